"""The Spark source's and sink's Redis clients: how long a Python worker keeps them open.

Counted on the server: each test's URLs carry a ``client_name`` of its own, and ``CLIENT
LIST`` shows the connections a client still holds (a closed one drops out as the server sees
its socket close, so the counts are waited for, never sampled once).
"""

from __future__ import annotations

import uuid
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
