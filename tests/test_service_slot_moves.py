"""The service's per-node calls (rcoord/service/nodes.py) when a slot moves: a call through a
node's plain client that is told the slot moved is made once more through the cluster client,
which follows it. Before, the registry's calls (``on_node``) did not follow at all, so every
lease round failed once the registry's slot moved; and a follow-up that failed was taken for
the failure of the node that had answered, which was then skipped for up to a second."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from rcoord.scripts import Scripts
from rcoord.service import nodes
from rcoord.service.leases import LeaseKeeper
from rcoord.testing.embedded import EmbeddedCluster


def _move_slot(cluster: EmbeddedCluster, client: Any, key: str, finish: bool) -> None:
    """Move ``key``'s slot to another master (``redis-cli --cluster reshard``'s steps), or
    stop half-way (``finish`` False: migrating, its keys moved). (tests/test_resharding.py's
    ``migrate_slot`` moves a slot of its replica cluster whole, a key at a time.)"""
    slot, src_port = client.keyslot(key), int(client.get_node_from_key(key).port)
    dst_port = next(p for p in cluster.ports if p != src_port)
    nodes = {p: redis.Redis(host="127.0.0.1", port=p) for p in cluster.ports}
    try:
        src, dst = nodes[src_port], nodes[dst_port]
        src_id, dst_id = (n.execute_command("CLUSTER", "MYID").decode() for n in (src, dst))
        dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", src_id)
        src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", dst_id)
        keys = src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100)
        if keys:
            src.execute_command("MIGRATE", "127.0.0.1", dst_port, "", 0, 5000, "KEYS", *keys)
        if finish:  # (the destination first, as migrate_slot)
            for node in sorted(nodes.values(), key=lambda n: n is not dst):
                node.execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst_id)
    finally:
        for node in nodes.values():
            node.close()


@pytest.mark.parametrize("finish", [False, True], ids=["migrating", "moved"])
def test_a_lease_round_follows_the_registrys_slot(own_cluster, namespace, finish):
    client = own_cluster.client()
    scripts = Scripts(client)
    scripts.load()
    keeper = LeaseKeeper(client, scripts, namespace, 4, "me", 30_000)
    try:
        assert keeper.step() == {0, 1, 2, 3}
        _move_slot(own_cluster, client, keeper.registry_key, finish)
        for _ in range(3):  # (every round, not only the first after the move)
            assert keeper.step() == {0, 1, 2, 3}
        assert client.zscore(keeper.registry_key, "me") is not None
        keeper.announce(b"joined")
        keeper.release_all()
        assert client.zscore(keeper.registry_key, "me") is None
    finally:
        client.close()


def test_a_follow_up_that_fails_is_not_the_answering_nodes_failure(own_cluster):
    """The node answered that the slot moved; the cluster client's call after it failed
    (here: made to fail). That node is healthy: nothing of it may be skipped after."""
    client = own_cluster.client()
    try:
        items = ["{a}", "{b}", "{c}"]
        names = {i: client.get_node_from_key(i).name for i in items}
        assert len(set(names.values())) > 1
        moving = items[0]

        def work(via: Any, piece: list[str]) -> None:
            if moving not in piece:
                return
            if via is client:  # the follow-up through the cluster client
                raise redis.ConnectionError("the follow-up failed")
            raise redis.exceptions.AskError(f"{client.keyslot(moving)} 127.0.0.1:1")

        failed = nodes.each_node(client, items, lambda i: i, work)
        assert [(piece, type(exc)) for piece, exc in failed] == [
            ([i for i in items if names[i] == names[moving]], redis.ConnectionError)]
        assert nodes._skipped(client, names[moving]) is None
        assert nodes.each_node(client, items, lambda i: i, lambda via, piece: None) == []
    finally:
        client.close()
