"""Kafka's rules for Produce, Fetch, ListOffsets and CreateTopics that the gateway follows
(KafkaApis and ReplicaManager): an acks=0 Produce with a failed partition closes the
connection (the one sign such a producer gets); acks other than -1, 0 and 1 append nothing
(INVALID_REQUIRED_ACKS); a negative partition or an illegal topic name is
UNKNOWN_TOPIC_OR_PARTITION for that partition alone; a Fetch answers at once with min_bytes 0
and waits for min_bytes otherwise; the bytes a Fetch reads follow the response's max_bytes; and
CreateTopics with validate_only refuses what the create would; Metadata by topic id; one batch per
partition in a Produce, bytes after the last whole one dropped; a partition named twice in a
Produce or Fetch served once (the last entry); a SyncGroup v5 needs its protocol type and
name."""

from __future__ import annotations

import importlib
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("kio")

from gateway_harness import (
    call_once,
    closed_by_gateway,
    connect,
    fetched_records,
    fill_backlog,
    produced_batch,
    request_frame,
    response,
    running_gateway,
    with_crc,
)

from rcoord.errors import Errors
from rcoord.gateway.errors import CORRUPT_MESSAGE
from rcoord.topics import Producer, Record, Topics, log_offsets

INVALID_REQUIRED_ACKS = 21
INVALID_RECORD = 87


@pytest.fixture(scope="module")
def _shared_gateway(redis_server: Any) -> Iterator[Any]:
    """One gateway for the module's tests that only send requests and read answers: a
    gateway's start and stop collect garbage to judge leaked sockets (tests/gateway_harness.py),
    which cost over 0.3 s a test in a full run's heap; a socket a test leaves without a cycle
    still fails that test (pytest's unraisable hook), a cycle's at the module's end."""
    with running_gateway(redis_server, "t" + uuid.uuid4().hex[:12]) as gw:
        yield gw


@pytest.fixture
def own_gateway() -> None:
    """Marks a test (``usefixtures``) that gets a gateway and a namespace of its own: the
    group tests, whose groups a shared namespace would keep from one test to the next."""


@pytest.fixture
def namespace(request: pytest.FixtureRequest) -> str:
    if "own_gateway" in request.fixturenames:
        return "t" + uuid.uuid4().hex[:12]
    return str(request.getfixturevalue("_shared_gateway").config.namespace)


@pytest.fixture
def gateway(request: pytest.FixtureRequest, redis_server: Any, namespace: str) -> Iterator[Any]:
    """The shared gateway, left as a fresh one would be: the test's topics deleted (with their
    producers' states), and the namespace's keys checked to be the ones the test found. A test
    marked ``own_gateway`` gets conftest's per-test gateway."""
    if "own_gateway" in request.fixturenames:
        with running_gateway(redis_server, namespace) as own:
            yield own
        return
    client = redis_server.client()
    try:
        found = set(client.scan_iter(match=f"{namespace}:*"))
        yield request.getfixturevalue("_shared_gateway")
        topics = Topics(client, namespace)
        for name in topics.list():
            topics.delete(name)
        left = set(client.scan_iter(match=f"{namespace}:*"))
        assert left == found, f"keys the next test would see: {sorted(left ^ found)}"
    finally:
        client.close()


def _produce(topic: str, acks: int, corr: int, index: int = 0) -> bytes:
    batch = produced_batch([Record(0, None, b"v", {}, 0)])
    return request_frame(0, 9, corr, {"acks": acks, "timeout": 5000, "topic_data": [
        {"name": topic, "partition_data": [{"index": index, "records": batch}]}]})


def _metadata(corr: int) -> bytes:
    return request_frame(3, 9, corr, {"topics": [{"name": "t"}],
                                      "allow_auto_topic_creation": False,
                                      "include_topic_authorized_operations": False})


def _log(gateway: Any, redis_server: Any) -> tuple[int, int]:
    """Topic t's partition 0: (log start, log end)."""
    client = redis_server.client()
    try:
        return log_offsets(client, gateway.config.namespace, "t", 0)
    finally:
        client.close()


def test_an_acks0_produce_that_fails_closes_the_connection(gateway, redis_server, topics):
    topics.create("t", 1)
    # A good acks=0 produce: no answer, and the connection serves the next request.
    sock = connect(gateway)
    try:
        sock.sendall(_produce("t", 0, 1) + _metadata(2))
        assert response(sock, 3, 9, 5).topics[0].name == "t"
    finally:
        sock.close()
    # A topic that does not exist, a partition past the count: closed, the Metadata after it
    # unanswered (before, it was answered, and the records were lost without a sign).
    for topic, index in (("missing", 0), ("t", 5)):
        sock = connect(gateway)
        try:
            sock.sendall(_produce(topic, 0, 1, index) + _metadata(2))
            assert closed_by_gateway(sock), (topic, index)
        finally:
            sock.close()
    assert _log(gateway, redis_server) == (0, 1)  # the good one only


def test_acks_other_than_minus_one_zero_or_one_append_nothing(gateway, redis_server, topics):
    topics.create("t", 1)
    sock = connect(gateway)
    try:
        for corr, acks in enumerate((2, -2), 1):
            sock.sendall(_produce("t", acks, corr))
            got = response(sock, 0, 9, 5)
            [[part]] = [t.partition_responses for t in got.responses]
            assert (part.index, part.error_code.value, part.base_offset) == (
                0, INVALID_REQUIRED_ACKS, -1)
    finally:
        sock.close()
    assert _log(gateway, redis_server) == (0, 0)


def test_invalid_acks_comes_after_the_checks_kafka_makes_on_parsing(gateway, redis_server,
                                                                    topics):
    """Kafka's handleProduceRequest runs ProduceRequest.validateRecords on each partition
    before ReplicaManager.appendRecords looks at acks: with acks=2, a partition with a magic 1
    batch or two batches is INVALID_RECORD; one whose fault is found on append (a bad CRC)
    is INVALID_REQUIRED_ACKS. The gateway answered INVALID_REQUIRED_ACKS for all of them."""
    topics.create("t", 3)
    one = produced_batch([Record(0, None, b"v", {}, 0)])
    magic1 = _with_byte(one, 16, 1, crc=False)
    bad_crc = _with_byte(one, 30, 0xFF, crc=False)
    answer = call_once(gateway, 0, 9, {"acks": 2, "timeout": 5000, "topic_data": [
        {"name": "t", "partition_data": [{"index": 0, "records": magic1},
                                         {"index": 1, "records": one + one},
                                         {"index": 2, "records": bad_crc}]}]})
    assert [(p.index, p.error_code.value) for t in answer.responses
            for p in t.partition_responses] == [
        (0, INVALID_RECORD), (1, INVALID_RECORD), (2, INVALID_REQUIRED_ACKS)]
    client = redis_server.client()
    try:
        assert [log_offsets(client, gateway.config.namespace, "t", p) for p in range(3)] == [
            (0, 0)] * 3
    finally:
        client.close()


def test_a_partition_no_topic_has_fails_only_itself(gateway, topics):
    topics.create("t", 1)
    fetched = call_once(gateway, 1, 12, {
        "replica_id": -1, "max_wait": 0, "min_bytes": 1, "max_bytes": 1 << 20,
        "topics": [{"topic": "t", "partitions": [
            {"partition": -1, "fetch_offset": 0, "partition_max_bytes": 1 << 20},
            {"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1 << 20}]},
            {"topic": "bad name!", "partitions": [
                {"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1 << 20}]}]})
    assert fetched.error_code.value == 0
    codes = {(t.topic, p.partition_index): p.error_code.value
             for t in fetched.responses for p in t.partitions}
    assert codes == {("t", -1): Errors.UNKNOWN_TOPIC_OR_PARTITION, ("t", 0): 0,
                     ("bad name!", 0): Errors.UNKNOWN_TOPIC_OR_PARTITION}
    listed = call_once(gateway, 2, 7, {
        "replica_id": -1, "isolation_level": 0, "topics": [{"name": "t", "partitions": [
            {"partition_index": 0, "timestamp": -1}, {"partition_index": -1, "timestamp": -1}]}]})
    codes = {p.partition_index: (p.error_code.value, p.offset)
             for t in listed.topics for p in t.partitions}
    assert codes == {0: (0, 0), -1: (Errors.UNKNOWN_TOPIC_OR_PARTITION, -1)}


def _fetch_body(topic: str, partitions: list[int], *, max_wait: int, min_bytes: int,
                max_bytes: int, partition_max_bytes: int) -> dict[str, Any]:
    return {"replica_id": -1, "max_wait": max_wait, "min_bytes": min_bytes,
            "max_bytes": max_bytes, "topics": [{"topic": topic, "partitions": [
                {"partition": p, "fetch_offset": 0, "partition_max_bytes": partition_max_bytes}
                for p in partitions]}]}


def _records(fetched: Any) -> dict[int, list[bytes | None]]:
    return {p.partition_index: [r.value for r in fetched_records(bytes(p.records or b""))]
            for t in fetched.responses for p in t.partitions}


def test_fetch_min_bytes(gateway, redis_server, topics):
    """min_bytes 0 answers at once at the log end (it waited max_wait); a min_bytes larger than
    the records there waits for more (it answered with the first record)."""
    topics.create("t", 1)
    # A minute's max_wait under the harness' 10 s socket timeout: only an answer at once
    # passes.
    assert _records(call_once(gateway, 1, 12, _fetch_body(
        "t", [0], max_wait=60_000, min_bytes=0, max_bytes=1 << 20,
        partition_max_bytes=1 << 20))) == {0: []}

    client = redis_server.client()
    producer = Producer(client, gateway.config.namespace, idempotent=False)
    producer.send("t", b"small", partition=0)
    sock = connect(gateway)
    sock.settimeout(60)
    got: list[Any] = []
    waiting = threading.Thread(target=lambda: got.append(response(sock, 1, 12, 5)))
    try:
        sock.sendall(request_frame(1, 12, 1, _fetch_body(
            "t", [0], max_wait=60_000, min_bytes=100_000, max_bytes=1 << 20,
            partition_max_bytes=1 << 20)))
        waiting.start()
        for _ in range(3):  # 3 x 40 KB: the answer comes once they are all there
            producer.send("t", b"x" * 40_000, partition=0)
        waiting.join(60)
        assert got, "no answer"
        values = _records(got[0])[0]
        assert values[0] == b"small" and len(values) == 4
        assert sum(len(v or b"") for v in values) >= 100_000
    finally:
        sock.close()
        client.close()


def test_the_bytes_a_fetch_reads_follow_its_max_bytes(gateway, redis_server, topics,
                                                      monkeypatch):
    """40 backlogged partitions of 20 records of 50 KB, max_bytes 1 MB, partition_max_bytes
    1 MB each: the gateway read 40 MB (every partition to its own limit) to send 1 MB; now the
    first partition's megabyte and one record of each other."""
    topics.create("t", 40)
    fill_backlog(redis_server, gateway.config.namespace, "t")
    read = [0]
    fetch_module = importlib.import_module("rcoord.topics.fetch")  # (every read goes through)
    real = fetch_module._fetch_many

    def counting(client: Any, reads: Any) -> Any:
        answers = real(client, reads)
        read[0] += sum(len(r.value or b"") for a in answers for r in a.records)
        return answers

    monkeypatch.setattr(fetch_module, "_fetch_many", counting)
    fetched = call_once(gateway, 1, 12, _fetch_body("t", list(range(40)), max_wait=0,
                                                    min_bytes=1, max_bytes=1 << 20,
                                                    partition_max_bytes=1 << 20))
    got = _records(fetched)
    sent = sum(len(v or b"") for vs in got.values() for v in vs)
    assert len(got[0]) == 20 and sent < 1.1 * (1 << 20)
    # The first partition's records (and one more a read asked for), one record of each of
    # the 39 others: about 3 MB, not 40.
    assert read[0] <= 21 * 50_000 + 39 * 50_000


def test_validate_only_refuses_what_the_create_would(gateway, topics):
    topics.create("taken", 1)
    body = {"topics": [
        {"name": name, "num_partitions": count, "replication_factor": -1, "assignments": [],
         "configs": configs}
        for name, count, configs in (
            ("bad name!", 1, []), ("huge", 200_000, []), ("taken", 1, []), ("fine", 3, []),
            ("badcfg", 1, [{"name": "retention.ms", "value": "-5"}]))],
        "timeout": 5000}
    checked = call_once(gateway, 19, 7, {**body, "validate_only": True})
    codes = {t.name: (t.error_code.value, t.num_partitions) for t in checked.topics}
    assert codes == {"bad name!": (Errors.INVALID_TOPIC_EXCEPTION, -1),
                     "huge": (Errors.INVALID_PARTITIONS, -1),
                     "taken": (Errors.TOPIC_ALREADY_EXISTS, -1), "fine": (0, 3),
                     "badcfg": (Errors.INVALID_CONFIG, -1)}
    assert topics.list() == ["taken"]  # validate_only created nothing
    created = call_once(gateway, 19, 7, {**body, "validate_only": False})
    assert {t.name: t.error_code.value for t in created.topics} == {
        name: code for name, (code, _) in codes.items()}
    assert topics.list() == ["fine", "taken"]


def test_validate_only_reads_the_topic_not_the_keyspace(gateway, topics, monkeypatch):
    """CreateTopics with validate_only learned whether a name is taken by listing every topic,
    a SCAN of the whole Redis keyspace (every namespace's keys) for each topic validated; one
    read of the topic's metadata answers it."""
    from rcoord.topics import Topics

    topics.create("taken", 1)

    def no_listing(self):
        raise AssertionError("validate_only listed every topic")

    monkeypatch.setattr(Topics, "list", no_listing)
    checked = call_once(gateway, 19, 7, {"timeout": 5000, "validate_only": True, "topics": [
        _new_topic("taken"), _new_topic("free")]})
    assert {t.name: t.error_code.value for t in checked.topics} == {
        "taken": Errors.TOPIC_ALREADY_EXISTS, "free": 0}


@pytest.mark.parametrize("validate_only", [False, True])
def test_an_existing_topic_is_already_exists_whatever_else_is_wrong(gateway, topics,
                                                                    validate_only):
    """Kafka's createTopics checks the name and whether it is taken before the configs, the
    replication factor and the partitions: an existing topic asked for with replication
    factor 3, an unknown config or 0 partitions was answered with that error, not
    TOPIC_ALREADY_EXISTS, which tools creating a topic "if it does not exist" look for."""
    topics.create("there", 1)
    asked = [_new_topic("there", rf=3), _new_topic("there", count=0),
             {**_new_topic("there"), "configs": [{"name": "cleanup.policy", "value": "x"}]}]
    for topic in asked:
        answered = call_once(gateway, 19, 7, {"timeout": 5000, "validate_only": validate_only,
                                              "topics": [topic]})
        assert [(t.name, t.error_code.value) for t in answered.topics] == [
            ("there", Errors.TOPIC_ALREADY_EXISTS)]
    assert topics.partition_count("there") == 1


def test_a_topic_redis_fails_on_is_answered_alone(gateway, topics, monkeypatch, caplog):
    """A create or delete that cannot reach Redis is REQUEST_TIMED_OUT for its topic only: the
    whole request was answered so, also the topics it had created or deleted, and a client's
    retry then found them TOPIC_ALREADY_EXISTS or unknown."""
    import redis

    from rcoord.topics import Topics

    create, delete = Topics.create, Topics.delete

    def failing(real):
        def call(self, topic, *args, **kwargs):
            if topic == "cut":
                raise redis.exceptions.ConnectionError("connection reset (test)")
            return real(self, topic, *args, **kwargs)
        return call

    monkeypatch.setattr(Topics, "create", failing(create))
    monkeypatch.setattr(Topics, "delete", failing(delete))
    created = call_once(gateway, 19, 7, {"timeout": 5000, "validate_only": False,
                                         "topics": [_new_topic("kept"), _new_topic("cut")]})
    assert {t.name: t.error_code.value for t in created.topics} == {
        "kept": 0, "cut": Errors.REQUEST_TIMED_OUT}
    assert topics.list() == ["kept"]
    create(topics, "cut", 1)  # (the real one)
    deleted = call_once(gateway, 20, 5, {"timeout": 5000, "topic_names": ["kept", "cut"]})
    assert {t.name: t.error_code.value for t in deleted.responses} == {
        "kept": 0, "cut": Errors.REQUEST_TIMED_OUT}
    assert topics.list() == ["cut"]
    assert "topic 'cut': Redis unreachable or unavailable" in caplog.text


def test_metadata_for_every_topic_leaves_out_one_deleted_meanwhile(gateway, topics,
                                                                   monkeypatch):
    """Metadata for every topic lists the topics, then reads each one's partition count: a
    topic deleted in between was answered UNKNOWN_TOPIC_OR_PARTITION in a list of the topics
    that exist (Kafka's answer holds only those it has); it is left out. Named, it is still
    answered unknown."""
    from rcoord.topics import Topics

    topics.create("here", 2)
    listing = Topics.list
    monkeypatch.setattr(Topics, "list", lambda self: [*listing(self), "gone"])
    every = call_once(gateway, 3, 12, {"topics": None, "allow_auto_topic_creation": False,
                                       "include_topic_authorized_operations": False})
    assert [(t.name, t.error_code.value, len(t.partitions)) for t in every.topics] == [
        ("here", 0, 2)]
    named = call_once(gateway, 3, 12, {"topics": [{"name": "gone", "topic_id": None}],
                                       "allow_auto_topic_creation": False,
                                       "include_topic_authorized_operations": False})
    assert [(t.name, t.error_code.value) for t in named.topics] == [
        ("gone", Errors.UNKNOWN_TOPIC_OR_PARTITION)]


def test_metadata_by_topic_id(gateway, topics):
    """Metadata v12 may name a topic by id alone: rcoord's topics have no id, so each id named
    is UNKNOWN_TOPIC_ID (it used to be dropped from the answer, which a client waits on); an
    id or a missing name before v12 is INVALID_REQUEST (Kafka's handleTopicMetadataRequest)."""
    import uuid

    topics.create("t", 1)
    some_id = uuid.uuid4()
    answer = call_once(gateway, 3, 12, {
        "topics": [{"name": None, "topic_id": some_id}, {"name": "t", "topic_id": some_id}],
        "allow_auto_topic_creation": False, "include_topic_authorized_operations": False})
    assert [(t.error_code.value, t.name, t.topic_id) for t in answer.topics] == [
        (100, None, some_id)]
    by_name = call_once(gateway, 3, 12, {
        "topics": [{"name": "t", "topic_id": uuid.UUID(int=0)}],
        "allow_auto_topic_creation": False, "include_topic_authorized_operations": False})
    assert [(t.error_code.value, t.name, len(t.partitions)) for t in by_name.topics] == [
        (0, "t", 1)]
    for body_topic in ({"name": None, "topic_id": uuid.UUID(int=0)},
                       {"name": "t", "topic_id": some_id}):
        refused = call_once(gateway, 3, 11, {
            "topics": [body_topic], "allow_auto_topic_creation": False,
            "include_topic_authorized_operations": False})
        assert [(t.error_code.value, t.name) for t in refused.topics] == [
            (Errors.INVALID_REQUEST, body_topic["name"] or "")]


def test_two_batches_for_one_partition_append_nothing(gateway, redis_server, topics):
    """Kafka's LogValidator takes one v2 batch per partition in a Produce (INVALID_RECORD
    otherwise): a second batch that fails (here a negative producer epoch) must not leave the
    first appended, and two good ones are refused alike, whole."""
    topics.create("t", 1)
    good = produced_batch([Record(0, None, b"a", {}, 0)])
    bad = produced_batch([Record(0, None, b"b", {}, 0)], producer_id=7, producer_epoch=-1,
                       base_sequence=0)
    for records in (good + bad, good + good):
        answer = call_once(gateway, 0, 9, {"acks": -1, "timeout": 5000, "topic_data": [
            {"name": "t", "partition_data": [{"index": 0, "records": records}]}]})
        (part,) = answer.responses[0].partition_responses
        assert part.error_code.value == INVALID_RECORD
        assert "one partition" in part.error_message
        assert _log(gateway, redis_server) == (0, 0)
    answer = call_once(gateway, 0, 9, {"acks": -1, "timeout": 5000, "topic_data": [
        {"name": "t", "partition_data": [{"index": 0, "records": good}]}]})
    assert answer.responses[0].partition_responses[0].error_code.value == 0
    assert _log(gateway, redis_server) == (0, 1)


def _produce_to(gateway: Any, partitions: list[tuple[int, bytes]]) -> list[Any]:
    """Produce v9 to topic t's ``partitions`` (index, batch), in that order: the partition
    responses."""
    answer = call_once(gateway, 0, 9, {"acks": -1, "timeout": 5000, "topic_data": [
        {"name": "t", "partition_data": [{"index": i, "records": b} for i, b in partitions]}]})
    return [p for t in answer.responses for p in t.partition_responses]


def test_a_negative_partition_in_a_produce_fails_only_itself(gateway, redis_server, topics):
    """A reviewer's repro: the negative partition's InvalidRequestError failed the request
    whole (INVALID_REQUEST on every partition) after partition 0 was already appended, so the
    producer was told its stored record had failed. As Kafka (its metadata cache has no such
    partition), that partition alone is UNKNOWN_TOPIC_OR_PARTITION."""
    topics.create("t", 1)
    batch = produced_batch([Record(0, None, b"v", {}, 0)])
    answered = _produce_to(gateway, [(0, batch), (-1, batch)])
    assert [(p.index, p.error_code.value, p.base_offset) for p in answered] == [
        (0, 0, 0), (-1, Errors.UNKNOWN_TOPIC_OR_PARTITION, -1)]
    assert _log(gateway, redis_server) == (0, 1)


def test_a_partition_named_twice_is_appended_to_and_read_once(gateway, redis_server, topics):
    """A reviewer's repro: each entry of a partition named twice was appended (both batches,
    in no fixed order) and answered; a Fetch read it twice. Kafka keys both requests by
    partition (the last entry wins) and answers the partition once."""
    topics.create("t", 1)
    first, last = (produced_batch([Record(0, None, v, {}, 0)]) for v in (b"a", b"b"))
    answered = _produce_to(gateway, [(0, first), (0, last)])
    assert [(p.index, p.error_code.value, p.base_offset) for p in answered] == [(0, 0, 0)]
    assert _log(gateway, redis_server) == (0, 1)
    _produce_to(gateway, [(0, produced_batch([Record(0, None, b"c", {}, 0)]))])
    fetched = call_once(gateway, 1, 12, {
        "replica_id": -1, "max_wait": 0, "min_bytes": 1, "max_bytes": 1 << 20,
        "topics": [{"topic": "t", "partitions": [
            {"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1 << 20},
            {"partition": 0, "fetch_offset": 1, "partition_max_bytes": 1 << 20}]}]})
    assert [p.partition_index for t in fetched.responses for p in t.partitions] == [0]
    assert _records(fetched) == {0: [b"c"]}  # read from the last entry's offset


@pytest.mark.usefixtures("own_gateway")
def test_sync_group_v5_needs_its_protocol_type_and_name(gateway):
    """From v5 a SyncGroup's protocol type and name are mandatory: Kafka answers one without
    them INCONSISTENT_GROUP_PROTOCOL before it looks at the group. The gateway passed the nulls
    on as "not given", and the leader got its assignment."""
    sock = connect(gateway)
    corr = iter(range(1, 100))

    def call(key: int, version: int, body: dict[str, Any]) -> Any:
        sock.sendall(request_frame(key, version, next(corr), body))
        return response(sock, key, version, 5)

    try:
        join = {"group_id": "g", "session_timeout": 30_000, "rebalance_timeout": 30_000,
                "member_id": "", "group_instance_id": None, "protocol_type": "consumer",
                "protocols": [{"name": "range", "metadata": b""}], "reason": None}
        member = call(11, 9, join).member_id
        joined = call(11, 9, {**join, "member_id": member})
        assert joined.error_code.value == 0
        sync = {"group_id": "g", "generation_id": joined.generation_id, "member_id": member,
                "group_instance_id": None, "protocol_type": "consumer", "protocol_name": "range",
                "assignments": [{"member_id": member, "assignment": b"a"}]}
        for missing in ("protocol_type", "protocol_name"):
            refused = call(14, 5, {**sync, missing: None})
            assert refused.error_code.value == Errors.INCONSISTENT_GROUP_PROTOCOL
            assert not refused.assignment
        synced = call(14, 5, sync)
        assert (synced.error_code.value, synced.assignment) == (0, b"a")
        older = call(14, 4, {k: v for k, v in sync.items()
                             if k not in ("protocol_type", "protocol_name")})
        assert (older.error_code.value, older.assignment) == (0, b"a")  # (optional before v5)
    finally:
        sock.close()


@pytest.mark.usefixtures("own_gateway")
def test_a_join_group_listing_a_protocol_twice_is_an_invalid_request(gateway):
    """rcoord refuses a JoinGroup that names one protocol twice (docs/architecture.md,
    "Errors"); through the gateway that is INVALID_REQUEST, and no member is added."""
    joined = call_once(gateway, 11, 9, {
        "group_id": "g", "session_timeout": 30_000, "rebalance_timeout": 30_000,
        "member_id": "", "group_instance_id": None, "protocol_type": "consumer",
        "protocols": [{"name": "range", "metadata": b"a"}, {"name": "range", "metadata": b"b"}],
        "reason": None})
    assert joined.error_code.value == Errors.INVALID_REQUEST
    described = call_once(gateway, 15, 5, {"groups": ["g"],
                                           "include_authorized_operations": False})
    assert [g.group_state for g in described.groups] == ["Dead"]


@pytest.mark.usefixtures("own_gateway")
def test_a_join_group_v0_session_timeout_out_of_bounds_is_invalid_session_timeout(gateway):
    """JoinGroup v0 has no rebalance timeout: it is the session timeout, as in Kafka. A session
    timeout of 0 was answered INVALID_REQUEST (the rebalance timeout's own check, which ran
    first); Kafka's answer is INVALID_SESSION_TIMEOUT, which a client reports as such."""
    sock = connect(gateway)
    try:
        sock.sendall(request_frame(11, 0, 1, {
            "group_id": "g0", "session_timeout": 0, "member_id": "",
            "protocol_type": "consumer", "protocols": [{"name": "range", "metadata": b"a"}]}))
        joined = response(sock, 11, 0, 4)
    finally:
        sock.close()
    assert joined.error_code.value == Errors.INVALID_SESSION_TIMEOUT


@pytest.mark.usefixtures("own_gateway")
@pytest.mark.parametrize("rebalance_ms", [0, -1, -(1 << 31)])
def test_a_join_group_rebalance_timeout_below_one_is_taken_as_kafka_takes_it(gateway,
                                                                            rebalance_ms):
    """Kafka's group coordinator takes any rebalance timeout a JoinGroup v1+ sends (it only
    bounds the session timeout: GroupCoordinator.handleJoinGroup, GroupCoordinatorService
    .joinGroup); one below 1 ms ends the join and sync phases at once. The gateway passed it to
    rcoord, which refuses a rebalance timeout below 1 ms, and answered INVALID_REQUEST, also
    ahead of a session timeout out of bounds (Kafka: INVALID_SESSION_TIMEOUT)."""
    def join(group: str, session_ms: int) -> Any:
        sock = connect(gateway)
        try:
            sock.sendall(request_frame(11, 1, 1, {
                "group_id": group, "session_timeout": session_ms,
                "rebalance_timeout": rebalance_ms, "member_id": "", "protocol_type": "consumer",
                "protocols": [{"name": "range", "metadata": b"a"}]}))
            return response(sock, 11, 1, 4)
        finally:
            sock.close()

    joined = join("g", 30_000)
    assert (joined.error_code.value, joined.generation_id) == (0, 1)
    assert joined.leader == joined.member_id
    assert join("g0", 0).error_code.value == Errors.INVALID_SESSION_TIMEOUT


def _new_topic(name: str, count: int = 1, rf: int = -1, assignments: Any = ()) -> dict[str, Any]:
    return {"name": name, "num_partitions": count, "replication_factor": rf,
            "assignments": [{"partition_index": i, "broker_ids": b} for i, b in assignments],
            "configs": []}


def test_a_topic_named_twice_is_neither_created_nor_deleted(gateway, topics):
    """Kafka's ControllerApis: a name a CreateTopics or DeleteTopics gives twice is answered
    once, INVALID_REQUEST "Duplicate topic name.", and nothing is done for it; one entry was
    created with the other refused (which one's settings won was not fixed), and a delete was
    answered NONE twice."""
    created = call_once(gateway, 19, 7, {"timeout": 5000, "validate_only": False, "topics": [
        _new_topic("dup"), _new_topic("dup", 3), _new_topic("once", 2)]})
    assert sorted((t.name, t.error_code.value, t.error_message) for t in created.topics) == [
        ("dup", Errors.INVALID_REQUEST, "Duplicate topic name."), ("once", 0, None)]
    assert topics.list() == ["once"]
    topics.create("dup", 1)
    deleted = call_once(gateway, 20, 5, {"timeout": 5000,
                                         "topic_names": ["dup", "once", "dup"]})
    assert sorted((r.name, r.error_code.value, r.error_message) for r in deleted.responses) == [
        ("dup", Errors.INVALID_REQUEST, "Duplicate topic name."), ("once", 0, None)]
    assert topics.list() == ["dup"]


@pytest.mark.parametrize(("entry", "code", "says"), [
    (_new_topic("m", 4, -1, [(0, [0])]), Errors.INVALID_REQUEST, "numPartitions"),
    (_new_topic("m", -1, 1, [(0, [0])]), Errors.INVALID_REQUEST, "replication factor"),
    (_new_topic("m", -1, -1, [(0, [7])]), 39, "broker 7"),
    (_new_topic("m", -1, -1, [(0, [])]), 39, "empty replica list"),
    (_new_topic("m", -1, -1, [(0, [0, 0])]), 39, "more than once"),
    (_new_topic("m", -1, -1, [(0, [0]), (0, [0])]), 39, "multiple manual"),
    (_new_topic("m", -1, -1, [(0, [0]), (5, [0])]), 39, "consecutive"),
])
def test_a_manual_assignment_is_checked_as_kafka_checks_it(gateway, topics, entry, code, says):
    """Kafka's ReplicationControlManager.createTopic: only the number of assignments was read,
    so an assignment naming a broker that does not exist, or numPartitions 4 with one
    assignment (the client got 1 partition, silently), created a topic."""
    for validate_only in (True, False):
        (answer,) = call_once(gateway, 19, 7, {"timeout": 5000, "validate_only": validate_only,
                                               "topics": [entry]}).topics
        assert answer.error_code.value == code and says in answer.error_message
    assert topics.list() == []


def test_a_manual_assignment_on_this_broker_creates_its_partitions(gateway, topics):
    (answer,) = call_once(gateway, 19, 7, {"timeout": 5000, "validate_only": False, "topics": [
        _new_topic("m", -1, -1, [(1, [0]), (0, [0]), (2, [0])])]}).topics
    assert (answer.error_code.value, answer.num_partitions, answer.replication_factor) == (0, 3, 1)
    assert topics.partition_count("m") == 3


@pytest.mark.parametrize("validate_only", [True, False])
def test_a_config_with_a_null_value_is_refused(gateway, topics, validate_only):
    """Kafka's CreateTopics refuses a config whose value is null (INVALID_CONFIG, "Null value
    not supported for topic configs: ..."); the gateway created the topic with the default
    retention, as if the config had not been given."""
    entry = {**_new_topic("n"), "configs": [{"name": "retention.ms", "value": None}]}
    (answer,) = call_once(gateway, 19, 7, {"timeout": 5000, "validate_only": validate_only,
                                           "topics": [entry]}).topics
    assert (answer.error_code.value, answer.error_message) == (
        Errors.INVALID_CONFIG, "Null value not supported for topic configs: retention.ms")
    assert topics.list() == []


def test_config_values_are_read_as_kafka_reads_a_long(gateway, topics):
    """Kafka reads a LONG config with Long.parseLong of the trimmed text: " 5 " and "+7" are
    numbers; "1_000", other scripts' digits and numbers past a long are INVALID_CONFIG (Python's
    int() took them, and the first two made a topic)."""
    def answer(value: str) -> tuple[int, int | None]:
        entry = {**_new_topic("c"), "configs": [{"name": "retention.ms", "value": value}]}
        (got,) = call_once(gateway, 19, 7, {"timeout": 5000, "validate_only": True,
                                            "topics": [entry]}).topics
        values = {c.name: c.value for c in got.configs or ()}
        return got.error_code.value, None if not values else int(values["retention.ms"])

    assert answer(" 5 ") == (0, 5) and answer("+7") == (0, 7)
    for bad in ("1_000", "\u0665", "9223372036854775808", "5ms", ""):
        assert answer(bad) == (Errors.INVALID_CONFIG, None), bad
    assert topics.list() == []


@pytest.mark.parametrize("version", [5, 7])
@pytest.mark.parametrize("validate_only", [True, False])
def test_a_created_topic_is_answered_with_its_configs(gateway, topics, version, validate_only):
    """CreateTopics v5+ (KIP-525) answers each topic created with its configs, as Kafka's
    ReplicationControlManager.createTopic: the list was null, and Java's AdminClient reads it
    for every topic answered without error (``configs.stream()``), so its createTopics failed
    with a NullPointerException although the topic was created. They are what DescribeConfigs
    then gives for the topic."""
    entry = {**_new_topic("c", 2), "configs": [{"name": "retention.ms", "value": "60000"}]}
    (answer,) = call_once(gateway, 19, version, {"timeout": 5000,
                                                 "validate_only": validate_only,
                                                 "topics": [entry]}).topics
    assert (answer.error_code.value, int(answer.topic_config_error_code),
            answer.num_partitions, answer.replication_factor) == (0, 0, 2, 1)
    assert answer.configs is not None
    got = [(c.name, c.value, c.config_source, c.read_only, c.is_sensitive) for c in answer.configs]
    if validate_only:
        topics.create("c", 2, retention_ms=60000)  # what DescribeConfigs would say of it
    described = call_once(gateway, 32, 4, {"resources": [
        {"resource_type": 2, "resource_name": "c", "configuration_keys": None}],
        "include_synonyms": False, "include_documentation": False}).results[0].configs
    assert got == [(c.name, c.value, c.config_source, c.read_only, False) for c in described]
    assert ("retention.ms", "60000", 1, False, False) in got  # DYNAMIC_TOPIC_CONFIG, alterable


def _with_header_field(batch: bytes, at: int, value: int) -> bytes:
    """``batch`` with the int32 at ``at`` set to ``value``, its CRC (over what follows the
    CRC field) made again."""
    out = bytearray(batch)
    out[at:at + 4] = value.to_bytes(4, "big", signed=True)
    return with_crc(out)


@pytest.mark.parametrize(("at", "value", "says"), [
    (23, 5, "offset range has 6 records"),  # lastOffsetDelta 5 for one record
    (23, -1, "must be positive"),
    (57, 0, "reports 0 records"),  # (the record count)
])
def test_a_batch_whose_offset_range_and_count_disagree_is_refused(gateway, redis_server, topics,
                                                                  at, value, says):
    """Kafka's LogValidator.validateBatch: INVALID_RECORD when lastOffsetDelta + 1 and the
    record count disagree or are not positive; it was appended (an idempotent producer's last
    sequence is counted from that range)."""
    topics.create("t", 1)
    batch = _with_header_field(produced_batch([Record(0, None, b"v", {}, 0)]), at, value)
    (part,) = _produce_to(gateway, [(0, batch)])
    assert part.error_code.value == INVALID_RECORD and says in part.error_message
    assert _log(gateway, redis_server) == (0, 0)


def test_a_producer_batch_with_a_negative_sequence_is_an_invalid_record(gateway, redis_server,
                                                                        topics):
    """Kafka's LogValidator.validateBatch answers INVALID_RECORD (it was INVALID_REQUEST)."""
    topics.create("t", 1)
    batch = produced_batch([Record(0, None, b"v", {}, 0)], producer_id=7, producer_epoch=0,
                         base_sequence=-1)
    (part,) = _produce_to(gateway, [(0, batch)])
    assert part.error_code.value == INVALID_RECORD and "sequence number -1" in part.error_message
    assert _log(gateway, redis_server) == (0, 0)


@pytest.mark.usefixtures("own_gateway")
@pytest.mark.parametrize("version", [5, 8, 9])
def test_a_static_leader_back_in_a_stable_group_assigns_only_if_it_can_skip(gateway, version):
    """A static leader restarted (a new member id, the same group.instance.id) in a Stable
    group: from JoinGroup v9 it is told it leads, with every member, and to skip the assignment
    (KIP-814); below v9, where SkipAssignment does not exist, it gets the leader it replaced
    and no members, as Kafka answers it (GroupMetadataManager, static member in Stable), so it
    follows. It was told it leads below v9 too, and ran its assignor for nothing."""
    flexible = {11: 6, 14: 4}

    def call(key: int, v: int, body: dict[str, Any]) -> Any:
        sock = connect(gateway)
        try:
            sock.sendall(request_frame(key, v, 1, body))
            return response(sock, key, v, 5 if v >= flexible[key] else 4)
        finally:
            sock.close()

    join = {"group_id": "g", "session_timeout": 30_000, "rebalance_timeout": 30_000,
            "member_id": "", "group_instance_id": "ia", "protocol_type": "consumer",
            "protocols": [{"name": "range", "metadata": b"x"}], "reason": None}
    first = call(11, version, join)
    assert first.error_code.value == 0 and first.leader == first.member_id
    sync = {"group_id": "g", "generation_id": first.generation_id, "member_id": first.member_id,
            "group_instance_id": "ia", "protocol_type": "consumer", "protocol_name": "range",
            "assignments": [{"member_id": first.member_id, "assignment": b"A"}]}
    assert call(14, 5 if version >= 9 else 3, sync).assignment == b"A"
    back = call(11, version, join)
    assert back.error_code.value == 0 and back.generation_id == first.generation_id
    assert back.member_id != first.member_id
    if version >= 9:
        assert back.skip_assignment and back.leader == back.member_id
        assert [m.group_instance_id for m in back.members] == ["ia"]
    else:
        assert (back.leader, tuple(back.members)) == (first.member_id, ())


def _with_byte(batch: bytes, at: int, value: int, crc: bool) -> bytes:
    out = bytearray(batch)
    out[at] = value
    return with_crc(out) if crc else bytes(out)


@pytest.mark.parametrize(("records", "says"), [
    # magic 1 (before the CRC); a v1 message set shorter than a v2 header; a control batch
    # (attributes' low byte 0x28: control, LogAppendTime); no batch at all
    (_with_byte(produced_batch([Record(0, None, b"v", {}, 0)]), 16, 1, crc=False), "magic 1"),
    (_with_byte(produced_batch([Record(0, None, b"v", {}, 0)]), 16, 1, crc=False)[:40], "magic 1"),
    (_with_byte(produced_batch([Record(0, None, b"v", {}, 0)]), 22, 0x28, crc=True),
     "not allowed to write control records"),
    (b"", "at least one record batch"),
])
def test_batches_kafka_calls_invalid_records_are_answered_so(gateway, redis_server, topics,
                                                             records, says):
    """ProduceRequest.validateRecords and LogValidator.validateBatch answer INVALID_RECORD;
    these were UNSUPPORTED_VERSION, CORRUPT_MESSAGE (a short v1 set) and INVALID_REQUEST."""
    topics.create("t", 1)
    (part,) = _produce_to(gateway, [(0, records)])
    assert part.error_code.value == INVALID_RECORD and says in part.error_message
    assert _log(gateway, redis_server) == (0, 0)


def _batch_head(length: int, magic: int = 2) -> bytes:
    """The first 17 bytes of a batch (base offset, length, leader epoch, magic): as much of a
    batch as Kafka reads to know its size (ByteBufferLogInputStream.nextBatchSize)."""
    return bytes(8) + length.to_bytes(4, "big", signed=True) + bytes(4) + bytes([magic])


@pytest.mark.parametrize("tail", [
    b"\x00" * 11,  # less than a batch's offset and length (12 bytes)
    _batch_head(200)[:14],  # a length, but the magic not yet
    _batch_head(200),  # a length (200) the 17 bytes sent do not hold
    produced_batch([Record(0, None, b"w", {}, 0)])[:-1],  # a whole batch but for its last byte
], ids=["11 bytes", "no magic", "a header", "all but a byte"])
def test_a_partial_batch_after_the_whole_one_is_trimmed_as_kafka_does(
        gateway, redis_server, topics, tail):
    """Kafka reads a partition's records batch by batch (ByteBufferLogInputStream) and stops at
    bytes that do not hold a whole batch; UnifiedLog.trimInvalidBytes drops them and the whole
    batch before them is appended. The gateway answered such a request CORRUPT_MESSAGE, which
    producers retry: the same request was resent until the delivery timeout."""
    topics.create("t", 1)
    good = produced_batch([Record(0, None, b"v", {}, 0)])
    (part,) = _produce_to(gateway, [(0, good + tail)])
    assert (part.error_code.value, part.base_offset) == (0, 0), part.error_message
    assert _log(gateway, redis_server) == (0, 1)


@pytest.mark.parametrize(("records", "code", "says"), [
    # No whole batch: Kafka's ProduceRequest.validateRecords finds none (INVALID_RECORD).
    (produced_batch([Record(0, None, b"v", {}, 0)])[:40], INVALID_RECORD, "whole record batch"),
    (_batch_head(200), INVALID_RECORD, "whole record batch"),
    (b"\x00" * 5, INVALID_RECORD, "whole record batch"),
    # What nextBatchSize refuses before it looks for the batch's end: CORRUPT_MESSAGE.
    (_batch_head(13), CORRUPT_MESSAGE, "length 13"),
    (_batch_head(200, magic=3), CORRUPT_MESSAGE, "magic 3"),
    (produced_batch([Record(0, None, b"v", {}, 0)]) + _batch_head(5)[:12], CORRUPT_MESSAGE,
     "length 5"),
], ids=["40 bytes", "a header", "5 bytes", "length 13", "magic 3", "then length 5"])
def test_records_without_a_whole_batch_are_answered_as_kafka_does(
        gateway, redis_server, topics, records, code, says):
    """A record set that holds no whole batch is INVALID_RECORD (Kafka: "must have at least one
    record batch"), not CORRUPT_MESSAGE, which producers retry; a batch length below the least
    Kafka takes, or a magic past 2, stays CORRUPT_MESSAGE, where Kafka reads it."""
    topics.create("t", 1)
    (part,) = _produce_to(gateway, [(0, records)])
    assert part.error_code.value == code and says in part.error_message, part.error_message
    assert _log(gateway, redis_server) == (0, 0)


def _transactional(value: bytes) -> bytes:
    """A one-record batch of a transactional producer (attributes 0x10, producer id 7)."""
    out = bytearray(produced_batch([Record(0, None, value, {}, 0)], producer_id=7,
                                   producer_epoch=0, base_sequence=0))
    out[22] |= 0x10
    return with_crc(out)


def test_a_transactional_batch_fails_the_whole_produce_as_kafka_does(gateway, redis_server,
                                                                      topics):
    """The gateway serves no transactions: a transactional id is answered
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED, as Kafka answers one the caller may not use. Kafka
    checks a Produce with transactional records before anything else and answers it so whole,
    on every partition, appending none (KafkaApis.handleProduceRequest); an acks=0 one closes
    the connection. The gateway answered the transactional partition INVALID_REQUEST and
    appended the others of the same request."""
    topics.create("t", 2)
    plain = produced_batch([Record(0, None, b"p", {}, 0)])
    for txn_id in (None, "tx"):
        answer = call_once(gateway, 0, 9, {
            "transactional_id": txn_id, "acks": -1, "timeout": 5000, "topic_data": [
                {"name": "t", "partition_data": [{"index": 0, "records": plain},
                                                 {"index": 1, "records": _transactional(b"x")}]},
                {"name": "missing", "partition_data": [{"index": 0, "records": plain}]}]})
        got = [(t.name, p.index, p.error_code.value, p.base_offset) for t in answer.responses
               for p in t.partition_responses]
        assert got == [("t", 0, 53, -1), ("t", 1, 53, -1), ("missing", 0, 53, -1)]
        assert "transactions are not supported" in answer.responses[0].partition_responses[
            0].error_message
        assert _log(gateway, redis_server) == (0, 0)
    sock = connect(gateway)
    try:
        sock.sendall(request_frame(0, 9, 1, {"acks": 0, "timeout": 5000, "topic_data": [
            {"name": "t", "partition_data": [{"index": 0, "records": plain},
                                             {"index": 1, "records": _transactional(b"x")}]}]}))
        assert closed_by_gateway(sock)
    finally:
        sock.close()
    assert _log(gateway, redis_server) == (0, 0)
    # A transactional batch after a whole one is not looked at: two batches, INVALID_RECORD.
    (part,) = _produce_to(gateway, [(0, plain + _transactional(b"y"))])
    assert part.error_code.value == INVALID_RECORD and "one partition" in part.error_message


@pytest.mark.parametrize("epoch", [-1, -2, -(1 << 15)])
def test_an_idempotent_batch_with_a_negative_epoch_is_invalid_producer_epoch(
        gateway, redis_server, topics, epoch):
    """Kafka answers a producer's batch whose epoch is below the one the partition has for it
    (-1, "none", for a new producer) INVALID_PRODUCER_EPOCH (ProducerAppendInfo
    .checkProducerEpoch): epoch -1 once the producer wrote at epoch 0, or any epoch below -1.
    The gateway answered INVALID_REQUEST, an answer Kafka never gives here. (Epoch -1 from a
    producer the partition never saw, which Kafka appends, is refused too: not tested here.)"""
    topics.create("t", 1)
    (first,) = _produce_to(gateway, [(0, produced_batch([Record(0, None, b"a", {}, 0)],
                                                       producer_id=7, producer_epoch=0,
                                                       base_sequence=0))])
    assert first.error_code.value == 0
    # The producer that wrote at epoch 0, and one the partition never saw (below -1 only).
    for pid in (7, 8) if epoch < -1 else (7,):
        (part,) = _produce_to(gateway, [(0, produced_batch([Record(0, None, b"b", {}, 0)],
                                                          producer_id=pid, producer_epoch=epoch,
                                                          base_sequence=1))])
        assert part.error_code.value == 47 and "epoch" in part.error_message
    assert _log(gateway, redis_server) == (0, 1)


def test_a_partition_that_does_not_exist_says_so_before_its_records_are_read(
        gateway, redis_server, topics):
    """Kafka looks each partition up before it reads its records or looks at acks
    (KafkaApis.handleProduceRequest, then ReplicaManager.appendRecords): a corrupt batch or an
    invalid acks to a topic or partition that does not exist is UNKNOWN_TOPIC_OR_PARTITION,
    the answer that makes a client refresh its metadata. They were CORRUPT_MESSAGE and
    INVALID_REQUIRED_ACKS; an existing partition keeps those answers."""
    topics.create("t", 1)
    corrupt = _with_byte(produced_batch([Record(0, None, b"v", {}, 0)]), 30, 0xFF, crc=False)
    for topic, index, code in (("missing", 0, Errors.UNKNOWN_TOPIC_OR_PARTITION),
                               ("t", 3, Errors.UNKNOWN_TOPIC_OR_PARTITION),
                               ("t", 0, CORRUPT_MESSAGE)):
        answer = call_once(gateway, 0, 9, {"acks": -1, "timeout": 5000, "topic_data": [
            {"name": topic, "partition_data": [{"index": index, "records": corrupt}]}]})
        [[part]] = [t.partition_responses for t in answer.responses]
        assert part.error_code.value == code, (topic, index)
    sock = connect(gateway)
    try:
        batch = produced_batch([Record(0, None, b"v", {}, 0)])
        sock.sendall(request_frame(0, 9, 1, {"acks": 2, "timeout": 5000, "topic_data": [
            {"name": "t", "partition_data": [{"index": 0, "records": batch},
                                             {"index": 7, "records": batch}]},
            {"name": "missing", "partition_data": [{"index": 0, "records": batch}]}]}))
        got = response(sock, 0, 9, 5)
    finally:
        sock.close()
    assert [(t.name, p.index, p.error_code.value) for t in got.responses
            for p in t.partition_responses] == [
        ("t", 0, INVALID_REQUIRED_ACKS), ("t", 7, Errors.UNKNOWN_TOPIC_OR_PARTITION),
        ("missing", 0, Errors.UNKNOWN_TOPIC_OR_PARTITION)]
    assert _log(gateway, redis_server) == (0, 0)


def test_a_producer_may_not_stamp_its_batch_log_append_time(gateway, redis_server, topics):
    """The gateway's topics are LogAppendTime (the Redis clock stamps each record), and Kafka
    refuses a producer's batch flagged LogAppendTime on such a topic: INVALID_TIMESTAMP
    (LogValidator.validateTimestamp). It was taken. The gateway's own encoding, made for Fetch,
    sets that flag."""
    from rcoord.gateway.records import encode_batch

    topics.create("t", 1)
    (part,) = _produce_to(gateway, [(0, encode_batch([Record(0, None, b"v", {}, 0)]))])
    assert part.error_code.value == 32 and "LogAppendTime" in part.error_message
    assert _log(gateway, redis_server) == (0, 0)
    (part,) = _produce_to(gateway, [(0, produced_batch([Record(0, None, b"v", {}, 0)]))])
    assert (part.error_code.value, part.base_offset) == (0, 0)  # CreateTime: taken
    assert _log(gateway, redis_server) == (0, 1)


@pytest.mark.parametrize(("stamp", "max_stamp"), [
    (253_402_300_800_000, None),  # 10000-01-01: past what a Python datetime holds
    ((1 << 63) - 1, None),  # Long.MAX_VALUE, which a Java ProducerRecord takes
    (1_700_000_000_000, 0),  # a batch max timestamp below its record's (Kafka resets it)
])
def test_any_timestamp_a_producer_stamps_is_taken(gateway, redis_server, topics, stamp,
                                                 max_stamp):
    """The gateway's topics are LogAppendTime: Kafka's broker stamps the records itself and
    takes any int64 a producer sent (it sets the batch's max timestamp too). The gateway read
    batches with kio's reader, which makes every timestamp a datetime and compared the batch's
    max timestamp (ms) with each record's in seconds: these were refused CORRUPT_MESSAGE, which
    Kafka clients retry until their delivery timeout."""
    topics.create("t", 1)
    batch = produced_batch([Record(0, b"k", b"v", {}, stamp)])
    if max_stamp is not None:
        out = bytearray(batch)
        out[35:43] = max_stamp.to_bytes(8, "big", signed=True)
        batch = with_crc(out)
    (part,) = _produce_to(gateway, [(0, batch)])
    assert (part.error_code.value, part.base_offset) == (0, 0), part.error_message
    assert part.log_append_time not in (-1, stamp)  # the Redis clock
    assert _log(gateway, redis_server) == (0, 1)


def _malformed(change: str) -> bytes:
    """A one-record batch, its CRC made again after ``change``: its records no longer parse."""
    out = bytearray(produced_batch([Record(0, None, b"v", {}, 0, header_list=(("h", b"x"),))]))
    if change == "record size":
        out[61] += 2  # the record's length (a zigzag varint): one byte more than it has
    elif change == "null header name":
        at = out.index(b"\x02h\x02x")
        out[at] = 1  # the header name's length: -1
    elif change == "bytes after the records":
        out[8:12] = (int.from_bytes(out[8:12], "big") + 1).to_bytes(4, "big")
        out += b"\x00"
    else:  # "fewer records than counted": the count and the offset range both say 2
        out[23:27] = (1).to_bytes(4, "big")
        out[57:61] = (2).to_bytes(4, "big")
    return with_crc(out)


@pytest.mark.parametrize(("change", "says"), [
    ("record size", "declares"),
    ("null header name", "null key"),
    ("bytes after the records", "1 bytes after its 1 records"),
    ("fewer records than counted", "invalid record structure"),
])
def test_records_that_do_not_parse_in_a_sound_batch_are_invalid_records(
        gateway, redis_server, topics, change, says):
    """A batch whose CRC holds but whose records do not parse: Kafka's DefaultRecord and
    DefaultRecordBatch throw InvalidRecordException, INVALID_RECORD (non-retriable). The gateway
    answered CORRUPT_MESSAGE, which Kafka clients retry: the same batch was resent until the
    producer's delivery timeout. A bad CRC stays CORRUPT_MESSAGE."""
    topics.create("t", 1)
    (part,) = _produce_to(gateway, [(0, _malformed(change))])
    assert part.error_code.value == INVALID_RECORD and says in part.error_message
    assert _log(gateway, redis_server) == (0, 0)
    crc_broken = bytearray(_malformed(change))
    crc_broken[20] ^= 1
    (part,) = _produce_to(gateway, [(0, bytes(crc_broken))])
    assert part.error_code.value == CORRUPT_MESSAGE and "CRC" in part.error_message


def test_an_incremental_fetch_of_a_session_never_opened_is_refused(gateway, topics):
    """The gateway opens no fetch sessions (KIP-227: it answers session id 0). An incremental
    fetch (epoch > 0) names one: Kafka's FetchManager answers FETCH_SESSION_ID_NOT_FOUND with
    no partitions, and the client starts over with a full fetch. It was served as a full
    fetch, NONE for only the partitions named (a reviewer's repro)."""
    topics.create("t", 1)
    for session_id, epoch in ((77, 3), (0, 5)):
        body = {**_fetch_body("t", [0], max_wait=0, min_bytes=0, max_bytes=1 << 20,
                              partition_max_bytes=1 << 20),
                "session_id": session_id, "session_epoch": epoch}
        got = call_once(gateway, 1, 12, body)
        assert (got.error_code.value, got.session_id, got.responses) == (70, 0, ())
    for epoch in (0, -1):  # a full fetch, opening a session (not opened) or without one
        body = {**_fetch_body("t", [0], max_wait=0, min_bytes=0, max_bytes=1 << 20,
                              partition_max_bytes=1 << 20), "session_epoch": epoch}
        got = call_once(gateway, 1, 12, body)
        assert (got.error_code.value, got.session_id, len(got.responses)) == (0, 0, 1)


@pytest.mark.parametrize("corrupt", [_batch_head(13), _batch_head(200, magic=3)],
                         ids=["length 13", "magic 3"])
def test_a_corrupt_first_batch_fails_the_whole_produce_as_kafka_does(
        gateway, redis_server, topics, corrupt):
    """Kafka reads the first batch of every partition before anything else of a Produce
    (RequestUtils.hasTransactionalRecords); a length below 14 or a magic outside 0-2 there
    raises CorruptRecordException, and the request is answered whole: CORRUPT_MESSAGE on every
    partition, even one that does not exist, nothing appended (acks=0: the connection closed).
    The gateway failed that partition alone and appended the others of the request."""
    topics.create("t", 2)
    plain = produced_batch([Record(0, None, b"p", {}, 0)])
    answer = call_once(gateway, 0, 9, {"acks": -1, "timeout": 5000, "topic_data": [
        {"name": "t", "partition_data": [{"index": 0, "records": plain},
                                         {"index": 1, "records": corrupt}]},
        {"name": "missing", "partition_data": [{"index": 0, "records": plain}]}]})
    got = [(t.name, p.index, p.error_code.value, p.base_offset) for t in answer.responses
           for p in t.partition_responses]
    assert got == [("t", 0, CORRUPT_MESSAGE, -1), ("t", 1, CORRUPT_MESSAGE, -1),
                   ("missing", 0, CORRUPT_MESSAGE, -1)]
    assert "corrupt record batch" in answer.responses[0].partition_responses[0].error_message
    # Read in request order, as Kafka: a transactional batch before it is answered first.
    (_, txn), (_, bad) = [(t.name, p.error_code.value) for t in call_once(gateway, 0, 9, {
        "acks": -1, "timeout": 5000, "topic_data": [
            {"name": "t", "partition_data": [{"index": 0, "records": _transactional(b"x")},
                                             {"index": 1, "records": corrupt}]}]}).responses
        for p in t.partition_responses]
    assert (txn, bad) == (53, 53)
    sock = connect(gateway)
    try:
        sock.sendall(request_frame(0, 9, 1, {"acks": 0, "timeout": 5000, "topic_data": [
            {"name": "t", "partition_data": [{"index": 0, "records": plain},
                                             {"index": 1, "records": corrupt}]}]}))
        assert closed_by_gateway(sock)
    finally:
        sock.close()
    client = redis_server.client()
    try:
        assert [log_offsets(client, gateway.config.namespace, "t", p) for p in (0, 1)] == [
            (0, 0), (0, 0)]
    finally:
        client.close()


@pytest.mark.parametrize("first", [
    _with_byte(produced_batch([Record(0, None, b"a", {}, 0)]), 30, 0xFF, crc=False),
    _with_byte(produced_batch([Record(0, None, b"a", {}, 0)]), 22, 0x01, crc=True),
], ids=["bad CRC", "compressed"])
def test_two_batches_are_counted_before_the_first_is_read(gateway, redis_server, topics, first):
    """Kafka's ProduceRequest.validateRecords refuses a second batch for a partition
    (INVALID_RECORD) before the first's CRC or compression is looked at. The gateway read the
    first batch whole first: CORRUPT_MESSAGE, which producers retry, or
    UNSUPPORTED_COMPRESSION_TYPE."""
    topics.create("t", 1)
    (part,) = _produce_to(gateway, [(0, first + produced_batch([Record(0, None, b"b", {}, 0)]))])
    assert part.error_code.value == INVALID_RECORD and "one partition" in part.error_message
    assert _log(gateway, redis_server) == (0, 0)


@pytest.mark.parametrize("fault", ["second batch", "bad CRC", "base offset"])
def test_a_zstd_batch_before_produce_v7_is_refused_before_its_other_faults(
        gateway, redis_server, topics, fault):
    """Kafka's ProduceRequest.validateRecords refuses a zstd batch on Produce v3-6
    (UNSUPPORTED_COMPRESSION_TYPE) while it parses the request: before it counts the batches,
    and before the base offset and CRC are looked at on append. The gateway answered the other
    fault (INVALID_RECORD, or CORRUPT_MESSAGE, which producers resend)."""
    topics.create("t", 1)
    batch = bytearray(_with_byte(produced_batch([Record(0, None, b"a", {}, 0)]), 22, 0x04,
                                 crc=fault != "bad CRC"))
    if fault == "base offset":
        batch[0:8] = (5).to_bytes(8, "big")
    records = bytes(batch) + (produced_batch([Record(0, None, b"b", {}, 0)])
                              if fault == "second batch" else b"")
    for version, code in [(6, 76), (7, INVALID_RECORD if fault != "bad CRC" else CORRUPT_MESSAGE)]:
        answer = call_once(gateway, 0, version, {"acks": -1, "timeout": 5000, "topic_data": [
            {"name": "t", "partition_data": [{"index": 0, "records": records}]}]},
            header_bytes=4)
        (part,) = answer.responses[0].partition_responses
        assert part.error_code.value == code, version
    assert _log(gateway, redis_server) == (0, 0)


def test_a_producer_batch_with_a_base_offset_is_an_invalid_record(gateway, redis_server, topics):
    """Kafka refuses a client's v2 batch whose base offset is not 0, INVALID_RECORD, before its
    CRC is checked (UnifiedLog.analyzeAndValidateRecords); the gateway appended it."""
    topics.create("t", 1)
    batch = bytearray(produced_batch([Record(0, None, b"v", {}, 0)]))
    batch[0:8] = (5).to_bytes(8, "big")  # the base offset is not under the CRC
    (part,) = _produce_to(gateway, [(0, bytes(batch))])
    assert part.error_code.value == INVALID_RECORD and "base offset is 5" in part.error_message
    assert _log(gateway, redis_server) == (0, 0)


@pytest.mark.parametrize(("at", "value"), [(22, 0x01), (22, 0x20), (60, 2)],
                         ids=["compressed", "control", "count"])
def test_a_bad_crc_is_found_before_the_fields_it_covers_are_read(gateway, redis_server, topics,
                                                                 at, value):
    """Kafka checks a batch's CRC (UnifiedLog.analyzeAndValidateRecords) before it reads its
    attributes or record count (LogValidator): a batch damaged there is CORRUPT_MESSAGE, which
    producers resend. The gateway read those fields first and answered
    UNSUPPORTED_COMPRESSION_TYPE or INVALID_RECORD, which fail the send for good."""
    topics.create("t", 1)
    damaged = _with_byte(produced_batch([Record(0, None, b"v", {}, 0)]), at, value, crc=False)
    (part,) = _produce_to(gateway, [(0, damaged)])
    assert part.error_code.value == CORRUPT_MESSAGE and "CRC" in part.error_message
    assert _log(gateway, redis_server) == (0, 0)
