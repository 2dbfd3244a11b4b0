"""How a handler reports a request-wide failure (one Kafka error code for the whole response),
and the Kafka error codes only the gateway answers with (``rcoord.errors.Errors`` holds the
ones rcoord's own API uses; these are Kafka's numbers, ``org.apache.kafka.common.protocol``)."""

from __future__ import annotations

__all__ = [
    "CORRUPT_MESSAGE",
    "DUPLICATE_SEQUENCE_NUMBER",
    "INVALID_PRODUCER_EPOCH",
    "INVALID_REPLICATION_FACTOR",
    "UNSUPPORTED_COMPRESSION_TYPE",
    "RequestError",
]

CORRUPT_MESSAGE = 2
INVALID_REPLICATION_FACTOR = 38
DUPLICATE_SEQUENCE_NUMBER = 46
INVALID_PRODUCER_EPOCH = 47
UNSUPPORTED_COMPRESSION_TYPE = 76


class RequestError(Exception):
    """Answer the request with ``code`` in its top-level error field (or close, if none)."""

    def __init__(self, code: int, message: str = "") -> None:
        super().__init__(message or f"error code {code}")
        self.code = int(code)
