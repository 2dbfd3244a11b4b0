-- topic_grow_meta.lua: raises a topic's partition count (it only grows).
-- KEYS[1] meta. ARGV[1] new total, ARGV[2] token of the add_partitions call (unique per call,
-- the same when that call is resent). Returns {error name, partition count before}.
-- A resent call (redis-py retries a call whose reply was lost) finds the total it set and its
-- own token, and answers NONE again; any other request for the current count is
-- INVALID_PARTITIONS, as in Kafka.

local cur = redis.call('HGET', KEYS[1], 'partitions')
if not cur then return {'UNKNOWN_TOPIC_OR_PARTITION', -1} end
cur = tonumber(cur)
local total = tonumber(ARGV[1])
if total == cur and redis.call('HGET', KEYS[1], 'grow_token') == ARGV[2] then
  return {'NONE', cur}
end
if total <= cur then return {'INVALID_PARTITIONS', cur} end
redis.call('HSET', KEYS[1], 'partitions', ARGV[1], 'grow_token', ARGV[2])
return {'NONE', cur}
