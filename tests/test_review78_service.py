"""Review 78 (the coordinator service: leases, the sweeper, deadlines, retention): reproductions
of what it found."""

from __future__ import annotations

import threading
from typing import Any

from harness import wait_until
from test_service import _in_process, _over_maxmemory


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
