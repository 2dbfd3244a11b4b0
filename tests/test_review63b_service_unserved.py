"""The coordinator service's calls per node while one slot is served by no master: since its
cluster client no longer requires full coverage (``connect.FULL_COVERAGE``), the client's slot
map has no entry for that slot once refreshed, and redis-py's ``get_node_from_key`` raises
``SlotNotCoveredError`` for a key there. ``nodes._split`` let that out of ``each_node``, so one
lease partition, group partition or topic on that slot failed the whole call: every lease round
(all the leases read at once) failed and every lease lapsed, and no deadline was swept on any
partition, for as long as the slot had no master. That piece alone fails now, as a node down."""

from __future__ import annotations

import threading

import redis.exceptions
from harness import wait_until
from test_gateway_slot_moves import _unserved

from rcoord.connect import connect
from rcoord.scripts import Scripts
from rcoord.service.leases import LeaseKeeper
from rcoord.service.nodes import each_node


def _keys(client, unserved: str) -> list[str]:
    """Keys on every master, one of them on ``unserved``'s slot."""
    keys = [unserved]
    nodes = {client.get_node_from_key(unserved).name}
    i = 0
    while len(nodes) < 3 or len(keys) < 6:
        key = f"review63b-{i}"
        i += 1
        if client.keyslot(key) != client.keyslot(unserved):
            keys.append(key)
            nodes.add(client.get_node_from_key(key).name)
    return keys


def test_each_node_fails_only_the_piece_whose_slot_has_no_master(own_cluster):
    client = connect(own_cluster.url, socket_timeout=5)
    try:
        unserved = "review63b-unserved"
        keys = _keys(client, unserved)
        done: list[str] = []
        lock = threading.Lock()

        def work(node, piece: list[str]) -> None:
            for key in piece:
                node.set(key, b"1")
            with lock:
                done.extend(piece)

        with _unserved(own_cluster, unserved):
            client.nodes_manager.initialize()  # (the topology refresh a MOVED or failover makes)
            failed = each_node(client, keys, lambda k: k, work)
        assert sorted(done) == sorted(k for k in keys if k != unserved)
        assert [piece for piece, _ in failed] == [[unserved]]
        assert isinstance(failed[0][1], redis.exceptions.SlotNotCoveredError)
    finally:
        client.close()


def test_a_lease_round_renews_the_leases_whose_slot_has_a_master(own_cluster):
    """A lease round reads every lease at once (``each_node``): one lease's slot with no
    master failed the round, and every lease of the process lapsed."""
    client = connect(own_cluster.url, socket_timeout=5)
    try:
        scripts = Scripts(client)
        scripts.load()
        keeper = LeaseKeeper(client, scripts, "review63b", 8, "c1", 10_000)
        keeper.claim_id(threading.Event())
        assert keeper.step() == set(range(8))
        shared = {client.keyslot(keeper.registry_key), client.keyslot(keeper.claim_key)}
        lost = next(p for p in range(8)
                    if client.keyslot(keeper._lease_key(p)) not in shared)
        with _unserved(own_cluster, keeper._lease_key(lost)):
            client.nodes_manager.initialize()  # (the topology refresh a MOVED or failover makes)
            assert keeper.step() == set(range(8)) - {lost}
        # The round after the slot has a master again reads the slot map again (nothing else
        # would: the piece is sent nowhere), and the one after takes the lease again.
        wait_until(lambda: keeper.step() == set(range(8)), timeout_s=10)
        keeper.release_all(final=True)
    finally:
        client.close()
