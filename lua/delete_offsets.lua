-- delete_offsets.lua: Kafka's OffsetDelete (KIP-496) for one group.
-- keys: the group layout of prelude.lua (keys[1]..keys[16]); ARGV: the function's args.
-- ARGV[1] now ms or ''   ARGV[2] group id   ARGV[3..] fields '<partition>:<topic>'
-- Returns {group-level error name, {per-partition error names in ARGV order}}.

local function delete_offsets(ARGV)
  local results = {}
  if not group_exists() then
    return {'GROUP_ID_NOT_FOUND', results}
  end
  if G.state ~= EMPTY and G.ptype ~= 'consumer' then
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
  if G.state == EMPTY then schedule_by('gc', NOW) end
  return {'NONE', results}
end

-- settles: a join completion written in chunks stores the subscribed topics with its last one,
-- and an unknown set counts every topic as subscribed; Kafka knows them from the start of
-- CompletingRebalance. So the step answers BUSY (writing a chunk) until the completion is whole.
group_step('delete_offsets', delete_offsets, nil, {brief = true, settles = true})
