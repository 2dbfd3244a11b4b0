"""The sticky assignors settle with racks and unequal subscriptions (no Redis).

Each round feeds the previous round's assignment back as the members' ``owned_partitions``
with the next generation, as the client does; the group must reach an assignment that the
next round repeats. Kafka's AbstractStickyAssignor does not always: it takes every owned
partition off its rack away, balancing puts partitions back off their racks, and the group
rebalances for ever (the first case below is one it cycles on).
"""

from __future__ import annotations

import random
from collections import Counter

import pytest

from rcoord.assignors import get_assignor, validate_cooperative_assignment
from rcoord.protocol.consumer import ConsumerProtocolSubscription
from rcoord.protocol.offsets import TopicPartition as TP

STICKY = ["sticky", "cooperative-sticky"]
MAX_ROUNDS = {"sticky": 2, "cooperative-sticky": 4}
"""Distinct assignments before one repeats: eager settles at once or after one move;
cooperative adds the revoke-then-assign round (and, rarely, one more: Kafka without racks
needs it too)."""


def rounds(name, subs, member_racks, counts, racks, owned=None, generation=0, limit=12):
    """Rebalance until an assignment repeats the previous one: (assignments seen, final)."""
    assignor = get_assignor(name)
    owned = dict(owned or {})
    seen: list[dict[str, list[TP]]] = []
    for gen in range(generation + 1, generation + 1 + limit):
        members = {m: ConsumerProtocolSubscription(
            topics, owned_partitions=owned.get(m, ()),
            generation_id=gen - 1 if m in owned else -1, rack=member_racks[m])
            for m, topics in subs.items()}
        result = assignor.assign(members, counts, partition_racks=racks)
        if name == "cooperative-sticky":
            validate_cooperative_assignment({m: owned.get(m, []) for m in subs}, result)
        assert all(tp.topic in subs[m] for m, parts in result.items() for tp in parts)
        assert all(n == 1 for n in Counter(tp for p in result.values() for tp in p).values())
        if seen and result == seen[-1]:
            return seen, result
        assert result not in seen, f"{name} cycles: {seen}"
        seen.append(result)
        owned = {m: list(parts) for m, parts in result.items()}
    raise AssertionError(f"{name} did not settle in {limit} rounds: {seen}")


def check_settled(subs, counts, result):
    """Everything assigned, and balanced as Kafka means it (no member could take a partition
    of a topic it subscribes to from a member 2+ heavier)."""
    wanted = {TP(t, p) for topics in subs.values() for t in topics for p in range(counts[t])}
    assert {tp for parts in result.values() for tp in parts} == wanted
    size = {m: len(parts) for m, parts in result.items()}
    for mid in result:
        for other, theirs in result.items():
            if size[other] > size[mid] + 1:
                assert not any(tp.topic in subs[mid] for tp in theirs), (mid, other, result)


# Five members, seven partitions, one rack per partition. m0 (rack r0) reads only b, and no
# partition of b is on r0, so whatever b partition it holds is off its rack; Kafka took it
# away every other round and gave it (or another) back, leaving three partitions unread.
CYCLE_COUNTS = {"a": 2, "b": 3, "c": 2}
CYCLE_RACKS = {TP("a", 0): {"r1"}, TP("a", 1): {"r1"}, TP("b", 0): {"r1"}, TP("b", 1): {"r1"},
               TP("b", 2): {"r2"}, TP("c", 0): {"r2"}, TP("c", 1): {"r1"}}
CYCLE_SUBS = {"m0": ["b"], "m1": ["a", "b", "c"], "m2": ["a"], "m3": ["a", "b", "c"],
              "m4": ["a", "b", "c"]}
CYCLE_MEMBER_RACKS = {"m0": "r0", "m1": "r2", "m2": "r0", "m3": "r1", "m4": "r1"}


def leave_then_join(name, subs, member_racks, counts, racks, final, generation, gone, joiner,
                    limit=12):
    """From the settled ``final`` (after ``generation``), two histories: ``gone`` leaves; a
    member "mz" reading ``joiner[0]`` on rack ``joiner[1]`` joins. Each ends checked settled;
    returns how many assignments each saw: {"leave": n, "join": n}."""
    stay = {m: t for m, t in subs.items() if m != gone}
    left, after = rounds(name, stay, member_racks, counts, racks,
                         {m: p for m, p in final.items() if m != gone}, generation, limit)
    check_settled(stay, counts, after)
    joined = {**subs, "mz": joiner[0]}
    came, after = rounds(name, joined, {**member_racks, "mz": joiner[1]}, counts, racks, final,
                         generation, limit)
    check_settled(joined, counts, after)
    return {"leave": len(left), "join": len(came)}


@pytest.mark.parametrize("name", STICKY)
def test_off_rack_only_member_settles(name):
    seen, final = rounds(name, CYCLE_SUBS, CYCLE_MEMBER_RACKS, CYCLE_COUNTS, CYCLE_RACKS)
    assert len(seen) <= MAX_ROUNDS[name]
    check_settled(CYCLE_SUBS, CYCLE_COUNTS, final)
    # m0 and m2 can only read partitions off their rack; each keeps the one it holds.
    assert [len(final[m]) for m in ("m0", "m2")] == [1, 1]


@pytest.mark.parametrize("name", STICKY)
def test_random_rack_groups_settle(name):
    """Random groups with racks and unequal subscriptions settle from scratch, after a member
    leaves, and after one joins (Kafka's algorithm cycles on some of these).

    Cooperative groups settle in the revoke-then-assign pair: the leader plays the round
    after the one that holds partitions back, and aims at where that round puts them. Before,
    9 of these 400 leave and join histories took a third round (the held-back partitions
    were placed afresh, and that moved partitions kept in the first round)."""
    rng = random.Random(11)
    topics = ["a", "b", "c", "d"]
    checked = 0
    longer = []
    for _ in range(200):
        counts = {t: rng.randint(1, 12) for t in topics}
        racks = {TP(t, p): {f"r{rng.randint(0, 2)}"} for t in topics for p in range(counts[t])}
        subs = {f"m{i}": sorted(rng.sample(topics, rng.randint(1, 4)))
                for i in range(rng.randint(2, 8))}
        if len({tuple(t) for t in subs.values()}) == 1:
            continue  # identical subscriptions take the other path
        member_racks = {m: f"r{i % 3}" for i, m in enumerate(subs)}
        seen, final = rounds(name, subs, member_racks, counts, racks)
        assert len(seen) <= MAX_ROUNDS[name]
        check_settled(subs, counts, final)
        generation = len(seen) + 1

        gone = rng.choice(sorted(subs))
        joiner = (sorted(rng.sample(topics, rng.randint(1, 4))), f"r{rng.randint(0, 2)}")
        for history, n in leave_then_join(name, subs, member_racks, counts, racks, final,
                                          generation, gone, joiner).items():
            assert n <= MAX_ROUNDS[name]
            if n > 2:
                longer.append((history, checked))
        checked += 1
    assert checked > 150
    assert longer == []


def test_larger_eager_group_settles_in_one_rebalance():
    """An 80-member group needs five replayed rounds to settle (they change 182, 90, 58, 54
    and 22 partitions, each leaving fewer off their racks); with the replay capped at four,
    the leader returned an assignment that the next rebalance changed again. About one fresh
    group in seven of this shape needs five or six."""
    rng = random.Random(18)
    topics = [f"t{i:02d}" for i in range(20)]
    counts = {t: rng.randint(10, 80) for t in topics}
    racks = {TP(t, p): {f"r{rng.randrange(3)}"} for t in topics for p in range(counts[t])}
    subs = {f"m{i:03d}": sorted(rng.sample(topics, rng.randint(1, 8))) for i in range(80)}
    member_racks = {m: f"r{rng.randrange(3)}" for m in subs}
    seen, final = rounds("sticky", subs, member_racks, counts, racks)
    assert len(seen) == 1, "the next rebalance moved partitions again"
    check_settled(subs, counts, final)


def test_medium_cooperative_groups_settle_in_the_revoke_then_assign_pair():
    """10-30 members reading 1-6 of 10 topics on 3 racks: after a leave or a join, the
    cooperative group settles in the revoke-then-assign pair. Before the leader played the
    assign round, 19 of these 40 histories took a third round or more (up to five); playing
    it once left 8; the leader now plays it up to three times (1 left)."""
    rng = random.Random(1)
    topics = [f"t{i}" for i in range(10)]
    longer = []
    for case in range(20):
        counts = {t: rng.randint(5, 30) for t in topics}
        racks = {TP(t, p): {f"r{rng.randint(0, 2)}"} for t in topics for p in range(counts[t])}
        subs = {f"m{i:02d}": sorted(rng.sample(topics, rng.randint(1, 6)))
                for i in range(rng.randint(10, 30))}
        member_racks = {m: f"r{rng.randint(0, 2)}" for m in subs}
        seen, final = rounds("cooperative-sticky", subs, member_racks, counts, racks, limit=20)
        generation = len(seen) + 1
        gone = rng.choice(sorted(subs))
        joiner = (sorted(rng.sample(topics, 3)), "r1")
        for history, n in leave_then_join("cooperative-sticky", subs, member_racks, counts,
                                          racks, final, generation, gone, joiner,
                                          limit=20).items():
            if n > 2:
                longer.append((history, case, n))
    assert len(longer) <= 2, longer
