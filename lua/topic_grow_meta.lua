-- topic_grow_meta.lua: raises a topic's partition count (it only grows).
-- KEYS[1] meta. ARGV[1] new total. Only grows; {error name, partition count before}.

local cur = redis.call('HGET', KEYS[1], 'partitions')
if not cur then return {'UNKNOWN_TOPIC_OR_PARTITION', -1} end
cur = tonumber(cur)
if tonumber(ARGV[1]) <= cur then return {'INVALID_PARTITIONS', cur} end
redis.call('HSET', KEYS[1], 'partitions', ARGV[1])
return {'NONE', cur}
