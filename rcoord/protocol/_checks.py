"""Argument checks shared by the protocol steps (both coordinators call them).

Type errors are programming errors (TypeError). Values Kafka answers with an error code are left
to the step, which returns that code. Values no coordinator could accept (too large, outside the
wire type's range, not encodable as UTF-8) raise InvalidRequestError, with the limit in the
message. Every limit is listed in docs/architecture.md, "Limits".

Why bounds at all: every step is one Lua script, and Redis runs nothing else while a script
runs. A request's cost must therefore be bounded by the request itself: one OffsetCommit of a
million partitions held a whole shard for 4 s. Kafka's own bound is the request size
(``socket.request.max.bytes``); rcoord bounds the item count and the bytes of each call.
"""

from __future__ import annotations

from typing import Any

from ..errors import InvalidRequestError

MAX_ID_BYTES = 1024
"""Longest group id, group instance id, member id, client id, client host, protocol type or
protocol name (UTF-8 bytes); Kafka has no fixed limit. Generated member ids stay within it too."""
MAX_METADATA_BYTES = 1 << 20
"""Largest protocol metadata or member assignment (1 MiB); Kafka's message.max.bytes is similar."""
MAX_PROTOCOLS = 64
"""Most protocols one member may offer."""
MAX_MEMBER_METADATA_BYTES = 1 << 20
"""Largest total of one JoinGroup's protocols (names plus metadata, 1 MiB). The group stores
them per member and sends them all to the leader, so this, not the per-protocol limit, is what
one member may cost."""
MAX_ITEMS_PER_CALL = 10_000
"""Most items in one call's list: partitions of a commit, fetch or offset delete, members of a
leave, assignments of a sync, states of a list filter. A 10,000-partition commit runs in about
40 ms of server time."""
MAX_REQUEST_BYTES = 16 << 20
"""Largest total of one SyncGroup's assignments, or of one OffsetCommit's topics and metadata."""

INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


def utf8(name: str, value: str) -> bytes:
    """``value`` as UTF-8; a lone surrogate (which Redis could not be sent) is a bad request."""
    try:
        return value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidRequestError(
            f"{name} is not valid Unicode text ({exc.reason} at index {exc.start})"
        ) from None


def require_str(name: str, value: Any) -> str:
    """A str that can be sent to Redis (valid UTF-8)."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, got {type(value).__name__}")
    utf8(name, value)
    return value


def require_int(name: str, value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    return value


def require_int32(name: str, value: Any) -> int:
    """An int that fits Kafka's INT32 field (generation ids, timeouts, partitions)."""
    number = require_int(name, value)
    if not INT32_MIN <= number <= INT32_MAX:
        raise InvalidRequestError(f"{name} {number} is outside int32 [{INT32_MIN}, {INT32_MAX}]")
    return number


def require_int64(name: str, value: Any) -> int:
    """An int that fits Kafka's INT64 field (offsets, retention)."""
    number = require_int(name, value)
    if not INT64_MIN <= number <= INT64_MAX:
        raise InvalidRequestError(f"{name} {number} is outside int64 [{INT64_MIN}, {INT64_MAX}]")
    return number


def require_bytes(name: str, value: Any) -> bytes:
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise TypeError(f"{name} must be bytes, got {type(value).__name__}")
    data = bytes(value)
    if len(data) > MAX_METADATA_BYTES:
        raise InvalidRequestError(f"{name} is {len(data)} bytes; the limit is {MAX_METADATA_BYTES}")
    return data


def check_id(name: str, value: Any) -> str:
    """A group id, member id, client id or similar name: valid UTF-8, at most MAX_ID_BYTES."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, got {type(value).__name__}")
    if len(utf8(name, value)) > MAX_ID_BYTES:
        raise InvalidRequestError(f"{name} is longer than {MAX_ID_BYTES} bytes")
    return value


NO_MEMBER_ID = "-" * (MAX_ID_BYTES + 1)
"""Sent for a member id past MAX_ID_BYTES (``member_ref``): no member's (generated ids stay
within the bound), so a script answers it as it answers any id the group does not know,
without carrying an unbounded id to Redis."""


def member_ref(value: Any) -> str:
    """A member id that a request names (to heartbeat, sync, commit, rejoin or leave as), not
    one to store: valid UTF-8 of any length. Kafka has no bound on it and answers an id no
    member has UNKNOWN_MEMBER_ID (or FENCED_INSTANCE_ID beside another member's instance id)
    in the order its checks run; past MAX_ID_BYTES it cannot be a member's, so
    ``NO_MEMBER_ID`` stands for it. (Refused INVALID_REQUEST before: through the gateway a
    Kafka client sending such an id got an error its client treats as fatal.)"""
    text = require_str("member_id", value)
    return text if len(text.encode("utf-8")) <= MAX_ID_BYTES else NO_MEMBER_ID


def check_count(name: str, items: Any, limit: int = MAX_ITEMS_PER_CALL) -> None:
    """Refuse a call's list before looking at its items, so a huge list costs nothing."""
    if len(items) > limit:
        raise InvalidRequestError(f"{name} has {len(items)} items; at most {limit} per call")


def check_total(name: str, total: int, limit: int) -> None:
    if total > limit:
        raise InvalidRequestError(f"{name} total {total} bytes; the limit is {limit}")


def check_instance_id(value: Any) -> str:
    """'' for a dynamic member (None); otherwise any non-empty id within ``MAX_ID_BYTES``.

    This is the broker's rule, not the client's: Kafka's group coordinator takes any string as
    a group.instance.id, and only the Java client's configs check it against the topic-name
    charset (JoinGroupRequest.validateGroupInstanceId). librdkafka, kafka-python or franz-go
    members send ids such as ``host:1`` or ``pod/3``, which Kafka's broker takes; the worker's
    own config keeps the Java client's rule (rcoord/client/config.py). The empty string, which
    the coordinator's scripts read as "no instance id", is refused rather than made dynamic."""
    if value is None:
        return ""
    text = check_id("group_instance_id", value)
    if not text:
        raise InvalidRequestError(
            "group_instance_id is empty: send null (None) for a dynamic member")
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
