"""Group mode: a streaming query that is one member of an rcoord consumer group.

``StreamMember`` lives in Spark's *streaming source runner*, the Python process the JVM starts
for the query's stream reader and keeps for the query's whole life (see the PySpark notes).
That process can hold a membership: a ``ConsumerGroup`` with its heartbeat thread. No Spark
here: the Spark adapter calls ``initial()``, ``plan()``, ``commit()`` and ``close()``.

**The query is the member.** Its plans (``Position``) carry the generation and member id they
were made under:

* ``initial()`` joins and waits for the first generation; the query starts at the group's
  committed offsets (the ``start_offset`` policy where none was committed). Under ``latest``
  the start of a partition without one is committed at once, and ``latest`` places only the
  query's first generation: partitions that appear later start at their log start
  (``_place``).
* ``plan(start, latest, limit)`` runs when Spark plans the next micro-batch. Spark plans a
  batch only after the previous one's sink has finished, so ``start`` (the previous batch's
  end) is processed: it is committed first, fenced by the generation it was planned in. Then,
  if the generation ended (a member came or went), the member lets the group rejoin, takes the
  next generation and *rebases*: lost partitions are dropped, gained ones start at the group's
  committed offsets, and the query goes on without a restart.
* The member does not rejoin while a batch planned in the ending generation may still be
  running: each generation has a routine (``Generation.start``) that returns only when ``plan``
  has committed that batch, so a partition's new owner never reads it while its old owner is
  still processing it (Kafka's eager rebalance: revoke, commit, then rejoin). The rebalance
  timeout bounds the wait, as in Kafka.
* A commit the coordinator refuses (the group moved on; the plan came from an old checkpoint
  or a member that was removed) moves no offset and stops nothing: it is counted in
  ``refused`` and the partitions are processed again by their owner (at-least-once).
* A commit that was not made and did not fence the member (Redis did not answer, or answered
  with another error than the fencing codes above) holds the plan: no further batch is
  planned until it lands, the generation ends, or the session timeout passes (the query
  fails); one no retry mends (a replica's URL, a missing permission) fails the query at once.
  Planning on left several finished batches uncommitted, and a crash then delivered their
  records again under new batch ids (``_held``).
* ``replay(end, ranges)`` serves the batch Spark replays after a restart (planned by the old
  process's membership, never committed): its partitions this member holds with the group's
  committed offset at the batch's start are read again, and their ends become a plan of this
  member's generation, which the next ``plan`` commits and continues from. So each of their
  records is delivered in one batch id, and the sink's producer (named by the batch id)
  stores it once. The rest of the batch reads nothing (at-least-once, as before). The
  replaying generation is recorded in Redis first (``rcoord.spark.replays``), for sinks that
  name their output by the generation the batch is committed under; a replay that cannot
  record it fails (``ReplayNotRecordedError``): read as nothing, the batch would count as
  finished, and a later restart would go on from its end.
* A restarted query whose last batch finished (Spark's commit log has it; Spark never called
  ``commit`` for it) plans first from that batch's end, planned by the old process: the
  partitions this member holds begin there and it is committed under this generation, unless
  the group has committed further (``_resume``); that commit, not made, holds the plan as
  above, and fenced, the member rejoins and resumes in the next generation (a batch planned
  in the ended one read the finished batch again). Ends of replayed batches (``replaying``)
  are never taken for finished ones.
* ``close()`` leaves the group at once, so the others take the partitions over without
  waiting for the session timeout.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, TypeVar

from ..client import (
    CommitFailedError,
    ConsumerGroup,
    ConsumerGroupConfig,
    EndReason,
    Generation,
    GenerationContext,
    GenerationEndedError,
    GroupClosedError,
    RebalanceInProgressError,
    reaction_for,
)
from ..client.join import log_offsets_of, topics_matching
from ..errors import ConnectionLost, Errors, RcoordError
from ..protocol.offsets import OffsetAndMetadata, TopicPartition
from ..topics import Topics
from ..topics._base import meta_key
from ..topics.incarnation import created_times
from ..topics.times import server_ms
from .options import ReadOptions
from .plan import OffsetRange, Position, limit_end
from .replays import (
    REDIS_FAILURES,
    REPLAY_TTL_S,
    record_replay,
    record_replay_reads,
    replay_reads,
)
from .resolve import (
    Clamp,
    DataLossError,
    added_loss,
    continuity_loss,
    continuity_restart,
    drop_after_loss,
    gone_loss,
    restart_after_loss,
)

__all__ = ["TOKEN_METADATA", "CommitNotMadeError", "CommitOutcome", "ReplayNotRecordedError",
           "StreamMember", "member_config"]

log = logging.getLogger("rcoord.spark")

TP = TopicPartition
T = TypeVar("T")
LatestFn = Callable[[Sequence[TP]], tuple[Mapping[TP, tuple[int, int]], Mapping[str, str]]]
"""(partitions) -> (partition -> (log start, log end), topic -> create token); a partition or
topic that does not exist is missing."""

TOKEN_METADATA = "rcoord-create-token:"
"""Commit metadata prefix: the create token of the topic the committed offset belongs to, so the
partition's next owner can tell an offset of a deleted topic from one of the topic created again
under the same name (whose offsets began again at 0). ``MEMBER_METADATA`` and the committing
member's id follow it."""

MEMBER_METADATA = " member:"
"""Commit metadata, after the token: the member whose plan the offset ends, so a restarted query
can tell the group's offset its old process left (``StreamMember._resume``) from one an operator
set meanwhile (``rcoord groups reset-offsets``)."""


def _parse_metadata(metadata: str) -> tuple[str | None, str | None]:
    """(create token, committing member) of a commit's metadata; None where it has none (a
    plain worker's commit, an operator's reset)."""
    if not metadata.startswith(TOKEN_METADATA):
        return None, None
    token, _, member = metadata[len(TOKEN_METADATA):].partition(MEMBER_METADATA)
    return token or None, member or None


class ReplayNotRecordedError(RuntimeError):
    """A batch Spark replays after a restart, which this member would read, cannot run: Redis
    did not take the record of the replaying generation (``replays.record_replay``), which a
    sink naming its output by generation needs. The batch fails, so Spark replays it again
    when the query restarts; the Redis error is its ``__cause__``."""


class CommitNotMadeError(RuntimeError):
    """The end of the query's last finished batch could not be committed for longer than the
    session timeout, and the generation did not end: Redis kept answering the commit with an
    error (``StreamMember._held``). The query fails rather than plan further batches past an
    uncommitted one; the error is its ``__cause__``."""


@dataclass(frozen=True)
class CommitOutcome:
    """What became of one commit: ``accepted`` or refused with the coordinator's ``error``."""

    generation: int
    member: str
    offsets: dict[TP, int]
    accepted: bool
    error: Errors = Errors.NONE


def member_config(opts: ReadOptions, topics: Sequence[str], client: Any) -> ConsumerGroupConfig:
    """The group settings of a group-mode read: ``topics``, or with ``subscribePattern`` the
    pattern itself, so the member follows topics created and deleted while the query runs (a
    topic list fixed at the start never read a topic created later)."""
    start = opts.starting if isinstance(opts.starting, str) else "earliest"
    pattern = None if opts.pattern is None else re.compile(opts.pattern)
    return ConsumerGroupConfig(
        group_id=str(opts.group_id),
        topics=[] if pattern is not None else list(topics),
        topic_pattern=pattern,
        redis_client=client,
        namespace=opts.namespace,
        session_timeout_ms=opts.session_timeout_ms,
        heartbeat_interval_ms=opts.heartbeat_interval_ms,
        rebalance_timeout_ms=opts.rebalance_timeout_ms,
        partition_watch_interval_ms=max(500, opts.heartbeat_interval_ms),
        join_backoff_ms=min(1000, opts.session_timeout_ms),
        start_offset="latest" if start == "latest" else "earliest",
        client_id="spark",
    )


class StreamMember:
    """One streaming query's membership in a consumer group (see the module docstring)."""

    def __init__(self, group: ConsumerGroup, *, fail_on_data_loss: bool = True,
                 rejoin_wait_s: float = 1.0, first_join_wait_s: float | None = None) -> None:
        self._group = group
        self._fail = fail_on_data_loss
        self._rejoin_wait_s = rejoin_wait_s
        self._unreachable_since: float | None = None  # (``_next_generation``)
        # How long a plan() waits for this process's first generation (a query restarted on
        # its checkpoint plans before it ever joined): a first join waits out the group's
        # initial delay, and a dead member of the old process; a plan that gives up builds
        # no batch, and under availableNow Spark ends the run on it.
        self._first_join_wait_s = rejoin_wait_s if first_join_wait_s is None \
            else max(rejoin_wait_s, first_join_wait_s)
        self._gen: Generation | None = None
        self._hold = threading.Event()
        # What the last commit of this generation's own plan raised when it was not made and
        # the member was not fenced (``_commit_own``); ``plan`` plans no further batch while
        # it stands (``_held``), failing the query past a session timeout of such errors
        # (``_commit_failing_since``; ``_outage`` for ConnectionLost).
        self._commit_failed: RcoordError | None = None
        self._commit_failing_since: float | None = None
        self._closing = threading.Event()
        self._planned_at: float | None = None  # when plan() last began (monotonic)
        self._gap_warned = False
        self._committed: dict[TP, int] = {}
        self._initial: Position | None = None
        # (generation, member) -> offsets already sent: Spark's deferred commit(end) repeats
        # a plan that plan() committed (or saw refused) before the generation changed.
        self._sent: dict[tuple[int, str], dict[TP, int]] = {}
        # The (generation, member) stamps this process planned under. Only those positions are
        # committed: of a batch replayed from a checkpoint another process planned, only what
        # replay() read again is committed, under this member's stamp. Committing its end in
        # the old member's name, which the coordinator accepts while that member's session and
        # generation last, would move the group past records nobody processed.
        self._planned: set[tuple[int, str]] = set()
        # (the replayed end another process planned, this member's plan of what it replays):
        # see replay(). plan() and commit() take the second for the first.
        self._replayed: tuple[Position, Position] | None = None
        # Partitions found gone (their topic deleted) and reported once; read from their log
        # start if the topic comes back while this process runs.
        self._gone: set[TP] = set()
        # Per partition, the create token of the topic the generation's base offset (the
        # group's committed offset, or this process's last commit) belongs to; None unknown.
        self._base_tokens: dict[TP, str | None] = {}
        # Per partition, the member whose plan the group's committed offset ends (_resume).
        self._base_members: dict[TP, str | None] = {}
        # Where the current generation starts the partitions the group has no offset for
        # (see _place); the others start at the group's committed offset.
        self._placed: dict[TP, int] = {}
        # Every such start this process chose, kept across generations (see _place), and
        # moved with this process's commits read on from it (_commit_own).
        self._chosen: dict[TP, tuple[int, str | None]] = {}  # (start, its topic's token)
        # For a start chosen while its topic's token could not be read: the server's time
        # then, which the topic's creation time is checked against once the token is read
        # (_settle_tokens).
        self._chosen_ms: dict[TP, int] = {}
        # Per partition the group had no committed offset for, the start this process took:
        # the query's own start, or where it went on after reporting a loss (_check_unread).
        # A partition without one is new to the query.
        self._seen: dict[TP, int] = {}
        self._adopted = False
        # Ends of batches another process planned that Spark replays here (replaying()): they
        # may hold records nobody processed. Any other end of another process's plan that
        # Spark plans from is that of a batch Spark's commit log records as finished (_resume).
        self._replaying: list[Position] = []
        # Under latest, the create tokens of the subscribed topics read before the query's
        # first join (initial()); None when not read (_place: topics made again since).
        self._start_tokens: dict[str, str] | None = None
        self.outcomes: list[CommitOutcome] = []

    # -- information

    @property
    def generation(self) -> Generation | None:
        return self._gen

    @property
    def refused(self) -> list[CommitOutcome]:
        return [o for o in self.outcomes if not o.accepted]

    # -- lifecycle

    def initial(self, timeout_s: float) -> Position:
        """Join and return where the query starts: the group's committed offsets.

        Spark asks twice when a query starts; both answers are the same position.
        """
        if self._initial is None:
            if self._group.config.start_offset == "latest" and not self._adopted \
                    and not self._group.joining:
                # Before any join reads a log end: a topic made again between that read and
                # _place's token read shows as another token (_place).
                self._start_tokens = self._subscribed_tokens(timeout_s)
            self._take(timeout_s, query_start=True)
            self._initial = self._base_position()
            self._planned.add((int(self._initial.generation or 0), self._initial.member or ""))
        return self._initial

    def close(self, timeout_s: float | None = 30.0) -> None:
        """Leave the group now (the routine of the current generation returns first)."""
        self._closing.set()
        self._hold.set()
        self._group.close(timeout=timeout_s)

    # -- planning

    def plan(self, start: Position, latest: LatestFn, limit: int | None,
             clamp: Clamp | None = None, *, until_target: bool = False) -> Position:
        """The end of the next batch; ``start`` itself when there is nothing to read.

        ``latest`` gives the real log bounds, which the data-loss checks use; ``clamp``
        (availableNow: no end past the run's target) bounds only how far the batch reads, as
        ``resolve.next_position`` does: a start past the target (records appended after the
        run began, read by another run of the group) is not a topic created again.
        ``until_target`` (availableNow): Spark ends the run on the first plan that reads
        nothing, so a rebalance is waited out (``_next_generation``) instead of being taken
        for the end of the data."""
        self._group.start()  # a query restarted on a checkpoint plans before initial()
        self._check_plan_gap()
        own = self._own(start)  # a replayed batch's end: what this member replayed of it
        self._commit_failed = None
        self._commit_own(own)
        if self._held(own, until_target, lambda: self._commit_own(own)):
            return start
        gen = self._gen
        if gen is None or gen.done.is_set():
            if not self._next_generation(until_target):
                return start
            gen = self._gen
            assert gen is not None
        while own is start and self._finished_elsewhere(start):
            resumed = gen
            self._resume(resumed, start)
            if self._held(start, until_target, partial(self._resume, resumed, start)):
                return start  # (the next plan resumes again)
            if not resumed.done.is_set():
                break
            # Its commit fenced (or a rebalance began meanwhile): a batch planned in the ended
            # generation went on from the group's committed offset, and read the finished
            # batch again. Rejoin and resume in the next one, as a Kafka consumer whose commit
            # is refused rejoins before it fetches; no generation soon: nothing this trigger.
            if not self._next_generation(until_target):
                return start
            gen = self._gen
            assert gen is not None
        # Nothing holds the plan now: a run of failed commits, if any, is over (a resume
        # refused, then found moot, left its clock running for the next refusal to trip).
        self._commit_failing_since = None
        assigned = sorted(gen.offsets)
        # Partitions that go on from ``own``; the others (all of them when it was planned by
        # another membership: an old checkpoint, or a generation this query left) go on from
        # what the group has committed.
        carried = set(own.offsets) & set(assigned) if (
            own.generation == gen.generation_id and own.member == gen.member_id) else set()
        begin = {tp: own.offsets[tp] if tp in carried else self._base(tp) for tp in assigned}
        # Spark's ``partitions(start, end)`` gets only the two positions: every partition that
        # does not continue from ``start`` itself says in ``starts`` where it begins (all of
        # them after a replay: Spark's ``start`` is then the other process's plan).
        starts = {tp: begin[tp] for tp in assigned if tp not in carried or own is not start}
        bounds, tokens = latest(sorted(set(assigned) | set(start.offsets)))
        # A partition this query was reading (in ``start``) or was given that no longer exists:
        # its topic was deleted. Data loss, reported once (resolve.drop_after_loss); the plan
        # goes on without it. The leader's partition watcher soon rebalances it away, and that
        # rebase must not hide it, so ``start`` is checked whichever generation planned it.
        for tp in sorted(set(start.offsets) | set(assigned)):
            if tp not in bounds and tp not in self._gone:
                drop_after_loss(gone_loss(tp, start.offsets.get(tp, begin.get(tp, 0))),
                                self._fail)
                self._gone.add(tp)
        for tp in assigned:
            if tp not in bounds:
                del begin[tp]
                starts.pop(tp, None)
                continue
            lo, hi = bounds[tp]
            if tp in self._gone:
                # Created again after this process saw it gone: new to the query, read from
                # its log start (the group's committed offset belongs to the deleted topic).
                self._gone.discard(tp)
                begin[tp] = starts[tp] = lo
                if tp in self._seen:  # (where the query began the new topic: _check_unread)
                    self._seen[tp] = lo
                continue
            planned = (own.tokens.get(tp.topic) if tp in carried else None) \
                or self._base_tokens.get(tp)
            now = tokens.get(tp.topic)
            if not planned and now and tp in self._chosen_ms and tp in self._chosen:
                # A start this generation chose without its token (dated, _settle_tokens): its
                # own plan had nothing to compare, and read a topic made again since from the
                # old topic's offset, unreported.
                remade = self._settle_tokens([tp], {tp.topic: now})
                if tp in remade:
                    begin[tp] = starts[tp] = self._begin_remade(tp, remade[tp], lo, now)
                    continue
                if self._chosen[tp][1] is not None:
                    planned = self._base_tokens[tp] = self._chosen[tp][1]
            made_again = bool(planned and now and planned != now)
            if tp not in carried and tp not in gen.committed and tp not in self._committed \
                    and not made_again:
                # No offset committed: the query has not read it before (added, or matched by
                # a pattern, also while the query was down), or only from where it began.
                # (Not in a topic made again: its log start is not comparable with where the
                # query began the old one, and that loss is reported once, below.)
                start_at = self._check_unread(tp, lo)
                if start_at > begin[tp]:
                    begin[tp] = starts[tp] = start_at
            # The topic was deleted and created again (another create token than the one the
            # offset was planned or committed in), the offset is below the log start
            # (retention) or past the log end: data loss, as outside group mode
            # (resolve.next_position).
            loss = continuity_loss(tp, begin[tp], (lo, hi), planned, now)
            if loss is not None:
                at, what = continuity_restart(begin[tp], (lo, hi), planned, now)
                begin[tp] = starts[tp] = restart_after_loss(loss, at, self._fail, what)
                if made_again and tp in self._seen:
                    self._seen[tp] = begin[tp]  # (where the query began the new topic)
        readable = bounds if clamp is None else clamp(dict(bounds), tokens)
        ends = limit_end(begin, {tp: max(begin[tp], readable[tp][1]) for tp in begin}, limit)
        read = {tp.topic for tp in begin}
        end = Position(ends, starts, gen.generation_id, gen.member_id,
                       tokens={t: v for t, v in tokens.items() if t in read},
                       planned_ms=_planned_ms(self._group.redis_client))
        if not starts and end.offsets == start.offsets and start.same_plan(end):
            return start
        if start == self._initial:
            # After a restart Spark replays batch 0 from the *new* process's initial position,
            # not this one: the end must say where each partition began (replay()).
            end = replace(end, starts=dict(begin))
        self._planned.add((gen.generation_id, gen.member_id))
        return end

    def _held(self, own: Position, until_target: bool, again: Callable[[], object]) -> bool:
        """Whether ``plan`` builds no batch now: the commit of ``own`` (the last batch's end,
        planned in the live generation) was not made and did not fence the member, so the next
        batch waits for it, as Kafka's ``commitSync`` retries a commit before the poll loop
        goes on. That is a commit Redis did not answer (``ConnectionLost``: its outcome is
        unknown) and one it answered with any other error than the fencing codes
        (REBALANCE_IN_PROGRESS, ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID end the generation, and
        its partitions go on from the group's committed offset, at least once): a replica's
        READONLY (``ReadOnlyReplicaError``), COORDINATOR_NOT_AVAILABLE past the retries, a
        per-partition error, a missing permission. Only ``ConnectionLost`` held before; the
        others planned on, with the same duplicates after a crash.

        Planning on from an uncommitted end left two or more finished batches behind the
        group's committed offset. A crash then made the restarted query replay the last one
        with the group's offset short of its start: the replay read nothing, and the group
        delivered the finished batches' records again under new batch ids, which the sink
        stored a second time. Held, the query's last batch is finished (``_resume`` goes on
        from its end) or is the one replayed, whose start the group has committed.

        The same holds for ``_resume``'s commit of the end of a batch the process before a
        restart finished (``own`` is then that end): planned from the group's committed
        offset, its records came again in the next batch.

        The commit is tried again by the next plan (under ``until_target`` here, by ``again``,
        since a plan that reads nothing ends an availableNow run). Held no longer once the
        generation ends, and never past the session timeout of failures: the query fails
        (``_outage``, or ``CommitNotMadeError``). An error no retry mends
        (``reaction_for(...).fatal``: a replica's URL, a missing permission or ACL, a refused
        login) fails it at once, with the error's own message saying what to fix."""
        gen = self._gen
        while True:
            exc = self._commit_failed
            if gen is None or gen.done.is_set():
                self._commit_failing_since = None
                return False
            if exc is None:
                # (Nothing failed: made, or nothing to commit. Only a commit made ends a run of
                # failures: a plan's own batch with nothing to commit, before ``_resume``'s
                # refused commit, restarted its clock at every plan, so a lasting refusal of
                # that commit held the query for ever.)
                return False
            if reaction_for(exc).fatal:
                exc.add_note(f"rcoord: group {gen.group_id!r} could not commit the end of the "
                             "last finished batch, and the query stops rather than plan "
                             "further batches past it (a crash would deliver them again); "
                             "restart it once this is fixed: it goes on from that batch's end")
                raise exc
            if isinstance(exc, ConnectionLost):
                self._outage(exc)
            else:
                self._refused_too_long(gen, exc)
            log.warning("group %r: committing the last batch's end of [%s] failed (%s); no "
                        "further batch is planned until that commit lands", gen.group_id,
                        _names(set(own.offsets)), exc)
            if not until_target:
                return True
            gen.done.wait(self._rejoin_wait_s)
            self._commit_failed = None
            again()

    def _refused_too_long(self, gen: Generation, exc: RcoordError) -> None:
        """``_outage`` for a commit Redis answered with an error (not ``ConnectionLost``):
        ``CommitNotMadeError`` once such errors have lasted longer than the session timeout,
        so a lasting refusal (OFFSET_METADATA_TOO_LARGE under a small
        ``offset.metadata.max.bytes``, a deleted group) fails the query instead of holding
        it, reading nothing, for ever."""
        self._commit_failing_since, session_s = self._failing_since(self._commit_failing_since)
        if session_s is not None:
            raise CommitNotMadeError(
                f"group {gen.group_id!r}: committing the end of the last finished batch failed "
                f"for more than the session timeout ({session_s:g} s), so the query stops "
                f"rather than plan further batches past it (a crash would deliver them again): "
                f"{exc}. Fix that and restart the query: it goes on from that batch's end"
            ) from exc

    def _check_plan_gap(self) -> None:
        """Warn when Spark planned this batch later than the rebalance timeout after the last.

        The member commits its batch and rejoins only when Spark plans the next one (the
        generation's routine waits for that), as a Kafka consumer rejoins only in poll(). A
        trigger interval plus batch longer than ``rebalanceTimeoutMs`` (Kafka's
        ``max.poll.interval.ms`` plays its part) makes every rebalance drop this query from the
        group and its batch's commit be refused, so the partitions' next owner reads it again:
        with two queries and a 6 s trigger over a 3 s timeout, each batch re-read the backlog
        and the group never settled. Said once, and again each time such a gap ended a
        generation."""
        now = time.monotonic()
        last, self._planned_at = self._planned_at, now
        limit_ms = self._group.config.rebalance_timeout_ms
        if last is None or (now - last) * 1000 <= limit_ms:
            return
        ended = self._gen is not None and self._gen.done.is_set()
        if self._gap_warned and not ended:
            return
        self._gap_warned = True
        log.warning(
            "group %r: %.1f s passed between two micro-batch plans, more than rebalanceTimeoutMs "
            "(%d ms)%s. This query commits its batch and rejoins only when Spark plans the next "
            "one, so a rebalance in such a gap drops it from the group and its batch is read "
            "again by the partitions' next owner. Set rebalanceTimeoutMs above the trigger "
            "interval plus the longest batch (Kafka's max.poll.interval.ms, 300000 by default, "
            "plays this part)", self._group.config.group_id, now - last, limit_ms,
            "; a rebalance began meanwhile" if ended else "")

    def replay(self, end: Position, ranges: Sequence[OffsetRange], timeout_s: float) -> set[TP]:
        """The partitions of a replayed batch this member reads again exactly.

        ``end`` was planned by another process's membership (the query restarted from its
        checkpoint; Spark's first call in the new runner is ``partitions`` of the batch the old
        one planned but never committed, before any ``initialOffset`` or ``latestOffset``), and
        ``ranges`` are the batch's planned ranges. With no generation yet, this joins and waits
        for one, as ``initial()`` does (at most ``timeout_s``: ``TimeoutError``).

        A partition is replayed only if this member holds it (in the topic the batch was
        planned in) and the group's committed offset is exactly where its range begins: then
        nobody read past that since, and reading the range again under the same batch id lets
        the sink check the first attempt's appends off. Where nothing is committed, it is
        replayed unless the start policy puts it past the range's start (there is no commit to
        rewind; under ``latest`` the range would otherwise go to nobody). Any other range reads
        nothing: another member's partition is its owner's to read again from the committed
        offset (at-least-once), and a commit that moved past the start must not be rewound.
        The replayed ends become a plan of this generation (``_own``), so the next ``plan``
        commits them fenced by this generation, never in the old member's name, and goes on
        from them. If Redis does not take the record of the replay (``record_replay``), this
        raises: ``ReplayNotRecordedError``, or the error itself when no retry mends it (a
        refused login).
        """
        self.replaying(end)
        if self._replayed is not None and self._replayed[0] == end:
            return set(self._replayed[1].offsets)
        if self._gen is None:
            self._take(timeout_s)
        gen = self._gen
        assert gen is not None
        keep = {TP(r.topic, r.partition) for r in ranges if self._replays(gen, r, end)}
        log.info("group %r: replaying [%s] of a batch planned in generation %s by %s; [%s] "
                 "read nothing", gen.group_id, _names(keep), end.generation, end.member,
                 _names({TP(r.topic, r.partition) for r in ranges} - keep))
        try:
            # before any task reads: what it reads, for a query restarted after Spark counted
            # this replay as finished (_resume: the rest of the batch was read by nobody)
            record_replay_reads(self._group.redis_client, self._group.config.namespace,
                                gen.group_id, end, keep)
            # The sink learns the batch's generation from this one. A batch planned without
            # a group (the query restarted with groupId) names none: batch_generation gives -1
            # for it, whatever replays it, so there is nothing to record.
            if keep and end.generation is not None:
                record_replay(self._group.redis_client, self._group.config.namespace,
                              gen.group_id, end, gen.generation_id)
        except REDIS_FAILURES as exc:
            # Not read as nothing: Spark would count the batch as finished, and a query
            # restarted after it (a refused login fails this one at its next plan) took
            # its end for a finished batch's (_resume) and skipped its records for good.
            # Failed, the batch is replayed again when the query restarts.
            if isinstance(exc, RcoordError) and reaction_for(exc).fatal:
                raise
            raise ReplayNotRecordedError(
                f"group {gen.group_id!r}: cannot record that generation "
                f"{gen.generation_id} replays the batch planned in generation "
                f"{end.generation} by {end.member} ({exc}); the batch fails rather than "
                "read nothing, which Spark would count as finished: restart the query "
                "once Redis answers, and it replays the batch again") from exc
        if keep:
            stamp = (gen.generation_id, gen.member_id)
            own = Position({tp: end.offsets[tp] for tp in sorted(keep)}, generation=stamp[0],
                           member=stamp[1], tokens=dict(end.tokens))
            self._planned.add(stamp)
            self._replayed = (end, own)
        return keep

    def replaying(self, end: Position) -> None:
        """Spark replays the batch ending at ``end``, planned by another process: whatever
        ``replay`` reads of it (perhaps nothing), its end is no finished batch's (``_resume``).
        The source says so before anything else, so that a replay that fails still counts."""
        if end not in self._replaying:
            self._replaying.append(end)
            del self._replaying[:-16]

    # -- commits

    def commit(self, pos: Position) -> CommitOutcome | None:
        """Commit ``pos`` (a finished batch's end) with the generation it was planned in.

        Returns None when there is nothing new to commit, or when the commit was not made and
        is held (``_held``: the next plan makes it again).
        """
        return self._commit_own(self._own(pos))

    def _commit_own(self, pos: Position) -> CommitOutcome | None:
        """``commit`` of a position already taken through ``_own``."""
        if pos.generation is None or not pos.offsets or pos == self._initial:
            return None
        stamp = (pos.generation, pos.member or "")
        if stamp not in self._planned:
            # Planned by another process (a checkpoint's batch, of which this query replayed
            # nothing): not ours to commit. Its records come again from the group's committed
            # offsets (at least once), never skipped.
            log.info("not committing a batch planned in generation %s by %s: another "
                     "process planned it", pos.generation, pos.member)
            return None
        sent = self._sent.get(stamp, {})
        if all(sent.get(tp) == o for tp, o in pos.offsets.items()):
            return None
        self._sent[stamp] = {**sent, **pos.offsets}
        while len(self._sent) > 16:
            del self._sent[next(iter(self._sent))]
        gen = self._gen
        mine = gen is not None and (pos.generation, pos.member) == (gen.generation_id,
                                                                    gen.member_id)
        if mine:
            todo = {tp: o for tp, o in pos.offsets.items() if self._committed.get(tp) != o}
            if not todo:
                return None
            assert gen is not None
            try:
                gen.commit_offsets(_with_tokens(todo, pos.tokens, gen.member_id))
            except (CommitFailedError, RebalanceInProgressError) as exc:
                log.warning("group %r: %s", gen.group_id, exc)
                return self._record(pos, todo, exc.error or Errors.ILLEGAL_GENERATION)
            except RcoordError as exc:  # not made, member not fenced: plan holds (``_held``)
                log.warning("group %r: commit failed, will retry: %s", gen.group_id, exc)
                self._sent.pop(stamp, None)
                self._commit_failed = exc  # (``_held``)
                # Not an outcome: nothing was refused and nothing is read again; counted in
                # ``refused`` once per held plan, an outage of n plans showed n refusals of a
                # batch committed once, in full.
                return None
            self._unreachable_since = self._commit_failing_since = None
            self._committed.update(todo)
            self._base_tokens.update({tp: pos.tokens.get(tp.topic) for tp in todo})
            for tp in todo.keys() & self._chosen.keys():
                # A start this process chose (_place) that this plan read on from: the query
                # has read up to here, so a topic found made again later (the group's commit,
                # older than the new topic, then counts as none, and _place starts there
                # again) loses the old topic's records from here on, and a commit that expired
                # is taken up from here. The loss named the first start, as if nothing had been
                # read, and a commit that expired was read again from it. A dated start
                # (_settle_tokens) keeps its date, committed without a token (the plan could
                # not read it either); one chosen with its token takes the plan's, if read.
                token = None if tp in self._chosen_ms else (
                    pos.tokens.get(tp.topic) or self._chosen[tp][1])
                self._chosen[tp] = (todo[tp], token)
            return self._record(pos, todo, Errors.NONE)
        # This process's plan from an earlier generation: let the coordinator fence it with
        # its own stamp.
        try:
            result = self._group.coordinator.commit_offsets(
                self._group.config.group_id,
                _with_tokens(pos.offsets, pos.tokens, pos.member or ""),
                member_id=pos.member or "",
                generation_id=pos.generation,
            )
        except RcoordError as exc:
            log.warning("commit of a generation %d plan failed: %s", pos.generation, exc)
            return self._record(pos, dict(pos.offsets), Errors.UNKNOWN_SERVER_ERROR)
        error = next((e for e in result.values() if e is not Errors.NONE), Errors.NONE)
        if error is not Errors.NONE:
            log.warning("group %r: commit planned in generation %d by %s refused (%s); the "
                        "group's committed offsets stay", self._group.config.group_id,
                        pos.generation, pos.member, error.name)
        return self._record(pos, dict(pos.offsets), error)

    # -- internals

    def _record(self, pos: Position, offsets: dict[TP, int], error: Errors) -> CommitOutcome:
        out = CommitOutcome(int(pos.generation or 0), pos.member or "", offsets,
                            error is Errors.NONE, error)
        self.outcomes.append(out)
        del self.outcomes[:-100]
        return out

    def _replays(self, gen: Generation, r: OffsetRange, end: Position) -> bool:
        """Whether ``replay`` reads ``r`` (a range of ``end``, the replayed batch) again."""
        tp = TP(r.topic, r.partition)
        if tp not in gen.offsets or tp not in end.offsets:
            return False  # another member's: its owner reads it from the committed offset
        token, base_token = end.tokens.get(r.topic), self._base_tokens.get(tp)
        if token and base_token and token != base_token:
            return False  # the committed offset belongs to another topic of that name
        if tp in self._committed or tp in gen.committed:
            return self._base(tp) == r.start  # moved past the start (or short of it): no
        # Nothing committed: the start policy placed the generation (earliest: the log start,
        # latest: the log end). No commit can be rewound; under latest, reading nothing would
        # leave the batch's records to nobody. A batch of the query run without groupId (no
        # generation) is replayed where it began: the group has read none of it, and the
        # next plan goes on from its end, as from a finished one (_resume); read as nothing,
        # the partition began again at the log start, every record read before came again.
        return end.generation is None or r.start <= self._base(tp)

    def _own(self, pos: Position) -> Position:
        """``pos``, or this member's plan of it if it is the end of a batch it replayed."""
        if self._replayed is not None and pos == self._replayed[0]:
            return self._replayed[1]
        return pos

    def _base(self, tp: TP) -> int:
        """Where the current generation stands in ``tp``: committed by us, else its start."""
        assert self._gen is not None
        return self._committed.get(tp, self._placed.get(tp, self._gen.offsets[tp]))

    def _base_position(self) -> Position:
        assert self._gen is not None
        base = {tp: self._base(tp) for tp in sorted(self._gen.offsets)}
        return Position(base, dict(base), self._gen.generation_id, self._gen.member_id)

    def _committed_metadata(self, gen: Generation) -> dict[TP, tuple[str | None, str | None]]:
        """(create token, committing member) of the group's committed offsets of ``gen``'s
        partitions (``_parse_metadata``; None where a commit has none, e.g. a plain worker's,
        and for every partition if the fetch fails: then only a start past the log end shows a
        re-creation, and ``_resume`` leaves the group's offsets as they are)."""
        if not gen.offsets:
            return {}
        try:
            fetched = self._group.coordinator.fetch_offsets(gen.group_id, sorted(gen.offsets))
        except RcoordError as exc:
            log.warning("group %r: reading the committed offsets' metadata failed: %s",
                        gen.group_id, exc)
            return {}
        return {tp: _parse_metadata(om.metadata or "") for tp, om in fetched.offsets.items()}

    def _take(self, timeout_s: float, *, query_start: bool = False) -> None:
        """Take the group's next generation, waiting at most ``timeout_s`` (``TimeoutError``);
        one that ended before it could be held is passed over for the one after it."""
        deadline = time.monotonic() + timeout_s
        while True:
            gen = self._group.next(timeout=max(0.0, deadline - time.monotonic()))
            try:
                self._adopt(gen, query_start=query_start)
            except GenerationEndedError:
                log.info("group %r: generation %d ended before it was taken; waiting for the "
                         "next", gen.group_id, gen.generation_id)
                continue
            except DataLossError:
                # (A RuntimeError too, but the query's to fail, as any plan's: taken for a
                # thread that cannot start, it ended the generation with its routine held, so
                # the call waited out its whole join wait and failed with a timeout's error.)
                raise
            except RuntimeError as exc:
                # The hold's thread cannot start (the process's thread limit). Let out from
                # here, the generation stayed live, heartbeating, held by no one: this member
                # kept its partitions unread, and the next plan waited for a generation after
                # it that never came. It ends with the error instead, as Consumer._begin does
                # (ERROR_POLICY's "anything else": the member leaves and joins again after
                # join_backoff_ms); the group reports the error once, through next() here.
                gen._end(EndReason.ERROR, exc)
                continue
            return

    def _adopt(self, gen: Generation, *, query_start: bool = False) -> None:
        """Hold ``gen`` and start planning in it. Its routine starts first, before any round
        trip: a generation that ends meanwhile then waits for this member's plan to release
        it, instead of being collected without it (``GenerationEndedError`` only if it was
        collected before this call)."""
        hold = threading.Event()

        def revoke(ctx: GenerationContext) -> None:
            # Returning lets the group rejoin: only after plan() committed what this
            # generation planned (or the query is closing).
            while not hold.wait(0.1):
                if self._closing.is_set():
                    return

        gen.start(revoke)
        self._hold = hold
        try:
            self._begin(gen, query_start)
        except BaseException:
            hold.set()  # (nothing of this generation is planned: its routine need not wait)
            raise

    def _begin(self, gen: Generation, query_start: bool) -> None:
        """``_adopt``'s work once the generation is held."""
        self._gen = gen
        self._committed = {}
        self._gone = set()
        metadata = self._committed_metadata(gen)
        self._base_tokens = {tp: token for tp, (token, _) in metadata.items()}
        self._base_members = {tp: member for tp, (_, member) in metadata.items()}
        for tp, offset in gen.committed.items():
            if tp in self._chosen and self._chosen[tp][0] != offset:
                # The group committed past a start this process chose (and dated) in an
                # earlier generation: another member read on from it, maybe in a topic made
                # again since. That start, and its date, no longer say where the query goes
                # on; the date judged the group's offset, a loss nobody had.
                del self._chosen[tp]
                self._chosen_ms.pop(tp, None)
        first = query_start and not self._adopted
        self._placed = self._place(gen, first)
        self._adopted = True
        if first:  # the query's start: whatever the log holds now is where it begins
            for tp, offset in gen.offsets.items():
                if tp not in gen.committed:
                    self._seen.setdefault(tp, self._placed.get(tp, max(0, offset)))
            for tp, log_start in self._log_starts_now().items():
                self._seen.setdefault(tp, log_start)
        log.info("group %r: generation %d, member %s, partitions %s", gen.group_id,
                 gen.generation_id, gen.member_id,
                 [f"{tp.topic}-{tp.partition}" for tp in sorted(gen.offsets)])

    def _finished_elsewhere(self, start: Position) -> bool:
        """Whether ``start`` is the end of a batch another process planned and finished.

        Spark plans from another process's position only after a restart, and then either
        replays that position's batch (``replaying``), or its commit log records the batch as
        finished: its sink stored every record, though Spark never called ``commit`` for it
        (it does not for the last batch before a stop). A position without a generation is
        the checkpoint of the query run without ``groupId`` (``_resume`` takes it up).
        """
        return (bool(start.offsets) and start not in self._replaying
                and (start.generation is None
                     or (start.generation, start.member or "") not in self._planned))

    def _resume(self, gen: Generation, start: Position) -> None:
        """Begin the partitions of ``start`` (a finished batch's end, ``_finished_elsewhere``)
        that ``gen`` gives this member where that batch ended, committing it under ``gen``.

        The old process's member committed only up to the batch's start, so the group would
        deliver the batch again under the next batch id, and the sink would store it twice.
        A partition whose committed offset someone else set (another member went on reading
        it, an operator reset it: the commit's metadata names another member, or none) or
        whose offset belongs to another topic of that name stays where the group stands; one
        this member does not hold is its owner's to read from the group's committed offset
        (at-least-once). But where the batch began a partition (``start.starts``: it was
        handed to the old member in a rebalance, or that member had rejoined under a new id)
        at exactly the offset a member committed, nothing moved it since: the batch goes on
        from its end there too. It was delivered again, the commit naming the member that had
        handed the partition over. An operator's reset (no member named) always wins.

        A batch Spark replayed after an earlier restart (Spark counts a replay as finished
        whatever it read) is finished only in the partitions the replay read again
        (``replays.replay_reads``); the others were read by nobody, or by their owner from the
        group's committed offsets, and come again from there. Before, a replay that read
        nothing (another member's partitions, or a batch 0 whose starts were not recorded),
        followed by a stop before the next plan, had its records skipped for good.

        ``start`` without a generation is the checkpoint of the query run without ``groupId``,
        restarted with it: the partitions the group has no committed offset for go on where the
        checkpoint's finished batch ended, as Spark's Kafka source goes on from its checkpoint
        whatever the options say; where the group has one, the group's wins. Before, they
        started at the group's start policy, and the log start (under ``latest`` too: a
        restarted query's generation places at the log start) delivered every record the
        query had already read again.

        A replay's record lasts ``REPLAY_TTL_S``; no record of a batch planned longer ago
        (``_record_may_have_expired``) does not say that its planner's process ran it: the
        batch comes again from the group's committed offsets, as when Redis cannot tell. Before,
        a query restarted after it had been stopped that long, right after a replay that read
        only part of the batch, took the rest for read and skipped it for good.
        """
        try:
            read = replay_reads(self._group.redis_client, self._group.config.namespace,
                                gen.group_id, start)
        except REDIS_FAILURES as exc:
            log.warning("group %r: cannot tell whether the batch planned in generation %s by "
                        "%s was a replay that read only part of it (%s); it comes again from "
                        "the group's committed offsets", gen.group_id, start.generation,
                        start.member, exc)
            return
        if read is None and _record_may_have_expired(self._group.redis_client, start):
            log.warning("group %r: the batch planned in generation %s by %s may be older than "
                        "a replay record lasts (%d days; or the server's clock cannot be read "
                        "to tell): if a restart replayed only part of it, that record may be "
                        "gone; it comes again from the group's committed offsets (at least "
                        "once)", gen.group_id, start.generation, start.member,
                        REPLAY_TTL_S // 86400)
            return
        todo: dict[TP, int] = {}
        for tp, end in sorted(start.offsets.items()):
            if tp not in gen.offsets or (read is not None and tp not in read):
                continue
            token, base = start.tokens.get(tp.topic), self._base_tokens.get(tp)
            if token and base and token != base:
                continue
            have, by = gen.committed.get(tp), self._base_members.get(tp)
            if start.generation is None:  # a plain checkpoint: only where the group has none
                untouched = False
            else:
                untouched = by is not None and (by == start.member
                                                or have == start.starts.get(tp))
            if have is None or (have < end and untouched):
                todo[tp] = end
        if not todo:
            return
        try:
            gen.commit_offsets(_with_tokens(todo, start.tokens, gen.member_id))
        except (CommitFailedError, RebalanceInProgressError) as exc:
            # Fenced: the generation ended; its partitions go on from the group's committed
            # offsets (at least once), never skipped.
            log.warning("group %r: committing where the finished batch of generation %s by "
                        "%s ended failed: %s", gen.group_id, start.generation, start.member, exc)
            return
        except RcoordError as exc:
            # Not made, the member not fenced: the plan holds and resumes again (``_held``).
            # Planning from the group's committed offsets delivered the finished batch's
            # records again under the next batch id, and the sink stored them twice.
            log.warning("group %r: committing where the finished batch of generation %s by "
                        "%s ended failed: %s", gen.group_id, start.generation, start.member, exc)
            self._commit_failed = exc
            return
        log.info("group %r: [%s] go on where the batch planned in generation %s by %s ended "
                 "(finished before the restart)", gen.group_id, _names(set(todo)),
                 start.generation, start.member)
        self._unreachable_since = self._commit_failing_since = None
        self._committed.update(todo)
        self._base_tokens.update({tp: start.tokens.get(tp.topic) for tp in todo})

    def _place(self, gen: Generation, query_start: bool) -> dict[TP, int]:
        """Under ``startingOffsets=latest``: where ``gen`` starts the partitions the group has
        no committed offset for, committed at once under ``gen``.

        ``latest`` places the query's start, as in Spark's Kafka source: it applies to the
        first generation of a query that starts (``initial()``, Spark's ``initialOffset``)
        only. A query restarted on its checkpoint takes its first generation in ``plan`` or
        ``replay``: Spark's Kafka source reads the partitions its checkpoint does not know from
        their log start. A partition without a committed offset in any other generation is
        one this process placed before (its commit did not land) or one new to the query
        (partitions added, a topic subscribed by pattern, also while the query was down): it
        starts where this process placed it, else at its log start, as Spark's Kafka source
        reads a partition it discovers. Committing the start (as Kafka's consumer commits a reset
        position on revocation) is what keeps the next generation from placing the partition
        at a newer log end: the records appended between the two ends would go to nobody.
        Under ``earliest`` nothing is placed: the next generation finds the same log start.
        """
        if self._group.config.start_offset != "latest":
            return {}
        todo = {tp: start for tp, start in sorted(gen.offsets.items())
                if tp not in gen.committed and start >= 0}
        if not todo:
            return {}
        # The create tokens are read before the log starts (a topic created again in between
        # then shows as data loss, never as the new topic read from the old one's offset). A
        # start chosen before keeps the token it was chosen with (chosen without one: the
        # token its topic is found to have had then, _settle_tokens).
        fresh = self._create_tokens({tp.topic for tp in todo})
        remade = self._settle_tokens([tp for tp in todo if tp in self._chosen], fresh)
        # A start chosen now without its topic's token is dated instead (_settle_tokens), by
        # the clock of its topic's master, which stamped the topic's created_ms.
        config = self._group.config
        since = {t: ms for t in sorted({tp.topic for tp in todo
                                        if tp not in self._chosen and tp.topic not in fresh})
                 if (ms := _topic_ms(self._group.redis_client, config.namespace, t)) is not None}
        # The query's start is the log end its join read, of the topic the token read before
        # that join names (initial()). Another token now: the topic was made again since the
        # query began, perhaps after that read, and the offset may be the old topic's (taken
        # for the new one's, the new topic's first records went unread, unreported). All the
        # new topic's records came after the query began: it is read from its log start, as
        # a topic that appears later, that log start read after the token (a topic made again
        # in between then shows as data loss, below).
        before = self._start_tokens if query_start else None
        made_since = [tp for tp in todo if before is not None and tp.topic in before
                      and tp.topic in fresh and before[tp.topic] != fresh[tp.topic]]
        log_starts = self._log_starts(made_since) if query_start else self._log_starts(
            [tp for tp in todo if tp not in self._chosen])
        placed: dict[TP, int] = {}
        for tp, start in todo.items():
            if query_start:
                got = log_starts.get(tp, start)
                if isinstance(got, RcoordError):
                    # Its log start unknown: the join's offset, as the old topic's (before's
                    # token, a start chosen before: not committed), which the plan reports as
                    # a topic made again, rather than the new topic read from it unreported.
                    log.warning("group %r: no log start for %s-%d (%s)", gen.group_id,
                                tp.topic, tp.partition, got)
                    assert before is not None
                    self._chosen[tp] = (start, before[tp.topic])
                    placed[tp] = start
                else:
                    placed[tp] = start if tp not in made_since else self._check_unread(tp, got)
            elif tp in self._chosen:
                placed[tp] = self._chosen[tp][0]
            else:
                got = log_starts[tp]
                if isinstance(got, RcoordError):
                    log.warning("group %r: no log start for %s-%d (%s); it starts at its log "
                                "end", gen.group_id, tp.topic, tp.partition, got)
                    got = start
                    if tp not in remade:
                        placed[tp] = start
                        continue
                if tp in remade:
                    placed[tp] = self._begin_remade(tp, remade[tp], got, fresh[tp.topic],
                                                    placed=True)
                else:
                    placed[tp] = self._check_unread(tp, got)
        # The commit names the topic its offsets belong to, as every commit of a plan does:
        # a topic deleted and created again under it is then data loss, not a read of the new
        # topic from the old one's offset (which skipped the new topic's first records).
        earlier = {tp for tp in placed if tp in self._chosen}
        for tp, offset in placed.items():
            token = fresh.get(tp.topic)
            if tp in earlier:
                continue
            if token is not None:
                self._chosen[tp] = (offset, token)
            elif tp.topic in since:
                self._chosen[tp], self._chosen_ms[tp] = (offset, None), since[tp.topic]
            # (Neither token nor time: chosen again by the next generation, from its log
            # start, rather than kept where no later read could tell its topic.)
        tokens = {tp: self._chosen[tp][1] if tp in self._chosen else None for tp in placed}
        self._base_tokens.update(tokens)
        # A start chosen before is committed only if its topic is still the one it was chosen
        # in (both tokens known and equal): else the group's other readers (a plain Consumer)
        # could take the old topic's offset for the new one's (a commit made after the
        # creation counts as the new topic's, rcoord.topics.incarnation) and skip its first
        # records. The plan still starts there with the old token, so a topic made again is
        # reported as data loss (continuity_loss); one whose token could not be read now is
        # placed again from _chosen by the next generation.
        stale = {tp for tp in earlier
                 if not tokens[tp] or tokens[tp] != fresh.get(tp.topic)}
        commit = {tp: _stamped(o, tokens[tp], gen.member_id)
                  for tp, o in placed.items() if tp not in stale}
        try:
            if commit:
                gen.commit_offsets(commit)
        except RcoordError as exc:
            # The generation ended already (or Redis is away): the next one places them the
            # same way, from _chosen.
            log.warning("group %r: committing the start of %s failed: %s", gen.group_id,
                        _names(set(commit)), exc)
        return placed

    def _settle_tokens(self, tps: Sequence[TP], fresh: Mapping[str, str]) -> dict[TP, str]:
        """Give the starts of ``tps`` chosen while their topic's token could not be read
        (``_chosen_ms``) the token ``fresh`` now has for it, if the topic was created before
        the start was chosen; a topic created since is another one, and the partition is
        returned with the data loss to report (the old topic's records from that start on
        went unread), to be chosen again in the new topic (``_place``).

        Kept without a token, such a start was never committed (only a start whose topic is
        known to be the same is): a generation that ended before its first batch committed
        left the partition to a member that placed it afresh, under ``latest`` at a newer log
        end, and the records between went to nobody, unreported."""
        todo = [tp for tp in tps if self._chosen[tp][1] is None and tp in self._chosen_ms
                and tp.topic in fresh]
        if not todo:
            return {}
        config = self._group.config
        try:
            born = created_times(self._group.redis_client, config.namespace,
                                 {tp.topic for tp in todo})
        except REDIS_FAILURES as exc:
            log.warning("group %r: cannot read when %s was created (%s)", config.group_id,
                        ", ".join(sorted({tp.topic for tp in todo})), exc)
            return {}
        remade: dict[TP, str] = {}
        for tp in todo:
            if tp.topic not in born:
                continue  # (deleted meanwhile: tried again next time)
            start, chosen_ms = self._chosen[tp][0], self._chosen_ms.pop(tp)
            # (Created in the start's millisecond counts as since: a loss reported, never
            # the new topic read from the old one's offset; ``Topics.create`` returns only
            # once its millisecond is over, rcoord.topics.incarnation.)
            if born[tp.topic] < chosen_ms:
                self._chosen[tp] = (start, fresh[tp.topic])
                continue
            del self._chosen[tp]
            remade[tp] = (f"topic {tp.topic!r} partition {tp.partition}: the topic was deleted "
                          f"and created again since offset {start} was chosen (or committed "
                          "without its token) as where the query goes on, so the old topic's "
                          "records from there on were never read")
        return remade

    def _begin_remade(self, tp: TP, loss: str, log_start: int, token: str, *,
                      placed: bool = False) -> int:
        """Where ``tp`` goes on once ``_settle_tokens`` found its dated start's topic made again
        (``loss`` to report): the new topic's log start ``log_start``, after the loss
        (``restart_after_loss``: raised under failOnDataLoss), the offset then belonging to the
        new topic (``token``). The query began the new topic there: that is the partition's
        ``_seen``, which ``_check_unread`` compares later log starts with, if it has one, or
        ``placed`` (``_place``: the group has no committed offset for it)."""
        at = restart_after_loss(loss, log_start, self._fail)
        self._base_tokens[tp] = token
        if placed or tp in self._seen:
            self._seen[tp] = at
        return at

    def _check_unread(self, tp: TP, log_start: int) -> int:
        """Where a partition the group has no committed offset for begins, ``log_start`` being
        its log start now; data loss (``restart_after_loss``) if retention removed records the
        query never read: the partition is new to the query (``_seen`` has no start for it) and
        its log no longer starts at 0, as Spark's Kafka source reports an added partition
        ("starts from X instead of 0"), or it starts past where this process began it."""
        began = self._seen.get(tp)
        if log_start > (began or 0):
            loss = added_loss(tp, log_start) if began is None else continuity_loss(
                tp, began, (log_start, log_start), None, None)
            assert loss is not None  # (began < log_start: the retention case)
            restart_after_loss(loss, log_start, self._fail)
        self._seen[tp] = max(began or 0, log_start)
        return log_start

    def _log_starts_now(self) -> dict[TP, int]:
        """The log start of every partition the query subscribes to now, also those another
        member holds. A partition there when the query started is not new to it: taken over
        later without a committed offset (its owner stopped before committing), it begins at
        its log start, and only records trimmed since the query began are data loss
        (``_check_unread``); before, any log start past 0 was reported, as for a partition
        added later. Read once per query; what cannot be read is left to that check."""
        config, coordinator = self._group.config, self._group.coordinator
        out: dict[TP, int] = {}
        try:
            names = self._subscribed_names(lambda: coordinator.list_topics())
            counts = coordinator.partition_counts(sorted(names))
        except RcoordError as exc:
            counts = {}
            log.warning("group %r: cannot read its topics' partitions (%s)", config.group_id, exc)
        tps = [TP(t, p) for t, n in sorted(counts.items()) for p in range(max(n, 0))]
        for tp, got in self._log_starts(tps).items():
            if isinstance(got, RcoordError):  # (deleted meanwhile, or Redis away)
                log.warning("group %r: no log start for %s-%d (%s)", config.group_id, tp.topic,
                            tp.partition, got)
            else:
                out[tp] = got
        return out

    def _log_starts(self, tps: Sequence[TP]) -> dict[TP, int | RcoordError]:
        """The log start of each of ``tps`` in one read (``join.log_offsets_of``: a round trip
        per node), in their order, or the error that left it unknown: its own (a deleted
        topic, a partition out of range), or the read's (Redis away) for all of them.

        One ``log_offsets`` per partition cost a round trip each: ``_log_starts_now`` reads
        every partition of every subscribed topic when a query starts."""
        try:
            edges = log_offsets_of(tps, self._group.coordinator, _once)
        except RcoordError as exc:
            return {tp: exc for tp in tps}
        return {tp: got if isinstance(got, RcoordError) else got[0]
                for tp, got in ((tp, edges[tp]) for tp in tps)}

    def _subscribed_names(self, listed: Callable[[], Sequence[str]]) -> list[str]:
        """The topics the query subscribes to now: its names, or those of its pattern among
        ``listed()`` (the namespace's topics, read only for a pattern)."""
        config = self._group.config
        if config.topic_pattern is None:
            return list(config.topics)
        return list(topics_matching(config.topic_pattern, listed()))

    def _subscribed_tokens(self, timeout_s: float) -> dict[str, str] | None:
        """The create tokens of the topics the query subscribes to now (``_create_tokens``:
        one it cannot read is missing), read connected but not joined (``ConsumerGroup.connect``,
        waiting at most ``timeout_s`` for a start under way), or None if the group cannot
        connect or the names cannot be listed."""
        config = self._group.config
        try:
            self._group.connect(timeout_s)
            names = self._subscribed_names(
                lambda: Topics(self._group.redis_client, config.namespace).list())
        except (*REDIS_FAILURES, TimeoutError) as exc:
            log.warning("group %r: cannot read its topics before joining (%s)", config.group_id,
                        exc)
            return None
        return self._create_tokens(set(names))

    def _create_tokens(self, topics: set[str]) -> dict[str, str]:
        """The create token of each of ``topics`` (``Topics.create_token``), read through the
        group's Redis client; a topic that is gone, or a read that fails, has none (its
        placement is checked by its offsets only, as before tokens)."""
        config = self._group.config
        admin = Topics(self._group.redis_client, config.namespace)
        out: dict[str, str] = {}
        for topic in sorted(topics):
            try:
                token = admin.create_token(topic)
            except RcoordError as exc:
                log.warning("group %r: no create token for topic %r (%s)", config.group_id,
                            topic, exc)
                continue
            if token:
                out[topic] = token
        return out

    def _next_generation(self, until_target: bool) -> bool:
        """Release the ended generation and take the next one if it comes soon (this
        process's first one: within ``first_join_wait_s``). ``until_target`` (availableNow):
        a plan that gives up ends the run short of its target, so it waits as long as for a
        first join, through the group's retried join errors, and then fails the query."""
        self._hold.set()
        wait = self._first_join_wait_s if until_target or not self._adopted \
            else self._rejoin_wait_s
        deadline = time.monotonic() + wait
        while True:
            try:
                self._take(max(0.0, deadline - time.monotonic()))
                self._unreachable_since = None
                return True
            except TimeoutError:
                if until_target:
                    raise TimeoutError(
                        f"group {self._group.config.group_id!r}: no generation within {wait:g} "
                        "s after a rebalance, so this availableNow run cannot read up to its "
                        "target; it stops here rather than end as if it had") from None
                return False
            except GroupClosedError:
                raise
            except RcoordError as exc:
                if reaction_for(exc).fatal:
                    # The group closed on it (a missing permission, a JoinGroup refusal, a
                    # fenced instance id): no generation will come, so the query fails with
                    # its message.
                    raise
                log.warning("group %r: %s", self._group.config.group_id, exc)  # it backs off
                if isinstance(exc, ConnectionLost):
                    self._outage(exc)
                if not until_target:
                    return False

    def _outage(self, exc: ConnectionLost) -> None:
        """Fail the query once Redis has been out of reach for longer than the session
        timeout. A plan without a generation builds no batch, which Spark takes for "no new
        data": on an outage the query stayed up reading nothing, for ever, with only warnings
        (a reviewer's repro; the plain reader fails at once, and Spark's Kafka source after
        ``fetchOffset.numRetries``). A blip shorter than a session keeps the query running:
        the member is still in its group, and its partitions with it; past the session timeout
        the group has expired it anyway, and Spark's restart of the query is the way back."""
        self._unreachable_since, session_s = self._failing_since(self._unreachable_since)
        if session_s is not None:
            raise ConnectionLost(
                f"group {self._group.config.group_id!r}: Redis out of reach for more than the "
                f"session timeout ({session_s:g} s), so the query stops rather than plan empty "
                f"batches: {exc}") from exc

    def _failing_since(self, since: float | None) -> tuple[float, float | None]:
        """(when a run of failures began: ``since``, or now for its first; the session timeout
        in seconds once the run has lasted longer than it, else None). The one bound of
        ``_outage`` and ``_refused_too_long``: a shorter run may mend while the member keeps
        its partitions; past it the group has expired the member anyway."""
        now = time.monotonic()
        if since is None:
            return now, None
        session_s = self._group.config.session_timeout_ms / 1000
        return since, (session_s if now - since > session_s else None)


def _server_ms(client: Any) -> int | None:
    """Now, in ms of the Redis server's clock (``TIME``: the one clock every rcoord deadline
    comes from; a replay record's expiry runs on it too), or None if it cannot be read (then
    the plan records 0, ``_planned_ms``)."""
    try:
        return server_ms(client)
    except REDIS_FAILURES:
        return None


def _topic_ms(client: Any, namespace: str, topic: str) -> int | None:
    """Now by the clock of ``topic``'s master (the node of its metadata hash, whose ``TIME``
    stamped the topic's ``created_ms``), which ``_settle_tokens`` compares with it; None if
    that clock cannot be read. A cluster's ``TIME`` went to any node: a master whose clock was
    behind the topic's dated a start chosen just after the topic's creation before it, and
    the unchanged topic was taken for one made again (a false DataLossError); one ahead took
    a topic made again just after the start for the same one (the new topic read from the
    old one's offset, unreported). When the topic's master does not answer (the token read
    that failed may have met the same outage), no other clock dates the start (until
    2026-12-02 any node's did, with both risks): undated, it is chosen again by the next
    generation (``_place``), its records read again rather than skipped or falsely lost."""
    if not hasattr(client, "get_node_from_key"):
        return _server_ms(client)  # (one node: the topic's master)
    try:
        node = client.get_node_from_key(meta_key(namespace, topic))
        secs, micros = client.time(target_nodes=node)
    except REDIS_FAILURES as exc:
        log.info("cannot read the clock of topic %r's master (%s); its start is not dated",
                 topic, exc)
        return None
    return int(secs) * 1000 + int(micros) // 1000


def _planned_ms(client: Any) -> int:
    """A plan's ``Position.planned_ms``: now by the server's clock, or 0 when it cannot be
    read (TIME failed: a cluster's node that answers it down). 0 is as long ago as can be,
    so a restart on that batch with no replay record found takes it as one whose record may
    have expired (``_record_may_have_expired``): it comes again, at least once. It was None,
    which a restart takes for a position checkpointed by an older rcoord, "not expired", and
    the batch's end was committed: what a replay had left unread was skipped for good."""
    now = _server_ms(client)
    return 0 if now is None else now


def _record_may_have_expired(client: Any, start: Position) -> bool:
    """Whether a record of a replay of the batch ending at ``start`` (written after it was
    planned, kept ``REPLAY_TTL_S`` from then) may be gone by now, by the server's clock. A
    position without a planning time (checkpointed by an older rcoord) cannot tell, and is
    taken as before. A server clock that cannot be read now (TIME failed: a cluster's node
    that answers it down) cannot tell either, and may: the batch comes again (at least once),
    as when the record cannot be read. It was taken for "not expired", and the batch's end
    committed, skipping what a partial replay left unread."""
    if start.planned_ms is None:
        return False
    now = _server_ms(client)
    return now is None or now - start.planned_ms >= REPLAY_TTL_S * 1000


def _once(call: Callable[[], T], error_of: Callable[[T], Errors] | None) -> T:
    """A ``Retry`` that makes one attempt: the member's own reads are not retried (a failed
    one is warned about and left to the next plan)."""
    return call()


def _names(tps: set[TP]) -> str:
    return ", ".join(f"{tp.topic}-{tp.partition}" for tp in sorted(tps))


def _with_tokens(offsets: Mapping[TP, int], tokens: Mapping[str, str],
                 member: str) -> dict[TP, OffsetAndMetadata | int]:
    """Offsets to commit, each with metadata naming the create token of its topic (when known)
    and the member whose plan they end."""
    return {tp: _stamped(o, tokens.get(tp.topic), member) for tp, o in offsets.items()}


def _stamped(offset: int, token: str | None, member: str) -> OffsetAndMetadata:
    """``offset`` with the metadata ``_parse_metadata`` reads back."""
    return OffsetAndMetadata(offset, TOKEN_METADATA + (token or "") + MEMBER_METADATA + member)
