-- topic_make.lua: creates an empty partition stream, with no idempotent-producer state.
-- KEYS[1] stream, KEYS[2] producer states, KEYS[3] producer activity, KEYS[4] last record
-- timestamp, KEYS[5] creation token (a string: the create token of the topic the partition
-- belongs to). All five share the partition's hash tag.
-- ARGV[1] 'reset' (Topics.create: a new topic, drop any leftover), 'ensure' (add_partitions:
-- make it if missing, keep it if it is this topic's) or 'replace' (add_partitions: replace a
-- leftover of an older topic of the same name, seen by an earlier 'ensure'),
-- ARGV[2] the topic's creation token (the Topics.create call's; '' for a topic made before
-- tokens), ARGV[3] ('replace' only) the token the leftover carried ('' for none).
-- Returns {1, ''} if it made the stream, {0, ''} if it left the partition as it was (this
-- topic's already), {-1, token found} if the stream carries another topic's token ('ensure'
-- and 'replace' leave it alone: the caller decides whether it is a leftover).
-- An empty stream is made with XGROUP CREATE MKSTREAM: XADD would spend offset 0 (its mark is made
-- below). Producer state left by a crashed delete of an older topic of the same name goes with the
-- stream, so a re-created partition accepts every producer from scratch. 'reset' records the
-- token, and a resent call (its reply was lost, redis-py sent it again) finds it and leaves the
-- partition alone: producers may already have appended records and been told their offsets.
-- 'ensure' keeps a stream with the topic's token (a concurrent add_partitions of the same topic
-- made it and may have announced it), but not one of an older topic (a delete that raced an
-- add_partitions left it, records and all): that one is reported, and replaced only by a 'replace'
-- naming the token seen, so a stream made meanwhile by a newer topic is never lost.

local token = redis.call('GET', KEYS[5]) or ''
if ARGV[1] == 'reset' then
  if token == ARGV[2] then return {0, ''} end
elseif redis.call('EXISTS', KEYS[1]) == 1 then
  if token == ARGV[2] then return {0, ''} end
  if ARGV[1] == 'ensure' or token ~= ARGV[3] then return {-1, token} end
end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5])
redis.call('XGROUP', 'CREATE', KEYS[1], 'rcoord-init', '$', 'MKSTREAM')
redis.call('XGROUP', 'DESTROY', KEYS[1], 'rcoord-init')
-- The last-record mark ("<timestamp> <log end>", topic_common.lua's appended) exists from the
-- start, timestamp 0 (none yet): the reads of the log offsets name it beside the stream, and a
-- cluster answers a command on two keys of a migrating slot, one of them missing, TRYAGAIN for
-- as long as the slot moves, so a fetch of a partition with no records yet raised
-- ConnectionLost for every partition read with it.
redis.call('SET', KEYS[4], '0 0')
if ARGV[2] ~= '' then redis.call('SET', KEYS[5], ARGV[2]) end
return {1, ''}
