"""Review 71: the asyncio coordinator given a cluster client whose nodes manager is the
caller's own subclass of redis-py's."""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

import pytest
import redis.asyncio.cluster
import redis.cluster
import redis.exceptions

from rcoord import ConnectionLost, Errors
from rcoord.asyncio import AsyncGroupCoordinator
from rcoord.asyncio.cluster import learn_slots
from rcoord.keys import GroupKeys


class CountingManager(redis.asyncio.cluster.NodesManager):
    """A caller's manager with one harmless override: it counts the slots looked up."""

    __slots__ = ()  # (so a client's manager can take it in place)
    looked_up: ClassVar[list[int]] = []

    def get_node_from_slot(self, slot: int, *args: Any, **kwargs: Any) -> Any:
        CountingManager.looked_up.append(slot)
        return super().get_node_from_slot(slot, *args, **kwargs)


def test_a_slot_no_master_serves_is_a_connection_loss_with_the_callers_nodes_manager(
        redis_cluster, namespace):
    """``learn_slots`` (e915cd9) gave redis-py's own manager the lookup that raises
    ``SlotNotCoveredError`` for a slot no master serves, but left a caller's subclass as it
    was: a call on such a slot failed with redis-py's bare ``KeyError``, past the error
    boundary. It is now the retriable ``ConnectionLost`` (or answered, once the map is read
    again), and the caller's override still runs."""

    async def scenario() -> None:
        client = redis.asyncio.cluster.RedisCluster(
            host="127.0.0.1", port=redis_cluster.ports[0], require_full_coverage=False)
        try:
            await client.initialize()
            client.nodes_manager.__class__ = CountingManager
            acoord = await AsyncGroupCoordinator(client, namespace).start()
            assert isinstance(client.nodes_manager, CountingManager)
            slot = redis.cluster.key_slot(
                GroupKeys.of(namespace, acoord.config.num_partitions, "g").group.encode())
            # What reading the map leaves when no master served the slot.
            client.nodes_manager.slots_cache.pop(slot)
            CountingManager.looked_up.clear()
            try:
                assert await acoord.heartbeat("g", 1, "m") == Errors.UNKNOWN_MEMBER_ID
            except ConnectionLost as exc:
                assert isinstance(exc.__cause__, redis.exceptions.SlotNotCoveredError), exc
            assert slot in CountingManager.looked_up  # (the caller's override ran)
        finally:
            await client.aclose()

    asyncio.run(scenario())


def test_the_callers_manager_class_keeps_its_own_state_and_overrides():
    """A caller's manager with instance attributes of its own (no ``__slots__``) takes the
    added lookups too; its override answers as before for a slot it serves itself, and the
    class made for it is made once, so two clients share it."""

    class OwnManager(redis.asyncio.cluster.NodesManager):
        def get_node_from_slot(self, slot: int, *args: Any, **kwargs: Any) -> Any:
            if slot == 0:
                return self.own
            return super().get_node_from_slot(slot, *args, **kwargs)

    managers = []
    for _ in range(2):
        manager = OwnManager([], False, {})
        manager.own = "own node"
        learn_slots(type("Client", (), {"nodes_manager": manager})())
        managers.append(manager)
    first, second = managers
    assert type(first) is type(second) and isinstance(first, OwnManager)
    assert first.get_node_from_slot(0) == "own node"
    with pytest.raises(redis.exceptions.SlotNotCoveredError):
        first.get_node_from_slot(1)
