"""OffsetFetch and OffsetDelete through the gateway for partitions no topic has.

OffsetFetch does not check names or partitions against the topics (Kafka's
``KafkaApis.handleOffsetFetchRequest`` asks its coordinator for any): a negative partition, the
empty topic name or one too long to store answer -1 with no error, and every other partition
and group its real offset. Before, such a partition failed every group of the request with
INVALID_REQUEST and hid their committed offsets.

OffsetDelete does (``handleOffsetDeleteRequest`` checks its metadata cache): a partition of a
topic that does not exist, of an illegal name, past the topic's last partition or negative is
answered UNKNOWN_TOPIC_OR_PARTITION and the others are deleted as usual. Before, such a
partition was answered NONE, and a negative one failed the whole request with INVALID_REQUEST.
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("kio")

from gateway_harness import call_once, connect, request_frame, response

NONE, UNKNOWN_TOPIC_OR_PARTITION, GROUP_ID_NOT_FOUND = 0, 3, 69
TOO_LONG = "x" * 1025  # past MAX_ID_BYTES: no commit can be stored under it


def _commit(gateway: Any, group: str, topic: str, offsets: dict[int, int]) -> None:
    """A simple (``assign()``) commit: no member, generation -1."""
    got = call_once(gateway, 8, 8, {
        "group_id": group, "generation_id_or_member_epoch": -1, "member_id": "",
        "group_instance_id": None, "topics": [{"name": topic, "partitions": [
            {"partition_index": p, "committed_offset": o, "committed_leader_epoch": -1,
             "committed_metadata": ""} for p, o in offsets.items()]}]})
    assert [p.error_code.value for t in got.topics for p in t.partitions] == [NONE] * len(offsets)


def _answers(topics: Any) -> list[tuple[str, list[tuple[int, int, int]]]]:
    return [(t.name, [(p.partition_index, p.committed_offset, p.error_code.value)
                      for p in t.partitions]) for t in topics]


def _fetch(gateway: Any, groups: dict[str, dict[str, list[int]]]) -> dict[str, Any]:
    """OffsetFetch v8: group -> (group error, answers)."""
    got = call_once(gateway, 9, 8, {"groups": [
        {"group_id": g, "topics": [{"name": t, "partition_indexes": ps} for t, ps in named.items()]}
        for g, named in groups.items()], "require_stable": False})
    return {g.group_id: (g.error_code.value, _answers(g.topics)) for g in got.groups}


def _offset_delete(gateway: Any, group: str,
                   parts: dict[str, list[int]]) -> tuple[int, dict[tuple[str, int], int]]:
    """OffsetDelete v0 (response header v0): (top-level error, (topic, partition) -> error)."""
    sock = connect(gateway)
    try:
        sock.sendall(request_frame(47, 0, 7, {"group_id": group, "topics": [
            {"name": t, "partitions": [{"partition_index": p} for p in ps]}
            for t, ps in parts.items()]}))
        got = response(sock, 47, 0, 4)
    finally:
        sock.close()
    return got.error_code.value, {(t.name, p.partition_index): p.error_code.value
                                  for t in got.topics for p in t.partitions}


def test_offset_fetch_of_partitions_no_commit_can_have_answers_minus_one_and_the_rest(
        gateway: Any, topics: Any) -> None:
    topics.create("t", 2)
    _commit(gateway, "g", "t", {0: 5, 1: 7})
    assert _fetch(gateway, {"g": {"t": [0, -1, 1], "": [0], TOO_LONG: [0]}}) == {"g": (NONE, [
        ("t", [(0, 5, NONE), (-1, -1, NONE), (1, 7, NONE)]),
        ("", [(0, -1, NONE)]),
        (TOO_LONG, [(0, -1, NONE)]),
    ])}
    # Only such partitions: answered without asking, no error.
    assert _fetch(gateway, {"g": {"t": [-1]}}) == {"g": (NONE, [("t", [(-1, -1, NONE)])])}


def test_offset_fetch_v7_of_a_negative_partition_keeps_the_real_offsets(
        gateway: Any, topics: Any) -> None:
    topics.create("t", 2)
    _commit(gateway, "g", "t", {0: 5, 1: 7})
    got = call_once(gateway, 9, 7, {"group_id": "g", "topics": [
        {"name": "t", "partition_indexes": [-2, 1]}], "require_stable": False})
    assert (got.error_code.value, _answers(got.topics)) == (
        NONE, [("t", [(-2, -1, NONE), (1, 7, NONE)])])


def test_offset_fetch_v8_a_negative_partition_in_one_group_leaves_the_others_answered(
        gateway: Any, topics: Any) -> None:
    topics.create("t", 2)
    _commit(gateway, "a", "t", {0: 5})
    _commit(gateway, "b", "t", {1: 9})
    assert _fetch(gateway, {"a": {"t": [0]}, "b": {"t": [-1, 1]}, "c": {"": [0]}}) == {
        "a": (NONE, [("t", [(0, 5, NONE)])]),
        "b": (NONE, [("t", [(-1, -1, NONE), (1, 9, NONE)])]),
        "c": (NONE, [("", [(0, -1, NONE)])]),
    }


def test_offset_delete_of_partitions_no_topic_has_is_unknown_topic_or_partition(
        gateway: Any, topics: Any) -> None:
    topics.create("t", 2)
    _commit(gateway, "g", "t", {0: 5, 1: 7})
    assert _offset_delete(gateway, "g", {"t": [0, 9], "nosuch": [0], "bad name": [0]}) == (
        NONE, {("t", 0): NONE, ("t", 9): UNKNOWN_TOPIC_OR_PARTITION,
               ("nosuch", 0): UNKNOWN_TOPIC_OR_PARTITION,
               ("bad name", 0): UNKNOWN_TOPIC_OR_PARTITION})
    # The partition that exists was deleted, the other kept.
    assert _fetch(gateway, {"g": {"t": [0, 1]}}) == {"g": (NONE, [
        ("t", [(0, -1, NONE), (1, 7, NONE)])])}


def test_offset_delete_of_a_negative_partition_is_unknown_and_the_rest_are_handled(
        gateway: Any, topics: Any) -> None:
    topics.create("t", 2)
    _commit(gateway, "g", "t", {0: 5, 1: 7})
    assert _offset_delete(gateway, "g", {"t": [-1]}) == (
        NONE, {("t", -1): UNKNOWN_TOPIC_OR_PARTITION})
    assert _fetch(gateway, {"g": {"t": [0, 1]}}) == {"g": (NONE, [
        ("t", [(0, 5, NONE), (1, 7, NONE)])])}
    # Beside one that exists: that one is deleted.
    assert _offset_delete(gateway, "g", {"t": [-1, 1]}) == (
        NONE, {("t", -1): UNKNOWN_TOPIC_OR_PARTITION, ("t", 1): NONE})
    assert _fetch(gateway, {"g": {"t": [0, 1]}}) == {"g": (NONE, [
        ("t", [(0, 5, NONE), (1, -1, NONE)])])}


def test_offset_delete_of_a_group_that_does_not_exist_is_answered_with_the_group_error_alone(
        gateway: Any, topics: Any) -> None:
    """Kafka answers a whole-group error with no topics: the per-partition refusals (an
    unknown topic here) are dropped, not listed beside it."""
    topics.create("t", 2)
    assert _offset_delete(gateway, "nosuch-group", {"t": [0, 9], "nosuch": [0]}) == (
        GROUP_ID_NOT_FOUND, {})


def test_a_group_id_too_long_to_store_is_answered_as_no_group_and_the_others_are_served(
        gateway: Any, topics: Any) -> None:
    """Kafka's broker takes a group id of any length; rcoord stores none past MAX_ID_BYTES.
    In a request naming several groups such an id is a group that does not exist: before, its
    INVALID_REQUEST failed every group of the request (offsets hidden, nothing deleted)."""
    topics.create("t", 1)
    _commit(gateway, "ok", "t", {0: 7})
    _commit(gateway, "gone", "t", {0: 3})
    assert _fetch(gateway, {"ok": {"t": [0]}, TOO_LONG: {"t": [0]}}) == {
        "ok": (NONE, [("t", [(0, 7, NONE)])]),
        TOO_LONG: (NONE, [("t", [(0, -1, NONE)])]),
    }
    everything = call_once(gateway, 9, 8, {"groups": [{"group_id": TOO_LONG, "topics": None}],
                                           "require_stable": False})
    assert [(g.error_code.value, list(g.topics)) for g in everything.groups] == [(NONE, [])]
    described = call_once(gateway, 15, 5, {"groups": ["ok", TOO_LONG],
                                           "include_authorized_operations": False})
    assert [(g.group_id, g.error_code.value, g.group_state) for g in described.groups] == [
        ("ok", NONE, "Empty"), (TOO_LONG, NONE, "Dead")]
    deleted = call_once(gateway, 42, 2, {"groups_names": ["gone", TOO_LONG]})
    assert [(r.group_id, r.error_code.value) for r in deleted.results] == [
        ("gone", NONE), (TOO_LONG, GROUP_ID_NOT_FOUND)]
    assert _fetch(gateway, {"gone": {"t": [0]}}) == {"gone": (NONE, [("t", [(0, -1, NONE)])])}
