"""/metrics (Prometheus text format) and /healthz (JSON) for a coordinator process."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from ..errors import ConfigError

__all__ = ["REQUEST_TIMEOUT_S", "StatusServer"]

REQUEST_TIMEOUT_S = 10.0
"""A connection that sends nothing for this long is closed. http.server's handlers otherwise
wait for a request for ever, one thread each: a peer that opens connections and stays silent
would pile up threads without bound. Prometheus and health probes send their request at once."""


class StatusServer:
    def __init__(self, host: str, port: int, registry: Any, health: Callable[[], tuple[bool, dict[str, Any]]]) -> None:
        registry_ = registry
        health_ = health

        class Handler(BaseHTTPRequestHandler):
            timeout = REQUEST_TIMEOUT_S  # (StreamRequestHandler sets it on the socket)

            def do_GET(self) -> None:  # noqa: N802 - the http.server API
                if self.path.startswith("/metrics"):
                    body, ctype, code = generate_latest(registry_), CONTENT_TYPE_LATEST, 200
                elif self.path.startswith("/healthz"):
                    ok, detail = health_()
                    body, ctype, code = json.dumps(detail).encode(), "application/json", 200 if ok else 503
                else:
                    body, ctype, code = b"not found\n", "text/plain", 404
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                return

        try:
            self._server = ThreadingHTTPServer((host, port), Handler)
        except OSError as exc:
            raise ConfigError(
                f"cannot serve /metrics on {host}:{port}: {exc.strerror or exc} (choose another "
                "metrics port, or 0 for any free one)") from exc
        # Polled for a stop every 0.2 s: shutdown() waits for the next poll (0.5 s by default,
        # a quarter of the stop's whole budget; service.STOP_GRACE_MS).
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
