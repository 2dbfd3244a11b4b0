-- settings.lua: the namespace settings as one agreed fact (rcoord/settings.py drives it).
-- KEYS[1] the namespace settings hash '<ns>:settings' (ops establish, update, move, mark,
--         unmark, adopt), or a partition's copy '<ns>:{tag}:cfg' (ops copy, withdraw), or an
--         anchor '<ns>:{a.<i>.<k>}:anchor' (op copy)
-- KEYS[2] (ops copy, withdraw; none for an anchor) the partition's withdrawal mark
--         '<ns>:{tag}:withdrawn' (a string: the version its layout was withdrawn at)
-- KEYS[3..] (op withdraw only) keys of that partition deleted with its copy (its events stream,
--         read position and replica-ack counter: the same {tag}, so the same slot)
-- (op drop) KEYS[1] a partition's copy, KEYS[2] its groups set, KEYS[3] its due index,
--         KEYS[4] the group's offsets, KEYS[5] its wake stream, KEYS[6..] its other keys
-- ARGV[1] op:
--   'establish'  ARGV[2..] field, value pairs: stored (version 1) only if no settings exist;
--                either way the stored settings come back. Whoever comes first decides.
--   'update'     ARGV[2..] field, value pairs: the fields that differ are written and the
--                version goes up by one; the stored settings come back. RCOORD_NOT_COORDINATOR
--                if no settings exist (they were lost: establish first).
--   'move'       ARGV[2] the partition count expected stored, ARGV[3..] field, value pairs:
--                'update', only if the stored num_partitions is ARGV[2] (a change of the count
--                checked that layout for groups and marks it to be retired); else nothing is
--                written (another process moved the count since: the settle reads it again).
--                The stored settings come back.
--   'copy'       ARGV[2] version, ARGV[3..] field, value pairs: the copy is replaced unless it
--                already holds a newer version (two writers racing never leave an older copy),
--                or its layout was withdrawn at this version or a newer one (KEYS[2]: a settle
--                that read the count before a change of it, its write landing after the
--                changer's deletion; then {'withdrawn', that version} comes back). A copy
--                written deletes KEYS[2] (the layout is in force again).
--   'withdraw'   ARGV[2] version: the copy (of a layout no longer in force) and KEYS[3..] are
--                deleted unless the copy holds a newer version (written since for the layout
--                in force again: then nothing is); 1 also if it was gone already (a deletion
--                retried after it failed halfway). One script, so a change back landing between
--                the copy's deletion and the others' cannot lose the live partition's stream.
--                KEYS[2] is set to ARGV[2] (kept if it holds a newer one), so a late copy of the
--                old settings is refused by 'copy' itself, whether or not its writer lives on.
--   'drop'       ARGV[2] a group id: unless the copy exists (the layout is in force again, and
--                the group with it), the group's keys are deleted, ARGV[2] removed from the
--                groups set and the due index, and a wake-up left for its parked callers
--                (expiring, as prelude.lua's finish leaves one for a deleted group); returns
--                the group's offsets as they were (a flat field, value array), or 0 if kept.
--                A group formed in a layout a change of count withdrew (rcoord/settings.py
--                _retire): no step serves it, and kept, it came back with a change back.
--   'mark'       ARGV[2] a field ('retire:<count>'), ARGV[3] its value (a random token): set
--                if the settings exist (a hash created holding only it would lack
--                num_partitions, which every settle refuses).
--   'unmark'     ARGV[2] a field, ARGV[3] a value: the field is deleted only if it holds that
--                value (the mark as read: one set again since marks copies written later).
--   'adopt'      ARGV[2] version, ARGV[3..] field, value pairs: the fields are written at that
--                version only if the settings hold an older one (they were rolled back below a
--                copy by a failover); the stored settings come back ({} if none exist: nothing
--                is written, the settle re-establishes them). RCOORD_BAD_ARGUMENT if the version
--                is not an integer.
-- Returns a flat field, value array (establish, update, move, adopt; drop: the offsets) or 1 / 0
-- (copy, withdraw, mark, unmark: written or deleted, or not; copy may also refuse as said above;
-- drop: 0 if kept).

-- ARGV[2] (a version) and ARGV[3..] (field, value pairs) as one HSET argument list.
local function versioned_pairs(ARGV)
  local pairs_ = {'version', ARGV[2]}
  for i = 3, #ARGV do pairs_[#pairs_ + 1] = ARGV[i] end
  return pairs_
end

-- The version a hash holds; -1 if none or none readable (a copy edited by hand is rewritten,
-- as rcoord/settings.py's _version reads it). Before, an unreadable one failed the comparison
-- with a Lua error, and every settle of the namespace (every process's start) with it.
local function held_version(key)
  return tonumber(redis.call('HGET', key, 'version') or '-1') or -1
end

-- The version a partition's withdrawal mark holds; -1 if none (or none readable).
local function withdrawn_at(key)
  return tonumber(redis.call('GET', key) or '-1') or -1
end

register('settings', function(KEYS, ARGV)
  local key, op = KEYS[1], ARGV[1]

  if op == 'establish' then
    if redis.call('EXISTS', key) == 0 then
      local pairs_ = {}
      for i = 2, #ARGV do pairs_[#pairs_ + 1] = ARGV[i] end
      redis.call('HSET', key, unpack(pairs_))
      if redis.call('HEXISTS', key, 'version') == 0 then redis.call('HSET', key, 'version', 1) end
    end
    return redis.call('HGETALL', key)
  elseif op == 'update' or op == 'move' then
    if redis.call('EXISTS', key) == 0 then
      return redis.error_reply(RCOORD_NOT_COORDINATOR .. ' the settings at ' .. key .. ' were lost')
    end
    local first = 2
    if op == 'move' then
      if redis.call('HGET', key, 'num_partitions') ~= ARGV[2] then
        return redis.call('HGETALL', key)
      end
      first = 3
    end
    local changed = false
    for i = first, #ARGV, 2 do
      if redis.call('HGET', key, ARGV[i]) ~= ARGV[i + 1] then
        redis.call('HSET', key, ARGV[i], ARGV[i + 1])
        changed = true
      end
    end
    if changed then redis.call('HINCRBY', key, 'version', 1) end
    return redis.call('HGETALL', key)
  elseif op == 'copy' then
    local have = held_version(key)
    local version = tonumber(ARGV[2])
    if have > version then return 0 end
    if KEYS[2] then
      local gone = withdrawn_at(KEYS[2])
      if gone >= version then return {'withdrawn', tostring(gone)} end
      redis.call('DEL', KEYS[2])
    end
    redis.call('DEL', key)
    redis.call('HSET', key, unpack(versioned_pairs(ARGV)))
    return 1
  elseif op == 'withdraw' then
    local version = tonumber(ARGV[2])
    if held_version(key) > version then return 0 end
    if withdrawn_at(KEYS[2]) < version then redis.call('SET', KEYS[2], ARGV[2]) end
    redis.call('DEL', key, unpack(KEYS, 3))
    return 1
  elseif op == 'drop' then
    if redis.call('EXISTS', key) == 1 then return 0 end
    local offsets = redis.call('HGETALL', KEYS[4])
    redis.call('DEL', KEYS[4], unpack(KEYS, 6))
    redis.call('SREM', KEYS[2], ARGV[2])
    redis.call('ZREM', KEYS[3], ARGV[2])
    -- Whether or not the stream exists yet: a group's first join parked for the initial delay
    -- waits on a stream no wake-up has created (it waited for its deadline, refused then).
    redis.call('XADD', KEYS[5], 'MAXLEN', '~', '16', '*', 'g', '-1')
    redis.call('PEXPIRE', KEYS[5], 60000)
    return offsets
  elseif op == 'mark' then
    if redis.call('EXISTS', key) == 0 then return 0 end
    redis.call('HSET', key, ARGV[2], ARGV[3])
    return 1
  elseif op == 'unmark' then
    if redis.call('HGET', key, ARGV[2]) ~= ARGV[3] then return 0 end
    redis.call('HDEL', key, ARGV[2])
    return 1
  elseif op == 'adopt' then
    local version = tonumber(ARGV[2])
    if version == nil or version ~= math.floor(version) then
      return redis.error_reply(RCOORD_BAD_ARGUMENT .. ' adopt needs an integer version, got '
        .. tostring(ARGV[2]))
    end
    if redis.call('EXISTS', key) == 1
        and held_version(key) < version then
      redis.call('HSET', key, unpack(versioned_pairs(ARGV)))
    end
    return redis.call('HGETALL', key)
  end
  return redis.error_reply(RCOORD_BAD_ARGUMENT .. ' unknown settings op ' .. tostring(op))
end)
