"""Metadata of a very large topic: a topic an older rcoord created can have far more than the
10,000 partitions one create now makes, and building Metadata's partition list (a dict and a
kio entity per partition, then the encoding) takes seconds at 100,000. It is built and encoded
on the topic threads (``Api.offload``), so every other connection is served meanwhile."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("kio")

from gateway_harness import answered_while_building, connect, request_frame, response

from rcoord.topics import meta_key

WAIT_S = 60.0


def test_other_connections_are_served_while_a_metadata_response_is_built(gateway, topics,
                                                                         monkeypatch):
    """The Metadata response's build is held until another connection has been answered: on
    the event loop (as it was) nothing else could be answered, and this failed by timeout."""
    topics.create("t", 3)
    got = answered_while_building(gateway, monkeypatch, 3, 12, {"topics": [{"name": "t"}]})
    assert [(t.name, [p.partition_index for p in t.partitions]) for t in got.topics] == [
        ("t", [0, 1, 2])]


def test_a_topic_of_100000_partitions_is_described_whole(gateway, topics, redis_server):
    topics.create("huge", 1)
    client = redis_server.client()
    try:  # as an older rcoord left it: no cap on one create
        client.hset(meta_key(gateway.config.namespace, "huge"), "partitions", 100_000)
    finally:
        client.close()
    sock = connect(gateway)
    try:
        sock.settimeout(WAIT_S)
        sock.sendall(request_frame(3, 12, 1, {"topics": [{"name": "huge"}]}))
        got = response(sock, 3, 12, 5)
    finally:
        sock.close()
    (topic,) = got.topics
    assert topic.name == "huge" and topic.error_code.value == 0
    assert [p.partition_index for p in topic.partitions] == list(range(100_000))
    assert {(p.leader_id, p.replica_nodes, p.isr_nodes) for p in topic.partitions} == {
        (0, (0,), (0,))}


@pytest.mark.parametrize("version", [8, 10, 11, 12])
def test_authorized_operations_when_asked_and_the_sentinel_when_not(gateway, topics, version):
    """Metadata v8+ (KIP-430) with no ACLs: every topic operation (3576) and, up to v10, every
    cluster operation (8096) when asked; Kafka's sentinel -2**31 when not."""
    topics.create("t", 1)

    def ask(include: bool) -> Any:
        body: dict[str, Any] = {"topics": [{"name": "t"}], "allow_auto_topic_creation": False,
                                "include_topic_authorized_operations": include}
        if version <= 10:
            body["include_cluster_authorized_operations"] = include
        sock = connect(gateway)
        try:
            sock.sendall(request_frame(3, version, 1, body))
            return response(sock, 3, version, 5 if version >= 9 else 4)  # v9+: flexible
        finally:
            sock.close()

    asked, not_asked = ask(True), ask(False)
    assert [t.topic_authorized_operations for t in asked.topics] == [3576]
    assert [t.topic_authorized_operations for t in not_asked.topics] == [-(2**31)]
    if version <= 10:
        assert asked.cluster_authorized_operations == 8096
        assert not_asked.cluster_authorized_operations == -(2**31)
