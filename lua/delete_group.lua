-- delete_group.lua: Kafka's DeleteGroups for one group: only an Empty group may go, and its
-- offsets go with it.
-- KEYS: the group layout of prelude.lua (KEYS[1]..KEYS[15]).
-- ARGV[1] now ms or ''   ARGV[2] group id
-- Returns the Kafka error name.

apply_due()
local result
if not group_exists() then
  result = 'GROUP_ID_NOT_FOUND'
elseif G.state ~= EMPTY then
  result = 'NON_EMPTY_GROUP'
else
  delete_group()
  result = 'NONE'
end
finish()
return result
