-- fetch_offsets.lua: Kafka's OffsetFetch for a classic group.
-- keys: the group layout of prelude.lua (keys[1]..keys[16]); ARGV: the function's args.
-- ARGV[1] now ms or ''   ARGV[2] group id
-- ARGV[3..] fields '<partition>:<topic>', or ARGV[3] '#<cursor>' and ARGV[4] a count: a page of
--   all the group's offsets (HSCAN from that cursor, '#0' first), so that no call reads more than
--   about that many however many offsets the group has (rcoord/steps.py fetch_offsets).
-- Returns {field, record-or-false, field, record-or-false, ...}; a page ends with the pairs
-- {'#', next cursor ('0': the last page), '@', the server process's token (prelude.lua
-- server_token: the caller starts again when it changes, as the cursor is that process's)}.

local function fetch_offsets(ARGV)
  if string.sub(ARGV[3] or '', 1, 1) == '#' then
    local page = redis.call('HSCAN', K_OFFSETS, string.sub(ARGV[3], 2), 'COUNT', ARGV[4])
    local out = page[2]
    out[#out + 1], out[#out + 2] = '#', page[1]
    out[#out + 1], out[#out + 2] = '@', server_token()
    return out
  end
  local out = {}
  for i = 3, #ARGV do
    out[#out + 1] = ARGV[i]
    out[#out + 1] = redis.call('HGET', K_OFFSETS, ARGV[i]) or false
  end
  return out
end

group_step('fetch_offsets', fetch_offsets, nil, {brief = true})
