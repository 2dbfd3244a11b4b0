-- heartbeat.lua: Kafka's Heartbeat (classicGroupHeartbeatToClassicGroup) in one atomic step.
-- The hot path of every live member, so it runs without the prelude and takes only the keys it
-- needs. If any of the group's deadlines has passed it changes nothing and answers 'DUE': the
-- caller applies them (expire_deadlines) and sends the heartbeat again, so deadlines still act
-- first, as in every other step.
-- KEYS[1] due  KEYS[2] group  KEYS[3] members  KEYS[4] statics  KEYS[5] deadlines  KEYS[6] hint
--   (the same keys as in prelude.lua's layout, rcoord/keys.py GroupKeys.heartbeat_keys)
-- ARGV[1] now ms or ''   ARGV[2] group id
-- ARGV[3..] one or more triples: member id, generation id, group instance id ('' = none)
--   (several members of one group heartbeat in one call: GroupCoordinator.heartbeat_many)
-- Returns an array with the Kafka error name for each triple ('NONE' on success), or 'DUE'.

local K_DUE, K_GROUP, K_MEMBERS, K_STATIC, K_DL, K_HINT = KEYS[1], KEYS[2], KEYS[3], KEYS[4],
  KEYS[5], KEYS[6]
local group_id = ARGV[2]
local now, mock_time = read_clock(ARGV[1])

local first = redis.call('ZRANGE', K_DL, 0, 0, 'WITHSCORES')
if #first > 0 and tonumber(first[2]) <= now then return 'DUE' end

local state, gen = unpack(redis.call('HMGET', K_GROUP, 'state', 'gen'))
gen = tonumber(gen)

local function heartbeat(member_id, generation, iid)
  if not state then return 'UNKNOWN_MEMBER_ID' end
  if state == 'Dead' then return 'COORDINATOR_NOT_AVAILABLE' end
  -- ClassicGroup.validateMember
  if iid ~= '' then
    local existing = redis.call('HGET', K_STATIC, iid)
    if not existing then return 'UNKNOWN_MEMBER_ID' end
    if existing ~= member_id then return 'FENCED_INSTANCE_ID' end
  end
  local blob = redis.call('HGET', K_MEMBERS, member_id)
  if not blob then return 'UNKNOWN_MEMBER_ID' end
  if gen ~= generation then return 'ILLEGAL_GENERATION' end
  if state == 'Empty' then return 'UNKNOWN_MEMBER_ID' end
  -- Every other state refreshes the session: members heartbeat while they rejoin or sync.
  local rec = cmsgpack.unpack(blob)
  redis.call('ZADD', K_DL, now + rec.st, 'hb:' .. member_id)
  if state == 'PreparingRebalance' then return 'REBALANCE_IN_PROGRESS' end
  if state == 'CompletingRebalance' or state == 'Stable' then return 'NONE' end
  return 'UNKNOWN_SERVER_ERROR' -- not reachable: the state table has no other state
end

local results = {}
for i = 3, #ARGV, 3 do
  results[#results + 1] = heartbeat(ARGV[i], tonumber(ARGV[i + 1]), ARGV[i + 2])
end
if state then publish_earliest(K_DL, K_DUE, K_HINT, group_id, true, now, mock_time) end
return results
