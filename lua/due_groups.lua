-- due_groups.lua: the groups of one partition with a deadline that has passed.
-- This script does not use the prelude (clock.lua only): it touches one partition key only.
-- KEYS[1] due (zset: group id -> earliest deadline)
-- ARGV[1] now ms or ''   ARGV[2] most groups to return
-- Returns {now, group ids...}.

local now = read_clock(ARGV[1])
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[2]))
table.insert(ids, 1, tostring(now))
return ids
