"""What every handler can reach: the settings, the coordinator, the topics, one connection.

The gateway keeps no state of its own between requests (groups, offsets and records live in
Redis), so several gateways may serve the same namespace behind one address. Topic calls go
through ``rcoord.topics``, which is blocking: they run on a thread pool of their own, so a slow
one never stalls the event loop that serves the other connections.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import redis

from ..asyncio import AsyncGroupCoordinator
from ..asyncio.wake import command_limit, pool_size
from ..names import NAMESPACE_RULE, valid_namespace
from ..steps import block_limit
from ..topics import Producer, Topics
from ..topics.producer import MAX_REQUEST_SIZE_LIMIT
from .acl import (
    CLUSTER_NAME,
    Operation,
    ResourceType,
    operations_bitfield,
    supported_operations,
)
from .errors import AUTHORIZATION_FAILED, RequestError

__all__ = ["Connection", "ConnectionBudget", "GatewayConfig", "GatewayState"]

T = TypeVar("T")

NODE_ID = 0
"""The broker id this gateway gives itself; each gateway is the whole cluster to its clients."""


FETCH_WAITS_UNSIZED = 12
"""The Fetch waits' units when the client's pool does not say its size: what redis-py's default
pool of 100 connections gives them (``fetch_wait_limit``)."""


def fetch_wait_limit(client: Any) -> int:
    """How many ``XREAD BLOCK``s the Fetches waiting for records may have in flight at once on
    the asyncio client ``client`` (the units of ``GatewayState.fetch_waits``; each holds a
    pooled connection).

    The group coordinator keeps up to ``command_limit`` commands and half as many wake-stream
    reads in flight (``rcoord.asyncio.wake``): the Fetch waits get half of what that leaves of
    the pool, so the other half stays free for the rest (at least one unit). With redis-py's
    default 100: 50 + 25 for the coordinator, 12 units. On a cluster client the pools are per
    node, and so are the coordinator's bounds (its commands' and its reads'), while these units
    count all nodes together: the same formula over one node's pool bounds what each node's
    pool holds.
    ``FETCH_WAITS_UNSIZED`` when the pool does not say its size."""
    size = pool_size(client)
    if size is None:
        return FETCH_WAITS_UNSIZED
    commands = command_limit(client)
    coordinator = commands + max(1, commands // 2)
    return max(1, (size - coordinator) // 2)


class ConnectionBudget:
    """A number of units (connections) that tasks take several at a time and give back.

    ``take(n)`` gets all ``n`` or none, in the order the takers came: one that cannot have its
    ``n`` yet waits at the head of the line, and the smaller requests behind it do not overtake
    it (they would starve a large one for as long as small ones keep coming). A taker that
    leaves the line (timed out, cancelled) lets the ones behind it go on; units granted to it
    just as it left are given back. Bound to the event loop it is used on (its futures are)."""

    def __init__(self, units: int) -> None:
        if units < 1:
            raise ValueError(f"a budget needs at least one unit, got {units}")
        self.units = units
        self.free = units
        """Units not taken now."""
        self._line: collections.deque[tuple[int, asyncio.Future[bool]]] = collections.deque()

    @property
    def waiting(self) -> int:
        """Takers in line now (for tests and debugging)."""
        return len(self._line)

    async def take(self, n: int, timeout: float | None = None) -> bool:
        """Take ``n`` units, waiting in line for up to ``timeout`` seconds (None: as long as it
        takes): True once taken, False if the time ran out first (nothing is taken then)."""
        if not 1 <= n <= self.units:
            raise ValueError(f"cannot take {n} of {self.units} units")
        if not self._line and n <= self.free:
            self.free -= n
            return True
        if timeout is not None and timeout <= 0:
            return False
        loop = asyncio.get_running_loop()
        granted: asyncio.Future[bool] = loop.create_future()
        place = (n, granted)
        self._line.append(place)
        timer = None if timeout is None else loop.call_later(timeout, self._expire, place)
        try:
            return await granted
        except BaseException:  # cancelled: out of the line, and units granted meanwhile back
            self._leave(place)
            raise
        finally:
            if timer is not None:
                timer.cancel()

    def give(self, n: int) -> None:
        """Give back ``n`` units taken before; the takers in line get them in turn."""
        if n < 1 or self.free + n > self.units:
            raise ValueError(f"cannot give {n} units back ({self.free} of {self.units} free)")
        self.free += n
        self._grant()

    def _grant(self) -> None:
        while self._line:
            n, future = self._line[0]
            if not future.done():
                if n > self.free:
                    return
                self.free -= n
                future.set_result(True)
            self._line.popleft()

    def _expire(self, place: tuple[int, asyncio.Future[bool]]) -> None:
        if not place[1].done():
            place[1].set_result(False)
            self._leave(place)

    def _leave(self, place: tuple[int, asyncio.Future[bool]]) -> None:
        n, future = place
        if future.done() and not future.cancelled() and future.result():
            self.give(n)  # granted as the taker left
            return
        future.cancel()
        with contextlib.suppress(ValueError):
            self._line.remove(place)
        self._grant()  # it may have held back the smaller requests behind it


@dataclass(frozen=True)
class GatewayConfig:
    """``advertise_*``: the address clients are told to connect to (Metadata, FindCoordinator);
    ``max_frame_bytes``: Kafka's ``socket.request.max.bytes``; ``topic_threads``: threads for
    the blocking topic calls; ``tls_*``: TLS on the listener (Kafka's SSL / SASL_SSL)."""

    listen_host: str = "127.0.0.1"
    listen_port: int = 9092
    advertise_host: str | None = None
    advertise_port: int | None = None
    namespace: str = "rcoord"
    max_frame_bytes: int = 100 * 1024 * 1024
    message_max_bytes: int = 1024 * 1024 + 12
    """The largest record batch a Produce may append to a partition (Kafka's broker setting
    ``message.max.bytes``, and its default: 1 MiB and a batch's 12-byte log overhead); a larger
    one is MESSAGE_TOO_LARGE for its partition. Without it a batch was bounded only by
    ``max_frame_bytes`` (100 MiB), so a client told by a Kafka broker's limit found none here,
    and a stream entry could hold a hundred times what Kafka's consumers expect a batch to be."""
    topic_threads: int = 16
    tls_cert_file: str | None = None
    """Serve TLS on the listener with this certificate chain (PEM); None: plaintext."""
    tls_key_file: str | None = None
    """The certificate's private key (PEM); None: it is in ``tls_cert_file``."""
    tls_key_password_file: str | None = None
    """A file whose first line is the private key's pass phrase (Kafka's ``ssl.key.password``,
    kept out of the command line and the environment, where ``ps`` and ``/proc`` show it);
    None: the key is not encrypted."""
    tls_ca_file: str | None = None
    """CA(s) that must sign a client certificate: every client must present one (mutual TLS).
    None: clients are not asked for a certificate."""
    commit_required_acks: int = 0
    """Replicas that must have an OffsetCommit before it is answered (Kafka's broker setting
    ``offsets.commit.required.acks``; 0 trusts the master, see docs/guarantees.md)."""
    commit_ack_timeout_ms: int = 5000
    """How long a commit waits for them (``offsets.commit.timeout.ms``)."""
    socket_send_buffer_bytes: int = 100 * 1024
    """Each client socket's send buffer (SO_SNDBUF; Kafka's ``socket.send.buffer.bytes`` and its
    default; -1: the system's, which Linux grows up to ``net.ipv4.tcp_wmem``'s maximum, 4 MiB by
    default). A connection reads its next request only once the answers before it are in this
    buffer and its transport's 64 KiB, as Kafka's broker: left to grow, it took about 10,000
    answers (4 MiB) for a peer that never reads before the connection stopped reading, its
    work done and its memory held until the idle sweep, which that work had kept away for
    seconds on a loaded machine."""
    connections_max_idle_ms: int = 600_000
    """A connection that has no request in progress and sends no complete request for about
    this long is closed (Kafka's ``connections.max.idle.ms``, 10 minutes): a peer that connects
    and stays silent, or sends part of a frame and stops, no longer holds a task and its buffer
    for ever. Clients reconnect when they next need the connection, as they do with Kafka."""

    def validate(self) -> GatewayConfig:
        if not valid_namespace(self.namespace):  # CoordinatorConfig's rule and words
            raise ValueError(f"namespace must be {NAMESPACE_RULE}, got {self.namespace!r}")
        if not 0 <= self.listen_port <= 65535:
            raise ValueError(f"listen_port must be 0..65535, got {self.listen_port}")
        if self.advertise_port is not None and not 1 <= self.advertise_port <= 65535:
            raise ValueError(f"advertise_port must be 1..65535, got {self.advertise_port}")
        if self.max_frame_bytes < 1024:
            raise ValueError(f"max_frame_bytes must be >= 1024, got {self.max_frame_bytes}")
        if self.message_max_bytes < 0:  # (Kafka's atLeast(0))
            raise ValueError(f"message_max_bytes must be >= 0, got {self.message_max_bytes}")
        if self.commit_required_acks < 0 or self.commit_ack_timeout_ms < 1:
            raise ValueError("commit_required_acks must be >= 0 and commit_ack_timeout_ms >= 1 "
                             "(Redis keeps no in-sync replica set: Kafka's -1 has no equivalent)")
        if self.socket_send_buffer_bytes < 1 and self.socket_send_buffer_bytes != -1:
            raise ValueError("socket_send_buffer_bytes must be >= 1, or -1 for the system's, "
                             f"got {self.socket_send_buffer_bytes}")
        if self.connections_max_idle_ms < 100:
            raise ValueError("connections_max_idle_ms must be >= 100, got "
                             f"{self.connections_max_idle_ms}")
        if self.topic_threads < 1:
            raise ValueError(f"topic_threads must be >= 1, got {self.topic_threads}")
        if self.tls_cert_file is None and (self.tls_key_file or self.tls_ca_file
                                           or self.tls_key_password_file):
            raise ValueError("tls_key_file, tls_key_password_file and tls_ca_file need "
                             "tls_cert_file (the listener's certificate)")
        return self


class GatewayState:
    """The shared pieces of one gateway process (see the module docstring)."""

    def __init__(self, config: GatewayConfig, async_redis: Any, sync_redis: Any,
                 auth: Any = None) -> None:
        self.config = config
        self.auth = auth
        """An ``auth.AuthConfig``: every connection must authenticate (None: no one must)."""
        self.redis = async_redis
        self.block_limit_ms = block_limit(async_redis)
        """The longest ``XREAD BLOCK`` the Redis client's socket timeout lets through."""
        self.sync_redis = sync_redis
        self.coordinator = AsyncGroupCoordinator(async_redis, config.namespace)
        self.topics = Topics(sync_redis, config.namespace)
        # A record is bounded by the frame that brought it (Kafka's clients bound it by their
        # own max.request.size), not by the Producer's default.
        self.producer = Producer(sync_redis, config.namespace, idempotent=False,
                                 max_request_size=min(config.max_frame_bytes,
                                                      MAX_REQUEST_SIZE_LIMIT))
        self.executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=config.topic_threads, thread_name_prefix="rcoord-gateway-topics")
        self.advertised: tuple[str, int] = (config.listen_host, config.listen_port)
        self.cluster = not isinstance(sync_redis, redis.Redis)
        """A Redis Cluster: multi-key commands must stay within one slot."""
        self.fetch_wait_limit = fetch_wait_limit(async_redis)
        """``XREAD BLOCK``s of waiting Fetches in flight at once at most (``fetch_waits``)."""
        self.fetch_waiting = 0
        """Fetches waiting for records now, blocked or in line for units (for tests and
        debugging)."""
        self.record_bytes: dict[tuple[str, int], int] = {}
        """Bytes per record of each partition's last read in a Fetch, as ``rcoord.topics``'
        byte limits weigh them (``read_bytes``), (topic, partition) -> bytes: the next first
        read asks for what its limit holds at that size (``api_records._read``). Cleared when
        it names ``RECORD_SIZES_KEPT`` partitions."""
        self._fetch_waits: tuple[asyncio.AbstractEventLoop, ConnectionBudget] | None = None
        self.missing_permissions: dict[str, tuple[float, int]] = {}
        """The refusals of the gateway's Redis user logged (``dispatch``'s
        ``_missing_permission``): when each was last logged (``time.monotonic``), and how many
        requests it failed since."""
        self.login_refusals: dict[str, tuple[float, int]] = {}
        """Refused logins of the gateway's own (``errors.log_login_refused``): when each
        was last logged (``time.monotonic``), and how many requests it failed since."""
        self.unreached: dict[str, tuple[float, int]] = {}
        """Failures to reach Redis (``errors.log_unreached``), as ``login_refusals``."""

    def fetch_waits(self) -> ConnectionBudget:
        """The units of the Fetches that wait for records (``fetch_wait_limit`` of them, one per
        ``XREAD BLOCK`` in flight), made on the running loop (its waiters' futures belong to
        one)."""
        loop = asyncio.get_running_loop()
        if self._fetch_waits is None or self._fetch_waits[0] is not loop:
            self._fetch_waits = (loop, ConnectionBudget(self.fetch_wait_limit))
        return self._fetch_waits[1]

    async def blocking(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run a blocking topic call on the topic threads."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.executor, functools.partial(fn, *args, **kwargs))

    def close(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)


@dataclass
class Connection:
    """One client connection: who it is, for the requests that record it (JoinGroup)."""

    state: GatewayState
    client_host: str
    client_id: str = ""
    sasl_mechanism: str | None = None
    sasl_raw_token: bool = False
    """SaslHandshake v0 was answered: the next frame is the SASL token, no request
    (``auth.raw_token``)."""
    api_versions_answered: bool = False
    """ApiVersions was answered before authentication (Kafka's HANDSHAKE_REQUEST state): the
    SASL order (``dispatch``) lets it come once, before SaslHandshake."""
    principal: str | None = None
    """``User:<name>`` once SASL authentication succeeded (None: not yet, or no auth file)."""
    close_after_response: bool = False
    """Set by a handler whose answer must be the connection's last (a failed authentication)."""
    requests: int = 0
    """Requests read so far; the idle sweep (``Gateway``) sees a silent connection by it."""
    busy: bool = False
    """A request is being answered (a parked JoinGroup, a waiting Fetch): never idle then."""

    def may(self, op: Operation, resource: ResourceType, name: str = CLUSTER_NAME, *,
            log_denied: bool = True) -> bool:
        """May this connection's principal do ``op`` on the resource? True when no ACLs are
        configured (``rcoord.gateway.acl`` has the rules)."""
        auth = self.state.auth
        if auth is None or auth.authorizer is None:
            return True
        return bool(auth.authorizer.authorize(self.principal or "User:ANONYMOUS",
                                              self.client_host, op, resource, name,
                                              log_denied=log_denied))

    def authorized_operations(self, resource: ResourceType, name: str = CLUSTER_NAME) -> int:
        """The ``authorized_operations`` bitfield of a resource (Kafka's
        ``AuthHelper.authorizedOperations``): each operation supported on its type that the
        principal may do, decided without logging denials; every one when no ACLs are
        configured."""
        return operations_bitfield(
            op for op in supported_operations(resource)
            if self.may(op, resource, name, log_denied=False))

    def may_any(self, op: Operation, resource: ResourceType) -> bool:
        """May the principal do ``op`` on some resource of this type (Kafka's
        ``authorizeByResourceType``)? True when no ACLs are configured."""
        auth = self.state.auth
        if auth is None or auth.authorizer is None:
            return True
        return bool(auth.authorizer.authorize_any(self.principal or "User:ANONYMOUS",
                                                  self.client_host, op, resource))

    def require(self, op: Operation, resource: ResourceType, name: str = CLUSTER_NAME) -> None:
        """Raise the request-wide authorization error of the resource type unless allowed."""
        if not self.may(op, resource, name):
            raise RequestError(AUTHORIZATION_FAILED[resource],
                               f"{op.value} on {resource.value} {name} is not allowed")
