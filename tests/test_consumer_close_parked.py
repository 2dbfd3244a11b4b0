"""close() while the consumer's fetch is parked in ``XREAD BLOCK`` (``fetch_max_wait_ms``)."""

from __future__ import annotations

import gc
import os
import signal
import socket
import threading
import tracemalloc
from typing import Any

import pytest
from harness import blocked_xreads, wait_until, without_join_delay

from rcoord.client import Consumer, ConsumerGroupConfig
from rcoord.testing.embedded import EmbeddedCluster, EmbeddedServer
from rcoord.topics import Producer, Topics


def _parked_reads(nodes: list[Any], name: str | None) -> int:
    """How many connections of the servers of ``nodes`` are blocked in an XREAD now: those
    named ``name`` only, if given (this test's clients: not another test's, on the session's
    shared servers)."""
    return sum(blocked_xreads(node, name) for node in nodes)


def _open_sockets() -> list[socket.socket]:
    gc.collect()
    return [o for o in gc.get_objects() if isinstance(o, socket.socket) and o.fileno() != -1]


def _ours(sockets: list[socket.socket], nodes: list[Any], name: str) -> list[socket.socket]:
    """Those of ``sockets`` connected to a server of ``nodes`` that the server lists under
    ``name`` (every connection of this test's clients sends it), or does not list at all (its
    end closed): not a socket another test's leftover thread opened meanwhile (those of the
    ``nodes`` themselves are unnamed)."""
    listed: dict[tuple[int, str], str] = {}
    for node in nodes:
        port = int(node.connection_pool.connection_kwargs["port"])
        listed.update({(port, c["addr"]): c.get("name", "") for c in node.client_list()})
    ports = {port for port, _ in listed}
    found = []
    for s in sockets:
        try:
            port = s.getpeername()[1]
            host, local = s.getsockname()[:2]
        except (OSError, TypeError, IndexError):
            continue  # (not connected: to no server of this test)
        if port in ports and listed.get((port, f"{host}:{local}"), name) == name:
            found.append(s)
    return found


def _wait_for_the_consumer_threads_to_end(group_id: str) -> None:
    """Until every thread of group ``group_id``'s consumer (rcoord-<group_id>-...) has ended
    (a group id of the test's own: not another test's consumer of a group of the same name)."""
    prefix = f"rcoord-{group_id}-"
    wait_until(lambda: not any(t.name.startswith(prefix) for t in threading.enumerate()))


def _park_a_consumer(config: ConsumerGroupConfig, nodes: list[Any], name: str | None) -> tuple[
        Consumer, threading.Event, threading.Thread]:
    """A consumer of ``config`` (fetch_max_wait_ms a minute) polling on a thread of its own
    until the returned event is set, once assigned and its fetch parked in XREAD on ``nodes``
    (on a connection named ``name``, if given; no JoinGroup parked on its wake stream then:
    the XREAD is the fetch's)."""
    consumer = Consumer(config, fetch_max_wait_ms=60_000)
    closing = threading.Event()

    def poll_loop() -> None:  # a poll loop, which another thread closes
        while not closing.is_set():
            consumer.poll(timeout=60)

    poller = threading.Thread(target=poll_loop, daemon=True)
    poller.start()
    wait_until(lambda: consumer.assignment() and _parked_reads(nodes, name) == 1)
    return consumer, closing, poller


@pytest.mark.parametrize(("own_client", "timeout"),
                         [(True, None), (True, 0.0), (False, None), (False, 5.0)])
def test_close_ends_a_parked_fetch_and_leaks_no_socket(
    request: pytest.FixtureRequest, backend: str, namespace: str, own_client: bool,
    timeout: float | None,
) -> None:
    """A fetch parked for a minute: close() wakes it, and once every client is closed (the
    caller's by the caller after close(); one made from ``redis_url`` by the consumer) no
    socket is left open. Before, on a cluster, the parked read failed under the closed client
    and redis-py read the topology again on a socket nobody closed."""
    before = {id(s) for s in _open_sockets()}
    name = namespace  # (every connection of this test's clients, on the shared servers)
    if backend == "single":
        server: EmbeddedServer = request.getfixturevalue("redis_server")
        url, nodes = server.url, [server.client()]
        client = server.client(client_name=name)
    else:
        cluster: EmbeddedCluster = request.getfixturevalue("redis_cluster")
        url, nodes = cluster.url, cluster.node_clients()
        client = cluster.client(client_name=name)
    try:
        without_join_delay(client, namespace)
        Topics(client, namespace).create("t", 1)
        config = ConsumerGroupConfig(
            group_id=namespace, topics=["t"], namespace=namespace, heartbeat_interval_ms=100,
            **({"redis_url": f"{url}?client_name={name}"} if own_client
               else {"redis_client": client}))
        consumer, closing, poller = _park_a_consumer(config, nodes, name)
        closing.set()
        consumer.close(timeout=timeout)
        poller.join()
        if timeout == 0:  # close(0) does not wait for the unblock: its thread sends it
            wait_until(lambda: _parked_reads(nodes, name) == 0)
        else:
            assert _parked_reads(nodes, name) == 0  # woken, not left parked for its minute
        if not own_client:
            client.close()
        # The consumer's threads end (the group's closes its client as it exits, after a
        # close(0) returned).
        _wait_for_the_consumer_threads_to_end(namespace)
        wait_until(lambda: _parked_reads(nodes, name) == 0)
        client.close()
        left = _ours([s for s in _open_sockets() if id(s) not in before], nodes, name)
        assert not left, "\n".join(f"{s} made at:\n{_made_at(s)}" for s in left)
    finally:
        client.close()
        for node in nodes:
            node.close()


def _made_at(obj: object) -> str:
    """Where ``obj`` was allocated (with PYTHONTRACEMALLOC set), for a failure's message."""
    tb = tracemalloc.get_object_traceback(obj)
    return "(set PYTHONTRACEMALLOC=30 to see)" if tb is None else "\n".join(tb.format())


def test_close_keeps_its_timeout_with_a_parked_fetch_and_a_stopped_server(
    own_server: EmbeddedServer, namespace: str
) -> None:
    """The server stops (SIGSTOP) under a parked fetch: the unblock gets no answer either,
    and close(0.5) still returns (the client has no socket timeout: a close that waited for
    the server would return only after SIGCONT, at the end of the test)."""
    client = own_server.client(socket_timeout=None)
    node = own_server.client()
    pid = own_server.pid
    assert pid is not None
    try:
        without_join_delay(client, namespace)
        Topics(client, namespace).create("t", 1)
        config = ConsumerGroupConfig(group_id=namespace, topics=["t"], namespace=namespace,
                                     heartbeat_interval_ms=100, redis_client=client)
        consumer, closing, poller = _park_a_consumer(config, [node], None)
        closing.set()
        os.kill(pid, signal.SIGSTOP)
        try:
            closer = threading.Thread(target=consumer.close, args=(0.5,), daemon=True)
            closer.start()
            closer.join(15.0)
            assert not closer.is_alive(), "close() waited for the server that does not answer"
        finally:
            os.kill(pid, signal.SIGCONT)
        poller.join()
        _wait_for_the_consumer_threads_to_end(namespace)
    finally:
        client.close()
        node.close()


def test_close_leaves_the_group_within_its_timeout_when_the_fetch_cannot_be_woken(
    own_server: EmbeddedServer, namespace: str
) -> None:
    """A user whose ACL allows ``CLIENT ID`` but not ``CLIENT UNBLOCK`` (``-@dangerous``): the
    parked fetch cannot be woken, and close(2) still leaves the group before it returns.
    Before, close() waited for the fetch first, for all of its timeout, and then gave the
    group's close (the LeaveGroup) none: the member was still in the group."""
    admin = own_server.client()
    admin.acl_setuser("worker", enabled=True, nopass=True, keys=["*"], channels=["*"],
                      commands=["+@all", "-client|unblock"])
    client = own_server.client(username="worker")
    try:
        without_join_delay(admin, namespace)
        Topics(client, namespace).create("t", 1)
        config = ConsumerGroupConfig(group_id=namespace, topics=["t"], namespace=namespace,
                                     heartbeat_interval_ms=100, redis_client=client)
        consumer, closing, poller = _park_a_consumer(config, [admin], None)
        closing.set()
        consumer.close(timeout=2.0)
        assert consumer.group.coordinator.describe_group(namespace).state == "Empty"
        admin.client_kill_filter(user="worker")  # ends the read parked for its minute
        poller.join()
        _wait_for_the_consumer_threads_to_end(namespace)
    finally:
        client.close()
        admin.close()


def test_a_parked_fetch_whose_connection_is_killed_reads_again_without_failing(
    redis_server: EmbeddedServer, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The parked read's connection is killed (CLIENT KILL, a proxy's idle timeout, a
    restart): the fetch reads again through the client, which reconnects, and the next record
    comes with no failed fetch. Before, the hand-rolled read raised ConnectionLost: a warning
    "fetch of t-0 failed" and a retry backoff, where the client's own xread retried."""
    admin, client = redis_server.client(), redis_server.client(client_name=namespace)
    try:
        without_join_delay(client, namespace)
        Topics(client, namespace).create("t", 1)
        config = ConsumerGroupConfig(group_id=namespace, topics=["t"], namespace=namespace,
                                     heartbeat_interval_ms=100, redis_client=client)
        with Consumer(config, fetch_max_wait_ms=60_000) as consumer:
            got: list[Any] = []
            poller = threading.Thread(target=lambda: got.extend(consumer.poll(timeout=60)),
                                      name=f"{namespace}-poll", daemon=True)
            poller.start()
            wait_until(lambda: consumer.assignment() and _parked_reads([admin], namespace) == 1)
            parked = [c for c in admin.client_list()
                      if c.get("cmd") == "xread" and c.get("name") == namespace]
            admin.client_kill_filter(_id=parked[0]["id"])
            # parked again, on a new one
            wait_until(lambda: _parked_reads([admin], namespace) == 1)
            Producer(client, namespace).send("t", b"v", partition=0)
            poller.join()
            assert [r.value for r in got] == [b"v"]
        # (this test's threads only: the poll's, the consumer's)
        assert not [r.getMessage() for r in caplog.records if "failed" in r.getMessage()
                    and (r.threadName == poller.name
                         or r.threadName.startswith(f"rcoord-{namespace}-"))]
    finally:
        client.close()
        admin.close()
