"""Consumer: Kafka's poll loop over the partitions a ``ConsumerGroup`` assigns to this member.

::

    with Consumer(ConsumerGroupConfig(group_id="orders", topics=["orders"],
                                      redis_url="redis://127.0.0.1:6379/0")) as consumer:
        for record in consumer:              # or: records = consumer.poll(timeout=1.0)
            handle(record)                   # offsets are auto-committed every 5 s

``poll()`` drives everything, as in Kafka's consumer: when the group hands out a new generation
it calls ``on_partitions_assigned``, it fetches the assigned partitions from the positions the
generation gives (committed offsets, or the start-offset policy; an offset the listener committed
for a partition it did not ``seek()``, as in Kafka), and when the generation ends it revokes the
partitions before the member may rejoin:

1. the records fetched but not yet returned for those partitions are dropped, so a record of a
   partition this member no longer owns is never handed out (kafka-go #1398, sarama #1543);
2. if the partitions were **revoked** (the member is still in the group, so the generation's
   commits still succeed): auto-commit commits the positions, then ``on_partitions_revoked``
   runs, where the application may commit too (a final commit Redis does not answer in time
   holds the revocation, not ``poll()``: the poll returns by its timeout with no records and
   the next one goes on, as Kafka's ``onJoinPrepare`` does under the poll timer);
3. if they were **lost** (the member was expired or fenced; someone else may own them already):
   ``on_partitions_lost`` runs and nothing is committed.

Within one member the order is always revoked-or-lost of generation N, then assigned of
generation N+1: the group cannot form N+1 until this member rejoins, and it rejoins only after
the revocation (the consumer holds generation N open with a routine until then). Callbacks run
in the thread that calls ``poll()``, never concurrently with the application's processing.

The revocation waits for the next ``poll()`` (or ``close()``), for at most
``rebalance_timeout_ms``: a member that does not rejoin by then is removed by the coordinator,
so after that the partitions are reported as lost. (Kafka's consumer sends
``max.poll.interval.ms`` as its rebalance timeout; here the two are apart:
``rebalance_timeout_ms`` bounds this wait, and ``max_poll_interval_ms`` makes a member whose
application stops calling ``poll()`` leave the group.)

Under the cooperative protocol (every assignor supports it, e.g. ``["cooperative-sticky"]``) a
rebalance that does not lose the partitions revokes nothing up front: ``poll()`` goes on returning
records of every partition while the member rejoins, then applies the difference (KIP-429):
revoked partitions are stopped (their buffered records dropped), committed and passed to
``on_partitions_revoked`` (only when there are some; they are still assigned while it runs, so
it can read their positions and commit them, as in Kafka; the member then rejoins so their new
owners get them, and never before that callback has returned, even if another member's arrival
ended the generation meanwhile, so its commits still succeed), added ones start at their
committed offsets (or at one ``on_partitions_assigned`` commits), kept ones continue from their
positions, and ``on_partitions_assigned`` gets the added partitions (possibly none). Lost
partitions are still all lost.

A ``Consumer`` is used from one thread: a call from a second thread while one is inside a call
raises ``ConcurrentModificationError``, as Kafka's consumer does; ``close()`` and ``wakeup()``
may be called from another one.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from types import TracebackType
from typing import Any, Literal, Self, TypeVar, overload

from ..assignors import RebalanceProtocol
from ..errors import ConfigError, ConnectionLost, Errors, RcoordError
from ..protocol._checks import INT64_MAX
from ..protocol.offsets import OffsetAndMetadata, TopicPartition
from ..topics import CorruptRecordError, FetchWaker, Header, PartitionRecords, Record, TopicError
from ..topics._base import legal_topic, sync_headers, unreadable_partition
from ..topics.incarnation import older_than_their_topic, topics_to_judge
from ..topics.times import OffsetAndTimestamp
from .committer import AsyncCommitter, Completion, OffsetCommitCallback
from .config import ConsumerGroupConfig, check_duration_bound
from .coordinator import Coordinator, RedisCoordinator, client_from_url
from .errors import (
    CommitFailedError,
    ConcurrentModificationError,
    GenerationEndedError,
    IllegalStateError,
    InvalidOffsetError,
    NoOffsetForPartitionError,
    OffsetOutOfRangeError,
    RebalanceInProgressError,
    WakeupError,
    refused_by_replica,
)
from .generation import EndReason, Generation, GenerationContext, commit_offsets_arg
from .group import ConsumerGroup
from .inflight import Finished, InFlight
from .join import start_offsets
from .policy import reaction_for
from .polltimer import PollTimer
from .retry import call_with_retries, interruptible_by
from .subscription import (
    PARTITION_MARKS,
    PARTITION_TABLES,
    SubscriptionMixin,
    check_listener,
    retry_bound,
)

__all__ = ["Consumer", "ConsumerRebalanceListener", "ConsumerRecord"]

log = logging.getLogger("rcoord.client")

T = TypeVar("T")


@dataclass(frozen=True)
class ConsumerRecord:
    """One record of a partition, as ``poll()`` returns it. ``headers`` and ``header_list``
    are as in ``rcoord.topics.Record``: a dict with the last value of each name, and every
    header in order."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: dict[str, bytes | None] = field(default_factory=dict)
    timestamp_ms: int = 0
    header_list: tuple[Header, ...] = ()

    def __post_init__(self) -> None:
        sync_headers(self)

    @property
    def topic_partition(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)


_new = object.__new__
_set = object.__setattr__

if hasattr(ConsumerRecord, "__slots__") or [f.name for f in fields(ConsumerRecord)] != [
    "topic", "partition", *(f.name for f in fields(Record))
]:  # pragma: no cover - a guard for a future change of either class
    raise ImportError("_consumer_records needs ConsumerRecord = topic, partition + Record's fields")


def _consumer_records(topic: str, partition: int, records: list[Record]) -> list[ConsumerRecord]:
    """``records`` of one partition as ``ConsumerRecord``s (the blocking fetch's answer; the
    others are decoded as ConsumerRecords directly, ``rcoord.topics.fetch_many_as``).

    Built as ``rcoord.topics._decode`` builds records: a fresh instance's ``__dict__`` is filled
    with the topic, the partition and the Record's own fields, instead of calling the frozen
    dataclass's ``__init__`` (seven ``object.__setattr__`` calls: about 2.3 µs a record, more
    than decoding it). The result is an ordinary ``ConsumerRecord``, equal to one built by its
    constructor, with the same repr, and as immutable (``tests/test_consumer.py`` checks
    that); the headers dict is shared with the Record, as the constructor call shared it.
    """
    out: list[ConsumerRecord] = []
    append = out.append
    for rec in records:
        cr = _new(ConsumerRecord)
        _set(cr, "__dict__", {"topic": topic, "partition": partition, **rec.__dict__})
        append(cr)
    return out


class ConsumerRebalanceListener:
    """Callbacks around a rebalance (Kafka's ``ConsumerRebalanceListener``). All run in ``poll()``.

    Override what you need; the defaults do nothing. Unlike Kafka's Java default,
    ``on_partitions_lost`` does *not* call ``on_partitions_revoked``: a lost partition must not be
    committed, and revocation handlers usually commit.
    """

    def on_partitions_revoked(self, partitions: list[TopicPartition]) -> None:
        """The generation is ending and this member still owns ``partitions``: commits still
        succeed, so flush and commit here. Buffered records were already dropped."""

    def on_partitions_assigned(self, partitions: list[TopicPartition]) -> None:
        """A generation started with ``partitions`` (every one of them, as in Kafka's eager
        protocol). Fetching starts from the committed offsets, or the start-offset policy.

        As in Kafka, a partition starts at an offset committed here (``commit()``, or a
        ``commit_async()`` the first fetch waits for), unless this callback gave it a position
        first: ``seek()``, ``seek_to_*()`` or ``position()``, whose answer is then where it
        starts (a ``seek()`` after the commit wins too)."""

    def on_partitions_lost(self, partitions: list[TopicPartition]) -> None:
        """The member was expired or fenced: another member may own ``partitions`` already.
        Clean up without committing."""


class _Hold:
    """The consumer's routine on a generation: it keeps the generation open (so the member
    does not rejoin) until the polling thread has revoked its partitions, or, when they are
    carried through the rejoin (cooperative), until it has taken the generation in hand."""

    def __init__(self, limit_s: float) -> None:
        self.released = threading.Event()  # poll() revoked (or lost) the partitions
        self.applied = threading.Event()  # poll() took the generation in hand, revocation included
        self.gave_up = False
        self._limit_s = limit_s

    def __call__(self, ctx: GenerationContext) -> None:
        ctx.done.wait()
        gen = ctx.generation
        if gen.wait_decided(self._limit_s) and gen.carried:
            # Cooperative: the partitions are kept through the rejoin, nothing to revoke now.
            # Only wait until poll() has taken the generation in hand (it does so at once), so
            # the member reports exactly the partitions this consumer holds, and until the
            # on_partitions_revoked that taking it called has returned: as in Kafka, whose
            # poll thread sends the JoinGroup after it, the revoked partitions reach their new
            # owners (and the callback's commits are accepted) only once it is done, even when
            # another member's arrival ended this generation meanwhile.
            self.applied.wait(self._limit_s)
            return
        if not self.released.wait(self._limit_s):
            self.gave_up = True
            log.warning(
                "generation %d ended but poll() was not called within the rebalance timeout "
                "(%.1f s); rejoining, and its partitions will be reported as lost",
                ctx.generation.generation_id,
                self._limit_s,
            )


_FOREVER_S = threading.TIMEOUT_MAX / 2
"""A timeout longer than this (``float("inf")``, the spelling of Kafka's ``poll(Long.MAX_VALUE)``
idiom) is no bound at all: the waits it would reach refuse anything past
``threading.TIMEOUT_MAX`` (about 292 years) with an ``OverflowError``."""


def _check_timeout(timeout: float | None) -> float | None:
    """``timeout`` checked: seconds >= 0, or None (also for one too long to wait: no bound)."""
    if timeout is not None and (
        not isinstance(timeout, (int, float)) or isinstance(timeout, bool)
    ):
        raise TypeError(f"timeout must be seconds (a float) or None, got {timeout!r}")
    if timeout is not None and not timeout >= 0:  # NaN too
        raise ValueError(f"timeout must be >= 0 seconds, got {timeout!r} (as Kafka's: "
                         "'Timeout must not be negative')")
    return None if timeout is None or timeout > _FOREVER_S else float(timeout)


class Consumer(SubscriptionMixin):
    """Records from the partitions a consumer group assigns to this member.

    Arguments besides ``config``:
        listener: a ``ConsumerRebalanceListener`` (or any object with some of its methods).
        enable_auto_commit: commit the positions of returned records every
            ``auto_commit_interval_ms`` (from inside ``poll()``), before a revocation and on
            ``close()``. Kafka's ``enable.auto.commit``. A position is committed once every record
            before it has been returned by ``poll()``, and ``poll()`` is called again only after
            they were processed, so auto-commit gives at-least-once processing.
        max_poll_records: most records one ``poll()`` returns (Kafka's ``max.poll.records``).
        fetch_max_bytes: about the most bytes of records one fetch reads, over all the
            partitions it reads (Kafka's ``fetch.max.bytes``, 50 MiB).
        max_partition_fetch_bytes: about the most bytes of records one fetch reads of one
            partition (Kafka's ``max.partition.fetch.bytes``, 1 MiB). As in Kafka, neither is
            absolute: the first partition of a fetch that has records gives at least one,
            however large, so the consumer makes progress (``rcoord.topics.fetch``'s
            ``_fetch_bounded``), and a partition left out is asked first in the next fetch. A
            record counts as its key, value, headers and timestamp.
        fetch_max_wait_ms: how long one fetch waits for new records when every assigned
            partition is at its end (Kafka's ``fetch.max.wait.ms``).
        coordinator: a ``Coordinator`` to use instead of Redis (tests).
    """

    def __init__(
        self,
        config: ConsumerGroupConfig,
        *,
        listener: ConsumerRebalanceListener | Any = None,
        enable_auto_commit: bool = True,
        auto_commit_interval_ms: int = 5000,
        max_poll_records: int = 500,
        fetch_max_bytes: int = 52_428_800,
        max_partition_fetch_bytes: int = 1_048_576,
        fetch_max_wait_ms: int = 100,
        max_poll_interval_ms: int = 300_000,
        default_api_timeout_ms: int = 60_000,
        coordinator: Coordinator | None = None,
    ) -> None:
        for name, value in (
            ("auto_commit_interval_ms", auto_commit_interval_ms),
            ("max_poll_records", max_poll_records),
            ("fetch_max_bytes", fetch_max_bytes),
            ("max_partition_fetch_bytes", max_partition_fetch_bytes),
            ("fetch_max_wait_ms", fetch_max_wait_ms),
            ("max_poll_interval_ms", max_poll_interval_ms),
            ("default_api_timeout_ms", default_api_timeout_ms),
        ):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"{name} must be an int >= 1, got {value!r}")
            if name.endswith("_ms"):
                check_duration_bound(name, value)
        if not isinstance(enable_auto_commit, bool):
            # bool("false") is True: a string from an environment or a file turned it on.
            raise ConfigError(f"enable_auto_commit must be True or False, got "
                              f"{enable_auto_commit!r}")
        check_listener(listener)
        self._config = config
        self._coordinator_arg = coordinator
        self._own_coordinator: Coordinator | None = None
        self._owned_client: Any = None
        # Offset queries running now (``_query``: without the lock, so a close() from another
        # thread does not wait for them), and whether the client made from ``redis_url`` is
        # to be closed once the last returns (``_close_own_client``); under ``_client_guard``.
        self._client_users = 0
        self._client_close_due = False
        self._client_guard = threading.Lock()
        # subscribe() gives the consumer a group; assign() gives it partitions and no group.
        self._group: ConsumerGroup | None = None
        self._assigned_manually = False
        if config.topics or config.topic_pattern is not None:
            self._group = ConsumerGroup(config, coordinator=coordinator, acknowledge="by_caller")
        self._listener = listener if listener is not None else ConsumerRebalanceListener()
        self._auto_commit = enable_auto_commit
        self._auto_commit_s = auto_commit_interval_ms / 1000
        self._max_poll_records = max_poll_records
        self._fetch_max_bytes = fetch_max_bytes
        self._max_partition_fetch_bytes = max_partition_fetch_bytes
        self._fetch_max_wait_ms = fetch_max_wait_ms
        self._api_timeout_s = default_api_timeout_ms / 1000
        self._lock = threading.RLock()
        # The thread inside a call of this consumer, and how deep (a listener's or a callback's
        # calls nest): Kafka's acquire()/release() (_single_threaded).
        self._owner: int | None = None
        self._owner_depth = 0
        self._owner_guard = threading.Lock()
        self._closer: int | None = None  # the thread running close(), which holds the lock
        self._stop = threading.Event()  # close() was called (possibly from another thread)
        self._wakeup = threading.Event()  # wakeup() was called: poll() raises WakeupError
        # In unsubscribe(): False, True once it took a wakeup() to raise (_leave_woken).
        self._woken_leaving: bool | None = None
        # Ends the retries of assign()'s simple-group commits: close()'s bound has passed (as
        # ConsumerGroup.stop_retrying ends a generation's), so close()'s final commit is retried
        # until then, as a subscribed consumer's is.
        self._simple_retries_end = threading.Event()
        # close() is running its final revocation: the listener may still commit (Kafka's
        # close() calls onPartitionsRevoked while the consumer is open), but close() is not
        # run again. _closed is set only once that revocation and its commits are done.
        self._closing = False
        self._closed = False
        # What poll() handed out and the application may not have processed yet: per partition,
        # the offset of the first such record (Kafka counts a poll()'s records processed when the
        # next poll() comes; the iterator counts each record when the loop asks for the next).
        # A close() from another thread than the loop's, which may be in the middle of them,
        # commits no further (_close).
        self._unacked: dict[TopicPartition, int] = {}
        # The thread whose ``for record in consumer`` loop body is running (__iter__), or None.
        self._iterating: int | None = None
        # Per partition, the serial of its latest seek() (or of the iterator's first batch of
        # it): the iterator tells a position the loop body set from its own. Like every
        # per-partition table, forgotten with the partition (``_forget_partitions``): a pattern
        # subscription over short-lived topics kept one entry per past partition. Serials are
        # the consumer's, not counts per partition: a partition given up and assigned again
        # (its entry forgotten) does not match the batch's again, even once started.
        self._seeks: dict[TopicPartition, int] = {}
        self._seek_serials = itertools.count(1)
        self._poll_thread: int | None = None  # the thread of the latest poll()
        # The thread running poll() or commit() now, outside the listener: a close() from that
        # very thread (a signal handler interrupting it) would change the state under it, so it
        # is deferred until that call returns (_deferred_close: close()'s arguments).
        self._inside: int | None = None
        self._deferred_close: tuple[float | None] | None = None
        self._gen: Generation | None = None
        self._hold: _Hold | None = None
        self._assigned: list[TopicPartition] = []
        self._position: dict[TopicPartition, int] = {}
        self._fetch_pos: dict[TopicPartition, int] = {}
        self._buffers: dict[TopicPartition, deque[ConsumerRecord]] = {}
        self._committed: dict[TopicPartition, int] = {}
        # The partitions of each commit queued (``_submit_commit``) whose outcome has not been
        # taken yet (``_run_commit_callbacks``), by ticket: a commit's landing is noted in
        # ``_committed`` only for the partitions none of the later ones will overwrite.
        self._commits_pending: dict[int, frozenset[TopicPartition]] = {}
        # Finished commits whose outcomes are in the books (``_take_outcomes``) and whose
        # callbacks have not run yet (``_run_commit_callbacks``).
        self._outcomes: deque[Completion] = deque()
        # Per partition held, the offset of the application's latest commit of it
        # (``_note_commit_floor``), which none of the consumer's own commits (auto-commit's, a
        # revocation's, close()'s) goes below (``_changed_positions``): close() and a loop left
        # at a record take the position back to a record the application may have committed
        # past already. A seek, the application's or the ``start_offset`` policy's, drops it:
        # that position is the one to commit, as in Kafka. Kept as (ticket, offset) of that
        # commit and of those before it back to the last landed, so that one failing leaves
        # the floor of the commit before it (``_settle_commit_floor``); the last is the floor.
        self._commit_floor: dict[TopicPartition, list[tuple[int, int]]] = {}
        # Assigned partitions with no position to read from (start_offset="none"): -1 when
        # nothing was committed, else the position that fell out of the log. Not fetched or
        # committed; poll() raises until the application seeks them.
        self._invalid: dict[TopicPartition, int] = {}
        # seek_to_beginning()/seek_to_end() not evaluated yet (Kafka's requestOffsetReset):
        # partition -> 0 (log start) or 1 (log end). Such a partition's _fetch_pos is a
        # negative marker (from _reset_markers) its fetch answer is matched against; it has no
        # position (not committed, no lag) until a fetch reads the edge (a paused one's too,
        # without its records: _send_fetch) or position() does (_resolved).
        self._resets: dict[TopicPartition, int] = {}
        self._reset_markers = 1
        # Partitions a generation assigned whose start is still the generation's (its
        # committed offset, or the start-offset policy's): not sought, asked position() of,
        # or fetched yet. Kafka's consumer has no position for them until the poll() that ran
        # on_partitions_assigned fetches their committed offsets, so an offset the listener
        # committed is where they start (``_start_commits``, applied in ``_note_started``).
        self._unstarted: set[TopicPartition] = set()
        # Partitions assign() gave that have no start yet (unstarted, their committed offset
        # not read): the first poll() or position() reads them all at once (``_read_starts``),
        # as Kafka's first poll() after assign() fetches the committed offsets, so a commit by
        # another client in between is where they start. Their ``_position`` is a stand-in.
        self._unread: set[TopicPartition] = set()
        # poll()'s read of those starts runs on a thread of its own and outlives a poll() whose
        # timeout it outlasts (Redis slow or not answering), as the fetch does: a later poll()
        # collects it (``_collect_starts``). Tagged with ``_unread_adds`` as it was when the
        # read was sent: an assign() since then (which may have given up a partition and
        # taken it again) drops the answer, and the partitions still unread are read again.
        self._reading_starts: InFlight[_Starts, tuple[int, tuple[TopicPartition, ...]]] = (
            InFlight(f"rcoord-{config.group_id}-starts"))
        self._unread_adds = 0
        # Commits of such partitions' offsets the application made (its ticket -> offsets):
        # once landed, each sets the start of those still unstarted; the first fetch waits
        # for those of partitions unstarted then (``_starts_landed``).
        self._start_commits: dict[int, dict[TopicPartition, int]] = {}
        # Partition counts read for commits of partitions not held (_check_exist), and of the
        # consumer's own commits of its positions, held or not (_own_unverified): topic ->
        # (a count it had, time.monotonic() of the read), trusted for a partition watch
        # interval (a topic may be deleted, or created again with fewer partitions).
        self._partition_counts: dict[str, tuple[int, float]] = {}
        # When each partition's latest fetch found it (time.monotonic()): a commit the consumer
        # makes of its position needs no count read then (_own_unverified). A fetch that finds
        # it missing drops it.
        self._fetch_found: dict[TopicPartition, float] = {}
        self._paused: set[TopicPartition] = set()
        # Partitions whose last fetch reached the log end: a fetch shares its record budget
        # among the others (_send_fetch). Only a hint; a stale entry costs one small fetch.
        self._caught_up: set[TopicPartition] = set()
        # Partitions whose last fetch could not read them at their fetch position (its
        # ``offset``): a stream entry there that is not a record, say (``_take``). poll() raises
        # the error while the partition is still there, as Kafka's consumer raises a corrupt
        # record's until the application seeks past it; a later fetch that reads it drops it.
        # (the fetch position, and the error: its offset is -1 for a pending seek_to_*'s read)
        self._unreadable: dict[TopicPartition, tuple[int, CorruptRecordError]] = {}
        # Bytes per record of each partition's last fetched records: the next fetch asks for
        # as many as its byte limits hold at that size, in one step (``_send_fetch``).
        self._record_bytes: dict[TopicPartition, int] = {}
        # When each partition last gave records (a count of fetched partitions): a fetch asks
        # the partitions that gave records longest ago first (``_send_fetch``).
        self._fetched_turn: dict[TopicPartition, int] = {}
        self._fetched_turns = 0
        self._committer = AsyncCommitter(f"rcoord-{config.group_id}-committer")
        self._fetching: InFlight[list[PartitionRecords[ConsumerRecord]], _FetchAsk] = InFlight(
            f"rcoord-{config.group_id}-fetcher")
        self._fetch_retry_at = 0.0  # after a failed fetch, the next waits until then
        self._fetch_waker = FetchWaker()  # ends a parked fetch at close() (_end_calls)
        self._poll_timer = PollTimer(
            config.group_id, max_poll_interval_ms, lambda: self._group, self._stop
        )
        self._next_auto_commit = 0.0
        self._auto_committing: int | None = None  # the committer's ticket of the last auto-commit
        # The committer's ticket of the last commit() whose wait ended before it was done
        # (its timeout, wakeup(), an interrupt): what a later commit() may wait for
        # (``_earlier_commits``).
        self._given_up_commit = 0
        # A revocation poll()'s deadline cut short (``_revoke``): the committer's ticket of its
        # final auto-commit, still in flight; then the hold released once the listener's async
        # commits landed (``_release_hold``).
        self._revocation_commit: int | None = None
        # Before a rebalance's commit is reckoned (``_floors_landed``): what waits, the
        # generation given up (eager) or moved to (cooperative), or a changed subscription
        # (the config ``subscribe()`` made, ``_revoke_unsubscribed``), and the committer's
        # ticket of the newest application commit then in flight of the partitions it
        # commits, which it waits for.
        self._floor_wait: tuple[object, int] | None = None
        self._releasing: tuple[_Hold, int] | None = None  # (the hold, the last commit's ticket)
        # A changed subscription's revocation after the held generation ended: the ticket of
        # the last commit queued during it, which the rejoin with the new subscription waits
        # for (``_unsubscribed_landed``), the change pending meanwhile.
        self._unsubscribed_commit: int | None = None
        # A cooperative revocation's rejoin, due once the commits queued during it landed
        # (``_finish_rejoin``): what requests that rejoin (None when it is due anyway: a new
        # subscription ended the generation), the hold that keeps the member from it, and the
        # ticket of the last commit it waits for (not for commits queued after it).
        self._rejoin_after: tuple[Callable[[], None] | None, _Hold, int] | None = None
        self._close_deadline: float | None = None  # close()'s, while it runs
        self._drain_turn = 0
        self._block_turn = 0
        self._revoking = False
        # Cooperative revoked partitions while on_partitions_revoked runs: no longer fetched
        # or returned (out of _assigned) but still assigned, with their positions (_transition).
        self._pending_revocation: list[TopicPartition] = []
        # A cooperative generation not applied yet because the revocation callback raised
        # WakeupError while applying it, or the application's commits in flight of the
        # partitions it revokes had not landed by poll()'s deadline: the consumer still holds
        # the previous one's partitions (``_hold`` is this one's) and the next poll() applies
        # it again (``_transition``).
        self._interrupted: Generation | None = None
        # A subscription subscribe() changed, for the next poll() to rejoin with (Kafka: the
        # rejoin, and the revocation before it, happen in poll(), between batches).
        self._resubscribe: ConsumerGroupConfig | None = None

    # -- information

    def _coordinator(self, deadline: float | None = None) -> Coordinator:
        if self._group is not None:
            # Connects only (idempotent): offset queries and seeks may come before the first
            # poll(), which is what joins (ConsumerGroup.next()). ``deadline`` bounds the wait
            # for a start another call began (``ConsumerGroup.connect``).
            self._group.connect(None if deadline is None else deadline - time.monotonic())
            return self._group.coordinator
        if self._own_coordinator is None:
            coord = self._coordinator_arg
            if coord is None:
                client = self._config.redis_client
                if client is None:
                    if self._config.redis_url is None:
                        raise ConfigError("redis_url or redis_client must be set")
                    # (one client, whichever start of the coordinator answers: the start is
                    # retried, _query)
                    client = self._owned_client = (self._owned_client
                                                   or client_from_url(self._config.redis_url))
                redis_coord = RedisCoordinator(
                    client, self._config.namespace,
                    commit_required_acks=self._config.commit_required_acks,
                    commit_ack_timeout_ms=self._config.commit_ack_timeout_ms,
                )
                redis_coord.start()
                coord = redis_coord
            self._own_coordinator = coord
        return self._own_coordinator

    @property
    def group(self) -> ConsumerGroup:
        """The group this consumer is subscribed through (IllegalStateError if it is not)."""
        if self._group is None:
            raise IllegalStateError("this consumer is not subscribed; it has no group")
        return self._group

    @property
    def generation(self) -> Generation | None:
        """The generation whose partitions this consumer holds, or None between generations."""
        return self._gen

    @property
    def member_id(self) -> str:
        return self._group.member_id if self._group is not None else ""

    def assignment(self) -> list[TopicPartition]:
        """The partitions currently assigned to this consumer, sorted (inside a cooperative
        ``on_partitions_revoked``, the revoked ones too, as in Kafka)."""
        self._check_open()
        if self._pending_revocation:
            return sorted(self._assigned + self._pending_revocation)
        return list(self._assigned)

    def position(self, tp: TopicPartition, timeout: float | None = None) -> int:
        """The offset of the next record ``poll()`` returns for ``tp`` (an assigned partition).

        After ``seek_to_beginning()``/``seek_to_end()`` not yet evaluated by a ``poll()``, it
        reads the log's edge now, as Kafka's ``position()`` does, and that of every other
        partition awaiting one too, as Kafka's ``updateFetchPositions``: all are evaluated
        then, not the others at a later ``poll()``. A partition whose topic does not exist
        (yet) is asked again every ``retry_backoff_ms`` until
        ``timeout`` seconds have passed (default ``default_api_timeout_ms``, as Kafka's), then
        ``TimeoutError`` is raised (Kafka's TimeoutException); ``wakeup()`` ends the wait
        (``WakeupError``; one pending when it would read raises at once, as Kafka's), and so
        does ``close()`` (``IllegalStateError``); a lost connection is
        retried as long (see ``_query``). Raises ``IllegalStateError`` if ``tp`` is not
        assigned (Kafka's IllegalStateException), and ``InvalidOffsetError`` if it has no
        position (``start_offset="none"``). A partition whose stream cannot be read (its last
        id is not rcoord's: an XADD by hand) raises its ``TopicError`` (UNKNOWN_SERVER_ERROR,
        its ``detail`` saying what mends it) and stays pending; another partition's position
        is not failed by it. Of a partition not started yet (assigned, not sought or fetched)
        whose offset an async commit of the application is carrying, it waits (as long, the
        same way) for that commit and gives its offset, as Kafka's fetch of the committed
        offset does (``_await_start_commit``).
        """
        self._check_open()
        key = self._require_assigned(tp, "read the position of")
        _check_timeout(timeout)
        if key in self._unread:
            self._take_wakeup("position()")
            self._read_starts(timeout)
        if key in self._unstarted:
            self._await_start_commit(key, timeout)
        if key in self._invalid:
            raise self._invalid_offsets_error([key])
        if key not in self._resets:
            self._unstarted.discard(key)  # it has a position now, as Kafka's position() gives
            return self._position[key]
        self._take_wakeup("position()")  # it reads the log's edge: Kafka polls the network
        budget = self._api_timeout_s if timeout is None else float(timeout)
        deadline = time.monotonic() + budget
        while True:
            # Looked at under the lock: a close() from another thread ends the pause below
            # and, until it is done, has dropped the assignment though the consumer is not
            # closed yet (read unlocked, the position was a KeyError); this waits for it.
            with self._single_threaded():
                self._check_open()
                self._require_assigned(key, "read the position of")
                if key in self._invalid:
                    raise self._invalid_offsets_error([key])
                if key not in self._resets:
                    return self._position[key]
                # Every pending reset, as Kafka's updateFetchPositions resets them all.
                pending = {p: (edge, self._fetch_pos[p]) for p, edge in self._resets.items()}
            # Read without the lock, as the other offset queries: a close() from another
            # thread does not wait for it (nor for the pause before the next try).
            left = max(0.0, deadline - time.monotonic())
            found = self._reset_edges(pending, left)
            with self._single_threaded():
                self._check_open()
                for p, offset in found.items():
                    if (not isinstance(offset, TopicError)
                            and self._fetch_pos.get(p) == pending[p][1]):  # (not sought/revoked)
                        self._resolved(p, offset)
                self._require_assigned(key, "read the position of")
                failed = found.get(key)
                if (isinstance(failed, TopicError) and key in self._resets
                        and self._fetch_pos.get(key) == pending[key][1]):
                    # Its stream cannot be read (the detail says what mends it): it stays
                    # pending, and the others' errors are theirs (left pending too).
                    raise failed
            if key in found or key not in self._resets:
                continue  # resolved, or sought meanwhile: look again
            if self._stop.is_set():
                # close() was called (from another thread, a signal handler, or the listener
                # close() runs): the pause would return at once, and read again in a busy loop
                # until the timeout, the close waiting as long when this runs in a listener.
                raise IllegalStateError(
                    f"cannot read the position of {key.topic}-{key.partition}: the consumer "
                    f"is closing, and topic {key.topic!r} has no partition {key.partition} "
                    f"(UNKNOWN_TOPIC_OR_PARTITION)")
            now = time.monotonic()
            if now >= deadline:
                raise TimeoutError(
                    f"the position of {key.topic}-{key.partition} could not be determined "
                    f"within {budget:g} s: topic {key.topic!r} has no partition "
                    f"{key.partition} (UNKNOWN_TOPIC_OR_PARTITION); create it, or pass a "
                    f"longer timeout")
            with self._interruptible():
                self._pause(min(deadline - now, self._config.retry_backoff_ms / 1000))

    def _read_starts(self, timeout: float | None) -> None:
        """Where the ``assign()``ed partitions without a start (``_unread``) start: their
        committed offsets, else the ``start_offset`` policy, read in one OffsetFetch (and log
        read) as Kafka's first ``poll()`` or ``position()`` after ``assign()`` fetches them
        (``initWithCommittedOffsetsIfNeeded``). Before, ``assign()`` read them itself, and
        a commit by another client before the first ``poll()`` (another simple-group
        consumer, ``groups reset-offsets``) was ignored, then written over by the next commit
        of the positions. Read without the lock (a ``close()`` from another thread does not
        wait for it); a partition sought or given up meanwhile keeps what that did.
        ``timeout``: see ``_query`` (``ConnectionLost``, ``TimeoutError``). ``position()``'s;
        ``poll()`` reads them on a thread (``_collect_starts``)."""
        unread = sorted(self._unread)
        if not unread:
            return
        found = self._starts_of(unread, timeout, interruptible=True)
        with self._single_threaded():
            self._check_open()
            self._apply_starts(unread, found)

    def _starts_of(self, unread: list[TopicPartition], timeout: float | None, *,
                   interruptible: bool) -> _Starts:
        """``start_offsets`` of ``unread`` (``_read_starts``), each query as ``_query``."""
        coord = self._started(timeout, interruptible=interruptible)
        missing: set[TopicPartition] = set()
        offsets, committed = start_offsets(
            unread, coord, self._config,
            lambda call, error_of: self._query(call, timeout, error_of,
                                               interruptible=interruptible),
            missing=missing)
        return _Starts(offsets, committed, frozenset(missing))

    def _apply_starts(self, unread: list[TopicPartition], found: _Starts) -> None:
        """Set the starts ``found`` of the partitions of ``unread`` still unread (the lock
        held); one sought or given up meanwhile keeps what that did."""
        offsets, committed = found.offsets, found.committed
        edge = 0 if self._config.start_offset == "earliest" else 1
        for tp in unread:
            if tp not in self._unread:
                continue
            self._unread.discard(tp)
            self._position[tp] = self._fetch_pos[tp] = offsets[tp]
            if offsets[tp] < 0:  # start_offset="none" and nothing committed
                self._invalid[tp] = offsets[tp]
            if tp in committed:
                self._committed[tp] = committed[tp]
            if tp in found.missing:  # (no position until it exists: see assign())
                self._reset_later(tp, edge)

    def _collect_starts(self, deadline: float | None) -> bool:
        """``poll()``'s ``_read_starts``: the read runs on a thread of its own
        (``_reading_starts``), sent if none is in flight, and ``poll()`` waits for it only
        until its deadline (or ``wakeup()``, or ``close()``); one still in flight then is
        collected by a later ``poll()``, as Kafka's ``poll(timeout)`` bounds its fetch of the
        committed offsets by its timer and keeps the request pending for the next. Before,
        ``poll()`` made the read itself, under the consumer's lock, and a Redis that did not
        answer held a ``poll(0.2)`` for the socket timeout (10 s; a client without one, until
        Redis answered). True once the read was collected (applied, or dropped for an
        ``assign()`` made since it was sent: ``_unread_adds``); its ``ConnectionLost`` or
        ``TimeoutError`` (retried for the timeout left to the ``poll()`` that sent it) and any
        other error are raised here."""
        if not self._reading_starts.busy:
            unread = tuple(sorted(self._unread))
            timeout = _remaining(deadline)
            self._reading_starts.start(
                lambda: self._starts_of(list(unread), timeout, interruptible=False),
                (self._unread_adds, unread))
        done = self._reading_starts.wait(_remaining(deadline), self._wakeup, self._stop)
        if done is None:
            return False
        if done.error is not None:
            raise done.error
        adds, unread = done.tag
        assert done.value is not None
        if adds == self._unread_adds:
            self._apply_starts(list(unread), done.value)
        return True

    def _await_start_commit(self, key: TopicPartition, timeout: float | None) -> None:
        """``position()`` of an unstarted partition (``_unstarted``) whose offset the
        application committed meanwhile (``commit_async()`` in the listener, or after
        ``assign()``): wait for that commit (until ``timeout``, ``wakeup()`` or ``close()``)
        and, landed, take it as the start. Kafka's ``position()`` fetches the committed offset
        of a partition without a position, answered after the commits sent before it; here
        the start read before the listener was returned and kept (the partition was started),
        so reading began there and the next commit of the positions undid the application's
        commit. The commit callbacks still run at the next ``poll()``, ``commit()`` or
        ``close()``."""
        # (A copy, taken in one step: a close() on another thread that runs the commit
        # callbacks pops from it, and iterating it then raised "dictionary changed size".)
        pending = self._start_commits.copy()
        tickets = sorted(t for t, offsets in pending.items() if key in offsets)
        if not tickets:
            return
        if not self._committer.finished(tickets[-1]):
            self._take_wakeup("position()")
            budget = self._api_timeout_s if timeout is None else float(timeout)
            # close()'s listener (on_partitions_revoked reading its positions) waits despite
            # the close, within close()'s bound, as its commits do.
            closing = self._closer == threading.get_ident()
            interrupts = () if closing else (self._wakeup, self._stop)
            if closing and self._close_deadline is not None:
                budget = min(budget, max(0.0, self._close_deadline - time.monotonic()))
            if not self._committer.wait_idle(budget, *interrupts, upto=tickets[-1]):
                self._take_wakeup("position()")
                self._check_open()
                if self._stop.is_set() and not closing:
                    raise IllegalStateError(
                        f"cannot read the position of {key.topic}-{key.partition}: the "
                        f"consumer is closing, and a commit of its offset is in flight")
                raise TimeoutError(
                    f"the position of {key.topic}-{key.partition} could not be determined "
                    f"within {budget:g} s: a commit of its offset made before is still in "
                    f"flight (Redis did not answer it); pass a longer timeout")
        with self._single_threaded():
            self._check_open()
            self._require_assigned(key, "read the position of")  # (not revoked meanwhile)
            current = self._commit_target()
            for ticket in tickets:
                done = self._committer.completed(ticket)
                if (done is not None and done.error is None and current is not None
                        and done.token is current[1]):
                    starts = self._start_commits.get(ticket, {})
                    if key in starts:
                        self._note_started({key: starts[key]})

    def _reset_edges(
        self, pending: Mapping[TopicPartition, tuple[int, int]], timeout: float
    ) -> dict[TopicPartition, int | TopicError]:
        """The edges of the pending ``seek_to_*``s, read for ``position()``; a partition that
        does not exist is left out (it stays pending), and one whose stream cannot be read
        (``unreadable_partition``) is answered its ``TopicError``: ``position()`` raises it
        for that partition only. Before, that error was raised for the whole read, so the
        position of every other partition awaiting an edge failed with it."""
        found = self._edges_each([(tp, edge) for tp, (edge, _) in pending.items()], timeout)
        out: dict[TopicPartition, int | TopicError] = {}
        for tp, got in found.items():
            if not isinstance(got, TopicError) or unreadable_partition(got):
                out[tp] = got
            elif got.error is not Errors.UNKNOWN_TOPIC_OR_PARTITION:
                raise got
        return out

    def _edges(self, edges: Sequence[tuple[TopicPartition, int]], timeout: float | None, *,
               missing_ok: bool) -> dict[TopicPartition, int]:
        """Each partition's log edge (0: log start, 1: log end), all in one round trip
        (``_query``'s retries and ``timeout``). A partition that does not exist, or whose
        stream cannot be read (``unreadable_partition``: its ``detail`` says what mends it),
        raises its ``TopicError`` (the first in ``edges``), or is left out with
        ``missing_ok``: it has no edge, as Kafka's ``currentLag`` is empty for a partition
        whose offsets are unknown. Before, such a stream raised for every partition read with
        it, with ``missing_ok`` too (``lag()`` of all partitions failed)."""
        out: dict[TopicPartition, int] = {}
        for tp, got in self._edges_each(edges, timeout).items():
            if not isinstance(got, TopicError):
                out[tp] = got
            elif not (missing_ok and (got.error is Errors.UNKNOWN_TOPIC_OR_PARTITION
                                      or unreadable_partition(got))):
                raise got
        return out

    def _edges_each(self, edges: Sequence[tuple[TopicPartition, int]], timeout: float | None
                    ) -> dict[TopicPartition, int | TopicError]:
        """``_edges``, each partition that has none answered its ``TopicError`` in its place
        (``Coordinator.log_offsets_many``), in the order of ``edges``."""
        coord = self._started(timeout)

        def read() -> dict[TopicPartition, int | TopicError]:
            if not edges:
                return {}
            out: dict[TopicPartition, int | TopicError] = {}
            partitions = [tp for tp, _ in edges]
            for (tp, edge), got in zip(edges, coord.log_offsets_many(partitions), strict=True):
                if isinstance(got, tuple):
                    out[tp] = got[edge]
                else:
                    out[tp] = (got if isinstance(got, TopicError)
                               else TopicError(got, f"{tp.topic}-{tp.partition}"))
            return out

        return self._query(read, timeout)

    def _pause(self, seconds: float) -> None:
        """Wait ``seconds``, less if ``close()`` or ``wakeup()`` comes (``WakeupError``)."""
        end = time.monotonic() + seconds
        while not self._stop.is_set():
            left = end - time.monotonic()
            if left <= 0:
                return
            if self._wakeup.wait(min(left, 0.05)):
                raise WakeupError("position() interrupted by wakeup()")

    # -- positions and flow control (Kafka's seek*, pause, resume)

    def _require_assigned(
        self, tp: TopicPartition | tuple[str, int], action: str
    ) -> TopicPartition:
        key = TopicPartition(*tp)
        if key not in self._position:
            held = _names(self._assigned) or "nothing"
            raise IllegalStateError(
                f"cannot {action} {key.topic}-{key.partition}: it is not assigned to this "
                f"consumer (assigned: {held}); wait for on_partitions_assigned or assign() it"
            )
        return key

    def _partitions_arg(
        self, partitions: list[TopicPartition] | None, action: str
    ) -> list[TopicPartition]:
        if partitions is None:
            return list(self._assigned)
        return [self._require_assigned(tp, action) for tp in partitions]

    def seek(self, tp: TopicPartition, offset: int) -> None:
        """The next ``poll()`` returns records of ``tp`` from ``offset`` on (Kafka's ``seek``).

        Records already fetched for ``tp`` are dropped. An offset outside the log is handled at
        the next fetch by the ``start_offset`` policy, as Kafka's ``auto.offset.reset``. One
        past int64 (which Kafka's ``long`` cannot hold) raises ``ValueError``: taken, it was a
        position no commit could carry, and the coordinator refused every commit holding it,
        the other partitions' positions with it (a ``close()``'s final auto-commit included).
        """
        if (not isinstance(offset, int) or isinstance(offset, bool)
                or not 0 <= offset <= INT64_MAX):
            raise ValueError(f"seek offset must be an int >= 0 and <= {INT64_MAX} (int64), "
                             f"got {offset!r}")
        with self._single_threaded():
            self._check_open()
            key = self._require_assigned(tp, "seek")
            self._reposition(key, offset)

    def _reposition(self, key: TopicPartition, offset: int) -> None:
        """Set the position of ``key`` (a seek), dropping what was fetched from the old one."""
        self._position[key] = self._fetch_pos[key] = offset
        self._unstarted.discard(key)  # a commit no longer moves it
        self._unread.discard(key)  # (the seek wins over the committed offset, as in Kafka)
        self._seeks[key] = next(self._seek_serials)
        self._unacked.pop(key, None)  # the application says where it stands now
        self._commit_floor.pop(key, None)  # ... and its commits go from there
        self._invalid.pop(key, None)
        self._resets.pop(key, None)
        self._unreadable.pop(key, None)
        self._caught_up.discard(key)
        buf = self._buffers.get(key)
        if buf is not None:
            buf.clear()

    def seek_to_beginning(self, partitions: list[TopicPartition] | None = None) -> None:
        """Seek ``partitions`` (default, or an empty list as in Kafka: every assigned one) to
        their log start offsets, evaluated lazily (see ``_seek_to_edge``)."""
        self._seek_to_edge(partitions, 0)

    def seek_to_end(self, partitions: list[TopicPartition] | None = None) -> None:
        """Seek ``partitions`` (default, or an empty list as in Kafka: every assigned one) to
        their log end offsets, evaluated lazily (see ``_seek_to_edge``)."""
        self._seek_to_edge(partitions, 1)

    def _seek_to_edge(self, partitions: list[TopicPartition] | None, edge: int) -> None:
        """As Kafka's ``seekToBeginning``/``seekToEnd`` (``requestOffsetReset``), the edge is
        read at the next fetch (in ``poll()``) or ``position()``, not here: records appended
        before that ``poll()`` are past a ``seek_to_end()``, and until then the partition has
        no position, so a commit or a revocation's auto-commit leaves its committed offset as
        it was (before, the edge read here was committed, and the next owner skipped what the
        application had not read). The call itself reads nothing, so it does not block on
        Redis. A ``seek()`` or a later ``seek_to_*`` replaces it."""
        with self._single_threaded():
            self._check_open()
            given = None if partitions is None else list(partitions)
            wanted = self._partitions_arg(given or None, "seek")  # [] means every one
            for tp in wanted:
                self._reset_later(tp, edge)

    def _reset_later(self, tp: TopicPartition, edge: int) -> None:
        """Leave ``tp`` without a position until its log ``edge`` (0: start, 1: end) is read
        at the next fetch or ``position()``, asked again while the partition does not exist
        (Kafka's ``requestOffsetReset``)."""
        self._reset_markers += 1
        self._reposition(tp, 0)
        self._fetch_pos[tp] = -self._reset_markers  # (< -1: not NO_POSITION)
        self._resets[tp] = edge

    def _resolved(self, tp: TopicPartition, offset: int) -> None:
        """A pending ``seek_to_*`` of ``tp`` read its edge: ``offset`` is the position."""
        self._resets.pop(tp, None)
        self._position[tp] = self._fetch_pos[tp] = offset

    def beginning_offsets(
        self, partitions: list[TopicPartition], timeout: float | None = None
    ) -> dict[TopicPartition, int]:
        """The first offset still in each partition's log (Kafka's ``beginningOffsets``): any
        partition of an existing topic, assigned or not. ``timeout``: see ``_query``."""
        return self._log_edge(partitions, 0, timeout)

    def end_offsets(
        self, partitions: list[TopicPartition], timeout: float | None = None
    ) -> dict[TopicPartition, int]:
        """The offset the next record appended to each partition will get (Kafka's
        ``endOffsets``): any partition of an existing topic, assigned or not. ``timeout``: see
        ``_query``."""
        return self._log_edge(partitions, 1, timeout)

    def _log_edge(
        self, partitions: list[TopicPartition], edge: int, timeout: float | None
    ) -> dict[TopicPartition, int]:
        self._check_open()
        self._take_wakeup("beginning_offsets()" if edge == 0 else "end_offsets()")
        return self._edges([(TopicPartition(*tp), edge) for tp in partitions], timeout,
                           missing_ok=False)

    def offsets_for_times(
        self, timestamps: Mapping[TopicPartition, int], timeout: float | None = None
    ) -> dict[TopicPartition, OffsetAndTimestamp | None]:
        """Per partition, the earliest offset whose record's timestamp (ms) is at or after the
        given one, or None when no record is that recent (Kafka's ``offsetsForTimes``). Any
        partition of an existing topic, assigned or not. ``timeout``: see ``_query``."""
        self._check_open()
        self._take_wakeup("offsets_for_times()")
        asked = {TopicPartition(*tp): ts for tp, ts in timestamps.items()}
        keys = {(tp.topic, tp.partition): ts for tp, ts in asked.items()}
        coord = self._started(timeout)
        found = self._query(lambda: coord.offsets_for_times(keys), timeout)
        return {tp: found[tp] for tp in asked}

    def _started(self, timeout: float | None, *, interruptible: bool = True) -> Coordinator:
        """The coordinator for an offset query with ``timeout`` (``_query``): its start is
        retried as the query is, and a start that a ``poll(timeout)`` began and gave up
        waiting for (still held in the client's own retries) is waited for only until the
        query's timeout, then ``TimeoutError`` (Kafka's TimeoutException)."""
        bounded = _check_timeout(timeout)  # (None: no bound, also for one too long to wait)
        deadline = (None if timeout is not None and bounded is None
                    else time.monotonic() + (self._api_timeout_s if bounded is None else bounded))
        return self._query(lambda: self._coordinator(deadline), timeout,
                           interruptible=interruptible)

    def _query(self, call: Callable[[], T], timeout: float | None,
               error_of: Callable[[T], Errors] | None = None, *,
               interruptible: bool = True) -> T:
        """A read of offsets, retried while Redis is unreachable (``ConnectionLost``) for up to
        ``timeout`` seconds after its first failure, by default ``default_api_timeout_ms``
        (Kafka's ``default.api.timeout.ms``, whose offset queries retry as long); then that
        ``ConnectionLost`` is raised. The public methods make the coordinator's start (the
        first call on Redis) a query too: made outside, a start on a replica of a namespace
        without settings raised "try again" at once. ``wakeup()`` ends the retries
        (``WakeupError``), and so does ``close()``. A refusal (a bad argument, a missing
        permission) is not retried. A ``wakeup()`` pending before the call is raised by the
        public methods (Kafka's ``committed``, ``beginningOffsets``, ``endOffsets``,
        ``offsetsForTimes`` raise it), through ``_take_wakeup``; one that comes during a single
        round trip (no retry to cut short) stays pending for the next call. A replica's answer
        (READONLY, MASTERDOWN) met for the whole ``timeout`` raises ``ReadOnlyReplicaError``,
        which says to give the master's URL (``refused_by_replica``). A coordinator start
        that an earlier ``poll(timeout)`` began and still waits on Redis is waited for only
        until ``timeout``, then ``TimeoutError`` (``_started``). ``error_of``: the answer's
        error, the retriable ones retried as long (``call_with_retries``). Not
        ``interruptible``: on a thread of the consumer's own (``_collect_starts``), whose
        retries a ``wakeup()`` must not end (nor use up: it is the application's thread's);
        ``close()`` still does."""
        _check_timeout(timeout)
        budget = self._api_timeout_s if timeout is None else float(timeout)
        bound = f"{budget * 1000:g} ms (the call's timeout, by default default_api_timeout_ms)"
        with (self._using_client(),
              self._interruptible() if interruptible else contextlib.nullcontext(),
              refused_by_replica(self._config.group_id, bound)):
            return call_with_retries(call, error_of, config=self._config, closing=self._stop,
                                     budget_s=budget)

    @contextlib.contextmanager
    def _using_client(self) -> Iterator[None]:
        """Keep the clients made from ``redis_url`` (the consumer's own, the group's) open
        while a query runs on them. A close() from another thread, past its bound, closed the
        client under a coordinator start held there and the query after it, which connected
        it again (redis-py reconnects a closed client): that connection stayed open as long
        as the consumer. A query begun once the consumer is closed raises, as one begun
        after close() returned does (its client may be closed already)."""
        release = self._group.hold_client() if self._group is not None else None
        with self._client_guard:
            self._client_users += 1
        try:
            self._check_open()
            yield
        finally:
            with self._client_guard:
                self._client_users -= 1
                due = self._client_close_due and not self._client_users
            if release is not None:
                release()
            if due:
                self._close_own_client()

    def pause(self, partitions: list[TopicPartition]) -> None:
        """Stop returning records of ``partitions`` from ``poll()``; they stay assigned (and
        the member stays in the group). Pausing is forgotten when a partition is revoked."""
        with self._single_threaded():
            self._check_open()
            self._paused.update(self._partitions_arg(list(partitions), "pause"))

    def resume(self, partitions: list[TopicPartition]) -> None:
        """Return records of ``partitions`` again, from where they were paused."""
        with self._single_threaded():
            self._check_open()
            self._paused.difference_update(self._partitions_arg(list(partitions), "resume"))

    def paused(self) -> list[TopicPartition]:
        """The paused partitions, sorted."""
        self._check_open()
        return sorted(self._paused)

    @overload
    def committed(
        self, partitions: list[TopicPartition] | None = None, timeout: float | None = None,
        *, metadata: Literal[False] = False,
    ) -> dict[TopicPartition, int]: ...

    @overload
    def committed(
        self, partitions: list[TopicPartition] | None = None, timeout: float | None = None,
        *, metadata: Literal[True],
    ) -> dict[TopicPartition, OffsetAndMetadata | None]: ...

    def committed(
        self, partitions: list[TopicPartition] | None = None, timeout: float | None = None,
        *, metadata: bool = False,
    ) -> dict[TopicPartition, int] | dict[TopicPartition, OffsetAndMetadata | None]:
        """Committed offsets from the coordinator (-1: none), of ``partitions`` or the
        assignment. ``metadata=True`` (kafka-python's flag): each as the
        ``OffsetAndMetadata`` that was committed (its metadata string, leader epoch and commit
        time), None where there is none, as Kafka's ``committed()`` answers. A commit to a
        deleted topic (one that does not exist, or was created again since) is none: Kafka
        deletes a topic's offsets with it, and ``assign()`` does not start there. Before, a
        deleted topic's partition answered its old commit while ``start_offset="none"`` raised
        ``NoOffsetForPartitionError`` for it. So is a commit to a partition number past its
        topic's count (stored by a path that skips ``commit()``'s check), as Kafka answers no
        offset there and ``assign()`` takes it. ``timeout``: see ``_query``; a pending
        ``wakeup()`` raises ``WakeupError`` before anything is read."""
        self._check_open()
        wanted = list(partitions if partitions is not None else self._assigned)
        if not wanted:
            return {}
        self._take_wakeup("committed()")
        coord = self._started(timeout)
        result = self._query(lambda: coord.fetch_offsets(self._config.group_id, wanted), timeout)
        judged = topics_to_judge(result.offsets)
        if judged:  # a commit to a deleted topic of the same name is none (Kafka deletes it)
            created = self._query(lambda: coord.created_times(judged), timeout)
            stale = older_than_their_topic(result.offsets, created)
            # A topic without a creation time may be deleted: a commit to a partition of it
            # that does not exist is none, as start_offsets takes it (Kafka deletes a topic's
            # offsets with it); no read while every topic committed to exists.
            # (An illegal name, which only a commit bypassing the check can hold, is no topic.)
            absent = [t for t in judged if t not in created]
            # A commit to a partition past an existing topic's count (one a commit bypassing
            # the check stored) is none too: Kafka stores none for such a partition (its broker
            # refuses it) and answers no offset; start_offsets takes it as none too. A held
            # partition with a position existed when assigned (the leader read the counts, or
            # assign()'s log read found it; one not found waits in _resets); for the others,
            # a count read of the last partition watch interval answers for the partitions
            # below it, else one is read: it proves those exist, not that one past it is
            # missing (the topic may have grown since; the commit checks read again too).
            suspect = {tp for tp, om in result.offsets.items() if om.offset >= 0
                       and tp.topic in created
                       and (tp not in self._position or tp in self._resets
                            or tp in self._unread)}
            since = time.monotonic() - self._config.partition_watch_interval_ms / 1000
            kept = {t: _fresh_count(self._partition_counts.get(t), since)
                    for t in {tp.topic for tp in suspect}}
            counts = {t: n for t, n in kept.items()
                      if all(tp.partition < n for tp in suspect if tp.topic == t)}
            unsure = sorted({tp.topic for tp in suspect} - counts.keys())
            legal = [t for t in absent if legal_topic(t)] + unsure
            if legal:
                counts |= self._query(lambda: coord.partition_counts(legal), timeout)
                self._note_counts(unsure, counts)
            stale |= {tp for tp, om in result.offsets.items() if om.offset >= 0
                      and (tp.topic in absent or tp in suspect)
                      and tp.partition >= counts.get(tp.topic, 0)}
            result = replace(result, offsets={tp: OffsetAndMetadata(-1) if tp in stale else om
                                              for tp, om in result.offsets.items()})
        if metadata:  # (OffsetFetch answers offset -1 for a partition nothing was committed to)
            return {tp: got if (got := result.offsets.get(tp)) is not None and got.offset >= 0
                    else None for tp in wanted}
        return {tp: result.offsets[tp].offset if tp in result.offsets else -1 for tp in wanted}

    def lag(self, timeout: float | None = None) -> dict[TopicPartition, int]:
        """Records between the position and the log end, per assigned partition. A partition
        that does not exist (an ``assign()``ed one not created yet, or of a topic deleted
        until the next rebalance drops it) is left out, as one without a position is: it has
        no log end (Kafka's ``currentLag`` is empty then); before, the whole call raised
        ``TopicError`` for it, so one missing partition hid the lag of all the others. So is
        one whose stream cannot be read (its last id is not rcoord's: ``end_offsets()`` of it
        raises its error). ``timeout``: see ``_query``."""
        self._check_open()
        held = [tp for tp in self._assigned if tp not in self._invalid and tp not in self._resets
                and tp not in self._unread]
        # (a partition without a position has no lag: Kafka's currentLag is empty then)
        ends = self._edges([(tp, 1) for tp in held], timeout, missing_ok=True)
        return {tp: max(0, end - self._position.get(tp, end)) for tp, end in ends.items()}

    # -- the poll loop

    def poll(
        self, timeout: float | None = 1.0, max_records: int | None = None
    ) -> list[ConsumerRecord]:
        """Records of the assigned partitions: as soon as there are some, else [] after ``timeout``.

        Runs the rebalance callbacks and auto-commit as described in the module docstring.
        Raises what the group's ``next()`` raises (a join error, once; a fatal error such as
        ``JoinRefusedError``, ``FencedInstanceIdError``, ``MissingPermissionError`` or
        ``AuthenticationFailedError``, from then on) and what the listener raises (after the
        rebalance step completed), but not that Redis or the coordinator could not be reached:
        as Kafka's poll(), it keeps trying and returns no records meanwhile (the group logs it).

        It returns by ``timeout`` even while Redis does not answer: the fetch and the
        auto-commit run on background threads and stay in flight for a later poll() to collect
        (``_fetch``, ``_maybe_auto_commit``), as does the read of where ``assign()``ed
        partitions start (``_collect_starts``), and so do a revocation's commits (a changed
        subscription's too), which the member's rejoin waits for instead (``_revoke``,
        ``_finish_rejoin``). Not bounded by it: the listener.
        """
        limit = self._max_poll_records if max_records is None else max_records
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
            raise ValueError(f"max_records must be an int >= 1, got {max_records!r}")
        timeout = _check_timeout(timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._single_threaded():
            self._check_open()
            self._poll_thread = threading.get_ident()
            self._unacked = {}  # the application came back: what it was handed is processed
            self._poll_timer.poll_started()
            try:
                with self._own_call(), self._interruptible():
                    records = self._poll(deadline, limit)
            finally:
                self._poll_timer.poll_finished()
                self._run_deferred_close()
            return [] if self._closed else records

    @contextlib.contextmanager
    def _single_threaded(self) -> Iterator[None]:
        """Enter a call, refusing a second thread while one is inside (Kafka's acquire()); then
        take the lock, which only close() (from any thread) contends for."""
        me = threading.get_ident()
        if self._closer == me:
            # close() runs here (from any thread), holding the lock: its listener may commit.
            with self._lock:
                yield
            return
        with self._owner_guard:
            if self._owner is not None and self._owner != me:
                raise ConcurrentModificationError(
                    "Consumer is not safe for multi-threaded access: another thread is inside a "
                    "call of this consumer (poll(), commit(), seek() ...); use it from one thread "
                    "(only close() and wakeup() may come from another)"
                )
            self._owner = me
            self._owner_depth += 1
        try:
            with self._lock:
                yield
        finally:
            with self._owner_guard:
                self._owner_depth -= 1
                if self._owner_depth == 0:
                    self._owner = None

    @contextlib.contextmanager
    def _own_call(self) -> Iterator[None]:
        """Marks the block as this thread's poll() or commit() (see ``_inside``)."""
        outer = self._inside
        self._inside = threading.get_ident()
        try:
            yield
        finally:
            self._inside = outer

    def _listen(self, method: str, partitions: list[TopicPartition]) -> None:
        """Calls the listener's ``method``; it may close() this consumer at once (it runs
        between the steps of the call, not in the middle of one)."""
        outer, self._inside = self._inside, None
        try:
            with self._poll_timer.listener_running():  # its time counts, as in Kafka
                _call(self._listener, method, partitions)
        finally:
            self._inside = outer

    def _run_deferred_close(self) -> None:
        """Runs the close() a signal handler asked for inside this thread's call: the records
        that call drained are not committed (they were never handed out, or only now)."""
        if self._deferred_close is not None and self._inside is None:
            (timeout,) = self._deferred_close
            self._deferred_close = None
            self._do_close(timeout, handed_out_unprocessed=True)

    @contextlib.contextmanager
    def _interruptible(self) -> Iterator[None]:
        """The block's retries end at ``wakeup()`` (``retry.interruptible_by``), and the
        ``WakeupError`` that ends them uses the wakeup up: it is raised once per call."""
        try:
            with interruptible_by(self._wakeup):
                yield
        except WakeupError:
            self._wakeup.clear()
            raise

    def _take_wakeup(self, call: str) -> None:
        """Raise the pending ``wakeup()``, once, at the start of a call that would block on
        Redis: Kafka raises a pending WakeupException from the next ``poll``, ``commitSync``,
        ``committed``, ``position``, ``beginningOffsets``, ``endOffsets`` or
        ``offsetsForTimes``, not only the next ``poll``. Before, only ``poll()`` raised it, so
        a loop stopped by ``wakeup()`` while the application was inside ``commit()`` or an
        offset query ran on until it polled again. Not inside ``close()`` (its listener's
        commits): Kafka's close disables wakeups, so a final commit is not refused by one."""
        if self._closer == threading.get_ident():
            return
        if self._wakeup.is_set():
            self._wakeup.clear()
            raise WakeupError(f"{call} interrupted by wakeup()")

    def wakeup(self) -> None:
        """Make the ``poll()`` or ``commit()`` blocked now in another thread, or else the next
        call that would block on Redis (``poll()``, ``commit()``, ``committed()``,
        ``position()`` when it must read the log, ``beginning_offsets()``, ``end_offsets()``,
        ``offsets_for_times()``), raise ``WakeupError`` (Kafka's ``wakeup()``), within about
        ``fetch_max_wait_ms``: the way to stop a poll loop from a signal handler or another
        thread and still commit and close from the loop's own thread. Raised once: the
        wakeup is used up by the call that raises it. ``close()`` ignores it, as Kafka's.

        It also cuts short the retries of the call that thread is blocked in (an offset query
        retrying against an unreachable coordinator, for up to a session timeout otherwise):
        the pause ends and that call raises ``WakeupError``. The heartbeat's retries, in their
        own thread, go on, and so do a commit's, made on the committer thread. It ends
        ``commit()``'s wait for earlier commits too, before it sends anything, and for
        its own commit (which stays in flight, as after its timeout), and ``poll()``'s waits
        for its auto-commit, its fetch and a revocation's commits, which stay in flight (a
        later ``poll()`` collects them and goes on with the revocation). In ``unsubscribe()``
        it ends the final commit's retries and its wait for the member's join; the member
        still leaves, then ``unsubscribe()`` raises it (``_leave_woken``)."""
        self._wakeup.set()
        self._wake_waits()

    def _wake_waits(self) -> None:
        """Make the waits of a call in another thread look at ``_wakeup`` and ``_stop`` now:
        ``poll()``'s for its fetch and its auto-commit, ``commit()``'s for its commit."""
        self._committer.interrupt_waits()
        self._fetching.interrupt_waits()
        self._reading_starts.interrupt_waits()

    def _poll(self, deadline: float | None, limit: int) -> list[ConsumerRecord]:
        """``poll()``'s loop, with the lock held and the poll timer stopped."""
        self._run_commit_callbacks()
        if not self._apply_subscription(deadline):
            self._take_wakeup("poll()")
            return []  # (a changed subscription's revocation waits: ``_revoke_unsubscribed``)
        while True:
            self._take_wakeup("poll()")
            if self._stop.is_set():
                return []  # closed meanwhile (from the listener, or another thread)
            self._settle(deadline)
            if self._stop.is_set():
                return []
            self._release_hold(deadline)
            if not self._finish_rejoin(deadline):
                self._take_wakeup("poll()")
                return []  # (as for the first step's)
            if self._gen is None and self._group is None:
                if not self._assigned_manually:
                    raise IllegalStateError(
                        "this consumer is neither subscribed nor assigned any partitions; "
                        "call subscribe() or assign() first"
                    )
            elif self._gen is None:
                gen = self._next_generation(_slice(deadline, 0.1))
                if gen is None:
                    if _expired(deadline):
                        return []
                    continue
                self._begin(gen)
                continue
            self._maybe_auto_commit(deadline)
            if self._must_revoke():
                # The generation ended while this poll() ran (the auto-commit just learnt that the
                # member is gone, or the heartbeat did): its partitions go before any record of
                # them is handed out, since another member may own them already.
                if _expired(deadline):
                    return []
                continue
            if self._unread:
                try:
                    collected = self._collect_starts(deadline)
                except (ConnectionLost, TimeoutError):
                    # Redis away: as Kafka's poll() when its fetch of committed offsets times
                    # out, no records meanwhile; a later try reads them (logged by the retries).
                    collected = False
                if not collected or self._unread:
                    # (still in flight, failed, or dropped: the loop's top looks at wakeup()
                    # and close() before the next wait or read)
                    if _expired(deadline):
                        return []
                    continue
            if (self._unstarted and not self._starts_landed(deadline)
                    and not _expired(deadline)):
                continue  # (woken up, or closing: the loop's top says)
            # (A commit still held up by then: the unstarted partitions are not fetched, the
            # others are, as Kafka's poll() fetches those with a position when its fetch of
            # committed offsets timed out.)
            records = self._drain(limit)
            if records:
                return records
            invalid = [tp for tp in self._invalid
                       if tp not in self._paused and tp not in self._unstarted]
            if invalid or self._unreadable_now():
                # As Kafka's fetch collector: the other partitions' records come first, the
                # error only in a poll that has none. Raising before any fetch stalled every
                # partition behind one out of range, and pausing it did not help.
                self._fetch(time.monotonic())  # collects a fetch under way, or starts one
                records = self._drain(limit)
                if records:
                    return records
                if invalid:
                    raise self._invalid_offsets_error(invalid)
                unreadable = self._unreadable_now()
                if unreadable:
                    raise unreadable[0]
            if not self._fetch(deadline) and _expired(deadline):
                return []

    def __iter__(self) -> Iterator[ConsumerRecord]:
        """Every record, forever (until ``close()``): ``poll()`` in a loop, its batches handed
        out one record at a time.

        As kafka-python's iterator, a partition's position moves past each record as it is
        handed out (``poll()`` moves it past the whole batch): a ``commit()`` or ``position()``
        in the loop body counts the records up to the one the loop is on, not the rest of the
        batch. A ``seek()`` in the body applies at once (the batch's other records of that
        partition are not handed out), and so does a ``pause()`` (they come again after
        ``resume()``); before, both waited for the batch's end.

        A close() from another thread commits up to the record the loop is on, not past it;
        and a loop left at a record (``break``, an exception in its body, the iterator dropped)
        leaves each partition's position at the first record of it the loop has not asked past,
        unless the body sought it, so a new loop, ``poll()``, ``commit()`` or ``close()`` goes
        on from there (at least once: the record the loop was on comes again)."""
        while not self._stop.is_set():
            batch = self.poll(timeout=1.0)
            seeks = self._batch_start(batch)
            for i, record in enumerate(batch):
                if self._stop.is_set():
                    return  # closed (or closing) meanwhile: no record comes after close()
                tp = TopicPartition(record.topic, record.partition)
                if i > 0:
                    before = batch[i - 1]
                    done = TopicPartition(before.topic, before.partition)
                    if done != tp and self._seeks.get(done, 0) == seeks[done]:
                        # A batch holds each partition's records together (_drain): the loop
                        # asked past the last one of that partition, so a close() now does not
                        # rewind it to that record.
                        self._unacked[done] = before.offset + 1
                if self._seeks.get(tp, 0) != seeks[tp] or tp not in self._position:
                    # Sought or revoked in the loop body: these records are stale. Or given up
                    # and assigned again (its serial forgotten with it): it starts at its
                    # committed offset, and handed out, these records came again from there
                    # at the next poll().
                    continue
                if tp in self._paused:
                    # Paused in the loop body: the rest of its records come after resume().
                    self._rewind(tp, record.offset)
                    continue
                with self._lock:  # not between close()'s rewind and its commit
                    if self._stop.is_set():
                        return
                    self._position[tp] = record.offset + 1
                    self._unacked[tp] = record.offset
                left = True
                self._iterating = threading.get_ident()
                try:
                    yield record
                    left = False
                finally:
                    self._iterating = None
                    if left:
                        self._hand_back(batch[i:], seeks)

    def _batch_start(self, batch: list[ConsumerRecord]) -> dict[TopicPartition, int]:
        """Set the position of each partition of ``batch`` back to its first record there,
        for the iterator to move record by record; the partitions' seek counts now."""
        seeks: dict[TopicPartition, int] = {}
        with self._lock:
            for record in batch:
                tp = TopicPartition(record.topic, record.partition)
                if tp not in seeks:
                    seeks[tp] = 0  # (not assigned: its records are stale)
                    if tp in self._position:
                        seeks[tp] = self._seeks.setdefault(tp, next(self._seek_serials))
                        if not self._stop.is_set():
                            self._position[tp] = record.offset
        return seeks

    def _rewind(self, tp: TopicPartition, offset: int) -> None:
        """Go back to ``offset`` of ``tp``, dropping what was fetched after it (the records
        after the batch), as a seek does; the seek of a consumer closed meanwhile is left."""
        with self._lock, contextlib.suppress(IllegalStateError, ConcurrentModificationError):
            floor = self._commit_floor.get(tp)  # (not close()'s commit in between)
            self.seek(tp, offset)
            if floor is not None:  # not the application's seek: what it committed stands
                self._commit_floor[tp] = floor

    def _hand_back(self, records: list[ConsumerRecord], seeks: dict[TopicPartition, int]) -> None:
        """The iterator was left at ``records[0]``: each partition of the records not handed
        out goes back to its first one (dropping what was fetched after the batch), so the next
        loop neither skips them nor gets records twice, and ``close()`` does not commit them.
        A partition the loop body sought (its position is the application's), no longer
        assigned, assigned again (it starts at its committed offset, or is started from it
        already: the seek back to the old assignment's record overrode that), or a consumer
        closed or closing meanwhile (whose close goes back to the record the loop was on by
        itself), is left alone."""
        firsts: dict[TopicPartition, int] = {}
        for r in records:
            firsts.setdefault(TopicPartition(r.topic, r.partition), r.offset)
        for tp, offset in firsts.items():
            if tp in self._position and self._seeks.get(tp, 0) == seeks[tp]:
                self._rewind(tp, offset)

    # -- commits

    def commit(
        self, offsets: Mapping[TopicPartition, int | OffsetAndMetadata] | None = None,
        timeout: float | None = None,
    ) -> None:
        """Commit ``offsets`` (next offset to read, per partition), or every current position.

        Fenced by the generation: raises ``CommitFailedError`` if the group rebalanced since
        (then the partitions are revoked at the next ``poll()``), and, as Kafka's
        ``commitSync``, ``RebalanceInProgressError`` while this member is joining the group
        (it holds no generation since ``poll()`` began a rebalance, or a cooperative rejoin
        has not been taken by ``poll()`` yet): nothing was committed and nothing is lost;
        ``poll()`` completes the rebalance, then the commit of the partitions still assigned
        can be made again. A negative offset raises ``ValueError`` and nothing is committed,
        as Kafka's ``OffsetAndMetadata`` refuses one; an offset of a partition that does not
        exist raises ``TopicError`` (UNKNOWN_TOPIC_OR_PARTITION), nothing committed either
        (``_check_exist``). Without ``offsets``, the positions of partitions that no longer
        exist (a topic deleted while held) are skipped with a warning and the others committed
        (``_skip_missing``), as are auto-commit's, a revocation's and ``close()``'s; and, as
        Kafka's ``allConsumed()``, only partitions with a position: not one assigned and not
        yet sought, asked ``position()`` of or polled (``_positions``).

        ``timeout`` (Kafka's ``commitSync(timeout)``): seconds the call waits, by default
        ``default_api_timeout_ms``; then it raises ``TimeoutError`` (Kafka's
        TimeoutException). The commit is made on the committer thread, behind the async
        commits queued before it, and waited for: one that Redis has not answered by then
        stays in flight (its retries bounded by a session timeout) and **may still land**
        after ``TimeoutError`` (its failure is logged); every commit made after it is sent
        after it, so it never overwrites a newer one. Commit again, or read ``committed()``,
        to know. A ``TimeoutError`` while earlier commits are still in flight (async ones, or
        a ``commit()`` given up on; the message says which) means nothing of this commit was
        sent. Before, the commit ran on the caller's thread with no
        bound of its own: each retry held redis-py's whole retry cycle (or a socket timeout),
        so a Redis that did not answer held ``commit()`` for several session timeouts.

        ``wakeup()`` (Kafka's ``commitSync``): one pending at the call raises ``WakeupError``
        before anything is sent; one that comes while earlier commits are awaited
        raises it then, nothing sent; one that comes while this commit is in flight raises it
        at once, the commit left in flight as after a timeout (it may still be applied, as in
        Kafka): commit again, or read ``committed()``, to know.
        """
        given = None if offsets is None else commit_offsets_arg(offsets)
        bounded = _check_timeout(timeout)
        budget = self._api_timeout_s if timeout is None else bounded
        with self._single_threaded():
            self._check_open()
            self._take_wakeup("commit()")
            deadline = None if budget is None else time.monotonic() + budget
            try:
                with self._own_call(), self._interruptible():
                    self._commit(given, deadline, budget)
            finally:
                self._run_deferred_close()

    def _commit(
        self, given: Mapping[TopicPartition, int | OffsetAndMetadata] | None,
        deadline: float | None, budget: float | None,
    ) -> None:
        """commit()'s body, with the lock held: the commit runs on the committer thread (which
        keeps commits in order) and is waited for until ``deadline`` (``budget`` seconds after
        the call), so an attempt held by Redis never overruns it, and a commit given up on is
        never overtaken by a later one (an attempt abandoned on this thread could land after
        a newer commit and move the offset back)."""
        # close()'s listener commits despite a wakeup (Kafka's close disables wakeups).
        interrupts = () if self._closer == threading.get_ident() else (self._wakeup,)
        if self._committer.pending and not self._committer.wait_idle(
                _remaining(deadline), *interrupts):
            self._commit_wait_ended(budget, f"{self._earlier_commits()}; nothing of this "
                                    "commit was sent")
        self._run_commit_callbacks()
        target = self._commit_target()
        if target is None:
            if given:
                raise _no_generation(self._group)
            return
        commit, token = target
        wanted: Mapping[TopicPartition, int | OffsetAndMetadata]
        if given is not None:
            wanted, unknown = given, self._unverified(given)
        else:
            wanted = self._positions()
            unknown = self._own_unverified(wanted)
        if not wanted:
            # Nothing to send (as Kafka's commitOffsetsSync for empty offsets): an empty job
            # waited for on the committer would raise TimeoutError with timeout=0.
            return
        own = given is None
        group_id, bound = self._config.group_id, retry_bound(self._config)

        def run() -> None:  # (on the committer thread: the checks may read Redis)
            offsets = wanted
            if own and unknown:
                offsets = self._skip_missing(wanted, unknown, "commit()")
            elif unknown:
                self._check_exist(unknown)
            with refused_by_replica(group_id, bound):
                commit(offsets)

        plain = {
            TopicPartition(*tp): off.offset if isinstance(off, OffsetAndMetadata) else int(off)
            for tp, off in wanted.items()}
        outcome = _SyncCommit()
        ticket = self._submit_app_commit(run, plain, outcome.done, token, own)
        try:
            landed = self._committer.wait_idle(_remaining(deadline), *interrupts, upto=ticket)
        except BaseException:
            # A KeyboardInterrupt (a signal handler's exception) ends the wait too, the commit
            # in flight: it is given up on as after a timeout, so a failure is still logged.
            outcome.abandoned = True
            self._given_up_commit = ticket
            raise
        if not landed:
            outcome.abandoned = True
            self._given_up_commit = ticket
            self._commit_wait_ended(budget, "it is still in flight and may land later; "
                                    "later commits are sent after it")
        self._run_commit_callbacks()  # ours, which notes the offsets committed
        if outcome.error is not None:
            raise outcome.error

    def _earlier_commits(self) -> str:
        """What ``commit()`` is waiting for before it sends its commit, said as it is: it
        called them all "earlier async commits", also an earlier ``commit()`` that had raised
        before it was done (its timeout, ``wakeup()``), which the application had not made
        asynchronously and may take for failed."""
        n = self._committer.pending
        are = "commits are" if n > 1 else "commit is"
        given_up = self._given_up_commit
        if given_up and not self._committer.finished(given_up):
            return (f"{n} earlier {are} still in flight: a commit() that timed out or was "
                    "interrupted (it may still land)" + (", and async ones" if n > 1 else ""))
        return f"{n} earlier async {are} still in flight (commit_async() or auto-commit)"

    def _commit_wait_ended(self, budget: float | None, state: str) -> None:
        """Raise what ends commit()'s wait before its commit finished: ``WakeupError`` when
        ``wakeup()`` ended it (using the wakeup up), else ``TimeoutError``."""
        if self._wakeup.is_set() and self._closer != threading.get_ident():
            self._wakeup.clear()
            raise WakeupError(f"commit() interrupted by wakeup(): {state}")
        raise TimeoutError(
            f"commit() timed out after {budget:g} s (its timeout, by default "
            f"default_api_timeout_ms) waiting for Redis: {state}")

    def commit_async(
        self,
        offsets: Mapping[TopicPartition, int | OffsetAndMetadata] | None = None,
        callback: OffsetCommitCallback | None = None,
    ) -> None:
        """Commit ``offsets`` (default: the current positions) in the background.

        As Kafka's ``commitAsync``: commits are sent one at a time in the order of the calls, so
        a later commit is never overtaken by an earlier one's retry, and ``callback(offsets,
        exception)`` (exception None on success; ``CommitFailedError`` when fenced, and
        ``RebalanceInProgressError`` as in ``commit()``) runs in that same order, from a later
        ``poll()``, ``commit()`` or ``close()`` in the caller's thread, never from the
        background thread. ``commit()`` waits for earlier async commits.
        A negative offset raises ``ValueError`` here, at the call, as in ``commit()``; an
        offset of a partition that does not exist is the callback's ``TopicError``
        (``_check_exist``), nothing of that call committed. Without ``offsets``, partitions
        that no longer exist are skipped, as in ``commit()``, and only partitions with a
        position are committed (Kafka's ``allConsumed()``): not one assigned and not yet
        sought, asked ``position()`` of or polled (``_positions``); with none, the callback
        gets ``({}, None)``.
        """
        if callback is not None and not callable(callback):
            raise TypeError(f"callback must be callable(offsets, exception), got {callback!r}")
        given = None if offsets is None else commit_offsets_arg(offsets)
        with self._single_threaded():
            self._check_open()
            target = self._commit_target()
            wanted = given if given is not None else self._positions()
            plain = {
                TopicPartition(*tp): off.offset if isinstance(off, OffsetAndMetadata) else int(off)
                for tp, off in wanted.items()
            }
            if target is None:
                refused = _no_generation(self._group) if plain else None
                self._committer.complete_now(plain, refused, callback)
                return
            commit, token = target
            own = given is None  # its positions: the missing partitions are skipped, logged
            unknown = self._own_unverified(wanted) if own else self._unverified(wanted)
            if not unknown:
                self._submit_app_commit(lambda: commit(wanted), plain, callback, token, own)
                return

            def checked() -> None:  # (on the committer thread: it reads Redis)
                if own:
                    commit(self._skip_missing(wanted, unknown, "commit_async()"))
                    return
                self._check_exist(unknown)
                commit(wanted)

            self._submit_app_commit(checked, plain, callback, token, own)

    def _submit_app_commit(self, run: Callable[[], None], offsets: dict[TopicPartition, int],
                           callback: OffsetCommitCallback | None, token: object,
                           own: bool) -> int:
        """Queue an application's commit (``commit()``, ``commit_async()``) of ``offsets``: its
        floor (``_note_commit_floor``) and, when it named its offsets (not ``own``: the
        consumer's positions), the starts it sets once it lands (``_note_start_commit``)."""
        ticket = self._submit_commit(run, offsets, callback, token)
        self._note_commit_floor(ticket, offsets)
        if not own:
            self._note_start_commit(ticket, offsets)
        return ticket

    def _note_commit_floor(self, ticket: int, offsets: Mapping[TopicPartition, int]) -> None:
        """The application commits ``offsets``: the consumer's own commits of the partitions
        held do not go below them (``_commit_floor``). Noted as the commit is queued, not as
        it lands: commits are sent in that order, and close()'s final commit, reckoned before
        an async commit's callback had run, was sent after it and undid it. Their committed
        offsets are not known until it lands (``_committed``, which the consumer's commits
        leave out when unchanged): close() after ``commit_async()`` of an older offset left
        that offset, where Kafka's close() commits the consumed positions after it."""
        for tp, offset in offsets.items():
            if tp in self._position:
                self._commit_floor.setdefault(tp, []).append((ticket, offset))
                self._committed.pop(tp, None)

    def _settle_commit_floor(self, ticket: int, offsets: Mapping[TopicPartition, int],
                             landed: bool) -> None:
        """The commit ``ticket`` of ``offsets`` finished. Landed, the application's commits
        before it no longer matter to the floor (``_commit_floor``). Failed, it commits
        nothing, so it holds the consumer's own commits back no more (as in Kafka, where a
        failed ``commitAsync`` pins nothing): the floor goes back to the application's commit
        before it. Before, a ``commit()`` that failed for good at record 3 (4) kept close()
        from committing 3, leaving an older offset, until the next seek or rebalance."""
        for tp in offsets:
            floors = self._commit_floor.get(tp)
            if floors is None or all(t != ticket for t, _ in floors):
                continue  # (the consumer's own commit, or one from before a seek)
            floors[:] = [(t, o) for t, o in floors if (t >= ticket if landed else t != ticket)]
            if not floors:
                del self._commit_floor[tp]

    def _note_start_commit(self, ticket: int, offsets: Mapping[TopicPartition, int]) -> None:
        """A commit of ``offsets`` the application made (``ticket``): once it lands, it sets
        the start of the partitions of them that are unstarted then (``_unstarted``)."""
        if self._unstarted and not self._unstarted.isdisjoint(offsets):
            self._start_commits[ticket] = {
                tp: o for tp, o in offsets.items() if tp in self._unstarted}

    def _unverified(self, offsets: Mapping[TopicPartition, object]) -> list[TopicPartition]:
        """The partitions of a commit's ``offsets`` not known to exist (``_check_exist``)."""
        held = self._position if self._gen is not None else {}
        counts = self._partition_counts
        since = time.monotonic() - self._config.partition_watch_interval_ms / 1000
        return [TopicPartition(*tp) for tp in offsets
                if tp not in held and tp[1] >= _fresh_count(counts.get(tp[0]), since)]

    def _check_exist(self, unknown: list[TopicPartition]) -> None:
        """Raise ``TopicError`` (UNKNOWN_TOPIC_OR_PARTITION) when an offset given to
        ``commit``/``commit_async`` is of a partition that does not exist (its topic, or its
        number past the topic's count): Kafka's broker refuses those partitions (KafkaApis,
        before its group coordinator, which, as rcoord's, does not look at topics), where
        rcoord's coordinator stored them, so a typo in a topic name was a commit that
        "succeeded" and was never read. Nothing of the call is committed: the caller learns of
        the mistake before any offset of it is stored, and commits again with it corrected
        (Kafka's broker stores the others, then its client retries the whole request until
        its timeout). A partition held from the group's assignment exists (the leader read
        the counts); others are looked up once per topic, then the count is trusted for
        ``partition_watch_interval_ms`` (how stale the group's own view of the counts may be),
        so the common commits cost no extra round trip. Kept for good, a count outlived its
        topic: a commit to a topic deleted (or created again with fewer partitions) after its
        count was read was stored for as long as the consumer ran, where Kafka's broker, which
        checks its own current metadata, refuses it at once."""
        missing, found = self._missing(unknown)
        if missing:
            where = "; ".join(
                f"topic {t!r} has {found[t]} partitions" if t in found
                else f"topic {t!r} does not exist" for t in sorted({tp.topic for tp in missing}))
            raise TopicError(
                Errors.UNKNOWN_TOPIC_OR_PARTITION,
                f"commit of {_names(missing)} refused ({where}): nothing of this commit was "
                "stored; commit offsets of existing partitions only")

    def _missing(
        self, unknown: list[TopicPartition], budget_s: float | None = None
    ) -> tuple[list[TopicPartition], dict[str, int]]:
        """Of ``unknown``, the partitions that do not exist (sorted), and the counts read of
        their topics (one round trip, none when ``unknown`` is empty), kept for
        ``partition_watch_interval_ms`` (``_check_exist``). ``budget_s``: how long the read
        is retried after its first failure (``call_with_retries``; 0: one attempt)."""
        if not unknown:
            return [], {}
        coord = self._coordinator()
        topics = sorted({tp.topic for tp in unknown})
        found = call_with_retries(lambda: coord.partition_counts(topics), None,
                                  config=self._config, closing=self._stop, budget_s=budget_s)
        self._note_counts(topics, found)
        return sorted(tp for tp in unknown if tp.partition >= found.get(tp.topic, 0)), found

    def _note_counts(self, topics: Iterable[str], found: Mapping[str, int]) -> None:
        """Keep the counts just read of ``topics`` (``found``: those that exist) for the
        commit checks; a topic missing from ``found`` leaves the cache."""
        counts = self._partition_counts
        if len(counts) + len(found) > _COUNTS_KEPT:
            counts.clear()  # (a bound: a pattern consumer may see many short-lived topics)
        now = time.monotonic()
        for topic in topics:
            if topic in found:
                counts[topic] = (found[topic], now)
            else:
                counts.pop(topic, None)

    def _own_unverified(self, offsets: Mapping[TopicPartition, object]) -> list[TopicPartition]:
        """The partitions of a commit the consumer makes itself (its positions: auto-commit,
        a revocation's or ``close()``'s commit, ``commit()`` without offsets) that no count
        read within ``partition_watch_interval_ms`` covers. Unlike ``_unverified``, a held
        partition is not taken to exist: its topic may have been deleted since the group
        assigned it (or a never-existing ``assign()``ed one sought), and the next rebalance
        is what drops it. A partition fetched within that interval (and not paused since)
        needs no read either: the fetch found it, so the commits of a consumer that is reading
        cost no extra round trip. Read on the caller's thread (the cache is the consumer's)."""
        counts, found, paused = self._partition_counts, self._fetch_found, self._paused
        since = time.monotonic() - self._config.partition_watch_interval_ms / 1000
        return [TopicPartition(*tp) for tp in offsets
                if not (found.get(tp, -math.inf) >= since and tp not in paused)
                and tp[1] >= _fresh_count(counts.get(tp[0]), since)]

    def _skip_missing(self, offsets: Mapping[TopicPartition, T],
                      unknown: list[TopicPartition], what: str) -> dict[TopicPartition, T]:
        """``offsets`` of a commit the consumer makes itself without the partitions of
        ``unknown`` that do not exist, with one warning naming those. Kafka's broker answers
        such a commit per partition: the existing ones are stored, the missing ones refused
        (UNKNOWN_TOPIC_OR_PARTITION, which its auto-commit logs). rcoord's coordinator stores
        any partition, so a topic deleted while held (until the rebalance that drops it), or
        created again with fewer partitions, got its old positions committed: kept for the
        topic name, and read as the start of a partition added later. Refusing the whole
        commit would instead hold back the existing partitions' progress.

        A check that cannot read the counts commits everything, as before the check existed:
        the commit itself is what must not fail for it. The read is tried once, not retried:
        retried for a session timeout, as it was, a node of the counts out of reach (a
        cluster node down, the group's up) held each such commit (``commit()``, a
        revocation's on the poll thread) that long before it committed everything anyway,
        and with Redis down ``commit()`` took twice as long to fail (the commit retries)."""
        try:
            missing = set(self._missing(unknown, budget_s=0)[0])
        except ConnectionLost as exc:
            log.warning("%s: could not check that %s still exist (%s); committed them",
                        what, _names(unknown), exc)
            return dict(offsets)
        if not missing:
            return dict(offsets)
        log.warning("%s: skipped %s (no such partition: its topic was deleted, or has fewer "
                    "partitions now); the other partitions were committed", what,
                    _names(sorted(missing)))
        return {tp: off for tp, off in offsets.items() if TopicPartition(*tp) not in missing}

    def _positions(self) -> dict[TopicPartition, int]:
        """The positions of the assigned partitions that have one (what a commit sends): not
        those without one (``_invalid``), waiting for a ``seek_to_*`` (``_resets``), or
        unstarted (``_unstarted``: not sought, asked ``position()`` of, or fetched yet).

        Kafka's consumer commits ``allConsumed()``, the partitions with a valid position;
        one assigned (``assign()``, a generation) has none until a poll() fetched its
        committed offset or reset it by the policy. Sent anyway, a ``close()``, ``commit()``
        or auto-commit before that poll wrote the ``start_offset`` policy's edge as the
        group's offset (with "latest", the next owner skipped the records before it, which
        none had read), or wrote the old committed offset back over an async commit the
        listener had made of the partition."""
        if not self._invalid and not self._resets and not self._unstarted:
            return dict(self._position)
        return {tp: p for tp, p in self._position.items()
                if tp not in self._invalid and tp not in self._resets
                and tp not in self._unstarted}

    def _invalid_offsets_error(self, partitions: list[TopicPartition]) -> InvalidOffsetError:
        """What ``poll()`` and ``position()`` raise for partitions without a position: no
        committed offset first (Kafka resets those before it fetches), else out of range."""
        missing = sorted(tp for tp in partitions if self._invalid[tp] < 0)
        how = "seek(), seek_to_beginning() or seek_to_end()"
        if missing:
            return NoOffsetForPartitionError(
                f"no committed offset for {_names(missing)} and start_offset is 'none': "
                f"choose where to start with {how}",
                missing,
            )
        out = {tp: self._invalid[tp] for tp in sorted(partitions)}
        where = ", ".join(f"{tp.topic}-{tp.partition} at {o}" for tp, o in out.items())
        return OffsetOutOfRangeError(
            f"positions out of range of their logs ({where}): records were deleted by "
            f"retention or the topic was created again, and start_offset is 'none': choose "
            f"where to go on with {how}",
            out,
        )

    def _commit_target(self) -> tuple[_CommitFn, object] | None:
        """How to commit now, and the token an async completion is checked against: the
        generation's fenced commit, the simple-group commit of ``assign()``, or None (between
        generations)."""
        if self._gen is not None:
            return self._commit_generation().commit_offsets, self._gen
        if self._assigned_manually:
            return self._commit_simple, _SIMPLE
        return None

    def _await_committer(self, woken: Callable[[], bool] | None = None) -> None:
        # Each job's retries are bounded by a session timeout; this bound only guards against a
        # committer that close() already stopped with jobs left. (commit() waits with its own
        # deadline and wakeup: ``_commit``.) With ``woken`` (``_leave_woken``, unsubscribe()),
        # wakeup() ends the queued commits' retries, which are still waited for (one attempt
        # each, its failure given to its callback), or, after assign(), the wait, which leaves
        # them in flight: before, unsubscribe() waited for them, deaf to wakeup(), a session
        # timeout each against an unreachable Redis.
        limit = 2 * self._config.session_timeout_ms / 1000
        if not self._committer.pending:
            return
        deadline = time.monotonic() + limit  # (one bound for both waits)
        if woken is not None:
            if not self._woken_leaving:
                if self._committer.wait_idle(limit, self._wakeup):
                    return
                if not self._wakeup.is_set():  # (the bound passed)
                    log.warning("async commits still pending after %.0f s; committing anyway",
                                limit)
                    return
            if not woken():
                return
        if self._committer.wait_idle(max(0.0, deadline - time.monotonic())):
            return
        log.warning("async commits still pending after %.0f s; committing anyway", limit)

    def _take_outcomes(self) -> None:
        """Take the finished commits' outcomes into the consumer's books (what is committed,
        the commit floor, the unstarted partitions' starts) now; their callbacks run later, in
        commit order (``_run_commit_callbacks``). An implicit commit reckons its positions
        after this, so that an application's commit that failed holds nothing back; before,
        ``unsubscribe()`` or ``assign()`` right after a refused ``commit_async()`` of a later
        position left the partition uncommitted (its floor still set)."""
        while (done := self._committer.take_completion()) is not None:
            error = done.error
            current = self._commit_target()
            starts = self._start_commits.pop(done.ticket, None)
            self._commits_pending.pop(done.ticket, None)
            self._settle_commit_floor(done.ticket, done.offsets, error is None)
            if error is None and current is not None and done.token is current[1]:
                self._note_committed(done.offsets, done.ticket)
                if starts:
                    self._note_started(starts)
            self._outcomes.append(done)

    def _run_commit_callbacks(self) -> None:
        """Run finished commits' callbacks in commit order, one at a time: a ``commit()`` made
        in one first runs the others finished before it, as Kafka's commitSync runs the
        completed callbacks first (before, they ran after it, and their landings were noted
        over its offset). The first exception a callback raises propagates once they all ran."""
        self._take_outcomes()
        first: BaseException | None = None
        while self._outcomes:
            try:
                done = self._outcomes.popleft()
            except IndexError:
                break  # (another thread's close() took the last)
            error = done.error
            if done.callback is None:
                if error is not None:
                    log.warning("async commit of %s failed: %s", done.offsets, error)
                continue
            try:
                done.callback(done.offsets, error)
            except Exception as exc:  # noqa: BLE001 - re-raised below, after the others ran
                first = first or exc
        if first is not None:
            raise first

    def _submit_commit(self, run: Callable[[], None], offsets: dict[TopicPartition, int],
                       callback: OffsetCommitCallback | None, token: object = None) -> int:
        """Queue a commit of ``offsets`` on the committer, noted pending until its outcome is
        taken (``_commits_pending``); its ticket."""
        ticket = self._committer.submit(run, offsets, callback, token)
        self._commits_pending[ticket] = frozenset(offsets)
        return ticket

    def _note_committed(self, offsets: Mapping[TopicPartition, int], ticket: int) -> None:
        """The commit ``ticket`` of ``offsets`` landed: remember the committed offsets of the
        partitions held now (``_changed_positions`` compares with them). Not of others: a
        commit of offsets of partitions the consumer does not hold, or an async commit whose
        callback ran after ``assign()`` moved off its partitions, left an entry that nothing
        removed, one per such partition for good. Nor of those a commit queued after it and
        still pending will overwrite: an auto-commit's landing, its callback run before the
        application's older ``commit_async()`` queued after it landed, noted the position as
        committed, and close() left that older offset committed."""
        later = self._commits_pending.copy()  # (one step: close() may submit meanwhile)
        overwritten = set().union(*(tps for t, tps in later.items() if t > ticket))
        self._committed.update((tp, offset) for tp, offset in offsets.items()
                               if tp in self._position and tp not in overwritten)

    def _note_started(self, starts: Mapping[TopicPartition, int]) -> None:
        """A commit the application made of unstarted partitions' offsets landed: those still
        unstarted start there, as in Kafka, where the poll() that ran
        ``on_partitions_assigned`` fetches the committed offsets of the partitions without a
        position. Before, they started where the generation's committed offsets (read before
        the listener ran) said, and the next commit of the positions undid the listener's.
        Only the application's commits: an auto-commit or a revocation's sends positions."""
        reading = self._reading_starts.busy
        for tp, offset in starts.items():
            if tp in self._unstarted:
                if reading:
                    # poll()'s read of its start is in flight: its answer may predate this
                    # commit, and it would set the start back over it.
                    self._unread.discard(tp)
                self._position[tp] = self._fetch_pos[tp] = offset
                self._invalid.pop(tp, None)  # (start_offset="none": it has one now)
                self._caught_up.discard(tp)

    def _starts_landed(self, deadline: float | None) -> bool:
        """Before the first fetch after ``on_partitions_assigned``: wait (until ``deadline``,
        ``wakeup()`` or ``close()``) for the commits the application queued of unstarted
        partitions' offsets (``commit_async()`` in the listener), apply them, and end the
        partitions' unstarted time (a commit moves no position after it, as in Kafka, whose
        fetch of the committed offsets is answered after the commits sent before it). False
        if the wait ended first: they stay unstarted, not fetched (``_fetchable``), and the
        next poll() waits again. Nothing is waited for when the listener queued no such
        commit: no round trip is added to a rebalance. Only the commits of partitions
        unstarted now: one of a partition ``assign()`` gave up since (or a seek started)
        sets no start; waited for, a held-up commit of a partition given up kept the new
        ones from being fetched, every poll() until its deadline, until it landed."""
        wait = max((ticket for ticket, starts in self._start_commits.items()
                    if not self._unstarted.isdisjoint(starts)), default=0)
        if wait and not self._committer.wait_idle(
                _remaining(deadline), self._wakeup, self._stop, upto=wait):
            return False
        try:
            self._run_commit_callbacks()
        finally:
            self._unstarted.clear()
        return True

    def _changed_positions(self) -> dict[TopicPartition, int]:
        """The positions that moved since they were last committed, and not below what the
        application committed (``_commit_floor``): what the consumer's own commits send.
        Before, a ``close()`` in the loop body committed the record the loop was on over the
        application's ``commit()`` past it, moving the committed offset back."""
        floors = {tp: entries[-1][1] for tp, entries in self._commit_floor.copy().items()
                  if entries}
        return {tp: pos for tp, pos in self._positions().items()
                if self._committed.get(tp) != pos and pos >= floors.get(tp, pos)}

    def _queue_commit(self, commit: _CommitFn, offsets: dict[TopicPartition, int], what: str,
                      token: object = None) -> int | None:
        """Queue a commit the consumer makes itself on the committer, behind the async commits
        queued before (so it never overtakes one); a failure is logged as ``what``. Its
        ticket; None when ``offsets`` is empty (nothing queued). Partitions that do not exist
        are left out of it (``_skip_missing``, on the committer thread: it may read Redis)."""
        if not offsets:
            return None
        unknown = self._own_unverified(offsets)
        return self._submit_commit(
            lambda: commit(self._skip_missing(offsets, unknown, what) if unknown else offsets),
            offsets, _logged(what), token)

    def _commit_changed(self, commit: _CommitFn,
                        woken: Callable[[], bool] | None = None) -> None:
        """Commit the positions that moved since the last commit, on the committer thread
        behind the async commits queued before (so it never overtakes one, however long they
        retry), and wait for it: a revocation's, which must land before the member rejoins
        (``_revoke``), or ``unsubscribe()``'s after ``assign()``, so the wait is not cut short
        by ``wakeup()``; its error is raised here. Before, it waited for the queued commits for
        two session timeouts at most, then committed on this thread: a simple-group commit
        (``assign()``), which no generation fences, was overtaken by an older async commit
        still in flight, which moved the committed offset back. The commits queued before
        end first and their outcomes are taken (``_take_outcomes``), so that one that failed
        holds nothing back. With ``woken``, ``wakeup()`` ends the wait: ``woken`` is called,
        which ends the commit's retries, and the commit is waited for; or, when it returns
        False, the commit is left in flight, its failure logged (``_leave_woken``); so for the
        commits queued before (``_await_committer``)."""
        self._await_committer(woken)
        self._take_outcomes()
        changed = self._changed_positions()
        if not changed:
            return
        unknown = self._own_unverified(changed)
        outcome: list[BaseException | None] = []

        def run() -> None:  # (on the committer thread: the check may read Redis)
            try:
                commit(self._skip_missing(changed, unknown, "commit") if unknown else changed)
            except Exception as exc:
                outcome.append(exc)
                raise
            outcome.append(None)

        interrupted: list[bool] = []

        def done(offsets: dict[TopicPartition, int], error: BaseException | None) -> None:
            # (its outcome is raised below; logged only when the wait for it was interrupted)
            if interrupted and error is not None:
                log.warning("auto-commit of %s, whose wait an interrupt ended, failed: %s",
                            _names(sorted(offsets)), error)

        ticket = self._submit_commit(run, changed, done)
        try:
            if woken is not None and (self._woken_leaving or not self._committer.wait_idle(
                    None, self._wakeup, upto=ticket)) and not woken():
                interrupted.append(True)
                return
            self._committer.wait_idle(None, upto=ticket)  # (its retries bound it)
        except BaseException:
            # A KeyboardInterrupt ends the wait, the commit in flight: a failure is logged.
            interrupted.append(True)
            raise
        if not outcome:  # failed unsent: close()'s bound passed, the coordinator unreachable
            raise ConnectionLost("commit not sent: close()'s timeout passed and an earlier "
                                 "commit could not reach the coordinator")
        if outcome[0] is not None:
            raise outcome[0]
        self._note_committed(changed, ticket)

    def _maybe_auto_commit(self, deadline: float | None) -> None:
        """Every ``auto_commit_interval_ms``, commit the positions that moved, as Kafka's
        ``maybeAutoCommitOffsetsAsync``: on the committer thread, behind the async commits
        queued before, and waited for only until ``poll()``'s deadline (or ``wakeup()``).

        Redis answers at once, so the commit is done before ``poll()`` hands anything out: when
        it is refused because the member is gone, that poll() revokes and hands out none of
        the lost partitions' records. When Redis does not answer, ``poll()`` still returns by
        its timeout, where it waited for the commit's retries (a session timeout) before, and
        the commit stays in flight: the next poll()s wait for it, none queues another, and its
        outcome (logged if it failed) is applied by a later poll() (``_run_commit_callbacks``).
        """
        target = self._commit_target()
        if not self._auto_commit or target is None or self._revocation_commit is not None:
            return  # (a revocation's final commit in flight commits the same positions)
        ticket = self._auto_committing
        if ticket is None or self._committer.finished(ticket):
            now = time.monotonic()
            if now < self._next_auto_commit:
                return
            self._next_auto_commit = now + self._auto_commit_s
            # (Those finished since poll() began first: a refused commit's floor, left in the
            # books, kept its partition out of every auto-commit while the poll() lasted.)
            self._take_outcomes()
            ticket = self._queue_commit(target[0], self._changed_positions(), "auto-commit",
                                        target[1])
            if ticket is None:
                return
            self._auto_committing = ticket
        # close() from another thread ends the wait too (it interrupts the waits).
        self._committer.wait_idle(_remaining(deadline), self._wakeup, self._stop, upto=ticket)

    # -- generations

    def _begin(self, gen: Generation) -> None:
        hold = _Hold(self._config.rebalance_timeout_ms / 1000)
        try:
            gen.start(hold)
        except GenerationEndedError:
            return  # it ended before we could hold it: nothing was assigned
        except RuntimeError as exc:
            # The hold's thread cannot start (the process's thread limit). Raised from here,
            # the generation stayed live, heartbeating, with no one holding it: every later
            # poll() waited for a next generation that never came, and the partitions sat
            # unread in this member. It ends with the error instead (ERROR_POLICY's "anything
            # else", as a helper thread that cannot start: the member leaves, next() reports
            # the error once, which this poll() raises, and it joins again after the backoff).
            gen._end(EndReason.ERROR, exc)
            return
        self._gen, self._hold = gen, hold
        # Only the subscribed topics' partitions: a custom or foreign leader's assignor may
        # give others, which were consumed and announced (``_transition`` filters likewise).
        offsets = {tp: o for tp, o in gen.offsets.items() if self._subscribed(tp.topic)}
        self._assigned = sorted(offsets)
        self._position = dict(offsets)
        self._fetch_pos = dict(offsets)
        self._invalid = {tp: o for tp, o in offsets.items() if o < 0}
        self._resets = {}
        self._buffers = {tp: deque() for tp in self._assigned}
        self._committed = {tp: c for tp, c in gen.committed.items() if tp in offsets}
        self._unstarted = set(self._assigned)
        self._next_auto_commit = time.monotonic() + self._auto_commit_s
        gen.acknowledge()
        hold.applied.set()  # nothing revoked in taking it
        self._rejoin_for_unsubscribed(gen, given=len(gen.offsets), taken=len(offsets))
        log.info(
            "generation %d: assigned %s",
            gen.generation_id,
            ", ".join(f"{tp.topic}-{tp.partition}" for tp in self._assigned) or "nothing",
        )
        self._listen("on_partitions_assigned", list(self._assigned))

    def _settle(self, deadline: float | None) -> None:
        """If the generation ended: revoke everything (eager, lost, closing), or, when the
        cooperative protocol carries the partitions through the rejoin, take the next generation
        as soon as it is there and apply only what changed (``_transition``)."""
        gen = self._gen
        if gen is None or not gen.done.is_set():
            return
        if not gen.wait_decided(0.5):
            return  # the group decides at once; until then the fetcher pauses
        lost = self._partitions_lost()
        if not gen.carried or lost:
            self._revoke(lost=lost, poll_deadline=deadline, polling=True)
            return
        interrupted, self._interrupted = self._interrupted, None
        if interrupted is not None and self._hold is not None and not interrupted.wait_routines(0):
            # Taken already, its revocation cut short by a WakeupError: apply it again. (Once
            # its routines have returned, its hold gave up waiting: the member rejoined reporting
            # the partitions held here, and the generation after it applies from them.)
            self._transition(interrupted, deadline, self._hold)
            return
        # Rebalancing cooperatively: keep consuming; block only when there is nothing to read.
        wait = 0.0 if self._assigned else _slice(deadline, self._fetch_max_wait_ms / 1000)
        new = self._next_generation(wait)
        if new is None:
            return
        self._transition(new, deadline)

    def _next_generation(self, timeout: float) -> Generation | None:
        """The group's next generation, or None if there is none within ``timeout`` or the
        group reported an error it is already retrying (a ``retry`` row of ``ERROR_POLICY``:
        Redis unreachable, the coordinator unavailable). Kafka's poll() never throws because the
        coordinator cannot be reached: it keeps trying and returns no records; the group's
        thread logged the error. Other errors (fatal ones, and "anything else", which Kafka's
        JoinGroup handler throws from poll() too) are raised."""
        assert self._group is not None
        try:
            return self._group.next(timeout=timeout)
        except TimeoutError:
            return None
        except RcoordError as exc:
            if reaction_for(exc).retry:
                return None
            raise

    def _transition(self, new: Generation, deadline: float | None,
                    hold: _Hold | None = None) -> None:
        """Cooperative (KIP-429): move from the held generation to ``new`` keeping what stays.

        Revoked partitions (owned, not assigned) are stopped and committed, then the listener
        hears ``on_partitions_revoked`` (only if there are any; they keep their positions until
        it returned, so it can commit them), they are removed, and the member rejoins so their
        new owners get them; added ones start at ``new``'s offsets; kept ones go on from this
        consumer's positions (``new`` only knows their committed offsets, which may lag).
        ``on_partitions_assigned`` always runs, with the added partitions only, even when
        ``on_partitions_revoked`` raised (whose exception is raised afterwards, as in Kafka).

        As Kafka's ``onJoinComplete``, the assignment changes only after the revocation
        callback: while it runs, ``assignment()`` is what was held before (the revoked
        partitions included, the added ones not yet). If it raises ``WakeupError`` (or
        ``KeyboardInterrupt``), that is raised at once, as Kafka rethrows a WakeupException,
        and nothing is applied: the consumer keeps what it held, and the next poll() applies
        ``new`` again from the start, revocation callback included (``_interrupted``; ``hold``
        is then ``new``'s hold, already running), as Kafka's next poll() runs
        ``onJoinComplete`` again. Before, the added partitions were assigned (``assignment()``,
        ``position()``) with no ``on_partitions_assigned`` yet, and the revoked ones were
        dropped with their callback cut short, its commits never made.

        The revoked partitions' commits (auto-commit's and the callback's) are waited for only
        until ``deadline``: the rejoin waits for them, ``poll()`` does not (``_finish_rejoin``).
        """
        if hold is None:
            hold = _Hold(self._config.rebalance_timeout_ms / 1000)
            try:
                new.start(hold)
            except GenerationEndedError:
                return  # ended and collected before we held it: the member still reports our set
            except RuntimeError as exc:  # its thread cannot start: as in _begin
                new._end(EndReason.ERROR, exc)
                return
        old = self._gen
        before = set(self._assigned)
        offsets = new.offsets
        revoked = sorted(before - offsets.keys())
        fresh = offsets.keys() - before
        # (Not those of a topic subscribe() dropped since ``new`` was joined: revoked already
        # (``_revoke_unsubscribed``) and no longer reported owned, they went to another member
        # while this one consumed them again, as Kafka's onJoinComplete takes no assignment
        # that does not match the subscription.)
        added = sorted(tp for tp in fresh if self._subscribed(tp.topic))
        if revoked and self._auto_commit and not self._floors_landed(new, revoked, deadline):
            # Their commit waits for the application's commits of them in flight (as Kafka's
            # onJoinComplete runs in poll(), the next poll() goes on): nothing applied yet,
            # the member, in ``new``, held from rejoining by ``hold`` meanwhile.
            self._hold = hold
            if not self._closed:
                self._interrupted = new
            return
        self._revoking = True
        stopped = woken = False
        failed: Exception | None = None  # what on_partitions_revoked raised
        try:
            self._stop_revoked(revoked, new.commit_offsets)
            self._assigned = sorted(before - set(revoked))
            self._pending_revocation = revoked
            self._gen, self._hold = new, hold
            log.info(
                "generation %d -> %d (cooperative): kept %d, revoked %s, added %s",
                old.generation_id if old is not None else -1,
                new.generation_id,
                len(self._assigned),
                _names(revoked) or "nothing",
                _names(added) or "nothing",
            )
            if revoked:
                stopped = True
                # As Kafka's ConsumerCoordinator: the callback runs while they are still
                # assigned, so it can read their positions and commit them.
                try:
                    self._listen("on_partitions_revoked", list(revoked))
                except BaseException as exc:
                    if isinstance(exc, Exception) and not isinstance(exc, WakeupError):
                        failed = exc  # re-raised after the assigned callback
                    else:
                        woken = True  # raised at once, as Kafka's listener invoker does
                        raise
        finally:
            if self._gen is not new:
                # The callback unsubscribed (``_leave_inside_revocation``): nothing is held.
                self._forget_revoked(revoked)
            elif woken:
                self._undo_transition(old, new, hold, revoked)
            else:
                self._forget_revoked(revoked)
                for tp in added:
                    self._position[tp] = self._fetch_pos[tp] = offsets[tp]
                    if offsets[tp] < 0:
                        self._invalid[tp] = offsets[tp]
                    self._buffers[tp] = deque()
                    if tp in new.committed:
                        self._committed[tp] = new.committed[tp]
                self._unstarted.update(added)
                self._assigned = sorted(set(self._assigned) | set(added))
                new.acknowledge()
                if stopped:
                    # A follow-up rejoin (KIP-429) only for partitions the member reported as
                    # owned in its JoinGroup (``new.revoked``): their new owners get them with
                    # the next generation. Those it no longer reported (a topic deleted, or no
                    # longer subscribed) were free for the assignor already, as in Kafka, whose
                    # onJoinPrepare revokes them before the JoinGroup; a rejoin for them was a
                    # rebalance of the whole group for nothing.
                    self._await_rejoin(new.request_rejoin if new.revoked else None, hold)
                elif self._rejoin_after is None or self._rejoin_after[1] is not hold:
                    hold.applied.set()  # the member may rejoin now (see _Hold)
                # (Else a revocation for a changed subscription, made while ``new`` waited,
                # owes its rejoin under ``hold``: ``_finish_rejoin`` lets the member go once
                # its commits landed. Let go here, it rejoined with them in flight, and they
                # were refused once the next generation completed.)
                self._rejoin_for_unsubscribed(new, given=len(fresh), taken=len(added))
        # As Kafka: the added partitions are announced even if the revocation callback raised
        # (they are assigned either way), unless it closed the consumer; then its exception,
        # the first one, propagates. A close() from another thread, which began meanwhile
        # and revokes them once this poll() returns, does not keep them from the listener:
        # it would hear of their revocation without having heard of their assignment.
        try:
            if not self._closed and self._gen is new:
                self._listen("on_partitions_assigned", list(added))
        except Exception as exc:
            if failed is None:
                raise
            if isinstance(exc, WakeupError):
                # It outranks the earlier failure, as in Kafka: raising that one instead
                # swallowed the wakeup() the application asked for.
                log.error("on_partitions_revoked raised before a wakeup()", exc_info=failed)
                raise
            log.exception("on_partitions_assigned raised after on_partitions_revoked did")
        if failed is not None:
            raise failed
        # Only now: a subscription the revocation callback made may revoke partitions, the
        # added ones included, which must have been announced first.
        self._finish_rejoin(deadline)

    def _undo_transition(self, old: Generation | None, new: Generation, hold: _Hold,
                         revoked: list[TopicPartition]) -> None:
        """The revocation callback of the move to ``new`` raised ``WakeupError``: hold
        ``old``'s partitions again, the revoked ones fetched again from their positions (their
        buffered records were dropped), and leave ``new`` for the next poll() to apply
        (``_interrupted``). ``hold`` stays, unreleased, as the consumer's hold: the member is
        in ``new``, and must not rejoin before it is applied (Kafka's poll thread does not);
        ``new`` is not acknowledged, so if that hold gives up, the member reports these."""
        self._restore_revoked(revoked)
        self._gen, self._hold = old, hold
        if not self._closed:
            self._interrupted = new

    def _restore_revoked(self, revoked: list[TopicPartition]) -> None:
        """Undo ``_stop_revoked`` after a revocation callback raised ``WakeupError``: the
        partitions stay assigned, fetched again from their positions (their buffered records
        were dropped), for the next poll() to revoke again."""
        self._revoking = False
        self._pending_revocation = []
        for tp in revoked:
            self._buffers[tp] = deque()
            if tp not in self._resets:  # (else its fetch position is the seek_to_*'s marker)
                self._fetch_pos[tp] = self._position[tp]
        self._assigned = sorted(set(self._assigned) | set(revoked))

    def _stop_revoked(self, revoked: list[TopicPartition], commit: _CommitFn) -> None:
        """The first half of revoking some partitions while keeping the rest (cooperative):
        auto-commit their positions through ``commit``, and stop them. Their buffered records
        are never handed out and, out of ``_assigned`` (the caller's), they are not fetched
        again. Their positions stay until ``on_partitions_revoked`` has returned, so it can
        commit them; ``_forget_revoked`` is the second half. The commit is queued on the
        committer (behind older async commits, so it never overtakes one; a failure is
        logged); the rejoin that hands the partitions over waits for it (``_finish_rejoin``),
        as does a sync ``commit()`` in the callback. The finished commits' outcomes are taken
        first (``_take_outcomes``), so that one refused holds nothing back; the callers wait
        for those still in flight (``_floors_landed``)."""
        if revoked and self._auto_commit:
            self._take_outcomes()
            gone = set(revoked)
            self._queue_commit(
                commit, {tp: o for tp, o in self._changed_positions().items() if tp in gone},
                "commit of revoked partitions")
        for tp in revoked:
            self._buffers.pop(tp, None)
            self._caught_up.discard(tp)
            self._record_bytes.pop(tp, None)
            self._fetched_turn.pop(tp, None)

    def _forget_revoked(self, revoked: list[TopicPartition]) -> None:
        self._revoking = False
        self._pending_revocation = []
        self._forget_partitions(revoked)

    def _rejoin_for_unsubscribed(self, gen: Generation, given: int, taken: int) -> None:
        """``gen`` gave the member ``given`` partitions new to it, of which it took the
        ``taken`` of subscribed topics (``_subscribed``). Those left out (a custom or foreign
        leader's assignor gave them) reached nobody until some other rebalance: the member
        rejoins, as Kafka's onJoinComplete does for "received assignment does not match the
        current subscription", unless a subscription change is pending, whose own rejoin hands
        them on. As any rejoin, once the hold lets the member go; for a generation ended
        already, nothing more."""
        if taken < given and self._resubscribe is None:
            gen.request_rejoin()

    def _revoke_unsubscribed(self, subscribed: Callable[[str], bool], change: object,
                             deadline: float | None) -> bool:
        """Before a cooperative rejoin for a new subscription (``poll()`` after
        ``subscribe()``): revoke the partitions of topics no longer subscribed, as Kafka's
        ``onJoinPrepare`` does, so none is consumed here once the rejoin lets another member
        take it. The others are carried through the rejoin. On eager groups, and when the
        partitions are lost, ``_settle`` revokes everything once the generation ends, as for
        any rebalance.

        First, their commit is reckoned only once the application's commits of them in flight
        have landed or failed (``_floors_landed``), as a rebalance's is, so that one refused
        holds nothing back (before, it kept the partition uncommitted for its next owner).
        False while those are still in flight at ``deadline`` (or ``wakeup()``, ``close()``):
        nothing revoked, and ``poll()`` returns nothing.

        Then their commits (auto-commit's, and the callback's async ones) are queued, not
        waited for: the held generation's hold keeps the member from rejoining until they
        landed (``_finish_rejoin``, waiting until ``poll()``'s deadline, a later ``poll()``
        going on), and meanwhile the member consumes what it kept. Once the generation
        ended, no hold keeps it: the new subscription waits for them instead
        (``_unsubscribed_landed``), False meanwhile, the change pending."""
        if not self._unsubscribed_landed(deadline):
            return False
        gen, hold = self._gen, self._hold
        revoked = [] if (gen is None or hold is None or self._group is None
                         or self._group.protocol is not RebalanceProtocol.COOPERATIVE
                         or self._partitions_lost()) else [
            tp for tp in self._assigned if not subscribed(tp.topic)]
        if not revoked:
            return True
        assert gen is not None and hold is not None
        # Keyed by the ``change`` (``subscribe()``'s), not the generation: a later change
        # waits for the commits in flight at its own first try, not at an abandoned one's,
        # and no change restarts a rebalance's own wait in the generation.
        if self._auto_commit and not self._floors_landed(change, revoked, deadline):
            return False
        # First: a rebalance another member starts meanwhile must not rejoin either (the
        # member would no longer report them as owned while their commits are in flight).
        # The hold keeps the member from rejoining only if its routine has not let it go yet:
        # the generation is still on, or a revocation's rejoin waits on it already.
        waiting = not hold.applied.is_set()
        hold.applied.clear()
        gated = waiting or not gen.done.is_set()
        self._revoking = True
        woken = False
        try:
            self._stop_revoked(revoked, self._commit_carried(self._commit_generation()))
            self._assigned = [tp for tp in self._assigned if subscribed(tp.topic)]
            self._pending_revocation = revoked
            log.info("generation %d: revoking %s (no longer subscribed)", gen.generation_id,
                     _names(revoked))
            try:
                self._listen("on_partitions_revoked", list(revoked))
            except BaseException as exc:
                woken = not isinstance(exc, Exception) or isinstance(exc, WakeupError)
                raise
        finally:
            if self._gen is not gen:
                self._forget_revoked(revoked)  # the callback unsubscribed
            elif woken:
                # Cut short by wakeup(): they stay assigned and the member does not rejoin
                # without them yet (``_apply_subscription`` tries again at the next poll()).
                self._restore_revoked(revoked)
                if not waiting:
                    hold.applied.set()
            elif gated:
                self._forget_revoked(revoked)
                self._await_rejoin(None, hold)
            else:
                # The generation ended before this poll() and the member is rejoining (or
                # has joined the next one, which the commits were made under, ``peek``):
                # nothing keeps it from rejoining with the new subscription but waiting for
                # the commits before it is applied, as Kafka's onJoinPrepare would before its
                # JoinGroup.
                self._forget_revoked(revoked)
                hold.applied.set()
                self._unsubscribed_commit = self._committer.last_ticket
        return self._unsubscribed_landed(deadline)

    def _unsubscribed_landed(self, deadline: float | None) -> bool:
        """Whether the commits of a changed subscription's revocation after the held
        generation ended (``_revoke_unsubscribed``) have finished, waiting until ``deadline``,
        ``wakeup()`` or ``close()``: until then the change stays pending and ``poll()``
        returns nothing, where it waited for them past its deadline (up to two session
        timeouts), deaf to ``wakeup()`` and ``close()``."""
        ticket = self._unsubscribed_commit
        if ticket is not None and not self._commits_landed(deadline, ticket):
            return False
        self._unsubscribed_commit = None
        return True

    def _must_revoke(self) -> bool:
        """The held generation ended and its partitions are not carried into the next one
        (eager, lost, or not decided yet): ``_settle`` revokes them."""
        gen = self._gen
        return gen is not None and gen.done.is_set() and (
            not gen.carried or self._partitions_lost())

    def _commit_generation(self) -> Generation:
        """The generation to commit under: the held one, or, cooperatively, the newest one
        the group's thread has joined since (the rejoin runs in the background, so the group
        may be in the next generation before poll() applies it, and that one may itself have
        ended, untaken, when yet another member joined: ``ConsumerGroup.newest``). The member
        still owns every partition it holds there (a revoked one moves only after its next
        rejoin), and the ended generation's commits would be refused (ILLEGAL_GENERATION),
        silently dropping a close()'s final commit and failing commit()."""
        gen = self._gen
        assert gen is not None
        if gen.done.is_set() and gen.carried and not self._partitions_lost():
            return self._joined_after(gen) or gen
        return gen

    def _joined_after(self, gen: Generation, wait_s: float = 0.0) -> Generation | None:
        """The newest generation the same member has joined since ``gen`` (None if none), a
        join under way waited for up to ``wait_s``: it still owns there what it carried from
        ``gen`` (``_commit_generation``)."""
        return self._group.newest_after(gen, wait_s) if self._group is not None else None

    def _commit_carried(self, under: Generation) -> _CommitFn:
        """Commit under ``under`` (``_commit_generation``), and once more under the newer
        generation the member has joined meanwhile (its join under way waited for) if
        ``under``'s commit is refused as rebalancing: a changed subscription's revocation
        after the generation ended (``_revoke_unsubscribed``), and the final commit of
        ``close()`` or ``unsubscribe()`` once a carried generation was taken in hand (its hold
        let the member go), commit while the group thread may be rejoining, so the join may
        complete before the commit arrives (ILLEGAL_GENERATION). The member still owns the
        partitions there, until the change's rejoin (which waits for this commit) or its
        leave hands them on; dropped, they were left uncommitted for their next owner, where
        Kafka's onJoinPrepare commits before its JoinGroup. Unless that join lost them
        (``under.lost``): the member rejoined owning nothing, and the commit fails
        (``CommitFailedError``) rather than land for partitions another member may own. Not for
        the application's own ``commit()``: refused, it raises, as Kafka's commitSync does
        during a rebalance."""

        def commit(offsets: Mapping[TopicPartition, int | OffsetAndMetadata]) -> None:
            try:
                under.commit_offsets(offsets)
            except RebalanceInProgressError as refused:
                # (bounded as Kafka's onJoinPrepare bounds its commit: the rebalance timeout)
                ahead = self._joined_after(under, self._config.rebalance_timeout_ms / 1000)
                if ahead is None:
                    raise
                if under.lost:
                    # The join it waited for lost them (a SyncGroup failing with a "lost"
                    # reaction that keeps the member id): the member rejoined owning nothing,
                    # and the generation it joined would take a commit of partitions that
                    # may be another member's now (Kafka's onPartitionsLost commits nothing).
                    raise CommitFailedError(
                        f"commit of generation {under.generation_id} refused as rebalancing, "
                        f"and not made again under generation {ahead.generation_id}: the "
                        "member's rejoin lost the partitions, so they may belong to another "
                        "member now, which will process again the records after the last "
                        "successful commit.", Errors.ILLEGAL_GENERATION) from refused
                log.info("commit of generation %d refused as rebalancing: committing under "
                         "generation %d, joined since", under.generation_id,
                         ahead.generation_id)
                ahead.commit_offsets(offsets)

        return commit

    def _partitions_lost(self) -> bool:
        """Whether the current generation's partitions are lost rather than revoked: the
        generation says so, or the hold gave up (poll() did not come within the rebalance
        timeout, so the member rejoined without this consumer and others may own them).
        Lost partitions are never committed."""
        gen, hold = self._gen, self._hold
        return gen is not None and (gen.lost or (hold is not None and hold.gave_up))

    def _revoke(self, *, lost: bool, poll_deadline: float | None = None,
                polling: bool = False) -> None:
        """End this consumer's hold on the current generation (see the module docstring).

        In ``poll()`` (``polling``) it is bounded by the poll's deadline, as Kafka's
        ``onJoinPrepare`` is by the poll timer: the final auto-commit runs on the committer
        and, while Redis does not answer, is waited for only until ``poll_deadline`` (or
        ``wakeup()``); poll() then returns no records and a later poll() goes on waiting
        (``_revocation_commit``). Nothing of the partitions is handed out meanwhile, and the
        member does not rejoin. If the rebalance timeout passes first, the hold gives up and
        the partitions are reported lost instead (Kafka's ``joinPrepareTimer``). Elsewhere
        (``close()``, ``unsubscribe()``) the revocation always completes."""
        gen, hold = self._gen, self._hold
        assert gen is not None
        self._interrupted = None  # (its hold is ``hold``: released below, or by close())
        partitions = list(self._assigned)
        self._buffers = {}  # never hand out a record of a partition we are giving up
        if not lost and self._auto_commit:
            under = self._commit_generation()
            of = f"generation {under.generation_id}"
            if not polling:
                # (close(), unsubscribe(): no hold keeps a carried generation's member from
                # rejoining, so its join may complete before the commit arrives)
                self._final_commit(self._commit_carried(under), of)
            elif not self._revocation_committed(under.commit_offsets, of, poll_deadline):
                return
            lost = gen.lost or under.lost  # a refused commit can reveal they are gone
        self._revocation_commit = None
        self._revoking = True
        try:
            log.info(
                "generation %d: %s %d partitions (%s)",
                gen.generation_id,
                "lost" if lost else "revoking",
                len(partitions),
                gen.end_reason.value if gen.end_reason else "closing",
            )
            method = "on_partitions_lost" if lost else "on_partitions_revoked"
            if partitions or (polling and not lost):
                # Leaving (close(), unsubscribe()) with nothing assigned calls no listener,
                # as Kafka's onLeavePrepare; an eager rebalance in poll() calls
                # on_partitions_revoked even so, as Kafka's onJoinPrepare does, but never
                # on_partitions_lost for nothing (its onJoinPrepare checks the lost set is
                # non-empty; ConsumerRebalanceListener's contract).
                self._listen(method, partitions)  # what it raises propagates after finally
        finally:
            self._revoking = False
            self._drop_assignment()
            if hold is not None and not self._closing:
                # As Kafka, whose commitAsync in onPartitionsRevoked goes out before the
                # JoinGroup: the callback's async commits land in this generation before the
                # member may rejoin (a rejoin completing the next one would fence them).
                # close() releases the hold itself once they landed.
                if polling:
                    self._releasing = (hold, self._committer.last_ticket)
                    self._release_hold(poll_deadline)
                else:
                    self._await_committer(self._woken_if_leaving())
                    hold.released.set()

    def _drop_assignment(self) -> None:
        """The consumer holds no generation and no partition any more."""
        self._gen = self._hold = None
        self._interrupted = None
        self._assigned, self._pending_revocation = [], []
        for name in PARTITION_TABLES:  # (new objects: a thread may still hold the old ones)
            setattr(self, name, {})
        for name in PARTITION_MARKS:
            setattr(self, name, set())

    def _leave_inside_revocation(self) -> None:
        """``unsubscribe()`` from inside a revocation's callback: that revocation is the
        consumer's last, as for ``close()`` from there (the listener, running now, is not
        called again). With auto-commit the partitions it does not give up (a cooperative
        one's kept partitions) are committed, as ``close()`` commits them; then the consumer
        drops its assignment, so the revocation that called the listener goes no further (no
        partitions added, no ``on_partitions_assigned``), and lets go of its hold on the
        generation, which the group's close waits for. Before, that wait lasted until the
        hold gave up (``rebalance_timeout_ms``), and a cooperative revocation went on to
        announce the added partitions and report the kept ones lost, uncommitted."""
        hold = self._hold
        if (self._pending_revocation and self._gen is not None and self._auto_commit
                and not self._partitions_lost()):
            self._final_commit(self._commit_carried(self._commit_generation()),
                               "the partitions kept")
        self._drop_assignment()
        if hold is not None:
            hold.released.set()
            hold.applied.set()

    def _revocation_committed(self, commit: _CommitFn, of: str, deadline: float | None) -> bool:
        """Whether the revocation's final auto-commit has finished (landed, or failed and
        logged), sending it first if it is not in flight yet: behind the async commits queued
        before, so it never overtakes one. Waits until ``deadline``, ``wakeup()`` or
        ``close()``; False while it is still in flight.

        The application's commits in flight end first and their outcomes are taken
        (``_floors_landed``), as for close()'s, so that one that failed holds nothing back:
        reckoned while a ``commit_async()`` past the position was still in flight, then
        refused, the revocation committed nothing of the partition (redelivered)."""
        ticket = self._revocation_commit
        if ticket is None:
            gen = self._gen
            assert gen is not None
            if not self._floors_landed(gen, list(self._commit_floor), deadline):
                return False
            ticket = self._queue_commit(commit, self._changed_positions(), f"final commit of {of}",
                                        self._gen)
            if ticket is None:
                return True
            self._revocation_commit = ticket
        return self._commits_landed(deadline, ticket)

    def _await_rejoin(self, rejoin: Callable[[], None] | None, hold: _Hold) -> None:
        """After a cooperative revocation, its listener returned: ``hold`` keeps the member
        from rejoining until the commits queued so far landed (those queued later, an
        application's ``commit_async()`` among them, are not waited for); then
        ``_finish_rejoin`` calls ``rejoin`` (if any) and lets it. A rejoin waiting already
        under another hold is superseded (its generation is over); under the same hold, it
        still requests its rejoin."""
        pending = self._rejoin_after
        if pending is not None:
            if pending[1] is not hold:
                pending[1].applied.set()
            elif rejoin is None:
                rejoin = pending[0]
        self._rejoin_after = (rejoin, hold, self._committer.last_ticket)

    def _finish_rejoin(self, deadline: float | None) -> bool:
        """After a cooperative revocation (``_transition``, ``_revoke_unsubscribed``): once the
        commits queued during it landed (waiting until ``deadline``, ``wakeup()`` or
        ``close()``; a later poll() goes on), rejoin so the revoked partitions reach their new
        owners, with the subscription the callback made, if it made one. As Kafka's
        ``onJoinPrepare``, the revocation comes before the JoinGroup; until then the member
        goes on consuming what it kept. False while the callback's subscription waits to
        revoke (``_apply_subscription``): the rejoin waits with it, and poll() returns."""
        pending = self._rejoin_after
        if (pending is None or (self._interrupted is not None and pending[1] is self._hold)
                or not self._commits_landed(deadline, pending[2])):
            # (A move still waiting to be applied, ``_interrupted``, holds that same hold: the
            # member rejoins once it is applied, so that it rejoins without what it revokes.)
            return True
        self._rejoin_after = None
        rejoin, hold, _ = pending
        try:
            if self._resubscribe is not None:
                # The callback subscribed anew: revoke what is no longer subscribed now,
                # under this generation, and rejoin with the new subscription (which the
                # new owners wait for too). At the next poll(), after this rejoin, that
                # revocation's commits met the next generation's join completed and were
                # refused (ILLEGAL_GENERATION), as Kafka's onJoinPrepare revokes before it
                # sends the JoinGroup. If it revokes any, the rejoin waits for their commits
                # under this same hold, and still requests the rejoin this one owed.
                try:
                    if not self._apply_subscription(deadline):
                        self._rejoin_after = pending
                        return False
                except (WakeupError, KeyboardInterrupt):
                    if self._resubscribe is not None and self._rejoin_after is None:
                        # That revocation was cut short and is made again at the next
                        # poll(), before the new subscription: so is this rejoin, after it.
                        self._rejoin_after = pending
                    raise
                again = self._rejoin_after
                if again is not None and again[1] is hold:
                    self._rejoin_after = (again[0] or rejoin, hold, again[2])
                    return True
            if rejoin is not None:
                # After the callback: their new owners wait for it. (A subscription that
                # came back to the joined one ends no generation: this rejoin still must.)
                rejoin()
        finally:
            if self._rejoin_after is None:
                hold.applied.set()  # the member may rejoin now (see _Hold)
        return True

    def _release_hold(self, deadline: float | None) -> None:
        """Let the member rejoin after a revocation once the async commits queued before its
        end (the listener's included) have finished (waiting until ``deadline``; a later poll()
        or close() goes on)."""
        releasing = self._releasing
        if releasing is None or not self._commits_landed(deadline, releasing[1]):
            return
        self._releasing = None
        releasing[0].released.set()

    def _drop_holds(self) -> None:
        """Leaving the group (``close()``, ``unsubscribe()``), once its own revocation is done:
        let go of a hold a revocation left waiting for its commits (``_release_hold``,
        ``_finish_rejoin``); the rejoin it waited for is moot."""
        releasing, rejoin = self._releasing, self._rejoin_after
        for held in (releasing[0] if releasing else None, rejoin[1] if rejoin else None):
            if held is not None:
                held.released.set()
                held.applied.set()
        self._releasing = self._rejoin_after = None

    def _commits_landed(self, deadline: float | None, upto: int) -> bool:
        """Whether the commits queued up to the ticket ``upto`` have finished, waiting until
        ``deadline``, ``wakeup()`` or ``close()``."""
        return self._committer.finished(upto) or self._committer.wait_idle(
            _remaining(deadline), self._wakeup, self._stop, upto=upto)

    def _floors_landed(self, key: object, partitions: list[TopicPartition],
                       deadline: float | None) -> bool:
        """Before a rebalance reckons its commit of ``partitions`` (giving up the generation
        ``key``, or moving to it; or for the changed subscription ``key``): whether the
        application's commits of them in flight then have finished, waiting until
        ``deadline``, ``wakeup()`` or ``close()``; if so their outcomes are taken
        (``_take_outcomes``), so that one refused holds nothing back
        (``_settle_commit_floor``). Only those in flight at the first call for ``key``: a
        ``poll(0)`` loop that commits after each poll() would otherwise never catch up."""
        wait = self._floor_wait
        if wait is None or wait[0] is not key:
            newest = max((t for tp in partitions for t, _ in self._commit_floor.get(tp, ())),
                         default=0)
            wait = self._floor_wait = (key, newest)
        if not self._commits_landed(deadline, wait[1]):
            return False
        self._floor_wait = None
        self._take_outcomes()
        return True

    def _final_commit(self, commit: _CommitFn, of: str) -> None:
        """Auto-commit's last commit of the partitions this consumer gives up (a revocation, or
        close() after assign()), bounded as close() bounds it (``_give_up_waiting``). A commit
        that fails is logged, not raised, so giving the partitions up completes. In
        ``unsubscribe()`` a wakeup ends its retries and its wait for the member's join
        (``_leave_woken``); elsewhere it does not cut it short (it runs on the committer
        thread, and ``_commit_changed`` waits for it whatever the wakeup; one pending stays
        set for the next poll() or commit()).

        Inside ``close()`` the commit goes through the committer, behind the queued async
        commits, and close() waits for it only until its deadline: Redis not answering holds
        that thread, not close() (which waited up to the socket timeout, 10 s, before). Its
        outcome is logged when close() runs the commit callbacks."""
        if self._closing:
            # The commits queued before it end first, their outcomes taken, so that one that
            # failed holds nothing back (``_settle_commit_floor``): reckoned while an
            # application's ``commit_async()`` of a position past the record the loop was on
            # was still pending, then failed, close() committed nothing of the partition.
            self._committer.wait_idle(_remaining(self._close_deadline))
            self._take_outcomes()
            self._queue_commit(commit, self._changed_positions(), f"final commit of {of}")
            if not self._committer.wait_idle(_remaining(self._close_deadline)):
                log.warning("final commit of %s: close()'s timeout passed before Redis "
                            "answered (the commit may still land)", of)
                # Now, not when the timer comes (close() may cancel it first): the commit's
                # retries must not go on in the background after close() returned.
                self._give_up_waiting()
            return
        try:
            self._commit_changed(commit, self._woken_if_leaving())
        except (CommitFailedError, RebalanceInProgressError) as exc:
            log.warning("final commit of %s refused: %s", of, exc)
        except RcoordError as exc:
            log.warning("final commit of %s failed: %s", of, exc)

    def _woken_if_leaving(self) -> Callable[[], bool] | None:
        """``_leave_woken`` inside ``unsubscribe()``, for its waits on the committer; None
        elsewhere (only unsubscribe() raises the wakeup it takes: a subscribe() leaving a
        group a fatal error closed does not; nor does a ``close()`` called from a listener
        inside ``unsubscribe()``, which ignores wakeups as every ``close()`` does)."""
        if self._woken_leaving is None or self._stop.is_set():
            return None
        return self._leave_woken

    def _leave_woken(self) -> bool:
        """``wakeup()`` during ``unsubscribe()``'s final commit: end its retries and its wait
        for the member's join (``_commit_carried``, up to the rebalance timeout otherwise) by
        giving up the group's retries, as close()'s give-up does (the group is closed next),
        so the member still leaves at once, the partitions revoked, and the next owner reads
        from the last commit that landed. The wakeup is used up here, so the revocation
        callback's own commits are not refused by it; ``unsubscribe()`` raises it once the
        member has left, as Kafka's raises the WakeupException of a ``commitSync`` in
        ``onPartitionsRevoked``. Left half-left instead (Kafka's case), the member kept its
        partitions in the group until its session timed out.

        After ``assign()`` no group closes: the wait ends (False), the commits left in flight
        (in order on the committer, their retries bounded as ever, a failure logged), so that
        ``unsubscribe()`` forgets the partitions at once and raises, as Kafka's, which makes
        no commit there. Before, it waited for them (a session timeout each, retried against
        an unreachable Redis), deaf to ``wakeup()``; cut, the auto-commit would be lost."""
        self._wakeup.clear()
        self._woken_leaving = True
        if self._group is None:
            return False
        self._group.stop_retrying()
        return True

    # -- fetching

    def _drain(self, limit: int) -> list[ConsumerRecord]:
        """Up to ``limit`` buffered records, taking partitions in turn; advances positions."""
        out: list[ConsumerRecord] = []
        n = len(self._assigned)
        for i in range(n):
            tp = self._assigned[(self._drain_turn + i) % n]
            buf = self._buffers.get(tp)
            if not buf or tp in self._paused or tp in self._unstarted:
                continue  # (an unstarted one's start may still move: ``_note_started``)
            room = limit - len(out)
            self._unacked.setdefault(tp, buf[0].offset)
            if len(buf) <= room:
                out.extend(buf)
                buf.clear()
            else:
                out.extend(buf.popleft() for _ in range(room))
            self._position[tp] = out[-1].offset + 1
            if len(out) >= limit:
                break
        self._drain_turn += 1
        return out

    def _fetch(self, deadline: float | None) -> bool:
        """Fetch every fetchable partition (assigned, not paused, nothing buffered) in one call;
        if none of them has records, wait on one of them, a different one each time.

        The calls run on the fetch thread (``InFlight``), and ``poll()`` waits for them only
        until its deadline: one still in flight then (Redis slow or not answering) is collected
        by a later ``poll()``, as Kafka's fetch requests outlive the poll that sent them. Before,
        ``poll(0.5)`` against a stopped server took the 10 s socket timeout."""
        if not self._fetching.busy and not self._send_fetch(deadline):
            return False
        for _ in range(2):  # the fetch of every partition, then perhaps the blocking one
            # Waits end at wakeup() and close() too; a second at most, so that the loop looks
            # at the generation now and then while a server does not answer.
            done = self._fetching.wait(_slice(deadline, 1.0), self._wakeup, self._stop)
            if done is None:
                return False  # still in flight: a later poll() collects it
            got = self._apply_fetch(done)
            ask = done.tag
            if got or ask.blocking or done.error is not None or self._unreadable_now() or (
                    not self._send_blocking(deadline, {tp for tp, _ in ask.asked})):
                return got  # (an unreadable partition: poll() raises its error now)
        return False

    def _unreadable_now(self) -> list[CorruptRecordError]:
        """The errors of the partitions a fetch could not read (``_unreadable``) that are still
        assigned, not paused, and at the position that fetch read (those of partitions given
        up are dropped here)."""
        for tp in [tp for tp in self._unreadable if tp not in self._buffers]:
            del self._unreadable[tp]
        return [err for tp, (pos, err) in sorted(self._unreadable.items())
                if tp in self._buffers and tp not in self._paused
                and self._fetch_pos.get(tp) == pos]

    def _fetchable(self) -> list[TopicPartition]:
        """Not those unstarted: a commit of the application may still set their start."""
        return [
            tp
            for tp in self._assigned
            if not self._buffers.get(tp) and tp not in self._paused and tp not in self._invalid
            and tp not in self._unstarted
        ]

    def _send_fetch(self, deadline: float | None) -> bool:
        """Start a fetch of every fetchable partition, in one call (one round trip per node);
        False if there is none, or none yet (then it waited as a fetch would).

        The call asks for about ``_FETCH_POLLS`` polls' worth of records in all, shared among
        the partitions not known to be at their log end, and at most ``max_poll_records`` of
        one partition; and about ``fetch_max_bytes`` in all and ``max_partition_fetch_bytes``
        of one partition (Kafka's bounds), read in one step when the partition's last records
        tell their size (``_record_bytes``). Before the byte bounds, 500 records of 1 MiB
        were one read of 500 MiB. Why a count bound: records buffered for many polls live long
        enough for Python's collector to move them to its oldest generation, and its full
        collections walk every live object. Why not one poll's worth: each partition read has
        a fixed cost (two commands, their replies, the log offsets), so small shares repeat it
        every few records; hence also the floor, ``_MIN_FETCH_SHARE``. Measured with
        ``bench/read_path.py`` (12 partitions, 500 per poll): one poll's worth (42 a partition)
        and 500 a partition were both slower than about 200 (this rule gives 167).

        The partitions go in the order of when they last gave records, longest ago first, and
        those at their log end last, as Kafka's consumer moves a partition that gave records
        to the end of its fetches (``SubscriptionState.movePartitionToEnd``): only the first
        partition with records may go over the byte limits, and the others get what the ones
        before them left, so in a fixed order a partition behind one with a backlog of large
        records got nothing until that backlog was read. Those at their log end go last
        because they likely give nothing: first, each would keep the next one's record over
        its share for a second read.
        """
        gen = self._gen
        idle = gen.done if gen is not None else self._stop  # what ends an idle wait early
        pending = self._fetchable()
        turns, caught_up = self._fetched_turn, self._caught_up
        pending.sort(key=lambda tp: (tp in caught_up, turns.get(tp, 0)))
        # Paused partitions with a pending seek_to_* read their edge too, without records, as
        # Kafka's poll() resets every partition awaiting a reset, paused or not.
        edge_only = {tp for tp in self._assigned if tp in self._paused and tp in self._resets}
        busy = sum(1 for tp in pending if tp not in self._caught_up)
        pending += sorted(edge_only)
        wait = self._fetch_retry_at - time.monotonic()
        if not pending or wait > 0:
            # Nothing to fetch (nothing assigned, or all paused or buffered), or backing off
            # after a failed fetch: wait as a fetch would, then return.
            if not idle.is_set():
                idle.wait(_slice(deadline, wait if wait > 0 else self._fetch_max_wait_ms / 1000))
            return False
        if self._must_stop_fetching(gen):
            return False
        limit = self._max_poll_records
        share = min(limit, max(-(-_FETCH_POLLS * limit // max(1, busy)), _MIN_FETCH_SHARE))
        coord = self._coordinator()
        asked = tuple((tp, self._fetch_pos[tp]) for tp in pending)
        ask = _FetchAsk(asked, False)
        resets = {tp: self._resets[tp] for tp in pending if tp in self._resets}
        sizes = [self._record_bytes.get(tp, 0) for tp in pending]
        most, each = self._fetch_max_bytes, self._max_partition_fetch_bytes

        def fetch() -> list[PartitionRecords[ConsumerRecord]]:
            # A pending seek_to_* reads its edge first, here on the fetch thread (poll() waits
            # for it no longer than for the fetch); the read starts there (``ask.resolved``).
            reads: list[tuple[str, int, int]] = []
            edges: dict[TopicPartition, PartitionRecords[ConsumerRecord]] = {}
            found = _edges_of(coord, list(resets))
            for tp, pos in asked:
                if tp in resets:
                    offsets = found[tp]
                    if isinstance(offsets, TopicError):  # (for _take to keep: poll() raises it)
                        edges[tp] = PartitionRecords([], -1, -1, offsets.error,
                                                     detail=offsets.detail)
                        continue
                    if not isinstance(offsets, tuple):
                        edges[tp] = _UNKNOWN  # no such partition (yet): it stays pending
                        continue
                    start, end = offsets
                    pos = ask.resolved[tp] = (start, end)[resets[tp]]
                    if tp in edge_only:  # (paused: its records come after resume())
                        edges[tp] = PartitionRecords([], start, end)
                        continue
                reads.append((tp.topic, tp.partition, pos))
            read_sizes = [n for (tp, _), n in zip(asked, sizes, strict=True) if tp not in edges]
            got = iter(coord.fetch_many_as(reads, share, ConsumerRecord, max_bytes=most,
                                           partition_max_bytes=each, record_bytes=read_sizes))
            return [edges[tp] if tp in edges else next(got) for tp, _ in asked]

        self._fetching.start(fetch, ask)
        return True

    def _send_blocking(self, deadline: float | None, asked: set[TopicPartition]) -> bool:
        """Start a fetch of one partition of ``asked`` (which had no records) that waits up to
        ``fetch_max_wait_ms`` for one; False if there is no time left or fetching must stop."""
        block = _slice(deadline, self._fetch_max_wait_ms / 1000)
        pending = [tp for tp in self._fetchable() if tp in asked and tp not in self._resets]
        if block <= 0.001 or not pending or self._must_stop_fetching(self._gen):
            return False
        tp = pending[self._block_turn % len(pending)]
        self._block_turn += 1
        coord, pos, most = self._coordinator(), self._fetch_pos[tp], self._max_poll_records
        each = self._max_partition_fetch_bytes

        def fetch() -> list[PartitionRecords[ConsumerRecord]]:
            try:
                result = coord.fetch(tp.topic, tp.partition, pos, most, int(block * 1000),
                                     max_bytes=each, waker=self._fetch_waker)
            except TopicError as exc:
                if not unreadable_partition(exc):
                    raise
                # (the record waited for is an entry that is not one: as the fetch of several
                # partitions answers it, for ``_take`` to keep; raised, poll() raised it once)
                return [PartitionRecords([], -1, -1, exc.error, detail=exc.detail)]
            records = _consumer_records(tp.topic, tp.partition, result.records)
            return [PartitionRecords(records, result.log_start_offset, result.log_end_offset,
                                     result.error)]

        self._fetching.start(fetch, _FetchAsk(((tp, pos),), True))
        return True

    def _apply_fetch(self, done: _FetchDone) -> bool:
        """Take a finished fetch's answers (True if any records came): only for partitions
        still assigned at the position asked, since a seek, a revocation or a reset may have
        come between (Kafka drops such fetch responses too). A fetch that could not reach Redis
        is logged, and the next one waits ``retry_backoff_ms``; another error is raised."""
        ask = done.tag
        if done.error is not None:
            if not isinstance(done.error, ConnectionLost):
                raise done.error
            log.warning("fetch of %s failed: %s", _names([tp for tp, _ in ask.asked]), done.error)
            self._back_off()
            return False
        assert done.value is not None
        got = unknown = False
        done_at = time.monotonic()
        for (tp, pos), result in zip(ask.asked, done.value, strict=True):
            if (tp not in self._buffers or self._fetch_pos.get(tp) != pos
                    or tp in self._unstarted):
                # Revoked, sought or reset since: a stale answer. Or unstarted (never asked,
                # ``_fetchable``): given up and assigned again since, at the same start. Taken,
                # its records were handed out from that start though a commit of the
                # application then set another (``_note_started``), and again from there.
                continue
            if tp in ask.resolved:
                self._resolved(tp, ask.resolved[tp])  # the seek_to_* read its edge
            got = self._take(tp, result) or got
            if result.error in (Errors.NONE, Errors.OFFSET_OUT_OF_RANGE):
                self._fetch_found[tp] = done_at
            else:
                self._fetch_found.pop(tp, None)
            unknown = unknown or result.error is Errors.UNKNOWN_TOPIC_OR_PARTITION
        if unknown and not got:
            # Deleted under us: the next rebalance drops it (a pattern subscription's watcher
            # notices); until then, ask again only after a backoff (unless others have records).
            self._back_off()
        return got

    def _back_off(self) -> None:
        self._fetch_retry_at = time.monotonic() + self._config.retry_backoff_ms / 1000

    def _must_stop_fetching(self, gen: Generation | None) -> bool:
        """Stop when closing, or when the generation ended and its partitions are not carried
        through the rejoin (cooperative): they are about to be revoked or lost."""
        if self._stop.is_set():
            return True
        if gen is None:
            return False  # assign(): no generation to end
        return gen.done.is_set() and not (gen.carried and not gen.lost)

    def _take(self, tp: TopicPartition, result: PartitionRecords[ConsumerRecord]) -> bool:
        """Apply one partition's fetch answer: buffer its records (True if there were any),
        reset an out-of-range position by the ``start_offset`` policy, or keep the error of a
        partition that cannot be read there (``_unreadable``, which poll() raises). Before,
        such a partition failed the whole fetch (every other partition stalled with it), and
        any error but OFFSET_OUT_OF_RANGE was logged at DEBUG as if there were nothing yet."""
        before = self._unreadable.pop(tp, None)
        if result.detail:
            pos = self._fetch_pos[tp]
            if pos >= 0:
                where = (f"at offset {pos}: {result.detail}. poll() raises this, once the other "
                         "partitions' records are handed out, until the partition is sought "
                         f"elsewhere (seek({tp!r}, {pos + 1}) skips one entry)")
            else:  # (a pending seek_to_*: reading the log's edge failed)
                where = (f"(its log offsets, for its pending seek_to_beginning() or "
                         f"seek_to_end()): {result.detail}. poll() raises this, once the other "
                         "partitions' records are handed out, until the partition is sought "
                         "elsewhere")
            self._unreadable[tp] = (pos, CorruptRecordError(
                tp.topic, tp.partition, max(pos, -1),
                f"{tp.topic}-{tp.partition} cannot be read {where} or the partition is mended "
                "as said"))
            if before is None or before[0] != pos:  # (once, not at every poll that raises it)
                log.warning("fetch of %s-%d: %s: %s", tp.topic, tp.partition,
                            result.error.name, result.detail)
            return False
        if result.error is Errors.OFFSET_OUT_OF_RANGE:
            policy = self._config.start_offset
            if policy == "none":
                log.warning(
                    "%s-%d: offset %d is out of range [%d, %d]; start_offset is 'none', so "
                    "poll() raises until the partition is sought",
                    tp.topic,
                    tp.partition,
                    self._fetch_pos[tp],
                    result.log_start_offset,
                    result.log_end_offset,
                )
                self._invalid[tp] = self._fetch_pos[tp]
                return False
            reset = result.log_start_offset if policy == "earliest" else result.log_end_offset
            log.warning(
                "%s-%d: offset %d is out of range [%d, %d]; resetting to %s (%d)",
                tp.topic,
                tp.partition,
                self._fetch_pos[tp],
                result.log_start_offset,
                result.log_end_offset,
                policy,
                reset,
            )
            self._fetch_pos[tp] = self._position[tp] = reset
            self._commit_floor.pop(tp, None)  # (a seek by the policy: see _reposition)
            self._caught_up.discard(tp)
            return False
        if result.error is not Errors.NONE:
            log.debug("fetch of %s-%d: %s", tp.topic, tp.partition, result.error.name)
            return False
        records = result.records
        if records:
            self._buffers[tp].extend(records)
            self._fetch_pos[tp] = records[-1].offset + 1
            if result.read_bytes:
                self._record_bytes[tp] = -(-result.read_bytes // len(records))
            self._fetched_turns += 1
            self._fetched_turn[tp] = self._fetched_turns
        if self._fetch_pos[tp] >= result.log_end_offset:
            self._caught_up.add(tp)
        else:
            self._caught_up.discard(tp)
        return bool(records)

    # -- lifecycle

    def _check_open(self) -> None:
        """Every call but ``close()`` and ``wakeup()`` on a closed consumer raises, as Kafka's
        ``IllegalStateException("This consumer has already been closed.")``: after close the
        consumer holds no partitions and no group, so an answer would be made up (``seek``
        said the partition was "not assigned; wait for on_partitions_assigned")."""
        if self._closed:
            raise IllegalStateError(
                "this consumer has been closed; create a new Consumer to consume again"
            )

    def _close_own_client(self) -> None:
        """Close the client made from ``redis_url``, once no query runs on it
        (``_using_client``; else the last one closes it)."""
        with self._client_guard:
            self._client_close_due = bool(self._client_users)
            if self._client_close_due:
                return
            client, self._owned_client = self._owned_client, None
        if client is not None:
            try:
                client.close()
            except Exception:  # closing a broken client must not hide the close itself
                log.debug("closing the Redis client failed", exc_info=True)

    def close(self, timeout: float | None = None) -> None:
        """Revoke (committing, with auto-commit) or drop the partitions, leave the group, stop.

        The final revocation runs before the consumer counts as closed, so the listener's
        ``commit()`` and ``commit_async()`` in ``on_partitions_revoked`` still work, as in
        Kafka; the async commits are flushed and their callbacks run before the group is left,
        while the generation still accepts them.

        ``timeout`` (seconds) bounds the whole close, as Kafka's ``close(timeout)``: once it
        has passed, commits and heartbeats stop retrying (each call still makes one attempt,
        so with a reachable coordinator nothing is dropped), async commits still queued are
        sent once each until one fails to reach the coordinator (the rest then fail unsent,
        with ``ConnectionLost``), and close() stops waiting for the group's thread (which sends
        LeaveGroup in the background). ``None``: the retries give up one session timeout after
        close() began (the budget one call's retries have anyway), and close() waits for the
        group's thread. The final auto-commit is waited for only until the bound too (it runs
        on the committer thread, and may still land after close() returned, or be refused
        once the member has left). Not bounded: the listener, and the calls it makes. An
        exception the listener raises in the final revocation does not stop the close: it is
        raised once the consumer is closed, as Kafka's close() throws "User rebalance callback
        throws an error" (leaving a ``with`` block that raised, it is logged instead, so the
        block's own error goes on). With no partition assigned, no listener is called, as in
        Kafka.

        Safe to call from another thread than ``poll()``'s, and more than once: a ``poll()``
        running there returns at its next step (waits in it end by the same bound), then this
        close() revokes. With auto-commit it then commits only what that thread is done with:
        the records its latest ``poll()`` handed out count as processed once it polls again
        (when iterating, each record once the loop asks for the next), as Kafka's auto-commit
        counts them; the rest go to the partitions' next owner (at-least-once). Never below
        an offset the application committed itself since its last seek of the partition: that
        commit says those records are processed (``_commit_floor``). Called from
        inside this thread's own ``poll()`` or ``commit()`` (a signal handler), it runs when
        that call returns, which then returns no records and commits none it drained; a
        signal handler that stops the loop while it processes records should call
        ``wakeup()`` instead, and let the loop close.
        """
        timeout = _check_timeout(timeout)
        if self._inside == threading.get_ident():
            # Interrupting this thread's own call, whose state is mid-change: after it.
            self._stop.set()
            self._wake_waits()
            self._deferred_close = (timeout,)
            return
        me = threading.get_ident()
        # From the loop body of ``for record in consumer`` too: the record it is on, and the
        # rest of its batch, are not processed yet.
        self._do_close(timeout, handed_out_unprocessed=me != self._poll_thread
                       or me == self._iterating)

    def _do_close(self, timeout: float | None, *, handed_out_unprocessed: bool) -> None:
        """close(); ``handed_out_unprocessed``: what ``_unacked`` names may be unprocessed.
        Raises what the listener raised in the final revocation, once the close is done."""
        self._stop.set()
        self._wake_waits()  # a poll() in another thread returns now
        started = time.monotonic()
        deadline = None if timeout is None else started + max(0.0, timeout)
        give_up_after = (
            self._config.session_timeout_ms / 1000 if timeout is None else max(0.0, timeout)
        )
        timer = threading.Timer(give_up_after, self._give_up_waiting)
        timer.daemon = True
        timer.name = f"rcoord-{self._config.group_id}-close-timer"
        timer.start()
        try:
            listener_error = self._close(deadline, handed_out_unprocessed)
        finally:
            timer.cancel()
        if listener_error is not None:
            raise listener_error

    def _give_up_waiting(self) -> None:
        """close()'s bound has passed: stop retrying commits and heartbeats (here and in a
        ``poll()`` running in another thread) and stop sending async commits to a coordinator
        that cannot be reached."""
        if self._simple_retries_end.is_set():
            return  # given up already (the timer, or close()'s final commit)
        log.warning(
            "group %r: close() is past its bound; commits and heartbeats stop retrying",
            self._config.group_id,
        )
        group = self._group
        if group is not None:
            group.stop_retrying()
        self._simple_retries_end.set()
        self._committer.give_up()

    def _close(self, deadline: float | None, handed_out_unprocessed: bool) -> Exception | None:
        """The close; what the listener raised in the final revocation, if it did (the close
        goes on: ``close()`` raises it at the end, as Kafka's close() throws "User rebalance
        callback throws an error" once it is done)."""
        listener_error: Exception | None = None
        with self._lock:
            if self._closed or self._closing:
                return None  # closed, or close() called again from the listener it is running
            self._closing = True
            self._close_deadline = deadline
            self._closer = threading.get_ident()
            if handed_out_unprocessed:
                # The positions go back to the first record not known processed (a
                # revocation's listener reads and commits these positions too).
                for tp, first in list(self._unacked.items()):
                    if tp in self._position:
                        self._position[tp] = min(self._position[tp], first)
            hold = self._hold
            try:
                if not self._revoking and self._gen is not None:
                    try:
                        self._revoke(lost=self._partitions_lost())
                    except Exception as exc:  # noqa: BLE001 - raised once the close is done
                        listener_error = exc
                elif self._assigned_manually and self._auto_commit:
                    # As Kafka's close(), which with auto-commit commits the consumed positions
                    # after assign() too (a simple-group commit: generation -1, no member id).
                    self._final_commit(self._commit_simple, "the assigned partitions")
                elif (self._pending_revocation and self._gen is not None and self._auto_commit
                      and not self._partitions_lost()):
                    # close() from inside a cooperative revocation's callback: that revocation
                    # gives up only some partitions, so the positions of those kept are
                    # committed too (the listener, running now, is not called again).
                    self._final_commit(self._commit_carried(self._commit_generation()),
                                       "the partitions kept")
                # Else close() was called from inside an eager revocation's callback: that
                # revocation is this consumer's last.
                # The callbacks of the commits finished by the deadline run while the
                # committer still takes commits: one may commit (commit() goes through it);
                # closed first, it made that commit() raise RuntimeError, nothing committed.
                self._committer.wait_idle(_remaining(deadline))
                self._run_close_callbacks()
                self._committer.close(_remaining(deadline))
                self._run_close_callbacks()  # (of the commits those callbacks made)
            finally:
                self._closed = True
                self._closing = False
                self._closer = None
                # Only now may the group go on (it waits for the hold): the commits made
                # during the revocation used the generation, which a rejoin would end.
                if hold is not None:
                    hold.released.set()
                    hold.applied.set()
                self._drop_holds()
                ender = self._end_calls()
                if self._group is not None:
                    self._group.close(_remaining(deadline))
                if ender is not None:
                    # (after the group's close, which leaves the group: a fetch that cannot
                    # be woken must not take its time)
                    left = _remaining(deadline)
                    ender.join(self._config.session_timeout_ms / 1000 if left is None else left)
                self._fetching.close()  # a fetch still in flight is dropped
                self._reading_starts.close()  # (so is a read of assign()'s starts)
                if ender is None:
                    self._close_own_client()  # (else the ender does, once the calls returned)
        return listener_error

    def _run_close_callbacks(self) -> None:
        """close()'s run of the finished commits' callbacks: what one raises is logged."""
        try:
            self._run_commit_callbacks()
        except Exception:
            log.exception("an async commit callback raised during close()")

    def _end_calls(self) -> threading.Thread | None:
        """Wake a fetch parked in ``XREAD BLOCK`` (``FetchWaker``) and wait for it and for the
        commits still running; the thread that does it (started: close() joins it within its
        bound, with none a session timeout, once the group is closed), which closes the
        consumer's own client once they returned, or None if nothing was running.

        Before, close() left the fetch parked for up to ``fetch_max_wait_ms`` and closed the
        client under it (its own or the group's, made from ``redis_url``), or the caller did
        after close(); so with close(0) and a final commit still running. A cluster client
        whose read fails reads the topology again on a new socket that nobody closes (a
        ResourceWarning at some later collection), and a standalone one's retry reconnects.
        The wake and the wait run on a thread of their own, so that a server that does not
        answer holds close() no longer than its bound; the clients made from ``redis_url``
        are closed by that thread once the calls returned (the group's is held open until
        then). A client the caller gave is the caller's to close after close() returned.
        The join comes after the group's close: before, it came first, so a fetch that
        ``CLIENT UNBLOCK`` cannot end (an ACL without ``@dangerous``, which has ``CLIENT ID``)
        took all of a close(timeout) shorter than its wait, and the LeaveGroup got none of it.
        """
        if not self._fetching.busy and not self._committer.pending:
            self._fetch_waker.wake()  # (no round trip: nothing is parked)
            return None
        release = self._group.hold_client() if self._group is not None else None

        def end() -> None:
            try:
                self._fetch_waker.wake()
                # (the socket timeout bounds the calls; the commits no longer retry)
                self._fetching.wait_finished(None)
                self._committer.wait_idle(None)
            finally:
                if release is not None:
                    release()
                self._close_own_client()

        ender = threading.Thread(target=end, daemon=True,
                                 name=f"rcoord-{self._config.group_id}-close-calls")
        ender.start()
        return ender

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            self.close()
            return
        try:
            self.close()
        except Exception:  # the block's own error is the one to raise
            log.exception("the rebalance listener raised in close(), leaving a block that "
                          "raised %s", exc_type.__name__ if exc_type else "an error")


_FETCH_POLLS = 4
"""A fetch asks for about this many polls' worth of records in all (``Consumer._send_fetch``)."""

_MIN_FETCH_SHARE = 50
"""Fewest records a fetch asks of one partition (unless max_poll_records is smaller)."""


@dataclass(frozen=True)
class _Starts:
    """What ``start_offsets`` found of the ``assign()``ed partitions (``_starts_of``)."""

    offsets: dict[TopicPartition, int]
    committed: dict[TopicPartition, int]
    missing: frozenset[TopicPartition]


@dataclass(frozen=True)
class _FetchAsk:
    """What a fetch in flight asked: per partition, the position it read from (its answer
    applies only while that is still the partition's fetch position; for a pending
    ``seek_to_*``, its marker); ``blocking``: one partition, waiting for a record, after a
    fetch of every partition found none; ``resolved``: the offsets the fetch thread read for
    the pending ``seek_to_*`` (the positions their reads started at)."""

    asked: tuple[tuple[TopicPartition, int], ...]
    blocking: bool
    resolved: dict[TopicPartition, int] = field(default_factory=dict)


_COUNTS_KEPT = 1024
"""The most topics whose partition counts a consumer keeps for its commit checks."""


def _fresh_count(cached: tuple[int, float] | None, since: float) -> int:
    """A cached partition count (``Consumer._check_exist``) if it was read after ``since``,
    else 0 (to be read again)."""
    return cached[0] if cached is not None and cached[1] >= since else 0

def _edges_of(coord: Coordinator, partitions: list[TopicPartition]
              ) -> dict[TopicPartition, tuple[int, int] | Errors | TopicError]:
    """The log offsets of ``partitions`` (their pending seek_to_*'s edges), all in one round
    trip; a partition that cannot be read (a stream whose last id is not rcoord's) is
    answered its TopicError (with a ``detail`` naming its stream) in its place by
    ``Coordinator.log_offsets_many``. Before, that one partition failed every fetch, so the
    others stalled with it."""
    if not partitions:
        return {}
    return dict(zip(partitions, coord.log_offsets_many(partitions), strict=True))


_UNKNOWN: PartitionRecords[Any] = PartitionRecords([], -1, -1, Errors.UNKNOWN_TOPIC_OR_PARTITION)
"""The answer for a pending ``seek_to_*`` whose partition does not exist (yet)."""


_FetchDone = Finished[list[PartitionRecords["ConsumerRecord"]], _FetchAsk]

_CommitFn = Callable[[Mapping[TopicPartition, int | OffsetAndMetadata]], None]
_SIMPLE = object()  # the token of simple-group commits (assign())


def _no_generation(
    group: ConsumerGroup | None,
) -> CommitFailedError | RebalanceInProgressError:
    """What a commit of given offsets raises while the consumer holds no generation, as
    Kafka's ``sendOffsetCommitRequest``: ``RebalanceInProgressError`` while the member is
    joining the group (a ``poll()`` started it: its first join, or a rebalance after its
    partitions were revoked or lost), since ``poll()`` completes the rebalance and the commit
    may follow; ``CommitFailedError`` when it takes part in no group (not polled yet,
    unsubscribed, or closed by a fatal error). Both refusals used to be CommitFailedError,
    which tells the application that its partitions are gone."""
    if group is not None and group.joining:
        return RebalanceInProgressError(
            "this consumer holds no generation: it is joining the group (a rebalance is in "
            "progress), so it owns no partitions to commit yet. Call poll() to complete the "
            "rebalance, then commit the partitions it assigns",
            Errors.REBALANCE_IN_PROGRESS,
        )
    return CommitFailedError(
        "this consumer holds no generation: it is not part of an active group (no poll() "
        "since it subscribed, or it is not subscribed), so it owns no partitions to commit",
        Errors.REBALANCE_IN_PROGRESS,
    )


class _SyncCommit:
    """The outcome of a ``commit()`` made on the committer thread: its callback records the
    error for ``commit()`` to raise, or, once ``commit()`` stopped waiting (``abandoned``:
    it raised ``TimeoutError``, ``WakeupError`` or a ``KeyboardInterrupt``), logs a failure, as
    an auto-commit's."""

    def __init__(self) -> None:
        self.abandoned = False
        self.error: BaseException | None = None

    def done(self, offsets: dict[TopicPartition, int], error: BaseException | None) -> None:
        if self.abandoned:
            if error is not None:
                log.warning("commit() of %s, which raised before it was done (its timeout, "
                            "wakeup() or an interrupt), failed: %s", _names(sorted(offsets)),
                            error)
        else:
            self.error = error


def _logged(what: str) -> OffsetCommitCallback:
    """The callback of a commit the consumer makes itself: a failure is logged, not raised."""

    def done(offsets: dict[TopicPartition, int], error: BaseException | None) -> None:
        if isinstance(error, (CommitFailedError, RebalanceInProgressError)):
            log.warning("%s refused: %s", what, error)
        elif error is not None:
            log.warning("%s of %s failed: %s", what, _names(sorted(offsets)), error)

    return done


def _call(listener: Any, method: str, partitions: list[TopicPartition]) -> None:
    fn = getattr(listener, method, None)
    if fn is not None:
        fn(partitions)


def _names(partitions: list[TopicPartition]) -> str:
    return ", ".join(f"{tp.topic}-{tp.partition}" for tp in partitions)


def _slice(deadline: float | None, cap: float) -> float:
    """Seconds to wait now: at most ``cap``, and not past ``deadline``."""
    if deadline is None:
        return cap
    return max(0.0, min(cap, deadline - time.monotonic()))


def _remaining(deadline: float | None) -> float | None:
    """Seconds left until ``deadline`` (None: no deadline), never negative."""
    return None if deadline is None else max(0.0, deadline - time.monotonic())


def _expired(deadline: float | None) -> bool:
    return deadline is not None and time.monotonic() >= deadline
