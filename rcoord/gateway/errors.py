"""How a handler reports a request-wide failure (one Kafka error code for the whole response)."""

from __future__ import annotations

__all__ = ["RequestError"]


class RequestError(Exception):
    """Answer the request with ``code`` in its top-level error field (or close, if none)."""

    def __init__(self, code: int, message: str = "") -> None:
        super().__init__(message or f"error code {code}")
        self.code = int(code)
