"""Rack affinity in a group shared with kafka-go members (through ``rcoord gateway``).

kafka-go's ``RackAffinityGroupBalancer`` puts a member's zone in its subscription's
``user_data`` (the bare rack name) and sends no rack field; its leader reads every member's zone
from there. So an rcoord member of the "rack-affinity" protocol sends its rack there too, and an
rcoord leader reads the partition racks when some member names a zone either way.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from rcoord.client import ConsumerGroup, ConsumerGroupConfig
from rcoord.client.join import leader_assignment
from rcoord.protocol.consumer import ConsumerProtocolAssignment, ConsumerProtocolSubscription
from rcoord.protocol.join import JoinGroupMember, JoinGroupResult
from rcoord.protocol.offsets import TopicPartition as TP
from rcoord.topics import Topics

WAIT_S = 30.0


@pytest.mark.parametrize("encoding", ["msgpack", "kafka"])
@pytest.mark.parametrize(("assignors", "user_data"), [
    (["rack-affinity", "range"], b"zone-a"),
    (["range", "rack-affinity"], b""),  # (range is chosen: its user_data is its own)
])
def test_a_rack_affinity_member_sends_its_rack_as_user_data(
    make_coordinator: Any, redis_client: Any, namespace: str, encoding: str,
    assignors: list[str], user_data: bytes,
) -> None:
    coord = make_coordinator()
    Topics(redis_client, namespace).create("t", 2)
    config = ConsumerGroupConfig(
        group_id="g", topics=["t"], assignors=assignors, client_rack="zone-a",
        protocol_encoding=encoding,  # type: ignore[arg-type]
        redis_client=redis_client, namespace=namespace, heartbeat_interval_ms=50,
        session_timeout_ms=1000, rebalance_timeout_ms=3000, retry_backoff_ms=10)
    with ConsumerGroup(config) as group:
        group.next(timeout=WAIT_S)
        desc = coord.describe_group("g")
    assert desc.protocol_name == assignors[0]
    (member,) = desc.members
    sub = ConsumerProtocolSubscription.decode(member.metadata)
    assert (sub.user_data, sub.rack) == (user_data, "zone-a")


class RackedCoordinator:
    """What ``leader_assignment`` reads: topic "t" with partitions 0 and 2 in rack a, 1 and 3
    in rack b; ``racks_read`` counts the partition racks' reads."""

    def __init__(self) -> None:
        self.racks_read = 0

    def partition_counts(self, topics: list[str]) -> dict[str, int]:
        return {"t": 4}

    def partition_racks(self, counts: Mapping[str, int]) -> dict[TP, set[str]]:
        self.racks_read += 1
        return {TP("t", p): {"ab"[p % 2]} for p in range(4)}


def joined(protocol: str, zones: dict[str, bytes]) -> JoinGroupResult:
    """The leader's JoinGroup answer: members named by ``zones``, each with that user_data
    and no rack, as kafka-go members subscribe (in Kafka's encoding)."""
    return JoinGroupResult(
        error=0, generation_id=1, protocol_type="consumer",  # type: ignore[arg-type]
        protocol_name=protocol, leader_id="m1", member_id="m1",
        members=[JoinGroupMember(mid, None, ConsumerProtocolSubscription(
            ["t"], user_data=zone).encode("kafka")) for mid, zone in zones.items()])


def no_retry(call: Any, error_of: Any) -> Any:
    return call()


def assigned(encoded: dict[str, bytes]) -> dict[str, list[TP]]:
    return {mid: list(ConsumerProtocolAssignment.decode(raw).partitions)
            for mid, raw in encoded.items()}


@pytest.mark.parametrize("zones, racks_read, expected", [
    # Each member takes its own zone's partitions; before, the leader read no racks, every
    # partition was of zone "", and m1 got 0 and 1.
    ({"m1": b"b", "m2": b"a"}, 1,
     {"m1": [TP("t", 1), TP("t", 3)], "m2": [TP("t", 0), TP("t", 2)]}),
    # No member names a zone: no read (the racks cost one per rebalance).
    ({"m1": b"", "m2": b""}, 0,
     {"m1": [TP("t", 0), TP("t", 1)], "m2": [TP("t", 2), TP("t", 3)]}),
], ids=["zones-in-user-data", "no-zone"])
def test_a_leader_reads_partition_racks_for_kafka_go_members_zones_in_user_data(
        zones: dict[str, bytes], racks_read: int, expected: dict[str, list[TP]]) -> None:
    from rcoord.assignors import RackAffinityAssignor

    coordinator = RackedCoordinator()
    plan, _ = leader_assignment(
        joined("rack-affinity", zones), [RackAffinityAssignor()],
        coordinator, no_retry, "g")  # type: ignore[arg-type]
    assert coordinator.racks_read == racks_read
    assert assigned(plan) == expected
