"""kafka-go's RackAffinityGroupBalancer: members prefer partitions led from their own zone."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..protocol.consumer import ConsumerProtocolSubscription
from ..protocol.offsets import TopicPartition
from ._base import RebalanceProtocol, check_inputs, check_partition_racks, subscribed_known_topics

__all__ = ["RackAffinityAssignor"]


class RackAffinityAssignor:
    """Balance first, then keep as much traffic as possible inside each zone (rack).

    Per topic, every subscriber gets ``n // m`` partitions and ``n % m`` get one more, exactly
    as kafka-go's ``RackAffinityGroupBalancer`` does: first each zone's members take partitions
    of their own zone, up to that target (and the extra ones where the zone has leftovers), then
    the remaining partitions fill up whoever is short, regardless of zone. A member's zone is
    its subscription's ``rack``, or else its ``user_data`` as text, which is where a kafka-go
    member (whose subscription has no rack field) puts it ("" when neither says, or the
    ``user_data`` is not UTF-8); a partition's zone is its leader's rack in
    kafka-go. rcoord has no leaders, so it is the partition's rack in ``partition_racks`` when
    it has one, the smallest rack name when it has several (a stable stand-in), and "" when it
    has none, so members and partitions without a rack still pair up, as in kafka-go.

    Zones are visited in name order and members in member order, where kafka-go walks Go maps
    in random order, so every leader computes the same result. Topic ``t`` with partitions
    p0, p1 on rack a and p2, p3 on rack b, members A (rack a) and B (rack b):

    ======  =========
    member  assigned
    ======  =========
    A       tp0, tp1
    B       tp2, tp3
    ======  =========
    """

    name = "rack-affinity"
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
        result: dict[str, list[TopicPartition]] = {mid: [] for mid in order}
        for topic in subscribed_known_topics(members, partitions_per_topic):
            consumers = [mid for mid in order if topic in members[mid].topics]
            zones: dict[str, list[int]] = {}
            for p in range(partitions_per_topic[topic]):
                rack_set = racks.get(TopicPartition(topic, p))
                zones.setdefault(min(rack_set) if rack_set else "", []).append(p)
            for mid, parts in _assign_topic(consumers, members, zones).items():
                result[mid].extend(TopicPartition(topic, p) for p in sorted(parts))
        for mid in order:
            result[mid].sort()
        return result


def _assign_topic(
    consumers: list[str],
    members: Mapping[str, ConsumerProtocolSubscription],
    zoned_partitions: dict[str, list[int]],
) -> dict[str, list[int]]:
    """kafka-go's ``assignTopic`` with zones in sorted order."""
    zoned_consumers: dict[str, list[str]] = {}
    for mid in consumers:
        zoned_consumers.setdefault(_zone(members[mid]), []).append(mid)
    total = sum(len(parts) for parts in zoned_partitions.values())
    target, remainder = divmod(total, len(consumers))
    assignments: dict[str, list[int]] = {mid: [] for mid in consumers}
    left_over: dict[str, list[int]] = {}
    for zone in sorted(zoned_partitions):
        parts = zoned_partitions[zone]
        local = zoned_consumers.get(zone, [])
        if not local:
            left_over[zone] = parts
            continue
        # Never give a member more than the target from its own zone.
        per_member = min(len(parts) // len(local), target)
        for i, mid in enumerate(local):
            assignments[mid].extend(parts[i * per_member:(i + 1) * per_member])
        parts = parts[len(local) * per_member:]
        # Members that reached the target in-zone may take one leftover each, as long as the
        # topic's remainder (the number of members allowed one extra) lasts.
        extra = len(parts)
        if per_member == target:
            extra = min(extra, remainder, len(local))
            remainder -= extra
        for i in range(extra):
            assignments[local[i]].append(parts[i])
        parts = parts[extra:]
        if parts:
            left_over[zone] = parts
    remaining = [p for zone in sorted(left_over) for p in left_over[zone]]
    start = 0
    for mid in consumers:
        delta = target - len(assignments[mid])
        if delta >= 0 and remainder > 0:
            delta += 1
            remainder -= 1
        if delta > 0:
            assignments[mid].extend(remaining[start:start + delta])
            start += delta
    return assignments


def _zone(sub: ConsumerProtocolSubscription) -> str:
    """The member's zone: its ``rack``, else its ``user_data`` read as kafka-go writes it
    (``RackAffinityGroupBalancer.UserData`` is the bare rack name), else ""."""
    if sub.rack:
        return sub.rack
    try:
        return sub.user_data.decode("utf-8")
    except UnicodeDecodeError:
        return ""
