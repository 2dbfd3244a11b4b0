"""Review 80 of the asyncio driver's commits with ``required_acks`` and of ``delete_groups``:
reproductions of defects found, each failing on the code it was written against."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
import redis
import redis.asyncio
import redis.cluster

from rcoord import CoordinatorConfig, Errors, GroupCoordinator, TopicPartition
from rcoord.asyncio import AsyncGroupCoordinator
from rcoord.asyncio.cluster import AsyncClusterClient
from rcoord.connect import ClusterClient
from rcoord.keys import GroupKeys

TP = TopicPartition("t", 0)


def _config() -> CoordinatorConfig:
    return CoordinatorConfig(namespace="a" + uuid.uuid4().hex[:10], num_partitions=4)


@pytest.mark.parametrize("driver", ["blocking", "asyncio"])
def test_a_commit_with_acks_is_answered_after_its_slot_left_the_clients_map(
        redis_cluster, driver):
    """A cluster client's map loses a slot no master served when it was read (a failover, a
    slot move under way); the next call on the slot reads the map again. The blocking driver's
    ``MasterOf`` and replica wait look the group's master up through that refresh (rcoord's
    ``ClusterClient.get_node_from_key``); the asyncio one looked it up in the map as it was,
    and the commit, stored meanwhile, failed ``ConnectionLost`` (``SlotNotCoveredError``)
    where the blocking driver answered. No replica here: the answer is
    COORDINATOR_NOT_AVAILABLE, with the offset on the master."""
    cfg = _config()
    keys = GroupKeys.of(cfg.namespace, cfg.num_partitions, "g")
    slot = redis.cluster.key_slot(keys.partition.acks.encode())
    port = redis_cluster.ports[0]
    if driver == "blocking":
        client = ClusterClient(host="127.0.0.1", port=port, require_full_coverage=False)
        try:
            coord = GroupCoordinator(client, cfg).start()
            client.nodes_manager.slots_cache.pop(slot)  # what a read of the map leaves then
            got = coord.commit_offsets("g", {TP: 7}, required_acks=1, ack_timeout_ms=20)
            assert got == {TP: Errors.COORDINATOR_NOT_AVAILABLE}
            assert coord.fetch_offsets("g", [TP]).offsets[TP].offset == 7
        finally:
            client.close()
        return

    async def scenario() -> None:
        aclient = AsyncClusterClient(host="127.0.0.1", port=port, require_full_coverage=False)
        try:
            acoord = await AsyncGroupCoordinator(aclient, cfg).start()
            aclient.nodes_manager.slots_cache.pop(slot)  # (as above)
            got = await acoord.commit_offsets("g", {TP: 7}, required_acks=1, ack_timeout_ms=20)
            assert got == {TP: Errors.COORDINATOR_NOT_AVAILABLE}
            assert (await acoord.fetch_offsets("g", [TP])).offsets[TP].offset == 7
        finally:
            await aclient.aclose()

    asyncio.run(scenario())


async def _until(condition: Any, timeout_s: float = 10.0) -> None:
    """Wait (polling, bounded) until ``condition()`` holds."""
    async with asyncio.timeout(timeout_s):
        while not condition():
            await asyncio.sleep(0.01)


def _waiting_in_wait(server: Any) -> bool:
    with server.client() as admin:
        return any(c.get("cmd") == "wait" for c in admin.client_list())


def test_a_replica_wait_does_not_hold_a_place_a_heartbeat_needs(redis_server):
    """A commit's WAIT blocks its connection for up to ``ack_timeout_ms``, as a parked call's
    stream read does for its block; it took a place under the commands' bound, which on a
    client with a small pool (``max_connections=2``: one place) is every place, so another
    member's heartbeat waited behind it for the whole ack timeout (a member's session can be
    shorter). It now waits under the blocking reads' bound, as those reads do."""
    cfg = _config()

    async def scenario() -> None:
        client = redis.asyncio.Redis(host="127.0.0.1", port=redis_server.port,
                                     max_connections=2)
        coord = AsyncGroupCoordinator(client, cfg)
        try:
            await coord.start()
            # No replica: the WAIT lasts its whole timeout (far longer than a heartbeat).
            commit = asyncio.ensure_future(coord.commit_offsets(
                "g", {TP: 1}, required_acks=1, ack_timeout_ms=10_000))
            await _until(lambda: _waiting_in_wait(redis_server) or commit.done())
            beat = asyncio.ensure_future(coord.heartbeat("other", 1, "m"))
            done, _ = await asyncio.wait({beat, commit}, return_when=asyncio.FIRST_COMPLETED)
            assert beat in done and not commit.done(), "the heartbeat waited for the WAIT"
            assert beat.result() == Errors.UNKNOWN_MEMBER_ID
            commit.cancel()
            await asyncio.wait({commit})
        finally:
            await coord.close()
            await client.aclose()

    asyncio.run(scenario())


@pytest.mark.parametrize("backend", ["single", "cluster"])
def test_a_stale_pooled_connection_does_not_fail_a_stored_commit_with_acks(
        request, backend):
    """The server dropped the client's idle connections (a restart of the proxy, ``timeout``,
    ``CLIENT KILL``) after the commit's script ran and before its replica wait. redis-py sends
    a command again on a fresh connection when the pooled one turns out closed, and so does the
    single node's pipeline; the cluster's wait went through one node's ``execute_pipeline``,
    which does not, and the stored commit was reported ``ConnectionLost``. INCR and WAIT are
    safe to send again on another connection (WAIT counts that connection's INCR, after the
    commit in the replication stream). No replica: the answer is COORDINATOR_NOT_AVAILABLE."""
    from rcoord import ConnectionLost

    cfg = _config()
    keys = GroupKeys.of(cfg.namespace, cfg.num_partitions, "g")
    if backend == "single":
        server = request.getfixturevalue("redis_server")
        port = server.port
    else:
        cluster = request.getfixturevalue("redis_cluster")
        with redis.cluster.RedisCluster(host="127.0.0.1", port=cluster.ports[0]) as probe:
            port = int(probe.get_node_from_key(keys.partition.acks).port)

    async def scenario() -> None:
        if backend == "single":
            client: Any = redis.asyncio.Redis(host="127.0.0.1", port=port)
        else:
            client = AsyncClusterClient(host="127.0.0.1", port=port)
        coord = AsyncGroupCoordinator(client, cfg)
        scripts = coord._scripts
        real = scripts.acall
        killed = []

        async def then_drop_connections(name: str, *args: Any) -> Any:
            reply = await real(name, *args)
            if name == "commit_offsets":  # stored: the group's master drops its clients
                with redis.Redis(host="127.0.0.1", port=port) as admin:
                    killed.append(admin.execute_command(
                        "CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"))
            return reply

        try:
            await coord.start()
            scripts.acall = then_drop_connections  # type: ignore[method-assign]
            try:
                got = await coord.commit_offsets("g", {TP: 5}, required_acks=1,
                                                 ack_timeout_ms=20)
            except ConnectionLost as exc:
                pytest.fail(f"a stored commit reported lost: {exc!r}")
            assert killed and killed[0] >= 1  # (the pooled connection was dropped)
            assert got == {TP: Errors.COORDINATOR_NOT_AVAILABLE}
            assert (await coord.fetch_offsets("g", [TP])).offsets[TP].offset == 5
        finally:
            await coord.close()
            await client.aclose()

    asyncio.run(scenario())


@pytest.mark.parametrize("backend", ["single", "cluster"])
def test_a_delete_cancelled_after_its_script_ran_still_drops_the_replay_record(
        request, backend):
    """``delete_groups`` deletes the group (its script), then the group's Spark replay record
    (another slot, a DEL of its own). A caller's task cancelled between the two (its
    ``asyncio.timeout``, a shutdown) left the record behind, the group gone: a group made
    again under that id started with the old one's replays, and deleting it again answered
    GROUP_ID_NOT_FOUND without a DEL. The two now run to their end (the flow's ``Unbroken``),
    and the cancellation is raised after them."""
    from rcoord.keys import replays_key

    cfg = _config()
    if backend == "single":
        server = request.getfixturevalue("redis_server")
        blocking: Any = server.client()
        make: Any = lambda: redis.asyncio.Redis(host="127.0.0.1", port=server.port)
    else:
        port = request.getfixturevalue("redis_cluster").ports[0]
        blocking = ClusterClient(host="127.0.0.1", port=port)
        make = lambda: AsyncClusterClient(host="127.0.0.1", port=port)
    request.addfinalizer(blocking.close)
    record = replays_key(cfg.namespace, "g")

    async def scenario() -> None:
        client = make()
        coord = AsyncGroupCoordinator(client, cfg)
        scripts = coord._scripts
        real = scripts.acall
        ran, proceed = asyncio.Event(), asyncio.Event()

        async def then_pause(name: str, *args: Any) -> Any:
            reply = await real(name, *args)
            if name == "delete_group":  # the group is gone; its record not yet
                ran.set()
                await proceed.wait()
            return reply

        try:
            await coord.start()
            assert await coord.commit_offsets("g", {TP: 5}) == {TP: Errors.NONE}  # Empty group
            blocking.hset(record, "1:m", 3)
            scripts.acall = then_pause  # type: ignore[method-assign]
            deleting = asyncio.ensure_future(coord.delete_groups(["g"]))
            await ran.wait()
            deleting.cancel()
            await asyncio.sleep(0)  # (the cancellation reaches the call)
            proceed.set()
            await asyncio.wait({deleting})
            assert deleting.cancelled()  # the caller's cancellation is not lost
            scripts.acall = real  # type: ignore[method-assign]
            assert (await coord.describe_group("g")).state == "Dead"
            assert not blocking.exists(record), "the replay record outlived its group"
        finally:
            await coord.close()
            await client.aclose()

    asyncio.run(scenario())
