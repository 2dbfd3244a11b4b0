"""The data source's options: parsed and checked once, with errors that name the option.

Spark hands a data source its ``.option(k, v)`` pairs as strings in a case-insensitive map. The
names follow Spark's Kafka source wherever it has the same concept (``subscribe``,
``subscribePattern``, ``assign``, ``startingOffsets``, ``endingOffsets``,
``maxOffsetsPerTrigger``, ``failOnDataLoss``, ``maxRecordsPerPartition``), so a Kafka pipeline
moves over by changing ``format("kafka")`` to ``format("rcoord")``. rcoord adds ``url``,
``namespace``, ``groupId`` (group mode) and the group's timeouts.

**Every option is checked by name.** Spark's own Kafka source ignores an option it does not
know, so a typo (``startingOffset``) silently changes what a query reads. Here an unknown name
is an ``OptionError`` that names it and the nearest valid name; a Kafka-source option rcoord
does not implement says what to use instead (``UNSUPPORTED``); and the keys Spark adds by
itself to every data source's options (``SPARK_OPTIONS``) pass. Spark hands options over in
its ``CaseInsensitiveDict`` (keys lower-cased), so names compare without case.

Everything here is plain Python: no Redis, no Spark. Checks that need Redis (does the topic
exist?) happen where the partitions are resolved (``rcoord.spark.plan``), with the same kind of
error.
"""

from __future__ import annotations

import difflib
import enum
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..cli import INTEGER
from ..config import CoordinatorConfig
from ..errors import ConfigError
from ..names import NAMESPACE_RULE, valid_namespace
from ..protocol._checks import INT32_MAX
from ..topics.producer import MAX_REQUEST_SIZE, MAX_REQUEST_SIZE_LIMIT
from ..urls import redact_url, repr_redacting, url_problem

__all__ = [
    "EARLIEST",
    "LATEST",
    "READ_OPTIONS",
    "SPARK_OPTIONS",
    "UNSUPPORTED",
    "WRITE_OPTIONS",
    "OffsetSpec",
    "OptionError",
    "ReadKind",
    "ReadOptions",
    "WriteOptions",
    "check_session_timeout",
    "parse_read_options",
    "parse_write_options",
]

EARLIEST = -2
"""Kafka's sentinel for "the log start offset" in a JSON offsets option."""
LATEST = -1
"""Kafka's sentinel for "the log end offset" in a JSON offsets option."""

_GROUP_OPTIONS = ("sessiontimeoutms", "heartbeatintervalms", "rebalancetimeoutms")

REBALANCE_TIMEOUT_MS = 300_000
"""Default ``rebalanceTimeoutMs``: Kafka's ``max.poll.interval.ms``, which it stands for. A
group-mode query commits and rejoins only when Spark plans its next batch, so this must exceed
the trigger interval plus the longest batch (a default of 30 s dropped any query whose batches
took longer from every rebalance, and its partitions' next owner read the batch again)."""

READ_OPTIONS = (
    "url", "namespace", "subscribe", "subscribePattern", "assign", "startingOffsets",
    "endingOffsets", "maxOffsetsPerTrigger", "failOnDataLoss", "maxRecordsPerPartition",
    "fetchSize", "maxPartitionFetchBytes", "includeHeaders", "groupId", "sessionTimeoutMs",
    "heartbeatIntervalMs", "rebalanceTimeoutMs",
)
"""Every option a read takes (spelled as documented; compared without case)."""
MAX_PARTITION_FETCH_BYTES = 1 << 20
"""Default ``maxPartitionFetchBytes``: Kafka's ``max.partition.fetch.bytes`` default, which
bounds each poll of the one partition a task of Spark's Kafka source reads."""
WRITE_OPTIONS = ("url", "namespace", "topic", "maxRequestSize")
"""Every option a write takes."""
SPARK_OPTIONS = ("path", "paths", "checkpointLocation", "queryName")
"""Keys Spark itself puts into a data source's options (measured on Spark 4.3): ``path`` from
``load(p)``/``save(p)``, ``paths`` (a JSON list) from ``load(p1, p2)``, and ``checkpointLocation``
and ``queryName`` in a ``writeStream``'s options. rcoord uses none of them."""

_TIMESTAMPS = ("rcoord does not start or end a read at a timestamp; find the offsets with "
               "rcoord.topics.offsets_for_times and give them in startingOffsets/endingOffsets")
_NO_CONSUMER = ("rcoord reads Redis with no Kafka consumer, so there is no poll or offset "
                "fetch to tune; remove it (fetchSize and maxPartitionFetchBytes bound what one "
                "call reads)")
UNSUPPORTED = {
    "startingOffsetsByTimestamp": _TIMESTAMPS,
    "endingOffsetsByTimestamp": _TIMESTAMPS,
    "startingTimestamp": _TIMESTAMPS,
    "endingTimestamp": _TIMESTAMPS,
    "startingOffsetsByTimestampStrategy": _TIMESTAMPS,
    "minPartitions": ("rcoord does not support it; every topic partition is one Spark task, "
                      "split into tasks of at most maxRecordsPerPartition records"),
    "minOffsetsPerTrigger": ("rcoord does not support it; a processingTime trigger lets "
                             "records gather between micro-batches"),
    "maxTriggerDelay": ("rcoord does not support it (it goes with minOffsetsPerTrigger); use a "
                        "processingTime trigger"),
    "fetchOffset.numRetries": _NO_CONSUMER,
    "fetchOffset.retryIntervalMs": _NO_CONSUMER,
    "kafkaConsumer.pollTimeoutMs": _NO_CONSUMER,
    "groupIdPrefix": ("rcoord's reads join no consumer group unless groupId is set (group "
                      "mode, where the query is a member); remove it, or set groupId"),
}
"""Spark Kafka source options rcoord does not implement, with what to do instead."""


class OptionError(ConfigError):
    """An option of the ``rcoord`` data source is missing, malformed or conflicts with another.

    The message starts with the option's name, as given in ``.option(...)``.
    """


class ReadKind(enum.Enum):
    """Which read the options are for: Spark calls the same data source for both."""

    BATCH = "batch"
    STREAM = "stream"


OffsetSpec = str | dict[str, dict[int, int]]
"""``"earliest"``, ``"latest"``, or topic -> partition -> offset (-2 earliest, -1 latest)."""


@dataclass(frozen=True)
class ReadOptions:
    """A read's settings. ``topics``/``pattern``/``assign``: exactly one is set."""

    url: str
    namespace: str = "rcoord"
    topics: tuple[str, ...] = ()
    pattern: str | None = None
    assign: dict[str, tuple[int, ...]] | None = None
    starting: OffsetSpec = "earliest"
    ending: OffsetSpec = "latest"
    max_offsets_per_trigger: int | None = None
    fail_on_data_loss: bool = True
    max_records_per_partition: int = 100_000
    fetch_size: int = 2000
    max_partition_fetch_bytes: int = MAX_PARTITION_FETCH_BYTES
    """About the most bytes of records one read of a task takes (at least one record)."""
    group_id: str | None = None
    session_timeout_ms: int = 10_000
    heartbeat_interval_ms: int = 1_000
    rebalance_timeout_ms: int = REBALANCE_TIMEOUT_MS
    extra: dict[str, str] = field(default_factory=dict)

    def __repr__(self) -> str:
        return repr_redacting(self, "url")

    @property
    def subscription(self) -> str:
        """The option that names the topics, for error messages."""
        if self.assign is not None:
            return "assign"
        return "subscribePattern" if self.pattern is not None else "subscribe"


@dataclass(frozen=True)
class WriteOptions:
    url: str
    namespace: str = "rcoord"
    topic: str | None = None
    max_request_size: int = MAX_REQUEST_SIZE
    """The largest record (value, key and headers) in bytes, and the bytes of one append
    (Kafka's ``max.request.size``); a larger row fails the task with MESSAGE_TOO_LARGE."""

    def __repr__(self) -> str:
        return repr_redacting(self, "url")


def _lower(options: Mapping[str, Any]) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in options.items():
        out[str(key).lower()] = "" if value is None else str(value)
    return out


def _check_names(opts: Mapping[str, str], known: tuple[str, ...], what: str,
                 other: tuple[str, ...]) -> None:
    """Raise ``OptionError`` for the first option that is not in ``known`` (nor Spark's own);
    ``other`` are the options of the other direction (a read's, for a write)."""
    canonical = {n.lower(): n for n in (*known, *SPARK_OPTIONS)}
    others = {n.lower(): n for n in other}
    unsupported = {n.lower(): why for n, why in UNSUPPORTED.items()}
    for key in sorted(opts):
        if key in canonical:
            continue
        if key == "kafka.bootstrap.servers":
            raise OptionError(f"{key}: rcoord reads and writes Redis, not Kafka brokers; give "
                              "url (redis://host:port/db) instead")
        if key in ("kafka.max.partition.fetch.bytes", "kafka.fetch.max.bytes"):
            raise OptionError(f"{key}: use maxPartitionFetchBytes (about the most bytes of "
                              "records a task reads at once)")
        if key == "kafka.max.request.size":
            raise OptionError(f"{key}: use maxRequestSize (the largest record, in bytes)")
        if key == "kafka.group.id":
            raise OptionError(f"{key}: use groupId (group mode: the query is a member of an "
                              "rcoord consumer group)")
        if key.startswith("kafka."):
            raise OptionError(f"{key}: rcoord takes no Kafka client settings (it talks to "
                              "Redis through url); remove it")
        if key in unsupported:
            raise OptionError(f"{key}: {unsupported[key]}")
        if key == "topic" and what == "read":
            raise OptionError("topic: is a write option; a read names its topics with "
                              "subscribe, subscribePattern or assign")
        if key in others:
            raise OptionError(f"{others[key]}: is a {'write' if what == 'read' else 'read'} "
                              f"option, not one of an rcoord {what}")
        near = difflib.get_close_matches(key, list(canonical), n=1)
        hint = f"did you mean {canonical[near[0]]}?" if near else \
            f"the {what} options are {', '.join(known)}"
        raise OptionError(f"{key}: not an option of an rcoord {what}; {hint}")


def _refuse_empty(options: Mapping[str, Any]) -> None:
    """An option set to "" (or blanks) is refused, not taken as unset: an empty ``groupId``
    from an unset environment variable would otherwise be a stream without a group that skips
    the backlog (``latest``), and an empty ``startingOffsets`` a silent default."""
    for name, value in options.items():
        if isinstance(value, str) and not value.strip():
            raise OptionError(f"{name}: empty value {value!r}; leave the option out to get its "
                              "default")


def _url(opts: Mapping[str, str], env: Mapping[str, str]) -> str:
    url = opts.get("url") or env.get("RCOORD_REDIS_URL", "")
    if not url:
        raise OptionError(
            "url: no Redis URL; set .option('url', 'redis://host:port/db') or RCOORD_REDIS_URL"
        )
    problem = url_problem(url)
    if problem:
        raise OptionError(f"url: {redact_url(url, query=True)!r} {problem}")
    return url


def _namespace(opts: Mapping[str, str]) -> str:
    ns = opts.get("namespace", "rcoord") or "rcoord"
    if not valid_namespace(ns):
        raise OptionError(f"namespace: must be {NAMESPACE_RULE}, got {ns!r}")
    return ns


def _java_int(raw: str) -> int | None:
    """``raw`` as Java's ``Long.parseLong`` reads it (Spark's Kafka source reads its numbers
    so), or None: Python's ``int()`` also takes blanks around it, ``1_0`` and other scripts'
    digits, so a typo became another number instead of an error."""
    return int(raw) if INTEGER.fullmatch(raw) else None


def _positive_int(name: str, raw: str, most: int | None = None) -> int:
    """``raw`` as a positive integer, at most ``most``: a timeout is Kafka's INT, and past it
    (Long.MAX, a Java user's "no limit") the query failed later, in a wait threading cannot
    take ("timestamp out of range for platform time_t"), naming no option."""
    value = _java_int(raw)
    if value is None:
        raise OptionError(f"{name}: must be a positive integer, got {raw!r}")
    if value < 1:
        raise OptionError(f"{name}: must be a positive integer, got {raw!r}")
    if most is not None and value > most:
        raise OptionError(f"{name}: must be at most {most} (Kafka's INT), got {raw!r}")
    return value


def _bool(name: str, raw: str) -> bool:
    low = raw.strip().lower()
    if low in ("true", "1", "yes"):
        return True
    if low in ("false", "0", "no"):
        return False
    raise OptionError(f"{name}: must be true or false, got {raw!r}")


def _json(name: str, raw: str) -> Any:
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        raise OptionError(f"{name}: malformed JSON ({exc.msg} at character {exc.pos}): {raw!r}")\
            from None


def parse_offsets(name: str, raw: str, allowed: tuple[int, ...], why: str = "") -> OffsetSpec:
    """``earliest`` / ``latest`` / ``{"topic": {"0": 23, "1": -2}}`` (Spark's Kafka format).

    ``allowed`` are the sentinels this option accepts: a batch's ``endingOffsets`` cannot be
    -2 (earliest), as in Spark's Kafka source. ``why`` ends the message refusing another one.
    """
    text = raw.strip()
    low = text.lower()
    if low == "earliest" and EARLIEST in allowed:
        return "earliest"
    if low == "latest" and LATEST in allowed:
        return "latest"
    if not text.startswith("{"):
        words = " or ".join(w for w, s in (("earliest", EARLIEST), ("latest", LATEST))
                            if s in allowed)
        raise OptionError(f"{name}: must be {words} or JSON like {{\"events\": {{\"0\": 23}}}}, "
                          f"got {raw!r}{why}")
    parsed = _json(name, text)
    if not isinstance(parsed, dict) or not parsed:
        raise OptionError(f"{name}: JSON must map topic names to {{partition: offset}}, got {raw!r}")
    out: dict[str, dict[int, int]] = {}
    for topic, parts in parsed.items():
        if not isinstance(parts, dict) or not parts:
            raise OptionError(f"{name}: topic {topic!r} must map partitions to offsets, "
                              f"got {parts!r}")
        out[topic] = {}
        for p, off in parts.items():
            partition = _java_int(p)
            if partition is None:
                raise OptionError(f"{name}: partition {p!r} of topic {topic!r} is not an "
                                  "integer")
            if partition < 0:
                raise OptionError(f"{name}: partition {p!r} of topic {topic!r} is negative")
            if not isinstance(off, int) or isinstance(off, bool):
                raise OptionError(f"{name}: offset of {topic}-{p} must be an integer, got {off!r}")
            if off < 0 and off not in allowed:
                raise OptionError(f"{name}: offset {off} of {topic}-{p} is not allowed here "
                                  f"(offsets are >= 0, or one of {sorted(allowed)}){why}")
            out[topic][partition] = off
    return out


def _assign(raw: str) -> dict[str, tuple[int, ...]]:
    parsed = _json("assign", raw)
    if not isinstance(parsed, dict) or not parsed:
        raise OptionError(f"assign: JSON must map topic names to partition lists, like "
                          f"{{\"events\": [0, 1]}}, got {raw!r}")
    out: dict[str, tuple[int, ...]] = {}
    for topic, parts in parsed.items():
        if (not isinstance(parts, list) or not parts
                or not all(isinstance(p, int) and not isinstance(p, bool) and p >= 0
                           for p in parts)):
            raise OptionError(f"assign: topic {topic!r} needs a non-empty list of partition "
                              f"numbers >= 0, got {parts!r}")
        out[topic] = tuple(sorted(set(parts)))
    return out


def parse_read_options(
    options: Mapping[str, Any], kind: ReadKind | None, env: Mapping[str, str] | None = None
) -> ReadOptions:
    """Check a read's options; raises ``OptionError`` naming the first bad one.

    ``kind`` None runs only the checks a batch and a stream read share: Spark's
    ``DataSource.schema()``, where ``load()`` checks the options (as Spark's Kafka source does
    in ``sourceSchema``), is not told which read it is for. The result is then only a check.
    """
    _refuse_empty(options)
    opts = _lower(options)
    _check_names(opts, READ_OPTIONS, "read", WRITE_OPTIONS)
    env = os.environ if env is None else env
    url = _url(opts, env)
    namespace = _namespace(opts)
    if opts.get("includeheaders") and not _bool("includeHeaders", opts["includeheaders"]):
        raise OptionError("includeHeaders: rcoord's rows always have the headers column; keep "
                          "includeHeaders true (or unset) and drop the column with "
                          "df.drop('headers')")

    given = [n for n, k in (("subscribe", "subscribe"), ("subscribePattern", "subscribepattern"),
                            ("assign", "assign")) if opts.get(k, "").strip()]
    if len(given) != 1:
        what = "none" if not given else " and ".join(given)
        raise OptionError(f"{'/'.join(given) or 'subscribe'}: give exactly one of subscribe, "
                          f"subscribePattern or assign (got {what})")
    topics: tuple[str, ...] = ()
    pattern: str | None = None
    assign: dict[str, tuple[int, ...]] | None = None
    if given[0] == "subscribe":
        topics = tuple(dict.fromkeys(t.strip() for t in opts["subscribe"].split(",") if t.strip()))
        if not topics:
            raise OptionError(f"subscribe: no topic names in {opts['subscribe']!r}")
    elif given[0] == "subscribePattern":
        # Trimmed, as Spark's Kafka source trims it: a stray blank or newline (a value read
        # from a file) matched no topic, and the query read nothing, silently.
        pattern = opts["subscribepattern"].strip()
        try:
            re.compile(pattern)
        except re.error as exc:
            raise OptionError(f"subscribePattern: not a regular expression ({exc}): "
                              f"{pattern!r}") from None
    else:
        assign = _assign(opts["assign"])

    group_id = opts.get("groupid") or None
    if group_id is not None:
        if kind is ReadKind.BATCH:
            raise OptionError(
                "groupId: group mode is for streaming reads (spark.readStream); a batch read "
                "(spark.read) reads fixed offset ranges and joins no group"
            )
        if assign is not None:
            raise OptionError("groupId: a group divides subscribed topics among its members; "
                              "use subscribe or subscribePattern, not assign")

    default_start = "earliest" if kind is ReadKind.BATCH or group_id else "latest"
    starting: OffsetSpec = default_start
    if opts.get("startingoffsets"):
        allowed = (EARLIEST,) if kind is ReadKind.BATCH else (EARLIEST, LATEST)
        why = ("; a batch read (spark.read) cannot start at latest, which is for streams "
               "(spark.readStream)") if kind is ReadKind.BATCH else ""
        starting = parse_offsets("startingOffsets", opts["startingoffsets"], allowed, why)
        if group_id is not None and isinstance(starting, dict):
            raise OptionError("startingOffsets: in group mode the group's committed offsets "
                              "say where to start; give earliest or latest (for partitions "
                              "the group has never committed)")
    ending: OffsetSpec = "latest"
    if opts.get("endingoffsets"):
        if kind is ReadKind.STREAM:
            raise OptionError("endingOffsets: only for batch reads (spark.read); a stream "
                              "reads on as records arrive")
        # Spark's schema() check does not know the read's kind (None): its message must
        # hold for a stream too, which takes no endingOffsets at all.
        why = ("; a batch read cannot end at earliest (it would read nothing)"
               if kind is ReadKind.BATCH else
               "; endingOffsets is for batch reads (spark.read), which cannot end at earliest "
               "(it would read nothing); a stream (spark.readStream) takes none")
        ending = parse_offsets("endingOffsets", opts["endingoffsets"], (LATEST,), why)

    max_per_trigger = None
    if opts.get("maxoffsetspertrigger"):
        if kind is ReadKind.BATCH:
            raise OptionError("maxOffsetsPerTrigger: only for streams (spark.readStream); a "
                              "batch read reads from startingOffsets to endingOffsets whole")
        max_per_trigger = _positive_int("maxOffsetsPerTrigger", opts["maxoffsetspertrigger"])
    fail = _bool("failOnDataLoss", opts["failondataloss"]) if opts.get("failondataloss") else True
    per_part = 100_000
    if opts.get("maxrecordsperpartition"):
        per_part = _positive_int("maxRecordsPerPartition", opts["maxrecordsperpartition"])
    fetch_size = _positive_int("fetchSize", opts["fetchsize"]) if opts.get("fetchsize") else 2000
    fetch_bytes = MAX_PARTITION_FETCH_BYTES
    if opts.get("maxpartitionfetchbytes"):
        fetch_bytes = _positive_int("maxPartitionFetchBytes", opts["maxpartitionfetchbytes"])

    timeouts: dict[str, int] = {}
    for key, name in zip(_GROUP_OPTIONS,
                         ("sessionTimeoutMs", "heartbeatIntervalMs", "rebalanceTimeoutMs")):
        if opts.get(key):
            if group_id is None:
                raise OptionError(f"{name}: only meaningful with groupId")
            timeouts[key] = _positive_int(name, opts[key], most=INT32_MAX)
    session = timeouts.get("sessiontimeoutms", 10_000)
    beat = timeouts.get("heartbeatintervalms", min(1_000, max(1, session // 3)))
    if beat * 3 > session:
        if "heartbeatintervalms" not in timeouts:
            raise OptionError(f"sessionTimeoutMs: {session} is too short; it must hold three "
                              "heartbeat intervals of at least 1 ms (at least 3)")
        raise OptionError(f"heartbeatIntervalMs: {beat} must be at most sessionTimeoutMs / 3 "
                          f"({session / 3:g})")
    return ReadOptions(
        url=url,
        namespace=namespace,
        topics=topics,
        pattern=pattern,
        assign=assign,
        starting=starting,
        ending=ending,
        max_offsets_per_trigger=max_per_trigger,
        fail_on_data_loss=fail,
        max_records_per_partition=per_part,
        fetch_size=fetch_size,
        max_partition_fetch_bytes=fetch_bytes,
        group_id=group_id,
        session_timeout_ms=session,
        heartbeat_interval_ms=beat,
        rebalance_timeout_ms=timeouts.get("rebalancetimeoutms", REBALANCE_TIMEOUT_MS),
    )


def check_session_timeout(opts: ReadOptions, namespace: CoordinatorConfig) -> None:
    """Group mode: ``sessionTimeoutMs`` must lie within the session timeouts the namespace
    allows, as Kafka's coordinator refuses a JoinGroup outside ``group.min.session.timeout.ms``
    .. ``group.max.session.timeout.ms`` (INVALID_SESSION_TIMEOUT). Checked before the query
    joins because the refusal names the group client's ``session_timeout_ms``, not the Spark
    option; and here, not in the parser, because the bounds are the namespace's settings in
    Redis (``CoordinatorConfig``), which a deployment may change."""
    low, high = namespace.group_min_session_timeout_ms, namespace.group_max_session_timeout_ms
    if not low <= opts.session_timeout_ms <= high:
        raise OptionError(
            f"sessionTimeoutMs: {opts.session_timeout_ms} is outside {low}..{high}, the session "
            f"timeouts namespace {opts.namespace!r} allows (its group_min_session_timeout_ms "
            "and group_max_session_timeout_ms, changed with CoordinatorConfig)")


def parse_write_options(
    options: Mapping[str, Any], env: Mapping[str, str] | None = None
) -> WriteOptions:
    """A write's settings: where to, and the default ``topic`` for rows without one."""
    _refuse_empty(options)
    opts = _lower(options)
    env = os.environ if env is None else env
    for name in ("subscribe", "subscribepattern", "assign", "groupid"):
        if opts.get(name):
            pretty = {"subscribepattern": "subscribePattern", "groupid": "groupId"}.get(name, name)
            raise OptionError(f"{pretty}: is a read option; a write names its topic with the "
                              "topic option or a topic column")
    _check_names(opts, WRITE_OPTIONS, "write", READ_OPTIONS)
    topic = opts.get("topic") or None
    size = MAX_REQUEST_SIZE
    if "maxrequestsize" in opts:
        size = _positive_int("maxRequestSize", opts["maxrequestsize"])
        if size > MAX_REQUEST_SIZE_LIMIT:
            raise OptionError(f"maxRequestSize: must be at most {MAX_REQUEST_SIZE_LIMIT} "
                              f"(Redis's largest argument by default), got {size}")
    return WriteOptions(url=_url(opts, env), namespace=_namespace(opts), topic=topic,
                        max_request_size=size)
