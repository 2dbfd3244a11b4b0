"""The timer work of the partitions a coordinator leases.

For each leased partition it knows the earliest deadline (the partition's due index, kept current
by shard-channel messages and re-read on any doubt), sleeps until the earliest one of all, and
then applies every passed deadline of every due group with ``expire_deadlines``. No polling
interval decides precision: the wait ends exactly at the next deadline or at a message that
brings one earlier.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import redis

from ..keys import PartitionKeys
from ..scripts import Scripts
from .metrics import Metrics

__all__ = ["Sweeper"]

DUE_BATCH = 500
log = logging.getLogger("rcoord.service")


class Sweeper:
    def __init__(self, client: Any, scripts: Scripts, namespace: str, num_partitions: int,
                 metrics: Metrics) -> None:
        self._client = client
        self._scripts = scripts
        self._pk = [PartitionKeys(namespace, p, num_partitions) for p in range(num_partitions)]
        self._metrics = metrics
        self.earliest: dict[int, float] = {}
        self._offset_ms = 0.0  # server clock minus local wall clock

    # -- server time -----------------------------------------------------------------------------

    def sync_clock(self) -> None:
        """Server time = monotonic time + offset, so a step of the local wall clock (NTP) can
        neither make the loop spin nor sleep past a deadline."""
        before = time.monotonic() * 1000
        sec, usec = self._client.time()
        after = time.monotonic() * 1000
        self._offset_ms = int(sec) * 1000 + int(usec) / 1000 - (before + after) / 2

    def server_now(self) -> float:
        return time.monotonic() * 1000 + self._offset_ms

    # -- the deadline index ----------------------------------------------------------------------

    def resync(self, owned: set[int]) -> None:
        """Re-read the earliest deadline of every leased partition (the authority)."""
        ps = sorted(owned)
        pipe = self._client.pipeline(transaction=False)
        for p in ps:
            pipe.zrange(self._pk[p].due, 0, 0, withscores=True)
        self.earliest = {}
        for p, first in zip(ps, pipe.execute(), strict=True):
            self.earliest[p] = float(first[0][1]) if first else float("inf")

    def note_deadline(self, p: int, at: float) -> None:
        if p in self.earliest and at < self.earliest[p]:
            self.earliest[p] = at

    def next_due(self) -> float:
        return min(self.earliest.values(), default=float("inf"))

    def sweep_due(self, source: str) -> int:
        """Apply the passed deadlines of every leased partition whose earliest one has passed.

        Three pipelined round trips however many partitions are due: the due groups of each,
        then every group's ``expire_deadlines``, then each partition's new earliest deadline. A
        burst of expiries spread over many partitions (a rack going down) must not cost a round
        trip per partition or per group.
        """
        now = self.server_now()
        due = [p for p, at in self.earliest.items() if at <= now]
        if not due:
            return 0
        pipe = self._client.pipeline(transaction=False)
        for p in due:
            pipe.execute_command(*self._scripts.command("due_groups", [self._pk[p].due],
                                                        ["", DUE_BATCH]))
        work: list[tuple[int, str]] = []
        full: list[int] = []
        for p, reply in zip(due, pipe.execute(raise_on_error=False), strict=True):
            if isinstance(reply, Exception):  # library missing: the partition's own path loads it
                full.append(p)
                continue
            groups = [g.decode("utf-8", "surrogateescape") for g in reply[1:]]
            work.extend((p, g) for g in groups)
            if len(groups) >= DUE_BATCH:
                full.append(p)
        applied = self._expire_many(work, source)
        for p in full:
            applied += self.sweep_partition(p, source)
        self._refresh(due)
        return applied

    def _refresh(self, partitions: list[int]) -> None:
        pipe = self._client.pipeline(transaction=False)
        for p in partitions:
            pipe.zrange(self._pk[p].due, 0, 0, withscores=True)
        for p, first in zip(partitions, pipe.execute(), strict=True):
            self.earliest[p] = float(first[0][1]) if first else float("inf")

    def sweep_partition(self, p: int, source: str) -> int:
        """Every due group of one partition, in pipelined batches."""
        pk = self._pk[p]
        applied = 0
        while True:
            due = self._scripts.due_groups(keys=[pk.due], args=["", DUE_BATCH])
            groups = [g.decode("utf-8", "surrogateescape") for g in due[1:]]
            applied += self._expire_many([(p, g) for g in groups], source)
            if len(groups) < DUE_BATCH:
                break
        self._refresh([p])
        return applied

    def expire_group(self, p: int, group_id: str, source: str) -> int:
        keys = self._pk[p].group(group_id)
        try:
            reply = self._scripts.expire_deadlines(keys=keys.all(), args=["", group_id])
        except redis.ResponseError as exc:
            # One broken group (a script error is a bug, logged) must not stop the others.
            log.error("expiring a group failed", extra={"event": "expire_error", "partition": p,
                                                        "group": group_id, "why": str(exc)})
            return 0
        return self._record(reply, source)

    def _expire_many(self, work: list[tuple[int, str]], source: str) -> int:
        if len(work) <= 1:
            return sum(self.expire_group(p, g, source) for p, g in work)
        pipe = self._client.pipeline(transaction=False)
        for p, group_id in work:
            keys = self._pk[p].group(group_id).all()
            pipe.execute_command(*self._scripts.command("expire_deadlines", keys, ["", group_id]))
        applied = 0
        for (p, group_id), reply in zip(work, pipe.execute(raise_on_error=False), strict=True):
            if isinstance(reply, (redis.ConnectionError, redis.TimeoutError)):
                raise reply
            if isinstance(reply, Exception):
                # The library missing after a restart or failover, or a function error: one by
                # one, through the library call, which loads the library and logs a failure.
                applied += self.expire_group(p, group_id, source)
            else:
                applied += self._record(reply, source)
        return applied

    def _record(self, reply: list[Any], source: str) -> int:
        applied = int(reply[0])
        for late_ms in reply[1:]:
            self._metrics.lateness.observe(max(0, int(late_ms)) / 1000.0)
        if applied:
            self._metrics.deadlines_applied.labels(source).inc(applied)
        return applied
