"""Kafka's binary ``ConsumerProtocol`` encoding of subscriptions and assignments.

Kafka clients (Java, librdkafka, kafka-python, aiokafka, franz-go, ...) put these bytes in their
JoinGroup metadata and SyncGroup assignments. rcoord's own client writes msgpack by default
(``rcoord.protocol.consumer``); it reads and writes this encoding too so that one group can hold
members of both kinds (an rcoord member next to Kafka clients reaching the group through the
gateway). The core package does not depend on kio, so this is a small codec of its own, written
from Kafka's message schemas (``ConsumerProtocolSubscription.json`` and
``ConsumerProtocolAssignment.json``) and checked against kio's generated codec in the tests.

The layout: an int16 version, then the struct of that version (non-flexible: int16-length
strings, int32-length arrays and bytes, -1 for null).

* Subscription v0: ``topics [string]``, ``user_data bytes?``; v1 adds ``owned_partitions
  [topic string, partitions [int32]]`` (KIP-429); v2 adds ``generation_id int32`` (KIP-792);
  v3 adds ``rack_id string?`` (KIP-881).
* Assignment v0-v3: ``assigned_partitions [topic string, partitions [int32]]``, ``user_data
  bytes?`` (the versions share one layout).

Versions above 3 are read as version 3 and the rest of the bytes is ignored, which is how
Kafka's own ``ConsumerProtocol`` reads a newer member's metadata; negative versions are refused.

Kafka's sticky assignors also keep state in the Subscription's ``user_data``; the sticky
assignors (``rcoord.assignors``) read it with the two decoders at the end of this module:

* ``cooperative-sticky`` (``COOPERATIVE_STICKY_ASSIGNOR_USER_DATA_V0``): ``generation int32``,
  the generation of the member's last assignment. Subscriptions below v2 have no
  ``generation_id`` field, so this is where such a member's generation is.
* ``sticky`` (``STICKY_ASSIGNOR_USER_DATA_V1``): ``previous_assignment [topic string,
  partitions [int32]]``, ``generation int32``; V0 has no generation. An eager member revokes
  everything before it rejoins, so its ``owned_partitions`` is empty and this is the only record
  of what it held.

``decode_subscription`` leaves ``user_data`` opaque: what it holds depends on the assignor.

Functions here work on plain values; ``rcoord.protocol.consumer`` builds its dataclasses from
them. Every decoding failure is a ``ValueError`` whose message says what is wrong and where.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = [
    "HIGHEST_VERSION",
    "KafkaAssignment",
    "KafkaSubscription",
    "decode_assignment",
    "decode_cooperative_sticky_user_data",
    "decode_sticky_user_data",
    "decode_subscription",
    "encode_assignment",
    "encode_sticky_user_data",
    "encode_subscription",
]

HIGHEST_VERSION = 3
"""The highest Subscription and Assignment version this codec knows (Kafka 3.5+)."""

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")


@dataclass(frozen=True)
class KafkaSubscription:
    """The fields of a decoded Subscription, with ``version`` as sent (before capping)."""

    version: int
    topics: list[str]
    user_data: bytes
    owned_partitions: list[tuple[str, int]]
    generation_id: int
    rack: str | None


@dataclass(frozen=True)
class KafkaAssignment:
    version: int
    partitions: list[tuple[str, int]]
    user_data: bytes


# -- writing ----------------------------------------------------------------------------------


def _string(value: str) -> bytes:
    raw = value.encode()
    if len(raw) > 0x7FFF:
        raise ValueError(f"a string of {len(raw)} bytes does not fit Kafka's int16 length")
    return _I16.pack(len(raw)) + raw


def _topic_partitions(tps: Iterable[tuple[str, int]]) -> bytes:
    grouped: dict[str, list[int]] = {}
    for topic, partition in tps:
        grouped.setdefault(topic, []).append(partition)
    out = [_I32.pack(len(grouped))]
    for topic, partitions in grouped.items():
        out.append(_string(topic))
        out.append(_I32.pack(len(partitions)))
        out.extend(_I32.pack(p) for p in partitions)
    return b"".join(out)


def _check_version(version: int) -> None:
    if not 0 <= version <= HIGHEST_VERSION:
        raise ValueError(f"version must be in [0, {HIGHEST_VERSION}], got {version}")


def encode_subscription(
    topics: Sequence[str],
    user_data: bytes = b"",
    owned_partitions: Iterable[tuple[str, int]] = (),
    generation_id: int = -1,
    rack: str | None = None,
    version: int = HIGHEST_VERSION,
) -> bytes:
    """Subscription bytes at ``version``; fields that version lacks are left out.

    Empty ``user_data`` is written as null, as Kafka's clients do when an assignor has none.
    """
    _check_version(version)
    out = [_I16.pack(version), _I32.pack(len(topics))]
    out.extend(_string(t) for t in topics)
    out.append(_I32.pack(len(user_data)) + user_data if user_data else _I32.pack(-1))
    if version >= 1:
        out.append(_topic_partitions(owned_partitions))
    if version >= 2:
        out.append(_I32.pack(generation_id))
    if version >= 3:
        out.append(_I16.pack(-1) if rack is None else _string(rack))
    return b"".join(out)


def encode_assignment(
    partitions: Iterable[tuple[str, int]], user_data: bytes = b"", version: int = HIGHEST_VERSION
) -> bytes:
    """Assignment bytes at ``version`` (every version has the same layout)."""
    _check_version(version)
    body = _topic_partitions(partitions)
    tail = _I32.pack(len(user_data)) + user_data if user_data else _I32.pack(-1)
    return _I16.pack(version) + body + tail


# -- reading ----------------------------------------------------------------------------------


class _Reader:
    """Bounds-checked reads over untrusted bytes; every failure names the field being read."""

    def __init__(self, data: bytes, kind: str) -> None:
        self.data = data
        self.pos = 0
        self.kind = kind

    def _take(self, n: int, what: str) -> bytes:
        end = self.pos + n
        if n < 0 or end > len(self.data):
            raise ValueError(
                f"{self.kind} is truncated: {what} needs {n} bytes at offset {self.pos}, "
                f"{len(self.data) - self.pos} left"
            )
        chunk = self.data[self.pos:end]
        self.pos = end
        return chunk

    def i16(self, what: str) -> int:
        value: int = _I16.unpack(self._take(2, what))[0]
        return value

    def i32(self, what: str) -> int:
        value: int = _I32.unpack(self._take(4, what))[0]
        return value

    def string(self, what: str, nullable: bool = False) -> str | None:
        n = self.i16(what)
        if n == -1 and nullable:
            return None
        if n < 0:
            raise ValueError(f"{self.kind} {what} has length {n}")
        try:
            return self._take(n, what).decode()
        except UnicodeDecodeError as exc:
            raise ValueError(f"{self.kind} {what} is not UTF-8 ({exc})") from None

    def topic(self, what: str) -> str:
        name = self.string(what)
        if not name:
            raise ValueError(f"{self.kind} {what} is empty")
        return name

    def nullable_bytes(self, what: str) -> bytes:
        n = self.i32(what)
        return b"" if n < 0 else self._take(n, what)  # any negative length is null, as Kafka reads

    def count(self, what: str) -> int:
        n = self.i32(f"{what} count")
        # Each element takes at least 2 bytes, so a count the rest cannot hold is a lie; this
        # stops a forged count from allocating before the reads fail.
        if n < 0 or 2 * n > len(self.data) - self.pos:
            raise ValueError(f"{self.kind} {what} count {n} does not fit the bytes left")
        return n

    def topic_partitions(self, what: str) -> list[tuple[str, int]]:
        out: list[tuple[str, int]] = []
        for _ in range(self.count(what)):
            topic = self.topic(f"{what} topic")
            for _ in range(self.count(f"{what} partitions of {topic!r}")):
                partition = self.i32(f"{what} partition")
                if partition < 0:
                    raise ValueError(f"{self.kind} {what} of {topic!r} has partition {partition}")
                out.append((topic, partition))
        return out


def _version(r: _Reader) -> int:
    version = r.i16("version")
    if version < 0:
        raise ValueError(f"{r.kind} version must be >= 0, got {version}")
    return version


def decode_subscription(data: bytes) -> KafkaSubscription:
    """Decode a Subscription of any version >= 0 (above 3: read as 3, the rest ignored)."""
    r = _Reader(bytes(data), "Kafka subscription")
    version = _version(r)
    read_as = min(version, HIGHEST_VERSION)
    topics = [r.topic("topic") for _ in range(r.count("topics"))]
    user_data = r.nullable_bytes("user_data")
    owned = r.topic_partitions("owned_partitions") if read_as >= 1 else []
    # Any negative generation is none (Kafka's Subscription: ``generationId < 0`` is empty).
    generation_id = max(r.i32("generation_id"), -1) if read_as >= 2 else -1
    rack = r.string("rack_id", nullable=True) if read_as >= 3 else None
    return KafkaSubscription(version, topics, user_data, owned, generation_id, rack)


def decode_assignment(data: bytes) -> KafkaAssignment:
    """Decode an Assignment of any version >= 0 (all share the v0 layout)."""
    r = _Reader(bytes(data), "Kafka assignment")
    version = _version(r)
    partitions = r.topic_partitions("assigned_partitions")
    user_data = r.nullable_bytes("user_data")
    return KafkaAssignment(version, partitions, user_data)


# -- the sticky assignors' user_data ----------------------------------------------------------


def decode_cooperative_sticky_user_data(data: bytes) -> int:
    """The generation in cooperative-sticky's user_data (an int32; any bytes after it ignored).

    Raises ``ValueError`` when fewer than 4 bytes are given.
    """
    return _Reader(bytes(data), "cooperative-sticky user_data").i32("generation")


def encode_sticky_user_data(partitions: Iterable[tuple[str, int]], generation: int) -> bytes:
    """The (eager) sticky assignor's user_data, V1: the member's last assignment and the
    generation it came in (Kafka's ``StickyAssignor.subscriptionUserData``)."""
    return _topic_partitions(sorted(partitions)) + _I32.pack(generation)


def decode_sticky_user_data(data: bytes) -> tuple[list[tuple[str, int]], int | None]:
    """The previous assignment and generation in the (eager) sticky assignor's user_data.

    Read as V1 (``previous_assignment``, ``generation``); when fewer than 4 bytes follow the
    assignment it is V0 and the generation is None. Bytes after that are ignored, as Kafka's
    schema reader does. Entries that cannot name a real partition (an empty topic, a negative
    partition) are left out. Raises ``ValueError`` when the assignment itself does not decode.
    """
    r = _Reader(bytes(data), "sticky user_data")
    out: list[tuple[str, int]] = []
    for _ in range(r.count("previous_assignment")):
        topic = r.string("previous_assignment topic") or ""
        for _ in range(r.count(f"previous_assignment partitions of {topic!r}")):
            partition = r.i32("previous_assignment partition")
            if topic and partition >= 0:
                out.append((topic, partition))
    generation = r.i32("generation") if len(r.data) - r.pos >= 4 else None
    return out, generation
