-- join_group.lua: Kafka's JoinGroup (GroupMetadataManager.classicGroupJoin) in one atomic step.
-- keys: the group layout of prelude.lua (keys[1]..keys[16]); ARGV: the function's args.
-- ARGV[1]  now ms or ''          ARGV[2]  group id
-- ARGV[3]  member id ('' = new member)
-- ARGV[4]  group instance id ('' = dynamic member)
-- ARGV[5]  protocol type         ARGV[6]  protocols: cmsgpack array of {name, metadata}
-- ARGV[7]  session timeout ms    ARGV[8]  rebalance timeout ms
-- ARGV[9]  client id             ARGV[10] client host
-- ARGV[11] '1' if a known member id is required (KIP-394), else '0'
-- ARGV[12] the id of the member this join adds, if it adds one (rcoord/protocol/join.py
--          new_member_id: the client id or group instance id, '-', the request's UUID)
-- ARGV[13] cmsgpack array of {protocol name, subscribed topics or false}: for protocol type
--          "consumer", the topics each protocol's metadata subscribes to (false: undecodable)
-- ARGV[14] '1' if the client reads SkipAssignment (KIP-814; Kafka's JoinGroup v9+), else '0'
-- Returns {'R', reply} or {'W', wake_id, next_deadline, now, member_id} (see prelude reply_or_wait).

local REQ -- this call's request (set by parse_join_group)
local KNOWN -- the record of the member REQ.mid names, once read (false: no such member)

-- The record of the member the request names. Every path that asks whether the id is a member
-- goes on to use its record, with nothing written in between, so the question is the read.
local function known_record()
  if KNOWN == nil then KNOWN = REQ.mid ~= '' and mget(REQ.mid) or false end
  return KNOWN
end

local function parse_join_group(ARGV)
  local req = {
    mid = ARGV[3], iid = ARGV[4], pt = ARGV[5], pr = ARGV[6],
    st = tonumber(ARGV[7]), rt = tonumber(ARGV[8]), cid = ARGV[9], host = ARGV[10],
  }
  -- (flags are '1' or '0': a 'true' or 'false' was read as the opposite of one of them)
  for _, i in ipairs({11, 14}) do
    if ARGV[i] ~= '1' and ARGV[i] ~= '0' then error('ARGV[' .. i .. "] must be '1' or '0'", 0) end
  end
  req.require_known = ARGV[11] == '1'
  req.new_id = ARGV[12]
  -- ('' is the id of no member: a member added under it could never be named again)
  if req.new_id == '' then error('ARGV[12] (the id of a member this join adds) is empty', 0) end
  req.skip_ok = ARGV[14] ~= '0'
  req.protocols = cmsgpack.unpack(req.pr)
  for _, p in ipairs(req.protocols) do
    if type(p[1]) ~= 'string' or type(p[2]) ~= 'string' then
      error('ARGV[6] (protocols) must be an array of {name, metadata} strings', 0)
    end
  end
  req.subs = {}
  for _, entry in ipairs(cmsgpack.unpack(ARGV[13])) do req.subs[entry[1]] = entry[2] end
  REQ, KNOWN = req, nil
  return req
end

-- Kafka's acceptJoiningMember, for the member the request names: parked members always; others
-- while there is room. (A new member, id '', is nobody's: no read asks.)
-- rcoord: a static member back with no member id is judged as the member whose instance id it
-- holds, which it replaces (update_static_member_and_rebalance): it takes that member's place
-- and adds nobody. Kafka's classic check counts it as a new member, so a static member that
-- restarted in a group at group.max.size got GROUP_MAX_SIZE_REACHED, fatal to its client, where
-- a restart should rebalance nothing (KAFKA-20601 fixed this for consumer groups).
local function accept_joining_member()
  local state = G.state
  if state == EMPTY or state == DEAD then return true end
  local id = REQ.mid
  local known = known_record() ~= false
  if id == '' and REQ.iid ~= '' then
    local owner = redis.call('HGET', K_STATIC, REQ.iid)
    if owner then id, known = owner, true end
  end
  if state == PREPARING then
    -- The count first: the join asks it again (all_joined, which keeps it), and while there is
    -- room, whether this member is parked need not be asked at all.
    NJOINING = NJOINING or redis.call('HLEN', K_JOINING)
    return NJOINING < CFG.group_max_size or (known and awaiting_join(id))
  end
  return known or nmembers() < CFG.group_max_size
end

local function add_member_and_rebalance(id)
  add_member(id, REQ)
  if G.state == PREPARING and G.prev == EMPTY then set_g('nma', 1) end
  -- A new member cannot heartbeat while parked; bound how long its join may wait.
  schedule(hb_key(id), NOW + CFG.new_member_join_timeout_ms)
  maybe_prepare_rebalance_or_complete_join('adding new member ' .. id)
  return reply_or_wait(id, 'j')
end

local function update_member_and_rebalance(rec, reason)
  update_member(rec, REQ, true)
  maybe_prepare_rebalance_or_complete_join(reason)
  return reply_or_wait(rec.id, 'j')
end

-- ClassicGroup.replaceStaticMember: the new member id takes over the old one's place; a caller
-- still parked under the old id is fenced at once.
local function replace_static_member(old_id, new_id)
  local old = mget(old_id)
  if not old then illegal('cannot replace non-existing member ' .. old_id) end
  if settle_chunks() then old = mget(old_id) end
  local was_joining = awaiting_join(old_id)
  local was_syncing = old.as == 1
  local was_pending_sync = redis.call('HEXISTS', K_PSYNC, old_id) == 1
  forget_members()
  redis.call('HDEL', K_MEMBERS, old_id)
  NMEMBERS = nil
  redis.call('HDEL', K_JOINING, old_id)
  NJOINING = nil
  redis.call('HDEL', K_PSYNC, old_id)
  cancel(hb_key(old_id))
  if was_joining then
    reply_put(old_id, {k = 'j', e = 'FENCED_INSTANCE_ID', mid = old_id, gen = -1, ldr = '',
                       mem = {}, skip = false})
  elseif was_syncing then
    reply_put(old_id, sync_error('FENCED_INSTANCE_ID'))
  end
  local rec = old
  rec.id, rec.as, rec.new = new_id, 0, 0
  mput(rec)
  if G.oq and rec.seq then
    redis.call('ZREM', K_ORDER, old_id)
    redis.call('ZADD', K_ORDER, rec.seq, new_id)
  end
  if G.leader == old_id then set_g('leader', new_id) end
  -- (The join sequence moves on, though the new id keeps the old one's place: a description
  -- listed a page at a time sees that the members changed; describe_group.lua.)
  set_g('seq', tonumber(G.seq or '0') + 1)
  redis.call('HSET', K_STATIC, REQ.iid, new_id)
  -- rcoord: the obligation to sync moves to the new id (see docs/architecture.md).
  if was_pending_sync then redis.call('HSET', K_PSYNC, new_id, 1) end
  return rec
end

-- Kafka's updateStaticMemberThenRebalanceOrCompleteJoin. ``old_id`` == ``new_id``: the
-- static member's join sent again, whose replacement's id is the member's own (join_group), so
-- only the rest of the replacement is left to do.
local function update_static_member_and_rebalance(old_id, new_id)
  -- Checked before any write (a script error must not leave the group half-changed).
  if G.state == EMPTY or G.state == DEAD then
    illegal('Group ' .. GROUP_ID .. ' was not supposed to be in the state ' .. G.state ..
      ' when the unknown static member ' .. REQ.iid .. ' rejoins.')
  end
  local leader_before = G.leader
  local rec = old_id == new_id and known_record() or replace_static_member(old_id, new_id)
  reschedule_heartbeat(rec.id, rec.st)
  local subscribed_before = subscribed_topics_of(rec, G.pname)
  update_member(rec, REQ, true)
  if G.state == STABLE then
    -- rcoord (as KAFKA-12759 proposes): a static member back with other topics than it
    -- subscribed to rebalances the group. Kafka looks at the selected protocol only, and hands
    -- such a member its old assignment with no rebalance: its new topics go unread, and its
    -- rejoin on seeing the mismatch finds the stored metadata already the new one.
    -- (inline, not a helper: the largest step file's locals count towards Lua's 200)
    local after, same_topics = subscribed_topics_of(rec, G.pname), true
    if subscribed_before == nil or after == nil then
      same_topics = subscribed_before == after
    else
      local set, n = {}, 0
      for _, topic in ipairs(subscribed_before) do
        if not set[topic] then set[topic], n = true, n + 1 end
      end
      for _, topic in ipairs(after) do
        if not set[topic] then same_topics = false break end
        if set[topic] == true then set[topic], n = 1, n - 1 end
      end
      same_topics = same_topics and n == 0
    end
    if select_protocol() == G.pname and (G.ptype ~= 'consumer' or same_topics) then
      -- Same protocol: no rebalance; the static member gets the current generation back, and
      -- a returning leader is told to skip the assignment (KIP-814).
      -- A client that cannot read SkipAssignment (below v9) gets what Kafka answered before
      -- KIP-814: the leader it replaced and no members, so it follows and does not assign.
      redis.call('HDEL', K_JOINING, new_id)
      NJOINING = nil
      local is_leader = G.leader == new_id and REQ.skip_ok
      local rep = join_reply(new_id, 'NONE', is_leader, is_leader)
      if not REQ.skip_ok then rep.ldr = leader_before end
      return respond(rep)
    end
    maybe_prepare_rebalance_or_complete_join('static member ' .. new_id ..
      (same_topics and ' changed protocol' or ' changed its subscription'))
  elseif G.state == COMPLETING then
    prepare_rebalance('static member ' .. new_id .. ' rejoined during CompletingRebalance')
  else
    maybe_complete_join_phase()
  end
  return reply_or_wait(new_id, 'j')
end

local function join_new_member()
  if G.state == DEAD then return respond(join_error('COORDINATOR_NOT_AVAILABLE', '')) end
  if not supports_protocols(REQ.pt, REQ.protocols) then
    return respond(join_error('INCONSISTENT_GROUP_PROTOCOL', ''))
  end
  local new_id = REQ.new_id
  if REQ.iid ~= '' then
    local existing = redis.call('HGET', K_STATIC, REQ.iid)
    if existing then return update_static_member_and_rebalance(existing, new_id) end
    return add_member_and_rebalance(new_id)
  end
  if REQ.require_known then
    -- KIP-394: hand out the id; the member is pending until it joins with it. The id comes
    -- from the caller's UUID (join_group, below), so it may name a member already (the round
    -- sent again after its member joined, or a UUID taken from another member's id): it is
    -- handed out again with nothing written, since a pending entry and a new session deadline
    -- would replace that member's (whose expiry would then only drop the pending entry, and
    -- the member would never expire).
    if mget(new_id) then return respond(join_error('MEMBER_ID_REQUIRED', new_id)) end
    redis.call('HSET', K_PENDING, new_id, 1)
    schedule(hb_key(new_id), NOW + REQ.st)
    return respond(join_error('MEMBER_ID_REQUIRED', new_id))
  end
  return add_member_and_rebalance(new_id)
end

local function join_existing_member()
  local id = REQ.mid
  if G.state == DEAD then return respond(join_error('COORDINATOR_NOT_AVAILABLE', id)) end
  if not supports_protocols(REQ.pt, REQ.protocols) then
    return respond(join_error('INCONSISTENT_GROUP_PROTOCOL', id))
  end
  -- (A member id is never both a member and pending: add_member takes it out of the pending
  -- ones, and the KIP-394 round never hands out a member's id as pending. A member found is
  -- not asked about.)
  local known = known_record()
  if not known and is_pending(id) then
    if REQ.iid ~= '' then
      -- Kafka raises IllegalStateException here: pending members are never static.
      return respond(join_error('UNKNOWN_SERVER_ERROR', id))
    end
    return add_member_and_rebalance(id)
  end
  local err, rec = validate_member(id, REQ.iid, false, known)
  if err then return respond(join_error(err, id)) end
  if G.state == PREPARING then
    return update_member_and_rebalance(rec, 'member ' .. id .. ' rejoined during PreparingRebalance')
  elseif G.state == COMPLETING then
    if rec.pr == REQ.pr then
      -- Same metadata: it probably missed its JoinGroup response; send it again.
      return respond(join_reply(id, 'NONE', G.leader == id, false))
    end
    return update_member_and_rebalance(rec, 'member ' .. id .. ' changed metadata')
  elseif G.state == STABLE then
    -- Kafka takes a static member's join sent again for a new instance, and replaces it.
    if REQ.static_resend then return update_static_member_and_rebalance(id, id) end
    if G.leader == id or rec.pr ~= REQ.pr then
      -- A leader's rejoin forces a rebalance (it may have seen metadata change).
      return update_member_and_rebalance(rec, 'member ' .. id .. ' rejoined Stable group')
    end
    return respond(join_reply(id, 'NONE', false, false))
  end
  -- Empty: the member must reset its generation and rejoin.
  return respond(join_error('UNKNOWN_MEMBER_ID', id))
end

local function join_group()
  if REQ.st < CFG.group_min_session_timeout_ms or REQ.st > CFG.group_max_session_timeout_ms then
    return respond(join_error('INVALID_SESSION_TIMEOUT', REQ.mid))
  end

  if not group_exists() then
    if REQ.mid ~= '' then return respond(join_error('UNKNOWN_MEMBER_ID', REQ.mid)) end
    create_group()
  end

  -- A new member's id comes with the request (ARGV[12], made from the caller's UUID), not
  -- from the server as in Kafka, so the same request sent twice (redis-py sends a call again
  -- when the connection lost its reply; rcoord's worker sends its first join again with the
  -- same UUID) names the same member: when that member exists, this is its rejoin, never a
  -- second member (which would count its protocols and rebalance timeout twice). A
  -- MEMBER_ID_REQUIRED round sent again hands out the same id. A static member's join sent
  -- again in Stable is answered as Kafka's replacement of that member would be
  -- (join_existing_member), not as a known leader's rejoin, which would rebalance.
  if REQ.mid == '' and (REQ.iid ~= '' or not REQ.require_known) then
    local rec = mget(REQ.new_id)
    if rec then REQ.mid, KNOWN, REQ.static_resend = REQ.new_id, rec, REQ.iid ~= '' end
  end

  if not accept_joining_member() then
    if REQ.mid ~= '' and (known_record() or is_pending(REQ.mid)) then remove_member(REQ.mid) end
    return respond(join_error('GROUP_MAX_SIZE_REACHED', ''))
  end
  if REQ.mid == '' then return join_new_member() end
  return join_existing_member()
end

-- The group hash fields a join that adds or updates a member reads besides the core (the
-- member sequence, the rebalance timeout counts, the count of each protocol it names, and the
-- initial rebalance's new-member flag), in the first read. The MEMBER_ID_REQUIRED round reads
-- none of them.
local function join_fields(req)
  if req.mid == '' and req.iid == '' and req.require_known then return nil end
  local fields = {'seq', 'rtc', 'nma'}
  for _, p in ipairs(req.protocols) do fields[#fields + 1] = 'P:' .. p[1] end
  return fields
end

group_step('join_group', join_group, parse_join_group,
  {all_settings = true, fields = join_fields, settles = true, argc = 14,
   ints = {{7, 'session_timeout_ms'}, {8, 'rebalance_timeout_ms'}}})
