"""The sticky assignors read a Kafka member's generation (and, for ``sticky``, its previous
assignment) from ``user_data`` where Kafka's assignors keep them.

* cooperative-sticky: a Subscription without a generation (v0/v1, before KIP-792, or v2+ with
  -1) carries it in ``user_data`` as one int32 (CooperativeStickyAssignor.memberData).
* sticky (eager): ``user_data`` holds ``previous_assignment [topic, [partition]]`` and, from V1
  on, ``generation`` (StickyAssignor.memberData); an eager member reports no owned partitions.

Subscriptions are built byte by byte from Kafka's schemas, as a Java client sends them.
"""

from __future__ import annotations

import random
import struct

import pytest

from rcoord.assignors import get_assignor
from rcoord.protocol.consumer import ConsumerProtocolSubscription as Sub

_DEFAULT = object()


def _string(value: str) -> bytes:
    raw = value.encode()
    return struct.pack(">h", len(raw)) + raw


def _topic_partitions(tps: dict[str, list[int]]) -> bytes:
    out = struct.pack(">i", len(tps))
    for topic, partitions in tps.items():
        out += _string(topic) + struct.pack(">i", len(partitions))
        out += b"".join(struct.pack(">i", p) for p in partitions)
    return out


def kafka_subscription(
    version: int,
    topics: list[str],
    user_data: bytes | None,
    owned: dict[str, list[int]] | None = None,
    generation: int = -1,
) -> Sub:
    """ConsumerProtocolSubscription bytes at ``version`` (rack null at v3), decoded by rcoord."""
    data = struct.pack(">h", version) + struct.pack(">i", len(topics))
    data += b"".join(_string(t) for t in topics)
    data += struct.pack(">i", -1) if user_data is None else (
        struct.pack(">i", len(user_data)) + user_data)
    if version >= 1:
        data += _topic_partitions(owned or {})
    if version >= 2:
        data += struct.pack(">i", generation)
    if version >= 3:
        data += struct.pack(">h", -1)
    return Sub.decode(data)


def coop_user_data(generation: int) -> bytes:
    """COOPERATIVE_STICKY_ASSIGNOR_USER_DATA_V0."""
    return struct.pack(">i", generation)


def sticky_user_data(previous: dict[str, list[int]], generation: int | None) -> bytes:
    """STICKY_ASSIGNOR_USER_DATA_V1, or V0 when ``generation`` is None."""
    out = _topic_partitions(previous)
    return out if generation is None else out + struct.pack(">i", generation)


def assign(name: str, members: dict[str, Sub], counts: dict[str, int]) -> dict[str, list[str]]:
    result = get_assignor(name).assign(members, counts)
    return {mid: [f"{tp.topic}-{tp.partition}" for tp in parts] for mid, parts in result.items()}


# -- cooperative-sticky: the generation in user_data ------------------------------------------


def test_cooperative_v1_user_data_generation_settles_a_stale_claim() -> None:
    """The reviewer's case: the current owner (generation 5) keeps t-1 over a stale claim
    (generation 3); without the user_data generations both count as -1 and t-1 is voided."""
    members = {
        "A": kafka_subscription(1, ["t"], coop_user_data(5), {"t": [1]}),
        "B": kafka_subscription(1, ["t"], coop_user_data(3), {"t": [1]}),
    }
    assert assign("cooperative-sticky", members, {"t": 2}) == {"A": ["t-1"], "B": ["t-0"]}


def test_cooperative_v1_newer_generation_wins_in_either_visiting_order() -> None:
    members = {
        "A": kafka_subscription(1, ["t"], coop_user_data(3), {"t": [1]}),
        "B": kafka_subscription(1, ["t"], coop_user_data(5), {"t": [1]}),
    }
    assert assign("cooperative-sticky", members, {"t": 2}) == {"A": ["t-0"], "B": ["t-1"]}


def test_cooperative_v1_claims_settle_with_a_v0_member_joining() -> None:
    """A v0 member (no owned partitions at all) joins; the v1 members' claims settle by their
    user_data generations."""
    members = {
        "A": kafka_subscription(1, ["t"], coop_user_data(4), {"t": [0, 1]}),
        "B": kafka_subscription(1, ["t"], coop_user_data(7), {"t": [1]}),
        "C": kafka_subscription(0, ["t"], coop_user_data(7)),
    }
    # B (7) takes t-1 from A's older claim (4); A keeps t-0; C gets the free t-2.
    assert assign("cooperative-sticky", members, {"t": 3}) == {
        "A": ["t-0"], "B": ["t-1"], "C": ["t-2"]}


def test_cooperative_subscription_generation_first_user_data_when_it_is_minus_one() -> None:
    """v2+: a generation in the subscription wins over user_data (B's 9 is not read); a
    subscription generation of -1 falls back to user_data (A's 5), as Kafka's Optional does."""
    members = {
        "A": kafka_subscription(3, ["t"], coop_user_data(5), {"t": [1]}, generation=-1),
        "B": kafka_subscription(3, ["t"], coop_user_data(9), {"t": [1]}, generation=3),
    }
    assert assign("cooperative-sticky", members, {"t": 2}) == {"A": ["t-1"], "B": ["t-0"]}


def test_cooperative_v1_member_next_to_an_rcoord_member() -> None:
    """An rcoord (msgpack) member's stale claim (generation 3) loses to a Kafka v1 member whose
    user_data says generation 5."""
    members = {
        "A": Sub.decode(Sub(["t"], owned_partitions=[("t", 1)], generation_id=3).encode()),
        "B": kafka_subscription(1, ["t"], coop_user_data(5), {"t": [1]}),
    }
    assert assign("cooperative-sticky", members, {"t": 2}) == {"A": ["t-0"], "B": ["t-1"]}


@pytest.mark.parametrize(
    "user_data",
    [None, b"", b"\x00\x07", coop_user_data(-7)],
    ids=["null", "empty", "too-short", "negative"],
)
def test_cooperative_unreadable_user_data_is_no_generation(user_data: bytes | None) -> None:
    """A's user_data holds no usable generation: it counts as -1, so B's generation 0 wins."""
    members = {
        "A": kafka_subscription(1, ["t"], user_data, {"t": [1]}),
        "B": kafka_subscription(1, ["t"], coop_user_data(0), {"t": [1]}),
    }
    assert assign("cooperative-sticky", members, {"t": 2}) == {"A": ["t-0"], "B": ["t-1"]}


def test_cooperative_user_data_generation_in_the_general_path() -> None:
    """Unequal subscriptions take the general path; the stale claim on t-1 (A, generation 3)
    still loses to its current owner (B, generation 5)."""
    members = {
        "A": kafka_subscription(1, ["t", "u"], coop_user_data(3), {"t": [1], "u": [0]}),
        "B": kafka_subscription(1, ["t"], coop_user_data(5), {"t": [1]}),
    }
    assert assign("cooperative-sticky", members, {"t": 2, "u": 1}) == {
        "A": ["t-0", "u-0"], "B": ["t-1"]}


# -- sticky (eager): previous assignment and generation in user_data ---------------------------


def test_sticky_previous_assignment_from_user_data_v1() -> None:
    """Eager Kafka members rejoin owning nothing; their user_data says what they held. C joins:
    A keeps both of its partitions, B keeps t-0 and gives t-2 to C."""
    members = {
        "A": kafka_subscription(3, ["t"], sticky_user_data({"t": [1, 3]}, 4), generation=4),
        "B": kafka_subscription(3, ["t"], sticky_user_data({"t": [0, 2]}, 4), generation=4),
        "C": kafka_subscription(3, ["t"], None),
    }
    assert assign("sticky", members, {"t": 4}) == {
        "A": ["t-1", "t-3"], "B": ["t-0"], "C": ["t-2"]}


def test_sticky_previous_assignment_from_user_data_v0_v1_subscription() -> None:
    """V0 user_data (no generation) in a v1 subscription: the claims still count."""
    members = {
        "A": kafka_subscription(1, ["t"], sticky_user_data({"t": [1, 3]}, None)),
        "B": kafka_subscription(1, ["t"], sticky_user_data({"t": [0, 2]}, None)),
    }
    assert assign("sticky", members, {"t": 4}) == {"A": ["t-1", "t-3"], "B": ["t-0", "t-2"]}


def test_sticky_user_data_generations_settle_conflicts() -> None:
    """A's user_data is from generation 2, B's from 5: B keeps t-0, A keeps only t-2."""
    members = {
        "A": kafka_subscription(1, ["t"], sticky_user_data({"t": [0, 2]}, 2)),
        "B": kafka_subscription(1, ["t"], sticky_user_data({"t": [0, 1]}, 5)),
    }
    assert assign("sticky", members, {"t": 3}) == {"A": ["t-2"], "B": ["t-0", "t-1"]}


@pytest.mark.parametrize(
    "user_data",
    [b"\xff\xff\xff\xff", b"\x00\x00\x00\x01\x00", b"\x01", b"\x00\x00\x00\x01\x00\x01t\xff\xff\xff\xfe"],
    ids=["negative-count", "truncated-topic", "short", "negative-partition-count"],
)
def test_sticky_unreadable_user_data_means_no_previous_assignment(user_data: bytes) -> None:
    """As in Kafka, user_data that does not decode is no previous assignment and no generation;
    the subscription's own fields are not read instead (A's claim on t-0 there is ignored)."""
    members = {
        "A": kafka_subscription(3, ["t"], user_data, {"t": [0]}, generation=9),
        "B": kafka_subscription(3, ["t"], sticky_user_data({"t": [0]}, 3), generation=3),
    }
    assert assign("sticky", members, {"t": 2}) == {"A": ["t-1"], "B": ["t-0"]}


def test_sticky_without_user_data_uses_the_subscription_fields() -> None:
    """rcoord's members send no user_data and report what they held in the subscription."""
    members = {
        "A": Sub(["t"], owned_partitions=[("t", 1), ("t", 3)], generation_id=4),
        "B": kafka_subscription(3, ["t"], sticky_user_data({"t": [0, 2]}, 4), generation=4),
    }
    assert assign("sticky", members, {"t": 4}) == {"A": ["t-1", "t-3"], "B": ["t-0", "t-2"]}


# -- never crash on arbitrary user_data --------------------------------------------------------


@pytest.mark.parametrize("name", ["sticky", "cooperative-sticky"])
def test_random_user_data_never_fails_the_assignment(name: str) -> None:
    rng = random.Random(792)
    for _ in range(300):
        members = {}
        for mid in ("A", "B", "C"):
            raw = rng.randbytes(rng.randrange(0, 24))
            if rng.random() < 0.3:  # a plausible prefix: a small count, then noise
                raw = struct.pack(">i", rng.randrange(0, 3)) + raw
            owned = {"t": sorted(rng.sample(range(4), rng.randrange(0, 3)))}
            members[mid] = kafka_subscription(1, ["t"], raw, owned)
        got = assign(name, members, {"t": 4})
        flat = [tp for parts in got.values() for tp in parts]
        assert len(flat) == len(set(flat))
        if name == "sticky":
            assert sorted(flat) == ["t-0", "t-1", "t-2", "t-3"]


# -- the decoders ------------------------------------------------------------------------------


def test_decode_cooperative_sticky_user_data() -> None:
    from rcoord.protocol.kafka_consumer import decode_cooperative_sticky_user_data as decode

    assert decode(coop_user_data(12)) == 12
    assert decode(coop_user_data(12) + b"later fields") == 12
    with pytest.raises(ValueError):
        decode(b"\x00\x00\x0c")


def test_decode_sticky_user_data() -> None:
    from rcoord.protocol.kafka_consumer import decode_sticky_user_data as decode

    assert decode(sticky_user_data({"t": [2, 0], "u": [1]}, 6)) == (
        [("t", 2), ("t", 0), ("u", 1)], 6)
    assert decode(sticky_user_data({"t": [1]}, None)) == ([("t", 1)], None)
    assert decode(sticky_user_data({"t": [1]}, None) + b"\x00\x00") == ([("t", 1)], None)
    assert decode(sticky_user_data({"t": [1]}, 6) + b"more") == ([("t", 1)], 6)
    # Entries no partition can match are dropped, the rest kept.
    assert decode(sticky_user_data({"": [0], "t": [-1, 3]}, 2)) == ([("t", 3)], 2)
    for bad in (b"", b"\xff\xff\xff\xff", b"\x00\x00\x00\x01\x00\x01t\x00\x00\x00\x02\x00"):
        with pytest.raises(ValueError):
            decode(bad)
