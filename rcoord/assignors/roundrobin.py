"""Kafka's RoundRobinAssignor."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..protocol.consumer import ConsumerProtocolSubscription
from ..protocol.offsets import TopicPartition
from ._base import RebalanceProtocol, check_inputs, check_partition_racks, subscribed_known_topics

__all__ = ["RoundRobinAssignor"]


class RoundRobinAssignor:
    """Kafka's RoundRobinAssignor: all partitions dealt in turn, skipping unsubscribed members.

    Every partition of every subscribed topic, sorted by (topic, partition), goes to the next
    member in a circular walk over the members in member order; a member not subscribed to the
    partition's topic is passed over (the walk does not restart per topic). With identical
    subscriptions this balances total counts to within one, across all topics, which ranges
    cannot do.

    Members C0 and C1 subscribe to t0 and t1, each with 3 partitions:

    ======  ==========================
    member  assignment
    ======  ==========================
    C0      t0p0, t0p2, t1p1
    C1      t0p1, t1p0, t1p2
    ======  ==========================
    """

    name = "roundrobin"
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
        check_partition_racks(partition_racks)  # validated; Kafka's round robin ignores racks
        result: dict[str, list[TopicPartition]] = {mid: [] for mid in order}
        pos = 0  # the circular iterator's position, kept across topics as in Kafka
        for topic in subscribed_known_topics(members, partitions_per_topic):
            for p in range(partitions_per_topic[topic]):
                # Someone subscribes to this topic, so the walk finds a member within one lap.
                while topic not in members[order[pos]].topics:
                    pos = (pos + 1) % len(order)
                result[order[pos]].append(TopicPartition(topic, p))
                pos = (pos + 1) % len(order)
        return result

