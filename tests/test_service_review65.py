"""Review 65 of the coordinator service's stop: a program's signal handler calling ``stop()``
while its thread holds the stop flag's lock, and ``stop()`` from another thread while ``run()``
runs with the timer loop in a call."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from typing import Any

from harness import InThread, wait_until
from test_service_stop_left_loop import _HeldClock

from rcoord.testing.embedded import EmbeddedServer

STOP_WAIT_S = 10.0


def _claimed_elsewhere(client: Any, namespace: str, coordinator_id: str) -> Any:
    """Another live process holds ``coordinator_id`` (a minute's claim, on this machine with no
    machine named, so never taken over): a service's ``start()`` waits on its stop flag for
    the claim to lapse, where these tests' handlers stop it."""
    from rcoord.scripts import Scripts
    from rcoord.service.leases import LeaseKeeper

    scripts = Scripts(client)
    scripts.load()
    other = LeaseKeeper(client, scripts, namespace, 4, coordinator_id, 60_000,
                        f"{socket.gethostname()}-1-0123456789ab")
    other.claim_id(threading.Event())
    other.register()
    return other


def _stop_inside_the_flags(svc: Any, method: str,
                           seen: Callable[[], Any] | None = None) -> list[Any]:
    """The stop flag's ``method`` (which runs holding the flag's lock) calls ``svc.stop()``
    the first time, as a signal's handler that fired there, on that thread, does. What it
    notes: ``called``, then ``returned`` once that stop came back, then what ``seen()``
    returns then (if given)."""
    cond = svc._stop._cond
    real = getattr(cond, method)
    handled: list[Any] = []

    def inside(*args: Any) -> Any:
        if not handled:
            handled.append("called")
            svc.stop()
            handled.append("returned")
            if seen is not None:
                handled.append(seen())
        return real(*args)

    setattr(cond, method, inside)
    return handled


def _noted_at_release(svc: Any, note: Callable[[], bool]) -> list[bool]:
    """``note()`` as each release of the leases began: whether the timer loop had ended (or
    was marked left behind) before the leases went, which is what a stop must wait for."""
    noted: list[bool] = []
    real = svc.leases.release_all

    def release_all(*args: Any, **kwargs: Any) -> None:
        noted.append(note())
        real(*args, **kwargs)

    svc.leases.release_all = release_all
    return noted


class _HeldInABlockingRead:
    """The service's timer loop held, once ``catch()`` is called, in a blocking read a lease
    TTL long inside its next clock sync: a call a socket shut fails (the watchdog's interrupt),
    or ``let_go()``."""

    def __init__(self, svc: Any, client: Any, namespace: str) -> None:
        self.svc, self.client = svc, client
        self.blocked = f"{namespace}:test:blocked"
        self.hold, self.entered = threading.Event(), threading.Event()
        real = svc.sweeper.sync_clock

        def sync_clock() -> None:
            if self.hold.is_set():
                self.hold.clear()
                self.entered.set()
                svc._client.blpop([self.blocked], timeout=25)
            real()

        svc.sweeper.sync_clock = sync_clock

    def catch(self) -> None:
        """Once the service owns its leases, hold the loop's next call; wait until the server
        has it blocked."""
        wait_until(lambda: bool(self.svc.leases.owned))
        self.hold.set()
        wait_until(self.entered.is_set)
        wait_until(lambda: any(c.get("cmd") == "blpop" for c in self.client.client_list()))

    def let_go(self) -> None:
        self.client.rpush(self.blocked, "go")


def test_a_stop_from_a_handler_inside_the_claim_wait_ends_the_start(
        own_server: EmbeddedServer, namespace: str) -> None:
    """``start()`` waits on the stop flag for a claimed id to lapse; a handler that fired
    while its thread held the flag's lock (inside the flag's own wait) called ``stop()``,
    whose ``set()`` waited for ever for that lock. The stop now ends the wait: the start
    raises ``StoppedBeforeClaim`` having taken nothing."""
    from rcoord.service.leases import StoppedBeforeClaim
    from rcoord.service.service import CoordinatorService, ServiceConfig

    client = own_server.client()
    other = _claimed_elsewhere(client, namespace, "held-id")
    svc = CoordinatorService(ServiceConfig(
        redis_url=own_server.url, namespace=namespace, coordinator_id="held-id",
        lease_ttl_ms=1000, settings={"num_partitions": 4}, retention_check_interval_ms=0))
    handled = _stop_inside_the_flags(svc, "wait")  # (on the thread running start())
    try:
        starting = InThread(svc.start)
        starting.thread.join(STOP_WAIT_S)
        assert not starting.thread.is_alive(), "start() hung: a stop from a handler in its wait"
        assert handled == ["called", "returned"]
        assert [type(o) for o in starting.outcome] == [StoppedBeforeClaim]
        assert client.get(other.claim_key) == other.incarnation.encode()
    finally:
        client.close()


def test_a_stop_from_a_handler_inside_the_stops_own_flag_set_ends(
        own_server: EmbeddedServer, namespace: str, caplog: Any) -> None:
    """A program's ``stop()`` sets the stop flag first; a second handler's ``stop()`` that
    fired while that ``set()`` held the flag's lock waited for ever for it. Now the stop ends,
    once, and releases the leases.

    The handler's stop leaves the shutdown to the interrupted one, which goes on as the
    handler returns (no "stopped" logged and every lease held when it returned). Before, it
    ran the whole shutdown inside the handler with the flag's lock held, so the flag's other
    waiters (the metrics sampler, in a 5 s wait) woke only after it."""
    import logging

    from rcoord.keys import PartitionKeys
    from rcoord.service.service import CoordinatorService, ServiceConfig

    caplog.set_level(logging.INFO, logger="rcoord.service")
    svc = CoordinatorService(ServiceConfig(
        redis_url=own_server.url, namespace=namespace, coordinator_id="stop-in-set",
        lease_ttl_ms=1000, retention_check_interval_ms=0)).start()
    client = own_server.client()
    n = svc.group_config.num_partitions
    leases = [PartitionKeys(namespace, p, n).lease for p in range(n)]
    wait_until(lambda: all(client.get(k) is not None for k in leases))

    def seen() -> tuple[int, int]:
        stopped = [getattr(r, "event", None) for r in caplog.records].count("stopped")
        return stopped, sum(client.get(k) is not None for k in leases)

    handled = _stop_inside_the_flags(svc, "notify_all", seen)  # (a second signal's handler)
    try:
        stopping = InThread(svc.stop)
        stopping.thread.join(STOP_WAIT_S)
        assert not stopping.thread.is_alive(), "stop() hung: a stop from a handler in its set"
        assert handled == ["called", "returned", (0, n)]
        assert [getattr(r, "event", None) for r in caplog.records].count("stopped") == 1
        assert [client.get(k) for k in leases] == [None] * n
    finally:
        client.close()


def test_a_handlers_stop_marked_before_the_main_threads_wait_ends_that_wait(
        own_server: EmbeddedServer, namespace: str) -> None:
    """On the main thread (where handlers run), a stop marked by a handler just before the
    flag's wait began (the lock held, the wait not yet listening) ends that wait within a
    slice, not after it: here the claim wait's (a quarter of a day's TTL). A thread sets the
    flag after ``STOP_WAIT_S`` if nothing else ended the wait."""
    from rcoord.service.leases import StoppedBeforeClaim
    from rcoord.service.service import CoordinatorService, ServiceConfig

    assert threading.current_thread() is threading.main_thread()
    client = own_server.client()
    _claimed_elsewhere(client, namespace, "held-main")
    svc = CoordinatorService(ServiceConfig(
        redis_url=own_server.url, namespace=namespace, coordinator_id="held-main",
        lease_ttl_ms=86_400_000, settings={"num_partitions": 4},
        retention_check_interval_ms=0))
    _stop_inside_the_flags(svc, "wait")
    rescued: list[str] = []

    def rescue() -> None:
        rescued.append("the wait went on after the handler's stop")
        svc._stop.set()

    timer = threading.Timer(STOP_WAIT_S, rescue)
    timer.start()
    try:
        outcome: BaseException | None = None
        try:
            svc.start()
        except StoppedBeforeClaim as exc:
            outcome = exc
        assert rescued == []
        assert isinstance(outcome, StoppedBeforeClaim)
    finally:
        timer.cancel()
        client.close()


def test_a_stop_from_another_thread_interrupts_the_loop_run_still_runs(
        own_server: EmbeddedServer, namespace: str, caplog: Any) -> None:
    """``stop()`` from another thread while ``run()`` runs, the timer loop held in a call a
    socket shut fails (a blocking read a lease TTL long). Before, the stop began the lease
    release at once, under the loop still in its call (which came back to sweep partitions
    released), and the watchdog, which shuts no socket once the release has begun, never
    interrupted the loop (the stop's close of the client closed its socket under it, or,
    through a client passed in, ``run()`` left it behind). Now the release waits for the loop,
    which the watchdog interrupts; the leases are released, nothing is left behind."""
    import logging

    from rcoord.keys import PartitionKeys
    from rcoord.service.service import CoordinatorService, ServiceConfig

    caplog.set_level(logging.INFO, logger="rcoord.service")
    svc = CoordinatorService(ServiceConfig(
        redis_url=own_server.url, namespace=namespace, coordinator_id="stop-while-running",
        lease_ttl_ms=30_000, retention_check_interval_ms=0)).start()
    loop_ended_at_release = _noted_at_release(svc, svc._loop_ended.is_set)
    client = own_server.client()
    held = _HeldInABlockingRead(svc, client, namespace)
    try:
        runner = InThread(svc.run)
        held.catch()
        svc.stop()  # (from this thread; run() runs on another)
        runner.thread.join(STOP_WAIT_S)
        assert not runner.thread.is_alive()
        assert loop_ended_at_release == [True], "the leases were released under a live loop"
        events = [getattr(r, "event", None) for r in caplog.records]
        assert "timer_loop_left" not in events and not svc._loop_left.is_set()
        assert svc._interrupted  # (the watchdog shut the loop's socket)
        assert "release_failed" not in events
        n = svc.group_config.num_partitions
        assert [client.get(PartitionKeys(namespace, p, n).lease) for p in range(n)] == [None] * n
    finally:
        held.let_go()
        client.close()


def test_a_stop_from_another_thread_marks_a_loop_it_cannot_interrupt_before_releasing(
        own_server: EmbeddedServer, namespace: str) -> None:
    """Through a client passed in (whose sockets a stop leaves alone), a loop held in a call
    cannot be interrupted. Before, a ``stop()`` from another thread released the leases at
    once, the loop not yet marked left behind: coming back, it acted on partitions released.
    Now the release waits until ``run()``'s wait marks it (``_loop_left``)."""
    from rcoord.service.service import CoordinatorService, ServiceConfig

    passed = own_server.client()
    svc = CoordinatorService(ServiceConfig(
        redis_url=own_server.url, namespace=namespace, coordinator_id="stop-passed-client",
        lease_ttl_ms=30_000, retention_check_interval_ms=0), client=passed).start()
    clock = _HeldClock(svc)  # (a call no socket shut wakes)
    marked_at_release = _noted_at_release(
        svc, lambda: svc._loop_ended.is_set() or svc._loop_left.is_set())
    try:
        runner = InThread(svc.run)
        wait_until(lambda: bool(svc.leases.owned))
        clock.catch()
        svc.stop()  # (from this thread; run() runs on another)
        runner.thread.join(STOP_WAIT_S)
        assert not runner.thread.is_alive()
        assert marked_at_release == [True], "the leases were released under an unmarked loop"
    finally:
        clock.let_go()
        if svc._timer_thread is not None:
            svc._timer_thread.join(STOP_WAIT_S)
        passed.close()


def test_a_stop_from_a_handler_on_runs_thread_is_done_by_run_after_the_loop(
        own_server: EmbeddedServer, namespace: str, caplog: Any) -> None:
    """A program's handler calling ``stop()`` on the thread in ``run()`` (between two of its
    polls), the timer loop held in a call a socket shut fails. Before, the handler shut the
    service down there and then: it released the leases under the loop still in its call
    (the watchdog, stopped by the release, never interrupted it). Now ``run()`` stops the
    service as it returns, after the loop (interrupted) has ended; once."""
    import logging

    from rcoord.keys import PartitionKeys
    from rcoord.service.service import CoordinatorService, ServiceConfig

    caplog.set_level(logging.INFO, logger="rcoord.service")
    svc = CoordinatorService(ServiceConfig(
        redis_url=own_server.url, namespace=namespace, coordinator_id="stop-in-run",
        lease_ttl_ms=30_000, retention_check_interval_ms=0)).start()
    loop_ended_at_release = _noted_at_release(svc, svc._loop_ended.is_set)
    signalled, handled = threading.Event(), threading.Event()
    real_wait = svc._loop_ended.wait

    def wait(timeout: float | None = None) -> bool:  # (run()'s poll, on its thread)
        if (threading.current_thread().name == "runs" and signalled.is_set()
                and not handled.is_set()):
            handled.set()
            svc.stop()  # a SIGTERM's handler, on the thread in run()
        return real_wait(timeout)

    svc._loop_ended.wait = wait  # type: ignore[method-assign]
    client = own_server.client()
    held = _HeldInABlockingRead(svc, client, namespace)
    try:
        runner = threading.Thread(target=svc.run, name="runs", daemon=True)
        runner.start()
        held.catch()
        signalled.set()
        runner.join(STOP_WAIT_S)
        assert not runner.is_alive()
        assert handled.is_set()
        assert loop_ended_at_release == [True], "the leases were released under a live loop"
        svc.stop()  # (the program's own, after run() returned: nothing left to do)
        events = [getattr(r, "event", None) for r in caplog.records]
        assert events.count("stopped") == 1 and "timer_loop_left" not in events
        n = svc.group_config.num_partitions
        assert [client.get(PartitionKeys(namespace, p, n).lease) for p in range(n)] == [None] * n
    finally:
        held.let_go()
        client.close()
