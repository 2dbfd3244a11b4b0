"""A stop while the timer loop is stuck connecting to a node that does not answer SYNs (its host
drops them, or its listener's accept queue is full).

The stop's interrupt shuts the sockets of calls in flight (``nodes.disconnect_all``), but a
call still in ``connect()`` has no socket redis-py knows of yet: before, ``run()`` waited for
that call's connect timeout (the URL's ``socket_connect_timeout``, 5 s by default), and a
SIGTERM was not over within Docker's grace when it was set higher. Kafka's
``KafkaConsumer.close(timeout)`` returns once its timer expires whatever is still in flight.
"""

from __future__ import annotations

import contextlib
import logging
import selectors
import socket
import sys
import threading
from collections.abc import Iterator

import pytest
from harness import InThread, RunningService, wait_until

from rcoord.testing.embedded import EmbeddedServer

CONNECT_TIMEOUT_S = 60
"""The service's connect timeout: a stuck connect lasts this long."""
STOP_WAIT_S = 10.0
"""Generous for a loaded machine (the stop's grace is 0.8 s, twice), far below the connect
timeout that the stop waited for before."""


class BlackHoleProxy:
    """A TCP proxy to ``target`` on a loopback port, until ``black_hole()``: then it accepts no
    more connections (its listener's accept queue filled, so the kernel drops new SYNs and a
    connect hangs) and drops the connections it carried."""

    def __init__(self, target: tuple[str, int]) -> None:
        self._target = target
        self._listener = socket.socket()
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(0)
        self.port = self._listener.getsockname()[1]
        self._holding = threading.Event()
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._pairs: list[socket.socket] = []
        self._fillers: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        with selectors.DefaultSelector() as sel:
            sel.register(self._listener, selectors.EVENT_READ)
            while not self._holding.is_set():
                if sel.select(0.05):
                    client, _ = self._listener.accept()
                    upstream = socket.create_connection(self._target)
                    with self._lock:
                        self._pairs += [client, upstream]
                    for a, b in ((client, upstream), (upstream, client)):
                        threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def black_hole(self) -> None:
        self._holding.set()
        self._thread.join()
        # Fill the accept queue: connects complete until it is full; then one hangs.
        while True:
            filler = socket.socket()
            self._fillers.append(filler)
            filler.settimeout(0.5)
            try:
                filler.connect(("127.0.0.1", self.port))
            except TimeoutError:
                break
        with self._lock:
            for s in self._pairs:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._holding.set()
        self._thread.join()
        self._listener.close()  # (a connect still waiting is refused now)
        with self._lock:
            for s in [*self._pairs, *self._fillers]:
                s.close()


@contextlib.contextmanager
def _proxy(server: EmbeddedServer) -> Iterator[BlackHoleProxy]:
    proxy = BlackHoleProxy((server.host, server.port))
    try:
        yield proxy
    finally:
        proxy.close()


def _timer_loop_connecting() -> bool:
    """Some thread runs the timer loop and is in a socket connect under it."""
    for frame in sys._current_frames().values():
        names = set()
        f = frame
        while f is not None:
            names.add(f.f_code.co_name)
            f = f.f_back
        if "_timer_loop" in names and "_connect" in names:
            return True
    return False


def test_a_stop_does_not_wait_for_a_connect_the_node_never_answers(
        own_server: EmbeddedServer, namespace: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="rcoord.service")
    with _proxy(own_server) as proxy:
        url = (f"redis://127.0.0.1:{proxy.port}/0"
               f"?socket_connect_timeout={CONNECT_TIMEOUT_S}")
        running = RunningService(url, namespace, ttl_ms=1000, stop_wait_s=STOP_WAIT_S,
                                 settings={"group_min_session_timeout_ms": 10})
        svc = running.svc
        try:
            wait_until(lambda: bool(svc.leases.owned))
            proxy.black_hole()
            wait_until(_timer_loop_connecting, timeout_s=20)
            assert running.sigterm(), (
                f"the service did not stop within {STOP_WAIT_S} s: its timer loop waited out "
                f"a connect timeout of {CONNECT_TIMEOUT_S} s")
            assert any(getattr(r, "event", None) == "timer_loop_left" for r in caplog.records)
            # What the call left behind comes back to acts on no partition.
            assert svc._leases_held() == 0 and not svc._confirmed_leases()
        finally:
            running.sigterm(wait_s=0)


def test_a_sweeper_left_behind_by_run_expires_nothing(
        own_server: EmbeddedServer, namespace: str) -> None:
    """The call ``run()`` left behind may come back (its connect answered after all): the turn
    it was in must not go on expiring groups of partitions the stop gave up to others."""
    from rcoord import CoordinatorConfig, GroupCoordinator
    from rcoord.service.metrics import Metrics
    from rcoord.service.sweeper import Sweeper

    client = own_server.client()
    try:
        coord = GroupCoordinator(client, CoordinatorConfig(
            namespace=namespace, num_partitions=1, group_min_session_timeout_ms=10,
            group_initial_rebalance_delay_ms=0)).start()
        coord.join_group("g", protocol_type="consumer", protocols=[("range", b"")],
                         session_timeout_ms=10, rebalance_timeout_ms=2000)
        due = coord._keys("g").partition.due

        def due_now() -> int:
            sec, usec = client.time()
            return int(client.zcount(due, 0, int(sec) * 1000 + int(usec) // 1000))

        wait_until(lambda: due_now() == 1)
        left = threading.Event()
        sweeper = Sweeper(client, coord._scripts, namespace, 1, Metrics(), left=left)
        sweeper.sync_clock()
        sweeper.resync({0})
        left.set()
        assert sweeper.sweep_due("deadline") == 0
        assert sweeper.sweep_partition(0, "deadline") == 0
        assert sweeper.expire_group(0, "g", "hint") == 0
        assert due_now() == 1  # still due: nothing was applied
        left.clear()
        assert sweeper.sweep_due("deadline") == 1  # (what the checks above would have done)
        assert due_now() == 0
    finally:
        client.close()


def test_a_connect_is_given_a_lease_ttl_at_most(own_server: EmbeddedServer,
                                                namespace: str) -> None:
    """A connect a node's host never answers (SYNs dropped) is abandoned as soon as a call it
    does not answer: within a lease TTL (at least a second), and never after more than
    ``connect``'s 5 s. Before, 5 s whatever the TTL: with a 1 s TTL every round that met such
    a master took five TTLs. The URL's own ``socket_connect_timeout`` still wins."""
    from rcoord.service.service import CoordinatorService, ServiceConfig

    def connect_timeout(ttl_ms: int, query: str = "") -> float:
        svc = CoordinatorService(ServiceConfig(
            redis_url=own_server.url + query, namespace=namespace, lease_ttl_ms=ttl_ms,
            retention_check_interval_ms=0)).start()
        try:
            return float(svc._client.connection_pool.connection_kwargs["socket_connect_timeout"])
        finally:
            svc.stop()

    assert connect_timeout(1000) == 1.0
    assert connect_timeout(200) == 1.0  # (the socket timeout's floor)
    assert connect_timeout(30_000) == 5.0
    assert connect_timeout(1000, "?socket_connect_timeout=7") == 7.0


def test_the_stop_interrupts_no_more_once_run_left_the_loop_behind(
        own_server: EmbeddedServer, namespace: str) -> None:
    """The stop's watchdog shuts the client's sockets every 100 ms while the timer loop has not
    ended; once ``run()`` has left the loop behind, ``stop()`` releases the leases through that
    client, so the watchdog must stop shutting its sockets (a release call in flight would fail,
    and its leases wait a TTL to lapse). Here the loop is held in a call no socket shut wakes."""
    from rcoord.keys import PartitionKeys
    from rcoord.service.service import CoordinatorService, ServiceConfig

    earlier = set(threading.enumerate())  # (another test's service may still be stopping)
    svc = CoordinatorService(ServiceConfig(
        redis_url=own_server.url, namespace=namespace, coordinator_id="held", lease_ttl_ms=1000,
        retention_check_interval_ms=0)).start()
    hold, entered, held = threading.Event(), threading.Event(), threading.Event()
    real_next_due = svc.sweeper.next_due

    def next_due() -> float:
        if hold.is_set():
            entered.set()
            held.wait(30)
        return real_next_due()

    svc.sweeper.next_due = next_due  # type: ignore[method-assign]
    runner = InThread(svc.run)
    client = own_server.client()
    try:
        wait_until(lambda: bool(svc.leases.owned))
        hold.set()
        wait_until(entered.is_set)
        svc._stop.set()
        runner.thread.join(STOP_WAIT_S)
        assert not runner.thread.is_alive(), "run() waited for a loop held in a call"
        wait_until(lambda: not any(t.name == "rcoord-stop" and t.is_alive() and t not in earlier
                                   for t in threading.enumerate()), timeout_s=STOP_WAIT_S)
        svc.stop()
        n = svc.group_config.num_partitions
        assert [client.get(PartitionKeys(namespace, p, n).lease) for p in range(n)] == [None] * n
    finally:
        hold.clear()
        held.set()
        # The loop let go ends its turn through the client the stop closed, connecting it
        # again: stopped once more after that, the stop closes that connection too, instead of
        # leaving it to the collector in some later test (half the runs of this file).
        if svc._timer_thread is not None:
            svc._timer_thread.join(STOP_WAIT_S)
        svc.stop()
        client.close()


def test_a_second_interrupt_while_run_waits_for_the_loop_still_marks_it_left(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A KeyboardInterrupt (a second Ctrl-C) that ends ``run()``'s wait for the loop left the
    loop behind unmarked: it went on acting on the partitions ``stop()`` then released, and the
    stop's watchdog went on shutting the sockets under that release. No Redis needed: the loop
    is held in a call, the stop flag set, and the wait interrupted."""
    from rcoord.service import service as service_module
    from rcoord.service.service import CoordinatorService, ServiceConfig

    svc = CoordinatorService(ServiceConfig(redis_url="redis://127.0.0.1:1/0"))
    held, release = threading.Event(), threading.Event()

    def timer_loop(index: bool) -> None:
        held.set()
        release.wait(30)

    monkeypatch.setattr(svc, "_timer_loop", timer_loop)

    class Interrupted(threading.Event):
        def wait(self, timeout: float | None = None) -> bool:
            if timeout == service_module.LOOP_LEFT_MS / 1000:
                raise KeyboardInterrupt
            return super().wait(timeout)

    svc._loop_ended = Interrupted()
    svc._stop.set()
    try:
        with pytest.raises(KeyboardInterrupt):
            svc.run()
        assert held.wait(30)
        assert svc._loop_left.is_set()
        assert not svc._leases_confirmed()
    finally:
        release.set()
        assert svc._timer_thread is not None
        svc._timer_thread.join(30)
