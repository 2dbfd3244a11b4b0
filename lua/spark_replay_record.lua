-- spark_replay_record.lua: records that a Spark query's restart replays a batch
-- (rcoord/spark/replays.py), and drops the records older than the retention.
-- KEYS[1] the group's replay record (hash: field '<generation>:<member>' -> replaying
-- generation, field '@<generation>:<member>' -> its write time, ms)
-- ARGV[1] the field of the replayed batch   ARGV[2] the replaying generation
-- ARGV[3] how long a record counts, ms      ARGV[4] now in ms ('': the server's TIME)
-- Returns the write time. One script: a record another member writes meanwhile is never taken
-- for an old one.

local now = read_clock(ARGV[4])  -- (clock.lua, in front of this script)
local all = redis.call('HGETALL', KEYS[1])
local records, written = {}, {}
for i = 1, #all, 2 do
  if string.sub(all[i], 1, 1) == '@' then written[string.sub(all[i], 2)] = tonumber(all[i + 1])
  else records[all[i]] = true end
end
for f in pairs(records) do
  local at = written[f]
  if at == nil then redis.call('HSET', KEYS[1], '@' .. f, now)  -- written without a time
  elseif now - at >= tonumber(ARGV[3]) then redis.call('HDEL', KEYS[1], f, '@' .. f) end
end
for f in pairs(written) do
  if not records[f] then redis.call('HDEL', KEYS[1], '@' .. f) end
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2], '@' .. ARGV[1], now)
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return now
