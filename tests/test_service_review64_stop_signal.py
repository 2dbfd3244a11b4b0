"""``CoordinatorService.stop()`` called by a program's own signal handler, which Python runs on
the main thread between two steps of whatever it is doing: the stop itself, or the start.

Each test calls ``stop()`` from inside a step of the service on the same thread, as such a
handler would at that moment (a second SIGTERM during the stop; a SIGTERM during the start).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from harness import InThread, wait_until

from rcoord.testing.embedded import EmbeddedServer

STOP_WAIT_S = 10.0


def _ours_running(earlier: set[threading.Thread]) -> list[str]:
    return [t.name for t in threading.enumerate()
            if t not in earlier and t.name.startswith("rcoord-") and t.is_alive()]


def test_a_stop_from_a_handler_during_the_stop_returns_and_the_stop_ends(
        own_server: EmbeddedServer, namespace: str) -> None:
    """Before, the inner stop began the whole stop again and waited for ever for the lock the
    interrupted one held while it closed the client (``_closing``): the process hung."""
    from rcoord.service.service import CoordinatorService, ServiceConfig

    svc = CoordinatorService(ServiceConfig(
        redis_url=own_server.url, namespace=namespace, coordinator_id="stop-in-stop",
        lease_ttl_ms=1000, retention_check_interval_ms=0)).start()
    real_close = svc._client.close
    inner: list[str] = []

    def close() -> None:  # (the stop holds ``_closing`` here)
        if not inner:
            inner.append("called")
            svc.stop()  # the handler of a second signal, on this thread
            inner.append("returned")
        real_close()

    svc._client.close = close
    stopping = InThread(svc.stop)
    stopping.thread.join(STOP_WAIT_S)
    assert not stopping.thread.is_alive(), "stop() hung: a stop from a handler inside it"
    assert inner == ["called", "returned"]


def test_a_stop_from_a_handler_during_the_start_is_done_once_by_the_start(
        own_server: EmbeddedServer, namespace: str, caplog: Any) -> None:
    """Before, the handler's stop shut the half-started service down (reading the events of
    an event tail not made yet: a WARNING), the start then went on starting its listener
    and threads, and shut down again: "coordinator stopped" twice."""
    from rcoord.keys import PartitionKeys
    from rcoord.service.service import CoordinatorService, ServiceConfig

    caplog.set_level(logging.INFO, logger="rcoord.service")
    earlier = set(threading.enumerate())
    svc = CoordinatorService(ServiceConfig(
        redis_url=own_server.url, namespace=namespace, coordinator_id="stop-in-start",
        lease_ttl_ms=1000, retention_check_interval_ms=0))
    real_named = svc._named_at_start

    def named_at_start(named: dict[str, Any]) -> dict[str, Any]:
        svc.stop()  # a SIGTERM's handler, on the thread running start()
        return real_named(named)

    svc._named_at_start = named_at_start  # type: ignore[method-assign]
    client = own_server.client()
    try:
        svc.start()
        svc.stop()  # (the program's own stop after start() returned: nothing left to do)
        wait_until(lambda: not _ours_running(earlier), timeout_s=STOP_WAIT_S,
                   why=lambda: f"threads still running: {_ours_running(earlier)}")
        events = [getattr(r, "event", None) for r in caplog.records]
        assert events.count("stopped") == 1
        assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
        n = svc.group_config.num_partitions
        assert [client.get(PartitionKeys(namespace, p, n).lease) for p in range(n)] == [None] * n
    finally:
        client.close()
