-- topic_producer_id.lua: hands out the next number for an idempotent producer's id.
-- KEYS[1] the namespace's producer id counter. No ARGV. Returns the new number.
-- The Producer adds a random suffix, so ids stay unique even if the counter is ever reset.

return redis.call('INCR', KEYS[1])
