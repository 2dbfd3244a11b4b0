"""OffsetCommit and OffsetFetch through the gateway answer every entry of the request, as
Kafka's broker does, and OffsetCommit v2-v4 keeps Kafka's ``retention_time_ms``.

* Kafka's ``OffsetMetadataManager.commitOffset`` and ``fetchOffsets`` build their responses
  from the request's entries: a partition (or a topic) named twice is answered twice, in
  request order, and the commit's records are written in that order, so the later entry is the
  one stored (unless its metadata is too large: refused alone). Before, such a partition was
  answered once.
* ``expireTimestampMs`` is commit time + ``retention_time_ms`` for any value but -1: below -1 it
  is in the past, and the offset is expired at once. Before, the gateway took it for -1 (the
  group's retention, a week).
* Past 10,000 partitions in one commit (rcoord's limit, docs/architecture.md "Limits"), every
  entry is answered INVALID_REQUEST and nothing is committed; the limit counts partitions, so a
  partition named twice counts once.
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("kio")

from gateway_harness import (
    call_once,
    connect,
    request_frame,
    response,
    running_gateway,
    sasl_connect,
    topics_of,
)
from harness import wait_until

from rcoord.gateway.auth import load_auth_file

NONE, UNKNOWN_TOPIC_OR_PARTITION, OFFSET_METADATA_TOO_LARGE = 0, 3, 12
UNKNOWN_MEMBER_ID, TOPIC_AUTHORIZATION_FAILED, INVALID_REQUEST = 25, 29, 42
TOO_LARGE = "x" * 4097  # past offset_metadata_max_bytes, 4096 by default (Kafka's too)

Entries = list[tuple[str, list[tuple[int, int, str]]]]  # (topic, [(partition, offset, metadata)])


def _commit(gateway: Any, entries: Entries, version: int = 8, generation: int = -1,
            retention_ms: int = -1) -> list[tuple[str, list[tuple[int, int]]]]:
    """An OffsetCommit of ``entries`` as given (a partition or topic may repeat); its answers
    as (topic, [(partition, error)]), in response order. Generation -1 with no member id: the
    simple (``assign()``) commit."""
    marker = 123_456_789  # a retention a timedelta holds, replaced in the frame by the real one
    body = {"group_id": "g", "generation_id_or_member_epoch": generation, "member_id": "",
            "retention_time": datetime.timedelta(milliseconds=marker),
            "group_instance_id": None, "topics": [
                {"name": t, "partitions": [
                    {"partition_index": p, "committed_offset": o, "committed_leader_epoch": -1,
                     "committed_metadata": m} for p, o, m in parts]} for t, parts in entries]}
    frame = request_frame(8, version, 5, body)
    if 2 <= version <= 4:  # (any int64, also one past what a timedelta holds)
        at = frame.index(marker.to_bytes(8, "big"))
        frame = frame[:at] + retention_ms.to_bytes(8, "big", signed=True) + frame[at + 8:]
    sock = connect(gateway)
    try:
        sock.sendall(frame)
        got = response(sock, 8, version, 5 if version >= 8 else 4)  # flexible from v8
    finally:
        sock.close()
    return [(t.name, [(p.partition_index, p.error_code.value) for p in t.partitions])
            for t in got.topics]


def _fetch(gateway: Any, named: list[tuple[str, list[int]]] | None,
           version: int = 8) -> list[tuple[str, list[tuple[int, int, str, int]]]]:
    """OffsetFetch of group g (v8: batched, v7: one group): (topic, [(partition, offset,
    metadata, error)]) in response order."""
    topics = None if named is None else [{"name": t, "partition_indexes": ps} for t, ps in named]
    if version >= 8:
        got = call_once(gateway, 9, 8, {"groups": [{"group_id": "g", "topics": topics}],
                                        "require_stable": False})
        assert got.groups[0].error_code.value == NONE
        answered = got.groups[0].topics
    else:
        got = call_once(gateway, 9, version, {"group_id": "g", "topics": topics,
                                              "require_stable": False})
        assert got.error_code.value == NONE
        answered = got.topics
    return [(t.name, [(p.partition_index, p.committed_offset, p.metadata, p.error_code.value)
                      for p in t.partitions]) for t in answered]


# -- 1. OffsetCommit v2-v4 retention_time_ms --------------------------------------------------


@pytest.mark.parametrize("version", [2, 3, 4])
def test_a_retention_below_minus_one_is_answered_none_and_the_offset_expires_at_once(
        gateway: Any, topics: Any, version: int) -> None:
    """Kafka stores the expire timestamp commit time + retention and expires the offset once
    the clock reaches it; -1 is its default (the group's retention). Before, every negative
    retention was taken for -1, and the offset stayed a week."""
    topics.create("t", 4)
    assert _commit(gateway, [("t", [(0, 5, "")])], version, retention_ms=-1) == [
        ("t", [(0, NONE)])]
    assert _commit(gateway, [("t", [(1, 6, "")])], version, retention_ms=3_600_000) == [
        ("t", [(1, NONE)])]
    assert _commit(gateway, [("t", [(2, 7, "")])], version, retention_ms=-2) == [
        ("t", [(2, NONE)])]
    assert _commit(gateway, [("t", [(3, 8, "")])], version, retention_ms=-86_400_000) == [
        ("t", [(3, NONE)])]
    assert _fetch(gateway, [("t", [0, 1, 2, 3])]) == [
        ("t", [(0, 5, "", NONE), (1, 6, "", NONE), (2, -1, "", NONE), (3, -1, "", NONE)])]
    assert _fetch(gateway, None) == [("t", [(0, 5, "", NONE), (1, 6, "", NONE)])]


@pytest.mark.parametrize("version", [2, 3, 4])
def test_a_retention_past_what_a_timedelta_holds_is_answered(
        gateway: Any, topics: Any, version: int) -> None:
    """``retention_time_ms`` is any int64; kio reads it into a ``datetime.timedelta``, which
    ends near 8.64e16 ms. Past that the request did not decode and the gateway closed the
    connection unanswered. Kafka answers: commit time + retention, in the far future (the
    offset stays) or, for a negative one, in the past (expired at once)."""
    topics.create("t", 4)
    top, bottom = 2**63 - 1, -(2**63)
    assert _commit(gateway, [("t", [(0, 5, "")])], version, retention_ms=top) == [
        ("t", [(0, NONE)])]
    assert _commit(gateway, [("t", [(1, 6, "")])], version, retention_ms=10**17) == [
        ("t", [(1, NONE)])]
    assert _commit(gateway, [("t", [(2, 7, "")])], version, retention_ms=bottom) == [
        ("t", [(2, NONE)])]
    assert _commit(gateway, [("t", [(3, 8, "")])], version, retention_ms=-(10**17)) == [
        ("t", [(3, NONE)])]
    assert _fetch(gateway, [("t", [0, 1, 2, 3])]) == [
        ("t", [(0, 5, "", NONE), (1, 6, "", NONE), (2, -1, "", NONE), (3, -1, "", NONE)])]


def test_a_positive_retention_expires_the_offset_once_its_time_has_passed(
        gateway: Any, topics: Any) -> None:
    """docs/gateway.md: ``retention_time_ms`` other than -1 expires the offset at commit time +
    it (Kafka's ``expireTimestampMs``), in a group that lets offsets expire (a simple commit's);
    the one committed beside it with -1 stays."""
    topics.create("t", 2)
    assert _commit(gateway, [("t", [(0, 5, "")])], 2, retention_ms=200) == [("t", [(0, NONE)])]
    assert _commit(gateway, [("t", [(1, 6, "")])], 2, retention_ms=-1) == [("t", [(1, NONE)])]
    wait_until(lambda: _fetch(gateway, [("t", [0])]) == [("t", [(0, -1, "", NONE)])])
    assert _fetch(gateway, None) == [("t", [(1, 6, "", NONE)])]


# -- 2. a partition named twice -----------------------------------------------------------------


def test_commit_answers_every_entry_in_request_order_and_the_later_one_is_stored(
        gateway: Any, topics: Any) -> None:
    """Before: one answer per partition (and per topic name), the refused ones last."""
    topics.create("t", 2)
    assert _commit(gateway, [
        ("nosuch", [(0, 1, ""), (0, 1, "")]),
        ("t", [(0, 5, "a"), (9, 1, ""), (1, 6, "b"), (0, 7, "c")]),
        ("t", [(1, 8, "d")]),
    ]) == [
        ("nosuch", [(0, UNKNOWN_TOPIC_OR_PARTITION), (0, UNKNOWN_TOPIC_OR_PARTITION)]),
        ("t", [(0, NONE), (9, UNKNOWN_TOPIC_OR_PARTITION), (1, NONE), (0, NONE)]),
        ("t", [(1, NONE)]),
    ]
    assert _fetch(gateway, [("t", [0, 1])]) == [("t", [(0, 7, "c", NONE), (1, 8, "d", NONE)])]


def test_a_later_entry_with_metadata_too_large_leaves_the_earlier_one_stored(
        gateway: Any, topics: Any) -> None:
    """Kafka refuses an entry whose metadata is too large alone, and writes the others: the
    earlier entry of the partition is stored and answered NONE. Before, the later entry
    replaced it unseen: the partition was answered OFFSET_METADATA_TOO_LARGE once, and
    nothing stored."""
    topics.create("t", 2)
    assert _commit(gateway, [("t", [(0, 5, "ok"), (0, 6, TOO_LARGE),
                                    (1, 7, TOO_LARGE), (1, 8, "fine")])]) == [
        ("t", [(0, NONE), (0, OFFSET_METADATA_TOO_LARGE),
               (1, OFFSET_METADATA_TOO_LARGE), (1, NONE)])]
    assert _fetch(gateway, [("t", [0, 1])]) == [
        ("t", [(0, 5, "ok", NONE), (1, 8, "fine", NONE)])]
    # Both too large: both refused, nothing stored.
    assert _commit(gateway, [("t", [(0, 9, TOO_LARGE), (0, 10, TOO_LARGE)])]) == [
        ("t", [(0, OFFSET_METADATA_TOO_LARGE), (0, OFFSET_METADATA_TOO_LARGE)])]
    # A group-level refusal (a generation with no member) comes first (Kafka's
    # validateOffsetCommit), for every entry.
    assert _commit(gateway, [("t", [(0, 11, "ok"), (0, 12, TOO_LARGE)])], generation=3) == [
        ("t", [(0, UNKNOWN_MEMBER_ID), (0, UNKNOWN_MEMBER_ID)])]
    assert _fetch(gateway, [("t", [0])]) == [("t", [(0, 5, "ok", NONE)])]


@pytest.mark.parametrize("version", [7, 8])
def test_fetch_answers_every_entry_in_request_order(gateway: Any, topics: Any,
                                                    version: int) -> None:
    """Kafka's ``fetchOffsets`` answers every index of every topic entry. Before, a partition
    named twice was answered once, and a topic named twice in one entry."""
    topics.create("t", 2)
    assert _commit(gateway, [("t", [(0, 5, "a"), (1, 6, "b")])]) == [
        ("t", [(0, NONE), (1, NONE)])]
    assert _fetch(gateway, [("t", [1, 0, 1, -1]), ("", [0, 0]), ("t", [0])], version) == [
        ("t", [(1, 6, "b", NONE), (0, 5, "a", NONE), (1, 6, "b", NONE), (-1, -1, "", NONE)]),
        ("", [(0, -1, "", NONE), (0, -1, "", NONE)]),
        ("t", [(0, 5, "a", NONE)]),
    ]


def test_fetch_answers_the_topics_it_may_not_describe_after_the_others(
        redis_server: Any, namespace: str, tmp_path: Path) -> None:
    """Kafka's ``fetchOffsetsForGroup``: the coordinator's answers, in request order, then
    TOPIC_AUTHORIZATION_FAILED for each entry of a topic the principal may not describe.
    Before, the refused topics came first and a partition named twice was answered once."""
    path = tmp_path / "auth.json"
    path.write_text(json.dumps({"users": {"alice": "pw"}, "acls": [
        {"principal": "User:alice", "resource": resource, "name": name, "pattern": "literal",
         "operations": ["READ"], "permission": "allow"}
        for resource, name in (("group", "g"), ("topic", "orders"))]}))
    with topics_of(redis_server, namespace) as topics, \
            running_gateway(redis_server, namespace, auth=load_auth_file(path)) as gw:
        topics.create("orders", 1)
        topics.create("secret", 1)
        sock = sasl_connect(gw, "alice", "pw")
        try:
            sock.sendall(request_frame(9, 8, 20, {"groups": [{"group_id": "g", "topics": [
                {"name": "secret", "partition_indexes": [0, 0]},
                {"name": "orders", "partition_indexes": [0, 0]}]}], "require_stable": False}))
            got = response(sock, 9, 8, 5)
        finally:
            sock.close()
    assert [(t.name, [(p.partition_index, p.committed_offset, p.error_code.value)
                      for p in t.partitions]) for t in got.groups[0].topics] == [
        ("orders", [(0, -1, NONE), (0, -1, NONE)]),
        ("secret", [(0, -1, TOPIC_AUTHORIZATION_FAILED), (0, -1, TOPIC_AUTHORIZATION_FAILED)]),
    ]


# -- 3. the 10,000-partition limit ------------------------------------------------------------


def test_a_commit_past_10000_partitions_is_refused_whole_and_a_repeat_counts_once(
        gateway: Any, topics: Any) -> None:
    """docs/gateway.md, OffsetCommit: rcoord stores a commit in one script call, so one of more
    than 10,000 partitions is refused, every entry INVALID_REQUEST and nothing stored. 10,001
    entries of 10,000 partitions are committed and each entry answered (before: 10,000
    answers)."""
    topics.create("a", 5_000)
    topics.create("b", 5_001)
    everything = [("a", [(p, 1, "") for p in range(5_000)]),
                  ("b", [(p, 1, "") for p in range(5_001)])]
    refused = _commit(gateway, everything)
    assert [(t, len(parts), {e for _, e in parts}) for t, parts in refused] == [
        ("a", 5_000, {INVALID_REQUEST}), ("b", 5_001, {INVALID_REQUEST})]
    assert _fetch(gateway, None) == []
    repeated = [("a", [(p, 2, "") for p in range(5_000)]),
                ("b", [(p, 2, "") for p in range(5_000)] + [(0, 3, "")])]
    committed = _commit(gateway, repeated)
    assert [(t, len(parts), {e for _, e in parts}) for t, parts in committed] == [
        ("a", 5_000, {NONE}), ("b", 5_001, {NONE})]
    assert _fetch(gateway, [("b", [0, 1, 5_000])]) == [
        ("b", [(0, 3, "", NONE), (1, 2, "", NONE), (5_000, -1, "", NONE)])]
