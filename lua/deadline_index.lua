-- deadline_index.lua: shared by prelude.lua and heartbeat.lua (scripts.py puts it in front).
-- Publishes a group's earliest deadline to its partition: the due index (KEYS 'due'), a message
-- on the shard channel named like the due index when this deadline becomes the partition's
-- earliest (so the lease holder never sleeps past it), and the hint key expiring at that moment
-- (a wake-up for coordinators listening to expired-key events; only a hint).
-- Takes every key and value as arguments; touches nothing else.

local function publish_earliest(k_deadlines, k_due, k_hint, group_id, exists, now, mock_time)
  local first = exists and redis.call('ZRANGE', k_deadlines, 0, 0, 'WITHSCORES') or {}
  if #first == 0 then
    redis.call('ZREM', k_due, group_id)
    redis.call('DEL', k_hint)
    return
  end
  local at = tonumber(first[2])
  local old = tonumber(redis.call('ZSCORE', k_due, group_id) or '-1')
  if old == at then return end
  local pmin = redis.call('ZRANGE', k_due, 0, 0, 'WITHSCORES')
  redis.call('ZADD', k_due, at, group_id)
  if #pmin == 0 or at < tonumber(pmin[2]) then
    redis.call('SPUBLISH', k_due, string.format('%d', at))
  end
  if not mock_time then redis.call('SET', k_hint, group_id, 'PXAT', math.max(at, now + 1)) end
end
