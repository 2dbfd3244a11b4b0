"""The core of topics: types, key names, argument checks and the Lua scripts they call."""


import functools
import hashlib
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

import msgpack
import redis.exceptions

from ..errors import Errors, InvalidRequestError, ProtocolError
from ..murmur2 import murmur2
from ..names import NAMESPACE_RULE, valid_namespace
from ..partitioning import SLOTS, keyslot
from ..scripts import lua_source, route_fcall_locally, send_reloading

MAX_APPEND_PER_CALL = 1000
"""Records per append script call; bounds how long one call holds the server."""
RETENTION_SCAN = 1000
"""Records one retention call removes by age at most; ``apply_retention`` repeats until done."""
RETENTION_SCAN_BYTES = 1 << 20
"""Bytes of records one retention call copies at most past its first probe (always read). A
record's age is a field of it, so each probe copies a whole record into the script: a linear
scan of 1,000 records of 1 MB held the server for 6.5 s and doubled its memory."""
RETENTION_TRIM_BYTES = 16 << 20
"""Bytes of records one retention call removes at most (estimated from records read as it goes):
freeing them takes the server's time too (500 records of 1 MB: 108 ms in one ``XTRIM``)."""
PRODUCER_ID_EXPIRATION_MS = 86_400_000
"""Kafka's ``producer.id.expiration.ms`` default (1 day): idle producer state is forgotten."""
PRODUCER_PRUNE_PER_CALL = 8
"""Expired producer states one idempotent append removes at most, so pruning stays O(1) per call
and still outpaces growth (each call adds at most one producer)."""
_TAG_SHARES = 64
_GOLDEN32 = 0x9E3779B9  # 2**32 / golden ratio
_LEGAL_TOPIC = re.compile(r"[a-zA-Z0-9._-]+")
_MAX_TOPIC_LEN = 249
TOPIC_RULE = (f"1 to {_MAX_TOPIC_LEN} of the characters a-z A-Z 0-9 . _ - (not '.' or '..'), "
              "as in Kafka")
"""``_LEGAL_TOPIC`` and ``_MAX_TOPIC_LEN`` in words, for errors that say what to fix."""


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


class CorruptRecordError(TopicError):
    """A partition cannot be read at ``offset`` (UNKNOWN_SERVER_ERROR): the stream entry there
    is not a record rcoord's appends wrote (an XADD by hand), or the stream's last id is not
    rcoord's. Kafka's consumer raises a KafkaException for a corrupt record ("please seek past
    the record to continue consumption") and, like it, rcoord's ``Consumer.poll()`` raises this
    until the application seeks the partition elsewhere (or the entry is removed with
    ``Topics.delete_records``), after handing out the other partitions' records."""

    def __init__(self, topic: str, partition: int, offset: int, message: str) -> None:
        self.topic, self.partition, self.offset = topic, partition, offset
        super().__init__(Errors.UNKNOWN_SERVER_ERROR, message)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.topic, self.partition, self.offset, self.detail))


# -- data -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PartitionInfo:
    """Log offsets of one partition; ``error`` is set (offsets -1) if its stream is missing
    (UNKNOWN_TOPIC_OR_PARTITION) or cannot be read (UNKNOWN_SERVER_ERROR)."""

    partition: int
    log_start_offset: int
    log_end_offset: int
    error: Errors = Errors.NONE
    detail: str = ""
    """Why, with UNKNOWN_SERVER_ERROR: the partition's stream has a last id that is not
    rcoord's (an XADD by hand), and what mends it."""


@dataclass(frozen=True)
class DeletedRecords:
    """One partition's answer to ``Topics.delete_records``: its log start offset after it (-1
    with an error: UNKNOWN_TOPIC_OR_PARTITION, or OFFSET_OUT_OF_RANGE and nothing removed)."""

    partition: int
    low_watermark: int
    error: Errors = Errors.NONE
    detail: str = ""
    """Why, with UNKNOWN_SERVER_ERROR: the partition's stream has a last id that is not
    rcoord's (an XADD by hand), and what mends it."""


@dataclass(frozen=True)
class TopicDescription:
    name: str
    partitions: list[PartitionInfo]
    created_ms: int = 0
    retention_records: int | None = None
    retention_ms: int | None = None
    producer_id_expiration_ms: int | None = None
    create_token: str = ""
    """Unique per ``create`` call: a topic deleted and created again under the same name has a
    new one (its offsets start again at 0), so a reader can tell the two apart."""
    marked_for_deletion: bool = False
    """A ``delete`` of it began and has not finished (``deleting`` in its metadata; Kafka's
    ``MarkedForDeletion``): a delete that stopped partway, whose removed partitions are
    UNKNOWN_TOPIC_OR_PARTITION; ``delete`` again finishes it, ``create`` refuses it."""


Header: TypeAlias = tuple[str, bytes | None]
"""One record header: a name and a value, which may be null (``None``), as in Kafka."""

Headers: TypeAlias = Mapping[str, bytes | None] | Sequence[tuple[str, bytes | None]]
"""What a producer accepts as a record's headers: a mapping (one value per name) or a sequence
of ``(name, value)`` pairs, kept in order with repeated names (Kafka's ``Headers.add``)."""


@dataclass(frozen=True)
class ProducerRecord:
    """One record for ``Producer.send_batch``; ``value=None`` is a tombstone, as in Kafka.

    ``headers``: a mapping, or a sequence of ``(name, value)`` pairs whose order and repeated
    names are kept (Kafka's record headers are such a list); a header value may be ``None``.
    """

    value: bytes | None
    key: bytes | None = None
    partition: int | None = None
    headers: Headers | None = None


@dataclass(frozen=True)
class RecordMetadata:
    """Where a record went. ``duplicate``: an idempotent producer's retry found the record already
    appended, so nothing was appended; ``offset`` and ``timestamp_ms`` are then the original
    append's, or -1 when the partition no longer remembers that batch (it keeps the last 5)."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    duplicate: bool = False


@dataclass(frozen=True)
class Record:
    """One stored record.

    ``header_list``: every header, in the order produced, repeated names included (Kafka's
    ``Headers``). ``headers``: the same as a dict, one value per name, the *last* one where a
    name repeats (what Kafka's ``Headers.lastHeader`` returns); convenient, but it loses
    repeats, so code that forwards records (the Kafka gateway, Spark rows) reads
    ``header_list``. Built with only one of them, the other is derived from it.
    """

    offset: int
    key: bytes | None
    value: bytes | None
    headers: dict[str, bytes | None]
    timestamp_ms: int
    header_list: tuple[Header, ...] = ()

    def __post_init__(self) -> None:
        sync_headers(self)


def sync_headers(rec: Any) -> None:
    """Fill whichever of ``rec.headers`` / ``rec.header_list`` its constructor left empty from
    the other (``Record``, and the consumer's ``ConsumerRecord``, which mirrors its fields);
    both given must agree."""
    if rec.headers and not rec.header_list:
        object.__setattr__(rec, "header_list", tuple(rec.headers.items()))
    elif rec.header_list:
        pairs = tuple((k, v) for k, v in rec.header_list)
        object.__setattr__(rec, "header_list", pairs)
        if not rec.headers:
            object.__setattr__(rec, "headers", dict(pairs))
        elif rec.headers != dict(pairs):
            raise ValueError("headers must be dict(header_list) (the last value of each name)")


@dataclass(frozen=True)
class FetchResult:
    """Kafka's per-partition fetch answer: records plus the log offsets seen at the same instant.

    Offsets are -1 when ``error`` is UNKNOWN_TOPIC_OR_PARTITION, or UNKNOWN_SERVER_ERROR for a
    stream whose last id is not rcoord's; ``detail`` says what is wrong with such a partition.
    """

    records: list[Record]
    log_start_offset: int
    log_end_offset: int
    error: Errors = Errors.NONE
    detail: str = ""
    """Why, with an ``error`` a read of the partition will keep meeting (UNKNOWN_SERVER_ERROR:
    a stream entry that is not a record where the read begins, or a stream whose last id is
    not rcoord's): what is wrong and what mends it (``rcoord.topics.fetch._answer``)."""
    next_offset: int = -1
    """With UNKNOWN_SERVER_ERROR for a gap (entries removed by hand from the stream's middle,
    an XDEL, where the read begins): the offset of the next entry there is, past the offset
    read (``rcoord.topics.fetch._unmatched``); -1 otherwise."""


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


def producer_state_keys(namespace: str, topic: str, partition: int) -> tuple[str, str]:
    """Idempotent producers' state of one partition, in the stream's slot: a hash (producer id ->
    epoch, last sequence, recent batches) and a zset (producer id -> last activity ms) that
    finds expired states without a scan."""
    tag = partition_tag(topic, partition)
    return (
        f"{namespace}:topicpst:{{{tag}}}:{topic}:{partition}",
        f"{namespace}:topicpact:{{{tag}}}:{topic}:{partition}",
    )


def producer_log_key(namespace: str, topic: str, partition: int, producer_id: str) -> str:
    """One idempotent producer's append log in one partition (the stream's slot): the offset
    ranges its current epoch appended, kept only for producers that ask for it
    (``Producer(log_appends=True)``; ``rcoord.topics.epoch_log`` reads it)."""
    tag = partition_tag(topic, partition)
    return f"{namespace}:topicplog:{{{tag}}}:{topic}:{partition}:{producer_id}"


def last_timestamp_key(namespace: str, topic: str, partition: int) -> str:
    """The timestamp of the partition's latest record and the log end after it ("<ms> <end>",
    a string; an older rcoord wrote the timestamp alone), in the stream's slot. Appends stamp
    max(clock, it) and raise it, so a partition's timestamps never decrease
    (``offsets_for_times`` binary-searches them) without reading the last record, whose value
    the read would copy (360 us for a 1 MB value); and reads, retention, DeleteRecords and
    ``offsets_for_times`` take the log offsets from it (``topic_common.lua``'s
    log_offsets_marked) instead of from XINFO STREAM, which copies the first and last
    records."""
    return f"{namespace}:topicts:{{{partition_tag(topic, partition)}}}:{topic}:{partition}"


def last_timestamp_key_of(stream_key: str) -> str:
    """``last_timestamp_key`` of the partition whose stream is ``stream_key`` (a
    ``partition_key``: a namespace has no braces, so the first one opens the hash tag)."""
    tag = stream_key.index("{")
    return stream_key[:tag - len("topic:")] + "topicts:" + stream_key[tag:]


def partition_keys(namespace: str, topic: str, partition: int) -> list[str]:
    """The stream of one partition, its producer state, then its last timestamp (idempotent
    appends' KEYS)."""
    return [partition_key(namespace, topic, partition),
            *producer_state_keys(namespace, topic, partition),
            last_timestamp_key(namespace, topic, partition)]


def creation_token_key(namespace: str, topic: str, partition: int) -> str:
    """The token of the ``Topics.create`` call that made the partition, in the stream's slot: a
    resent create finds it and leaves the partition (and what producers appended) alone."""
    return f"{namespace}:topicmade:{{{partition_tag(topic, partition)}}}:{topic}:{partition}"


def make_keys(namespace: str, topic: str, partition: int) -> list[str]:
    """Every key of one partition (``topic_make`` KEYS): ``partition_keys`` and its creation
    token."""
    return [*partition_keys(namespace, topic, partition),
            creation_token_key(namespace, topic, partition)]


def producer_id_counter_key(namespace: str) -> str:
    """The counter behind allocated producer ids."""
    return f"{namespace}:producerids"


def _offset_id(offset: int) -> str:
    return f"0-{offset + 1}"


def _id_offset(entry_id: bytes | str) -> int:
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    return int(text.partition("-")[2]) - 1



# -- Lua (lua/topic_*.lua) --------------------------------------------------------------------


class _Lua:
    """A script called by SHA, loaded on NOSCRIPT (also after ``SCRIPT FLUSH`` or a restart).

    redis-py's ``Script`` cannot preload into a cluster pipeline, so pipelines queue EVALSHA
    and re-run, one by one, the calls that came back NOSCRIPT (they did not run); ``_run``
    keeps that from reordering the calls of one partition.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.source = lua_source(name)
        self.sha = hashlib.sha1(self.source.encode()).hexdigest()

    def __call__(self, client: Any, keys: Sequence[str], args: Sequence[Any]) -> Any:
        def send() -> Any:
            return client.evalsha(self.sha, len(keys), *keys, *args)

        return send_reloading(send, send, lambda: self.load(client, keys[0]),
                              lambda exc: isinstance(exc, redis.exceptions.NoScriptError))

    def load(self, client: Any, key: str) -> None:
        """Load the script; on a cluster on every master, each on its own, so that a master
        that does not answer fails only if it is ``key``'s.

        Every master, as redis-py's ``SCRIPT LOAD`` does: during a slot move the call is
        answered by the importing master (``ASK``), not the key's. Each on its own: redis-py
        sends them in one go, which failed, connection refused, while any master was down,
        so after a node's script cache was emptied (a restart, a failover) every topic call
        needing the reload (retention, appends, log offsets) failed there too, though its own
        keys' master answered."""
        masters = getattr(client, "get_primaries", None)
        if masters is None:
            client.script_load(self.source)
            return
        own = client.get_node_from_key(key).name
        for node in masters():
            try:
                client.execute_command("SCRIPT LOAD", self.source, target_nodes=node)
            except redis.exceptions.RedisError:
                if node.name == own:
                    raise


_Call = tuple[_Lua, Sequence[str], Sequence[Any]]


def _run(client: Any, calls: Sequence[_Call], *, keep_errors: bool = False,
         keep_slot_moves: bool = False) -> list[Any]:
    """Run script calls in pipelines (one round trip per node); results in call order.

    Calls on the same first key (one partition) depend on each other's order: the chunks of a
    batch of more than ``MAX_APPEND_PER_CALL`` records, whose offsets or sequence numbers follow
    on. A pipeline therefore holds at most one call per first key, and the k-th call of a key
    goes in the k-th pipeline, sent once the one before has fully answered. The reason is
    NOSCRIPT: a call that came back NOSCRIPT did not run and is sent again after its pipeline,
    and had a later call of the same partition been in that pipeline, it could have run (the
    script loaded meanwhile by another client), and the resent call would land after it:
    records out of order, or for an idempotent producer a spurious OUT_OF_ORDER_SEQUENCE_NUMBER
    or records taken for duplicates and never appended. Different partitions do not depend on
    each other, so resending within a pipeline is safe. Nearly every call has one call per key,
    and one pipeline.

    For the same reason, once a call answers with an error (a reply whose first element is an
    error name other than NONE), the later calls of its key are not sent, and their results are
    None: a batch's records after a refused chunk were appended before, and the caller, told
    the batch failed, could not know that part of it was stored (resent, it was stored twice).

    With ``keep_errors``, a call the server refused with an error (a script's ``error()``, such
    as FOREIGN_ENTRY_ID) is answered with that ``ResponseError`` in its place, and counts as
    refused too, instead of raising it: the other calls had run, and a caller that answers
    per partition (DeleteRecords) must still report them. With ``keep_slot_moves``, so is a
    call refused by a slot move or a failover (a redis-py ``ClusterError``, which never ran it:
    ``_run_through_slot_moves``).
    """
    out: list[Any] = [None] * len(calls)
    rounds: list[list[int]] = []
    seen: dict[str, int] = {}
    for i, (_, keys, _) in enumerate(calls):
        k = seen.get(keys[0], 0)
        seen[keys[0]] = k + 1
        if k == len(rounds):
            rounds.append([])
        rounds[k].append(i)
    refused: set[str] = set()
    for indices in rounds:
        indices = [i for i in indices if calls[i][1][0] not in refused]
        if not indices:
            break
        for i, res in zip(indices, _run_independent(client, [calls[i] for i in indices],
                                                    keep_errors, keep_slot_moves)):
            out[i] = res
            if _refused(res) or isinstance(res, Exception):
                refused.add(calls[i][1][0])
    return out


SLOT_MOVE_RETRY_S = 0.1
"""How often a call a slot move refused is sent again (Kafka's ``retry.backoff.ms``)."""


class SlotMoveOutlasted(redis.exceptions.ClusterError):
    """``_run_through_slot_moves``'s time ran out with calls a slot move (or a failover) still
    refused, never run; ``__cause__`` is redis-py's last refusal. A ``ClusterError``, so it
    is reported as ``ConnectionLost`` like the refusal itself; the producer says more."""


def _run_through_slot_moves(client: Any, calls: Sequence[_Call], timeout_s: float,
                            settled: Callable[[list[tuple[int, Any]]], None] | None = None,
                            ) -> list[Any]:
    """``_run``, whose calls a slot move refused are sent again, with the later calls of their
    keys, for up to ``timeout_s``; only for calls whose second run is harmless (an idempotent
    producer's, which the same sequence numbers make duplicates; setting expiry times).

    ``settled``: called after each round with ``(index, answer)`` of the calls whose answers
    became final in it, so a caller can let go of what those calls held while others wait out
    the move (the producer's partition locks: one partition's wait held up sends to others).

    While a slot migrates, a master refuses a script whose keys are split between it and the
    other (``TRYAGAIN``), or that names a key that does not exist yet, until the move ends;
    redis-py gives up after about 0.4 s with "TTL exhausted" (a ``ClusterError``, as is
    CLUSTERDOWN during a failover), having not run that call, though a pipeline's others have
    run. Those keep their answers: resending every call of the pipeline every 100 ms for the
    whole move sent again all the records of every partition (up to ``max_request_size``
    each) that were already stored, only to have them answered as duplicates."""
    deadline = time.monotonic() + timeout_s
    out: list[Any] = [None] * len(calls)
    todo = list(range(len(calls)))
    while True:
        got = _run(client, [calls[i] for i in todo], keep_slot_moves=True)
        moved = [(i, res) for i, res in zip(todo, got, strict=True)
                 if isinstance(res, redis.exceptions.ClusterError)]
        keys = {calls[i][1][0] for i, _ in moved}
        again, final = [], []
        for i, res in zip(todo, got, strict=True):
            # (a key's calls after the one a move refused were not sent: None)
            if calls[i][1][0] in keys and (res is None or isinstance(res, Exception)):
                again.append(i)
            else:
                out[i] = res
                final.append((i, res))
        if settled is not None and final:
            settled(final)
        if not again:
            return out
        if time.monotonic() + SLOT_MOVE_RETRY_S >= deadline:
            raise SlotMoveOutlasted(
                f"refused by a slot move or failover for {timeout_s * 1000:.0f} ms "
                f"({moved[0][1]})") from moved[0][1]
        todo = again
        time.sleep(SLOT_MOVE_RETRY_S)


def _refused(res: Any) -> bool:
    """A script's reply that starts with an error name other than NONE."""
    return (isinstance(res, list) and bool(res) and isinstance(res[0], (bytes, str))
            and res[0] not in (b"NONE", "NONE"))


def _run_independent(
    client: Any, calls: Sequence[_Call], keep_errors: bool = False,
    keep_slot_moves: bool = False,
) -> list[Any]:
    """``_run`` for calls on distinct first keys, in one pipeline (``_run`` says why)."""

    def kept(exc: Exception) -> bool:
        return ((keep_errors and isinstance(exc, redis.exceptions.ResponseError))
                or (keep_slot_moves and isinstance(exc, redis.exceptions.ClusterError)))

    if len(calls) == 1:
        lua, keys, args = calls[0]
        try:
            return [lua(client, keys, args)]
        except redis.exceptions.RedisError as exc:
            if not kept(exc):
                raise
            return [exc]
    route_fcall_locally(client)  # (a cluster pipeline's EVALSHA: no COMMAND GETKEYS)
    pipe = client.pipeline(transaction=False)
    for lua, keys, args in calls:
        # execute_command: a cluster pipeline blocks the evalsha() method, not the command,
        # and routes it by its first key like any other keyed command.
        pipe.execute_command("EVALSHA", lua.sha, len(keys), *keys, *args)
    results = pipe.execute(raise_on_error=False)
    missing = [n for n, res in enumerate(results)
               if isinstance(res, redis.exceptions.NoScriptError)]
    if len(missing) > 1:
        # After a restart or SCRIPT FLUSH every call of the pipeline answers NOSCRIPT: load
        # each script once and send those calls again in one pipeline (their first keys are
        # distinct, so their order does not matter), not one round trip each.
        for n in {calls[n][0].sha: n for n in missing}.values():
            calls[n][0].load(client, calls[n][1][0])
        again = client.pipeline(transaction=False)
        for n in missing:
            lua, keys, args = calls[n]
            again.execute_command("EVALSHA", lua.sha, len(keys), *keys, *args)
        for n, res in zip(missing, again.execute(raise_on_error=False), strict=True):
            results[n] = res
    out = []
    for (lua, keys, args), res in zip(calls, results):
        if isinstance(res, redis.exceptions.NoScriptError):  # (flushed again: one by one)
            res = _run_independent(client, [(lua, keys, args)], keep_errors, keep_slot_moves)[0]
        elif isinstance(res, Exception) and not kept(res):
            raise res
        out.append(res)
    return out


def read_pipelined(client: Any, commands: Sequence[Sequence[Any]]) -> list[Any]:
    """Read commands (``("HGET", key, field)``, ...) in one pipeline; their replies in order.

    On a Redis Cluster, a master that does not answer costs one command's retries, not one per
    command of it: redis-py's cluster pipeline sends each command a node failed again alone
    (its ``parent_execute_command``), each with its own retries and socket timeouts, so the
    first ``partition_counts`` of 6 topics after their master froze took 41 s with a socket
    timeout of 0.5 s (13 s for one). The first command sent again alone still has redis-py's
    retries, which read the slot map again (a failover's new master answers); once one has
    failed to reach its node, the others fail at once with its error."""
    pipe = client.pipeline(transaction=False)
    alone = getattr(pipe, "parent_execute_command", None)
    if alone is not None:
        lost: list[Exception] = []

        def once(*args: Any, **options: Any) -> Any:
            if lost:
                raise lost[0]
            try:
                return alone(*args, **options)
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
                lost.append(exc)
                raise

        pipe.parent_execute_command = once
    for args in commands:
        pipe.execute_command(*args)
    return list(pipe.execute())


APPEND = _Lua("topic_append")
APPEND_IDEMPOTENT = _Lua("topic_append_idempotent")
PRODUCER_ID = _Lua("topic_producer_id")
MAKE = _Lua("topic_make")
OFFSETS = _Lua("topic_offsets")
RETENTION = _Lua("topic_retention")
DELETE_RECORDS = _Lua("topic_delete_records")
CREATE_META = _Lua("topic_create_meta")
GROW_META = _Lua("topic_grow_meta")
ALTER_META = _Lua("topic_alter_meta")
PRODUCER_TTL = _Lua("topic_producer_ttl")


# -- helpers ----------------------------------------------------------------------------------


def _check_namespace(namespace: str) -> None:
    """The namespace prefixes every key; braces in it would split a partition's keys over
    cluster slots (``rcoord.names``)."""
    if not valid_namespace(namespace):
        raise InvalidRequestError(f"namespace must be {NAMESPACE_RULE}, got {namespace!r}")


def _check_client(client: Any) -> None:
    """Record values are bytes; a decoding client would corrupt them (or fail on binary)."""
    if not callable(getattr(client, "get_encoder", None)):
        raise TypeError(
            f"redis_client must be a redis.Redis or redis.RedisCluster client (e.g. "
            f"redis.Redis.from_url(url)), got {type(client).__name__}"
        )
    if client.get_encoder().decode_responses:
        raise TypeError("rcoord topics need a Redis client with decode_responses=False")


def legal_topic(topic: str) -> bool:
    """Whether ``topic`` follows Kafka's topic name rules; they also keep braces (hash tags)
    out of key names."""
    return (
        _LEGAL_TOPIC.fullmatch(topic) is not None
        and len(topic) <= _MAX_TOPIC_LEN
        and topic not in (".", "..")
    )


def _check_topic(topic: str) -> None:
    """Raise unless ``topic`` is a legal topic name (``legal_topic``)."""
    if not isinstance(topic, str):
        raise TypeError(f"topic must be str, got {type(topic).__name__}")
    if not legal_topic(topic):
        raise TopicError(Errors.INVALID_TOPIC_EXCEPTION, f"illegal topic name {topic!r}")


INT32_MAX = (1 << 31) - 1
"""Kafka's bound of a count or a wait in ms (an int32: ``max.poll.records``,
``fetch.max.wait.ms``); larger values failed in Redis with a raw "out of range" error, or
blocked for ever."""


def _check_int(name: str, value: Any, minimum: int, maximum: int | None = None) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be int, got {type(value).__name__}")
    if value < minimum:
        raise InvalidRequestError(f"{name} must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise InvalidRequestError(f"{name} must be <= {maximum}, got {value}")
    return value


def _foreign_ids(exc: Exception) -> Exception:
    """A TopicError (UNKNOWN_SERVER_ERROR) for a script's refusal of an entry that is not
    rcoord's (FOREIGN_ENTRY_ID: a last id not 0-<seq>, ``topic_common.lua``'s log_offsets,
    which a fetch and ``log_offsets`` used to meet as an IndexError, the reply lacking its log
    end; an entry with no integer timestamp, ``topic_offset_for_time.lua``); ``exc`` itself
    for any other error."""
    text = str(exc)
    at = text.find("FOREIGN_ENTRY_ID ")
    if at < 0 or not isinstance(exc, redis.exceptions.ResponseError):
        return exc
    detail = text[at + len("FOREIGN_ENTRY_ID "):].split(" script: ")[0]
    return TopicError(Errors.UNKNOWN_SERVER_ERROR, detail)


def unreadable_partition(exc: BaseException) -> bool:
    """Whether ``exc`` is a read's refusal of a partition it cannot read there: a stream entry
    that is not a record where the read begins, or a stream whose last id is not rcoord's
    (UNKNOWN_SERVER_ERROR with a ``detail`` naming it: ``_foreign_ids``, ``fetch._answer``),
    which a reader of several partitions answers for that partition alone."""
    return (isinstance(exc, TopicError) and exc.error is Errors.UNKNOWN_SERVER_ERROR
            and bool(exc.detail))


def _offsets_of(client: Any, keys: Sequence[str]) -> list[tuple[int, int] | Errors | TopicError]:
    """The log offsets of the partitions of stream ``keys`` (``topic_offsets.lua``) in one
    round trip per node, in the same order: (log start, log end), the script's error code
    (UNKNOWN_TOPIC_OR_PARTITION: no such stream), or for a stream whose last id is not
    rcoord's (an XADD by hand) the ``_foreign_ids`` TopicError naming it and what mends it.
    Such a stream failed the whole read before, so one hand-made entry hid the offsets of
    every other partition read with it, where Kafka's ListOffsets answers per partition."""
    calls: list[_Call] = [(OFFSETS, [key, last_timestamp_key_of(key)], []) for key in keys]
    out: list[tuple[int, int] | Errors | TopicError] = []
    for res in _run(client, calls, keep_errors=True) if calls else []:
        if isinstance(res, Exception):
            failed = _foreign_ids(res)
            if not isinstance(failed, TopicError):
                raise res
            out.append(failed)
            continue
        error = _name(res[0])
        out.append(error if error != Errors.NONE else (int(res[1]), int(res[2])))
    return out


def _name(raw: bytes | str) -> Errors:
    return Errors.from_name(raw)


def _opt_int(raw: bytes | None) -> int | None:
    return None if raw is None else int(raw)


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
    if rec.headers is not None:  # ("" is refused as "abc" is, not taken for none)
        pairs = _header_pairs(rec.headers)
        if pairs:
            headers = msgpack.packb(pairs, use_bin_type=True)
            flags |= 4
    return [flags, rec.value if rec.value is not None else b"", rec.key or b"", headers]




def _header_pairs(headers: Any) -> list[list[Any]]:
    """A record's headers as stored: ``[[name, value], ...]`` in order, repeats kept."""
    items = headers.items() if isinstance(headers, Mapping) else headers
    if isinstance(items, (str, bytes, bytearray)) or not isinstance(items, Iterable):
        raise TypeError("headers must be a mapping or a sequence of (str, bytes) pairs")
    out: list[list[Any]] = []
    for pair in items:
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise TypeError(f"headers must be a mapping or a sequence of (str, bytes) pairs, "
                            f"got an item {pair!r}")
        name, val = pair
        if not isinstance(name, str):
            raise TypeError(f"a header name must be str, got {type(name).__name__}")
        try:
            name.encode("utf-8")
        except UnicodeEncodeError as exc:  # (a lone surrogate: msgpack raised it mid-send)
            raise InvalidRequestError(
                f"header name {name!r} is not valid UTF-8 ({exc.reason}); name headers with "
                "text, and put bytes in the value") from None
        if val is not None and not isinstance(val, (bytes, bytearray)):
            raise TypeError(f"header {name!r}: value must be bytes or None, "
                            f"got {type(val).__name__}")
        out.append([name, None if val is None else bytes(val)])
    return out
