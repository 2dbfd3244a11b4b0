"""A peer that sends requests and never reads the answers: the gateway stops reading it after
a bounded number of answers (Kafka's ``socket.send.buffer.bytes``, the gateway's
``--socket-send-buffer-bytes``), so the idle sweep closes it soon after, however loaded the
machine."""

from __future__ import annotations

import socket
from typing import Any

import pytest

pytest.importorskip("kio")

from gateway_harness import running_gateway
from harness import WAIT_S, wait_until

from rcoord.gateway import server
from rcoord.gateway.state import GatewayConfig

SENT = 20_000
"""Pipelined requests: more than the ~10,000 answers a send buffer grown to Linux's default
maximum (4 MiB) takes."""


def _api_versions_v4() -> bytes:
    """ApiVersions at a version the gateway does not serve: answered at v0 with the table
    (about 400 bytes for 14)."""
    body = (18).to_bytes(2, "big") + (4).to_bytes(2, "big") + (1).to_bytes(4, "big") + \
        b"\xff\xff"
    return len(body).to_bytes(4, "big") + body


def test_a_peer_that_never_reads_gets_a_bounded_number_of_answers(redis_server, namespace,
                                                                  monkeypatch):
    # Before: the client socket's send buffer grew to 4 MiB, so the gateway read and answered
    # about 10,000 of these before its writes blocked; at ~1 ms each on a loaded machine, the
    # connection stayed busy, out of the idle sweep's reach, for longer than the 15 s that
    # tests/test_gateway_robustness.py's never-reading peer waits for it to close.
    answered = 0
    handle_frame = server.handle_frame

    async def counted(*args: Any) -> bytes | None:
        nonlocal answered
        answered += 1
        return await handle_frame(*args)

    monkeypatch.setattr(server, "handle_frame", counted)
    with running_gateway(redis_server, namespace, connections_max_idle_ms=300) as gw:
        assert gw.gateway is not None
        sock = socket.socket()
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
            sock.connect(gw.address)
            sock.settimeout(WAIT_S)  # (280 KB: the kernel's buffers take it without a read)
            sock.sendall(_api_versions_v4() * SENT)
            wait_until(lambda: answered > 0)  # (accepted: its task is there to be waited for)
            wait_until(lambda: not gw.gateway._tasks and not gw.gateway._conns)
        finally:
            sock.close()
    # 100 KiB (Linux doubles it) and the transport's 64 KiB: about 900 answers here.
    assert answered <= 2000, answered  # (before: about 10,000)


def test_a_socket_send_buffer_of_zero_is_refused():
    with pytest.raises(ValueError, match="socket_send_buffer_bytes must be >= 1, or -1"):
        GatewayConfig(socket_send_buffer_bytes=0).validate()
    assert GatewayConfig(socket_send_buffer_bytes=-1).validate().socket_send_buffer_bytes == -1
