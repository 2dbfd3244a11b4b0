"""The gateway while one topic's slot is served by no master (``cluster-require-full-coverage
no``): a request naming that topic and others answers the others as usual and that topic by
itself, as Kafka answers by topic and partition. On a cluster of the module's own."""

from __future__ import annotations

import logging
from typing import Any

from gateway_harness import (
    GatewayThread,
    call_once,
    connect,
    fetch_body,
    fetched_records,
    request_frame,
    response,
    settle_fast_groups,
)
from harness import blocked_xreads, wait_until
from test_gateway_slot_moves import _unserved

from rcoord import CoordinatorConfig
from rcoord.errors import Errors
from rcoord.gateway.errors import NOT_LEADER_OR_FOLLOWER
from rcoord.keys import GroupKeys
from rcoord.topics import Producer, Topics, partition_key
from rcoord.topics._base import meta_key


def _started(cluster: Any, namespace: str) -> tuple[GatewayThread, str]:
    """A gateway over ``cluster`` for topics "t" and "u" (1 partition each, on other slots),
    and a group whose slot is neither topic's metadata slot."""
    client = cluster.client()
    try:
        settle_fast_groups(client, namespace)
        topics = Topics(client, namespace)
        topics.create("t", 1)
        topics.create("u", 1)
        t_slot = client.keyslot(meta_key(namespace, "t"))
        assert t_slot != client.keyslot(meta_key(namespace, "u"))
        n = CoordinatorConfig(namespace=namespace).num_partitions
        group = next(g for g in (f"g{i}" for i in range(1000))
                     if client.keyslot(GroupKeys.of(namespace, n, g).group) != t_slot)
    finally:
        client.close()
    return GatewayThread(cluster.url, namespace).start(), group


def _codes(answer: Any) -> dict[str, int]:
    return {t.name: int(t.partitions[0].error_code.value) for t in answer.topics}


def test_an_offset_commit_answers_a_topic_whose_slot_is_unserved_by_itself(own_cluster,
                                                                           namespace):
    """OffsetCommit reads each topic's partition count (Kafka's check of its metadata
    cache). One topic's slot unserved failed the whole commit COORDINATOR_NOT_AVAILABLE: no
    offset of any other topic was stored for as long as it lasted. As Kafka answers a topic its
    metadata cache does not hold, that topic is UNKNOWN_TOPIC_OR_PARTITION (retried by its
    clients) and the other topic's offset is committed."""
    gw, group = _started(own_cluster, namespace)
    try:
        with _unserved(own_cluster, meta_key(namespace, "t")):
            committed = call_once(gw, 8, 8, {
                "group_id": group, "generation_id_or_member_epoch": -1, "member_id": "",
                "topics": [{"name": name, "partitions": [
                    {"partition_index": 0, "committed_offset": 7}]} for name in ("t", "u")]})
        fetched = call_once(gw, 9, 8, {"groups": [{"group_id": group, "topics": [
            {"name": "u", "partition_indexes": [0]}]}], "require_stable": False})
    finally:
        gw.stop()
    assert _codes(committed) == {"t": Errors.UNKNOWN_TOPIC_OR_PARTITION, "u": Errors.NONE}
    assert fetched.groups[0].topics[0].partitions[0].committed_offset == 7


def test_an_offset_delete_answers_a_topic_whose_slot_is_unserved_by_itself(own_cluster,
                                                                           namespace):
    """OffsetDelete checks its topics as OffsetCommit does, and failed whole the same way;
    the served topic's offset is deleted, the other is UNKNOWN_TOPIC_OR_PARTITION."""
    gw, group = _started(own_cluster, namespace)
    try:
        call_once(gw, 8, 8, {
            "group_id": group, "generation_id_or_member_epoch": -1, "member_id": "",
            "topics": [{"name": name, "partitions": [
                {"partition_index": 0, "committed_offset": 7}]} for name in ("t", "u")]})
        with _unserved(own_cluster, meta_key(namespace, "t")):
            deleted = call_once(gw, 47, 0, {"group_id": group, "topics": [
                {"name": name, "partitions": [{"partition_index": 0}]}
                for name in ("t", "u")]}, header_bytes=4)
        fetched = call_once(gw, 9, 8, {"groups": [{"group_id": group, "topics": [
            {"name": "u", "partition_indexes": [0]}]}], "require_stable": False})
    finally:
        gw.stop()
    assert deleted.error_code.value == Errors.NONE
    assert _codes(deleted) == {"t": Errors.UNKNOWN_TOPIC_OR_PARTITION, "u": Errors.NONE}
    assert fetched.groups[0].topics[0].partitions[0].committed_offset == -1


def test_a_parked_fetch_whose_wait_meets_a_slot_losing_its_master_waits_on_the_others(
        own_cluster, namespace, caplog):
    """A Fetch parked on two partitions (one ``XREAD BLOCK`` per slot) when one partition's
    slot loses its master: that wait ends with CLUSTERDOWN, which failed the whole Fetch
    (both partitions NOT_LEADER_OR_FOLLOWER, the other's records not sent). The other
    partition's wait goes on, and its record answers the Fetch; the unserved partition is
    NOT_LEADER_OR_FOLLOWER alone."""
    caplog.set_level(logging.WARNING, logger="rcoord.gateway")
    client = own_cluster.client()
    nodes = own_cluster.node_clients()
    gw: GatewayThread | None = None
    try:
        settle_fast_groups(client, namespace)
        Topics(client, namespace).create("t", 2)
        assert (client.keyslot(partition_key(namespace, "t", 0))
                != client.keyslot(partition_key(namespace, "t", 1)))
        producer = Producer(client, namespace, idempotent=False)
        for p in (0, 1):
            producer.send("t", b"a", partition=p)
        gw = GatewayThread(own_cluster.url, namespace).start()
        sock = connect(gw)
        try:
            sock.sendall(request_frame(1, 12, 1, fetch_body("t", (0, 1), 1, 60_000)))
            wait_until(lambda: sum(blocked_xreads(n) for n in nodes) == 2)
            with _unserved(own_cluster, partition_key(namespace, "t", 1)):
                # (the wait on partition 1 failed: logged, by the Fetch or by the gateway)
                wait_until(lambda: any("unreachable or unavailable" in r.getMessage()
                                       for r in caplog.records))
                producer.send("t", b"b", partition=0)
                answer = response(sock, 1, 12, 5)
        finally:
            sock.close()
    finally:
        for node in nodes:
            node.close()
        client.close()
        if gw is not None:
            gw.stop()
    parts = {p.partition_index: p for p in answer.responses[0].partitions}
    assert parts[0].error_code.value == Errors.NONE
    assert [r.value for r in fetched_records(bytes(parts[0].records))] == [b"b"]
    assert parts[1].error_code.value == NOT_LEADER_OR_FOLLOWER


def _groups_apart(cluster: Any, namespace: str) -> tuple[str, str, str]:
    """A group's key (to take its slot down), that group, and a group on another slot."""
    client = cluster.client()
    try:
        settle_fast_groups(client, namespace)
        Topics(client, namespace).create("u", 1)
        n = CoordinatorConfig(namespace=namespace).num_partitions
        down = GroupKeys.of(namespace, n, "g").group
        other = next(g for g in (f"h{i}" for i in range(1000))
                     if client.keyslot(GroupKeys.of(namespace, n, g).group)
                     != client.keyslot(down))
    finally:
        client.close()
    return down, "g", other


def _commit(gw: GatewayThread, group: str) -> None:
    answer = call_once(gw, 8, 8, {
        "group_id": group, "generation_id_or_member_epoch": -1, "member_id": "",
        "topics": [{"name": "u", "partitions": [{"partition_index": 0, "committed_offset": 3}]}]})
    assert _codes(answer) == {"u": Errors.NONE}


def test_describe_groups_answers_a_group_whose_slot_is_unserved_by_itself(own_cluster,
                                                                          namespace):
    """DescribeGroups names several groups (Kafka's admin client sends all a coordinator's
    groups in one). One group's slot unserved failed the request for every group
    (COORDINATOR_NOT_AVAILABLE); as Kafka answers by group, that group alone is."""
    key, down, other = _groups_apart(own_cluster, namespace)
    gw = GatewayThread(own_cluster.url, namespace).start()
    try:
        _commit(gw, other)
        with _unserved(own_cluster, key):
            described = call_once(gw, 15, 5, {"groups": [down, other],
                                              "include_authorized_operations": False})
    finally:
        gw.stop()
    by_id = {g.group_id: g for g in described.groups}
    assert by_id[down].error_code.value == Errors.COORDINATOR_NOT_AVAILABLE
    assert (by_id[other].error_code.value, by_id[other].group_state) == (Errors.NONE, "Empty")


def test_delete_groups_answers_a_group_whose_slot_is_unserved_by_itself(own_cluster,
                                                                        namespace):
    """DeleteGroups deleted its groups one after the other in one flow: a group whose slot
    is unserved failed the whole request COORDINATOR_NOT_AVAILABLE, after the groups before
    it were deleted (told retriable, their retry answered GROUP_ID_NOT_FOUND), and the groups
    after it were not tried. Each group is answered its own."""
    key, down, other = _groups_apart(own_cluster, namespace)
    gw = GatewayThread(own_cluster.url, namespace).start()
    try:
        _commit(gw, other)
        with _unserved(own_cluster, key):
            deleted = call_once(gw, 42, 2, {"groups_names": [down, other]})
    finally:
        gw.stop()
    codes = {r.group_id: r.error_code.value for r in deleted.results}
    assert codes == {down: Errors.COORDINATOR_NOT_AVAILABLE, other: Errors.NONE}


def test_an_offset_fetch_of_groups_answers_a_group_whose_slot_is_unserved_by_itself(
        own_cluster, namespace):
    """OffsetFetch v8 names several groups; one group's slot unserved failed every group's
    fetch (COORDINATOR_NOT_AVAILABLE); the other group's offsets are answered."""
    key, down, other = _groups_apart(own_cluster, namespace)
    gw = GatewayThread(own_cluster.url, namespace).start()
    try:
        _commit(gw, other)
        with _unserved(own_cluster, key):
            fetched = call_once(gw, 9, 8, {"groups": [
                {"group_id": g, "topics": [{"name": "u", "partition_indexes": [0]}]}
                for g in (down, other)], "require_stable": False})
    finally:
        gw.stop()
    by_id = {g.group_id: g for g in fetched.groups}
    assert by_id[down].error_code.value == Errors.COORDINATOR_NOT_AVAILABLE
    assert by_id[other].error_code.value == Errors.NONE
    assert by_id[other].topics[0].partitions[0].committed_offset == 3


def test_delete_records_answers_a_partition_whose_slot_is_unserved_by_itself(own_cluster,
                                                                             namespace):
    """DeleteRecords removes a topic's partitions in one call, which failed on the partition
    whose slot has no master after the other partition's records were removed: both were
    answered REQUEST_TIMED_OUT. The served partition is answered its new log start; the
    unserved one alone NOT_LEADER_OR_FOLLOWER (nothing sent: its producer asks again with
    fresh metadata, tests/test_gateway_unrun70.py)."""
    client = own_cluster.client()
    try:
        settle_fast_groups(client, namespace)
        Topics(client, namespace).create("t", 2)
        producer = Producer(client, namespace, idempotent=False)
        for p in (0, 1):
            producer.send("t", b"a", partition=p)
    finally:
        client.close()
    gw = GatewayThread(own_cluster.url, namespace).start()
    try:
        with _unserved(own_cluster, partition_key(namespace, "t", 1)):
            deleted = call_once(gw, 21, 2, {"topics": [{"name": "t", "partitions": [
                {"partition_index": p, "offset": -1} for p in (0, 1)]}], "timeout_ms": 5000})
    finally:
        gw.stop()
    parts = {p.partition_index: (p.error_code.value, p.low_watermark)
             for p in deleted.topics[0].partitions}
    assert parts == {0: (Errors.NONE, 1), 1: (NOT_LEADER_OR_FOLLOWER, -1)}
