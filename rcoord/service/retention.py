"""Topic retention, applied by the coordinator service as Kafka's broker applies it (every
``log.retention.check.interval.ms``, 5 minutes by default).

Each topic belongs to one of the service's lease partitions, found from its name as a group's
partition is found from the group id (Kafka's ``abs(String.hashCode) % N``,
``partitioning.partition_for``). So with several processes each topic is trimmed by the one
holding that partition's lease, and the work moves with the lease. Every ``interval_ms`` (counted
from the end of the previous pass) a process lists the namespace's topics (``Topics.list``, a
SCAN), reads the retention settings of those on its leases (one ``HMGET`` each, pipelined per
node), and calls ``Topics.apply_retention`` for those that have one (``retention_records`` or
``retention_ms``); a topic without one is not touched.

The passes run on a thread of their own, so a long one never delays a deadline of the timer
loop. Nothing they meet ends the process: a failed listing, or a topic whose trim fails, is
logged (``retention_error``, once per pass) and tried again at the next pass. On one node a
failure that says Redis cannot run anything now (unreachable, out of memory, read-only) ends the
pass, since every other topic would meet it too (each perhaps after a socket timeout); on a
cluster the topics of the other nodes go on. The stop event is checked between topics, and
between the scan rounds of a topic's trim.

While a master of a cluster fails (killed, with no replica to promote), or a slot has no
master (the cluster client then refuses to list every master,
``connect.refuse_partial_listing``: the listing would leave out that slot's topics), a pass
lists the masters one by one (``_list_by_master``) and trims the topics found there: those of
the masters that answer are trimmed on time, and the pass is logged as failed, naming what was
not listed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import redis.cluster

from ..connect import partial_listing
from ..errors import Errors
from ..partitioning import partition_for
from ..topics import TopicError, Topics, meta_key
from .metrics import Metrics
from .nodes import NODE_FAILURES, each_node

__all__ = ["FIRST_PASS_MAX_MS", "MAX_RETENTION_CHECK_INTERVAL_MS", "RetentionKeeper"]

log = logging.getLogger("rcoord.service")

FIRST_PASS_MAX_MS = 30_000
"""The first pass comes after the interval, or after 30 s if that is sooner (Kafka's scheduler
starts its retention task after 30 s too): a process restarted more often than every interval
still trims."""
MAX_RETENTION_CHECK_INTERVAL_MS = 86_400_000
"""A day: longer waits are no use for retention, and far longer ones overflow a thread's wait."""
SETTINGS_CHUNK = 500
"""Topics whose settings one pipeline reads."""


class RetentionKeeper:
    """The retention passes of one coordinator process; ``run()`` is its thread's body.

    ``owned`` returns the lease partitions this process holds now, or None while its leases are
    not confirmed (no renewal within a TTL: Redis out of reach, the process paused), when it
    cannot tell which it holds; it is asked at the start of a pass and again before each topic,
    so a topic whose lease moved during a pass is left to its new holder. (The service's
    ``owned`` answers the last confirmed set, not None, while Redis refuses the lease rounds as
    out of memory: nobody can take a lease then, and a trim is what frees memory;
    ``CoordinatorService._retention_leases``.)

    A pass that meets unconfirmed leases trims nothing more and is counted "failed" and logged
    ``retention_error`` (``leases_unconfirmed``), not "ok": the topics left are due and nobody
    may be trimming them, as after a failed listing, and an operator alerting on failed passes
    must see a process whose lease rounds keep lapsing. (A stopped pass is not counted failed:
    the stop is asked for.) Before, unconfirmed leases read as "no leases": the pass, or the
    topics left in it, were skipped and the pass counted "ok"."""

    def __init__(self, client: Any, namespace: str, num_partitions: int, metrics: Metrics,
                 owned: Callable[[], set[int] | None], interval_ms: int, stop: threading.Event,
                 coordinator_id: str = "") -> None:
        self._client = client
        self._ns = namespace
        self._n = num_partitions
        self._metrics = metrics
        self._owned = owned
        self.interval_ms = interval_ms
        self._stop = stop
        self._id = coordinator_id
        self._topics = Topics(client, namespace)
        self._single_node = not isinstance(client, redis.cluster.RedisCluster)
        self.last_pass: float | None = None
        """When the last pass ended (monotonic), whatever its outcome; None before the first."""

    def run(self) -> None:
        """Pass after pass until the stop event is set; never raises."""
        wait_ms = min(self.interval_ms, FIRST_PASS_MAX_MS)
        while not self._stop.wait(wait_ms / 1000):
            try:
                self.run_once()
            except Exception as exc:  # noqa: BLE001 - retention must never end the process
                self._metrics.retention_passes.labels("failed").inc()
                log.error("a retention pass failed", extra={
                    "event": "retention_error", "id": self._id, "why": repr(exc)})
            self.last_pass = time.monotonic()
            wait_ms = self.interval_ms

    def run_once(self) -> int:
        """One pass: apply the retention of every topic on this process's leases that has one.
        Returns how many topics had their retention applied."""
        started = time.monotonic()
        owned = self._owned()
        if owned is None:
            self._metrics.retention_passes.labels("failed").inc()
            self._unconfirmed(None)
            return 0
        if not owned:
            self._metrics.retention_passes.labels("ok").inc()
            return 0
        try:
            names, unlisted, cut = self._list()
            mine = [t for t in names if partition_for(t, self._n) in owned]
            settings, failed_read = self._with_retention(mine)
        except Exception as exc:  # noqa: BLE001 - logged; the next pass tries again
            self._metrics.retention_passes.labels("failed").inc()
            log.warning("listing the topics for retention failed; trying again next pass", extra={
                "event": "retention_error", "id": self._id, "why": str(exc),
                "retry_in_ms": self.interval_ms})
            return 0
        applied = 0
        failures = len(failed_read)
        first_error: tuple[str, str] | None = None
        if failed_read:
            first_error = (failed_read[0][0], str(failed_read[0][1]))
        unconfirmed = False
        # A stop cuts a pass short (the listing of the masters one by one, the topics, a
        # topic's trim): what it left is not known to be trimmed, so such a pass is not "ok"
        # (it is "failed" only for what failed). A stop that came once every topic's trim was
        # done leaves nothing: that pass is "ok". (Before, a stopped pass counted "ok"; later
        # every pass that ended with the stop set was taken for cut short, also one whose
        # complete listing found no topic with retention.)
        stopped = cut
        for done, topic in enumerate(settings):
            if self._stop.is_set():
                stopped = True
                break
            now_owned = self._owned()
            if now_owned is None:
                unconfirmed = True
                self._unconfirmed(len(settings) - done)
                break
            if partition_for(topic, self._n) not in now_owned:
                continue  # its lease moved during the pass: its new holder trims it
            try:
                starts = self._topics.apply_retention(topic, self._stop)
            except TopicError as exc:
                if exc.error == Errors.UNKNOWN_TOPIC_OR_PARTITION:
                    continue  # deleted since it was listed
                failures += 1
                first_error = first_error or (topic, str(exc))
                continue
            except Exception as exc:  # noqa: BLE001 - this topic only; logged below
                failures += 1
                first_error = first_error or (topic, str(exc))
                if self._single_node and isinstance(exc, NODE_FAILURES):
                    break  # Redis cannot run anything now: every other topic would fail too
                continue
            if not starts.done:
                # The trim ended at the stop between its rounds with rounds left: it is not
                # counted applied (the next pass, wherever the lease goes, finishes it and counts
                # it). One that finished in the stop's round is (its answer says it is done);
                # before, the answer did not say, and it was taken for cut short.
                log.debug("retention stopped: the topic's trim is unfinished", extra={
                    "event": "retention_stopped", "id": self._id, "topic": topic,
                    "partition": partition_for(topic, self._n), "log_start_offsets": starts,
                    "unfinished": list(starts.unfinished)})
                stopped = True
                break
            applied += 1
            self._metrics.retention_topics.inc()
            log.debug("retention applied", extra={
                "event": "retention_applied", "id": self._id, "topic": topic,
                "partition": partition_for(topic, self._n), "log_start_offsets": starts})
        took_ms = int((time.monotonic() - started) * 1000)
        if failures:
            self._metrics.retention_errors.inc(failures)
            assert first_error is not None
            log.warning("applying retention failed for %d topic(s); trying again next pass",
                        failures, extra={
                            "event": "retention_error", "id": self._id, "failed": failures,
                            "topic": first_error[0], "why": first_error[1],
                            "retry_in_ms": self.interval_ms})
        if unlisted:
            log.warning("the topics of %s were not listed; trying again next pass",
                        ", ".join(what for what, _ in unlisted), extra={
                            "event": "retention_error", "id": self._id,
                            "unlisted": [what for what, _ in unlisted],
                            "why": str(unlisted[0][1]), "retry_in_ms": self.interval_ms})
        # One result per pass: "failed" for whatever failed (a stopped pass is not failed for
        # the stop), "ok" only when nothing failed and the stop left nothing.
        if failures or unlisted or unconfirmed:
            self._metrics.retention_passes.labels("failed").inc()
        elif not stopped:
            self._metrics.retention_passes.labels("ok").inc()
        log.debug("retention pass", extra={
            "event": "retention_pass", "id": self._id, "topics": len(names), "on_leases": len(mine),
            "with_retention": len(settings), "applied": applied, "failed": failures,
            "stopped": stopped, "leases_unconfirmed": unconfirmed, "took_ms": took_ms})
        return applied

    def _unconfirmed(self, left: int | None) -> None:
        """Log a pass that found its leases unconfirmed (see the class docstring), with ``left``
        topics with retention it did not reach: None at the pass's start, which
        has listed no topic, so the line leaves ``left`` out rather than say 0 (nothing undone)."""
        extra: dict[str, object] = {
            "event": "retention_error", "id": self._id, "leases_unconfirmed": True,
            "why": "the leases were not renewed within a TTL", "retry_in_ms": self.interval_ms}
        if left is not None:
            extra["left"] = left
        log.warning("this process's leases are not confirmed: retention waits for the next pass",
                    extra=extra)

    def _list(self) -> tuple[list[str], list[tuple[str, BaseException]], bool]:
        """The topic names, what could not be listed (what, why): nothing, unless the
        listing of every master of a cluster failed (``_list_by_master``), and whether the
        stop cut the listing short (only a listing of the masters one by one stops)."""
        try:
            return self._topics.list(), [], False
        except NODE_FAILURES as exc:
            if self._single_node:
                raise
            refused = partial_listing(self._client.nodes_manager, "SCAN")
            return self._list_by_master(exc if refused else None)

    def _list_by_master(self, refused: BaseException | None
                        ) -> tuple[list[str], list[tuple[str, BaseException]], bool]:
        """The topics on each master, listed through its own client, when the cluster client's
        listing of every master failed: a master fails, or the client refuses (``refused``: a
        slot has no master). Before, the whole pass was skipped, and no topic was trimmed
        for as long as that lasted (with a master lost and no replica, for good): streams
        grew past their retention on the healthy masters too. Topics are found on the
        masters that answer (one that fails is named, with its error); those of the slots
        with no master are not, and are named too. Raises when no master answered."""
        names: set[str] = set()
        unlisted: list[tuple[str, BaseException]] = []
        if refused is not None:
            unlisted.append(("the slots with no master", refused))
        masters = self._client.get_primaries()
        failed = 0
        cut = False
        for node in masters:
            if self._stop.is_set():
                cut = True  # (a hung master costs a socket timeout: the stop does not wait)
                break
            try:
                names.update(Topics(self._client.get_redis_connection(node), self._ns).list())
            except NODE_FAILURES as exc:
                failed += 1
                unlisted.append((node.name, exc))
        if failed == len(masters):
            raise unlisted[-1][1] if unlisted else ConnectionError("no master to list")
        return sorted(names), unlisted, cut

    def _with_retention(self, topics: Sequence[str]) -> tuple[list[str], list[tuple[str, BaseException]]]:
        """The topics that have a retention setting (in order), and those whose settings could
        not be read (their node failed) with the error. Raises when every node failed."""
        found: set[str] = set()
        failed: list[tuple[str, BaseException]] = []

        def read(node: Any, piece: list[str]) -> None:
            with_setting = []  # kept only if the whole piece is read: a failed one is retried
            for start in range(0, len(piece), SETTINGS_CHUNK):
                chunk = piece[start:start + SETTINGS_CHUNK]
                pipe = node.pipeline(transaction=False)
                for topic in chunk:
                    pipe.hmget(meta_key(self._ns, topic), ["retention_records", "retention_ms"])
                for topic, (records, age) in zip(chunk, pipe.execute(), strict=True):
                    if records not in (None, b"", "") or age not in (None, b"", ""):
                        with_setting.append(topic)
            found.update(with_setting)

        for piece, exc in each_node(self._client, topics, lambda t: meta_key(self._ns, t), read):
            failed.extend((t, exc) for t in piece)
        return [t for t in topics if t in found], failed
