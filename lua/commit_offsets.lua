-- commit_offsets.lua: Kafka's OffsetCommit for a classic group (OffsetMetadataManager.commitOffset
-- and ClassicGroup.validateOffsetCommit), all partitions in one atomic step: either every accepted
-- partition is stored or, on a group-level error, none is.
-- keys: the group layout of prelude.lua (keys[1]..keys[16]); offsets live in keys[13].
-- ARGV[1] now ms or ''   ARGV[2] group id   ARGV[3] member id   ARGV[4] generation id
-- ARGV[5] group instance id ('' = none)
-- ARGV[6] retention ms ('' = the group's retention; at most 2^52, so NOW + it stays exact)
-- ARGV[7] cmsgpack array of {field, offset, metadata, leader epoch (-1 = none), metadata length
--         [, 1: metadata longer than the setting the caller knew, not sent: refused]}
--         where field = '<partition>:<topic>'; offset and leader epoch are decimal strings,
--         stored as they came: Lua numbers are doubles and Kafka's offsets are int64
-- Returns {group-level error name, {per-partition error names in request order}}.

local function parse_commit_offsets(ARGV)
  -- (at most 2^52: explicit_expiry adds it to the clock, and NOW + it must stay exact)
  if ARGV[6] ~= '' and not (string.match(ARGV[6], '^%d+$') and tonumber(ARGV[6]) <= 2 ^ 52) then
    error('ARGV[6] (retention ms) must be empty or a decimal integer <= 2^52', 0)
  end
  -- Whether ``s`` is a decimal integer in [-max - 1, max], ``max`` and ``max + 1`` given as
  -- digits: compared as text, as a Lua number (a double) cannot hold every int64.
  local function decimal_in(s, max, min)
    local sign, digits = string.match(s, '^(%-?)0*(%d+)$')
    if not digits then return false end
    local limit = sign == '-' and min or max
    return #digits < #limit or (#digits == #limit and digits <= limit)
  end
  local entries = cmsgpack.unpack(ARGV[7])
  -- Offsets and epochs are stored as they came, and every fetch of the group decodes every
  -- field and record (rcoord/protocol/offsets.py decode_fetch; the gateway encodes them as
  -- Kafka's INT32 partition, INT64 offset and INT32 epoch), so one that does not decode or
  -- fit is refused here: stored, it failed every fetch of the group's offsets.
  for _, e in ipairs(entries) do
    -- (the partition as field_of writes it: '07:t' would be a second field of partition 7)
    local partition = type(e[1]) == 'string' and string.match(e[1], '^(%d+):.')
    if not partition or (#partition > 1 and string.sub(partition, 1, 1) == '0')
        or not decimal_in(partition, '2147483647', '2147483648')
        or type(e[2]) ~= 'string'
        or not decimal_in(e[2], '9223372036854775807', '9223372036854775808')
        or type(e[3]) ~= 'string' or type(e[4]) ~= 'string'
        or not decimal_in(e[4], '2147483647', '2147483648') or type(e[5]) ~= 'number' then
      error('ARGV[7] (offsets): each entry must be {field <partition>:<topic> (an int32 '
        .. 'partition, no leading zero), decimal offset (int64), metadata, decimal leader epoch '
        .. '(int32), metadata length}', 0)
    end
  end
  return {member_id = ARGV[3], generation = tonumber(ARGV[4]), iid = ARGV[5],
          retention = ARGV[6], entries = entries}
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

-- The records of one commit, built before anything is written: the per-partition answers, the
-- HSET arguments in batches of 256 partitions, and the last record stored (nil when every
-- partition was refused). Every record of one commit has the same commit time and expiry.
-- ``max_metadata``: the offset_metadata_max_bytes setting (called only when a partition has
-- metadata, so the common commit reads no setting for it).
local function offset_records(entries, now, expire, max_metadata)
  local results, batches, batch, stored = {}, {}, {}, nil
  for i, e in ipairs(entries) do
    if e[6] or (e[5] > 0 and e[5] > max_metadata()) then
      results[i] = 'OFFSET_METADATA_TOO_LARGE'
    else
      stored = {o = e[2], m = e[3], le = e[4], t = now, x = expire}
      batch[#batch + 1] = e[1]
      batch[#batch + 1] = cmsgpack.pack(stored)
      if #batch >= 512 then
        batches[#batches + 1] = batch
        batch = {}
      end
      results[i] = 'NONE'
    end
  end
  if #batch > 0 then batches[#batches + 1] = batch end
  return results, batches, stored
end

local function write_offsets(batches)
  for _, batch in ipairs(batches) do redis.call('HSET', K_OFFSETS, unpack(batch)) end
end

local function explicit_expiry(req, now)
  if req.retention == '' then return -1 end
  return now + tonumber(req.retention)
end

local function commit_offsets(req)
  local entries = req.entries
  local err, session = validate_commit(req)
  if err then
    local results = {}
    for i = 1, #entries do results[i] = err end
    return {err, results}
  end

  -- A commit from a member of the current generation counts as a heartbeat.
  if session and (G.state == STABLE or G.state == PREPARING) then
    reschedule_heartbeat(req.member_id, session)
  end

  local results, batches, stored = offset_records(entries, NOW, explicit_expiry(req, NOW),
    function() return CFG.offset_metadata_max_bytes end)
  write_offsets(batches)
  if stored then schedule_offset_expiry(stored) end
  return {'NONE', results}
end

-- The common commit without the wrapper: a member of the current generation of a Stable or
-- PreparingRebalance group that has nothing due, whose commit moves no deadline before the
-- published one (so nothing is applied, published or woken: the wrapper would only read). It
-- reads what the step reads and writes what the step writes, in the same order; any other case
-- returns nil before writing anything, and the step runs in the wrapper (which reads again:
-- only the rare cases pay twice). A simple commit (generation -1) goes there at once.
local COMMIT_SETTINGS = {'num_partitions', 'group_max_size', 'offsets_retention_ms',
  'offset_metadata_max_bytes', 'offsets_retention_check_interval_ms'}
local COMMIT_GROUP_FIELDS = {'state', 'gen', 'ea', 'ptype', 'subs', 'capchk', 'gcw'}
local function commit_fast(keys, args, req)
  if req.generation < 0 or req.member_id == '' then return nil end
  bind_group_keys(keys)
  local now = read_clock(args[1])
  local cfg = redis.call('HMGET', K_CFG, unpack(COMMIT_SETTINGS))
  if not cfg[1] then return nil end -- (the step answers NOT_COORDINATOR)
  local state, gen_now, ea, ptype, subs, capchk, walk =
    unpack(redis.call('HMGET', K_GROUP, unpack(COMMIT_GROUP_FIELDS)))
  if state ~= STABLE and state ~= PREPARING then return nil end
  local published = published_of(ea)
  if not published or published <= now then return nil end -- (due, or not known: apply_due)
  if state == STABLE
      and tonumber(capchk or '-1') ~= (tonumber(cfg[2]) or DEFAULTS.group_max_size) then
    return nil -- (apply_due's capacity check)
  end
  if tonumber(gen_now) ~= req.generation then return nil end
  if req.iid ~= '' and redis.call('HGET', K_STATIC, req.iid) ~= req.member_id then return nil end
  local blob = redis.call('HGET', K_MEMBERS, req.member_id)
  if not blob then return nil end
  local session_at = now + member_session(blob)
  if session_at < published then return nil end
  local results, batches, stored = offset_records(req.entries, now, explicit_expiry(req, now),
    function() return tonumber(cfg[4]) or DEFAULTS.offset_metadata_max_bytes end)
  -- (the retention timer, if it runs in this state, counts from the commit)
  local gc_at = nil
  if stored and expiration_base_of(ptype, state, subs) == 'commit' then
    gc_at = retention_check_at(
      expiry_of(stored, 'commit', tonumber(cfg[3]) or DEFAULTS.offsets_retention_ms), now,
      tonumber(cfg[5]) or DEFAULTS.offsets_retention_check_interval_ms)
    if gc_at < published then return nil end
    if walk then return nil end -- (a retention walk in progress learns of it: the step)
  end
  redis.call('ZADD', K_DL, session_at, hb_key(req.member_id))
  write_offsets(batches)
  if gc_at then redis.call('ZADD', K_DL, 'LT', gc_at, 'gc') end
  return {'NONE', results}
end

-- (brief, and 'subs' and 'gcw' in the first read: the retention schedule asks for both.)
local COMMIT_FIELDS = {'subs', 'gcw'}
group_step('commit_offsets', commit_offsets, parse_commit_offsets,
  {brief = true, fields = function() return COMMIT_FIELDS end, argc = 7,
   ints = {{4, 'generation_id'}}, fast = commit_fast})
