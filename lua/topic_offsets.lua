-- topic_offsets.lua: the log start and end offsets of one partition.
-- KEYS[1] stream. Returns {error name, log start, log end}.

if not is_partition(KEYS[1]) then return {'UNKNOWN_TOPIC_OR_PARTITION', -1, -1} end
local s, e = log_offsets(KEYS[1])
return {'NONE', s, e}
