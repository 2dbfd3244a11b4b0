-- topic_make.lua: creates an empty partition stream, with no idempotent-producer state.
-- KEYS[1] stream, KEYS[2] producer states, KEYS[3] producer activity, KEYS[4] creation token
-- (a string; all four share the partition's hash tag).
-- ARGV[1] 'reset' (a new topic: drop any leftover) or 'ensure' (keep existing),
-- ARGV[2] the creation token of the Topics.create call ('reset' only).
-- Returns 1 if it made the stream, 0 if it left the partition as it was.
-- An empty stream is made with XGROUP CREATE MKSTREAM: XADD would spend offset 0. Producer
-- state left by a crashed delete of an older topic of the same name goes with the stream, so
-- a re-created partition accepts every producer from scratch. 'reset' records the token, and a
-- resent call (its reply was lost, redis-py sent it again) finds it and leaves the partition
-- alone: producers may already have appended records and been told their offsets.

if ARGV[1] == 'reset' then
  if redis.call('GET', KEYS[4]) == ARGV[2] then return 0 end
elseif redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4])
redis.call('XGROUP', 'CREATE', KEYS[1], 'rcoord-init', '$', 'MKSTREAM')
redis.call('XGROUP', 'DESTROY', KEYS[1], 'rcoord-init')
if ARGV[1] == 'reset' then redis.call('SET', KEYS[4], ARGV[2]) end
return 1
