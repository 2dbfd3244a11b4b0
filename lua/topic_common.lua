-- topic_common.lua: shared helpers of the topic scripts (rcoord/scripts.py puts it in front of them).
-- Used in front of the other topic_*.lua scripts; touches only the keys they pass.

local function seq(id) return tonumber(string.match(id, '^0%-(%d+)$')) end
local function is_partition(key) return redis.call('TYPE', key)['ok'] == 'stream' end
local function now_ms() return (read_clock('')) end
-- The timestamp of records appended at `now` to stream `key`: `now`, or the partition's last
-- record's if that is later (a clock stepped back, a failover to a node whose clock is behind),
-- so a partition's timestamps never decrease and topic_offset_for_time.lua can binary-search
-- them (Kafka's time index keeps the largest timestamp so far for the same reason). The last
-- timestamp is kept in `mark_key` (a string in the stream's slot, "<timestamp> <log end>",
-- written by `appended`): reading the stream's last entry instead would copy its value (about
-- 360 us for 1 MB). Without it (a stream an older rcoord appended to, which wrote the timestamp
-- alone) the last entry is read once; 't' is the first field of every record the append
-- scripts write. Call it only when records are appended next, then `appended`.
local function stamp(key, mark_key, now)
  local last = tonumber(string.match(redis.call('GET', mark_key) or '', '^(%d+)'))
  if last == nil then
    local entry = redis.call('XREVRANGE', key, '+', '-', 'COUNT', 1)[1]
    if entry and entry[2][1] == 't' then last = tonumber(entry[2][2]) end
  end
  if last ~= nil and last >= now then return last end
  return now
end
-- After records stamped `t` were appended, the last with id `last_id`: the mark holds their
-- timestamp and the log end, which log_offsets_marked reads instead of XINFO STREAM.
local function appended(mark_key, t, last_id)
  redis.call('SET', mark_key, string.format('%d %d', t, seq(last_id)))
end
-- Log start and end offsets: end = sequence of the last id ever generated (kept by trimming),
-- start = first entry's offset, or end when retention emptied the stream.
-- Why a stream whose last id `last` is not 0-<seq> (an XADD by hand with an id of its own,
-- '*': milliseconds) cannot be read or appended to, and what mends it.
local function foreign_id_message(key, last)
  return string.format('%s: its last entry id is %s, not 0-<offset + 1> as '
    .. "rcoord's appends give (an XADD by hand with an id of its own?), so its records "
    .. 'have no offsets past it and no append can follow it; delete and re-create the '
    .. 'topic (or copy its records to another)', key, last)
end
local function log_offsets(key)
  local info = redis.call('XINFO', 'STREAM', key)
  local last, first = nil, false
  for i = 1, #info, 2 do
    if info[i] == 'last-generated-id' then last = info[i + 1]
    elseif info[i] == 'first-entry' then first = info[i + 1] end
  end
  local e = seq(last)
  if e == nil then
    -- An XADD with an id of its own ('*': milliseconds) made the last id not 0-<seq>: the
    -- offsets would be nil (a bare Lua error, or a reply short of its offsets), and appends
    -- (XADD 0-*, below that id) fail. FOREIGN_ENTRY_ID is the marker rcoord.topics.fetch reads.
    -- (XDEL then XSETID cannot mend it: the server refuses a last id below a deleted one.)
    error('FOREIGN_ENTRY_ID ' .. foreign_id_message(key, last), 0)
  end
  if first then return seq(first[1]) - 1, e end
  return e, e
end
-- The reply of an append script whose XADD 0-* the server refused with `err` (a redis.pcall
-- error table): {'UNKNOWN_SERVER_ERROR', why} when the stream's last id is not 0-<seq> (the
-- server then refuses every XADD 0-*: "equal or smaller than the target stream top item"),
-- which the producers raise as a TopicError naming the stream; else `err` itself. Only
-- this path reads XINFO STREAM, so appends cost nothing more.
local function refused_append(key, err)
  local info = redis.call('XINFO', 'STREAM', key)
  for i = 1, #info, 2 do
    if info[i] == 'last-generated-id' and seq(info[i + 1]) == nil then
      return {'UNKNOWN_SERVER_ERROR', foreign_id_message(key, info[i + 1])}
    end
  end
  return err
end
-- log_offsets from the mark `appended` keeps (the log end) and XLEN: rcoord appends with
-- consecutive ids (XADD 0-*) and removes only a prefix (XTRIM), so the log start is the end
-- less the length. XINFO STREAM, which log_offsets reads, copies the first and last records
-- (1 ms for records of 1 MB); this reads two numbers, and asks for an entry past the end (none,
-- so nothing is copied) to catch a mark left behind by appends that did not keep it (an older
-- rcoord's, or an XADD by hand), and for an entry below the start so found (none, so nothing
-- is copied): each entry removed from the middle by hand (XDEL) shortens the length by one, so
-- the end less it lies past the first entry, which is then the start, as Kafka's log start is
-- the first offset held (the end less the length made a reset to earliest, reads, DeleteRecords
-- and offsets_for_times skip a first record per removed entry, as if retention had removed
-- them). A stream with no mark (made empty by an older topic_make.lua,
-- which deleted it, or appended to by an older rcoord), one whose mark does not fit its length or
-- has entries past it, and an empty stream (whose XINFO copies no record; an older rcoord's
-- re-create kept the old topic's mark) are read by log_offsets; so is every stream for a
-- Redis user whose ACL rules, written before this read, lack XLEN (docs/security.md lists it).
local function log_offsets_marked(key, mark_key)
  local e = tonumber(string.match(redis.call('GET', mark_key) or '', ' (%d+)$'))
  if e then
    local n = redis.pcall('XLEN', key)
    if type(n) == 'number' and n > 0 and n <= e
        and #redis.call('XRANGE', key, '(0-' .. string.format('%d', e), '+', 'COUNT', 1) == 0 then
      -- (ids up to 0-<e - n> hold offsets below e - n)
      local below = redis.call('XRANGE', key, '-', string.format('0-%d', e - n), 'COUNT', 1)[1]
      if below then return seq(below[1]) - 1, e end
      return e - n, e
    end
  end
  return log_offsets(key)
end
-- The log offsets of the scripts that take the partition's mark as an optional KEYS[2]
-- (topic_offsets, topic_retention, topic_delete_records, topic_offset_for_time): from the
-- mark when the caller passed it, else from XINFO STREAM (a caller that passes the stream
-- alone still works, copying the first and last records).
local function partition_offsets(key, mark_key)
  if mark_key then return log_offsets_marked(key, mark_key) end
  return log_offsets(key)
end
-- Removes records from the log start ``s`` toward offset ``target`` (exclusive), about
-- ``max_bytes`` of them in one call (one record at least), so that no call holds the server long
-- (DeleteRecords, retention by count). Returns the new log start; below ``target`` when more is
-- left for another call. Sizes are judged in rounds: each reads the record it starts at (one
-- copy) and takes as many records of that size as the bytes left allow, but no more than the
-- rounds before it took (one at first), so a jump in sizes is seen after at most as many records
-- as were already taken (a sample, not a bound: sizes that alternate so that the records read
-- are small and the rest large still pass it). Judging the whole call by the first record alone
-- removed a whole backlog of large records behind a small first one (one record of 10 bytes:
-- 500 records of 1,000 for a bound of 5,000). Uniform sizes take about log2(records) reads and
-- end where one read did; the records are removed by one XTRIM.
local function trim_head_toward(key, s, target, max_bytes)
  local upto, left = s, max_bytes
  while upto < target do
    local ent = redis.call('XRANGE', key, string.format('0-%d', upto + 1), '+', 'COUNT', 1)[1]
    if not ent then break end
    local bytes = 1
    for j = 1, #ent[2] do bytes = bytes + #ent[2][j] end
    local fit = math.floor(left / bytes)
    if upto == s then fit = math.max(1, fit) end
    local n = math.min(fit, math.max(1, upto - s), target - upto)
    if n < 1 then break end
    upto = upto + n
    left = left - n * bytes
    if n == fit then break end  -- the bytes are spent, by this record's size
  end
  redis.call('XTRIM', key, 'MINID', string.format('0-%d', upto + 1))
  return upto
end
