"""The sticky assignors' general path does bounded work per move (no Redis, no clocks).

Counted, not timed: how many per-topic balance checks and heap pushes a rebalance makes for
the moves it performs, and how many heap entries it builds when nothing is to move.
"""

from __future__ import annotations

import heapq

import pytest

from rcoord.assignors import _sticky_general, get_assignor
from rcoord.protocol.consumer import ConsumerProtocolSubscription
from rcoord.protocol.offsets import TopicPartition

TOPICS = [f"t{i:02d}" for i in range(40)]
COUNTS = dict.fromkeys(TOPICS, 10)


class _CountingHeapq:
    """``heapq`` with its pushes and the entries it heapifies counted."""

    heappop = staticmethod(heapq.heappop)
    heapreplace = staticmethod(heapq.heapreplace)

    def __init__(self) -> None:
        self.pushes = 0
        self.entries = 0

    def heappush(self, heap: list, item: object) -> None:
        self.pushes += 1
        heapq.heappush(heap, item)

    def heapify(self, heap: list) -> None:
        self.entries += len(heap)
        heapq.heapify(heap)


@pytest.mark.parametrize("name", ["sticky", "cooperative-sticky"])
def test_moves_off_a_member_of_many_topics_do_not_recheck_all_of_them(name, monkeypatch):
    """One member reading 40 topics owns everything and 99 members reading 20 topics each
    join, so every move is off a member that reads 40 topics.

    Each move used to recheck the balance of every topic its two members read (40 here:
    about 39 checks and 80 heap pushes a move; at 1,000 members x 10,000 partitions, 999
    joining one owner of all took 2.4-2.8 s without racks). A topic is now only marked, and
    checked when the balancing asks; a count pushes a heap entry only where its stale one
    could hide it (lighter where the member reads, heavier where it holds)."""
    assignor = get_assignor(name)
    alone = {"m000": ConsumerProtocolSubscription(TOPICS)}
    owned = assignor.assign(alone, COUNTS)["m000"]
    members = {f"m{i:03d}": ConsumerProtocolSubscription(
        [TOPICS[(i + k) % 40] for k in range(20)]) for i in range(1, 100)}
    members["m000"] = ConsumerProtocolSubscription(TOPICS, owned_partitions=owned,
                                                   generation_id=1)
    counted = {"checks": 0, "moves": 0}
    check, move = (_sticky_general.GeneralAssignment._topic_unbalanced,
                   _sticky_general.GeneralAssignment._move)

    def counting_check(self, topic):
        counted["checks"] += 1
        return check(self, topic)

    def counting_move(self, tp, new):
        counted["moves"] += 1
        return move(self, tp, new)

    heaps = _CountingHeapq()
    monkeypatch.setattr(_sticky_general.GeneralAssignment, "_topic_unbalanced", counting_check)
    monkeypatch.setattr(_sticky_general.GeneralAssignment, "_move", counting_move)
    monkeypatch.setattr(_sticky_general, "heapq", heaps)
    assignor.assign(members, COUNTS)
    moves = counted["moves"]
    assert moves >= 390  # all but m000's share of 400 partitions leave it
    assert counted["checks"] <= 4 * moves + len(TOPICS)
    assert heaps.pushes <= 50 * moves


def test_a_settled_racked_group_does_not_rebuild_every_topics_heaps(monkeypatch):
    """200 members on 3 racks, each reading 50 of 100 topics, rejoin with the assignment the
    assignor gave them: nothing moves. Each run of the general path (two per replayed round)
    used to build heaps of every member for every topic it reads, once per pass placing
    partitions (three or more a run) and once for balancing, whether or not a partition of
    the topic was to be placed or balanced: 71,575 entries here for 10,000 subscriptions.
    Now a topic's heaps are built when a step first needs them."""
    topics = [f"t{i:03d}" for i in range(100)]
    counts = dict.fromkeys(topics, 10)
    racks = {TopicPartition(t, p): {f"r{(i + p) % 3}"}
             for i, t in enumerate(topics) for p in range(10)}
    subs = {f"m{i:03d}": [topics[(i + k) % 100] for k in range(50)] for i in range(200)}
    assignor = get_assignor("sticky")
    first = assignor.assign(
        {m: ConsumerProtocolSubscription(t, rack=f"r{i % 3}") for i, (m, t) in enumerate(
            subs.items())}, counts, partition_racks=racks)
    members = {m: ConsumerProtocolSubscription(t, owned_partitions=first[m], generation_id=1,
                                               rack=f"r{i % 3}")
               for i, (m, t) in enumerate(subs.items())}
    heaps = _CountingHeapq()
    monkeypatch.setattr(_sticky_general, "heapq", heaps)
    assert assignor.assign(members, counts, partition_racks=racks) == first
    assert heaps.entries <= 2 * sum(len(t) for t in subs.values())
