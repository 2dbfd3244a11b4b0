-- delete_group.lua: Kafka's DeleteGroups for one group: only an Empty group may go, and its
-- offsets go with it.
-- keys: the group layout of prelude.lua (keys[1]..keys[16]); ARGV: the function's args.
-- ARGV[1] now ms or ''   ARGV[2] group id
-- Returns the Kafka error name.

local function delete_group_step()
  local result
  if not group_exists() then
    result = 'GROUP_ID_NOT_FOUND'
  elseif G.state ~= EMPTY then
    result = 'NON_EMPTY_GROUP'
  else
    delete_group()
    result = 'NONE'
  end
  return result
end

group_step('delete_group', delete_group_step)
