"""The worker client's exceptions (see the hierarchy in ``rcoord.errors``)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

import redis.exceptions

from ..assignors import CooperativeAssignmentError  # raised by the leader's check
from ..errors import (  # RebalanceInProgressError: commits made during a rebalance raise it
    ConnectionLost,
    Errors,
    ProtocolError,
    RcoordError,
    RebalanceInProgressError,
)
from ..protocol.offsets import TopicPartition

__all__ = [
    "REPLICA_ANSWERS",
    "CommitFailedError",
    "CooperativeAssignmentError",
    "GenerationEndedError",
    "GroupClosedError",
    "IllegalStateError",
    "InvalidAssignmentError",
    "InvalidOffsetError",
    "JoinRefusedError",
    "NoOffsetForPartitionError",
    "OffsetOutOfRangeError",
    "ReadOnlyReplicaError",
    "RebalanceInProgressError",
    "WakeupError",
]


class CommitFailedError(ProtocolError):
    """An offset commit was refused because the group has moved on from this generation.

    ``error`` is the coordinator's code (ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID or
    FENCED_INSTANCE_ID); ``partitions`` maps each refused partition to it. The generation has
    ended; its partitions may already belong to another member, which will process again the
    records since the last successful commit.

    A commit refused only because the group is in the middle of a rebalance this member takes
    part in raises ``RebalanceInProgressError`` instead (``rcoord.errors``; not a subclass of
    this one), as Kafka's consumer raises ``RebalanceInProgressException`` rather than
    ``CommitFailedException``: nothing says the partitions are gone, so ``poll()`` (which
    completes the rebalance) and a commit of the partitions still assigned may follow.
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


class JoinRefusedError(ProtocolError):
    """The coordinator refused JoinGroup for a reason no retry can mend: a setting of this
    member or of the namespace has to change first (INVALID_SESSION_TIMEOUT,
    INCONSISTENT_GROUP_PROTOCOL, GROUP_MAX_SIZE_REACHED, INVALID_GROUP_ID,
    GROUP_AUTHORIZATION_FAILED). As in Kafka, which raises these from ``poll()`` as fatal
    exceptions (``InvalidSessionTimeoutException``, ``GroupMaxSizeReachedException``, ...), it
    closes the group: ``ConsumerGroup.next()`` and ``Consumer.poll()`` raise it from then on.
    ``error`` is the code; ``hint`` says which setting to change ("" if there is nothing to
    add to the code)."""

    def __init__(self, message: str = "", error: Errors | None = None, hint: str = "") -> None:
        super().__init__(message, error)
        self.hint = hint

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.error, self.hint))


REPLICA_ANSWERS = (redis.exceptions.ReadOnlyError, redis.exceptions.MasterDownError)
"""The redis-py errors only a replica answers: READONLY (a write refused), and MASTERDOWN
(anything refused by a replica whose link to its master is down, with
``replica-serve-stale-data no``). Met for longer than a failover takes, they mean the client
was given a replica's URL (``ReadOnlyReplicaError``; ``rcoord.cli.explain``)."""


class ReadOnlyReplicaError(RcoordError):
    """Redis answered READONLY to every JoinGroup (or every start of the coordinator, which
    stores a new namespace's settings) for the client's whole retry bound (one session
    timeout): the client is connected to a read-only replica, by a URL that names one
    or a master that a failover demoted with no new master at that address since. It closes
    the group (``ConsumerGroup.next()`` and ``Consumer.poll()`` raise it), as a refused
    setting does: a failover in progress is over well within a session timeout, a URL naming a
    replica never mends, and a member that took it for a failover joined again every
    ``join_backoff_ms`` for ever, reading nothing (``rcoord topics consume --group`` said
    "waiting to join" until killed). The replica's error is its ``__cause__``; connect the
    client to the master. ``Consumer.committed()``, ``assign()`` and ``commit()`` raise it
    too when a replica's answer lasts their own retry bound (their ``timeout``, or one session
    timeout): the committed offsets are read by a function that may write (it applies the
    group's passed deadlines), which a replica refuses (and the log reads, on a replica that
    answers MASTERDOWN); the consumer is left as it was."""


def replica_answer(exc: BaseException) -> BaseException | None:
    """The redis-py error behind ``exc`` if it is one only a replica answers (None if not):
    READONLY (a write refused), or MASTERDOWN (anything refused by a replica whose link to its
    master is down, with ``replica-serve-stale-data no``; rcoord raises it as a
    ``ConnectionLost``, as it does every redis-py ``ClusterError``)."""
    cause = exc.__cause__ if isinstance(exc, ConnectionLost) else None
    return cause if isinstance(cause, REPLICA_ANSWERS) else None


def session_bound(session_timeout_ms: int) -> str:
    """The retry bound of a call under ``call_with_retries`` (one session timeout), as
    ``replica_refusal`` and ``refused_by_replica`` name it."""
    return f"{session_timeout_ms} ms (session_timeout_ms, the client's retry bound)"


def replica_refusal(exc: BaseException, group_id: str, call: str,
                    bound: str) -> ReadOnlyReplicaError | None:
    """``ReadOnlyReplicaError`` if ``exc``, the error a call raised after its retries (for
    ``bound``, e.g. "45000 ms (session_timeout_ms, the client's retry bound)"), is a replica's
    answer (``replica_answer``), else None. Its ``__cause__`` is the replica's error."""
    cause = replica_answer(exc)
    if cause is None:
        return None
    code = "READONLY" if isinstance(cause, redis.exceptions.ReadOnlyError) else "MASTERDOWN"
    refused = ReadOnlyReplicaError(
        f"group {group_id!r}: Redis answered {code} to {call} for {bound}: the client is "
        f"connected to a read-only replica (a URL that names a replica, or a master a failover "
        f"demoted); give it the URL of the master ({' '.join(str(cause).split())})")
    refused.__cause__ = cause
    return refused


@contextlib.contextmanager
def refused_by_replica(group_id: str, bound: str) -> Iterator[None]:
    """Within this block, a ``ConnectionLost`` that is a replica's answer (``replica_answer``)
    is raised as ``ReadOnlyReplicaError`` (``replica_refusal``; the call named is the rcoord
    function that met it). For a call made under ``call_with_retries``, whose error has lasted
    ``bound``: the offset queries, ``assign()`` and its commits raised ``ServerUnavailable``
    "Redis cannot run this now; try again" at the end of their retries, where the group's
    joins say to give the master's URL."""
    try:
        yield
    except ConnectionLost as exc:
        refused = replica_refusal(exc, group_id, str(exc).split(":", 1)[0], bound)
        if refused is None:
            raise
        raise refused from refused.__cause__


class GroupClosedError(RcoordError):
    """The group was closed (by ``close()``, or by a fatal error): no more generations."""


class GenerationEndedError(RcoordError):
    """``Generation.start`` was called after the generation's routines were collected."""


class InvalidAssignmentError(RcoordError):
    """The leader's assignor gave partitions to an id that is not a member of the group, or a
    partition its topic does not have: raised on the leader before SyncGroup, so nothing is
    handed out (synced, the partitions went to no one, or the member started a partition that
    does not exist at offset 0). Or it gave a ``ConsumerGroup`` member a topic the member does
    not subscribe to: raised by ``next()``, the generation withdrawn (its routines consumed
    it). ``member_id`` is the id given them; ``partitions`` lists the offending ones, sorted."""

    def __init__(self, message: str, member_id: str, partitions: list[TopicPartition]) -> None:
        super().__init__(message)
        self.member_id = member_id
        self.partitions = sorted(partitions)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.member_id, self.partitions))


class InvalidOffsetError(RcoordError):
    """Assigned partitions have no position to read from and ``start_offset="none"`` forbids
    guessing one (Kafka's ``InvalidOffsetException``). ``partitions`` lists them; the
    consumer goes on raising this from ``poll()`` until each is given a position with
    ``seek``, ``seek_to_beginning`` or ``seek_to_end``."""

    def __init__(self, message: str, partitions: list[TopicPartition]) -> None:
        super().__init__(message)
        self.partitions = sorted(partitions)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.partitions))


class NoOffsetForPartitionError(InvalidOffsetError):
    """No offset was ever committed for these partitions (Kafka's
    ``NoOffsetForPartitionException``)."""


class OffsetOutOfRangeError(InvalidOffsetError):
    """The positions of these partitions fell out of their logs: records were deleted by
    retention, or the topic was created again (Kafka's ``OffsetOutOfRangeException``).
    ``offsets`` maps each partition to the position that is out of range."""

    def __init__(self, message: str, offsets: Mapping[TopicPartition, int]) -> None:
        super().__init__(message, list(offsets))
        self.offsets = dict(offsets)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.offsets))


class WakeupError(RcoordError):
    """``Consumer.wakeup()`` was called: the ``poll()`` or ``commit()`` it interrupted, or
    else the next call that would block on Redis (``poll()``, ``commit()``, ``committed()``,
    ``position()``, ``beginning_offsets()``, ``end_offsets()``, ``offsets_for_times()``),
    raises this once (Kafka's ``WakeupException``). The consumer is unchanged; the poll loop
    usually commits and closes next."""


class IllegalStateError(RcoordError):
    """A call that the consumer's current state does not allow (Kafka's
    ``IllegalStateException``): seeking or pausing a partition that is not assigned, or mixing
    ``subscribe`` and ``assign`` on one consumer. The message says which state and what to do."""


class ConcurrentModificationError(IllegalStateError):
    """A second thread called a ``Consumer`` while another was inside one of its calls (Kafka's
    ``ConcurrentModificationException``). Two threads polling one consumer would each be handed
    records, and each auto-commit would commit past the records the other has not processed.
    ``close()`` and ``wakeup()`` may come from another thread; everything else from one."""
