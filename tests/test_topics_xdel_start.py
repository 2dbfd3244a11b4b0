"""A partition's log start after entries were removed from its stream by hand (XDEL in its
middle; rcoord removes records only from a log's start) is its first entry's offset, as Kafka's
log start offset is the first offset the log holds. It was the log end less the stream's length,
one too high per removed entry, so every reader of the log start (describe, ``log_offsets``,
``beginning_offsets``, a Consumer's reset to earliest, Spark's planning, the gateway's
ListOffsets) and DeleteRecords and ``offsets_for_times`` skipped the first records as if
retention had removed them. Real servers (the ``env`` fixture of test_consumer: one node and
the cluster)."""

from __future__ import annotations

import importlib
from typing import Any

import test_consumer
from test_client_group import WAIT_S

from rcoord import TopicPartition
from rcoord.topics import ProducerRecord, log_offsets, offsets_for_times, partition_key
from rcoord.topics.fetch import log_offsets_each

fetch_module = importlib.import_module("rcoord.topics.fetch")  # (`fetch` is the function)
env = test_consumer.env
TP = TopicPartition


def _records_with_xdel(env: Any, count: int, removed: list[int]) -> str:
    """Topic t of 1 partition holding records b"a0".. at offsets 0 to ``count - 1``, of which
    those at offsets ``removed`` were removed by hand (XDEL). Returns the stream's key."""
    env.topics.create("t", 1)
    env.producer.send_batch("t", [ProducerRecord(b"a%d" % i, partition=0) for i in range(count)])
    key = partition_key(env.namespace, "t", 0)
    env.client.execute_command("XDEL", key, *(f"0-{o + 1}" for o in removed))
    return key


def test_the_log_start_is_the_first_entry_after_a_middle_xdel(env: Any) -> None:
    """Offsets 0 to 3 with 2 removed: the log start is 0 (it was 4 - 3 = 1) for every reader
    of it; the log end stays 4."""
    _records_with_xdel(env, 4, [2])
    assert log_offsets(env.client, env.namespace, "t", 0) == (0, 4)
    assert log_offsets_each(env.client, env.namespace, [("t", 0)]) == [(0, 4)]
    (p,) = env.topics.describe("t").partitions
    assert (p.log_start_offset, p.log_end_offset) == (0, 4)
    consumer = env.consumer(enable_auto_commit=False, topics=[], start_offset="earliest")
    assert consumer.beginning_offsets([TP("t", 0)]) == {TP("t", 0): 0}


def test_a_consumer_reset_to_earliest_reads_the_first_record(env: Any) -> None:
    """Offsets 0 to 4 with 0 and 4 removed: the first record held is at 1. A consumer with no
    position resets to 1 and reads b"a1" (it reset to 5 - 3 = 2 and never read it); one
    positioned below the start (0, a removed record) is out of range and is reset by its
    policy to 1, as Kafka's consumer is."""
    _records_with_xdel(env, 5, [0, 4])
    assert log_offsets(env.client, env.namespace, "t", 0) == (1, 5)
    fresh = env.consumer(enable_auto_commit=False, topics=[], start_offset="earliest")
    fresh.assign([TP("t", 0)])
    below = env.consumer(enable_auto_commit=False, topics=[], start_offset="earliest")
    below.assign([TP("t", 0)])
    below.seek(TP("t", 0), 0)
    for consumer in (fresh, below):
        values: list[bytes] = []
        for _ in range(20):  # (a poll may end before its fetch is answered)
            values += [r.value for r in consumer.poll(WAIT_S)]
            if len(values) >= 3:
                break
        assert values == [b"a1", b"a2", b"a3"]
        assert consumer.position(TP("t", 0)) == 4


def test_delete_records_removes_the_records_before_its_offset(env: Any) -> None:
    """Offsets 0 to 3 with 2 removed, DeleteRecords to 1: record 0 is removed. It was left in
    place (the log start taken for 1 already) while the answer said the log starts at 1."""
    key = _records_with_xdel(env, 4, [2])
    (got,) = env.topics.delete_records("t", {0: 1}).values()
    assert got.low_watermark == 1
    ids = [e[0] for e in env.client.execute_command("XRANGE", key, "-", "+")]
    assert [i.decode() if isinstance(i, bytes) else i for i in ids] == ["0-2", "0-4"]
    assert log_offsets(env.client, env.namespace, "t", 0) == (1, 4)


def test_offsets_for_times_finds_the_first_record(env: Any) -> None:
    """A timestamp older than every record answers the first record held, offset 0 (it was 1,
    the search starting at the log start taken)."""
    _records_with_xdel(env, 4, [2])
    (got,) = offsets_for_times(env.client, env.namespace, {("t", 0): 0}).values()
    assert got is not None and got.offset == 0


def test_a_byte_bounded_fetch_across_a_gap_answers_each_record_once(env: Any) -> None:
    """Offsets 0 to 5 with 2 removed, read from 0 by byte-bounded steps (one record first,
    then two: 1 and 3, across the gap): every record comes once, in order. The step after
    read on from 0 + 3 records, offset 3, so b"a3" came twice in one answer (and a Consumer
    handed it out twice)."""
    _records_with_xdel(env, 6, [2])
    want = [(0, b"a0"), (1, b"a1"), (3, b"a3"), (4, b"a4"), (5, b"a5")]
    (many,) = fetch_module.fetch_many(env.client, env.namespace, [("t", 0, 0)],
                                      max_bytes=1 << 20)
    one = fetch_module.fetch_bounded(env.client, env.namespace, "t", 0, 0, 100, 1 << 20)
    for got in (many, one):
        assert [(r.offset, r.value) for r in got.records] == want
    consumer = env.consumer(enable_auto_commit=False, topics=[], start_offset="earliest")
    consumer.assign([TP("t", 0)])
    values: list[tuple[int, bytes]] = []
    for _ in range(20):  # (a poll may end before its fetch is answered)
        values += [(r.offset, r.value) for r in consumer.poll(WAIT_S)]
        if len(values) >= len(want):
            break
    assert values == want and consumer.position(TP("t", 0)) == 6
