-- topic_retention.lua: applies retention (by record count and by age) to one partition.
-- KEYS[1] stream. ARGV[1] retention records or '', ARGV[2] retention ms or '', ARGV[3] scan limit.
-- Kafka deletes from the head while the oldest data is expired and stops at the first record
-- that is not, so the scan stops there too. Returns {error name, start, end, more to scan}.

if not is_partition(KEYS[1]) then return {'UNKNOWN_TOPIC_OR_PARTITION', -1, -1, 0} end
if ARGV[1] ~= '' then redis.call('XTRIM', KEYS[1], 'MAXLEN', ARGV[1]) end
local more = 0
if ARGV[2] ~= '' then
  local cutoff = now_ms() - tonumber(ARGV[2])
  local entries = redis.call('XRANGE', KEYS[1], '-', '+', 'COUNT', ARGV[3])
  local keep = nil
  for _, ent in ipairs(entries) do
    local ts = 0
    for j = 1, #ent[2], 2 do
      if ent[2][j] == 't' then ts = tonumber(ent[2][j + 1]) end
    end
    if ts >= cutoff then keep = ent[1]; break end
  end
  if keep then
    redis.call('XTRIM', KEYS[1], 'MINID', keep)
  elseif #entries > 0 then
    redis.call('XTRIM', KEYS[1], 'MINID', string.format('0-%d', seq(entries[#entries][1]) + 1))
    if #entries >= tonumber(ARGV[3]) then more = 1 end
  end
end
local s, e = log_offsets(KEYS[1])
return {'NONE', s, e, more}
