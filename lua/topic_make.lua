-- topic_make.lua: creates an empty partition stream.
-- KEYS[1] stream. ARGV[1] 'reset' (a new topic: drop any leftover) or 'ensure' (keep existing).
-- An empty stream is made with XGROUP CREATE MKSTREAM: XADD would spend offset 0.

if ARGV[1] == 'reset' then redis.call('DEL', KEYS[1])
elseif redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('XGROUP', 'CREATE', KEYS[1], 'rcoord-init', '$', 'MKSTREAM')
redis.call('XGROUP', 'DESTROY', KEYS[1], 'rcoord-init')
return 1
