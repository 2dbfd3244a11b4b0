"""What a thread ``stop()`` left behind in a call does when that call comes back.

The stop closes the client it connected; a thread still in a call then (the timer loop in a
connect a node does not answer, past ``run()``'s wait) came back to a client that had been
closed, went on with its turn through it (redis-py connects a closed pool again on the next
call), and ended leaving that connection open: a socket the server kept until the collector
found it. Kafka's ``KafkaConsumer.close()`` leaves no connection of its own behind.
"""

from __future__ import annotations

import sys
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


class _HeldClock:
    """The service's timer loop held inside a call (its ``sync_clock``) once ``catch()`` is
    called, until ``let_go()``: a call no socket shut wakes (as one in connect() is), which
    then comes back and is answered, through the client as it is by then."""

    def __init__(self, svc: Any) -> None:
        self.hold, self.entered, self.released = (
            threading.Event(), threading.Event(), threading.Event())
        real = svc.sweeper.sync_clock

        def sync_clock() -> None:
            if self.hold.is_set():
                self.entered.set()
                self.released.wait(30)
            real()

        svc.sweeper.sync_clock = sync_clock

    def catch(self) -> None:
        """Hold the loop's next call, and wait until it is held."""
        self.hold.set()
        wait_until(self.entered.is_set)

    def let_go(self) -> None:
        self.hold.clear()
        self.released.set()


def _stop_after(svc: Any, clock: _HeldClock) -> None:
    """A test's clean-up: let the held loop go, wait for it, stop the service."""
    clock.let_go()
    if svc._timer_thread is not None:
        svc._timer_thread.join(STOP_WAIT_S)
    svc.stop()



def _hold_start(svc: Any, hold_s: float) -> tuple[threading.Event, threading.Event]:
    """Hold ``svc.start()`` in its settings read (``_named_at_start``): the first event is set
    once it is held there, and it goes on once the second is set (or after ``hold_s``)."""
    entered, released = threading.Event(), threading.Event()
    real_named = svc._named_at_start

    def named_at_start(named: dict[str, Any]) -> dict[str, Any]:
        entered.set()
        released.wait(hold_s)
        return real_named(named)

    svc._named_at_start = named_at_start
    return entered, released


def _nothing_left_running(svc: Any, client: Any, namespace: str,
                          earlier: set[threading.Thread]) -> None:
    """Every ``rcoord-`` thread started since ``earlier`` ended, and every lease released."""
    from rcoord.keys import PartitionKeys

    def ours_running() -> list[str]:
        return [t.name for t in threading.enumerate()
                if t not in earlier and t.name.startswith("rcoord-") and t.is_alive()]

    wait_until(lambda: not ours_running(), timeout_s=STOP_WAIT_S,
               why=lambda: f"threads still running after the stop: {ours_running()}")
    n = svc.group_config.num_partitions
    assert [client.get(PartitionKeys(namespace, p, n).lease) for p in range(n)] == [None] * n


def test_a_timer_loop_left_behind_leaves_no_connection_open(
        own_server: EmbeddedServer, namespace: str) -> None:
    from rcoord.service.service import CoordinatorService, ServiceConfig

    svc = CoordinatorService(ServiceConfig(
        redis_url=own_server.url, namespace=namespace, coordinator_id="left",
        lease_ttl_ms=1000, retention_check_interval_ms=0)).start()
    clock = _HeldClock(svc)
    runner = InThread(svc.run)
    try:
        wait_until(lambda: bool(svc.leases.owned))
        clock.catch()
        svc._stop.set()
        runner.thread.join(STOP_WAIT_S)
        assert not runner.thread.is_alive(), "run() waited for a loop held in a call"
        svc.stop()
        assert _open_sockets(svc._client) == 0
        clock.let_go()
        assert svc._timer_thread is not None
        svc._timer_thread.join(STOP_WAIT_S)
        assert not svc._timer_thread.is_alive()
        assert _open_sockets(svc._client) == 0, (
            "the timer loop left behind reconnected the closed client and left it open")
    finally:
        _stop_after(svc, clock)



def test_a_stop_while_starting_leaves_nothing_running(
        own_server: EmbeddedServer, namespace: str) -> None:
    """``stop()`` from another thread while ``start()`` runs (a program's shutdown path): the
    stop found no listener nor threads yet and closed the client; the start then went on,
    starting the listener (its threads reconnecting the closed client for ever) and taking
    leases nobody released. The stop now waits for the start to end, then undoes all of it."""
    from rcoord.service.service import CoordinatorService, ServiceConfig

    earlier = set(threading.enumerate())
    svc = CoordinatorService(ServiceConfig(
        redis_url=own_server.url, namespace=namespace, coordinator_id="stopped-starting",
        lease_ttl_ms=1000, retention_check_interval_ms=0, metrics_port=0))
    entered, released = _hold_start(svc, 30)
    starting = InThread(svc.start)
    client = own_server.client()
    try:
        wait_until(entered.is_set)
        stopping = InThread(svc.stop)

        def stop_done_or_waiting() -> bool:
            # (Ended, or in stop() itself with the stop flag set: waiting for the start.)
            frame = sys._current_frames().get(stopping.thread.ident or 0)
            return (not stopping.thread.is_alive()
                    or (frame is not None and frame.f_code.co_name == "stop"
                        and svc._stop.is_set()))

        wait_until(stop_done_or_waiting)
        released.set()
        starting.thread.join(STOP_WAIT_S)
        stopping.thread.join(STOP_WAIT_S)
        assert not starting.thread.is_alive() and not stopping.thread.is_alive()

        _nothing_left_running(svc, client, namespace, earlier)
    finally:
        released.set()
        svc.stop()
        client.close()


def test_the_stop_interrupting_the_loop_ends_the_listener_quietly(
        own_server: EmbeddedServer, namespace: str, caplog: Any) -> None:
    """The stop's watchdog shuts the client's sockets under the timer loop's call; the
    listener's subscriptions are on that client too. Before, each subscription then logged a
    warning that it had lost its connection (on a graceful stop) and subscribed again."""
    import logging

    from rcoord.service.service import CoordinatorService, ServiceConfig

    caplog.set_level(logging.INFO, logger="rcoord.service")
    svc = CoordinatorService(ServiceConfig(
        redis_url=own_server.url, namespace=namespace, coordinator_id="quiet",
        lease_ttl_ms=1000, retention_check_interval_ms=0)).start()
    clock = _HeldClock(svc)
    runner = InThread(svc.run)
    try:
        wait_until(lambda: bool(svc.leases.owned and svc.listener
                                and svc.listener.hint_nodes))
        clock.catch()
        svc._stop.set()
        runner.thread.join(STOP_WAIT_S)
        assert not runner.thread.is_alive()
        assert svc._interrupted  # (the watchdog shut the sockets)
        svc.stop()
        noisy = [r.getMessage() for r in caplog.records if getattr(r, "event", None) in (
            "listener_reconnect", "listener_error", "keyspace_lost")]
        assert noisy == []
    finally:
        _stop_after(svc, clock)


def test_a_stop_does_not_wait_for_a_start_stuck_in_a_call(
        own_server: EmbeddedServer, namespace: str) -> None:
    """A start held in a call (a node that does not answer, through a client passed in
    without a socket timeout) is waited for the stop's grace only; that start then stops
    what it started as it ends."""
    from rcoord.service.service import CoordinatorService, ServiceConfig

    earlier = set(threading.enumerate())
    svc = CoordinatorService(ServiceConfig(
        redis_url=own_server.url, namespace=namespace, coordinator_id="stuck-starting",
        lease_ttl_ms=1000, retention_check_interval_ms=0))
    entered, released = _hold_start(svc, 60)
    starting = InThread(svc.start)
    client = own_server.client()
    try:
        wait_until(entered.is_set)
        stopping = InThread(svc.stop)
        stopping.thread.join(STOP_WAIT_S)
        assert not stopping.thread.is_alive(), "stop() waited for a start held in a call"
        released.set()
        starting.thread.join(STOP_WAIT_S)
        assert not starting.thread.is_alive()

        _nothing_left_running(svc, client, namespace, earlier)
        assert _open_sockets(svc._client) == 0
    finally:
        released.set()
        starting.thread.join(STOP_WAIT_S)
        svc.stop()
        client.close()


def test_the_stop_watchdog_shuts_no_socket_once_the_lease_release_began(
        own_server: EmbeddedServer, namespace: str) -> None:
    """The stop's watchdog shuts the client's sockets under a timer loop held in a call; that
    call then fails, the loop ends, ``run()`` returns and the caller's ``stop()`` releases the
    leases. Before, the watchdog went on with the shut it was in the middle of (or began one
    more, the loop having ended just after its last look), under the release's connection
    just taken: the release failed and the leases waited a TTL for another coordinator. Here
    the watchdog's shut is held (the point where the loop ends under it) until the release
    has begun or waits for the watchdog's lock; no shut may run while the release does."""
    from rcoord.keys import PartitionKeys
    from rcoord.service import service as service_module
    from rcoord.service.service import CoordinatorService, ServiceConfig

    svc = CoordinatorService(ServiceConfig(
        redis_url=own_server.url, namespace=namespace, coordinator_id="release-kept",
        lease_ttl_ms=1000, retention_check_interval_ms=0)).start()
    clock = _HeldClock(svc)
    # ``step``: the release began (before) or waits for the watchdog's lock (now).
    step, shut_done = threading.Event(), threading.Event()
    releasing, released = threading.Event(), threading.Event()
    overlaps: list[str] = []
    shuts = 0
    real_disconnect = service_module.disconnect_all
    real_release = svc.leases.release_all

    def disconnect_all(client: Any) -> None:
        nonlocal shuts
        shuts += 1
        if shuts == 1:
            clock.let_go()  # the held call comes back (as the shut fails it): the loop ends
            step.wait(STOP_WAIT_S)
        if releasing.is_set() and not released.is_set():
            overlaps.append(f"shut {shuts} during the release")
        real_disconnect(client)
        shut_done.set()

    def release_all(*args: Any, **kwargs: Any) -> None:
        releasing.set()
        step.set()
        shut_done.wait(STOP_WAIT_S)
        try:
            real_release(*args, **kwargs)
        finally:
            released.set()

    class WatchedLock:
        """The watchdog's lock, saying when the release thread asks for it."""

        def __init__(self, lock: Any) -> None:
            self._lock = lock

        def __enter__(self) -> Any:
            if threading.current_thread().name == "rcoord-leave":
                step.set()
            return self._lock.__enter__()

        def __exit__(self, *exc: object) -> Any:
            return self._lock.__exit__(*exc)

    service_module.disconnect_all = disconnect_all  # type: ignore[assignment]
    svc.leases.release_all = release_all  # type: ignore[method-assign]
    svc._interrupting = WatchedLock(svc._interrupting)  # type: ignore[assignment]
    client = own_server.client()

    def run_then_stop() -> None:  # (as the CLI does)
        svc.run()
        svc.stop()

    try:
        runner = InThread(run_then_stop)
        wait_until(lambda: bool(svc.leases.owned))
        clock.catch()
        svc._stop.set()
        runner.thread.join(STOP_WAIT_S)
        assert not runner.thread.is_alive()
        assert shuts >= 1 and released.is_set()
        assert overlaps == []
        n = svc.group_config.num_partitions
        assert [client.get(PartitionKeys(namespace, p, n).lease) for p in range(n)] == [None] * n
    finally:
        service_module.disconnect_all = real_disconnect
        client.close()
        _stop_after(svc, clock)
