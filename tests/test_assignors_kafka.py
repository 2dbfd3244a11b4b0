"""Cases from Kafka's and kafka-go's assignor tests, re-expressed as data tables (no Redis).

Sources (read, not copied): Kafka's RangeAssignorTest (rack-aware cases),
AbstractStickyAssignorTest, StickyAssignorTest and CooperativeStickyAssignorTest, and
kafka-go's TestRackAffinityGroupBalancer. Kafka runs its abstract sticky tests against both
sticky assignors; for cooperative-sticky it first repeats the rebalance until nothing is
revoked any more and then checks the same expected assignment, and so do these tests.
"""

from __future__ import annotations

import re
from collections import Counter

import pytest

from rcoord.assignors import (
    CooperativeAssignmentError,
    RebalanceProtocol,
    get_assignor,
    partitions_transferring_ownership,
    rebalance_protocol,
    sticky_assignment,
    validate_cooperative_assignment,
)
from rcoord.protocol.consumer import ConsumerProtocolSubscription
from rcoord.protocol.kafka_consumer import encode_subscription
from rcoord.protocol.offsets import TopicPartition

ALL_RACKS = ["a", "b", "c", "d", "e", "f"]


def tps(spec: str) -> list[TopicPartition]:
    """'t1-0, t2-3' or 't1p0 t2p3' -> sorted TopicPartitions."""
    out = []
    for item in re.split(r"[,\s]+", spec.strip()):
        if item:
            topic, part = re.fullmatch(r"(.+?)(?:-|p)(\d+)", item).groups()
            out.append(TopicPartition(topic, int(part)))
    return sorted(out)


def sub(topics: str, owned: str = "", gen: int = -1, rack: str | None = None):
    return ConsumerProtocolSubscription(topics.split(), owned_partitions=tps(owned),
                                        generation_id=gen, rack=rack)


def kafka_racks(counts: dict[str, int], replication: int, broker_racks: list[str | None]):
    """Kafka's test layout: replica j of partition i (topic offset n) on broker (i+j+n) % B."""
    racks: dict[TopicPartition, set[str]] = {}
    offset = 0
    for topic, count in counts.items():
        for i in range(count):
            names = {broker_racks[(i + j + offset) % len(broker_racks)] for j in range(replication)}
            racks[TopicPartition(topic, i)] = {r for r in names if r is not None}
        offset += count
    return racks


def check_valid(members, counts, result):
    assert set(result) == set(members)
    owners = Counter(tp for parts in result.values() for tp in parts)
    assert all(n == 1 for n in owners.values()), owners
    for mid, parts in result.items():
        assert all(tp.topic in members[mid].topics for tp in parts)


def converge(name, members, counts, generation=1):
    """Kafka's cooperative verifyValidityAndBalance: rebalance until nothing is revoked."""
    assignor = get_assignor(name)
    result = assignor.assign(members, counts)
    for _ in range(4):
        owned = {m: members[m].owned_partitions for m in members}
        validate_cooperative_assignment(owned, result)
        revoked = any(set(owned[m]) - set(result[m]) for m in members)
        if not revoked:
            return result
        members = {m: ConsumerProtocolSubscription(s.topics, owned_partitions=result[m],
                                                   generation_id=generation, rack=s.rack)
                   for m, s in members.items()}
        result = assignor.assign(members, counts)
    raise AssertionError("cooperative rebalancing did not settle within 4 rounds")


# -- range, rack-aware (RangeAssignorTest) ----------------------------------------------------

ALL3 = "t1 t2 t3"
RANGE_RACK_CASES = {
    # name: (topics, consumer topics, replication, broker racks, consumer racks, expected)
    "uniform_no_racks": ({"t1": 6, "t2": 7, "t3": 2}, [ALL3] * 3, 3, [None] * 3, ["a", "b", "c"],
                         ["t1-0, t1-1, t2-0, t2-1, t2-2, t3-0", "t1-2, t1-3, t2-3, t2-4, t3-1",
                          "t1-4, t1-5, t2-5, t2-6"]),
    "uniform_every_partition_on_every_rack": (
        {"t1": 6, "t2": 7, "t3": 2}, [ALL3] * 3, 3, ["a", "b", "c"], ["a", "b", "c"],
        ["t1-0, t1-1, t2-0, t2-1, t2-2, t3-0", "t1-2, t1-3, t2-3, t2-4, t3-1",
         "t1-4, t1-5, t2-5, t2-6"]),
    "uniform_consumers_on_other_racks": (
        {"t1": 6, "t2": 7, "t3": 2}, [ALL3] * 3, 3, ["a", "b", "c"], ["d", "e", "f"],
        ["t1-0, t1-1, t2-0, t2-1, t2-2, t3-0", "t1-2, t1-3, t2-3, t2-4, t3-1",
         "t1-4, t1-5, t2-5, t2-6"]),
    "uniform_rf1": ({"t1": 6, "t2": 7, "t3": 2}, [ALL3] * 3, 1, ["a", "b", "c"], ["a", "b", "c"],
                    ["t1-0, t1-3, t2-0, t2-3, t2-6", "t1-1, t1-4, t2-1, t2-4, t3-0",
                     "t1-2, t1-5, t2-2, t2-5, t3-1"]),
    "uniform_rf2": ({"t1": 6, "t2": 7, "t3": 2}, [ALL3] * 3, 2, ["a", "b", "c"], ["a", "b", "c"],
                    ["t1-0, t1-2, t2-0, t2-2, t2-3, t3-1", "t1-1, t1-3, t2-1, t2-4, t3-0",
                     "t1-4, t1-5, t2-5, t2-6"]),
    "uniform_one_consumer_rack_without_partitions": (
        {"t1": 6, "t2": 7, "t3": 2}, [ALL3] * 3, 3, ["a", "b"], ["a", "b", "c"],
        ["t1-0, t1-1, t2-0, t2-1, t2-2, t3-0", "t1-2, t1-3, t2-3, t2-4, t3-1",
         "t1-4, t1-5, t2-5, t2-6"]),
    "non_equal_rf1": ({"t1": 6, "t2": 7, "t3": 2}, [ALL3, ALL3, "t1 t3"], 1, ["a", "b", "c"],
                      ["a", "b", "c"],
                      ["t1-0, t1-3, t2-0, t2-2, t2-3, t2-6", "t1-1, t1-4, t2-1, t2-4, t2-5, t3-0",
                       "t1-2, t1-5, t3-1"]),
    "non_equal_rf2": ({"t1": 6, "t2": 7, "t3": 2}, [ALL3, ALL3, "t1 t3"], 2, ["a", "b", "c"],
                      ["a", "b", "c"],
                      ["t1-0, t1-2, t2-0, t2-2, t2-3, t2-5, t3-1",
                       "t1-1, t1-3, t2-1, t2-4, t2-6, t3-0", "t1-4, t1-5"]),
    "co_partitioning_beats_racks_rf1": (
        {"t1": 5, "t2": 5, "t3": 5}, [ALL3] * 3, 1, ["a", "b", "c"], ["a", "b", "c"],
        ["t1-0, t1-1, t2-0, t2-1, t3-0, t3-1", "t1-2, t1-3, t2-2, t2-3, t3-2, t3-3",
         "t1-4, t2-4, t3-4"]),
    "co_partitioning_non_equal_rf1": (
        {"t1": 5, "t2": 5, "t3": 5}, [ALL3, ALL3, "t1 t3"], 1, ["a", "b", "c"], ["a", "b", "c"],
        ["t1-0, t1-1, t2-0, t2-1, t2-4, t3-0, t3-1", "t1-2, t1-3, t2-2, t2-3, t3-2, t3-3",
         "t1-4, t3-4"]),
    "co_partitioning_non_equal_rf2": (
        {"t1": 5, "t2": 5, "t3": 5}, [ALL3, ALL3, "t1 t3"], 2, ["a", "b", "c"], ["a", "b", "c"],
        ["t1-2, t2-0, t2-1, t2-3, t3-2", "t1-0, t1-3, t2-2, t2-4, t3-0, t3-3",
         "t1-1, t1-4, t3-1, t3-4"]),
    "co_partitioned_pairs_rf1": (
        {"t1": 6, "t2": 6, "t3": 2, "t4": 2}, ["t1 t2", "t1 t2", "t3 t4", "t3 t4"], 1,
        ["a", "b"], ["a", "b", "b", "a"],
        ["t1-0, t1-2, t1-4, t2-0, t2-2, t2-4", "t1-1, t1-3, t1-5, t2-1, t2-3, t2-5",
         "t3-1, t4-1", "t3-0, t4-0"]),
    "co_partitioned_all_topics_rf1_two_racks": (
        {"t1": 6, "t2": 6, "t3": 2, "t4": 2}, ["t1 t2 t3 t4"] * 4, 1, ["a", "b"],
        ["a", "b", "b", "a"],
        ["t1-0, t1-2, t2-0, t2-2, t3-0, t4-0", "t1-1, t1-3, t2-1, t2-3, t3-1, t4-1",
         "t1-5, t2-5", "t1-4, t2-4"]),
    "co_partitioned_all_topics_rf1_three_racks": (
        {"t1": 6, "t2": 6, "t3": 2, "t4": 2}, ["t1 t2 t3 t4"] * 4, 1, ["a", "b", "c"],
        ["a", "b", "b", "a"],
        ["t1-0, t1-3, t2-0, t2-3, t3-0, t4-0", "t1-1, t1-4, t2-1, t2-4, t3-1, t4-1",
         "t1-2, t2-2", "t1-5, t2-5"]),
}


@pytest.mark.parametrize("case", RANGE_RACK_CASES)
def test_range_rack_aware(case):
    counts, topics, replication, broker_racks, consumer_racks, expected = RANGE_RACK_CASES[case]
    members = {f"consumer{i}": sub(t, rack=r)
               for i, (t, r) in enumerate(zip(topics, consumer_racks, strict=True))}
    racks = kafka_racks(counts, replication, broker_racks)
    got = get_assignor("range").assign(members, counts, partition_racks=racks)
    assert got == {f"consumer{i}": tps(e) for i, e in enumerate(expected)}


def test_range_without_member_racks_ignores_partition_racks():
    counts = {"t1": 6, "t2": 7, "t3": 2}
    members = {f"consumer{i}": sub(ALL3) for i in range(3)}
    racks = kafka_racks(counts, 1, ["a", "b", "c"])
    plain = get_assignor("range").assign(members, counts)
    assert get_assignor("range").assign(members, counts, partition_racks=racks) == plain


# -- sticky (AbstractStickyAssignorTest, StickyAssignorTest) ----------------------------------

STICKY_CASES = {
    # name: (members, partitions per topic, expected assignment, expected transferring or None)
    "one_consumer_no_topic": ({"consumer": sub("")}, {}, {"consumer": ""}, {}),
    "one_consumer_nonexistent_topic": ({"consumer": sub("topic")}, {"topic": 0},
                                       {"consumer": ""}, {}),
    "one_consumer_one_topic": ({"consumer": sub("topic")}, {"topic": 3},
                               {"consumer": "topic-0 topic-1 topic-2"}, {}),
    "only_subscribed_topics": ({"consumer": sub("topic")}, {"topic": 3, "other": 3},
                               {"consumer": "topic-0 topic-1 topic-2"}, {}),
    "one_consumer_multiple_topics": ({"consumer": sub("topic1 topic2")},
                                     {"topic1": 1, "topic2": 2},
                                     {"consumer": "topic1-0 topic2-0 topic2-1"}, {}),
    "two_consumers_one_partition": ({"consumer1": sub("topic"), "consumer2": sub("topic")},
                                    {"topic": 1}, {"consumer1": "topic-0", "consumer2": ""}, {}),
    "two_consumers_two_partitions": ({"consumer1": sub("topic"), "consumer2": sub("topic")},
                                     {"topic": 2},
                                     {"consumer1": "topic-0", "consumer2": "topic-1"}, {}),
    "mixed_topic_subscriptions": (
        {"consumer1": sub("topic1"), "consumer2": sub("topic1 topic2"),
         "consumer3": sub("topic1")},
        {"topic1": 3, "topic2": 2},
        {"consumer1": "topic1-0 topic1-2", "consumer2": "topic2-0 topic2-1",
         "consumer3": "topic1-1"}, {}),
    "two_consumers_two_topics_six_partitions": (
        {"consumer1": sub("topic1 topic2"), "consumer2": sub("topic1 topic2")},
        {"topic1": 3, "topic2": 3},
        {"consumer1": "topic1-0 topic1-2 topic2-1", "consumer2": "topic1-1 topic2-0 topic2-2"},
        {}),
    "owning_min_quota_expecting_max_quota": (
        {"consumer1": sub("topic1 topic2", "topic1-0 topic2-1", 1),
         "consumer2": sub("topic1 topic2", "topic1-1 topic2-2", 1)},
        {"topic1": 2, "topic2": 3},
        {"consumer1": "topic1-0 topic2-1 topic2-0", "consumer2": "topic1-1 topic2-2"}, {}),
    "more_max_quota_owners_than_wanted": (
        {"consumer1": sub("topic1 topic2", "topic1-0 topic2-0", 1),
         "consumer2": sub("topic1 topic2", "topic1-1 topic2-1", 1),
         "consumer3": sub("topic1 topic2", "", 1)},
        {"topic1": 2, "topic2": 2},
        # Kafka expects consumer2 to keep both: its HashMap happens to visit consumer2 first.
        # Visiting in id order, consumer1 keeps both; see test_max_quota_goes_to_first_visited.
        {"consumer1": "topic1-0 topic2-0", "consumer2": "topic1-1", "consumer3": "topic2-1"},
        {TopicPartition("topic2", 1): "consumer3"}),
    "all_under_min_quota": (
        {"consumer1": sub("topic1 topic2", "topic1-0", 1),
         "consumer2": sub("topic1 topic2", "topic1-1", 1),
         "consumer3": sub("topic1 topic2", "", 1)},
        {"topic1": 2, "topic2": 3},
        {"consumer1": "topic1-0 topic2-1", "consumer2": "topic1-1 topic2-2",
         "consumer3": "topic2-0"}, {}),
    "consumer_added_one_topic": (
        {"consumer1": sub("topic", "topic-0 topic-1 topic-2", 1), "consumer2": sub("topic", "", 1)},
        {"topic": 3},
        {"consumer1": "topic-0 topic-1", "consumer2": "topic-2"},
        {TopicPartition("topic", 2): "consumer2"}),
    "consumer_removed_one_topic": ({"consumer2": sub("topic", "topic-2", 1)}, {"topic": 3},
                                   {"consumer2": "topic-0 topic-1 topic-2"}, {}),
    "all_reach_quota": (
        {"consumer1": sub("topic", "topic-0 topic-1", 1), "consumer2": sub("topic", "topic-2", 1),
         "consumer3": sub("topic", "", 1)},
        {"topic": 4},
        {"consumer1": "topic-0 topic-1", "consumer2": "topic-2", "consumer3": "topic-3"}, {}),
    "stale_generation_loses": (
        {"consumer1": sub("topic topic2", "topic-0 topic-2 topic2-1", 10),
         "consumer2": sub("topic topic2", "topic-0 topic-2 topic2-1", 9)},
        {"topic": 3, "topic2": 3},
        {"consumer1": "topic-0 topic-2 topic2-1", "consumer2": "topic-1 topic2-0 topic2-2"}, {}),
    "no_generation_loses": (
        {"consumer1": sub("topic topic2", "topic-0 topic-2 topic2-1", 10),
         "consumer2": sub("topic topic2", "topic-0 topic-2 topic2-1", -1)},
        {"topic": 3, "topic2": 3},
        {"consumer1": "topic-0 topic-2 topic2-1", "consumer2": "topic-1 topic2-0 topic2-2"}, {}),
    "same_generation_claims_void_the_partition": (
        {"consumer1": sub("topic", "topic-0 topic-1", 1),
         "consumer2": sub("topic", "topic-0 topic-2", 1), "consumer3": sub("topic", "", 1)},
        {"topic": 3},
        {"consumer1": "topic-1", "consumer2": "topic-2", "consumer3": "topic-0"},
        {TopicPartition("topic", 0): "consumer3"}),
    "same_generation_claims_unequal_counts": (
        {"consumer1": sub("topic", "topic-0 topic-1", 1),
         "consumer2": sub("topic", "topic-0 topic-2", 1), "consumer3": sub("topic", "", 1)},
        {"topic": 4},
        {"consumer1": "topic-1 topic-3", "consumer2": "topic-2", "consumer3": "topic-0"},
        {TopicPartition("topic", 0): "consumer3"}),
    "highest_generation_wins": (
        {"consumer1": sub("topic topic2 topic3", "topic-0 topic2-0 topic3-0", 10),
         "consumer2": sub("topic topic2 topic3", "topic-1 topic2-1 topic3-1", 9),
         "consumer3": sub("topic topic2 topic3", "topic2-1 topic3-0 topic3-2", 8)},
        {"topic": 3, "topic2": 3, "topic3": 3},
        {"consumer1": "topic-0 topic2-0 topic3-0", "consumer2": "topic-1 topic2-1 topic3-1",
         "consumer3": "topic-2 topic2-2 topic3-2"}, {}),
    "multiple_generations_invalidated": (
        {"consumer1": sub("topic topic2", "topic-0 topic2-1 topic-1", 10),
         "consumer2": sub("topic topic2", "topic-0 topic2-1 topic2-2", 8)},
        {"topic": 3, "topic2": 3},
        {"consumer1": "topic-0 topic2-1 topic-1", "consumer2": "topic-2 topic2-2 topic2-0"}, {}),
}


def _expected(spec):
    return {m: tps(v) for m, v in spec.items()}


@pytest.mark.parametrize("case", STICKY_CASES)
def test_sticky_cases(case):
    members, counts, expected, transferring = STICKY_CASES[case]
    got, moving = sticky_assignment(members, counts)
    check_valid(members, counts, got)
    if expected is not None:
        assert got == _expected(expected)
    if transferring is not None:
        assert moving == transferring
    assert get_assignor("sticky").assign(members, counts) == got


@pytest.mark.parametrize("case", STICKY_CASES)
def test_cooperative_sticky_converges_to_the_sticky_result(case):
    members, counts, expected, _ = STICKY_CASES[case]
    final = converge("cooperative-sticky", members, counts)
    check_valid(members, counts, final)
    if expected is not None:
        assert final == _expected(expected)
    sizes = [len(p) for p in final.values()]
    if len({m.topics for m in members.values()}) == 1 and sum(counts.values()):
        assert max(sizes) - min(sizes) <= 1


def test_max_quota_goes_to_first_visited():
    # The same case with the member ids swapped gives Kafka's published answer.
    members = {"consumer2": sub("topic1 topic2", "topic1-0 topic2-0", 1),
               "consumer1": sub("topic1 topic2", "topic1-1 topic2-1", 1),
               "consumer3": sub("topic1 topic2", "", 1)}
    got, moving = sticky_assignment(members, {"topic1": 2, "topic2": 2})
    assert got == {"consumer2": tps("topic1-0"), "consumer1": tps("topic1-1 topic2-1"),
                   "consumer3": tps("topic2-0")}
    assert moving == {TopicPartition("topic2", 0): "consumer3"}


def _sticky(members, counts):
    result = get_assignor("sticky").assign(members, counts)
    check_valid(members, counts, result)
    return result


@pytest.mark.parametrize("all_equal", [True, False])
def test_multiple_generations_1(all_equal):
    # StickyAssignorTest.testAssignmentWithMultipleGenerations1.
    counts = {"topic": 6, "topic2": 6}
    both = "topic topic2"
    c2_topics = both if all_equal else "topic"
    r1 = _sticky({"consumer1": sub(both), "consumer2": sub(c2_topics),
                  "consumer3": sub(both)}, counts)
    assert [len(r1[m]) for m in sorted(r1)] == [4, 4, 4]
    r2 = _sticky({"consumer1": ConsumerProtocolSubscription(both.split(), owned_partitions=r1[
        "consumer1"], generation_id=1),
                  "consumer2": ConsumerProtocolSubscription(c2_topics.split(), owned_partitions=r1[
                      "consumer2"], generation_id=1)}, counts)
    assert len(r2["consumer1"]) == 6 and len(r2["consumer2"]) == 6
    if all_equal:
        assert set(r1["consumer1"]) <= set(r2["consumer1"])
    assert set(r1["consumer2"]) <= set(r2["consumer2"])
    assert set(r2["consumer2"]) & set(r1["consumer3"])
    # consumer3 comes back with its stale generation-1 claims; consumer2's generation 2 wins.
    r3 = _sticky({"consumer2": ConsumerProtocolSubscription(c2_topics.split(), owned_partitions=r2[
        "consumer2"], generation_id=2),
                  "consumer3": ConsumerProtocolSubscription(both.split(), owned_partitions=r1[
                      "consumer3"], generation_id=1)}, counts)
    assert len(r3["consumer2"]) == 6 and len(r3["consumer3"]) == 6


@pytest.mark.parametrize("all_equal", [True, False])
def test_multiple_generations_2(all_equal):
    # StickyAssignorTest.testAssignmentWithMultipleGenerations2.
    counts = {"topic": 4, "topic2": 4, "topic3": 4}
    every = "topic topic2 topic3"
    c1_topics = every if all_equal else "topic"
    c3_topics = every if all_equal else "topic topic2"
    r1 = _sticky({"consumer1": sub(c1_topics), "consumer2": sub(every),
                  "consumer3": sub(c3_topics)}, counts)
    assert [len(r1[m]) for m in sorted(r1)] == [4, 4, 4]
    owned2 = ConsumerProtocolSubscription(every.split(), owned_partitions=r1["consumer2"],
                                          generation_id=1)
    r2 = _sticky({"consumer2": owned2}, counts)
    assert len(r2["consumer2"]) == 12
    r3 = _sticky({
        "consumer1": ConsumerProtocolSubscription(c1_topics.split(), owned_partitions=r1[
            "consumer1"], generation_id=1),
        "consumer2": ConsumerProtocolSubscription(every.split(), owned_partitions=r2[
            "consumer2"], generation_id=2),
        "consumer3": ConsumerProtocolSubscription(c3_topics.split(), owned_partitions=r1[
            "consumer3"], generation_id=1)}, counts)
    assert [len(r3[m]) for m in sorted(r3)] == [4, 4, 4]


@pytest.mark.parametrize("all_equal", [True, False])
def test_conflicting_previous_generations(all_equal):
    # StickyAssignorTest.testAssignmentWithConflictingPreviousGenerations.
    counts = {"topic": 4, "topic2": 4, "topic3": 4}
    every = "topic topic2 topic3"
    c1_owned = "topic-0 topic-1 topic-2 topic2-2 topic2-3 topic3-0" if all_equal else (
        "topic-0 topic-1 topic-2 topic-3")
    c2_owned = "topic-0 topic-1 topic2-0 topic2-1 topic2-2 topic2-3"
    c3_owned = "topic-2 topic-3 topic3-0 topic3-1 topic3-2 topic3-3"
    members = {"consumer1": sub(every if all_equal else "topic", c1_owned, 1),
               "consumer2": sub(every if all_equal else "topic topic2", c2_owned, 2),
               "consumer3": sub(every, c3_owned, 2)}
    got = _sticky(members, counts)
    assert [len(got[m]) for m in sorted(got)] == [4, 4, 4]
    assert set(got["consumer2"]) <= set(tps(c2_owned))
    assert set(got["consumer3"]) <= set(tps(c3_owned))


COOPERATIVE_FIRST_ROUND = {
    # CooperativeStickyAssignorTest: the first round leaves out partitions still owned.
    "same_generation_claims_void_the_partition": {
        "consumer1": "topic-1", "consumer2": "topic-2", "consumer3": ""},
    "same_generation_claims_unequal_counts": {
        "consumer1": "topic-1 topic-3", "consumer2": "topic-2", "consumer3": ""},
    "consumer_added_one_topic": {"consumer1": "topic-0 topic-1", "consumer2": ""},
    "more_max_quota_owners_than_wanted": {
        "consumer1": "topic1-0 topic2-0", "consumer2": "topic1-1", "consumer3": ""},
}


@pytest.mark.parametrize("case", COOPERATIVE_FIRST_ROUND)
def test_cooperative_first_round_holds_back_owned_partitions(case):
    members, counts, _, _ = STICKY_CASES[case]
    got = get_assignor("cooperative-sticky").assign(members, counts)
    assert got == _expected(COOPERATIVE_FIRST_ROUND[case])


def test_cooperative_general_path_uses_reported_ownership():
    # Unequal subscriptions take Kafka's general path; the held-back partitions are computed
    # from what members reported owning.
    members = {"c1": sub("t u", "tp0 tp1 tp2 up0", 3), "c2": sub("t", "", 3)}
    sticky, moving = sticky_assignment(members, {"t": 3, "u": 1})
    coop = get_assignor("cooperative-sticky").assign(members, {"t": 3, "u": 1})
    assert moving and all(tp not in coop[mid] for tp, mid in moving.items())
    assert moving == partitions_transferring_ownership(
        {m: s.owned_partitions for m, s in members.items()}, sticky)


def test_uniform_subscription_transferring_with_racks():
    # CooperativeStickyAssignorTest.testUniformSubscriptionTransferOwnershipListIsRight:
    # rf 1 on two racks, each member owns the partitions of the other rack.
    counts = {"topic1": 4}
    racks = kafka_racks(counts, 1, ["a", "b"])
    members = {"c0": sub("topic1", "topic1-0 topic1-1", 1, "a"),
               "c1": sub("topic1", "topic1-2 topic1-3", 1, "b")}
    _, moving = sticky_assignment(members, counts, partition_racks=racks)
    assert len(moving) == 2


@pytest.mark.parametrize("name", ["sticky", "cooperative-sticky"])
def test_sticky_rack_aware_uniform(name):
    # AbstractStickyAssignorTest.testRackAwareAssignmentWithUniformSubscription, rf 1: with
    # racks every partition goes to a member on its rack when balance allows.
    counts = {"t1": 6, "t2": 7, "t3": 2}
    racks = kafka_racks(counts, 1, ["a", "b", "c"])
    members = {f"consumer{i}": sub(ALL3, rack=r) for i, r in enumerate("abc")}
    got = get_assignor(name).assign(members, counts, partition_racks=racks)
    check_valid(members, counts, got)
    assert sorted(len(p) for p in got.values()) == [5, 5, 5]
    mismatched = [tp for m, parts in got.items() for tp in parts
                  if members[m].rack not in racks[tp]]
    assert mismatched == []


def test_sticky_rack_aware_general_path_prefers_racks():
    counts = {"t1": 6, "t2": 7, "t3": 2}
    racks = kafka_racks(counts, 1, ["a", "b", "c"])
    members = {"consumer0": sub(ALL3, rack="a"), "consumer1": sub(ALL3, rack="b"),
               "consumer2": sub("t1 t3", rack="c")}
    got = get_assignor("sticky").assign(members, counts, partition_racks=racks)
    check_valid(members, counts, got)
    plain = get_assignor("sticky").assign(members, counts)
    def mismatches(result):
        return sum(members[m].rack not in racks[tp] for m, parts in result.items() for tp in parts)
    assert mismatches(got) < mismatches(plain)


# -- cooperative protocol helpers -------------------------------------------------------------


def test_protocols_declared():
    assert get_assignor("cooperative-sticky").supported_protocols == (
        RebalanceProtocol.COOPERATIVE, RebalanceProtocol.EAGER)
    for name in ["sticky", "range", "roundrobin", "rack-affinity"]:
        assert get_assignor(name).supported_protocols == (RebalanceProtocol.EAGER,)
    assert rebalance_protocol([get_assignor("cooperative-sticky")]) is RebalanceProtocol.COOPERATIVE
    assert rebalance_protocol([get_assignor("cooperative-sticky"), get_assignor("range")]) is (
        RebalanceProtocol.EAGER)


def test_validate_cooperative_assignment():
    owned = {"a": tps("tp0 tp1"), "b": tps("tp2")}
    validate_cooperative_assignment(owned, {"a": tps("tp0"), "b": tps("tp2"), "c": []})
    validate_cooperative_assignment(owned, {"a": tps("tp0 tp1"), "b": tps("tp2 tp3")})
    with pytest.raises(CooperativeAssignmentError) as info:
        validate_cooperative_assignment(owned, {"a": tps("tp0"), "b": tps("tp1 tp2")})
    assert info.value.partitions == tps("tp1")
    assert "t-1 -> b" in str(info.value)
    # A member that left (absent from the assignment) still owns until it is gone.
    with pytest.raises(CooperativeAssignmentError):
        validate_cooperative_assignment({"gone": tps("tp0")}, {"a": tps("tp0")})


def test_validate_rejects_what_plain_sticky_does_on_a_join():
    members, counts, _, _ = STICKY_CASES["consumer_added_one_topic"]
    owned = {m: s.owned_partitions for m, s in members.items()}
    with pytest.raises(CooperativeAssignmentError):
        validate_cooperative_assignment(owned, get_assignor("sticky").assign(members, counts))
    validate_cooperative_assignment(owned, get_assignor("cooperative-sticky").assign(members, counts))


# -- rack-affinity (kafka-go TestRackAffinityGroupBalancer) -----------------------------------

RACK_AFFINITY_CASES = {
    # name: (members per zone, partitions per zone, {member zone: {partition zone: count}})
    "unknown_and_known_zones": ({"": 1, "z1": 1, "z2": 1}, {"z1": 5, "z2": 4, "": 9},
                                {"z1": {"": 1, "z1": 5}, "z2": {"": 2, "z2": 4}, "": {"": 6}}),
    "all_unknown": ({"": 5}, {"": 103}, {"": {"": 103}}),
    "remainder_stays_local": ({"z1": 3, "z2": 3, "z3": 3}, {"z1": 20, "z2": 19, "z3": 20},
                              {"z1": {"z1": 20}, "z2": {"z2": 19}, "z3": {"z3": 20}}),
    "imbalanced_partitions": ({"z1": 1, "z2": 1, "z3": 1}, {"z1": 7, "z2": 0, "z3": 7},
                              {"z1": {"z1": 5}, "z2": {"z1": 2, "z3": 2}, "z3": {"z3": 5}}),
    "imbalanced_members": ({"z1": 5, "z2": 3, "z3": 1}, {"z1": 9, "z2": 9, "z3": 9},
                           {"z1": {"z1": 9, "z3": 6}, "z2": {"z2": 9}, "z3": {"z3": 3}}),
    "no_consumers_in_zone": ({"z2": 10}, {"z1": 20, "z3": 19}, {"z2": {"z1": 20, "z3": 19}}),
}


@pytest.mark.parametrize("case", RACK_AFFINITY_CASES)
def test_rack_affinity(case):
    member_zones, partition_zones, expected = RACK_AFFINITY_CASES[case]
    members = {}
    for zone, count in member_zones.items():
        for _ in range(count):
            members[f"{zone}:{len(members) + 1}"] = sub("test", rack=zone or None)
    racks, zone_of = {}, {}
    for zone, count in partition_zones.items():
        for _ in range(count):
            tp = TopicPartition("test", len(zone_of))
            zone_of[tp] = zone
            racks[tp] = {zone} if zone else set()
    got = get_assignor("rack-affinity").assign(members, {"test": len(zone_of)},
                                               partition_racks=racks)
    check_valid(members, {"test": len(zone_of)}, got)
    low = len(zone_of) // len(members)
    assert all(low <= len(p) <= low + 1 for p in got.values())
    per_zone: dict[str, Counter] = {}
    for mid, parts in got.items():
        for tp in parts:
            per_zone.setdefault(members[mid].rack or "", Counter())[zone_of[tp]] += 1
    assert {z: dict(c) for z, c in per_zone.items()} == expected


def test_rack_affinity_multi_topic():
    members = {"z1": sub("topic1 topic2", rack="z1"), "z2": sub("topic2 topic3", rack="z2"),
               "z3": sub("topic3 topic1", rack="z3")}
    leaders = {"topic1": ["z1", "z3"], "topic2": ["z1", "z2"], "topic3": ["z3", "z2"]}
    # kafka-go numbers these partitions 1 and 2; here they are 0 and 1.
    racks = {TopicPartition(t, i): {z} for t, zs in leaders.items() for i, z in enumerate(zs)}
    got = get_assignor("rack-affinity").assign(members, {t: 2 for t in leaders},
                                               partition_racks=racks)
    assert got == {"z1": tps("topic1-0 topic2-0"), "z2": tps("topic2-1 topic3-1"),
                   "z3": tps("topic1-1 topic3-0")}


def test_rack_affinity_reads_a_kafka_go_members_zone_from_user_data():
    """kafka-go's balancer sends its rack as the bare user_data of a v0 subscription, which has
    no rack field, and reads every member's zone from there: a kafka-go member in a group an
    rcoord member leads gets its own zone's partitions (it was zone "" and got the others')."""
    kafka_go = ConsumerProtocolSubscription.decode(
        encode_subscription(["t"], user_data=b"z1", version=0))
    assert kafka_go.rack is None
    members = {"go": kafka_go, "py": sub("t", rack="z2"),
               "bad": ConsumerProtocolSubscription(["t"], user_data=b"\xff")}
    racks = {TopicPartition("t", p): {z} for p, z in enumerate(["z2", "z2", "z1", "z1", "", ""])}
    got = get_assignor("rack-affinity").assign(members, {"t": 6}, partition_racks=racks)
    assert got == {"go": tps("t-2 t-3"), "py": tps("t-0 t-1"), "bad": tps("t-4 t-5")}


def test_rack_affinity_without_racks_balances():
    members = {f"m{i}": sub("t") for i in range(3)}
    got = get_assignor("rack-affinity").assign(members, {"t": 7})
    assert sorted(len(p) for p in got.values()) == [2, 2, 3]
    check_valid(members, {"t": 7}, got)


@pytest.mark.parametrize("name", ["range", "roundrobin", "sticky", "cooperative-sticky",
                                  "rack-affinity"])
@pytest.mark.parametrize("bad", [["a"], {TopicPartition("t", 0): "a"}, {("t",): {"a"}}])
def test_bad_partition_racks(name, bad):
    with pytest.raises(TypeError):
        get_assignor(name).assign({"m": sub("t")}, {"t": 1}, partition_racks=bad)
