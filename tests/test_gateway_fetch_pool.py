"""Fetches parked waiting for records share the gateway's asyncio Redis pool with everything
else: they wait under a bound of their own (``GatewayState.fetch_waits``, one unit per
``XREAD BLOCK`` in flight), the pool makes a command wait for a connection instead of refusing
it, and a Fetch that cannot wait is answered with what it has. Before, each parked Fetch held a
pooled connection in ``XREAD BLOCK``: with more of them than the pool's size, Fetches,
heartbeats and joins failed ("Too many connections"). On a Redis Cluster a Fetch blocked on
every slot of its partitions at once, under one place of the bound: a few idle Fetches over
many partitions overran a node's pool. Also: Fetch error responses carry empty records, never
null."""

from __future__ import annotations

import asyncio
import collections
import json
import select
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("kio")

import redis.exceptions
from gateway_harness import (
    GatewayThread,
    connect,
    produced_batch,
    request_frame,
    response,
    running_gateway,
    sasl_connect,
    topics_of,
)
from harness import blocked_xreads, wait_until

from rcoord.gateway.auth import load_auth_file
from rcoord.gateway.error_responses import request_error_response
from rcoord.gateway.state import fetch_wait_limit
from rcoord.gateway.wire import build, request_class
from rcoord.topics import Record

NOT_LEADER_OR_FOLLOWER, TOPIC_AUTHORIZATION_FAILED, MEMBER_ID_REQUIRED = 6, 29, 79
POOL = 10
"""The asyncio pool of the gateway under test: fewer connections than parked Fetches."""
PARKED = POOL + 4


def _fetch_body(topic: str, max_wait: int, offset: int = 0, partitions: int = 1
                ) -> dict[str, Any]:
    return {"replica_id": -1, "max_wait": max_wait, "min_bytes": 1, "max_bytes": 1 << 20,
            "topics": [{"topic": topic, "partitions": [
                {"partition": p, "fetch_offset": offset, "partition_max_bytes": 1 << 20}
                for p in range(partitions)]}]}


def _produce_body(topic: str, value: bytes, partition: int = 0) -> dict[str, Any]:
    return {"acks": -1, "timeout": 10000, "topic_data": [
        {"name": topic, "partition_data": [
            {"index": partition, "records": produced_batch([Record(0, None, value, {}, 0)])}]}]}


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


def _join(calls: _Calls, group: str) -> tuple[int, str]:
    """Join ``group`` alone as its leader and sync (JoinGroup twice, SyncGroup): the generation
    and the member id."""
    join = {"group_id": group, "session_timeout": 30_000, "rebalance_timeout": 30_000,
            "member_id": "", "group_instance_id": None, "protocol_type": "consumer",
            "protocols": [{"name": "range", "metadata": b""}], "reason": None}
    first = calls.call(11, 9, join)
    assert first.error_code.value == MEMBER_ID_REQUIRED and first.member_id
    joined = calls.call(11, 9, {**join, "member_id": first.member_id})
    assert joined.error_code.value == 0 and joined.leader == first.member_id
    synced = calls.call(14, 5, {
        "group_id": group, "generation_id": joined.generation_id,
        "member_id": first.member_id, "group_instance_id": None,
        "protocol_type": "consumer", "protocol_name": "range",
        "assignments": [{"member_id": first.member_id, "assignment": b"a"}]})
    assert (synced.error_code.value, synced.assignment) == (0, b"a")
    return int(joined.generation_id), str(first.member_id)


def _beat(calls: _Calls, group: str, generation: int, member_id: str) -> int:
    """A Heartbeat's error code."""
    beat = calls.call(12, 4, {"group_id": group, "generation_id": generation,
                              "member_id": member_id, "group_instance_id": None})
    return int(beat.error_code.value)


@pytest.fixture
def small_pool(redis_server: Any, namespace: str) -> Iterator[GatewayThread]:
    """A gateway whose Redis clients have ``POOL`` connections (and few topic threads, so that
    the blocking client's pool of the same size is enough for them)."""
    with running_gateway(redis_server, namespace, topic_threads=4,
                         redis_kwargs={"max_connections": POOL, "client_name": namespace}) as gw:
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
        assert blocked_xreads(client, namespace) <= state.fetch_wait_limit

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
        generation, member_id = _join(other, "g")
        assert _beat(other, "g", generation, member_id) == 0
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

    class _Unsized:  # a client whose pool does not say its size
        nodes_manager = None

    assert fetch_wait_limit(_Unsized()) == 12  # FETCH_WAITS_UNSIZED, as redis-py's default pool


# -- the budget of connections ----------------------------------------------------------------


def _budget(units: int) -> Any:
    from rcoord.gateway.state import ConnectionBudget
    return ConnectionBudget(units)


async def _until(cond: Any) -> None:
    """Let the other tasks run until ``cond`` holds (a bounded number of loop turns)."""
    for _ in range(100):
        if cond():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition not reached")


def test_the_budget_takes_all_units_or_none() -> None:
    async def check() -> None:
        budget = _budget(3)
        assert await budget.take(2) and budget.free == 1
        assert not await budget.take(2, timeout=0.01)  # one free: none of it is taken
        assert (budget.free, budget.waiting) == (1, 0)
        assert await budget.take(1, timeout=0.01) and budget.free == 0
        budget.give(3)
        assert await budget.take(3) and budget.free == 0
        budget.give(3)
        for n in (0, 4):
            with pytest.raises(ValueError):
                await budget.take(n)
        with pytest.raises(ValueError):
            budget.give(1)  # more than were taken
        assert budget.free == 3

    asyncio.run(check())


def test_the_budget_serves_its_takers_in_turn_a_large_one_before_smaller_ones_behind_it(
        ) -> None:
    async def check() -> None:
        budget = _budget(4)
        assert await budget.take(3)
        got: list[str] = []

        async def taker(name: str, n: int) -> None:
            assert await budget.take(n)
            got.append(name)

        large = asyncio.create_task(taker("large", 4))
        await _until(lambda: budget.waiting == 1)
        small = asyncio.create_task(taker("small", 1))
        await _until(lambda: budget.waiting == 2)
        assert budget.free == 1 and not got  # enough for the small one, which stays behind
        budget.give(3)
        await large
        assert got == ["large"] and budget.free == 0 and not small.done()
        budget.give(4)
        await small
        assert got == ["large", "small"] and budget.free == 3

    asyncio.run(check())


def test_a_taker_that_leaves_the_line_lets_the_ones_behind_it_go_on() -> None:
    async def check() -> None:
        budget = _budget(2)
        assert await budget.take(2)
        # timed out at the head of the line
        timed = asyncio.create_task(budget.take(2, timeout=0.05))
        await _until(lambda: budget.waiting == 1)
        behind = asyncio.create_task(budget.take(1))
        await _until(lambda: budget.waiting == 2)
        budget.give(1)
        assert not behind.done() and budget.free == 1
        assert await timed is False
        assert await behind is True and (budget.free, budget.waiting) == (0, 0)
        # cancelled at the head of the line
        cancelled = asyncio.create_task(budget.take(2))
        await _until(lambda: budget.waiting == 1)
        behind = asyncio.create_task(budget.take(1))
        await _until(lambda: budget.waiting == 2)
        budget.give(1)
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        assert await behind is True and (budget.free, budget.waiting) == (0, 0)

    asyncio.run(check())


def test_units_granted_to_a_taker_as_it_is_cancelled_are_given_back() -> None:
    async def check() -> None:
        budget = _budget(1)
        assert await budget.take(1)
        late = asyncio.create_task(budget.take(1))
        await _until(lambda: budget.waiting == 1)
        budget.give(1)  # granted to ``late``, which has not run since
        assert budget.free == 0
        late.cancel()
        with pytest.raises(asyncio.CancelledError):
            await late
        assert (budget.free, budget.waiting) == (1, 0)
        assert await budget.take(1, timeout=0)

    asyncio.run(check())


# -- a Redis Cluster --------------------------------------------------------------------------


WIDE = 40
"""Partitions of the topic the cluster tests' Fetches wait on (in as many slots, or nearly)."""
SLOT_WAITS = 8
"""``rcoord.gateway.api_records.MAX_SLOT_WAITS``: slot groups a Fetch blocks on a round."""
CLUSTER_POOL = 20
"""Each node's asyncio pool in the cluster gateway under test: (20 - 10 - 5) // 2 = 2 units."""


def test_the_cluster_gateways_pools_have_its_size_which_sets_the_units(
        redis_cluster: Any) -> None:
    """The gateway's asyncio cluster client has pools of ``DEFAULT_MAX_CONNECTIONS`` per node
    unless the URL or kwargs say, and the Fetch waits' units are worked out from that size as
    on one node (a cluster had 64 places, whatever its pools)."""
    from rcoord.gateway import Gateway, GatewayConfig
    from rcoord.gateway.server import DEFAULT_MAX_CONNECTIONS

    async def check() -> None:
        url = redis_cluster.url
        for at, kwargs, size, units in (
                (url, {}, DEFAULT_MAX_CONNECTIONS, 12),  # (100 - 50 - 25) // 2
                (f"{url}?max_connections={CLUSTER_POOL}", {}, CLUSTER_POOL, 2),
                (url, {"max_connections": CLUSTER_POOL}, CLUSTER_POOL, 2)):  # (20 - 10 - 5) // 2
            gw = Gateway(GatewayConfig(listen_port=0), at, **kwargs)
            try:
                assert gw.state.cluster
                made = gw.state.redis
                assert made.nodes_manager.connection_kwargs["max_connections"] == size
                assert gw.state.fetch_wait_limit == fetch_wait_limit(made) == units
                assert await made.ping()
            finally:
                await gw.close()

    asyncio.run(check())


def test_idle_fetches_over_many_slots_leave_the_cluster_pools_to_a_heartbeating_member(
        redis_cluster: Any, namespace: str) -> None:
    """Six idle Fetches over 40 partitions each, on a gateway whose pools have 20 connections
    per node: they block on no more than the budget's units on any node, are not answered
    before their ``max_wait``, and a member heartbeats beside them without an error. Blocking
    on every slot at once, they sent some 80 ``XREAD``s per node and were answered
    NOT_LEADER_OR_FOLLOWER ("Too many connections"), and the heartbeats failed with them."""
    with topics_of(redis_cluster, namespace) as topics:
        topics.create("wide", WIDE)
    nodes = redis_cluster.node_clients()
    with running_gateway(redis_cluster, namespace, topic_threads=4,
                         redis_kwargs={"max_connections": CLUSTER_POOL,
                                       "client_name": namespace}) as gw:
        assert gw.gateway is not None
        state = gw.gateway.state
        member = _Calls(connect(gw))
        idle = [connect(gw) for _ in range(6)]
        try:
            generation, member_id = _join(member, "g")
            for i, sock in enumerate(idle):
                sock.sendall(request_frame(1, 12, i + 1, _fetch_body(
                    "wide", max_wait=120_000, partitions=WIDE)))
            wait_until(lambda: state.fetch_waiting == len(idle) or bool(_answered(idle)))
            assert not _answered(idle), "an idle Fetch was answered before its max_wait"

            seen: list[list[int]] = []

            def beat_and_look() -> None:
                assert _beat(member, "g", generation, member_id) == 0
                seen.append([blocked_xreads(node, namespace) for node in nodes])

            # heartbeats while the Fetches' rounds go by, some of them seen blocking
            wait_until(lambda: len(seen) >= 30 and sum(1 for s in seen if any(s)) >= 5,
                       step=beat_and_look)
            assert max(max(s) for s in seen) <= state.fetch_wait_limit, seen
            assert not _answered(idle) and state.fetch_waiting == len(idle)
            assert state.fetch_wait_limit == 2  # (20 - 10 - 5) // 2
        finally:
            member.sock.close()
            for sock in idle:
                sock.close()
            for node in nodes:
                node.close()


class _WatchedXreads:
    """The gateway's asyncio client, counting the ``XREAD``s of the Fetch waits in flight and
    the streams they block on (the gateway's loop updates it, the test reads it)."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self._lock = threading.Lock()
        self._keys: collections.Counter[str] = collections.Counter()
        self.reads = 0
        self.peak = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def blocked(self) -> set[str]:
        with self._lock:
            return {k for k, n in self._keys.items() if n > 0}

    async def xread(self, streams: dict[Any, Any], **kwargs: Any) -> Any:
        keys = [k if isinstance(k, str) else k.decode() for k in streams]
        with self._lock:
            self._keys.update(keys)
            self.reads += 1
            self.peak = max(self.peak, self.reads)
        try:
            return await self._client.xread(streams, **kwargs)
        finally:
            with self._lock:
                self._keys.subtract(keys)
                self.reads -= 1


def test_a_record_in_a_slot_not_blocked_on_this_round_still_answers_the_fetch(
        redis_cluster: Any, namespace: str) -> None:
    """A Fetch over 40 partitions blocks on ``MAX_SLOT_WAITS`` slot groups a round, in turn; a
    record produced to a partition it is not blocked on is found when its turn comes, long
    before the Fetch's ``max_wait`` (2 minutes; ``wait_until`` gives up well before)."""
    from rcoord.partitioning import keyslot
    from rcoord.topics import partition_key

    keys = [partition_key(namespace, "wide", p) for p in range(WIDE)]
    assert len({keyslot(k) for k in keys}) > SLOT_WAITS
    with topics_of(redis_cluster, namespace) as topics:
        topics.create("wide", WIDE)
    with running_gateway(redis_cluster, namespace) as gw:
        assert gw.gateway is not None
        state = gw.gateway.state
        assert state.fetch_wait_limit > SLOT_WAITS
        watched = _WatchedXreads(state.redis)
        state.redis = watched
        waiting = connect(gw)
        producer = _Calls(connect(gw))
        try:
            waiting.sendall(request_frame(1, 12, 1, _fetch_body("wide", max_wait=120_000,
                                                                 partitions=WIDE)))
            target: list[int] = []

            def not_blocked_on() -> bool:
                blocked = watched.blocked()
                target[:] = [p for p, k in enumerate(keys) if blocked and k not in blocked]
                return bool(target)

            wait_until(not_blocked_on)
            produced = producer.call(0, 9, _produce_body("wide", b"elsewhere", target[0]))
            assert produced.responses[0].partition_responses[0].error_code.value == 0
            wait_until(lambda: bool(_answered([waiting])))
            got = response(waiting, 1, 12, 5)
            assert got.error_code.value == 0
            parts = {p.partition_index: p for p in got.responses[0].partitions}
            assert all(p.error_code.value == 0 for p in parts.values())
            assert parts[target[0]].records and b"elsewhere" in parts[target[0]].records
            assert watched.peak == SLOT_WAITS
        finally:
            waiting.close()
            producer.sock.close()
    from rcoord.gateway.api_records import MAX_SLOT_WAITS
    assert MAX_SLOT_WAITS == SLOT_WAITS
