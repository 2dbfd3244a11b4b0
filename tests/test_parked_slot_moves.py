"""A parked JoinGroup or SyncGroup while its group's slot moves to another master, served by the
blocking and by the asyncio coordinator: both keep waiting through the migration (the group's
keys moved, the source answering ``ASK`` to the parked call's reads) and through the change of
the slot's owner (``MOVED``, also to the read blocked on the source), and both return the reply
the wake-up writes on the new master. (An earlier note said the asyncio one raised
``ConnectionLost`` where the blocking one waited; this checks the two alike.)

A step run while the slot is half-moved is refused by Redis (``TRYAGAIN``: some of its keys do
not exist on the importing node), which both coordinators report as ``ConnectionLost``; so the
wake-up here comes once the owner changed, as ``redis-cli --cluster reshard`` ends a slot's
move right after its last key."""

from __future__ import annotations

import concurrent.futures
from typing import Any

import pytest
import redis
import redis.asyncio.cluster
from harness import wait_until

from rcoord import CoordinatorConfig, Errors, GroupCoordinator
from rcoord.keys import GroupKeys
from rcoord.testing.embedded import EmbeddedCluster

JOIN: dict[str, Any] = {"protocol_type": "consumer", "protocols": [("range", b"m")],
                        "session_timeout_ms": 30_000, "rebalance_timeout_ms": 30_000}
SOCKET_TIMEOUT_S = 0.4
"""The parked calls' clients': a parked read blocks for half of it (``steps.block_limit``), so
the parked call reads again, and meets the migration, several times a second."""


def _errors(port: int, kind: str) -> int:
    node = redis.Redis(host="127.0.0.1", port=port, decode_responses=True)
    try:
        return int(node.info("errorstats").get(f"errorstat_{kind}", {}).get("count", 0))
    finally:
        node.close()


class _Move:
    """Move ``key``'s slot to another master, in two halves: the keys, then the owner."""

    def __init__(self, cluster: EmbeddedCluster, client: Any, key: str) -> None:
        self.key, self.slot = key, client.keyslot(key)
        self.src = int(client.get_node_from_key(key).port)
        self.dst = next(p for p in cluster.ports if p != self.src)
        self.nodes = {p: redis.Redis(host="127.0.0.1", port=p) for p in cluster.ports}
        self.ids = {p: n.execute_command("CLUSTER", "MYID").decode() for p, n in self.nodes.items()}

    def keys(self) -> None:
        src, dst = self.nodes[self.src], self.nodes[self.dst]
        dst.execute_command("CLUSTER", "SETSLOT", self.slot, "IMPORTING", self.ids[self.src])
        src.execute_command("CLUSTER", "SETSLOT", self.slot, "MIGRATING", self.ids[self.dst])
        keys = src.execute_command("CLUSTER", "GETKEYSINSLOT", self.slot, 1000)
        src.execute_command("MIGRATE", "127.0.0.1", self.dst, "", 0, 5000, "KEYS", *keys)

    def owner(self) -> None:
        for port in sorted(self.nodes, key=lambda p: p != self.dst):  # the destination first
            self.nodes[port].execute_command("CLUSTER", "SETSLOT", self.slot, "NODE",
                                             self.ids[self.dst])

    def close(self) -> None:
        for node in self.nodes.values():
            node.close()


@pytest.mark.parametrize("kind", ["join", "sync"])
@pytest.mark.parametrize("driver", ["blocking", "asyncio"])
def test_a_parked_call_waits_through_its_slots_move(own_cluster, namespace, driver, kind):
    from async_driver import AsyncBacked

    cfg = CoordinatorConfig(namespace=namespace, group_min_session_timeout_ms=10,
                            group_initial_rebalance_delay_ms=0)
    other = GroupCoordinator(own_cluster.client(), cfg).start()  # member a's, the waker's
    client = own_cluster.client(socket_timeout=SOCKET_TIMEOUT_S)
    coord: Any
    if driver == "blocking":
        coord = GroupCoordinator(client, cfg).start()
    else:
        port = own_cluster.ports[0]
        coord = AsyncBacked(client, lambda: redis.asyncio.cluster.RedisCluster(
            host="127.0.0.1", port=port, socket_timeout=SOCKET_TIMEOUT_S), cfg).start()
    pool = concurrent.futures.ThreadPoolExecutor(2)
    move = _Move(own_cluster, client, GroupKeys.of(namespace, cfg.num_partitions, "g").wake)
    try:
        a = other.join_group("g", **JOIN).member_id
        first = other.join_group("g", a, **JOIN)  # a alone, then b joins: a rejoins and leads
        other.sync_group("g", first.generation_id, a, assignments={a: b"a"})
        b = coord.join_group("g", **JOIN).member_id
        joined = pool.submit(coord.join_group, "g", b, **JOIN)
        if kind == "join":  # b's join parks until a rejoins
            parked = joined

            def wake() -> None:
                assert other.join_group("g", a, **JOIN).error == Errors.NONE
        else:  # b's sync parks until the leader's
            ra = other.join_group("g", a, **JOIN)
            rb = joined.result(30)
            assert ra.leader_id == a and rb.generation_id == ra.generation_id == 2
            parked = pool.submit(coord.sync_group, "g", rb.generation_id, b)

            def wake() -> None:
                assert other.sync_group("g", ra.generation_id, a, assignments={
                    a: b"a", b: b"b"}).error == Errors.NONE
        asked = _errors(move.src, "ASK")
        move.keys()
        # The parked call reads again while the slot is migrating: the source answers ASK.
        wait_until(lambda: _errors(move.src, "ASK") > asked or parked.done())
        assert not parked.done(), parked.result()
        move.owner()
        wake()
        result = parked.result(30)
        assert result.error == Errors.NONE
        if kind == "join":
            assert result.generation_id == 2
        else:
            assert result.assignment == b"b"
        assert move.nodes[move.dst].exists(move.key)  # (served by the new master)
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
        move.close()
        coord.close()
        other.close()
        client.close()
