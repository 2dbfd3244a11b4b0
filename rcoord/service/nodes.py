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

A node that refuses (killed: connection refused; CLUSTERDOWN; out of memory) is likewise left
alone for ``RETRY_FIRST_MS``, doubling up to ``RETRY_MAX_MS``, as Kafka's client waits
``reconnect.backoff.ms`` (doubling up to ``reconnect.backoff.max.ms``, 1 s) before it connects
to a failed broker again (``ClusterConnectionStates``): every round (lease renewal, event tail,
index re-read, sweep) used to ask a dead master again, each logging a ``node_error`` line (about
8 a second for as long as it was down). A node's failure is logged here, once per outage as
Kafka's ``NetworkClient`` logs a disconnected node once per state change: when it starts, then at
most every ``LOG_EVERY_S`` with the number of failures left out, and once when it answers again.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import redis
import redis.cluster
import redis.exceptions
from redis.crc import REDIS_CLUSTER_HASH_SLOTS

from ..errors import AuthenticationFailedError, ConnectionLost
from ..scripts import Scripts

__all__ = ["LOG_EVERY_S", "NODE_FAILURES", "Outage", "disconnect_all", "each_node", "forget_failures",
           "node_client", "node_scripts", "on_any_node", "on_node", "split_by_node"]

T = TypeVar("T")

NODE_FAILURES: tuple[type[BaseException], ...] = (
    redis.ConnectionError, redis.TimeoutError, redis.exceptions.ClusterError, ConnectionLost,
    AuthenticationFailedError, redis.exceptions.SlotNotCoveredError)
"""What says a node could not run a piece at all (rcoord's ``ServerUnavailable`` is a
``ConnectionLost``: out of memory, READONLY, BUSY on that node). A script's own error is not
one: it concerns one call, and its caller handles it. A login the node refuses (a password
rotated under the running service; redis-py's ``AuthenticationError`` is a
``ConnectionError``, rcoord's ``AuthenticationFailedError`` is not a ``ConnectionLost``) is
one too: the service goes on with the other nodes and reports the outage (its log, health),
as it did when rcoord raised it as ``ConnectionLost``; at start it exits 1 with one line. So is
a slot no master serves (redis-py's ``SlotNotCoveredError``, a ``RedisClusterException``: the
cluster client does not require full coverage, ``connect.FULL_COVERAGE``): it failed the whole
lease round, and every lease lapsed."""
MOVED = (redis.exceptions.AskError, redis.exceptions.TryAgainError)
"""A node's answer that the slot is (being) moved (``MovedError`` is an ``AskError``): the
piece is run again through the cluster client, which follows the slot (a reshard)."""
SKIP_FIRST_MS = 1000
SKIP_MAX_MS = 5000
"""A node that timed out fails at once for 1 s, doubling up to 5 s while it keeps timing out."""
RETRY_FIRST_MS = 200
RETRY_MAX_MS = 1000
"""A node that refused fails at once for 200 ms, doubling up to 1 s (Kafka's
``reconnect.backoff.max.ms``): its deadlines still act within about a second of it answering."""
LOG_EVERY_S = 30.0
"""While a node keeps failing, one line this often at most (with the count left out)."""

log = logging.getLogger("rcoord.service")


class Outage:
    """A failure that comes back every round while it lasts (a node down, a lease round that
    fails): logged when it starts, then at most every ``LOG_EVERY_S`` with the count left out,
    and once when it ends, as Kafka's ``NetworkClient`` logs a disconnected node once per state
    change. Before, each failed round was a warning line: several a second while Redis was
    down. ``fields`` go on every line.

    ``quiet_s``: an answer ends the outage only once that long has passed since the last
    failure (0: at once). For a round that fails only now and then while it lasts (the timer
    loop's turns with Redis out of memory: those that write fail, the others answer), which
    otherwise began a new outage, and its warning, at nearly every failure."""

    def __init__(self, event: str, message: str, *, again: str, over_event: str,
                 over_message: str, quiet_s: float = 0.0, **fields: Any) -> None:
        self._event, self._message, self._again = event, message, again
        self._over_event, self._over_message = over_event, over_message
        self._quiet_s = quiet_s
        self._last_failure = 0.0
        self._fields = fields
        self.since: float | None = None
        """When it began (monotonic); None while there is none."""
        self._logged = 0.0
        self._suppressed = 0
        self._failures = 0

    def failed(self, exc: BaseException) -> None:
        now = self._last_failure = time.monotonic()
        self._failures += 1
        if self.since is None:
            self.since = self._logged = now
            log.warning(self._message, extra={"event": self._event, **self._fields,
                                              "why": str(exc)})
        elif now - self._logged >= LOG_EVERY_S:
            log.warning(self._again, extra={
                "event": self._event, **self._fields, "why": str(exc),
                "suppressed": self._suppressed, "failed_ms": int((now - self.since) * 1000)})
            self._logged, self._suppressed = now, 0
        else:
            self._suppressed += 1

    def ended(self) -> None:
        if self.since is not None and time.monotonic() - self._last_failure >= self._quiet_s:
            log.info(self._over_message, extra={
                "event": self._over_event, **self._fields, "failures": self._failures,
                "failed_ms": int((time.monotonic() - self.since) * 1000)})
            self.since, self._suppressed, self._failures = None, 0, 0


@dataclass
class _Failing:
    """A node that failed and has not answered since."""

    outage: Outage
    """Its log."""
    until: float = 0.0
    """Until when it is not asked (monotonic)."""
    tries: int = 0
    """Times it was asked and failed (the backoff doubles with each)."""


_failing: weakref.WeakKeyDictionary[Any, dict[str, _Failing]] = weakref.WeakKeyDictionary()
"""cluster client -> node name -> its failure."""
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
        try:
            node = client.get_node_from_key(key_of(item))
        except redis.exceptions.SlotNotCoveredError as exc:
            node = pieces[_Unserved.name][0] if _Unserved.name in pieces else _Unserved(exc)
        pieces.setdefault(node.name if node is not None else "", (node, []))[1].append(item)
    return list(pieces.values())


def _served_again(client: Any) -> None:
    """End the outage of the slots with no master (``_Unserved``) once the client's slot map
    has a master for every slot (not merely for the items of one call: another call's may
    still have none)."""
    with _skips_lock:
        if _Unserved.name not in _failing.get(client, {}):
            return
    cache = client.nodes_manager.slots_cache
    if len(cache) == REDIS_CLUSTER_HASH_SLOTS and all(cache.values()):
        _note(client, _Unserved.name, None)


class _Unserved:
    """The "node" of the items whose slot no master serves (``_split``): their piece fails
    with ``error`` (``_run``), as a node down; the others are run. Before, redis-py's
    ``SlotNotCoveredError`` failed the whole call: one such lease partition failed every lease
    round, and every lease lapsed."""

    name = "(slots with no master)"

    def __init__(self, error: BaseException) -> None:
        self.error = error


class _SkippedError(redis.ConnectionError):
    """A piece not sent: its node failed a moment ago (``_skipped``)."""


def _skipped(client: Any, name: str) -> _SkippedError | None:
    """The error of a piece for a node left alone for now (counted as one more failure), or
    None if the node may be asked."""
    with _skips_lock:
        failing = _failing.get(client, {}).get(name)
        if failing is None or failing.until <= time.monotonic():
            return None
    exc = _SkippedError(f"{name} failed a moment ago; skipped for now")
    _note(client, name, exc)
    return exc


def _note(client: Any, name: str, exc: BaseException | None) -> None:
    """Record a node's outcome: a failure (``NODE_FAILURES``) leaves the node alone for a while
    (doubling: ``SKIP_*`` after a timeout, ``RETRY_*`` else) and is logged when the outage
    starts and then at most every ``LOG_EVERY_S``; an answer ends the outage (logged once)."""
    now = time.monotonic()
    with _skips_lock:
        nodes = _failing.setdefault(client, {})
        failing = nodes.get(name)
        if exc is None:
            if failing is not None:
                del nodes[name]
                failing.outage.ended()
            return
        if not isinstance(exc, NODE_FAILURES):
            return  # the node answered (a script's error concerns one call)
        if failing is None:
            failing = nodes[name] = _Failing(Outage(
                "node_error", "a Redis node fails; its partitions wait until it answers",
                again="a Redis node still fails", over_event="node_recovered",
                over_message="a Redis node answers again", node=name))
        if not isinstance(exc, _SkippedError):
            first_ms, max_ms = ((SKIP_FIRST_MS, SKIP_MAX_MS) if isinstance(exc, redis.TimeoutError)
                                else (RETRY_FIRST_MS, RETRY_MAX_MS))
            failing.until = now + min(max_ms, first_ms * 2 ** min(failing.tries, 10)) / 1000
            failing.tries += 1
        failing.outage.failed(exc)


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
        outcomes = [_run(client, None, piece, work) for _, piece in pieces]
    else:
        outcomes = [None] * len(pieces)

        def run(i: int, node: Any, piece: list[T]) -> None:
            outcomes[i] = _run(client, node, piece, work)

        threads = [threading.Thread(target=run, args=(i, node, piece), daemon=True,
                                    name="rcoord-node") for i, (node, piece) in enumerate(pieces)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    if _cluster(client) and not any(isinstance(node, _Unserved) for node, _ in pieces):
        _served_again(client)
    failed: list[tuple[list[T], BaseException]] = []
    for (_, piece), exc in zip(pieces, outcomes, strict=True):
        if isinstance(exc, NODE_FAILURES):
            failed.append((piece, exc))
        elif exc is not None:
            raise exc
    if failed and len(failed) == len(pieces):
        raise failed[0][1]
    return failed


def _run(client: Any, node: Any, piece: list[T],
         work: Callable[[Any, list[T]], None]) -> BaseException | None:
    """One piece, through ``node``'s plain client (``_following``; None: ``client``, one
    node); what it raised (None if nothing)."""
    if isinstance(node, _Unserved):
        skipped = _skipped(client, node.name)
        if skipped is not None:
            return skipped
        # Nothing is sent for this piece, so nothing would make the client read the slot map
        # again: the slot would stay without master in it for good. Read it now (with the
        # backoff of a node that refused: at most once a second), for the next call.
        with contextlib.suppress(Exception):
            client.nodes_manager.initialize()
        _note(client, node.name, node.error)  # (logged once per outage, as a node's)
        return node.error
    try:
        if node is None:
            work(client, piece)
        else:
            _following(client, node, lambda via: work(via, piece))
    except Exception as exc:  # noqa: BLE001 - handed to the caller's thread
        return exc
    return None


def _following(client: Any, node: Any, call: Callable[[Any], T]) -> T:
    """``call`` through ``node``'s plain client (``_ask``); if the node answers that the slot
    moved, once more through the cluster client, which follows the slot and learns the new
    map. That second call's failure is not ``node``'s: it answered. (It was taken for the
    node's, so a healthy master, one whose slot was being moved, was skipped for up to 1 s.)"""
    try:
        return _ask(client, node, call)
    except MOVED:
        return call(client)


def _ask(client: Any, node: Any, call: Callable[[Any], T]) -> T:
    """``call(plain client of node)``, with that node's backoff and log: one that failed a
    moment ago fails at once (``_skipped``), and the outcome is recorded (``_note``; an answer
    that the slot moved is an answer)."""
    skipped = _skipped(client, node.name)
    if skipped is not None:
        raise skipped
    try:
        result = call(client.get_redis_connection(node))
    except NODE_FAILURES as exc:
        _note(client, node.name, exc)
        raise
    except MOVED:
        _note(client, node.name, None)
        raise
    _note(client, node.name, None)
    return result


def on_node(client: Any, key: str, call: Callable[[Any], T]) -> T:
    """``call(node)`` through the plain client of the node serving ``key`` (one node:
    ``client``), with that node's backoff and log (``each_node``'s, for one call), following
    the slot as ``each_node`` does. (Without that, once the registry's slot moved every lease
    round failed on MOVED, for as long as the cluster client's map stayed old: the leases
    lapsed and nothing was swept.)"""
    if not _cluster(client):
        return call(client)
    return _following(client, client.get_node_from_key(key), call)


def on_any_node(client: Any, call: Callable[[Any], T]) -> T:
    """``call(node)`` on the first master that answers (one node: ``client``), leaving out
    those that failed a moment ago: for what any node can answer (the server's ``TIME``). Before,
    the left-out ones were asked last rather than not at all, so with every master hung one
    call cost a socket timeout per master (15 s with the default lease TTL)."""
    if not _cluster(client):
        return call(client)
    error: BaseException | None = None
    for node in client.get_primaries():
        try:
            return _ask(client, node, call)
        except _SkippedError as exc:
            error = error or exc
        except NODE_FAILURES as exc:
            error = exc
    assert error is not None
    raise error


def disconnect_all(client: Any) -> None:
    """Shut every socket of ``client``, those in use included: a call blocked in one (on a
    node that never answers) fails at once, as Kafka's ``consumer.wakeup()`` aborts a blocking
    call from another thread. The client connects again on its next call.

    Shut (``shutdown``), not closed: the thread that uses a socket closes it (redis-py
    disconnects a connection whose call failed; an idle one is found dead and replaced when it
    is next taken). ``ConnectionPool.disconnect`` closes them too, and that raced with a call in
    flight: a thread that had read the socket's descriptor but not yet entered its ``poll`` (a
    loaded machine) polled whatever the number was given to next (the lowest free one: the
    next connection any thread opened, to a hung master), and waited its whole socket timeout
    (5 s by default) however often the socket was shut. A SIGTERM then took 5 s and more."""
    if _cluster(client):
        pools = {id(pool): pool for pool in (
            node.redis_connection.connection_pool for node in client.get_nodes()
            if node.redis_connection is not None)}
    else:
        pools = {id(client.connection_pool): client.connection_pool}
    for pool in pools.values():
        try:  # (redis-py's ConnectionPool; another pool class is disconnected its own way)
            with pool._lock:
                connections = [*pool._available_connections, *pool._in_use_connections]
        except AttributeError:
            pool.disconnect()
            continue
        for connection in connections:
            sock = getattr(connection, "_sock", None)
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)


def forget_failures(client: Any) -> None:
    """Ask every node of ``client`` again at its next call, whatever it failed before (the
    calls ``disconnect_all`` failed say nothing of their nodes)."""
    with _skips_lock:
        _failing.pop(client, None)
