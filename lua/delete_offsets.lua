-- delete_offsets.lua: Kafka's OffsetDelete (KIP-496) for one group.
-- KEYS: the group layout of prelude.lua (KEYS[1]..KEYS[15]).
-- ARGV[1] now ms or ''   ARGV[2] group id   ARGV[3..] fields '<partition>:<topic>'
-- Returns {group-level error name, {per-partition error names in ARGV order}}.

apply_due()
local results = {}
if not group_exists() then
  finish()
  return {'GROUP_ID_NOT_FOUND', results}
end
if G.state ~= EMPTY and G.ptype ~= 'consumer' then
  finish()
  return {'NON_EMPTY_GROUP', results}
end
local subs = subscribed_set()
for i = 3, #ARGV do
  local topic = string.match(ARGV[i], '^%d+:(.*)$')
  if is_subscribed(topic, subs) then
    results[#results + 1] = 'GROUP_SUBSCRIBED_TO_TOPIC'
  else
    redis.call('HDEL', K_OFFSETS, ARGV[i])
    results[#results + 1] = 'NONE'
  end
end
-- An Empty group whose last offset went is removed on the usual schedule.
if G.state == EMPTY then redis.call('ZADD', K_DL, 'LT', NOW, 'gc') end
finish()
return {'NONE', results}
