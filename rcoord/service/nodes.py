"""A coordinator's rounds over its partitions, split by the Redis node that serves each one.

A pipeline on a cluster spans every node its keys live on, and redis-py fails the whole of it
when one node cannot be reached (measured: a killed master's "connection refused" raised for
every command of a pipeline whose other commands went to two healthy masters). One failed
master must not stop the deadlines, leases and event logs of the healthy ones: while a replica
waits out the node timeout before it takes over (seconds), their members still expire on time.
So a round is run once per node, and a failure of the node itself (unreachable, timed out,
refusing everything) costs that node's partitions only. On one node there is one piece, and its
failure is the round's, as before.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import redis
import redis.cluster

from ..errors import ConnectionLost

__all__ = ["NODE_FAILURES", "each_node", "split_by_node"]

T = TypeVar("T")

NODE_FAILURES: tuple[type[BaseException], ...] = (
    redis.ConnectionError, redis.TimeoutError, redis.exceptions.ClusterError, ConnectionLost)
"""What says a node could not run a piece at all (rcoord's ``ServerUnavailable`` is a
``ConnectionLost``: out of memory, READONLY, BUSY on that node). A script's own error is not
one: it concerns one call, and its caller handles it."""


def split_by_node(client: Any, items: Sequence[T], key_of: Callable[[T], str]) -> list[list[T]]:
    """``items`` in one list per node serving ``key_of(item)``, in their order; one list on a
    single node (none for no items)."""
    if not items:
        return []
    if not isinstance(client, redis.cluster.RedisCluster):
        return [list(items)]
    pieces: dict[str, list[T]] = {}
    for item in items:
        node = client.get_node_from_key(key_of(item))
        pieces.setdefault(node.name if node is not None else "", []).append(item)
    return list(pieces.values())


def each_node(client: Any, items: Sequence[T], key_of: Callable[[T], str],
              work: Callable[[list[T]], None]) -> list[tuple[list[T], BaseException]]:
    """Run ``work`` on each node's piece of ``items``; return the pieces whose node failed,
    each with its error, for the caller to retry later.

    When every piece failed, nothing was done anywhere: the first error is raised, and the
    caller waits and tries again as it does for any failed round. Anything else ``work``
    raises is raised at once."""
    pieces = split_by_node(client, items, key_of)
    failed: list[tuple[list[T], BaseException]] = []
    for piece in pieces:
        try:
            work(piece)
        except NODE_FAILURES as exc:
            failed.append((piece, exc))
    if failed and len(failed) == len(pieces):
        raise failed[0][1]
    return failed
