"""Kafka's RangeAssignor, with KIP-881 rack awareness."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..protocol.consumer import ConsumerProtocolSubscription
from ..protocol.offsets import TopicPartition
from ._base import (
    RebalanceProtocol,
    check_inputs,
    check_partition_racks,
    subscribed_known_topics,
    use_rack_aware,
)

__all__ = ["RangeAssignor"]


class _TopicState:
    """One topic's progress: what is left, and how many each subscriber may still take.

    Kafka's ``TopicAssignmentState``: ``n // m`` each, and the first members to pass that
    count take the ``n % m`` extras, so rack matching can hand the extras to whichever members
    match without breaking the per-topic balance.
    """

    def __init__(
        self,
        topic: str,
        count: int,
        consumers: list[str],
        consumer_racks: Mapping[str, str],
        partition_racks: Mapping[TopicPartition, frozenset[str]],
    ) -> None:
        self.topic = topic
        self.count = count
        self.consumers = consumers
        self.consumer_racks = {c: consumer_racks[c] for c in consumers if c in consumer_racks}
        self.assigned: set[int] = set()
        self.taken = dict.fromkeys(consumers, 0)
        self.per_consumer, self.extras_left = divmod(count, len(consumers))
        self.racks: dict[int, frozenset[str]] = {}
        if self.consumer_racks:
            empty: frozenset[str] = frozenset()
            self.racks = {p: partition_racks.get(TopicPartition(topic, p), empty)
                          for p in range(count)}
        all_racks = {r for racks in self.racks.values() for r in racks}
        self.needs_racks = use_rack_aware(
            self.consumer_racks.values(), all_racks, self.racks.values())
        # Kafka groups co-partitioned topics by its rack map's size, which is 0 when no
        # subscriber has a rack.
        self.rack_map_size = len(self.racks)

    def racks_match(self, consumer: str, p: int) -> bool:
        rack = self.consumer_racks.get(consumer)
        return rack is None or rack in self.racks.get(p, ())

    def max_assignable(self, consumer: str) -> int:
        extra = 1 if self.extras_left > 0 else 0
        return max(0, self.per_consumer + extra - self.taken[consumer])

    def assign(self, consumer: str, parts: list[int], result: dict[str, list[TopicPartition]]) -> None:
        result[consumer].extend(TopicPartition(self.topic, p) for p in parts)
        self.taken[consumer] += len(parts)
        if self.taken[consumer] > self.per_consumer:
            self.extras_left -= 1
        self.assigned.update(parts)

    def assign_ranges(
        self, result: dict[str, list[TopicPartition]], match: Callable[[str, int], bool] | None
    ) -> None:
        """Each consumer in turn takes the first unassigned partitions it may (Kafka's order)."""
        if len(self.assigned) == self.count:
            return
        remaining = [p for p in range(self.count) if p not in self.assigned]
        start = 0  # without a filter the takes are consecutive slices of ``remaining``
        # With rack matching, each rack's candidates in partition order, and how far each
        # rack's scan got: partitions before the cursor are taken, so no scan repeats work.
        by_rack: dict[str, list[int]] = {}
        if match is not None:
            for p in remaining:
                for rack in self.racks.get(p, ()):
                    by_rack.setdefault(rack, []).append(p)
        cursor: dict[str | None, int] = {}
        for consumer in self.consumers:
            if len(self.assigned) == self.count:
                break
            limit = self.max_assignable(consumer)
            if match is None:
                parts = remaining[start:start + limit]
                start += len(parts)
            else:
                own = self.consumer_racks.get(consumer)
                candidates = remaining if own is None else by_rack.get(own, [])
                i, parts = cursor.get(own, 0), []
                while len(parts) < limit and i < len(candidates):
                    if candidates[i] not in self.assigned:
                        parts.append(candidates[i])
                    i += 1
                cursor[own] = i
            if parts:
                self.assign(consumer, parts, result)


class RangeAssignor:
    """Kafka's RangeAssignor: per topic, contiguous ranges; the first ``n % m`` get one extra.

    For each topic (in name order) the members subscribed to it, in member order, split its
    ``n`` partitions into ``m`` contiguous ranges of ``n // m``; the first ``n % m`` members get
    one more. Ranges keep a member's partitions of co-partitioned topics aligned (partition 0 of
    every topic goes to the same member), which joins across topics rely on. The cost is skew:
    the extra partitions of every topic go to the same first members.

    Members C0 and C1 subscribe to t0 and t1, each with 3 partitions:

    ======  ==========================
    member  assignment
    ======  ==========================
    C0      t0p0, t0p1, t1p0, t1p1
    C1      t0p2, t1p2
    ======  ==========================

    Rack awareness (KIP-881), when members send a ``rack`` and ``partition_racks`` says where
    replicas live, and only where it can help (see ``use_rack_aware``): first each member takes,
    within its per-topic quota, partitions with a replica on its rack; then the plain range pass
    hands out the rest. Topics with the same subscribers and partition count stay co-partitioned:
    partition ``p`` of all of them goes to one member whose rack holds all of them. The per-topic
    balance is never traded for locality.
    """

    name = "range"
    supported_protocols = (RebalanceProtocol.EAGER,)

    def assign(
        self,
        members: Mapping[str, ConsumerProtocolSubscription],
        partitions_per_topic: Mapping[str, int],
        *,
        member_order: Sequence[str] | None = None,
        partition_racks: Mapping[TopicPartition, Any] | None = None,
    ) -> dict[str, list[TopicPartition]]:
        order = check_inputs(members, partitions_per_topic, member_order)
        racks = check_partition_racks(partition_racks)
        consumer_racks = {mid: sub.rack for mid, sub in members.items() if sub.rack}
        result: dict[str, list[TopicPartition]] = {mid: [] for mid in order}
        states = []
        for topic in subscribed_known_topics(members, partitions_per_topic):
            if partitions_per_topic[topic] == 0:
                continue
            consumers = [mid for mid in order if topic in members[mid].topics]
            states.append(_TopicState(topic, partitions_per_topic[topic], consumers,
                                      consumer_racks, racks))
        rack_aware = any(s.needs_racks for s in states)
        if rack_aware:
            _assign_with_rack_matching(states, result)
        for state in states:
            state.assign_ranges(result, None)
        if rack_aware:
            for assigned in result.values():
                assigned.sort()
        return result


def _assign_with_rack_matching(
    states: list[_TopicState], result: dict[str, list[TopicPartition]]
) -> None:
    """Kafka's first pass: group topics by (subscribers, partition count), then match racks."""
    groups: dict[tuple[tuple[str, ...], int], list[_TopicState]] = {}
    for state in states:
        groups.setdefault((tuple(state.consumers), state.rack_map_size), []).append(state)
    for (_, count), group in groups.items():
        if len(group) > 1:
            _assign_co_partitioned(group, count, result)
        elif group[0].needs_racks:
            group[0].assign_ranges(result, group[0].racks_match)


def _assign_co_partitioned(
    group: list[_TopicState], count: int, result: dict[str, list[TopicPartition]]
) -> None:
    """Partition ``p`` of every topic in the group to the first member whose rack fits all.

    Every topic in the group has the same subscribers and partition count and sees the same
    assignments, so a member's remaining quota is the same in each; once it reaches zero it
    never grows again, so such members are dropped from the scan for good.
    """
    first = group[0]
    remaining = list(first.consumers)
    empty: frozenset[str] = frozenset()
    for p in range(count):
        remaining = [c for c in remaining if first.max_assignable(c) > 0]
        if not remaining:
            break
        # A member fits partition p of every topic when its rack holds all of them (or it has
        # no rack): the racks common to the group's topics decide, once per partition.
        common = frozenset.intersection(*(s.racks.get(p, empty) for s in group))
        for consumer in remaining:
            rack = first.consumer_racks.get(consumer)
            if rack is None or rack in common:
                for s in group:
                    s.assign(consumer, [p], result)
                break
