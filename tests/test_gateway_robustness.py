"""What an untrusted peer can send the gateway: values from the wire that must not break it.

Each test names the wire value and what the gateway must do with it, as Kafka's broker does."""

from __future__ import annotations

import time
from typing import Any

import pytest

pytest.importorskip("kio")

from gateway_harness import connect, request_frame, response, running_gateway

from rcoord.errors import Errors


def _call(gw: Any, key: int, version: int, body: dict[str, Any]) -> Any:
    sock = connect(gw)
    try:
        sock.sendall(request_frame(key, version, 3, body))
        return response(sock, key, version, 5)
    finally:
        sock.close()


def test_a_fetch_that_waits_longer_than_the_redis_socket_timeout_is_answered_empty(
        redis_server, namespace, topics):
    # Fetch's max_wait comes from the client (fetch.max.wait.ms, any int32). The wait is an
    # XREAD BLOCK on the gateway's Redis connection; blocked past the socket timeout, redis-py
    # gave up and the Fetch was answered UNKNOWN_SERVER_ERROR on every partition.
    topics.create("quiet", 1)
    with running_gateway(redis_server, namespace, redis_kwargs={"socket_timeout": 0.5}) as gw:
        started = time.monotonic()
        fetched = _call(gw, 1, 12, {
            "replica_id": -1, "max_wait": 1500, "min_bytes": 1, "max_bytes": 1 << 20,
            "topics": [{"topic": "quiet", "partitions": [
                {"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1 << 20}]}]})
        waited = time.monotonic() - started
    assert fetched.error_code.value == Errors.NONE
    (part,) = fetched.responses[0].partitions
    assert part.error_code.value == Errors.NONE and not part.records
    assert waited >= 1.4  # the whole max_wait, not cut short by the socket timeout
