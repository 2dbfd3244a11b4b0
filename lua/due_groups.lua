-- due_groups.lua: the groups of one partition with a deadline that has passed.
-- It uses none of the prelude's per-call state: it touches one partition key only.
-- KEYS[1] due (zset: group id -> earliest deadline)
-- ARGV[1] now ms or ''   ARGV[2] most groups to return
-- Returns {now, group ids...}.

register('due_groups', function(KEYS, ARGV)
  local now = read_clock(ARGV[1])
  local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[2]))
  table.insert(ids, 1, tostring(now))
  return ids
end, {'no-writes'})
