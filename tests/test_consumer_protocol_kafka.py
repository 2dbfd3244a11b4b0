"""Kafka's binary ConsumerProtocol encoding (rcoord.protocol.kafka_consumer), checked against
kio's codec generated from Kafka's own schemas, and its place beside msgpack in
rcoord.protocol.consumer (pure logic, no Redis)."""

from __future__ import annotations

import importlib
import io
import struct
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_consumer_protocol import assignments, subscriptions

from rcoord.protocol import kafka_consumer
from rcoord.protocol.consumer import (
    ConsumerProtocolAssignment,
    ConsumerProtocolSubscription,
    MalformedMetadataError,
    metadata_encoding,
    subscribed_topics,
)
from rcoord.protocol.offsets import TopicPartition

kio_serial = pytest.importorskip("kio.serial")

TP = TopicPartition
VERSIONS = (0, 1, 2, 3)


def _kio(kind: str, version: int) -> Any:
    return importlib.import_module(f"kio.schema.consumer_protocol_{kind}.v{version}.data")


def _kio_decode(kind: str, data: bytes) -> Any:
    version = struct.unpack(">h", data[:2])[0]
    cls = getattr(_kio(kind, version), f"ConsumerProtocol{kind.title()}")
    value, used = kio_serial.entity_reader(cls)(memoryview(data), 2)
    assert used + 2 == len(data)
    return value


def _kio_encode(value: Any) -> bytes:
    buf = io.BytesIO()
    kio_serial.entity_writer(type(value))(buf, value)
    return struct.pack(">h", type(value).__version__) + buf.getvalue()


def _grouped(mod: Any, tps: tuple[TP, ...]) -> tuple[Any, ...]:
    out: dict[str, list[int]] = {}
    for tp in tps:
        out.setdefault(tp.topic, []).append(tp.partition)
    return tuple(mod.TopicPartition(topic=t, partitions=tuple(ps)) for t, ps in out.items())


def _flat(grouped: Any) -> list[TP]:
    return sorted(TP(g.topic, p) for g in grouped for p in g.partitions)


# -- against kio -------------------------------------------------------------------------------


@given(subscriptions)
def test_subscription_v3_reads_back_in_kio(sub: ConsumerProtocolSubscription) -> None:
    data = sub.encode("kafka")
    assert metadata_encoding(data) == ("kafka", 3)
    got = _kio_decode("subscription", data)
    assert got.topics == sub.topics
    assert (got.user_data or b"") == sub.user_data
    assert _flat(got.owned_partitions) == list(sub.owned_partitions)
    assert (got.generation_id, got.rack_id) == (sub.generation_id, sub.rack)
    assert ConsumerProtocolSubscription.decode(data) == sub


@pytest.mark.parametrize("version", VERSIONS)
@given(sub=subscriptions)
def test_kio_subscriptions_of_every_version_decode(version: int,
                                                   sub: ConsumerProtocolSubscription) -> None:
    mod = _kio("subscription", version)
    fields: dict[str, Any] = {"topics": sub.topics, "user_data": sub.user_data or None}
    if version >= 1:
        fields["owned_partitions"] = _grouped(mod, sub.owned_partitions)
    if version >= 2:
        fields["generation_id"] = sub.generation_id
    if version >= 3:
        fields["rack_id"] = sub.rack
    got = ConsumerProtocolSubscription.decode(_kio_encode(mod.ConsumerProtocolSubscription(
        **fields)))
    assert got.topics == sub.topics and got.user_data == sub.user_data
    assert got.owned_partitions == (sub.owned_partitions if version >= 1 else ())
    assert got.generation_id == (sub.generation_id if version >= 2 else -1)
    assert got.rack == (sub.rack if version >= 3 else None)


@pytest.mark.parametrize("version", VERSIONS)
@given(a=assignments)
def test_assignments_round_trip_with_kio(version: int, a: ConsumerProtocolAssignment) -> None:
    data = a.encode("kafka", version)
    assert metadata_encoding(data) == ("kafka", version)
    got = _kio_decode("assignment", data)
    assert _flat(got.assigned_partitions) == list(a.partitions)
    assert (got.user_data or b"") == a.user_data
    mod = _kio("assignment", version)
    theirs = _kio_encode(mod.ConsumerProtocolAssignment(
        assigned_partitions=_grouped(mod, a.partitions), user_data=a.user_data or None))
    assert ConsumerProtocolAssignment.decode(theirs) == a
    assert theirs == data  # the same bytes kio writes


# -- the two encodings side by side ------------------------------------------------------------


def test_msgpack_stays_the_default_and_both_decode() -> None:
    sub = ConsumerProtocolSubscription(["b", "a"], owned_partitions=[("a", 1)], generation_id=4)
    msg, kafka = sub.encode(), sub.encode("kafka")
    assert metadata_encoding(msg)[0] == "msgpack" and metadata_encoding(kafka)[0] == "kafka"
    assert ConsumerProtocolSubscription.decode(msg) == ConsumerProtocolSubscription.decode(kafka)
    assert subscribed_topics(kafka) == frozenset({"a", "b"})
    with pytest.raises(ValueError, match="encoding must be one of"):
        sub.encode("json")  # type: ignore[arg-type]


def test_a_newer_version_is_read_as_v3_and_the_rest_ignored() -> None:
    v3 = ConsumerProtocolSubscription(["t"], rack="r1", generation_id=2).encode("kafka")
    v9 = struct.pack(">h", 9) + v3[2:] + b"future fields"
    assert ConsumerProtocolSubscription.decode(v9) == ConsumerProtocolSubscription.decode(v3)
    # kafka-python's range assignor sends v0 with an empty (not null) user_data
    v0 = struct.pack(">hih1si", 0, 1, 1, b"t", 0)
    assert ConsumerProtocolSubscription.decode(v0) == ConsumerProtocolSubscription(["t"])


def test_negative_generations_and_user_data_lengths_read_as_none() -> None:
    # As Kafka reads them (Subscription's generationId < 0, a nullable bytes' negative length):
    # refusing them failed the whole group's rebalance at the leader.
    data = struct.pack(">hih1sii", 2, 1, 1, b"t", -5, 0) + struct.pack(">i", -7)
    assert ConsumerProtocolSubscription.decode(data) == ConsumerProtocolSubscription(["t"])


GOOD = ConsumerProtocolSubscription(["t"], owned_partitions=[("t", 0)]).encode("kafka")


@pytest.mark.parametrize("data, message", [
    (GOOD[:-3], "truncated"),
    (b"\x00", "not a msgpack map"),  # one byte: not Kafka's (which needs an int16)
    (struct.pack(">hi", 0, 1_000_000), "topics count 1000000 does not fit"),
    (struct.pack(">hi", 0, -1), "topics count -1"),
    (struct.pack(">hih", 0, 1, 0) + struct.pack(">i", -1), "topic is empty"),
    (struct.pack(">hih", 0, 1, 2) + b"\xff\xfe" + struct.pack(">i", -1), "not UTF-8"),
    (struct.pack(">hiiih1sii", 1, 0, -1, 1, 1, b"t", 1, -5), "partition -5"),
])
def test_bad_kafka_subscriptions_name_the_problem(data: bytes, message: str) -> None:
    with pytest.raises(MalformedMetadataError, match=message):
        ConsumerProtocolSubscription.decode(data)
    assert subscribed_topics(data) is None


def test_bad_kafka_assignment_is_malformed() -> None:
    data = ConsumerProtocolAssignment([("t", 1)]).encode("kafka")
    with pytest.raises(MalformedMetadataError, match="truncated"):
        ConsumerProtocolAssignment.decode(data[:-1])
    # A negative version starts with 0xff, which is msgpack's (a negative int) ...
    with pytest.raises(MalformedMetadataError, match="not valid msgpack"):
        ConsumerProtocolAssignment.decode(b"\xff\xff" + data[2:])
    # ... and the Kafka codec on its own refuses it.
    with pytest.raises(ValueError, match="version must be >= 0"):
        kafka_consumer.decode_assignment(b"\xff\xff" + data[2:])


@given(st.binary(max_size=64))
def test_arbitrary_bytes_starting_like_kafka_never_escape(tail: bytes) -> None:
    for data in (b"\x00\x00" + tail, b"\x00\x03" + tail):
        try:
            ConsumerProtocolSubscription.decode(data)
            ConsumerProtocolAssignment.decode(data)
        except MalformedMetadataError:
            pass
