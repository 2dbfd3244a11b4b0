-- commit_offsets.lua: Kafka's OffsetCommit for a classic group (OffsetMetadataManager.commitOffset
-- and ClassicGroup.validateOffsetCommit), all partitions in one atomic step: either every accepted
-- partition is stored or, on a group-level error, none is.
-- keys: the group layout of prelude.lua (keys[1]..keys[16]); offsets live in keys[13].
-- ARGV[1] now ms or ''   ARGV[2] group id   ARGV[3] member id   ARGV[4] generation id
-- ARGV[5] group instance id ('' = none)
-- ARGV[6] retention ms ('' = the group's retention; at most 2^52, so NOW + it stays exact)
-- ARGV[7] cmsgpack array of {field, offset, metadata, leader epoch (-1 = none), metadata length}
--         where field = '<partition>:<topic>'; offset and leader epoch are decimal strings,
--         stored as they came: Lua numbers are doubles and Kafka's offsets are int64
-- Returns {group-level error name, {per-partition error names in request order}}.

local function parse_commit_offsets(ARGV)
  return {member_id = ARGV[3], generation = tonumber(ARGV[4]), iid = ARGV[5],
          retention = ARGV[6], entries = cmsgpack.unpack(ARGV[7])}
end

-- nil and the committing member's session timeout (nil for a simple commit), or the
-- group-level error.
local function validate_commit(req)
  local generation, member_id = req.generation, req.member_id
  if not group_exists() then
    if generation >= 0 then return 'GROUP_ID_NOT_FOUND' end
    create_group() -- a "simple" group, used only for offsets
    return nil
  end
  if G.state == DEAD then return 'COORDINATOR_NOT_AVAILABLE' end
  if generation < 0 and G.state == EMPTY then return nil end
  local session = nil
  if generation >= 0 or member_id ~= '' or req.iid ~= '' then
    local err
    err, session = validate_member(member_id, req.iid, true)
    if err then return err end
    if generation ~= gen() then return 'ILLEGAL_GENERATION' end
  elseif G.state ~= EMPTY then
    return 'UNKNOWN_MEMBER_ID'
  end
  if G.state == COMPLETING then return 'REBALANCE_IN_PROGRESS' end
  return nil, session
end

local function commit_offsets(req)
  local entries = req.entries
  local err, session = validate_commit(req)
  local results = {}
  if err then
    for i = 1, #entries do results[i] = err end
    return {err, results}
  end

  -- A commit from a member of the current generation counts as a heartbeat.
  if session and (G.state == STABLE or G.state == PREPARING) then
    reschedule_heartbeat(req.member_id, session)
  end

  local expire = -1
  if req.retention ~= '' then expire = NOW + tonumber(req.retention) end
  -- Every record of one commit has the same commit time and expiry, so one expiry schedule
  -- covers them all; fields are written in HSET batches (one command per 256 partitions).
  local stored, batch = nil, {}
  local function flush()
    if #batch > 0 then redis.call('HSET', K_OFFSETS, unpack(batch)) end
    batch = {}
  end
  for i, e in ipairs(entries) do
    -- (empty metadata always fits: no settings read for the common commit)
    if e[5] > 0 and e[5] > CFG.offset_metadata_max_bytes then
      results[i] = 'OFFSET_METADATA_TOO_LARGE'
    else
      stored = {o = e[2], m = e[3], le = e[4], t = NOW, x = expire}
      batch[#batch + 1] = e[1]
      batch[#batch + 1] = cmsgpack.pack(stored)
      if #batch >= 512 then flush() end
      results[i] = 'NONE'
    end
  end
  flush()
  if stored then schedule_offset_expiry(stored) end
  return {'NONE', results}
end

-- (brief, and 'subs' in the first read: the retention schedule asks whether it is there.)
local COMMIT_FIELDS = {'subs'}
group_step('commit_offsets', commit_offsets, parse_commit_offsets,
  {brief = true, fields = function() return COMMIT_FIELDS end})
