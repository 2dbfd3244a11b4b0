-- topic_create_meta.lua: claims a new topic's metadata hash.
-- KEYS[1] meta. ARGV[1] partitions, ARGV[2] retention records or '', ARGV[3] retention ms or '',
-- ARGV[4] producer id expiration ms or '' (producers then use Kafka's default, 1 day),
-- ARGV[5] creation token: unique per Topics.create call, the same when that call is resent.
-- Returns {'NONE'} or {'TOPIC_ALREADY_EXISTS'}.
-- A resent call (redis-py retries a call whose reply was lost) finds its own token and answers
-- NONE again without writing, so create goes on to make the partitions instead of failing.

if redis.call('EXISTS', KEYS[1]) == 1 then
  if redis.call('HGET', KEYS[1], 'create_token') == ARGV[5] then return {'NONE'} end
  return {'TOPIC_ALREADY_EXISTS'}
end
local now = string.format('%d', now_ms())
redis.call('HSET', KEYS[1], 'partitions', ARGV[1], 'created_ms', now, 'create_token', ARGV[5])
if ARGV[2] ~= '' then redis.call('HSET', KEYS[1], 'retention_records', ARGV[2]) end
if ARGV[3] ~= '' then redis.call('HSET', KEYS[1], 'retention_ms', ARGV[3]) end
if ARGV[4] ~= '' then redis.call('HSET', KEYS[1], 'producer_id_expiration_ms', ARGV[4]) end
return {'NONE'}
