-- topic_make.lua: creates an empty partition stream, with no idempotent-producer state.
-- KEYS[1] stream, KEYS[2] producer states, KEYS[3] producer activity (same hash tag).
-- ARGV[1] 'reset' (a new topic: drop any leftover) or 'ensure' (keep existing).
-- An empty stream is made with XGROUP CREATE MKSTREAM: XADD would spend offset 0. Producer
-- state left by a crashed delete of an older topic of the same name goes with the stream, so
-- a re-created partition accepts every producer from scratch.

if ARGV[1] ~= 'reset' and redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
redis.call('XGROUP', 'CREATE', KEYS[1], 'rcoord-init', '$', 'MKSTREAM')
redis.call('XGROUP', 'DESTROY', KEYS[1], 'rcoord-init')
return 1
