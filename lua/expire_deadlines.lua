-- expire_deadlines.lua: applies every passed deadline of one group (the timer sweep's step).
-- KEYS: the group layout of prelude.lua (KEYS[1]..KEYS[14]).
-- ARGV[1] now ms or ''   ARGV[2] group id
-- Returns the number of deadlines applied.

local applied = apply_due()
finish()
return applied
