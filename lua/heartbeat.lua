-- heartbeat.lua: Kafka's Heartbeat (classicGroupHeartbeatToClassicGroup) in one atomic step.
-- KEYS: the group layout of prelude.lua (KEYS[1]..KEYS[15]).
-- ARGV[1] now ms or ''   ARGV[2] group id   ARGV[3] member id   ARGV[4] generation id
-- ARGV[5] group instance id ('' = none)
-- Returns the Kafka error name ('NONE' on success).

local member_id, generation, iid = ARGV[3], tonumber(ARGV[4]), ARGV[5]

apply_due()

local function heartbeat()
  if not group_exists() then return 'UNKNOWN_MEMBER_ID' end
  if G.state == DEAD then return 'COORDINATOR_NOT_AVAILABLE' end
  local err = validate_member(member_id, iid)
  if err then return err end
  if generation ~= gen() then return 'ILLEGAL_GENERATION' end
  if G.state == EMPTY then return 'UNKNOWN_MEMBER_ID' end
  -- Every other state refreshes the session: members heartbeat while they rejoin or sync.
  reschedule_heartbeat(mget(member_id))
  if G.state == PREPARING then return 'REBALANCE_IN_PROGRESS' end
  if G.state == COMPLETING or G.state == STABLE then return 'NONE' end
  illegal('unexpected state ' .. tostring(G.state) .. ' in Heartbeat')
end

local result = heartbeat()
finish()
return result
