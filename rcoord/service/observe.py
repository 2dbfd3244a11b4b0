"""Turning the partitions' event streams into structured logs and metrics.

Scripts append every group transition and member expiry to their partition's capped events
stream; the lease holder tails it, logs each event as one JSON line and counts it. Gauges of
groups by state and of members are sampled from the leased partitions.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from ..keys import PartitionKeys
from .metrics import Metrics
from .nodes import each_node

__all__ = ["EventTail", "Sample", "sample_groups"]

log = logging.getLogger("rcoord.groups")
STATES = ("Empty", "PreparingRebalance", "CompletingRebalance", "Stable")
POLL_WAIT_S = 0.2
"""How long a ``poll`` waits for another one of the same tail to end (``EventTail.poll``)."""


def _id_key(entry_id: bytes) -> tuple[int, int]:
    """A stream entry id (``<ms>-<seq>``) as numbers, to compare ids."""
    ms, _, seq = entry_id.partition(b"-")
    return int(ms), int(seq or 0)


class EventTail:
    def __init__(self, client: Any, namespace: str, num_partitions: int, metrics: Metrics) -> None:
        self._client = client
        self._pk = [PartitionKeys(namespace, p, num_partitions) for p in range(num_partitions)]
        self._metrics = metrics
        self._last: dict[int, bytes] = {}
        self._polling = threading.Lock()
        """Held by a ``poll``: two at once read from the same positions."""

    def poll(self, owned: set[int]) -> int:
        """Read what is new in each leased partition's events.

        Every partition's read position is shared through its ``tail`` key: the id of the last
        event logged there (written after every read that moved it), so whoever holds the
        partition next goes on from it, and the events a holder had not read when it died,
        paused or handed the partition over, and those the new holder's first sweep applies, are
        logged and counted (before, a new holder started at the stream's end, and every expiry of
        a takeover went unlogged).

        - A partition's first holder ever (no position stored) starts at the stream's end, and
          stores that position at once (``SET NX``): before, it stored nothing until it had
          read an event, so a partition that changed holder before that (a pause, a hand-over,
          a death within a tail interval) was started at the stream's end again by the next
          holder, and what happened in between was never logged.
        - Every read skips what the stored position says someone else logged already (a
          holder that was paused past its lease TTL, or that reads a partition being handed
          over, goes on from its own position otherwise, and logged and counted those events
          a second time).

        So each event is logged once, except by two processes that read the same partition at
        the same moment (a hand-over, a pause ending), which may both log it: at least once,
        never lost while the stream still holds it.

        One poll at a time: the stop's last read (``CoordinatorService._leave``) may come while
        the timer loop is in one (a ``stop()`` from another thread than ``run()``'s, or a loop
        ``run()`` left behind), and both read on from the same positions, so every event
        between was logged and counted twice by this one process. A poll that finds another
        under way waits ``POLL_WAIT_S`` for it, then reads on from where that one ended; if it
        has not ended (a node that does not answer), it reads nothing (0): the next poll, or
        the partition's next holder (from the stored position), logs what it would have."""
        if not self._polling.acquire(timeout=POLL_WAIT_S):
            log.debug("another read of the group events is under way; read on later",
                      extra={"event": "events_unread", "partitions": sorted(owned)})
            return 0
        try:
            return self._poll(owned)
        finally:
            self._polling.release()

    def _poll(self, owned: set[int]) -> int:
        ps = sorted(owned)
        for p in list(self._last):
            if p not in owned:
                del self._last[p]
        seen: list[int] = []

        def read(node: Any, partitions: list[int]) -> None:
            seen.append(self._poll_node(node, partitions))

        for partitions, exc in each_node(self._client, ps, self._events_key, read):
            # Read on from where this process stopped once the node answers. (The node's
            # failure is logged once per outage, by nodes.py.)
            log.debug("reading a node's group events failed; read on later", extra={
                "event": "events_unread", "partitions": partitions, "why": str(exc)})
        return sum(seen)

    def _events_key(self, p: int) -> str:
        return self._pk[p].events

    def _poll_node(self, node: Any, ps: list[int]) -> int:
        """``poll``'s reads for the partitions of one node, through ``node``: each changes
        ``_last`` for its own partitions only, as the nodes' pieces run at once."""
        pipe = node.pipeline(transaction=False)
        for p in ps:
            pipe.get(self._pk[p].tail)
            if p in self._last:
                pipe.xrange(self._pk[p].events, min=b"(" + self._last[p], max="+", count=1000)
            else:
                pipe.xrevrange(self._pk[p].events, count=1)
        replies = iter(pipe.execute())
        seen = 0
        moved: dict[int, bytes] = {}
        started: dict[int, bytes] = {}
        for p in ps:
            stored = next(replies)
            if p not in self._last:
                latest = next(replies)
                if stored:
                    self._last[p] = stored
                else:
                    self._last[p] = started[p] = latest[0][0] if latest else b"0-0"
                continue
            # Logged already, by another process (or this one, as stored).
            floor = max(self._last[p], stored, key=_id_key) if stored else self._last[p]
            for entry_id, fields in next(replies):
                if _id_key(entry_id) <= _id_key(floor):
                    continue
                self._last[p] = moved[p] = entry_id
                self._record(p, {k.decode(): v.decode("utf-8", "surrogateescape") for k, v in fields.items()})
                seen += 1
            if _id_key(floor) > _id_key(self._last[p]):
                self._last[p] = floor
        if moved or started:
            pipe = node.pipeline(transaction=False)
            for p, entry_id in moved.items():
                pipe.set(self._pk[p].tail, entry_id)
            for p, entry_id in started.items():
                # Unless another holder stored one meanwhile (the next read skips to it).
                pipe.set(self._pk[p].tail, entry_id, nx=True)
            pipe.execute()
        return seen

    def _record(self, partition: int, e: dict[str, str]) -> None:
        kind = e.get("e")
        if kind == "transition":
            to = e.get("to", "")
            self._metrics.transitions.labels(to).inc()
            if to == "PreparingRebalance" and e.get("from") != "PreparingRebalance":
                self._metrics.rebalances_started.inc()
            if e.get("took"):
                self._metrics.rebalances_completed.inc()
                self._metrics.rebalance_duration.observe(int(e["took"]) / 1000.0)
            log.info("group transition", extra={"event": "group_transition", "partition": partition,
                                                "group": e.get("g"), "from": e.get("from"), "to": to,
                                                "generation": int(e.get("gen") or 0),
                                                "reason": e.get("why") or None, "at_ms": int(e["at"])})
        elif kind == "expired":
            self._metrics.members_expired.inc()
            log.info("member expired", extra={"event": "member_expired", "partition": partition,
                                              "group": e.get("g"), "member": e.get("member"),
                                              "late_ms": int(e.get("late") or 0), "at_ms": int(e["at"])})


Sample = tuple[dict[str, int], int]
"""One partition's sample: groups by state, and members."""


def sample_groups(client: Any, namespace: str, num_partitions: int, owned: set[int],
                  metrics: Metrics, known: dict[int, Sample] | None = None,
                  ) -> list[tuple[list[int], BaseException]]:
    """Refresh the groups-by-state and members gauges from the leased partitions, each read
    through its node's own client (a hung master fails its reads within the socket timeout,
    without the cluster client's retries, so the sampler's thread stops in time).

    ``known``, kept by the caller from one call to the next, holds each leased partition's
    last sample: a partition whose node fails now counts as it was last sampled (none if it
    never was), and the gauges are set from the nodes that answer; the failed pieces are
    returned (``each_node``'s; their node's outage is logged by ``nodes.py``). Before, one
    failing node of a cluster failed the whole pass, and the gauges stayed as they were for
    every node while it lasted. Without ``known``, such a pass raises, the gauges unchanged.
    When every node fails, the first error is raised and the gauges stay as they were."""
    fresh: dict[int, Sample] = {}
    lock = threading.Lock()

    def read(node: Any, partitions: list[int]) -> None:
        for p in partitions:
            pk = PartitionKeys(namespace, p, num_partitions)
            counts, members = dict.fromkeys(STATES, 0), 0
            ids = list(node.smembers(pk.groups))
            if ids:
                pipe = node.pipeline(transaction=False)
                for raw in ids:
                    keys = pk.group(raw.decode("utf-8", "surrogateescape"))
                    pipe.hget(keys.group, "state")
                    pipe.hlen(keys.members)
                replies = pipe.execute()
                for i in range(0, len(replies), 2):
                    state = (replies[i] or b"").decode()
                    if state in counts:
                        counts[state] += 1
                    members += int(replies[i + 1])
            with lock:
                fresh[p] = (counts, members)

    failed = each_node(client, sorted(owned),
                       lambda p: PartitionKeys(namespace, p, num_partitions).groups, read)
    if failed and known is None:
        raise failed[0][1]  # the gauges stay as they were (the caller logs it)
    if known is None:
        known = {}
    for p in list(known):
        if p not in owned:
            del known[p]
    known.update(fresh)
    totals = dict.fromkeys(STATES, 0)
    for counts, _ in known.values():
        for state, n in counts.items():
            totals[state] += n
    for state, n in totals.items():
        metrics.groups.labels(state).set(n)
    metrics.members.set(sum(members for _, members in known.values()))
    return failed
