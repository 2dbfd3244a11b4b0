-- leave_group.lua: Kafka's LeaveGroup (classicGroupLeaveToClassicGroup), batch form (KIP-345).
-- KEYS: the group layout of prelude.lua (KEYS[1]..KEYS[15]).
-- ARGV[1] now ms or ''   ARGV[2] group id
-- ARGV[3] cmsgpack array of {member id, group instance id ('' = none)}, in request order
-- Returns {top-level error name, {per-member error names in request order}}.

local leaving = cmsgpack.unpack(ARGV[3])

apply_due()

local results = {}
if not group_exists() then
  for i = 1, #leaving do results[i] = 'UNKNOWN_MEMBER_ID' end
  finish()
  return {'NONE', results}
end
if G.state == DEAD then
  finish()
  return {'COORDINATOR_NOT_AVAILABLE', results}
end

local any_left = false
for i, m in ipairs(leaving) do
  local mid, iid = m[1], m[2]
  local err = nil
  if mid == '' then
    -- Administrative removal by instance id.
    local current = iid ~= '' and redis.call('HGET', K_STATIC, iid)
    if current then remove_member(current) else err = 'UNKNOWN_MEMBER_ID' end
  elseif is_pending(mid) then
    remove_member(mid)
  else
    err = validate_member(mid, iid)
    if not err then remove_member(mid) end
  end
  results[i] = err or 'NONE'
  if not err then any_left = true end
end

if any_left then
  if G.state == STABLE or G.state == COMPLETING then
    maybe_prepare_rebalance_or_complete_join('members left the group')
  elseif G.state == PREPARING then
    maybe_complete_join_phase()
  end
end
finish()
return {'NONE', results}
