"""The sticky assignors' general path does bounded work per move (no Redis, no clocks).

Counted, not timed: how many per-topic balance checks and heap pushes a rebalance makes for
the moves it performs. One member reading 40 topics owns everything and 99 members reading 20
topics each join, so every move is off a member that reads 40 topics.
"""

from __future__ import annotations

import heapq

import pytest

from rcoord.assignors import _sticky_general, get_assignor
from rcoord.protocol.consumer import ConsumerProtocolSubscription

TOPICS = [f"t{i:02d}" for i in range(40)]
COUNTS = dict.fromkeys(TOPICS, 10)


class _CountingHeapq:
    """``heapq`` with its pushes counted."""

    heapify = staticmethod(heapq.heapify)
    heappop = staticmethod(heapq.heappop)
    heapreplace = staticmethod(heapq.heapreplace)

    def __init__(self) -> None:
        self.pushes = 0

    def heappush(self, heap: list, item: object) -> None:
        self.pushes += 1
        heapq.heappush(heap, item)


@pytest.mark.parametrize("name", ["sticky", "cooperative-sticky"])
def test_moves_off_a_member_of_many_topics_do_not_recheck_all_of_them(name, monkeypatch):
    """Each move used to recheck the balance of every topic its two members read (40 here:
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
