"""The coordinator's status endpoint (/healthz, /metrics) against peers that misbehave."""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest
from harness import wait_until
from prometheus_client import CollectorRegistry

from rcoord.errors import ConfigError
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


def _serve(health: Callable[[], tuple[bool, dict[str, Any]]] = lambda: (True, {"status": "ok"})
           ) -> http.StatusServer:
    server = http.StatusServer("127.0.0.1", 0, CollectorRegistry(), health)
    server.start()
    return server


def _exchange(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
        conn.sendall(request)
        answer = b""
        while chunk := conn.recv(4096):
            answer += chunk
    return answer


def _closed_within(conn: socket.socket, seconds: float, trickle: bool = False) -> bool:
    """Whether the server closes ``conn`` within ``seconds`` (while we send a byte every 50 ms
    when ``trickle``)."""
    deadline = time.monotonic() + seconds
    conn.settimeout(0.05)
    while time.monotonic() < deadline:
        try:
            if trickle:
                conn.sendall(b"X")
            if conn.recv(1024) == b"":
                return True
        except TimeoutError:
            continue
        except (ConnectionResetError, BrokenPipeError):
            return True
    return False


@pytest.mark.parametrize(("request_line", "status"), [
    ("GET /metrics?name[]=up", b"200"), ("GET /healthz", b"200"),
    ("GET /metricsXYZ", b"404"), ("GET /healthz-anything", b"404"),
    ("GET /metrics/../../etc", b"404"), ("POST /healthz", b"405"), ("DELETE /metrics", b"405"),
    ("GET http://[/metrics", b"400"), ("HEAD http://[::1/healthz", b"400"),
])
def test_only_the_two_paths_answer_and_only_to_get_and_head(request_line: str,
                                                            status: bytes) -> None:
    server = _serve()
    try:
        answer = _exchange(server.port, f"{request_line} HTTP/1.0\r\n\r\n".encode())
        assert answer.split(b"\r\n", 1)[0].split(b" ")[1] == status
        if status == b"405":
            assert b"\r\nAllow: GET, HEAD\r\n" in answer
    finally:
        server.stop()


def test_head_answers_the_status_without_a_body() -> None:
    # curl -I and HEAD-based checkers: the status of GET (503 when unhealthy), no body.
    server = _serve(lambda: (False, {"status": "redis unreachable"}))
    try:
        answer = _exchange(server.port, b"HEAD /healthz HTTP/1.0\r\n\r\n")
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.0 503") and body == b""
        assert b"Content-Length: " + str(len(b'{"status": "redis unreachable"}')).encode() in head
    finally:
        server.stop()


def test_a_trickling_peer_is_cut_off_at_the_request_deadline(monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    # A byte every 50 ms resets a read timeout of 0.3 s each time: only a deadline for the
    # whole request frees the thread.
    monkeypatch.setattr(http, "REQUEST_TIMEOUT_S", 0.3)
    server = _serve()
    trickler = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    try:
        trickler.sendall(b"GET /healthz HTTP/1.0\r\n")
        assert _closed_within(trickler, 5.0, trickle=True)
    finally:
        trickler.close()
        server.stop()


def test_connections_beyond_the_limit_are_closed_and_the_rest_served(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(http, "MAX_CONNECTIONS", 2)
    server = _serve()
    silent = [socket.create_connection(("127.0.0.1", server.port), timeout=5) for _ in range(2)]
    try:
        extra = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        with extra:
            assert _closed_within(extra, 5.0)
        silent.pop().close()
        deadline = time.monotonic() + 5
        while True:  # the closed one's thread ends once its handler reads the end of stream
            answer = _exchange(server.port, b"GET /healthz HTTP/1.0\r\n\r\n")
            if answer or time.monotonic() > deadline:
                break
        assert answer.startswith(b"HTTP/1.0 200")
    finally:
        for conn in silent:
            conn.close()
        server.stop()


def test_a_peer_that_hangs_up_early_leaves_no_traceback(capfd: pytest.CaptureFixture[str]
                                                        ) -> None:
    # A probe that gave up (the compose healthcheck's 2 s timeout) is not our failure: it
    # printed socketserver's traceback on stderr, outside the JSON logs.
    hung_up, answered = threading.Event(), threading.Event()

    def health() -> tuple[bool, dict[str, str]]:
        hung_up.wait(5)
        return True, {"status": "ok"}

    server = _serve(health)
    original = server._server.shutdown_request

    def observed(request: socket.socket) -> None:
        original(request)
        answered.set()
    server._server.shutdown_request = observed  # type: ignore[method-assign]
    try:
        conn = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        conn.sendall(b"GET /healthz HTTP/1.0\r\n\r\n")
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        conn.close()  # a reset, not a FIN
        hung_up.set()
        assert answered.wait(5)  # the handler met the reset and its connection was closed
    finally:
        server.stop()
    assert "Traceback" not in capfd.readouterr().err


def test_an_ipv6_address_is_served() -> None:
    try:
        socket.socket(socket.AF_INET6).close()
    except OSError:
        pytest.skip("no IPv6 on this machine")
    server = http.StatusServer("::1", 0, CollectorRegistry(), lambda: (True, {"status": "ok"}))
    server.start()
    try:
        with socket.create_connection(("::1", server.port), timeout=5) as conn:
            conn.sendall(b"GET /healthz HTTP/1.0\r\n\r\n")
            assert conn.recv(4096).startswith(b"HTTP/1.0 200")
    finally:
        server.stop()


def test_a_bind_failure_says_what_to_change() -> None:
    server = _serve()
    try:
        with pytest.raises(ConfigError, match="choose another metrics port"):
            http.StatusServer("127.0.0.1", server.port, CollectorRegistry(), lambda: (True, {}))
    finally:
        server.stop()
    with pytest.raises(ConfigError, match="give an address of this machine"):
        http.StatusServer("192.0.2.1", 0, CollectorRegistry(), lambda: (True, {}))  # TEST-NET


def test_a_privileged_port_refused_says_to_choose_another(monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    """A process without the right to bind a port below 1024 (a container run as another user
    than root) was told to give another address."""
    import errno

    def refused(self: Any) -> None:
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(http._Server, "server_bind", refused)
    with pytest.raises(ConfigError, match=r"127\.0\.0\.1:80: Permission denied \(choose a port "
                       r"from 1024 up, or give the process the right to bind this one "
                       r"\(CAP_NET_BIND_SERVICE\)\)"):
        http.StatusServer("127.0.0.1", 80, CollectorRegistry(), lambda: (True, {}))


def test_a_stop_closes_the_connections_still_open(monkeypatch: pytest.MonkeyPatch) -> None:
    """A connection open when the server stops (a probe that sent half its request) is closed
    by the stop. Before, the serving loop that cuts late connections had ended, so the
    connection and its handler thread stayed until the handler's own read timed out (for
    ever, against a peer that trickles its request a byte at a time)."""
    monkeypatch.setattr(http, "REQUEST_TIMEOUT_S", 60.0, raising=False)
    server = http.StatusServer("127.0.0.1", 0, CollectorRegistry(),
                               lambda: (True, {"status": "ok"}))
    server.start()
    half = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    try:
        half.sendall(b"GET /heal")
        wait_until(lambda: bool(server._server._open))  # (accepted, its handler reading)
        server.stop()
        assert half.recv(1024) == b""  # closed by the stop, well before the 60 s timeout
    finally:
        half.close()
        server.stop()
