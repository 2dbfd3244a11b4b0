-- await_reply.lua: a parked JoinGroup or SyncGroup caller collects its reply, or learns how long
-- to wait. A reply already stored is returned at once (await_reply_fast below); otherwise it
-- applies the group's passed deadlines first, so a caller waiting on a deadline completes it
-- itself when no coordinator process is running.
-- keys: the group layout of prelude.lua (keys[1]..keys[16]); ARGV: the function's args.
-- ARGV[1] now ms or ''   ARGV[2] group id   ARGV[3] member id   ARGV[4] 'j' (join) or 's' (sync)
-- Returns {'R', reply} or {'W', wake_id, next_deadline, now, member_id}.

local function await_reply(ARGV)
  return reply_or_wait(ARGV[3], ARGV[4])
end

-- A reply once stored is final (prelude.lua's reply slots), so a caller whose reply is there
-- gets it at the cost of one HGET, without the wrapper: the answer is the one the step would
-- give, and the deadlines it would have applied first are left to the sweep and to the callers
-- still waiting, as when the park flow's own HGET finds the reply (rcoord/protocol/park.py).
-- This is the common call while a large join completion or sync propagation is written in
-- chunks: every caller woken by a chunk that was not in it asks, and by the time it is served
-- another caller's call has usually written its chunk.
local function await_reply_fast(keys, args)
  bind_group_keys(keys)
  local blob = redis.call('HGET', K_REPLIES, reply_field(args[4], args[3]))
  if blob then return {'R', blob} end
  return nil
end

local function parse_await_reply(ARGV)
  if ARGV[4] ~= 'j' and ARGV[4] ~= 's' then error("ARGV[4] must be 'j' or 's'", 0) end
  return ARGV
end

group_step('await_reply', await_reply, parse_await_reply,
  {brief = true, fast = await_reply_fast, argc = 4})
