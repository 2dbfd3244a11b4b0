-- topic_producer_ttl.lua: after a change of a topic's producer.id.expiration.ms, stores it in
-- one partition's producer states hash and, after a raise, extends that partition's
-- producer state keys to expire that long after its last idempotent append.
-- KEYS[1] producer states (hash), KEYS[2] producer activity (zset: producer id -> last
-- activity ms), KEYS[3..] the append logs (rcoord.topics.epoch_log) of the producers ARGV[2..]
-- names, in that order; all carry the partition's hash tag. ARGV[1] the new
-- producer.id.expiration.ms, ARGV[2..] producer ids (those of the activity zset when read).
-- Each log is extended to expire that long after its producer's last append: kept at the old
-- time, a retried Spark task found its producer's state but no log (not complete) and could
-- store its rows again. Returns {1 if it extended the state keys else 0, {the producer ids of
-- KEYS[2] that ARGV[2..] does not name}}: those that first appended between the caller's read of
-- KEYS[2] and this script, with the setting the append read, so the caller calls again with
-- their logs (once: every append after this script reads the setting stored here).
-- topic_append_idempotent.lua sets both keys to expire the setting's value after each append,
-- as it was then: a raise since left them to go at the old, shorter time, while the state is
-- not expired by the new setting (the script's rule, Kafka's expiry check's), and a batch
-- resent then was taken for a new producer's and appended twice. Never shortened: a lowered
-- setting already expires the states by the rule, and the keys go at the old time.
-- Every PEXPIRE is GT: only ever later, and a key without an expiry (appended under a
-- caller's clock, a test's) is left alone, GT taking it as expiring never. (No PTTL: the
-- roles of docs/security.md may not run it, and the admin's alter_configs failed on it after
-- the setting was written, leaving the keys at the old time.)

local last = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
local now = read_clock('')  -- (clock.lua, in front of this script)
local expiration = math.min(tonumber(ARGV[1]), 2 ^ 46)
-- The new setting, raised or lowered, where every append reads it (topic_append_idempotent.lua
-- takes it over a caller's older, shorter one): the states' empty field, which no producer id
-- can name (ids are 1..1024 bytes).
redis.call('HSET', KEYS[1], '', ARGV[1])
local named, unnamed = {}, {}
for i = 2, #ARGV do named[ARGV[i]] = true end
for _, pid in ipairs(redis.call('ZRANGE', KEYS[2], 0, -1)) do
  if not named[pid] then unnamed[#unnamed + 1] = pid end
end
if #last == 0 then
  -- No state: the field alone, for as long as the setting (a producer that starts here with
  -- the setting it read before the change finds it; an append extends it as the state's).
  redis.call('PEXPIRE', KEYS[1], string.format('%d', expiration))
  return {0, unnamed}
end
for i = 3, #KEYS do
  local at = redis.call('ZSCORE', KEYS[2], ARGV[i - 1])
  local log_ttl = at and tonumber(at) + expiration - now
  if log_ttl and log_ttl > 0 then
    redis.call('PEXPIRE', KEYS[i], string.format('%d', log_ttl), 'GT')
  end
end
local ttl = tonumber(last[2]) + expiration - now
if ttl <= 0 then return {0, unnamed} end  -- (a PEXPIRE of 0 or less would delete the keys)
ttl = string.format('%d', ttl)  -- never in exponent form
redis.call('PEXPIRE', KEYS[1], ttl, 'GT')
return {redis.call('PEXPIRE', KEYS[2], ttl, 'GT'), unnamed}
