-- lease.lua: compare-and-set operations on one partition's lease (rcoord/service/leases.py).
-- A lease only decides which coordinator does a partition's timer work; state stays correct
-- even if two coordinators briefly work the same partition.
-- KEYS[1] the partition's lease key (string: holder id, with a TTL)
-- ARGV[1] op: 'acquire' | 'renew' | 'handoff' | 'release' | 'steal'
-- ARGV[2] this coordinator's id   ARGV[3] ttl ms
-- ARGV[4] handoff: the new holder; steal: the holder seen gone from the registry
-- Returns the holder after the operation ('' when free).

register('lease', function(KEYS, ARGV)
  local key, op, me, ttl = KEYS[1], ARGV[1], ARGV[2], ARGV[3]
  local holder = redis.call('GET', key)
  if op == 'acquire' then
    if not holder then
      redis.call('SET', key, me, 'PX', ttl)
      return me
    end
    if holder == me then redis.call('PEXPIRE', key, ttl) end
    return holder
  end
  if op == 'steal' then
    -- The holder left the registry (it stopped, or died and its entry expired): take over,
    -- unless the lease changed hands since it was read.
    if holder == ARGV[4] then
      redis.call('SET', key, me, 'PX', ttl)
      return me
    end
    return holder or ''
  end
  if holder ~= me then return holder or '' end
  if op == 'renew' then
    redis.call('PEXPIRE', key, ttl)
    return me
  elseif op == 'handoff' then
    redis.call('SET', key, ARGV[4], 'PX', ttl)
    return ARGV[4]
  elseif op == 'release' then
    redis.call('DEL', key)
    return ''
  end
  return redis.error_reply(RCOORD_BAD_ARGUMENT .. ' unknown lease op ' .. tostring(op))
end)
