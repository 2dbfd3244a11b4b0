"""What an untrusted peer can send the gateway: values from the wire that must not break it.

Each test names the wire value and what the gateway must do with it, as Kafka's broker does."""

from __future__ import annotations

import contextlib
import select
import socket
import time

import pytest

pytest.importorskip("kio")

from gateway_harness import (
    call_once,
    closed_by_gateway,
    connect,
    request_frame,
    response,
    running_gateway,
)
from harness import WAIT_S, wait_until

from rcoord.errors import Errors
from rcoord.gateway.auth import load_auth_file


def test_a_fetch_that_waits_longer_than_the_redis_socket_timeout_is_answered_empty(
        redis_server, namespace, topics):
    # Fetch's max_wait comes from the client (fetch.max.wait.ms, any int32). The wait is an
    # XREAD BLOCK on the gateway's Redis connection; blocked past the socket timeout, redis-py
    # gave up and the Fetch was answered UNKNOWN_SERVER_ERROR on every partition.
    topics.create("quiet", 1)
    with running_gateway(redis_server, namespace, redis_kwargs={"socket_timeout": 0.5}) as gw:
        started = time.monotonic()
        fetched = call_once(gw, 1, 12, {
            "replica_id": -1, "max_wait": 1500, "min_bytes": 1, "max_bytes": 1 << 20,
            "topics": [{"topic": "quiet", "partitions": [
                {"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1 << 20}]}]})
        waited = time.monotonic() - started
    assert fetched.error_code.value == Errors.NONE
    (part,) = fetched.responses[0].partitions
    assert part.error_code.value == Errors.NONE and not part.records
    assert waited >= 1.4  # the whole max_wait, not cut short by the socket timeout


def test_idle_and_half_sent_connections_are_closed_and_busy_ones_kept(redis_server, namespace):
    # Kafka's connections.max.idle.ms: before it, a peer that connected and stayed silent, or
    # sent a size prefix and part of a frame, held its task (and up to a frame's buffer) for
    # ever; with SASL on, without ever authenticating.
    with running_gateway(redis_server, namespace, connections_max_idle_ms=300) as gw:
        silent, partial, active = connect(gw), connect(gw), connect(gw)
        try:
            for s in (silent, partial):
                s.settimeout(5)  # far above the 300-450 ms it should take
            partial.sendall((1000).to_bytes(4, "big") + b"\x00\x12")  # then nothing
            started = time.monotonic()
            # The active connection asks for ApiVersions every 100 ms for 1.2 s, longer than
            # the limit; each request resets its idle time, so it stays open.
            for corr in range(12):
                active.sendall(request_frame(18, 0, corr, {}))
                assert response(active, 18, 0, 4).error_code.value == Errors.NONE
                time.sleep(0.1)
            assert time.monotonic() - started >= 1.0
            assert closed_by_gateway(silent) and closed_by_gateway(partial)
        finally:
            for s in (silent, partial, active):
                s.close()


def test_a_parked_request_is_not_idle(redis_server, namespace, topics):
    # A Fetch waiting for records (max_wait) is a request in progress, however long.
    topics.create("slow", 1)
    with running_gateway(redis_server, namespace, connections_max_idle_ms=200) as gw:
        fetched = call_once(gw, 1, 12, {
            "replica_id": -1, "max_wait": 700, "min_bytes": 1, "max_bytes": 1 << 20,
            "topics": [{"topic": "slow", "partitions": [
                {"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1 << 20}]}]})
    assert fetched.error_code.value == Errors.NONE


def test_close_ends_a_parked_fetch_whose_first_cancel_was_lost(redis_server, namespace, topics,
                                                                monkeypatch):
    # On Python 3.11 one cancel() can be lost: asyncio.wait_for (redis-py awaits each command's
    # write with it) returns the inner result when the cancel comes as that completes. A Fetch
    # cancelled at that moment went on into its XREAD BLOCK, and close() (so SIGTERM) waited
    # for it up to the Fetch's max_wait. Here the wait loses the first cancel every time.
    import asyncio
    import threading

    from rcoord.gateway import api_records

    parked = threading.Event()

    async def loses_one_cancel(*_: object) -> None:
        parked.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            pass  # as 3.11's wait_for does when its inner call has just completed
        await asyncio.sleep(3600)

    monkeypatch.setattr(api_records, "_wait_for_records", loses_one_cancel)
    topics.create("idle", 1)
    with running_gateway(redis_server, namespace) as gw:
        sock = connect(gw)
        try:
            sock.sendall(request_frame(1, 12, 2, {
                "replica_id": -1, "max_wait": 600_000, "min_bytes": 1, "max_bytes": 1 << 20,
                "topics": [{"topic": "idle", "partitions": [
                    {"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1 << 20}]}]}))
            assert parked.wait(10), "the Fetch never parked"
            assert gw.gateway is not None
            closing = asyncio.run_coroutine_threadsafe(gw.gateway.close(), gw.loop)
            closing.result(10)  # (before: TimeoutError, the Fetch's task still parked)
            sock.settimeout(10)
            assert closed_by_gateway(sock)
        finally:
            sock.close()


def _flood_without_reading(sock: socket.socket, request: bytes) -> None:
    """Send ``request`` over and over, never reading, until the gateway stops reading them:
    its answers fill the peer's tiny receive window and its own write buffer."""
    blob = request * 4096
    sock.setblocking(False)
    while select.select([], [sock], [], 0.5)[1]:  # (writable: the gateway still reads)
        try:
            sock.send(blob)
        except BlockingIOError:
            pass
        except ConnectionError:  # closed by the gateway already (not authenticated in time)
            return


@pytest.mark.parametrize("auth", [False, True])
def test_a_peer_that_never_reads_is_closed_all_the_same(redis_server, namespace, tmp_path,
                                                        auth):
    # Requests sent, answers never read (a zero receive window): the gateway's answers wait in
    # its write buffer. Closed as idle (or as not authenticated), the connection waited in
    # wait_closed() for that buffer to drain, which it never did, out of the idle sweep's
    # sight: its task and socket stayed until the gateway stopped. ApiVersions v4 is not
    # served, and so may be repeated before authentication too.
    config: dict[str, object] = {"connections_max_idle_ms": 300}
    if auth:
        path = tmp_path / "auth.json"
        path.write_text('{"users": {"alice": "secret"}}')
        config["auth"] = load_auth_file(path)
    with running_gateway(redis_server, namespace, **config) as gw:
        assert gw.gateway is not None
        sock = socket.socket()
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
            sock.connect(gw.address)
            _flood_without_reading(sock, _api_versions_v4())
            wait_until(lambda: not gw.gateway._tasks and not gw.gateway._conns)
        finally:
            sock.close()


def _api_versions_v4() -> bytes:
    """ApiVersions at a version the gateway does not serve: answered at v0 with the table."""
    body = (18).to_bytes(2, "big") + (4).to_bytes(2, "big") + (1).to_bytes(4, "big") + \
        b"\xff\xff"
    return len(body).to_bytes(4, "big") + body


@pytest.mark.parametrize("reads", [True, False])
def test_a_closing_connection_flushes_its_last_answers_within_a_bound(reads):
    # A connection that ends in order (the client's EOF, a refused authentication's answer)
    # still sends what is buffered to a peer that reads it; to one that does not, it gives up
    # after the bound (the gateway's connections_max_idle_ms) instead of waiting for ever.
    import asyncio
    import threading

    from rcoord.gateway.server import close_connection

    data = b"x" * (1 << 20 if reads else 64 << 20)  # (64 MB: more than the kernel buffers)
    received: list[int] = []

    def read_all(peer: socket.socket) -> None:
        with contextlib.suppress(ConnectionResetError):
            while chunk := peer.recv(1 << 16):
                received.append(len(chunk))

    async def main(server_side: socket.socket, peer: socket.socket) -> None:
        _, writer = await asyncio.open_connection(sock=server_side)
        writer.write(data)
        reader = threading.Thread(target=read_all, args=(peer,), daemon=True)
        if reads:
            reader.start()
        async with asyncio.timeout(WAIT_S):  # (before: wait_closed() waited for ever)
            await close_connection(writer, WAIT_S if reads else 0.2)
        if not reads:
            reader.start()  # reads what the kernel held, then the end of the connection
        await asyncio.to_thread(reader.join, WAIT_S)
        assert not reader.is_alive()

    with socket.create_server(("127.0.0.1", 0)) as listener, socket.socket() as peer:
        peer.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
        peer.connect(listener.getsockname())
        server_side, _ = listener.accept()
        asyncio.run(main(server_side, peer))
    if reads:
        assert sum(received) == len(data)
    else:
        assert sum(received) < len(data)
