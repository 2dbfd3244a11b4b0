-- topic_retention.lua: applies retention (by record count and by age) to one partition.
-- KEYS[1] stream, KEYS[2] optional: the partition's last-record mark (same hash tag), which
-- gives the log offsets without XINFO STREAM's copy of the first and last records (as in
-- topic_offsets.lua), KEYS[3] (with ARGV[7]) the partition's creation token (same hash tag).
-- ARGV[1] retention records or '', ARGV[2] retention ms or '', ARGV[3] most
-- entries one call removes by age, ARGV[4] scan budget (bytes of field values copied), ARGV[5]
-- '' on a partition's first call, else the previous call's `kept`, ARGV[6] most bytes of
-- records one call removes (estimated from records read: topic_common.lua's trim_head_toward),
-- ARGV[7] optional: the topic's creation token read with the settings ARGV[1] and ARGV[2]
-- ('' for a topic made before tokens). A partition carrying another token is
-- UNKNOWN_TOPIC_OR_PARTITION (nothing removed): the topic was deleted and made again since the
-- settings were read, and a later round trimmed the new topic by the old one's retention.
-- Returns {error name, start, end, more to do, kept}: `kept` is an offset at or after which
-- every record is known to be kept (at least the log end), -1 when the search by age has not
-- run yet (the count's removal is not done: the next call is a partition's first again).
--
-- By count, the newest ARGV[1] records are kept: offsets are consecutive, so those from the
-- log end less ARGV[1]. The removal is bounded as DeleteRecords' is (about ARGV[6] bytes a
-- call, judged in rounds by sizes read; topic_common.lua): one XTRIM MAXLEN removed a
-- whole backlog at once (a setting lowered on a large partition, a long pass interval), and
-- freeing 500 records of 1 MB held the server for 108 ms.
--
-- Kafka deletes from the head while the oldest data is expired and stops at the first record
-- that is not. A partition's timestamps never decrease (topic_common.lua), so the expired
-- records are a prefix of the log and the scan binary-searches its end instead of reading
-- every record: XRANGE copies a whole entry into the script (values of 1 MB included) just to
-- read its 't' field, and a linear scan of 1,000 such records held the server for 6.5 s and
-- doubled its memory. Each call copies at most ARGV[4] bytes past its first probe (so it always
-- moves on), removes what it found expired and hands `kept` to the next call: a backlog of n
-- expired records takes about log2(n) probes in all. A partition's first call probes the head
-- first, since usually nothing is due. A stale `kept` (the partition re-created meanwhile) can
-- only make a call remove less, never more: what is removed was read as expired by this call.

if not is_partition(KEYS[1]) then return {'UNKNOWN_TOPIC_OR_PARTITION', -1, -1, 0, -1} end
if ARGV[7] and (redis.call('GET', KEYS[3]) or '') ~= ARGV[7] then
  return {'UNKNOWN_TOPIC_OR_PARTITION', -1, -1, 0, -1}
end
local s, e = partition_offsets(KEYS[1], KEYS[2])
local by_count = (ARGV[1] ~= '') and e - tonumber(ARGV[1]) or s
if by_count > s then
  local upto = trim_head_toward(KEYS[1], s, by_count, tonumber(ARGV[6]))
  s = upto
  -- (A call that removed by count leaves the search by age to the next, so that no call
  -- removes about ARGV[6] bytes twice over.)
  if upto < by_count or ARGV[2] ~= '' then return {'NONE', s, e, 1, -1} end
end
if ARGV[2] == '' then return {'NONE', s, e, 0, e} end
local cutoff = now_ms() - tonumber(ARGV[2])
local limit, budget = tonumber(ARGV[3]), tonumber(ARGV[4])
-- Every record up to `gone` is expired (or already removed); every record from `kept` is kept.
local gone, kept = s - 1, e
if ARGV[5] ~= '' then kept = math.max(s, math.min(kept, tonumber(ARGV[5]))) end
local at = (ARGV[5] == '') and s or nil
local copied = 0
while gone + 1 < kept and (copied == 0 or copied < budget) do
  at = at or math.floor((gone + kept) / 2)
  local ent = redis.call('XRANGE', KEYS[1], string.format('0-%d', at + 1), '+', 'COUNT', 1)[1]
  local off = ent and seq(ent[1]) - 1
  local expired = false
  if ent and off < kept then
    local t = nil
    for j = 1, #ent[2], 2 do
      copied = copied + #ent[2][j + 1]
      if ent[2][j] == 't' then t = tonumber(ent[2][j + 1]) end
    end
    if t == nil then
      -- An entry added with XADD by hand: a t that is not a number failed with a bare Lua
      -- error, and one with no t was taken for kept, so retention stopped at it for good.
      -- (Before any write of this call: a call that trimmed by count returned above.)
      error(string.format('FOREIGN_ENTRY_ID %s: the entry at offset %d is not a record (it '
        .. 'has no integer t field), so retention by age cannot pass it; Topics.delete_records '
        .. 'to offset %d removes it and the records before it', KEYS[1], off, off + 1), 0)
    end
    expired = t < cutoff
  end
  if expired then gone = off else kept = at end  -- nothing in [at, off), and off is kept
  at = nil
end
-- Freeing records costs the server time too (500 records of 1 MB: 108 ms in one XTRIM), so the
-- removal is bounded by ARGV[6] bytes as the count's is (trim_head_toward). It was estimated
-- from the search's probes, which may all miss the large records: a record of 1 byte, 19 of
-- 100 KB, then 21 of 1 byte went at once (1.9 MB for a bound of 5,000).
local upto = math.min(gone + 1, s + limit)  -- the first offset this call keeps, at most
if upto > s then
  upto = trim_head_toward(KEYS[1], s, upto, tonumber(ARGV[6]))
  s = upto
end
local more = 0
if gone + 1 < kept or upto < gone + 1 then more = 1 end
return {'NONE', s, e, more, kept}
