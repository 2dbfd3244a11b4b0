"""CoordinatorService: a stateless process that makes every deadline act on time.

Group state needs no process: every script applies the passed deadlines of the group it
touches. But an idle group (a member that just stops heartbeating) is touched by nobody, so
coordinator processes run the timers. They divide the partitions among themselves with leases
(``leases.py``); each sweeps the deadlines of the partitions it leases exactly when they fall due
(``sweeper.py``), woken early by shard-channel messages when a script sets an earlier deadline,
and optionally by expired-key events (``listener.py``), which are only hints. Events become logs
and metrics (``observe.py``); ``/metrics`` and ``/healthz`` are served over HTTP (``http.py``).
Each process also applies the retention of the topics on its leases (``retention.py``), as
Kafka's broker does every ``log.retention.check.interval.ms``.
"""

from __future__ import annotations

import logging
import os
import queue
import socket
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import redis

from ..config import STORED_SETTINGS, CoordinatorConfig
from ..coordinator import GroupCoordinator
from ..errors import ConfigError
from ..keys import settings_key
from ..settings import ORIGIN, RETIRE, SWEEP
from ..urls import redact_url, repr_redacting, url_problem
from .connect import connect
from .events import CoordinatorsChanged, Deadline, Event, EventQueue, Hint, Owned, Resync
from .http import StatusServer
from .leases import CoordinatorIdInUse, LeaseKeeper
from .listener import Listener
from .metrics import Metrics
from .nodes import NODE_FAILURES, Outage, disconnect_all, forget_failures, on_node
from .observe import EventTail, Sample, sample_groups
from .retention import MAX_RETENTION_CHECK_INTERVAL_MS, RetentionKeeper
from .sweeper import Sweeper

__all__ = ["CoordinatorService", "ServiceConfig"]

log = logging.getLogger("rcoord.service")

RESYNC_MS = 1000
"""Re-read the deadline index this often anyway (pub/sub is at-most-once)."""
TAIL_MS = 250
SAMPLE_MS = 5000
WAKE_MODES = ("both", "index", "hints")
STALLED_MIN_MS = 3000
"""A timer loop without a finished turn for this long (and two lease TTLs) gives its leases up."""
WATCH_GAP_MS = 1000
"""A gap this long (and two lease periods) between two of the lease thread's own stall checks
means the thread itself did not run (the whole process paused: SIGSTOP, a frozen VM, a long GC):
the timer loop's silence is then measured from the end of the gap, not across it."""
STOP_GRACE_MS = 800
"""How long a stop waits for calls in flight (the timer loop's turn; then, in ``stop()``, the
lease round, the last read of the events and the lease release) before it shuts the client's
connections under them, as Kafka's ``KafkaConsumer.close(timeout)`` waits for its LeaveGroup
and commits only until its timer expires (``ConsumerCoordinator.close(Timer)``). On a Redis
that answers, all of it takes milliseconds and the leases are released; with every master
hung (or vanished) each call waited a socket timeout (a lease TTL, 5 s by default), and a
SIGTERM took 7-18 s, past Docker's 10 s grace."""
INTERRUPT_EVERY_S = 0.1
LOOP_LEFT_MS = 2 * STOP_GRACE_MS
"""How long ``run()`` waits, once a stop is asked for, for the timer loop to end: its grace,
then as long again for the calls the interrupt failed (``_interrupt_when_stopped``). A call
still in ``connect()`` has no socket the interrupt can shut (a node whose host drops SYNs, or
whose listener's accept queue is full): ``run()`` returns without it, as Kafka's
``KafkaConsumer.close(timeout)`` returns when its timer expires. Before, it waited for the
connect timeout (5 s by default, more if the URL sets ``socket_connect_timeout``)."""
LOOP_PAUSE_MS = 200
LOOP_PAUSE_MAX_MS = 1000
"""The timer loop's wait after a failed turn: 200 ms, doubling up to 1 s, so deadlines act
within about a second of Redis answering again (up to 5 s, they came 4.6 s late after a
7 s outage)."""
LOOP_QUIET_MS = 5000
"""A failing timer loop's outage (one ``loop_error`` line, ``nodes.Outage``) ends at the first
turn that succeeds this long after the last failed one: with Redis out of memory only the
turns that write fail, and each one between two that did not began a new outage."""


def _db_of(client: Any) -> int:
    """The database the client uses (keyspace events are per database)."""
    pool = getattr(client, "connection_pool", None)
    return int(pool.connection_kwargs.get("db", 0)) if pool is not None else 0


def _left(deadline: float) -> float:
    """Seconds until the monotonic ``deadline`` (0 once it passed)."""
    return max(0.0, deadline - time.monotonic())


class StopFlag(threading.Event):
    """The stop flag: an ``Event`` that a program's signal handler may set (``stop``).

    Python runs a handler on the main thread between two steps of whatever it is doing.
    ``Event.set()`` takes the event's lock, which is not reentrant: a handler that fired while
    its thread held that lock (inside the flag's own ``wait``, ``start()`` waiting for a
    claimed id; or its ``set``, a stop) waited for ever for itself. A set on a thread already
    inside the flag's ``set`` or ``wait`` (only a handler can be) takes no lock: it marks the
    flag, which reads as set at once, and the interrupted call sets it as it leaves (waking
    the waiters). The main thread waits in slices of ``INTERRUPT_EVERY_S``: a mark made
    before its wait began ends the wait within one."""

    def __init__(self) -> None:
        super().__init__()
        self._marked = False
        self._inside: set[int] = set()
        """The threads inside ``set`` or ``wait`` (holding, or about to take, the lock)."""
        self._setting: set[int] = set()
        """The threads inside ``set`` (``setting``)."""

    def setting(self) -> bool:
        """Whether this thread is inside this flag's ``set``: a call here is a signal handler
        that interrupted it, and the flag's waiters wake only once that set goes on."""
        return threading.get_ident() in self._setting

    def is_set(self) -> bool:
        return self._marked or super().is_set()

    def set(self) -> None:
        me = threading.get_ident()
        if me in self._inside:  # (a signal handler, on the thread it interrupted)
            self._marked = True
            return
        self._inside.add(me)
        self._setting.add(me)
        try:
            super().set()
        finally:
            self._inside.discard(me)
            self._setting.discard(me)

    def wait(self, timeout: float | None = None) -> bool:
        me = threading.get_ident()
        main = me == threading.main_thread().ident
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            step = None if deadline is None else _left(deadline)
            if main:
                step = INTERRUPT_EVERY_S if step is None else min(step, INTERRUPT_EVERY_S)
            self._inside.add(me)
            try:
                super().wait(step)
            finally:
                self._inside.discard(me)
            if self._marked and not super().is_set():
                self.set()  # (a handler's mark, made during that wait: wakes the others)
            if self.is_set() or (deadline is not None and _left(deadline) == 0):
                return self.is_set()

    def clear(self) -> None:
        self._marked = False
        super().clear()


def default_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


@dataclass(frozen=True)
class ServiceConfig:
    """Settings of one coordinator process.

    ``wake`` chooses what drives the timers: ``index`` (the deadline index and its shard-channel
    messages), ``hints`` (expired-key events only; for measurements, never for production), or
    ``both`` (the default).

    ``settings`` are group settings this process names for the namespace (``CoordinatorConfig``
    field -> value, e.g. ``group_min_session_timeout_ms``), as a broker's configuration names
    Kafka's group settings. They are written at start (the partition count only where the
    namespace has none stored, as Kafka's ``offsets.topic.num.partitions``: see
    ``_named_at_start``), and written again whenever the process sees the namespace's settings
    lost (a restart without persistence, a failover to an empty replica). Settings changed by
    someone else are adopted (a warning names the ones overridden), so processes naming
    different values do not rewrite each other's every lease round.

    ``retention_check_interval_ms`` (Kafka's ``log.retention.check.interval.ms``, 5 minutes by
    default): how often the process applies the retention of the topics on its leases
    (``retention.py``); 0 turns that off (another process, or a program calling
    ``Topics.apply_retention``, does it).
    """

    redis_url: str
    coordinator_id: str = field(default_factory=default_id)
    namespace: str = "rcoord"
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    lease_ttl_ms: int = 5000
    wake: str = "both"
    settings: Mapping[str, int] = field(default_factory=dict)
    retention_check_interval_ms: int = 300_000

    def __repr__(self) -> str:
        return repr_redacting(self, "redis_url")

    def __post_init__(self) -> None:
        if not self.redis_url:
            raise ConfigError("redis_url is required (--redis-url or RCOORD_REDIS_URL)")
        cid = self.coordinator_id
        # (An int here failed the start with a TypeError deep in the lease round, sorting it
        # among the live ids; an id also names a Redis key and a log and metrics label.)
        if (not isinstance(cid, str) or not 1 <= len(cid) <= MAX_COORDINATOR_ID
                or not cid.isprintable()):
            raise ConfigError(f"coordinator_id must be a str of 1 to {MAX_COORDINATOR_ID} "
                              f"printable characters, got {cid!r}")
        problem = url_problem(self.redis_url)
        if problem:
            raise ConfigError(f"redis_url {redact_url(self.redis_url, query=True)!r} {problem}")
        if not 100 <= self.lease_ttl_ms <= MAX_LEASE_TTL_MS:
            raise ConfigError(f"lease_ttl_ms must be in 100..{MAX_LEASE_TTL_MS} (a day), got "
                              f"{self.lease_ttl_ms}")
        unknown = set(self.settings) - set(STORED_SETTINGS)
        if unknown:
            raise ConfigError(f"unknown group setting(s) {sorted(unknown)}; known: {', '.join(STORED_SETTINGS)}")
        named: dict[str, Any] = dict(self.settings)
        CoordinatorConfig(namespace=self.namespace, **named)  # validates the values
        if self.wake not in WAKE_MODES:
            raise ConfigError(f"wake must be one of {', '.join(WAKE_MODES)}, got {self.wake!r}")
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65535:
            raise ConfigError(f"metrics_port must be in 0..65535, got {self.metrics_port}")
        interval = self.retention_check_interval_ms
        if (not isinstance(interval, int) or isinstance(interval, bool)
                or not 0 <= interval <= MAX_RETENTION_CHECK_INTERVAL_MS):
            raise ConfigError(f"retention_check_interval_ms must be an integer in "
                              f"0..{MAX_RETENTION_CHECK_INTERVAL_MS} (a day; 0 turns the "
                              f"retention checks off), got {interval!r}")


MAX_COORDINATOR_ID = 255
"""The longest coordinator id taken (it is part of a Redis key name and of every log line)."""

MAX_LEASE_TTL_MS = 86_400_000
"""A day: a partition whose coordinator died waits a TTL for another, so more is no use, and
far more overflowed the waits it sets (an OverflowError at the start, not a usage error)."""


def socket_timeout_s(cfg: ServiceConfig) -> float:
    """A lease TTL, at least a second: by then the lease a stalled call would renew has lapsed."""
    return max(1.0, cfg.lease_ttl_ms / 1000)


CONNECT_TIMEOUT_MAX_S = 5.0
"""``connect``'s default connect timeout."""


def connect_timeout_s(cfg: ServiceConfig) -> float:
    """The socket timeout (``socket_timeout_s``), at most ``CONNECT_TIMEOUT_MAX_S``: a connect
    that a node's host does not answer (it drops the SYNs: a host down, a partition) costs a
    round no more than a call the node does not answer. Before, it was 5 s whatever the TTL:
    with a 1 s TTL, each round that met such a master (lease renewal, sweep: their pieces
    are joined) took five TTLs, and the leases on the healthy masters lapsed meanwhile."""
    return min(socket_timeout_s(cfg), CONNECT_TIMEOUT_MAX_S)


def _out_of_memory(exc: BaseException | None) -> bool:
    """Redis refused the call as out of memory (redis-py's ``OutOfMemoryError``, as raised or
    as the cause of rcoord's ``ServerUnavailable``)."""
    while exc is not None:
        if isinstance(exc, redis.exceptions.OutOfMemoryError):
            return True
        exc = exc.__cause__
    return False


class CoordinatorService:
    def __init__(self, config: ServiceConfig, client: Any = None) -> None:
        self.config = config
        self._client = client
        self.metrics = Metrics()
        self._queue: EventQueue = queue.Queue()
        self._stop = StopFlag()
        self._lease_wake = threading.Event()
        self._owned: set[int] = set()
        self._last_lease_ok = 0.0
        self._confirmed_at = 0.0
        """When the last successful lease round began (monotonic): the leases it renewed hold
        for a TTL from then at least (``_leases_confirmed``)."""
        self._refused_at = 0.0
        """When the last lease round Redis refused as out of memory began (monotonic), while
        every round since the last confirmed one was refused so, each within a TTL of the one
        before; 0 once another failure or a give-up broke that chain (``_retention_leases``)."""
        self._watch_since = 0.0
        """Since when the lease thread has watched the timer loop without a gap of its own."""
        self._last_turn_ok = 0.0
        self._last_alive = 0.0  # the timer loop's last sign of life (a turn begun or failed)
        self._running = False
        """``run()`` (the timer loop) has started: from then on leases need its turns."""
        self._running_on: int | None = None
        """The thread running ``run()`` (its ident), while it does: a ``stop()`` on that
        thread (a program's signal handler) is left to ``run()`` (``stop``)."""
        self._stop_left_to_run = False
        """``run()`` stops the service as it returns (``stop``)."""
        self._loop_ended = threading.Event()
        """The timer loop has ended."""
        self._loop_left = threading.Event()
        """``run()`` returned while the timer loop was still in a call (``LOOP_LEFT_MS``): what
        that call comes back to acts on no partition (``_leases_confirmed``, the sweeper's
        ``left``)."""
        self._loop_error: BaseException | None = None
        self._interrupting = threading.Lock()
        """Held by the stop's watchdog while it shuts the sockets, by ``run()`` while it
        leaves the loop behind, and by ``_leave`` as the lease release begins: no socket is
        shut after either (``stop()`` releases the leases through them)."""
        self._releasing = False
        """The stop's lease release has begun (``_leave``): the watchdog shuts no more
        sockets."""
        self._timer_thread: threading.Thread | None = None
        """The thread ``run()`` runs the timer loop on."""
        self._interrupted = False
        """A stop shut the connections under calls in flight (``_interrupt_when_stopped``)."""
        """When the timer loop last completed a turn (monotonic): leases renewed by a process
        whose timer loop is stuck would hold partitions nobody sweeps, so health checks both."""
        self._http: StatusServer | None = None
        self._lease_thread: threading.Thread | None = None
        self._sample_thread: threading.Thread | None = None
        self._retention_thread: threading.Thread | None = None
        self.retention: RetentionKeeper | None = None
        self.listener: Listener | None = None
        self._made_client = False
        """``start()`` connected (no client given): ``stop()`` closes that client."""
        self._closed = False
        """The stop closed the client it connected: a thread of this service that it left
        behind in a call closes it again as it ends (``_run_closing``)."""
        self._closing = threading.Lock()
        """Held while the client is closed (by the stop, or by a thread left behind)."""
        self._starting = threading.RLock()
        """Held by ``start()``: ``stop()`` from another thread waits for it (``stop``)."""
        self._stop_called = False
        """``stop()`` was called: a start still running then stops what it started as it
        ends (``stop``)."""
        self._stopped_by_start = False
        """That start did: the stop waiting for it has nothing left to do."""
        self._starting_on: int | None = None
        """The thread running ``start()`` (its ident), while it does: a ``stop()`` on that
        thread (a program's signal handler) is left to the start (``stop``)."""
        self._stopped = False
        """``_stop_now`` has begun, or a failed start shut down what it opened: it runs once,
        and never after such a start."""
        self.exit_code = 0
        self._hinted: set[int] = set()
        self._resync_due = False
        """A ``Resync`` was heard in this drain of the queue: the index is re-read once, after
        the drain (``_timer_loop``), however many were heard."""

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> CoordinatorService:
        """Connect, settle, start listening and leasing. A start that fails part way closes
        what it opened (listener threads would otherwise reconnect forever)."""
        with self._starting:
            self._starting_on = threading.get_ident()
            try:
                started = self._connect_and_start()
            except BaseException:
                # It shut down what it opened (``_connect_and_start``): a stop that waits for
                # it, or comes after it (a caller's ``finally``, a signal handler as this
                # returns), has nothing left to do. (It shut all down a second time: it read
                # the last events of a service that had none, a WARNING, and logged
                # "coordinator stopped" for one that never started; say a stop that ended a
                # wait for a claimed id, ``StoppedBeforeClaim``. A stop after a start that
                # failed on its own did so until this was set here.)
                self._stopped = True
                raise
            finally:
                self._starting_on = None
            if self._stop_called:
                # A stop() came while this start ran: it waits for this (``stop``), or has
                # returned if this took longer than its grace.
                self._stop_now()
                self._stopped_by_start = True
            return started

    def _connect_and_start(self) -> CoordinatorService:
        cfg = self.config
        if self._client is None:
            # No call the service makes blocks in the server; one not answered within a lease
            # TTL (a black-holed connection, which TCP alone reports only after hours) is
            # abandoned and retried on a new connection, instead of stalling its loop; nor
            # does a connect (the URL's ?socket_connect_timeout= wins over both).
            self._client = connect(cfg.redis_url, socket_timeout=socket_timeout_s(cfg),
                                   socket_connect_timeout=connect_timeout_s(cfg))
            self._made_client = True
        try:
            return self._start()
        except BaseException:
            self._shut_down(release=True)
            raise

    def _start(self) -> CoordinatorService:
        cfg = self.config
        if cfg.metrics_port is not None:
            # Bound first, served last: a port already taken fails the start before this process
            # has taken a lease (or told the other coordinators it joined).
            self._http = StatusServer(cfg.metrics_host, cfg.metrics_port, self.metrics.registry,
                                      self.health)
        named: dict[str, Any] = dict(cfg.settings)
        coord = GroupCoordinator(self._client, CoordinatorConfig(namespace=cfg.namespace, **named))
        scripts = coord._scripts
        scripts.load()  # (no I/O: allows the claim's call before the settings are settled)
        self.leases = LeaseKeeper(self._client, scripts, cfg.namespace, 0, cfg.coordinator_id,
                                  cfg.lease_ttl_ms)
        # Before anything else: a process given the id of one that runs is refused (exit status
        # 2) having written no namespace setting it names, swept, logged or released nothing.
        self.leases.claim_id(self._stop)
        kept = self._named_at_start(named)
        if kept != named:
            coord = GroupCoordinator(self._client, CoordinatorConfig(namespace=cfg.namespace,
                                                                     **kept))
        try:
            coord.start()
        except ConfigError:
            # No count was stored (the settings hash alone lost, say a failover of its node),
            # so the named one was written, over the one the settle re-established from the
            # surviving copies, which groups hold: refused. That count is stored now, and
            # served, as when it is found stored. Before, such a start failed, and every
            # restart by its supervisor too (nothing else re-establishes the settings while
            # the copies the workers' calls check are intact).
            again = self._named_at_start(named)
            if again == kept:
                raise
            coord = GroupCoordinator(self._client, CoordinatorConfig(namespace=cfg.namespace,
                                                                     **again))
            coord.start()
        self._coord = coord
        self.group_config = coord.config
        n = self.group_config.num_partitions
        self.leases.size(n)
        self.sweeper = Sweeper(self._client, scripts, cfg.namespace, n, self.metrics,
                               stop=self._stop, left=self._loop_left)
        self.sweeper.turn_budget_ms = min(self.sweeper.turn_budget_ms, cfg.lease_ttl_ms // 4)
        self.tail = EventTail(self._client, cfg.namespace, n, self.metrics)
        listener = Listener(self._client, cfg.namespace, n, self.leases.channel, self._queue,
                            deadlines=cfg.wake != "hints", hints=cfg.wake != "index",
                            db=_db_of(self._client))
        self.listener = listener
        listener.start()
        began = time.monotonic()
        self._owned = self.leases.step()
        self.metrics.leases.set_function(self._leases_held)
        self._confirmed_at = began
        self._last_lease_ok = self._last_turn_ok = time.monotonic()
        self.leases.announce(b"joined")
        self._queue.put(Owned(frozenset(self._owned)))
        self._lease_thread = self._thread(self._lease_loop, "rcoord-leases")
        self._lease_thread.start()
        self._sample_thread = self._thread(self._sample_loop, "rcoord-sampler")
        self._sample_thread.start()
        if self._made_client:  # (a client passed in is the caller's, maybe used elsewhere too)
            threading.Thread(target=self._interrupt_when_stopped, name="rcoord-stop",
                             daemon=True).start()
        if cfg.retention_check_interval_ms > 0:
            self.retention = RetentionKeeper(
                self._client, cfg.namespace, n, self.metrics, self._retention_leases,
                cfg.retention_check_interval_ms, self._stop, cfg.coordinator_id)
            self._retention_thread = self._thread(self.retention.run, "rcoord-retention")
            self._retention_thread.start()
        if self._http is not None:
            self._http.start()
        log.info("coordinator started", extra={
            "event": "started", "id": cfg.coordinator_id, "namespace": cfg.namespace,
            "partitions": n, "leases": len(self._owned), "wake": cfg.wake,
            "retention_check_interval_ms": cfg.retention_check_interval_ms,
            "metrics_port": self._http.port if self._http else None,
            "keyspace_events": listener.keyspace_status})
        return self

    @property
    def metrics_port(self) -> int | None:
        return self._http.port if self._http else None

    def stop(self) -> None:
        """Graceful: release leases at once so the others take over without waiting a TTL.

        From another thread while ``start()`` runs, it sets the stop flag (a wait for a
        claimed id ends at once) and waits for the start to end, then undoes what it did.
        Before, it found no listener or threads yet and closed the client; the start then went
        on, and left its listener's threads reconnecting the closed client for ever, its
        status server's thread dead on the closed socket, and leases taken after the stop
        released them (held until they lapsed). It waits ``STOP_GRACE_MS`` at most (a start in
        a call that a node does not answer, through a client passed in without a socket
        timeout, may not end): then it returns, and the start undoes what it did as it ends.

        From a program's signal handler (which Python runs on the main thread, between two
        steps of whatever that thread is doing): on the thread running ``start()`` it only
        sets the stop flag, and the start stops what it started as it ends (or, waiting for a
        claimed id, ends at once); before, it shut the service down in the middle of the start,
        which then went on starting the listener and the threads, and shut down again. So on
        the thread running ``run()``, which stops as it returns, once its loop has ended (or
        been left behind): before, the handler released the leases under the loop still in its
        turn, which the stop's watchdog then no longer interrupted. Once a
        stop has begun, another (a second signal while the stop runs on that thread) returns
        at once: before, it began the stop again, and waited for ever for the client-closing
        or listener lock the interrupted stop held. The flag (``StopFlag``) takes no lock when
        a handler sets it on a thread inside the flag's own wait (``start()`` waiting for a
        claimed id) or set (a stop): before, such a handler waited for ever for the lock its
        thread held. A handler inside a ``stop()``'s own ``set`` of the flag leaves the stop
        to that call, which goes on as the handler returns: before, it ran the whole shutdown
        inside the handler, the flag's lock held by the interrupted set, so the flag's other
        waiters (the metrics sampler) woke only after it, and were left behind. (The ``rcoord
        coordinator`` command's handler only writes to a pipe, and a thread of its own sets
        the flag: ``cli.SignalStop``.)"""
        self._stop_called = True
        self._stop.set()
        if self._starting_on == threading.get_ident():
            return  # a signal handler on the start's thread: the start stops as it ends
        if self._running_on == threading.get_ident():
            self._stop_left_to_run = True
            return  # a signal handler on run()'s thread: run() stops as it returns
        if self._stop.setting():
            return  # a signal handler inside a stop()'s set of the flag: that stop goes on next
        if not self._starting.acquire(timeout=STOP_GRACE_MS / 1000):
            log.warning("stop(): the start is still in a call; it stops what it started as it "
                        "ends", extra={"event": "stop_left_to_start",
                                       "id": self.config.coordinator_id})
            return
        try:
            if self._stopped_by_start:
                self._stopped_by_start = False
            else:
                self._stop_now()
        finally:
            self._starting.release()

    def _stop_now(self) -> None:
        """Shut down (once: a ``stop()`` from a signal handler that fires while this runs on
        the same thread returns at once, ``stop``)."""
        if self._stopped:
            return
        self._stopped = True
        self._shut_down(release=False)
        log.info("coordinator stopped", extra={"event": "stopped", "id": self.config.coordinator_id})

    def _shut_down(self, release: bool) -> None:
        """Stop the threads, release the leases, close what ``start()`` opened (the client it
        connected included; a client passed in belongs to the caller). Also what a failed
        start runs, on whatever part of the start had happened (``release``: the leases may
        not have been logged yet, so only released)."""
        self._stop.set()
        self._lease_wake.set()
        if self._running:
            # ``run()`` still runs on another thread: the release waits for its loop, as it
            # does after ``run()`` returns (then at once). Before, it began at once, and the
            # watchdog, which stops at the release (it would shut the release's connection),
            # no longer interrupted a loop held in a call: it was left behind after
            # ``LOOP_LEFT_MS``.
            self._await_loop()
        deadline = time.monotonic() + STOP_GRACE_MS / 1000
        if self._lease_thread is not None:
            self._lease_thread.join(_left(deadline))
        if getattr(self, "leases", None) is not None:
            # On a thread of its own, so that a Redis that does not answer holds the stop for
            # the grace only; on one that answers, the leases are released as before.
            last = self._thread(self._leave, "rcoord-leave", release)
            last.start()
            last.join(_left(deadline))
        if self.listener is not None:
            self.listener.stop(_left(deadline))
        if self._http is not None:
            self._http.stop()
        for thread in (self._sample_thread, self._retention_thread):
            # The retention thread sees the stop between two topics; within one, after that
            # topic's apply_retention. Left behind (a daemon) if it is still in a call then.
            if thread is not None:
                thread.join(_left(deadline))
        if self._made_client and self._client is not None:
            # (Also fails at once what the threads left behind still wait for.)
            self._closed = True
            self._close_client()

    def _close_client(self) -> None:
        with self._closing:
            try:
                self._client.close()
            except Exception as exc:  # noqa: BLE001 - best effort on the way out
                log.warning("could not close the Redis client",
                            extra={"event": "close_failed", "why": str(exc)})

    def _thread(self, target: Any, name: str, *args: Any) -> threading.Thread:
        """A daemon thread of this service, running ``target(*args)`` (``_run_closing``)."""
        return threading.Thread(target=self._run_closing, args=(target, *args), name=name,
                                daemon=True)

    def _run_closing(self, target: Any, *args: Any) -> None:
        """``target(*args)``, then, if the stop closed the client meanwhile, close it again.

        A thread the stop left behind in a call (a connect a node does not answer, past the
        stop's grace) comes back to a client the stop has closed; redis-py connects a closed
        pool again on the next call, so that call, and the rest of the thread's turn, ran on a
        new connection, left open when the thread ended (a socket the server kept until the
        collector found it). ``_closed`` is set before the stop closes the client: a thread
        that finds it unset ended before that close, which shuts what it used."""
        try:
            target(*args)
        finally:
            self._close_if_closed()

    def _close_if_closed(self) -> None:
        """Close the client again if the stop closed it (``_run_closing``)."""
        if self._closed:
            self._close_client()

    def _leave(self, release: bool) -> None:
        """Log the events since the last look (so a stop loses no transition or expiry; not on
        a failed start: the leases may not have been logged yet), then release the leases.

        The stop's watchdog (``_interrupt_when_stopped``) is ended first, under its lock: it
        may be shutting the sockets at the moment the timer loop ends (and ``run()`` returns,
        and the caller's ``stop()`` begins), and it shut the connection the release had just
        taken; the leases then waited a TTL before another coordinator took them."""
        with self._interrupting:
            self._releasing = True
        if self._interrupted:
            # The calls the stop failed on purpose must not leave healthy nodes unasked.
            forget_failures(self._client)
        if not release:
            try:
                self.tail.poll(set(self.leases.owned))
            except Exception as exc:  # noqa: BLE001 - best effort on the way out
                log.warning("could not read the last events",
                            extra={"event": "tail_failed", "why": str(exc)})
        try:
            self.leases.release_all(final=True)
        except Exception as exc:  # noqa: BLE001 - best effort on the way out
            log.warning("could not release leases",
                        extra={"event": "release_failed", "why": str(exc)})

    def _interrupt_when_stopped(self) -> None:
        """Once a stop is asked for, give the timer loop ``STOP_GRACE_MS`` to end its turn, then
        shut the client's connections, so that a call Redis does not answer (every master hung
        or gone) fails at once instead of after a socket timeout per call; a ``stop()`` from
        another thread while ``run()`` runs waits for that (``_await_loop``) before it releases
        the leases. Again every ``INTERRUPT_EVERY_S``
        until the loop ends: a call that failed may go on to another node (the server's time is
        read from the first master that answers) on a new connection."""
        self._stop.wait()
        if not self._running or self._loop_ended.wait(STOP_GRACE_MS / 1000):
            return
        self._interrupted = True
        if self.listener is not None:
            # Its subscriptions use the client's connections too: they end now, quietly.
            self.listener.halt()
        while True:
            with self._interrupting:
                if self._loop_left.is_set() or self._releasing:
                    # ``run()`` returned without the loop, or the stop's lease release has
                    # begun: it goes through these connections now. (Before, the watchdog
                    # went on shutting them under it, every 100 ms, for as long as the loop's
                    # call lasted; or once more, when the loop ended during a shut.)
                    return
                try:
                    disconnect_all(self._client)
                except Exception as exc:  # noqa: BLE001 - best effort on the way out
                    log.warning("could not interrupt the calls in flight",
                                extra={"event": "close_failed", "why": str(exc)})
                    return
            if self._loop_ended.wait(INTERRUPT_EVERY_S):
                return

    def health(self) -> tuple[bool, dict[str, Any]]:
        """Healthy while both the lease thread and the timer loop make progress: a turn of the
        timer loop ends at least every ``TAIL_MS`` when nothing is wrong, so one that has not
        ended for two lease TTLs is stuck (or Redis refuses it), and the partitions it leases
        are not swept."""
        now = time.monotonic()
        age_ms = (now - self._last_lease_ok) * 1000
        turn_ms = (now - self._last_turn_ok) * 1000
        limit = 2 * self.config.lease_ttl_ms
        ok = age_ms < limit and turn_ms < limit and not self._stop.is_set()
        return ok, {
            "status": "ok" if ok else "unhealthy",
            "id": self.config.coordinator_id,
            "leases": self._leases_held(),
            "live_coordinators": len(self.leases.live),
            "last_lease_round_ms_ago": int(age_ms),
            "last_timer_turn_ms_ago": int(turn_ms),
            "wake": self.config.wake,
            "keyspace_events": self.listener.keyspace_status if self.listener else None,
            "keyspace_nodes": sorted(self.listener.hint_nodes) if self.listener else [],
            "last_retention_pass_ms_ago": self._retention_age_ms(now),
        }

    def _retention_age_ms(self, now: float) -> int | None:
        """How long ago the last retention pass ended; None before the first or when off."""
        last = self.retention.last_pass if self.retention is not None else None
        return None if last is None else int((now - last) * 1000)

    # -- loops ----------------------------------------------------------------------------------

    def _lease_loop(self) -> None:
        period = self.config.lease_ttl_ms / 4000.0
        published = set(self._owned)
        settings_problem = ""
        failing = Outage("lease_error", "lease round failed", again="lease round failed",
                         over_event="lease_error_over", over_message="lease round failed: over")
        gap = max(2 * period, WATCH_GAP_MS / 1000)
        checked = self._watch_since = time.monotonic()
        while not self._stop.is_set():
            self._lease_wake.wait(period)
            # Cleared before the round: a wake-up that arrives during it is not lost.
            self._lease_wake.clear()
            if self._stop.is_set():
                return
            now = time.monotonic()
            if now - checked > gap:
                # This thread did not run meanwhile (the process was paused): neither could the
                # timer loop, which gets its turn before it counts as stalled. Before, a pause
                # of the whole process for two TTLs (and 3 s) was taken for a stuck loop, and
                # every lease was given up.
                self._watch_since = now
            checked = now
            if self._timer_loop_stalled():
                published = self._give_up_leases(published)
                continue
            try:
                self._check_settings()
                settings_problem = ""
            except NODE_FAILURES as exc:
                # Their node failing must not stop the renewal of the leases on the others.
                # (The node's failure is logged once per outage, by nodes.py.)
                log.debug("checking the namespace settings failed", extra={
                    "event": "settings_unreachable", "why": str(exc)})
            except Exception as exc:  # noqa: BLE001 - the leases must go on being renewed
                # Settings stored that cannot be settled (another party wrote values that
                # contradict each other, or a script refused): this process keeps the settings
                # it has, and says so once per problem; before, the exception ended this thread,
                # and the leases lapsed under a process that went on as if it held them.
                if str(exc) != settings_problem:
                    settings_problem = str(exc)
                    log.error("the namespace settings stored cannot be adopted; keeping the "
                              "ones this process has", extra={
                                  "event": "settings_error", "why": settings_problem})
            try:
                started = time.monotonic()
                try:
                    owned = self.leases.step()
                except CoordinatorIdInUse as exc:
                    self._id_taken(exc)
                    return
                took_ms = (time.monotonic() - started) * 1000
                if took_ms > self.config.lease_ttl_ms / 2:
                    log.warning("a lease round took more than half the lease TTL",
                                extra={"event": "slow_lease_round", "took_ms": int(took_ms)})
                if self.leases.handed_off:
                    self.leases.announce(b"handoff")
            except Exception as exc:  # noqa: BLE001 - keep trying; health reports staleness
                # (and once the last round is a TTL old, the leases lapsed: ``_leases_held``
                # reports none, where the gauge and /healthz kept the old count before)
                failing.failed(exc)
                self._round_refused(started, exc)
                continue
            failing.ended()
            self._owned = owned
            if owned != published:
                published = set(owned)
                log.info("leases changed", extra={"event": "leases", "id": self.config.coordinator_id,
                                                  "count": len(owned), "partitions": sorted(owned)})
                self._queue.put(Owned(frozenset(owned)))
            # Recorded once the round's set is published (``leases.owned``, and the timer loop's
            # queue): a round is confirmed together with what it says is held.
            self._confirmed_at = started
            self._last_lease_ok = time.monotonic()

    def _id_taken(self, exc: CoordinatorIdInUse) -> None:
        """Another process holds this process's coordinator id now: stop, with exit status 2
        (the two were given one id), owning nothing and releasing nothing (``leases``)."""
        log.error(str(exc), extra={"event": "coordinator_id_taken",
                                   "id": self.config.coordinator_id, "by": exc.holder})
        self._owned = set()
        self._queue.put(Owned(frozenset()))
        self.exit_code = 2
        self._stop.set()

    def _timer_loop_stalled(self) -> bool:
        """The timer loop runs but has shown no sign of life for two lease TTLs (health's
        limit), nor for ``STALLED_MIN_MS``: a loaded machine's slow turn is no reason to move
        partitions. A sign of life is a turn begun, a batch of calls come back, or a failed turn
        (Redis refusing or unreachable: it waits and tries again; another process would meet
        the same Redis, and giving the leases up left them unswept once Redis answered)."""
        if not self._running:
            return False
        limit = max(2 * self.config.lease_ttl_ms, STALLED_MIN_MS)
        alive = max(self._last_alive, self.sweeper.last_progress, self._watch_since)
        return (time.monotonic() - alive) * 1000 >= limit

    def _give_up_leases(self, published: set[int]) -> set[int]:
        """A process whose timer loop is stuck must not keep partitions nobody sweeps: release
        them and leave the registry, so the others take them over at once. Leases are taken
        again (a normal round) once the loop ends a turn. Returns what is now published."""
        if not self._owned and published == set():
            return published
        log.error("the timer loop has not ended a turn for two lease TTLs; releasing leases",
                  extra={"event": "timer_loop_stalled", "count": len(self._owned)})
        try:
            self.leases.release_all()
        except Exception as exc:  # noqa: BLE001 - they lapse by themselves after a TTL
            log.warning("could not release leases", extra={"event": "lease_error", "why": str(exc)})
        self._owned = set()
        self._refused_at = 0.0  # (retention stops too: ``_retention_leases``)
        self._queue.put(Owned(frozenset()))
        return set()

    def _named_at_start(self, named: dict[str, Any]) -> dict[str, Any]:
        """The settings this start writes: those named, less the partition count if the
        namespace already has another one (logged).

        Kafka applies ``offsets.topic.num.partitions`` only when it creates
        ``__consumer_offsets``; a broker configured with another count later never moves it.
        Before, every start wrote the named count: two services naming different counts in a
        namespace with no group yet restarted each other for ever (each start moved the count,
        which stopped the other with status 3, whose restart moved it back). The count named
        is still written where none is stored (a new namespace) and when the settings are lost
        (``_check_settings``), unless the settle re-establishing the lost settings finds
        groups under another count (then that one is served, ``_start``); a program's
        ``GroupCoordinator`` naming a count still changes it (an empty namespace only), and
        the services follow it (status 3)."""
        if "num_partitions" not in named:
            return named
        key = settings_key(self.config.namespace)
        raw = on_node(self._client, key, lambda node: node.hget(key, "num_partitions"))
        try:
            stored = None if raw is None else int(raw)
        except ValueError:  # (written by hand: the settle names it, and named over it, fixes it)
            return named
        if stored is None or stored == named["num_partitions"]:
            return named
        log.warning("--set num_partitions=%d is not in force: namespace %r has %d coordinator "
                    "partitions, fixed once stored (as Kafka's offsets.topic.num.partitions); "
                    "it serves that count (a GroupCoordinator started naming a count changes it "
                    "while the namespace holds no group)", named["num_partitions"],
                    self.config.namespace, stored, extra={
                        "event": "settings_overridden", "overridden": {"num_partitions": {
                            "named": named["num_partitions"], "now": stored}}})
        return {k: v for k, v in named.items() if k != "num_partitions"}

    def _check_settings(self) -> None:
        """Keep the namespace settings as this process knows them, every lease round.

        Lost (data loss): settle again, which writes the settings this process names and
        re-establishes the rest as they were. Lost and already established again by another
        process (a worker that settled first, from its own settings or the defaults) counts as
        lost: the stored origin (``rcoord.settings.ORIGIN``) is another one, whatever the
        version; before, this process adopted them (or, at the version it knew, did not notice)
        and the settings it names were gone for good. Named settings that cannot be written over
        the ones re-established (another count with groups under it) are adopted instead.
        Changed by another party (the version
        moved): adopt the stored values and warn once about named ones overridden; writing ours back
        would start a war with a process naming other values, each rewriting the settings
        (and every copy) every round. The partition count is fixed while groups exist, but may
        change before: a process that kept the old count would sweep keys nobody uses, so it
        stops and lets its supervisor start it again. A change of count whose deletion of the
        old layout failed (a mark ``rcoord.settings.RETIRE`` left) is finished here by a settle:
        processes on the new count are never refused, so before, the old layout stayed until
        some process happened to settle, and a process still on the old count ran its groups
        there meanwhile (a group existing twice). So is a search for layouts left behind by a
        loss (``rcoord.settings.SWEEP``) that the process re-establishing the settings did not
        finish (killed, or a master down)."""
        key = settings_key(self.config.namespace)
        # Through its node's own client: a hung master there fails this within the socket
        # timeout (no cluster retries), and the lease round goes on (nodes.py). The whole hash
        # (a dozen fields): the marks' names are not known in advance.
        stored = {(k.decode() if isinstance(k, bytes) else k): v
                  for k, v in on_node(self._client, key, lambda node: node.hgetall(key)).items()}
        raw = [stored.get(name) for name in ("version", "num_partitions", ORIGIN)]
        marked = any(name.startswith(RETIRE) or name == SWEEP for name in stored)
        try:
            version = None if raw[0] is None else int(raw[0])
        except ValueError:
            # Written by hand: read as the scripts read it (-1), a change by another party,
            # which the settle repairs from the copies or names in a ConfigError (logged once).
            # Before, int()'s bare message was the settings_error, and nothing repaired it.
            version = -1
        origin = raw[2].decode() if isinstance(raw[2], bytes) else raw[2]
        lost = version is None or origin != self._coord.settings_origin
        was_version = self._coord.settings_version
        adopted: CoordinatorConfig | None = None
        if not lost and (marked or version != was_version):
            # (a mark alone: _retire deletes the old layout, then the mark)
            adopted = self._coord.resettle(write_named=False)
            # Another origin than the one read: lost and established again by another process
            # between that read and the settle's own. Before, that was adopted as the change
            # expected, its origin taken for this process's own, and no later round saw a
            # loss: the settings this process names were gone for good.
            lost = self._coord.settings_origin != origin
        settled = adopted
        if lost:
            log.warning("namespace settings lost; settling them again", extra={
                "event": "settings_resettled", "was_version": was_version,
                "now_version": version})
            try:
                settled = self._coord.resettle()
            except ConfigError as exc:
                # The named settings cannot be written over the ones re-established (a
                # process naming another count changed it and formed groups there, or a
                # named value contradicts a stored one): adopted, as a change by another
                # process is, so a count that moved stops this process (status 3, below).
                # Before, every lease round wrote them again and failed (a settings_error,
                # the loss warning each round), and the process served its old layout for
                # ever. (Settings that cannot be adopted either raise here, as before.)
                log.warning("the settings this process names cannot be written over the "
                            "ones re-established; adopting them", extra={
                                "event": "settings_adopted_after_loss", "why": str(exc)})
                settled = self._coord.resettle(write_named=False)
                self._report_overridden(settled, was_version)
        elif adopted is not None and version != was_version:
            self._report_overridden(adopted, was_version)
        if settled is not None:
            raw = [None, str(settled.num_partitions).encode()]
        if raw[1] is not None and int(raw[1]) != self.group_config.num_partitions:
            log.error("num_partitions changed; restarting", extra={
                "event": "settings_changed", "was": self.group_config.num_partitions, "now": int(raw[1])})
            self.exit_code = 3
            self._stop.set()

    def _report_overridden(self, settled: CoordinatorConfig, was_version: int) -> None:
        """One warning per change by another party, naming the settings of ours it overrode."""
        overridden = {name: {"named": value, "now": getattr(settled, name)}
                      for name, value in self.config.settings.items()
                      if getattr(settled, name) != value}
        if overridden:
            log.warning("namespace settings changed by another process; adopted, overriding %s",
                        ", ".join(f"{k}={v['named']} (now {v['now']})" for k, v in overridden.items()),
                        extra={"event": "settings_overridden", "was_version": was_version,
                               "now_version": self._coord.settings_version, "overridden": overridden})
        else:
            log.info("namespace settings changed by another process; adopted", extra={
                "event": "settings_adopted", "was_version": was_version,
                "now_version": self._coord.settings_version})

    def _sample_loop(self) -> None:
        """Gauges of groups by state and members: O(groups), so never on the timer loop."""
        # Once per outage (before, a warning every pass, every 5 s, for as long as Redis was
        # down); a pass that some nodes answered samples those, and is no failure: the failing
        # nodes' outages are logged by nodes.py, and their partitions count as last sampled.
        failing = Outage("sample_error", "sampling groups failed", again="sampling groups failed",
                         over_event="sample_error_over",
                         over_message="sampling groups failed: over")
        known: dict[int, Sample] = {}
        while not self._stop.wait(SAMPLE_MS / 1000):
            # Only the leases confirmed within a TTL, as ``rcoord_leases_held`` counts them:
            # before, while they were not (Redis out of reach, a pause, the loop left behind),
            # the gauges went on counting their groups, beside ``rcoord_leases_held`` 0, and a
            # sum over the processes counted them twice once another had taken them.
            owned = self._confirmed_leases() or set()
            try:
                for partitions, exc in sample_groups(
                        self._client, self.config.namespace, self.group_config.num_partitions,
                        owned, self.metrics, known):
                    log.debug("sampling a node's groups failed; counted as last sampled",
                              extra={"event": "sample_unread", "partitions": partitions,
                                     "why": str(exc)})
            except Exception as exc:  # noqa: BLE001 - a gauge may be stale; nothing else
                failing.failed(exc)
                continue
            failing.ended()

    def run(self) -> None:
        """The timer loop; returns when ``stop()`` is called (from a signal or another thread),
        within ``LOOP_LEFT_MS`` of it. The loop runs on a daemon thread of its own, so that a
        call that cannot be interrupted (stuck in ``connect()``) is left behind, not waited
        for; it then acts on no partition when it comes back. What ends the loop otherwise (a
        bug) is raised here. A ``stop()`` from a signal handler on this thread is done here,
        as this returns (``stop``)."""
        index = self.config.wake != "hints"
        self._last_turn_ok = self._last_alive = time.monotonic()
        self._running_on = threading.get_ident()
        self._running = True
        self._timer_thread = self._thread(self._run_timer_loop, "rcoord-timer", index)
        self._timer_thread.start()
        try:
            # Two things end the wait, the loop's end and the stop flag: the flag is polled
            # beside the loop's event (one wait cannot take both).
            while not self._loop_ended.wait(INTERRUPT_EVERY_S) and not self._stop.is_set():
                pass
        finally:
            # Also on a KeyboardInterrupt here: the loop stops, as it did when it ran here.
            self._stop.set()
            try:
                self._await_loop()
            finally:
                self._running_on = None
            if self._stop_left_to_run:
                self._stop_now()
        if self._loop_error is not None:
            raise self._loop_error

    def _await_loop(self) -> None:
        """Wait ``LOOP_LEFT_MS`` for the timer loop to end (the stop's watchdog interrupts its
        call meanwhile); else leave it behind, marked (``_loop_left``): what it comes back to
        acts on no partition. ``run()`` does, once the stop flag is set, and so does a
        ``stop()`` from another thread while ``run()`` runs, before it releases the leases."""
        if self._loop_left.is_set():
            return
        left = True
        first = False
        try:
            left = not self._loop_ended.wait(LOOP_LEFT_MS / 1000)
        finally:
            # Also when a second KeyboardInterrupt ends this wait (a user pressing Ctrl-C
            # again): before, the loop was left behind unmarked, acting on the partitions
            # the caller's stop() then released, its sockets shut under that release.
            if left:
                with self._interrupting:
                    first = not self._loop_left.is_set()
                    self._loop_left.set()
        if first:
            log.warning("the timer loop is still in a call the stop could not interrupt "
                        "(a connect to a node that does not answer, or a client passed in, "
                        "whose connections a stop leaves alone); left behind",
                        extra={"event": "timer_loop_left", "id": self.config.coordinator_id})

    def _run_timer_loop(self, index: bool) -> None:
        try:
            self._timer_loop(index)
        except BaseException as exc:  # noqa: BLE001 - raised by run(), on its caller's thread
            self._loop_error = exc
        finally:
            self._loop_ended.set()

    def _timer_loop(self, index: bool) -> None:
        sweeper = self.sweeper
        synced = False
        owned: set[int] = set()
        last_resync = last_tail = 0.0
        pause = LOOP_PAUSE_MS
        # Once per outage, as the lease rounds' (before, a warning every failed turn: about
        # one a second for as long as Redis was down); each failed turn at DEBUG.
        failing = Outage("loop_error", "timer loop error; retrying",
                         again="timer loop still failing", over_event="loop_error_over",
                         over_message="timer loop error: over", quiet_s=LOOP_QUIET_MS / 1000)
        while not self._stop.is_set():
            self._last_alive = time.monotonic()
            try:
                if not synced:
                    # In the loop, so a Redis that does not answer at the start is waited for
                    # as any later failure is; before, it ended the process with a traceback.
                    sweeper.sync_clock()
                    synced = True
                if index and sweeper.next_due() <= sweeper.server_now():
                    sweeper.sweep_due("deadline")
                    self.metrics.wakeups.labels("deadline").inc()
                mono = time.monotonic() * 1000
                wait_ms = min(RESYNC_MS - (mono - last_resync), TAIL_MS - (mono - last_tail))
                if index:
                    wait_ms = min(wait_ms, sweeper.next_due() - sweeper.server_now())
                try:
                    event = self._queue.get(timeout=max(0.0, wait_ms) / 1000.0)
                except queue.Empty:
                    event = None
                while event is not None:
                    # Drain everything already heard before sweeping: a burst of messages then
                    # costs one sweep, not one loop turn each.
                    owned = self._handle(event, owned, index)
                    try:
                        event = self._queue.get_nowait()
                    except queue.Empty:
                        event = None
                if self._hinted:
                    self._check_hints()
                if self._resync_due:
                    if index:
                        sweeper.resync(owned)
                    self._resync_due = False
                mono = time.monotonic() * 1000
                if mono - last_resync >= RESYNC_MS:
                    last_resync = mono
                    # The lease keeper's set is the truth; events only make changes act sooner.
                    owned = set(self.leases.owned)
                    sweeper.sync_clock()
                    if index:
                        sweeper.resync(owned)
                if mono - last_tail >= TAIL_MS:
                    # Moved on whether or not the events are read: while the leases are
                    # unconfirmed the turn's wait is still bounded by TAIL_MS from here; it
                    # was bounded by a time already passed, and the loop turned without
                    # waiting (a spin) until a lease round confirmed them again.
                    last_tail = mono
                    if self._leases_confirmed():
                        self.tail.poll(self._tailed(owned))
                pause = LOOP_PAUSE_MS
                self._last_turn_ok = time.monotonic()
                failing.ended()
            except Exception as exc:  # noqa: BLE001 - a lost connection must not end the process
                # Redis that refuses (out of memory, read-only, unreachable) refuses the next
                # turn too: wait, longer each time (bounded), rather than asking again at once.
                failing.failed(exc)
                log.debug("timer loop turn failed; retrying", extra={
                    "event": "loop_retry", "why": str(exc), "retry_in_ms": pause})
                self._last_alive = time.monotonic()
                self._stop.wait(pause / 1000)
                pause = min(LOOP_PAUSE_MAX_MS, pause * 2)

    def _round_refused(self, started: float, exc: BaseException) -> None:
        """Note a failed lease round (begun at ``started``) for ``_retention_leases``: one
        Redis refused as out of memory, within a TTL of the round before (confirmed or refused
        so), goes on the chain; any other failure breaks it. Logged once per chain."""
        last = max(self._confirmed_at, self._refused_at)
        if not _out_of_memory(exc) or started - last >= self.config.lease_ttl_ms / 1000:
            self._refused_at = 0.0
            return
        if self._refused_at <= self._confirmed_at:
            log.warning("Redis is out of memory and refuses the lease rounds: retention goes on "
                        "with the leases last confirmed, to free memory", extra={
                            "event": "retention_on_last_leases", "id": self.config.coordinator_id,
                            "partitions": sorted(self.leases.owned), "why": str(exc)})
        self._refused_at = started

    def _retention_leases(self) -> set[int] | None:
        """The partitions whose topics the retention passes trim (``RetentionKeeper``'s
        ``owned``): ``_confirmed_leases``, or, while Redis refuses the lease rounds as out of
        memory (noeviction), the set the last confirmed round held.

        Out of memory, Redis refuses every write that may grow it, each lease round's included
        (the registry's ZADD, the ``lease`` function), but not a trim (XTRIM), which is what frees
        memory (``ServerUnavailable``'s message tells the operator to free it with retention).
        Before, the leases were unconfirmed a TTL later and every pass failed as
        ``leases_unconfirmed``: no topic was trimmed for as long as Redis was full
        (``tests/test_review78_service.py::test_retention_is_applied_while_redis_is_out_of_memory``;
        Kafka's broker runs its log retention whatever else fails). While the rounds are refused
        so, nobody takes a lease either (taking one writes to the same Redis, and every round
        registers on the registry's node first, the one refusing), so the last set is still this
        process's in fact. The chain holds only while each refused round came within a TTL of
        the one before (a paused process's leases may have moved meanwhile) and breaks at any
        other failure (``_round_refused``). Retention only: a trim is idempotent, so should the
        set be wrong, two processes trimming one topic cost a call, where the timer loop acting
        on a partition it lost would log its events twice. It can be wrong: memory freed for a
        moment lets another process's round through; and on a cluster one master out of memory
        fails the whole round of every process with a lease there (its OOM answer to the
        ``lease`` function is no node failure), while the registry's master, if another, still
        takes a newcomer, whose plan may give it a lease of this process's on a healthy master
        once that lease lapses."""
        confirmed = self._confirmed_leases()
        if confirmed is not None:
            return confirmed
        if (self._loop_left.is_set() or self._refused_at <= self._confirmed_at
                or time.monotonic() - self._refused_at >= self.config.lease_ttl_ms / 1000):
            return None
        return set(self.leases.owned)

    def _confirmed_leases(self) -> set[int] | None:
        """The partitions this process leases, if its leases were renewed within a TTL
        (``_leases_confirmed``); else None, not knowing (an empty set says it holds none): the
        retention of their topics waits for the next lease round to say which are still this
        process's, and the pass is not counted ok (``RetentionKeeper``)."""
        return set(self.leases.owned) if self._leases_confirmed() else None

    def _leases_confirmed(self) -> bool:
        """The leases were renewed within a TTL (counted from the start of the round that
        renewed them), so ``leases.owned`` is still this process's. After a pause (SIGSTOP, a
        frozen VM, a long GC) they may have passed to another process, which has logged their
        events since. The next lease round says which are still held. Never once ``run()``
        left the timer loop behind: the stop releases them."""
        return (not self._loop_left.is_set()
                and time.monotonic() - self._confirmed_at < self.config.lease_ttl_ms / 1000)

    def _tailed(self, owned: set[int]) -> set[int]:
        """The partitions whose events the timer loop reads: those of its set (``owned``) that
        the latest lease round confirmed. The loop's set may be older: after a pause, the first
        round that confirmed the leases again (holding fewer, or none) could come before the
        loop had taken that round's set from its queue, and the loop read the partitions it no
        longer held from where it had stopped, logging and counting again what their new
        holder had logged meanwhile. ``leases.owned`` is set before a round is confirmed; the
        callers read only while it is (``_leases_confirmed``)."""
        return owned & self.leases.owned

    def _leases_held(self) -> int:
        """How many leases this process holds, as far as it knows: none once its last
        successful lease round is a TTL old (Redis down, the process paused): they have lapsed.
        The ``rcoord_leases_held`` gauge and ``/healthz``'s ``leases``."""
        return len(self._owned) if self._leases_confirmed() else 0

    def _check_hints(self) -> None:
        """An expired hint key says a group had a deadline due: a hit if the index had missed it
        (its earliest deadline was stale); the following sweep then applies it."""
        hinted, self._hinted = sorted(self._hinted), set()
        known = {p: self.sweeper.earliest.get(p, float("inf")) for p in hinted}
        self.sweeper._refresh(hinted)
        now = self.sweeper.server_now()
        for p in hinted:
            fresh = self.sweeper.earliest[p]
            hit = fresh <= now and fresh < known[p]
            self.metrics.hints.labels("hit" if hit else "miss").inc()

    def _handle(self, event: Event, owned: set[int], index: bool) -> set[int]:
        match event:
            case Owned(partitions):
                owned = set(partitions)
                # A hint heard before this event, for a partition given up since, is not this
                # process's to act on (_check_hints would put it back in the sweeper's index).
                self._hinted &= owned
                # Where each new partition's log goes on, read before the first sweep applies
                # anything there (observe.EventTail.poll). Not if the round that sent it is a
                # TTL old by now (the process paused): the next confirmed turn reads them.
                if self._leases_confirmed():
                    self.tail.poll(self._tailed(owned))
                if index:
                    self.sweeper.resync(owned)
                    self._resync_due = False  # (this re-read answers a Resync heard before)
            case Deadline(p, at_ms):
                if p in owned:
                    self.metrics.wakeups.labels("channel").inc()
                    self.sweeper.note_deadline(p, at_ms)
            case Hint(p, group_id):
                if p in owned:
                    self.metrics.wakeups.labels("hint").inc()
                    if index:
                        # The index usually acted already: collect the partitions and re-read
                        # their earliest deadlines in one round trip after draining (see run()).
                        self._hinted.add(p)
                    else:
                        applied = self.sweeper.expire_group(p, group_id, "hint")
                        self.metrics.hints.labels("hit" if applied else "miss").inc()
            case Resync():
                # Once for the whole drain (``_timer_loop``): the deadline listener queues one
                # per channel it subscribes (one per partition), so a reconnect queued as many
                # as there are partitions, and each re-read them all. With 1,000 partitions the
                # loop spent seconds re-reading the index (a million ZRANGEs) after a Redis
                # restart or a dropped connection, applying no deadline meanwhile.
                self._resync_due = True
            case CoordinatorsChanged():
                self._lease_wake.set()
            case _:
                raise TypeError(f"the timer loop got an unknown event {event!r}")
        return owned
