"""The asyncio front end shares the scripts and the sans-I/O core; run it on both backends."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis.asyncio
import redis.asyncio.cluster

from rcoord import (
    ConfigError,
    CoordinatorConfig,
    Errors,
    GroupCoordinator,
    MemberIdentity,
    TopicPartition,
)
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


def _pooled_client(request: pytest.FixtureRequest, backend: str, size: int) -> Any:
    if backend == "single":
        server = request.getfixturevalue("redis_server")
        return redis.asyncio.Redis(host="127.0.0.1", port=server.port, max_connections=size)
    cluster = request.getfixturevalue("redis_cluster")
    return redis.asyncio.cluster.RedisCluster(host="127.0.0.1", port=cluster.ports[0],
                                              max_connections=size)


def test_a_group_larger_than_the_client_pool_forms_on_one_loop(request, backend, redis_client,
                                                               namespace):
    """A reviewer's repro, scaled down: every parked call held a pooled connection with its own
    XREAD BLOCK, and redis.asyncio refuses a connection past the pool's size, so more members
    on one loop than the pool holds (100 by default) failed with ConnectionLost "Too many
    connections". They now share one read per wake stream, and the other commands wait for a
    place under half the pool."""
    from rcoord.keys import GroupKeys

    GroupCoordinator(redis_client, CoordinatorConfig(
        namespace=namespace, group_min_session_timeout_ms=10,
        group_initial_rebalance_delay_ms=300)).start()
    members, pool = 40, 12
    join = dict(JOIN, session_timeout_ms=30_000, rebalance_timeout_ms=30_000)

    async def scenario() -> None:
        client = _pooled_client(request, backend, pool)
        coord = await AsyncGroupCoordinator(client, namespace).start()
        ids = [(await coord.join_group("big", **join)).member_id for _ in range(members)]
        joined = await asyncio.gather(*(coord.join_group("big", i, **join) for i in ids))
        assert {r.error for r in joined} == {Errors.NONE}
        assert {r.generation_id for r in joined} == {1}
        leader = joined[0].leader_id
        followers = [asyncio.create_task(coord.sync_group("big", 1, i)) for i in ids if i != leader]
        wake = GroupKeys.of(namespace, coord.config.num_partitions, "big").wake
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        while coord._wake_reads.waiting(wake) < members - 1:  # every follower parked
            assert loop.time() < deadline, coord._wake_reads.waiting(wake)
            await asyncio.sleep(0.01)
        mine = await coord.sync_group("big", 1, leader, assignments={i: i.encode() for i in ids})
        assert mine.assignment == leader.encode()
        synced = await asyncio.gather(*followers)
        assert {s.error for s in synced} == {Errors.NONE}
        assert sorted(s.assignment for s in synced) == sorted(
            i.encode() for i in ids if i != leader)
        await client.aclose()

    asyncio.run(scenario())


def test_each_coordinator_takes_only_its_own_kind_of_client(request, backend, redis_client,
                                                             namespace):
    """A blocking client given to the asyncio coordinator ran its commands on the loop and then
    failed with "object list can't be used in 'await' expression"; the reverse, with
    "'coroutine' object is not subscriptable". An empty namespace= fell back to the default
    namespace on the asyncio coordinator only."""
    with pytest.raises(TypeError, match="AsyncGroupCoordinator needs a redis.asyncio client"):
        AsyncGroupCoordinator(redis_client, namespace)
    client = _async_client(request, backend)
    with pytest.raises(TypeError, match="GroupCoordinator needs a blocking client"):
        GroupCoordinator(client, namespace)
    async def start_empty() -> None:
        with pytest.raises(ConfigError, match="namespace"):
            await AsyncGroupCoordinator(client, namespace="").start()
        await client.aclose()

    asyncio.run(start_empty())
    with pytest.raises(ConfigError, match="namespace"):
        GroupCoordinator(redis_client, "").start()


def test_parked_reads_never_take_the_places_of_other_commands(request, backend, redis_client,
                                                              namespace):
    """A reviewer's repro: the reads shared the commands' bound, so with parked calls in as
    many groups as the bound, every place was held by a blocked read for up to a second, and a
    heartbeat (or the SyncGroup that would wake them) waited for one to end. Reads now have a
    bound of their own. Also: the bounds belong to the loop using them, so the coordinator works
    from a second ``asyncio.run`` (an asyncio.Semaphore binds to the loop that first waits)."""
    from rcoord.keys import GroupKeys

    GroupCoordinator(redis_client, CoordinatorConfig(
        namespace=namespace, group_min_session_timeout_ms=10,
        group_initial_rebalance_delay_ms=300)).start()
    client = _pooled_client(request, backend, 4)  # commands 2, reads 1
    coord = AsyncGroupCoordinator(client, namespace)
    join = dict(JOIN, session_timeout_ms=30_000, rebalance_timeout_ms=30_000)

    async def park_and_beat() -> None:
        await coord.start()
        groups, leaders, parked = ["r1", "r2"], {}, []
        for g in groups:
            ids = [(await coord.join_group(g, **join)).member_id for _ in range(2)]
            joined = await asyncio.gather(*(coord.join_group(g, i, **join) for i in ids))
            assert len({r.generation_id for r in joined}) == 1
            leaders[g] = (joined[0].leader_id, ids, joined[0].generation_id)
            parked += [asyncio.create_task(coord.sync_group(g, joined[0].generation_id, i))
                       for i in ids if i != joined[0].leader_id]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        wakes = [GroupKeys.of(namespace, coord.config.num_partitions, g).wake for g in groups]
        while not all(coord._wake_reads.waiting(w) for w in wakes):
            assert loop.time() < deadline
            await asyncio.sleep(0.01)
        # Both groups parked, one read place: it is taken, and the commands' places are free.
        assert coord._wake_reads._reads.locked() and not coord._wake_reads.commands().locked()
        for g, (leader, ids, gen) in leaders.items():
            await coord.sync_group(g, gen, leader, assignments={i: b"x" for i in ids})
        assert {s.error for s in await asyncio.gather(*parked)} == {Errors.NONE}
        await client.aclose()  # (its connections belong to this loop)

    async def burst() -> None:
        listed = await asyncio.gather(*(coord.list_groups() for _ in range(8)))
        assert all({"r1", "r2"} <= {g.group_id for g in found} for found in listed)
        await client.aclose()

    asyncio.run(park_and_beat())
    asyncio.run(burst())  # a second loop
