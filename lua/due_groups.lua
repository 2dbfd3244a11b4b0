-- due_groups.lua: the groups of one partition with a deadline that has passed.
-- This script does not use the prelude: it touches one partition key only.
-- KEYS[1] due (zset: group id -> earliest deadline)
-- ARGV[1] now ms or ''   ARGV[2] most groups to return
-- Returns {now, group ids...}.

local now
if ARGV[1] ~= '' then
  now = tonumber(ARGV[1])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[2]))
table.insert(ids, 1, tostring(now))
return ids
