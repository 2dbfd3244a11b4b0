"""Partition assignors: Kafka's documented examples, edge cases, and properties (no Redis)."""

from __future__ import annotations

import re
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rcoord import assignors
from rcoord.assignors import (
    ASSIGNORS,
    RangeAssignor,
    RebalanceProtocol,
    RoundRobinAssignor,
    UnknownAssignorError,
    get_assignor,
    kafka_member_order,
    rebalance_protocol,
    register_assignor,
    supported_protocols,
)
from rcoord.errors import InvalidRequestError, RcoordError
from rcoord.protocol.consumer import ConsumerProtocolSubscription
from rcoord.protocol.offsets import TopicPartition

RANGE = RangeAssignor()
ROUND_ROBIN = RoundRobinAssignor()
BOTH = [RANGE, ROUND_ROBIN]


def tps(spec: str) -> list[TopicPartition]:
    """'t0p0 t1p2' -> [TopicPartition('t0', 0), TopicPartition('t1', 2)] (tables stay readable)."""
    out = []
    for item in spec.split():
        topic, part = re.fullmatch(r"(.+)p(\d+)", item).groups()
        out.append(TopicPartition(topic, int(part)))
    return out


def subs(**topics: str) -> dict[str, ConsumerProtocolSubscription]:
    """subs(C0="t0 t1") -> {"C0": ConsumerProtocolSubscription(("t0", "t1"))}."""
    return {mid: ConsumerProtocolSubscription(t.split()) for mid, t in topics.items()}


# Each case: members' subscriptions, partitions per topic, expected range, expected roundrobin.
CASES = {
    # Kafka's RangeAssignor / RoundRobinAssignor javadoc example.
    "kafka_doc_two_consumers": (
        subs(C0="t0 t1", C1="t0 t1"),
        {"t0": 3, "t1": 3},
        {"C0": tps("t0p0 t0p1 t1p0 t1p1"), "C1": tps("t0p2 t1p2")},
        {"C0": tps("t0p0 t0p2 t1p1"), "C1": tps("t0p1 t1p0 t1p2")},
    ),
    # Kafka's RoundRobinAssignor javadoc example with uneven subscriptions.
    "kafka_doc_uneven_subscriptions": (
        subs(C0="t0", C1="t0 t1", C2="t0 t1 t2"),
        {"t0": 1, "t1": 2, "t2": 3},
        {"C0": tps("t0p0"), "C1": tps("t1p0"), "C2": tps("t1p1 t2p0 t2p1 t2p2")},
        {"C0": tps("t0p0"), "C1": tps("t1p0"), "C2": tps("t1p1 t2p0 t2p1 t2p2")},
    ),
    "disjoint_subscriptions": (
        subs(a="x", b="y"),
        {"x": 2, "y": 3},
        {"a": tps("xp0 xp1"), "b": tps("yp0 yp1 yp2")},
        {"a": tps("xp0 xp1"), "b": tps("yp0 yp1 yp2")},
    ),
    "range_skews_extras_to_the_first_member": (
        subs(a="t u", b="t u", c="t u"),
        {"t": 4, "u": 4},
        {"a": tps("tp0 tp1 up0 up1"), "b": tps("tp2 up2"), "c": tps("tp3 up3")},
        {"a": tps("tp0 tp3 up2"), "b": tps("tp1 up0 up3"), "c": tps("tp2 up1")},
    ),
    "more_members_than_partitions": (
        subs(m1="t", m2="t", m3="t"),
        {"t": 2},
        {"m1": tps("tp0"), "m2": tps("tp1"), "m3": []},
        {"m1": tps("tp0"), "m2": tps("tp1"), "m3": []},
    ),
    "member_ids_sort_as_strings": (
        subs(m10="t", m2="t"),
        {"t": 3},
        {"m10": tps("tp0 tp1"), "m2": tps("tp2")},
        {"m10": tps("tp0 tp2"), "m2": tps("tp1")},
    ),
    "topic_nobody_subscribes_to_and_unknown_topic": (
        subs(a="t missing", b="t"),
        {"t": 2, "unsubscribed": 5},
        {"a": tps("tp0"), "b": tps("tp1")},
        {"a": tps("tp0"), "b": tps("tp1")},
    ),
    "topic_with_no_partitions": (
        subs(a="t e", b="t"),
        {"t": 1, "e": 0},
        {"a": tps("tp0"), "b": []},
        {"a": tps("tp0"), "b": []},
    ),
    "member_with_no_topics": (
        subs(a="", b="t"),
        {"t": 2},
        {"a": [], "b": tps("tp0 tp1")},
        {"a": [], "b": tps("tp0 tp1")},
    ),
    "no_members": ({}, {"t": 3}, {}, {}),
    "no_partitions_known": (subs(a="t"), {}, {"a": []}, {"a": []}),
}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("assignor", BOTH, ids=lambda a: a.name)
def test_assignment_tables(assignor, case):
    members, partitions, want_range, want_roundrobin = CASES[case]
    want = want_range if assignor is RANGE else want_roundrobin
    assert assignor.assign(members, partitions) == want


def test_roundrobin_walk_continues_across_topics():
    # Kafka keeps one circular iterator for all partitions; it does not restart at each topic.
    members = subs(a="t u", b="t u", c="t u")
    got = ROUND_ROBIN.assign(members, {"t": 1, "u": 2})
    assert got == {"a": tps("tp0"), "b": tps("up0"), "c": tps("up1")}


@pytest.mark.parametrize("assignor", BOTH, ids=lambda a: a.name)
def test_member_order_replaces_sorting_by_id(assignor):
    members = subs(C0="t0 t1", C1="t0 t1")
    flipped = assignor.assign(members, {"t0": 3, "t1": 3}, member_order=["C1", "C0"])
    usual = assignor.assign(members, {"t0": 3, "t1": 3})
    assert flipped == {"C1": usual["C0"], "C0": usual["C1"]}
    assert list(flipped) == ["C1", "C0"]


@pytest.mark.parametrize("order", [["a"], ["a", "b", "c"], ["a", "a"], ["a", "x"]])
@pytest.mark.parametrize("assignor", BOTH, ids=lambda a: a.name)
def test_member_order_must_list_every_member_once(assignor, order):
    with pytest.raises(ValueError, match="every member id exactly once"):
        assignor.assign(subs(a="t", b="t"), {"t": 1}, member_order=order)


@pytest.mark.parametrize("name", sorted(ASSIGNORS))
def test_member_ids_are_ordered_as_java_orders_them(name):
    # Kafka sorts member ids with Java's String.compareTo (UTF-16 units): "😀-1" (a surrogate
    # pair, 0xD83D...) comes before "Ａ-2" (U+FF21), where Python's code-point order puts it
    # after. Before, range gave "Ａ-2" partitions 0-1 where Kafka gives them to "😀-1".
    assignor = ASSIGNORS[name]
    ascii_ids = assignor.assign(subs(a="t", b="t"), {"t": 3})
    wide_ids = assignor.assign(subs(**{"😀-1": "t", "Ａ-2": "t"}), {"t": 3})
    assert wide_ids == {"😀-1": ascii_ids["a"], "Ａ-2": ascii_ids["b"]}
    assert len(ascii_ids["a"]) != len(ascii_ids["b"])  # (the order decides who gets two)
    assert kafka_member_order([("Ａ-2", None), ("😀-1", None), ("x", "Ａ"), ("y", "😀")]) == [
        "y", "x", "😀-1", "Ａ-2"]


def test_kafka_member_order_puts_static_members_first():
    members = [("a-1", None), ("b-7", "zeta"), ("c-2", "alpha"), ("0-0", None)]
    assert kafka_member_order(members) == ["c-2", "b-7", "0-0", "a-1"]
    # A restarted static member gets a new member id but keeps its place, hence its partitions.
    before = RANGE.assign(
        subs(x="t", y="t"),
        {"t": 3},
        member_order=kafka_member_order([("x", "inst-1"), ("y", "inst-0")]),
    )
    after = RANGE.assign(
        subs(z="t", y="t"),
        {"t": 3},
        member_order=kafka_member_order([("z", "inst-1"), ("y", "inst-0")]),
    )
    assert before["x"] == after["z"] and before["y"] == after["y"]


@pytest.mark.parametrize("assignor", BOTH, ids=lambda a: a.name)
@pytest.mark.parametrize(
    "members, partitions, exc",
    [
        ([("a", None)], {}, TypeError),
        ({"a": ["t"]}, {}, TypeError),
        ({1: ConsumerProtocolSubscription(["t"])}, {}, TypeError),
        ({}, [("t", 1)], TypeError),
        ({}, {"t": "3"}, TypeError),
        ({}, {"t": True}, TypeError),
        ({}, {"t": -1}, InvalidRequestError),
    ],
)
def test_bad_inputs(assignor, members, partitions, exc):
    with pytest.raises(exc):
        assignor.assign(members, partitions)


# -- registry ----------------------------------------------------------------------------------


def test_registry_has_the_builtin_assignors():
    assert set(ASSIGNORS) >= {"range", "roundrobin"}
    assert isinstance(get_assignor("range"), RangeAssignor)
    assert isinstance(get_assignor("roundrobin"), RoundRobinAssignor)
    with pytest.raises(TypeError):
        ASSIGNORS["x"] = RANGE  # type: ignore[index]


def test_unknown_assignor_names_the_known_ones():
    with pytest.raises(UnknownAssignorError) as info:
        get_assignor("stickyish")
    assert isinstance(info.value, KeyError) and isinstance(info.value, RcoordError)
    assert str(info.value).startswith("unknown assignor 'stickyish'; known: ")
    assert "range" in str(info.value) and "roundrobin" in str(info.value)
    with pytest.raises(KeyError):
        get_assignor("")


class EverythingToFirst:
    """A custom assignor: all partitions to the first member by id."""

    name = "test-everything-to-first"

    def assign(self, members, partitions_per_topic):
        result = {mid: [] for mid in sorted(members)}
        if result:
            first = next(iter(result))
            for topic in sorted(partitions_per_topic):
                count = partitions_per_topic[topic]
                result[first] += [TopicPartition(topic, p) for p in range(count)]
        return result


def test_register_a_custom_assignor():
    custom = EverythingToFirst()
    try:
        register_assignor(custom)
        register_assignor(custom)  # registering the same object again is harmless
        assert get_assignor(custom.name) is custom
        assert ASSIGNORS[custom.name] is custom
        with pytest.raises(ValueError, match="already registered"):
            register_assignor(EverythingToFirst())
        replacement = EverythingToFirst()
        register_assignor(replacement, replace=True)
        assert get_assignor(custom.name) is replacement
    finally:
        assignors._REGISTRY.pop(custom.name, None)


def test_register_rejects_non_assignors():
    class NoName:
        def assign(self, members, partitions_per_topic):
            return {}

    class NoAssign:
        name = "no-assign"

    with pytest.raises(TypeError):
        register_assignor(NoName())  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        register_assignor(NoAssign())  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        register_assignor(RangeAssignor())  # "range" is taken by another instance
    assert "no-assign" not in ASSIGNORS


def test_protocols_declared_by_value_are_the_enum_members():
    """A custom assignor declaring protocols by value ("cooperative") gets COOPERATIVE itself:
    the client tests ``protocol is RebalanceProtocol.COOPERATIVE``, so the plain str it got
    before made such a member behave eagerly while reporting "cooperative"."""

    class ByValue(EverythingToFirst):
        supported_protocols = ("cooperative", "eager")

    assert supported_protocols(ByValue()) == (RebalanceProtocol.COOPERATIVE,
                                              RebalanceProtocol.EAGER)
    assert rebalance_protocol([ByValue()]) is RebalanceProtocol.COOPERATIVE
    assert rebalance_protocol([ByValue(), RangeAssignor()]) is RebalanceProtocol.EAGER


@pytest.mark.parametrize("declared", [("COOPERATIVE",), "cooperative", 1,
                                      lambda self: (RebalanceProtocol.COOPERATIVE,)])
def test_bad_protocol_declarations_name_the_assignor(declared):
    """Kafka's ``supportedProtocols()`` is a method; here it is a tuple. A declaration that is
    not one fails with a TypeError naming the assignor and the valid values."""

    class Bad(EverythingToFirst):
        pass

    Bad.supported_protocols = declared  # type: ignore[attr-defined]
    with pytest.raises(TypeError, match="assignor 'test-everything-to-first'.*'cooperative'"):
        rebalance_protocol([Bad()])


# -- properties --------------------------------------------------------------------------------

TOPICS = ["t0", "t1", "t2", "t3"]

member_ids = st.text(alphabet="abcxyz019-", min_size=1, max_size=4)
group_inputs = st.tuples(
    st.dictionaries(member_ids, st.lists(st.sampled_from(TOPICS + ["unknown"])), max_size=7),
    st.dictionaries(st.sampled_from(TOPICS), st.integers(0, 12)),
)


def build(raw_members):
    return {mid: ConsumerProtocolSubscription(topics) for mid, topics in raw_members.items()}


def check_valid(members, partitions, result):
    assert set(result) == set(members)
    owners = Counter(tp for assigned in result.values() for tp in assigned)
    subscribed = {t for sub in members.values() for t in sub.topics}
    expected = {
        TopicPartition(t, p) for t in subscribed & partitions.keys() for p in range(partitions[t])
    }
    assert set(owners) == expected  # nothing unsubscribed or unknown is handed out
    assert all(n == 1 for n in owners.values())  # exactly one owner each
    for mid, assigned in result.items():
        assert all(tp.topic in members[mid].topics for tp in assigned)
        assert assigned == sorted(assigned)


@pytest.mark.parametrize("assignor", BOTH, ids=lambda a: a.name)
@given(inputs=group_inputs)
def test_every_subscribed_partition_has_exactly_one_subscribed_owner(assignor, inputs):
    raw, partitions = inputs
    members = build(raw)
    check_valid(members, partitions, assignor.assign(members, partitions))


@pytest.mark.parametrize("assignor", BOTH, ids=lambda a: a.name)
@given(inputs=group_inputs, rnd=st.randoms())
def test_deterministic_whatever_the_insertion_order(assignor, inputs, rnd):
    raw, partitions = inputs
    members = build(raw)
    member_items = list(members.items())
    partition_items = list(partitions.items())
    rnd.shuffle(member_items)
    rnd.shuffle(partition_items)
    shuffled = assignor.assign(dict(member_items), dict(partition_items))
    assert shuffled == assignor.assign(members, partitions)
    assert list(shuffled) == sorted(members)


@given(inputs=group_inputs)
def test_range_balances_each_topic_among_its_subscribers(inputs):
    raw, partitions = inputs
    members = build(raw)
    result = RANGE.assign(members, partitions)
    for topic, count in partitions.items():
        subscribers = sorted(mid for mid, sub in members.items() if topic in sub.topics)
        if not subscribers:
            continue
        counts = [sum(tp.topic == topic for tp in result[mid]) for mid in subscribers]
        assert max(counts) - min(counts) <= 1
        assert counts == sorted(counts, reverse=True)  # the extras go to the first members
        # Each member's share of a topic is one contiguous range, in member order.
        flat = [tp.partition for mid in subscribers for tp in result[mid] if tp.topic == topic]
        assert flat == list(range(count))


@given(
    ids=st.sets(member_ids, min_size=1, max_size=8),
    topics=st.lists(st.sampled_from(TOPICS), min_size=1, unique=True),
    counts=st.lists(st.integers(0, 12), min_size=4, max_size=4),
)
def test_roundrobin_balances_total_counts_for_identical_subscriptions(ids, topics, counts):
    members = {mid: ConsumerProtocolSubscription(topics) for mid in ids}
    partitions = dict(zip(TOPICS, counts, strict=True))
    result = ROUND_ROBIN.assign(members, partitions)
    totals = [len(assigned) for assigned in result.values()]
    assert max(totals) - min(totals) <= 1
    check_valid(members, partitions, result)


@pytest.mark.parametrize("assignor", BOTH, ids=lambda a: a.name)
@given(inputs=group_inputs, rnd=st.randoms())
def test_explicit_member_order_is_still_valid(assignor, inputs, rnd):
    raw, partitions = inputs
    members = build(raw)
    order = sorted(members)
    rnd.shuffle(order)
    result = assignor.assign(members, partitions, member_order=order)
    assert list(result) == order
    check_valid(members, partitions, result)
