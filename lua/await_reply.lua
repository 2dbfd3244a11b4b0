-- await_reply.lua: a parked JoinGroup or SyncGroup caller collects its reply, or learns how long
-- to wait. It applies the group's passed deadlines first, so a caller waiting on a deadline
-- completes it itself when no coordinator process is running.
-- KEYS: the group layout of prelude.lua (KEYS[1]..KEYS[15]).
-- ARGV[1] now ms or ''   ARGV[2] group id   ARGV[3] member id   ARGV[4] 'j' (join) or 's' (sync)
-- Returns {'R', reply} or {'W', wake_id, next_deadline, now, member_id}.

apply_due()
return reply_or_wait(ARGV[3], ARGV[4])
