"""CreateTopics, DeleteTopics and CreatePartitions asked with ``timeout_ms`` 0 (librdkafka's
``operation_timeout=0``) for a topic whose call cannot reach Redis.

A Kafka broker answers a topic it started to create, delete or grow without waiting
REQUEST_TIMED_OUT (``ZkAdminManager``: "if timeout <= 0 ... return immediately"), and
librdkafka takes that code, asked so, for "in progress": its future succeeds. The gateway's
"Redis unreachable, whether it was done is not known" was that code too, so a client was told
a topic was created (deleted, grown) that was not. Redis is made unreachable for one topic's
call by patching the ``Topics`` method that makes it (as tests/test_gateway_create_partitions.py
does), so the failure is deterministic.
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("kio")

import redis
from gateway_harness import call_once

from rcoord.errors import Errors
from rcoord.topics import Topics

WAIT_S = 60.0


def _cut(monkeypatch: Any, method: str) -> None:
    """``Topics.<method>`` for topic "cut" fails as a lost Redis connection does."""
    real = getattr(Topics, method)

    def failing(self: Topics, topic: str, *args: Any, **kwargs: Any) -> Any:
        if topic == "cut":
            raise redis.exceptions.ConnectionError("connection reset (test)")
        return real(self, topic, *args, **kwargs)

    monkeypatch.setattr(Topics, method, failing)


def _admin(gateway: Any) -> Any:
    from confluent_kafka.admin import AdminClient

    return AdminClient({"bootstrap.servers": gateway.bootstrap, "broker.address.family": "v4"})


def _failed(future: Any) -> Any:
    """The KafkaException ``future`` failed with (the test fails if it succeeded)."""
    from confluent_kafka import KafkaException

    with pytest.raises(KafkaException) as raised:
        future.result(timeout=WAIT_S)
    return raised.value.args[0]


def test_confluent_kafka_is_not_told_a_topic_was_created_that_was_not(gateway, topics,
                                                                      monkeypatch):
    pytest.importorskip("confluent_kafka")
    from confluent_kafka.admin import NewTopic

    _cut(monkeypatch, "create")
    admin = _admin(gateway)  # (kept: a collected client ends its calls with _DESTROY)
    futures = admin.create_topics([NewTopic("cut", 1, 1), NewTopic("kept", 1, 1)],
                                            operation_timeout=0, request_timeout=30)
    assert futures["kept"].result(timeout=WAIT_S) is None
    error = _failed(futures["cut"])
    assert "Redis unreachable or unavailable" in error.str()
    assert set(topics.list()) == {"kept"}


def test_confluent_kafka_is_not_told_a_topic_was_deleted_that_was_not(gateway, topics,
                                                                      monkeypatch):
    pytest.importorskip("confluent_kafka")
    topics.create("cut", 1)
    topics.create("gone", 1)
    _cut(monkeypatch, "delete")
    admin = _admin(gateway)
    futures = admin.delete_topics(["cut", "gone"], operation_timeout=0,
                                            request_timeout=30)
    assert futures["gone"].result(timeout=WAIT_S) is None
    _failed(futures["cut"])
    assert set(topics.list()) == {"cut"}


def test_confluent_kafka_is_not_told_a_topic_was_grown_that_was_not(gateway, topics,
                                                                    monkeypatch):
    pytest.importorskip("confluent_kafka")
    from confluent_kafka.admin import NewPartitions

    topics.create("cut", 1)
    topics.create("kept", 1)
    _cut(monkeypatch, "add_partitions")
    admin = _admin(gateway)
    futures = admin.create_partitions(
        [NewPartitions("cut", 3), NewPartitions("kept", 3)], operation_timeout=0,
        request_timeout=30)
    assert futures["kept"].result(timeout=WAIT_S) is None
    error = _failed(futures["cut"])
    assert "Redis unreachable or unavailable" in error.str()
    assert (topics.partition_count("cut"), topics.partition_count("kept")) == (1, 3)


_REQUESTS: dict[str, tuple[int, int, str, dict[str, Any]]] = {
    # api: (key, version, Topics method, body without its timeout)
    "CreateTopics": (19, 7, "create", {"validate_only": False, "topics": [
        {"name": "cut", "num_partitions": 1, "replication_factor": 1, "assignments": [],
         "configs": []}]}),
    "DeleteTopics": (20, 5, "delete", {"topic_names": ["cut"]}),
    "CreatePartitions": (37, 3, "add_partitions", {"validate_only": False, "topics": [
        {"name": "cut", "count": 2, "assignments": None}]}),
}


def _code(gateway: Any, api: str, timeout_ms: int) -> int:
    key, version, _, body = _REQUESTS[api]
    answer = call_once(gateway, key, version, {**body, "timeout": timeout_ms})
    (item,) = getattr(answer, {19: "topics", 20: "responses", 37: "results"}[key])
    return int(item.error_code.value)


@pytest.mark.parametrize("api", sorted(_REQUESTS))
def test_only_a_call_that_waits_is_answered_request_timed_out(gateway, topics, monkeypatch, api):
    """REQUEST_TIMED_OUT still where the client waits (``timeout_ms`` > 0): there it says "not
    known whether done" to every client; with 0 or less a code no client takes for "begun"."""
    if api != "CreateTopics":
        topics.create("cut", 1)
    _cut(monkeypatch, _REQUESTS[api][2])
    assert _code(gateway, api, 5000) == Errors.REQUEST_TIMED_OUT
    for timeout_ms in (0, -1):
        assert _code(gateway, api, timeout_ms) not in (Errors.NONE, Errors.REQUEST_TIMED_OUT)
