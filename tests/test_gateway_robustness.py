"""What an untrusted peer can send the gateway: values from the wire that must not break it.

Each test names the wire value and what the gateway must do with it, as Kafka's broker does."""

from __future__ import annotations

import socket
import time

import pytest

pytest.importorskip("kio")

from gateway_harness import call_once, connect, request_frame, response, running_gateway

from rcoord.errors import Errors


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


def _closed_by_server(sock: socket.socket) -> bool:
    """True once the gateway closed ``sock`` (within the socket's own timeout)."""
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


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
            assert _closed_by_server(silent) and _closed_by_server(partial)
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
            assert _closed_by_server(sock)
        finally:
            sock.close()
