"""OffsetFetch of all a group's offsets: a group can hold the offsets of 100,000 partitions, and
building and encoding that response took about 1.7 s on the event loop, holding every other
connection. It is built and encoded on the topic threads (``Api.offload``)."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("kio")

from gateway_harness import answered_while_building, call_once
from harness import wait_for_the_next_ms


def _commit(gateway: Any, group: str, topic: str, offsets: dict[int, int]) -> None:
    got = call_once(gateway, 8, 8, {
        "group_id": group, "generation_id_or_member_epoch": -1, "member_id": "",
        "group_instance_id": None, "topics": [{"name": topic, "partitions": [
            {"partition_index": p, "committed_offset": o, "committed_leader_epoch": -1,
             "committed_metadata": f"m{p}"} for p, o in offsets.items()]}]})
    assert [p.error_code.value for t in got.topics for p in t.partitions] == [0] * len(offsets)


@pytest.mark.parametrize("version", [7, 8])
def test_other_connections_are_served_while_an_offset_fetch_response_is_built(
        gateway: Any, topics: Any, monkeypatch: Any, version: int) -> None:
    """The response's build is held until another connection has been answered: on the event
    loop (as it was) nothing else could be answered, and this failed by timeout."""
    topics.create("t", 3)
    _commit(gateway, "g", "t", {0: 5, 1: 6, 2: 7})
    body = ({"groups": [{"group_id": "g", "topics": None}], "require_stable": False}
            if version >= 8 else {"group_id": "g", "topics": None, "require_stable": False})
    got = answered_while_building(gateway, monkeypatch, 9, version, body)
    topics_ = got.groups[0].topics if version >= 8 else got.topics
    assert [(t.name, [(p.partition_index, p.committed_offset, p.metadata, p.error_code.value)
                      for p in t.partitions]) for t in topics_] == [
        ("t", [(0, 5, "m0", 0), (1, 6, "m1", 0), (2, 7, "m2", 0)])]


def test_offsets_committed_to_a_deleted_topic_are_not_those_of_one_created_again(
        gateway: Any, topics: Any, single_client: Any) -> None:
    """Kafka deletes a topic's committed offsets with it. Before, a Kafka client resumed a
    topic created again under the same name at the deleted topic's offsets."""
    topics.create("t", 2)
    topics.create("kept", 1)
    _commit(gateway, "g", "t", {0: 5, 1: 6})
    _commit(gateway, "g", "kept", {0: 3})
    topics.delete("t")
    topics.create("t", 2)
    wait_for_the_next_ms(single_client, topics.describe("t").created_ms)
    _commit(gateway, "g", "t", {1: 1})  # made to the new topic: it counts

    def fetched(wanted: Any) -> list[tuple[str, list[tuple[int, int]]]]:
        got = call_once(gateway, 9, 8, {"groups": [{"group_id": "g", "topics": wanted}],
                                        "require_stable": False})
        return sorted((t.name, [(p.partition_index, p.committed_offset) for p in t.partitions])
                      for t in got.groups[0].topics)

    assert fetched([{"name": "t", "partition_indexes": [0, 1]}]) == [("t", [(0, -1), (1, 1)])]
    assert fetched(None) == [("kept", [(0, 3)]), ("t", [(1, 1)])]
