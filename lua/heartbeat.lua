-- heartbeat.lua: Kafka's Heartbeat (classicGroupHeartbeatToClassicGroup) in one atomic step.
-- The hot path of every live member, so it runs outside group_step (it needs none of the
-- prelude's state) and takes only the keys it needs. If any of the group's deadlines has passed
-- it changes nothing and answers 'DUE': the caller applies them (expire_deadlines) and sends the
-- heartbeat again, so deadlines still act first, as in every other step.
-- keys[1] cfg  keys[2] due  keys[3] group  keys[4] members  keys[5] statics  keys[6] deadlines
-- keys[7] hint
--   (named in rcoord/contract.py HEARTBEAT_KEYS; rcoord/keys.py GroupKeys.heartbeat_keys)
-- The state constants (EMPTY ... DEAD) come from the library's header (rcoord/contract.py).
-- ARGV[1] now ms or ''   ARGV[2] group id
-- ARGV[3..] one or more triples: member id, generation id, group instance id ('' = none)
--   (several members of one group heartbeat in one call: GroupCoordinator.heartbeat_many)
-- Returns an array with the Kafka error name for each triple ('NONE' on success), or 'DUE'.
-- Refuses (RCOORD_NOT_COORDINATOR, as prelude.lua read_settings) a partition with no settings
-- copy: the caller's partition count is stale, and it settles again and re-addresses.

local function heartbeat_one(k_members, k_static, k_dl, state, gen, now, member_id, generation,
                             iid)
  if not state then return 'UNKNOWN_MEMBER_ID' end
  if state == DEAD then return 'COORDINATOR_NOT_AVAILABLE' end
  -- ClassicGroup.validateMember
  if iid ~= '' then
    local existing = redis.call('HGET', k_static, iid)
    if not existing then return 'UNKNOWN_MEMBER_ID' end
    if existing ~= member_id then return 'FENCED_INSTANCE_ID' end
  end
  local blob = redis.call('HGET', k_members, member_id)
  if not blob then return 'UNKNOWN_MEMBER_ID' end
  if gen ~= generation then return 'ILLEGAL_GENERATION' end
  if state == EMPTY then return 'UNKNOWN_MEMBER_ID' end
  -- Every other state refreshes the session: members heartbeat while they rejoin or sync.
  local at = now + member_session(blob)
  redis.call('ZADD', k_dl, at, 'hb:' .. member_id)
  if state == PREPARING then return 'REBALANCE_IN_PROGRESS', at end
  if state == COMPLETING or state == STABLE then return 'NONE', at end
  return 'UNKNOWN_SERVER_ERROR', at -- not reachable: the state table has no other state
end

register('heartbeat', function(KEYS, ARGV)
  local k_cfg, k_due, k_group, k_members, k_static, k_dl, k_hint = KEYS[1], KEYS[2], KEYS[3],
    KEYS[4], KEYS[5], KEYS[6], KEYS[7]
  local group_id = ARGV[2]
  -- Malformed arguments are refused before anything is written (Redis does not undo a script
  -- that fails half-way: a short last triple failed after the triples before it had refreshed
  -- their sessions). rcoord/steps.py sends whole triples with int32 generations.
  local bad = #ARGV < 5 or (#ARGV - 2) % 3 ~= 0
    or (ARGV[1] ~= '' and not string.match(ARGV[1], '^%d+$'))
  for i = 4, #ARGV, 3 do
    local g = string.match(ARGV[i], '^%-?%d+$') and #ARGV[i] <= 12 and tonumber(ARGV[i])
    bad = bad or not g or g < -2147483648 or g > 2147483647
  end
  if bad then
    return redis.error_reply(RCOORD_BAD_ARGUMENT .. ' heartbeat: takes ARGV[1] now (empty or '
      .. 'a decimal integer), ARGV[2] the group id, then triples of member id, int32 '
      .. 'generation id and group instance id; got ' .. #ARGV .. ' arguments')
  end
  -- A group formed in a layout a change of the partition count then withdrew (its copy of the
  -- settings deleted: rcoord/settings.py) is not the group: answered here, its member stayed
  -- live there while the group formed again under the new count. Kafka answers a heartbeat
  -- sent to a broker that no longer coordinates the group NOT_COORDINATOR. (One EXISTS: the
  -- hot path reads nothing else of the settings.)
  if redis.call('EXISTS', k_cfg) == 0 then
    return redis.error_reply(RCOORD_NOT_COORDINATOR .. ' no settings at ' .. k_cfg ..
      ': the partition count is stale or the settings were lost')
  end
  local now, mock_time = read_clock(ARGV[1])

  local state, gen, ea = unpack(redis.call('HMGET', k_group, 'state', 'gen', 'ea'))
  gen = tonumber(gen)
  -- The group's 'ea' is the earliest deadline as published to the partition's due index, never
  -- later than the real one (deadline_index.lua). While it lies ahead, nothing is due, and a
  -- refreshed session needs publishing only if it falls before it (it never does in a steady
  -- group: sessions only move later).
  local published = published_of(ea)
  local look = state ~= false and (published == nil or (published and published <= now))
  if look then
    -- The published time has passed (or is not known): look at the deadlines themselves.
    -- A join completion or sync propagation still being written in chunks (the continuation
    -- 'cj' or 'cs', due at 0: prelude.lua) does not hold heartbeats back: the state and
    -- generation are already the new ones, so a heartbeat is answered as after a completion
    -- in one call (a member whose join reply is still pending sends the old generation, and the
    -- sync chunks never shorten a session a heartbeat refreshed). Nor does a passed
    -- offset-retention check ('gc', due when a group with offsets turns Stable): it changes no
    -- heartbeat's answer. Any other passed deadline acts first.
    local head = redis.call('ZRANGE', k_dl, 0, 2, 'WITHSCORES')
    for i = 1, #head, 2 do
      local name, at = head[i], tonumber(head[i + 1])
      if not (name == 'cj' or name == 'cs' or (name == 'gc' and at <= now)) then
        if at <= now then return 'DUE' end
        break
      end
    end
  end

  local moved = look
  local results = {}
  for i = 3, #ARGV, 3 do
    local code, at = heartbeat_one(k_members, k_static, k_dl, state, gen, now, ARGV[i],
      tonumber(ARGV[i + 1]), ARGV[i + 2])
    results[#results + 1] = code
    if at and (not published or at < published) then moved = true end -- (at: state ~= false)
  end
  -- After a look, publish the real earliest (a write only if it differs from 'ea').
  if moved then
    publish_earliest(k_dl, k_due, k_hint, k_group, group_id, true, ea or nil, now,
      mock_time)
  end
  return results
end, {'allow-oom'})
-- allow-oom: under used memory above maxmemory (noeviction) Redis refuses every function at
-- its start unless it is flagged so. A heartbeat writes a few fixed-size entries of a group
-- that exists (a known member's session deadline; the group's published earliest deadline,
-- its 'ea' field and hint key), never more per call, and answers 'DUE' without writing when a
-- deadline must act first (expire_deadlines is still refused), so it keeps members' sessions
-- alive, as Kafka's coordinator answers heartbeats from memory while its log cannot be
-- written. Refused, every worker counted its partitions lost after a session of full memory,
-- and the first step once memory was freed expired every member.
