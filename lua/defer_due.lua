-- defer_due.lua: moves a group's entry in its partition's due index to the time the sweeper
-- retries the group, after the sweeper's expire_deadlines of it failed (a script error): a
-- step announces a deadline only when it is earlier than the index's first entry, so a passed
-- entry left there kept the partition's later deadlines unannounced (rcoord/service/sweeper.py).
-- Only an entry that had passed when the failed call was sent: a deadline a step of the group
-- published since (with its 'ea', later than that) is the group's real one, and stays. Only
-- later (GT), only an entry that is there (XX).
-- It uses none of the prelude's per-call state: it touches one partition key only.
-- KEYS[1] due (zset: group id -> earliest deadline)
-- ARGV[1] group id   ARGV[2] when the failed call was sent, ms (server time)
-- ARGV[3] the retry time, ms
-- Returns 1 if the entry moved, else 0.

register('defer_due', function(KEYS, ARGV)
  local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
  if not score or tonumber(score) > tonumber(ARGV[2]) then return 0 end
  return redis.call('ZADD', KEYS[1], 'XX', 'GT', 'CH', ARGV[3], ARGV[1])
end)
