"""Property tests of the assignors over random groups and multi-round histories (no Redis).

Each history starts from a random group and applies random events: members join and leave,
change subscriptions, and topics grow. Every round feeds the previous round's assignment back
as the members' ``owned_partitions`` with the round's generation, as the client does.
"""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rcoord.assignors import get_assignor, validate_cooperative_assignment
from rcoord.protocol.consumer import ConsumerProtocolSubscription
from rcoord.protocol.offsets import TopicPartition

TOPICS = ["t0", "t1", "t2"]
ALL = ["range", "roundrobin", "sticky", "cooperative-sticky", "rack-affinity"]

ids = st.sampled_from([f"m{i}" for i in range(8)])
topic_sets = st.lists(st.sampled_from(TOPICS), min_size=1, max_size=3, unique=True)
groups = st.dictionaries(ids, topic_sets, min_size=1, max_size=6)
counts = st.fixed_dictionaries({t: st.integers(0, 9) for t in TOPICS})
events = st.lists(st.one_of(
    st.tuples(st.just("join"), ids, topic_sets),
    st.tuples(st.just("leave"), ids, st.just([])),
    st.tuples(st.just("resubscribe"), ids, topic_sets),
    st.tuples(st.just("grow"), st.sampled_from(TOPICS), st.integers(1, 4)),
    st.tuples(st.just("nothing"), st.just(""), st.just([])),
), max_size=6)


def every_partition(subs, parts):
    wanted = {t for topics in subs.values() for t in topics}
    return {TopicPartition(t, p) for t in wanted for p in range(parts.get(t, 0))}


def check_valid(subs, parts, result, complete=True):
    assert set(result) == set(subs)
    owners = Counter(tp for assigned in result.values() for tp in assigned)
    assert all(n == 1 for n in owners.values())
    if complete:
        assert set(owners) == every_partition(subs, parts)
    for mid, assigned in result.items():
        assert all(tp.topic in subs[mid] and tp.partition < parts[tp.topic] for tp in assigned)


def check_balanced(subs, parts, result):
    """Kafka's rule: no member could take a partition it subscribes to from one 2+ heavier.

    With identical subscriptions this is "counts differ by at most one".
    """
    size = {m: len(p) for m, p in result.items()}
    for mid in result:
        for other, theirs in result.items():
            if size[other] > size[mid] + 1:
                assert not any(tp.topic in subs[mid] for tp in theirs), (mid, other, result)


def build(subs, owned=None, generation=-1):
    owned = owned or {}
    return {m: ConsumerProtocolSubscription(t, owned_partitions=owned.get(m, ()),
                                            generation_id=generation if m in owned else -1)
            for m, t in subs.items()}


def apply(event, subs, parts):
    kind, key, arg = event
    subs, parts = dict(subs), dict(parts)
    if kind in ("join", "resubscribe"):
        subs[key] = arg
    elif kind == "leave" and len(subs) > 1:
        subs.pop(key, None)
    elif kind == "grow":
        parts[key] += arg
    return subs, parts


@pytest.mark.parametrize("name", ALL)
@settings(max_examples=60, deadline=None)
@given(group=groups, parts=counts, history=events)
def test_every_round_is_valid_and_balanced(name, group, parts, history):
    assignor = get_assignor(name)
    subs, owned = group, {}
    for generation, event in enumerate([("nothing", "", [])] + history, start=1):
        subs, parts = apply(event, subs, parts)
        owned = {m: p for m, p in owned.items() if m in subs}
        members = build(subs, owned, generation - 1)
        result = assignor.assign(members, parts)
        if name == "cooperative-sticky":
            validate_cooperative_assignment({m: s.owned_partitions for m, s in members.items()},
                                            result)
            check_valid(subs, parts, result, complete=False)
        else:
            check_valid(subs, parts, result)
            if name in ("sticky", "roundrobin") and len({tuple(t) for t in subs.values()}) == 1:
                sizes = [len(p) for p in result.values()]
                assert max(sizes) - min(sizes) <= 1
            if name == "sticky":
                check_balanced(subs, parts, result)
        owned = result


@settings(max_examples=150, deadline=None)
@given(group=groups, parts=counts, history=events)
def test_sticky_keeps_what_balance_allows(group, parts, history):
    """With identical subscriptions each member keeps its owned partitions up to its quota."""
    sticky = get_assignor("sticky")
    topics = sorted(set(next(iter(group.values()))))
    subs = dict.fromkeys(group, topics)
    owned: dict[str, list[TopicPartition]] = {}
    for generation, event in enumerate([("nothing", "", [])] + history, start=1):
        if event[0] in ("join", "resubscribe"):
            event = (event[0], event[1], topics)
        subs, parts = apply(event, subs, parts)
        owned = {m: p for m, p in owned.items() if m in subs}
        result = sticky.assign(build(subs, owned, generation - 1), parts)
        total = sum(parts[t] for t in topics)
        quota = total // len(subs)
        for mid, mine in owned.items():
            still = [tp for tp in mine if tp.partition < parts[tp.topic]]
            kept = set(still) & set(result[mid])
            assert len(kept) >= min(len(still), quota), (mid, mine, result[mid])
        owned = result


@settings(max_examples=150, deadline=None)
@given(group=groups, parts=counts, history=events)
def test_cooperative_settles_within_two_rounds(group, parts, history):
    """After any change, the round that follows hands out everything held back.

    Round 1 leaves out partitions that move between owners (validated: nobody gets a partition
    another member still owns); the members revoke them and rejoin; round 2 assigns them. It
    then matches what the eager sticky assignor would have given for the same ownership.
    """
    coop = get_assignor("cooperative-sticky")
    subs, owned = group, {}
    generation = 0
    for event in [("nothing", "", [])] + history:
        subs, parts = apply(event, subs, parts)
        owned = {m: p for m, p in owned.items() if m in subs}
        for round_no in (1, 2):
            generation += 1
            members = build(subs, owned, generation - 1)
            result = coop.assign(members, parts)
            validate_cooperative_assignment({m: s.owned_partitions for m, s in members.items()},
                                            result)
            owned = result
            assigned = {tp for p in result.values() for tp in p}
            if assigned == every_partition(subs, parts):
                break
        else:
            pytest.fail(f"partitions still held back after 2 rounds: {result}")
        check_valid(subs, parts, owned)
        check_balanced(subs, parts, owned)


@pytest.mark.parametrize("name", ALL)
@settings(max_examples=40, deadline=None)
@given(group=groups, parts=counts, rnd=st.randoms(use_true_random=False))
def test_deterministic_whatever_the_insertion_order(name, group, parts, rnd):
    assignor = get_assignor(name)
    members = build(group)
    items = list(members.items())
    rnd.shuffle(items)
    assert assignor.assign(dict(items), parts) == assignor.assign(members, parts)
