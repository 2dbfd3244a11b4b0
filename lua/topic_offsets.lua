-- topic_offsets.lua: the log start and end offsets of one partition.
-- KEYS[1] stream, KEYS[2] optional: the partition's last-record mark (topic_common.lua's
-- appended), which gives them without XINFO STREAM's copy of the first and last records.
-- Returns {error name, log start, log end}.

if not is_partition(KEYS[1]) then return {'UNKNOWN_TOPIC_OR_PARTITION', -1, -1} end
local s, e = partition_offsets(KEYS[1], KEYS[2])
return {'NONE', s, e}
