-- leave_group.lua: Kafka's LeaveGroup (classicGroupLeaveToClassicGroup), batch form (KIP-345).
-- keys: the group layout of prelude.lua (keys[1]..keys[16]); ARGV: the function's args.
-- ARGV[1] now ms or ''   ARGV[2] group id
-- ARGV[3] cmsgpack array of {member id, group instance id ('' = none)}, in request order
-- Returns {top-level error name, {per-member error names in request order}}.

local function parse_leave_group(ARGV)
  local leaving = cmsgpack.unpack(ARGV[3])
  for _, m in ipairs(leaving) do
    if type(m[1]) ~= 'string' or type(m[2]) ~= 'string' then
      error('ARGV[3] must be an array of {member id, group instance id} strings', 0)
    end
  end
  return leaving
end

local function leave_group(leaving)
  local results = {}
  if not group_exists() then
    for i = 1, #leaving do results[i] = 'UNKNOWN_MEMBER_ID' end
    return {'NONE', results}
  end
  if G.state == DEAD then
    return {'COORDINATOR_NOT_AVAILABLE', results}
  end

  -- Every named member is checked first, in request order, as if the earlier ones had already
  -- left (a member named twice, or by member id after its instance id, is unknown the second
  -- time); then all of them are removed together and the group-level work runs once. What the
  -- checks read (member records, pending ids, static owners) is read for the whole request
  -- first, a few batched HMGETs instead of three commands per member; nothing is written
  -- before every check is done, so the batch reads stay true.
  local blobs, pending, owners = {}, {}, {}
  local function prefetch(key, names, into)
    local list, seen = {}, {}
    for _, name in ipairs(names) do
      if name ~= '' and not seen[name] and into[name] == nil then
        seen[name] = true
        list[#list + 1] = name
      end
    end
    for i = 1, #list, BATCH do
      local last = math.min(i + BATCH - 1, #list)
      local values = redis.call('HMGET', key, unpack(list, i, last))
      for j = i, last do into[list[j]] = values[j - i + 1] end
    end
  end
  local mids, iids = {}, {}
  for i, m in ipairs(leaving) do mids[i], iids[i] = m[1], m[2] end
  prefetch(K_MEMBERS, mids, blobs)
  if redis.call('HLEN', K_PENDING) > 0 then prefetch(K_PENDING, mids, pending) end
  prefetch(K_STATIC, iids, owners)
  local function owner_of(iid)
    if owners[iid] == nil then prefetch(K_STATIC, {iid}, owners) end
    return owners[iid] or nil
  end

  local gone, gone_static, recs, leaving_ids = {}, {}, {}, {}
  local function mark(id)
    gone[id] = true
    leaving_ids[#leaving_ids + 1] = id
    if blobs[id] == nil then prefetch(K_MEMBERS, {id}, blobs) end
    local rec = blobs[id] and cmsgpack.unpack(blobs[id]) or nil
    recs[id] = rec or false
    if rec and rec.iid ~= '' and owner_of(rec.iid) == id then gone_static[rec.iid] = true end
  end
  local function static_owner(iid)
    if iid == '' or gone_static[iid] then return nil end
    return owner_of(iid)
  end
  local function check_member(mid, iid) -- prelude validate_member, seeing earlier removals
    if iid ~= '' then
      local existing = static_owner(iid)
      if not existing then return 'UNKNOWN_MEMBER_ID' end
      if existing ~= mid then return 'FENCED_INSTANCE_ID' end
    end
    if gone[mid] or not blobs[mid] then return 'UNKNOWN_MEMBER_ID' end
    return nil
  end

  local any_left = false
  for i, m in ipairs(leaving) do
    local mid, iid = m[1], m[2]
    local err = nil
    if mid == '' then
      -- Administrative removal by instance id.
      local current = static_owner(iid)
      if current then mark(current) else err = 'UNKNOWN_MEMBER_ID' end
    elseif not gone[mid] and pending[mid] then
      mark(mid)
    else
      err = check_member(mid, iid)
      if not err then mark(mid) end
    end
    results[i] = err or 'NONE'
    if not err then any_left = true end
  end
  remove_members(leaving_ids, recs)

  if any_left then
    if G.state == STABLE or G.state == COMPLETING then
      maybe_prepare_rebalance_or_complete_join('members left the group')
    elseif G.state == PREPARING then
      maybe_complete_join_phase()
    end
  end
  return {'NONE', results}
end

group_step('leave_group', leave_group, parse_leave_group, {settles = true, argc = 3})
