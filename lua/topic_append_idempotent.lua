-- topic_append_idempotent.lua: appends an idempotent producer's records to one partition stream,
-- dropping the records it already appended (Kafka KIP-98, the broker's ProducerAppendInfo).
-- KEYS[1] stream, KEYS[2] producer states (hash: producer id -> state), KEYS[3] producer activity
-- (zset: producer id -> last activity ms; on the server's clock both expire
-- producer.id.expiration.ms after the partition's last idempotent append), KEYS[4] the
-- partition's last record timestamp and log end (a string; stamp and appended in
-- topic_common.lua), KEYS[5] optional: this
-- producer's append log (a string, one line per call that appended: "epoch first-sequence
-- first-offset count\n", only the current epoch's; rcoord.topics.epoch_log reads it). All
-- carry the partition's hash tag.
-- ARGV[1] now ms or '' (Redis TIME), ARGV[2] producer id, ARGV[3] producer epoch,
-- ARGV[4] sequence number of the first record (the others follow consecutively),
-- ARGV[5] lowest sequence number the producer may have lost ('' if none),
-- ARGV[6] producer.id.expiration.ms (the setting stored in KEYS[2] if longer, below),
-- ARGV[7] expired producers to prune at most,
-- ARGV[8] sequence modulus ('' for rcoord's unbounded sequences; 2147483648 for a Kafka
-- producer's, which wrap from 2^31-1 to 0), ARGV[9 ...] 4 per record as in topic_append.lua:
-- flags, value, key, headers.
-- Returns {'NONE', first appended id or '', timestamp ms of the appended records (the clock, or
-- the partition's last record's timestamp if that is later, as in topic_append.lua),
-- duplicates d, {offsets of the d leading records}, {their timestamps}} (-1 where no longer
-- known), or
-- {'UNKNOWN_TOPIC_OR_PARTITION'}, {'PRODUCER_FENCED', why}, {'UNKNOWN_SERVER_ERROR', why} (a
-- stream an XADD by hand left refusing appends: refused_append, in topic_common.lua), or
-- {'OUT_OF_ORDER_SEQUENCE_NUMBER', why, the sequence expected next (modulo ARGV[8] if given)}:
-- the client compares that with what it was told was stored (a failover that lost an
-- acknowledged append leaves the state behind it; rcoord.topics.producer); a fourth element,
-- 'lost' or 'unknown', when the call resent a sequence skipped as lost (below).
--
-- State of one producer (a msgpack array of integers; C-coded, about 5x cheaper than text):
-- epoch, last sequence appended (-1: none in this epoch), last activity ms, then 4 per entry:
-- first the skipped ranges (below), if any, then the remembered batches (oldest first): first
-- sequence, last sequence, first offset, timestamp. A batch's offsets are consecutive because
-- one call appends them. Stored sequences never wrap: a wrapping one is unwrapped on arrival
-- (below). Every check comes before the first write.
-- Skipped ranges: {first, -2 - last, kind, 0}, kind GAP (the sequences a declared loss skipped:
-- never appended, and never will be; the last KEEP_GAPS of the epoch) or UNKNOWN (at most
-- KEEP_GAPS, apart: sequences whose outcome is no longer known, those of gaps beyond KEEP_GAPS,
-- which join the oldest such range, and those a call declared lost when the state had
-- expired). A call that sends one again (a late call, or a
-- replay by a new Producer under the same id and epoch) is refused, not called a duplicate,
-- which would tell a replay that its record is stored. The negative second field makes an
-- older rcoord's script, which reads every entry as a batch, match no sequence to them (its
-- appends drop them oldest first, as batches: the gaps are then forgotten, not misread).
-- Duplicates: rcoord's own producer (no modulus) may resend part of a call, so records are
-- deduplicated one by one; a Kafka producer's batch (a modulus) only whole (below).

local RECORD_ARGS = 9
local KEEP_BATCHES = 5  -- Kafka's ProducerStateEntry.NUM_BATCHES_TO_RETAIN
local KEEP_GAPS = 16  -- declared losses remembered exactly per epoch (each is a failed call)
local GAP, UNKNOWN = -1, -2  -- the kinds of skipped ranges

if not is_partition(KEYS[1]) then return {'UNKNOWN_TOPIC_OR_PARTITION'} end
local now = read_clock(ARGV[1])
local pid = ARGV[2]
local epoch, first = tonumber(ARGV[3]), tonumber(ARGV[4])
local lost_from = tonumber(ARGV[5])  -- nil when ''
local expiration, prune = tonumber(ARGV[6]), tonumber(ARGV[7])
-- The topic's setting as its last change wrote it into the producer states
-- (topic_producer_ttl.lua; the empty field, which no producer id can name: ids are 1..1024
-- bytes), when it is longer than ARGV[6]:
-- a caller that read the setting before a raise (a Producer's cache, up to
-- metadata_max_age_ms) took a state idle for longer than the old setting for expired (a batch
-- it resent was appended twice), and gave a state and an append log it started the old
-- lifetime (a retried Spark task then found the state but no log, epoch_appends: not
-- complete, and could store its rows again). A lowered setting is the field's value too, so
-- it rules as soon as the callers' caches have it.
local stored = tonumber(redis.call('HGET', KEYS[2], ''))
if stored and stored > expiration then expiration = stored end
local modulus = tonumber(ARGV[8])  -- nil when ''
local n = (#ARGV - RECORD_ARGS + 1) / 4
-- The append log's lifetime, and the producer states' keys' (below): the state's, but within
-- what the server takes (an expire time past its range fails the SET after the records are
-- written; 2^46 ms is over 2,000 years), as an integer (a large number would otherwise be sent
-- in exponent form).
local log_ttl = string.format('%d', math.min(expiration, 2 ^ 46))

local function load_state(raw)
  local v = cmsgpack.unpack(raw)
  local st = {epoch = v[1], last = v[2], active = v[3], batches = {}, gaps = {}, unknown = {}}
  for i = 4, #v, 4 do
    if v[i + 1] >= v[i] then
      st.batches[#st.batches + 1] = {v[i], v[i + 1], v[i + 2], v[i + 3]}
    elseif v[i + 2] == GAP then
      st.gaps[#st.gaps + 1] = {v[i], -2 - v[i + 1]}
    else
      st.unknown[#st.unknown + 1] = {v[i], -2 - v[i + 1]}
    end
  end
  return st
end

-- A state idle for producer.id.expiration.ms is gone, as if pruned (Kafka's isProducerExpired).
local raw = redis.call('HGET', KEYS[2], pid)
local st, expired = nil, nil
if raw then
  st = load_state(raw)
  if now - st.active >= expiration then st, expired = nil, st end
end
local starts = st == nil  -- a producer (re)starts here: the one way the state can grow
local log_key = KEYS[5]
-- The log holds one epoch: it starts over when the producer (re)starts or its epoch rises.
local log_starts = starts or epoch > st.epoch

-- The remembered batch that holds sequence `s`, or nil (batches never overlap).
local function batch_of(st, s)
  for _, b in ipairs(st.batches) do
    if b[1] <= s and s <= b[2] then return b end
  end
  return nil
end

-- The first of `first`..`last` that may never have been appended, and its kind, or nil: one in
-- a gap, or one of unknown outcome that is in no batch kept.
local function skipped_in(st, first, last)
  for _, g in ipairs(st.gaps) do
    if g[1] <= last and first <= g[2] then
      return {math.max(first, g[1]), 'lost', string.format(
        'which it declared lost when it went on at sequence %d: that record is not in the '
        .. 'partition, and cannot be appended in its place now that later ones are', g[2] + 1)}
    end
  end
  for _, u in ipairs(st.unknown) do
    for s = math.max(first, u[1]), math.min(last, u[2]) do
      if batch_of(st, s) == nil then
        return {s, 'unknown', string.format(
          'whose call failed and whose outcome is no longer known (the producer state expired '
          .. 'before the next call, or more than %d gaps were declared lost in this epoch): '
          .. 'that record may or may not be in the partition', KEEP_GAPS)}
      end
    end
  end
  return nil
end

local dup = 0  -- leading records whose sequence was already appended
local gap = nil  -- the sequences this call skips as lost: {first, last}
local unknown_from = nil  -- a starting state's first sequence of unknown outcome
if st then
  if epoch < st.epoch then
    return {'PRODUCER_FENCED', string.format(
      'producer %s epoch %d is older than epoch %d, which appended to this partition',
      pid, epoch, st.epoch)}
  end
  if epoch > st.epoch then
    st = {epoch = epoch, last = -1, active = now, batches = {}, gaps = {}, unknown = {}}
  end
  local sent = first
  if modulus and st.last >= 0 then
    -- Kafka numbers modulo 2^31 (0 follows 2^31-1, DefaultRecordBatch.incrementSequence):
    -- take the unwrapped sequence congruent to `first` nearest the expected one (within half
    -- the range either way), so the comparisons below hold across the wrap.
    local d = (first - st.last - 1) % modulus
    if d >= modulus / 2 then d = d - modulus end
    first = st.last + 1 + d
  end
  -- The next sequence is last + 1; a gap is only accepted where the producer says it may have
  -- lost records (a call that failed or timed out), which then never appear.
  if first > st.last + 1 and not (lost_from and lost_from <= st.last + 1) then
    local expected = modulus and (st.last + 1) % modulus or st.last + 1
    return {'OUT_OF_ORDER_SEQUENCE_NUMBER', string.format(
      'producer %s epoch %d sent sequence %d, expected %d', pid, epoch, sent, expected),
      expected}
  end
  if first > st.last + 1 then gap = {st.last + 1, first - 1} end
  if modulus then
    -- A Kafka producer resends whole batches: a batch is a duplicate only when it is exactly
    -- one the partition remembers (ProducerStateEntry.findDuplicateBatch); any other must
    -- follow the last sequence (ProducerAppendInfo.checkSequence). A sequence at or below the
    -- last one is not proof it was appended (a state may start past it: a batch that failed
    -- before a later one got in), and a Kafka client takes DUPLICATE_SEQUENCE_NUMBER for
    -- success, so counting it appended would lose the batch.
    for _, b in ipairs(st.batches) do
      if b[1] == first and b[2] == first + n - 1 then dup = n end
    end
    if dup == 0 and first <= st.last then
      return {'OUT_OF_ORDER_SEQUENCE_NUMBER', string.format(
        'producer %s epoch %d sent sequences %d..%d, expected %d: not a batch this partition '
        .. 'remembers (its last %d), and below the next sequence', pid, epoch, sent,
        (sent + n - 1) % modulus, (st.last + 1) % modulus, KEEP_BATCHES), (st.last + 1) % modulus}
    end
  else
    dup = math.max(0, math.min(n, st.last - first + 1))
    local skipped = dup > 0 and skipped_in(st, first, first + dup - 1)
    if skipped then
      return {'OUT_OF_ORDER_SEQUENCE_NUMBER', string.format(
        'producer %s epoch %d sent sequence %d again, %s', pid, epoch, skipped[1], skipped[3]),
        st.last + 1, skipped[2]}
    end
  end
else
  -- No state (new, expired, or a re-created topic): any sequence starts it, as in Kafka.
  st = {epoch = epoch, last = -1, active = now, batches = {}, gaps = {}, unknown = {}}
  -- The skipped ranges of an expired state still here (not yet pruned) of this epoch stay
  -- skipped below the new state's first: a replay of a sequence a loss skipped before the
  -- expiry would otherwise be taken for appended, and answered a duplicate (stored at -1).
  -- From `first` on the sequences are the new state's, appended by it (a replay from 0).
  if expired and expired.epoch == epoch then
    for kind, ranges in pairs({gaps = expired.gaps, unknown = expired.unknown}) do
      for _, r in ipairs(ranges) do
        if r[1] < first then st[kind][#st[kind] + 1] = {r[1], math.min(r[2], first - 1)} end
      end
    end
  end
  -- A declared loss below it: whether those calls ran went with the expired state.
  if lost_from and not modulus and lost_from < first then unknown_from = lost_from end
end

local dup_offsets, dup_ts = {}, {}
for i = 1, dup do
  local s, off, t = first + i - 1, -1, -1
  local b = batch_of(st, s)
  if b then off, t = b[3] + s - b[1], b[4] end
  dup_offsets[i], dup_ts[i] = off, t
end

-- Writes from here on. Only a starting producer can add a state, so it is the one that
-- removes up to `prune` expired ones: the state never grows without bound, and an append by a
-- known producer (the common case) does not scan.
if starts then
  local stale = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', string.format('%d', now - expiration),
    'LIMIT', 0, prune)
  for _, other in ipairs(stale) do
    redis.call('HDEL', KEYS[2], other)
    redis.call('ZREM', KEYS[3], other)
  end
end

-- Whole ms, never in exponent form. Records carry max(now, the last record's timestamp), read
-- only when there is something to append; the state's activity is `now`.
local t = dup < n and stamp(KEYS[1], KEYS[4], now) or now
local ts = string.format('%d', t)
local first_id, last_id = '', nil
for r = dup + 1, n do
  local i = RECORD_ARGS + (r - 1) * 4
  local flags = tonumber(ARGV[i])
  local f = {'t', ts}
  if flags % 2 == 1 then f[#f + 1] = 'v'; f[#f + 1] = ARGV[i + 1] end
  if math.floor(flags / 2) % 2 == 1 then f[#f + 1] = 'k'; f[#f + 1] = ARGV[i + 2] end
  if math.floor(flags / 4) % 2 == 1 then f[#f + 1] = 'h'; f[#f + 1] = ARGV[i + 3] end
  last_id = redis.pcall('XADD', KEYS[1], '0-*', unpack(f))
  -- (the first XADD's refusal, before any state of this producer is written)
  if type(last_id) == 'table' then return refused_append(KEYS[1], last_id) end
  if first_id == '' then first_id = last_id end
end
if last_id then appended(KEYS[4], t, last_id) end

-- Only an append is activity (Kafka's lastTimestamp): a resent duplicate does not extend the
-- state's life, so retrying forever cannot keep a dead producer's state.
if dup < n then
  st.batches[#st.batches + 1] = {first + dup, first + n - 1, seq(first_id) - 1, t}
  while #st.batches > KEEP_BATCHES do table.remove(st.batches, 1) end
  -- Kept apart from the ranges carried: joined, the sequences between them, stored by the
  -- state in between, were refused as unknown.
  if unknown_from then st.unknown[#st.unknown + 1] = {unknown_from, first - 1} end
  if gap then
    st.gaps[#st.gaps + 1] = gap
    if #st.gaps > KEEP_GAPS then
      -- The oldest gap's sequences join the oldest range of unknown outcome (with those
      -- between).
      local old, u = table.remove(st.gaps, 1), st.unknown[1]
      st.unknown[1] = u and {math.min(u[1], old[1]), math.max(u[2], old[2])} or old
    end
  end
  st.last = first + n - 1
  local out = {st.epoch, st.last, now}
  local function put(a, b, c, d)
    out[#out + 1], out[#out + 2], out[#out + 3], out[#out + 4] = a, b, c, d
  end
  while #st.unknown > KEEP_GAPS do  -- (the oldest two join, with the sequences between)
    local a, b = st.unknown[1], table.remove(st.unknown, 2)
    st.unknown[1] = {math.min(a[1], b[1]), math.max(a[2], b[2])}
  end
  for _, u in ipairs(st.unknown) do put(u[1], -2 - u[2], UNKNOWN, 0) end
  for _, g in ipairs(st.gaps) do put(g[1], -2 - g[2], GAP, 0) end
  for _, b in ipairs(st.batches) do put(b[1], b[2], b[3], b[4]) end
  redis.call('HSET', KEYS[2], pid, cmsgpack.pack(out))
  redis.call('ZADD', KEYS[3], string.format('%d', now), pid)
  -- Every state of the partition is expired once no producer appended for the expiration (the
  -- latest state's activity is this append's), so the two keys go then. Only a starting
  -- producer prunes the others (above): a partition whose producers all stopped, or that only
  -- plain producers write to now, kept every state for good, where Kafka expires them. (Not
  -- under a caller's clock, a test's: that clock alone says when a state expires.) Only ever
  -- later (GT; NX when they have none yet): a caller whose setting is older than a raise (a
  -- Producer's cache, up to metadata_max_age_ms) would otherwise cut back what the raise
  -- extended (topic_producer_ttl.lua), and a state the current setting keeps could go.
  if ARGV[1] == '' then
    for k = 2, 3 do
      if redis.call('PEXPIRE', KEYS[k], log_ttl, 'GT') == 0 then
        redis.call('PEXPIRE', KEYS[k], log_ttl, 'NX')
      end
    end
  end
  if log_key then
    -- It lives as long as the state would (expiration after the last append).
    local line = string.format('%d %d %d %d\n', st.epoch, first + dup, seq(first_id) - 1, n - dup)
    if log_starts then
      redis.call('SET', log_key, line, 'PX', log_ttl)
    else
      redis.call('APPEND', log_key, line)
      -- Only ever later, as the state keys (above): a caller's older setting would cut back
      -- what a raise extended (topic_producer_ttl.lua).
      if redis.call('PEXPIRE', log_key, log_ttl, 'GT') == 0 then
        redis.call('PEXPIRE', log_key, log_ttl, 'NX')
      end
    end
  end
end
return {'NONE', first_id, t, dup, dup_offsets, dup_ts}
