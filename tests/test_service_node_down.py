"""The coordinator service on a cluster whose master fails: the deadlines of groups on the
healthy masters are applied on time while the failed master's replica waits out the node timeout,
and the failed master's own groups soon after the replica takes over. Before, every round
(sweep, lease renewal, event tail) was one pipeline over all masters, which redis-py fails as a
whole when one node refuses the connection: the healthy masters' members expired only after the
failover (11.6 s after a kill, with a node timeout of 5 s)."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from typing import Any

import pytest
from cluster_replicas import ReplicaCluster, running_cluster
from harness import wait_until
from test_service import JOIN, Proc

from rcoord import CoordinatorConfig, Errors, GroupCoordinator
from rcoord.connect import connect
from rcoord.service.leases import LeaseKeeper

pytestmark = pytest.mark.slow

NODE_TIMEOUT_MS = 6000
"""How long the failed master's replica waits before it takes over: far longer than the
healthy masters' sessions (1 s) and the service's reaction, so "applied before the failover"
is what the test can tell apart from "applied after it"."""
SESSION_MS = 1000


@pytest.fixture
def cluster() -> Iterator[ReplicaCluster]:
    yield from running_cluster(masters=3, replicas=1, node_timeout_ms=NODE_TIMEOUT_MS)


def _lonely_member(coord: GroupCoordinator, group: str) -> str:
    join = {**JOIN, "session_timeout_ms": SESSION_MS, "rebalance_timeout_ms": 5000}
    mid = coord.join_group(group, **join).member_id
    res = coord.join_group(group, mid, **join)
    assert coord.sync_group(group, res.generation_id, mid, assignments={}).error == Errors.NONE
    return mid


def _is_member(client: Any, coord: GroupCoordinator, group: str, mid: str) -> bool:
    """A raw read (it applies no deadline, unlike every script)."""
    return bool(client.hexists(coord._keys(group).members, mid))


def test_a_failed_master_stops_neither_the_healthy_masters_deadlines_nor_its_own_after_failover(
        cluster: ReplicaCluster, namespace: str) -> None:
    client = connect(cluster.url(), socket_timeout=2, socket_connect_timeout=1)
    proc = None
    try:
        coord = GroupCoordinator(client, CoordinatorConfig(
            namespace=namespace, group_min_session_timeout_ms=10,
            group_initial_rebalance_delay_ms=0)).start()
        # The failed master is the one holding the coordinator registry: the service must keep
        # its plan without it.
        registry = LeaseKeeper(client, coord._scripts, namespace, 1, "probe", 1000).registry_key
        victim = client.get_node_from_key(registry)
        groups_on: dict[str, list[str]] = {}
        i = 0
        while len(groups_on) < 3 or any(len(gs) < 2 for gs in groups_on.values()):
            group = f"g{i}"
            i += 1
            node = client.get_node_from_key(coord._keys(group).group).name
            if len(groups_on.setdefault(node, [])) < 2:
                groups_on[node].append(group)
        healthy = [g for node, gs in groups_on.items() if node != victim.name for g in gs]
        failing = groups_on[victim.name]

        proc = Proc(cluster.url(), namespace, "c1")
        wait_until(lambda: proc.health().get("leases") == coord.config.num_partitions,
                   timeout_s=30)
        members = {g: _lonely_member(coord, g) for g in healthy + failing}
        replica = cluster.replica_of(next(n for n in cluster.masters() if n.port == victim.port))
        os.kill(cluster.nodes[victim.port].pid, signal.SIGKILL)

        def healthy_expired() -> bool:
            return not any(_is_member(client, coord, g, members[g]) for g in healthy)

        wait_until(healthy_expired, timeout_s=NODE_TIMEOUT_MS / 1000)
        # Applied while the failed master's replica had not taken over yet.
        replica_role = cluster.node_client(replica.port).info("replication")["role"]
        assert replica_role == "slave", "the healthy masters' deadlines waited for the failover"

        # The failed master's groups, once its replica serves them.
        def failing_expired() -> bool:
            try:
                return not any(_is_member(client, coord, g, members[g]) for g in failing)
            except Exception:  # noqa: BLE001 - the slots are unserved until the failover
                return False

        wait_until(failing_expired, timeout_s=60)
        out = proc.stop()
        errors = [json.loads(line) for line in out.splitlines()
                  if line.startswith("{") and '"event": "node_error"' in line]
        assert errors, "the failed node's partitions were never reported"
        assert any('"event": "member_expired"' in line and g in line
                   for line in out.splitlines() for g in healthy)
    finally:
        if proc is not None:
            proc.stop(signal.SIGKILL)
        client.close()
