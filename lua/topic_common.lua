-- topic_common.lua: shared helpers of the topic scripts (rcoord/scripts.py puts it in front of them).
-- Used in front of the other topic_*.lua scripts; touches only the keys they pass.

local function seq(id) return tonumber(string.match(id, '^0%-(%d+)$')) end
local function is_partition(key) return redis.call('TYPE', key)['ok'] == 'stream' end
local function now_ms() return (read_clock('')) end
-- The timestamp of records appended at `now` to stream `key`: `now`, or the partition's last
-- record's if that is later (a clock stepped back, a failover to a node whose clock is behind),
-- so a partition's timestamps never decrease and topic_offset_for_time.lua can binary-search
-- them (Kafka's time index keeps the largest timestamp so far for the same reason). The last
-- timestamp is kept in `ts_key` (a string in the stream's slot; set here when it rises): reading
-- the stream's last entry instead would copy its value (about 360 us for 1 MB). Without it (a
-- stream an older rcoord appended to) the last entry is read once; 't' is the first field of
-- every record the append scripts write. Call it only when records are appended next.
local function stamp(key, ts_key, now)
  local last = tonumber(redis.call('GET', ts_key) or '')
  local known = last ~= nil
  if not known then
    local entry = redis.call('XREVRANGE', key, '+', '-', 'COUNT', 1)[1]
    if entry and entry[2][1] == 't' then last = tonumber(entry[2][2]) end
  end
  local t = now
  if last ~= nil and last >= now then t = last end
  if t ~= last or not known then redis.call('SET', ts_key, string.format('%d', t)) end
  return t
end
-- Log start and end offsets: end = sequence of the last id ever generated (kept by trimming),
-- start = first entry's offset, or end when retention emptied the stream.
local function log_offsets(key)
  local info = redis.call('XINFO', 'STREAM', key)
  local last, first = nil, false
  for i = 1, #info, 2 do
    if info[i] == 'last-generated-id' then last = info[i + 1]
    elseif info[i] == 'first-entry' then first = info[i + 1] end
  end
  local e = seq(last)
  if first then return seq(first[1]) - 1, e end
  return e, e
end
