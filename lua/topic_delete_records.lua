-- topic_delete_records.lua: Kafka's DeleteRecords for one partition: raises its log start
-- offset to an offset, removing every record before it.
-- KEYS[1] stream, KEYS[2] optional: the partition's last-record mark (same hash tag), which
-- gives the log offsets without XINFO STREAM's copy of the first and last records (as in
-- topic_offsets.lua), KEYS[3] (with ARGV[3]) the partition's creation token (same hash tag).
-- ARGV[1] the new log start offset (-1: the log end, Kafka's high watermark),
-- ARGV[2] most bytes of records one call removes (estimated from records read
-- as it goes: topic_common.lua's trim_head_toward), ARGV[3] optional: the topic's creation
-- token read when the removal began ('' for a topic made before tokens).
-- Returns {error name, log start, log end, more to do}: OFFSET_OUT_OF_RANGE (nothing removed)
-- for an offset below -1 or past the log end, as Kafka's UnifiedLog.deleteRecordsOnLeader;
-- an offset at or below the log start removes nothing and answers the log start.
--
-- Freeing records costs the server time (500 records of 1 MB: 108 ms in one XTRIM), so a call
-- removes about ARGV[2] bytes at most (one record at least) and says whether more is left: the
-- caller repeats with the log end it was answered, as topic_retention.lua's caller does.
-- A partition carrying another token than ARGV[3] is UNKNOWN_TOPIC_OR_PARTITION (nothing
-- removed), as Kafka answers for a deleted topic: the topic was deleted and made again between
-- two calls, and the later calls trimmed the new topic's records.

if not is_partition(KEYS[1]) then return {'UNKNOWN_TOPIC_OR_PARTITION', -1, -1, 0} end
if ARGV[3] and (redis.call('GET', KEYS[3]) or '') ~= ARGV[3] then
  return {'UNKNOWN_TOPIC_OR_PARTITION', -1, -1, 0}
end
local s, e = partition_offsets(KEYS[1], KEYS[2])
local target = tonumber(ARGV[1])
if target == -1 then target = e end
if target < 0 or target > e then return {'OFFSET_OUT_OF_RANGE', s, e, 0} end
if target <= s then return {'NONE', s, e, 0} end
local upto = trim_head_toward(KEYS[1], s, target, tonumber(ARGV[2]))
local more = 0
if upto < target then more = 1 end
return {'NONE', upto, e, more}
