-- sync_group.lua: Kafka's SyncGroup (classicGroupSyncToClassicGroup) in one atomic step.
-- keys: the group layout of prelude.lua (keys[1]..keys[16]); ARGV: the function's args.
-- ARGV[1] now ms or ''   ARGV[2] group id   ARGV[3] member id   ARGV[4] generation id
-- ARGV[5] group instance id ('' = none)
-- ARGV[6] protocol type, ARGV[7] protocol name: '' = not given, else '=' .. value
-- ARGV[8] assignments: cmsgpack map member id -> bytes ('' = none; only the leader's count)
-- Returns {'R', reply} or {'W', wake_id, next_deadline, now, member_id}.

-- Kafka's isProtocolInconsistent: both given and different.
local function inconsistent(given, actual)
  if given == '' then return false end
  return actual ~= '' and string.sub(given, 2) ~= actual
end

-- Decoded before any write: a failed call must never leave the group half-changed.
local function parse_sync_group(ARGV)
  -- (a bare 'consumer' was compared as 'onsumer': INCONSISTENT_GROUP_PROTOCOL)
  for _, i in ipairs({6, 7}) do
    if ARGV[i] ~= '' and string.sub(ARGV[i], 1, 1) ~= '=' then
      error('ARGV[' .. i .. "] must be '' (not given) or '=' followed by the value", 0)
    end
  end
  local assignments = {}
  if ARGV[8] ~= '' then assignments = cmsgpack.unpack(ARGV[8]) end
  for id, blob in pairs(assignments) do
    if type(id) ~= 'string' or type(blob) ~= 'string' then
      error('ARGV[8] (assignments) must be a map of member id -> assignment strings', 0)
    end
  end
  return {member_id = ARGV[3], generation = tonumber(ARGV[4]), iid = ARGV[5], ptype = ARGV[6],
          pname = ARGV[7], assignments = assignments, sent = ARGV[8] ~= ''}
end

-- The leader's SyncGroup (the one that sends assignments) moves the group to Stable, and the
-- transition reads when the rebalance began and why: in the first read, not one HGET each.
local LEADER_FIELDS = {'rbts', 'reason'}
local function sync_fields(req)
  if req.sent then return LEADER_FIELDS end
  return nil
end

-- The member's SyncGroup waits for its assignment: marked awaiting, its reply slot cleared,
-- and no longer expected to sync.
local function park_sync(rec)
  rec.as = 1
  mput(rec)
  park_slot(rec.id, 's')
  remove_pending_sync(rec.id)
end

local function sync_group(req)
  local member_id = req.member_id
  if not group_exists() or G.state == EMPTY then return respond(sync_error('UNKNOWN_MEMBER_ID')) end
  if G.state == DEAD then return respond(sync_error('COORDINATOR_NOT_AVAILABLE')) end
  local err, rec = validate_member(member_id, req.iid)
  if err then return respond(sync_error(err)) end
  if req.generation ~= gen() then return respond(sync_error('ILLEGAL_GENERATION')) end
  if inconsistent(req.ptype, G.ptype) or inconsistent(req.pname, G.pname) then
    return respond(sync_error('INCONSISTENT_GROUP_PROTOCOL'))
  end

  if G.state == PREPARING then return respond(sync_error('REBALANCE_IN_PROGRESS')) end

  if G.state == COMPLETING then
    if G.leader == member_id then
      -- The leader's assignment (only the leader's counts); members it left out get an
      -- empty one. The leader is answered with the others, by the propagation's first chunk,
      -- which writes its record and reply slot once (park_sync would write both first).
      remove_pending_sync(member_id)
      set_and_propagate_assignment(req.assignments, member_id, rec)
      transition(STABLE)
    else
      park_sync(rec)
    end
    return reply_or_wait(member_id, 's')
  end

  if G.state == STABLE then
    if G.csk and rec.ag ~= gen() then
      -- The leader's assignment is stored but this member's chunk is still to be written
      -- (prelude propagate_assignment): it waits, as a SyncGroup in CompletingRebalance does,
      -- and is answered with its chunk.
      park_sync(rec)
      return reply_or_wait(member_id, 's')
    end
    remove_pending_sync(member_id)
    -- The Scala coordinator's doSyncGroup refreshed the session here too (Kafka 4's Java one
    -- no longer does; kept, harmless): a member counts its session from the
    -- sending of its SyncGroup (rcoord/client/heartbeat.py watch_session).
    reschedule_heartbeat(member_id, rec.st)
    return respond({k = 's', e = 'NONE', pt = G.ptype, pn = G.pname, asg = rec.asg})
  end
  illegal('unexpected state ' .. tostring(G.state) .. ' in SyncGroup')
end

group_step('sync_group', sync_group, parse_sync_group,
  {fields = sync_fields, argc = 8, ints = {{4, 'generation_id'}}})
