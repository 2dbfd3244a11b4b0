-- prelude.lua: the shared part of the rcoord Functions library (rcoord/scripts.py assembles
-- the library: clock.lua, deadline_index.lua, this file, then one file per step). Everything here
-- is defined once, when the library loads; a call only sets the per-call state (begin()) and runs
-- its step inside group_step(), which applies due deadlines, runs the step and finishes.
--
-- Every group step receives the same keys (rcoord/keys.py documents them; the library's header,
-- rendered by rcoord/contract.py, binds them to the K_* locals by name in this order):
--   keys[1]  cfg       hash   namespace settings, this partition's copy
--   keys[2]  groups    set    group ids of this partition
--   keys[3]  due       zset   group id -> earliest deadline of the group
--   keys[4]  group     hash   state, gen, ptype, pname, leader, timer arguments, P:<protocol> counts
--   keys[5]  members   hash   member id -> member record (cmsgpack)
--   keys[6]  statics   hash   group instance id -> member id
--   keys[7]  pending   hash   member ids handed out with MEMBER_ID_REQUIRED, not yet joined
--   keys[8]  joining   hash   member ids with a parked JoinGroup
--   keys[9]  psync     hash   member ids expected to send SyncGroup this generation
--   keys[10] replies   hash   'j:<member>' | 's:<member>' -> reply to a parked Join/SyncGroup
--   keys[11] wake      stream wake-ups for parked callers
--   keys[12] deadlines zset   'hb:<member>' | 'join' | 'sync' -> deadline (ms)
--   keys[13] offsets   hash   committed offsets
--   keys[14] hint      string expires when the group's earliest deadline falls due (a wake-up
--                             hint for coordinators that listen to expired-key events)
--   keys[15] events    stream this partition's group transitions and member expiries (capped),
--                             which coordinators turn into logs and metrics
--   keys[16] order     zset   member id -> its join sequence number (leader election)
-- and the same first arguments (ARGV in the step files):
--   ARGV[1]  now in ms, or '' to read Redis TIME (the one clock; tests may pass a mock time)
--   ARGV[2]  group id
-- Protocol errors are returned inside replies by Kafka name; invariant violations are error
-- replies starting with RCOORD_ILLEGAL_STATE (rcoord/errors.py maps both).
--
-- The header in front of the library (rcoord/contract.py renders it from the Python) defines
-- what both languages share: the state constants EMPTY, PREPARING, COMPLETING, STABLE, DEAD
-- and VALID_PREVIOUS (rcoord/state.py), DEFAULTS and SETTINGS_FIELDS (rcoord/config.py), the
-- K_* key locals and bind_group_keys (rcoord/keys.py order), and one constant per named error
-- reply, RCOORD_* (rcoord/errors.py).
--
-- Functions may not create globals, and the library's locals (the upvalues below) outlive a
-- call: begin() sets every per-call value at the start of each call.

local GROUP_ID, NOW, MOCK_TIME

-- Settings: DEFAULTS and SETTINGS_FIELDS come from the header (rcoord/config.py).
-- The partition's copy of the settings is also the proof that the caller's layout is the
-- namespace's: keys are named by (partition count, partition), and copies exist only for the
-- agreed count (rcoord/settings.py). No copy means a stale count or lost settings; nothing is
-- written, and the caller settles the namespace again and retries (Kafka's NOT_COORDINATOR).
-- Every step needs the copy's existence and group_max_size (apply_due's capacity check), and a
-- step that completes a join or propagates a sync join_chunk_members (a field more in a read
-- costs far less than a read), so those come in the first read; the other settings are read,
-- all at once, by the first step that asks for one (offsets_retention_ms: a commit that
-- schedules the retention check asks for the check interval too, and the retention walk's page
-- of up to 250 offsets costs a thousand times the read). A brief step (read_group), which
-- meets a chunk only when it continues one, leaves join_chunk_members out: each field an HMGET
-- names costs a few tenths of a microsecond, and that is a part of every sweep's and await's
-- fixed cost.
-- Fills ``cfg`` with every setting from ``values``, an HMGET reply whose SETTINGS_FIELDS
-- start at index ``first``.
local function fill_settings(cfg, values, first)
  for i, field in ipairs(SETTINGS_FIELDS) do
    rawset(cfg, field, tonumber(values[first + i - 1]) or DEFAULTS[field])
  end
  return cfg
end
local CFG_META = {__index = function(cfg, name)
  if name == 'join_chunk_members' then -- (no default: false when unset, chunk_size)
    local value = tonumber(redis.call('HGET', K_CFG, name)) or false
    rawset(cfg, name, value)
    return value
  end
  if DEFAULTS[name] == nil then return nil end
  fill_settings(cfg, redis.call('HMGET', K_CFG, unpack(SETTINGS_FIELDS)), 1)
  return rawget(cfg, name)
end}
local CFG = {}
-- Reads the partition's settings copy into CFG; an error reply when there is none.
-- ``all``: every setting in the same read (JoinGroup uses several; other steps use the two);
-- ``brief``: a brief step's (group_step's opts.brief).
local function read_settings(all, brief)
  local values
  if all then
    values = redis.call('HMGET', K_CFG, 'num_partitions', 'join_chunk_members',
      unpack(SETTINGS_FIELDS))
  elseif brief then
    values = redis.call('HMGET', K_CFG, 'num_partitions', 'group_max_size')
  else
    values = redis.call('HMGET', K_CFG, 'num_partitions', 'group_max_size', 'join_chunk_members')
  end
  if not values[1] then
    return redis.error_reply(RCOORD_NOT_COORDINATOR .. ' no settings at ' .. K_CFG ..
      ': the partition count is stale or the settings were lost')
  end
  if all then
    CFG = fill_settings({num_partitions = tonumber(values[1]),
      join_chunk_members = tonumber(values[2]) or false}, values, 3)
    return nil
  end
  CFG = setmetatable({num_partitions = tonumber(values[1]),
    group_max_size = tonumber(values[2]) or DEFAULTS.group_max_size}, CFG_META)
  if not brief then CFG.join_chunk_members = tonumber(values[3]) or false end
  return nil
end

-- A record of what happened, for logs and metrics (the stream is capped; events are a view).
local function event(kind, ...)
  redis.call('XADD', K_EVENTS, 'MAXLEN', '~', '1000', '*', 'e', kind, 'g', GROUP_ID, 'at',
    string.format('%d', NOW), ...)
end

local function illegal(msg)
  return error({err = RCOORD_ILLEGAL_STATE .. ' ' .. msg})
end

-- Group hash, cached in G and written through. The fields a step reads first (GROUP_READS, from
-- the header: rcoord/contract.py GROUP_CORE_FIELDS or GROUP_BRIEF_FIELDS) come in one HMGET;
-- any other is read on first use (G_SEEN remembers the ones read absent), so a call never reads
-- the whole hash (protocol counts, timer arguments) for one field. Every call builds G, so it
-- is made in one allocation (the read's ``of``) and G_SEEN only when a field outside the first
-- read is read.
local READ = GROUP_READS.full -- the fields this call read first (read_group)
local G_SEEN = nil
local G_WRITES, G_WRITE_ORDER = nil, nil -- (set_g, below)
local G_META = {__index = function(g, field)
  if READ.set[field] then return nil end -- in this call's first read: absent
  if G_WRITES and G_WRITES[field] == false then return nil end -- deleted in this call
  if G_SEEN == nil then G_SEEN = {} elseif G_SEEN[field] then return nil end
  G_SEEN[field] = true
  local value = redis.call('HGET', K_GROUP, field)
  if not value then return nil end
  rawset(g, field, value)
  return value
end}
local G = {}
local function new_group_table() return setmetatable({}, G_META) end
-- ``extra``: fields outside the first read that this call will read (a step names them from its
-- request: group_step's ``fields``), fetched in the same HMGET instead of one HGET each.
-- ``brief``: the step changes no membership, and reads GROUP_READS.brief instead of .full
-- (rcoord/contract.py GROUP_BRIEF_FIELDS says why).
local function read_group(extra, brief)
  G_SEEN = nil
  READ = brief and GROUP_READS.brief or GROUP_READS.full
  if extra == nil or #extra == 0 then
    G = setmetatable(READ.of(redis.call('HMGET', K_GROUP, unpack(READ.names))), G_META)
    return
  end
  local names = {unpack(READ.names)}
  for _, field in ipairs(extra) do names[#names + 1] = field end
  local values = redis.call('HMGET', K_GROUP, unpack(names))
  G = setmetatable(READ.of(values), G_META)
  G_SEEN = {}
  for i, field in ipairs(extra) do
    local value = values[#READ.names + i]
    if value then rawset(G, field, value) else G_SEEN[field] = true end
  end
end
local function group_exists() return G.state ~= nil end

-- The partition's due index holds, for each group, a time no later than the group's earliest
-- deadline (a lower bound, not the exact earliest), and the group hash's 'ea' field holds the
-- same value ('-': the group has no deadline and is not in the index; absent: not known). So
-- a write that postpones a deadline, or removes one, leaves the index alone: a coordinator (or
-- a parked caller) that comes at the old time finds nothing due and publishes the real earliest
-- then (apply_due). In a steady group the member whose session is the earliest is the next to
-- heartbeat, so an exact index had to be rewritten by nearly every heartbeat; a lower bound is
-- rewritten about once per session timeout. Only a deadline earlier than the published one must
-- be published at once, or it would be acted on late; every write to the group's deadlines
-- goes through schedule, schedule_by, cancel or call_batched, so finish() knows.
-- PUBLISHED: the published bound (false: none, nil: not known), from G.ea.
local DL_CHANGED = false
local PUBLISHED = nil
-- Notes a deadline written at ``at``: it must be published if it falls before the bound.
local function note_deadline_write(at)
  if DL_CHANGED then return end
  DL_CHANGED = not PUBLISHED or at < PUBLISHED
end
-- The group's earliest deadline as read in this call ({} when none; nil: not read since the
-- last write), so that the checks for due deadlines, the parked caller's wait and the
-- publication at the end read it once between two writes. Every write to the deadlines
-- forgets it (DL_HEAD = nil: schedule, schedule_by, cancel, call_batched, sync_chunk's ZADD,
-- delete_group).
local DL_HEAD = nil
local function dl_head()
  if DL_HEAD == nil then DL_HEAD = redis.call('ZRANGE', K_DL, 0, 0, 'WITHSCORES') end
  return DL_HEAD
end
-- Deadlines: this group's zset, and the partition index of each group's earliest deadline.
local function schedule(name, at)
  note_deadline_write(at)
  DL_HEAD = nil
  redis.call('ZADD', K_DL, at, name)
end
-- Due no later than ``at`` (an earlier deadline of that name stays).
local function schedule_by(name, at)
  note_deadline_write(at)
  DL_HEAD = nil
  redis.call('ZADD', K_DL, 'LT', at, name)
end
local function cancel(name)
  DL_HEAD = nil
  redis.call('ZREM', K_DL, name) -- the index stays a lower bound
end
-- Writes to the group hash through set_g / del_g are kept in G and sent together, one HSET
-- (and one HDEL) when the step finishes: a rebalance step changes a dozen fields (state, prev,
-- ts, gen, pname, the timer arguments, the wake id ...), and each command inside a function
-- costs a few tenths of a microsecond besides its work (bench/lua_cost.py) and is one more
-- command in the replication stream. Every command that writes the hash directly (g_call,
-- call_batched) sends the collected writes first, so the hash sees every write in the order
-- the step made it.
local function note_g(field, value)
  if G_WRITES == nil then G_WRITES, G_WRITE_ORDER = {}, {} end
  if G_WRITES[field] == nil then G_WRITE_ORDER[#G_WRITE_ORDER + 1] = field end
  G_WRITES[field] = value
end
local function set_g(field, value)
  local v = tostring(value)
  G[field] = v
  note_g(field, v)
end
local function del_g(field)
  G[field] = nil
  note_g(field, false)
end
local function flush_g()
  if G_WRITES == nil then return end
  local sets, dels = {}, {}
  for _, field in ipairs(G_WRITE_ORDER) do
    local v = G_WRITES[field]
    if v then
      sets[#sets + 1] = field
      sets[#sets + 1] = v
    else
      dels[#dels + 1] = field
    end
  end
  G_WRITES, G_WRITE_ORDER = nil, nil
  if #sets > 0 then redis.call('HSET', K_GROUP, unpack(sets)) end
  if #dels > 0 then redis.call('HDEL', K_GROUP, unpack(dels)) end
end
-- A direct write to the group hash, after the writes set_g collected (fields set_g does not
-- keep: chunk parts).
local function g_call(cmd, ...)
  flush_g()
  return redis.call(cmd, K_GROUP, ...)
end
local function gen() return tonumber(G.gen or '0') end

local function create_group()
  G = new_group_table()
  set_g('state', EMPTY)
  set_g('prev', EMPTY)
  set_g('gen', 0)
  set_g('ptype', '')
  set_g('pname', '')
  set_g('leader', '')
  set_g('ts', NOW)
  set_g('created', NOW)
  -- What tells this incarnation of the group from one made again under its id after a
  -- deletion (group_incarnation): 'created' alone does not, a group made again within the same
  -- millisecond (or at the same mock time) sharing it, so Redis TIME's microseconds follow it,
  -- read even under a mock time. A record an older rcoord made has no 'inc': 'created' stands.
  local t = redis.call('TIME')
  set_g('inc', string.format('%d.%s%06d', NOW, t[1], tonumber(t[2])))
  set_g('oq', 1) -- the group keeps its members' join order in K_ORDER (oldest_member)
  -- A group deleted by a call that woke its parked callers leaves its wake stream for a
  -- minute (finish): a group made again under the id meanwhile waits after that stream's
  -- last entry, not '0-0', which the old entries would answer at once, again and again.
  local last = redis.call('XREVRANGE', K_WAKE, '+', '-', 'COUNT', 1)
  if #last > 0 then
    set_g('wid', last[1][1])
    redis.call('PERSIST', K_WAKE)  -- the stream is this group's now
  end
  redis.call('SADD', K_GROUPS, GROUP_ID)
  -- An Empty group with no offsets is removed after the retention check interval.
  schedule_by('gc', NOW + CFG.offsets_retention_check_interval_ms)
end

local function transition(to)
  local from = G.state
  if not VALID_PREVIOUS[to][from] then
    local names = {}
    for s, _ in pairs(VALID_PREVIOUS[to]) do names[#names + 1] = s end
    table.sort(names)
    illegal('Group ' .. GROUP_ID .. ' should be in one of the states {' ..
      table.concat(names, ', ') .. '} before moving to ' .. to ..
      ' state. Instead it is in ' .. tostring(from) .. ' state.')
  end
  set_g('prev', from)
  set_g('state', to)
  set_g('ts', NOW)
  -- A rebalance runs from entering PreparingRebalance to reaching Stable (or Empty).
  local took = ''
  if to == PREPARING and from ~= PREPARING then
    set_g('rbts', NOW)
  elseif (to == STABLE or to == EMPTY) and G.rbts then
    took = string.format('%d', NOW - tonumber(G.rbts))
    del_g('rbts')
  end
  event('transition', 'from', from or '', 'to', to, 'gen', G.gen or '0', 'took', took,
    'why', G.reason or '')
  -- Entering Empty or Stable changes which offsets may expire (KIP-211): re-examine them (the
  -- retention timer, due now, runs expire_offsets in a later call). A Stable group with no
  -- offsets has none to re-examine (its first commit schedules the timer), so after each
  -- rebalance of such a group nothing is published for a coordinator to come and apply.
  if to == EMPTY or (to == STABLE and redis.call('HLEN', K_OFFSETS) > 0) then
    schedule_by('gc', NOW)
  end
end


local function hb_key(id) return 'hb:' .. id end

-- Wake-ups and replies for parked callers.
local WAKE = false
local function wake() WAKE = true end
-- A reply slot per member and kind, so a join reply never overwrites an uncollected sync reply.
-- reply_field(kind, id): the header's (rcoord/contract.py REPLY_FIELD_SEPARATOR).
-- The reply slots this call wrote (SLOTS_NOW: field -> the reply) or cleared to park a call
-- (field -> true), and whether it has since written any reply or removed any member
-- (ANSWERED). A call that parked a member and answered nobody knows, without reading them,
-- that the slot is empty and the member waits, and a call that wrote a reply has it without
-- reading it back (reply_or_wait). Every write of a slot goes through here, call_batched or
-- slot_written, and a slot removed another way is forgotten.
local SLOTS_NOW, ANSWERED = nil, false
local function slot_written(field, blob)
  if SLOTS_NOW == nil then SLOTS_NOW = {} end
  SLOTS_NOW[field] = blob
end
local function park_slot(id, kind)
  local field = reply_field(kind, id)
  redis.call('HDEL', K_REPLIES, field)
  slot_written(field, true)
end
-- ``blob``: ``rep`` already encoded, when the caller built it from encoded parts (the leader's
-- join reply, join_chunk).
local function reply_put(id, rep, blob)
  ANSWERED = true
  rep.at = NOW
  local field = reply_field(rep.k, id)
  blob = blob or cmsgpack.pack(rep)
  redis.call('HSET', K_REPLIES, field, blob)
  slot_written(field, blob)
  wake()
end

-- Per-member writes go out in batches of this many arguments (Lua's unpack has a limit), so a
-- step that touches every member makes a few calls instead of one per member. Even, so that
-- field/value and score/member pairs never straddle two batches.
local BATCH = 1000
-- Notes deadlines written as ZADD score/member pairs (see note_deadline_write).
local function note_deadline_pairs(items)
  for i = 1, #items, 2 do note_deadline_write(tonumber(items[i])) end
end
-- The member records this call has read (mget) or written (mput), decoded, by id: a step
-- that reads a record again (the leader's, to select the protocol and again to complete the
-- join) has it without reading and decoding it again. Every write of the members hash goes
-- through mput (which keeps the entry true), call_batched or forget_members (which drop them
-- all); a record changed in place is written (mput) before anything reads it again.
local RECS = nil
-- The number of parked joins (the joining hash's length), read once per call and kept by the
-- HSET that parks a member (add_member, update_member: its reply counts the field added); any
-- other write of the hash forgets it (nil: not known). A member's join that asks whether the
-- group has room and then whether every member has joined reads it once.
local NJOINING = nil
local function call_batched(cmd, key, items)
  if key == K_MEMBERS and #items > 0 then RECS = nil end
  if key == K_JOINING then NJOINING = nil end
  if key == K_DL then
    DL_HEAD = nil
    if cmd == 'ZADD' then note_deadline_pairs(items) end
  end
  if key == K_GROUP then flush_g() end
  if key == K_REPLIES then
    if cmd == 'HSET' then
      ANSWERED = true
      for i = 1, #items, 2 do slot_written(items[i], items[i + 1]) end
    elseif SLOTS_NOW then -- (HDEL)
      for _, field in ipairs(items) do SLOTS_NOW[field] = nil end
    end
  end
  for i = 1, #items, BATCH do
    redis.call(cmd, key, unpack(items, i, math.min(i + BATCH - 1, #items)))
  end
end

-- HMGET of any number of fields, in batches.
local function hmget_batched(key, fields)
  local out = {}
  for i = 1, #fields, BATCH do
    local part = redis.call('HMGET', key, unpack(fields, i, math.min(i + BATCH - 1, #fields)))
    for j = 1, #part do out[#out + 1] = part[j] end
  end
  return out
end

-- Member records. A join or sync of a large group walks every member several times, so the
-- decoded records are cached for the rest of this call; writes go through mput (which keeps the
-- cache true) and removals drop the record from MEMBERS_BY_ID, the list is compacted lazily.
-- LEAD_POS: no live member sits before this position of the list (elect_leader starts there).
local MEMBERS_CACHE, MEMBERS_BY_ID, MEMBERS_DIRTY, LEAD_POS = nil, nil, false, 1
-- The member count (nmembers), read once per call and kept by the writes that change it (mput
-- adds, removals forget it).
local NMEMBERS = nil
local function forget_members() MEMBERS_CACHE, MEMBERS_BY_ID, RECS = nil, nil, nil end
-- A member record is one cmsgpack map whose first entry is the session timeout ('st'), so the
-- steps that need only that (a heartbeat, a commit's session refresh) decode one number instead
-- of the record (member_session). Whoever decodes the whole map (every other step; an older
-- rcoord during a rolling upgrade) reads the same record. Every record written goes through
-- member_blob; records an older rcoord wrote, 'st' anywhere, are decoded whole.
local function member_blob(rec)
  local st = rec.st
  rec.st = nil
  local body = cmsgpack.pack(rec)
  rec.st = st
  local b, n, rest = string.byte(body, 1), nil, nil
  if b >= 0x80 and b <= 0x8f then -- fixmap
    n, rest = b - 0x80, string.sub(body, 2)
  else -- map16 (0xde): a record never reaches map32's 65,536 entries
    n, rest = string.byte(body, 2) * 256 + string.byte(body, 3), string.sub(body, 4)
  end
  n = n + 1
  local head = n <= 15 and string.char(0x80 + n) or string.char(0xde, math.floor(n / 256), n % 256)
  return head .. '\162st' .. cmsgpack.pack(st) .. rest
end
local function member_session(blob)
  local at = string.byte(blob, 1) == 0xde and 4 or 2 -- the first key
  if string.sub(blob, at, at + 2) == '\162st' then
    local _, st = cmsgpack.unpack_one(blob, at + 2) -- (a 0-based offset: the value's)
    return st
  end
  return cmsgpack.unpack(blob).st
end
local function mget(id)
  if MEMBERS_BY_ID then return MEMBERS_BY_ID[id] end
  local rec = RECS and RECS[id]
  if rec then return rec end
  local blob = redis.call('HGET', K_MEMBERS, id)
  if not blob then return nil end
  rec = cmsgpack.unpack(blob)
  if RECS == nil then RECS = {} end
  RECS[id] = rec
  return rec
end
local function mput(rec)
  local added = redis.call('HSET', K_MEMBERS, rec.id, member_blob(rec))
  if NMEMBERS ~= nil then NMEMBERS = NMEMBERS + added end
  if MEMBERS_BY_ID and MEMBERS_BY_ID[rec.id] ~= rec then forget_members() end
  if RECS == nil then RECS = {} end
  RECS[rec.id] = rec
end
local function all_members()
  if MEMBERS_CACHE then
    if MEMBERS_DIRTY then
      local live = {}
      for _, rec in ipairs(MEMBERS_CACHE) do
        if MEMBERS_BY_ID[rec.id] == rec then live[#live + 1] = rec end
      end
      MEMBERS_CACHE, MEMBERS_DIRTY, LEAD_POS = live, false, 1
    end
    return MEMBERS_CACHE
  end
  local flat = redis.call('HGETALL', K_MEMBERS)
  local out, by_id, by_seq, seqs = {}, {}, {}, {}
  for i = 2, #flat, 2 do
    local rec = cmsgpack.unpack(flat[i])
    out[#out + 1] = rec
    by_id[rec.id] = rec
    if seqs and by_seq[rec.seq] == nil then
      by_seq[rec.seq] = rec
      seqs[#seqs + 1] = rec.seq
    else
      seqs = nil
    end
  end
  if seqs then
    -- Sorting the numbers alone is several times faster than sorting with a Lua comparator.
    table.sort(seqs)
    for i, seq in ipairs(seqs) do out[i] = by_seq[seq] end
  else
    table.sort(out, function(a, b) return a.seq < b.seq end)
  end
  MEMBERS_CACHE, MEMBERS_BY_ID, MEMBERS_DIRTY, LEAD_POS = out, by_id, false, 1
  return out
end
local function nmembers()
  if NMEMBERS == nil then NMEMBERS = redis.call('HLEN', K_MEMBERS) end
  return NMEMBERS
end
local function is_pending(id) return redis.call('HEXISTS', K_PENDING, id) == 1 end
local function awaiting_join(id) return redis.call('HEXISTS', K_JOINING, id) == 1 end
local function all_joined()
  NJOINING = NJOINING or redis.call('HLEN', K_JOINING)
  return nmembers() == NJOINING and redis.call('HLEN', K_PENDING) == 0
end
-- Decoded protocol lists by their encoding (members of a group mostly send the same one), so a
-- pass over every member decodes each distinct list once. Callers never modify them.
local PROTOCOLS = nil -- made on first use in a call
local function protocols_of(rec)
  if PROTOCOLS == nil then PROTOCOLS = {} end
  local list = PROTOCOLS[rec.pr]
  if list == nil then
    list = cmsgpack.unpack(rec.pr)
    PROTOCOLS[rec.pr] = list
  end
  return list
end
-- Kafka's isNew: set when the member is added, cleared when the next generation forms. The
-- generation it was added in (ng) clears it implicitly, so completing a join need not rewrite
-- every member record (records without ng are cleared explicitly).
local function is_new(rec) return rec.new == 1 and (rec.ng == nil or rec.ng == gen()) end
-- P:<protocol> counts how many members support a protocol; G keeps them current.
local function add_protocol_count(name, delta)
  local field = 'P:' .. name
  local n = tonumber(G[field] or '0') + delta
  if n <= 0 then del_g(field) else set_g(field, n) end
end
local function count_protocols(rec, delta)
  for _, p in ipairs(protocols_of(rec)) do add_protocol_count(p[1], delta) end
end
local function protocol_count(name) return tonumber(G['P:' .. name] or '0') end
local function metadata_for(rec, name)
  for _, p in ipairs(protocols_of(rec)) do
    if p[1] == name then return p[2] end
  end
  return ''
end

-- Kafka's ClassicGroup.supportsProtocols: an Empty group takes any non-empty type and list;
-- otherwise the type must match and one protocol must be supported by every member.
local function supports_protocols(ptype, protocols)
  if G.state == EMPTY then
    return ptype ~= '' and #protocols > 0
  end
  if G.ptype ~= ptype then return false end
  local n = nmembers()
  for _, p in ipairs(protocols) do
    if protocol_count(p[1]) == n then return true end
  end
  return false
end

-- Kafka's selectProtocol: every member votes for its most preferred candidate (a protocol all
-- members support); most votes wins, ties go to the smaller name so the choice is deterministic.
local function select_protocol()
  -- Every candidate (a protocol all members support) is in every member's list: when the
  -- leader's list holds exactly one, it wins the vote, and no other member is read.
  local n = nmembers()
  local probe = G.leader ~= '' and mget(G.leader)
  if probe then
    local only, found = nil, 0
    for _, p in ipairs(protocols_of(probe)) do
      if protocol_count(p[1]) == n then only, found = p[1], found + 1 end
    end
    if found == 1 then return only end
  end
  local members = all_members()
  n = #members
  local votes = {}
  for _, rec in ipairs(members) do
    for _, p in ipairs(protocols_of(rec)) do
      if protocol_count(p[1]) == n then
        votes[p[1]] = (votes[p[1]] or 0) + 1
        break
      end
    end
  end
  local best, best_votes = '', -1
  for name, v in pairs(votes) do
    if v > best_votes or (v == best_votes and name < best) then best, best_votes = name, v end
  end
  return best
end

-- The members' rebalance timeouts, kept as a count per value in the group field 'rtc' (cmsgpack
-- map timeout -> count; add_member, update_member and remove_members keep it), so the largest
-- is known without decoding every member: a LeaveGroup that starts a rebalance reads only the
-- members it removes. A group stored before the field existed counts its members once.
-- Callers that change the members read the counts before their first change of K_MEMBERS.
local function rt_counts()
  if G.rtc then return cmsgpack.unpack(G.rtc) end
  local counts = {}
  for _, rec in ipairs(all_members()) do counts[rec.rt] = (counts[rec.rt] or 0) + 1 end
  return counts
end
local function rt_update(counts, deltas)
  for rt, d in pairs(deltas) do
    local n = (counts[rt] or 0) + d
    if n > 0 then counts[rt] = n else counts[rt] = nil end
  end
  set_g('rtc', cmsgpack.pack(counts))
end
local function rebalance_timeout()
  local rt = 0
  for value, _ in pairs(rt_counts()) do
    if value > rt then rt = value end
  end
  return rt
end

local function current_members()
  local out = {}
  for _, rec in ipairs(all_members()) do
    out[#out + 1] = {id = rec.id, iid = rec.iid, meta = metadata_for(rec, G.pname)}
  end
  return out
end

local function join_reply(id, err, with_members, skip)
  local rep = {k = 'j', e = err, mid = id, gen = gen(), pt = G.ptype, pn = G.pname,
               ldr = G.leader, mem = {}, skip = skip or false}
  if with_members then rep.mem = current_members() end
  return rep
end
local function join_error(err, id) return {k = 'j', e = err, mid = id or '', gen = -1, ldr = '',
                                            mem = {}, skip = false} end
local function sync_error(err) return {k = 's', e = err, asg = ''} end

-- The members' join order, kept so that electing the oldest member reads no member record: the
-- order key (K_ORDER) scores each member id by the sequence number it joined with (add_member
-- adds it, remove_members removes it, a replaced static member's new id takes its score), so
-- its head is the oldest live member. It is a key of its own, not fields of the group hash:
-- a hash of a few dozen fields is a listpack, which the server searches field by field, and
-- a field per member would make every step's read of the group grow with the group.
-- Groups without it ('oq' absent: created by an older rcoord, which kept the order in group
-- fields 'o:<seq>') decode every member instead; remove_members still drops those fields.
local ORDER_SCAN = 100
local function order_field(seq) return 'o:' .. string.format('%d', seq) end
-- The id of the oldest member in the order key for which accept(id) is true (any member when
-- ``accept`` is nil), or nil.
local function oldest_member(accept)
  local start, batch = 0, 16 -- the member sought is usually near the head: a small first read
  while true do
    local ids = redis.call('ZRANGE', K_ORDER, start, start + batch - 1)
    for _, id in ipairs(ids) do
      if accept == nil or accept(id) then return id end
    end
    if #ids < batch then return nil end
    start = start + batch
    batch = ORDER_SCAN
  end
end

-- The oldest member leads: the order key's head. Without the key (or without any member in
-- it) the records decide; removed members stay in their cached list until it is compacted, so
-- that scan starts after the last removed leader: leaders removed one after another in one call
-- cost one pass over the list in all, not one each.
local function elect_leader()
  if G.oq then
    -- (Members an older rcoord added meanwhile are not in the order key: with none found
    -- there, the records decide.)
    local id = oldest_member()
    if id or nmembers() == 0 then
      set_g('leader', id or '')
      return
    end
  end
  if not MEMBERS_CACHE then all_members() end
  local best = ''
  while LEAD_POS <= #MEMBERS_CACHE do
    local rec = MEMBERS_CACHE[LEAD_POS]
    if MEMBERS_BY_ID[rec.id] == rec then
      best = rec.id
      break
    end
    LEAD_POS = LEAD_POS + 1
  end
  set_g('leader', best)
end

-- Finishes a join completion or a sync propagation that is still being written in chunks
-- (complete_join and propagate_assignment below), so a step that changes the members or the
-- generation sees it whole; true if there was one.
local settle_chunks

-- Elements i..j of a list (unpack has a limit).
local function slice(list, i, j)
  local out = {}
  for x = i, math.min(j, #list) do out[#out + 1] = list[x] end
  return out
end

-- Members per chunk of a join completion or a sync propagation: the partition settings field
-- join_chunk_members (tests set a small one), else:
local JOIN_CHUNK_MEMBERS = 100
local CHUNK_RAN = false -- a chunk was written in this call (apply_due writes at most one)
local function chunk_size()
  -- (Read with the settings by every step but a brief one: read_settings; false when unset.)
  return math.max(1, CFG.join_chunk_members or JOIN_CHUNK_MEMBERS)
end

-- ClassicGroup.add: the member is added with a parked JoinGroup.
local function add_member(id, req)
  -- Both checks before the first write (Redis keeps a failed call's earlier writes).
  local first = nmembers() == 0
  if not first and G.ptype ~= req.pt then
    illegal('The group and member protocol types must be the same')
  end
  if req.iid ~= '' and redis.call('HEXISTS', K_STATIC, req.iid) == 1 then
    illegal('Static member with groupInstanceId=' .. req.iid .. ' is already a member of ' .. GROUP_ID)
  end
  settle_chunks()
  local rtc = rt_counts()
  if req.iid ~= '' then redis.call('HSET', K_STATIC, req.iid, id) end
  if first then set_g('ptype', req.pt) end
  if G.leader == '' then set_g('leader', id) end
  forget_members()
  local rec = {id = id, iid = req.iid, cid = req.cid, host = req.host, st = req.st, rt = req.rt,
               pt = req.pt, pr = req.pr, subs = req.subs, asg = '', as = 0, new = 1, ng = gen(),
               seq = tonumber(G.seq or '0') + 1}
  set_g('seq', rec.seq)
  mput(rec)
  if G.oq then redis.call('ZADD', K_ORDER, rec.seq, id) end
  count_protocols(rec, 1)
  rt_update(rtc, {[rec.rt] = 1})
  local parked = redis.call('HSET', K_JOINING, id, 1)
  if NJOINING then NJOINING = NJOINING + parked end
  redis.call('HDEL', K_PENDING, id)
  park_slot(id, 'j')
  return rec
end

-- ClassicGroup.remove plus cancelling the session deadline, for any number of members at once:
-- every key is written with one call per batch, protocol counts once per protocol, and the
-- leader is elected once at the end, so removing k members costs O(k), not O(k * group size).
-- ``recs`` optionally maps ids to records the caller already read (others are read here).
-- Replies already stored stay: Kafka sent those responses before removing the members.
local function remove_members(ids, recs)
  if #ids == 0 then return end
  settle_chunks()
  local rtc, rt_deltas = rt_counts(), {}
  recs = recs or {}
  local uniq, seen, unread = {}, {}, {}
  for _, id in ipairs(ids) do
    if not seen[id] then
      seen[id] = true
      uniq[#uniq + 1] = id
      if recs[id] == nil then unread[#unread + 1] = id end
    end
  end
  if MEMBERS_BY_ID then
    for _, id in ipairs(unread) do recs[id] = MEMBERS_BY_ID[id] or false end
  else
    for i = 1, #unread, BATCH do
      local part = {unpack(unread, i, math.min(i + BATCH - 1, #unread))}
      local blobs = redis.call('HMGET', K_MEMBERS, unpack(part))
      for j = 1, #part do
        recs[part[j]] = blobs[j] and cmsgpack.unpack(blobs[j]) or false
      end
    end
  end
  local present, deltas, iids, iid_owner, hb, order = {}, {}, {}, {}, {}, {}
  local legacy_order = G.oi ~= nil -- (an older rcoord's order fields 'o:<seq>' to drop)
  for _, id in ipairs(uniq) do
    local rec = recs[id]
    if rec then
      present[#present + 1] = id
      if legacy_order and rec.seq then order[#order + 1] = order_field(rec.seq) end
      for _, p in ipairs(protocols_of(rec)) do deltas[p[1]] = (deltas[p[1]] or 0) - 1 end
      rt_deltas[rec.rt] = (rt_deltas[rec.rt] or 0) - 1
      if rec.iid ~= '' then
        iids[#iids + 1] = rec.iid
        iid_owner[#iids] = id
      end
      if MEMBERS_BY_ID and MEMBERS_BY_ID[id] then
        MEMBERS_BY_ID[id] = nil
        MEMBERS_DIRTY = true
      end
    end
    hb[#hb + 1] = hb_key(id)
  end
  call_batched('HDEL', K_MEMBERS, present)
  NMEMBERS, ANSWERED = nil, true
  if G.oq then call_batched('ZREM', K_ORDER, present) end
  if legacy_order then call_batched('HDEL', K_GROUP, order) end
  local names = {}
  for name, _ in pairs(deltas) do names[#names + 1] = name end
  table.sort(names)
  for _, name in ipairs(names) do add_protocol_count(name, deltas[name]) end
  if #present > 0 then rt_update(rtc, rt_deltas) end
  if #iids > 0 then
    local stale = {}
    for i = 1, #iids, BATCH do
      local last = math.min(i + BATCH - 1, #iids)
      local owners = redis.call('HMGET', K_STATIC, unpack(iids, i, last))
      for j = i, last do
        if owners[j - i + 1] == iid_owner[j] then stale[#stale + 1] = iids[j] end
      end
    end
    call_batched('HDEL', K_STATIC, stale)
  end
  -- These hashes are mostly empty (no parked join, pending id or awaited sync): one HLEN
  -- instead of a command naming every leaving member.
  for _, key in ipairs({K_JOINING, K_PENDING, K_PSYNC}) do
    if redis.call('HLEN', key) > 0 then call_batched('HDEL', key, uniq) end
  end
  call_batched('ZREM', K_DL, hb)
  if seen[G.leader] then elect_leader() end
  wake()
end

local function remove_member(id) remove_members({id}) end

-- ClassicGroup.updateMember: new protocols and timeouts; parked again when rejoining.
local function update_member(rec, req, parked)
  local settled = settle_chunks()
  if settled then
    -- The chunks rewrote the record the caller read: keep what they wrote.
    local now_rec = mget(rec.id) or rec
    rec.new, rec.as, rec.asg, rec.ag = now_rec.new, now_rec.as, now_rec.asg, now_rec.ag
  end
  -- A rejoin that changes nothing in the record (the usual one: the metadata, timeouts and
  -- subscriptions it had) does not write it again. (Its encoding would differ only in the
  -- order of the map's entries, which every decoding of the record ignores.)
  local same = not settled and rec.pr == req.pr and rec.rt == req.rt and rec.st == req.st
    and type(rec.subs) == 'table'
  if same then
    for name, topics in pairs(req.subs) do
      local had = rec.subs[name]
      same = type(had) == type(topics) and (not topics or #had == #topics)
      if same and topics then
        for i = 1, #topics do
          if had[i] ~= topics[i] then same = false break end
        end
      end
      if not same then break end
    end
    if same then
      for name, _ in pairs(rec.subs) do
        if req.subs[name] == nil then same = false break end
      end
    end
  end
  -- A member that rejoins with the protocols and rebalance timeout it had (the usual rejoin)
  -- leaves the protocol counts and the timeout counts as they are: taking it out of them and
  -- putting it back would decode and rewrite both for nothing. (Counts not stored yet, from
  -- an older rcoord, are made here all the same.)
  local same_pr, same_rt = rec.pr == req.pr, rec.rt == req.rt and G.rtc ~= nil
  local rtc, old_rt = not same_rt and rt_counts(), rec.rt
  if not same_pr then count_protocols(rec, -1) end
  if not same then
    rec.pr, rec.rt, rec.st, rec.subs = req.pr, req.rt, req.st, req.subs
    mput(rec)
  end
  if not same_pr then count_protocols(rec, 1) end
  if rtc then
    local rt_deltas = {[old_rt] = -1}
    rt_deltas[rec.rt] = (rt_deltas[rec.rt] or 0) + 1
    rt_update(rtc, rt_deltas)
  end
  if parked then
    local added = redis.call('HSET', K_JOINING, rec.id, 1)
    if NJOINING then NJOINING = NJOINING + added end
    park_slot(rec.id, 'j')
  else
    redis.call('HDEL', K_JOINING, rec.id)
    NJOINING = nil
  end
end

-- Kafka's validateMember: nil and the member's record, or the error. Every caller goes on to
-- use the record, so it is read here once (the check is its existence). ``session_only``: the
-- caller needs only the session timeout (a commit refreshing it), which comes back instead of
-- the record, without decoding the record. ``known``: the record when the caller has read it
-- already (false: read, and there is none).
local function validate_member(id, iid, session_only, known)
  if iid ~= '' then
    local existing = redis.call('HGET', K_STATIC, iid)
    if not existing then return 'UNKNOWN_MEMBER_ID' end
    if existing ~= id then return 'FENCED_INSTANCE_ID' end
  end
  if session_only and not MEMBERS_BY_ID then
    local blob = redis.call('HGET', K_MEMBERS, id)
    if not blob then return 'UNKNOWN_MEMBER_ID' end
    return nil, member_session(blob)
  end
  local rec = known
  if rec == nil then rec = mget(id) end
  if not rec then return 'UNKNOWN_MEMBER_ID' end
  return nil, session_only and rec.st or rec
end

local function reschedule_heartbeat(id, st) schedule(hb_key(id), NOW + st) end

-- Sync propagation in chunks (issue 12: no single call may block the shard for long). Giving a
-- large group its assignment rewrites every member record and answers every parked SyncGroup,
-- so the call that stores the leader's assignment (or a reset's error) writes the first chunk of
-- members, the leader's own first, and keeps the others' assignments in the group hash; each
-- later call writes one more chunk through the continuation deadline 'cs' (due at 0, as 'cj' of
-- a join completion: apply_due writes one chunk per call and applies no other deadline until
-- the propagation is whole). The group's state moves at once, as in Kafka (Stable once the
-- leader's assignment is stored): a member whose chunk is pending is answered when it is
-- written (a SyncGroup in Stable parks until then: sync_group), heartbeats are answered as in
-- Stable (heartbeat.lua passes over the continuation), and session deadlines count from the
-- propagation (ZADD GT: a heartbeat answered meanwhile is not shortened). A step that changes
-- the members or the generation first finishes the rest (settle_chunks).
-- Group fields while chunks remain: csk next chunk, csn chunks, cst propagation time, cse the
-- error sent ('NONE' with an assignment), 'cs:<k>' chunk k's {member ids, assignments}.
-- Member records: asg the assignment, ag the generation it was given in.

-- Writes one chunk: members ``ids`` get assignments ``asgs`` of the propagation at ``at``.
-- ``parked``: the id of a member whose SyncGroup this very call parks (the leader's, which
-- stores the assignment): answered as a parked one without its record or slot being written
-- first only to be written again here. ``parked_rec``: its record as the caller read it in
-- this call, with nothing written since (it is then not read again; ids[1] must be parked).
local function sync_chunk(ids, asgs, err, at, parked, parked_rec)
  CHUNK_RAN = true
  local skip = parked_rec and ids[1] == parked and 1 or 0
  local blobs = #ids > skip and hmget_batched(K_MEMBERS, skip == 0 and ids or
    slice(ids, 2, #ids)) or {}
  local g = gen()
  local recs, replies, hbs = {}, {}, {}
  for i, id in ipairs(ids) do
    local rec = i <= skip and parked_rec
    if not rec and blobs[i - skip] then rec = cmsgpack.unpack(blobs[i - skip]) end
    if rec then
      rec.asg, rec.ag = asgs[i], g
      if rec.as == 1 or id == parked then
        -- ``at``: when the session was refreshed (the propagation's time, not this chunk's):
        -- the member counts its session from it (SyncGroupResult.parked_ms).
        local rep = {k = 's', e = err, asg = rec.asg, at = at}
        if err == 'NONE' then rep.pt, rep.pn = G.ptype, G.pname end
        replies[#replies + 1] = reply_field('s', id)
        replies[#replies + 1] = cmsgpack.pack(rep)
        rec.as = 0
        hbs[#hbs + 1] = at + rec.st
        hbs[#hbs + 1] = hb_key(id)
      end
      recs[#recs + 1] = id
      recs[#recs + 1] = member_blob(rec)
    end
  end
  forget_members()
  call_batched('HSET', K_MEMBERS, recs)
  call_batched('HSET', K_REPLIES, replies)
  if #hbs > 0 then
    note_deadline_pairs(hbs)
    DL_HEAD = nil
    for i = 1, #hbs, BATCH do
      redis.call('ZADD', K_DL, 'GT', unpack(hbs, i, math.min(i + BATCH - 1, #hbs)))
    end
  end
  if #replies > 0 then wake() end
end

-- Writes the next chunk of a pending sync propagation.
local function continue_sync()
  local k, n = tonumber(G.csk), tonumber(G.csn)
  local part = cmsgpack.unpack(redis.call('HGET', K_GROUP, 'cs:' .. k))
  sync_chunk(part[1], part[2], G.cse, tonumber(G.cst))
  if k < n then
    g_call('HDEL', 'cs:' .. k)
    set_g('csk', k + 1)
  else
    g_call('HDEL', 'cs:' .. k)
    for _, field in ipairs({'csk', 'csn', 'cst', 'cse'}) do del_g(field) end
    cancel('cs')
  end
end

-- Gives every member its new assignment (``asg_of(id)``) and completes the parked SyncGroups
-- with it (or with the error ``err``), in chunks (above): the ids come from the hash's keys, so
-- no record is decoded outside the chunk that writes it. ``parked``: as sync_chunk's, the leader
-- (always in the first chunk), and ``parked_rec`` its record as sync_chunk's.
local function propagate_assignment(err, asg_of, ids, parked, parked_rec)
  if settle_chunks() then parked_rec = nil end -- (the chunks may have rewritten it)
  ids = ids or redis.call('HKEYS', K_MEMBERS)
  for i, id in ipairs(ids) do
    if id == G.leader and i > 1 then
      ids[i] = ids[1]
      ids[1] = id
      break
    end
  end
  local asgs = {}
  for i, id in ipairs(ids) do asgs[i] = asg_of(id) end
  local size = chunk_size()
  local n = math.max(1, math.ceil(#ids / size))
  if n > 1 then
    local fields = {}
    for k = 2, n do
      local first = (k - 1) * size + 1
      fields[#fields + 1] = 'cs:' .. k
      fields[#fields + 1] = cmsgpack.pack({slice(ids, first, k * size),
                                           slice(asgs, first, k * size)})
    end
    call_batched('HSET', K_GROUP, fields)
    set_g('csk', 2)
    set_g('csn', n)
    set_g('cst', NOW)
    set_g('cse', err)
    schedule('cs', 0)
  end
  sync_chunk(slice(ids, 1, size), slice(asgs, 1, size), err, NOW, parked, parked_rec)
end

-- ``leader``: the leader's id; its SyncGroup, which brings the assignment, is answered by the
-- first chunk as a parked one (sync_group.lua), from ``leader_rec``, its record as that step
-- read it (nothing written to it since), which is not read again.
local function set_and_propagate_assignment(assignments, leader, leader_rec)
  if G.state ~= COMPLETING then illegal('assignment outside CompletingRebalance') end
  propagate_assignment('NONE', function(id) return assignments[id] or '' end, nil, leader,
    leader_rec)
end

-- Kafka clears every member's assignment and answers the parked SyncGroups. Here only the
-- parked members are written: while CompletingRebalance, a member has synced (its SyncGroup is
-- parked, 'as') exactly when it is no longer expected to (the syncing hash; join chunks are
-- settled first), and an assignment is read only in Stable, which every member reaches with
-- one written by the leader's propagation. So a reset costs the members that synced, not the
-- whole group (a late joiner right after a 1,000-member completion: none).
local function reset_and_propagate_error(err)
  if G.state ~= COMPLETING then illegal('reset of assignment outside CompletingRebalance') end
  settle_chunks()
  local parked, expected = {}, {}
  for _, id in ipairs(redis.call('HKEYS', K_PSYNC)) do expected[id] = true end
  for _, id in ipairs(redis.call('HKEYS', K_MEMBERS)) do
    if not expected[id] then parked[#parked + 1] = id end
  end
  propagate_assignment(err, function() return '' end, parked)
end

local function remove_pending_sync(id)
  redis.call('HDEL', K_PSYNC, id)
  if G.state == COMPLETING or G.state == STABLE then
    -- (While join chunks remain, their members' pending syncs are not written yet.)
    if redis.call('HLEN', K_PSYNC) == 0 and not G.cjk then cancel('sync') end
  else
    cancel('sync')
  end
end

-- The topics a "consumer" member subscribes to under protocol ``name``: decoded from its
-- ConsumerProtocolSubscription by the sans-I/O core (rcoord/protocol/join.py) and kept in the
-- member record; nil when the metadata did not decode.
local function subscribed_topics_of(rec, name)
  if type(rec.subs) ~= 'table' then return nil end
  local topics = rec.subs[name]
  if type(topics) ~= 'table' then return nil end
  return topics
end

-- Kafka's computeSubscribedTopics: known only for the "consumer" protocol type and only when
-- every member's metadata decodes; an unknown subscription counts as every topic.
local function compute_subscribed_topics()
  del_g('subs')
  if G.ptype ~= 'consumer' then return end
  local set, list = {}, {}
  for _, rec in ipairs(all_members()) do
    local topics = subscribed_topics_of(rec, G.pname)
    if topics == nil then return end
    for _, topic in ipairs(topics) do
      if not set[topic] then set[topic] = true list[#list + 1] = topic end
    end
  end
  set_g('subs', cmsgpack.pack(list))
end

local function subscribed_set()
  if G.subs == nil then return nil end
  local set = {}
  for _, topic in ipairs(cmsgpack.unpack(G.subs)) do set[topic] = true end
  return set
end

local function is_subscribed(topic, subs)
  if subs == nil then return G.ptype == 'consumer' end
  return subs[topic] == true
end

-- ``psync_empty``: the caller emptied the syncing hash in this call, and nothing wrote it since.
local function init_next_generation(psync_empty)
  set_g('gen', gen() + 1)
  if not psync_empty then redis.call('DEL', K_PSYNC) end
  if nmembers() > 0 then
    set_g('pname', select_protocol())
    -- The subscribed topics are computed by the completion's chunks (complete_join).
    del_g('subs')
    transition(COMPLETING)
  else
    set_g('pname', '')
    compute_subscribed_topics()
    transition(EMPTY)
  end
end

-- Whether the order key holds every one of the group's ``n`` members (it never holds a member
-- that left; it lacks members an older rcoord added during a rolling upgrade): it has an entry
-- at position n - 1. ZRANGE, not ZCARD, which the documented ACL roles do not grant
-- (docs/security.md).
local function order_holds_all(n)
  return n == 0 or #redis.call('ZRANGE', K_ORDER, n - 1, n - 1) == 1
end

-- Kafka's maybeElectNewJoinedLeader: keep a leader that rejoined, else the oldest rejoined member.
-- ``all_parked``: every member is parked in a join (complete_join's), the leader too.
local function maybe_elect_new_joined_leader(all_parked)
  if G.leader == '' then return false end
  if all_parked or awaiting_join(G.leader) then return true end
  if G.oq then
    local id = oldest_member(awaiting_join)
    if id then
      set_g('leader', id)
      return true
    end
    -- None there: if the order key holds every member, nobody rejoined; else members an older
    -- rcoord added are only in the records.
    if order_holds_all(nmembers()) then return false end
  end
  for _, rec in ipairs(all_members()) do
    if awaiting_join(rec.id) then
      set_g('leader', rec.id)
      return true
    end
  end
  return false
end

-- Replies nobody collected are dropped once a generation forms. A parked caller re-checks at
-- least every second, so a reply older than REPLY_TTL_MS has no caller left.
local REPLY_TTL_MS = 60000
-- Drops those of the reply ``fields`` that are older than that (absent ones are skipped).
local function prune_reply_fields(fields)
  local stale = {}
  for i = 1, #fields, BATCH do
    local last = math.min(i + BATCH - 1, #fields)
    local blobs = redis.call('HMGET', K_REPLIES, unpack(fields, i, last))
    for j = i, last do
      local blob = blobs[j - i + 1]
      if blob and (cmsgpack.unpack(blob).at or 0) + REPLY_TTL_MS < NOW then
        stale[#stale + 1] = fields[j]
      end
    end
  end
  call_batched('HDEL', K_REPLIES, stale)
end

-- The header of a msgpack array of ``n`` elements (the leader's member list is assembled from
-- entries packed in several calls).
local function msgpack_array_header(n)
  if n < 16 then return string.char(0x90 + n) end
  if n < 65536 then return string.char(0xdc, math.floor(n / 256), n % 256) end
  return string.char(0xdd, math.floor(n / 16777216) % 256, math.floor(n / 65536) % 256,
    math.floor(n / 256) % 256, n % 256)
end

-- Join completion in chunks (issue 12: no single call may block the shard for long). Completing
-- the join of a large group writes a reply, a session deadline and more per member; the first
-- call (complete_join) decides everything group-level (absent members removed, leader,
-- generation, protocol, pending syncs, sync deadline) and writes the first chunk of members;
-- each later call writes one more chunk: apply_due runs the continuation deadline 'cj', which
-- is due at 0 so that it comes before every other deadline of the group, and applies no other
-- deadline while chunks remain (so session and sync deadlines act after the completion, as
-- after a completion in one call; a heartbeat answers DUE meanwhile). Parked callers and the
-- sweeper drive it: a caller whose chunk is pending is still parked and is told to wait until
-- 'cj', which has passed. The leader's reply, which lists every member, is written with the
-- last chunk, from member entries each chunk stores ('cjm:<k>'). A step that changes the
-- members or the generation first finishes the rest (settle_chunks).
-- Group fields while chunks remain: cjk next chunk, cjn chunks, cjt completion time (session
-- deadlines count from it), 'cj:<k>' chunk k's member ids, 'cjm:<k>' chunk k's entries.
-- Chunk size: chunk_size() above.

-- Writes chunk ``k`` of ``n`` (member ``ids``) of the completion that started at ``at``;
-- ``all_parked``: every member of the chunk is known to be parked in a join (complete_join's),
-- so which of them are is not read.
local function join_chunk(ids, k, n, at, all_parked)
  CHUNK_RAN = true
  -- The members' records (false: no such member): those this call has decoded already
  -- (mget's, or every member's: all_members) are not read again, the others in one read.
  local recs_of, unread, pos = {}, {}, {}
  for i, id in ipairs(ids) do
    local rec
    if MEMBERS_BY_ID then rec = MEMBERS_BY_ID[id] or false else rec = RECS and RECS[id] end
    if rec == nil then
      unread[#unread + 1] = id
      pos[#unread] = i
    else
      recs_of[i] = rec
    end
  end
  if #unread > 0 then
    local blobs = hmget_batched(K_MEMBERS, unread)
    for j, i in ipairs(pos) do recs_of[i] = blobs[j] and cmsgpack.unpack(blobs[j]) or false end
  end
  local parked = not all_parked and hmget_batched(K_JOINING, ids)
  -- The replies of a completion differ only in the member id, and in the leader's member list:
  -- encode the rest once ('head': a map two entries larger than it, and its pairs) and append
  -- those (a msgpack map is its size, then its key/value pairs). The leader's reply (last
  -- chunk) is made from the same head.
  local common = join_reply('', 'NONE', false, false)
  common.mid, common.mem, common.at = nil, nil, NOW
  local body = cmsgpack.pack(common)
  local n_common = string.byte(body, 1) - 0x80
  local head = n_common >= 1 and n_common < 14 and string.char(0x82 + n_common) ..
    string.sub(body, 2)
  local template = head and head .. cmsgpack.pack('mem') .. '\144' .. cmsgpack.pack('mid')
  local consumer = G.ptype == 'consumer'
  local replies, joined, hbs, recs, old, mem, topics = {}, {}, {}, {}, {}, {}, {}
  local psync = {}
  local unknown = false
  local leader_parked = nil -- known when the leader is in this chunk
  for i, id in ipairs(ids) do
    local rec = recs_of[i]
    if rec then
      local is_parked = all_parked or parked[i]
      if id == G.leader then leader_parked = is_parked and true or false end
      -- Every member must sync this generation, unless it already did (a member that learnt
      -- the generation from a repeated JoinGroup before its chunk was written).
      if rec.as ~= 1 then
        psync[#psync + 1] = id
        psync[#psync + 1] = 1
      end
      old[#old + 1] = reply_field('s', id)
      if is_parked then
        if id ~= G.leader then
          replies[#replies + 1] = reply_field('j', id)
          replies[#replies + 1] = template and template .. cmsgpack.pack(id) or
            cmsgpack.pack(join_reply(id, 'NONE', false, false))
          joined[#joined + 1] = id
        end
      else
        old[#old + 1] = reply_field('j', id)
      end
      hbs[#hbs + 1] = at + rec.st
      hbs[#hbs + 1] = hb_key(id)
      if rec.new == 1 and rec.ng == nil then
        rec.new = 0
        recs[#recs + 1] = id
        recs[#recs + 1] = member_blob(rec)
      end
      mem[#mem + 1] = rec.seq
      mem[#mem + 1] = cmsgpack.pack({id = rec.id, iid = rec.iid, meta = metadata_for(rec, G.pname)})
      if consumer and not unknown then
        local list = subscribed_topics_of(rec, G.pname)
        if list == nil then
          unknown = true
        else
          for _, t in ipairs(list) do topics[#topics + 1] = t end
        end
      end
    end
  end
  -- The last chunk: the entries of every chunk, in the members' order (oldest first), make the
  -- leader's reply, written and unparked with this chunk's members (one HSET, one HDEL).
  local drop = {}
  if k == n then
    for j = 1, n - 1 do
      local part = cmsgpack.unpack(redis.call('HGET', K_GROUP, 'cjm:' .. j))
      for _, x in ipairs(part[1]) do mem[#mem + 1] = x end
      if part[2] == true then
        unknown = true
      elseif not unknown then
        for _, t in ipairs(part[2]) do topics[#topics + 1] = t end
      end
      drop[#drop + 1] = 'cjm:' .. j
      drop[#drop + 1] = 'cj:' .. (j + 1)
    end
    local by_seq, seqs = {}, {}
    for i = 1, #mem, 2 do
      by_seq[mem[i]] = mem[i + 1]
      seqs[#seqs + 1] = mem[i]
    end
    table.sort(seqs)
    local entries = {}
    for i, seq in ipairs(seqs) do entries[i] = by_seq[seq] end
    -- (Not in this chunk: not among the members it unparks, so asked before or after them.)
    if leader_parked == nil then
      leader_parked = redis.call('HEXISTS', K_JOINING, G.leader) == 1
    end
    if leader_parked then
      local members = cmsgpack.pack('mem') .. msgpack_array_header(#entries) ..
        table.concat(entries)
      local blob
      if head then
        blob = head .. cmsgpack.pack('mid') .. cmsgpack.pack(G.leader) .. members
      else
        local rep = join_reply(G.leader, 'NONE', false, false)
        rep.mem, rep.at = nil, NOW
        local lbody = cmsgpack.pack(rep)
        blob = string.char(string.byte(lbody, 1) + 1) .. string.sub(lbody, 2) .. members
      end
      replies[#replies + 1] = reply_field('j', G.leader)
      replies[#replies + 1] = blob
      joined[#joined + 1] = G.leader
    end
  end
  prune_reply_fields(old)
  call_batched('HSET', K_PSYNC, psync)
  call_batched('HSET', K_REPLIES, replies)
  call_batched('HDEL', K_JOINING, joined)
  call_batched('ZADD', K_DL, hbs)
  call_batched('HSET', K_MEMBERS, recs)
  if #replies > 0 then wake() end
  if k < n then
    g_call('HSET', 'cjm:' .. k, cmsgpack.pack({mem, unknown or topics}))
    set_g('cjk', k + 1)
    return
  end
  -- Kafka's computeSubscribedTopics: known only for "consumer" and when every member's decodes.
  if consumer and not unknown then
    local set, list = {}, {}
    for _, t in ipairs(topics) do
      if not set[t] then set[t] = true list[#list + 1] = t end
    end
    set_g('subs', cmsgpack.pack(list))
  end
  if n > 1 then
    call_batched('HDEL', K_GROUP, drop) -- (two fields per chunk: more than one unpack holds)
    for _, field in ipairs({'cjk', 'cjn', 'cjt'}) do del_g(field) end
    cancel('cj')
  end
  -- Every member synced before the last chunk was written: the sync deadline has no purpose.
  -- (This chunk's pending syncs were just written: none of them synced.)
  if #psync == 0 and redis.call('HLEN', K_PSYNC) == 0 then cancel('sync') end
end

-- Writes the next chunk of a pending join completion.
local function continue_join()
  local k, n = tonumber(G.cjk), tonumber(G.cjn)
  local ids = cmsgpack.unpack(redis.call('HGET', K_GROUP, 'cj:' .. k))
  join_chunk(ids, k, n, tonumber(G.cjt))
end

settle_chunks = function()
  if not G.cjk and not G.csk then return false end
  while G.cjk do continue_join() end
  while G.csk do continue_sync() end
  forget_members()
  return true
end

-- ``all_parked``: the caller has just found every member parked in a join (all_joined), so
-- nobody is absent and the count of parked joins is not read again. ``psync_empty``: the
-- caller emptied the syncing hash in this call (prepare_rebalance; removing members only
-- deletes from it), so the next generation need not.
local function complete_join(all_parked, psync_empty)
  cancel('join')
  -- Members that neither rejoined nor are static (static members keep their place) are removed;
  -- found from the keys alone (a static member is its instance id's owner), no record decoded.
  -- When every member rejoined (the common case), nobody is absent and no set is built.
  local ids, absent = redis.call('HKEYS', K_MEMBERS), {}
  if not all_parked and (NJOINING or redis.call('HLEN', K_JOINING)) < #ids then
    local joining, static = {}, {}
    for _, id in ipairs(redis.call('HKEYS', K_JOINING)) do joining[id] = true end
    for _, id in ipairs(redis.call('HVALS', K_STATIC)) do static[id] = true end
    local kept = {}
    for _, id in ipairs(ids) do
      if joining[id] or static[id] then kept[#kept + 1] = id else absent[#absent + 1] = id end
    end
    ids = kept
  end
  remove_members(absent)
  if G.state == DEAD then return end
  if not maybe_elect_new_joined_leader(all_parked) and nmembers() > 0 then
    -- Nobody rejoined (only absent static members remain): try again after a rebalance timeout.
    set_g('jk', 'n')
    schedule('join', NOW + rebalance_timeout())
    return
  end
  init_next_generation(psync_empty)
  if G.state == EMPTY then return end
  -- Replies left by members no longer in the group (members' own: with their chunk).
  local member, others = {}, {}
  for _, id in ipairs(ids) do member[id] = true end
  for _, field in ipairs(redis.call('HKEYS', K_REPLIES)) do
    if not member[string.sub(field, 3)] then others[#others + 1] = field end
  end
  prune_reply_fields(others)
  -- The pending syncs are written with each member's chunk (join_chunk).
  set_g('sg', gen())
  schedule('sync', NOW + rebalance_timeout())
  local size = chunk_size()
  local n = math.max(1, math.ceil(#ids / size))
  if n > 1 then
    local fields = {}
    for k = 2, n do
      fields[#fields + 1] = 'cj:' .. k
      fields[#fields + 1] = cmsgpack.pack(slice(ids, (k - 1) * size + 1, k * size))
    end
    call_batched('HSET', K_GROUP, fields)
    set_g('cjn', n)
    set_g('cjt', NOW)
    schedule('cj', 0)
  end
  join_chunk(slice(ids, 1, size), 1, n, NOW, all_parked)
end

local function maybe_complete_join_phase()
  if G.state ~= PREPARING then return end
  if G.prev == EMPTY then return end -- the initial rebalance completes only by its delay timer
  if not all_joined() then return end
  complete_join(true)
end

local function prepare_rebalance(reason)
  settle_chunks()
  if G.state == COMPLETING then reset_and_propagate_error('REBALANCE_IN_PROGRESS') end
  redis.call('DEL', K_PSYNC)
  cancel('sync')
  local initial = G.state == EMPTY
  if initial then
    local delay = CFG.group_initial_rebalance_delay_ms
    set_g('jk', 'i')
    set_g('jd', delay)
    set_g('jr', math.max(rebalance_timeout() - delay, 0))
    -- Kafka's newMemberAdded, cleared here (Kafka clears it only when it extends the delay, so
    -- an arrival in an earlier initial rebalance could extend a later one).
    set_g('nma', 0)
    schedule('join', NOW + delay)
  end
  set_g('reason', reason or '')
  transition(PREPARING)
  if not initial then
    if all_joined() then
      complete_join(true, true)
    else
      set_g('jk', 'n')
      schedule('join', NOW + rebalance_timeout())
    end
  end
end

local function maybe_prepare_rebalance_or_complete_join(reason)
  if VALID_PREVIOUS[PREPARING][G.state] then -- (Kafka's canRebalance)
    prepare_rebalance(reason)
  else
    maybe_complete_join_phase()
  end
end

-- Timer actions -----------------------------------------------------------------------------

local function expire_heartbeat(id, deadline)
  if G.state == DEAD then return end
  if is_pending(id) then
    redis.call('HDEL', K_PENDING, id)
    if G.state == PREPARING and all_joined() then complete_join(true) end
    return
  end
  local rec = mget(id)
  if not rec then return end
  -- Kafka's hasSatisfiedHeartbeat: a parked member is alive, unless it is new.
  local satisfied = not is_new(rec) and (awaiting_join(id) or rec.as == 1)
  if satisfied then return end
  event('expired', 'member', id, 'late', string.format('%d', NOW - deadline))
  remove_member(id)
  if G.state == STABLE or G.state == COMPLETING then
    maybe_prepare_rebalance_or_complete_join('removing member ' .. id .. ' on heartbeat expiration')
  elseif G.state == PREPARING and all_joined() then
    complete_join(true)
  end
end

local function expire_join()
  if G.state ~= PREPARING then return end
  if G.jk == 'i' then
    -- Kafka's tryCompleteInitialRebalanceElseSchedule: extend while members keep arriving.
    local delay, remaining = tonumber(G.jd), tonumber(G.jr)
    if G.nma == '1' and remaining ~= 0 then
      local new_delay = math.min(CFG.group_initial_rebalance_delay_ms, remaining)
      set_g('nma', 0)
      set_g('jd', new_delay)
      set_g('jr', math.max(remaining - delay, 0))
      schedule('join', NOW + new_delay)
      return
    end
  end
  complete_join()
end

local function expire_sync()
  if tonumber(G.sg or '-1') ~= gen() then return end
  if G.state ~= COMPLETING and G.state ~= STABLE then return end
  local ids = redis.call('HKEYS', K_PSYNC)
  if #ids == 0 then return end
  remove_members(ids)
  prepare_rebalance('removing members that did not send SyncGroup in time')
end

-- The group becomes Dead and its keys go in the same step (Dead is never stored).
local function delete_group()
  forget_members()
  DL_CHANGED = true
  transition(DEAD)
  G_WRITES, G_WRITE_ORDER, NMEMBERS, SLOTS_NOW = nil, nil, nil, nil -- the hash goes
  NJOINING = nil
  redis.call('DEL', K_GROUP, K_MEMBERS, K_STATIC, K_PENDING, K_JOINING, K_PSYNC, K_REPLIES,
    K_WAKE, K_DL, K_OFFSETS, K_HINT, K_ORDER)
  DL_HEAD = nil
  redis.call('SREM', K_GROUPS, GROUP_ID)
  redis.call('ZREM', K_DUE, GROUP_ID)
  G = new_group_table()
end

-- Kafka's offsetExpirationCondition: which timestamp an offset's retention counts from, or nil
-- when no offset may expire in the current state. From the group's protocol type, state and
-- subscribed topics (any value: some): G's, or what commit_offsets.lua's fast path read
-- without G.
local function expiration_base_of(ptype, state, subs)
  if ptype == '' then return 'commit' end
  if state == EMPTY then return 'empty' end
  if ptype == 'consumer' and subs and state == STABLE then return 'commit' end
  return nil
end

-- ``retention``: offsets_retention_ms when the caller read it without CFG (commit_offsets.lua's
-- fast path, base 'commit'); otherwise CFG's.
local function expiry_of(rec, base, retention)
  if rec.x >= 0 then return rec.x end -- explicit per-commit retention (OffsetCommit v2-v4)
  retention = retention or CFG.offsets_retention_ms
  if base == 'empty' then return tonumber(G.ts) + retention end
  return rec.t + retention
end

-- When the retention timer runs next, for an offset (or a group) that expires ``at``: then, or
-- after the check interval if that comes first. Each run reads the settings in force, so a
-- lowered offsets_retention_ms applies to stored offsets within one interval, as Kafka's
-- periodic clean-up (every offsets.retention.check.interval.ms) applies it; otherwise a timer
-- set under the old retention (a week by default) stood, and so did the offsets. ``interval``:
-- when the caller read it without CFG (commit_offsets.lua's fast path).
local function retention_check_at(at, now, interval)
  return math.min(at, now + (interval or CFG.offsets_retention_check_interval_ms))
end

-- After a commit: make sure the retention timer fires no later than this offset's expiry. While
-- a retention walk is in progress its timer is a millisecond away, so that alone says nothing
-- about this offset, whose field may sit behind the walk's cursor: the walk, which schedules
-- its next run from the earliest expiry it has seen, is told of this one too.
local function schedule_offset_expiry(rec)
  local base = expiration_base_of(G.ptype, G.state, G.subs)
  if not base then return end
  local at = expiry_of(rec, base)
  if G.gcw then -- (generation, base, cursor, earliest expiry seen: expire_offsets, below)
    local w, b, c, n = string.match(G.gcw, '^(%S+) (%S+) (%S+) ?(%S*)$')
    n = tonumber(n)
    if n == nil or at < n then set_g('gcw', string.format('%s %s %s %d', w, b, c, at)) end
  end
  schedule_by('gc', retention_check_at(at, NOW))
end

-- The retention check reads a group's offsets a page at a time (HSCAN), so that no call holds
-- the shard for long however many offsets a group has (a commit takes up to 10,000 partitions,
-- a group any number: 300,000 offsets took 1.2 s in one call). A walk not done keeps its place
-- in the group hash ('gcw': the generation and base it runs under, the cursor, and the earliest
-- expiry seen so far, if any) and comes back a millisecond later (the service's next call, or
-- any step's), one page per call. A walk goes on only under the generation and base it began
-- with (they decide which offsets may expire) and on the server process that began it (its
-- cursor is that process's: SERVER_TOKEN, below; the token rides on the base, 'BASE@TOKEN', so a
-- version that does not know it reads another base and starts again too); otherwise it starts
-- again. Continued on another process, a walk skipped offsets; an Empty group's walk that saw
-- only expired ones scheduled no next check, and the skipped offsets and the group stayed for
-- good. A page is 250 offsets (HSCAN's COUNT): at most about 2 ms of server time.
-- This is Kafka's cleanupExpiredOffsets plus the removal of an Empty group with no offsets
-- left, exactly when due instead of on a periodic scan.
-- The token of the server process (of this library's Lua state, made from TIME at its first
-- walk: the same on two processes only in the same microsecond) is a local of this block, not
-- of the main chunk, whose 200 locals are kept for helpers (tests/test_state.py); fetch_offsets.lua
-- keeps its own. (A library loaded again makes a new one: one restart more. Another rcoord
-- version's library has another: each starts the other's walk again.)
local expire_offsets
do
local SERVER_TOKEN = nil
function expire_offsets()
  if SERVER_TOKEN == nil then
    local t = redis.call('TIME')
    SERVER_TOKEN = t[1] .. '.' .. t[2]
  end
  local base = expiration_base_of(G.ptype, G.state, G.subs)
  local next_at = nil
  if base then
    local subs = subscribed_set()
    local walk = (G.gen or '0') .. ' ' .. base .. '@' .. SERVER_TOKEN
    local cursor, left = '0', G.gcw
    if left then
      local w, b, c, n = string.match(left, '^(%S+) (%S+) (%S+) ?(%S*)$')
      if w .. ' ' .. b == walk then cursor, next_at = c, tonumber(n) end
    end
    local page = redis.call('HSCAN', K_OFFSETS, cursor, 'COUNT', 250)
    local flat = page[2]
    for i = 1, #flat, 2 do
      local topic = string.match(flat[i], '^%d+:(.*)$')
      if not is_subscribed(topic, subs) then
        local at = expiry_of(cmsgpack.unpack(flat[i + 1]), base)
        if NOW >= at then
          redis.call('HDEL', K_OFFSETS, flat[i])
        elseif next_at == nil or at < next_at then
          next_at = at
        end
      end
    end
    if page[1] ~= '0' then
      set_g('gcw', walk .. ' ' .. page[1] .. (next_at and string.format(' %d', next_at) or ''))
      schedule('gc', NOW + 1)
      return
    end
    if left then del_g('gcw') end
  end
  if G.state == EMPTY and redis.call('HLEN', K_OFFSETS) == 0 then
    local at = tonumber(G.ts) + CFG.offsets_retention_check_interval_ms
    if NOW >= at then
      delete_group()
      return
    end
    if next_at == nil or at < next_at then next_at = at end
  end
  if next_at then schedule('gc', retention_check_at(next_at, NOW)) end
end
end -- (SERVER_TOKEN's block)

-- Applies every deadline of this group that has passed, in deadline order (lazy expiry).
-- ms after its deadline that each applied timer acted (for metrics); made on first use
local NO_LATENESS = {}
local LATENESS = NO_LATENESS
-- Deadlines (other than chunk continuations) applied per call: a burst of session expiries (a
-- host with hundreds of members dying) would otherwise be applied in one call, about 0.1 ms
-- each, blocking the shard for tens of ms. The rest stay due: MORE_DUE tells group_step to
-- answer BUSY, and the caller sends its request again (each call applies the next batch). The
-- partition settings field due_per_call overrides it (tests set a small one).
local DUE_PER_CALL = 25
local MORE_DUE = false
local function due_budget()
  return math.max(1, tonumber(redis.call('HGET', K_CFG, 'due_per_call')) or DUE_PER_CALL)
end

local function apply_due()
  local applied, budget = 0, nil
  CHUNK_RAN = false
  PUBLISHED = published_of(G.ea)
  if group_exists() and not (PUBLISHED == false or (PUBLISHED and PUBLISHED > NOW)) then
    -- The published bound has passed (or is not known): look at the deadlines themselves, and
    -- publish the real earliest when done (finish() writes only if it differs).
    DL_CHANGED = true
  end
  while DL_CHANGED and group_exists() do
    local first = dl_head()
    if #first == 0 or tonumber(first[2]) > NOW then break end
    local name = first[1]
    -- A join completion or sync propagation still being written (due at 0, so first): one
    -- chunk per call, and no other deadline until it is whole (complete_join explains).
    if name == 'cj' or name == 'cs' then
      if CHUNK_RAN then break end
      if name == 'cj' and G.cjk then
        continue_join()
      elseif name == 'cs' and G.csk then
        continue_sync()
      else
        cancel(name) -- (no chunk left: a stray continuation)
      end
      if G.cjk or G.csk then
        applied = applied + 1
        break
      end
    else
      budget = budget or due_budget()
      if budget == 0 then
        MORE_DUE = true
        break
      end
      budget = budget - 1
      -- Kafka's timer orders by deadline only; at equal deadlines the group's join and sync
      -- timers act before session timers (a member the join keeps is then rescheduled).
      if string.sub(name, 1, 3) == 'hb:' then
        for _, t in ipairs({'join', 'sync'}) do
          if redis.call('ZSCORE', K_DL, t) == first[2] then name = t break end
        end
      end
      cancel(name)
      local deadline = tonumber(first[2])
      if LATENESS == NO_LATENESS then LATENESS = {} end
      LATENESS[#LATENESS + 1] = NOW - deadline
      if name == 'join' then
        expire_join()
      elseif name == 'sync' then
        expire_sync()
      elseif name == 'gc' then
        expire_offsets()
      elseif string.sub(name, 1, 3) == 'hb:' then
        expire_heartbeat(string.sub(name, 4), deadline)
      end
    end
    applied = applied + 1
  end
  -- A group over a lowered group_max_size rebalances once per new limit, so that the excess
  -- members are turned away (Kafka does this when it loads such a group).
  -- The check runs once per limit (a group under the limit cannot outgrow it: joins refuse
  -- members beyond it), so a step does not count the members every time.
  -- (capchk first: in a settled group it is the one that fails, and a brief step then reads
  -- neither chunk cursor.)
  if group_exists() and (G.state == STABLE or G.state == COMPLETING) and not MORE_DUE
      and tonumber(G.capchk or '-1') ~= CFG.group_max_size and not (G.cjk or G.csk) then
    set_g('capchk', CFG.group_max_size)
    if nmembers() > CFG.group_max_size then
      prepare_rebalance('group is over capacity group_max_size=' .. CFG.group_max_size)
    end
  end
  return applied
end

-- Every group step ends here (group_step calls it): publish the group's earliest deadline
-- (deadline_index.lua) if it must be, wake parked callers, and send the group hash writes.
local FORCE_PUBLISH = false
local function finish()
  if DL_CHANGED or FORCE_PUBLISH then
    local ea = publish_earliest(K_DL, K_DUE, K_HINT, nil, GROUP_ID, group_exists(), G.ea, NOW,
      MOCK_TIME, group_exists() and dl_head() or nil)
    if group_exists() and ea ~= G.ea then set_g('ea', ea) end
  end
  if WAKE then
    -- Trimmed a stream node at a time (about 16 to 116 entries with the server's default
    -- stream-node-max-entries of 100; rcoord/wake.py reads 128 at once): an exact MAXLEN 16
    -- removes an entry from inside a node on every wake-up, which tripled the XADD's cost.
    local id = redis.call('XADD', K_WAKE, 'MAXLEN', '~', '16', '*', 'g', gen())
    if group_exists() then
      set_g('wid', id)
    else
      -- The group was deleted in this call: parked callers still need the wake-up, but the
      -- stream must not outlive them.
      redis.call('PEXPIRE', K_WAKE, 60000)
    end
  end
  flush_g()
end

-- The deadline a parked caller waits for: the group's earliest as published (the due index's
-- score, which the park flow reads back when its wait ends, rcoord/protocol/park.py), -1 when
-- the group has none. Asked after finish(), so it is the one just published when this call moved
-- a deadline before the old bound, and costs no read of the deadlines: a bound earlier than the
-- real earliest (one postponed since) wakes the caller early, and its await_reply publishes the
-- real one (apply_due).
local function published_deadline()
  local ea = G.ea
  if ea == nil then -- (not known: only a group deleted in this call)
    local first = dl_head()
    return #first == 0 and -1 or tonumber(first[2])
  end
  return tonumber(ea) or -1
end

-- Reply to a parked caller if its reply is ready, otherwise tell it how to wait.
-- Shapes: {'R', reply} or {'W', wake_id, next_deadline_ms, now_ms, member_id}; the wake id and
-- the deadline are filled in by group_step after finish() (which may add the wake-up this
-- caller waits after, and publish the deadline).
-- A reply is read, not consumed: if the same member parked twice (a client that gave up on its
-- first JoinGroup and sent another), both callers get the answer, and neither is left waiting
-- or told it is unknown. The slot is cleared when the member parks again, and pruned later.
local WAIT_REPLY = nil
local function reply_or_wait(id, kind)
  local field = reply_field(kind, id)
  local slot = SLOTS_NOW and SLOTS_NOW[field]
  if slot == true and not ANSWERED then
    WAIT_REPLY = {'W', '0-0', -1, NOW, id}
    return WAIT_REPLY
  end
  if slot and slot ~= true then return {'R', slot} end
  local blob = redis.call('HGET', K_REPLIES, field)
  if blob then return {'R', blob} end
  local waiting
  if kind == 'j' then
    waiting = awaiting_join(id)
  else
    local rec = mget(id)
    waiting = rec ~= nil and rec.as == 1
  end
  if not waiting then
    if kind == 'j' then return {'R', cmsgpack.pack(join_error('UNKNOWN_MEMBER_ID', ''))} end
    return {'R', cmsgpack.pack(sync_error('UNKNOWN_MEMBER_ID'))}
  end
  WAIT_REPLY = {'W', '0-0', -1, NOW, id}
  return WAIT_REPLY
end

local function respond(rep) return {'R', cmsgpack.pack(rep)} end

-- The start of every call: the per-call state, the settings and the group. An error reply
-- (nothing written) when the partition has no settings copy.
local APPLIED = 0
local function begin(keys, argv, all_settings, extra, brief)
  bind_group_keys(keys)
  GROUP_ID = argv[2]
  NOW, MOCK_TIME = read_clock(argv[1])
  WAKE, DL_CHANGED, FORCE_PUBLISH, WAIT_REPLY, APPLIED = false, false, false, nil, 0
  G_WRITES, G_WRITE_ORDER, NMEMBERS, NJOINING = nil, nil, nil, nil
  SLOTS_NOW, ANSWERED = nil, false
  MEMBERS_CACHE, MEMBERS_BY_ID, MEMBERS_DIRTY, LEAD_POS, RECS = nil, nil, false, 1, nil
  PROTOCOLS, LATENESS, PUBLISHED, DL_HEAD, MORE_DUE = nil, NO_LATENESS, nil, nil, false
  local err = read_settings(all_settings, brief)
  if err then return err end
  read_group(extra, brief)
  return nil
end

-- Registers a library function under the library's versioned prefix (LIB, set by
-- rcoord/scripts.py in front of the library).
local function register(name, fn, flags)
  redis.register_function{function_name = LIB .. '_' .. name, callback = fn, flags = flags or {}}
end

-- Registers a group step: ``parse(args)`` decodes the arguments (from the arguments alone,
-- before anything is read or written; it may return an error reply), then the wrapper reads
-- the settings and the group, applies the group's passed deadlines, runs ``run(parsed)`` (its
-- checks come before its own writes) and finishes: deadline index and wake-ups, once per call,
-- whatever path the step took. ``opts.all_settings``: read every setting at once;
-- ``opts.fields(parsed)``: group hash fields outside the core the step will read (read_group).
-- No call blocks the shard for long, so a call may end before its step runs and answer BUSY
-- (nothing of the step done; the caller sends the request again, rcoord/steps.py): when
-- deadlines are still due after this call's share (apply_due), and, for a step that would
-- otherwise finish a chunked join completion or sync propagation all at once
-- (``opts.settles``: it may change the members or the generation; settle_chunks), while
-- chunks remain (this call wrote one). ``opts.partial``: the step runs anyway (the sweep's
-- expire_deadlines, whose callers call again while the group stays due). ``opts.brief``: the
-- step changes no membership and reads GROUP_READS.brief first (read_group). ``opts.fast(keys,
-- args, parsed)``: the step's common case decided without the wrapper (a reply), or nil before
-- any write: it must answer exactly as the wrapper would, so it declines every case where the
-- wrapper would apply, publish or wake anything (commit_offsets.lua). One exception, on
-- purpose: await_reply.lua answers a stored reply (final) and leaves the due deadlines to the
-- sweep and to the callers still waiting, as the park flow's own read of the slot does.
--
-- Malformed arguments (a caller other than rcoord/steps.py, or a version skew) are refused with
-- RCOORD_BAD_ARGUMENT before anything is read or written: Redis does not undo a script that
-- fails half-way, and a non-numeric timeout failed join_group after it had written the member.
-- ``opts.argc``: the fewest ARGV the step takes; ``opts.ints``: {index, name} of each ARGV
-- that must be a decimal int32; ARGV[1], the clock, must be '' or a decimal integer. A
-- ``parse`` that fails (undecodable msgpack, a wrong shape) is refused the same way.
local BUSY = {'B'}
local function group_step(name, run, parse, opts)
  opts = opts or {}
  local all_settings, fields, settles, partial, brief, fast = opts.all_settings, opts.fields,
    opts.settles, opts.partial, opts.brief, opts.fast
  local argc, ints = opts.argc or 2, opts.ints or {}
  local function bad(what)
    return redis.error_reply(RCOORD_BAD_ARGUMENT .. ' ' .. name .. ': ' .. what)
  end
  register(name, function(keys, args)
    if #args < argc then
      return bad('needs at least ' .. argc .. ' arguments, got ' .. #args)
    end
    if args[1] ~= '' and not string.match(args[1], '^%d+$') then
      return bad('ARGV[1] (now) must be empty or a decimal integer, got ' .. string.format(
        '%q', string.sub(args[1], 1, 40)))
    end
    for _, spec in ipairs(ints) do
      local v = args[spec[1]]
      local n = string.match(v, '^%-?%d+$') and #v <= 12 and tonumber(v)
      if not n or n < -2147483648 or n > 2147483647 then
        return bad('ARGV[' .. spec[1] .. '] (' .. spec[2] .. ') must be a decimal int32, got '
          .. string.format('%q', string.sub(v, 1, 40)))
      end
    end
    local req = args
    if parse then
      local ok
      ok, req = pcall(parse, args)
      if not ok then
        if type(req) == 'table' and req.err then return req end
        return bad('malformed arguments (' .. tostring(req) .. ')')
      end
      if type(req) == 'table' and req.err then return req end
    end
    if fast then
      local reply = fast(keys, args, req)
      if reply ~= nil then return reply end
    end
    local err = begin(keys, args, all_settings, fields and fields(req), brief)
    if err then return err end
    APPLIED = apply_due()
    if not partial and (MORE_DUE or (settles and (G.cjk or G.csk))) then
      finish()
      return BUSY
    end
    local reply = run(req)
    finish()
    if reply ~= nil and reply == WAIT_REPLY then
      reply[2], reply[3] = G.wid or '0-0', published_deadline()
    end
    return reply
  end)
end
