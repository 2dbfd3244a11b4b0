"""Argument checks shared by the protocol steps.

Type errors are programming errors (TypeError). Values Kafka answers with an error code are left
to the step, which returns that code. Sizes no coordinator could accept raise
InvalidRequestError, with the limit in the message.
"""

from __future__ import annotations

import re
from typing import Any

from ..errors import InvalidRequestError

MAX_ID_BYTES = 1024
"""Longest group id, member id or client id accepted (UTF-8 bytes); Kafka has no fixed limit."""
MAX_METADATA_BYTES = 1 << 20
"""Largest protocol metadata or member assignment (1 MiB); Kafka's message.max.bytes is similar."""
MAX_PROTOCOLS = 64
"""Most protocols one member may offer."""

_INSTANCE_ID_RE = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")


def require_str(name: str, value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, got {type(value).__name__}")
    return value


def require_int(name: str, value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    return value


def require_bytes(name: str, value: Any) -> bytes:
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise TypeError(f"{name} must be bytes, got {type(value).__name__}")
    data = bytes(value)
    if len(data) > MAX_METADATA_BYTES:
        raise InvalidRequestError(f"{name} is {len(data)} bytes; the limit is {MAX_METADATA_BYTES}")
    return data


def check_id(name: str, value: Any) -> str:
    text = require_str(name, value)
    if len(text.encode("utf-8", "surrogatepass")) > MAX_ID_BYTES:
        raise InvalidRequestError(f"{name} is longer than {MAX_ID_BYTES} bytes")
    return text


def check_instance_id(value: Any) -> str:
    """'' for a dynamic member; otherwise Kafka's rule for group.instance.id (topic-name charset)."""
    if value is None:
        return ""
    text = require_str("group_instance_id", value)
    if not _INSTANCE_ID_RE.match(text) or text in (".", ".."):
        raise InvalidRequestError(
            f"group_instance_id {text!r} is invalid: use 1-249 characters of [a-zA-Z0-9._-], "
            "not '.' or '..'"
        )
    return text


def text(value: Any) -> str:
    """Decode a string field of a script reply (msgpack raw); False/None mean absent -> ''."""
    if value is None or value is False:
        return ""
    if isinstance(value, bytes):
        return value.decode("utf-8", "surrogateescape")
    return str(value)


def optional_text(value: Any) -> str | None:
    return text(value) or None
