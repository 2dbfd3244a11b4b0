-- await_reply.lua: a parked JoinGroup or SyncGroup caller collects its reply, or learns how long
-- to wait. It applies the group's passed deadlines first, so a caller waiting on a deadline
-- completes it itself when no coordinator process is running.
-- keys: the group layout of prelude.lua (keys[1]..keys[16]); ARGV: the function's args.
-- ARGV[1] now ms or ''   ARGV[2] group id   ARGV[3] member id   ARGV[4] 'j' (join) or 's' (sync)
-- Returns {'R', reply} or {'W', wake_id, next_deadline, now, member_id}.

local function await_reply(ARGV)
  return reply_or_wait(ARGV[3], ARGV[4])
end

group_step('await_reply', await_reply, nil, {brief = true})
