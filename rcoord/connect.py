"""Connecting to Redis from a URL: one node or a cluster, whichever the server says it is.

The coordinator service (``rcoord.service``) and the worker client (``rcoord.client``) both
connect through ``connect``, so a deployment is described by its URL alone.

How the topology is found: ``HELLO`` (no arguments) answers with a ``mode`` field,
``standalone`` or ``cluster``. Redis and Valkey run ``HELLO`` for every authenticated user
whatever its ACL rules say (it is flagged ``no-auth`` like ``AUTH``), so a least-privilege user
that may not run ``INFO`` still gets the right answer; taking a cluster for a single node would
leak raw ``MOVED`` errors from every later call. Servers older than 6.2 do not know ``HELLO``
without arguments; for them ``INFO cluster`` is asked instead, and a refusal of both is an
error that names the permission, never a guess.

A cluster client also needs ``CLUSTER SLOTS`` (to map slots to nodes) and ``COMMAND`` (to find
the keys of a command); a user without them gets a ``MissingPermissionError`` naming them
instead of redis-py's "cannot be connected" (docs/security.md has the ACL rules).

Closing: a cluster client is a ``ClusterClient``, whose ``close()`` also shuts the sockets of
every node. redis-py's own ``RedisCluster.close()`` does not when the client was made from a URL
(see the class), and a start that fails shuts the sockets it opened before raising.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import redis
import redis.cluster
import redis.exceptions
from redis.crc import REDIS_CLUSTER_HASH_SLOTS

from .errors import ConfigError, MissingPermissionError, is_missing_function
from .urls import redact_url

__all__ = ["FULL_COVERAGE", "MAX_CONNECTIONS", "ClusterClient", "connect", "driver_info",
           "learn_node", "one_operation", "partial_listing", "refresh_uncovered",
           "refuse_partial_listing", "refused_unrun", "server_mode"]

MAX_CONNECTIONS = 1000
"""Connections a client made by ``connect`` opens at most (per node on a cluster), as needed.
redis-py 8 made its pool refuse a command past 100 ("Too many connections"), and every thread
in a call holds one (a parked JoinGroup or SyncGroup for up to half the socket timeout): a
process of 200 member threads on one blocking coordinator had 13 of its joins fail. A server
takes 10,000 clients by default."""

FULL_COVERAGE = False
"""The ``require_full_coverage`` of rcoord's cluster clients: False, so a client serves the
slots that have a master while another slot has none (a master lost with no replica to
promote, on a cluster run with ``cluster-require-full-coverage no``), as Kafka keeps serving
the partitions whose leaders are up. redis-py's default, True, refused to start a client then
("All slots are not covered"), and failed every topology refresh of a running one (after a
failover or a MOVED), which so never learned a covered slot's new master; a call to the
unserved slot fails either way, with redis-py's CLUSTERDOWN or ``SlotNotCoveredError``,
which rcoord raises as ``ConnectionLost`` (retriable). So does a listing of the keyspace
(``LISTINGS``) meanwhile: ``refuse_partial_listing``."""

LISTINGS = frozenset({"SCAN", "KEYS", "DBSIZE", "RANDOMKEY"})
"""Commands a cluster client sends to every master to list (or count) the keys of every slot:
refused while a slot has no master (``refuse_partial_listing``)."""

CLUSTER_COMMANDS = ("CLUSTER SLOTS", "COMMAND")
"""What redis-py's RedisCluster runs on start besides the caller's commands."""


def server_mode(client: redis.Redis) -> str:
    """``"cluster"`` or ``"standalone"``, as the server reports it (see the module docstring)."""
    try:
        hello = client.execute_command("HELLO")
    except redis.exceptions.NoPermissionError:
        hello = None  # not seen on Redis/Valkey (HELLO is no-auth), but cheap to handle
    except redis.exceptions.ResponseError:
        hello = None  # before 6.2: HELLO needs a protocol version, or is unknown (before 6.0)
    if isinstance(hello, dict):
        mode = hello.get(b"mode", hello.get("mode"))
        if mode is not None:
            return mode.decode() if isinstance(mode, bytes) else str(mode)
    try:
        info = client.info("cluster")
    except redis.exceptions.NoPermissionError as exc:
        raise MissingPermissionError(
            "cannot tell a Redis Cluster from a single node: the server has no HELLO mode field "
            f"and the user may not run INFO ({exc}); allow +info in its ACL rules"
        ) from exc
    return "cluster" if str(info.get("cluster_enabled", 0)) == "1" else "standalone"


@functools.cache
def driver_info() -> Any:
    """One ``DriverInfo`` (redis-py >= 7.1) for every connection this module's clients make;
    pass it as ``driver_info=`` when you build a redis-py client for rcoord yourself.

    Without it, redis-py 8 builds a new one in each ``Connection.__init__`` of a pool made from
    a URL, and that reads the installed package's metadata (``importlib.metadata.version``,
    an email-header parse): about 0.5 ms of CPU per connection, most of the cost of a client's
    start when many workers connect at once. The name and version are the ones redis-py would
    compute, so ``CLIENT SETINFO`` sends the same. None where redis-py has no ``DriverInfo``.
    """
    try:
        from redis.driver_info import DriverInfo
    except ImportError:
        return None
    return DriverInfo(name="redis-py", lib_version=redis.__version__)


class ClusterClient(redis.cluster.RedisCluster):
    """A ``RedisCluster`` whose ``close()`` shuts every node's sockets, as ``Redis.close()`` does.

    Why: redis-py (8.1) builds each node of a cluster made from a URL as
    ``Redis(connection_pool=ConnectionPool(...))``. A ``Redis`` handed a pool does not own it
    (``auto_close_connection_pool`` is False), so ``RedisCluster.close()``, which calls each
    node's ``Redis.close()``, returns the connections to their pools and leaves their sockets
    open until garbage collection: a ResourceWarning, and a connection the server keeps until
    then. The same holds for a start that fails after opening a socket (a user refused
    ``CLUSTER SLOTS`` or ``COMMAND``): redis-py raises from ``__init__`` and nobody can close
    what it opened. Only public redis-py attributes are read (``startup_nodes``,
    ``nodes_manager``, ``ClusterNode.redis_connection``); nothing of redis-py is patched.

    Its ``nodes_manager`` follows an ``ASK`` to a master added since the topology was read
    (``_LearningNodesManager``), and a call every attempt of which a node refused unrun is
    marked so (``refused_unrun``).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Whether an attempt of the thread's call in flight may have run (``refused_unrun``);
        # set first: redis-py's __init__ may send a call through this client.
        self._maybe_ran = threading.local()
        try:
            super().__init__(*args, **kwargs)
        except BaseException:
            self._disconnect_nodes()
            raise
        # Its pipelines share it, so they follow an ASK to a new master too.
        self.nodes_manager.__class__ = _LearningNodesManager

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._disconnect_nodes()

    def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        """redis-py's, and a refusal (``REFUSALS``) it ends with is marked ``refused_unrun``
        when no attempt of this call (of the whole ``one_operation`` it is in) failed
        otherwise: redis-py sends a call again after a lost connection or a timeout, which it
        may have run, and then raises the later attempt's error alone."""
        calls = self._maybe_ran
        scoped = getattr(calls, "scoped", False)
        outer = getattr(calls, "value", False)  # (a call sent while another is: its own mark)
        if not scoped:
            calls.value = False
        try:
            return super().execute_command(*args, **kwargs)  # type: ignore[no-untyped-call]
        except REFUSALS as exc:
            if not calls.value:
                _REFUSED_UNRUN.add(exc)
            raise
        finally:
            if not scoped:
                calls.value = outer

    @contextlib.contextmanager
    def one_operation(self) -> Iterator[None]:
        """Judge the calls of the block together for ``refused_unrun``: one script call can be
        several commands (on NOSCRIPT, ``rcoord.scripts.send_reloading`` loads the script and
        sends it again), and the last one's refusals say nothing of an earlier one that lost
        its connection after it ran (a failover's empty script cache, then a slot move: a
        stored append was answered "not stored")."""
        calls = self._maybe_ran
        saved = getattr(calls, "scoped", False), getattr(calls, "value", False)
        calls.scoped, calls.value = True, False
        try:
            yield
        finally:
            calls.scoped, calls.value = saved

    def _execute_command(self, *args: Any, **kwargs: Any) -> Any:
        """redis-py's attempt at one node, noting an attempt that failed other than by a
        refusal (``execute_command``). A script or function the server did not have ran
        nothing either: in ``one_operation`` the resend after its reload is judged with it,
        so counting it "may have run" answered an append nothing of which was stored
        "maybe written"."""
        try:
            return super()._execute_command(*args, **kwargs)  # type: ignore[no-untyped-call]
        except REFUSALS:
            raise
        except BaseException as exc:
            if not _not_loaded(exc):
                self._maybe_ran.value = True
            raise

    def _determine_nodes(self, *args: Any, **kwargs: Any) -> Any:
        """redis-py's, but a listing of every slot is refused while one has no master
        (``refuse_partial_listing``), and a slot with no master in the map is looked up again
        (``refresh_uncovered``)."""
        if partial_listing(self.nodes_manager, args[0]):
            # Maybe an old map (the slot has a master again): read it again first.
            self.nodes_manager.initialize()
            refuse_partial_listing(self.nodes_manager, args[0])
        find = super()._determine_nodes
        try:
            return find(*args, **kwargs)
        except redis.exceptions.SlotNotCoveredError:
            if not refresh_uncovered(self):
                raise
            return find(*args, **kwargs)

    def get_node_from_key(self, key: Any, replica: bool = False) -> Any:
        """redis-py's, looked up again once the map read again (``refresh_uncovered``)."""
        find = super().get_node_from_key
        try:
            return find(key, replica)  # type: ignore[no-untyped-call]
        except redis.exceptions.SlotNotCoveredError:
            if not refresh_uncovered(self):
                raise
            return find(key, replica)  # type: ignore[no-untyped-call]

    def _disconnect_nodes(self) -> None:
        """Disconnect the pool of every node this client made, whether ``__init__`` finished.

        ``startup_nodes`` is set before redis-py asks ``CLUSTER SLOTS`` (and holds the URL's
        node); ``nodes_manager`` exists once the slots are known. A node the topology dropped
        on a later refresh is in neither (redis-py forgets it) and is left to its own ``__del__``.
        """
        nodes: list[Any] = list(getattr(self, "startup_nodes", None) or ())
        manager = getattr(self, "nodes_manager", None)
        if manager is not None:
            nodes += manager.startup_nodes.values()
            nodes += manager.nodes_cache.values()
        pools = {id(pool): pool for pool in (
            node.redis_connection.connection_pool for node in nodes
            if node.redis_connection is not None)}
        for pool in pools.values():
            pool.disconnect()


def _not_loaded(exc: BaseException) -> bool:
    """The server's answer that the script (``NOSCRIPT``) or function called is not loaded:
    it ran nothing."""
    return isinstance(exc, redis.exceptions.NoScriptError) or is_missing_function(exc)


REFUSALS = (redis.exceptions.ClusterError, redis.exceptions.SlotNotCoveredError)
"""What a cluster client's call raises when a node refused it before running it: redis-py's
"TTL exhausted" (its redirections, ``TRYAGAIN``, ``MOVED`` and ``ASK``, ran out; a multi-key
call whose keys a slot move split between two masters gets ``TRYAGAIN`` until the move ends),
``CLUSTERDOWN``, or a slot no master is known for (nothing sent)."""

_REFUSED_UNRUN: weakref.WeakSet[BaseException] = weakref.WeakSet()
"""The refusals ``ClusterClient.execute_command`` raised with no attempt that may have run."""


def one_operation(client: Any) -> contextlib.AbstractContextManager[None]:
    """``ClusterClient.one_operation`` of a cluster client made by ``connect``; nothing for
    another client (whose refusals are never marked)."""
    if isinstance(client, ClusterClient):
        return client.one_operation()
    return contextlib.nullcontext()


def refused_unrun(exc: BaseException) -> bool:
    """Whether ``exc``, or an exception it was raised from (rcoord's ``ConnectionLost`` is
    raised from redis-py's), is a cluster client's call every attempt of which a node refused
    before running it: certainly not run, where the error alone (a "TTL exhausted") cannot
    say so, since redis-py raises it too after a retry of an attempt that may have run. A
    write so refused can be answered "not written" (the gateway's Produce:
    NOT_LEADER_OR_FOLLOWER), not "maybe written"."""
    seen: BaseException | None = exc
    while seen is not None:
        if seen in _REFUSED_UNRUN:
            return True
        seen = seen.__cause__
    return False


def learn_node(manager: Any, found: Any, host: str | None, node_name: str | None,
               make_node: Callable[[str, int], Any]) -> Any:
    """What a cluster client's ``nodes_manager.get_node(host, port, node_name)`` answers:
    ``found`` (redis-py's answer) when it found a node or was not asked by name alone; else
    the master ``node_name`` (``host:port``, an ``ASK`` target), added to the manager's nodes
    (``make_node(host, port)`` builds it, with its connections); the client's next topology
    refresh keeps it or drops it as the cluster says. None for a name that is not
    ``host:port``."""
    if found is not None or not node_name or host is not None:
        return found
    host, _, port = node_name.rpartition(":")
    if not host or not port.isdigit():
        return None
    node = manager.nodes_cache.get(node_name)
    if node is None:
        node = make_node(host, int(port))
        node = manager.nodes_cache.setdefault(node.name, node)  # another thread may have won
    return node


UNCOVERED_REFRESH_S = 1.0
"""A cluster client reads the slot map again at most this often when a call meets a slot its
map has no master for (``refresh_uncovered``)."""


def refresh_uncovered(client: Any) -> bool:
    """Read ``client``'s slot map again (``CLUSTER SLOTS``) after a call met a slot with no
    master in it, at most every ``UNCOVERED_REFRESH_S``: whether it was read (the caller then
    looks the slot up again).

    redis-py (8.1) reads the map again on a redirection or a failed connection, but not when
    the map itself has no master for a slot, which it raises as ``SlotNotCoveredError`` before
    sending anything. With ``FULL_COVERAGE`` off a refresh while a slot had no master stores
    the map without it, and nothing ever read it again: once the slot had a master again (a
    replacement assigned, ``CLUSTER ADDSLOTS``), every call to it still failed, for the life
    of the client (a worker's groups there could not heartbeat or commit until it restarted).
    With full coverage the refresh had failed and the old map stayed, whose calls reached the
    slot's master as soon as it answered."""
    now = time.monotonic()
    if now - getattr(client, "_uncovered_refreshed", -UNCOVERED_REFRESH_S) < UNCOVERED_REFRESH_S:
        return False
    client._uncovered_refreshed = now
    try:
        client.nodes_manager.initialize()
    except Exception:  # noqa: BLE001 - the caller raises the slot's own error
        return False
    return True


def partial_listing(manager: Any, command: Any) -> bool:
    """``command`` is one of ``LISTINGS`` and the client's slot map (``manager.slots_cache``)
    has a slot no master serves (``refuse_partial_listing``)."""
    if isinstance(command, bytes):
        command = command.decode()
    if not isinstance(command, str) or command.upper() not in LISTINGS:
        return False
    cache = manager.slots_cache
    return len(cache) < REDIS_CLUSTER_HASH_SLOTS or not all(cache.values())


def refuse_partial_listing(manager: Any, command: Any) -> None:
    """Raise ``SlotNotCoveredError`` for a command of ``LISTINGS`` sent to every master while
    the client's slot map has a slot no master serves (the client refreshes that map first).

    With ``FULL_COVERAGE`` off, redis-py sends such a command to the masters it knows, which
    serve the other slots only: a ``SCAN`` left out the keys lost with that slot's master
    without a word, so ``topics list`` (and the gateway's Metadata for every topic, a pattern
    subscription's) omitted its topics, and a settings sweep after a loss marked done a search
    that had not seen every copy. Before, the client refused to start or refresh then; the
    refusal is retriable (``ConnectionLost``; a sweep waits for the next settle)."""
    if not partial_listing(manager, command):
        return
    cache = manager.slots_cache
    slot = next(s for s in range(REDIS_CLUSTER_HASH_SLOTS) if not cache.get(s))
    name = (command.decode() if isinstance(command, bytes) else command).upper()
    raise redis.exceptions.SlotNotCoveredError(
        f"slot {slot} is served by no master of the Redis Cluster: {name} of every master "
        f"would leave out its keys; try again once every slot has a master")


class _LearningNodesManager(redis.cluster.NodesManager):
    """redis-py's, and a node it does not know yet when asked by name: an ``ASK`` to a master
    added since the topology was read (``--cluster add-node``, then a reshard to it). redis-py
    (8.1) follows an ``ASK`` by looking its address up among the nodes it knows and failed with
    ``AttributeError: 'NoneType' object has no attribute 'redis_connection'`` for a new one,
    so during such a reshard heartbeats and commits raised that instead of reaching the node,
    and a member lost its partitions. A refresh would not help: a master owns no slot, and so
    is in no ``CLUSTER SLOTS`` answer, until its first slot's migration ends."""

    def get_node(self, host: str | None = None, port: int | None = None,
                 node_name: str | None = None) -> Any:
        found = super().get_node(host, port, node_name)
        return learn_node(self, found, host, node_name, self._new_master)

    def _new_master(self, host: str, port: int) -> Any:
        node = redis.cluster.ClusterNode(host, port, redis.cluster.PRIMARY)
        self.create_redis_connections([node])  # type: ignore[no-untyped-call]
        return node


def _missing_cluster_permission(client: redis.Redis) -> MissingPermissionError | None:
    """Run what RedisCluster runs on start; name the first command the user may not run."""
    for command in CLUSTER_COMMANDS:
        try:
            client.execute_command(*command.split())
        except redis.exceptions.NoPermissionError as exc:
            rule = "+" + command.lower().replace(" ", "|")
            return MissingPermissionError(
                f"the Redis user may not run {command}, which a Redis Cluster client needs to "
                f"find the nodes and the keys of each command: add {rule} to its ACL rules "
                f"(see docs/security.md); the server said: {exc}"
            )
    return None


def _cluster_database(url: str, db: object) -> ConfigError:
    """The error for a URL naming a database other than 0 of a Redis Cluster. Said by the
    server as "SELECT is not allowed in cluster mode" (or by redis-py as a ``db``
    querystring option), naming neither the URL nor its ``/DB``."""
    return ConfigError(
        f"the URL {redact_url(url)!r} names database {db}, but the server is a Redis Cluster, "
        f"whose clients use database 0 only: drop /{db} (or ?db={db}) from the URL")


def connect(url: str, **kwargs: Any) -> Any:
    """A client for ``url`` (redis://, rediss://, with user:password): a ``ClusterClient`` (a
    RedisCluster) when the server reports cluster mode, else a Redis. ``close()`` shuts every
    socket it opened; a failed ``connect`` leaves none open.

    ``kwargs`` go to redis-py (``socket_timeout``, ``ssl_ca_certs``, ...);
    ``socket_connect_timeout`` defaults to 5 s, ``max_connections`` (per node) to
    ``MAX_CONNECTIONS`` (the URL's ``?max_connections=`` wins over both), and
    ``decode_responses`` is always False (rcoord reads bytes). A cluster client serves the
    slots that have a master while another slot has none (``require_full_coverage`` defaults
    to False; see ``FULL_COVERAGE``).

    Raises redis-py's ``ConnectionError`` (refused, unknown host, TLS failure),
    ``AuthenticationError`` (wrong user or password), ``ValueError`` (a malformed URL;
    ``ConfigError`` for a database other than 0 on a cluster) and ``MissingPermissionError``
    (an ACL user that lacks what connecting needs).
    """
    kwargs.setdefault("socket_connect_timeout", 5.0)
    kwargs.setdefault("max_connections", MAX_CONNECTIONS)
    kwargs["decode_responses"] = False
    full_coverage = kwargs.pop("require_full_coverage", FULL_COVERAGE)  # (a cluster's only)
    info = driver_info()
    if info is not None and not {"driver_info", "lib_name", "lib_version"} & kwargs.keys():
        kwargs["driver_info"] = info
    probe = redis.Redis.from_url(url, **kwargs)
    db = probe.connection_pool.connection_kwargs.get("db") or 0
    try:
        cluster = server_mode(probe) == "cluster"
    except redis.exceptions.ResponseError as exc:
        probe.close()
        if db and "SELECT" in str(exc):
            raise _cluster_database(url, db) from exc
        raise
    except BaseException:
        probe.close()
        raise
    if not cluster:
        return probe
    if db:  # a Valkey cluster may take SELECT (cluster-databases); redis-py's client may not
        probe.close()
        raise _cluster_database(url, db)
    try:
        return ClusterClient.from_url(url, require_full_coverage=full_coverage, **kwargs)
    except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException) as exc:
        # redis-py words a refused CLUSTER SLOTS as "cannot be connected": say why.
        missing = _missing_cluster_permission(probe)
        if missing is not None:
            raise missing from exc
        raise
    finally:
        probe.close()
