-- describe_group.lua: Kafka's DescribeGroups for one classic group (after applying its passed
-- deadlines, so the answer is current).
-- keys: the group layout of prelude.lua (keys[1]..keys[16]); ARGV: the function's args.
-- ARGV[1] now ms or ''   ARGV[2] group id
-- Returns cmsgpack {st = state, pt = protocol type, pn = protocol name (Stable only),
--                   mem = {{id, iid, cid, host, meta, asg}...}}; a missing group is 'Dead'.

local function describe_group(ARGV)
  local out
  if not group_exists() then
    out = {st = DEAD, pt = '', pn = '', mem = {}}
  else
    -- As Kafka: metadata and assignments are shown only once the group is Stable.
    local stable = G.state == STABLE
    settle_chunks() -- (assignments still being written in chunks: every member is read anyway)
    local members = {}
    for _, rec in ipairs(all_members()) do
      members[#members + 1] = {id = rec.id, iid = rec.iid, cid = rec.cid, host = rec.host,
        meta = stable and metadata_for(rec, G.pname) or '', asg = stable and rec.asg or ''}
    end
    out = {st = G.state, pt = G.ptype, pn = stable and G.pname or '', mem = members}
  end
  return cmsgpack.pack(out)
end

group_step('describe_group', describe_group, nil, {settles = true})
