-- expire_deadlines.lua: applies the passed deadlines of one group (the timer sweep's step): a
-- share per call (apply_due: up to due_per_call of them, or one chunk); the group stays due in
-- the partition's index for the rest, and the sweep calls again (it never answers BUSY).
-- keys: the group layout of prelude.lua (keys[1]..keys[16]); ARGV: the function's args.
-- ARGV[1] now ms or ''   ARGV[2] group id
-- Returns {number of deadlines applied (a chunk counts one), then each deadline's lateness in
-- ms (now - deadline)}.
-- It publishes the group's earliest deadline whenever the group's published one ('ea') has
-- passed, is unknown or says there is none (other steps only when it may have moved), so the
-- sweep, which comes here from the partition's index, also repairs that index (an entry of a
-- group that is gone, among others). An 'ea' still ahead means the sweep raced a step that
-- published it (the index and 'ea' are written together, deadline_index.lua): the index holds
-- it too, and nothing is due, so the call reads nothing more (a look at the deadlines was a
-- quarter of this call's commands).

local function expire_deadlines()
  FORCE_PUBLISH = not (PUBLISHED and PUBLISHED > NOW)
  local out = {APPLIED}
  for i = 1, math.min(#LATENESS, 1000) do out[#out + 1] = LATENESS[i] end
  return out
end

group_step('expire_deadlines', expire_deadlines, nil, {partial = true, brief = true})
