"""/metrics (Prometheus text format) and /healthz (JSON) for a coordinator process.

The endpoint may be bound to every interface (the compose files do), so it holds up against
peers that misbehave: a connection gets ``REQUEST_TIMEOUT_S`` in all to be answered, at most
``MAX_CONNECTIONS`` are served at once, and a peer that hangs up early is not an error."""

from __future__ import annotations

import errno
import json
import logging
import math
import socket
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from ..errors import ConfigError

__all__ = ["MAX_CONNECTIONS", "REQUEST_TIMEOUT_S", "StatusServer"]

log = logging.getLogger("rcoord.service")

REQUEST_TIMEOUT_S = 10.0
"""A connection not answered this long after it opened is closed. http.server's handlers
otherwise wait for a request for ever, one thread each, and a read timeout alone is reset by
every byte: a peer that trickles its headers would hold a thread for good. Prometheus and
health probes send their request at once."""

MAX_CONNECTIONS = 64
"""Connections served at once; one more is closed unanswered (one thread each)."""


class _Server(ThreadingHTTPServer):
    """Counts and times its connections; the serving loop closes those past their time."""

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler],
                 family: socket.AddressFamily) -> None:
        self.address_family = family
        self._open: dict[socket.socket, float] = {}  # connection -> monotonic deadline
        self._open_lock = threading.Lock()
        super().__init__(address, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._open_lock:
            full = len(self._open) >= MAX_CONNECTIONS
            if not full:
                self._open[request] = time.monotonic() + REQUEST_TIMEOUT_S
        if full:
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._open_lock:
                self._open.pop(request, None)

    def service_actions(self) -> None:
        """Run by serve_forever at every poll: cut the connections past their deadline (the
        handler's blocked read or write then ends, and its thread with it)."""
        self.cut(time.monotonic())

    def cut(self, now: float) -> None:
        """Cut the connections whose deadline is ``now`` or earlier (all: ``math.inf``)."""
        with self._open_lock:
            late = [conn for conn, deadline in self._open.items() if deadline <= now]
        for conn in late:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already closed by its handler

    def handle_error(self, request: Any, client_address: Any) -> None:
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, TimeoutError)):
            return  # the peer hung up or went quiet: nothing of ours failed
        log.warning("status request from %s failed", client_address[0], exc_info=exc)


def _family(host: str, port: int) -> socket.AddressFamily:
    try:
        infos = socket.getaddrinfo(host or None, port, 0, socket.SOCK_STREAM, 0,
                                   socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise ConfigError(f"cannot serve /metrics on {host!r}: {exc.strerror} (give an address "
                          "or a name of this machine, such as 127.0.0.1, 0.0.0.0 or ::)") from exc
    return infos[0][0]


def check_address(host: str) -> None:
    """A ``ConfigError`` if ``host`` cannot be served on: a name that does not resolve, or an
    address not of this machine (a bind to a free port there fails). The command line checks
    it before it connects, so the error names the flag (``rcoord coordinator``); it was
    found only when the service started, and named neither the flag nor its variable."""
    family = _family(host, 0)
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((host, 0))
        except OSError as exc:
            raise ConfigError(f"cannot serve /metrics on {host!r}: {exc.strerror or exc} (give "
                              "an address of this machine, such as 127.0.0.1, 0.0.0.0 or ::)"
                              ) from exc


class StatusServer:
    def __init__(self, host: str, port: int, registry: Any, health: Callable[[], tuple[bool, dict[str, Any]]]) -> None:
        registry_ = registry
        health_ = health

        class Handler(BaseHTTPRequestHandler):
            timeout = REQUEST_TIMEOUT_S  # (StreamRequestHandler sets it on the socket)

            def _answer(self, with_body: bool) -> None:
                path: str | None
                try:
                    path = urlsplit(self.path).path
                except ValueError:
                    # A target urlsplit refuses ("http://[/x": an unclosed IPv6 host): a 400;
                    # the handler raised, the peer got no answer and the log a traceback.
                    path = None
                if path is None:
                    body, ctype, code = b"bad request target\n", "text/plain", 400
                elif path == "/metrics":
                    body, ctype, code = generate_latest(registry_), CONTENT_TYPE_LATEST, 200
                elif path == "/healthz":
                    ok, detail = health_()
                    body, ctype, code = json.dumps(detail).encode(), "application/json", 200 if ok else 503
                else:
                    body, ctype, code = b"not found\n", "text/plain", 404
                self._reply(code, ctype, body if with_body else None, len(body))

            def _reply(self, code: int, ctype: str, body: bytes | None, length: int,
                       *headers: tuple[str, str]) -> None:
                """The status, headers and ``body`` (None: headers only, as HEAD asks)."""
                self.send_response(code)
                for name, value in (*headers, ("Content-Type", ctype),
                                    ("Content-Length", str(length))):
                    self.send_header(name, value)
                self.end_headers()
                if body is not None:
                    self.wfile.write(body)

            def do_GET(self) -> None:
                self._answer(with_body=True)

            def do_HEAD(self) -> None:
                self._answer(with_body=False)

            def _not_allowed(self) -> None:
                body = b"method not allowed: GET or HEAD\n"
                self._reply(405, "text/plain", body, len(body), ("Allow", "GET, HEAD"))

            do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _not_allowed

            def log_message(self, format: str, *args: Any) -> None:
                return

        try:
            self._server = _Server((host, port), Handler, _family(host, port))
        except OSError as exc:
            # (A port below 1024 is refused to a process without the right to bind it, as in
            # a container run as a user other than root: the hint named the address.)
            hint = ("choose another metrics port, or 0 for any free one"
                    if exc.errno == errno.EADDRINUSE else
                    "choose a port from 1024 up, or give the process the right to bind this "
                    "one (CAP_NET_BIND_SERVICE)"
                    if exc.errno == errno.EACCES and 0 < port < 1024 else
                    "give an address of this machine, such as 127.0.0.1, 0.0.0.0 or ::")
            raise ConfigError(
                f"cannot serve /metrics on {host}:{port}: {exc.strerror or exc} ({hint})") from exc
        # Polled for a stop every 0.2 s: shutdown() waits for the next poll (0.5 s by default,
        # a quarter of the stop's whole budget; service.STOP_GRACE_MS). The poll also cuts
        # connections past REQUEST_TIMEOUT_S.
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.2,),
                                        name="rcoord-http", daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Also for a server bound but never started (a start that failed after binding):
        ``shutdown()`` would wait for ever for a serving loop that never ran."""
        if self._thread.is_alive():
            self._server.shutdown()
        self._server.server_close()
        # The connections still open (a probe in flight, a peer that sent half a request):
        # with the serving loop ended nothing cut them any more, and each kept its socket and
        # handler thread until its read timed out (never, against a peer that trickles).
        self._server.cut(math.inf)
