"""DeleteRecords (API 21) through the gateway: raw frames for Kafka's answers (v0-v2), ACLs
(DELETE on the topic), and confluent-kafka's AdminClient moving a partition's log start."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("kio")

from gateway_harness import call_once, gateway_for_alice
from test_delete_records import _lose_redis_in_round

from rcoord.errors import Errors
from rcoord.topics import Producer, ProducerRecord, Topics, log_offsets, partition_key

WAIT_S = 60.0
TOPIC_AUTHORIZATION_FAILED = 29


def _fill(redis_server: Any, namespace: str, topic: str, counts: list[int]) -> None:
    client = redis_server.client()
    try:
        Producer(client, namespace, idempotent=False).send_batch(topic, [
            ProducerRecord(b"v", partition=p) for p, n in enumerate(counts) for _ in range(n)])
    finally:
        client.close()


def _body(entries: list[tuple[str, int, int]]) -> dict[str, Any]:
    return {"timeout_ms": 5000, "topics": [
        {"name": name, "partitions": [{"partition_index": p, "offset": o}]}
        for name, p, o in entries]}


def _answers(gateway: Any, entries: list[tuple[str, int, int]], version: int = 2
             ) -> dict[tuple[str, int], tuple[int, int]]:
    # (v0 and v1 are not flexible: response header v0)
    topics = call_once(gateway, 21, version, _body(entries), 5 if version >= 2 else 4).topics
    return {(t.name, p.partition_index): (p.error_code.value, p.low_watermark)
            for t in topics for p in t.partitions}


@pytest.mark.parametrize("version", [0, 1, 2])
def test_kafkas_answers(gateway, redis_server, topics, version):
    topics.create("t", 3)
    _fill(redis_server, gateway.config.namespace, "t", [10, 10, 10])
    got = _answers(gateway, [("t", 0, 4), ("t", 1, -1), ("t", 2, 11), ("t", 3, 1), ("t", -1, 1),
                             ("nope", 0, 1), ("bad/name", 0, 1)], version)
    assert got == {
        ("t", 0): (0, 4), ("t", 1): (0, 10), ("t", 2): (Errors.OFFSET_OUT_OF_RANGE, -1),
        ("t", 3): (Errors.UNKNOWN_TOPIC_OR_PARTITION, -1),
        ("t", -1): (Errors.UNKNOWN_TOPIC_OR_PARTITION, -1),
        ("nope", 0): (Errors.UNKNOWN_TOPIC_OR_PARTITION, -1),
        ("bad/name", 0): (Errors.UNKNOWN_TOPIC_OR_PARTITION, -1)}
    client = redis_server.client()
    try:
        assert [log_offsets(client, gateway.config.namespace, "t", p) for p in range(3)] == [
            (4, 10), (10, 10), (0, 10)]
    finally:
        client.close()
    # Below the log start: nothing removed, the log start answered. Named twice: the last wins.
    assert _answers(gateway, [("t", 0, 2), ("t", 0, 6)], version) == {("t", 0): (0, 6)}
    assert _answers(gateway, [("t", 0, 5)], version) == {("t", 0): (0, 6)}


def test_a_topic_redis_fails_on_is_answered_alone(gateway, redis_server, topics, monkeypatch,
                                                  caplog):
    import redis

    real = Topics.delete_records

    def failing(self: Topics, topic: str, offsets: Any) -> Any:
        if topic == "cut":
            raise redis.exceptions.ConnectionError("connection reset (test)")
        return real(self, topic, offsets)

    monkeypatch.setattr(Topics, "delete_records", failing)
    for name in ("kept", "cut"):
        topics.create(name, 1)
        _fill(redis_server, gateway.config.namespace, name, [3])
    assert _answers(gateway, [("kept", 0, 2), ("cut", 0, 2)]) == {
        ("kept", 0): (0, 2), ("cut", 0): (Errors.REQUEST_TIMED_OUT, -1)}
    assert "topic 'cut': Redis unreachable or unavailable" in caplog.text


def test_a_call_that_loses_redis_partway_asks_again_only_what_it_left(gateway, redis_server,
                                                                      topics, monkeypatch):
    # Partition 1's removal takes bounded rounds, and Redis is lost in the second, after 5
    # records were appended to it. The gateway asked every partition again alone, partition
    # 1 with its -1, the log end by then: the 5 records appended since were removed too (low
    # watermark 45). It asks again only what the call left, at the offset it resolved (40).
    from rcoord.topics import admin as topics_admin

    ns = gateway.config.namespace
    topics.create("t", 2)
    client = redis_server.client()
    producer = Producer(client, ns, idempotent=False)
    producer.send_batch("t", [ProducerRecord(b"x" * 1000, partition=p)
                              for p, n in ((0, 3), (1, 40)) for _ in range(n)])
    monkeypatch.setattr(topics_admin, "RETENTION_TRIM_BYTES", 5000)
    _lose_redis_in_round(monkeypatch, 2, before=lambda: producer.send_batch(
        "t", [ProducerRecord(b"y", partition=1) for _ in range(5)]))
    try:
        assert _answers(gateway, [("t", 0, 2), ("t", 1, -1)]) == {
            ("t", 0): (0, 2), ("t", 1): (0, 40)}
        assert [log_offsets(client, ns, "t", p) for p in range(2)] == [(2, 3), (40, 45)]
    finally:
        client.close()


def test_deleting_records_needs_delete_on_the_topic(redis_server, namespace, tmp_path: Path):
    with gateway_for_alice(redis_server, namespace, tmp_path, ["DELETE"],
                           ["READ", "WRITE", "DESCRIBE", "ALTER"]) as (gw, topics):
        for name in ("mine", "theirs"):
            _fill(redis_server, namespace, name, [3])
        answered = call_once(gw, 21, 2, _body([("mine", 0, 2), ("theirs", 0, 2)]),
                             login=("alice", "pw")).topics
        got = {t.name: (t.partitions[0].error_code.value, t.partitions[0].low_watermark)
               for t in answered}
        assert got == {"mine": (0, 2), "theirs": (TOPIC_AUTHORIZATION_FAILED, -1)}
        assert topics.describe("theirs").partitions[0].log_start_offset == 0


def test_confluent_kafka_deletes_records(gateway, redis_server, topics):
    ck = pytest.importorskip("confluent_kafka")
    from confluent_kafka.admin import AdminClient

    topics.create("d", 2)
    _fill(redis_server, gateway.config.namespace, "d", [5, 5])
    admin = AdminClient({"bootstrap.servers": gateway.bootstrap, "broker.address.family": "v4"})
    futures = admin.delete_records([ck.TopicPartition("d", 0, 3),
                                    ck.TopicPartition("d", 1, ck.OFFSET_END)],
                                   request_timeout=30)
    done = {tp.partition: f.result(timeout=WAIT_S) for tp, f in futures.items()}
    assert {p: d.low_watermark for p, d in done.items()} == {0: 3, 1: 5}
    futures = admin.delete_records([ck.TopicPartition("d", 0, 9)], request_timeout=30)
    (future,) = futures.values()
    with pytest.raises(ck.KafkaException) as info:
        future.result(timeout=WAIT_S)
    assert info.value.args[0].code() == ck.KafkaError.OFFSET_OUT_OF_RANGE


def test_a_partition_the_log_cannot_serve_is_logged_with_what_mends_it(
        gateway, redis_server, topics, caplog):
    """A stream whose last id an XADD by hand made its own is UNKNOWN_SERVER_ERROR for its
    partition alone, and, as DeleteRecords has no error message, the gateway logs which stream
    and what mends it. Before, the per-partition answer (ba3c0cb) dropped that detail: the
    whole request no longer failed (which dispatch logged), and nothing said why."""
    topics.create("t", 2)
    _fill(redis_server, gateway.config.namespace, "t", [3, 3])
    client = redis_server.client()
    try:
        client.execute_command(
            "XADD", partition_key(gateway.config.namespace, "t", 1), "*", "t", 1)
    finally:
        client.close()
    with caplog.at_level("WARNING", logger="rcoord.gateway.api_delete_records"):
        assert _answers(gateway, [("t", 0, 2), ("t", 1, 2)]) == {
            ("t", 0): (0, 2), ("t", 1): (Errors.UNKNOWN_SERVER_ERROR, -1)}
    assert "DeleteRecords of t-1: UNKNOWN_SERVER_ERROR" in caplog.text
    assert "delete and re-create the topic" in caplog.text
