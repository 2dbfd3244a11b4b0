"""Kafka's framing: every request and response is a 4-byte big-endian size, then that many bytes.

A frame that cannot be read whole (the peer closed midway) or that announces more than the
gateway accepts ends that connection only: ``FrameError`` says why, the server logs it and
closes the socket, and every other connection carries on (as Kafka's ``NetworkReceive`` does
with ``socket.request.max.bytes``).
"""

from __future__ import annotations

import asyncio

__all__ = ["DEFAULT_MAX_FRAME_BYTES", "PRE_AUTH_MAX_FRAME_BYTES", "FrameError", "frame",
           "read_frame"]

DEFAULT_MAX_FRAME_BYTES = 100 * 1024 * 1024
"""Kafka's ``socket.request.max.bytes`` default (100 MiB)."""
PRE_AUTH_MAX_FRAME_BYTES = 512 * 1024
"""The limit until a connection has authenticated (with ``--auth-file``): Kafka's
``SaslServerAuthenticator`` caps requests at 512 KB then, so a peer that has not proved who it
is cannot make the gateway buffer ``DEFAULT_MAX_FRAME_BYTES`` per connection."""

_MIN_FRAME_BYTES = 8  # api key, api version, correlation id


class FrameError(Exception):
    """The byte stream is not a sequence of acceptable frames; the connection must close."""


async def read_frame(reader: asyncio.StreamReader, max_bytes: int,
                     raw_token: bool = False) -> bytes | None:
    """The next frame's body, or None at a clean end of stream (between frames). A request is
    at least a header; the raw SASL token after SaslHandshake v0 (``raw_token``) is the whole
    frame, and a valid PLAIN one can be shorter (``"\0bob\0pw"``: 7 bytes)."""
    min_bytes = 0 if raw_token else _MIN_FRAME_BYTES
    try:
        prefix = await reader.readexactly(4)
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            return None
        raise FrameError(f"truncated size prefix ({len(exc.partial)} of 4 bytes)") from None
    size = int.from_bytes(prefix, "big", signed=True)
    if size < min_bytes:
        raise FrameError(f"frame size {size} is below the {min_bytes} bytes of a header")
    if size > max_bytes:
        raise FrameError(f"frame size {size} exceeds the limit of {max_bytes} bytes")
    try:
        return await reader.readexactly(size)
    except asyncio.IncompleteReadError as exc:
        raise FrameError(f"truncated frame: {len(exc.partial)} of {size} bytes") from None


def frame(body: bytes) -> bytes:
    """``body`` with its size prefix."""
    return len(body).to_bytes(4, "big") + body
