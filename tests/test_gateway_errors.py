"""A request that fails as a whole is answered with the error on every item it named, never
with an empty response a client reads as success (Kafka's ``AbstractRequest.getErrorResponse``).
"""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

import pytest
from gateway_harness import (
    connect,
    produced_batch,
    recv_frame,
    request_frame,
    response,
    running_gateway,
    topics_of,
)

from rcoord import GroupCoordinator, TopicPartition
from rcoord.gateway.error_responses import request_error_response
from rcoord.gateway.registry import REGISTRY
from rcoord.gateway.wire import build, encode_response, request_class, response_class
from rcoord.topics import Record

REQUEST_TIMED_OUT = 7
COORDINATOR_NOT_AVAILABLE = 15
UNSUPPORTED_VERSION = 35


def _commit_body(group: str) -> dict[str, Any]:
    return {"group_id": group, "generation_id_or_member_epoch": -1, "member_id": "",
            "topics": [{"name": "t", "partitions": [
                {"partition_index": 0, "committed_offset": 1},
                {"partition_index": 1, "committed_offset": 1}]},
                {"name": "u", "partitions": [{"partition_index": 0, "committed_offset": 1}]}]}


def _produce_body(acks: int) -> dict[str, Any]:
    batch = produced_batch([Record(0, b"k", b"v", {}, 0)])
    return {"acks": acks, "timeout": 1000, "topic_data": [
        {"name": "t", "partition_data": [{"index": 0, "records": batch},
                                         {"index": 1, "records": batch}]}]}


def _codes(topics: Any, partitions: str, index: str) -> dict[tuple[str, int], int]:
    return {(t.name, getattr(p, index)): int(p.error_code.value)
            for t in topics for p in getattr(t, partitions)}


def test_redis_refusing_writes_is_an_error_on_every_partition_not_an_empty_success(own_server):
    ns = "e" + uuid.uuid4().hex[:10]
    with running_gateway(own_server, ns) as gw:
        with topics_of(own_server, ns) as topics:
            topics.create("t", 2)
            topics.create("u", 1)
        admin = own_server.client()
        sock = connect(gw)
        try:
            admin.config_set("maxmemory-policy", "noeviction")
            admin.config_set("maxmemory", "1")  # every write is refused with OOM
            sock.sendall(request_frame(8, 8, 1, _commit_body("grp")))
            got = response(sock, 8, 8, 5)
            assert _codes(got.topics, "partitions", "partition_index") == {
                ("t", 0): COORDINATOR_NOT_AVAILABLE, ("t", 1): COORDINATOR_NOT_AVAILABLE,
                ("u", 0): COORDINATOR_NOT_AVAILABLE}
            sock.sendall(request_frame(0, 9, 2, _produce_body(acks=-1)))
            got = response(sock, 0, 9, 5)
            assert _codes(got.responses, "partition_responses", "index") == {
                ("t", 0): REQUEST_TIMED_OUT, ("t", 1): REQUEST_TIMED_OUT}
            # acks=0: no response is ever due, so Kafka closes the connection to tell.
            sock.sendall(request_frame(0, 9, 3, _produce_body(acks=0)))
            sock.settimeout(10)
            with pytest.raises(ConnectionError, match="closed"):
                recv_frame(sock)
        finally:
            admin.config_set("maxmemory", "0")
            sock.close()
        fetched = GroupCoordinator(admin, ns).fetch_offsets("grp", [TopicPartition("t", 0)])
        assert fetched.offsets[TopicPartition("t", 0)].offset == -1  # nothing was committed
        admin.close()


def test_an_unserved_version_without_a_top_level_error_code_is_answered_per_partition(gateway):
    sock = connect(gateway)
    try:
        sock.sendall(request_frame(8, 9, 1, _commit_body("grp")))  # the gateway serves 2-8
        got = response(sock, 8, 9, 5)
        assert _codes(got.topics, "partitions", "partition_index") == {
            ("t", 0): UNSUPPORTED_VERSION, ("t", 1): UNSUPPORTED_VERSION,
            ("u", 0): UNSUPPORTED_VERSION}
    finally:
        sock.close()


_REQUESTS: dict[int, dict[str, Any]] = {
    0: _produce_body(acks=1),
    1: {"max_wait": 10, "topics": [{"topic": "t", "partitions": [{"partition": 3}]}]},
    2: {"topics": [{"name": "t", "partitions": [{"partition_index": 3}]}]},
    3: {"topics": [{"name": "t"}]},
    8: _commit_body("grp"),
    9: {"group_id": "grp", "topics": [{"name": "t", "partition_indexes": [3]}],
        "groups": [{"group_id": "grp", "topics": [{"name": "t", "partition_indexes": [3]}]}]},
    10: {"key": "grp", "coordinator_keys": ["grp"]},
    15: {"groups": ["grp"]},
    19: {"topics": [{"name": "t", "num_partitions": 1, "replication_factor": 1}]},
    20: {"topic_names": ["t"], "topics": [{"name": "t"}]},
    32: {"resources": [{"resource_type": 2, "resource_name": "t"}]},
    42: {"groups_names": ["grp"]},
}


def _error_codes(entity: Any) -> list[int]:
    """Every error code in a response entity, at any depth."""
    out: list[int] = []
    for f in dataclasses.fields(entity):
        value = getattr(entity, f.name)
        items = value if isinstance(value, tuple) else (value,)
        for item in items:
            if f.name == "error_code":
                out.append(int(item.value))
            elif dataclasses.is_dataclass(item):
                out += _error_codes(item)
    return out


@pytest.mark.parametrize("key", sorted(_REQUESTS))
def test_every_version_of_every_api_carries_the_error_somewhere(key):
    entry = REGISTRY[key]
    for version in range(entry.min_version, entry.max_version + 1):
        cls = request_class(key, version)
        names = {f.name for f in dataclasses.fields(cls)}
        req = build(cls, {k: v for k, v in _REQUESTS[key].items() if k in names})
        data = request_error_response(key, version, req, REQUEST_TIMED_OUT)
        assert data is not None, f"{entry.name} v{version}"
        encode_response(key, version, 1, data)  # encodes at that version
        codes = _error_codes(build(response_class(key, version), data))
        assert codes and set(codes) == {REQUEST_TIMED_OUT}, f"{entry.name} v{version}: {codes}"


def test_metadata_for_all_topics_cannot_carry_an_error_so_the_connection_closes():
    req = build(request_class(3, 12), {"topics": None})
    assert request_error_response(3, 12, req, REQUEST_TIMED_OUT) is None


ILLEGAL_GENERATION = 22


@pytest.mark.parametrize("version", [2, 8])
def test_commit_with_a_generation_to_a_group_that_does_not_exist_is_illegal_generation(
        gateway, topics, version):
    """Below OffsetCommit v9 Kafka answers ILLEGAL_GENERATION, not GROUP_ID_NOT_FOUND (69),
    which those clients do not know; a simple commit (generation -1) still creates the offsets."""
    topics.create("t", 1)
    sock = connect(gateway)
    header = 4 if version < 8 else 5
    try:
        def commit(corr: int, generation: int, member: str) -> int:
            sock.sendall(request_frame(8, version, corr, {
                "group_id": "gone", "generation_id_or_member_epoch": generation,
                "member_id": member, "topics": [{"name": "t", "partitions": [
                    {"partition_index": 0, "committed_offset": 1}]}]}))
            got = response(sock, 8, version, header)
            return int(got.topics[0].partitions[0].error_code.value)

        assert commit(1, 3, "m-1") == ILLEGAL_GENERATION
        assert commit(2, -1, "") == 0
    finally:
        sock.close()


def test_a_produce_is_answered_once_every_partition_append_ended(gateway, topics, monkeypatch):
    """One partition's append failing to reach Redis is that partition's REQUEST_TIMED_OUT; the
    response waits for the other partitions' appends and carries their own outcome. It was sent
    at once, REQUEST_TIMED_OUT for all, while another append still ran (a client resending it
    raced the original)."""
    import socket
    import threading

    from rcoord.errors import ConnectionLost
    from rcoord.gateway import api_records

    topics.create("t", 2)
    zero_failed, one_started, release = threading.Event(), threading.Event(), threading.Event()
    real = api_records._append

    def append(state: Any, topic: str, partition: int, data: Any) -> Any:
        if partition == 0:
            zero_failed.set()
            raise ConnectionLost("the connection broke")
        one_started.set()
        assert release.wait(30)
        return real(state, topic, partition, data)

    monkeypatch.setattr(api_records, "_append", append)
    sock = connect(gateway)
    try:
        sock.sendall(request_frame(0, 9, 7, _produce_body(acks=-1)))
        assert zero_failed.wait(10) and one_started.wait(10)
        sock.settimeout(0.5)
        with pytest.raises(socket.timeout):
            recv_frame(sock)  # partition 1's append has not ended: no answer yet
        release.set()
        sock.settimeout(10)
        got = response(sock, 0, 9, 5)
    finally:
        release.set()
        sock.close()
    parts = {p.index: p for t in got.responses for p in t.partition_responses}
    assert int(parts[0].error_code.value) == REQUEST_TIMED_OUT
    assert "the connection broke" in parts[0].error_message
    assert (int(parts[1].error_code.value), parts[1].base_offset) == (0, 0)
    assert topics.describe("t").partitions[1].log_end_offset == 1
