-- topic_alter_meta.lua: changes a topic's settings in its metadata hash, all or none.
-- KEYS[1] meta. ARGV: pairs of field, value; an empty value removes the field (the setting's
-- default applies again). The caller has checked every field and value before calling.
-- Returns {'NONE'} or {'UNKNOWN_TOPIC_OR_PARTITION'} (no topic: nothing written, so a topic
-- deleted meanwhile is not brought back as a hash of settings alone).

if redis.call('HEXISTS', KEYS[1], 'partitions') == 0 then
  return {'UNKNOWN_TOPIC_OR_PARTITION'}
end
for i = 1, #ARGV - 1, 2 do
  if ARGV[i + 1] == '' then
    redis.call('HDEL', KEYS[1], ARGV[i])
  else
    redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
  end
end
return {'NONE'}
