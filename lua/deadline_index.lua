-- deadline_index.lua: shared by prelude.lua and heartbeat.lua (scripts.py puts it in front).
-- Publishes a group's earliest deadline to its partition: the due index (KEYS 'due'), the
-- group hash's 'ea' field (the same value, so a step learns it with the group's other fields;
-- '-' when the group has no deadline), a message on the shard channel named like the due index
-- when this deadline becomes the partition's earliest (so the lease holder never sleeps past
-- it), and the hint key expiring at that moment (a wake-up for coordinators listening to
-- expired-key events; only a hint). Between two publications the index may be earlier than the
-- group's earliest deadline, never later (prelude.lua, note_deadline_write, says why).
-- Takes every key and value as arguments (``published``: the group's 'ea' as read, nil when
-- absent; ``k_group`` nil: the caller writes 'ea' itself; ``head``: the deadlines' first entry
-- as the caller last read it, if nothing wrote them since, else nil); touches nothing else.
-- Returns the value 'ea' is to hold.

-- The published time a group's 'ea' field holds: a number, false for '-' (the group has no
-- deadline), nil when the field is absent (not known).
local function published_of(ea)
  if ea == '-' then return false end
  return tonumber(ea)
end

local function publish_earliest(k_deadlines, k_due, k_hint, k_group, group_id, exists, published,
                                now, mock_time, head)
  local first = exists and (head or redis.call('ZRANGE', k_deadlines, 0, 0, 'WITHSCORES')) or {}
  if #first == 0 then
    if published == '-' then return published end
    redis.call('ZREM', k_due, group_id)
    redis.call('DEL', k_hint)
    if exists and k_group then redis.call('HSET', k_group, 'ea', '-') end
    return '-'
  end
  local at = tonumber(first[2])
  if tonumber(published) == at then return published end
  local pmin = redis.call('ZRANGE', k_due, 0, 0, 'WITHSCORES')
  redis.call('ZADD', k_due, at, group_id)
  local ea = string.format('%d', at)
  if k_group then redis.call('HSET', k_group, 'ea', ea) end
  if #pmin == 0 or at < tonumber(pmin[2]) then
    redis.call('SPUBLISH', k_due, ea)
  end
  if not mock_time then redis.call('SET', k_hint, group_id, 'PXAT', math.max(at, now + 1)) end
  return ea
end
