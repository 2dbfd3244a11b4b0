-- expire_deadlines.lua: applies the passed deadlines of one group (the timer sweep's step): a
-- share per call (apply_due: up to due_per_call of them, or one chunk); the group stays due in
-- the partition's index for the rest, and the sweep calls again (it never answers BUSY).
-- keys: the group layout of prelude.lua (keys[1]..keys[16]); ARGV: the function's args.
-- ARGV[1] now ms or ''   ARGV[2] group id
-- Returns {number of deadlines applied (a chunk counts one), then each deadline's lateness in
-- ms (now - deadline)}.
-- It always publishes the group's earliest deadline (other steps only when it may have moved),
-- so the sweep, which comes here from the partition's index, also repairs that index.

local function expire_deadlines()
  FORCE_PUBLISH = true
  local out = {APPLIED}
  for i = 1, math.min(#LATENESS, 1000) do out[#out + 1] = LATENESS[i] end
  return out
end

group_step('expire_deadlines', expire_deadlines, nil, {partial = true, brief = true})
