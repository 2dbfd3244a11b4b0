-- spark_replay_read.lua: the generation that replayed a Spark batch, if recorded within the
-- retention (rcoord/spark/replays.py; spark_replay_record.lua writes it).
-- KEYS[1] the group's replay record
-- ARGV[1] the field of the replayed batch   ARGV[2] how long a record counts, ms
-- ARGV[3] now in ms ('': the server's TIME)
-- Returns the replaying generation, or false. A record written without a time (by an older
-- rcoord) is read as it is.

local got = redis.call('HGET', KEYS[1], ARGV[1])
local at = tonumber(redis.call('HGET', KEYS[1], '@' .. ARGV[1]))
if got == false or at == nil then return got end
if read_clock(ARGV[3]) - at >= tonumber(ARGV[2]) then return false end  -- (clock.lua)
return got
