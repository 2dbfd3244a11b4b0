"""The asyncio server: one task per connection, requests of a connection answered in order.

Kafka's broker reads a connection's next request only after it has answered the previous one
(the channel is muted meanwhile), which is what makes responses come back in request order.
Each connection here is its own task that does the same, so a JoinGroup parked on one
connection waits on that task alone, and the event loop keeps serving every other connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from typing import Any, Self

import redis
import redis.asyncio
import redis.cluster
import redis.exceptions

from ..asyncio.cancel import cancel_and_wait
from ..asyncio.cluster import AsyncClusterClient
from ..connect import FULL_COVERAGE, connect
from ..errors import ConfigError, as_authentication_failed
from ..urls import redact_url
from .dispatch import handle_frame
from .framing import PRE_AUTH_MAX_FRAME_BYTES, FrameError, frame, read_frame
from .state import Connection, GatewayConfig, GatewayState

__all__ = ["Gateway", "TlsFileError", "close_connection"]

log = logging.getLogger("rcoord.gateway")

SOCKET_TIMEOUT_S = 30.0
"""Redis socket timeout; parked calls block for at most half of it (``rcoord.steps``)."""
DEFAULT_MAX_CONNECTIONS = 100
"""The asyncio client's pool (each node's on a cluster), unless the URL or the kwargs say
(redis-py's default; ``BlockingConnectionPool``'s own would be 50)."""
POOL_TIMEOUT_S = 10.0
"""How long a command waits for a free connection of that pool before it fails as Redis
unavailable (answered with the retriable codes of docs/gateway.md, "Bad requests")."""
TLS_HANDSHAKE_TIMEOUT_S = 10.0
"""A client that has not finished its TLS handshake by then is disconnected (the default of
``Gateway``'s ``tls_handshake_timeout_s``)."""


def async_single_node(redis_url: str, **kwargs: Any) -> redis.asyncio.Redis:
    """The asyncio client of one node: ``redis.asyncio.Redis.from_url``'s, with a pool that
    makes a command wait for a free connection (up to ``POOL_TIMEOUT_S``) where redis-py's
    default pool refuses it at once ("Too many connections"). The URL and ``kwargs`` are read
    as ``from_url`` reads them (TLS, credentials, ``?max_connections=``); the pool keeps
    redis-py's default size, 100, unless told otherwise."""
    kwargs.setdefault("max_connections", DEFAULT_MAX_CONNECTIONS)
    pool = redis.asyncio.BlockingConnectionPool.from_url(redis_url, timeout=POOL_TIMEOUT_S,
                                                         **kwargs)
    return redis.asyncio.Redis.from_pool(pool)  # (the client closes the pool)


def async_cluster(redis_url: str, **kwargs: Any) -> redis.asyncio.RedisCluster:
    """The asyncio client of a Redis Cluster: an ``AsyncClusterClient`` (it follows an ``ASK``
    to a master added since it started), each node's pool of ``DEFAULT_MAX_CONNECTIONS``
    unless the URL (``?max_connections=``, which ``from_url`` reads over the kwargs) or
    ``kwargs`` say otherwise. Such a pool refuses a command past its size
    (``MaxConnectionsError``) instead of waiting: the bounds that ``fetch_wait_limit`` and
    ``command_limit`` read from it keep the gateway below it. It serves the slots that have a
    master while another has none (``rcoord.connect.FULL_COVERAGE`` says why), as the
    blocking client does."""
    refused = async_cluster_refuses(redis_url)
    if refused:
        names = ", ".join(f"?{name}=" for name in refused)
        raise ConfigError(
            f"the URL {redact_url(redis_url, query=True)!r} has {names}, which redis-py's "
            "asyncio Redis Cluster client (the gateway's, on a cluster) does not take: remove "
            f"{'it' if len(refused) == 1 else 'them'} from the gateway's --redis-url")
    kwargs.setdefault("max_connections", DEFAULT_MAX_CONNECTIONS)
    kwargs.setdefault("require_full_coverage", FULL_COVERAGE)
    return AsyncClusterClient.from_url(redis_url, **kwargs)


def async_cluster_refuses(redis_url: str) -> list[str]:
    """The URL's query arguments that redis-py's asyncio ``RedisCluster`` has no parameter for.
    The URL check (``rcoord.urls``) takes what a connection takes, and the blocking clients
    pass all of it on; this client's ``__init__`` names its parameters one by one (8.1 has no
    ``retry_on_timeout``, ``ssl_password``, ``ssl_ca_path``, ...), so such a URL failed the
    gateway's start on a cluster as "unexpected TypeError: RedisCluster.__init__() got an
    unexpected keyword argument", after the blocking client had connected."""
    import inspect

    from redis.asyncio.connection import parse_url

    taken = inspect.signature(redis.asyncio.RedisCluster.__init__).parameters
    return sorted(set(parse_url(redis_url)) - set(taken) - {"connection_class"})


class TlsFileError(ValueError):
    """A listener TLS file that cannot be used: ``field`` is the ``GatewayConfig`` field that
    names it (the command line names its flag), ``problem`` says what is wrong."""

    def __init__(self, field: str, path: str, problem: str) -> None:
        super().__init__(f"{field} {path!r} {problem}")
        self.field, self.path, self.problem = field, path, problem


class _EncryptedKey(Exception):
    pass


class _PassPhrase:
    """The pass phrase callback. Without one OpenSSL would ask at the terminal (and a gateway
    started by systemd would wait there for ever), so with no file it refuses; ``asked`` tells
    whether the key was encrypted (a load that then fails had the wrong pass phrase)."""

    def __init__(self, phrase: str | None) -> None:
        self.phrase, self.asked = phrase, False

    def __call__(self) -> str:
        self.asked = True
        if self.phrase is None:
            raise _EncryptedKey
        return self.phrase


def _read_pass_phrase(path: str) -> str:
    """The first line of ``path``, without its line end (spaces are part of a pass phrase)."""
    try:
        with open(path, encoding="utf-8") as f:
            phrase = f.readline().rstrip("\r\n")
    except (OSError, UnicodeDecodeError) as exc:
        raise TlsFileError("tls_key_password_file", path,
                           f"cannot be read ({getattr(exc, 'strerror', None) or exc})") from None
    if not phrase:
        raise TlsFileError("tls_key_password_file", path,
                           "is empty: its first line must be the private key's pass phrase")
    return phrase


def _holds_certificate(path: str) -> bool:
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(path)
    except (ssl.SSLError, OSError):
        return False
    return True


def server_tls_context(config: GatewayConfig) -> ssl.SSLContext | None:
    """The listener's TLS context (None: plaintext). With ``tls_ca_file`` every client must
    present a certificate that CA signed (Kafka's ``ssl.client.auth=required``). A file that
    cannot be used is a TlsFileError naming it and why, as Kafka's ``SslFactory`` refuses a
    bad keystore at start-up."""
    if config.tls_cert_file is None:
        return None
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    cert = config.tls_cert_file
    key_field, key = (("tls_key_file", config.tls_key_file) if config.tls_key_file
                      else ("tls_cert_file", cert))
    phrase_file = config.tls_key_password_file
    pass_phrase = _PassPhrase(_read_pass_phrase(phrase_file) if phrase_file else None)
    try:
        ctx.load_cert_chain(cert, config.tls_key_file, password=pass_phrase)
    except _EncryptedKey:
        raise TlsFileError(key_field, key, "holds an encrypted private key and no pass phrase "
                           "file was given (--listen-tls-key-password-file, "
                           "tls_key_password_file): give one, or the key decrypted (openssl "
                           "pkey -in KEY -out KEY.plain), readable by its user only") from None
    except (ssl.SSLError, OSError) as exc:
        if pass_phrase.asked and phrase_file and getattr(exc, "reason", None) is None:
            # (OpenSSL says only "PEM lib" when the pass phrase does not decrypt the key)
            raise TlsFileError("tls_key_password_file", phrase_file,
                               f"does not hold the pass phrase of {key!r}") from None
        if getattr(exc, "reason", None) == "KEY_VALUES_MISMATCH":
            problem = f"is not the private key of the certificate in {cert!r}"
        elif not _holds_certificate(cert):
            key_field, key, problem = "tls_cert_file", cert, f"holds no PEM certificate ({exc})"
        else:
            problem = f"holds no PEM private key ({exc})"
        raise TlsFileError(key_field, key, problem) from None
    if config.tls_ca_file is not None:
        try:
            ctx.load_verify_locations(config.tls_ca_file)
        except (ssl.SSLError, OSError) as exc:
            raise TlsFileError("tls_ca_file", config.tls_ca_file,
                               f"holds no PEM CA certificate ({exc})") from None
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


class Gateway:
    """``async with Gateway(config, redis_url) as gw: await gw.serve_forever()``.

    ``start()`` binds the listening socket (port 0 picks a free one; ``address`` tells which)
    and loads the coordinator's scripts; ``close()`` stops accepting, ends every connection
    and releases the Redis clients. ``tls_handshake_timeout_s`` bounds a TLS client's
    handshake: a peer that opens TCP and never completes it would otherwise hold its socket
    for ever (tests give it a small one to see it happen).
    """

    def __init__(self, config: GatewayConfig, redis_url: str, *, auth: Any = None,
                 tls_handshake_timeout_s: float = TLS_HANDSHAKE_TIMEOUT_S,
                 **redis_kwargs: Any) -> None:
        self.config = config.validate()
        if not tls_handshake_timeout_s > 0:
            raise ValueError(f"tls_handshake_timeout_s must be > 0, got {tls_handshake_timeout_s}")
        self._tls_handshake_timeout_s = tls_handshake_timeout_s
        kwargs = {"socket_timeout": SOCKET_TIMEOUT_S, **redis_kwargs}
        self._tls = server_tls_context(self.config)  # (a bad file: before Redis is reached)
        # One node or a Redis Cluster, as the server says (rcoord.connect); the asyncio client
        # (groups, Fetch waits) is of the same kind.
        try:
            self._sync_redis = connect(redis_url, **kwargs)
        except redis.exceptions.AuthenticationError as exc:
            # (as rcoord's other clients raise it, naming the URL: redis-py's own says neither
            # which server refused nor what to check, and a caller of Gateway catching
            # AuthenticationFailedError, what a login refused at run time raises, missed it)
            raise as_authentication_failed("gateway", exc, redis_url) from exc
        try:  # (a failure from here on: the blocking client is closed now, not at its GC)
            kwargs["decode_responses"] = False
            self._async_redis: Any
            if isinstance(self._sync_redis, redis.cluster.RedisCluster):
                self._async_redis = async_cluster(redis_url, **kwargs)
            else:
                self._async_redis = async_single_node(redis_url, **kwargs)
            self.state = GatewayState(config, self._async_redis, self._sync_redis, auth)
        except BaseException:
            self._sync_redis.close()
            raise
        self._server: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._conns: dict[asyncio.Task[None], Connection] = {}
        self._sweeper: asyncio.Task[None] | None = None

    @property
    def address(self) -> tuple[str, int]:
        """The bound (host, port)."""
        if self._server is None:
            raise RuntimeError("the gateway is not started")
        host, port = self._server.sockets[0].getsockname()[:2]
        return str(host), int(port)

    async def start(self) -> Self:
        await self.state.coordinator.start()
        self._server = await asyncio.start_server(
            self._accept, self.config.listen_host, self.config.listen_port, ssl=self._tls,
            ssl_handshake_timeout=self._tls_handshake_timeout_s if self._tls else None)
        self._sweeper = asyncio.create_task(self._sweep_idle(), name="rcoord-gateway-idle")
        host, port = self.address
        self.state.advertised = (self.config.advertise_host or host,
                                 self.config.advertise_port or port)
        protocol = ("SASL_" if self.state.auth else "") + ("SSL" if self._tls else "PLAINTEXT")
        log.info("rcoord gateway listening on %s:%d (%s), advertising %s:%d (namespace %s)",
                 host, port, protocol, *self.state.advertised, self.config.namespace)
        return self

    async def serve_forever(self) -> None:
        if self._server is None:
            await self.start()
        assert self._server is not None
        await self._server.serve_forever()

    async def close(self) -> None:
        if self._sweeper is not None:
            await cancel_and_wait([self._sweeper])
        if self._server is not None:
            self._server.close()
        await cancel_and_wait(list(self._tasks))
        if self._server is not None:
            await self._server.wait_closed()
        await self.state.coordinator.close()  # its wake reads, before their client goes
        await self._async_redis.aclose()
        self._sync_redis.close()
        self.state.close()
        if self._server is not None:
            log.info("rcoord gateway on %s:%d closed", *self.state.advertised)

    async def __aenter__(self) -> Self:
        # A start that fails (a user without +function to load the coordinator's library, a
        # login refused, the port taken) releases what the constructor opened: ``async with``
        # calls no ``__aexit__`` then, and the Redis clients' sockets stayed open until
        # garbage collection (a ResourceWarning each, and connections the server kept).
        try:
            return await self.start()
        except BaseException:
            await self.close()
            raise

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self._serve(reader, writer)
        except asyncio.CancelledError:
            pass  # close() ends every connection; nothing to report
        finally:
            self._tasks.discard(task)

    async def _sweep_idle(self) -> None:
        """Close the connections idle for ``connections_max_idle_ms`` (Kafka's
        ``connections.max.idle.ms``): no request in progress, and none read since the sweep
        that many milliseconds ago. A sweep every half of it, so a connection goes between 1
        and 1.5 times the limit after its last request. It costs the request path one counter
        and one flag per request, no timer.

        A connection that must authenticate and has not is closed as if its requests did not
        count: between 1 and 1.5 times the limit after it was accepted, whatever it sends.
        Kafka has no such bound (its idle timer restarts on any traffic), but its SASL order
        (``dispatch``) leaves a client that never authenticates few requests to send, while
        ApiVersions answered UNSUPPORTED_VERSION, which that order lets a client repeat, would
        keep such a connection (and its 512 KB frame limit) for ever."""
        period_s = self.config.connections_max_idle_ms / 2000
        seen: dict[asyncio.Task[None], tuple[int, int]] = {}  # task -> (requests, idle sweeps)
        while True:
            await asyncio.sleep(period_s)
            now: dict[asyncio.Task[None], tuple[int, int]] = {}
            for task, conn in list(self._conns.items()):
                before, sweeps = seen.get(task, (-1, 0))
                unauthenticated = self.state.auth is not None and conn.principal is None
                if task not in seen or (not unauthenticated
                                        and (conn.busy or conn.requests != before)):
                    now[task] = (conn.requests, 0)
                elif sweeps + 1 >= 2:
                    log.info("closing connection from %s (client id %r): %s %d ms",
                             conn.client_host, conn.client_id,
                             "not authenticated after" if unauthenticated else "idle for",
                             self.config.connections_max_idle_ms)
                    task.cancel()
                else:
                    now[task] = (before, sweeps + 1)
            seen = now

    def _frame_limit(self, conn: Connection) -> int:
        """``max_frame_bytes``, but at most ``PRE_AUTH_MAX_FRAME_BYTES`` while the connection
        must still authenticate (as Kafka's SASL authenticator)."""
        if self.state.auth is not None and conn.principal is None:
            return min(self.config.max_frame_bytes, PRE_AUTH_MAX_FRAME_BYTES)
        return self.config.max_frame_bytes

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername") or ("?", 0)
        conn = Connection(self.state, str(peer[0]))
        task = asyncio.current_task()
        assert task is not None
        self._conns[task] = conn
        sock = writer.get_extra_info("socket")
        if self.config.socket_send_buffer_bytes != -1 and sock is not None:
            with contextlib.suppress(OSError):  # (gone already: the first read says so)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF,
                                self.config.socket_send_buffer_bytes)
        flush = False  # (idle, cancelled, broken or refused: unsent responses are dropped)
        try:
            while True:
                request = await read_frame(reader, self._frame_limit(conn),
                                           conn.sasl_raw_token)
                if request is None:
                    flush = True
                    break
                conn.busy = True
                conn.requests += 1
                response = await handle_frame(conn, request)
                conn.busy = False  # (a peer that never reads its responses is idle too)
                if response is not None:
                    writer.write(frame(response))
                    await writer.drain()
                if conn.close_after_response:
                    flush = True
                    break
        except FrameError as exc:
            log.warning("closing connection from %s:%s (client id %r): %s",
                        peer[0], peer[1], conn.client_id, exc)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the client went away
        except (ssl.SSLError, TimeoutError) as exc:
            # A corrupt TLS record after the handshake, or a socket that timed out (ETIMEDOUT):
            # the connection is over. One line, as Kafka's Selector logs a failed channel.
            log.info("closing connection from %s:%s (client id %r): %s: %s", peer[0], peer[1],
                     conn.client_id, type(exc).__name__, exc)
        finally:
            self._conns.pop(task, None)
            await close_connection(writer, self.config.connections_max_idle_ms / 1000
                                   if flush else None)


async def close_connection(writer: asyncio.StreamWriter, flush_s: float | None) -> None:
    """Close a client's connection, sending what is still buffered for at most ``flush_s``
    seconds (None: drop it and close at once).

    A plain ``close()`` waits for the buffer to drain, so ``wait_closed()`` on a peer that never
    reads (a zero receive window) never returned, and nothing else would close the connection:
    its task, socket and buffers stayed until the gateway stopped. Kafka's ``Selector`` closes
    a channel at once and drops its unsent responses, which is what the idle sweep, a
    cancellation and a broken frame get here. A connection that ends in order (the client's
    EOF, or a last answer such as a refused authentication, which the client should read) gets
    ``connections_max_idle_ms``: a peer that reads nothing for that long is idle."""
    transport = writer.transport
    if flush_s is None:
        transport.abort()
        return
    writer.close()
    try:
        async with asyncio.timeout(flush_s):
            await writer.wait_closed()
    except TimeoutError:
        transport.abort()
    except asyncio.CancelledError:
        transport.abort()  # (the gateway is closing)
        raise
    except Exception as exc:  # noqa: BLE001  (it failed as it closed: it is closed all the same)
        log.debug("connection failed as it closed: %s: %s", type(exc).__name__, exc)
