"""ConsumerGroupConfig: everything a worker needs to be one member of a consumer group.

The fields mirror segmentio/kafka-go's ``ConsumerGroupConfig`` in Python names (``ID`` ->
``group_id``, ``GroupBalancers`` -> ``assignors``, ``StartOffset`` -> ``start_offset``, ...),
with kafka-go's defaults except the rebalance timeout, which is Kafka's (60 s; kafka-go uses
30 s). Durations are integer milliseconds, as in Kafka's own configuration names.

``validate()`` runs on construction and names the field to fix, like kafka-go's
``ConsumerGroupConfig.Validate``. No I/O happens here: the Redis connection is made when the
group starts.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from ..assignors import Assignor, UnknownAssignorError, get_assignor
from ..errors import ConfigError, InvalidRequestError
from ..names import NAMESPACE_RULE, valid_namespace
from ..protocol._checks import INT32_MAX, INT64_MAX, check_id
from ..protocol.consumer import ENCODINGS, Encoding
from ..topics._base import TOPIC_RULE, TopicError, _check_topic
from ..urls import redact_url, repr_redacting, url_problem

__all__ = ["ConsumerGroupConfig", "StartOffset"]

StartOffset = Literal["earliest", "latest", "none"]

_INSTANCE_ID_RE = re.compile(r"[a-zA-Z0-9._-]{1,249}")


@dataclass(frozen=True)
class ConsumerGroupConfig:
    """Settings of one group member. Only ``group_id``, ``topics`` and Redis are required.

    ``topics`` may be empty only for a ``Consumer`` that calls ``subscribe()`` or ``assign()``
    later, or when ``topic_pattern`` is set; a ``ConsumerGroup`` needs one of the two.

    Attributes:
        group_id: the consumer group (kafka-go ``ID``).
        topics: topics to consume; stored as a tuple without duplicates, in the given order.
        topic_pattern: instead of ``topics``, a compiled ``re.Pattern``: the member subscribes
            to every topic whose whole name matches it (Kafka's ``subscribe(Pattern)``), checked
            at each join and every ``partition_watch_interval_ms``, so topics created or deleted
            later are picked up or dropped by a rebalance.
        assignors: assignment strategies offered in JoinGroup, most preferred first (kafka-go
            ``GroupBalancers``). Names registered with ``rcoord.assignors.register_assignor``, or
            ``Assignor`` objects. The coordinator picks the one every member supports that most
            members prefer; the leader then runs it.
        heartbeat_interval_ms: time between heartbeats (kafka-go ``HeartbeatInterval``). Must be
            at most a third of the session timeout, so two lost beats do not expire the member.
        partition_watch_interval_ms: how often the leader reads the partition counts of the
            subscribed topics (kafka-go ``PartitionWatchInterval``), and how often a member
            with a ``topic_pattern`` lists the topics again.
        watch_partition_changes: whether the leader watches at all (kafka-go
            ``WatchPartitionChanges``; rcoord defaults it on).
        session_timeout_ms: a member that does not heartbeat for this long is removed
            (kafka-go ``SessionTimeout``). Must lie within the namespace's
            ``group_min_session_timeout_ms`` / ``group_max_session_timeout_ms``.
        rebalance_timeout_ms: how long the coordinator waits for every member to rejoin in a
            rebalance; it bounds how long revoking partitions may take (kafka-go
            ``RebalanceTimeout``).
        join_backoff_ms: pause before joining again after a failed join (kafka-go
            ``JoinGroupBackoff``).
        retention_ms: how long committed offsets are kept once the group is empty; None keeps
            the namespace's ``offsets_retention_ms`` (kafka-go ``RetentionTime``); at most
            Long.MAX, as Kafka's OffsetCommit carries it.
        commit_required_acks: replicas that must have a commit before it counts as done (Kafka's
            ``offsets.commit.required.acks``); 0, the default, trusts the master's answer, which
            a failover can lose (docs/guarantees.md, "Failover"). With N > 0 a commit too few
            replicas acknowledged within ``commit_ack_timeout_ms`` is retried, as Kafka's
            client retries COORDINATOR_NOT_AVAILABLE. Needs ``+wait`` in the worker's ACL.
        commit_ack_timeout_ms: how long a commit waits for those replicas (Kafka's
            ``offsets.commit.timeout.ms``).
        start_offset: where to start in a partition with no committed offset, and where to go
            when a committed offset fell out of the log: "earliest" (the log start) or "latest"
            (the log end, only new records), kafka-go ``StartOffset`` (FirstOffset/LastOffset);
            or "none", Kafka's ``auto.offset.reset=none``: never guess. ``Consumer.poll()``
            then raises ``NoOffsetForPartitionError`` for a partition with no committed offset
            and ``OffsetOutOfRangeError`` for a position that fell out of the log (records
            deleted by retention, a topic created again) until the application seeks it; a
            ``Generation`` gives such a partition the offset -1 (no position).
        group_instance_id: makes the member static (KIP-345): it keeps its partitions across
            a restart within the session timeout, and it does not send LeaveGroup on close.
        client_id: prefix of the member id the coordinator hands out.
        client_rack: the rack (zone) this member runs in (Kafka ``client.rack``). Sent in the
            subscription; rack-aware assignors (``range``, ``sticky``, ``cooperative-sticky``
            per KIP-881, ``rack-affinity``) prefer partitions held in the same rack, where the
            racks of the Redis nodes are declared with ``rcoord.topics.set_node_racks``.
        protocol_encoding: how this member encodes its subscription: "msgpack" (rcoord's
            format) or "kafka" (Kafka's binary ConsumerProtocol). Use "kafka" in a group shared
            with Kafka clients (through ``rcoord gateway``), whose leader reads only that. An
            rcoord leader reads both and answers each member in its own encoding.
        redis_url: ``redis://host:port/db``; a cluster is detected and used as one.
        redis_client: an existing ``redis.Redis`` or ``redis.RedisCluster`` created with
            ``decode_responses=False``, used instead of ``redis_url``. The group does not close it.
        namespace: the rcoord namespace (key prefix) shared with the coordinators and topics.
        retry_backoff_ms: first pause before retrying a call that failed with a lost
            connection or COORDINATOR_NOT_AVAILABLE (Kafka ``retry.backoff.ms``). Pauses double,
            with jitter, up to ``retry_backoff_max_ms`` (Kafka ``retry.backoff.max.ms``); a call
            is retried for at most one session timeout.
    """

    group_id: str
    topics: Sequence[str]
    topic_pattern: re.Pattern[str] | None = None
    assignors: Sequence[str | Assignor] = ("range", "roundrobin")
    heartbeat_interval_ms: int = 3000
    partition_watch_interval_ms: int = 5000
    watch_partition_changes: bool = True
    session_timeout_ms: int = 30_000
    rebalance_timeout_ms: int = 60_000
    join_backoff_ms: int = 5000
    retention_ms: int | None = None
    commit_required_acks: int = 0
    commit_ack_timeout_ms: int = 5000
    start_offset: StartOffset = "earliest"
    group_instance_id: str | None = None
    client_id: str = "rcoord"
    client_rack: str | None = None
    protocol_encoding: Encoding = "msgpack"
    redis_url: str | None = None
    redis_client: Any = field(default=None, compare=False, repr=False)
    namespace: str = "rcoord"
    retry_backoff_ms: int = 100
    retry_backoff_max_ms: int = 1000

    def __repr__(self) -> str:
        return repr_redacting(self, "redis_url")

    def __post_init__(self) -> None:
        # Sequences become tuples so the frozen config is hashable and cannot change under us.
        if isinstance(self.topics, Iterable) and not isinstance(self.topics, (str, bytes)):
            object.__setattr__(self, "topics", tuple(dict.fromkeys(self.topics)))
        if isinstance(self.assignors, Iterable) and not isinstance(self.assignors, (str, bytes)):
            object.__setattr__(self, "assignors", tuple(self.assignors))
        self.validate()

    # -- checks ----------------------------------------------------------------------------

    def validate(self) -> None:
        """Check every field and invariant; the ``ConfigError`` message names the bad field."""
        if not isinstance(self.group_id, str) or not self.group_id:
            raise ConfigError(f"group_id must be a non-empty str, got {self.group_id!r}")
        _coordinator_id("group_id", self.group_id)
        if not isinstance(self.topics, tuple):
            raise ConfigError(f"topics must be a list of topic names, got {self.topics!r}")
        for topic in self.topics:
            if not isinstance(topic, str) or not topic:
                raise ConfigError(f"topics must hold non-empty str names, got {topic!r}")
            _coordinator_id("topic", topic)
            _topic_name(topic)
        if self.topic_pattern is not None:
            if not isinstance(self.topic_pattern, re.Pattern) or not isinstance(
                self.topic_pattern.pattern, str
            ):
                raise ConfigError(
                    "topic_pattern must be a compiled str pattern (re.compile(...)) or None, "
                    f"got {self.topic_pattern!r}"
                )
            if self.topics:
                raise ConfigError(
                    "topics and topic_pattern are mutually exclusive: subscribe to a list of "
                    "topics or to a pattern, not both"
                )
        self.resolved_assignors()  # raises ConfigError naming 'assignors'
        for name in (
            "heartbeat_interval_ms",
            "partition_watch_interval_ms",
            "session_timeout_ms",
            "rebalance_timeout_ms",
            "retry_backoff_ms",
            "retry_backoff_max_ms",
        ):
            _positive(name, getattr(self, name))
        _positive("join_backoff_ms", self.join_backoff_ms, least=0)
        if self.heartbeat_interval_ms * 3 > self.session_timeout_ms:
            raise ConfigError(
                f"heartbeat_interval_ms ({self.heartbeat_interval_ms}) must be at most "
                f"session_timeout_ms / 3 ({self.session_timeout_ms / 3:g})"
            )
        if self.retry_backoff_max_ms < self.retry_backoff_ms:
            raise ConfigError(
                f"retry_backoff_max_ms ({self.retry_backoff_max_ms}) must be >= "
                f"retry_backoff_ms ({self.retry_backoff_ms})"
            )
        if not isinstance(self.watch_partition_changes, bool):
            raise ConfigError("watch_partition_changes must be a bool")
        if self.retention_ms is not None:
            _int("retention_ms", self.retention_ms)
            # Kafka's OffsetCommit carries it as an INT64; past it every commit was refused,
            # the auto-commits and close()'s final commit only logging it.
            if not 0 <= self.retention_ms <= INT64_MAX:
                raise ConfigError(f"retention_ms must be from 0 to {INT64_MAX} or None, got "
                                  f"{self.retention_ms}")
        _int("commit_required_acks", self.commit_required_acks)
        if self.commit_required_acks < 0:
            raise ConfigError(
                f"commit_required_acks must be >= 0, got {self.commit_required_acks} (Redis "
                "keeps no in-sync replica set, so Kafka's -1 has no equivalent: name a count)")
        if self.commit_required_acks > INT32_MAX:
            # (The commit script takes an INT32, as Kafka's acks; past it every commit failed.)
            raise ConfigError(f"commit_required_acks must be at most {INT32_MAX}, got "
                              f"{self.commit_required_acks}")
        _positive("commit_ack_timeout_ms", self.commit_ack_timeout_ms)
        if self.start_offset not in ("earliest", "latest", "none"):
            raise ConfigError(
                f"start_offset must be 'earliest', 'latest' or 'none', got {self.start_offset!r}"
            )
        _instance_id(self.group_instance_id)
        if self.protocol_encoding not in ENCODINGS:
            raise ConfigError(
                f"protocol_encoding must be one of {ENCODINGS}, got {self.protocol_encoding!r}"
            )
        if not isinstance(self.client_id, str):
            raise ConfigError(f"client_id must be a str, got {self.client_id!r}")
        _coordinator_id("client_id", self.client_id)
        if self.redis_url is not None and self.redis_client is not None:
            raise ConfigError("give redis_url or redis_client, not both")
        problem = None if self.redis_url is None else url_problem(self.redis_url)
        if problem:
            raise ConfigError(f"redis_url {redact_url(self.redis_url, query=True)!r} {problem}")
        if not valid_namespace(self.namespace):
            raise ConfigError(f"namespace must be {NAMESPACE_RULE}, got {self.namespace!r}")

    def resolved_assignors(self) -> list[Assignor]:
        """The assignor objects, in preference order (names looked up in the registry)."""
        if not isinstance(self.assignors, tuple) or not self.assignors:
            raise ConfigError(f"assignors must be a non-empty list, got {self.assignors!r}")
        out: list[Assignor] = []
        for item in self.assignors:
            if isinstance(item, str):
                try:
                    out.append(get_assignor(item))
                except UnknownAssignorError as exc:
                    raise ConfigError(f"assignors: {exc}") from None
            elif isinstance(getattr(item, "name", None), str) and callable(
                getattr(item, "assign", None)
            ):
                out.append(item)
            else:
                raise ConfigError(f"assignors must hold names or Assignor objects, got {item!r}")
        names = [a.name for a in out]
        if len(set(names)) != len(names):
            raise ConfigError(f"assignors must not repeat a name, got {names}")
        return out


def _coordinator_id(name: str, value: str) -> None:
    """The coordinator's own id check (valid UTF-8, at most MAX_ID_BYTES), at construction
    rather than in the group's background loop; a ConfigError, like every bad setting here."""
    try:
        check_id(name, value)
    except InvalidRequestError as exc:
        raise ConfigError(str(exc)) from exc


def _instance_id(value: Any) -> None:
    """Kafka's client rule for group.instance.id (JoinGroupRequest.validateGroupInstanceId,
    called by ConsumerConfig): the topic-name charset, 1-249 characters, not '.' or '..'. The
    coordinator takes any non-empty id, as Kafka's broker does (non-Java clients send ids such
    as ``host:1``); the worker keeps the Java client's rule, checked when the config is made."""
    if value is None:
        return
    if not isinstance(value, str):
        raise ConfigError(f"group_instance_id must be a str or None, got {value!r}")
    if not _INSTANCE_ID_RE.fullmatch(value) or value in (".", ".."):  # ($ let "a\n" by)
        raise ConfigError(
            f"group_instance_id {value!r} is invalid: use 1-249 characters of [a-zA-Z0-9._-], "
            "not '.' or '..' (or None for a dynamic member)"
        )


def _topic_name(topic: str) -> None:
    """rcoord.topics' own name check (Kafka's rule), at construction: every subscribed topic is
    read through ``rcoord.topics``, which refuses the name, so the leader's partition counts
    failed with INVALID_TOPIC_EXCEPTION in every round and the member backed off and rejoined
    for ever (Kafka's consumer raises InvalidTopicException from poll instead)."""
    try:
        _check_topic(topic)
    except TopicError as exc:
        raise ConfigError(f"topics: {exc.detail}: a topic name is {TOPIC_RULE}") from exc


def _int(name: str, value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ConfigError(f"{name} must be an int (milliseconds), got {value!r}")
    return value


def _positive(name: str, value: Any, least: int = 1) -> None:
    """A duration of at least ``least`` ms, at most INT32_MAX: past it (Long.MAX, a Java
    user's "no limit") the consumer failed later, in a wait whose deadline the platform's
    clock cannot hold, or a join the coordinator refuses (Kafka's timeouts are INTs), naming
    no setting."""
    if _int(name, value) < least:
        raise ConfigError(f"{name} must be >= {least}, got {value}")
    check_duration_bound(name, value)


def check_duration_bound(name: str, value: int) -> None:
    """Refuse a duration past INT32_MAX ms (about 24.8 days), ``name`` in the message."""
    if value > INT32_MAX:
        raise ConfigError(f"{name} must be at most {INT32_MAX} ms (about 24.8 days, the bound "
                          f"of Kafka's timeouts), got {value}")
