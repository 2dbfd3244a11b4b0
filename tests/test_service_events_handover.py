"""The coordinator service's event log across a change of holder: a pause past the lease TTL, a
hand-over, a first holder that read nothing yet; and what it reports while its leases lapse.

Each event in a partition's stream is logged (and counted) once by the processes that held the
partition, not twice and not never. The services run in this process (small lease TTLs); a
pause is a lease round or a timer-loop call held until the test lets it go.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from harness import EventLog, handling, wait_until

from rcoord import CoordinatorConfig, Errors, GroupCoordinator
from rcoord.service.leases import plan
from rcoord.service.metrics import Metrics
from rcoord.service.observe import EventTail

JOIN: dict[str, Any] = {"protocol_type": "consumer", "protocols": [("range", b"")],
                        "session_timeout_ms": 30_000, "rebalance_timeout_ms": 2000}
"""Sessions far longer than a test: no expiry adds events while it counts them."""
TTL_MS = 200


def _coord(client: Any, namespace: str) -> GroupCoordinator:
    return GroupCoordinator(client, CoordinatorConfig(
        namespace=namespace, num_partitions=1, group_min_session_timeout_ms=10,
        group_initial_rebalance_delay_ms=0)).start()


def _lonely_member(coord: GroupCoordinator, group: str) -> None:
    """A group of one member, Stable: its transitions are appended to the partition's events."""
    mid = coord.join_group(group, **JOIN).member_id
    res = coord.join_group(group, mid, **JOIN)
    assert coord.sync_group(group, res.generation_id, mid, assignments={}).error == Errors.NONE


def _service(url: str, namespace: str, cid: str) -> Any:
    from rcoord.service.service import CoordinatorService, ServiceConfig

    return CoordinatorService(ServiceConfig(
        redis_url=url, namespace=namespace, coordinator_id=cid, lease_ttl_ms=TTL_MS, wake="index",
        settings={"num_partitions": 1}, retention_check_interval_ms=0)).start()


def _logged(metrics: Metrics) -> int:
    """Events a process logged and counted (transitions and expiries)."""
    total = 0.0
    for counter in (metrics.transitions, metrics.members_expired):
        for family in counter.collect():
            total += sum(s.value for s in family.samples if s.name.endswith("_total"))
    return int(total)


def _ids_ranked(first_wanted: bool) -> tuple[str, str]:
    """Two coordinator ids: the plan of one partition gives it to the second of them (to the
    first if ``first_wanted``)."""
    for i in range(100):
        a, b = f"a{i}", f"b{i}"
        if (plan(1, sorted([a, b]))[0] == a) == first_wanted:
            return a, b
    raise AssertionError("no such pair")


class _Gate:
    """Holds the calls of one thread (or any thread) to a method while closed: a pause there."""

    def __init__(self, real: Callable[..., Any], thread: Callable[[], Any] | None = None) -> None:
        self.real, self.thread = real, thread
        self.closed, self.entered, self.opened = False, threading.Event(), threading.Event()
        self.done = 0

    def close(self) -> None:
        self.opened.clear()
        self.entered.clear()
        self.closed = True

    def open(self) -> None:
        self.closed = False
        self.opened.set()

    def __call__(self, *args: Any, **kw: Any) -> Any:
        if self.closed and (self.thread is None or threading.current_thread() is self.thread()):
            self.entered.set()
            self.opened.wait(30)
        try:
            return self.real(*args, **kw)
        finally:
            self.done += 1


@pytest.fixture
def services() -> Iterator[list[tuple[Any, threading.Thread]]]:
    """Services started by the test, each with its timer loop's thread; stopped after it."""
    started: list[tuple[Any, threading.Thread]] = []
    yield started
    for svc, thread in started:
        _stop(svc)
        thread.join(15)


def _stop(svc: Any) -> None:
    for gate in svc._test_gates:
        gate.open()
    if not svc._stop.is_set():
        svc.stop()


def _run(services: list[tuple[Any, threading.Thread]], svc: Any) -> Any:
    thread = threading.Thread(target=svc.run, daemon=True)
    services.append((svc, thread))
    svc._test_gates = []
    thread.start()
    return svc


def _gate(svc: Any, obj: Any, name: str, thread: Callable[[], Any] | None = None) -> _Gate:
    gate = _Gate(getattr(obj, name), thread)
    setattr(obj, name, gate)
    svc._test_gates.append(gate)
    return gate


def _tail_stored(client: Any, coord: GroupCoordinator) -> bytes | None:
    value = client.get(coord._keys("g").partition.tail)
    return bytes(value) if value is not None else None


def _latest(client: Any, coord: GroupCoordinator) -> bytes | None:
    last = client.xrevrange(coord._keys("g").partition.events, count=1)
    return bytes(last[0][0]) if last else None


# -- EventTail ------------------------------------------------------------------------------------


def test_a_partitions_first_holder_stores_where_it_starts(own_server, namespace):
    """A first holder that starts on an empty stream and loses the partition before its next
    read: the next holder logs everything since (before, the first holder stored no position
    until it had read an event, and the next one started at the stream's end: never logged)."""
    client = own_server.client()
    coord = _coord(client, namespace)
    first = EventTail(client, namespace, 1, Metrics())
    assert first.poll({0}) == 0  # starts at the (empty) stream's end, and stores that
    assert client.get(coord._keys("g").partition.tail) is not None
    _lonely_member(coord, "g")  # the first holder dies, pauses or hands over before reading
    events = client.xlen(coord._keys("g").partition.events)
    assert events > 0
    metrics = Metrics()
    second = EventTail(client, namespace, 1, metrics)
    assert second.poll({0}) + second.poll({0}) == events
    assert _logged(metrics) == events


def test_a_holder_that_goes_on_after_another_logged_the_events_does_not_log_them_again(
        own_server, namespace):
    """A holder paused past its TTL goes on from its own position: what the partition's holder
    meanwhile logged (its stored position says so) is not logged a second time; what neither
    read yet is logged by the one that reads first, once."""
    client = own_server.client()
    coord = _coord(client, namespace)
    m1, m2 = Metrics(), Metrics()
    first, second = EventTail(client, namespace, 1, m1), EventTail(client, namespace, 1, m2)
    first.poll({0})
    _lonely_member(coord, "g")
    assert first.poll({0}) > 0
    logged_first = _logged(m1)
    _lonely_member(coord, "h")  # the first holder pauses; the second takes the partition
    second.poll({0})
    assert second.poll({0}) > 0
    assert first.poll({0}) == 0  # resumed: logged already (before: logged a second time)
    _lonely_member(coord, "i")  # both read it (the first one before its lease round says no)
    assert first.poll({0}) + second.poll({0}) > 0
    assert second.poll({0}) == 0 and first.poll({0}) == 0
    assert _logged(m1) > logged_first
    assert _logged(m1) + _logged(m2) == client.xlen(coord._keys("g").partition.events)


def test_two_reads_of_one_tail_at_once_log_each_event_once(own_server, namespace):
    """The stop's last read of the events may come while the timer loop is in one (a stop()
    from another thread than run()'s, or a timer loop run() left behind): the second read
    went on from where the first was in its logging (a backlog logged line by line), and both
    logged and counted the rest, twice in this one process. Here a second poll starts while
    the first one logs its first event."""
    client = own_server.client()
    coord = _coord(client, namespace)
    metrics = Metrics()
    tail = EventTail(client, namespace, 1, metrics)
    tail.poll({0})
    _lonely_member(coord, "g")
    events = client.xlen(coord._keys("g").partition.events)
    assert events > 1
    armed = [True]

    class SecondRead(logging.Handler):
        def createLock(self) -> None:
            self.lock = None  # (the second read logs through it while the first is in emit)

        def emit(self, record: logging.LogRecord) -> None:
            if armed and threading.current_thread() is main:
                armed.clear()
                other = threading.Thread(target=tail.poll, args=({0},))
                other.start()
                other.join(30)
                assert not other.is_alive()

    main = threading.current_thread()
    groups_log = logging.getLogger("rcoord.groups")
    handler, level = SecondRead(), groups_log.level
    groups_log.addHandler(handler)
    groups_log.setLevel(logging.INFO)
    try:
        tail.poll({0})
        tail.poll({0})  # (what the second one left unread)
    finally:
        groups_log.removeHandler(handler)
        groups_log.setLevel(level)
    assert not armed
    assert _logged(metrics) == events


# -- the service ----------------------------------------------------------------------------------


def test_a_coordinator_resumed_after_its_leases_lapsed_does_not_log_their_events_again(
        own_server, namespace, services):
    """A pauses past its TTL just before its timer loop reads the events; B takes the partition
    over and logs what happens meanwhile; A's first lease round after the pause holds nothing,
    and only then does A's loop go on (before: it read the partition it held before the pause
    from where it stopped, as that round had confirmed the leases, and logged B's events again)."""
    client = own_server.client()
    coord = _coord(client, namespace)
    first_id, second_id = _ids_ranked(first_wanted=False)
    a = _run(services, _service(own_server.url, namespace, first_id))
    wait_until(lambda: a.leases.owned == {0} and 0 in a.tail._last)
    _lonely_member(coord, "g")
    wait_until(lambda: _tail_stored(client, coord) == _latest(client, coord))  # A logged them
    logged_a = _logged(a.metrics)
    assert logged_a > 0
    step = _gate(a, a.leases, "step")
    confirmed = _gate(a, a, "_leases_confirmed", lambda: a._timer_thread)
    step.close()
    confirmed.close()
    wait_until(lambda: step.entered.is_set() and confirmed.entered.is_set())  # A is paused
    b = _run(services, _service(own_server.url, namespace, second_id))
    wait_until(lambda: b.leases.owned == {0})  # A's registry entry expired: B took over
    _lonely_member(coord, "h")
    wait_until(lambda: _tail_stored(client, coord) == _latest(client, coord))  # B logged them
    logged_b = _logged(b.metrics)
    assert logged_b > 0
    rounds = a._last_lease_ok
    step.open()  # A's lease thread goes on first: its round holds nothing (B has the lease)
    wait_until(lambda: a._last_lease_ok > rounds)
    assert not a.leases.owned  # (and B, the plan's holder, keeps it)
    since = time.monotonic()
    confirmed.open()  # then its timer loop, which was about to read the events
    wait_until(lambda: a._last_turn_ok > since)
    assert _logged(a.metrics) == logged_a
    assert _logged(a.metrics) + _logged(b.metrics) == client.xlen(coord._keys("g").partition.events)


def test_events_of_a_partition_handed_over_before_its_first_holder_read_them_are_logged_once(
        own_server, namespace, services):
    """The first holder takes the partition on an empty stream, and has read nothing when it
    hands the partition over to a coordinator that joins: the new holder logs everything since
    the first holder took it, and the first holder none of it (before: the new holder started at
    the stream's end; those events were never logged)."""
    client = own_server.client()
    coord = _coord(client, namespace)
    first_id, second_id = _ids_ranked(first_wanted=False)
    a = _run(services, _service(own_server.url, namespace, first_id))
    wait_until(lambda: a.leases.owned == {0} and 0 in a.tail._last)
    reads = _gate(a, a.tail, "poll", lambda: a._timer_thread)
    reads.close()  # A reads nothing more (as if it had no turn before the hand-over)
    _lonely_member(coord, "g")
    events = client.xlen(coord._keys("g").partition.events)
    b = _run(services, _service(own_server.url, namespace, second_id))
    wait_until(lambda: b.leases.owned == {0} and not a.leases.owned)  # handed over
    wait_until(lambda: _logged(b.metrics) == events, timeout_s=5)  # (before: none of them)
    since = time.monotonic()
    reads.open()
    wait_until(lambda: a._last_turn_ok > since)
    for svc, _ in services:
        _stop(svc)  # (reads once more on the way out)
    assert _logged(a.metrics) == 0
    assert _logged(b.metrics) == events == client.xlen(coord._keys("g").partition.events)


def test_a_pause_of_the_whole_process_is_not_taken_for_a_stalled_timer_loop(
        own_server, namespace, services, monkeypatch):
    """The process pauses (here: during a lease round, with the timer loop held too) for longer
    than the stall limit: when it goes on, the lease thread's check comes first, but the loop
    could not have moved meanwhile either: no ``timer_loop_stalled``, the leases are kept
    (before: an ERROR, and every lease released, to be taken back a moment later)."""
    from rcoord.service import service as service_mod

    monkeypatch.setattr(service_mod, "STALLED_MIN_MS", 1000)
    monkeypatch.setattr(service_mod, "WATCH_GAP_MS", 200, raising=False)
    limit_s = max(2 * TTL_MS, 1000) / 1000
    with handling(EventLog(), "rcoord", logging.INFO) as log:
        a = _run(services, _service(own_server.url, namespace, "A"))
        wait_until(lambda: a.leases.owned == {0} and a.health()[0])
        step = _gate(a, a.leases, "step")
        turns = _gate(a, a.sweeper, "next_due", lambda: a._timer_thread)
        step.close()
        turns.close()
        wait_until(lambda: step.entered.is_set() and turns.entered.is_set())

        def silent_s() -> float:
            return time.monotonic() - max(a._last_alive, a.sweeper.last_progress)

        wait_until(lambda: silent_s() > limit_s + 0.1)  # paused for longer than the limit
        rounds = step.done
        step.open()  # the lease thread goes on first (its round, then its next stall check)
        wait_until(lambda: "timer_loop_stalled" in log.seen or step.done >= rounds + 2)
        assert "timer_loop_stalled" not in log.seen
        assert a.leases.owned == {0}
        turns.open()
        wait_until(lambda: a.health()[0])
        assert "timer_loop_stalled" not in log.seen


def test_the_leases_are_reported_lapsed_while_redis_does_not_answer(own_server, namespace,
                                                                     services):
    """Redis stops answering: once the last lease round that succeeded is a TTL old, the leases
    have lapsed; the gauge and /healthz say none are held (before: the old number, until Redis
    answered again), and the number again once a round succeeds."""
    a = _run(services, _service(own_server.url, namespace, "A"))

    def held() -> float | None:
        return a.metrics.registry.get_sample_value("rcoord_leases_held")

    wait_until(lambda: held() == 1 and a.health()[1]["leases"] == 1)
    os.kill(own_server.pid, signal.SIGSTOP)
    try:
        wait_until(lambda: held() == 0 and a.health()[1]["leases"] == 0, timeout_s=5)
    finally:
        os.kill(own_server.pid, signal.SIGCONT)
    wait_until(lambda: held() == 1 and a.health()[1]["leases"] == 1)
