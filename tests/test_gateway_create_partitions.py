"""CreatePartitions (API 37) through the gateway: Kafka's checks and their words
(``ReplicationControlManager.createPartitions``), ``validate_only``, ACLs (ALTER on the topic),
a topic Redis cannot be reached for, and confluent-kafka's AdminClient growing a topic."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("kio")

from gateway_harness import call_once, gateway_for_alice

from rcoord.errors import Errors
from rcoord.topics import Topics

WAIT_S = 60.0
TOPIC_AUTHORIZATION_FAILED, INVALID_REPLICA_ASSIGNMENT = 29, 39


def _grow(name: str, count: int, assignments: list[list[int]] | None = None) -> dict[str, Any]:
    return {"name": name, "count": count, "assignments": None if assignments is None else [
        {"broker_ids": b} for b in assignments]}


def _answers(gateway: Any, entries: list[dict[str, Any]], validate_only: bool = False,
             version: int = 3) -> dict[str, tuple[int, str | None]]:
    body = {"topics": entries, "timeout": 5000, "validate_only": validate_only}
    # (v0 and v1 are not flexible: response header v0)
    results = call_once(gateway, 37, version, body, 5 if version >= 2 else 4).results
    return {r.name: (r.error_code.value, r.error_message) for r in results}


@pytest.mark.parametrize("version", [0, 1, 2, 3])
def test_a_topic_grows_and_keeps_its_records(gateway, redis_server, topics, version):
    from rcoord.topics import Producer, fetch

    topics.create("t", 1)
    client = redis_server.client()
    try:
        Producer(client, gateway.config.namespace, idempotent=False).send("t", b"kept", partition=0)
        assert _answers(gateway, [_grow("t", 3)], version=version) == {"t": (0, None)}
        assert topics.partition_count("t") == 3
        records = fetch(client, gateway.config.namespace, "t", 0, 0).records
        assert [r.value for r in records] == [b"kept"]
    finally:
        client.close()
    meta = call_once(gateway, 3, 12, {"topics": [{"name": "t", "topic_id": None}],
                                      "allow_auto_topic_creation": False,
                                      "include_topic_authorized_operations": False})
    assert sorted(p.partition_index for p in meta.topics[0].partitions) == [0, 1, 2]


def test_kafkas_checks_in_kafkas_words(gateway, topics):
    """Each refusal as Kafka's controller answers it, and none grows the topic."""
    topics.create("t", 2)
    for validate_only in (False, True):
        got = _answers(gateway, [_grow("t", 2)], validate_only)
        assert got == {"t": (Errors.INVALID_PARTITIONS, "Topic already has 2 partition(s).")}
        got = _answers(gateway, [_grow("t", 1)], validate_only)
        says = "The topic t currently has 2 partition(s); 1 would not be an increase."
        assert got == {"t": (Errors.INVALID_PARTITIONS, says)}
        for missing in ("nope", "bad/name"):
            (code, _), = _answers(gateway, [_grow(missing, 3)], validate_only).values()
            assert code == Errors.UNKNOWN_TOPIC_OR_PARTITION
        got = _answers(gateway, [_grow("t", 4, [[0]])], validate_only)
        says = ("Attempted to add 2 additional partition(s), but only 1 assignment(s) were "
                "specified.")
        assert got == {"t": (INVALID_REPLICA_ASSIGNMENT, says)}
        for replicas, says in (([7], "includes broker 7, but no such broker is registered"),
                               ([], "empty replica list"), ([0, 0], "more than once")):
            (code, message), = _answers(gateway, [_grow("t", 3, [replicas])],
                                        validate_only).values()
            assert code == INVALID_REPLICA_ASSIGNMENT and says in message, replicas
        (code, message), = _answers(gateway, [_grow("t", 10_003)], validate_only).values()
        assert code == Errors.INVALID_PARTITIONS and "at most 10000 more" in message
        got = _answers(gateway, [_grow("t", 3), _grow("t", 4)], validate_only)
        assert got == {"t": (Errors.INVALID_REQUEST, "Duplicate topic name.")}
    assert topics.partition_count("t") == 2


def test_validate_only_checks_and_grows_nothing(gateway, topics):
    topics.create("t", 1)
    assert _answers(gateway, [_grow("t", 3, [[0], [0]])], validate_only=True) == {"t": (0, None)}
    assert topics.partition_count("t") == 1
    assert _answers(gateway, [_grow("t", 3, [[0], [0]])]) == {"t": (0, None)}
    assert topics.partition_count("t") == 3


def test_a_topic_redis_fails_on_is_answered_alone(gateway, topics, monkeypatch, caplog):
    import redis

    grow = Topics.add_partitions

    def failing(self: Topics, topic: str, new_total: int) -> None:
        if topic == "cut":
            raise redis.exceptions.ConnectionError("connection reset (test)")
        grow(self, topic, new_total)

    monkeypatch.setattr(Topics, "add_partitions", failing)
    topics.create("kept", 1)
    topics.create("cut", 1)
    got = _answers(gateway, [_grow("kept", 2), _grow("cut", 2)])
    assert {name: code for name, (code, _) in got.items()} == {
        "kept": 0, "cut": Errors.REQUEST_TIMED_OUT}
    assert (topics.partition_count("kept"), topics.partition_count("cut")) == (2, 1)
    assert "topic 'cut': Redis unreachable or unavailable" in caplog.text


def test_growing_a_topic_needs_alter_on_it(redis_server, namespace, tmp_path: Path):
    with gateway_for_alice(redis_server, namespace, tmp_path, ["ALTER"],
                           ["READ", "WRITE", "DESCRIBE", "CREATE"]) as (gw, topics):
        results = call_once(gw, 37, 3, {"topics": [_grow("mine", 2), _grow("theirs", 2)],
                                        "timeout": 5000, "validate_only": False},
                            login=("alice", "pw")).results
        assert {r.name: r.error_code.value for r in results} == {
            "mine": 0, "theirs": TOPIC_AUTHORIZATION_FAILED}
        assert (topics.partition_count("mine"), topics.partition_count("theirs")) == (2, 1)


def test_confluent_kafka_adds_partitions(gateway, topics):
    ck = pytest.importorskip("confluent_kafka")
    from confluent_kafka.admin import AdminClient, NewPartitions

    topics.create("grown", 1)
    admin = AdminClient({"bootstrap.servers": gateway.bootstrap, "broker.address.family": "v4"})
    futures = admin.create_partitions([NewPartitions("grown", 4)], request_timeout=30)
    assert futures["grown"].result(timeout=WAIT_S) is None
    assert topics.partition_count("grown") == 4
    assert len(admin.list_topics(topic="grown", timeout=WAIT_S).topics["grown"].partitions) == 4
    futures = admin.create_partitions([NewPartitions("grown", 2)], request_timeout=30)
    with pytest.raises(ck.KafkaException) as info:
        futures["grown"].result(timeout=WAIT_S)
    assert info.value.args[0].code() == ck.KafkaError.INVALID_PARTITIONS
