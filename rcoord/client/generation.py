"""``Generation``: one generation of the group as this member sees it, the user's handle.

kafka-go's ``Generation``: it carries the fencing pair (member id, generation id) into every
``commit_offsets``, runs routines bound to it with ``start(fn)`` (each gets a
``GenerationContext``), and records why it ended (``EndReason``) and how (``ERROR_POLICY``).
``ConsumerGroup`` creates generations and collects their routines; see ``rcoord.client.group``.
"""

from __future__ import annotations

import enum
import logging
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import ConnectionLost, Errors, ProtocolError, RebalanceInProgressError
from ..protocol.offsets import OffsetAndMetadata, TopicPartition
from .coordinator import Coordinator
from .errors import (
    CommitFailedError,
    GenerationEndedError,
    refused_by_replica,
    session_bound,
)
from .policy import Reaction, combine, outranks, reaction_for

__all__ = [
    "EndReason",
    "Generation",
    "GenerationContext",
    "PartitionAssignment",
    "commit_offsets_arg",
]

log = logging.getLogger("rcoord.client")

_COMMIT_FENCED = (
    Errors.UNKNOWN_MEMBER_ID,
    Errors.ILLEGAL_GENERATION,
    Errors.FENCED_INSTANCE_ID,
    Errors.GROUP_ID_NOT_FOUND,
    Errors.REBALANCE_IN_PROGRESS,
)

_COMMIT_WHY = {
    Errors.UNKNOWN_MEMBER_ID: "the coordinator no longer knows member {member} (its session "
    "expired, it missed the rebalance timeout, or it left)",
    Errors.ILLEGAL_GENERATION: "generation {gen} is over: the group has moved to a newer generation",
    Errors.FENCED_INSTANCE_ID: "another process took over group instance id {iid}",
    # (OffsetCommit v9's answer for a group deleted since: its member expired, then the Empty
    # group was deleted or its offsets expired. Kafka's classic member gets ILLEGAL_GENERATION
    # there; it was "anything else", a ProtocolError that left the generation running.)
    Errors.GROUP_ID_NOT_FOUND: "the group was deleted since generation {gen} began (its members "
    "had left or expired)",
}


def commit_offsets_arg(
    offsets: Mapping[Any, int | OffsetAndMetadata],
) -> dict[TopicPartition, int | OffsetAndMetadata]:
    """``offsets`` of a commit, keyed by ``TopicPartition``, checked before anything is sent.

    An offset is the next one to read, so it is never negative: Kafka's client refuses one
    when the ``OffsetAndMetadata`` is built ("Invalid negative offset"). The coordinator stores
    any int64 (Kafka's broker does too), so without this check a -5 was committed, read back as
    a position outside the log and silently reset by the next owner.
    """
    out: dict[TopicPartition, int | OffsetAndMetadata] = {}
    for tp, off in offsets.items():
        if not isinstance(tp, tuple) or len(tp) != 2:
            raise TypeError(f"commit offsets must be keyed by TopicPartition(topic, partition), "
                            f"got {tp!r}")
        key = TopicPartition(tp[0], tp[1])
        value = off.offset if isinstance(off, OffsetAndMetadata) else off
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"offset for {key.topic}-{key.partition} must be an int or an "
                            f"OffsetAndMetadata, got {off!r}")
        if value < 0:
            raise ValueError(f"offset for {key.topic}-{key.partition} must be >= 0 (the next "
                             f"offset to read), got {value}")
        out[key] = off
    return out


def _name_of(fn: Callable[..., Any]) -> str:
    """A routine's function as a log line names it (a lambda's is where it was written)."""
    name = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    code = getattr(fn, "__code__", None)
    return name if code is None else f"{name} at {code.co_filename}:{code.co_firstlineno}"


class EndReason(enum.Enum):
    """Why a generation ended."""

    REBALANCE = "the coordinator started a rebalance"
    MEMBER_LOST = "the coordinator no longer counts this member in the generation"
    COORDINATOR_UNREACHABLE = "the coordinator could not be reached for a session timeout"
    PARTITIONS_CHANGED = "the partition count of a subscribed topic changed"
    SUBSCRIPTION_CHANGED = (
        "the subscription changed: subscribe() named other topics, or the topics its pattern "
        "matches changed"
    )
    ROUTINE_FAILED = "a routine started with Generation.start() raised"
    PARTITIONS_REVOKED = (
        "the cooperative assignment revoked partitions; rejoining so their new owners get them"
    )
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
            here start at the ``start_offset`` policy (at -1, no position, under "none").
        done: set when the generation ends; see ``end_reason`` and ``lost``.
        exceptions: what routines started with ``start`` raised.
        owned_before: the partitions this member reported as owned in the JoinGroup of this
            generation (always empty under the eager protocol, which revokes everything first).
        added, revoked: ``partitions - owned_before`` and ``owned_before - partitions``, sorted
            (KIP-429). Under the cooperative protocol a non-empty ``revoked`` means the member
            rejoins at once, once it has stopped them, so their new owners get them.
        carried: set once the generation has ended, if its partitions are carried through the
            next rejoin (cooperative protocol, not lost, not closing) rather than given up.
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
        owned_before: Sequence[TopicPartition] = (),
        session_from: float | None = None,
        session_timeout_ms: int | None = None,
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
        mine, before = set(assignments), {TopicPartition(*tp) for tp in owned_before}
        self.owned_before: list[TopicPartition] = sorted(before)
        self.added: list[TopicPartition] = sorted(mine - before)
        self.revoked: list[TopicPartition] = sorted(before - mine)
        self.done = threading.Event()
        self.exceptions: list[BaseException] = []
        self._coordinator = coordinator
        self._instance_id = group_instance_id
        self._retention_ms = retention_ms
        # How long ``retry`` retries a commit, for the ``ReadOnlyReplicaError`` it ends with.
        self._retry_bound = ("the client's retry bound" if session_timeout_ms is None else
                             session_bound(session_timeout_ms))
        self._retry = retry or (lambda call, error_of: call())
        self._on_end = on_end
        self._lock = threading.Lock()
        # When (time.monotonic) the coordinator last refreshed this member's session, as far as
        # the member can tell, never later than it did: the sending of the SyncGroup that made
        # the generation (plus the server's time it was parked, join_generation), then of each
        # heartbeat answered (heartbeat_answered).
        self._session_from = time.monotonic() if session_from is None else session_from
        self._threads: list[threading.Thread] = []
        self._routine_names: dict[threading.Thread, str] = {}  # for the warning of collect
        self._sealed = False
        self._end_reason: EndReason | None = None
        self._end_error: BaseException | Errors | None = None
        self._reaction: Reaction | None = None
        self._reaction_error: BaseException | Errors | None = None
        self._lost = False
        self._left = False  # the member left the group on its own (poll timeout): _mark_lost
        self._left_behind = False  # collect went on without a helper stuck in a call
        # Set once every routine has returned: the heartbeat and the watcher stop then.
        self._routines_done = threading.Event()
        self._helpers: list[threading.Thread] = []  # the heartbeat and the watcher
        self._watch_topics: list[str] = []
        self._watch_baseline: dict[str, int] | None = None  # the counts the leader assigned
        # A pattern subscription: the pattern, and the topics it matched when this member joined.
        self._watch_pattern: re.Pattern[str] | None = None
        self._watch_matched: tuple[str, ...] = ()
        # Cooperative protocol: once ended, the group decides (once) whether the partitions are
        # carried through the rejoin; the holder acknowledges that it holds exactly them.
        self._decided = threading.Event()
        self._carried = False
        self._acknowledged = threading.Event()

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
    def left_behind(self) -> bool:
        """Whether ``collect`` went on without a helper still in a call (``helper_wait_s``)."""
        return self._left_behind

    @property
    def lost(self) -> bool:
        """True if the partitions were lost rather than revoked (see ``ERROR_POLICY``)."""
        return self._lost

    @property
    def carried(self) -> bool:
        """True once the generation has ended and its partitions are kept through the rejoin
        (cooperative protocol); until the group has decided, False."""
        return self._decided.is_set() and self._carried

    def wait_decided(self, timeout: float | None = None) -> bool:
        """Wait until the group has decided how this ended generation's partitions end
        (carried or given up); True if it has."""
        return self._decided.wait(timeout)

    def acknowledge(self) -> None:
        """Tell the group that the caller now holds exactly this generation's partitions.

        Under the cooperative protocol the member reports the partitions of the last
        acknowledged generation as owned when it rejoins; reporting fewer than it consumes would
        let the assignor give one of them to another member. ``ConsumerGroup`` acknowledges a
        generation itself unless it was created with ``acknowledge="by_caller"`` (``Consumer``).
        """
        self._acknowledged.set()

    @property
    def acknowledged(self) -> bool:
        return self._acknowledged.is_set()

    def wait_acknowledged(self, timeout: float | None = None) -> bool:
        return self._acknowledged.wait(timeout)

    def request_rejoin(self) -> None:
        """End the generation so the member rejoins (cooperative: after revoking partitions)."""
        self._end(EndReason.PARTITIONS_REVOKED)

    # -- routines

    def start(self, fn: Callable[[GenerationContext], Any]) -> None:
        """Run ``fn(ctx)`` in a thread bound to this generation.

        The group starts the next generation only after every such thread has returned, so
        ``fn`` must return soon after ``ctx.done`` is set. If ``fn`` raises, the exception is
        logged and kept in ``exceptions``, and the generation ends (the member rejoins).
        Raises ``GenerationEndedError`` if the generation's routines were already collected,
        and ``RuntimeError`` if the thread cannot be started (the process's thread limit); a
        routine that never started is not waited for.
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
            # Started before it is recorded: one that cannot start (RuntimeError) would make
            # ``collect`` join a thread never started, which raises on the group's run thread.
            thread.start()
            self._threads.append(thread)
            self._routine_names[thread] = f"{thread.name} ({_name_of(fn)})"

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
        to the next offset to read (``ValueError`` if negative, checked before anything is sent).
        Raises ``CommitFailedError`` if the group has rebalanced since this generation started
        (and ends the generation, per ``ERROR_POLICY``), ``ConnectionLost`` if Redis stayed
        unreachable, ``ReadOnlyReplicaError`` if it answered as a replica (READONLY,
        MASTERDOWN) for the whole retry bound, and ``ProtocolError`` for other codes.

        ``RebalanceInProgressError`` instead when the refusal only says that the group is
        rebalancing with this member in it: REBALANCE_IN_PROGRESS (the group is between
        JoinGroup and SyncGroup), or ILLEGAL_GENERATION for a generation ``carried`` through
        the member's rejoin (the coordinator knows the member, which has joined the next
        generation and still owns the partitions). As Kafka's ``OffsetCommitResponseHandler``,
        which raises ``RebalanceInProgressException`` for both (and ``CommitFailedException``
        only when the member must reset its generation): the partitions are not lost, and the
        commit can be made again once the rebalance has completed.
        """
        prepared = commit_offsets_arg(offsets)
        if not prepared:
            return
        if self._left:
            # As Kafka's consumer, whose commit fails at once once a poll timeout has reset its
            # generation: a static member sends no LeaveGroup, so the coordinator, which still
            # knows it until its session expires, would take the commit of partitions given up.
            raise CommitFailedError(
                f"commit of generation {self.generation_id} refused: this member left the "
                "group (max_poll_interval_ms passed between polls), so its partitions may "
                "belong to another member now. Poll again to rejoin, then continue from the "
                "committed offsets.", Errors.UNKNOWN_MEMBER_ID)

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

        # A replica's answer (READONLY: a master demoted mid-generation) that lasted the
        # retries says to give the master's URL, as Consumer.commit() and the joins do; it
        # was ServerUnavailable "try again", which no retry mends.
        with refused_by_replica(self.group_id, self._retry_bound):
            result = self._retry(call, error_of)
        failed = {tp: e for tp, e in result.items() if e is not Errors.NONE}
        if not failed:
            return
        codes = set(failed.values())
        fenced = next((c for c in _COMMIT_FENCED if c in codes), None)
        if fenced is not None:
            rebalancing = fenced is Errors.REBALANCE_IN_PROGRESS or (
                fenced is Errors.ILLEGAL_GENERATION and self.carried)
            self._end(EndReason.of(fenced), fenced)
            if rebalancing:
                raise RebalanceInProgressError(
                    f"commit of generation {self.generation_id} refused ({fenced.name}): the "
                    "group is in the middle of a rebalance this member takes part in, so "
                    "nothing was committed; the partitions are not lost. Complete the "
                    "rebalance (Consumer.poll(), or take the next generation), then commit "
                    "again the partitions still assigned.",
                    fenced,
                )
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

    # -- the group's side (internal to rcoord.client)
    #
    # ``ConsumerGroup`` and its helper threads drive a generation through these methods, so
    # every field of a Generation is written only here.

    def watch(
        self,
        *,
        topics: Sequence[str],
        baseline: Mapping[str, int] | None,
        pattern: re.Pattern[str] | None,
        matched: Sequence[str],
    ) -> None:
        """Record what the watcher compares against: the topics whose partition counts it
        watches and the counts the leader assigned from, and a pattern subscription's pattern
        with the topics it matched at the join."""
        self._watch_topics = list(topics)
        self._watch_baseline = dict(baseline) if baseline is not None else None
        self._watch_pattern = pattern
        self._watch_matched = tuple(matched)

    @property
    def watched_topics(self) -> list[str]:
        return list(self._watch_topics)

    @property
    def watched_baseline(self) -> dict[str, int] | None:
        return dict(self._watch_baseline) if self._watch_baseline is not None else None

    @property
    def watched_pattern(self) -> re.Pattern[str] | None:
        return self._watch_pattern

    @property
    def watched_matched(self) -> tuple[str, ...]:
        return tuple(self._watch_matched)

    def start_helper(self, target: Callable[[], None], kind: str) -> None:
        """Run ``target`` in a background thread of this generation (the heartbeat, the
        watcher); ``collect`` joins it after the routines have returned.

        A thread that cannot be started (the process's thread limit) ends the generation with
        that error (``ERROR_POLICY``'s "anything else": without its heartbeat the member cannot
        keep its session, so it leaves and joins again after ``join_backoff_ms``, and
        ``next()`` reports the error); it is not recorded, so ``collect`` does not join it."""
        thread = threading.Thread(
            target=target,
            name=f"rcoord-{self.group_id}-gen{self.generation_id}-{kind}",
            daemon=True,
        )
        try:
            thread.start()
        except RuntimeError as exc:
            log.error("group %r: cannot start the %s thread of generation %d: %s",
                      self.group_id, kind, self.generation_id, exc)
            self._end(EndReason.ERROR, exc)
            return
        with self._lock:
            self._helpers.append(thread)

    def heartbeat_answered(self, sent_at: float) -> None:
        """A heartbeat sent at ``sent_at`` (``time.monotonic``) was answered with the session
        refreshed (``watch_session`` counts the session from the latest)."""
        with self._lock:
            self._session_from = max(self._session_from, sent_at)

    def session_left(self, session_timeout_s: float) -> float:
        """Seconds until the session, counted from its last refresh this member knows of, ends."""
        with self._lock:
            since = self._session_from
        return since + session_timeout_s - time.monotonic()

    def _session_expired(self, session_timeout_ms: int) -> None:
        """No heartbeat was answered for a session timeout: the coordinator has removed this
        member, or will as soon as it can write (Redis unreachable, or refusing writes under
        NOREPLICAS or MISCONF: the message said "has removed" then too), and another member
        may be given its partitions. They are lost
        now, so nothing more of them is handed out, as kafka-go ends a generation on a failed
        heartbeat; waiting for the heartbeat's own retries to give up took their socket
        timeouts (about 30 s)."""
        with self._lock:
            self._lost = True
        self._end(EndReason.COORDINATOR_UNREACHABLE, ConnectionLost(
            f"group {self.group_id!r}: no heartbeat answered for session_timeout_ms "
            f"({session_timeout_ms} ms): the coordinator removes member {self.member_id} as "
            "its session passed (if Redis is unreachable or refuses writes now, once it takes "
            "them again), and its partitions may have other owners"))

    def wait_routines(self, timeout: float | None = None) -> bool:
        """Wait until ``collect`` has seen every routine return; True if it has (the heartbeat
        beats until then, so the session survives a slow revocation)."""
        return self._routines_done.wait(timeout)

    def is_routine_thread(self, thread: threading.Thread) -> bool:
        """True if ``thread`` runs a routine of this generation (waiting for the group from
        there would deadlock)."""
        with self._lock:
            return thread in self._threads

    def collect(
        self,
        warn_after: float,
        on_stuck: Callable[[list[str]], None] | None = None,
        helper_wait_s: float | None = None,
    ) -> None:
        """Refuse new routines, wait for every routine (logging every ``warn_after`` seconds
        while one still runs), then stop and join the helper threads (not those of a lost
        generation, which act on nothing once it is collected).

        With ``helper_wait_s``, a helper still running that long after the routines returned
        (a heartbeat or watcher stuck in a call) is left behind: ``left_behind`` is set, and
        its late answer acts on nothing (``heartbeat._abandoned``). Joined without a bound, a
        heartbeat stuck in a call on a generation that ended on the member's side (new
        partitions, a routine that raised, ``resubscribe()``) held back the rejoin for as long
        as the call lasted; joined until the session passed, the wait itself let the session
        expire (the heartbeat beats no more once the routines returned), and a cooperative
        member gave up the partitions it would have carried. Kafka's rebalance never waits for
        a heartbeat in flight.

        Routines still running ``warn_after`` seconds (the rebalance timeout) after the wait
        began are passed, by name, to ``on_stuck``, once: a routine that ignores ``ctx.done``
        would otherwise keep the member in the group for ever when the coordinator is not
        rebalancing (the generation ended on the member's side: new partitions, a routine that
        raised, ``resubscribe()``, ``close()``), its heartbeat answered NONE at every beat.
        """
        with self._lock:
            self._sealed = True
            routines = list(self._threads)
        deadline = time.monotonic() + warn_after
        for thread in routines:
            thread.join(max(0.0, deadline - time.monotonic()))
        stuck = [thread for thread in routines if thread.is_alive()]
        if stuck and on_stuck is not None:
            with self._lock:
                names = [self._routine_names[thread] for thread in stuck]
            on_stuck(names)
        for thread in stuck:
            thread.join(warn_after)
            while thread.is_alive():
                log.warning(
                    "group %r: a routine of generation %d is still running %.0f s after the "
                    "generation ended; the member cannot rejoin until it returns",
                    self.group_id,
                    self.generation_id,
                    warn_after,
                )
                thread.join(warn_after)
        self._routines_done.set()
        with self._lock:
            # Those of a lost generation are left behind (its heartbeat stops at its next
            # attempt, heartbeat._abandoned): joined, a heartbeat stuck in a call (a
            # black-holed connection, a client without socket_timeout) held back the rejoin
            # of a member whose session was already over, for as long as the call lasted.
            helpers = [] if self._lost else list(self._helpers)
        until = None if helper_wait_s is None else time.monotonic() + helper_wait_s
        for thread in helpers:
            thread.join(None if until is None else max(0.0, until - time.monotonic()))
        stuck_helpers = [thread.name for thread in helpers if thread.is_alive()]
        if stuck_helpers:
            with self._lock:
                self._left_behind = True
            log.warning("group %r: %s of generation %d still in a call %.1f s after its "
                        "routines returned; rejoining without it (its answer will act on "
                        "nothing)", self.group_id, ", ".join(stuck_helpers),
                        self.generation_id, helper_wait_s)

    @property
    def pending_reaction(self) -> tuple[Reaction, BaseException | Errors | None] | None:
        """What the errors that ended this generation call for (their ``ERROR_POLICY`` rows,
        combined), with the most severe one's error; None if no error did."""
        with self._lock:
            if self._reaction is None:
                return None
            return self._reaction, self._reaction_error

    # -- ending (internal)

    def _end(self, reason: EndReason, error: BaseException | Errors | None = None) -> None:
        """End the generation; an error also applies its ``ERROR_POLICY`` row."""
        reaction = reaction_for(error) if error is not None else None
        with self._lock:
            if self._decided.is_set() and self._carried:
                # The partitions were carried into the next rejoin. A commit refused now only says that the group has moved on;
                # a real loss shows in the rejoin (UNKNOWN_MEMBER_ID) and ends the holder there.
                reaction = None
            if self._end_reason is None:
                self._end_reason = reason
                self._end_error = error
            if reaction is not None:
                if reaction.lost:
                    self._lost = True
                # Both rows apply (policy.combine); the more severe one's error is reported.
                if self._reaction is None:
                    self._reaction, self._reaction_error = reaction, error
                else:
                    if outranks(reaction, self._reaction):
                        self._reaction_error = error
                    self._reaction = combine(self._reaction, reaction)
        already = self.done.is_set()
        self.done.set()
        if not already and self._on_end is not None:
            self._on_end()

    def _decide(self, may_carry: bool) -> bool:
        """Decide once, after the end, whether the partitions are carried (not lost, not closed)."""
        with self._lock:
            if not self._decided.is_set():
                self._carried = (
                    may_carry and not self._lost and self._end_reason is not EndReason.CLOSED
                )
                self._decided.set()
            return self._carried

    def _mark_lost(self, left: bool = False) -> None:
        """The carried partitions turned out lost (the rejoin failed with a lost reaction), or
        the member ``left`` the group on its own; its commits are refused from then on."""
        with self._lock:
            self._lost = True
            self._left = self._left or left
        self._end(EndReason.MEMBER_LOST)
