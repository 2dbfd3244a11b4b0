-- topic_read.lua: XRANGE bounded by bytes as well as by count: the records of one partition
-- from an offset on, as a fetch's later reads take them (rcoord/topics/fetch.py's
-- _fetch_bounded).
-- KEYS[1] stream. ARGV[1] the first offset, ARGV[2] most records, ARGV[3] most bytes, weighed
-- as the client weighs entries (fetch.py's _entry_bytes: the lengths of field names and values).
-- Returns XRANGE's reply: entries from ARGV[1] on, up to ARGV[2] of them, stopping after the one
-- whose bytes reach ARGV[3] (so one record at least, however large).
--
-- XRANGE counts records only: a read sized by small records that met large ones returned them
-- all (100 records of 1 byte, then 162 asked: 143 MiB for a fetch of 1 MiB). The entries are
-- read here in chunks of at most READ_CHUNK, each no more than the bytes left allow at the
-- largest size seen, so the reply goes past ARGV[3] by one record at most and the copies made
-- here past it by READ_CHUNK - 1 records at most.

local READ_CHUNK = 16
local most, budget = tonumber(ARGV[2]), tonumber(ARGV[3])
local out, bytes, largest = {}, 0, 1
local from = string.format('0-%d', tonumber(ARGV[1]) + 1)
while #out < most and bytes < budget do
  local chunk = math.min(most - #out, READ_CHUNK,
                         math.max(1, math.floor((budget - bytes) / largest)))
  local entries = redis.call('XRANGE', KEYS[1], from, '+', 'COUNT', chunk)
  for i = 1, #entries do
    local size = 0
    for j = 1, #entries[i][2] do size = size + #entries[i][2][j] end
    out[#out + 1] = entries[i]
    bytes = bytes + size
    if size > largest then largest = size end
    if bytes >= budget then break end
  end
  if #entries < chunk then break end  -- the log end
  from = '(' .. out[#out][1]
end
return out
