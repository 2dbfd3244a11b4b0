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

1. **JoinGroup**, once: a new member names itself with a UUID it sends with every retry of
   its first join (``rcoord.client.join``). Each configured assignor is offered as a protocol,
   with a ``ConsumerProtocolSubscription`` of the topics as its metadata.
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
stops the thread. It stops joining at once: a JoinGroup or SyncGroup parked on the coordinator
is answered by the LeaveGroup, or, for a static member, given up within a second
(``rcoord.flow.abandon_parked_when``; the Java consumer drops its in-flight request too); the
routines' final commits (and the heartbeats meanwhile) are still retried until they have
returned, within ``close()``'s timeout.

Where this differs from kafka-go, on purpose:

* **The heartbeat keeps beating until the routines have returned** when a rebalance starts
  (aiokafka does the same). kafka-go stops it at once, so a slow revocation can expire the member.
  The rebalance timeout still bounds the revocation: a member that has not rejoined by then is
  removed by the coordinator, and the next beat reports it (UNKNOWN_MEMBER_ID: partitions lost).
  A generation can also end on the member's side alone (new partitions, a routine that raised,
  ``resubscribe()``, ``close()``), the coordinator answering NONE; so routines still running a
  rebalance timeout after the end make the member leave (a static member stops beating and its
  session expires), as Kafka's heartbeat thread does once ``max.poll.interval.ms`` passes, and
  their commits are refused (``ConsumerGroup._leave_stuck``). Its helpers are waited for only
  until its session has passed since the last beat answered (a heartbeat stuck in a call would
  hold back the rejoin); then the generation is lost and they are left behind.
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

**The cooperative protocol (KIP-429)**, when every configured assignor supports it (``protocol``):
a generation that ends without losing its partitions is *carried*: the member rejoins reporting
them in its subscription (``owned_partitions``, ``generation_id``) instead of giving them up, and
the next generation says what was ``added`` and ``revoked``; a non-empty ``revoked`` makes the
member rejoin at once so the partitions the assignor withheld reach their new owners. Lost
partitions are still lost. The member reports what its holder *acknowledged* holding
(``Generation.acknowledge``): this group acknowledges each generation at hand-out (the routines of
the previous one have returned); ``Consumer`` passes ``acknowledge="by_caller"`` and acknowledges
once ``poll()`` has applied the difference, which is what lets it keep returning records of kept
partitions during the rebalance. Routines started with ``Generation.start`` stay bound to their
generation (their commits carry its id, which dies with it), so with this class they stop and
restart around a rebalance; the assignment is cooperative, the no-pause path is ``Consumer``.
See docs/architecture.md, "Cooperative rebalancing in the client".

The client depends on a narrow ``Coordinator`` protocol (kafka-go's ``coordinator`` interface),
so tests can replace Redis with a fake whose methods are plain function fields.

This module holds ``ConsumerGroup`` (the lifecycle and the run loop); the rest of the client is
one module per concept:

* ``coordinator``: the ``Coordinator`` protocol, ``RedisCoordinator``, ``client_from_url``.
* ``policy``: ``ERROR_POLICY``, the table of reactions to coordinator errors.
* ``retry``: retrying one call under that policy.
* ``generation``: ``Generation``, ``GenerationContext``, ``EndReason``.
* ``join``: one round, from JoinGroup to a ``Generation``.
* ``heartbeat``: a generation's heartbeat and partition-watcher threads.
* ``errors``: ``CommitFailedError``, ``GroupClosedError``, ``GenerationEndedError``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from types import TracebackType
from typing import Any, Literal, NoReturn, Self, TypeVar

from ..assignors import Assignor, RebalanceProtocol, rebalance_protocol
from ..errors import (
    ConfigError,
    ConnectionLost,
    Errors,
    ParkAbandonedError,
    ProtocolError,
    RcoordError,
    as_missing_permission,
    is_missing_permission,
)
from ..flow import abandon_parked_when
from ..protocol.leave import MemberIdentity
from ..protocol.offsets import TopicPartition
from ..urls import redact_url
from .config import ConsumerGroupConfig
from .coordinator import Coordinator, RedisCoordinator, client_from_url
from .errors import (
    GroupClosedError,
    ReadOnlyReplicaError,
    replica_answer,
    replica_refusal,
    session_bound,
)
from .generation import EndReason, Generation
from .heartbeat import start_helpers
from .join import fenced_reason, join_generation, unsubscribed_error
from .policy import OTHERWISE, Reaction, reaction_for
from .retry import call_with_retries

# client_from_url is re-exported: rcoord.cli and bench/consume.py import it from here.
__all__ = ["ConsumerGroup", "client_from_url"]

log = logging.getLogger("rcoord.client")

T = TypeVar("T")


class ConsumerGroup:
    """A member of a consumer group; ``next()`` hands out its generations.

    ``ConsumerGroup(config)`` does no I/O. ``start()`` (or the first ``next()``, or entering the
    ``with`` block) connects and starts the background thread that joins the group. Pass
    ``coordinator`` to use another ``Coordinator`` than the Redis one (tests do).

    State transitions, as the user sees them::

        created --start()--> joining --(join, sync, fetch)--> generation N handed to next()
           generation N --(heartbeat error | partitions changed | resubscribe() | routine raised
                           | commit fenced)-->
           ended; routines return --> joining (same member id, unless ERROR_POLICY resets it)
        any --close()--> closing: generation ends, routines return, LeaveGroup --> closed
    """

    def __init__(
        self,
        config: ConsumerGroupConfig,
        *,
        coordinator: Coordinator | None = None,
        acknowledge: Literal["on_take", "by_caller"] = "on_take",
    ) -> None:
        if not isinstance(config, ConsumerGroupConfig):
            raise TypeError("config must be a ConsumerGroupConfig")
        if acknowledge not in ("on_take", "by_caller"):
            raise ValueError(f"acknowledge must be 'on_take' or 'by_caller', got {acknowledge!r}")
        config.validate()
        _check_subscribes(config)
        if coordinator is None and config.redis_url is None and config.redis_client is None:
            raise ConfigError("redis_url or redis_client must be set (or pass a coordinator)")
        self._config = config
        self._assignors: list[Assignor] = config.resolved_assignors()
        self._protocol = rebalance_protocol(self._assignors)
        self._acknowledge = acknowledge
        # Cooperative protocol: the partitions kept through the next rejoin, the generation
        # they were acknowledged in, and that generation (marked lost if the rejoin fails).
        self._owned: tuple[TopicPartition, ...] = ()
        self._owned_generation = -1
        self._held: Generation | None = None
        # The last assignment and its generation, kept or not: eager ``sticky`` sends them
        # as user_data (Kafka's StickyAssignor remembers them from onAssignment).
        self._assigned: tuple[TopicPartition, ...] = ()
        self._assigned_generation = -1
        self._coordinator: Coordinator | None = coordinator
        self._owned_client: Any = None
        # Holders of the client made from redis_url (hold_client), and whether its close
        # waits for them.
        self._client_holds = 0
        self._client_close_due = False
        self._cond = threading.Condition()
        self._closing = threading.Event()
        # Set once close() no longer waits for the routines (their generation was collected,
        # the run thread exited, or close()'s timeout passed). Joining and parking stop at
        # _closing; the generation's commits and heartbeats keep retrying until this, so a
        # routine's final commit on close survives a transient ConnectionLost.
        self._finished = threading.Event()
        self._thread: threading.Thread | None = None
        # Held while the coordinator is made and started (taken before _cond, never after).
        self._connecting = threading.Lock()
        # The start a next(timeout) gave up waiting for, still running (``_start_within``).
        self._starting: _Attempt | None = None
        self._slot: Generation | None = None
        self._error: BaseException | None = None
        self._fatal: BaseException | None = None
        # When the coordinator's start began failing, and whether with READONLY (None: it has
        # not failed since it last answered; ``_refused_at_start``).
        self._start_refused: tuple[float, bool] | None = None
        # Failed coordinator starts in a row, and when the next may begin (``_start_within``).
        self._start_failures = 0
        self._next_start_at = 0.0
        # The traceback ``_fatal`` had when the group closed on it (``_raise_fatal``).
        self._fatal_tb: TracebackType | None = None
        self._current: Generation | None = None
        # The newest generation the member joined (offered or not, ended or not): the one its
        # commits go under while no newer one is taken (``newest``).
        self._newest: Generation | None = None
        self._member_id = ""
        # The UUID a new member's join named it with while that join is unanswered (failed):
        # the next join as a new member sends it again (join_generation's new_member_uuid).
        self._member_uuid: str | None = None
        self._in_call = False
        self._left = False
        self._leaves_answered = 0  # LeaveGroups sent and answered (or failed): _parked
        self._exited = threading.Event()
        # Cleared while the member stays out of the group on its holder's request
        # (``leave_until_resumed``); the run loop joins only while it is set.
        self._may_join = threading.Event()
        self._may_join.set()

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
    def protocol(self) -> RebalanceProtocol:
        """EAGER or COOPERATIVE: the strongest protocol every configured assignor supports."""
        return self._protocol

    @property
    def coordinator(self) -> Coordinator:
        """The ``Coordinator`` in use (after ``start()``)."""
        if self._coordinator is None:
            raise RcoordError("the group has not started; call start() or next() first")
        return self._coordinator

    @property
    def redis_client(self) -> Any:
        """The Redis client the group talks through (after ``start()``): the configured one,
        or the one it made from ``redis_url``. For data that belongs beside the group's, such
        as the Spark source's replay records."""
        self.coordinator  # noqa: B018 - raises before start()
        return self._config.redis_client if self._config.redis_client is not None \
            else self._owned_client

    @property
    def closed(self) -> bool:
        return self._closing.is_set()

    @property
    def joining(self) -> bool:
        """Whether the member takes part in the group now: started (``start()``, or the first
        ``next()``) and not closed. Between its generations it is then rejoining (Kafka's
        PREPARING_REBALANCE or COMPLETING_REBALANCE), or holds one not taken yet."""
        with self._cond:
            return self._thread is not None and not self._closing.is_set()

    # -- lifecycle

    def connect(self, timeout: float | None = None) -> ConsumerGroup:
        """Connect without joining: ``coordinator`` is usable, and no member exists yet. For
        reads that need no membership (a consumer's offset queries before its first poll(),
        which in Kafka never join: a member that joined then would hold partitions while the
        application, not polling yet, has no max_poll_interval watching it). Idempotent.

        ``timeout`` bounds the wait for a start already under way on another thread (one a
        ``next(timeout)`` gave up waiting for, ``_start_within``, held in the client's own
        retries while Redis does not answer): ``TimeoutError`` once it passes. Waited for
        without a bound, it made ``Consumer.committed(timeout=0.1)`` after such a poll() last
        as long as that start, seconds. A start this call makes itself is not bounded."""
        if not self._connecting.acquire(timeout=-1 if timeout is None else max(0.0, timeout)):
            raise TimeoutError(
                f"group {self._config.group_id!r}: the coordinator's start (connecting to "
                f"Redis), begun by an earlier call, has not ended within {timeout:g} s")
        try:
            self._connect()
        finally:
            self._connecting.release()
        return self

    def _check_open_locked(self) -> None:
        if self._closing.is_set():
            if self._fatal is not None:
                # The error it closed on, as next() raises it: "is closed" alone left a caller
                # that starts the group again (a Spark query's next plan) without the reason.
                self._raise_fatal(self._fatal)
            raise GroupClosedError(f"group {self._config.group_id!r} is closed")

    def _connect(self) -> None:
        """Make and start the coordinator, once (with ``_connecting`` held). Its start runs
        without ``_cond``: with Redis unreachable, redis-py's own retries on the caller's
        client make it last seconds, and ``close()`` (which takes ``_cond``) waited as long
        for a start that ``next()`` had given up waiting for (``_start_within``)."""
        with self._cond:
            self._check_open_locked()
            if self._coordinator is not None:
                return
        client, made = self._config.redis_client, None
        try:
            if client is None:
                # (connecting is part of the start: a Redis unreachable here is logged and
                # backed off from as one that refuses the start, _refused_at_start)
                client = made = self._owned_client = client_from_url(
                    str(self._config.redis_url))
            coord = RedisCoordinator(
                client, self._config.namespace,
                commit_required_acks=self._config.commit_required_acks,
                commit_ack_timeout_ms=self._config.commit_ack_timeout_ms,
            )
            coord.start()
        except ConnectionLost as exc:
            with self._cond:
                self._start_failures += 1
                self._next_start_at = time.monotonic() + min(
                    self._config.retry_backoff_ms * 2 ** min(self._start_failures - 1, 30),
                    self._config.retry_backoff_max_ms) / 1000
                self._refused_at_start(exc)
            raise
        finally:
            if made is not None and self._closing.is_set():
                # close() came during the start, answered or not: it closed the client as it
                # found it (or none, before it was made), and the start, going on on it,
                # connected it again; nothing else would close it while the group lives.
                with self._cond:
                    self._owned_client = made
                self._close_owned_client()
        with self._cond:
            self._start_refused = None
            self._start_failures = 0
            self._coordinator = coord

    def _refused_at_start(self, exc: ConnectionLost) -> None:
        """A coordinator start failed (with ``_cond`` held): the first failure of a spell is
        logged, and a READONLY that lasts the client's retry bound closes the group with
        ``ReadOnlyReplicaError`` (raised here), as one that lasts a whole join does
        (``_replica_refusal``). ``next()`` starts the coordinator again at every call and
        ``Consumer.poll()`` takes a ``ConnectionLost`` for a failure it retries, so with Redis
        unreachable, or a replica refusing the start (it stores the namespace's settings where
        no coordinator has yet), a consumer returned no records for ever, with not one line
        logged, and on a replica never stopped."""
        now = time.monotonic()
        read_only = replica_answer(exc) is not None
        if self._start_refused is None or self._start_refused[1] != read_only:
            self._start_refused = (now, read_only)
            # (the error boundary's text begins with the name of the call it wrapped, a private
            # one such as "_connect"; the user is told which server, and redis-py's words)
            cause = exc.__cause__ or exc
            url = self._config.redis_url
            log.warning("consumer group %r: %s: %s; starting again at the next call",
                        self._config.group_id,
                        "Redis" if url is None else f"Redis at {redact_url(url)}",
                        str(cause) or type(cause).__name__)
            return
        if not read_only or (now - self._start_refused[0]) * 1000 < self._config.session_timeout_ms:
            return
        refused = _replica_refusal(exc, self._config, "the coordinator's start")
        assert refused is not None
        log.error("consumer group %r: fatal error, closing: %s", self._config.group_id, refused)
        self._fatal, self._fatal_tb = refused, None
        self._closing.set()
        self._cond.notify_all()
        raise refused

    def _raise_fatal(self, fatal: BaseException) -> NoReturn:
        """Raise ``fatal``, the error the group closed on, with the traceback it had then.
        Every later call raises this one object, and Python adds the raising frames to its
        traceback each time: raised as it was, a loop that logs the error and calls again (a
        poll() loop) grew it with every call, in memory and in each logged traceback."""
        raise fatal.with_traceback(self._fatal_tb)

    def start(self) -> ConsumerGroup:
        """Connect and start joining the group in the background. Idempotent. On a closed
        group it raises what ``next()`` raises: the fatal error the group closed on, or
        ``GroupClosedError``."""
        with self._connecting:
            self._connect()
            with self._cond:
                self._check_open_locked()
                if self._thread is not None:
                    return self
                self._thread = threading.Thread(
                    target=self._run, name=f"rcoord-{self._config.group_id}-run", daemon=True
                )
                self._thread.start()
        return self

    def _start_within(self, deadline: float) -> None:
        """``start()`` for ``next(timeout)``: made on a thread of its own, waited for until
        ``deadline`` (then ``TimeoutError``; the next call waits for the same start), its error
        raised. The coordinator's start is a call on the caller's Redis client, whose own
        retries (redis-py's default: three, backing off up to seconds) made a
        ``Consumer.poll(timeout=0.2)`` with Redis unreachable take about 4 s, every call; Kafka's
        poll() returns within its timeout.

        A start that failed is made again no sooner than ``retry_backoff_ms`` later (doubling
        up to ``retry_backoff_max_ms`` while it fails), as Kafka's consumer waits
        ``retry.backoff.ms`` between coordinator lookups: a start refused at once (READONLY on
        a replica of a namespace without settings, a client that does not retry a refused
        connection) was made again at once, and ``Consumer.poll(timeout)``, which calls again
        until its timeout, sent hundreds a second, each on a new thread."""
        with self._cond:
            if self._thread is not None and self._coordinator is not None:
                return
            attempt = self._starting
            if attempt is None:
                while not self._closing.is_set():
                    now = time.monotonic()
                    if now >= self._next_start_at:
                        break
                    if now >= deadline:
                        raise TimeoutError(
                            f"group {self._config.group_id!r}: the coordinator's start failed "
                            f"and is made again after retry_backoff_ms")
                    self._cond.wait(min(self._next_start_at, deadline) - now)
                attempt = self._starting = _Attempt(
                    self.start, f"rcoord-{self._config.group_id}-start")
        if not attempt.done.wait(max(0.0, deadline - time.monotonic())):
            raise TimeoutError(f"group {self._config.group_id!r}: the coordinator's start "
                               f"(connecting to Redis) has not ended yet")
        with self._cond:
            if self._starting is attempt:
                self._starting = None
        if attempt.error is not None:
            raise attempt.error

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
        (FENCED_INSTANCE_ID, a JoinGroup refusal no retry can mend, ``JoinRefusedError``, a
        permission the Redis user lacks, ``MissingPermissionError``, or a login Redis refuses,
        ``AuthenticationFailedError``: the ``fatal`` rows of ``ERROR_POLICY``) closes the group
        and is raised by every later call.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        if not self._closing.is_set():
            if deadline is None:
                self.start()
            else:
                self._start_within(deadline)
        with self._cond:
            while True:
                if self._error is not None:
                    error, self._error = self._error, None
                    raise error
                if self._closing.is_set() or self._exited.is_set():
                    if self._fatal is not None:
                        self._raise_fatal(self._fatal)
                    raise GroupClosedError(f"group {self._config.group_id!r} is closed")
                if self._slot is not None:
                    gen, self._slot = self._slot, None
                    self._cond.notify_all()
                    if not gen.done.is_set():  # one that ended meanwhile is withdrawn
                        return gen
                    continue
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise TimeoutError(
                        f"no generation of group {self._config.group_id!r} within {timeout} s"
                    )
                self._cond.wait(remaining)

    def resubscribe(
        self, topics: Sequence[str] = (), topic_pattern: re.Pattern[str] | None = None
    ) -> None:
        """Subscribe to other topics (or another pattern) without leaving the group, as Kafka's
        ``subscribe()`` on a subscribed consumer does: the member keeps its id and rejoins with
        the new subscription, so the group rebalances once. The generation in hand ends
        (``EndReason.SUBSCRIPTION_CHANGED``); under the cooperative protocol its partitions of
        topics still subscribed are carried through the rejoin, and the rejoin no longer
        reports the others as owned, so their holder must have stopped consuming them first
        (``Consumer.subscribe`` revokes them). A join under way with the old subscription is
        joined again at once. Raises ``ConfigError`` for an empty subscription and
        ``GroupClosedError`` once the group is closed."""
        config = dataclasses.replace(self._config, topics=list(topics),
                                     topic_pattern=topic_pattern)
        _check_subscribes(config)
        with self._cond:
            if self._closing.is_set():
                raise GroupClosedError(f"group {self._config.group_id!r} is closed")
            if (set(config.topics), config.topic_pattern) == (set(self._config.topics),
                                                               self._config.topic_pattern):
                return
            log.info("group %r: subscription changed to %s; rejoining", config.group_id,
                     topic_pattern.pattern if topic_pattern is not None else list(topics))
            self._config = config
            gen = self._current
        if gen is not None:
            gen._end(EndReason.SUBSCRIPTION_CHANGED)

    def peek(self) -> Generation | None:
        """The generation ``next()`` would return now, without taking it (None if there is
        none, or it ended before anyone took it). A cooperative consumer commits under it
        before it has applied it: the member is already in it, and the one it holds ended."""
        with self._cond:
            gen = self._slot
        return gen if gen is not None and not gen.done.is_set() else None

    def newest(self) -> Generation | None:
        """The newest generation the member joined, whether ``next()`` gave it out or not, and
        whether it ended or not. A cooperative consumer that holds an older one commits under
        it: the group's generation is that one (or a newer one the member is not in yet, which
        refuses either), and it is still in the group. ``peek`` has none once an untaken
        generation ends: a rebalance that began before ``poll()`` took the generation (another
        member joined) left such a consumer's commits, a ``close()``'s final one included,
        under the generation before, refused as ILLEGAL_GENERATION, and their records read
        again by the next owner, where Kafka's consumer commits under the newest generation it
        joined."""
        with self._cond:
            return self._newest

    def newest_after(self, generation: Generation, timeout: float = 0.0) -> Generation | None:
        """The newest generation the same member has joined since ``generation`` (``newest``),
        waiting up to ``timeout`` for a join under way to complete; None if none did, or the
        member lost its id, the group closed or its holder's ``close()`` gave up waiting
        (``stop_retrying``) meanwhile. A commit under a generation carried
        through the rejoin, refused because that join's JoinGroup completed first, has no
        generation to go under until its SyncGroup has returned (``Consumer._commit_carried``)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                ahead = self._newest
                if (ahead is not None and ahead.member_id == generation.member_id
                        and ahead.generation_id > generation.generation_id):
                    return ahead
                remaining = deadline - time.monotonic()
                if (remaining <= 0 or self._closing.is_set() or self._exited.is_set()
                        or self._finished.is_set() or self._member_id != generation.member_id):
                    return None
                self._cond.wait(remaining)

    def close(self, timeout: float | None = None) -> None:
        """End the generation, wait for its routines, leave the group (unless static), stop.

        ``timeout`` bounds the wait for the background thread, and for a coordinator start
        that a ``next(timeout)`` gave up waiting for (None: wait for them).
        Idempotent; ``next()`` raises ``GroupClosedError`` afterwards.

        A routine that ignores ``ctx.done`` holds back the background thread (and a
        ``close()`` without a timeout) until it returns, but not the group: a rebalance
        timeout after the close began, the member leaves (a static one stops beating, so its
        session expires) and the routine's commits are refused (``_leave_stuck``).
        """
        deadline = None if timeout is None else time.monotonic() + timeout

        def left() -> float | None:
            return None if deadline is None else max(0.0, deadline - time.monotonic())

        with self._cond:
            first = not self._closing.is_set()
            self._closing.set()
            gen = self._current
            parked_id = self._member_id if self._in_call else ""
            starting = self._starting
            self._cond.notify_all()
        if gen is not None:
            gen._end(EndReason.CLOSED)
        if starting is not None:
            # A start a next(timeout) gave up waiting for (``_start_within``), still on the
            # client (held in its own retries while Redis does not answer): waited for within
            # ``timeout``, as the run thread is. Not waited for, it went on after close()
            # returned, on the caller's redis_client too, which the caller may have closed:
            # redis-py connects a closed client again, so that connection stayed open.
            starting.done.wait(left())
        thread = self._thread
        me = threading.current_thread()
        # From a routine of the generation, waiting would deadlock: the run thread waits for it.
        inside = thread is me or (gen is not None and gen.is_routine_thread(me))
        if first and parked_id:
            # The run thread may be parked in JoinGroup or SyncGroup for up to the rebalance
            # timeout; leaving now removes the member, which answers the parked call at once.
            # A static member does not leave: its run thread gives the call up instead, within
            # one 1 s wait, having seen _closing (_parked). The LeaveGroup runs on a thread of
            # its own, waited for within ``timeout``: against a Redis that black-holes it, it
            # waits for the socket timeout (and behind the parked call), which overran a
            # close(timeout=2) to 10 s.
            leaver = threading.Thread(
                target=self._leave, args=(parked_id, "the consumer is closing"),
                name=f"rcoord-{self._config.group_id}-leave", daemon=True)
            leaver.start()
            if not inside:
                leaver.join(left())
        if thread is not None and not inside:
            if gen is not None and gen.wait_routines(left()):
                # The routines returned: stop the heartbeat's retries (if Redis is down, it
                # would otherwise hold the run thread's collect for up to a session timeout).
                self._finished.set()
            thread.join(left())
            if thread.is_alive():
                self._finished.set()  # close()'s timeout bounds the final commits' retries
        if thread is None or not thread.is_alive():
            self._close_owned_client()
        # Else the run thread closes it when it exits (_shutdown): close() did not wait for it
        # (called from a routine, or its timeout passed).

    def hold_client(self) -> Callable[[], None]:
        """Keep the client made from ``redis_url`` open until the returned call (idempotent)
        is made, whenever the group closes: for a call of the holder's still running on it
        (the consumer's fetch at close(), which close()'s timeout did not wait for)."""
        with self._cond:
            self._client_holds += 1
        released = threading.Event()

        def release() -> None:
            with self._cond:
                if released.is_set():
                    return
                released.set()
                self._client_holds -= 1
                due = self._client_close_due and not self._client_holds
            if due:
                self._close_owned_client()

        return release

    def _close_owned_client(self) -> None:
        """Closes the client made from ``redis_url``, once, when nothing will use it again
        (once every ``hold_client()`` is released)."""
        with self._cond:
            if self._client_holds:
                self._client_close_due = True
                return
            client, self._owned_client = self._owned_client, None
        if client is not None:
            try:
                client.close()
            except Exception:  # closing a broken client must not hide the close itself
                log.debug("closing the Redis client failed", exc_info=True)

    def stop_retrying(self) -> None:
        """Make the generation's commits and heartbeats stop retrying: each call from now on
        makes one attempt, and a retry under way ends at its next pause.

        For a holder whose ``close()`` timeout has passed before it closed this group
        (``Consumer.close``, which revokes first): against an unreachable coordinator those
        retries would otherwise go on for a session timeout each. ``close(timeout)`` does the
        same once its own timeout passed. Meant for closing only: it is never undone. A commit
        waiting for a join to complete (``newest_after``) stops waiting too.
        """
        with self._cond:
            self._finished.set()
            self._cond.notify_all()

    def leave_until_resumed(self, reason: str) -> None:
        """Leave the group now and stay out until ``resume()``: Kafka's reaction to an
        application that stopped polling for ``max.poll.interval.ms``. The current generation
        ends with its partitions lost (others may own them as soon as the group rebalances).
        A dynamic member sends LeaveGroup carrying ``reason`` and joins again as a new member
        (a new member id). A static member (``group_instance_id``) sends no LeaveGroup, as in
        Kafka (KIP-345): ``reason`` is only logged, its heartbeat stops, so its partitions move
        to the others when its session times out. It forgets its member id too, as Kafka's
        member resets its generation on leaving: ``resume()`` joins with its instance id alone,
        which the coordinator takes as the static member coming back (it replaces the old id),
        so a return within the session rebalances nothing, the leader's neither; joining again
        under the old id would make a returning leader rebalance the whole group."""
        with self._cond:
            self._may_join.clear()
            gen = self._current if self._current is not None else self._slot
            # Cooperative: the partitions carried through a rejoin under way are still read.
            held = self._held
            member_id = self._member_id
            self._cond.notify_all()
        for ending in (gen, held):
            if ending is not None and (ending is gen or ending.carried):
                ending._mark_lost(left=True)
        if member_id:
            if self._config.group_instance_id is None:
                self._leave(member_id, reason)
            else:
                log.warning(
                    "group %r: %s; a static member does not send LeaveGroup, its partitions "
                    "move when its session times out",
                    self._config.group_id,
                    reason,
                )
            self._forget_member_id()
            # The UUID of a new member's join under way is forgotten too: kept (the run thread
            # keeps it while it sees no member id, as for a join never answered), the next
            # join named the member that just left again.
            self._member_uuid = None

    def _forget_member_id(self) -> None:
        """The member has no id any more: a commit waiting for its join (``newest_after``)
        has no generation to come and must be woken, or it waited for the rebalance timeout
        (the poll timer's leave forgot the id unnotified: tests/test_review71_consumer.py)."""
        with self._cond:
            self._member_id = ""
            self._cond.notify_all()

    def resume(self) -> None:
        """Let the member join again after ``leave_until_resumed`` (idempotent)."""
        self._may_join.set()

    # -- the run loop

    def _run(self) -> None:
        reason = "joining"
        failures = 0
        try:
            while not self._closing.is_set():
                if not self._may_join.is_set():
                    while not self._may_join.wait(0.05) and not self._closing.is_set():
                        pass
                    if self._closing.is_set():
                        break
                    reason = "rejoining: the consumer polls again"
                if self._held is not None and self._held.lost:
                    # The carried partitions were lost since they were recorded as owned (the
                    # member left the group while a routine of their generation still ran:
                    # ``leave_until_resumed``): it owns nothing now, as Kafka's member whose
                    # generation was reset. Claimed, a new member would take them back.
                    self._drop_owned(None)
                joined = self._config  # resubscribe() may replace it during the join
                try:
                    gen = self._join_generation(reason, joined)
                except Exception as exc:  # noqa: BLE001 - every failure has a row in ERROR_POLICY
                    if self._closing.is_set():
                        break
                    failures += 1
                    if reaction_for(exc).lost:
                        self._drop_owned(None)  # the carried partitions are lost too
                    exc = _replica_refusal(exc, joined) or exc  # (fatal: ReadOnlyReplicaError)
                    if not self._react(exc, failures):
                        break
                    reason = f"rejoining after {type(exc).__name__}: {exc}"[:255]
                    continue
                if gen is None:
                    break
                failures = 0
                self._assigned = tuple(gen.partitions)
                self._assigned_generation = gen.generation_id
                refused = unsubscribed_error(gen) if self._acknowledge == "on_take" else None
                if refused is not None:
                    gen._end(EndReason.ERROR, refused)  # withdrawn: none of it is handed out
                elif self._acknowledge == "on_take":
                    # Every routine of the previous generation has returned: the member holds
                    # exactly what this generation gives it.
                    gen.acknowledge()
                    if gen.revoked and self.protocol is RebalanceProtocol.COOPERATIVE:
                        # Nothing consumes the revoked partitions any more: rejoin at once so
                        # their new owners get them (the generation is withdrawn, see _deliver).
                        gen.request_rejoin()
                with self._cond:
                    if self._closing.is_set():
                        gen._end(EndReason.CLOSED)
                    elif self._config is not joined:  # joined with the old subscription
                        gen._end(EndReason.SUBSCRIPTION_CHANGED)
                    left_meanwhile = not self._may_join.is_set()
                    if left_meanwhile:
                        # leave_until_resumed came during this join, with no generation in
                        # hand to end: this one is lost as that one would have been. A static
                        # member sent no LeaveGroup, so the join completed, and it went on
                        # heartbeating partitions its stuck application never read.
                        gen._mark_lost(left=True)
                    self._current = self._newest = gen
                if left_meanwhile:
                    # The join's answer set the id leave_until_resumed forgot again. A dynamic
                    # member's LeaveGroup may have gone before this join added it (or with no
                    # member id yet, so none went): leave once more, and rejoin as a new
                    # member. A static member rejoins with its instance id alone, as after
                    # leave_until_resumed (Kafka's member drops a join answered after it left,
                    # UnjoinedGroupException): kept, that id made a returning leader's join
                    # rebalance the whole group.
                    if self._config.group_instance_id is None:
                        self._leave(gen.member_id, "the consumer left the group: poll timeout")
                    self._forget_member_id()
                self._start_threads(gen)
                self._deliver(gen)
                gen.done.wait()
                carried = gen._decide(
                    self.protocol is RebalanceProtocol.COOPERATIVE and not self._closing.is_set()
                )
                self._collect(gen)
                if carried and not gen.lost:
                    if gen.acknowledged:
                        self._owned = tuple(gen.partitions)
                        self._owned_generation = gen.generation_id
                        self._held = gen
                else:
                    self._drop_owned(gen)
                with self._cond:
                    self._current = None
                reason = (gen.end_reason or EndReason.ERROR).value
                pending = gen.pending_reaction
                if pending is not None and not self._react(pending[1], 1, pending[0], gen):
                    break
        except BaseException as exc:  # the thread's root: never die silently
            log.exception("consumer group %r stopped on an unexpected error", self._config.group_id)
            # next() says why (it said only "closed"), and the generation in hand is lost: its
            # heartbeat, which beats until the routines are collected (they never will be now),
            # stops at once, so its session ends and its partitions move to other members.
            # close() no longer waits for those routines either (without a timeout, it waited
            # for ever).
            stopped = GroupClosedError(
                f"group {self._config.group_id!r} stopped on an unexpected error: {exc!r}")
            stopped.__cause__ = exc
            with self._cond:
                if self._fatal is None:
                    self._fatal, self._fatal_tb = stopped, None
                gen, self._current = self._current, None
            if gen is not None:
                gen._mark_lost()
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
            self._forget_member_id()
        if reaction.fatal:
            log.error("consumer group %r: fatal error, closing: %s", self._config.group_id, exc)
            with self._cond:
                self._fatal, self._fatal_tb = exc, exc.__traceback__
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
        self._finished.set()  # every routine has returned: nothing is left to retry for
        member_id = self._member_id
        if member_id and not self._left and self._config.group_instance_id is None:
            self._leave(member_id, "the consumer is closing")
        closed = self._closing.is_set()  # close() was called, not a fatal error
        with self._cond:
            self._closing.set()
            self._slot = None
            self._cond.notify_all()
        if closed:
            # close() may not have waited for this thread (below its timeout, or called from a
            # routine): the client is closed here. After a fatal error the holder may still
            # commit through it; its close() closes it.
            self._close_owned_client()
        with self._cond:
            self._exited.set()
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
        finally:
            with self._cond:
                self._leaves_answered += 1

    # -- one round

    def _join_generation(self, reason: str, config: ConsumerGroupConfig) -> Generation | None:
        self._left = False
        if not self._member_id and self._member_uuid is None:
            self._member_uuid = str(uuid.uuid4())
        try:
            return self._join_round(reason, config)
        finally:
            if self._member_id:  # the coordinator answered with the member's id
                self._member_uuid = None

    def _join_round(self, reason: str, config: ConsumerGroupConfig) -> Generation | None:
        return join_generation(
            reason,
            self._member_id,
            config=config,
            assignors=self._assignors,
            coordinator=self.coordinator,
            retry=self._retry,
            generation_retry=self._retry_until_finished,
            closing=self._closing,
            parked=self._parked,
            on_member_id=self._set_member_id,
            on_end=self._notify,
            protocol=self.protocol,
            owned=self._owned,
            owned_generation=self._owned_generation,
            assigned=self._assigned,
            assigned_generation=self._assigned_generation,
            new_member_uuid=self._member_uuid,
        )

    def _drop_owned(self, ended: Generation | None) -> None:
        """The member holds nothing any more; a carried generation still held is lost."""
        held, self._held = self._held, None
        self._owned, self._owned_generation = (), -1
        if held is not None and held is not ended and held.carried:
            held._mark_lost()

    def _set_member_id(self, member_id: str) -> None:
        self._member_id = member_id
        if self._closing.is_set():
            # A JoinGroup answered as close() began may have been taken after close()'s
            # LeaveGroup, adding the member again: _shutdown leaves once more (an extra
            # LeaveGroup for a member already gone is answered UNKNOWN_MEMBER_ID, harmless).
            self._left = False

    @contextlib.contextmanager
    def _parked(self) -> Iterator[None]:
        """Around JoinGroup and SyncGroup, which the coordinator may park for up to the
        rebalance timeout: ``close()`` sends LeaveGroup meanwhile, which answers them at once.
        A static member sends none (KIP-345), so the call is also given up once the group
        closes (``abandon_parked_when``: within one 1 s wait, raising ``ParkAbandonedError``,
        which the run loop takes as the end, like any error after close). A coordinator that
        does not run ``rcoord.flow`` flows (a test's fake) is unaffected."""
        with self._cond:
            self._in_call = True
            answered = self._leaves_answered
        try:
            with abandon_parked_when(self._closing):
                yield
        except ParkAbandonedError:
            with self._cond:
                if self._leaves_answered > answered:
                    # close()'s LeaveGroup was answered and the call still waited: the
                    # coordinator took it after the leave (sent as close() began), so the
                    # member is in the group again. _shutdown leaves once more.
                    self._left = False
            raise
        finally:
            with self._cond:
                self._in_call = False

    # -- a generation's threads

    def _start_threads(self, gen: Generation) -> None:
        start_helpers(gen, self.coordinator, self._config, self._retry_until_finished)

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
        gen.collect(warn_after=self._config.rebalance_timeout_ms / 1000,
                    on_stuck=lambda routines: self._leave_stuck(gen, routines),
                    helper_wait_s=self._config.heartbeat_interval_ms / 1000)

    def _leave_stuck(self, gen: Generation, routines: list[str]) -> None:
        """``routines`` of ``gen`` still run a rebalance timeout after it ended: the member
        leaves the group, as Kafka's heartbeat thread sends LeaveGroup once
        ``max.poll.interval.ms`` passes without the application coming back. Its heartbeat,
        which beat until the routines returned, kept it (and its partitions) in the group for
        ever when the generation had ended on the member's side alone (the coordinator, not
        rebalancing, answered NONE). A static member sends no LeaveGroup (KIP-345): its
        heartbeat stops, so its session expires. The generation is lost, so the routines'
        commits are refused (``CommitFailedError``); the member rejoins, under a new member id
        (or its instance id alone), once they have returned."""
        cfg = self._config
        if gen.lost:  # out of the group already: the heartbeat has stopped
            log.warning("group %r: routines of generation %d ignore ctx.done and still run "
                        "%d ms after it ended: %s", cfg.group_id, gen.generation_id,
                        cfg.rebalance_timeout_ms, ", ".join(routines))
            return
        log.warning("group %r: routines of generation %d ignore ctx.done and still run %d ms "
                    "(rebalance_timeout_ms) after it ended: %s; the member %s, its partitions "
                    "are lost, and it rejoins once they return", cfg.group_id,
                    gen.generation_id, cfg.rebalance_timeout_ms, ", ".join(routines),
                    "leaves the group" if cfg.group_instance_id is None
                    else "stops heartbeating (static: its session expires)")
        gen._mark_lost(left=True)
        if cfg.group_instance_id is None:
            self._leave(gen.member_id, "routines did not return within rebalance_timeout_ms "
                        "after the generation ended")
        with self._cond:
            forget = self._member_id == gen.member_id
        if forget:
            self._forget_member_id()

    def _notify(self) -> None:
        with self._cond:
            self._cond.notify_all()

    # -- retries

    def _retry(self, call: Callable[[], T], error_of: Callable[[T], Errors] | None) -> T:
        """``call_with_retries`` with this group's settings; retries stop when it closes
        (joining: a closing member has nothing to join for)."""
        return call_with_retries(call, error_of, config=self._config, closing=self._closing)

    def _retry_until_finished(
        self, call: Callable[[], T], error_of: Callable[[T], Errors] | None
    ) -> T:
        """The same for a generation's commits and heartbeats: these go on retrying after
        ``close()`` until its routines have returned (``_finished``), since a routine's last
        act is usually its final commit, which must not lose to one lost connection."""
        return call_with_retries(call, error_of, config=self._config, closing=self._finished)


class _Attempt:
    """``call`` made once on a daemon thread of its own: ``done`` is set when it has returned,
    ``error`` is what it raised (None if nothing)."""

    def __init__(self, call: Callable[[], object], name: str) -> None:
        self.done = threading.Event()
        self.error: BaseException | None = None
        self._call = call
        threading.Thread(target=self._run, name=name, daemon=True).start()

    def _run(self) -> None:
        try:
            self._call()
        except BaseException as exc:  # noqa: BLE001 - handed to the thread waiting for it
            self.error = exc
        finally:
            self.done.set()


def _check_subscribes(config: ConsumerGroupConfig) -> None:
    if not config.topics and config.topic_pattern is None:
        raise ConfigError(
            "topics must name at least one topic (or topic_pattern be set) to join a group"
        )


def _replica_refusal(exc: BaseException, config: ConsumerGroupConfig,
                     call: str = "JoinGroup") -> ReadOnlyReplicaError | None:
    """``ReadOnlyReplicaError`` if a join failed on a replica's answer (READONLY or
    MASTERDOWN, ``replica_answer``), else None.

    Every call of a join is retried for one session timeout (``call_with_retries``), and the
    join raises only when they are over (or the group closes, which ends the loop before
    this): a READONLY that comes out of it has lasted the client's whole retry bound. A
    failover in progress is over by then (the demoted master's clients are sent to the new
    one, or the node is promoted); a URL that names a replica never is, and the member joined
    again every ``join_backoff_ms`` for ever, reading nothing."""
    return replica_refusal(exc, config.group_id, call, session_bound(config.session_timeout_ms))


def _as_exception(error: BaseException | Errors | None, gen: Generation | None) -> BaseException:
    if isinstance(error, BaseException):
        # A refused permission comes as redis-py's NoPermissionError or, met inside a function,
        # as a plain ResponseError: one exception, with the server's words, for the application.
        return as_missing_permission(error) if is_missing_permission(error) else error
    if isinstance(error, Errors):
        where = f" (generation {gen.generation_id})" if gen is not None else ""
        if error is Errors.FENCED_INSTANCE_ID and gen is not None:
            where += f": {fenced_reason(gen._instance_id)}"
        return ProtocolError.of(error, f"the coordinator answered {error.name}{where}")
    return RcoordError("unknown error")
