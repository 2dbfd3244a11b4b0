-- describe_group.lua: Kafka's DescribeGroups for one classic group (after applying its passed
-- deadlines, so the answer is current), a page of members per call.
-- keys: the group layout of prelude.lua (keys[1]..keys[16]); ARGV: the function's args.
-- ARGV[1] now ms or ''   ARGV[2] group id
-- ARGV[3] the first member to list, 0-based in join order ('' = 0)
-- ARGV[4] the most members to list ('' = every one)
-- Returns cmsgpack {st = state, pt = protocol type, pn = protocol name (Stable only),
--                   mem = {{id, iid, cid, host, meta, asg}...}, n = members in all,
--                   nx = where the next page starts, tok = what the pages of one description
--                   share, inc = the group's incarnation token: 'inc' of its record, or
--                   'created' for a record an older rcoord made}; a missing group is 'Dead'.
-- Listing 1,000 members in one call held the shard 7-9 ms, so a caller lists a large group a
-- page at a time (rcoord/steps.py describe_group). The pages come from the join order key;
-- a page whose tok differs from the first page's was taken after the members, the state or
-- the generation changed (a static member's replacement too: it bumps the join sequence), or
-- the group was deleted and made again (its incarnation), and the caller starts again; so
-- does one that lacks a member its ids named. A group an older rcoord made (no order key, or
-- members it added missing from it) is listed whole in one call.

local function member_entry(rec, stable)
  return {id = rec.id, iid = rec.iid, cid = rec.cid, host = rec.host,
    meta = stable and metadata_for(rec, G.pname) or '', asg = stable and rec.asg or ''}
end

local function describe_group(ARGV)
  local out
  if not group_exists() then
    out = {st = DEAD, pt = '', pn = '', mem = {}, n = 0, tok = '', inc = ''}
  else
    -- As Kafka: metadata and assignments are shown only once the group is Stable.
    local stable = G.state == STABLE
    settle_chunks() -- (nothing left: group_step answered BUSY while chunks remained)
    local first, size = tonumber(ARGV[3]) or 0, tonumber(ARGV[4])
    local total = nmembers()
    local members = {}
    local nx = total
    if size and G.oq and total > 0 and order_holds_all(total) then
      local ids = redis.call('ZRANGE', K_ORDER, first, first + size - 1)
      local blobs = #ids > 0 and hmget_batched(K_MEMBERS, ids) or {}
      for i = 1, #ids do
        if blobs[i] then members[#members + 1] = member_entry(cmsgpack.unpack(blobs[i]), stable) end
      end
      nx = first + #ids
    else
      for _, rec in ipairs(all_members()) do members[#members + 1] = member_entry(rec, stable) end
      total = #members
    end
    local inc = G.inc or G.created or ''
    out = {st = G.state, pt = G.ptype, pn = stable and G.pname or '', mem = members, n = total,
      nx = nx, tok = G.state .. ':' .. gen() .. ':' .. (G.seq or '0') .. ':' .. total .. ':' .. inc,
      inc = inc}
  end
  return cmsgpack.pack(out)
end

local function parse_describe_group(ARGV)
  for i = 3, 4 do
    local v = ARGV[i] or ''
    if v ~= '' and not (string.match(v, '^%d+$') and #v <= 12 and tonumber(v) >= i - 3) then
      error('ARGV[' .. i .. '] must be empty or a decimal integer >= ' .. (i - 3), 0)
    end
  end
  return ARGV
end

group_step('describe_group', describe_group, parse_describe_group, {settles = true})
