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
* A member's commit to a group deleted since it joined (its session expired, then the Empty
  group was deleted or removed by retention) is answered GROUP_ID_NOT_FOUND by the coordinator
  (OffsetCommit v9's code). rcoord's client takes it for "anything else": ``commit_offsets``
  raises a plain ``ProtocolError`` and leaves the generation running, where a fenced commit
  raises ``CommitFailedError`` and ends it lost. Kafka's classic member is never told
  GROUP_ID_NOT_FOUND: ``OffsetMetadataManager.validateOffsetCommit`` answers OffsetCommit v8 and
  older ILLEGAL_GENERATION for a group that does not exist, and ``classicGroupHeartbeat``
  UNKNOWN_MEMBER_ID, both fenced.
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("kio")

from gateway_harness import connect, request_frame, response
from test_client_group import OneMemberGroup, fast_config
from test_gateway_offset_edges import TOO_LONG, _commit  # (a simple commit through the gateway)

from rcoord import Errors, TopicPartition
from rcoord.client import CommitFailedError, ConsumerGroup

NONE, GROUP_ID_NOT_FOUND = 0, 69


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


def test_a_generation_whose_group_was_deleted_fails_its_commit_as_fenced(ctx: Any) -> None:
    # The coordinator's answer (OffsetCommit v9's): the member's session expired, the Empty
    # group was deleted, and its commit stamped with its generation comes late.
    tp = TopicPartition("t", 0)
    gen, (mid,) = ctx.stable_group(1)
    ctx.sleep(ctx.session_timeout_ms)
    assert ctx.state() == "Empty"
    assert ctx.coord.delete_groups([ctx.group_id]) == {ctx.group_id: Errors.NONE}
    assert ctx.coord.commit_offsets(ctx.group_id, {tp: 6}, member_id=mid,
                                    generation_id=gen) == {tp: Errors.GROUP_ID_NOT_FOUND}
    # The client given that answer (tests/test_client_group.py's fake coordinator): fenced, as
    # for ILLEGAL_GENERATION (test_fenced_commit_raises_commit_failed_and_ends_the_generation).
    state = OneMemberGroup()
    group = ConsumerGroup(fast_config(), coordinator=state.fake)  # type: ignore[arg-type]
    try:
        generation = group.next(timeout=15)
        generation.commit_offsets({tp: 5})
        state.commit_answers.append(Errors.GROUP_ID_NOT_FOUND)
        with pytest.raises(CommitFailedError) as info:
            generation.commit_offsets({tp: 6})
        assert info.value.error is Errors.GROUP_ID_NOT_FOUND
        assert generation.done.is_set() and generation.lost
        assert state.committed == {tp: 5}
    finally:
        group.close(timeout=15)
