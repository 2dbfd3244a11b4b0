-- topic_common.lua: shared helpers of the topic scripts (rcoord/scripts.py puts it in front of them).
-- Used in front of the other topic_*.lua scripts; touches only the keys they pass.

local function seq(id) return tonumber(string.match(id, '^0%-(%d+)$')) end
local function is_partition(key) return redis.call('TYPE', key)['ok'] == 'stream' end
local function now_ms() return (read_clock('')) end
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
