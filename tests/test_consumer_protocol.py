"""The consumer protocol's metadata and assignment encodings (pure logic, no Redis)."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rcoord.errors import InvalidRequestError
from rcoord.protocol.consumer import (
    PROTOCOL_TYPE,
    ConsumerProtocolAssignment,
    ConsumerProtocolSubscription,
    MalformedMetadataError,
    subscribed_topics,
)
from rcoord.protocol.offsets import TopicPartition

TP = TopicPartition
INT32_MAX = 2**31 - 1

topic_names = st.text(min_size=1, max_size=12)
topic_partitions = st.builds(TP, topic_names, st.integers(0, INT32_MAX))
subscriptions = st.builds(
    ConsumerProtocolSubscription,
    topics=st.lists(topic_names, max_size=8),
    user_data=st.binary(max_size=64),
    owned_partitions=st.lists(topic_partitions, max_size=10),
    generation_id=st.integers(-1, INT32_MAX),
    rack=st.none() | st.text(max_size=10),
)
assignments = st.builds(
    ConsumerProtocolAssignment,
    partitions=st.lists(topic_partitions, max_size=16),
    user_data=st.binary(max_size=64),
)


def pack(obj: object) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def test_protocol_type_is_kafkas():
    assert PROTOCOL_TYPE == "consumer"


# -- construction ------------------------------------------------------------------------------


def test_subscription_normalises_topics_and_owned_partitions():
    sub = ConsumerProtocolSubscription(
        ["b", "a", "b"], owned_partitions=[("b", 1), TP("a", 2), ("b", 0), ("b", 1)]
    )
    assert sub.topics == ("a", "b")
    assert sub.owned_partitions == (TP("a", 2), TP("b", 0), TP("b", 1))
    assert all(isinstance(tp, TopicPartition) for tp in sub.owned_partitions)
    same = ConsumerProtocolSubscription(
        ("a", "b"), owned_partitions=[TP("b", 0), TP("b", 1), TP("a", 2)]
    )
    assert sub == same
    assert (sub.user_data, sub.generation_id, sub.rack) == (b"", -1, None)
    assert hash(sub) == hash(same)


def test_equal_values_encode_to_equal_bytes():
    # The coordinator compares metadata byte for byte, so order must not leak into the encoding.
    a = ConsumerProtocolSubscription(["x", "y", "z"], owned_partitions=[("y", 3), ("x", 1)])
    b = ConsumerProtocolSubscription(["z", "x", "y", "x"], owned_partitions=[("x", 1), ("y", 3)])
    assert a.encode() == b.encode()
    assert (
        ConsumerProtocolAssignment([("t", 2), ("s", 0)]).encode()
        == ConsumerProtocolAssignment([("s", 0), ("t", 2), ("t", 2)]).encode()
    )


@pytest.mark.parametrize(
    "kwargs, exc",
    [
        ({"topics": "orders"}, TypeError),  # a bare str would become its characters
        ({"topics": b"orders"}, TypeError),
        ({"topics": [1]}, TypeError),
        ({"topics": [""]}, InvalidRequestError),
        ({"topics": ["a"], "user_data": "text"}, TypeError),
        ({"topics": ["a"], "owned_partitions": [("a",)]}, TypeError),
        ({"topics": ["a"], "owned_partitions": [("a", -1)]}, InvalidRequestError),
        ({"topics": ["a"], "owned_partitions": [("a", True)]}, TypeError),
        ({"topics": ["a"], "owned_partitions": [("", 0)]}, InvalidRequestError),
        ({"topics": ["a"], "generation_id": -2}, InvalidRequestError),
        ({"topics": ["a"], "generation_id": 2**31}, InvalidRequestError),
        ({"topics": ["a"], "generation_id": "1"}, TypeError),
        ({"topics": ["a"], "rack": b"r1"}, TypeError),
    ],
)
def test_subscription_rejects_bad_arguments(kwargs, exc):
    with pytest.raises(exc):
        ConsumerProtocolSubscription(**kwargs)


def test_assignment_rejects_bad_arguments():
    with pytest.raises(TypeError):
        ConsumerProtocolAssignment([("a", "0")])
    with pytest.raises(InvalidRequestError):
        ConsumerProtocolAssignment([("a", 2**31)])
    with pytest.raises(TypeError):
        ConsumerProtocolAssignment([("a", 0)], user_data=None)  # type: ignore[arg-type]


def test_decode_requires_bytes():
    with pytest.raises(TypeError):
        ConsumerProtocolSubscription.decode("{}")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        ConsumerProtocolAssignment.decode(None)  # type: ignore[arg-type]


# -- round trips -------------------------------------------------------------------------------


@given(subscriptions)
def test_subscription_round_trips(sub):
    data = sub.encode()
    back = ConsumerProtocolSubscription.decode(data)
    assert back == sub
    assert back.encode() == data
    assert subscribed_topics(data) == frozenset(sub.topics)


@given(assignments)
def test_assignment_round_trips(asg):
    data = asg.encode()
    back = ConsumerProtocolAssignment.decode(data)
    assert back == asg
    assert back.encode() == data


@given(st.lists(topic_partitions, max_size=16), st.randoms())
def test_assignment_encoding_ignores_input_order(tps, rnd):
    shuffled = list(tps)
    rnd.shuffle(shuffled)
    assert ConsumerProtocolAssignment(tps).encode() == ConsumerProtocolAssignment(shuffled).encode()


def test_defaults_are_left_out_of_the_encoding():
    assert msgpack.unpackb(ConsumerProtocolSubscription(["t"]).encode()) == {
        "version": 0,
        "topics": ["t"],
    }
    full = ConsumerProtocolSubscription(
        ["t"], b"u", [("t", 1), ("t", 0)], generation_id=4, rack="r1"
    )
    assert msgpack.unpackb(full.encode()) == {
        "version": 0,
        "topics": ["t"],
        "user_data": b"u",
        "owned_partitions": {"t": [0, 1]},
        "generation_id": 4,
        "rack": "r1",
    }
    assert msgpack.unpackb(ConsumerProtocolAssignment([]).encode()) == {
        "version": 0,
        "partitions": {},
    }


# -- forward compatibility ---------------------------------------------------------------------


def test_newer_subscription_with_unknown_fields_decodes():
    data = pack(
        {
            "version": 7,
            "topics": ["b", "a"],
            "user_data": b"\x00\x01",
            "owned_partitions": {"a": [1, 0]},
            "generation_id": 3,
            "rack": None,
            "future_field": {"nested": [1, 2.5, None]},
            "another": msgpack.ExtType(42, b"opaque"),
            "int_keyed": {1: "a", 2: "b"},
        }
    )
    sub = ConsumerProtocolSubscription.decode(data)
    assert sub == ConsumerProtocolSubscription(
        ["a", "b"], b"\x00\x01", [("a", 0), ("a", 1)], generation_id=3
    )
    assert subscribed_topics(data) == frozenset({"a", "b"})


def test_minimal_subscription_uses_defaults():
    sub = ConsumerProtocolSubscription.decode(pack({"version": 0, "topics": []}))
    assert sub == ConsumerProtocolSubscription([])


def test_newer_assignment_with_unknown_fields_decodes():
    data = pack({"version": 3, "partitions": {"t": [2, 0]}, "user_data": b"x", "epoch": 9})
    assert ConsumerProtocolAssignment.decode(data) == ConsumerProtocolAssignment(
        [("t", 0), ("t", 2)], b"x"
    )


# -- malformed payloads ------------------------------------------------------------------------

GOOD_SUB = {"version": 0, "topics": ["a"]}


def _sub(**changes: object) -> bytes:
    return pack({**GOOD_SUB, **changes})


MALFORMED_SUBSCRIPTIONS = [
    (b"", "not valid msgpack"),
    (b"\xc1", "not valid msgpack"),  # a byte msgpack never uses
    (pack(GOOD_SUB)[:-2], "not valid msgpack"),  # truncated
    (pack(GOOD_SUB) + b"\x00", "not valid msgpack"),  # trailing bytes
    (b"\x81\x01\x02", "missing 'version'"),  # {1: 2}
    (b"\x81\x91\x01\x02", "not valid msgpack"),  # a list as a map key
    (b"\x81\xa1\xff\x00", "not valid msgpack"),  # invalid UTF-8 in a str
    (pack(["a"]), "not a msgpack map"),
    (pack("topics"), "not a msgpack map"),
    (pack({"topics": ["a"]}), "missing 'version'"),
    (_sub(version="0"), "'version' must be an int"),
    (_sub(version=True), "'version' must be an int"),
    (_sub(version=-1), "'version' must be >= 0"),
    (pack({"version": 0}), "missing 'topics'"),
    (_sub(topics="a"), "'topics' must be a list"),
    (_sub(topics=[1]), "'topics' must hold non-empty topic strings"),
    (_sub(topics=[""]), "'topics' must hold non-empty topic strings"),
    (_sub(topics=[b"a"]), "'topics' must hold non-empty topic strings"),
    (_sub(user_data="text"), "'user_data' must be msgpack bin"),
    (_sub(owned_partitions=[["a", 0]]), "'owned_partitions' must be a map"),
    (_sub(owned_partitions={"a": 0}), "partitions of 'a' must be a list"),
    (_sub(owned_partitions={"a": [-1]}), "'owned_partitions' must hold ints"),
    (_sub(owned_partitions={"a": [2**31]}), "'owned_partitions' must hold ints"),
    (_sub(owned_partitions={"a": [False]}), "'owned_partitions' must hold ints"),
    (_sub(owned_partitions={"": [0]}), "'owned_partitions' must hold non-empty topic strings"),
    (_sub(owned_partitions={1: [0]}), "'owned_partitions' must hold non-empty topic strings"),
    (_sub(generation_id=-2), "'generation_id' must hold ints"),
    (_sub(generation_id="1"), "'generation_id' must hold ints"),
    (_sub(rack=1), "'rack' must be a str or nil"),
]


@pytest.mark.parametrize("data, message", MALFORMED_SUBSCRIPTIONS)
def test_malformed_subscription_names_the_cause(data, message):
    with pytest.raises(MalformedMetadataError, match="^subscription ") as info:
        ConsumerProtocolSubscription.decode(data)
    assert message in str(info.value)
    assert isinstance(info.value, InvalidRequestError)
    assert subscribed_topics(data) is None


@pytest.mark.parametrize(
    "data, message",
    [
        (b"\x92", "not valid msgpack"),
        (pack([]), "not a msgpack map"),
        (pack({"partitions": {}}), "missing 'version'"),
        (pack({"version": -5, "partitions": {}}), "'version' must be >= 0"),
        (pack({"version": 0}), "missing 'partitions'"),
        (pack({"version": 0, "partitions": [["t", 0]]}), "'partitions' must be a map"),
        (pack({"version": 0, "partitions": {"t": ["0"]}}), "'partitions' must hold ints"),
        (pack({"version": 0, "partitions": {}, "user_data": 5}), "'user_data' must be msgpack bin"),
    ],
)
def test_malformed_assignment_names_the_cause(data, message):
    with pytest.raises(MalformedMetadataError, match="^assignment ") as info:
        ConsumerProtocolAssignment.decode(data)
    assert message in str(info.value)


def test_msgpack_failure_is_chained():
    with pytest.raises(MalformedMetadataError) as info:
        ConsumerProtocolSubscription.decode(b"\xc1")
    assert info.value.__cause__ is not None


@given(st.binary(max_size=64))
def test_arbitrary_bytes_decode_or_raise_malformed(data):
    for cls in (ConsumerProtocolSubscription, ConsumerProtocolAssignment):
        try:
            cls.decode(data)
        except MalformedMetadataError:
            pass
    result = subscribed_topics(data)
    assert result is None or isinstance(result, frozenset)


def test_deeply_nested_payload_is_malformed_not_a_crash():
    data = b"\x91" * 100_000 + b"\xc0"  # a list nested far beyond msgpack's recursion limit
    with pytest.raises(MalformedMetadataError, match="not valid msgpack"):
        ConsumerProtocolSubscription.decode(data)
