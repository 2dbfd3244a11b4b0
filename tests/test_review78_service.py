"""Review 78 (the coordinator service: leases, the sweeper, deadlines, retention): reproductions
of what it found."""

from __future__ import annotations

import threading
from typing import Any

from harness import wait_until
from test_service import _in_process, _over_maxmemory
from test_service_retention import _produce, services  # noqa: F401 - services: the fixture

from rcoord.service.service import CoordinatorService, ServiceConfig
from rcoord.topics import Topics, log_offsets


def test_the_timer_loop_waits_between_turns_while_its_leases_are_unconfirmed(own_server, namespace):
    """Redis out of memory refuses the lease rounds' writes (the registry's ZADD, the lease
    function), so a TTL later the leases are unconfirmed; nothing is due, so every call of the
    timer loop (TIME, the index's ZRANGEs) still succeeds. The loop's wait is bounded by the
    next read of the events (``TAIL_MS`` after the last one), and that read, with its time,
    is skipped while the leases are unconfirmed: the bound stayed negative, and the loop took
    its queue with no wait at all, turn after turn (a core spent for as long as the lease
    rounds failed, as with a master hung, whose rounds take about a TTL)."""
    client = own_server.client()
    svc = _in_process(own_server.url, namespace, "unconfirmed")
    timeouts: list[float | None] = []
    watching = threading.Event()
    real_get = svc._queue.get

    def get(block: bool = True, timeout: float | None = None) -> Any:
        if block and watching.is_set():
            timeouts.append(timeout)
        return real_get(block, timeout)

    svc._queue.get = get  # type: ignore[method-assign]
    runner = threading.Thread(target=svc.run, daemon=True)
    try:
        runner.start()
        wait_until(lambda: svc.leases.owned and svc._leases_confirmed(), timeout_s=10)
        _over_maxmemory(client)
        wait_until(lambda: not svc._leases_confirmed(), timeout_s=10)
        watching.set()
        wait_until(lambda: len(timeouts) >= 8, timeout_s=10)
        waited = [t for t in timeouts[:8] if t is not None and t > 0]
        assert len(waited) >= 4, f"the timer loop's waits: {timeouts[:8]}"
    finally:
        client.config_set("maxmemory", "0")
        svc.stop()
        runner.join(10)
    assert not runner.is_alive()


def test_retention_is_applied_while_redis_is_out_of_memory(own_server, namespace, services):  # noqa: F811 - the fixture
    """Redis out of memory (noeviction) refuses every write that may grow it, the lease
    rounds' included (the registry's ZADD, the lease function), but not a trim: the retention
    of a topic past its retention_records is what frees memory then (``ServerUnavailable``'s
    message says so), and ``Topics.apply_retention`` applies it. The service's retention
    passes apply it only while the leases are confirmed, which they never are while the
    rounds are refused: every pass failed with ``leases_unconfirmed`` and the topic stayed
    untrimmed for as long as Redis was full (Kafka's log retention runs on each broker whatever
    else fails)."""
    client = own_server.client()
    Topics(client, namespace).create("full", 1, retention_records=1)
    _produce(client, namespace, "full", 200)
    svc = CoordinatorService(
        ServiceConfig(
            redis_url=own_server.url,
            namespace=namespace,
            coordinator_id="oom-retention",
            lease_ttl_ms=200,
            wake="index",
            retention_check_interval_ms=2000,
        )
    ).start()
    services.append(svc)
    try:
        _over_maxmemory(client)
        wait_until(lambda: not svc._leases_confirmed(), timeout_s=10)
        passes = svc.metrics.registry.get_sample_value
        wait_until(
            lambda: (
                (passes("rcoord_retention_passes_total", {"result": "failed"}) or 0)
                + (passes("rcoord_retention_passes_total", {"result": "ok"}) or 0)
                >= 2
            ),
            timeout_s=15,
        )
        assert log_offsets(client, namespace, "full", 0) == (199, 200)
    finally:
        client.config_set("maxmemory", "0")
