-- topic_fetch.lua: reads the records of one partition from an offset.
-- KEYS[1] stream. ARGV[1] offset, ARGV[2] its id, ARGV[3] max records.
-- Returns {error name, log start, log end, entries}.

if not is_partition(KEYS[1]) then return {'UNKNOWN_TOPIC_OR_PARTITION', -1, -1, {}} end
local s, e = log_offsets(KEYS[1])
local o = tonumber(ARGV[1])
if o < s or o > e then return {'OFFSET_OUT_OF_RANGE', s, e, {}} end
local entries = {}
if o < e then entries = redis.call('XRANGE', KEYS[1], ARGV[2], '+', 'COUNT', ARGV[3]) end
return {'NONE', s, e, entries}
