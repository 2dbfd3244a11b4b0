"""heartbeat_many when one master of a cluster answers but refuses the call (a failed save,
too few replicas, a slot migrating): the members of the groups on the other
masters still get their answers, as when that master is down
(tests/test_heartbeat.py ``..._with_a_master_down_answers_the_others``)."""

from __future__ import annotations

import asyncio
from typing import Any

import redis
import redis.asyncio.cluster

from rcoord import CoordinatorConfig, Errors, GroupCoordinator
from rcoord.asyncio import AsyncGroupCoordinator
from rcoord.testing.embedded import EmbeddedCluster

JOIN: dict[str, Any] = {"protocol_type": "consumer", "protocols": [("range", b"")],
                        "session_timeout_ms": 60_000, "rebalance_timeout_ms": 60_000}


def _one_group_per_master(port_of: Any) -> dict[int, str]:
    by_port: dict[int, str] = {}
    n = 0
    while len(by_port) < 3:
        by_port.setdefault(port_of(f"g{n}"), f"g{n}")
        n += 1
    return by_port


def _refusing(cluster: EmbeddedCluster, port: int) -> redis.Redis:
    """A client of the master on ``port``, which now refuses every function that may write
    with NOREPLICAS (it asks for more replicas than it has); ``_serving`` ends it. (Not OOM:
    the heartbeat is flagged ``allow-oom`` and answers then.)"""
    node = next(n for n in cluster.nodes if n.port == port).client()
    node.config_set("min-replicas-to-write", 100)
    return node


def _serving(node: redis.Redis) -> None:
    node.config_set("min-replicas-to-write", 0)


def test_heartbeat_many_with_a_master_refusing_writes_answers_the_others(
    own_cluster: EmbeddedCluster,
) -> None:
    """It used to raise ``ServerUnavailable`` for every member: the refused group's retry
    (expire_deadlines, then the heartbeat alone) raised out of the flow, and the answers of
    the groups on the healthy masters (REBALANCE_IN_PROGRESS among them) were lost for as
    long as the one master refused."""
    client = own_cluster.client(socket_connect_timeout=2, socket_timeout=5)
    node = None
    try:
        coord = GroupCoordinator(client, CoordinatorConfig(
            namespace="trouble-hbm", group_initial_rebalance_delay_ms=0)).start()
        by_port = _one_group_per_master(
            lambda gid: client.get_node_from_key(coord._keys(gid).group).port)
        members: dict[str, tuple[int, str]] = {}
        for gid in by_port.values():
            mid = coord.join_group(gid, **JOIN).member_id
            joined = coord.join_group(gid, mid, **JOIN)
            coord.sync_group(gid, joined.generation_id, mid, assignments={mid: b""})
            members[gid] = (joined.generation_id, mid)
        full_port = next(iter(by_port))
        node = _refusing(own_cluster, full_port)
        asked = [(gid, *members[gid]) for gid in by_port.values()]
        answers = dict(zip(by_port, coord.heartbeat_many(asked), strict=True))
        assert answers.pop(full_port) == Errors.COORDINATOR_NOT_AVAILABLE
        assert list(answers.values()) == [Errors.NONE, Errors.NONE]
        _serving(node)
        assert coord.heartbeat_many(asked) == [Errors.NONE] * 3
    finally:
        if node is not None:
            _serving(node)
            node.close()
        client.close()


def test_asyncio_heartbeat_many_with_a_master_refusing_writes_answers_the_others(
    own_cluster: EmbeddedCluster,
) -> None:
    """The asyncio driver runs the same flow."""
    node: redis.Redis | None = None

    async def run() -> None:
        nonlocal node
        client = redis.asyncio.cluster.RedisCluster(
            host="127.0.0.1", port=own_cluster.nodes[0].port, socket_connect_timeout=2,
            socket_timeout=5)
        try:
            coord = await AsyncGroupCoordinator(client, CoordinatorConfig(
                namespace="trouble-ahbm", group_initial_rebalance_delay_ms=0)).start()
            await client.initialize()
            by_port = _one_group_per_master(
                lambda gid: client.get_node_from_key(coord._steps.keys(gid).group).port)
            members: dict[str, tuple[int, str]] = {}
            for gid in by_port.values():
                mid = (await coord.join_group(gid, **JOIN)).member_id
                joined = await coord.join_group(gid, mid, **JOIN)
                await coord.sync_group(gid, joined.generation_id, mid, assignments={mid: b""})
                members[gid] = (joined.generation_id, mid)
            full_port = next(iter(by_port))
            node = _refusing(own_cluster, full_port)
            asked = [(gid, *members[gid]) for gid in by_port.values()]
            answers = dict(zip(by_port, await coord.heartbeat_many(asked), strict=True))
            assert answers.pop(full_port) == Errors.COORDINATOR_NOT_AVAILABLE
            assert list(answers.values()) == [Errors.NONE, Errors.NONE]
        finally:
            await client.aclose()

    try:
        asyncio.run(run())
    finally:
        if node is not None:
            _serving(node)
            node.close()
