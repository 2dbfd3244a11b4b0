-- fetch_offsets.lua: Kafka's OffsetFetch for a classic group.
-- keys: the group layout of prelude.lua (keys[1]..keys[16]); ARGV: the function's args.
-- ARGV[1] now ms or ''   ARGV[2] group id
-- ARGV[3..] fields '<partition>:<topic>', or ARGV[3] '#<cursor>' and ARGV[4] a count: a page of
--   all the group's offsets (HSCAN from that cursor, '#0' first), so that no call reads more than
--   about that many however many offsets the group has (rcoord/steps.py fetch_offsets).
-- Returns {field, record-or-false, field, record-or-false, ...}; a page ends with the pairs
-- {'#', next cursor ('0': the last page), '@', the server process's token (SERVER_TOKEN: the
-- caller starts again when it changes, as the cursor is that process's)}.

-- A token of this server process (this library's Lua state), made from TIME at its first page
-- (two processes: the same only in the same microsecond). An HSCAN cursor means something
-- only to the process that gave it: another one (a replica promoted, a restart, the
-- destination of a slot migration) holds the same hash in other buckets, and continuing there
-- from the old cursor skips some of its fields. A local of this file, not of prelude.lua: the
-- main chunk's 200 locals are kept for helpers (tests/test_state.py); the retention walk keeps
-- its own (prelude.lua expire_offsets). (A library loaded again makes a new one: a restart more.)
local SERVER_TOKEN = nil

local function fetch_offsets(ARGV)
  if string.sub(ARGV[3] or '', 1, 1) == '#' then
    if SERVER_TOKEN == nil then
      local t = redis.call('TIME')
      SERVER_TOKEN = t[1] .. '.' .. t[2]
    end
    local page = redis.call('HSCAN', K_OFFSETS, string.sub(ARGV[3], 2), 'COUNT', ARGV[4])
    local out = page[2]
    out[#out + 1], out[#out + 2] = '#', page[1]
    out[#out + 1], out[#out + 2] = '@', SERVER_TOKEN
    return out
  end
  local out = {}
  for i = 3, #ARGV do
    out[#out + 1] = ARGV[i]
    out[#out + 1] = redis.call('HGET', K_OFFSETS, ARGV[i]) or false
  end
  return out
end

-- A page's cursor and count are decimal integers (HSCAN's errors named neither the step nor
-- the argument); the cursor an unsigned 64-bit one, as HSCAN takes (compared as text: a Lua
-- double cannot hold every one).
local function parse_fetch_offsets(ARGV)
  if string.sub(ARGV[3] or '', 1, 1) ~= '#' then return ARGV end
  local cursor = string.match(ARGV[3], '^#0*(%d+)$')
  if not (cursor and (#cursor < 20 or (#cursor == 20 and cursor <= '18446744073709551615'))
      and string.match(ARGV[4] or '', '^%d+$') and #ARGV[4] <= 9 and tonumber(ARGV[4]) > 0) then
    error("a page needs ARGV[3] '#<cursor>' (a decimal uint64) and ARGV[4] a decimal count "
      .. '>= 1', 0)
  end
  return ARGV
end

group_step('fetch_offsets', fetch_offsets, parse_fetch_offsets, {brief = true})
