"""Fetches parked waiting for records share the gateway's asyncio Redis pool with everything
else: they wait under a bound of their own (``GatewayState.fetch_waits``), the pool makes a
command wait for a connection instead of refusing it, and a Fetch that cannot wait is answered
with what it has. Before, each parked Fetch held a pooled connection in ``XREAD BLOCK``: with
more of them than the pool's size, Fetches, heartbeats and joins failed ("Too many
connections"). Also: Fetch error responses carry empty records, never null."""

from __future__ import annotations

import asyncio
import json
import select
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("kio")

import redis.exceptions
from gateway_harness import (
    GatewayThread,
    connect,
    request_frame,
    response,
    running_gateway,
    sasl_connect,
    topics_of,
)
from harness import wait_until

from rcoord.gateway.auth import load_auth_file
from rcoord.gateway.error_responses import request_error_response
from rcoord.gateway.records import encode_batch
from rcoord.gateway.state import FETCH_WAITS_CLUSTER, fetch_wait_limit
from rcoord.gateway.wire import build, request_class
from rcoord.topics import Record

NOT_LEADER_OR_FOLLOWER, TOPIC_AUTHORIZATION_FAILED, MEMBER_ID_REQUIRED = 6, 29, 79
POOL = 10
"""The asyncio pool of the gateway under test: fewer connections than parked Fetches."""
PARKED = POOL + 4


def _fetch_body(topic: str, max_wait: int, offset: int = 0) -> dict[str, Any]:
    return {"replica_id": -1, "max_wait": max_wait, "min_bytes": 1, "max_bytes": 1 << 20,
            "topics": [{"topic": topic, "partitions": [
                {"partition": 0, "fetch_offset": offset, "partition_max_bytes": 1 << 20}]}]}


def _produce_body(topic: str, value: bytes) -> dict[str, Any]:
    return {"acks": -1, "timeout": 10000, "topic_data": [
        {"name": topic, "partition_data": [
            {"index": 0, "records": encode_batch([Record(0, None, value, {}, 0)])}]}]}


def _answered(socks: list[socket.socket]) -> list[socket.socket]:
    """The sockets with something to read (a response, or the connection closed)."""
    return select.select(socks, [], [], 0)[0] if socks else []


class _Calls:
    """One raw connection: ``call`` sends a request and reads its response."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.corr = 100

    def call(self, key: int, version: int, body: dict[str, Any], header_bytes: int = 5) -> Any:
        self.corr += 1
        self.sock.sendall(request_frame(key, version, self.corr, body))
        return response(self.sock, key, version, header_bytes)


def _blocked_xreads(client: Any) -> int:
    return sum(1 for c in client.client_list()
               if c.get("cmd") == "xread" and "b" in c.get("flags", ""))


@pytest.fixture
def small_pool(redis_server: Any, namespace: str) -> Iterator[GatewayThread]:
    """A gateway whose Redis clients have ``POOL`` connections (and few topic threads, so that
    the blocking client's pool of the same size is enough for them)."""
    with running_gateway(redis_server, namespace, redis_kwargs={"max_connections": POOL},
                         topic_threads=4) as gw:
        yield gw


def test_parked_fetches_beyond_the_pool_leave_room_for_every_other_request(
        small_pool: GatewayThread, redis_server: Any, namespace: str) -> None:
    gw = small_pool
    assert gw.gateway is not None
    state = gw.gateway.state
    with topics_of(redis_server, namespace) as topics:
        topics.create("idle", 1)
        topics.create("busy", 1)
    parked = [connect(gw) for _ in range(PARKED)]
    other = _Calls(connect(gw))
    client = redis_server.client()
    try:
        # More Fetches wait for records than the asyncio pool has connections.
        for i, sock in enumerate(parked):
            sock.sendall(request_frame(1, 12, i + 1, _fetch_body("idle", max_wait=120_000)))
        wait_until(lambda: state.fetch_waiting == PARKED or bool(_answered(parked)))
        assert not _answered(parked), "a parked Fetch was answered before its max_wait"
        # (nothing else blocks on this server now: the group calls come later)
        assert _blocked_xreads(client) <= state.fetch_wait_limit

        # Meanwhile another connection is served: ApiVersions, Metadata, Produce, a Fetch with
        # records, and a whole group round (JoinGroup twice, SyncGroup, Heartbeat).
        assert other.call(18, 3, {"client_software_name": "t", "client_software_version": "1"},
                          header_bytes=4).error_code.value == 0
        meta = other.call(3, 12, {"topics": [{"name": "busy"}, {"name": "idle"}],
                                  "allow_auto_topic_creation": False})
        assert sorted((t.name, t.error_code.value) for t in meta.topics) == [
            ("busy", 0), ("idle", 0)]
        produced = other.call(0, 9, _produce_body("busy", b"ready"))
        assert produced.responses[0].partition_responses[0].error_code.value == 0
        fetched = other.call(1, 12, _fetch_body("busy", max_wait=120_000))
        part = fetched.responses[0].partitions[0]
        assert (fetched.error_code.value, part.error_code.value) == (0, 0)
        assert part.records and b"ready" in part.records
        join = {"group_id": "g", "session_timeout": 30_000, "rebalance_timeout": 30_000,
                "member_id": "", "group_instance_id": None, "protocol_type": "consumer",
                "protocols": [{"name": "range", "metadata": b""}], "reason": None}
        first = other.call(11, 9, join)
        assert first.error_code.value == MEMBER_ID_REQUIRED and first.member_id
        joined = other.call(11, 9, {**join, "member_id": first.member_id})
        assert joined.error_code.value == 0 and joined.leader == first.member_id
        synced = other.call(14, 5, {
            "group_id": "g", "generation_id": joined.generation_id,
            "member_id": first.member_id, "group_instance_id": None,
            "protocol_type": "consumer", "protocol_name": "range",
            "assignments": [{"member_id": first.member_id, "assignment": b"a"}]})
        assert (synced.error_code.value, synced.assignment) == (0, b"a")
        beat = other.call(12, 4, {"group_id": "g", "generation_id": joined.generation_id,
                                  "member_id": first.member_id, "group_instance_id": None})
        assert beat.error_code.value == 0
        assert not _answered(parked) and state.fetch_waiting == PARKED

        # A record for them: every parked Fetch is answered with it, none with an error.
        produced = other.call(0, 9, _produce_body("idle", b"wake"))
        assert produced.responses[0].partition_responses[0].error_code.value == 0
        for sock in parked:
            got = response(sock, 1, 12, 5)
            part = got.responses[0].partitions[0]
            assert (got.error_code.value, part.error_code.value) == (0, 0)
            assert part.records and b"wake" in part.records
        wait_until(lambda: state.fetch_waiting == 0)
    finally:
        client.close()
        other.sock.close()
        for sock in parked:
            sock.close()


def test_a_fetch_without_a_place_is_answered_empty_at_its_max_wait(
        small_pool: GatewayThread, redis_server: Any, namespace: str) -> None:
    """Kafka's purgatory answers an expired Fetch with what it has: so does a Fetch that got no
    place to wait in (``fetch_wait_limit`` is 1 here) before its ``max_wait`` ended."""
    gw = small_pool
    assert gw.gateway is not None
    state = gw.gateway.state
    assert state.fetch_wait_limit == 1
    with topics_of(redis_server, namespace) as topics:
        topics.create("idle", 1)
    holders = [connect(gw) for _ in range(3)]
    late = _Calls(connect(gw))
    try:
        for i, sock in enumerate(holders):
            sock.sendall(request_frame(1, 12, i + 1, _fetch_body("idle", max_wait=120_000)))
        wait_until(lambda: state.fetch_waiting == len(holders) or bool(_answered(holders)))
        for _ in range(3):
            got = late.call(1, 12, _fetch_body("idle", max_wait=50))
            part = got.responses[0].partitions[0]
            assert (got.error_code.value, part.error_code.value) == (0, 0)
            assert part.records == b"" and part.high_watermark == 0
        assert not _answered(holders) and state.fetch_waiting == len(holders)
    finally:
        late.sock.close()
        for sock in holders:
            sock.close()


def test_no_connection_for_a_wait_is_the_retriable_fetch_error_not_an_unknown_one(
        gateway: GatewayThread, topics: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A redis-py ConnectionError out of the wait (the pool had no connection for it) is
    answered NOT_LEADER_OR_FOLLOWER, as Redis unavailable is (docs/gateway.md, "Bad requests"),
    with empty records; it was UNKNOWN_SERVER_ERROR (-1), answered at once, and the client asked
    again at once."""
    topics.create("idle", 1)
    assert gateway.gateway is not None
    asked = []

    async def no_connection(*args: Any, **kwargs: Any) -> Any:
        asked.append(kwargs.get("block"))
        raise redis.exceptions.MaxConnectionsError("Too many connections")

    monkeypatch.setattr(gateway.gateway.state.redis, "xread", no_connection)
    calls = _Calls(connect(gateway))
    try:
        got = calls.call(1, 12, _fetch_body("idle", max_wait=30_000))
    finally:
        calls.sock.close()
    part = got.responses[0].partitions[0]
    assert (got.error_code.value, part.error_code.value) == (NOT_LEADER_OR_FOLLOWER,
                                                             NOT_LEADER_OR_FOLLOWER)
    assert part.records == b""
    assert len(asked) == 1 and 1 <= asked[0] <= gateway.gateway.state.block_limit_ms


def test_a_fetch_refused_by_acls_carries_empty_records(
        redis_server: Any, namespace: str, tmp_path: Path) -> None:
    """TOPIC_AUTHORIZATION_FAILED with records b"", as Kafka's MemoryRecords.EMPTY: null
    (size -1) is what librdkafka logged as "invalid MessageSetSize -1"."""
    path = tmp_path / "auth.json"
    path.write_text(json.dumps({"users": {"alice": "pw"}, "acls": [
        {"principal": "User:alice", "resource": "topic", "name": "open",
         "operations": ["READ"]}]}))
    with topics_of(redis_server, namespace) as topics:
        topics.create("open", 1)
        topics.create("secret", 1)
    with running_gateway(redis_server, namespace, auth=load_auth_file(path)) as gw:
        calls = _Calls(sasl_connect(gw, "alice", "pw"))
        try:
            got = calls.call(1, 12, {**_fetch_body("open", max_wait=0), "topics": [
                {"topic": t, "partitions": [{"partition": 0, "fetch_offset": 0,
                                             "partition_max_bytes": 1 << 20}]}
                for t in ("secret", "open")]})
        finally:
            calls.sock.close()
    parts = {t.topic: t.partitions[0] for t in got.responses}
    assert parts["secret"].error_code.value == TOPIC_AUTHORIZATION_FAILED
    assert parts["secret"].records == b""
    assert parts["open"].error_code.value == 0 and parts["open"].records == b""


@pytest.mark.parametrize("version", [4, 7, 12])
def test_a_fetch_failed_as_a_whole_carries_empty_records(version: int) -> None:
    request = build(request_class(1, version), _fetch_body("t", max_wait=0))
    body = request_error_response(1, version, request, NOT_LEADER_OR_FOLLOWER)
    assert body is not None
    assert [p["records"] for t in body["responses"] for p in t["partitions"]] == [b""]


def test_the_single_node_pool_waits_for_a_connection(redis_server: Any) -> None:
    """A ``BlockingConnectionPool`` of redis-py's size, or the one the URL or kwargs give; the
    Fetch waits' bound leaves room beside the coordinator's share."""
    from rcoord.gateway.server import DEFAULT_MAX_CONNECTIONS, async_single_node

    async def check() -> None:
        made = async_single_node(redis_server.url)
        try:
            pool = made.connection_pool
            assert isinstance(pool, redis.asyncio.BlockingConnectionPool)
            assert pool.max_connections == DEFAULT_MAX_CONNECTIONS
            assert fetch_wait_limit(made) == 12  # (100 - 50 - 25) // 2
            assert await made.ping()
        finally:
            await made.aclose()
        for made in (async_single_node(redis_server.url + "?max_connections=8"),
                     async_single_node(redis_server.url, max_connections=8)):
            assert made.connection_pool.max_connections == 8
            assert fetch_wait_limit(made) == 1
            await made.aclose()

    asyncio.run(check())

    class _Cluster:  # what redis.asyncio.RedisCluster has instead: no connection_pool
        nodes_manager = None

    assert fetch_wait_limit(_Cluster()) == FETCH_WAITS_CLUSTER
