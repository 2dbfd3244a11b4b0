"""How a ``Consumer`` gets its partitions: ``subscribe`` (a group assigns them) or ``assign``
(the application names them, no group membership), and the commit that goes with each.

Kafka allows one of the two per consumer at a time (its ``SubscriptionState`` types are mutually
exclusive), and so does this module: switching needs ``unsubscribe()`` in between. A subscribed
consumer commits with its generation (``Generation.commit_offsets``); an assigned one commits as a
*simple group* (``commit_as_simple_group``: no member id, generation -1), which the coordinator
accepts only while the group has no members.

``SubscriptionMixin`` holds the three public calls; ``Consumer`` inherits them. They work on the
consumer's own state (the mixin is a part of the ``Consumer`` class, split out to keep modules
small), so the attributes and helpers they use are declared below for the type checker.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError, Errors, ProtocolError, RcoordError
from ..protocol.offsets import OffsetAndMetadata, TopicPartition
from .config import ConsumerGroupConfig
from .coordinator import Coordinator
from .errors import (
    CommitFailedError,
    IllegalStateError,
    WakeupError,
    refused_by_replica,
    session_bound,
)
from .group import ConsumerGroup
from .polltimer import PollTimer
from .retry import call_with_retries

if TYPE_CHECKING:
    from .consumer import ConsumerRecord, _CommitFn

__all__ = ["PARTITION_MARKS", "PARTITION_TABLES", "SubscriptionMixin", "check_listener",
           "commit_as_simple_group", "retry_bound"]

log = logging.getLogger("rcoord.client")

LISTENER_METHODS = ("on_partitions_revoked", "on_partitions_assigned", "on_partitions_lost")


def check_listener(listener: Any) -> None:
    """Refuse a rebalance listener none of whose methods would ever be called (a function, or
    an object whose methods are misspelt): the consumer calls them by name and skips a
    missing one, so such a listener was silently never called. None (no listener) passes."""
    if listener is not None and not any(
            callable(getattr(listener, m, None)) for m in LISTENER_METHODS):
        raise ConfigError(
            f"listener must be a ConsumerRebalanceListener (or define one of "
            f"{', '.join(LISTENER_METHODS)}), got {listener!r}")


PARTITION_TABLES = ("_buffers", "_position", "_fetch_pos", "_committed", "_invalid", "_resets",
                    "_seeks", "_record_bytes", "_fetched_turn", "_fetch_found", "_unacked",
                    "_commit_floor")
"""The Consumer's dicts keyed by partition, and its sets of partitions (below), named once:
a partition given up leaves every one (``_forget_partitions``), and dropping the assignment
empties them all (``Consumer._drop_assignment``). A table listed in one place and not the
other kept one entry per partition ever held."""
PARTITION_MARKS = ("_paused", "_caught_up", "_unstarted", "_unread")


class SubscriptionMixin:
    """``subscribe``, ``assign`` and ``unsubscribe`` of ``Consumer``."""

    if TYPE_CHECKING:
        # The Consumer state these calls read and change (set in Consumer.__init__).
        _config: ConsumerGroupConfig
        _coordinator_arg: Coordinator | None
        _group: ConsumerGroup | None
        _assigned_manually: bool
        _listener: Any
        _lock: threading.RLock
        _auto_commit: bool
        _revoking: bool
        _auto_commit_s: float
        _next_auto_commit: float
        _assigned: list[TopicPartition]
        _paused: set[TopicPartition]
        _caught_up: set[TopicPartition]
        _unstarted: set[TopicPartition]
        _unread: set[TopicPartition]
        _unread_adds: int
        _seeks: dict[TopicPartition, int]
        _record_bytes: dict[TopicPartition, int]
        _fetched_turn: dict[TopicPartition, int]
        _fetch_found: dict[TopicPartition, float]
        _position: dict[TopicPartition, int]
        _fetch_pos: dict[TopicPartition, int]
        _invalid: dict[TopicPartition, int]
        _resets: dict[TopicPartition, int]
        _committed: dict[TopicPartition, int]
        _buffers: dict[TopicPartition, deque[ConsumerRecord]]
        _gen: Any
        _stop: threading.Event
        _simple_retries_end: threading.Event
        _poll_timer: PollTimer
        _resubscribe: ConsumerGroupConfig | None
        _unsubscribed_commit: int | None
        _woken_leaving: bool | None

        def _check_open(self) -> None: ...
        def _single_threaded(self) -> contextlib.AbstractContextManager[None]: ...
        def _coordinator(self) -> Coordinator: ...
        def _commit_target(self) -> tuple[_CommitFn, object] | None: ...
        def _commit_changed(self, commit: _CommitFn,
                            woken: Callable[[], bool] | None = None) -> None: ...
        def _await_committer(self, woken: Callable[[], bool] | None = None) -> None: ...
        def _woken_if_leaving(self) -> Callable[[], bool] | None: ...
        def _run_commit_callbacks(self) -> None: ...
        def _revoke(self, *, lost: bool, poll_deadline: float | None = None,
                    polling: bool = False) -> None: ...
        def _drop_holds(self) -> None: ...
        def _leave_inside_revocation(self) -> None: ...
        def _revoke_unsubscribed(self, subscribed: Callable[[str], bool], change: object,
                                 deadline: float | None) -> bool: ...
        def _partitions_lost(self) -> bool: ...
        def _reset_later(self, tp: TopicPartition, edge: int) -> None: ...

    def subscribe(
        self,
        topics: Sequence[str] | None = None,
        listener: Any = None,
        *,
        pattern: re.Pattern[str] | None = None,
    ) -> None:
        """Join the group for ``topics``, or for every topic whose whole name matches
        ``pattern`` (Kafka's ``subscribe``); the group assigns partitions.

        A pattern subscription follows the topics: the member joins with the topics the pattern
        matches now and rejoins, so the group rebalances, when a topic that matches is created
        or deleted (checked every ``partition_watch_interval_ms``).

        Replaces an earlier subscription of the same kind without leaving the group, as in
        Kafka: the member keeps its id, and the next ``poll()`` rejoins, so the group rebalances
        once. With the cooperative protocol, that ``poll()`` first revokes the partitions of
        topics no longer subscribed (committing with auto-commit, then
        ``on_partitions_revoked``) and keeps the rest through the rebalance; with the eager
        protocol, it revokes every partition, as for any rebalance. ``subscription()`` names
        the new topics at once. Raises ``IllegalStateError`` after ``assign()``, on a
        consumer subscribed by topics when given a pattern or the other way round, and when
        given both (Kafka's subscription types are mutually exclusive; call ``unsubscribe()``
        first).
        """
        if topics is not None and pattern is not None:
            raise IllegalStateError(
                "subscribe() with both topics and a pattern: subscribe to one or the other"
            )
        if pattern is not None and (
            not isinstance(pattern, re.Pattern) or not isinstance(pattern.pattern, str)
        ):
            raise TypeError(f"pattern must be a compiled str pattern (re.compile), got {pattern!r}")
        check_listener(listener)  # (as the constructor checks its own)
        names = [] if topics is None else [topics] if isinstance(topics, str) else list(topics)
        with self._single_threaded():
            self._check_open()
            if self._assigned_manually:
                raise IllegalStateError(
                    "subscribe() after assign(): a consumer either subscribes (the group assigns "
                    "its partitions) or assigns partitions itself; call unsubscribe() first"
                )
            if self._group is not None and (pattern is None) != (
                self._config.topic_pattern is None
            ):
                now = "a pattern" if self._config.topic_pattern is not None else "topics"
                raise IllegalStateError(
                    f"subscribe() by {'pattern' if pattern is not None else 'topics'} on a "
                    f"consumer subscribed by {now}: a consumer subscribes by topics or by "
                    "pattern, not both; call unsubscribe() first"
                )
            if not names and pattern is None:
                self.unsubscribe()
                return
            config = dataclasses.replace(self._config, topics=names, topic_pattern=pattern)
            if listener is not None:
                self._listener = listener
            if (self._group is not None and set(config.topics) == set(self._config.topics)
                    and config.topic_pattern == self._config.topic_pattern):
                return
            if self._group is not None and not self._group.closed:
                # Kafka's subscribe() on a subscribed consumer: the member stays, with its
                # id; the next poll() rejoins with the new subscription (one rebalance, not a
                # leave and a join), cooperatively after revoking what is no longer subscribed.
                self._config = self._resubscribe = config
                return
            self._leave_group()  # a group a fatal error closed: join as a new member
            self._config = config
            self._group = ConsumerGroup(
                config, coordinator=self._coordinator_arg, acknowledge="by_caller"
            )
            self._poll_timer.reset(config.group_id)

    def _apply_subscription(self, deadline: float | None) -> bool:
        """``poll()``'s first step after ``subscribe()`` changed the subscription: revoke the
        partitions no longer subscribed (cooperative) and rejoin with the new one, between the
        application's batches: the records the last ``poll()`` returned are processed by now,
        so their positions are what auto-commit commits.

        False while that revocation waits for the application's commits in flight of those
        partitions (``_revoke_unsubscribed``, until ``deadline``): the change stays pending,
        nothing applied, and a later ``poll()`` goes on."""
        config, self._resubscribe = self._resubscribe, None
        group = self._group
        if config is None or group is None:
            return True
        pattern = config.topic_pattern
        again = False
        try:
            if not self._revoke_unsubscribed(_subscribes(config), config, deadline):
                again = True
                return False
        except (WakeupError, KeyboardInterrupt):
            # The revocation callback was cut short, its partitions kept: as Kafka, which
            # revokes them again (in onJoinComplete) before anyone else may have them, the
            # next poll() revokes them again, and only then rejoins with this subscription
            # (the rejoin no longer reports them as owned). Unless the callback subscribed
            # anew, unsubscribed or closed: then that is what the next poll() applies.
            again = self._resubscribe is None and self._group is group and not group.closed
            raise
        except Exception:
            # The callback raised after the revocation was made (its exception is poll()'s,
            # as Kafka's listener exceptions are): if its commits are still in flight past
            # the generation (``_unsubscribed_commit``), the change still waits for them, as
            # when it returned; applied now, the member rejoined with them in flight.
            again = (self._unsubscribed_commit is not None and self._resubscribe is None
                     and self._group is group and not group.closed)
            raise
        finally:
            if again:
                self._resubscribe = config
            elif not group.closed:  # else the group's fatal error is what next() raises
                group.resubscribe(config.topics, pattern)
        return True

    def _subscribed(self, topic: str) -> bool:
        """Whether the subscription as it stands now (``subscribe()``'s, applied or not) takes
        ``topic``."""
        return _subscribes(self._config)(topic)

    def assign(self, partitions: Sequence[TopicPartition]) -> None:
        """Consume exactly ``partitions``, with no group membership (Kafka's ``assign``).

        No JoinGroup, no heartbeats, no rebalance callbacks. A new partition starts at its
        committed offset in ``group_id`` (or the ``start_offset`` policy), as it is at the next
        ``poll()`` or ``position()``, which reads it (``Consumer._read_starts``), as Kafka's
        first poll fetches the committed offsets: an offset committed before then, by this
        consumer or another client, is where it starts (before, it started at the offset read
        here, moved only by this consumer's own commits); a ``seek()`` before then wins. A
        partition kept from the previous ``assign()`` keeps its position. One that does not
        exist yet (no topic, or a number past its count) when that read is made has no
        position until it exists, then the policy's edge at that time (``_reset_later``; the
        log read of ``start_offsets`` finds it missing, so no other read, and no topic created
        between two reads starts at 0), as Kafka retries the
        reset of a partition missing from its metadata; under "none" it raises
        ``NoOffsetForPartitionError``. A committed offset does not change that: one to a
        partition that does not exist is a deleted topic's, which Kafka deletes with it.
        Commits go to ``group_id`` as a simple group (no member id, generation -1): the
        coordinator accepts them only while the group has no members, else they raise
        ``CommitFailedError``; with auto-commit, ``close()`` commits the positions that way too
        (Kafka's ``close()``). Raises ``IllegalStateError`` on a subscribed consumer;
        ``assign([])`` is ``unsubscribe()``.
        """
        wanted = sorted({TopicPartition(*tp) for tp in partitions})
        with self._single_threaded():
            self._check_open()
            if self._group is not None:
                raise IllegalStateError(
                    "assign() on a subscribed consumer: the group assigns its partitions; call "
                    "unsubscribe() first"
                )
            if not wanted:
                self.unsubscribe()
                return
            before = set(self._assigned)
            removed = before - set(wanted)
            added = [tp for tp in wanted if tp not in before]
            if removed and self._assigned_manually and self._auto_commit:
                self._auto_commit_now()
            with refused_by_replica(self._config.group_id, retry_bound(self._config)):
                # (the coordinator's start, retried: unretried, one start on a replica raised
                # "try again" at once, one with Redis down ConnectionLost; the offsets are
                # read by the first poll() or position(): Consumer._read_starts)
                call_with_retries(self._coordinator, None, config=self._config,
                                  closing=self._stop)
            self._forget_partitions(removed)
            if added:
                self._unread_adds += 1  # (an answer to a read sent before is dropped)
            for tp in added:
                self._position[tp] = self._fetch_pos[tp] = 0  # (a stand-in until it is read)
                self._buffers[tp] = deque()
                self._unstarted.add(tp)  # (a seek, _reset_later's too, gives it a position)
                self._unread.add(tp)  # (its start is read by the next poll() or position())
            self._assigned = wanted
            self._assigned_manually = True
            self._next_auto_commit = time.monotonic() + self._auto_commit_s

    def _forget_partitions(self, partitions: Iterable[TopicPartition]) -> None:
        """Drop what every per-partition table holds of ``partitions`` (given up): a
        long-running consumer moved over many topics (``assign()``, a pattern subscription
        over short-lived topics) kept an entry per partition it ever held in the tables this
        once left out (seek counts, fetch sizes and turns)."""
        tables = [getattr(self, name) for name in PARTITION_TABLES]
        marks = [getattr(self, name) for name in PARTITION_MARKS]
        for tp in partitions:
            for table in tables:
                table.pop(tp, None)
            for mark in marks:
                mark.discard(tp)

    def subscription(self) -> list[str]:
        """The topics this consumer is subscribed to, sorted (Kafka's ``subscription()``): the
        named ones, or, by pattern, those it matched when the current generation was joined
        (none between generations); [] when it is not subscribed (``assign()`` included)."""
        self._check_open()
        if self._group is None:
            return []
        if self._config.topic_pattern is None:
            return sorted(set(self._config.topics))
        gen = self._gen
        return sorted(gen.watched_matched) if gen is not None else []

    def unsubscribe(self) -> None:
        """Give up every partition: leave the group (revoking, with a final auto-commit), or
        forget the ``assign()``ed partitions (auto-committing their positions).

        A ``wakeup()`` while the final auto-commit, or the async commits queued before it,
        are waited for ends their retries and the final commit's wait for the member's join
        (``Consumer._leave_woken``); the member still leaves, and then ``WakeupError`` is
        raised. After ``assign()`` it ends the wait, the commits left in flight; the
        partitions are still forgotten, and then ``WakeupError`` is raised."""
        with self._single_threaded():
            self._check_open()
            manually = self._assigned_manually
            # A listener's own unsubscribe() inside this one's revocation leaves the wakeup
            # taken (or taken later) to the outer call, which raises it once the member left:
            # reset here, it was lost, and no call raised it.
            nested = self._woken_leaving is not None
            if not nested:
                self._woken_leaving = False
            try:
                if manually:
                    if self._auto_commit:
                        self._auto_commit_now()  # (a wakeup returns, the commit in flight)
                    self._assigned_manually = False
                    self._forget_partitions(self._assigned)
                    self._assigned = []
                self._leave_group()
            finally:
                woken: bool | None = False
                if not nested:
                    woken, self._woken_leaving = self._woken_leaving, None
            if woken and manually:
                raise WakeupError("unsubscribe() interrupted by wakeup(): the auto-commit of "
                                  "the assigned partitions' positions was left in flight, "
                                  "behind the commits queued before it (a failure is logged); "
                                  "the partitions are forgotten")
            if woken:
                raise WakeupError("unsubscribe() interrupted by wakeup(): its final commit "
                                  "and the async commits queued before it were made once, not "
                                  "retried (they may not have landed; a failure is logged or "
                                  "given to its callback); the consumer left the group")

    def _auto_commit_now(self) -> None:
        target = self._commit_target()
        if target is None:
            return
        try:
            self._commit_changed(target[0], self._woken_if_leaving())
        except RcoordError as exc:
            log.warning("auto-commit failed: %s", exc)

    def _leave_group(self) -> None:
        """Revoke the current generation's partitions and close the group, if there is one."""
        group = self._group
        if group is None:
            return
        self._await_committer(self._woken_if_leaving())
        self._run_commit_callbacks()
        try:
            if self._gen is not None and not self._revoking:
                self._revoke(lost=self._partitions_lost())
            elif self._gen is not None:
                # From the listener of a revocation in progress: that one is the last; a
                # second would call the listener again, nested, for the same partitions.
                self._leave_inside_revocation()
        finally:
            # Only now (the revocation's final commit landed): a hold a revocation poll()
            # finished left waiting for its commits, which have landed too. Released before,
            # it let the member rejoin while that final commit was in flight (refused).
            self._drop_holds()
            group.close()
            self._group = None
            self._resubscribe = None

    def _commit_simple(self, offsets: Mapping[TopicPartition, int | OffsetAndMetadata]) -> None:
        commit_as_simple_group(self._coordinator(), self._config, offsets,
                               self._simple_retries_end)


def retry_bound(config: ConsumerGroupConfig) -> str:
    """How long ``call_with_retries`` retried a call, for ``refused_by_replica``."""
    return session_bound(config.session_timeout_ms)


def commit_as_simple_group(
    coordinator: Coordinator,
    config: ConsumerGroupConfig,
    offsets: Mapping[TopicPartition, int | OffsetAndMetadata],
    closing: threading.Event,
) -> None:
    """OffsetCommit as a simple group (no member id, generation -1), as Kafka's consumer does
    after ``assign()``. The coordinator accepts it only while the group has no members: a group
    whose members commit with generations must not be overwritten. Raises ``CommitFailedError``
    when refused for that reason, ``ProtocolError`` for any other error."""
    prepared = {TopicPartition(*tp): off for tp, off in offsets.items()}
    if not prepared:
        return
    group_id = config.group_id
    with refused_by_replica(group_id, retry_bound(config)):
        result = call_with_retries(
            lambda: coordinator.commit_offsets(group_id, prepared,
                                               retention_ms=config.retention_ms),
            lambda r: next((e for e in r.values() if e is not Errors.NONE), Errors.NONE),
            config=config,
            closing=closing,
        )
    failed = {tp: e for tp, e in result.items() if e is not Errors.NONE}
    if not failed:
        return
    code = min(set(failed.values()))
    if code in (Errors.UNKNOWN_MEMBER_ID, Errors.ILLEGAL_GENERATION):
        raise CommitFailedError(
            f"commit refused ({code.name}): group {group_id!r} has active members, and a "
            "consumer using assign() commits as a simple group, which the coordinator "
            "accepts only while the group has no members. Use another group_id for "
            "assign(), or stop the group's members first.",
            code,
            failed,
        )
    raise ProtocolError.of(
        code,
        f"commit to group {group_id!r} failed for "
        + ", ".join(f"{tp.topic}-{tp.partition}: {e.name}" for tp, e in sorted(failed.items())),
    )


def _subscribes(config: ConsumerGroupConfig) -> Callable[[str], bool]:
    """Whether ``config``'s subscription takes a topic: its pattern matches the whole name
    (as ``topics_matching``), or the name is one of its topics."""
    pattern, wanted = config.topic_pattern, set(config.topics)
    return ((lambda t: pattern.fullmatch(t) is not None) if pattern is not None
            else wanted.__contains__)
