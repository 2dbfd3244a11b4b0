"""``rcoord gateway``: serve Kafka's protocol on HOST:PORT over the namespace's Redis state.

Only argument parsing lives at module level, so ``rcoord --help`` works without the
``gateway`` extra (kio) installed; the server is imported when the command runs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import faulthandler
import logging
import os
import signal
import sys
from typing import Any

from ..cli import (
    ENV_REDIS_URL,
    AfterCommand,
    UsageError,
    add_tls_arguments,
    check_url,
    env_default,
    log_level,
    report,
    with_tls_files,
)
from ..errors import as_missing_permission, is_missing_permission
from ..ops.common import integer

__all__ = ["add_arguments", "gateway_main", "host_port"]


def host_port(value: str, flag: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` for IPv6) or a UsageError saying what is expected."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise UsageError(f"{flag} {value!r} is not HOST:PORT (for example 127.0.0.1:9092)")
    return host.strip("[]") or "127.0.0.1", int(port)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--listen", default="127.0.0.1:9092",
                   help="address to accept Kafka clients on (default 127.0.0.1:9092; port 0 "
                   "picks a free one)")
    p.add_argument("--advertise", default=None,
                   help="HOST:PORT clients are told to connect to (Metadata, FindCoordinator); "
                   "default: the listening address")
    p.add_argument("--redis-url", action=AfterCommand, default=env_default(ENV_REDIS_URL),
                   help=f"Redis to use (default ${ENV_REDIS_URL})")
    p.add_argument("--namespace", action=AfterCommand,
                   default=env_default("RCOORD_NAMESPACE", "rcoord"),
                   help="the rcoord namespace (default $RCOORD_NAMESPACE, else rcoord)")
    p.add_argument("--max-frame-bytes", type=integer, default=100 * 1024 * 1024,
                   help="largest request accepted; a larger one closes the connection "
                   "(Kafka's socket.request.max.bytes, default 100 MiB)")
    p.add_argument("--message-max-bytes", type=integer, default=1024 * 1024 + 12,
                   help="largest record batch a Produce appends to a partition; a larger one "
                   "is refused MESSAGE_TOO_LARGE (Kafka's message.max.bytes, default 1048588)")
    p.add_argument("--socket-send-buffer-bytes", type=integer, default=100 * 1024,
                   help="each client socket's send buffer (Kafka's socket.send.buffer.bytes, "
                   "default 102400; -1: the system's)")
    p.add_argument("--connections-max-idle-ms", type=integer, default=600_000,
                   help="close a connection that sends no request for this long (Kafka's "
                   "connections.max.idle.ms, default 600000)")
    p.add_argument("--auth-file", default=None,
                   help='require SASL/PLAIN from every client; users (and optional Kafka ACLs) '
                   'from this JSON file: {"users": {"name": "password"}, "acls": [...]} '
                   "(docs/gateway.md)")
    p.add_argument("--listen-tls-cert-file", default=None,
                   help="serve TLS to Kafka clients with this certificate chain (PEM): "
                   "security.protocol SSL, or SASL_SSL with --auth-file. (--tls-* are for "
                   "the connection to Redis)")
    p.add_argument("--listen-tls-key-file", default=None,
                   help="the listener certificate's private key (PEM; default: in the "
                   "certificate file)")
    p.add_argument("--listen-tls-key-password-file", default=None,
                   help="a file whose first line is the private key's pass phrase (Kafka's "
                   "ssl.key.password; default: the key is not encrypted)")
    p.add_argument("--listen-tls-ca-file", default=None,
                   help="require a client certificate signed by this CA (mutual TLS)")
    p.add_argument("--commit-required-acks", type=integer, default=0,
                   help="replicas that must have an OffsetCommit before it is answered (Kafka's "
                        "offsets.commit.required.acks; default 0: the master's answer)")
    p.add_argument("--commit-ack-timeout-ms", type=integer, default=5000,
                   help="how long a commit waits for them (offsets.commit.timeout.ms; 5000)")
    p.add_argument("--log-level", action=AfterCommand,
                   default=env_default("RCOORD_LOG_LEVEL", "INFO"),
                   help="DEBUG also prints the traceback of an error (default "
                   "$RCOORD_LOG_LEVEL, as for every command, else INFO)")
    add_tls_arguments(p)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _dump_tasks() -> None:
    """Every thread's stack, then each asyncio task's chain of awaits on stderr, innermost
    last (the thread dump shows the event loop's thread waiting and nothing of what each task
    waits for; ``Task.print_stack`` shows only a task's outermost coroutine). A callback of
    the loop's, holding the GIL: no thread changes its stack while it is read."""
    sys.stderr.flush()
    faulthandler.dump_traceback(sys.stderr, all_threads=True)
    tasks = asyncio.all_tasks()
    print(f"{len(tasks)} asyncio tasks:", file=sys.stderr)
    for task in tasks:
        print(f"{task!r}", file=sys.stderr)
        awaited: Any = task.get_coro()
        while awaited is not None:
            frame = getattr(awaited, "cr_frame", None) or getattr(awaited, "gi_frame", None)
            if frame is not None:
                print(f"  {frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}",
                      file=sys.stderr)
            awaited = getattr(awaited, "cr_await", None) or getattr(awaited, "gi_yieldfrom", None)
    sys.stderr.flush()


def gateway_main(args: argparse.Namespace) -> int:
    """Serve until SIGTERM or SIGINT: then close the gateway and return 0. A usage error or
    a failure to start is one line on stderr and ``report``'s status (2: usage)."""
    url = level = None
    try:
        level = log_level(args.log_level)
        url = with_tls_files(check_url(args.redis_url), args.tls_ca_file, args.tls_cert_file,
                             args.tls_key_file)
        listen = host_port(args.listen, "--listen")
        advertise = host_port(args.advertise, "--advertise") if args.advertise else None
        logging.basicConfig(level=level,
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        from .auth import load_auth_file
        from .server import Gateway, TlsFileError, server_tls_context
        from .state import GatewayConfig

        try:
            auth = load_auth_file(args.auth_file) if args.auth_file else None
        except ValueError as exc:
            raise UsageError(str(exc)) from None

        config = GatewayConfig(
            listen_host=listen[0], listen_port=listen[1],
            advertise_host=advertise[0] if advertise else None,
            advertise_port=advertise[1] if advertise else None,
            namespace=args.namespace, max_frame_bytes=args.max_frame_bytes,
            message_max_bytes=args.message_max_bytes,
            tls_cert_file=args.listen_tls_cert_file, tls_key_file=args.listen_tls_key_file,
            tls_ca_file=args.listen_tls_ca_file,
            tls_key_password_file=args.listen_tls_key_password_file,
            commit_required_acks=args.commit_required_acks,
            commit_ack_timeout_ms=args.commit_ack_timeout_ms,
            connections_max_idle_ms=args.connections_max_idle_ms,
            socket_send_buffer_bytes=args.socket_send_buffer_bytes,
        )
        try:
            config.validate()
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        flags = {"tls_cert_file": "--listen-tls-cert-file",
                 "tls_key_file": "--listen-tls-key-file", "tls_ca_file": "--listen-tls-ca-file",
                 "tls_key_password_file": "--listen-tls-key-password-file"}
        for field, flag in flags.items():
            path = getattr(config, field)
            if path is not None and not os.path.isfile(path):
                raise UsageError(f"{flag} {path!r} does not exist")
        try:  # (loaded here too, so a bad file is a usage error before Redis is reached)
            server_tls_context(config)
        except TlsFileError as exc:
            raise UsageError(f"{flags[exc.field]} {exc.path!r} {exc.problem}") from None

        async def serve() -> None:
            # SIGTERM (kill, docker stop, systemd) and SIGINT: close the gateway (its
            # connections and Redis clients), then exit 0. Python's default for SIGTERM ends
            # the process at once, Gateway.close() never run.
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, stop.set)
            if hasattr(signal, "SIGUSR1"):
                # Every thread's stack (the event loop's own included), then every task's: a
                # connection waits in a task, where a thread dump does not show it.
                loop.add_signal_handler(signal.SIGUSR1, _dump_tasks)
            async with Gateway(config, url, auth=auth) as gateway:
                serving = asyncio.create_task(gateway.serve_forever())
                stopping = asyncio.create_task(stop.wait())
                await asyncio.wait({serving, stopping}, return_when=asyncio.FIRST_COMPLETED)
                for task in (serving, stopping):
                    task.cancel()
                for task in (serving, stopping):
                    with contextlib.suppress(asyncio.CancelledError):
                        await task  # (serve_forever's own error, if any, is raised here)

        # Until the event loop takes them over: a SIGTERM while starting is a Ctrl-C too.
        previous = signal.signal(signal.SIGTERM, _interrupt)
        try:
            asyncio.run(serve())
        finally:
            signal.signal(signal.SIGTERM, previous)
        return 0
    except KeyboardInterrupt:
        return 0
    except Exception as exc:  # noqa: BLE001  (the edge: one line, then exit)
        if is_missing_permission(exc):
            # (with the namespace: a refused key is told the pattern ~<namespace>:* to grant)
            exc = as_missing_permission(exc, args.namespace)
        return report(exc, "rcoord gateway", url=url, debug=level == "DEBUG")
