"""What the sticky assignors start from: resolved ownership claims and rack information.

Kafka's ``AbstractStickyAssignor.allSubscriptionsEqual`` and ``RackInfo``, made deterministic:
members are visited in member-id order where Kafka walks a hash map.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from ..protocol.consumer import ConsumerProtocolSubscription
from ..protocol.kafka_consumer import (
    decode_cooperative_sticky_user_data,
    decode_sticky_user_data,
)
from ..protocol.offsets import TopicPartition
from ._base import use_rack_aware

DEFAULT_GENERATION = -1
"""The generation of a member that never had an assignment (Kafka's ``DEFAULT_GENERATION``)."""

MemberData = Callable[[ConsumerProtocolSubscription], ConsumerProtocolSubscription]
"""How an assignor reads what a member owned (Kafka's ``memberData``): the subscription with
``owned_partitions`` and ``generation_id`` set to what the assignor takes them to be."""


def subscription_member_data(sub: ConsumerProtocolSubscription) -> ConsumerProtocolSubscription:
    """The subscription's own ``owned_partitions`` and ``generation_id`` (KIP-429, KIP-792)."""
    return sub


def cooperative_sticky_member_data(
    sub: ConsumerProtocolSubscription,
) -> ConsumerProtocolSubscription:
    """Kafka's ``CooperativeStickyAssignor.memberData``: the subscription's generation if it has
    one, else the generation in its ``user_data``.

    A Subscription below v2 has no ``generation_id`` (it decodes as -1), and neither does a
    member whose generation was reset; Kafka's cooperative-sticky assignor writes its last
    generation in ``user_data`` for them. ``user_data`` that does not hold one counts as
    generation -1 (as does a negative value). Owned partitions always come from the
    subscription.
    """
    if sub.generation_id >= 0 or not sub.user_data:
        return sub
    try:
        generation = decode_cooperative_sticky_user_data(sub.user_data)
    except ValueError:
        return sub  # its generation is already DEFAULT_GENERATION
    return _with_member_data(sub, sub.owned_partitions, generation)


def sticky_member_data(sub: ConsumerProtocolSubscription) -> ConsumerProtocolSubscription:
    """Kafka's ``StickyAssignor.memberData``: the previous assignment and generation in the
    member's ``user_data``, when it has any.

    An eager Kafka member has revoked everything when it rejoins, so it reports no owned
    partitions; its ``user_data`` holds what it had (and, from V1 on, the generation).
    ``user_data`` that does not decode means no previous assignment and generation -1, as in
    Kafka. Without ``user_data`` (a member's first join) the subscription's own fields are
    used.
    """
    if not sub.user_data:
        return sub
    try:
        partitions, generation = decode_sticky_user_data(sub.user_data)
    except ValueError:
        return _with_member_data(sub, (), DEFAULT_GENERATION)
    return _with_member_data(
        sub, partitions, DEFAULT_GENERATION if generation is None else generation)


def _with_member_data(
    sub: ConsumerProtocolSubscription,
    owned: Iterable[tuple[str, int]],
    generation: int,
) -> ConsumerProtocolSubscription:
    return ConsumerProtocolSubscription(
        sub.topics, sub.user_data, owned, max(generation, DEFAULT_GENERATION), sub.rack)


@dataclass
class Claims:
    """Each member's previously owned partitions, after settling conflicting claims.

    ``owned`` keeps, per member, the claimed partitions that still exist; ``contested`` holds
    partitions two members claimed in the same generation (neither keeps it: the data is
    inconsistent, so Kafka trusts neither); ``max_generation`` is the newest generation any
    member reported; ``all_equal`` says whether every member subscribes to the same topics,
    which selects Kafka's fast "constrained" path.
    """

    owned: dict[str, list[TopicPartition]]
    contested: set[TopicPartition] = field(default_factory=set)
    max_generation: int = DEFAULT_GENERATION
    all_equal: bool = True


def resolve_claims(
    ids: list[str],
    members: Mapping[str, ConsumerProtocolSubscription],
    counts: Mapping[str, int],
) -> Claims:
    """Settle who owns what, as Kafka does: the higher generation wins a contested partition.

    ``ids`` is the visiting order (sorted member ids). A claim on a partition that no longer
    exists (topic unknown, unsubscribed by everybody, or shrunk) is dropped. Two claims in the
    same generation void the partition for both (and for any later claim of a lower or equal
    generation); a claim from a newer generation replaces an older one.
    """
    owned: dict[str, list[TopicPartition]] = {}
    contested: set[TopicPartition] = set()
    holder: dict[TopicPartition, str] = {}  # the member whose claim currently stands (or last voided it)
    max_generation = DEFAULT_GENERATION
    first_topics = members[ids[0]].topics if ids else ()
    all_equal = True
    for mid in ids:
        sub = members[mid]
        if sub.topics != first_topics:  # topics are stored sorted, so tuples compare as sets
            all_equal = False
        generation = sub.generation_id
        max_generation = max(max_generation, generation)
        mine: list[TopicPartition] = []
        owned[mid] = mine
        for tp in sub.owned_partitions:
            if tp.partition >= counts.get(tp.topic, 0):
                continue
            other = holder.get(tp)
            if other is None:
                mine.append(tp)
                holder[tp] = mid
                continue
            other_generation = members[other].generation_id
            if generation == other_generation:
                contested.add(tp)
                _discard(owned[other], tp)
                holder[tp] = mid
            elif generation > other_generation:
                mine.append(tp)
                _discard(owned[other], tp)
                holder[tp] = mid
            # else: the other member's newer claim stands
    return Claims(owned, contested, max_generation, all_equal)


def _discard(parts: list[TopicPartition], tp: TopicPartition) -> None:
    if tp in parts:
        parts.remove(tp)


class RackInfo:
    """Members' racks and partitions' replica racks, when rack-aware assignment applies.

    Kafka's ``RackInfo``: used only if ``use_rack_aware`` says it can help; otherwise both maps
    are empty and every rack check passes.
    """

    def __init__(
        self,
        members: Mapping[str, ConsumerProtocolSubscription],
        all_partitions: list[TopicPartition],
        partition_racks: Mapping[TopicPartition, frozenset[str]],
    ) -> None:
        by_rack: dict[str, int] = {}
        racks_of_members = {mid: sub.rack for mid, sub in members.items() if sub.rack}
        for rack in racks_of_members.values():
            by_rack[rack] = by_rack.get(rack, 0) + 1
        self.consumer_racks: dict[str, str] = {}
        self.partition_racks: dict[TopicPartition, frozenset[str]] = {}
        self.consumers_on_racks: dict[TopicPartition, int] = {}
        if not racks_of_members:
            return
        empty: frozenset[str] = frozenset()
        per_partition = {tp: partition_racks.get(tp, empty) for tp in all_partitions}
        every_rack = {r for racks in per_partition.values() for r in racks}
        if use_rack_aware(by_rack, every_rack, per_partition.values()):
            self.consumer_racks = racks_of_members
            self.partition_racks = per_partition
            self.consumers_on_racks = {
                tp: sum(by_rack.get(r, 0) for r in racks) for tp, racks in per_partition.items()
            }

    @property
    def enabled(self) -> bool:
        return bool(self.consumer_racks)

    def mismatch(self, consumer: str, tp: TopicPartition) -> bool:
        """True when the member has a rack and the partition has no replica there."""
        rack = self.consumer_racks.get(consumer)
        return rack is not None and rack not in self.partition_racks.get(tp, ())

    def sort_by_scarcity(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        """Partitions with the fewest same-rack members first (stable), so they find one."""
        if not self.consumers_on_racks:
            return partitions
        return sorted(partitions, key=lambda tp: self.consumers_on_racks.get(tp, 0))

    def next_rack_consumer(self, tp: TopicPartition, consumers: list[str], first: int) -> int:
        """Index of the first member, circularly from ``first``, on a rack of ``tp``; else -1."""
        racks = self.partition_racks.get(tp)
        if not racks:
            return -1
        n = len(consumers)
        for i in range(n):
            index = (first + i) % n
            if self.consumer_racks.get(consumers[index]) in racks:
                return index
        return -1
