"""Turning the partitions' event streams into structured logs and metrics.

Scripts append every group transition and member expiry to their partition's capped events
stream; the lease holder tails it, logs each event as one JSON line and counts it. Gauges of
groups by state and of members are sampled from the leased partitions.
"""

from __future__ import annotations

import logging
from typing import Any

from ..keys import PartitionKeys
from .metrics import Metrics
from .nodes import each_node

__all__ = ["EventTail", "sample_groups"]

log = logging.getLogger("rcoord.groups")
STATES = ("Empty", "PreparingRebalance", "CompletingRebalance", "Stable")


class EventTail:
    def __init__(self, client: Any, namespace: str, num_partitions: int, metrics: Metrics) -> None:
        self._client = client
        self._pk = [PartitionKeys(namespace, p, num_partitions) for p in range(num_partitions)]
        self._metrics = metrics
        self._last: dict[int, bytes] = {}

    def poll(self, owned: set[int]) -> int:
        """Read what is new in each leased partition's events.

        A newly leased partition goes on from the last event its previous holder logged (the
        partition's ``tail`` key, written after every read that moved it), so what that holder
        did not read before it died or handed the partition over, and what the new holder's
        first sweep applies, is logged and counted (before, a new holder started at the
        stream's end, and every expiry of a takeover went unlogged). Without a stored position
        (the partition's first holder) it starts at the stream's end."""
        ps = sorted(owned)
        for p in list(self._last):
            if p not in owned:
                del self._last[p]
        seen = [0]

        def read(partitions: list[int]) -> None:
            seen[0] += self._poll_node(partitions)

        for partitions, exc in each_node(self._client, ps, self._events_key, read):
            # Read on from where this process stopped once the node answers.
            log.warning("reading a node's group events failed; read on later", extra={
                "event": "node_error", "partitions": partitions, "why": str(exc)})
        return seen[0]

    def _events_key(self, p: int) -> str:
        return self._pk[p].events

    def _poll_node(self, ps: list[int]) -> int:
        pipe = self._client.pipeline(transaction=False)
        for p in ps:
            if p in self._last:
                pipe.xrange(self._pk[p].events, min=b"(" + self._last[p], max="+", count=1000)
            else:
                pipe.get(self._pk[p].tail)
                pipe.xrevrange(self._pk[p].events, count=1)
        replies = iter(pipe.execute())
        seen = 0
        moved: dict[int, bytes] = {}
        for p in ps:
            if p not in self._last:
                stored, latest = next(replies), next(replies)
                self._last[p] = stored or (latest[0][0] if latest else b"0-0")
                continue
            for entry_id, fields in next(replies):
                self._last[p] = moved[p] = entry_id
                self._record(p, {k.decode(): v.decode("utf-8", "surrogateescape") for k, v in fields.items()})
                seen += 1
        if moved:
            pipe = self._client.pipeline(transaction=False)
            for p, entry_id in moved.items():
                pipe.set(self._pk[p].tail, entry_id)
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


def sample_groups(client: Any, namespace: str, num_partitions: int, owned: set[int],
                  metrics: Metrics) -> None:
    """Refresh the groups-by-state and members gauges from the leased partitions."""
    counts = dict.fromkeys(STATES, 0)
    members = 0
    for p in sorted(owned):
        pk = PartitionKeys(namespace, p, num_partitions)
        ids = list(client.smembers(pk.groups))
        if not ids:
            continue
        pipe = client.pipeline(transaction=False)
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
    for state, n in counts.items():
        metrics.groups.labels(state).set(n)
    metrics.members.set(members)
