-- expire_deadlines.lua: applies every passed deadline of one group (the timer sweep's step).
-- KEYS: the group layout of prelude.lua (KEYS[1]..KEYS[15]).
-- ARGV[1] now ms or ''   ARGV[2] group id
-- Returns {number of deadlines applied, then each one's lateness in ms (now - deadline)}.

local applied = apply_due()
finish()
local out = {applied}
for i = 1, math.min(#LATENESS, 1000) do out[#out + 1] = LATENESS[i] end
return out
