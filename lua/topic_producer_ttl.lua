-- topic_producer_ttl.lua: after a raise of a topic's producer.id.expiration.ms, extends one
-- partition's producer state keys to expire that long after its last idempotent append.
-- KEYS[1] producer states (hash), KEYS[2] producer activity (zset: producer id -> last
-- activity ms); both carry the partition's hash tag. ARGV[1] the new producer.id.expiration.ms.
-- Returns 1 if it extended them, else 0.
-- topic_append_idempotent.lua sets both keys to expire the setting's value after each append,
-- as it was then: a raise since left them to go at the old, shorter time, while the state is
-- not expired by the new setting (the script's rule, Kafka's expiry check's), and a batch
-- resent then was taken for a new producer's and appended twice. Never shortened: a lowered
-- setting already expires the states by the rule, and the keys go at the old time.
-- Keys without an expiry (appended under a caller's clock, a test's) are left alone.

local left = redis.call('PTTL', KEYS[2])
if left < 0 then return 0 end  -- -2: no state; -1: no expiry (a caller's clock)
local last = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
local now = read_clock('')  -- (clock.lua, in front of this script)
local ttl = tonumber(last[2]) + math.min(tonumber(ARGV[1]), 2 ^ 46) - now
if ttl <= left then return 0 end
ttl = string.format('%d', ttl)  -- never in exponent form
redis.call('PEXPIRE', KEYS[1], ttl)
redis.call('PEXPIRE', KEYS[2], ttl)
return 1
