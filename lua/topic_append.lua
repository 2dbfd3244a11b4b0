-- topic_append.lua: appends records to one partition stream; XADD 0-* assigns the offsets.
-- KEYS[1] stream, KEYS[2] the partition's last record timestamp (a string, same hash tag).
-- ARGV: 4 per record: flags (1 value, 2 key, 4 headers), value, key, headers.
-- Returns {'NONE', first id, timestamp ms}, {'UNKNOWN_TOPIC_OR_PARTITION'}, or
-- {'UNKNOWN_SERVER_ERROR', why} for a stream an XADD by hand left refusing appends
-- (refused_append, in topic_common.lua).
-- The timestamp is the node's TIME, or the last record's if that is later (stamp, in
-- topic_common.lua): a partition's timestamps never decrease. KEYS[2] then holds their
-- timestamp and the log end (appended, in topic_common.lua).

if not is_partition(KEYS[1]) then return {'UNKNOWN_TOPIC_OR_PARTITION'} end
local t = stamp(KEYS[1], KEYS[2], now_ms())
local ts = string.format('%d', t)
local first, id = nil, nil
for i = 1, #ARGV, 4 do
  local flags = tonumber(ARGV[i])
  local f = {'t', ts}
  if flags % 2 == 1 then f[#f + 1] = 'v'; f[#f + 1] = ARGV[i + 1] end
  if math.floor(flags / 2) % 2 == 1 then f[#f + 1] = 'k'; f[#f + 1] = ARGV[i + 2] end
  if math.floor(flags / 4) % 2 == 1 then f[#f + 1] = 'h'; f[#f + 1] = ARGV[i + 3] end
  id = redis.pcall('XADD', KEYS[1], '0-*', unpack(f))
  if type(id) == 'table' then return refused_append(KEYS[1], id) end  -- (the first XADD's)
  first = first or id
end
if id then appended(KEYS[2], t, id) end
return {'NONE', first, t}
