"""What a thread ``stop()`` left behind in a call does when that call comes back.

The stop closes the client it connected; a thread still in a call then (the timer loop in a
connect a node does not answer, past ``run()``'s wait) came back to a client that had been
closed, went on with its turn through it (redis-py connects a closed pool again on the next
call), and ended leaving that connection open: a socket the server kept until the collector
found it. Kafka's ``KafkaConsumer.close()`` leaves no connection of its own behind.
"""

from __future__ import annotations

import threading
from typing import Any

from harness import InThread, wait_until

from rcoord.testing.embedded import EmbeddedServer

STOP_WAIT_S = 10.0


def _open_sockets(client: Any) -> int:
    """Connections of ``client``'s pool whose socket is open."""
    pool = client.connection_pool
    with pool._lock:
        connections = [*pool._available_connections, *pool._in_use_connections]
    return sum(1 for c in connections if getattr(c, "_sock", None) is not None)



def test_a_timer_loop_left_behind_leaves_no_connection_open(
        own_server: EmbeddedServer, namespace: str) -> None:
    from rcoord.service.service import CoordinatorService, ServiceConfig

    svc = CoordinatorService(ServiceConfig(
        redis_url=own_server.url, namespace=namespace, coordinator_id="left",
        lease_ttl_ms=1000, retention_check_interval_ms=0)).start()
    hold, entered, released = threading.Event(), threading.Event(), threading.Event()
    real_sync_clock = svc.sweeper.sync_clock

    def sync_clock() -> None:
        # The loop held in a call no socket shut wakes (as one in connect() is), which then
        # comes back and is answered, through the client as it is by then.
        if hold.is_set():
            entered.set()
            released.wait(30)
        real_sync_clock()

    svc.sweeper.sync_clock = sync_clock  # type: ignore[method-assign]
    runner = InThread(svc.run)
    try:
        wait_until(lambda: bool(svc.leases.owned))
        hold.set()
        wait_until(entered.is_set)
        svc._stop.set()
        runner.thread.join(STOP_WAIT_S)
        assert not runner.thread.is_alive(), "run() waited for a loop held in a call"
        svc.stop()
        assert _open_sockets(svc._client) == 0
        hold.clear()
        released.set()
        assert svc._timer_thread is not None
        svc._timer_thread.join(STOP_WAIT_S)
        assert not svc._timer_thread.is_alive()
        assert _open_sockets(svc._client) == 0, (
            "the timer loop left behind reconnected the closed client and left it open")
    finally:
        hold.clear()
        released.set()
        if svc._timer_thread is not None:
            svc._timer_thread.join(STOP_WAIT_S)
        svc.stop()

