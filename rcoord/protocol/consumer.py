"""The "consumer" protocol: what members put in JoinGroup metadata and SyncGroup assignments.

This is rcoord's analogue of Kafka's ``ConsumerProtocol``. The coordinator treats metadata and
assignments as opaque bytes; only members (and the leader's assignor) read them. Kafka encodes
them with its own versioned schema; rcoord uses a msgpack map instead, for the same reasons Kafka
versions its schema:

* **Forward compatible.** Every payload is a map with a ``version`` field. A decoder reads the
  fields it knows and ignores the rest, and accepts any version >= 0 as long as the base fields
  (``topics`` for a subscription, ``partitions`` for an assignment) are there. So a member running
  newer code can join a group led by older code, which is exactly the situation during a rolling
  upgrade.
* **Deterministic.** ``encode()`` of equal values gives equal bytes (fixed key order, sorted
  topics and partitions). That matters because the coordinator compares metadata byte for byte:
  a member that rejoins a Stable group with *the same* metadata gets the current generation back,
  while different bytes start a rebalance.

Optional fields at their default value are left out of the encoding, which keeps the common
payload small and means older encoders' output is simply "a newer field at its default".

**Two encodings.** ``decode()`` also reads Kafka's own binary ``ConsumerProtocol``
(``rcoord.protocol.kafka_consumer``), and ``encode(encoding="kafka")`` writes it, so an rcoord
member and Kafka clients (through the gateway) can share one group: the leader of either kind
reads every member's subscription, and an rcoord leader answers each member in the encoding its
subscription came in (``metadata_encoding``). The two cannot be confused: Kafka's bytes open
with an int16 version (a 0x00 byte for versions 0-255), msgpack maps with 0x80-0x8f, 0xde or
0xdf. msgpack stays the default for rcoord-only groups: it is the format the rest of rcoord's
tools read, and it is forward compatible without a version table.

Decoding untrusted bytes never raises anything but ``MalformedMetadataError`` (a subclass of
``InvalidRequestError``), whose message names what is wrong. Constructing a value with the wrong
Python types raises ``TypeError`` (a programming error); impossible values (an empty topic, a
negative partition) raise ``InvalidRequestError``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import msgpack

from ..errors import InvalidRequestError
from . import kafka_consumer
from .offsets import TopicPartition

__all__ = [
    "ENCODINGS",
    "PROTOCOL_TYPE",
    "VERSION",
    "ConsumerProtocolAssignment",
    "ConsumerProtocolSubscription",
    "Encoding",
    "MalformedMetadataError",
    "metadata_encoding",
    "subscribed_topics",
]

PROTOCOL_TYPE = "consumer"
"""The ``protocol_type`` consumers send in JoinGroup (Kafka uses the same string)."""

VERSION = 0
"""The version this code writes. It reads every version >= 0 (unknown fields are ignored)."""

Encoding = Literal["msgpack", "kafka"]
"""rcoord's msgpack maps, or Kafka's binary ConsumerProtocol."""

ENCODINGS: tuple[Encoding, ...] = ("msgpack", "kafka")

_INT32_MAX = 2**31 - 1
"""Kafka's partition numbers and generation ids are int32; larger values cannot be real."""


class MalformedMetadataError(InvalidRequestError):
    """Consumer protocol bytes that do not decode: not msgpack, not a map, or a bad base field.

    A subclass of ``InvalidRequestError`` because no version of the protocol could accept the
    payload; the message says which part is wrong so the sender can be found and fixed.
    """


# -- construction checks (programming errors and impossible values) ---------------------------


def _topic(value: Any, what: str = "topic") -> str:
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, got {type(value).__name__}")
    if not value:
        raise InvalidRequestError(f"{what} must not be empty")
    return value


def _int(name: str, value: Any, low: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if not low <= value <= _INT32_MAX:
        raise InvalidRequestError(f"{name} must be in [{low}, {_INT32_MAX}], got {value}")
    return value


def _bytes(name: str, value: Any) -> bytes:
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise TypeError(f"{name} must be bytes, got {type(value).__name__}")
    return bytes(value)


def _iterable(name: str, value: Any) -> Iterable[Any]:
    # A bare str would silently become its characters ("orders" -> o, r, d, ...).
    if isinstance(value, (str, bytes, bytearray)) or not isinstance(value, Iterable):
        raise TypeError(f"{name} must be an iterable of values, not {type(value).__name__}")
    return value


def _topic_partitions(name: str, values: Any) -> tuple[TopicPartition, ...]:
    """Sorted, deduplicated: partition lists are sets, and sorting keeps encode() deterministic."""
    out: set[TopicPartition] = set()
    for tp in _iterable(name, values):
        if not isinstance(tp, tuple) or len(tp) != 2:
            raise TypeError(f"{name} must hold TopicPartition(topic, partition) values, got {tp!r}")
        out.add(TopicPartition(_topic(tp[0]), _int("partition", tp[1], 0)))
    return tuple(sorted(out))


def _group_by_topic(tps: Iterable[TopicPartition]) -> dict[str, list[int]]:
    """``{topic: [partitions]}``, Kafka's wire shape (each topic name is written once)."""
    grouped: dict[str, list[int]] = {}
    for tp in tps:  # already sorted, so topics and partitions come out in order
        grouped.setdefault(tp.topic, []).append(tp.partition)
    return grouped


# -- decoding (untrusted bytes -> MalformedMetadataError) -------------------------------------


def _unpack_map(data: Any, kind: str) -> dict[str, Any]:
    """The payload's top-level map, with its version checked (any version >= 0 is accepted)."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"{kind} data must be bytes, got {type(data).__name__}")
    try:
        # raw=False: msgpack str -> str (invalid UTF-8 fails here). strict_map_key=False so that
        # a newer version's unknown fields may use int keys; the fields read here check their
        # own key types. Any failure of the unpacker, whatever its class, means "not msgpack".
        obj = msgpack.unpackb(bytes(data), raw=False, strict_map_key=False)
    except Exception as exc:
        detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        raise MalformedMetadataError(f"{kind} is not valid msgpack ({detail})") from exc
    if not isinstance(obj, dict):
        raise MalformedMetadataError(f"{kind} is not a msgpack map (got {type(obj).__name__})")
    if "version" not in obj:
        raise MalformedMetadataError(f"{kind} is missing 'version'")
    version = obj["version"]
    if not isinstance(version, int) or isinstance(version, bool):
        raise MalformedMetadataError(
            f"{kind} 'version' must be an int, got {type(version).__name__}"
        )
    if version < 0:
        raise MalformedMetadataError(f"{kind} 'version' must be >= 0, got {version}")
    return obj


def _field_topic(kind: str, field: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise MalformedMetadataError(
            f"{kind} '{field}' must hold non-empty topic strings, got {value!r}"
        )
    return value


def _field_int(kind: str, field: str, value: Any, low: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= _INT32_MAX:
        raise MalformedMetadataError(
            f"{kind} '{field}' must hold ints in [{low}, {_INT32_MAX}], got {value!r}"
        )
    return value


def _field_bytes(kind: str, obj: Mapping[str, Any], field: str) -> bytes:
    value = obj.get(field, b"")
    if not isinstance(value, bytes):
        raise MalformedMetadataError(
            f"{kind} '{field}' must be msgpack bin, got {type(value).__name__}"
        )
    return value


def _field_partitions(kind: str, obj: Mapping[str, Any], field: str) -> list[TopicPartition]:
    value = obj.get(field, {})
    if not isinstance(value, dict):
        raise MalformedMetadataError(
            f"{kind} '{field}' must be a map of topic -> [partition], got {type(value).__name__}"
        )
    out: list[TopicPartition] = []
    for topic, partitions in value.items():
        topic = _field_topic(kind, field, topic)
        if not isinstance(partitions, list):
            raise MalformedMetadataError(
                f"{kind} '{field}' partitions of {topic!r} must be a list, "
                f"got {type(partitions).__name__}"
            )
        out.extend(TopicPartition(topic, _field_int(kind, field, p, 0)) for p in partitions)
    return out


def metadata_encoding(data: bytes) -> tuple[Encoding, int]:
    """Which encoding ``data`` is in, and its version: ("kafka", v) or ("msgpack", VERSION).

    Only the first byte is looked at (see the module docstring); whether the rest decodes is
    ``decode()``'s business. Empty or one-byte data counts as msgpack (and fails there).
    """
    if len(data) >= 2 and data[0] == 0:
        return "kafka", int.from_bytes(bytes(data[:2]), "big")
    return "msgpack", VERSION


def _check_encoding(encoding: Any) -> Encoding:
    if encoding not in ENCODINGS:
        raise ValueError(f"encoding must be one of {ENCODINGS}, got {encoding!r}")
    e: Encoding = encoding
    return e


def _pack(obj: dict[str, Any]) -> bytes:
    packed: bytes = msgpack.packb(obj, use_bin_type=True)
    return packed


# -- the two payloads -------------------------------------------------------------------------


@dataclass(frozen=True, init=False)
class ConsumerProtocolSubscription:
    """JoinGroup metadata of a consumer: what it wants, and what it holds (for sticky assignors).

    ``topics`` is stored sorted and deduplicated because a subscription is a set: two members with
    the same topics in a different order must encode to the same bytes (see the module docstring).
    ``owned_partitions`` and ``generation_id`` are the partitions the member held and the
    generation it held them in (Kafka's KIP-429 fields); ``rack`` is its ``client.rack``
    (KIP-881). ``user_data`` is opaque to rcoord and passed to custom assignors.
    """

    topics: tuple[str, ...]
    user_data: bytes
    owned_partitions: tuple[TopicPartition, ...]
    generation_id: int
    rack: str | None

    def __init__(
        self,
        topics: Iterable[str],
        user_data: bytes = b"",
        owned_partitions: Iterable[tuple[str, int]] = (),
        generation_id: int = -1,
        rack: str | None = None,
    ) -> None:
        norm_topics = tuple(sorted({_topic(t) for t in _iterable("topics", topics)}))
        if rack is not None and not isinstance(rack, str):
            raise TypeError(f"rack must be a str or None, got {type(rack).__name__}")
        object.__setattr__(self, "topics", norm_topics)
        object.__setattr__(self, "user_data", _bytes("user_data", user_data))
        object.__setattr__(
            self, "owned_partitions", _topic_partitions("owned_partitions", owned_partitions)
        )
        object.__setattr__(self, "generation_id", _int("generation_id", generation_id, -1))
        object.__setattr__(self, "rack", rack)

    def encode(self, encoding: Encoding = "msgpack") -> bytes:
        """Deterministic bytes: msgpack with fields at their defaults omitted, or Kafka's
        Subscription v3 (``encoding="kafka"``)."""
        if _check_encoding(encoding) == "kafka":
            return kafka_consumer.encode_subscription(
                self.topics, self.user_data, self.owned_partitions, self.generation_id, self.rack
            )
        obj: dict[str, Any] = {"version": VERSION, "topics": list(self.topics)}
        if self.user_data:
            obj["user_data"] = self.user_data
        if self.owned_partitions:
            obj["owned_partitions"] = _group_by_topic(self.owned_partitions)
        if self.generation_id != -1:
            obj["generation_id"] = self.generation_id
        if self.rack is not None:
            obj["rack"] = self.rack
        return _pack(obj)

    @classmethod
    def decode(cls, data: bytes) -> ConsumerProtocolSubscription:
        """Decode either encoding, any version >= 0, ignoring unknown fields; bad bytes raise
        MalformedMetadataError."""
        kind = "subscription"
        if metadata_encoding(data)[0] == "kafka":
            try:
                k = kafka_consumer.decode_subscription(data)
            except ValueError as exc:
                raise MalformedMetadataError(str(exc)) from exc
            return cls(k.topics, k.user_data, k.owned_partitions, k.generation_id, k.rack)
        obj = _unpack_map(data, kind)
        if "topics" not in obj:
            raise MalformedMetadataError(f"{kind} is missing 'topics'")
        topics = obj["topics"]
        if not isinstance(topics, list):
            raise MalformedMetadataError(
                f"{kind} 'topics' must be a list, got {type(topics).__name__}"
            )
        rack = obj.get("rack")
        if rack is not None and not isinstance(rack, str):
            raise MalformedMetadataError(
                f"{kind} 'rack' must be a str or nil, got {type(rack).__name__}"
            )
        return cls(
            topics=[_field_topic(kind, "topics", t) for t in topics],
            user_data=_field_bytes(kind, obj, "user_data"),
            owned_partitions=_field_partitions(kind, obj, "owned_partitions"),
            generation_id=_field_int(kind, "generation_id", obj.get("generation_id", -1), -1),
            rack=rack,
        )


@dataclass(frozen=True, init=False)
class ConsumerProtocolAssignment:
    """SyncGroup assignment of a consumer: the partitions it owns in the new generation.

    ``partitions`` is stored sorted and deduplicated: an assignment is a set, and a canonical
    order gives deterministic bytes. ``user_data`` is opaque (assignor-specific state).
    """

    partitions: tuple[TopicPartition, ...]
    user_data: bytes

    def __init__(self, partitions: Iterable[tuple[str, int]], user_data: bytes = b"") -> None:
        object.__setattr__(self, "partitions", _topic_partitions("partitions", partitions))
        object.__setattr__(self, "user_data", _bytes("user_data", user_data))

    def encode(
        self, encoding: Encoding = "msgpack", version: int = kafka_consumer.HIGHEST_VERSION
    ) -> bytes:
        """Deterministic bytes: msgpack with empty ``user_data`` omitted, or Kafka's Assignment
        at ``version`` (``encoding="kafka"``; the version only matters to that encoding)."""
        if _check_encoding(encoding) == "kafka":
            return kafka_consumer.encode_assignment(self.partitions, self.user_data, version)
        obj: dict[str, Any] = {
            "version": VERSION,
            "partitions": _group_by_topic(self.partitions),
        }
        if self.user_data:
            obj["user_data"] = self.user_data
        return _pack(obj)

    @classmethod
    def decode(cls, data: bytes) -> ConsumerProtocolAssignment:
        """Decode either encoding, any version >= 0, ignoring unknown fields; bad bytes raise
        MalformedMetadataError."""
        kind = "assignment"
        if metadata_encoding(data)[0] == "kafka":
            try:
                k = kafka_consumer.decode_assignment(data)
            except ValueError as exc:
                raise MalformedMetadataError(str(exc)) from exc
            return cls(k.partitions, k.user_data)
        obj = _unpack_map(data, kind)
        if "partitions" not in obj:
            raise MalformedMetadataError(f"{kind} is missing 'partitions'")
        return cls(
            partitions=_field_partitions(kind, obj, "partitions"),
            user_data=_field_bytes(kind, obj, "user_data"),
        )


def subscribed_topics(metadata: bytes) -> frozenset[str] | None:
    """The topics a member's JoinGroup metadata subscribes to, or None if it does not decode.

    None rather than an exception because the caller (the coordinator, deciding whether a group
    is subscribed to a topic) must not fail on one member's bad metadata. Kafka treats such a
    member as subscribed to every topic, so a topic is never wrongly considered unused.
    """
    try:
        return frozenset(ConsumerProtocolSubscription.decode(metadata).topics)
    except MalformedMetadataError:
        return None
