"""A request that fails as a whole is answered with the error on every item it named, never
with an empty response a client reads as success (Kafka's ``AbstractRequest.getErrorResponse``).
"""

from __future__ import annotations

import dataclasses
import logging
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
from rcoord.gateway.errors import UNREACHED_MESSAGE
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

    def append(state: Any, topic: str, partition: int, data: Any, **kw: Any) -> Any:
        if partition == 0:
            zero_failed.set()
            raise ConnectionLost("the connection broke")
        one_started.set()
        assert release.wait(30)
        return real(state, topic, partition, data, **kw)

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
    assert parts[0].error_message == UNREACHED_MESSAGE  # (the why is the log's alone)
    assert (int(parts[1].error_code.value), parts[1].base_offset) == (0, 0)
    assert topics.describe("t").partitions[1].log_end_offset == 1


def test_redis_unreachable_met_by_produce_is_logged_once_a_while(
        gateway, topics, monkeypatch, caplog: pytest.LogCaptureFixture) -> None:
    """A Produce answers each partition that could not reach Redis on its own
    (REQUEST_TIMED_OUT) and logged nothing for it: a gateway only producers used gave no sign
    that Redis was away. It is warned as for other requests: once, the rest at DEBUG."""
    from rcoord.errors import ConnectionLost
    from rcoord.gateway import api_records

    topics.create("t", 2)

    def append(*args: Any, **kw: Any) -> Any:
        raise ConnectionLost("Error 111 connecting to 127.0.0.1:1. Connection refused.")

    monkeypatch.setattr(api_records, "_append", append)
    sock = connect(gateway)
    try:
        with caplog.at_level(logging.DEBUG, logger="rcoord.gateway"):
            answers = []
            for corr in (1, 2):
                sock.sendall(request_frame(0, 9, corr, _produce_body(acks=-1)))
                got = response(sock, 0, 9, 5)
                answers.append(_codes(got.responses, "partition_responses", "index"))
    finally:
        sock.close()
    assert answers == [{("t", 0): REQUEST_TIMED_OUT, ("t", 1): REQUEST_TIMED_OUT}] * 2
    mine = [r for r in caplog.records if "Redis unreachable or unavailable" in r.getMessage()]
    warned = [r.getMessage() for r in mine if r.levelno == logging.WARNING]
    assert len(warned) == 1, warned
    assert warned[0].startswith("Produce v9: ") and "Connection refused" in warned[0]
    assert sum(r.levelno == logging.DEBUG for r in mine) == 3


@pytest.mark.parametrize("failure", ["unreachable", "topic gone"])
def test_a_stored_batch_is_answered_stored_when_its_log_start_cannot_be_read(
        gateway, topics, monkeypatch, failure):
    """The log start offset a Produce answer carries is read after the append. That read
    failing (Redis unreachable a moment, the topic deleted meanwhile) answered the partition
    REQUEST_TIMED_OUT or UNKNOWN_TOPIC_OR_PARTITION though its batch was stored, and a
    producer that is not idempotent resent it: a duplicate. Now it is answered with its offset
    and log start -1 (not known), as Kafka's PartitionResponse has it."""
    from rcoord.errors import ConnectionLost, Errors
    from rcoord.gateway import api_records
    from rcoord.topics import TopicError

    topics.create("t", 2)

    def log_offsets(*args: Any) -> Any:
        if failure == "unreachable":
            raise ConnectionLost("the connection broke")
        raise TopicError(Errors.UNKNOWN_TOPIC_OR_PARTITION, "t was deleted")

    monkeypatch.setattr(api_records, "log_offsets", log_offsets)
    sock = connect(gateway)
    try:
        sock.sendall(request_frame(0, 9, 7, _produce_body(acks=-1)))
        got = response(sock, 0, 9, 5)
    finally:
        sock.close()
    assert [(p.index, int(p.error_code.value), p.base_offset, p.log_start_offset)
            for t in got.responses for p in t.partition_responses] == [(0, 0, 0, -1),
                                                                      (1, 0, 0, -1)]
    assert [p.log_end_offset for p in topics.describe("t").partitions] == [1, 1]


_TOPIC_ID = uuid.UUID("6f1d8a52-3b7e-4c1a-9d2e-0a4b5c6d7e8f")
_BY_TOPIC_ID: dict[int, dict[str, Any]] = {
    0: {"acks": 1, "timeout": 1000, "topic_data": [{"topic_id": _TOPIC_ID, "partition_data": [
        {"index": 0, "records": produced_batch([Record(0, b"k", b"v", {}, 0)])}]}]},
    1: {"max_wait": 10, "topics": [{"topic_id": _TOPIC_ID, "partitions": [{"partition": 3}]}]},
    8: {"group_id": "grp", "generation_id_or_member_epoch": -1, "member_id": "", "topics": [
        {"topic_id": _TOPIC_ID, "partitions": [{"partition_index": 0, "committed_offset": 1}]}]},
    9: {"groups": [{"group_id": "grp", "topics": [{"topic_id": _TOPIC_ID,
                                                   "partition_indexes": [3]}]}]},
}


def _gateways(records: list[logging.LogRecord]) -> list[logging.LogRecord]:
    """The records a gateway logged (its own loggers, asyncio's for its event loop): not a
    warning some other test's thread, still ending in this process, logged meanwhile (a Kafka
    client's, a consumer's)."""
    return [r for r in records if r.name.startswith("rcoord.gateway") or r.name == "asyncio"]


def _topic_ids(entity: Any) -> set[uuid.UUID]:
    """Every topic id in a response entity, at any depth."""
    out: set[uuid.UUID] = set()
    for f in dataclasses.fields(entity):
        for item in (v if isinstance(v := getattr(entity, f.name), tuple) else (v,)):
            if f.name == "topic_id":
                out.add(item)
            elif dataclasses.is_dataclass(item):
                out |= _topic_ids(item)
    return out


@pytest.mark.parametrize(("key", "version"), [(0, 13), (1, 13), (1, 18), (8, 10), (9, 10)])
def test_an_unserved_version_that_names_topics_by_id_is_answered_unsupported_version(
        gateway, caplog, key, version):
    """Versions that name topics by id alone (KIP-516: Produce v13, Fetch v13+, OffsetCommit
    and OffsetFetch v10) made the error response's builder fail on the missing name: asyncio
    logged the exception as unhandled and the request was never answered, where an unserved
    version must be answered UNSUPPORTED_VERSION with the connection left open. The topic id
    comes back as sent; Fetch v13+ carries the top-level code only, as Kafka answers it."""
    assert not REGISTRY[key].min_version <= version <= REGISTRY[key].max_version
    caplog.set_level(logging.INFO)
    with connect(gateway) as sock:
        sock.sendall(request_frame(key, version, 1, _BY_TOPIC_ID[key]))
        got = response(sock, key, version, 5)
        codes = _error_codes(got)
        assert codes and set(codes) == {UNSUPPORTED_VERSION}, codes
        assert _topic_ids(got) == (set() if key == 1 else {_TOPIC_ID})
        sock.sendall(request_frame(18, 3, 2, {"client_software_name": "t",
                                              "client_software_version": "1"}))
        assert response(sock, 18, 3, 4).error_code.value == 0  # still served
    assert not [r for r in _gateways(caplog.records) if r.levelno >= logging.WARNING]


def _one_of_each(tp: Any) -> Any:
    """Plain data for a request of type ``tp`` whose every list holds one item, for ``build``."""
    import typing

    from rcoord.gateway.wire import _optional, _zero

    inner = _optional(tp)[1]
    if typing.get_origin(inner) is tuple:
        return [_one_of_each(typing.get_args(inner)[0])]
    if dataclasses.is_dataclass(inner):
        hints = typing.get_type_hints(inner)
        return {f.name: _one_of_each(hints[f.name]) for f in dataclasses.fields(inner)}
    if inner is uuid.UUID:
        return _TOPIC_ID
    return "t" if isinstance(inner, type) and issubclass(inner, str) else _zero(inner)


def test_every_unserved_version_kio_reads_has_an_unsupported_version_answer():
    """What the dispatcher answers a version it does not serve: every API and version kio has a
    schema for, each list in the request holding one item, gets UNSUPPORTED_VERSION somewhere
    in a response that encodes, or None (nothing to carry it: the connection is closed). Those
    naming topics by id failed (above), and so did the delegation token APIs, whose responses'
    timestamps had no zero value."""
    from kio.index import KioIndexError

    checked = 0
    for key in range(100):
        for version in range(20):
            entry = REGISTRY.get(key)
            if entry is not None and entry.min_version <= version <= entry.max_version:
                continue
            try:
                cls = request_class(key, version)
            except KioIndexError:
                continue
            req = build(cls, _one_of_each(cls))
            data = request_error_response(key, version, req, UNSUPPORTED_VERSION)
            if data is not None:
                encode_response(key, version, 1, data)
                codes = _error_codes(build(response_class(key, version), data))
                assert codes and set(codes) == {UNSUPPORTED_VERSION}, (key, version, codes)
            checked += 1
    assert checked > 150  # (175 with kio 0.6.5)


def test_an_error_response_that_cannot_be_built_closes_the_connection_with_one_line(
        gateway, caplog, monkeypatch):
    """The fallback for a request shape the builders do not know (a future kio version): the
    connection is closed with a warning, as for any request the gateway cannot answer, never an
    exception asyncio reports as unhandled with the request left waiting."""
    from rcoord.gateway import error_responses

    def fails(req: Any, code: int) -> None:
        raise AttributeError("no such field")

    monkeypatch.setitem(error_responses._BUILDERS, 8, fails)
    caplog.set_level(logging.INFO)
    with connect(gateway) as sock:
        sock.sendall(request_frame(8, 9, 1, _commit_body("grp")))  # the gateway serves 2-8
        with pytest.raises(ConnectionError, match="closed"):
            recv_frame(sock)
    warned = [r for r in _gateways(caplog.records) if r.levelno >= logging.WARNING]
    assert [r.levelno for r in warned] == [logging.WARNING], warned
    assert "cannot be built (AttributeError: no such field)" in warned[0].getMessage()


def test_a_login_redis_refuses_the_gateway_is_retriable_for_kafka_clients(own_server):
    """The gateway's own Redis credentials are not the Kafka client's problem: a password
    rotated under a running gateway (its connections made again with the old one) is answered
    as Redis unreachable is, COORDINATOR_NOT_AVAILABLE, which a Kafka client retries. Since a
    refused login became ``AuthenticationFailedError`` (not a ``ConnectionLost``) it fell to
    the catch-all: UNKNOWN_SERVER_ERROR and a traceback per request."""
    ns = "e" + uuid.uuid4().hex[:10]
    with running_gateway(own_server, ns) as gw:
        admin = own_server.client()
        sock = connect(gw)
        try:
            admin.config_set("requirepass", "rotated")
            admin.client_kill_filter(_type="normal", skipme=True)
            sock.sendall(request_frame(8, 8, 1, _commit_body("grp")))
            got = response(sock, 8, 8, 5)
            assert _codes(got.topics, "partitions", "partition_index") == {
                ("t", 0): COORDINATOR_NOT_AVAILABLE, ("t", 1): COORDINATOR_NOT_AVAILABLE,
                ("u", 0): COORDINATOR_NOT_AVAILABLE}
        finally:
            admin.config_set("requirepass", "")
            sock.close()
            admin.close()


def test_redis_unreachable_is_warned_once_a_while_not_per_request(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A stopped Redis failed every request, and each logged a warning: tens a second with one
    polling kafka-python consumer, growing with the clients. The same failure is warned once,
    then at most every ``UNREACHED_LOG_INTERVAL_S`` with how many calls met it meanwhile."""
    import types

    import redis

    from rcoord.gateway import errors

    state: Any = types.SimpleNamespace(unreached={}, login_refusals={})
    down = redis.exceptions.ConnectionError("Error 111 connecting to 127.0.0.1:1. Refused.")
    with caplog.at_level(logging.DEBUG, logger="rcoord.gateway"):
        for n in range(5):
            errors.log_unreached(state, f"Fetch v11 #{n}", down)
        errors.log_unreached(state, "Metadata v9", redis.exceptions.TimeoutError("timed out"))
        monkeypatch.setattr(errors, "UNREACHED_LOG_INTERVAL_S", 0.0, raising=False)
        errors.log_unreached(state, "Fetch v11 #5", down)
    mine = [r for r in caplog.records if r.name == errors.log.name]
    warned = [r.getMessage() for r in mine if r.levelno == logging.WARNING]
    assert warned == [
        "Fetch v11 #0: Redis unreachable or unavailable: " + str(down),
        "Metadata v9: Redis unreachable or unavailable: timed out",  # another failure
        "Fetch v11 #5: Redis unreachable or unavailable: " + str(down)
        + " (4 more calls met it since the last such line)"]
    assert sum(r.levelno == logging.DEBUG for r in mine) == 4
