"""A static member whose group.instance.id only Kafka's Java client would refuse, through the
gateway with kafka-python (which, like librdkafka and franz-go, sends the id as configured).

Kafka's broker takes any group.instance.id; the gateway answered such a member's JoinGroup
INVALID_REQUEST (rcoord applied the Java client's topic-name rule), so it never joined.
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("kio")
kafka = pytest.importorskip("kafka")

from gateway_harness import GatewayThread, call_once
from harness import wait_until

from rcoord.topics import Topics

WAIT_S = 30.0
LEAVE_GROUP, DESCRIBE_GROUPS = 13, 15


@pytest.mark.parametrize("iid", ["host-1:9092/pod 3", "ü{x}"])
def test_a_kafka_python_static_member_with_any_instance_id(gateway: GatewayThread,
                                                           topics: Topics, iid: str) -> None:
    topics.create("st", 2)
    consumer = kafka.KafkaConsumer(
        "st", bootstrap_servers=gateway.bootstrap, group_id="sg", group_instance_id=iid,
        auto_offset_reset="earliest", enable_auto_commit=False, session_timeout_ms=6000,
        heartbeat_interval_ms=100)
    # A metadata fetch made after subscribing: the coordinator's snapshot has the topic.
    assert "st" in consumer.topics()
    heartbeats: list[int] = []
    answer = consumer._coordinator._handle_heartbeat_response

    def count(response: Any, send_time: float) -> Any:
        heartbeats.append(response.error_code)
        return answer(response, send_time)

    consumer._coordinator._handle_heartbeat_response = count
    parts = {kafka.TopicPartition("st", 0), kafka.TopicPartition("st", 1)}
    try:
        # Joins and syncs: it is given both partitions.
        wait_until(lambda: consumer.poll(timeout_ms=50) is not None
                   and consumer.assignment() == parts, timeout_s=WAIT_S)
        wait_until(lambda: len(heartbeats) >= 2, lambda: consumer.poll(timeout_ms=50),
                   timeout_s=WAIT_S)
        assert set(heartbeats) == {0}
        tp = kafka.TopicPartition("st", 0)
        consumer.commit({tp: kafka.OffsetAndMetadata(3, "", -1)})
        assert consumer.committed(tp) == 3
        described = call_once(gateway, DESCRIBE_GROUPS, 5, {
            "groups": ["sg"], "include_authorized_operations": False})
        (group,) = described.groups
        assert [m.group_instance_id for m in group.members] == [iid]
    finally:
        consumer.close()  # a static member sends no LeaveGroup (KIP-345)
    # An operator removes it by its instance id (Kafka's removeMembersFromConsumerGroup).
    left = call_once(gateway, LEAVE_GROUP, 4, {
        "group_id": "sg", "members": [{"member_id": "", "group_instance_id": iid}]})
    assert left.error_code.value == 0
    assert [m.error_code.value for m in left.members] == [0]
    (group,) = call_once(gateway, DESCRIBE_GROUPS, 5, {
        "groups": ["sg"], "include_authorized_operations": False}).groups
    assert (group.group_state, list(group.members)) == ("Empty", [])
