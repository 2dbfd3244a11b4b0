-- topic_grow_meta.lua: raises a topic's partition count (it only grows).
-- KEYS[1] meta. ARGV[1] new total, ARGV[2] token of the add_partitions call (unique per call,
-- the same when that call is resent), ARGV[3] the topic's creation token the call read with
-- the count ('' for a topic made before tokens). Returns {error name, partition count before}.
-- A resent call (redis-py retries a call whose reply was lost) finds the total it set and its
-- own token, and answers NONE again; any other request for the current count is
-- INVALID_PARTITIONS, as in Kafka. A topic deleted (and perhaps created again) since the call
-- read the count is UNKNOWN_TOPIC_OR_PARTITION: the partitions it made belong to no topic. A
-- topic marked for deletion (Topics.delete's first write) is INVALID_TOPIC_EXCEPTION, as Kafka
-- answers a CreatePartitions of a topic queued for deletion.

local cur = redis.call('HGET', KEYS[1], 'partitions')
if not cur then return {'UNKNOWN_TOPIC_OR_PARTITION', -1} end
cur = tonumber(cur)
if (redis.call('HGET', KEYS[1], 'create_token') or '') ~= ARGV[3] then
  return {'UNKNOWN_TOPIC_OR_PARTITION', cur}
end
if redis.call('HEXISTS', KEYS[1], 'deleting') == 1 then return {'INVALID_TOPIC_EXCEPTION', cur} end
local total = tonumber(ARGV[1])
if total == cur and redis.call('HGET', KEYS[1], 'grow_token') == ARGV[2] then
  return {'NONE', cur}
end
if total <= cur then return {'INVALID_PARTITIONS', cur} end
redis.call('HSET', KEYS[1], 'partitions', ARGV[1], 'grow_token', ARGV[2])
return {'NONE', cur}
