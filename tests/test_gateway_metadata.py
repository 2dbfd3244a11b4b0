"""Metadata of a very large topic: a topic an older rcoord created can have far more than the
10,000 partitions one create now makes, and building Metadata's partition list (a dict and a
kio entity per partition, then the encoding) takes seconds at 100,000. It is built and encoded
on the topic threads (``Api.offload``), so every other connection is served meanwhile."""

from __future__ import annotations

import threading
from typing import Any

import pytest

pytest.importorskip("kio")

from gateway_harness import call_once, connect, request_frame, response

from rcoord.gateway import wire
from rcoord.topics import meta_key

WAIT_S = 60.0


def test_other_connections_are_served_while_a_metadata_response_is_built(gateway, topics,
                                                                         monkeypatch):
    """The Metadata response's build is held until another connection has been answered: on
    the event loop (as it was) nothing else could be answered, and this failed by timeout."""
    topics.create("t", 3)
    started, release = threading.Event(), threading.Event()
    real_build = wire.build

    def held_build(cls: Any, data: Any) -> Any:
        if cls.__name__ == "MetadataResponse":
            started.set()
            assert release.wait(WAIT_S)
        return real_build(cls, data)

    monkeypatch.setattr(wire, "build", held_build)
    sock = connect(gateway)
    try:
        sock.sendall(request_frame(3, 12, 1, {"topics": [{"name": "t"}]}))
        assert started.wait(WAIT_S)
        try:
            found = call_once(gateway, 10, 4, {"key_type": 0, "coordinator_keys": ["g"]})
        finally:
            release.set()
        assert [(c.key, c.error_code.value) for c in found.coordinators] == [("g", 0)]
        got = response(sock, 3, 12, 5)
    finally:
        sock.close()
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
