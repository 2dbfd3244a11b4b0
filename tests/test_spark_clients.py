"""The Spark source's and sink's Redis clients: how long a Python worker keeps them open.

Counted on the server: each test's URLs carry a ``client_name`` of its own, and ``CLIENT
LIST`` shows the connections a client still holds (a closed one drops out as the server sees
its socket close, so the counts are waited for, never sampled once).
"""

from __future__ import annotations

import gc
import os
import signal
import threading
import time
import uuid
import warnings
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from harness import wait_until

from rcoord.spark import clients
from rcoord.spark.options import ReadKind, parse_read_options
from rcoord.topics import Producer, Topics


@pytest.fixture(autouse=True)
def _own_clients(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """This test's leases only: the process's shared clients of other tests stay out of it."""
    entries: dict[str, Any] = {}
    monkeypatch.setattr(clients, "_entries", entries)
    yield
    for entry in entries.values():
        entry.client.close()


def _open(single_client: Any, prefix: str) -> int:
    """Connections on the server whose client name begins with ``prefix``."""
    return sum(1 for c in single_client.client_list() if c.get("name", "").startswith(prefix))


def _url(base: str, name: str) -> str:
    return f"{base}?client_name={name}"


def test_a_worker_keeps_no_client_for_every_url_it_ever_met(
        redis_server: Any, single_client: Any, namespace: str) -> None:
    # One long-lived Python worker plans and reads for many queries, each with its own URL
    # (another user, another password after a rotation). Before, every URL's client stayed
    # open for the worker's life: one more set of server connections per URL, for good.
    source = pytest.importorskip("rcoord.spark.source")  # pyspark, but no JVM
    Topics(single_client, namespace).create("ev", 1)
    Producer(single_client, namespace).send_batch("ev", [b"x"] * 3)
    prefix = f"x{uuid.uuid4().hex[:8]}-"
    queries = clients.MAX_IDLE + 3
    for n in range(queries):
        reader = source.BatchReader(parse_read_options(
            {"url": _url(redis_server.url, f"{prefix}{n}"), "namespace": namespace,
             "subscribe": "ev"}, ReadKind.BATCH, env={}))
        rows = [b for part in reader.partitions() for b in reader.read(part)]
        assert sum(b.num_rows for b in rows) == 3
    wait_until(lambda: _open(single_client, prefix) <= clients.MAX_IDLE)
    assert _open(single_client, prefix) >= 1  # the latest ones stay for the next task


def test_an_idle_client_is_closed_but_never_one_in_use(
        redis_server: Any, single_client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    monkeypatch.setattr(clients, "time", SimpleNamespace(monotonic=lambda: now[0]))
    prefix = f"x{uuid.uuid4().hex[:8]}-"
    held, other = _url(redis_server.url, f"{prefix}held"), _url(redis_server.url, f"{prefix}o")
    with clients.leased(held) as client:
        client.ping()
        now[0] += 2 * clients.IDLE_S
        with clients.leased(other) as second:  # a lease begins and ends: idle ones are closed
            second.ping()
        assert client.ping()  # the one in use was not: its connection is still the same
        assert _open(single_client, f"{prefix}held") == 1
    with clients.leased(held) as again:
        assert again is client  # idle for less than IDLE_S: the same client
    now[0] += clients.IDLE_S
    with clients.leased(other):  # both idle past IDLE_S: closed, "other" made again
        pass
    wait_until(lambda: _open(single_client, f"{prefix}held") == 0)


def test_a_stream_reader_closes_its_client_when_the_query_stops(
        redis_server: Any, single_client: Any, namespace: str) -> None:
    # The runner's reader connects for the query's life; before, its client stayed open in the
    # process after stop().
    source = pytest.importorskip("rcoord.spark.source")
    Topics(single_client, namespace).create("ev", 1)
    name = f"x{uuid.uuid4().hex[:8]}"
    reader = source.StreamReader(parse_read_options(
        {"url": _url(redis_server.url, name), "namespace": namespace, "subscribe": "ev"},
        ReadKind.STREAM, env={}))
    reader.initialOffset()
    assert _open(single_client, name) >= 1
    reader.stop()
    wait_until(lambda: _open(single_client, name) == 0)


def test_a_lease_the_garbage_collector_ends_inside_another_lease_call_hangs_nothing(
        redis_server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # A read task's generator (source._read holds its lease across yields) abandoned in a
    # reference cycle ends its lease when the cyclic garbage collector finalizes it, which
    # runs between any two bytecodes of whichever thread allocates: also inside the lease
    # table's lock. Before, that release waited for the lock its own thread held, for ever:
    # the Python worker hung. Here the collector runs where the lock is held (time.monotonic
    # in _acquire).
    monkeypatch.setattr(clients, "_lock", threading.Lock())  # a hung thread keeps only this
    prefix = f"x{uuid.uuid4().hex[:8]}-"
    url, other = _url(redis_server.url, f"{prefix}gen"), _url(redis_server.url, f"{prefix}o")

    def task() -> Iterator[Any]:
        with clients.leased(url) as client:
            yield client

    gc.disable()
    try:
        reads = task()
        next(reads)
        cycle: list[Any] = [reads]
        cycle.append(cycle)
        del reads, cycle
        collected = threading.Event()

        def monotonic() -> float:
            if not collected.is_set():
                collected.set()
                gc.collect()  # finalizes the abandoned task: its lease ends here
            return time.monotonic()

        monkeypatch.setattr(clients, "time", SimpleNamespace(monotonic=monotonic))
        done = threading.Event()

        def lease() -> None:
            with clients.leased(other):
                pass
            done.set()

        threading.Thread(target=lease, daemon=True).start()
        assert done.wait(10), "a lease ended by the garbage collector hung the worker"
    finally:
        gc.enable()
    assert collected.is_set()
    assert clients._entries[url].users == 0  # the abandoned task's lease ended


def test_a_worker_taking_turns_over_several_urls_connects_once_per_url(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A worker's tasks take turns over six URLs (a union of sources on several servers, a sink
    # on another). Before, only 4 idle clients were kept, the least recently used closed
    # first: cycled over six, every lease closed a client and made one (30 connects in 30
    # rounds).
    made: list[str] = []

    def connect(url: str) -> Any:
        made.append(url)
        return SimpleNamespace(close=lambda: None)

    monkeypatch.setattr(clients, "client_from_url", connect)
    urls = [f"redis://127.0.0.1:1/{n}" for n in range(6)]
    for _ in range(5):
        for url in urls:
            with clients.leased(url):
                pass
    assert sorted(made) == urls


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork")
def test_a_child_forked_while_another_thread_holds_the_lease_table_can_lease(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Another thread held the lease table's lock when the process forked: in the child nobody
    # releases it. Before, the child's first lease waited for it for ever.
    monkeypatch.setattr(clients, "_lock", threading.Lock())
    monkeypatch.setattr(clients, "client_from_url",
                        lambda url: SimpleNamespace(close=lambda: None))
    held, done = threading.Event(), threading.Event()

    def hold() -> None:
        with clients._lock:
            held.set()
            done.wait(30)

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    assert held.wait(10)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # (3.12: fork with threads)
            pid = os.fork()
        if pid == 0:  # the child: lease, and exit 0 if that returns
            code = 1
            try:
                with clients.leased("redis://127.0.0.1:1/0"):
                    code = 0
            finally:
                os._exit(code)
        status: list[int] = []

        def exited() -> bool:
            got, st = os.waitpid(pid, os.WNOHANG)
            if got:
                status.append(st)
            return bool(got)

        try:
            wait_until(exited, why=lambda: "the forked child's lease hung")
        finally:
            if not status:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status[0]) == 0
    finally:
        done.set()
        holder.join(10)
