"""A generation's background threads: the heartbeat and the watcher.

``start_helpers`` starts them (as the generation's helper threads, which ``Generation.collect``
joins) when a generation is handed out; they end the generation
(``Generation._end``) when the coordinator, the partition counts or the topics a pattern matches
say so, and stop once its routines have returned (the heartbeat) or it has ended (the watcher).

The watcher runs on the leader (partition counts of every topic the group subscribes to, as
Kafka's leader compares its metadata snapshot with the one it assigned from) and on every member
that subscribes by pattern (the topics its pattern matches against the set it joined with, as
Kafka's consumer rejoins when its pattern subscription changed since the last join). A
follower's changed subscription makes the coordinator rebalance the group, so a topic that only
a follower's pattern matches is picked up too.

Before the generation exists, from the JoinGroup answer until its helpers start, ``JoinBeats``
beats instead (``join_generation``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Self, TypeVar

from ..errors import Errors, ProtocolError, RcoordError
from .config import ConsumerGroupConfig
from .coordinator import Coordinator
from .generation import EndReason, Generation
from .join import topics_matching
from .policy import reaction_for
from .retry import Retry

__all__ = ["JoinBeats", "heartbeat_loop", "start_helpers", "watch_partitions", "watch_session"]

log = logging.getLogger("rcoord.client")

T = TypeVar("T")

REFRESHED = (Errors.NONE, Errors.REBALANCE_IN_PROGRESS)
"""Heartbeat answers that refreshed the member's session (heartbeat.lua)."""

_OUT_OF_GENERATION = (
    Errors.UNKNOWN_MEMBER_ID, Errors.ILLEGAL_GENERATION, Errors.FENCED_INSTANCE_ID)


def start_helpers(
    gen: Generation, coordinator: Coordinator, config: ConsumerGroupConfig, retry: Retry
) -> None:
    """Start the heartbeat (and the partition watcher, on the leader or under a pattern
    subscription) of ``gen`` as its helper threads; ``Generation.collect`` joins them."""
    gen.start_helper(lambda: heartbeat_loop(gen, coordinator, config, retry), "heartbeat")
    gen.start_helper(lambda: watch_session(gen, config), "session")
    if (config.watch_partition_changes and gen.is_leader) or gen.watched_pattern is not None:
        gen.start_helper(lambda: watch_partitions(gen, coordinator, config), "watcher")


def heartbeat_loop(
    gen: Generation, coordinator: Coordinator, config: ConsumerGroupConfig, retry: Retry
) -> None:
    """Beat every heartbeat interval until the generation's routines have all returned.

    Errors follow ``ERROR_POLICY``: a revoking member (REBALANCE_IN_PROGRESS) keeps beating
    so that its session survives a slow revocation; once the partitions are lost, beating
    is pointless and stops.
    """
    cfg = config
    coord = coordinator
    interval = cfg.heartbeat_interval_ms / 1000
    sent = [0.0]

    def beat() -> Errors:
        if _abandoned(gen):
            raise _Abandoned  # ends the retries: nothing is left to keep alive
        sent[0] = time.monotonic()  # (of this attempt: retries resend)
        return coord.heartbeat(
            gen.group_id, gen.generation_id, gen.member_id, cfg.group_instance_id)

    while not gen.wait_routines(interval):
        if gen.lost:
            # Lost from the client's side too (the poll timer left the group): a static member,
            # which sends no LeaveGroup, must stop beating so its session ends and the others
            # get its partitions, as Kafka's heartbeat thread stops once the generation is reset.
            return
        try:
            error = retry(beat, lambda e: e)
        except _Abandoned:
            return
        except Exception as exc:  # noqa: BLE001 - ERROR_POLICY decides (OTHERWISE for bugs)
            if not _abandoned(gen):
                gen._end(EndReason.of(exc), exc)
            return
        if _abandoned(gen):
            return  # a late answer: the group has moved on without this generation
        if error in REFRESHED:
            gen.heartbeat_answered(sent[0])
        if error is Errors.NONE:
            continue
        gen._end(EndReason.of(error), error)
        if reaction_for(error).lost:
            return


class _Abandoned(Exception):
    """A heartbeat retry of an abandoned generation (``_abandoned``): the retries end."""


def _abandoned(gen: Generation) -> bool:
    """Whether ``collect`` has left ``gen``'s helpers behind: it is lost and its routines have
    returned, or it went on without a helper stuck in a call (``left_behind``), so the member
    rejoins without waiting for them. Its heartbeat's retries went on for up to a session
    timeout after a call returned, for a session already over, and a late answer must not act
    on what the group does next."""
    return (gen.lost and gen.wait_routines(0)) or gen.left_behind


class JoinBeats:
    """The member's heartbeats from its JoinGroup answer until its generation's own start.

    The coordinator counts the session from the join's completion (and from the SyncGroup's
    arrival), but the generation, whose heartbeat thread keeps the session alive, exists only
    once the leader has read the partition counts and racks and run its assignor, SyncGroup has
    answered, and the start offsets are read (OffsetFetch, log offsets): steps that each may
    take a while. A member slower than the session timeout there was removed, so the leader's
    SyncGroup answered UNKNOWN_MEMBER_ID (and the next round was as slow), or the new generation
    was lost at once. Kafka's heartbeat thread is enabled from COMPLETING_REBALANCE on
    (``AbstractCoordinator``), and its coordinator answers NONE and refreshes the session in
    CompletingRebalance and Stable (heartbeat.lua too), so its member heartbeats while it fetches
    its committed offsets; its leader assigns from the metadata it already holds, while rcoord's
    reads it from Redis here.

    Beats every ``heartbeat_interval_ms`` on a thread of its own, one attempt each (a lost
    connection or a retriable code waits for the next beat; the calls around it have their own
    retries). ``check`` (before SyncGroup) raises the error of a heartbeat that said the member
    is out of this generation (UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION, FENCED_INSTANCE_ID), so
    the round ends without a SyncGroup, as Kafka's member resets its generation on such an
    answer; other codes are left to the SyncGroup (Kafka's member ignores REBALANCE_IN_PROGRESS
    in COMPLETING_REBALANCE). ``hand_over`` gives the generation the latest refresh
    (``Generation.heartbeat_answered``) and ends it by the error seen, REBALANCE_IN_PROGRESS
    included, as its heartbeat thread would have, and stops; an answer that the member is out
    (the beats stop at it) replaces an earlier REBALANCE_IN_PROGRESS, for ``check`` too.
    Leaving the ``with`` block stops the beats too; a beat in flight is not waited for.
    """

    def __init__(self, coordinator: Coordinator, config: ConsumerGroupConfig,
                 generation_id: int, member_id: str) -> None:
        self._coordinator = coordinator
        self._config = config
        self._generation_id = generation_id
        self._member_id = member_id
        self._lock = threading.Lock()
        self._answered: float | None = None  # the sending of the latest beat that refreshed
        self._error: Errors | None = None  # the worst answer but NONE and retriable codes
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, daemon=True,
            name=f"rcoord-{config.group_id}-gen{generation_id}-joinbeat")

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop.set()

    def _run(self) -> None:
        cfg = self._config
        while not self._stop.wait(cfg.heartbeat_interval_ms / 1000):
            sent = time.monotonic()
            try:
                error = self._coordinator.heartbeat(
                    cfg.group_id, self._generation_id, self._member_id, cfg.group_instance_id)
            except Exception as exc:  # noqa: BLE001 - the next beat tries again
                log.debug("group %r: heartbeat during the rebalance failed: %s", cfg.group_id,
                          exc)
                continue
            if error not in REFRESHED and reaction_for(error).retry:
                continue
            with self._lock:
                if error in REFRESHED:
                    self._answered = sent
                # A later answer that the member is out replaces a REBALANCE_IN_PROGRESS, whose
                # row every other outranks (policy.combine): as Kafka's heartbeat handler resets
                # the generation on it whatever an earlier beat said. Kept first, it made the
                # member sync and rejoin with a member id the coordinator had removed.
                if error is not Errors.NONE and (self._error is None or error not in REFRESHED):
                    self._error = error
            if error not in REFRESHED:
                return  # the member is out of the generation: beating is pointless

    def check(self) -> None:
        """Raise ``ProtocolError`` if a heartbeat said the member is out of this generation."""
        with self._lock:
            error = self._error
        if error is None:
            return
        if error in _OUT_OF_GENERATION:
            raise ProtocolError.of(
                error, f"heartbeat of {self._config.group_id!r} generation "
                f"{self._generation_id} during the rebalance: {error.name}")

    def hand_over(self, gen: Generation) -> None:
        """Stop; the generation takes the latest session refresh and the error seen."""
        self._stop.set()
        with self._lock:
            answered, error = self._answered, self._error
        if answered is not None:
            gen.heartbeat_answered(answered)
        if error is not None:
            gen._end(EndReason.of(error), error)


def watch_session(gen: Generation, config: ConsumerGroupConfig) -> None:
    """End ``gen`` with its partitions lost once no heartbeat has been answered for a session
    timeout (``Generation._session_expired``), whatever the heartbeat thread is waiting for.

    A member cut off from Redis (a black hole, no reset) had its heartbeat stuck in calls that
    each wait for the client's socket timeout and are retried, so its generation ended about
    30 s later, while the coordinator gave its partitions to another member after the session
    timeout, and ``poll()`` went on handing out the records it had fetched: two owners. The
    session is counted from the sending of the last heartbeat answered (or of the SyncGroup
    that made the generation, plus the server's time it was parked waiting for the leader's),
    never later than the coordinator counts it. Stops when the generation ends.
    """
    session_s = config.session_timeout_ms / 1000
    while True:
        left = gen.session_left(session_s)
        if left <= 0:
            if not gen.done.is_set():
                log.warning("group %r: no heartbeat answered for %d ms (the session timeout): "
                            "the partitions of generation %d are lost", gen.group_id,
                            config.session_timeout_ms, gen.generation_id)
                gen._session_expired(config.session_timeout_ms)
            return
        if gen.done.wait(left):
            return


def watch_partitions(
    gen: Generation, coordinator: Coordinator, config: ConsumerGroupConfig
) -> None:
    """End the generation when a partition count changes (leader) or the topics the member's
    pattern matches change (pattern subscription), checking every partition watch interval."""
    cfg = config
    topics = gen.watched_topics
    baseline = gen.watched_baseline
    interval = cfg.partition_watch_interval_ms / 1000
    coord = coordinator
    counting = cfg.watch_partition_changes and gen.is_leader
    if not counting:
        while not gen.done.wait(interval):
            if _pattern_changed(gen, coord, cfg):
                return
        return
    if baseline is None:
        baseline = _read(gen, "partition watcher: reading partition counts",
                         lambda: _counts(coord, topics))
    while not gen.done.wait(interval):
        if _pattern_changed(gen, coord, cfg):
            return
        counts = _read(gen, "partition watcher: reading partition counts",
                       lambda: _counts(coord, topics))
        if counts is None:
            if gen.done.is_set():  # a fatal error ended it (_read)
                return
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


def _pattern_changed(gen: Generation, coord: Coordinator, cfg: ConsumerGroupConfig) -> bool:
    """If ``gen``'s member subscribes by pattern and the matched topics are no longer the set it
    joined with, end the generation (the rejoin sends the new set) and return True."""
    pattern = gen.watched_pattern
    if pattern is None:
        return False
    matched = _read(gen, "pattern watcher: listing the topics",
                    lambda: topics_matching(pattern, coord.list_topics()))
    if matched is None:
        return gen.done.is_set()  # a fatal error ended it (_read)
    if matched == gen.watched_matched:
        return False
    log.info(
        "group %r: pattern %r now matches %s (joined with %s); rejoining",
        cfg.group_id,
        pattern.pattern,
        list(matched),
        list(gen.watched_matched),
    )
    gen._end(EndReason.SUBSCRIPTION_CHANGED)
    return True


def _read(gen: Generation, what: str, read: Callable[[], T]) -> T | None:
    """One read of a watcher: its result, or None if it failed; the watcher tries again at
    its next interval, as Kafka's consumer keeps its last metadata when a refresh fails.

    Any exception counts, not only ``RcoordError``: an unexpected one (a non-numeric partition
    count in a topic's metadata, a ``Coordinator`` that raises its own errors) ended the
    watcher's thread, and the generation went on with no one noticing new partitions or newly
    matching topics until it ended for another reason. Such an error is logged with its
    traceback. One whose ``ERROR_POLICY`` row is fatal (a permission the Redis user lacks)
    ends the generation with it instead, as it would have ended any call of the member's."""
    try:
        return read()
    except Exception as exc:  # retried at the next interval, or fatal
        if reaction_for(exc).fatal:
            gen._end(EndReason.of(exc), exc)
        elif isinstance(exc, RcoordError):
            log.warning("group %r: %s failed: %s", gen.group_id, what, exc)
        else:
            log.warning("group %r: %s failed; trying again in the next interval", gen.group_id,
                        what, exc_info=True)
        return None


def _counts(coord: Coordinator, topics: list[str]) -> dict[str, int]:
    found = coord.partition_counts(topics)
    return {t: found.get(t, 0) for t in topics}
