"""Edge answers of Fetch and ListOffsets, as Kafka gives them: a negative fetch offset is out
of range for its partition only, and ListOffsets' MAX_TIMESTAMP (KIP-734) names the record with
the largest timestamp and that timestamp, or -1 and -1 for an empty log."""

from __future__ import annotations

import pytest

pytest.importorskip("kio")

from gateway_harness import call_once

from rcoord.errors import Errors
from rcoord.topics import Producer, ProducerRecord


def test_a_negative_fetch_offset_is_out_of_range_for_its_partition_only(gateway, redis_server,
                                                                        topics):
    topics.create("neg", 2)
    client = redis_server.client()
    try:
        Producer(client, gateway.config.namespace, idempotent=False).send_batch(
            "neg", [ProducerRecord(b"a", partition=0), ProducerRecord(b"b", partition=1)])
    finally:
        client.close()
    fetched = call_once(gateway, 1, 12, {
        "replica_id": -1, "max_wait": 0, "min_bytes": 1, "max_bytes": 1 << 20,
        "topics": [{"topic": "neg", "partitions": [
            {"partition": 0, "fetch_offset": -1, "partition_max_bytes": 1 << 20},
            {"partition": 1, "fetch_offset": 0, "partition_max_bytes": 1 << 20}]}]})
    assert fetched.error_code.value == 0
    parts = {p.partition_index: p for p in fetched.responses[0].partitions}
    assert parts[0].error_code.value == Errors.OFFSET_OUT_OF_RANGE
    assert (parts[0].log_start_offset, parts[0].high_watermark) == (0, 1)  # to reset from
    assert parts[1].error_code.value == 0 and parts[1].records


def test_max_timestamp_names_the_last_record_or_nothing(gateway, redis_server, topics):
    topics.create("mx", 2)
    client = redis_server.client()
    try:
        metas = Producer(client, gateway.config.namespace, idempotent=False).send_batch(
            "mx", [ProducerRecord(b"a", partition=0), ProducerRecord(b"b", partition=0)])
    finally:
        client.close()
    listed = call_once(gateway, 2, 7, {"replica_id": -1, "isolation_level": 0, "topics": [
        {"name": "mx", "partitions": [{"partition_index": p, "timestamp": -3}
                                      for p in (0, 1)]}]})
    parts = {p.partition_index: p for p in listed.topics[0].partitions}
    assert parts[0].error_code.value == 0
    assert (parts[0].offset, parts[0].timestamp) == (metas[1].offset, metas[1].timestamp_ms)
    assert (parts[1].offset, parts[1].timestamp) == (-1, -1)  # empty: no such record
