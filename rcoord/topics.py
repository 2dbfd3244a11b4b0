"""Topics: the partitions a consumer group divides, as Redis Streams with Kafka offsets.

A topic with N partitions is N streams plus one metadata hash. Partition ``p`` of ``topic``:

* ``<ns>:topic:{<tag>}:<topic>:<p>``: a stream, one entry per record;
* ``<ns>:topicmeta:{<topic>}``: a hash with ``partitions``, ``created_ms`` and the retention
  settings (``retention_records``, ``retention_ms``; absent means unlimited).

**Offsets are stream ids.** The record at Kafka offset ``o`` has the stream id ``0-<o+1>``.
Appends use ``XADD key 0-*`` (Redis >= 7): the server itself gives the next sequence number in
millisecond 0, so the offset is assigned by the same command that stores the record, and a
script that appends several records gets consecutive offsets. ``o + 1`` because ``0-0`` is not
a valid entry id. The stream's ``last-generated-id`` survives trimming, so the log end offset
(the offset of the next record) is its sequence number even when retention removed every
record; the log start offset is the first entry's sequence minus one, or the log end when the
stream is empty. Fetching from ``o`` is ``XRANGE key 0-<o+1> +``, and waiting for records at
the log end ``e`` is ``XREAD BLOCK ... STREAMS key 0-<e>``. The ``<o+1>-0`` alternative would
need the next id computed by hand and gains nothing.

**Every script touches one key**, so in a cluster it runs on the partition's node. The tag of a
partition depends only on ``(topic, p)``, never on the partition count, because
``add_partitions`` must not move existing partitions. Tags follow a golden-ratio sequence
over 64 equal slot shares, rotated by the topic's hash: any prefix ``0..n-1`` of a topic's
partitions is spread over the slot range (so over the masters), and different topics start at
different places.

**One clock.** Record timestamps and retention cutoffs come from the partition node's Redis
``TIME``, read inside the script; no client clock is ever stored.

A partition stream exists from ``create``/``add_partitions`` until ``delete``; an append never
creates one (the script checks the key first), so producing to a deleted topic fails with
UNKNOWN_TOPIC_OR_PARTITION instead of resurrecting it.
"""

from __future__ import annotations

import functools
import hashlib
import random
import re
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import msgpack
import redis.exceptions

from .errors import Errors, InvalidRequestError, ProtocolError, translate_redis_errors
from .murmur2 import murmur2, partition_for_key, to_positive
from .partitioning import SLOTS, keyslot

__all__ = [
    "TopicError",
    "PartitionInfo",
    "TopicDescription",
    "ProducerRecord",
    "RecordMetadata",
    "Record",
    "FetchResult",
    "Topics",
    "Producer",
    "fetch",
    "log_offsets",
    "resolve_offset",
    "partition_key",
    "meta_key",
    "partition_tag",
]

MAX_APPEND_PER_CALL = 1000
"""Records per append script call; bounds how long one call holds the server."""
RETENTION_SCAN = 1000
"""Entries one retention call inspects for age; ``apply_retention`` repeats until done."""
_TAG_SHARES = 64
_GOLDEN32 = 0x9E3779B9  # 2**32 / golden ratio
_LEGAL_TOPIC = re.compile(r"[a-zA-Z0-9._-]+")
_MAX_TOPIC_LEN = 249


class TopicError(ProtocolError):
    """A topic request failed with a Kafka error code (``error``).

    It is a ``ProtocolError`` (so an ``RcoordError``) and so carries ``retriable``: for example
    UNKNOWN_TOPIC_OR_PARTITION is retriable, because metadata may simply be behind.
    """

    def __init__(self, error: Errors, message: str = "") -> None:
        self.detail = message
        super().__init__(f"{error.name}: {message}" if message else error.name, error)

    def __reduce__(self) -> tuple[Any, ...]:
        # Keep (error, message) through pickling: the base would rebuild from the text alone.
        return (type(self), (self.error, self.detail))


# -- data -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PartitionInfo:
    """Log offsets of one partition; ``error`` is set (offsets -1) if its stream is missing."""

    partition: int
    log_start_offset: int
    log_end_offset: int
    error: Errors = Errors.NONE


@dataclass(frozen=True)
class TopicDescription:
    name: str
    partitions: list[PartitionInfo]
    created_ms: int = 0
    retention_records: int | None = None
    retention_ms: int | None = None


@dataclass(frozen=True)
class ProducerRecord:
    """One record for ``Producer.send_batch``; ``value=None`` is a tombstone, as in Kafka."""

    value: bytes | None
    key: bytes | None = None
    partition: int | None = None
    headers: dict[str, bytes] | None = None


@dataclass(frozen=True)
class RecordMetadata:
    topic: str
    partition: int
    offset: int
    timestamp_ms: int


@dataclass(frozen=True)
class Record:
    offset: int
    key: bytes | None
    value: bytes | None
    headers: dict[str, bytes]
    timestamp_ms: int


@dataclass(frozen=True)
class FetchResult:
    """Kafka's per-partition fetch answer: records plus the log offsets seen at the same instant.

    Offsets are -1 when ``error`` is UNKNOWN_TOPIC_OR_PARTITION.
    """

    records: list[Record]
    log_start_offset: int
    log_end_offset: int
    error: Errors = Errors.NONE


# -- keys -------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=65536)
def partition_tag(topic: str, partition: int) -> str:
    """The hash tag of a partition: ``<topic>.<p>.<k>`` with the first ``k`` landing in its share.

    The share is ``(rotation + p * 2**32/phi) mod 2**32`` scaled to 64 shares: a low-discrepancy
    sequence, so partitions 0..n-1 spread over the slot range for every n, and the tag never
    depends on n. Integer arithmetic keeps it identical on every platform.
    """
    rotation = murmur2(topic.encode()) & 0xFFFFFFFF
    share = ((rotation + partition * _GOLDEN32) & 0xFFFFFFFF) * _TAG_SHARES >> 32
    k = 0
    while keyslot(f"{topic}.{partition}.{k}") * _TAG_SHARES // SLOTS != share:
        k += 1
    return f"{topic}.{partition}.{k}"


def partition_key(namespace: str, topic: str, partition: int) -> str:
    """The stream holding one partition."""
    return f"{namespace}:topic:{{{partition_tag(topic, partition)}}}:{topic}:{partition}"


def meta_key(namespace: str, topic: str) -> str:
    """The topic's metadata hash (partition count, creation time, retention)."""
    return f"{namespace}:topicmeta:{{{topic}}}"


def _offset_id(offset: int) -> str:
    return f"0-{offset + 1}"


def _id_offset(entry_id: bytes | str) -> int:
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    return int(text.partition("-")[2]) - 1


# -- Lua --------------------------------------------------------------------------------------

_LUA_COMMON = r"""
local function seq(id) return tonumber(string.match(id, '^0%-(%d+)$')) end
local function is_partition(key) return redis.call('TYPE', key)['ok'] == 'stream' end
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
-- Log start and end offsets: end = sequence of the last id ever generated (kept by trimming),
-- start = first entry's offset, or end when retention emptied the stream.
local function log_offsets(key)
  local info = redis.call('XINFO', 'STREAM', key)
  local last, first = nil, false
  for i = 1, #info, 2 do
    if info[i] == 'last-generated-id' then last = info[i + 1]
    elseif info[i] == 'first-entry' then first = info[i + 1] end
  end
  local e = seq(last)
  if first then return seq(first[1]) - 1, e end
  return e, e
end
"""

# KEYS[1] stream. ARGV: 4 per record: flags (1 value, 2 key, 4 headers), value, key, headers.
# Returns {'NONE', first id, timestamp ms} or {'UNKNOWN_TOPIC_OR_PARTITION'}.
_LUA_APPEND = _LUA_COMMON + r"""
if not is_partition(KEYS[1]) then return {'UNKNOWN_TOPIC_OR_PARTITION'} end
local ts = string.format('%d', now_ms())
local first = nil
for i = 1, #ARGV, 4 do
  local flags = tonumber(ARGV[i])
  local f = {'t', ts}
  if flags % 2 == 1 then f[#f + 1] = 'v'; f[#f + 1] = ARGV[i + 1] end
  if math.floor(flags / 2) % 2 == 1 then f[#f + 1] = 'k'; f[#f + 1] = ARGV[i + 2] end
  if math.floor(flags / 4) % 2 == 1 then f[#f + 1] = 'h'; f[#f + 1] = ARGV[i + 3] end
  local id = redis.call('XADD', KEYS[1], '0-*', unpack(f))
  first = first or id
end
return {'NONE', first, tonumber(ts)}
"""

# KEYS[1] stream. ARGV[1] offset, ARGV[2] its id, ARGV[3] max records.
# Returns {error name, log start, log end, entries}.
_LUA_FETCH = _LUA_COMMON + r"""
if not is_partition(KEYS[1]) then return {'UNKNOWN_TOPIC_OR_PARTITION', -1, -1, {}} end
local s, e = log_offsets(KEYS[1])
local o = tonumber(ARGV[1])
if o < s or o > e then return {'OFFSET_OUT_OF_RANGE', s, e, {}} end
local entries = {}
if o < e then entries = redis.call('XRANGE', KEYS[1], ARGV[2], '+', 'COUNT', ARGV[3]) end
return {'NONE', s, e, entries}
"""

# KEYS[1] stream. ARGV[1] 'reset' (a new topic: drop any leftover) or 'ensure' (keep existing).
# An empty stream is made with XGROUP CREATE MKSTREAM: XADD would spend offset 0.
_LUA_MAKE = r"""
if ARGV[1] == 'reset' then redis.call('DEL', KEYS[1])
elseif redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('XGROUP', 'CREATE', KEYS[1], 'rcoord-init', '$', 'MKSTREAM')
redis.call('XGROUP', 'DESTROY', KEYS[1], 'rcoord-init')
return 1
"""

# KEYS[1] stream. Returns {error name, log start, log end}.
_LUA_OFFSETS = _LUA_COMMON + r"""
if not is_partition(KEYS[1]) then return {'UNKNOWN_TOPIC_OR_PARTITION', -1, -1} end
local s, e = log_offsets(KEYS[1])
return {'NONE', s, e}
"""

# KEYS[1] stream. ARGV[1] retention records or '', ARGV[2] retention ms or '', ARGV[3] scan limit.
# Kafka deletes from the head while the oldest data is expired and stops at the first record
# that is not, so the scan stops there too. Returns {error name, start, end, more to scan}.
_LUA_RETENTION = _LUA_COMMON + r"""
if not is_partition(KEYS[1]) then return {'UNKNOWN_TOPIC_OR_PARTITION', -1, -1, 0} end
if ARGV[1] ~= '' then redis.call('XTRIM', KEYS[1], 'MAXLEN', ARGV[1]) end
local more = 0
if ARGV[2] ~= '' then
  local cutoff = now_ms() - tonumber(ARGV[2])
  local entries = redis.call('XRANGE', KEYS[1], '-', '+', 'COUNT', ARGV[3])
  local keep = nil
  for _, ent in ipairs(entries) do
    local ts = 0
    for j = 1, #ent[2], 2 do
      if ent[2][j] == 't' then ts = tonumber(ent[2][j + 1]) end
    end
    if ts >= cutoff then keep = ent[1]; break end
  end
  if keep then
    redis.call('XTRIM', KEYS[1], 'MINID', keep)
  elseif #entries > 0 then
    redis.call('XTRIM', KEYS[1], 'MINID', string.format('0-%d', seq(entries[#entries][1]) + 1))
    if #entries >= tonumber(ARGV[3]) then more = 1 end
  end
end
local s, e = log_offsets(KEYS[1])
return {'NONE', s, e, more}
"""

# KEYS[1] meta. ARGV[1] partitions, ARGV[2] retention records or '', ARGV[3] retention ms or ''.
_LUA_CREATE_META = _LUA_COMMON + r"""
if redis.call('EXISTS', KEYS[1]) == 1 then return {'TOPIC_ALREADY_EXISTS'} end
local now = string.format('%d', now_ms())
redis.call('HSET', KEYS[1], 'partitions', ARGV[1], 'created_ms', now)
if ARGV[2] ~= '' then redis.call('HSET', KEYS[1], 'retention_records', ARGV[2]) end
if ARGV[3] ~= '' then redis.call('HSET', KEYS[1], 'retention_ms', ARGV[3]) end
return {'NONE'}
"""

# KEYS[1] meta. ARGV[1] new total. Only grows; {error name, partition count before}.
_LUA_GROW_META = r"""
local cur = redis.call('HGET', KEYS[1], 'partitions')
if not cur then return {'UNKNOWN_TOPIC_OR_PARTITION', -1} end
cur = tonumber(cur)
if tonumber(ARGV[1]) <= cur then return {'INVALID_PARTITIONS', cur} end
redis.call('HSET', KEYS[1], 'partitions', ARGV[1])
return {'NONE', cur}
"""


class _Lua:
    """A script called by SHA, loaded on NOSCRIPT (also after ``SCRIPT FLUSH`` or a restart).

    redis-py's ``Script`` cannot preload into a cluster pipeline, so pipelines queue EVALSHA
    and re-run, one by one, the calls that came back NOSCRIPT (they did not run).
    """

    def __init__(self, source: str) -> None:
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()

    def __call__(self, client: Any, keys: Sequence[str], args: Sequence[Any]) -> Any:
        try:
            return client.evalsha(self.sha, len(keys), *keys, *args)
        except redis.exceptions.NoScriptError:
            client.script_load(self.source)
            return client.evalsha(self.sha, len(keys), *keys, *args)


_Call = tuple[_Lua, Sequence[str], Sequence[Any]]


def _run(client: Any, calls: Sequence[_Call]) -> list[Any]:
    """Run script calls in one pipeline (one round trip per node); results in call order."""
    if len(calls) == 1:
        lua, keys, args = calls[0]
        return [lua(client, keys, args)]
    pipe = client.pipeline(transaction=False)
    for lua, keys, args in calls:
        # execute_command: a cluster pipeline blocks the evalsha() method, not the command,
        # and routes it by its first key like any other keyed command.
        pipe.execute_command("EVALSHA", lua.sha, len(keys), *keys, *args)
    results = pipe.execute(raise_on_error=False)
    out = []
    for (lua, keys, args), res in zip(calls, results):
        if isinstance(res, redis.exceptions.NoScriptError):
            res = lua(client, keys, args)
        elif isinstance(res, Exception):
            raise res
        out.append(res)
    return out


APPEND = _Lua(_LUA_APPEND)
FETCH = _Lua(_LUA_FETCH)
MAKE = _Lua(_LUA_MAKE)
OFFSETS = _Lua(_LUA_OFFSETS)
RETENTION = _Lua(_LUA_RETENTION)
CREATE_META = _Lua(_LUA_CREATE_META)
GROW_META = _Lua(_LUA_GROW_META)


# -- helpers ----------------------------------------------------------------------------------


def _check_client(client: Any) -> None:
    """Record values are bytes; a decoding client would corrupt them (or fail on binary)."""
    if client.get_encoder().decode_responses:
        raise TypeError("rcoord topics need a Redis client with decode_responses=False")


def _check_topic(topic: str) -> None:
    """Kafka's topic name rules; they also keep braces (hash tags) out of key names."""
    if not isinstance(topic, str):
        raise TypeError(f"topic must be str, got {type(topic).__name__}")
    if (
        not _LEGAL_TOPIC.fullmatch(topic)
        or len(topic) > _MAX_TOPIC_LEN
        or topic in (".", "..")
    ):
        raise TopicError(Errors.INVALID_TOPIC_EXCEPTION, f"illegal topic name {topic!r}")


def _check_int(name: str, value: Any, minimum: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be int, got {type(value).__name__}")
    if value < minimum:
        raise InvalidRequestError(f"{name} must be >= {minimum}, got {value}")
    return value


def _name(raw: bytes | str) -> Errors:
    return Errors.from_name(raw)


def _opt_int(raw: bytes | None) -> int | None:
    return None if raw is None else int(raw)


def _decode_entry(entry: Sequence[Any]) -> Record:
    entry_id, flat = entry[0], entry[1]
    fields = dict(zip(flat[::2], flat[1::2]))
    raw_headers = fields.get(b"h")
    headers: dict[str, bytes] = {}
    if raw_headers is not None:
        headers = {k: v for k, v in msgpack.unpackb(raw_headers, raw=False)}
    return Record(
        offset=_id_offset(entry_id),
        key=fields.get(b"k"),
        value=fields.get(b"v"),
        headers=headers,
        timestamp_ms=int(fields[b"t"]),
    )


def _encode_record(rec: ProducerRecord) -> list[Any]:
    if rec.value is not None and not isinstance(rec.value, (bytes, bytearray)):
        raise TypeError(f"value must be bytes or None, got {type(rec.value).__name__}")
    if rec.key is not None and not isinstance(rec.key, (bytes, bytearray)):
        raise TypeError(f"key must be bytes or None, got {type(rec.key).__name__}")
    flags, headers = 0, b""
    if rec.value is not None:
        flags |= 1
    if rec.key is not None:
        flags |= 2
    if rec.headers:
        for name, val in rec.headers.items():
            if not isinstance(name, str) or not isinstance(val, (bytes, bytearray)):
                raise TypeError("headers must map str to bytes")
        headers = msgpack.packb([[k, bytes(v)] for k, v in rec.headers.items()], use_bin_type=True)
        flags |= 4
    return [flags, rec.value if rec.value is not None else b"", rec.key or b"", headers]


# -- topics -----------------------------------------------------------------------------------


class Topics:
    """Create, grow, describe, list and delete topics, and apply their retention.

    Topic-level steps touch several slots (the metadata hash and every partition stream), so
    they are ordered so that a crash leaves nothing a retry cannot mend: ``create`` claims the
    metadata first (the one atomic "does it exist" decision), then makes the streams;
    ``delete`` removes the streams first and the metadata last, so a half-deleted topic is
    still listed and ``delete`` can simply be called again. A ``create`` that crashed after
    its claim leaves a listed topic whose missing partitions ``describe`` reports as
    UNKNOWN_TOPIC_OR_PARTITION; ``delete`` and ``create`` again mend it.
    """

    def __init__(self, redis_client: Any, namespace: str = "rcoord") -> None:
        _check_client(redis_client)
        self._r = redis_client
        self._ns = namespace

    @translate_redis_errors
    def create(
        self,
        topic: str,
        partitions: int,
        *,
        retention_records: int | None = None,
        retention_ms: int | None = None,
    ) -> None:
        """Kafka's CreateTopics: TOPIC_ALREADY_EXISTS, INVALID_PARTITIONS (< 1), INVALID_CONFIG."""
        _check_topic(topic)
        if not isinstance(partitions, int) or isinstance(partitions, bool) or partitions < 1:
            raise TopicError(Errors.INVALID_PARTITIONS, f"partitions must be >= 1: {partitions!r}")
        for name, val in (("retention_records", retention_records), ("retention_ms", retention_ms)):
            if val is not None and (not isinstance(val, int) or isinstance(val, bool) or val < 0):
                raise TopicError(Errors.INVALID_CONFIG, f"{name} must be an int >= 0: {val!r}")
        (res,) = _run(self._r, [(CREATE_META, [meta_key(self._ns, topic)], [
            partitions,
            "" if retention_records is None else retention_records,
            "" if retention_ms is None else retention_ms,
        ])])
        if _name(res[0]) != Errors.NONE:
            raise TopicError(_name(res[0]), topic)
        # The name is ours now; drop whatever a crashed delete of an older topic left behind.
        _run(self._r, [(MAKE, [partition_key(self._ns, topic, p)], ["reset"])
                       for p in range(partitions)])

    @translate_redis_errors
    def add_partitions(self, topic: str, new_total: int) -> None:
        """Kafka's CreatePartitions: grow to ``new_total``; INVALID_PARTITIONS unless it grows.

        The new streams are made before the count is raised, so no producer is ever told about
        a partition that does not exist yet. They are made only if missing: a concurrent
        ``add_partitions`` may already have announced them and received records.
        """
        _check_topic(topic)
        _check_int("new_total", new_total, 1)
        current = self.partition_count(topic)
        if new_total <= current:
            raise TopicError(Errors.INVALID_PARTITIONS,
                             f"{topic} has {current} partitions; cannot go to {new_total}")
        _run(self._r, [(MAKE, [partition_key(self._ns, topic, p)], ["ensure"])
                       for p in range(current, new_total)])
        (res,) = _run(self._r, [(GROW_META, [meta_key(self._ns, topic)], [new_total])])
        if _name(res[0]) != Errors.NONE:
            raise TopicError(_name(res[0]), f"{topic} has {res[1]} partitions")

    @translate_redis_errors
    def partition_count(self, topic: str) -> int:
        _check_topic(topic)
        raw = self._r.hget(meta_key(self._ns, topic), "partitions")
        if raw is None:
            raise TopicError(Errors.UNKNOWN_TOPIC_OR_PARTITION, topic)
        return int(raw)

    @translate_redis_errors
    def describe(self, topic: str) -> TopicDescription:
        _check_topic(topic)
        meta = self._r.hgetall(meta_key(self._ns, topic))
        if not meta:
            raise TopicError(Errors.UNKNOWN_TOPIC_OR_PARTITION, topic)
        n = int(meta[b"partitions"])
        results = _run(self._r, [(OFFSETS, [partition_key(self._ns, topic, p)], [])
                                 for p in range(n)])
        infos = [PartitionInfo(p, int(r[1]), int(r[2]), _name(r[0])) for p, r in enumerate(results)]
        return TopicDescription(
            name=topic,
            partitions=infos,
            created_ms=int(meta.get(b"created_ms", 0)),
            retention_records=_opt_int(meta.get(b"retention_records")),
            retention_ms=_opt_int(meta.get(b"retention_ms")),
        )

    @translate_redis_errors
    def delete(self, topic: str) -> None:
        """Kafka's DeleteTopics; UNKNOWN_TOPIC_OR_PARTITION if there is no such topic."""
        n = self.partition_count(topic)
        pipe = self._r.pipeline(transaction=False)
        for p in range(n):
            pipe.delete(partition_key(self._ns, topic, p))
        pipe.execute()
        self._r.delete(meta_key(self._ns, topic))

    @translate_redis_errors
    def list(self) -> list[str]:
        """Topic names, sorted. SCAN visits every master in a cluster; the metadata hashes are
        the only registry, so there is no second structure to keep consistent."""
        prefix = f"{self._ns}:topicmeta:{{"
        pattern = re.sub(r"([*?\[\]\\])", r"\\\1", prefix) + "*}"
        names = set()
        for key in self._r.scan_iter(match=pattern, count=1000):
            text = key.decode() if isinstance(key, bytes) else key
            if text.startswith(prefix) and text.endswith("}"):
                names.add(text[len(prefix):-1])
        return sorted(names)

    @translate_redis_errors
    def apply_retention(self, topic: str) -> dict[int, int]:
        """Trim every partition by the topic's retention; returns partition -> log start offset.

        By count: ``XTRIM MAXLEN`` keeps the newest ``retention_records`` (exactly; Kafka works
        per segment and so keeps somewhat more). By age: records older than ``retention_ms`` by
        the node's clock go from the head, up to the first one that is not expired, scanned
        ``RETENTION_SCAN`` entries per call so no call holds the server for long.
        """
        _check_topic(topic)
        desc_meta = self._r.hgetall(meta_key(self._ns, topic))
        if not desc_meta:
            raise TopicError(Errors.UNKNOWN_TOPIC_OR_PARTITION, topic)
        n = int(desc_meta[b"partitions"])
        records = desc_meta.get(b"retention_records", b"")
        age = desc_meta.get(b"retention_ms", b"")
        pending = list(range(n))
        starts: dict[int, int] = {}
        while pending:
            results = _run(self._r, [
                (RETENTION, [partition_key(self._ns, topic, p)], [records, age, RETENTION_SCAN])
                for p in pending
            ])
            again = []
            for p, res in zip(pending, results):
                starts[p] = int(res[1])
                if int(res[3]):
                    again.append(p)
            pending, records = again, b""
        return dict(sorted(starts.items()))


# -- producer ---------------------------------------------------------------------------------

PartitionerFn = Callable[[str, "bytes | None", int], int]


class Producer:
    """Appends records to topic partitions, choosing partitions the way Kafka's producer does.

    ``partitioner``:

    * ``"default"``: Kafka's BuiltInPartitioner. A keyed record goes to
      ``toPositive(murmur2(key)) % partitions``, so every Kafka client agrees on it. Keyless
      records stick to one partition until ``batch_size`` bytes of values went there (Kafka's
      ``batch.size``, the "batch is done" point), then move to another partition at random.
    * ``"round_robin"``: Kafka's RoundRobinPartitioner: every record, keyed or not, to the next
      partition in turn.
    * a callable ``(topic, key, num_partitions) -> partition``.

    An explicit ``partition`` always wins. Partition counts are cached for
    ``metadata_max_age_ms`` (client monotonic time, only used for this cache) and re-read at
    once when a partition looks out of range or a topic unknown. The producer is thread-safe.
    """

    def __init__(
        self,
        redis_client: Any,
        namespace: str = "rcoord",
        partitioner: Literal["default", "round_robin"] | PartitionerFn = "default",
        *,
        batch_size: int = 16384,
        metadata_max_age_ms: int = 5000,
        rng: random.Random | None = None,
    ) -> None:
        _check_client(redis_client)
        if not callable(partitioner) and partitioner not in ("default", "round_robin"):
            raise InvalidRequestError(f"unknown partitioner {partitioner!r}")
        self._r = redis_client
        self._ns = namespace
        self._partitioner = partitioner
        self._batch_size = _check_int("batch_size", batch_size, 1)
        self._max_age_s = _check_int("metadata_max_age_ms", metadata_max_age_ms, 0) / 1000
        self._rng = rng or random.Random()
        self._lock = threading.Lock()
        self._counts: dict[str, tuple[int, float]] = {}
        self._sticky: dict[str, tuple[int, int]] = {}  # topic -> (partition, bytes sent to it)
        self._rr: dict[str, int] = {}

    # -- metadata

    def _num_partitions(self, topic: str, refresh: bool = False) -> int:
        now = time.monotonic()
        with self._lock:
            cached = self._counts.get(topic)
        if cached is not None and not refresh and now - cached[1] < self._max_age_s:
            return cached[0]
        raw = self._r.hget(meta_key(self._ns, topic), "partitions")
        if raw is None:
            with self._lock:
                self._counts.pop(topic, None)
            raise TopicError(Errors.UNKNOWN_TOPIC_OR_PARTITION, topic)
        with self._lock:
            self._counts[topic] = (int(raw), now)
        return int(raw)

    def _choose(self, topic: str, rec: ProducerRecord, n: int) -> int:
        if callable(self._partitioner):
            return int(self._partitioner(topic, rec.key, n))
        if self._partitioner == "round_robin":
            with self._lock:
                counter = self._rr.get(topic, 0)
                self._rr[topic] = counter + 1
            return to_positive(counter) % n
        if rec.key is not None:
            return partition_for_key(bytes(rec.key), n)
        with self._lock:
            part, used = self._sticky.get(topic, (-1, 0))
            if part < 0 or part >= n:
                part, used = self._rng.randrange(n), 0
            elif used >= self._batch_size:
                # The batch is done: move to another partition, never the same one again.
                if n > 1:
                    other = self._rng.randrange(n - 1)
                    part = other if other < part else other + 1
                used = 0
            self._sticky[topic] = (part, used + len(rec.value or b""))
        return part

    # -- sending

    @translate_redis_errors
    def send(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None = None,
        partition: int | None = None,
        headers: dict[str, bytes] | None = None,
    ) -> RecordMetadata:
        """Append one record; its offset and Redis-time timestamp come back."""
        return self._send(topic, [ProducerRecord(value, key, partition, headers)])[0]

    @translate_redis_errors
    def send_batch(
        self, topic: str, records: Iterable[ProducerRecord | bytes]
    ) -> list[RecordMetadata]:
        """Append many records in one pipeline; metadata comes back in the order given.

        Records of one partition go in one script call (per ``MAX_APPEND_PER_CALL``), so they
        get consecutive offsets in the order given. If a partition vanished meanwhile the other
        partitions' records are still appended and TopicError is raised.
        """
        recs = [r if isinstance(r, ProducerRecord) else ProducerRecord(r) for r in records]
        return self._send(topic, recs) if recs else []

    def _send(self, topic: str, recs: list[ProducerRecord]) -> list[RecordMetadata]:
        _check_topic(topic)
        n = self._num_partitions(topic)
        parts: list[int] = []
        for rec in recs:
            if rec.partition is not None:
                p = _check_int("partition", rec.partition, -(1 << 31))
                if p >= n:
                    n = self._num_partitions(topic, refresh=True)
            else:
                p = self._choose(topic, rec, n)
            if not 0 <= p < n:
                raise TopicError(Errors.UNKNOWN_TOPIC_OR_PARTITION,
                                 f"{topic} has no partition {p} (count {n})")
            parts.append(p)
        encoded = [_encode_record(rec) for rec in recs]

        by_part: dict[int, list[int]] = {}
        for i, p in enumerate(parts):
            by_part.setdefault(p, []).append(i)
        calls: list[_Call] = []
        chunks: list[tuple[int, list[int]]] = []
        for p, idxs in by_part.items():
            for lo in range(0, len(idxs), MAX_APPEND_PER_CALL):
                chunk = idxs[lo : lo + MAX_APPEND_PER_CALL]
                args = [a for i in chunk for a in encoded[i]]
                calls.append((APPEND, [partition_key(self._ns, topic, p)], args))
                chunks.append((p, chunk))

        out: list[RecordMetadata | None] = [None] * len(recs)
        failed: list[int] = []
        for (p, chunk), res in zip(chunks, _run(self._r, calls)):
            if _name(res[0]) != Errors.NONE:
                failed.append(p)
                continue
            first, ts = _id_offset(res[1]), int(res[2])
            for j, i in enumerate(chunk):
                out[i] = RecordMetadata(topic, p, first + j, ts)
        if failed:
            with self._lock:
                self._counts.pop(topic, None)
            raise TopicError(Errors.UNKNOWN_TOPIC_OR_PARTITION,
                             f"{topic} partitions {sorted(set(failed))} do not exist")
        return [m for m in out if m is not None]


# -- fetching ---------------------------------------------------------------------------------


def _fetch_once(client: Any, key: str, offset: int, max_records: int) -> FetchResult:
    (res,) = _run(client, [(FETCH, [key], [offset, _offset_id(offset), max_records])])
    return FetchResult(
        records=[_decode_entry(e) for e in res[3]],
        log_start_offset=int(res[1]),
        log_end_offset=int(res[2]),
        error=_name(res[0]),
    )


@translate_redis_errors
def fetch(
    redis_client: Any,
    namespace: str,
    topic: str,
    partition: int,
    offset: int,
    max_records: int = 500,
    block_ms: int | None = None,
) -> FetchResult:
    """Kafka's Fetch for one partition: up to ``max_records`` records from ``offset`` on.

    ``offset`` may be anything from the log start to the log end inclusive (the end gives no
    records); anything else answers OFFSET_OUT_OF_RANGE with the current log offsets, so the
    caller can apply its reset policy (``resolve_offset``). Records and log offsets are read
    in one script, so they describe the same instant.

    With ``block_ms`` > 0 and no records at ``offset``, waits up to ``block_ms`` for one
    (Kafka's ``fetch.max.wait.ms``) with ``XREAD BLOCK`` from the id just before ``offset``:
    a record appended between the first read and the XREAD is still seen, so no wake-up is
    lost. The client's ``socket_timeout`` must exceed ``block_ms``.
    """
    _check_client(redis_client)
    _check_topic(topic)
    _check_int("partition", partition, 0)
    _check_int("offset", offset, 0)
    _check_int("max_records", max_records, 1)
    key = partition_key(namespace, topic, partition)
    result = _fetch_once(redis_client, key, offset, max_records)
    if result.records or result.error != Errors.NONE or not block_ms or block_ms <= 0:
        return result
    # Entries with id > 0-<offset> are those at offsets >= offset.
    redis_client.xread({key: f"0-{offset}"}, count=1, block=int(block_ms))
    return _fetch_once(redis_client, key, offset, max_records)


@translate_redis_errors
def log_offsets(redis_client: Any, namespace: str, topic: str, partition: int) -> tuple[int, int]:
    """(log start offset, log end offset) of a partition: Kafka's ListOffsets earliest/latest."""
    _check_topic(topic)
    _check_int("partition", partition, 0)
    (res,) = _run(redis_client, [(OFFSETS, [partition_key(namespace, topic, partition)], [])])
    if _name(res[0]) != Errors.NONE:
        raise TopicError(_name(res[0]), f"{topic}-{partition}")
    return int(res[1]), int(res[2])


def resolve_offset(
    offset_reset: Literal["earliest", "latest"],
    redis_client: Any,
    namespace: str,
    topic: str,
    partition: int,
) -> int:
    """Kafka's ``auto.offset.reset``: where to start with no valid committed offset.

    "earliest" is the log start offset, "latest" the log end offset (only new records).
    """
    if offset_reset not in ("earliest", "latest"):
        raise InvalidRequestError(f"offset_reset must be 'earliest' or 'latest': {offset_reset!r}")
    start, end = log_offsets(redis_client, namespace, topic, partition)
    return start if offset_reset == "earliest" else end
