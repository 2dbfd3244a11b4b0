"""The coordinator's status endpoint (/healthz, /metrics) against peers that misbehave."""

from __future__ import annotations

import json
import socket
import urllib.request

import pytest
from prometheus_client import CollectorRegistry

from rcoord.service import http


def test_a_silent_connection_is_closed_and_others_are_served(monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    # http.server waits for a request for ever by default, a thread per connection: silent
    # peers would each hold one for good.
    monkeypatch.setattr(http, "REQUEST_TIMEOUT_S", 0.3, raising=False)
    server = http.StatusServer("127.0.0.1", 0, CollectorRegistry(),
                               lambda: (True, {"status": "ok"}))
    server.start()
    silent = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    try:
        silent.sendall(b"GET /heal")  # half a request line, then nothing
        url = f"http://127.0.0.1:{server.port}/healthz"
        with urllib.request.urlopen(url, timeout=5) as r:
            assert json.loads(r.read()) == {"status": "ok"}
        assert silent.recv(1024) == b""  # closed by the server, well before our 5 s
    finally:
        silent.close()
        server.stop()
