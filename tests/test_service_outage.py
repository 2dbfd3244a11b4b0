"""The coordinator service while a cluster master stays down, or the whole cluster does.

A master that stays down: Kafka's client waits ``reconnect.backoff.ms`` (doubling up to
``reconnect.backoff.max.ms``) before it connects to a failed broker again, and logs a
disconnected node once per state change. Before, every round (lease renewal, event tail, index
re-read, sweep) asked the dead master again and logged a ``node_error`` line for it: about 8 a
second for as long as it was down.

Every master hung: Kafka's ``KafkaConsumer.close(timeout)`` waits for its last requests only
until its timer expires. Before, each call of the stop (the timer loop's turn, the lease
thread's round, the last event read, the lease release) waited a socket timeout (a lease TTL,
5 s by default), and a SIGTERM took 7-18 s, past Docker's 10 s grace.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from harness import InThread, RunningService, partial_coverage_cluster, wait_until

from rcoord import CoordinatorConfig, Errors, GroupCoordinator
from rcoord.keys import PartitionKeys
from rcoord.service.connect import connect
from rcoord.service.nodes import disconnect_all
from rcoord.service.service import CoordinatorService
from rcoord.testing.embedded import EmbeddedCluster

pytestmark = pytest.mark.slow

JOIN: dict[str, Any] = {"protocol_type": "consumer", "protocols": [("range", b"")],
                        "session_timeout_ms": 60_000, "rebalance_timeout_ms": 2000}
SETTINGS = {"group_min_session_timeout_ms": 10, "group_initial_rebalance_delay_ms": 0}
ROUNDS = 12
"""Lease rounds watched while the master is down: each logged a node_error line before."""
STOP_WAIT_S = 4.0
"""Generous for a loaded machine (it takes under 2 s); before, at least the lease thread's 5 s
join, and up to 18 s."""


@pytest.fixture
def cluster() -> Iterator[EmbeddedCluster]:
    with partial_coverage_cluster() as cl:
        yield cl


def _running(url: str, namespace: str, ttl_ms: int) -> RunningService:
    return RunningService(url, namespace, ttl_ms=ttl_ms, stop_wait_s=STOP_WAIT_S,
                          settings=SETTINGS)


def _setup(cluster: EmbeddedCluster, namespace: str) -> tuple[Any, GroupCoordinator]:
    client = cluster.client()
    coord = GroupCoordinator(client, CoordinatorConfig(namespace=namespace, **SETTINGS)).start()
    for group in ("g0", "g1", "g2"):
        mid = coord.join_group(group, **JOIN).member_id
        res = coord.join_group(group, mid, **JOIN)
        assert coord.sync_group(group, res.generation_id, mid, assignments={}).error == Errors.NONE
    return client, coord


@contextlib.contextmanager
def _owning_every_partition(cluster: EmbeddedCluster, namespace: str) -> Iterator[RunningService]:
    """A service (1 s leases) over three formed groups, once it owns every partition; stopped
    by SIGTERM at the end, which must succeed."""
    client, coord = _setup(cluster, namespace)
    running = _running(cluster.url, namespace, 1000)
    try:
        wait_until(lambda: len(running.svc.leases.owned) == coord.config.num_partitions)
        yield running
    finally:
        assert running.sigterm()
        client.close()


def _node_errors(caplog: pytest.LogCaptureFixture,
                 cluster: EmbeddedCluster) -> list[logging.LogRecord]:
    """The node_error warnings about ``cluster``'s nodes: not another test's service, still
    ending in this process, failing on nodes of its own."""
    mine = {f"127.0.0.1:{node.port}" for node in cluster.nodes}
    return [r for r in caplog.records if getattr(r, "event", None) == "node_error"
            and r.levelno >= logging.WARNING and getattr(r, "node", None) in mine]


def _ident(thread: threading.Thread | None) -> int | None:
    """The ident of ``thread`` once it has started (None before, and for no thread)."""
    return None if thread is None else thread.ident


def _lease_rounds(svc: CoordinatorService, rounds: int) -> None:
    """Wait until the lease thread has ended ``rounds`` more rounds (each sets the time of
    its end; a poll may miss some, so at least that many ran)."""
    seen = {svc._last_lease_ok}
    wait_until(lambda: seen.add(svc._last_lease_ok) or len(seen) > rounds, timeout_s=15)


def test_a_master_that_stays_down_is_logged_when_it_fails_and_when_it_answers_not_every_round(
        cluster: EmbeddedCluster, namespace: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="rcoord.service")
    victim = cluster.nodes[2]
    victim_name = f"127.0.0.1:{victim.port}"
    with _owning_every_partition(cluster, namespace) as running:
        try:
            assert victim.pid is not None
            os.kill(victim.pid, signal.SIGSTOP)  # hung first: every round meets it
            wait_until(lambda: _node_errors(caplog, cluster), timeout_s=10)
            _lease_rounds(running.svc, ROUNDS)
            errors = _node_errors(caplog, cluster)
            assert len(errors) <= 2, f"{len(errors)} node_error lines in {ROUNDS} lease rounds"
            assert {getattr(r, "node", None) for r in errors} == {victim_name}
            os.kill(victim.pid, signal.SIGCONT)
            # Once when it answers again.
            wait_until(lambda: any(getattr(r, "event", None) == "node_recovered"
                                   and getattr(r, "node", None) == victim_name
                                   for r in caplog.records),
                       timeout_s=15)
            assert len(_node_errors(caplog, cluster)) <= 2
        finally:
            if victim.pid is not None:
                os.kill(victim.pid, signal.SIGCONT)


def test_a_killed_master_is_not_asked_every_round(
        cluster: EmbeddedCluster, namespace: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="rcoord.service")
    victim = cluster.nodes[2]
    with _owning_every_partition(cluster, namespace) as running:
        assert victim.pid is not None
        os.kill(victim.pid, signal.SIGKILL)
        wait_until(lambda: _node_errors(caplog, cluster), timeout_s=10)
        _lease_rounds(running.svc, ROUNDS)
        errors = _node_errors(caplog, cluster)
        assert len(errors) <= 2, f"{len(errors)} node_error lines in {ROUNDS} lease rounds"
        # Refused calls: the node is left alone between tries (Kafka's reconnect backoff),
        # so most rounds did not ask it at all.
        skipped = [r for r in caplog.records if "skipped for now" in str(getattr(r, "why", ""))]
        assert skipped, "the dead master was asked every round"


def test_a_cluster_down_logs_its_failing_lease_rounds_when_they_start_not_each_one(
        cluster: EmbeddedCluster, namespace: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="rcoord.service")
    with _owning_every_partition(cluster, namespace) as running:
        for node in cluster.nodes:
            assert node.pid is not None
            os.kill(node.pid, signal.SIGKILL)
        # (This service's threads' records: not another test's service, still ending in this
        # process, failing too. The timer thread is named before it starts: its ident is None
        # until then, which left every record of the timer loop out of the count.)
        wait_until(lambda: _ident(running.svc._timer_thread) is not None)
        ours = {_ident(running.svc._timer_thread), _ident(running.svc._lease_thread)}

        def records(event: str) -> list[logging.LogRecord]:
            return [r for r in caplog.records if getattr(r, "event", None) == event
                    and r.levelno >= logging.WARNING and r.thread in ours]

        def loop_retries() -> list[logging.LogRecord]:  # (each failed turn, at DEBUG)
            return [r for r in caplog.records
                    if getattr(r, "event", None) == "loop_retry" and r.thread in ours]

        # The timer loop's retries (200 ms doubling to 1 s) as a clock: about 2.4 s, in which
        # some 10 lease rounds (one every 250 ms) failed, each one a warning line before (and
        # each failed turn of the timer loop too).
        wait_until(lambda: len(loop_retries()) >= 4, timeout_s=15)
        assert len(records("loop_error")) == 1
        assert 1 <= len(records("lease_error")) <= 2, [r.getMessage() for r in caplog.records]
        assert len(_node_errors(caplog, cluster)) <= 3 * 2  # (once a master, and perhaps once more)


def test_the_service_stops_promptly_while_every_master_hangs(
        cluster: EmbeddedCluster, namespace: str) -> None:
    client, coord = _setup(cluster, namespace)
    # The default TTL: the socket timeout, and so each unanswered call, is 5 s.
    running = _running(cluster.url, namespace, 5000)
    svc = running.svc
    try:
        wait_until(lambda: len(svc.leases.owned) == coord.config.num_partitions)
        for node in cluster.nodes:
            assert node.pid is not None
            os.kill(node.pid, signal.SIGSTOP)
        # The lease thread is in a round that the hung masters do not answer (a round is due
        # every 1.25 s and takes milliseconds otherwise).
        period_s = 5000 / 4000
        wait_until(lambda: time.monotonic() - svc._last_lease_ok > 2 * period_s, timeout_s=10)
        assert running.sigterm(), f"the service did not stop within {STOP_WAIT_S} s"
    finally:
        for node in cluster.nodes:
            if node.pid is not None:
                os.kill(node.pid, signal.SIGCONT)
        running.sigterm(wait_s=20)
        client.close()


def test_a_stop_on_a_cluster_that_answers_still_releases_every_lease(
        cluster: EmbeddedCluster, namespace: str) -> None:
    client, coord = _setup(cluster, namespace)
    running = _running(cluster.url, namespace, 5000)
    n = coord.config.num_partitions
    try:
        wait_until(lambda: len(running.svc.leases.owned) == n)
    finally:
        assert running.sigterm()
    held = [client.get(PartitionKeys(namespace, p, n).lease) for p in range(n)]
    assert held == [None] * n
    assert client.zscore(f"{namespace}:coordinators", "c1") is None
    client.close()


def test_an_interrupt_shuts_the_socket_under_a_call_and_leaves_closing_it_to_the_call(
        cluster: EmbeddedCluster) -> None:
    """The stop's ``disconnect_all`` wakes a call blocked on a hung master, and does not close
    its socket: closing it from another thread raced with the call's ``poll`` (a thread that
    had read the descriptor polled the next socket given that number, for a socket timeout),
    so on a loaded machine a SIGTERM took over 5 s about one time in ten."""
    client = connect(cluster.url, socket_timeout=60)
    hung = client.get_primaries()[0]
    plain = client.get_redis_connection(hung)
    plain.ping()  # a connection, idle in its pool
    pool = plain.connection_pool
    idle = pool._available_connections[0]
    sock = idle._sock
    server = next(n for n in cluster.nodes if n.port == hung.port)
    assert server.pid is not None
    os.kill(server.pid, signal.SIGSTOP)
    try:
        disconnect_all(client)
        # Shut, but still open: its descriptor cannot be given to another socket meanwhile.
        assert sock.fileno() != -1, "disconnect_all closed a socket another thread may be using"

        caller = InThread(plain.time)
        wait_until(lambda: any(c._sock is not None and c._sock is not sock
                               for c in pool._in_use_connections) or caller.outcome)
        disconnect_all(client)  # the call in flight, on a new connection the master never answers
        caller.thread.join(30)  # (its socket timeout is 60 s)
        assert not caller.thread.is_alive(), "the call was not woken"
        assert isinstance(caller.outcome[0], redis.ConnectionError), caller.outcome
        assert sock.fileno() == -1  # closed by redis-py when that connection was next taken
    finally:
        os.kill(server.pid, signal.SIGCONT)
        client.close()
