"""DescribeGroups' ``authorized_operations`` (v3+, KIP-430) and the empty group id, as Kafka's
broker answers them: asked for, a group described without error carries the bitfield of the
operations the principal may do on it (every one a group has, READ, DESCRIBE and DELETE, when
no ACLs are configured); not asked for, Kafka's sentinel -2**31. The ACL cases are in
test_gateway_acl.py."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("kio")

from gateway_harness import GatewayThread, call_once, connect, request_frame, response

from rcoord.errors import Errors

READ, DELETE, DESCRIBE = 3, 6, 8  # Kafka's AclOperation codes
ALL_GROUP_OPERATIONS = (1 << READ) | (1 << DELETE) | (1 << DESCRIBE)  # 328
NOT_ASKED = -(2**31)


def _simple_commit(gw: GatewayThread, group: str, topic: str) -> None:
    got = call_once(gw, 8, 8, {"group_id": group, "generation_id_or_member_epoch": -1,
                               "member_id": "", "topics": [{"name": topic, "partitions": [
                                   {"partition_index": 0, "committed_offset": 1}]}]})
    assert [p.error_code.value for t in got.topics for p in t.partitions] == [0]


def _describe(gw: GatewayThread, version: int, groups: list[str], include: bool) -> Any:
    sock = connect(gw)
    try:
        sock.sendall(request_frame(15, version, 1, {
            "groups": groups, "include_authorized_operations": include}))
        return response(sock, 15, version, 5 if version >= 5 else 4)
    finally:
        sock.close()


@pytest.mark.parametrize("version", [3, 4, 5])
def test_authorized_operations_when_asked_and_the_sentinel_when_not(gateway, topics, version):
    topics.create("t", 1)
    _simple_commit(gateway, "used", "t")  # an Empty group with offsets
    asked = _describe(gateway, version, ["used", "never"], include=True)
    assert [(g.group_id, g.error_code.value, g.group_state, g.authorized_operations)
            for g in asked.groups] == [("used", 0, "Empty", ALL_GROUP_OPERATIONS),
                                       ("never", 0, "Dead", ALL_GROUP_OPERATIONS)]
    not_asked = _describe(gateway, version, ["used"], include=False)
    assert [g.authorized_operations for g in not_asked.groups] == [NOT_ASKED]


def test_kafka_clients_read_the_operations(gateway, topics):
    kafka = pytest.importorskip("kafka")
    topics.create("t", 1)
    _simple_commit(gateway, "used", "t")
    admin = kafka.KafkaAdminClient(bootstrap_servers=gateway.bootstrap)
    try:  # kafka-python always asks for them
        described = admin.describe_groups(["used"])["used"]
    finally:
        admin.close()
    assert described["error"] is None
    assert sorted(described["authorized_operations"]) == ["DELETE", "DESCRIBE", "READ"]

    ck_admin = pytest.importorskip("confluent_kafka.admin")
    ck = ck_admin.AdminClient({"bootstrap.servers": gateway.bootstrap,
                               "broker.address.family": "v4"})
    asked = ck.describe_consumer_groups(["used"], include_authorized_operations=True)
    ops = asked["used"].result(30).authorized_operations
    assert sorted(op.name for op in ops) == ["DELETE", "DESCRIBE", "READ"]
    not_asked = ck.describe_consumer_groups(["used"], include_authorized_operations=False)
    assert not_asked["used"].result(30).authorized_operations is None


def test_the_empty_group_id_is_a_group_as_in_kafka(gateway, topics):
    """Kafka answers INVALID_GROUP_ID only for a null group id in DescribeGroups and
    DeleteGroups (the wire cannot carry one there); "" is a group "for backwards
    compatibility" (GroupCoordinatorService.describeGroups / deleteGroups, and the classic
    GroupCoordinator.isValidGroupId), Dead and GROUP_ID_NOT_FOUND until it has offsets."""
    described = _describe(gateway, 5, [""], include=True)
    assert [(g.group_id, g.error_code.value, g.group_state, g.authorized_operations)
            for g in described.groups] == [("", 0, "Dead", ALL_GROUP_OPERATIONS)]
    deleted = call_once(gateway, 42, 2, {"groups_names": [""]})
    assert [(r.group_id, r.error_code.value) for r in deleted.results] == [
        ("", Errors.GROUP_ID_NOT_FOUND)]
    topics.create("t", 1)
    _simple_commit(gateway, "", "t")
    assert _describe(gateway, 5, [""], include=False).groups[0].group_state == "Empty"
    deleted = call_once(gateway, 42, 2, {"groups_names": [""]})
    assert [(r.group_id, r.error_code.value) for r in deleted.results] == [("", 0)]
