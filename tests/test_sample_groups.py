"""The groups-by-state and members gauges while a node, or all of Redis, fails."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import pytest
import redis
from harness import wait_until

from rcoord import CoordinatorConfig, Errors, GroupCoordinator
from rcoord.keys import PartitionKeys
from rcoord.partitioning import partition_for
from rcoord.service import nodes
from rcoord.service.metrics import Metrics
from rcoord.service.observe import Sample, sample_groups

JOIN: dict[str, Any] = {"protocol_type": "consumer", "protocols": [("range", b"")],
                        "session_timeout_ms": 30_000, "rebalance_timeout_ms": 30_000}


def _member(coord: GroupCoordinator, group: str) -> None:
    mid = coord.join_group(group, **JOIN).member_id
    res = coord.join_group(group, mid, **JOIN)
    assert coord.sync_group(group, res.generation_id, mid, assignments={}).error == Errors.NONE


def _node_of(client: Any, namespace: str, p: int, n: int) -> str:
    return str(client.get_node_from_key(PartitionKeys(namespace, p, n).groups).name)


def _known() -> dict[int, Sample]:
    """A cache of last samples, as the service keeps one."""
    return {}


def _gauges(metrics: Metrics) -> tuple[float | None, float | None]:
    registry = metrics.registry
    return (registry.get_sample_value("rcoord_groups", {"state": "Stable"}),
            registry.get_sample_value("rcoord_members"))


def test_a_failing_node_costs_the_gauges_only_its_own_partitions(redis_cluster, namespace):
    """One master of a cluster failing: the others' partitions are sampled, and the failing
    one's count as last sampled. Before, sample_groups raised, and every gauge stayed as it
    was for as long as the node failed."""
    client = redis_cluster.client()
    try:
        coord = GroupCoordinator(client, CoordinatorConfig(
            namespace=namespace, group_min_session_timeout_ms=10,
            group_initial_rebalance_delay_ms=0)).start()
        n = coord.config.num_partitions
        by_node: dict[str, list[str]] = {}
        for i in range(200):
            group = f"g{i}"
            by_node.setdefault(_node_of(client, namespace, partition_for(group, n), n),
                               []).append(group)
        assert len(by_node) >= 2
        down, up = sorted(by_node)[:2]
        for group in (by_node[down][0], by_node[up][0]):
            _member(coord, group)
        metrics, known = Metrics(), _known()
        owned = set(range(n))
        assert sample_groups(client, namespace, n, owned, metrics, known) == []
        assert _gauges(metrics) == (2, 2)
        _member(coord, by_node[up][1])
        nodes._note(client, down, redis.ConnectionError("down (test)"))
        with nodes._skips_lock:
            nodes._failing[client][down].until = time.monotonic() + 3600
        failed = sample_groups(client, namespace, n, owned, metrics, known)
        assert failed and all(_node_of(client, namespace, p, n) == down
                              for piece, _ in failed for p in piece)
        assert _gauges(metrics) == (3, 3)
        with pytest.raises(redis.ConnectionError):  # no cache kept: as before
            sample_groups(client, namespace, n, owned, Metrics())
    finally:
        nodes.forget_failures(client)
        client.close()


def test_sampling_that_fails_is_logged_once_per_outage(own_server, namespace, caplog,
                                                        monkeypatch):
    """Every pass failing (Redis down): one ``sample_error`` warning, then one
    ``sample_error_over`` line when a pass succeeds again. Before, a warning every pass."""
    from rcoord.service import service
    from rcoord.service.service import CoordinatorService, ServiceConfig

    failing = threading.Event()
    failing.set()
    calls: list[int] = []
    real = service.sample_groups

    def sample(*args: Any) -> list[tuple[list[int], BaseException]]:
        calls.append(1)
        if failing.is_set():
            raise redis.ConnectionError("Redis went away (test)")
        return real(*args)

    monkeypatch.setattr(service, "SAMPLE_MS", 10)
    monkeypatch.setattr(service, "sample_groups", sample)
    svc = CoordinatorService(ServiceConfig(redis_url=own_server.url, namespace=namespace,
                                           coordinator_id="sampler", lease_ttl_ms=1000,
                                           retention_check_interval_ms=0)).start()
    def events(name: str) -> list[logging.LogRecord]:
        # (The sampler's own: not another test's service, still ending in this process.)
        return [r for r in caplog.records if getattr(r, "event", None) == name
                and r.thread == svc._sample_thread.ident]

    try:
        with caplog.at_level(logging.INFO, logger="rcoord.service"):
            wait_until(lambda: len(calls) >= 5)
            failing.clear()
            wait_until(lambda: events("sample_error_over"))
        warned = events("sample_error")
        assert len(warned) == 1, [r.getMessage() for r in warned]
    finally:
        svc.stop()


def test_a_partition_no_longer_leased_leaves_the_gauges(redis_server, namespace):
    """The cache of last samples holds the leased partitions only."""
    client = redis_server.client()
    try:
        coord = GroupCoordinator(client, CoordinatorConfig(
            namespace=namespace, group_min_session_timeout_ms=10,
            group_initial_rebalance_delay_ms=0)).start()
        n = coord.config.num_partitions
        _member(coord, "g")
        metrics, known = Metrics(), _known()
        sample_groups(client, namespace, n, set(range(n)), metrics, known)
        assert _gauges(metrics) == (1, 1)
        p = partition_for("g", n)
        sample_groups(client, namespace, n, set(range(n)) - {p}, metrics, known)
        assert _gauges(metrics) == (0, 0) and p not in known
    finally:
        client.close()
