"""The groups-by-state and members gauges of a process whose leases are not confirmed."""

from __future__ import annotations

from typing import Any

from harness import wait_until

from rcoord import CoordinatorConfig, Errors, GroupCoordinator
from rcoord.service import service
from rcoord.service.service import CoordinatorService, ServiceConfig

JOIN: dict[str, Any] = {"protocol_type": "consumer", "protocols": [("range", b"")],
                        "session_timeout_ms": 30_000, "rebalance_timeout_ms": 30_000}


def _gauges(svc: CoordinatorService) -> tuple[float | None, float | None, float | None]:
    registry = svc.metrics.registry
    return (registry.get_sample_value("rcoord_groups", {"state": "Stable"}),
            registry.get_sample_value("rcoord_members"),
            registry.get_sample_value("rcoord_leases_held"))


def test_unconfirmed_leases_leave_the_group_gauges(redis_server, namespace, monkeypatch):
    """Once the leases are not confirmed (here: the timer loop was left behind, which no lease
    round confirms again), the next samples count no group, as ``rcoord_leases_held`` counts no
    lease. Before, the gauges went on counting the groups of the lapsed leases (1 and 1 here,
    beside 0 leases held), which another process may lease and count by then."""
    client = redis_server.client()
    calls: list[int] = []
    real = service.sample_groups

    def sample(*args: Any) -> list[tuple[list[int], BaseException]]:
        calls.append(1)
        return real(*args)

    monkeypatch.setattr(service, "SAMPLE_MS", 10)
    monkeypatch.setattr(service, "sample_groups", sample)
    svc = CoordinatorService(ServiceConfig(redis_url=redis_server.url, namespace=namespace,
                                           coordinator_id="sampler", lease_ttl_ms=3000,
                                           retention_check_interval_ms=0)).start()
    try:
        coord = GroupCoordinator(client, CoordinatorConfig(
            namespace=namespace, group_initial_rebalance_delay_ms=0)).start()
        mid = coord.join_group("g", **JOIN).member_id
        res = coord.join_group("g", mid, **JOIN)
        assert coord.sync_group("g", res.generation_id, mid, assignments={}).error == Errors.NONE
        n = coord.config.num_partitions
        wait_until(lambda: _gauges(svc) == (1, 1, n), timeout_s=20)
        svc._loop_left.set()
        after = len(calls)
        wait_until(lambda: len(calls) >= after + 2, timeout_s=20)  # a whole pass since
        assert _gauges(svc) == (0, 0, 0)
    finally:
        svc.stop()
        client.close()
