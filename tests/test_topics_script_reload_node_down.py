"""Topic scripts while a cluster master is down.

redis-py sends ``SCRIPT LOAD`` to every master, so after a node's script cache was emptied (a
restart, a failover) a topic call that needed the reload failed, connection refused, while any
other master was down, though its own keys' master answered: retention, appends and log offsets
of topics on the healthy masters stopped for as long as the dead one stayed down. The script
is loaded now on the node that answered NOSCRIPT alone (``_Lua.load``). And a cluster pipeline
of topic scripts (an append to several partitions, a fetch's log offsets) asked the client's
default node for the EVALSHA's keys (``COMMAND GETKEYS``), so it failed while that node was down
(``scripts.route_fcall_locally`` takes the first key now).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from typing import Any

import pytest
from harness import partial_coverage_cluster

from rcoord.connect import connect
from rcoord.testing.embedded import EmbeddedCluster
from rcoord.topics import Producer, ProducerRecord, Topics, fetch_many
from rcoord.topics._base import meta_key, partition_key

pytestmark = pytest.mark.slow

NS = "reload"


@pytest.fixture
def cluster() -> Iterator[EmbeddedCluster]:
    with partial_coverage_cluster() as cl:
        yield cl


def _port(client: Any, key: str) -> int:
    return int(client.get_node_from_key(key).port)


def _topic_off(client: Any, victim: int, partitions: int) -> str:
    """A topic none of whose keys (metadata, partitions) the ``victim`` port serves."""
    for i in range(500):
        name = f"t{i}"
        keys = [meta_key(NS, name)] + [partition_key(NS, name, p) for p in range(partitions)]
        if all(_port(client, k) != victim for k in keys):
            return name
    raise AssertionError("no topic off the victim in 500 names")


def _flush_scripts(cluster: EmbeddedCluster, client: Any) -> None:
    """Empty every master's script cache (as after their restarts)."""
    for node in client.get_primaries():
        client.get_redis_connection(node).script_flush()


def test_retention_reloads_its_script_on_its_own_master_while_another_is_down(
        cluster: EmbeddedCluster) -> None:
    client = connect(cluster.url, socket_timeout=5)
    try:
        victim = cluster.nodes[0]
        name = _topic_off(client, victim.port, 1)
        Topics(client, NS).create(name, 1, retention_records=1)
        Producer(client, NS).send_batch(name, [ProducerRecord(b"x", partition=0)] * 3)
        _flush_scripts(cluster, client)
        assert victim.pid is not None
        os.kill(victim.pid, signal.SIGKILL)
        # Before: ConnectionLost, "Error 111 connecting to" the dead master.
        assert Topics(client, NS).apply_retention(name) == {0: 2}
    finally:
        client.close()


def _kill_default_node(cluster: EmbeddedCluster, client: Any) -> Any:
    """SIGKILL the master the client asks by default (its ``COMMAND GETKEYS``); that node."""
    default = client.get_default_node()
    victim = next(n for n in cluster.nodes if n.port == int(default.port))
    assert victim.pid is not None
    os.kill(victim.pid, signal.SIGKILL)
    return victim


def test_a_pipelined_append_and_fetch_go_on_while_the_default_node_is_down(
        cluster: EmbeddedCluster) -> None:
    client = connect(cluster.url, socket_timeout=5)
    try:
        default_port = int(client.get_default_node().port)
        name = _topic_off(client, default_port, 2)
        Topics(client, NS).create(name, 2)
        producer = Producer(client, NS)
        producer.send_batch(name, [ProducerRecord(b"a", partition=p) for p in (0, 1)])
        _kill_default_node(cluster, client)
        # Before: ConnectionLost, "Error 111 connecting to" the default node (COMMAND GETKEYS).
        sent = producer.send_batch(name, [ProducerRecord(b"b", partition=p) for p in (0, 1)])
        assert sorted((m.partition, m.offset) for m in sent) == [(0, 1), (1, 1)]
        got = fetch_many(client, NS, [(name, 0, 0), (name, 1, 0)])
        assert [[r.value for r in res.records] for res in got] == [[b"a", b"b"]] * 2
    finally:
        client.close()


def test_a_pipelined_append_reloads_its_script_on_each_partitions_master(
        cluster: EmbeddedCluster) -> None:
    client = connect(cluster.url, socket_timeout=5)
    try:
        victim = cluster.nodes[0]
        name = _topic_off(client, victim.port, 2)
        Topics(client, NS).create(name, 2)
        producer = Producer(client, NS)
        producer.send_batch(name, [ProducerRecord(b"a", partition=p) for p in (0, 1)])
        _flush_scripts(cluster, client)
        assert victim.pid is not None
        os.kill(victim.pid, signal.SIGKILL)
        # Two partitions, one pipeline: both calls answer NOSCRIPT, loaded once per node.
        sent = producer.send_batch(name, [ProducerRecord(b"b", partition=p) for p in (0, 1)])
        assert sorted((m.partition, m.offset) for m in sent) == [(0, 1), (1, 1)]
    finally:
        client.close()
