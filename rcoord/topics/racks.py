"""Where a partition's data lives, by rack: what rack-aware assignors need (KIP-881).

In Kafka a partition's racks are the ``broker.rack`` of the brokers holding its replicas, and a
consumer with ``client.rack`` prefers partitions with a replica in its own rack, so it reads
from a nearby broker. In rcoord a partition is a stream on one Redis master, copied to that
master's replicas, and Redis nodes have no notion of a rack. So the operator declares one: the
namespace hash ``<ns>:node-racks`` maps a node's address (``host:port``, as the cluster reports
it, or as the client connects to a single server) to its rack (``set_node_racks``). A
partition's rack is then the rack of the master that owns its slot. Only the master counts:
rcoord reads every partition from its master (there is no follower fetching, Kafka's KIP-392),
so a replica in the consumer's rack would promise a locality the reads do not have. Nodes not in
the map have no rack; with no map at all, no partition has racks and the assignors behave
exactly as without rack awareness. A client connected through a unix socket has no address to
look up, so its partitions have no rack.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..protocol.offsets import TopicPartition
from ._base import partition_key

__all__ = ["node_racks", "node_racks_key", "partition_racks", "set_node_racks"]


def node_racks_key(namespace: str) -> str:
    """The namespace's node -> rack hash."""
    return f"{namespace}:node-racks"


_REPLACE_HASH = """
-- KEYS[1] the hash   ARGV field, value, field, value ... (none: the hash is deleted)
redis.call('DEL', KEYS[1])
for i = 1, #ARGV, 2 do redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
return #ARGV / 2
"""


def set_node_racks(client: Any, namespace: str, racks: Mapping[str, str]) -> None:
    """Declare the rack of each Redis node (``{"host:port": "rack"}``), replacing the map."""
    for node, rack in racks.items():
        host, sep, port = node.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"node must be 'host:port', got {node!r}")
        if not isinstance(rack, str) or not rack:
            raise ValueError(f"rack of {node!r} must be a non-empty str, got {rack!r}")
    # One script on one key: a leader never reads the map half replaced, on a cluster too
    # (redis-py 5's cluster client refuses MULTI).
    flat = [x for node, rack in sorted(racks.items()) for x in (node, rack)]
    client.eval(_REPLACE_HASH, 1, node_racks_key(namespace), *flat)


def node_racks(client: Any, namespace: str) -> dict[str, str]:
    """The declared node -> rack map ({} when none is declared)."""
    raw = client.hgetall(node_racks_key(namespace))
    return {k.decode() if isinstance(k, bytes) else k: v.decode() if isinstance(v, bytes) else v
            for k, v in raw.items()}


def _master(client: Any, key: str) -> str | None:
    """Address of the master ``key`` is read from: its slot's master (a cluster), or the one
    server the client talks to (None through a unix socket)."""
    if hasattr(client, "get_node_from_key"):
        node = client.get_node_from_key(key)
        return f"{node.host}:{node.port}"
    kwargs = client.connection_pool.connection_kwargs
    if "path" in kwargs or "host" not in kwargs:
        return None
    return f"{kwargs['host']}:{kwargs.get('port', 6379)}"


def partition_racks(
    client: Any, namespace: str, partitions_per_topic: Mapping[str, int]
) -> dict[TopicPartition, set[str]]:
    """The rack each partition of these topics is read from ({} when no rack is declared)."""
    racks = node_racks(client, namespace)
    if not racks:
        return {}
    out: dict[TopicPartition, set[str]] = {}
    for topic, count in partitions_per_topic.items():
        for p in range(count):
            master = _master(client, partition_key(namespace, topic, p))
            out[TopicPartition(topic, p)] = {racks[master]} if master in racks else set()
    return out
