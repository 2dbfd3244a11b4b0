"""Partition racks (KIP-881) in rcoord: declared per Redis node, used by rack-aware assignors."""

from __future__ import annotations

from typing import Any

import pytest
from harness import wait_until

from rcoord import TopicPartition
from rcoord.client import ConsumerGroup, ConsumerGroupConfig
from rcoord.topics import Topics, node_racks, partition_key, partition_racks, set_node_racks

WAIT_S = 30.0


def _masters(client: Any) -> list[str]:
    manager = getattr(client, "nodes_manager", None)
    if manager is None:
        kw = client.connection_pool.connection_kwargs
        return [f"{kw['host']}:{kw['port']}"]
    return sorted(f"{n.host}:{n.port}" for n in client.get_primaries())


def _holder(client: Any, key: str) -> str:
    manager = getattr(client, "nodes_manager", None)
    if manager is None:
        return _masters(client)[0]
    node = client.get_node_from_key(key)
    return f"{node.host}:{node.port}"


def test_no_declared_racks_means_no_partition_racks(redis_client, namespace):
    Topics(redis_client, namespace).create("t", 4)
    assert node_racks(redis_client, namespace) == {}
    assert partition_racks(redis_client, namespace, {"t": 4}) == {}


def test_a_partition_has_the_rack_of_the_node_holding_it(redis_client, namespace):
    Topics(redis_client, namespace).create("t", 12)
    masters = _masters(redis_client)
    racks = {m: f"rack-{i % 2}" for i, m in enumerate(masters)}
    set_node_racks(redis_client, namespace, racks)
    assert node_racks(redis_client, namespace) == racks
    got = partition_racks(redis_client, namespace, {"t": 12})
    assert set(got) == {TopicPartition("t", p) for p in range(12)}
    for p in range(12):
        holder = _holder(redis_client, partition_key(namespace, "t", p))
        assert got[TopicPartition("t", p)] == {racks[holder]}
    # Replacing the map replaces it; a node missing from it gives no rack.
    set_node_racks(redis_client, namespace, {})
    assert partition_racks(redis_client, namespace, {"t": 12}) == {}


@pytest.mark.parametrize("node", ["nohost", ":1", "h:port"])
def test_a_node_must_be_host_and_port(redis_client, namespace, node):
    with pytest.raises(ValueError, match="host:port"):
        set_node_racks(redis_client, namespace, {node: "a"})


@pytest.mark.parametrize("backend", ["cluster"], indirect=True)
def test_members_get_the_partitions_of_their_own_rack(redis_client, namespace, make_coordinator):
    make_coordinator()
    Topics(redis_client, namespace).create("t", 12)
    masters = _masters(redis_client)
    assert len(masters) == 3
    racks = {masters[0]: "a", masters[1]: "b", masters[2]: "a"}
    set_node_racks(redis_client, namespace, racks)
    by_rack = partition_racks(redis_client, namespace, {"t": 12})
    in_b = {tp for tp, r in by_rack.items() if r == {"b"}}
    assert 0 < len(in_b) <= 6  # the slot-spread tags put partitions on every master

    def cfg(rack: str) -> ConsumerGroupConfig:
        return ConsumerGroupConfig(
            group_id="g", topics=["t"], assignors=["rack-affinity"], client_rack=rack,
            redis_client=redis_client, namespace=namespace, heartbeat_interval_ms=100,
            session_timeout_ms=2000, rebalance_timeout_ms=3000, join_backoff_ms=100,
            retry_backoff_ms=10,
        )

    with ConsumerGroup(cfg("a")) as ga, ConsumerGroup(cfg("b")) as gb:
        held: dict[str, set[TopicPartition]] = {}

        def settled() -> bool:
            for name, g in (("a", ga), ("b", gb)):
                try:
                    held[name] = set(g.next(timeout=0.2).partitions)
                except TimeoutError:
                    pass  # no new generation for this one: what it holds stands
            gens = {g.generation.generation_id for g in (ga, gb) if g.generation is not None}
            return (len(held) == 2 and len(held["a"] | held["b"]) == 12
                    and held["a"].isdisjoint(held["b"]) and len(gens) == 1)

        wait_until(settled, timeout_s=WAIT_S)
    # Kafka-go's rack affinity: the rack-b member takes every rack-b partition (there are few
    # enough for balance), and the rack-a member only rack-a ones.
    assert in_b <= held["b"]
    assert all(by_rack[tp] == {"a"} for tp in held["a"])
