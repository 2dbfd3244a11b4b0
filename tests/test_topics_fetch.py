"""The fetch read path (XRANGE then XINFO STREAM, pipelined; rcoord.topics._decode): what the
fetch script used to guarantee, checked on one node and on the cluster."""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

import pytest

from rcoord import Errors
from rcoord.topics import (
    Producer,
    ProducerRecord,
    Record,
    Topics,
    fetch,
    partition_key,
)

fetch_module = importlib.import_module("rcoord.topics.fetch")  # the name `fetch` is the function


@pytest.fixture
def topics(redis_client: Any, namespace: str) -> Topics:
    return Topics(redis_client, namespace)


@pytest.fixture
def producer(redis_client: Any, namespace: str) -> Producer:
    return Producer(redis_client, namespace, partitioner="round_robin")


def test_decoded_records_equal_constructed_ones(
    topics: Topics, producer: Producer, redis_client: Any, namespace: str
) -> None:
    topics.create("t", 1)
    metas = producer.send_batch("t", [
        ProducerRecord(b"v0", partition=0),
        ProducerRecord(None, key=b"k1", partition=0),
        ProducerRecord(b"v2", key=b"", headers={"a": b"\x00", "b": b""}, partition=0),
    ])
    got = fetch(redis_client, namespace, "t", 0, 0).records
    want = [
        Record(0, None, b"v0", {}, metas[0].timestamp_ms),
        Record(1, b"k1", None, {}, metas[1].timestamp_ms),
        Record(2, b"", b"v2", {"a": b"\x00", "b": b""}, metas[2].timestamp_ms),
    ]
    assert got == want
    assert [repr(r) for r in got] == [repr(r) for r in want]
    assert [dataclasses.asdict(r) for r in got] == [dataclasses.asdict(r) for r in want]
    with pytest.raises(dataclasses.FrozenInstanceError):
        got[0].offset = 5  # type: ignore[misc]


def test_empty_partition_is_at_offset_zero(
    topics: Topics, redis_client: Any, namespace: str
) -> None:
    topics.create("t", 1)
    res = fetch(redis_client, namespace, "t", 0, 0)
    assert (res.error, res.records, res.log_start_offset, res.log_end_offset) == (
        Errors.NONE, [], 0, 0)
    assert fetch(redis_client, namespace, "t", 0, 1).error == Errors.OFFSET_OUT_OF_RANGE


def test_recreated_topic_answers_old_offsets_out_of_range(
    topics: Topics, producer: Producer, redis_client: Any, namespace: str
) -> None:
    topics.create("t", 1)
    producer.send_batch("t", [ProducerRecord(b"old", partition=0) for _ in range(6)])
    topics.delete("t")
    assert fetch(redis_client, namespace, "t", 0, 6).error == Errors.UNKNOWN_TOPIC_OR_PARTITION
    topics.create("t", 1)
    producer.send_batch("t", [ProducerRecord(b"new", partition=0) for _ in range(2)])
    stale = fetch(redis_client, namespace, "t", 0, 6)
    assert (stale.error, stale.records, stale.log_start_offset, stale.log_end_offset) == (
        Errors.OFFSET_OUT_OF_RANGE, [], 0, 2)
    assert [r.value for r in fetch(redis_client, namespace, "t", 0, 0).records] == [b"new"] * 2


def test_a_key_that_is_not_a_stream_is_no_partition(
    redis_client: Any, namespace: str
) -> None:
    redis_client.set(partition_key(namespace, "t", 0), b"not a stream")
    res = fetch(redis_client, namespace, "t", 0, 0)
    assert (res.error, res.records, res.log_start_offset, res.log_end_offset) == (
        Errors.UNKNOWN_TOPIC_OR_PARTITION, [], -1, -1)


def test_max_records_bounds_one_fetch(
    topics: Topics, producer: Producer, redis_client: Any, namespace: str
) -> None:
    topics.create("t", 1)
    producer.send_batch("t", [ProducerRecord(b"%d" % i, partition=0) for i in range(7)])
    res = fetch(redis_client, namespace, "t", 0, 2, max_records=4)
    assert [(r.offset, r.value) for r in res.records] == [(i, b"%d" % i) for i in range(2, 6)]
    assert (res.log_start_offset, res.log_end_offset) == (0, 7)


def test_a_stream_replaced_between_the_two_reads_is_read_again(
    topics: Topics, producer: Producer, redis_client: Any, namespace: str
) -> None:
    """The replies of a fetch whose XRANGE saw the old stream and whose XINFO saw the new one:
    the records reach past the new log end, so ``_answer`` refuses them (the fetch re-reads)."""
    topics.create("t", 1)
    producer.send_batch("t", [ProducerRecord(b"old", partition=0) for _ in range(6)])
    key = partition_key(namespace, "t", 0)
    old_entries = redis_client.xrange(key, "0-3", "+")
    topics.delete("t")
    topics.create("t", 1)
    producer.send_batch("t", [ProducerRecord(b"new", partition=0) for _ in range(3)])
    new_info = redis_client.xinfo_stream(key)
    assert fetch_module._answer(2, old_entries, new_info) is None
    same = fetch_module._answer(2, redis_client.xrange(key, "0-3", "+"), new_info)
    assert same is not None and [r.value for r in same.records] == [b"new"]
