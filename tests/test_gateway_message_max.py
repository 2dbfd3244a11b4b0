"""Kafka's broker setting ``message.max.bytes`` (the gateway's ``--message-max-bytes``): a
produced record batch larger than it is MESSAGE_TOO_LARGE for its partition, nothing of it
appended, and the request's other partitions are appended (``UnifiedLog``'s
``analyzeAndValidateRecords``). The gateway bounded a batch only by its frame limit (100 MiB)."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("kio")

from gateway_harness import call_once, produced_batch, running_gateway, topics_of

from rcoord.errors import Errors
from rcoord.gateway.state import GatewayConfig
from rcoord.topics import Record, fetch

KAFKA_DEFAULT = 1024 * 1024 + 12
BROKER = 4


def _batch_of(size: int) -> tuple[bytes, int]:
    """A producer's batch of one record, exactly ``size`` bytes long, and its value's length."""
    empty = len(produced_batch([Record(0, None, b"", {}, 0)]))
    value = b"v" * (size - empty)
    batch = produced_batch([Record(0, None, value, {}, 0)])
    if len(batch) != size:  # (the record's length varints grew with the value)
        value = value[:size - len(batch)]
        batch = produced_batch([Record(0, None, value, {}, 0)])
    assert len(batch) == size
    return batch, len(value)


def _produce(gw: Any, batches: dict[str, bytes]) -> dict[str, Any]:
    """One Produce v9 with ``batches`` (topic -> its partition 0's batch): each partition's
    answer by topic."""
    answer = call_once(gw, 0, 9, {"acks": -1, "timeout": 10_000, "topic_data": [
        {"name": topic, "partition_data": [{"index": 0, "records": batch}]}
        for topic, batch in batches.items()]})
    return {t.name: t.partition_responses[0] for t in answer.responses}


def _stored(redis_server: Any, namespace: str, topic: str) -> list[int]:
    client = redis_server.client()
    try:
        return [len(r.value or b"") for r in fetch(client, namespace, topic, 0, 0, 100).records]
    finally:
        client.close()


def test_a_batch_over_message_max_bytes_is_refused_and_the_others_appended(redis_server,
                                                                           namespace):
    limit = 4096
    with running_gateway(redis_server, namespace, message_max_bytes=limit) as gw, \
            topics_of(redis_server, namespace) as topics:
        for name in ("big", "edge", "small"):
            topics.create(name, 1)
        (big, _), (edge, edge_value), (small, small_value) = (
            _batch_of(limit + 1), _batch_of(limit), _batch_of(100))
        parts = _produce(gw, {"big": big, "edge": edge, "small": small})
    assert int(parts["big"].error_code.value) == Errors.MESSAGE_TOO_LARGE  # (before: NONE)
    assert f"{limit + 1} bytes" in parts["big"].error_message
    assert str(limit) in parts["big"].error_message
    assert int(parts["big"].base_offset) == -1
    for name in ("edge", "small"):
        assert int(parts[name].error_code.value) == Errors.NONE
        assert int(parts[name].base_offset) == 0
    assert _stored(redis_server, namespace, "big") == []
    assert _stored(redis_server, namespace, "edge") == [edge_value]
    assert _stored(redis_server, namespace, "small") == [small_value]


def test_the_default_is_kafkas_and_describe_configs_shows_it(redis_server, namespace):
    assert GatewayConfig().message_max_bytes == KAFKA_DEFAULT
    with running_gateway(redis_server, namespace) as gw, \
            topics_of(redis_server, namespace) as topics:
        topics.create("over", 1)
        topics.create("at", 1)
        parts = _produce(gw, {"over": _batch_of(KAFKA_DEFAULT + 1)[0],
                              "at": _batch_of(KAFKA_DEFAULT)[0]})
        described = call_once(gw, 32, 4, {"resources": [
            {"resource_type": BROKER, "resource_name": "0",
             "configuration_keys": ["message.max.bytes"]}]}).results[0]
    assert int(parts["over"].error_code.value) == Errors.MESSAGE_TOO_LARGE
    assert int(parts["at"].error_code.value) == Errors.NONE
    assert [(c.name, c.value, c.read_only) for c in described.configs] == [
        ("message.max.bytes", str(KAFKA_DEFAULT), True)]


def test_a_negative_message_max_bytes_is_refused():
    with pytest.raises(ValueError, match="message_max_bytes must be >= 0, got -1"):
        GatewayConfig(message_max_bytes=-1).validate()
