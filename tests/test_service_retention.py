"""The coordinator service applies topic retention (Kafka's broker does, every
log.retention.check.interval.ms): each topic by the process leasing its partition."""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from harness import handling, wait_until
from test_service import ROOT, Proc
from test_service_review64_retention import _passes as _keeper_passes

from rcoord.errors import ConfigError, ConnectionLost
from rcoord.partitioning import partition_for
from rcoord.service.leases import plan
from rcoord.service.metrics import Metrics
from rcoord.service.retention import RetentionKeeper
from rcoord.service.service import CoordinatorService, ServiceConfig
from rcoord.topics import Producer, ProducerRecord, Topics, log_offsets

INTERVAL_MS = 50
N = 50  # the namespace's partition count (the default)


class _Retention(logging.Handler):
    """The retention log records (``retention_applied`` per topic, ``retention_error``)."""

    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.applied: list[tuple[str, str]] = []  # (coordinator id, topic)
        self.stopped: list[str] = []  # topics whose trim a stop may have cut short
        self.errors: list[logging.LogRecord] = []
        self._lock = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        event = getattr(record, "event", None)
        with self._lock:
            if event == "retention_applied":
                self.applied.append((str(getattr(record, "id", "")), str(getattr(record, "topic", ""))))
            elif event == "retention_error":
                self.errors.append(record)
            elif event == "retention_stopped":
                self.stopped.append(str(getattr(record, "topic", "")))

    def appliers(self, topic: str) -> set[str]:
        with self._lock:
            return {cid for cid, t in self.applied if t == topic}


@pytest.fixture
def retention_log() -> Iterator[_Retention]:
    with handling(_Retention(), "rcoord.service", logging.DEBUG) as handler:
        yield handler


@pytest.fixture
def services() -> Iterator[list[CoordinatorService]]:
    started: list[CoordinatorService] = []
    yield started
    for svc in started:
        svc.stop()


def _service(url: str, namespace: str, cid: str, interval_ms: int = INTERVAL_MS) -> CoordinatorService:
    return CoordinatorService(ServiceConfig(
        redis_url=url, namespace=namespace, coordinator_id=cid, lease_ttl_ms=3000, wake="index",
        retention_check_interval_ms=interval_ms)).start()


def _metric(svc: CoordinatorService, name: str, **labels: str) -> float:
    return svc.metrics.registry.get_sample_value(name, labels) or 0.0


def _passes(svc: CoordinatorService, result: str = "ok") -> float:
    return _metric(svc, "rcoord_retention_passes_total", result=result)


def _applied(svc: CoordinatorService) -> float:
    return _metric(svc, "rcoord_retention_topics_applied_total")


def _more_passes(svc: CoordinatorService, n: int, result: str = "ok") -> None:
    """Wait until ``svc`` has ended ``n`` more passes with ``result``."""
    target = _passes(svc, result) + n
    wait_until(lambda: _passes(svc, result) >= target, timeout_s=20)


def _produce(client: Any, namespace: str, topic: str, count: int, partition: int = 0) -> None:
    Producer(client, namespace).send_batch(
        topic, [ProducerRecord(b"v%d" % i, partition=partition) for i in range(count)])


def test_the_service_applies_each_topics_retention(redis_server, single_client, namespace,
                                                   services, retention_log):
    """By count and by age, in every partition; a topic without retention is left alone. Before,
    nothing rcoord runs applied retention, and the streams grew for ever."""
    topics = Topics(single_client, namespace)
    topics.create("counted", 2, retention_records=3)
    topics.create("aged", 1, retention_ms=200)
    topics.create("kept", 1)
    for p in (0, 1):
        _produce(single_client, namespace, "counted", 10, partition=p)
    _produce(single_client, namespace, "kept", 10)
    svc = _service(redis_server.url, namespace, "solo")
    services.append(svc)
    runner = threading.Thread(target=svc.run, daemon=True)
    runner.start()
    try:
        wait_until(lambda: all(log_offsets(single_client, namespace, "counted", p) == (7, 10)
                               for p in (0, 1)), timeout_s=20)
        # By age: records produced now go once they are older than 200 ms (the log start moves
        # to the log end).
        _produce(single_client, namespace, "aged", 5)
        assert log_offsets(single_client, namespace, "aged", 0)[1] == 5
        wait_until(lambda: log_offsets(single_client, namespace, "aged", 0) == (5, 5), timeout_s=20)
        _more_passes(svc, 3)
        assert log_offsets(single_client, namespace, "kept", 0) == (0, 10)
        assert retention_log.appliers("kept") == set()
        assert retention_log.appliers("counted") == {"solo"}
        assert retention_log.appliers("aged") == {"solo"}
        assert _applied(svc) >= 2 and _passes(svc, "failed") == 0
    finally:
        svc.stop()
        runner.join(10)
    assert not runner.is_alive()


def test_the_service_applies_retention_on_every_master_of_a_cluster(redis_cluster, namespace,
                                                                     services):
    """Topics whose metadata and partitions lie on different masters are all trimmed."""
    client = redis_cluster.client()
    try:
        topics = Topics(client, namespace)
        names = [f"c{i}" for i in range(6)]
        for name in names:
            topics.create(name, 3, retention_records=2)
            for p in range(3):
                _produce(client, namespace, name, 4, partition=p)
        services.append(_service(redis_cluster.url, namespace, "cluster"))
        wait_until(lambda: all(log_offsets(client, namespace, t, p) == (2, 4)
                               for t in names for p in range(3)), timeout_s=20)
        assert _passes(services[0], "failed") == 0
    finally:
        client.close()


def _topics_by_holder(ids: list[str], per_holder: int) -> dict[str, list[str]]:
    """Topic names whose partition each of ``ids`` holds under the plan, ``per_holder`` each."""
    wanted = plan(N, ids)
    out: dict[str, list[str]] = {cid: [] for cid in ids}
    i = 0
    while any(len(v) < per_holder for v in out.values()):
        name = f"t{i}"
        holder = wanted[partition_for(name, N)]
        if len(out[holder]) < per_holder:
            out[holder].append(name)
        i += 1
    return out


def test_each_topic_is_trimmed_by_the_process_leasing_it(redis_server, single_client, namespace,
                                                         services, retention_log):
    """Two processes: each topic is trimmed by the holder of its partition's lease only; when
    one process stops, its topics are trimmed by the one that takes its leases."""
    ids = ["left", "right"]
    for cid in ids:
        services.append(_service(redis_server.url, namespace, cid))
    wanted = plan(N, ids)
    wait_until(lambda: all(svc.leases.owned == {p for p, c in wanted.items() if c == svc.config.coordinator_id}
                           for svc in services), timeout_s=20)
    by_holder = _topics_by_holder(ids, 3)
    topics = Topics(single_client, namespace)
    for names in by_holder.values():
        for name in names:
            topics.create(name, 1, retention_records=1)
            _produce(single_client, namespace, name, 3)
    every = [t for names in by_holder.values() for t in names]
    wait_until(lambda: all(log_offsets(single_client, namespace, t, 0) == (2, 3) for t in every),
               timeout_s=20)
    for svc in services:
        _more_passes(svc, 2)
    for cid, names in by_holder.items():
        for name in names:
            assert retention_log.appliers(name) == {cid}, name
    assert all(_applied(svc) >= 3 for svc in services)
    # The leases move, and the work with them.
    services[0].stop()
    survivor = services.pop(1)
    services[:] = [survivor]
    wait_until(lambda: len(survivor.leases.owned) == N, timeout_s=20)
    moved = by_holder["left"][0]
    _produce(single_client, namespace, moved, 3)
    wait_until(lambda: log_offsets(single_client, namespace, moved, 0) == (5, 6), timeout_s=20)
    assert retention_log.appliers(moved) == {"left", "right"}


def test_a_retention_pass_that_redis_fails_is_tried_again(redis_server, single_client, namespace,
                                                         services, retention_log, monkeypatch):
    """A failed listing, and a topic whose trim fails, are logged and tried again next pass; the
    other topics are trimmed meanwhile and the process goes on."""
    topics = Topics(single_client, namespace)
    topics.create("good", 1, retention_records=1)
    topics.create("bad", 1, retention_records=1)
    for name in ("good", "bad"):
        _produce(single_client, namespace, name, 3)
    failures = {"list": 2, "bad": 3}
    real_list, real_apply = Topics.list, Topics.apply_retention
    lock = threading.Lock()

    def flaky_list(self: Topics) -> list[str]:
        with lock:
            if failures["list"]:
                failures["list"] -= 1
                raise ConnectionLost("list: the connection dropped")
        return real_list(self)

    def flaky_apply(self: Topics, topic: str, stop: threading.Event | None = None
                    ) -> dict[int, int]:
        with lock:
            if topic == "bad" and failures["bad"]:
                failures["bad"] -= 1
                raise RuntimeError("bad: a script error")
        return real_apply(self, topic, stop)

    monkeypatch.setattr(Topics, "list", flaky_list)
    monkeypatch.setattr(Topics, "apply_retention", flaky_apply)
    svc = _service(redis_server.url, namespace, "flaky")
    services.append(svc)
    wait_until(lambda: log_offsets(single_client, namespace, "bad", 0) == (2, 3), timeout_s=20)
    assert log_offsets(single_client, namespace, "good", 0) == (2, 3)
    assert _passes(svc, "failed") == 5  # two listings, then three passes with "bad" failing
    assert _metric(svc, "rcoord_retention_topic_errors_total") == 3
    whys = [str(getattr(r, "why", "")) for r in retention_log.errors]
    assert sum("list: the connection dropped" in w for w in whys) == 2
    assert sum("bad: a script error" in w for w in whys) == 3
    assert svc._retention_thread is not None and svc._retention_thread.is_alive()


def _stopping_before_first_topic(client: Any, namespace: str, metrics: Metrics
                                 ) -> tuple[RetentionKeeper, threading.Event]:
    """A keeper (id c1, all of the N partitions) whose stop comes just before its first
    topic's trim: ``owned`` is asked at the pass's start, then before each topic, and sets the
    stop the second time it is asked; the stop, for a test to clear."""
    stop = threading.Event()
    asked: list[int] = []

    def owned() -> set[int]:
        asked.append(1)
        if len(asked) == 2:
            stop.set()
        return set(range(N))

    return RetentionKeeper(client, namespace, N, metrics, owned, 60_000, stop, "c1"), stop


def test_a_pass_a_stop_cuts_short_is_not_counted_ok(single_client, namespace):
    """The stop comes before the first topic's trim (a hook on ``owned``, asked before each
    topic): the other topic is left, and the pass is neither ok nor failed. Before, it was
    counted ok, as a complete pass."""
    topics = Topics(single_client, namespace)
    names = ["s1", "s2"]
    for name in names:
        topics.create(name, 1, retention_records=1)
        _produce(single_client, namespace, name, 3)
    metrics = Metrics()
    keeper, stop = _stopping_before_first_topic(single_client, namespace, metrics)
    # (The first topic's trim finishes in its one round: its answer says it is done, so it is
    # counted applied; test_retention_review69.)
    assert keeper.run_once() == 1
    assert sorted(log_offsets(single_client, namespace, t, 0) for t in names) == [(0, 3), (2, 3)]
    assert _keeper_passes(metrics, "ok") == 0 and _keeper_passes(metrics, "failed") == 0
    stop.clear()
    assert keeper.run_once() == 2  # a pass with no stop is complete, and counted ok
    assert [log_offsets(single_client, namespace, t, 0) for t in names] == [(2, 3)] * 2
    assert _keeper_passes(metrics, "ok") == 1


def test_a_pass_whose_complete_listing_found_no_topic_with_retention_is_ok(
        single_client, namespace):
    """The stop is set before the pass, whose listing (one node: it does not stop) is
    complete and finds only a topic without retention: the pass left nothing, so it is ok.
    Before, a stop set at the listing's end was taken for a listing cut short."""
    Topics(single_client, namespace).create("plain", 1)
    _produce(single_client, namespace, "plain", 3)
    metrics = Metrics()
    stop = threading.Event()
    stop.set()
    keeper = RetentionKeeper(single_client, namespace, N, metrics, lambda: set(range(N)),
                             60_000, stop, "c1")
    assert keeper.run_once() == 0
    assert _keeper_passes(metrics, "ok") == 1 and _keeper_passes(metrics, "failed") == 0
    assert log_offsets(single_client, namespace, "plain", 0) == (0, 3)


def test_a_topic_whose_trim_a_stop_cut_short_is_not_counted_applied(
        single_client, namespace, retention_log, monkeypatch):
    """The stop comes while the topic's first trim round runs (held at a gate in ``_run``
    until the stop is set): the trim ends after that round, 4 of its 30 old records gone, and
    the topic is neither counted in ``rcoord_retention_topics_applied`` nor logged
    ``retention_applied``, but ``retention_stopped``. Before, it was counted and logged
    applied, as a finished trim."""
    from rcoord.topics import admin as topics_admin

    topics = Topics(single_client, namespace)
    topics.create("c", 1, retention_records=10)
    Producer(single_client, namespace).send_batch(
        "c", [ProducerRecord(b"x" * 1000, partition=0) for _ in range(40)])
    monkeypatch.setattr(topics_admin, "RETENTION_TRIM_BYTES", 5000)  # 4 records a round
    entered, gate = threading.Event(), threading.Event()
    run = topics_admin._run

    def held(*args: Any, **kw: Any) -> Any:
        entered.set()
        assert gate.wait(60)
        return run(*args, **kw)

    monkeypatch.setattr(topics_admin, "_run", held)
    stop = threading.Event()
    metrics = Metrics()
    keeper = RetentionKeeper(single_client, namespace, N, metrics, lambda: set(range(N)), 60_000,
                             stop, "c1")
    result: list[int] = []
    pass_thread = threading.Thread(target=lambda: result.append(keeper.run_once()), daemon=True)
    pass_thread.start()
    try:
        assert entered.wait(60)
        stop.set()  # what the service's stop() does first
    finally:
        gate.set()
        pass_thread.join(60)
    assert result == [0]
    assert log_offsets(single_client, namespace, "c", 0) == (4, 40)  # one round, then the stop
    assert metrics.registry.get_sample_value("rcoord_retention_topics_applied_total") == 0
    assert retention_log.appliers("c") == set() and retention_log.stopped == ["c"]
    stop.clear()
    assert keeper.run_once() == 1  # the next pass finishes the trim, and counts it
    assert log_offsets(single_client, namespace, "c", 0) == (30, 40)
    assert metrics.registry.get_sample_value("rcoord_retention_topics_applied_total") == 1
    assert retention_log.appliers("c") == {"c1"} and retention_log.stopped == ["c"]


def test_a_pass_that_cannot_confirm_its_leases_is_failed_not_ok(single_client, namespace,
                                                               retention_log):
    """``owned`` answers None (the leases were not renewed within a TTL) at the pass's start:
    nothing is trimmed, and the pass is counted failed and logged, not ok. Before, "don't
    know" read as "no leases" and the pass counted ok."""
    topics = Topics(single_client, namespace)
    topics.create("u", 1, retention_records=1)
    _produce(single_client, namespace, "u", 3)
    leases: list[set[int] | None] = [None]
    metrics = Metrics()
    keeper = RetentionKeeper(single_client, namespace, N, metrics, lambda: leases[0], 60_000,
                             threading.Event(), "c1")
    assert keeper.run_once() == 0
    assert log_offsets(single_client, namespace, "u", 0) == (0, 3)
    assert _keeper_passes(metrics, "ok") == 0 and _keeper_passes(metrics, "failed") == 1
    assert [getattr(r, "leases_unconfirmed", None) for r in retention_log.errors] == [True]
    leases[0] = set(range(N))  # the next lease round confirms them
    assert keeper.run_once() == 1
    assert log_offsets(single_client, namespace, "u", 0) == (2, 3)
    assert _keeper_passes(metrics, "ok") == 1 and _keeper_passes(metrics, "failed") == 1


def test_a_pass_whose_leases_go_unconfirmed_midway_is_failed_not_ok(single_client, namespace,
                                                                    retention_log):
    """The leases are confirmed at the pass's start and not before its first topic: both
    topics are left, and the pass is counted failed and logged with the 2 topics it did not
    reach. Before, the unconfirmed leases read as moved and the pass counted ok."""
    topics = Topics(single_client, namespace)
    names = ["m1", "m2"]
    for name in names:
        topics.create(name, 1, retention_records=1)
        _produce(single_client, namespace, name, 3)
    asked = []

    def owned() -> set[int] | None:
        asked.append(1)
        return set(range(N)) if len(asked) == 1 else None

    metrics = Metrics()
    keeper = RetentionKeeper(single_client, namespace, N, metrics, owned, 60_000,
                             threading.Event(), "c1")
    assert keeper.run_once() == 0
    assert [log_offsets(single_client, namespace, t, 0) for t in names] == [(0, 3)] * 2
    assert _keeper_passes(metrics, "ok") == 0 and _keeper_passes(metrics, "failed") == 1
    assert [(getattr(r, "leases_unconfirmed", None), getattr(r, "left", None))
            for r in retention_log.errors] == [(True, 2)]


def test_the_service_says_it_does_not_know_its_leases_once_unconfirmed(redis_server, namespace,
                                                                       services):
    """The leases source the service gives its retention: the leased partitions while they
    are confirmed, None (not an empty set, "none held") once they are not (here: the timer
    loop was left behind, which no lease round confirms again)."""
    svc = _service(redis_server.url, namespace, "unsure", interval_ms=86_400_000)
    services.append(svc)
    assert svc._confirmed_leases() == set(range(N))  # the only process: it leases them all
    svc._loop_left.set()
    assert svc._confirmed_leases() is None


def test_stop_ends_the_retention_thread_at_once(redis_server, namespace, services):
    """Waiting for its next pass (a day away), the thread ends with the service."""
    svc = _service(redis_server.url, namespace, "idle", interval_ms=86_400_000)
    thread = svc._retention_thread
    assert thread is not None and thread.is_alive()
    svc.stop()
    services.clear()
    assert not thread.is_alive()


def test_a_zero_interval_turns_retention_off(redis_server, single_client, namespace, services):
    Topics(single_client, namespace).create("t", 1, retention_records=1)
    _produce(single_client, namespace, "t", 3)
    svc = _service(redis_server.url, namespace, "off", interval_ms=0)
    services.append(svc)
    assert svc._retention_thread is None and svc.retention is None
    assert svc.health()[1]["last_retention_pass_ms_ago"] is None
    assert log_offsets(single_client, namespace, "t", 0) == (0, 3)


@pytest.mark.parametrize("bad", [-1, 86_400_001, True, 1.5, "100"])
def test_a_bad_retention_check_interval_is_a_config_error(bad):
    with pytest.raises(ConfigError, match="retention_check_interval_ms"):
        ServiceConfig(redis_url="redis://127.0.0.1:1/0", retention_check_interval_ms=bad)


def test_the_retention_check_interval_flag(monkeypatch):
    from rcoord.service.cli import add_coordinator_arguments

    p = argparse.ArgumentParser()
    add_coordinator_arguments(p)
    assert p.parse_args([]).retention_check_interval_ms == 300_000  # Kafka's default
    assert ServiceConfig(redis_url="redis://x:1/0").retention_check_interval_ms == 300_000
    monkeypatch.setenv("RCOORD_RETENTION_CHECK_INTERVAL_MS", "1234")
    p = argparse.ArgumentParser()
    add_coordinator_arguments(p)
    assert int(p.parse_args([]).retention_check_interval_ms) == 1234
    assert p.parse_args(["--retention-check-interval-ms", "0"]).retention_check_interval_ms == 0


def test_the_coordinator_command_applies_retention(redis_server, single_client, namespace):
    """The reviewer's case: a topic created with --retention-ms 1 --retention-records 2 is trimmed
    by a running ``rcoord coordinator``."""
    Topics(single_client, namespace).create("t", 1, retention_ms=1, retention_records=2)
    _produce(single_client, namespace, "t", 10)
    proc = Proc(redis_server.url, namespace, "cli", "--retention-check-interval-ms", "100")
    try:
        wait_until(lambda: log_offsets(single_client, namespace, "t", 0) == (10, 10), timeout_s=20)
        wait_until(lambda: proc.metric("rcoord_retention_topics_applied_total") >= 1, timeout_s=20)
        assert proc.health()["last_retention_pass_ms_ago"] is not None
    finally:
        out = proc.stop()
    assert proc.proc.returncode == 0, out


def test_a_bad_retention_check_interval_flag_is_a_usage_error(redis_server, namespace):
    res = subprocess.run(
        [sys.executable, "-m", "rcoord.service", "--redis-url", redis_server.url, "--namespace",
         namespace, "--retention-check-interval-ms", "-5"],
        check=False, capture_output=True, text=True, timeout=30, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert res.returncode == 2
    assert "retention_check_interval_ms must be an integer in 0..86400000" in res.stderr
