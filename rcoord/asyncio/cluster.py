"""The asyncio Redis Cluster client rcoord builds (the gateway's)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import redis.asyncio.cluster
import redis.exceptions

from ..connect import UNCOVERED_REFRESH_S, learn_node, partial_listing, refuse_partial_listing

__all__ = ["AsyncClusterClient", "learn_slots", "node_of_key", "refresh_uncovered"]


class AsyncClusterClient(redis.asyncio.cluster.RedisCluster):
    """A ``redis.asyncio.RedisCluster`` that follows an ``ASK`` to a master it does not know
    yet, as ``rcoord.connect.ClusterClient`` does (``_LearningNodesManager`` there says why):
    redis-py's asyncio client failed the same way, with ``'NoneType' object has no attribute
    'execute_command'``, during a reshard to a master added since it started. A slot no
    master serves is ``SlotNotCoveredError``, as on the blocking client (``get_node_from_slot``
    below); so is a listing of every slot meanwhile (``connect.refuse_partial_listing``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Its pipelines share it, so they follow an ASK to a new master too.
        self.nodes_manager.__class__ = _LearningNodesManager
        self._uncovered_refreshed = -UNCOVERED_REFRESH_S

    async def _determine_nodes(self, *args: Any, **kwargs: Any) -> Any:
        if partial_listing(self.nodes_manager, args[0]):
            await self.nodes_manager.initialize()  # (as the blocking client's)
            refuse_partial_listing(self.nodes_manager, args[0])
        find = super()._determine_nodes
        try:
            return await find(*args, **kwargs)
        except redis.exceptions.SlotNotCoveredError:
            # A slot the map has no master for is looked up again once the map is read again
            # (``connect.refresh_uncovered``, which says why), at most every second.
            try:
                refreshed = await refresh_uncovered(self)
            except redis.exceptions.SlotNotCoveredError:
                raise redis.exceptions.SlotNotCoveredError(
                    f"{args[0]}: its slot is served by no master of the Redis Cluster") from None
            if not refreshed:
                raise
            return await find(*args, **kwargs)


async def refresh_uncovered(client: Any) -> bool:
    """The asyncio twin of ``rcoord.connect.refresh_uncovered`` (which says why): read the
    slot map of ``client`` again after a lookup met a slot with no master in it, at most every
    ``UNCOVERED_REFRESH_S``: whether it was read (then the caller looks the slot up again).
    A read that failed raises ``SlotNotCoveredError``."""
    now = time.monotonic()
    if now - getattr(client, "_uncovered_refreshed", -UNCOVERED_REFRESH_S) < UNCOVERED_REFRESH_S:
        return False
    client._uncovered_refreshed = now
    try:
        await client.nodes_manager.initialize()
    except Exception:  # noqa: BLE001 - the slot's own error is raised
        raise redis.exceptions.SlotNotCoveredError(
            "a slot is served by no master of the Redis Cluster") from None
    return True


async def node_of_key(client: Any, key: Any) -> Any:
    """The master ``client`` (a ``redis.asyncio.RedisCluster``) sends ``key`` to, looked up
    again once the map is read again when the map has none for its slot, as the blocking
    ``ClusterClient.get_node_from_key`` does: the acks of a commit (``MasterOf``, the replica
    wait) look the master up themselves, outside ``_determine_nodes``, and failed on a slot
    whose step had just been served (the commit stored, then reported lost)."""
    await client.initialize()  # (at once when it knows the slots)
    try:
        return client.get_node_from_key(key)
    except redis.exceptions.SlotNotCoveredError:
        if not await refresh_uncovered(client):
            raise
        return client.get_node_from_key(key)


def learn_slots(client: Any) -> None:
    """Give a plain ``redis.asyncio.RedisCluster`` the slot lookups of an ``AsyncClusterClient``
    (``_LearningNodesManager``): the coordinator takes any asyncio cluster client, and with
    redis-py's own a call on a slot no master serves failed with a bare ``KeyError`` that no
    error boundary maps, where the blocking client's ``SlotNotCoveredError`` is a retriable
    ``ConnectionLost``. A caller's subclass of redis-py's manager failed the same way, so it
    takes a subclass of its own class with the lookups added (``_learning``). A manager that
    is not redis-py's is left as it is."""
    manager = getattr(client, "nodes_manager", None)
    cls = type(manager)
    if issubclass(cls, redis.asyncio.cluster.NodesManager) and not issubclass(cls, _Learning):
        manager.__class__ = _learning(cls)


if TYPE_CHECKING:
    _Manager = redis.asyncio.cluster.NodesManager
else:
    _Manager = object  # (a mixin: the manager's class, redis-py's or a caller's, comes after)


class _Learning(_Manager):
    """The lookups ``_LearningNodesManager`` adds to redis-py's manager, as a mixin: put ahead
    of a caller's subclass, they wrap its overrides (``super()``), which still run as before,
    and change only what redis-py does for an unknown node or an uncovered slot."""

    __slots__ = ()  # redis-py's has slots: the same layout lets the client's take this class

    def get_node(self, host: str | None = None, port: int | None = None,
                 node_name: str | None = None) -> Any:
        found = super().get_node(host, port, node_name)
        return learn_node(self, found, host, node_name, self._new_master)

    def get_node_from_slot(self, slot: int, *args: Any, **kwargs: Any) -> Any:
        """redis-py's asyncio one (8.1) raised ``KeyError`` for a slot no master serves (its
        slot map has no entry for it once the client does not require full coverage), which
        no error boundary knows: the gateway answered a group call or Fetch wait on that slot
        UNKNOWN_SERVER_ERROR with a traceback, where the blocking client's
        ``SlotNotCoveredError`` is answered with the retriable codes."""
        try:
            return super().get_node_from_slot(slot, *args, **kwargs)
        except KeyError:
            raise redis.exceptions.SlotNotCoveredError(
                f"slot {slot} is served by no master of the Redis Cluster") from None

    def _new_master(self, host: str, port: int) -> Any:
        return redis.asyncio.cluster.ClusterNode(
            host, port, redis.cluster.PRIMARY, **self.connection_kwargs)


class _LearningNodesManager(_Learning, redis.asyncio.cluster.NodesManager):
    __slots__ = ()


# The class a manager of each class takes (``_learning``), made once per class.
_LEARNING: dict[type[Any], type[_Learning]] = {
    redis.asyncio.cluster.NodesManager: _LearningNodesManager}


def _learning(cls: type[Any]) -> type[_Learning]:
    """The class a manager of class ``cls`` takes. Its own slots are none, and ``cls`` is its
    layout base (the mixin's is ``object``), so an object of ``cls`` with or without a
    ``__dict__`` can take it."""
    made = _LEARNING.get(cls)
    if made is None:
        made = _LEARNING.setdefault(cls, type(
            f"_Learning{cls.__name__}", (_Learning, cls), {"__slots__": (), "__module__": __name__}))
    return made
