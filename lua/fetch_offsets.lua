-- fetch_offsets.lua: Kafka's OffsetFetch for a classic group.
-- keys: the group layout of prelude.lua (keys[1]..keys[16]); ARGV: the function's args.
-- ARGV[1] now ms or ''   ARGV[2] group id   ARGV[3..] fields '<partition>:<topic>' (none = all)
-- Returns {field, record-or-false, field, record-or-false, ...}.

local function fetch_offsets(ARGV)
  local out = {}
  if #ARGV > 2 then
    for i = 3, #ARGV do
      out[#out + 1] = ARGV[i]
      out[#out + 1] = redis.call('HGET', K_OFFSETS, ARGV[i]) or false
    end
  else
    out = redis.call('HGETALL', K_OFFSETS)
  end
  return out
end

group_step('fetch_offsets', fetch_offsets, nil, {brief = true})
