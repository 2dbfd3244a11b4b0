"""``rcoord coordinator``: run one coordinator process.

Settings come from flags, then the environment, then defaults:

====================  ===========================  ======================
flag                  environment                  default
====================  ===========================  ======================
``--redis-url``       ``RCOORD_REDIS_URL``         (required)
``--id``              ``RCOORD_COORDINATOR_ID``    host-pid-random
``--namespace``       ``RCOORD_NAMESPACE``         rcoord
``--metrics-port``    ``RCOORD_METRICS_PORT``      no HTTP server (0 = any free port)
``--metrics-host``    ``RCOORD_METRICS_HOST``      127.0.0.1
``--lease-ttl-ms``    ``RCOORD_LEASE_TTL_MS``      5000
``--wake``            ``RCOORD_WAKE``              both
``--retention-check-  ``RCOORD_RETENTION_CHECK_    300000 (0 = off)
interval-ms``         INTERVAL_MS``
``--log-level``       ``RCOORD_LOG_LEVEL``         INFO
``--tls-ca-file``     ``RCOORD_TLS_CA_FILE``       the system's CAs
``--tls-cert-file``   ``RCOORD_TLS_CERT_FILE``     none (mutual TLS only)
``--tls-key-file``    ``RCOORD_TLS_KEY_FILE``      none (mutual TLS only)
``--set NAME=VALUE``  ``RCOORD_SETTINGS``          none (group settings this process names;
                      (``NAME=VALUE,...``)         repeat the flag for several)
====================  ===========================  ======================

``--set`` names the namespace's group settings (``CoordinatorConfig`` fields, such as
``group_min_session_timeout_ms=100``) as a broker's configuration names Kafka's: they are written
at start and written again whenever the namespace loses them.

``--retention-check-interval-ms`` is Kafka's ``log.retention.check.interval.ms``: how often the
process applies the retention (``--retention-ms``, ``--retention-records``) of the topics on its
leases; 0 turns that off.

URLs may be ``redis://`` or ``rediss://``, carry ``user:password@`` (ACL users), and point at a
single node or any node of a Redis Cluster (detected from the server). The TLS files become
redis-py's URL arguments (``?ssl_ca_certs=...``), which may also be written in the URL itself.

SIGTERM and SIGINT stop the process gracefully (its leases are released), also while it waits
at start for the claim of its id, left by a process of that id that died, to lapse (exit 0,
nothing taken). SIGUSR1 writes the
stack of every thread to stderr and changes nothing: for a process that seems stuck, as a JVM's
thread dump is for a Kafka broker (``kill -QUIT``, ``jstack``).

A setting or connection that does not work is one line on stderr (``rcoord coordinator: error:
...``) and exit status 2 (a bad flag, a metrics port already in use, or an ``--id`` another
running process uses: found before any lease is taken) or 1 (Redis unreachable, refused the
login, or a missing ACL permission); ``--log-level debug`` adds the traceback. A process whose
id another process took while it was paused (for a lease TTL) stops with status 2 too, and one
that finds the namespace's ``num_partitions`` changed under it stops with status 3, for its
supervisor to start it again under the new count. ``--set num_partitions=N`` is written only
where the namespace has no count stored (or lost it), as Kafka's
``offsets.topic.num.partitions`` applies only when ``__consumer_offsets`` is created: a
process naming another count than the stored one logs so and serves the stored one.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
from typing import Any

from ..cli import INTEGER, LOG_LEVELS, FromEnv, FromEnvInt, env_default, env_note, from_env
from ..errors import ConfigError

__all__ = ["JsonFormatter", "add_coordinator_arguments", "coordinator_main"]

_RESERVED = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message and every ``extra`` field."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for k, v in record.__dict__.items():
            if k not in _RESERVED and not k.startswith("_"):
                out[k] = v
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def _int(text: str) -> int:
    """argparse's ``type=int``, whose error names the environment variable a default came
    from (it read "argument --lease-ttl-ms: invalid int value: 'abc'" for
    ``RCOORD_LEASE_TTL_MS=abc``, a flag nobody typed)."""
    if not INTEGER.fullmatch(text):  # (as the groups and topics commands: ops.common.integer)
        raise argparse.ArgumentTypeError(f"invalid int value: {str(text)!r}{env_note(text)}")
    value = int(text)
    if isinstance(text, FromEnv):  # (kept for the range check in coordinator_main)
        out = FromEnvInt(value)
        out.variable = text.variable
        return out
    return value


def _wake(text: str) -> str:
    """A ``--wake`` value; argparse checks ``choices`` only on a typed flag, so a bad
    ``$RCOORD_WAKE`` reached the service, whose error named neither."""
    from .service import WAKE_MODES

    if text not in WAKE_MODES:
        raise argparse.ArgumentTypeError(
            f"invalid choice: {str(text)!r}{env_note(text)} (choose from "
            f"{', '.join(WAKE_MODES)})")
    return str(text)


def add_coordinator_arguments(p: argparse.ArgumentParser) -> None:
    from ..cli import AfterCommand, add_tls_arguments
    from .service import WAKE_MODES

    p.add_argument("--redis-url", action=AfterCommand, default=env_default("RCOORD_REDIS_URL"),
                   help="the Redis (or Redis Cluster node) holding the groups: redis:// or "
                   "rediss:// (default $RCOORD_REDIS_URL)")
    p.add_argument("--id", dest="coordinator_id", default=env_default("RCOORD_COORDINATOR_ID"),
                   help="this process's name in leases, logs and metrics, one process's at a "
                   "time (default $RCOORD_COORDINATOR_ID; else host-pid-random)")
    p.add_argument("--namespace", action=AfterCommand,
                   default=env_default("RCOORD_NAMESPACE", "rcoord"),
                   help="the key prefix of the groups this process serves (default "
                   "$RCOORD_NAMESPACE, else rcoord)")
    p.add_argument("--metrics-port", type=_int, default=env_default("RCOORD_METRICS_PORT"),
                   help="serve /metrics (Prometheus) and /healthz on this port (default "
                   "$RCOORD_METRICS_PORT; none if unset)")
    p.add_argument("--metrics-host", default=env_default("RCOORD_METRICS_HOST", "127.0.0.1"),
                   help="the address /metrics and /healthz listen on, IPv4 or IPv6 (0.0.0.0 or :: for "
                   "every interface; default $RCOORD_METRICS_HOST, else 127.0.0.1: loopback only)")
    p.add_argument("--lease-ttl-ms", type=_int, default=env_default("RCOORD_LEASE_TTL_MS", 5000),
                   help="how long this process's lease on a coordinator partition lasts "
                   "unrenewed: a dead process's partitions move after it (default 5000)")
    p.add_argument("--wake", type=_wake, choices=WAKE_MODES,
                   default=env_default("RCOORD_WAKE", "both"),
                   help="what drives the timers: the deadline index, expired-key hints (for "
                   "measurements only) or both (default)")
    p.add_argument("--retention-check-interval-ms", type=_int,
                   default=env_default("RCOORD_RETENTION_CHECK_INTERVAL_MS", 300_000),
                   help="how often this process removes the records topic retention no longer "
                   "keeps, in the topics on its leases (Kafka's log.retention.check.interval.ms; "
                   "default $RCOORD_RETENTION_CHECK_INTERVAL_MS, else 300000; 0 turns it off)")
    p.add_argument("--log-level", action=AfterCommand,
                   default=env_default("RCOORD_LOG_LEVEL", "INFO"),
                   help=f"{', '.join(LOG_LEVELS)} (default $RCOORD_LOG_LEVEL, else INFO); "
                   "logs are JSON lines on stdout")
    add_tls_arguments(p)
    # (Each item names the variable, for parse_settings's error: "--set expects ..." named a
    # flag nobody typed.)
    env_settings = [from_env(x, "RCOORD_SETTINGS")
                    for x in os.environ.get("RCOORD_SETTINGS", "").split(",") if x]
    p.add_argument("--set", dest="settings", action="append", default=env_settings,
                   metavar="NAME=VALUE", help="a group setting this process names (repeatable)")


def parse_settings(items: list[str]) -> dict[str, int]:
    """``NAME=VALUE`` strings as setting -> int; a malformed one is a ConfigError naming it."""
    out: dict[str, int] = {}
    for item in items:
        name, sep, value = item.partition("=")
        value = value.strip()  # (blanks around it, as a properties file's are trimmed)
        if not sep or not INTEGER.fullmatch(value):
            raise ConfigError(f"--set expects NAME=INTEGER, got {str(item)!r}{env_note(item)}")
        out[name.strip()] = int(value)
    return out


def check_flag(flag: str, value: Any, url: str, **field: Any) -> None:
    """A UsageError naming ``flag``, its ``value`` and the variable it came from
    (``env_note``) if ServiceConfig refuses the setting ``field`` (one field, the rest
    defaults); the range stays ServiceConfig's own."""
    from ..cli import UsageError
    from .service import ServiceConfig

    try:
        ServiceConfig(redis_url=url, **field)
    except ConfigError as exc:
        raise UsageError(f"{flag} {value!r}{env_note(value)}: {exc}") from None


def check_metrics_host(host: str) -> None:
    """A UsageError naming ``--metrics-host`` and the variable it came from if /metrics cannot
    be served there (``http.check_address``)."""
    from ..cli import UsageError
    from .http import check_address

    try:
        check_address(str(host))
    except ConfigError as exc:
        raise UsageError(f"--metrics-host {str(host)!r}{env_note(host)}: {exc}") from None


def check_settings(items: list[str], url: str) -> None:
    """``check_flag`` for the ``--set`` items, checked together (one alone may not fit the
    defaults of the others set with it: a maximum below the default minimum). The error names
    the item without which the rest are taken, else every item."""
    from ..cli import UsageError
    from .service import ServiceConfig

    def refused(subset: list[str]) -> ConfigError | None:
        try:
            ServiceConfig(redis_url=url, settings=parse_settings(subset))
        except ConfigError as exc:
            return exc
        return None

    exc = refused(items)
    if exc is None:
        return
    culprits = [item for i, item in enumerate(items) if refused(items[:i] + items[i + 1:]) is None]
    named = ", ".join(f"{item!r}{env_note(item)}" for item in (culprits[:1] or items))
    raise UsageError(f"--set {named}: {exc}") from None


def coordinator_main(args: argparse.Namespace) -> int:
    """Run until SIGTERM/SIGINT; the exit status (see the module docstring)."""
    from ..cli import (
        UsageError,
        check_url,
        dump_threads_on_sigusr1,
        log_level,
        report,
        with_tls_files,
    )
    from .leases import StoppedBeforeClaim
    from .service import CoordinatorService, ServiceConfig

    prog = "rcoord coordinator"
    url = None
    try:
        level = log_level(args.log_level)
        url = with_tls_files(
            check_url(args.redis_url),
            getattr(args, "tls_ca_file", None),
            getattr(args, "tls_cert_file", None),
            getattr(args, "tls_key_file", None),
        )
        items = list(getattr(args, "settings", None) or [])
        # Each value checked alone first, so that a bad one is named as its flag and the
        # variable it came from (ServiceConfig's error named only its field:
        # "lease_ttl_ms must be in ..." for RCOORD_LEASE_TTL_MS=10).
        given: list[tuple[str, str, Any]] = [
            ("--namespace", "namespace", args.namespace),
            ("--id", "coordinator_id", args.coordinator_id or None),  # (empty: a random id)
            ("--metrics-port", "metrics_port", args.metrics_port),
            ("--lease-ttl-ms", "lease_ttl_ms", args.lease_ttl_ms),
            ("--retention-check-interval-ms", "retention_check_interval_ms",
             args.retention_check_interval_ms),
        ]
        for flag, field, value in given:
            if value is not None:
                check_flag(flag, value, url, **{field: value})
        if args.metrics_port is not None:
            check_metrics_host(args.metrics_host)
        check_settings(items, url)
        kw: dict[str, Any] = {
            "redis_url": url,
            "namespace": str(args.namespace),
            "metrics_port": None if args.metrics_port is None else int(args.metrics_port),
            "metrics_host": args.metrics_host,
            "lease_ttl_ms": int(args.lease_ttl_ms),
            "wake": args.wake,
            "retention_check_interval_ms": int(args.retention_check_interval_ms),
            "settings": parse_settings(items),
        }
        if args.coordinator_id:
            kw["coordinator_id"] = str(args.coordinator_id)
        config = ServiceConfig(**kw)
    except (UsageError, ValueError) as exc:  # ConfigError is a ValueError
        return report(exc if isinstance(exc, (UsageError, ConfigError)) else UsageError(str(exc)),
                      prog)
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    # Put back when the command ends, as the signal handlers are (``SignalStop.close``): a
    # program that runs it in its own process (``rcoord.cli.main``, a test) had its own
    # logging replaced by these JSON lines on stdout for good.
    # (Also when the command fails before its service starts: SignalStop off the main thread.)
    handlers_before, level_before = root.handlers[:], root.level
    root.handlers[:] = [handler]
    root.setLevel(level)
    try:
        service = CoordinatorService(config)
        # Before start(): a SIGTERM that arrives while it starts (it logs "started" first) is
        # a graceful stop too, not a kill.
        signals = SignalStop(service._stop)
        dumps = dump_threads_on_sigusr1()
        try:
            try:
                service.start()
            except StoppedBeforeClaim as exc:  # (SIGTERM while waiting for the id: clean stop)
                logging.getLogger("rcoord.service").info(str(exc), extra={"event": "stopped"})
                return 0
            except Exception as exc:  # noqa: BLE001 - the edge: one line, traceback on DEBUG
                return report(exc, prog, url=url, debug=level == "DEBUG")
            try:
                service.run()
            finally:
                service.stop()
            return service.exit_code
        finally:
            signals.close()
            dumps()
    finally:
        root.handlers[:] = handlers_before
        root.setLevel(level_before)


class SignalStop:
    """SIGTERM and SIGINT set ``stop`` (a graceful stop), from a thread of its own.

    The handler runs on the main thread, between two of its bytecodes, and must take no lock:
    ``Event.set()`` takes the event's lock, which is not reentrant, so a signal that arrived
    while the main thread held it (inside ``stop.wait()``: ``start()`` waiting for a claimed
    id; or ``stop.set()``: a second signal during the stop) hung the process until SIGKILL.
    The handler only writes a byte to a pipe; the thread reading it sets ``stop``.

    ``close()`` puts back the handlers it found, so a program that runs the command in its own
    process (``rcoord.cli.main(["coordinator", ...])``, a test) gets its Ctrl-C and SIGTERM
    back; before, both were left ignored for the rest of that process."""

    def __init__(self, stop: threading.Event) -> None:
        self._stop = stop
        self._previous: dict[int, Any] = {}
        self._read, self._write = os.pipe()
        os.set_blocking(self._write, False)
        try:
            for signum in (signal.SIGTERM, signal.SIGINT):
                self._previous[signum] = signal.signal(signum, self.handle)
        except BaseException:
            # (Off the main thread: ValueError. Before, the pipe's two ends and a thread
            # blocked reading it were left behind with it.)
            self._restore()
            os.close(self._read)
            os.close(self._write)
            raise
        # Started once the handlers are in: a signal before then waits in the pipe.
        threading.Thread(target=self._watch, name="rcoord-signals", daemon=True).start()

    def handle(self, signum: int, frame: Any) -> None:
        """The signal handler: no lock taken, nothing waited for."""
        try:
            os.write(self._write, b"s")
        except BlockingIOError:  # (the pipe is full: a stop is pending already)
            pass

    def _watch(self) -> None:
        try:
            while os.read(self._read, 1) == b"s":
                self._stop.set()
        finally:
            os.close(self._read)

    def _restore(self) -> None:
        """The handlers found at the start (``SIG_DFL`` for one not set from Python)."""
        for signum, previous in self._previous.items():
            signal.signal(signum, signal.SIG_DFL if previous is None else previous)
        self._previous.clear()

    def close(self) -> None:
        """The command has ended: the handlers found at the start are put back, and the
        thread ends. Called on the main thread."""
        self._restore()
        try:
            os.write(self._write, b"q")
        except BlockingIOError:  # (a full pipe: the thread, a daemon, is left reading it)
            pass
        os.close(self._write)
