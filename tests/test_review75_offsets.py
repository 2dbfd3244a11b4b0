"""Review 75 (offsets against Kafka): reproductions of OffsetDelete answers through the gateway
that differ from Kafka's broker. Each test FAILS on the code it was written against.

* A partition named twice in one OffsetDelete is answered twice by Kafka, in request order:
  ``OffsetMetadataManager.deleteOffsets`` adds one response partition per request entry
  (``topic.partitions().forEach(... responsePartitionCollection.add(...))``, a multi-collection)
  and ``KafkaApis.handleOffsetDeleteRequest`` passes the coordinator's answer on
  (``OffsetDeleteResponse.Builder.merge``). The gateway answers it once (its answers are a
  dict by partition), as OffsetCommit and OffsetFetch did before they were made to answer every
  entry (tests/test_gateway_offset_entries.py).
* A group id no group can have (longer than rcoord stores) is a group that does not exist:
  Kafka answers an OffsetDelete of it GROUP_ID_NOT_FOUND, and the gateway answers OffsetFetch,
  DescribeGroups and DeleteGroups of such an id as of a group that does not exist
  (``may_exist``, tests/test_gateway_offset_edges.py); its OffsetDelete is INVALID_REQUEST.
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("kio")

from gateway_harness import call_once, connect, request_frame, response

NONE, GROUP_ID_NOT_FOUND = 0, 69
TOO_LONG = "x" * 1025  # past MAX_ID_BYTES: no group is stored under it


def _commit(gateway: Any, group: str, topic: str, offsets: dict[int, int]) -> None:
    """A simple (``assign()``) commit: no member, generation -1."""
    got = call_once(gateway, 8, 8, {
        "group_id": group, "generation_id_or_member_epoch": -1, "member_id": "",
        "group_instance_id": None, "topics": [{"name": topic, "partitions": [
            {"partition_index": p, "committed_offset": o, "committed_leader_epoch": -1,
             "committed_metadata": ""} for p, o in offsets.items()]}]})
    assert [p.error_code.value for t in got.topics for p in t.partitions] == [NONE] * len(offsets)


def _offset_delete(gateway: Any, group: str, topics: list[tuple[str, list[int]]]
                   ) -> tuple[int, list[tuple[str, list[tuple[int, int]]]]]:
    """OffsetDelete v0 (response header v0): (top-level error, the answers in response order as
    (topic, [(partition, error)]))."""
    sock = connect(gateway)
    try:
        sock.sendall(request_frame(47, 0, 7, {"group_id": group, "topics": [
            {"name": t, "partitions": [{"partition_index": p} for p in ps]}
            for t, ps in topics]}))
        got = response(sock, 47, 0, 4)
    finally:
        sock.close()
    return got.error_code.value, [(t.name, [(p.partition_index, p.error_code.value)
                                            for p in t.partitions]) for t in got.topics]


def test_offset_delete_answers_a_partition_named_twice_twice(gateway: Any, topics: Any) -> None:
    topics.create("t", 2)
    _commit(gateway, "g", "t", {0: 5, 1: 7})
    assert _offset_delete(gateway, "g", [("t", [0, 0, 1])]) == (
        NONE, [("t", [(0, NONE), (0, NONE), (1, NONE)])])


def test_offset_delete_of_a_group_id_too_long_to_store_is_group_id_not_found(
        gateway: Any, topics: Any) -> None:
    topics.create("t", 1)
    assert _offset_delete(gateway, TOO_LONG, [("t", [0])]) == (GROUP_ID_NOT_FOUND, [])
