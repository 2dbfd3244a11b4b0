"""The timer work of the partitions a coordinator leases.

For each leased partition it knows the earliest deadline (the partition's due index, kept current
by shard-channel messages and re-read on any doubt), sleeps until the earliest one of all, and
then applies every passed deadline of every due group with ``expire_deadlines``. No polling
interval decides precision: the wait ends exactly at the next deadline or at a message that
brings one earlier.

Failures are of two kinds. Redis that cannot run anything now (out of memory, READONLY after a
demotion, BUSY, a lost connection: ``ServerUnavailable`` / ``ConnectionLost``) is raised to the
timer loop, which waits before the next turn; sweeping again at once would only repeat the
refusal (thousands of calls a second). A call that fails for one group only (a script error) is
retried for that group after a bounded exponential backoff, and the group is left out of the
earliest deadline meanwhile, so it neither stops the others nor makes the loop spin.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from typing import Any

import redis

from ..errors import (
    ConnectionLost,
    RcoordError,
    ServerUnavailable,
    is_missing_function,
    reraise_as_rcoord,
)
from ..keys import PartitionKeys
from ..scripts import Scripts
from .metrics import Metrics
from .nodes import MOVED, each_node, node_client, node_scripts, on_any_node

__all__ = ["Sweeper"]

DUE_BATCH = 500
MAX_PASSES = 20
"""Batches ``sweep_partition`` runs in one call; what is left stays due for the next turn, so
one call never runs unbounded (and the stop event is checked between batches)."""
TURN_BUDGET_MS = 250
"""How long one ``sweep_due`` works before it leaves the rest due for the next turn (the
service makes it at most a quarter of the lease TTL): a backlog (a takeover after an outage,
40,000 due groups) is applied in turns that each end soon, so the timer loop keeps reading its
events and reports progress, instead of one turn of seconds that looked like a stuck loop and
gave every lease up."""
NODE_RETRY_FIRST_MS = 200
NODE_RETRY_MAX_MS = 1000
"""A failed node's partitions are tried again after 200 ms, doubling up to 1 s (the timer
loop's own retry wait after a failed turn)."""
BACKOFF_FIRST_MS = 100
BACKOFF_MAX_MS = 30_000
"""A group whose call failed is retried after 100 ms, doubling up to 30 s."""
log = logging.getLogger("rcoord.service")
_UNREAD = object()
"""A group's incarnation that could not be read (``Sweeper._incarnation``)."""


class Sweeper:
    def __init__(self, client: Any, scripts: Scripts, namespace: str, num_partitions: int,
                 metrics: Metrics, stop: threading.Event | None = None,
                 left: threading.Event | None = None) -> None:
        self._client = client
        self._stop = stop if stop is not None else threading.Event()
        self._left = left if left is not None else threading.Event()
        """Set once the service's ``run()`` returned without the timer loop: no group is
        expired any more (the stop releases the leases to other processes)."""
        self.backoff_first_ms = BACKOFF_FIRST_MS
        self.backoff_max_ms = BACKOFF_MAX_MS
        self.backed_off: dict[tuple[int, str], tuple[float, int, float | None, str | None]] = {}
        """(partition, group) -> (its retry time, server ms; failures so far; when this process
        holds it back until then, the server ms its failed call was sent at, else None; the
        incarnation of the group that failed, ``_incarnation``). It is
        held back only when its index entry could not be moved to the retry time
        (``_failed``): else the index says when it is due. Even then, an index entry later than
        the failed call is a deadline a step published since (``_held``), acted on when it
        falls due. The failures are counted for one incarnation: a group made again under the
        name (after DeleteGroups or the offsets retention) starts from none."""
        self._scripts = scripts
        self._pk = [PartitionKeys(namespace, p, num_partitions) for p in range(num_partitions)]
        self._metrics = metrics
        self.earliest: dict[int, float] = {}
        self._offset_ms = 0.0  # server clock minus local wall clock
        self.turn_budget_ms = TURN_BUDGET_MS
        self._rotation = 0
        self._node_failures: dict[int, int] = {}
        """partition -> consecutive failures of its node (``_retry_later``)."""
        self.last_progress = time.monotonic()
        """When a batch of calls last came back (monotonic): a long turn is not a stuck one."""
        self._lock = threading.Lock()
        """Guards ``backed_off``: the nodes' pieces of a round run on threads of their own
        (``nodes.each_node``); each changes ``earliest`` for its own partitions only."""

    # -- server time -----------------------------------------------------------------------------

    def sync_clock(self) -> None:
        """Server time = monotonic time + offset, so a step of the local wall clock (NTP) can
        neither make the loop spin nor sleep past a deadline."""
        def read(node: Any) -> tuple[float, Any, float]:
            return time.monotonic() * 1000, node.time(), time.monotonic() * 1000

        # Any master's: every node keeps the one clock, and a hung one must not stall the loop.
        before, (sec, usec), after = on_any_node(self._client, read)
        self._offset_ms = int(sec) * 1000 + int(usec) / 1000 - (before + after) / 2

    def server_now(self) -> float:
        return time.monotonic() * 1000 + self._offset_ms

    # -- the deadline index ----------------------------------------------------------------------

    def resync(self, owned: set[int]) -> None:
        """Re-read the earliest deadline of every leased partition (the authority)."""
        now = self.server_now()
        # Forget backoffs long past (a group deleted meanwhile is never retried to clear it).
        self.backed_off = {k: v for k, v in self.backed_off.items()
                           if v[0] > now - self.backoff_max_ms and k[0] in owned}
        # Due now until read: a partition whose read fails is tried again (and so its deadlines
        # are applied soon after its node answers), not forgotten until the next resync.
        self.earliest = {p: now for p in owned}
        self._node_failures = {p: n for p, n in self._node_failures.items() if p in owned}
        self._refresh(sorted(owned))

    def note_deadline(self, p: int, at: float) -> None:
        if p in self.earliest and at < self.earliest[p]:
            self.earliest[p] = at

    def next_due(self) -> float:
        """The earliest deadline to act on; a backed-off group counts from its retry time."""
        return min(self.earliest.values(), default=float("inf"))

    def _held(self, p: int, group_id: str, score: float | None) -> float:
        """Until when this process holds the group back (-inf: it does not) given its index
        entry's ``score``: only the entry the failed call found passed is held, not one a step
        of the group published after it (that step applied the passed deadlines; a group made
        again under the name publishes too). Holding that one slept past it, up to
        ``backoff_max_ms``."""
        entry = self.backed_off.get((p, group_id))
        if entry is None or entry[2] is None or (score is not None and score > entry[2]):
            return float("-inf")
        return entry[0]

    def _backed_off_in(self, p: int) -> int:
        with self._lock:
            return sum(1 for (q, _), entry in self.backed_off.items()
                       if q == p and entry[2] is not None)

    def _succeeded(self, p: int, group_id: str) -> None:
        with self._lock:
            self.backed_off.pop((p, group_id), None)

    def sweep_due(self, source: str) -> int:
        """Apply the passed deadlines of every leased partition whose earliest one has passed.

        Three pipelined round trips per node however many partitions are due: the due groups
        of each, then every group's ``expire_deadlines``, then each partition's new earliest
        deadline. A burst of expiries spread over many partitions (a rack going down) must not
        cost a round trip per partition or per group. A node that fails its piece leaves its
        partitions for a later turn (``_retry_later``); the other nodes' are applied now.
        """
        now = self.server_now()
        due = [p for p, at in self.earliest.items() if at <= now]
        if not due:
            return 0
        until = time.monotonic() + self.turn_budget_ms / 1000
        # Each turn starts at another partition: a turn that ends on its budget must not hand
        # the first due partitions every turn while the later ones wait for them to drain.
        shift = self._rotation % len(due)
        due = due[shift:] + due[:shift]
        self._rotation += 1
        applied: list[int] = []

        def sweep(node: Any, partitions: list[int]) -> None:
            applied.append(self._sweep_node(node, partitions, now, until, source))

        self._retry_later(each_node(self._client, due, self._due_key, sweep))
        return sum(applied)

    def _sweep_node(self, node: Any, due: list[int], now: float, until: float, source: str) -> int:
        """``sweep_due``'s work for the due partitions of one node, through ``node``."""
        pipe = node.pipeline(transaction=False)
        for p in due:
            # Backed-off groups come first among the due ones often: ask for as many more.
            limit = DUE_BATCH + self._backed_off_in(p)
            pipe.execute_command(*self._scripts.command("due_groups", [self._pk[p].due],
                                                        ["", limit]))
        work: list[tuple[int, str]] = []
        full: list[int] = []
        for p, reply in zip(due, pipe.execute(raise_on_error=False), strict=True):
            _raise_if_node_failed(reply)  # each_node leaves its partitions for later
            if isinstance(reply, Exception):
                # The library missing (or a failure of this call alone): the partition's own
                # path, through the library call, loads it or reports the failure.
                full.append(p)
                continue
            ready = [g for g, score in self._with_held_scores(node, p, reply[1:])
                     if self._held(p, g, score) <= now]
            work.extend((p, g) for g in ready)
            if len(ready) >= DUE_BATCH:
                full.append(p)
        applied = 0
        for start in range(0, len(work), DUE_BATCH):
            # A batch at least; what the turn's budget leaves stays due for the next turn.
            if start and (self._stop.is_set() or time.monotonic() >= until):
                break
            applied += self._expire_many(node, work[start:start + DUE_BATCH], source)
        for p in full:
            if self._stop.is_set() or time.monotonic() >= until:
                break
            applied += self.sweep_partition(p, source, until, node)
        self._refresh_node(node, due)
        return applied

    def _due_key(self, p: int) -> str:
        return self._pk[p].due

    def _retry_later(self, failed: list[tuple[list[int], BaseException]]) -> None:
        """Partitions whose node failed (while the others' work went on) are due again after a
        wait that doubles while the node keeps failing (up to ``NODE_RETRY_MAX_MS``): asking it
        again at once would only repeat the refusal, but its deadlines must be applied soon
        after it answers (a replica promoted, a master restarted)."""
        now = self.server_now()
        for partitions, exc in failed:
            delay = 0
            for p in partitions:
                failures = self._node_failures.get(p, 0)
                delay = min(NODE_RETRY_MAX_MS, NODE_RETRY_FIRST_MS * 2 ** min(failures, 10))
                self._node_failures[p] = failures + 1
                self.earliest[p] = now + delay
            # (The node's failure is logged once per outage, by nodes.py.)
            log.debug("a node failed; its partitions are retried later", extra={
                "event": "partitions_retried", "partitions": partitions, "why": str(exc),
                "retry_in_ms": delay})

    def _refresh(self, partitions: list[int]) -> None:
        """Re-read each partition's earliest deadline, per node (``_retry_later`` for a node
        that fails)."""
        self._retry_later(each_node(self._client, partitions, self._due_key, self._refresh_node))

    def _refresh_node(self, node: Any, partitions: list[int]) -> None:
        """A backed-off group counts from its retry time, so the first entries are read up to
        one that is not backed off (entries after it are no earlier)."""
        pipe = node.pipeline(transaction=False)
        for p in partitions:
            pipe.zrange(self._pk[p].due, 0, self._backed_off_in(p), withscores=True)
        for p, firsts in zip(partitions, pipe.execute(), strict=True):
            at = float("inf")
            for raw, score in firsts:
                with self._lock:
                    held = self._held(p, raw.decode("utf-8", "surrogateescape"), float(score))
                    at = min(at, max(float(score), held))
            self.earliest[p] = at
            self._node_failures.pop(p, None)

    def sweep_partition(self, p: int, source: str, until: float | None = None,
                        node: Any = None) -> int:
        """The due groups of one partition, in pipelined batches: at most ``MAX_PASSES``, until
        a batch applies nothing, the service stops or the monotonic time ``until`` passes (what
        is left stays due for later); through ``node``, its node's client (found if not given)."""
        pk = self._pk[p]
        node = node if node is not None else node_client(self._client, pk.due)
        applied = 0
        for _ in range(MAX_PASSES):
            if self._stop.is_set() or (until is not None and time.monotonic() >= until):
                break
            limit = DUE_BATCH + self._backed_off_in(p)
            due = node_scripts(self._scripts, node).due_groups(keys=[pk.due], args=["", limit])
            now = float(due[0])
            ready = [g for g, score in self._with_held_scores(node, p, due[1:])
                     if self._held(p, g, score) <= now]
            done = self._expire_many(node, [(p, g) for g in ready], source)
            applied += done
            if len(ready) < DUE_BATCH or not done:
                break
        self._refresh_node(node, [p])
        return applied

    def _with_held_scores(self, node: Any, p: int, raws: list[bytes],
                          ) -> list[tuple[str, float | None]]:
        """Each due group with its index score where this process holds it (``_held`` needs
        it; read in one round trip, and only then: a hold is rare), else None."""
        groups = [raw.decode("utf-8", "surrogateescape") for raw in raws]
        with self._lock:
            held = [i for i, g in enumerate(groups)
                    if (entry := self.backed_off.get((p, g))) is not None and entry[2] is not None]
        scores: list[float | None] = [None] * len(groups)
        if held:
            pipe = node.pipeline(transaction=False)
            for i in held:
                pipe.zscore(self._pk[p].due, raws[i])
            for i, score in zip(held, pipe.execute(), strict=True):
                scores[i] = float(score) if score is not None else None
        return list(zip(groups, scores, strict=True))

    def expire_group(self, p: int, group_id: str, source: str, node: Any = None) -> int:
        """Apply one group's passed deadlines, through ``node`` (its node's client, found if
        not given)."""
        if self._left.is_set():
            return 0
        keys = self._pk[p].group(group_id)
        node = node if node is not None else node_client(self._client, keys.group)
        sent_at = self.server_now()
        try:
            reply = node_scripts(self._scripts, node).expire_deadlines(keys=keys.all(), args=["", group_id])
        except MOVED:
            raise  # nodes.each_node runs the piece again through the cluster client
        except redis.ResponseError as exc:
            self._failed(p, group_id, exc, node, sent_at)
            return 0
        self._succeeded(p, group_id)
        return self._record(reply, source)

    def _failed(self, p: int, group_id: str, exc: redis.ResponseError, node: Any,
                sent_at: float | None = None) -> None:
        """Raise what says Redis cannot run anything now (the loop waits, then tries again);
        else back this group off, so one broken group (a script error is a bug, logged) stops
        neither the others nor the loop's wait.

        Its entry in the partition's due index moves to its retry time too (``defer_due``), if
        it had passed when the failed call was sent (``sent_at``, server ms; by default now):
        a script announces a deadline only when it is earlier than the index's first entry, so
        a stale passed entry left there kept every later deadline of the partition unannounced
        until the next re-read of the index. A deadline a step of the group published since
        is its real one and stays (a ZADD of its own after the failed reply replaced it, and
        every sweeper reading the index slept past it). When the group is retried its 'ea' has
        passed, so ``expire_deadlines`` publishes its real earliest deadline again.

        Once the entry is moved (or found newer) the index says when the group is due, and this
        process holds it back no longer: a hold kept the sweeper that failed, the lease holder,
        asleep past a deadline published since, up to ``backoff_max_ms``, and a group made again
        under the name inherited it. Only an entry left where it was (the move failed) is held
        back here until the retry time, so a passed entry is not retried at once.

        The failures are counted for the group's incarnation (one more round trip, after a
        failure only): a group deleted and made again under the name inherited the old one's
        count until its retry time was long past (``resync``), and its first retry waited
        twice ``backoff_first_ms`` or more."""
        _raise_if_refused(exc)
        inc = self._incarnation(node, p, group_id)
        with self._lock:
            _, failures, _, was = self.backed_off.get((p, group_id), (0.0, 0, None, None))
            if inc is _UNREAD:
                inc = was  # (unknown: taken for the same group)
            elif inc != was:
                failures = 0  # another group under the name, or the first failure
            delay = min(self.backoff_max_ms, self.backoff_first_ms * 2 ** min(failures, 30))
            now = self.server_now()
            self.backed_off[(p, group_id)] = (now + delay, failures + 1,
                                              now if sent_at is None else sent_at, inc)
        log.error("expiring a group failed; retrying it later", extra={
            "event": "expire_error", "partition": p, "group": group_id, "why": str(exc),
            "failures": failures + 1, "retry_in_ms": int(delay)})
        try:
            node_scripts(self._scripts, node).defer_due(keys=[self._pk[p].due], args=[
                group_id, math.floor(now if sent_at is None else sent_at),
                math.ceil(now + delay)])
        except redis.RedisError as move_exc:
            # The hold above stays in this process; another one re-reading the index retries
            # the group sooner, which is only a wasted call.
            log.debug("a failed group's index entry stays", extra={
                "event": "expire_error_index", "partition": p, "group": group_id,
                "why": str(move_exc)})
        else:
            with self._lock:
                self.backed_off[(p, group_id)] = (now + delay, failures + 1, None, inc)

    def _incarnation(self, node: Any, p: int, group_id: str) -> Any:
        """The incarnation token of the group (its record's 'inc', or 'created' for a record an
        older rcoord made, as ``coordinator.group_incarnation`` reads it): None if it has no
        record, ``_UNREAD`` if the read failed (a record that is not a hash, among others)."""
        try:
            inc, created = node.hmget(self._pk[p].group(group_id).group, ["inc", "created"])
        except redis.RedisError:
            return _UNREAD
        token = inc if inc is not None else created
        return token.decode("utf-8", "surrogateescape") if isinstance(token, bytes) else token

    def _expire_many(self, node: Any, work: list[tuple[int, str]], source: str) -> int:
        if self._left.is_set():
            return 0
        try:
            return self._expire_each(node, work, source)
        finally:
            self.last_progress = time.monotonic()

    def _expire_each(self, node: Any, work: list[tuple[int, str]], source: str) -> int:
        if len(work) <= 1:
            return sum(self.expire_group(p, g, source, node) for p, g in work)
        pipe = node.pipeline(transaction=False)
        for p, group_id in work:
            keys = self._pk[p].group(group_id).all()
            pipe.execute_command(*self._scripts.command("expire_deadlines", keys, ["", group_id]))
        applied = 0
        for (p, group_id), reply in zip(work, pipe.execute(raise_on_error=False), strict=True):
            _raise_if_node_failed(reply)  # the rest of the batch failed too: the loop waits
            if isinstance(reply, Exception):
                # The library missing after a restart or failover, or a function error: one by
                # one, through the library call, which loads the library and logs a failure.
                applied += self.expire_group(p, group_id, source, node)
            else:
                self._succeeded(p, group_id)
                applied += self._record(reply, source)
        return applied

    def _record(self, reply: list[Any], source: str) -> int:
        applied = int(reply[0])
        for late_ms in reply[1:]:
            self._metrics.lateness.observe(max(0, int(late_ms)) / 1000.0)
        if applied:
            self._metrics.deadlines_applied.labels(source).inc(applied)
        return applied


def _raise_if_node_failed(reply: Any) -> None:
    """Raise a pipelined reply that says its node cannot run anything now (the connection
    lost or timed out, or a refusal: ``_raise_if_refused``); return for a success, the library
    missing, or a failure of that call alone."""
    if isinstance(reply, (redis.ConnectionError, redis.TimeoutError, *MOVED)):
        raise reply  # (a slot moved: nodes.each_node runs the piece through the cluster client)
    if isinstance(reply, redis.ResponseError) and not _library_missing(reply):
        _raise_if_refused(reply)


def _raise_if_refused(exc: redis.ResponseError) -> None:
    """Raise ``exc`` as rcoord's ``ServerUnavailable``/``ConnectionLost`` if it says Redis
    cannot run anything now (out of memory, READONLY, BUSY...); return if it concerns only the
    call that failed (a script's named error, a script bug)."""
    try:
        reraise_as_rcoord("expire_deadlines", exc)
    except (ServerUnavailable, ConnectionLost):
        raise
    except RcoordError:
        return


def _library_missing(exc: redis.ResponseError) -> bool:
    """The library is gone (a restart, a failover, FUNCTION FLUSH): the raw pipelined call
    fails, but the library call in ``expire_group`` loads it again, so it is no refusal."""
    return isinstance(exc, redis.exceptions.NoScriptError) or is_missing_function(exc)
