"""A coordinator's rounds over its partitions, split by the Redis node that serves each one.

A pipeline on a cluster spans every node its keys live on, and redis-py fails the whole of it
when one node cannot be reached (measured: a killed master's "connection refused" raised for
every command of a pipeline whose other commands went to two healthy masters). One failed
master must not stop the deadlines, leases and event logs of the healthy ones: while a replica
waits out the node timeout before it takes over (seconds), their members still expire on time.
So a round is run once per node, and a failure of the node itself (unreachable, timed out,
refusing everything) costs that node's partitions only. On one node there is one piece, and its
failure is the round's, as before.

A master that hangs (frozen, or its traffic dropped while it still accepts connections) is
handled as Kafka's broker handles an unresponsive node: each request to a node times out on its
own (``request.timeout.ms``, ``NetworkClient`` expires the in-flight requests of that node only)
and never holds up those to the others. Here each node's piece runs on its own thread and talks
to its node through that node's plain client (``RedisCluster.get_redis_connection``: redis-py
8.1 builds it with no retries, and the service's socket timeout), never through the cluster
client, whose pipeline retries a timed-out node command by command with topology refreshes (one
pipeline of 16 calls to a SIGSTOPped master had not returned after 90 s). A node that timed out
is failed at once for a short while (``SKIP_FIRST_MS``, doubling up to ``SKIP_MAX_MS``) instead
of costing every round a socket timeout.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import redis
import redis.cluster

from ..errors import ConnectionLost
from ..scripts import Scripts

__all__ = ["NODE_FAILURES", "each_node", "node_client", "node_scripts", "on_any_node",
           "split_by_node"]

T = TypeVar("T")

NODE_FAILURES: tuple[type[BaseException], ...] = (
    redis.ConnectionError, redis.TimeoutError, redis.exceptions.ClusterError, ConnectionLost)
"""What says a node could not run a piece at all (rcoord's ``ServerUnavailable`` is a
``ConnectionLost``: out of memory, READONLY, BUSY on that node). A script's own error is not
one: it concerns one call, and its caller handles it."""
MOVED = (redis.exceptions.AskError, redis.exceptions.TryAgainError)
"""A node's answer that the slot is (being) moved (``MovedError`` is an ``AskError``): the
piece is run again through the cluster client, which follows the slot (a reshard)."""
SKIP_FIRST_MS = 1000
SKIP_MAX_MS = 5000
"""A node that timed out fails at once for 1 s, doubling up to 5 s while it keeps timing out."""

_skips: weakref.WeakKeyDictionary[Any, dict[str, tuple[float, int]]] = weakref.WeakKeyDictionary()
"""cluster client -> node name -> (monotonic time until which it is skipped, timeouts so far)."""
_skips_lock = threading.Lock()
_scripts: weakref.WeakKeyDictionary[Any, Scripts] = weakref.WeakKeyDictionary()
"""node client -> the library's functions called through it."""


def _cluster(client: Any) -> bool:
    return isinstance(client, redis.cluster.RedisCluster)


def node_client(client: Any, key: str) -> Any:
    """The plain client of the node serving ``key`` (``client`` itself on one node)."""
    if not _cluster(client):
        return client
    return client.get_redis_connection(client.get_node_from_key(key))


def node_scripts(scripts: Scripts, node: Any) -> Scripts:
    """``scripts``'s functions called through ``node``, the client ``each_node`` handed a piece
    (``scripts`` itself when that is its own client: one node, or a piece sent again through the
    cluster client): a missing library is loaded on that node alone, never through the cluster
    client."""
    if node is scripts.client:
        return scripts
    with _skips_lock:
        found = _scripts.get(node)
        if found is None:
            found = _scripts[node] = Scripts(node)
            found.load()
    return found


def split_by_node(client: Any, items: Sequence[T], key_of: Callable[[T], str]) -> list[list[T]]:
    """``items`` in one list per node serving ``key_of(item)``, in their order; one list on a
    single node (none for no items)."""
    return [piece for _, piece in _split(client, items, key_of)]


def _split(client: Any, items: Sequence[T], key_of: Callable[[T], str]) -> list[tuple[Any, list[T]]]:
    if not items:
        return []
    if not _cluster(client):
        return [(None, list(items))]
    pieces: dict[str, tuple[Any, list[T]]] = {}
    for item in items:
        node = client.get_node_from_key(key_of(item))
        pieces.setdefault(node.name if node is not None else "", (node, []))[1].append(item)
    return list(pieces.values())


def _skipped(client: Any, name: str) -> bool:
    with _skips_lock:
        return _skips.get(client, {}).get(name, (0.0, 0))[0] > time.monotonic()


def _note(client: Any, name: str, exc: BaseException | None) -> None:
    """Skip a node that timed out for a while (doubling); forget it once it answers."""
    with _skips_lock:
        skips = _skips.setdefault(client, {})
        if exc is None:
            skips.pop(name, None)
        elif isinstance(exc, redis.TimeoutError):
            failures = skips.get(name, (0.0, 0))[1]
            wait_ms = min(SKIP_MAX_MS, SKIP_FIRST_MS * 2 ** min(failures, 10))
            skips[name] = (time.monotonic() + wait_ms / 1000, failures + 1)


def each_node(client: Any, items: Sequence[T], key_of: Callable[[T], str],
              work: Callable[[Any, list[T]], None]) -> list[tuple[list[T], BaseException]]:
    """Run ``work(node, piece)`` on each node's piece of ``items``, ``node`` being the client
    to use (that node's plain client on a cluster); return the pieces whose node failed, each
    with its error, for the caller to retry later.

    On a cluster the pieces run at once, one thread each, and every one has ended when this
    returns (each call is bounded by the socket timeout, with no retry): ``work`` may change
    state its callers share only per item (or under a lock). When every piece failed, nothing
    was done anywhere: the first error is raised, and the caller waits and tries again as it
    does for any failed round. Anything else ``work`` raises is raised (after every piece
    ended)."""
    pieces = _split(client, items, key_of)
    if not _cluster(client):
        outcomes = [_run(client, None, client, piece, work) for _, piece in pieces]
    else:
        outcomes = [None] * len(pieces)

        def run(i: int, node: Any, piece: list[T]) -> None:
            outcomes[i] = _run(client, node, client.get_redis_connection(node), piece, work)

        threads = [threading.Thread(target=run, args=(i, node, piece), daemon=True,
                                    name="rcoord-node") for i, (node, piece) in enumerate(pieces)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    failed: list[tuple[list[T], BaseException]] = []
    for (_, piece), exc in zip(pieces, outcomes, strict=True):
        if isinstance(exc, NODE_FAILURES):
            failed.append((piece, exc))
        elif exc is not None:
            raise exc
    if failed and len(failed) == len(pieces):
        raise failed[0][1]
    return failed


def _run(client: Any, node: Any, via: Any, piece: list[T],
         work: Callable[[Any, list[T]], None]) -> BaseException | None:
    """One piece; what it raised (None if nothing). A node that timed out a moment ago fails
    at once; a node that answers that the slot moved has the piece run through the cluster
    client, which follows it."""
    if node is not None and _skipped(client, node.name):
        return redis.TimeoutError(f"{node.name} timed out a moment ago; skipped for now")
    try:
        try:
            work(via, piece)
        except MOVED:
            if node is None:
                raise
            work(client, piece)
    except Exception as exc:  # noqa: BLE001 - handed to the caller's thread
        if node is not None:
            _note(client, node.name, exc)
        return exc
    if node is not None:
        _note(client, node.name, None)
    return None


def on_any_node(client: Any, call: Callable[[Any], T]) -> T:
    """``call(node)`` on the first master that answers (one node: ``client``), skipping one
    that timed out a moment ago: for what any node can answer (the server's ``TIME``)."""
    if not _cluster(client):
        return call(client)
    nodes = client.get_primaries()
    error: BaseException | None = None
    for node in sorted(nodes, key=lambda n: _skipped(client, n.name)):
        try:
            result = call(client.get_redis_connection(node))
        except NODE_FAILURES as exc:
            _note(client, node.name, exc)
            error = error or exc
            continue
        _note(client, node.name, None)
        return result
    assert error is not None
    raise error
