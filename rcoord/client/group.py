"""ConsumerGroup and Generation: one worker's life as a member of a consumer group.

The lifecycle is segmentio/kafka-go's ``ConsumerGroup``, made idiomatic in Python::

    with ConsumerGroup(config) as group:
        while True:
            gen = group.next()                      # join, sync, fetch offsets
            for topic, parts in gen.assignments.items():
                for p in parts:
                    gen.start(lambda ctx, t=topic, p=p: consume(ctx, t, p.partition, p.offset))
            # each routine runs until ctx.done is set, committing with gen.commit_offsets(...)

One background thread (``run``) drives the rounds. A round is:

1. **JoinGroup**, twice the first time (KIP-394: the coordinator hands out a member id, the
   member joins again with it). Each configured assignor is offered as a protocol, with a
   ``ConsumerProtocolSubscription`` of the topics as its metadata.
2. **Assign** (leader only): the leader decodes every member's subscription, reads the partition
   counts of all subscribed topics and runs the assignor the coordinator selected.
3. **SyncGroup**: the leader sends every member's ``ConsumerProtocolAssignment``; every member
   gets its own back.
4. **OffsetFetch** for the assigned partitions; a partition without a committed offset starts at
   the ``start_offset`` policy (log start or log end).
5. The ``Generation`` is handed to ``next()``, with a **heartbeat thread** and, on the leader, a
   **partition watcher** thread.
6. The generation **ends** (``done`` is set) when the heartbeat says so (see ``ERROR_POLICY``),
   the watcher sees a partition count change, a started routine raises, a commit is fenced, or
   the group closes. The run thread then waits until every routine started on the generation
   has returned, stops the heartbeat, and begins the next round. So two generations of one
   member never run at the same time.

``close()`` ends the generation, waits for its routines, sends LeaveGroup (not for a static
member, as in Kafka: a static member's partitions wait for it until its session times out) and
stops the thread.

Where this differs from kafka-go, on purpose:

* **The heartbeat keeps beating until the routines have returned** when a rebalance starts
  (aiokafka does the same). kafka-go stops it at once, so a slow revocation can expire the member.
  The rebalance timeout still bounds the revocation: a member that has not rejoined by then is
  removed by the coordinator, and the next beat reports it (UNKNOWN_MEMBER_ID: partitions lost).
* **A routine that returns does not end the generation**; one that raises does. In kafka-go any
  returning function ends it, because the heartbeat and the watchers are such functions too.
* **Only the leader watches partition counts**, as in Kafka's Java client. A follower's rejoin with
  unchanged metadata gets the current generation back, so only the leader's rejoin can rebalance.
* **``start()`` on a generation whose routines were already collected raises**
  ``GenerationEndedError`` instead of running the function anyway (kafka-go runs it with a
  cancelled context, where it may overlap the next generation).
* **A generation that ends before anyone took it from ``next()`` is withdrawn**, and the member
  rejoins at once, so ``next()`` never hands out a generation that is already over.
* **Errors are reported once through ``next()``** only when they change something the user
  should know (a join that backs off, a fatal error); a routine rejoin is not an error.

The client depends on a narrow ``Coordinator`` protocol (kafka-go's ``coordinator`` interface),
so tests can replace Redis with a fake whose methods are plain function fields.
"""

from __future__ import annotations

import enum
import functools
import inspect
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType, TracebackType
from typing import Any, Literal, Protocol, Self, TypeVar

import redis
import redis.cluster
import tenacity
from tenacity.stop import stop_base

from .. import topics as _topics
from ..assignors import Assignor, kafka_member_order
from ..config import CoordinatorConfig
from ..coordinator import GroupCoordinator
from ..errors import (
    ConfigError,
    ConnectionLost,
    Errors,
    ProtocolError,
    RcoordError,
    translate_redis_errors,
)
from ..protocol.consumer import (
    PROTOCOL_TYPE,
    ConsumerProtocolAssignment,
    ConsumerProtocolSubscription,
    MalformedMetadataError,
)
from ..protocol.join import JoinGroupResult
from ..protocol.leave import LeaveGroupResult, MemberIdentity
from ..protocol.offsets import OffsetAndMetadata, OffsetFetchResult, TopicPartition
from ..protocol.sync import SyncGroupResult
from .config import ConsumerGroupConfig

__all__ = [
    "CONNECTION_LOST",
    "ERROR_POLICY",
    "OTHERWISE",
    "CommitFailedError",
    "ConsumerGroup",
    "Coordinator",
    "EndReason",
    "Generation",
    "GenerationContext",
    "GenerationEndedError",
    "GroupClosedError",
    "PartitionAssignment",
    "Reaction",
    "RedisCoordinator",
    "client_from_url",
    "reaction_for",
]

log = logging.getLogger("rcoord.client")

T = TypeVar("T")

SOCKET_TIMEOUT_S = 10.0
"""Socket timeout of clients made from ``redis_url``: above a parked call's 1 s XREAD."""


# -- the seam ---------------------------------------------------------------------------------


class Coordinator(Protocol):
    """What the client needs from the coordinator and the topics, one method per request.

    ``RedisCoordinator`` implements it on Redis; tests implement it with function fields.
    Group-step methods have ``GroupCoordinator``'s signatures and Kafka error codes.
    """

    def join_group(
        self,
        group_id: str,
        member_id: str = "",
        *,
        protocol_type: str,
        protocols: Sequence[tuple[str, bytes]],
        session_timeout_ms: int,
        rebalance_timeout_ms: int | None = None,
        group_instance_id: str | None = None,
        client_id: str = "",
        reason: str | None = None,
    ) -> JoinGroupResult: ...

    def sync_group(
        self,
        group_id: str,
        generation_id: int,
        member_id: str,
        *,
        assignments: dict[str, bytes] | None = None,
        group_instance_id: str | None = None,
        protocol_type: str | None = None,
        protocol_name: str | None = None,
    ) -> SyncGroupResult: ...

    def heartbeat(
        self,
        group_id: str,
        generation_id: int,
        member_id: str,
        group_instance_id: str | None = None,
    ) -> Errors: ...

    def leave_group(self, group_id: str, members: Sequence[MemberIdentity]) -> LeaveGroupResult: ...

    def commit_offsets(
        self,
        group_id: str,
        offsets: dict[TopicPartition, OffsetAndMetadata | int],
        *,
        member_id: str = "",
        generation_id: int = -1,
        group_instance_id: str | None = None,
        retention_ms: int | None = None,
    ) -> dict[TopicPartition, Errors]: ...

    def fetch_offsets(
        self, group_id: str, partitions: Sequence[TopicPartition] | None = None
    ) -> OffsetFetchResult: ...

    def partition_counts(self, topics: Sequence[str]) -> dict[str, int]:
        """Partition count of each existing topic; unknown topics are left out."""
        ...

    def log_offsets(self, topic: str, partition: int) -> tuple[int, int]:
        """(log start offset, log end offset) of a partition."""
        ...

    def fetch(
        self, topic: str, partition: int, offset: int, max_records: int, block_ms: int | None
    ) -> _topics.FetchResult:
        """Records of one partition from ``offset`` (``rcoord.topics.fetch``)."""
        ...


class RedisCoordinator(GroupCoordinator):
    """The ``Coordinator`` on Redis: ``GroupCoordinator`` plus the topic reads a worker needs.

    It uses the settings stored in the namespace (it writes none), so workers enforce the limits
    the deployment's coordinators configured.
    """

    def __init__(self, redis_client: Any, namespace: str = "rcoord") -> None:
        super().__init__(redis_client, CoordinatorConfig(namespace=namespace))
        self._ns = namespace
        self._topic_admin = _topics.Topics(redis_client, namespace)

    @translate_redis_errors
    def partition_counts(self, topics: Sequence[str]) -> dict[str, int]:
        out: dict[str, int] = {}
        for topic in topics:
            try:
                out[topic] = self._topic_admin.partition_count(topic)
            except _topics.TopicError as exc:
                if exc.error is not Errors.UNKNOWN_TOPIC_OR_PARTITION:
                    raise
        return out

    def log_offsets(self, topic: str, partition: int) -> tuple[int, int]:
        return _topics.log_offsets(self._redis, self._ns, topic, partition)

    def fetch(
        self, topic: str, partition: int, offset: int, max_records: int, block_ms: int | None
    ) -> _topics.FetchResult:
        return _topics.fetch(
            self._redis, self._ns, topic, partition, offset, max_records, block_ms=block_ms
        )


@translate_redis_errors
def client_from_url(url: str) -> Any:
    """A ``redis.Redis`` for ``url``, or a ``redis.RedisCluster`` if the server is a cluster node."""
    kwargs: dict[str, Any] = {"socket_timeout": SOCKET_TIMEOUT_S, "socket_connect_timeout": 5.0}
    client = redis.Redis.from_url(url, **kwargs)
    try:
        enabled = str(client.info("cluster").get("cluster_enabled", 0)) == "1"
    except redis.exceptions.ResponseError:
        enabled = False
    if not enabled:
        return client
    client.close()
    return redis.cluster.RedisCluster.from_url(url, **kwargs)


# -- the error policy ------------------------------------------------------------------------


@dataclass(frozen=True)
class Reaction:
    """What the member does when a coordinator call answers with an error (one table row)."""

    retry: bool
    """Retry the same call first (exponential back-off, for at most one session timeout)."""
    member_id: Literal["keep", "reset", "leave"]
    """Keep the member id, forget it (rejoin as a new member), or send LeaveGroup and forget it."""
    partitions: Literal["revoked", "lost"]
    """How the current generation's partitions end: revoked (commits may still succeed, so the
    consumer commits) or lost (another member may own them already: no commit)."""
    then: Literal["rejoin", "backoff", "fatal"]
    """Rejoin at once; or report the error through ``next()`` and rejoin after
    ``join_backoff_ms``; or report it and close the group."""

    @property
    def lost(self) -> bool:
        return self.partitions == "lost"


_UNREACHABLE = Reaction(True, "keep", "lost", "backoff")

ERROR_POLICY: Mapping[Errors, Reaction] = MappingProxyType(
    {
        # error                                retry  member id  partitions  then
        Errors.REBALANCE_IN_PROGRESS: Reaction(False, "keep", "revoked", "rejoin"),
        Errors.ILLEGAL_GENERATION: Reaction(False, "keep", "lost", "rejoin"),
        Errors.UNKNOWN_MEMBER_ID: Reaction(False, "reset", "lost", "rejoin"),
        Errors.FENCED_INSTANCE_ID: Reaction(False, "keep", "lost", "fatal"),
        Errors.COORDINATOR_NOT_AVAILABLE: _UNREACHABLE,
        Errors.COORDINATOR_LOAD_IN_PROGRESS: _UNREACHABLE,
        Errors.NOT_COORDINATOR: _UNREACHABLE,
        Errors.REQUEST_TIMED_OUT: _UNREACHABLE,
    }
)
"""The client's error policy, in one place. It applies to every call that carries a generation
or a member id: JoinGroup, SyncGroup, Heartbeat and OffsetCommit.

=================================  =====  =========  ==========  =======
error                              retry  member id  partitions  then
=================================  =====  =========  ==========  =======
REBALANCE_IN_PROGRESS              no     keep       revoked     rejoin
ILLEGAL_GENERATION                 no     keep       lost        rejoin
UNKNOWN_MEMBER_ID                  no     reset      lost        rejoin
FENCED_INSTANCE_ID                 no     keep       lost        fatal
COORDINATOR_NOT_AVAILABLE,         yes    keep       lost        backoff
NOT_COORDINATOR,
COORDINATOR_LOAD_IN_PROGRESS,
REQUEST_TIMED_OUT
``ConnectionLost`` (exception)     yes    keep       lost        backoff
anything else                      no     leave      lost        backoff
=================================  =====  =========  ==========  =======

Why each row, in Kafka's terms: REBALANCE_IN_PROGRESS means "rejoin"; the member is still in the
group, so its partitions are *revoked* and a final commit still succeeds (the coordinator accepts
commits of the current generation while it prepares the rebalance), and the heartbeat keeps
beating until the revocation is done. ILLEGAL_GENERATION means the group went on without this
generation; Kafka resets the generation but keeps the member id. UNKNOWN_MEMBER_ID means the
member was removed (session expired, rebalance timeout, or left); it rejoins with a fresh id.
Both lose the partitions: someone else may be processing them. FENCED_INSTANCE_ID means another
process took over this static member's instance id; carrying on would make two owners, so it is
fatal, as in Kafka. Coordinator unavailability and lost connections are retried; if that fails for
a whole session timeout, the session has probably expired, so the partitions count as lost.
Anything else (INCONSISTENT_GROUP_PROTOCOL, INVALID_SESSION_TIMEOUT, GROUP_MAX_SIZE_REACHED, a
subscription the leader cannot decode, ...) is reported, and the member leaves and backs off
before it joins again (kafka-go's ``run`` loop does the same).

MEMBER_ID_REQUIRED is not in the table: it is the normal first step of JoinGroup (KIP-394).
"""

CONNECTION_LOST = _UNREACHABLE
"""The row for ``ConnectionLost``: Redis could not be reached."""

OTHERWISE = Reaction(False, "leave", "lost", "backoff")
"""The row for every error not in ``ERROR_POLICY``."""


def reaction_for(error: Errors | BaseException) -> Reaction:
    """The ``ERROR_POLICY`` row for an error code or an exception."""
    if isinstance(error, ConnectionLost):
        return CONNECTION_LOST
    if isinstance(error, ProtocolError):
        error = error.error
    if isinstance(error, Errors):
        return ERROR_POLICY.get(error, OTHERWISE)
    return OTHERWISE


# -- errors -----------------------------------------------------------------------------------


class CommitFailedError(ProtocolError):
    """An offset commit was refused because the group has moved on from this generation.

    ``error`` is the coordinator's code (ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID,
    REBALANCE_IN_PROGRESS or FENCED_INSTANCE_ID); ``partitions`` maps each refused partition to
    it. The generation has ended; its partitions may already belong to another member, which will
    process again the records since the last successful commit.
    """

    def __init__(
        self,
        message: str = "",
        error: Errors | None = None,
        partitions: Mapping[TopicPartition, Errors] | None = None,
    ) -> None:
        super().__init__(message, error)
        self.partitions = dict(partitions or {})

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.error, self.partitions))


class GroupClosedError(RcoordError):
    """The group was closed (by ``close()``, or by a fatal error): no more generations."""


class GenerationEndedError(RcoordError):
    """``Generation.start`` was called after the generation's routines were collected."""


_COMMIT_FENCED = (
    Errors.UNKNOWN_MEMBER_ID,
    Errors.ILLEGAL_GENERATION,
    Errors.FENCED_INSTANCE_ID,
    Errors.REBALANCE_IN_PROGRESS,
)

_COMMIT_WHY = {
    Errors.UNKNOWN_MEMBER_ID: "the coordinator no longer knows member {member} (its session "
    "expired, it missed the rebalance timeout, or it left)",
    Errors.ILLEGAL_GENERATION: "generation {gen} is over: the group has moved to a newer generation",
    Errors.FENCED_INSTANCE_ID: "another process took over group instance id {iid}",
    Errors.REBALANCE_IN_PROGRESS: "the group is completing a rebalance",
}


# -- generations ------------------------------------------------------------------------------


class EndReason(enum.Enum):
    """Why a generation ended."""

    REBALANCE = "the coordinator started a rebalance"
    MEMBER_LOST = "the coordinator no longer counts this member in the generation"
    COORDINATOR_UNREACHABLE = "the coordinator could not be reached for a session timeout"
    PARTITIONS_CHANGED = "the partition count of a subscribed topic changed"
    ROUTINE_FAILED = "a routine started with Generation.start() raised"
    ERROR = "the coordinator answered with an error"
    CLOSED = "the group is closing"

    @classmethod
    def of(cls, error: Errors | BaseException) -> EndReason:
        if isinstance(error, ConnectionLost):
            return cls.COORDINATOR_UNREACHABLE
        if isinstance(error, ProtocolError):
            error = error.error
        if error is Errors.REBALANCE_IN_PROGRESS:
            return cls.REBALANCE
        if error in (
            Errors.ILLEGAL_GENERATION,
            Errors.UNKNOWN_MEMBER_ID,
            Errors.FENCED_INSTANCE_ID,
        ):
            return cls.MEMBER_LOST
        if isinstance(error, Errors) and reaction_for(error).retry:
            return cls.COORDINATOR_UNREACHABLE
        return cls.ERROR


@dataclass(frozen=True)
class PartitionAssignment:
    """One assigned partition and the offset to start reading at (kafka-go's PartitionAssignment)."""

    partition: int
    offset: int


class GenerationContext:
    """What a routine started with ``Generation.start`` receives.

    ``done`` is set when the generation ends; the routine should then finish its work (a final
    commit still succeeds unless the partitions were lost) and return promptly.
    """

    def __init__(self, generation: Generation) -> None:
        self.generation = generation
        self.done = generation.done

    @property
    def ended(self) -> bool:
        return self.done.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until the generation ends or ``timeout`` passes; True if it ended."""
        return self.done.wait(timeout)


class Generation:
    """One generation of the group as this member sees it: the user's handle (kafka-go).

    Attributes:
        group_id, generation_id, member_id, leader_id, protocol_name: from JoinGroup.
        assignments: topic -> sorted ``PartitionAssignment`` list (where to start reading).
        committed: the committed offsets found for the assigned partitions; partitions missing
            here start at the ``start_offset`` policy.
        done: set when the generation ends; see ``end_reason`` and ``lost``.
        exceptions: what routines started with ``start`` raised.
    """

    def __init__(
        self,
        *,
        group_id: str,
        generation_id: int,
        member_id: str,
        leader_id: str,
        protocol_name: str | None,
        assignments: Mapping[TopicPartition, int],
        committed: Mapping[TopicPartition, int],
        coordinator: Coordinator,
        group_instance_id: str | None = None,
        retention_ms: int | None = None,
        retry: Callable[[Callable[[], Any], Callable[[Any], Any] | None], Any] | None = None,
        on_end: Callable[[], None] | None = None,
    ) -> None:
        self.group_id = group_id
        self.generation_id = generation_id
        self.member_id = member_id
        self.leader_id = leader_id
        self.protocol_name = protocol_name
        by_topic: dict[str, list[PartitionAssignment]] = {}
        for tp in sorted(assignments):
            by_topic.setdefault(tp.topic, []).append(
                PartitionAssignment(tp.partition, assignments[tp])
            )
        self.assignments: dict[str, list[PartitionAssignment]] = by_topic
        self.committed: dict[TopicPartition, int] = dict(committed)
        self.done = threading.Event()
        self.exceptions: list[BaseException] = []
        self._coordinator = coordinator
        self._instance_id = group_instance_id
        self._retention_ms = retention_ms
        self._retry = retry or (lambda call, error_of: call())
        self._on_end = on_end
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._sealed = False
        self._end_reason: EndReason | None = None
        self._end_error: BaseException | Errors | None = None
        self._reaction: Reaction | None = None
        self._reaction_error: BaseException | Errors | None = None
        self._lost = False
        # Set once every routine has returned: the heartbeat and the watcher stop then.
        self._routines_done = threading.Event()
        self._helpers: list[threading.Thread] = []  # the heartbeat and the watcher
        self._watch_topics: list[str] = []
        self._watch_baseline: dict[str, int] | None = None  # the counts the leader assigned

    def __repr__(self) -> str:
        state = "live" if not self.done.is_set() else f"ended ({self._end_reason})"
        return (
            f"Generation(group_id={self.group_id!r}, generation_id={self.generation_id}, "
            f"member_id={self.member_id!r}, partitions={len(self.partitions)}, {state})"
        )

    # -- information

    @property
    def partitions(self) -> list[TopicPartition]:
        """The assigned partitions, sorted."""
        return [
            TopicPartition(t, pa.partition) for t, pas in self.assignments.items() for pa in pas
        ]

    @property
    def offsets(self) -> dict[TopicPartition, int]:
        """Assigned partition -> offset to start at."""
        return {
            TopicPartition(t, pa.partition): pa.offset
            for t, pas in self.assignments.items()
            for pa in pas
        }

    @property
    def is_leader(self) -> bool:
        return self.member_id == self.leader_id

    @property
    def end_reason(self) -> EndReason | None:
        """Why the generation ended (None while it is live)."""
        return self._end_reason

    @property
    def end_error(self) -> BaseException | Errors | None:
        """The error code or exception that ended it, if one did."""
        return self._end_error

    @property
    def lost(self) -> bool:
        """True if the partitions were lost rather than revoked (see ``ERROR_POLICY``)."""
        return self._lost

    # -- routines

    def start(self, fn: Callable[[GenerationContext], Any]) -> None:
        """Run ``fn(ctx)`` in a thread bound to this generation.

        The group starts the next generation only after every such thread has returned, so
        ``fn`` must return soon after ``ctx.done`` is set. If ``fn`` raises, the exception is
        logged and kept in ``exceptions``, and the generation ends (the member rejoins).
        Raises ``GenerationEndedError`` if the generation's routines were already collected.
        """
        if not callable(fn):
            raise TypeError("start() needs a callable taking a GenerationContext")
        ctx = GenerationContext(self)
        with self._lock:
            if self._sealed:
                raise GenerationEndedError(
                    f"generation {self.generation_id} of group {self.group_id!r} has ended "
                    "and its routines were collected; take the next one from group.next()"
                )
            thread = threading.Thread(
                target=self._run_routine,
                args=(fn, ctx),
                name=f"rcoord-{self.group_id}-gen{self.generation_id}-routine{len(self._threads)}",
                daemon=True,
            )
            self._threads.append(thread)
            thread.start()

    def _run_routine(self, fn: Callable[[GenerationContext], Any], ctx: GenerationContext) -> None:
        try:
            fn(ctx)
        except BaseException as exc:  # the root of the routine: report once, end the generation
            log.exception(
                "routine of generation %s raised; ending the generation", self.generation_id
            )
            with self._lock:
                self.exceptions.append(exc)
            self._end(EndReason.ROUTINE_FAILED)  # not a coordinator error: the member rejoins

    # -- commits

    def commit_offsets(self, offsets: Mapping[TopicPartition, int | OffsetAndMetadata]) -> None:
        """OffsetCommit stamped with this generation and member id (fenced by the coordinator).

        ``offsets`` maps ``TopicPartition(topic, partition)`` (or a ``(topic, partition)`` pair)
        to the next offset to read. Raises ``CommitFailedError`` if the group has rebalanced
        since this generation started (and ends the generation, per ``ERROR_POLICY``),
        ``ConnectionLost`` if Redis stayed unreachable, and ``ProtocolError`` for other codes.
        """
        prepared: dict[TopicPartition, OffsetAndMetadata | int] = {
            TopicPartition(tp[0], tp[1]): off for tp, off in offsets.items()
        }
        if not prepared:
            return

        def call() -> dict[TopicPartition, Errors]:
            return self._coordinator.commit_offsets(
                self.group_id,
                prepared,
                member_id=self.member_id,
                generation_id=self.generation_id,
                group_instance_id=self._instance_id,
                retention_ms=self._retention_ms,
            )

        def error_of(result: dict[TopicPartition, Errors]) -> Errors:
            return next((e for e in result.values() if e is not Errors.NONE), Errors.NONE)

        result = self._retry(call, error_of)
        failed = {tp: e for tp, e in result.items() if e is not Errors.NONE}
        if not failed:
            return
        codes = set(failed.values())
        fenced = next((c for c in _COMMIT_FENCED if c in codes), None)
        if fenced is not None:
            self._end(EndReason.of(fenced), fenced)
            why = _COMMIT_WHY[fenced].format(
                member=self.member_id, gen=self.generation_id, iid=self._instance_id
            )
            raise CommitFailedError(
                f"commit of generation {self.generation_id} refused ({fenced.name}): {why}. "
                "The group has rebalanced, so these partitions may belong to another member "
                "now, which will process again the records after the last successful commit. "
                "Take the next generation and continue from the committed offsets.",
                fenced,
                failed,
            )
        first = min(codes)
        raise ProtocolError.of(
            first,
            f"commit of generation {self.generation_id} failed for "
            + ", ".join(f"{tp.topic}-{tp.partition}: {e.name}" for tp, e in sorted(failed.items())),
        )

    # -- ending (internal)

    def _end(self, reason: EndReason, error: BaseException | Errors | None = None) -> None:
        """End the generation; an error also applies its ``ERROR_POLICY`` row."""
        reaction = reaction_for(error) if error is not None else None
        with self._lock:
            if self._end_reason is None:
                self._end_reason = reason
                self._end_error = error
            if reaction is not None:
                if reaction.lost:
                    self._lost = True
                # The most severe row wins: fatal > backoff > rejoin (and forgetting the id).
                if self._reaction is None or _severity(reaction) > _severity(self._reaction):
                    self._reaction = reaction
                    self._reaction_error = error
        already = self.done.is_set()
        self.done.set()
        if not already and self._on_end is not None:
            self._on_end()

    def _routine_threads(self) -> list[threading.Thread]:
        with self._lock:
            return list(self._threads)

    def _seal(self) -> list[threading.Thread]:
        with self._lock:
            self._sealed = True
            return list(self._threads)


def _severity(r: Reaction) -> int:
    return {"rejoin": 0, "backoff": 1, "fatal": 3}[r.then] + (1 if r.member_id != "keep" else 0)


# -- the group --------------------------------------------------------------------------------


class _StopWhenClosing(stop_base):
    """Stop retrying once the group closes."""

    def __init__(self, event: threading.Event) -> None:
        self._event = event

    def __call__(self, retry_state: tenacity.RetryCallState) -> bool:
        return self._event.is_set()


class _StopAfterFailingFor(stop_base):
    """Stop once the call has been failing for ``budget`` seconds (measured from the first
    failure, so a long parked call does not use up the budget before its first retry)."""

    def __init__(self, budget: float) -> None:
        self._budget = budget
        self._first: float | None = None

    def __call__(self, retry_state: tenacity.RetryCallState) -> bool:
        now = time.monotonic()
        if self._first is None:
            self._first = now
        return now - self._first >= self._budget


class ConsumerGroup:
    """A member of a consumer group; ``next()`` hands out its generations.

    ``ConsumerGroup(config)`` does no I/O. ``start()`` (or the first ``next()``, or entering the
    ``with`` block) connects and starts the background thread that joins the group. Pass
    ``coordinator`` to use another ``Coordinator`` than the Redis one (tests do).

    State transitions, as the user sees them::

        created --start()--> joining --(join, sync, fetch)--> generation N handed to next()
           generation N --(heartbeat error | partitions changed | routine raised | commit fenced)-->
           ended; routines return --> joining (same member id, unless ERROR_POLICY resets it)
        any --close()--> closing: generation ends, routines return, LeaveGroup --> closed
    """

    def __init__(
        self, config: ConsumerGroupConfig, *, coordinator: Coordinator | None = None
    ) -> None:
        if not isinstance(config, ConsumerGroupConfig):
            raise TypeError("config must be a ConsumerGroupConfig")
        config.validate()
        if coordinator is None and config.redis_url is None and config.redis_client is None:
            raise ConfigError("redis_url or redis_client must be set (or pass a coordinator)")
        self._config = config
        self._assignors: list[Assignor] = config.resolved_assignors()
        self._coordinator: Coordinator | None = coordinator
        self._owned_client: Any = None
        self._cond = threading.Condition()
        self._closing = threading.Event()
        self._thread: threading.Thread | None = None
        self._slot: Generation | None = None
        self._error: BaseException | None = None
        self._fatal: BaseException | None = None
        self._current: Generation | None = None
        self._member_id = ""
        self._in_call = False
        self._left = False
        self._exited = threading.Event()

    # -- properties

    @property
    def config(self) -> ConsumerGroupConfig:
        return self._config

    @property
    def member_id(self) -> str:
        """The member id the coordinator gave this member ("" before the first join)."""
        return self._member_id

    @property
    def generation(self) -> Generation | None:
        """The current generation (also before ``next()`` takes it), or None between them."""
        return self._current

    @property
    def coordinator(self) -> Coordinator:
        """The ``Coordinator`` in use (after ``start()``)."""
        if self._coordinator is None:
            raise RcoordError("the group has not started; call start() or next() first")
        return self._coordinator

    @property
    def closed(self) -> bool:
        return self._closing.is_set()

    # -- lifecycle

    def start(self) -> ConsumerGroup:
        """Connect and start joining the group in the background. Idempotent."""
        with self._cond:
            if self._closing.is_set():
                raise GroupClosedError(f"group {self._config.group_id!r} is closed")
            if self._thread is not None:
                return self
            if self._coordinator is None:
                client = self._config.redis_client
                if client is None:
                    client = self._owned_client = client_from_url(str(self._config.redis_url))
                coord = RedisCoordinator(client, self._config.namespace)
                coord.start()
                self._coordinator = coord
            self._thread = threading.Thread(
                target=self._run, name=f"rcoord-{self._config.group_id}-run", daemon=True
            )
            self._thread.start()
        return self

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def next(self, timeout: float | None = None) -> Generation:
        """The next generation: blocks until this member has joined, synced and read offsets.

        Raises ``TimeoutError`` after ``timeout`` seconds, ``GroupClosedError`` once the group is
        closed, and, once each, an error that made a join fail (``ProtocolError``,
        ``ConnectionLost``, ``MalformedMetadataError``, ...): the group keeps trying after
        ``join_backoff_ms``, so calling ``next()`` again continues. A fatal error
        (FENCED_INSTANCE_ID) closes the group and is raised by every later call.
        """
        if not self._closing.is_set():
            self.start()
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                if self._error is not None:
                    error, self._error = self._error, None
                    raise error
                if self._closing.is_set() or self._exited.is_set():
                    if self._fatal is not None:
                        raise self._fatal
                    raise GroupClosedError(f"group {self._config.group_id!r} is closed")
                if self._slot is not None:
                    gen, self._slot = self._slot, None
                    self._cond.notify_all()
                    return gen
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise TimeoutError(
                        f"no generation of group {self._config.group_id!r} within {timeout} s"
                    )
                self._cond.wait(remaining)

    def close(self, timeout: float | None = None) -> None:
        """End the generation, wait for its routines, leave the group (unless static), stop.

        ``timeout`` bounds the wait for the background thread (None: wait for it).
        Idempotent; ``next()`` raises ``GroupClosedError`` afterwards.
        """
        with self._cond:
            first = not self._closing.is_set()
            self._closing.set()
            gen = self._current
            parked_id = self._member_id if self._in_call else ""
            self._cond.notify_all()
        if gen is not None:
            gen._end(EndReason.CLOSED)
        if first and parked_id:
            # The run thread may be parked in JoinGroup or SyncGroup for up to the rebalance
            # timeout; leaving now removes the member, which answers the parked call at once.
            self._leave(parked_id, "the consumer is closing")
        thread = self._thread
        me = threading.current_thread()
        # From a routine of the generation, waiting would deadlock: the run thread waits for it.
        inside = thread is me or (gen is not None and me in gen._routine_threads())
        if thread is not None and not inside:
            thread.join(timeout)
        if self._owned_client is not None and (thread is None or not thread.is_alive()):
            try:
                self._owned_client.close()
            except Exception:  # closing a broken client must not hide the close itself
                log.debug("closing the Redis client failed", exc_info=True)
            self._owned_client = None

    # -- the run loop

    def _run(self) -> None:
        reason = "joining"
        failures = 0
        try:
            while not self._closing.is_set():
                try:
                    gen = self._join_generation(reason)
                except Exception as exc:  # noqa: BLE001 - every failure has a row in ERROR_POLICY
                    if self._closing.is_set():
                        break
                    failures += 1
                    if not self._react(exc, failures):
                        break
                    reason = f"rejoining after {type(exc).__name__}: {exc}"[:255]
                    continue
                if gen is None:
                    break
                failures = 0
                with self._cond:
                    if self._closing.is_set():
                        gen._end(EndReason.CLOSED)
                    self._current = gen
                self._start_threads(gen)
                self._deliver(gen)
                gen.done.wait()
                self._collect(gen)
                with self._cond:
                    self._current = None
                reason = (gen.end_reason or EndReason.ERROR).value
                reaction = gen._reaction
                if reaction is not None and not self._react(gen._reaction_error, 1, reaction, gen):
                    break
        except BaseException:  # the thread's root: never die silently
            log.exception("consumer group %r stopped on an unexpected error", self._config.group_id)
        finally:
            self._shutdown()

    def _react(
        self,
        error: BaseException | Errors | None,
        failures: int,
        reaction: Reaction | None = None,
        gen: Generation | None = None,
    ) -> bool:
        """Apply an ``ERROR_POLICY`` row after a failed join or an ended generation.

        Returns False when the group must stop (fatal).
        """
        if reaction is None:
            reaction = reaction_for(error) if error is not None else OTHERWISE
        exc = _as_exception(error, gen)
        if reaction.member_id == "leave" and self._member_id:
            self._leave(self._member_id, f"leaving after {exc}"[:255])
        if reaction.member_id in ("reset", "leave"):
            self._member_id = ""
        if reaction.then == "fatal":
            log.error("consumer group %r: fatal error, closing: %s", self._config.group_id, exc)
            with self._cond:
                self._fatal = exc
                self._closing.set()
                self._cond.notify_all()
            return False
        if reaction.then == "backoff":
            log.warning(
                "consumer group %r: %s; joining again in %d ms",
                self._config.group_id,
                exc,
                self._config.join_backoff_ms,
            )
            with self._cond:
                self._error = exc
                self._cond.notify_all()
            self._closing.wait(self._config.join_backoff_ms / 1000)
        elif failures > 1:
            # Immediate rejoins that keep failing still slow down, up to retry_backoff_max_ms.
            cfg = self._config
            pause = min(cfg.retry_backoff_max_ms, cfg.retry_backoff_ms * 2 ** (failures - 2))
            self._closing.wait(pause / 1000)
        return True

    def _shutdown(self) -> None:
        member_id = self._member_id
        if member_id and not self._left and self._config.group_instance_id is None:
            self._leave(member_id, "the consumer is closing")
        with self._cond:
            self._closing.set()
            self._exited.set()
            self._slot = None
            self._cond.notify_all()

    def _leave(self, member_id: str, reason: str) -> None:
        """LeaveGroup, best effort; static members never leave (KIP-345)."""
        if self._config.group_instance_id is not None or self._coordinator is None:
            return
        self._left = True
        try:
            self._coordinator.leave_group(
                self._config.group_id, [MemberIdentity(member_id, reason=reason)]
            )
        except Exception as exc:  # noqa: BLE001 - best effort: the session expires anyway
            log.warning("LeaveGroup for %s failed: %s", member_id, exc)

    # -- one round

    def _join_generation(self, reason: str) -> Generation | None:
        cfg = self._config
        coord = self.coordinator
        metadata = ConsumerProtocolSubscription(cfg.topics).encode()
        protocols = [(a.name, metadata) for a in self._assignors]
        self._left = False
        while True:
            if self._closing.is_set():
                return None
            member_id = self._member_id
            with self._cond:
                self._in_call = True
            try:
                joined = self._retry(
                    functools.partial(
                        coord.join_group,
                        cfg.group_id,
                        member_id,
                        protocol_type=PROTOCOL_TYPE,
                        protocols=protocols,
                        session_timeout_ms=cfg.session_timeout_ms,
                        rebalance_timeout_ms=cfg.rebalance_timeout_ms,
                        group_instance_id=cfg.group_instance_id,
                        client_id=cfg.client_id,
                        reason=reason,
                    ),
                    lambda r: r.error,
                )
            finally:
                with self._cond:
                    self._in_call = False
            if joined.error is Errors.MEMBER_ID_REQUIRED:
                self._member_id = joined.member_id
                continue
            if joined.error is not Errors.NONE:
                raise ProtocolError.of(
                    joined.error, f"JoinGroup of {cfg.group_id!r} failed: {joined.error.name}"
                )
            break
        self._member_id = member_id = joined.member_id
        if self._closing.is_set():
            return None
        log.info(
            "group %r: joined generation %d as %s%s (protocol %s)",
            cfg.group_id,
            joined.generation_id,
            member_id,
            " (leader)" if joined.leader_id == member_id else "",
            joined.protocol_name,
        )
        plan: dict[str, bytes] | None = None
        counts: dict[str, int] | None = None
        if joined.leader_id == member_id and not joined.skip_assignment:
            plan, counts = self._assign(joined)
        with self._cond:
            self._in_call = True
        try:
            synced = self._retry(
                lambda: coord.sync_group(
                    cfg.group_id,
                    joined.generation_id,
                    member_id,
                    assignments=plan,
                    group_instance_id=cfg.group_instance_id,
                    protocol_type=PROTOCOL_TYPE,
                    protocol_name=joined.protocol_name,
                ),
                lambda r: r.error,
            )
        finally:
            with self._cond:
                self._in_call = False
        if synced.error is not Errors.NONE:
            raise ProtocolError.of(
                synced.error,
                f"SyncGroup of {cfg.group_id!r} generation {joined.generation_id} failed: "
                f"{synced.error.name}",
            )
        try:
            assignment = (
                ConsumerProtocolAssignment.decode(synced.assignment)
                if synced.assignment
                else ConsumerProtocolAssignment([])
            )
        except MalformedMetadataError as exc:
            raise MalformedMetadataError(
                f"the leader of {cfg.group_id!r} sent this member an assignment it cannot "
                f"decode: {exc}"
            ) from exc
        offsets, committed = self._start_offsets(list(assignment.partitions))
        gen = Generation(
            group_id=cfg.group_id,
            generation_id=joined.generation_id,
            member_id=member_id,
            leader_id=joined.leader_id,
            protocol_name=joined.protocol_name,
            assignments=offsets,
            committed=committed,
            coordinator=coord,
            group_instance_id=cfg.group_instance_id,
            retention_ms=cfg.retention_ms,
            retry=self._retry,
            on_end=self._notify,
        )
        gen._watch_baseline = counts
        gen._watch_topics = self._topics_to_watch(joined)
        return gen

    def _assign(self, joined: JoinGroupResult) -> tuple[dict[str, bytes], dict[str, int]]:
        """The leader's step: run the selected assignor over every member's subscription."""
        cfg = self._config
        name = joined.protocol_name or ""
        assignor = next((a for a in self._assignors if a.name == name), None)
        if assignor is None:
            raise ProtocolError.of(
                Errors.INCONSISTENT_GROUP_PROTOCOL,
                f"the coordinator selected protocol {name!r}, which this member did not offer "
                f"(offered: {[a.name for a in self._assignors]})",
            )
        subscriptions: dict[str, ConsumerProtocolSubscription] = {}
        for member in joined.members:
            try:
                subscriptions[member.member_id] = ConsumerProtocolSubscription.decode(
                    member.metadata
                )
            except MalformedMetadataError as exc:
                raise MalformedMetadataError(
                    f"member {member.member_id!r} of group {cfg.group_id!r} sent JoinGroup "
                    f"metadata for protocol {name!r} that is not a consumer subscription: {exc}"
                ) from exc
        topics = sorted({t for sub in subscriptions.values() for t in sub.topics})
        counts = self._retry(lambda: self.coordinator.partition_counts(topics), None)
        order = kafka_member_order((m.member_id, m.group_instance_id) for m in joined.members)
        if _takes_member_order(assignor):
            plan = assignor.assign(subscriptions, counts, member_order=order)  # type: ignore[call-arg]
        else:
            plan = assignor.assign(subscriptions, counts)
        log.debug("group %r: %s assignment %s", cfg.group_id, name, plan)
        encoded = {
            mid: ConsumerProtocolAssignment(plan.get(mid, [])).encode() for mid in subscriptions
        }
        return encoded, {t: counts.get(t, 0) for t in topics}

    def _topics_to_watch(self, joined: JoinGroupResult) -> list[str]:
        topics = set(self._config.topics)
        for member in joined.members:
            try:
                topics.update(ConsumerProtocolSubscription.decode(member.metadata).topics)
            except MalformedMetadataError:
                pass
        return sorted(topics)

    def _start_offsets(
        self, partitions: list[TopicPartition]
    ) -> tuple[dict[TopicPartition, int], dict[TopicPartition, int]]:
        """Committed offsets of the assigned partitions, the start-offset policy elsewhere."""
        if not partitions:
            return {}, {}
        cfg = self._config
        coord = self.coordinator
        fetched = self._retry(
            lambda: coord.fetch_offsets(cfg.group_id, partitions), lambda r: r.error
        )
        if fetched.error is not Errors.NONE:
            raise ProtocolError.of(fetched.error, f"OffsetFetch of {cfg.group_id!r} failed")
        offsets: dict[TopicPartition, int] = {}
        committed: dict[TopicPartition, int] = {}
        for tp in partitions:
            found = fetched.offsets.get(tp)
            if found is not None and found.offset >= 0:
                offsets[tp] = committed[tp] = found.offset
                continue
            try:
                start, end = self._retry(
                    functools.partial(coord.log_offsets, tp.topic, tp.partition), None
                )
            except _topics.TopicError as exc:
                log.warning(
                    "no log offsets for %s-%d (%s); starting at 0", tp.topic, tp.partition, exc
                )
                start = end = 0
            offsets[tp] = start if cfg.start_offset == "earliest" else end
        return offsets, committed

    # -- a generation's threads

    def _start_threads(self, gen: Generation) -> None:
        threads = [
            threading.Thread(
                target=self._heartbeat_loop,
                args=(gen,),
                name=f"rcoord-{gen.group_id}-gen{gen.generation_id}-heartbeat",
                daemon=True,
            )
        ]
        if self._config.watch_partition_changes and gen.is_leader:
            threads.append(
                threading.Thread(
                    target=self._watch_partitions,
                    args=(gen,),
                    name=f"rcoord-{gen.group_id}-gen{gen.generation_id}-watcher",
                    daemon=True,
                )
            )
        gen._helpers = threads
        for t in threads:
            t.start()

    def _heartbeat_loop(self, gen: Generation) -> None:
        """Beat every heartbeat interval until the generation's routines have all returned.

        Errors follow ``ERROR_POLICY``: a revoking member (REBALANCE_IN_PROGRESS) keeps beating
        so that its session survives a slow revocation; once the partitions are lost, beating
        is pointless and stops.
        """
        cfg = self._config
        coord = self.coordinator
        interval = cfg.heartbeat_interval_ms / 1000
        while not gen._routines_done.wait(interval):
            try:
                error = self._retry(
                    lambda: coord.heartbeat(
                        gen.group_id, gen.generation_id, gen.member_id, cfg.group_instance_id
                    ),
                    lambda e: e,
                )
            except Exception as exc:  # noqa: BLE001 - ERROR_POLICY decides (OTHERWISE for bugs)
                gen._end(EndReason.of(exc), exc)
                return
            if error is Errors.NONE:
                continue
            gen._end(EndReason.of(error), error)
            if reaction_for(error).lost:
                return

    def _watch_partitions(self, gen: Generation) -> None:
        """The leader's partition watcher: end the generation when a count changes."""
        cfg = self._config
        topics = gen._watch_topics
        baseline = gen._watch_baseline
        interval = cfg.partition_watch_interval_ms / 1000
        coord = self.coordinator
        if baseline is None:
            try:
                baseline = self._counts(coord, topics)
            except RcoordError as exc:
                log.warning("partition watcher: reading partition counts failed: %s", exc)
                baseline = None
        while not gen.done.wait(interval):
            try:
                counts = self._counts(coord, topics)
            except RcoordError as exc:
                log.warning("partition watcher: reading partition counts failed: %s", exc)
                continue
            if baseline is None:
                baseline = counts
            elif counts != baseline:
                log.info(
                    "group %r: partition counts changed %s -> %s; rejoining",
                    cfg.group_id,
                    baseline,
                    counts,
                )
                gen._end(EndReason.PARTITIONS_CHANGED)
                return

    @staticmethod
    def _counts(coord: Coordinator, topics: list[str]) -> dict[str, int]:
        found = coord.partition_counts(topics)
        return {t: found.get(t, 0) for t in topics}

    def _deliver(self, gen: Generation) -> None:
        """Offer ``gen`` to ``next()``; withdraw it if it ends before anyone takes it."""
        with self._cond:
            self._slot = gen
            self._error = None  # superseded: this round succeeded
            self._cond.notify_all()
            while self._slot is gen and not gen.done.is_set():
                self._cond.wait()
            if self._slot is gen:
                self._slot = None

    def _collect(self, gen: Generation) -> None:
        """Wait for every routine of ``gen``, then stop its heartbeat and watcher."""
        warn_after = self._config.rebalance_timeout_ms / 1000
        for thread in gen._seal():
            while not _join(thread, warn_after):
                log.warning(
                    "group %r: a routine of generation %d is still running %.0f s after the "
                    "generation ended; the member cannot rejoin until it returns",
                    self._config.group_id,
                    gen.generation_id,
                    warn_after,
                )
        gen._routines_done.set()
        for thread in gen._helpers:
            thread.join()

    def _notify(self) -> None:
        with self._cond:
            self._cond.notify_all()

    # -- retries

    def _retry(self, call: Callable[[], T], error_of: Callable[[T], Errors] | None) -> T:
        """Run ``call``; retry lost connections and the ``retry`` rows of ``ERROR_POLICY``.

        Pauses grow exponentially with jitter (``retry_backoff_ms`` .. ``retry_backoff_max_ms``)
        and wake early when the group closes. Retries stop one session timeout after the first
        failure; then the last result is returned (or the last exception raised).
        """
        cfg = self._config

        def sleep(seconds: float) -> None:
            self._closing.wait(seconds)

        def retriable(result: T) -> bool:
            return error_of is not None and reaction_for(error_of(result)).retry

        def last_outcome(state: tenacity.RetryCallState) -> T:
            assert state.outcome is not None
            return state.outcome.result()  # type: ignore[no-any-return]

        def before_sleep(state: tenacity.RetryCallState) -> None:
            assert state.outcome is not None
            what = (
                state.outcome.exception()
                if state.outcome.failed
                else (error_of(state.outcome.result()) if error_of else "?")
            )
            log.info(
                "group %r: retrying after %s (attempt %d)", cfg.group_id, what, state.attempt_number
            )

        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception_type(ConnectionLost)
            | tenacity.retry_if_result(retriable),
            # retry_backoff_ms * 2**n, capped, plus up to one retry_backoff_ms of jitter.
            wait=tenacity.wait_exponential(
                multiplier=cfg.retry_backoff_ms / 1000,
                min=cfg.retry_backoff_ms / 1000,
                max=cfg.retry_backoff_max_ms / 1000,
            )
            + tenacity.wait_random(0, cfg.retry_backoff_ms / 1000),
            stop=_StopAfterFailingFor(cfg.session_timeout_ms / 1000)
            | _StopWhenClosing(self._closing),
            sleep=sleep,
            retry_error_callback=last_outcome,
            before_sleep=before_sleep,
        )
        return retrying(call)


def _join(thread: threading.Thread, timeout: float) -> bool:
    thread.join(timeout)
    return not thread.is_alive()


def _as_exception(error: BaseException | Errors | None, gen: Generation | None) -> BaseException:
    if isinstance(error, BaseException):
        return error
    if isinstance(error, Errors):
        where = f" (generation {gen.generation_id})" if gen is not None else ""
        return ProtocolError.of(error, f"the coordinator answered {error.name}{where}")
    return RcoordError("unknown error")


def _takes_member_order(assignor: Assignor) -> bool:
    try:
        return "member_order" in inspect.signature(assignor.assign).parameters
    except (TypeError, ValueError):
        return False
