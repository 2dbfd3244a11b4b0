"""The asyncio front end shares the scripts and the sans-I/O core; run it on both backends."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis.asyncio
import redis.asyncio.cluster

from rcoord import CoordinatorConfig, Errors, GroupCoordinator, MemberIdentity, TopicPartition
from rcoord.asyncio import AsyncGroupCoordinator

JOIN = dict(protocol_type="consumer", protocols=[("range", b"m")], session_timeout_ms=5000,
            rebalance_timeout_ms=5000)


def _async_client(request: pytest.FixtureRequest, backend: str) -> Any:
    if backend == "single":
        server = request.getfixturevalue("redis_server")
        return redis.asyncio.Redis(host="127.0.0.1", port=server.port)
    cluster = request.getfixturevalue("redis_cluster")
    return redis.asyncio.cluster.RedisCluster(host="127.0.0.1", port=cluster.ports[0])


def test_members_form_a_group_and_commit(request, backend, redis_client, namespace):
    # The operator writes the namespace's settings with the blocking API.
    GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace, group_min_session_timeout_ms=10,
                                                     group_initial_rebalance_delay_ms=200)).start()

    async def scenario() -> None:
        client = _async_client(request, backend)
        coord = await AsyncGroupCoordinator(client, namespace).start()
        assert coord.config.group_initial_rebalance_delay_ms == 200
        ids = [(await coord.join_group("ag", **JOIN)).member_id for _ in range(3)]
        results = await asyncio.gather(*(coord.join_group("ag", i, **JOIN) for i in ids))
        assert {r.generation_id for r in results} == {1}
        leader = results[0].leader_id
        syncs = await asyncio.gather(*(
            coord.sync_group("ag", 1, i, assignments={m: m.encode() for m in ids} if i == leader else None)
            for i in ids))
        assert [s.assignment for s in syncs] == [i.encode() for i in ids]
        assert await coord.heartbeat("ag", 1, ids[0]) == Errors.NONE
        tp = TopicPartition("t", 0)
        assert await coord.commit_offsets("ag", {tp: 7}, member_id=ids[1], generation_id=1) == {tp: Errors.NONE}
        assert await coord.commit_offsets("ag", {tp: 9}, member_id=ids[1], generation_id=0) == {
            tp: Errors.ILLEGAL_GENERATION}
        assert (await coord.fetch_offsets("ag", [tp])).offsets[tp].offset == 7
        res = await coord.leave_group("ag", [MemberIdentity(ids[2]), MemberIdentity("ghost")])
        assert [m.error for m in res.members] == [Errors.NONE, Errors.UNKNOWN_MEMBER_ID]
        assert await coord.heartbeat("ag", 1, ids[0]) == Errors.REBALANCE_IN_PROGRESS
        await client.aclose()

    asyncio.run(scenario())


def test_async_and_blocking_members_share_one_group(request, backend, redis_client, namespace):
    sync_coord = GroupCoordinator(redis_client, CoordinatorConfig(
        namespace=namespace, group_min_session_timeout_ms=10, group_initial_rebalance_delay_ms=300)).start()

    async def scenario() -> None:
        client = _async_client(request, backend)
        coord = await AsyncGroupCoordinator(client, namespace).start()
        a = (await coord.join_group("mixed", **JOIN)).member_id
        b = sync_coord.join_group("mixed", **JOIN).member_id
        loop = asyncio.get_running_loop()
        ra, rb = await asyncio.gather(coord.join_group("mixed", a, **JOIN),
                                      loop.run_in_executor(None, lambda: sync_coord.join_group("mixed", b, **JOIN)))
        assert ra.generation_id == rb.generation_id == 1 and ra.leader_id == rb.leader_id
        await client.aclose()

    asyncio.run(scenario())


def test_async_errors_are_typed(request, backend, namespace):
    async def scenario() -> None:
        client = _async_client(request, backend)
        coord = AsyncGroupCoordinator(client, namespace)
        assert (await coord.join_group("", **JOIN)).error == Errors.INVALID_GROUP_ID
        with pytest.raises(TypeError):
            await coord.join_group("g", protocol_type="consumer", protocols="range", session_timeout_ms=10)
        await client.aclose()

    asyncio.run(scenario())
