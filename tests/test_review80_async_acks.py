"""Review 80 of the asyncio driver's commits with ``required_acks`` and of ``delete_groups``:
reproductions of defects found, each failing on the code it was written against."""

from __future__ import annotations

import asyncio
import uuid

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
