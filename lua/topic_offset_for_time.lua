-- topic_offset_for_time.lua: the first offset of one partition whose record timestamp is at or
-- after a target time (Kafka's ListOffsets by timestamp); read-only.
-- KEYS[1] stream, KEYS[2] optional: the partition's last-record mark (same hash tag), which
-- gives the log offsets without XINFO STREAM's copy of the first and last records (as in
-- topic_offsets.lua). ARGV[1] target timestamp ms (>= 0).
-- Returns {error name, offset, timestamp}: offset and timestamp are -1 when no record is that
-- recent (or the partition is missing, with UNKNOWN_TOPIC_OR_PARTITION).
--
-- Binary search over offsets, probing "the first entry at or after offset m" (XRANGE from
-- 0-<m+1>, COUNT 1), so entries missing in the middle would not mislead it. It relies on the
-- timestamps of a partition being non-decreasing: every append stamps max(node TIME, the last
-- record's timestamp) (stamp, in topic_common.lua), so they are even when the clock steps back.

if not is_partition(KEYS[1]) then return {'UNKNOWN_TOPIC_OR_PARTITION', -1, -1} end
local target = tonumber(ARGV[1])
local lo, hi = partition_offsets(KEYS[1], KEYS[2])

local function first_from(o)
  local got = redis.call('XRANGE', KEYS[1], '0-' .. string.format('%d', o + 1), '+', 'COUNT', 1)
  if #got == 0 then return nil end
  local fields, ts = got[1][2], nil
  for i = 1, #fields, 2 do
    if fields[i] == 't' then ts = tonumber(fields[i + 1]) end
  end
  local off = seq(got[1][1]) - 1
  if ts == nil then
    -- (An entry added with XADD by hand: comparing nil failed with a bare Lua error.)
    error(string.format('FOREIGN_ENTRY_ID %s: the entry at offset %d is not a record (it has '
      .. 'no integer t field); Topics.delete_records to offset %d removes it and the records '
      .. 'before it', KEYS[1], off, off + 1), 0)
  end
  return off, ts
end

while lo < hi do
  local mid = math.floor((lo + hi) / 2)
  local o, ts = first_from(mid)
  if o == nil or ts >= target then
    hi = mid
  else
    lo = o + 1
  end
end
local o, ts = first_from(lo)
if o == nil or ts < target then return {'NONE', -1, -1} end
return {'NONE', o, ts}
