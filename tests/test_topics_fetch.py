"""The fetch read path (XRANGE then topic_offsets.lua, pipelined; rcoord.topics._decode): what the
fetch script used to guarantee, and the several-partition fetch (fetch_many, fetch_many_as),
checked on one node and on the cluster."""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from typing import Any

import msgpack
import pytest

from rcoord import Errors
from rcoord.client.consumer import ConsumerRecord
from rcoord.errors import InvalidRequestError
from rcoord.topics import (
    Producer,
    ProducerRecord,
    Record,
    TopicError,
    Topics,
    _decode,
    fetch,
    log_offsets,
    offsets_for_times,
    partition_key,
)
from rcoord.topics._base import OFFSETS, last_timestamp_key_of
from rcoord.topics.producer import append_idempotent

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
    """The replies of a fetch whose XRANGE saw the old stream and whose log offsets read saw
    the new one: the records reach past the new log end, so ``_answer`` refuses them (the
    fetch re-reads)."""
    topics.create("t", 1)
    producer.send_batch("t", [ProducerRecord(b"old", partition=0) for _ in range(6)])
    key = partition_key(namespace, "t", 0)
    old_entries = redis_client.xrange(key, "0-3", "+")
    topics.delete("t")
    topics.create("t", 1)
    producer.send_batch("t", [ProducerRecord(b"new", partition=0) for _ in range(3)])
    new_info = OFFSETS(redis_client, [key, last_timestamp_key_of(key)], [])
    assert new_info == [b"NONE", 0, 3]
    assert fetch_module._answer(key, 2, old_entries, new_info) is None
    same = fetch_module._answer(key, 2, redis_client.xrange(key, "0-3", "+"), new_info)
    assert same is not None and [r.value for r in same.records] == [b"new"]


def _reply_bytes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The bytes of every fetch pipeline's replies (each string counted), one total a
    pipeline."""
    totals: list[int] = []
    make = fetch_module._pipeline

    def weigh(reply: Any) -> int:
        if isinstance(reply, (bytes, str)):
            return len(reply)
        if isinstance(reply, dict):
            return sum(weigh(k) + weigh(v) for k, v in reply.items())
        if isinstance(reply, (list, tuple)):
            return sum(map(weigh, reply))
        return 0

    def measured(client: Any) -> Any:
        pipe = make(client)
        execute = pipe.execute

        def execute_weighed(*args: Any, **kwargs: Any) -> Any:
            replies = execute(*args, **kwargs)
            totals.append(weigh(replies))
            return replies

        pipe.execute = execute_weighed
        return pipe

    monkeypatch.setattr(fetch_module, "_pipeline", measured)
    return totals


def test_a_read_of_large_records_carries_no_others_for_the_log_offsets(
    topics: Topics, producer: Producer, redis_client: Any, namespace: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A fetch learns the log offsets without copying records: it read them with XINFO
    STREAM, whose reply holds the partition's first and last records, so a fetch of one record
    of 256 KiB received 768 KiB (1 ms more a read for records of 1 MB)."""
    topics.create("t", 1)
    producer.send_batch("t", [ProducerRecord(bytes([i]) * 256 * 1024, partition=0)
                              for i in range(5)])
    totals = _reply_bytes(monkeypatch)
    got = fetch(redis_client, namespace, "t", 0, 2, 1)
    assert [r.value[:1] for r in got.records] == [b"\x02"]
    assert (got.log_start_offset, got.log_end_offset) == (0, 5)
    assert len(totals) == 1 and 256 * 1024 < totals[0] < 257 * 1024


def test_the_log_offsets_follow_appends_trims_and_a_topic_made_again(
    topics: Topics, producer: Producer, redis_client: Any, namespace: str
) -> None:
    """The offsets a fetch reports come from the partition's mark (its last timestamp and log
    end, kept by every append) and the stream's length; where the mark gives no end (written
    by an older rcoord) or one that does not fit the length, from XINFO STREAM as before."""
    topics.create("t", 1)
    key = partition_key(namespace, "t", 0)
    mark = last_timestamp_key_of(key)
    assert mark == f"{namespace}:topicts:{{{key.split('{')[1].split('}')[0]}}}:t:0"

    def offsets() -> tuple[int, int]:
        got = fetch(redis_client, namespace, "t", 0, 0, 1)  # (or out of range: both say)
        assert got.error in (Errors.NONE, Errors.OFFSET_OUT_OF_RANGE)
        described = topics.describe("t").partitions[0]
        both = (got.log_start_offset, got.log_end_offset)
        assert both == log_offsets(redis_client, namespace, "t", 0) == (
            described.log_start_offset, described.log_end_offset)
        return both

    assert offsets() == (0, 0)  # (made empty: no mark yet)
    producer.send_batch("t", [ProducerRecord(b"x", partition=0) for _ in range(7)])
    assert redis_client.get(mark).split()[1] == b"7"
    assert offsets() == (0, 7)
    topics.delete_records("t", {0: 3})
    assert offsets() == (3, 7)
    redis_client.xtrim(key, maxlen=0)  # (retention emptied it: the end stays)
    assert offsets() == (7, 7)
    Producer(redis_client, namespace, idempotent=False).send_batch(
        "t", [ProducerRecord(b"y", partition=0)])
    assert offsets() == (7, 8)
    ts = redis_client.get(mark).split()[0]
    for written in (ts, ts + b" 0"):  # an older rcoord's mark; one that does not fit
        redis_client.set(mark, written)
        assert offsets() == (7, 8)
    producer.send_batch("t", [ProducerRecord(b"z", partition=0)])
    assert redis_client.get(mark).split()[1] == b"9" and offsets() == (7, 9)
    # An append that keeps no mark (an older rcoord's, or by hand): the entry past the mark's
    # end is seen, and the offsets read as before (the mark said 9; the start would be 8).
    redis_client.execute_command("XADD", key, "0-*", "t", ts, "v", b"raw")
    assert offsets() == (7, 10)
    topics.delete("t")
    topics.create("t", 1)
    assert offsets() == (0, 0)
    redis_client.set(mark, ts + b" 50")  # (an older rcoord's re-create kept the old mark)
    assert offsets() == (0, 0)


# -- several partitions in one call (fetch_many, fetch_many_as) --------------------------------


def test_fetch_many_answers_each_read_as_fetch_does(
    topics: Topics, producer: Producer, redis_client: Any, namespace: str
) -> None:
    """Known partitions (on several masters in the cluster), an unknown partition and an
    unknown topic among them, an offset past the end and one at the end: one answer per read,
    in the order asked, each equal to the single-partition fetch of the same read."""
    topics.create("t", 6)
    for p in range(6):
        producer.send_batch("t", [ProducerRecord(b"%d-%d" % (p, i), partition=p)
                                  for i in range(p + 2)])
    reads = [
        ("t", 3, 1),
        ("t", 0, 0),
        ("t", 6, 0),        # no such partition
        ("nope", 0, 0),     # no such topic
        ("t", 5, 0),
        ("t", 1, 9),        # past the end (3 records)
        ("t", 2, 4),        # at the end: no records, no error
    ]
    if hasattr(redis_client, "get_node_from_key"):
        nodes = {redis_client.get_node_from_key(partition_key(namespace, "t", p)).name
                 for p in (3, 0, 5, 1, 2)}
        assert len(nodes) >= 2, "the reads must span several masters"
    got = fetch_module.fetch_many(redis_client, namespace, reads, max_records=3)
    want = [fetch(redis_client, namespace, t, p, o, max_records=3) for t, p, o in reads]
    assert got == want
    assert [(r.error, [x.value for x in r.records]) for r in got] == [
        (Errors.NONE, [b"3-1", b"3-2", b"3-3"]),
        (Errors.NONE, [b"0-0", b"0-1"]),
        (Errors.UNKNOWN_TOPIC_OR_PARTITION, []),
        (Errors.UNKNOWN_TOPIC_OR_PARTITION, []),
        (Errors.NONE, [b"5-0", b"5-1", b"5-2"]),
        (Errors.OFFSET_OUT_OF_RANGE, []),
        (Errors.NONE, []),
    ]
    assert (got[5].log_start_offset, got[5].log_end_offset) == (0, 3)
    assert (got[2].log_start_offset, got[2].log_end_offset) == (-1, -1)
    assert fetch_module.fetch_many(redis_client, namespace, []) == []


def test_fetch_many_checks_every_read_before_reading(redis_client: Any, namespace: str) -> None:
    with pytest.raises(TopicError):
        fetch_module.fetch_many(redis_client, namespace, [("t", 0, 0), ("bad name!", 0, 0)])
    with pytest.raises(InvalidRequestError):
        fetch_module.fetch_many(redis_client, namespace, [("t", 0, -1)])
    with pytest.raises(InvalidRequestError):
        fetch_module.fetch_many(redis_client, namespace, [("t", 0, 0)], max_records=0)


KIB = 1024


def _big_records(producer: Producer, partitions: int, count: int, size: int) -> None:
    for p in range(partitions):
        producer.send_batch("t", [ProducerRecord(bytes([i]) * size, partition=p)
                                  for i in range(count)])


def test_fetch_many_reads_about_the_byte_limits_going_over_by_one_record_at_most(
    topics: Topics, producer: Producer, redis_client: Any, namespace: str
) -> None:
    """Kafka's max.partition.fetch.bytes and fetch.max.bytes: partitions take their bytes in
    the order asked, and only the first with records may go over, by its first record
    (Kafka's readFromLog: minOneMessage until a partition gave records). Before, the only
    bound was the count: 500 records of 1 MiB were one read of 500 MiB; and then every
    partition with records got one, however large."""
    topics.create("t", 3)
    _big_records(producer, 3, 12, 100 * KIB)
    reads = [("t", 0, 0), ("t", 1, 2), ("t", 2, 0)]
    got = fetch_module.fetch_many(redis_client, namespace, reads,
                                  partition_max_bytes=350 * KIB)
    assert [[r.offset for r in res.records] for res in got] == [
        [0, 1, 2], [2, 3, 4], [0, 1, 2]]  # 3 records of just over 100 KiB fit 350 KiB
    assert all((res.error, res.log_start_offset, res.log_end_offset) == (Errors.NONE, 0, 12)
               for res in got)
    assert [r.value for r in got[1].records] == [bytes([i]) * 100 * KIB for i in (2, 3, 4)]
    # 450 KiB in all: a record of each (each gets one), and what is left to the first.
    got = fetch_module.fetch_many(redis_client, namespace, reads, max_bytes=450 * KIB,
                                  partition_max_bytes=350 * KIB)
    assert [[r.offset for r in res.records] for res in got] == [[0, 1], [2], [0]]
    # A limit below one record still reads one, of the first partition with records alone
    # (before, one of each); max_records still bounds the count.
    got = fetch_module.fetch_many(redis_client, namespace, reads, max_bytes=1)
    assert [[r.offset for r in res.records] for res in got] == [[0], [], []]
    assert all((res.error, res.log_end_offset) == (Errors.NONE, 12) for res in got)
    got = fetch_module.fetch_many(redis_client, namespace, [("t", 0, 12), *reads[1:]],
                                  partition_max_bytes=1)
    assert [[r.offset for r in res.records] for res in got] == [[], [2], []]
    got = fetch_module.fetch_many(redis_client, namespace, reads, 2, max_bytes=10 * 1024 * KIB)
    assert [[r.offset for r in res.records] for res in got] == [[0, 1], [2, 3], [0, 1]]
    # fetch: max_bytes is the partition's bound; the log end stops the reads.
    res = fetch(redis_client, namespace, "t", 0, 10, max_bytes=10 * 1024 * KIB)
    assert [r.offset for r in res.records] == [10, 11] and res.log_end_offset == 12


def _counts_asked(monkeypatch: pytest.MonkeyPatch) -> list[list[int]]:
    """The record counts each pipeline of reads asks, one list per pipeline (counted in
    ``_fetch_many``, which every read goes through)."""
    pipelines: list[list[int]] = []
    inner = fetch_module._fetch_many

    def counting(client: Any, reads: Any) -> Any:
        pipelines.append([count for _, _, count, _ in reads])
        return inner(client, reads)

    monkeypatch.setattr(fetch_module, "_fetch_many", counting)
    return pipelines


def test_fetch_many_as_reads_a_partition_of_a_known_record_size_in_one_step(
    topics: Topics, producer: Producer, redis_client: Any, namespace: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With the record size the last answer gave (read_bytes over its records), a bounded
    read takes one pipeline; without it, one record first and then the rest."""
    topics.create("t", 1)
    _big_records(producer, 1, 12, 100 * KIB)
    pipelines = _counts_asked(monkeypatch)
    (first,) = fetch_module.fetch_many_as(redis_client, namespace, [("t", 0, 0)], 500,
                                          ConsumerRecord, partition_max_bytes=350 * KIB)
    assert pipelines == [[1], [2]] and len(first.records) == 3
    size = -(-first.read_bytes // len(first.records))
    assert 100 * KIB < size < 101 * KIB
    pipelines.clear()
    (again,) = fetch_module.fetch_many_as(redis_client, namespace, [("t", 0, 3)], 500,
                                          ConsumerRecord, partition_max_bytes=350 * KIB,
                                          record_bytes=[size])
    assert pipelines == [[3]] and [r.offset for r in again.records] == [3, 4, 5]
    # Partitions reserve what their reads should take, not their whole bound: three reads of
    # about 301 KiB fit 1000 KiB in one step, though three bounds of 350 KiB do not.
    topics.create("t3", 3)
    for p in range(3):
        producer.send_batch("t3", [ProducerRecord(b"x" * 100 * KIB, partition=p)
                                   for _ in range(12)])
    pipelines.clear()
    got = fetch_module.fetch_many_as(redis_client, namespace, [("t3", p, 0) for p in range(3)],
                                     500, ConsumerRecord, max_bytes=1000 * KIB,
                                     partition_max_bytes=350 * KIB, record_bytes=[size] * 3)
    assert pipelines == [[3, 3, 3]] and [len(a.records) for a in got] == [3, 3, 3]
    # A share too small for one record reads none, but for the first partition's (Kafka's
    # rule); before, a record of each: 300 KiB read for a bound of 150 KiB. One step still.
    pipelines.clear()
    got = fetch_module.fetch_many_as(redis_client, namespace, [("t3", p, 3) for p in range(3)],
                                     500, ConsumerRecord, max_bytes=150 * KIB,
                                     record_bytes=[size] * 3)
    assert pipelines == [[1, 0, 0]] and [len(a.records) for a in got] == [1, 0, 0]
    assert all((a.error, a.log_end_offset) == (Errors.NONE, 12) for a in got)
    # The first partition read is at its log end: the next one with records still gets one.
    pipelines.clear()
    got = fetch_module.fetch_many_as(redis_client, namespace, [("t3", 0, 12), ("t3", 1, 3)],
                                     500, ConsumerRecord, max_bytes=50 * KIB,
                                     record_bytes=[size] * 2)
    assert pipelines == [[1, 0], [1]] and [[r.offset for r in a.records] for a in got] == [
        [], [3]]


def test_a_step_asks_for_a_bounded_multiple_of_the_records_read(
    topics: Topics, producer: Producer, redis_client: Any, namespace: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A step is sized by the records read so far, which may be far smaller than those after
    them: it asks for at most _STEP_GROWTH times as many. Before, a first record of 1 byte
    sized the next read at 499 records, here all 20 of 100 KiB (2 MiB) for a 150 KiB bound,
    and all were returned."""
    topics.create("t", 1)
    producer.send_batch("t", [ProducerRecord(b"s", partition=0)])
    _big_records(producer, 1, 20, 100 * KIB)
    read: list[int] = []
    inner = fetch_module._fetch_many

    def counting(client: Any, reads: Any) -> Any:
        answers = inner(client, reads)
        read.extend(len(a.records) for a in answers)
        return answers

    monkeypatch.setattr(fetch_module, "_fetch_many", counting)
    res = fetch(redis_client, namespace, "t", 0, 0, max_bytes=150 * KIB)
    assert sum(read) <= 1 + fetch_module._STEP_GROWTH, read
    assert 1 <= len(res.records) <= 2 and sum(len(r.value or b"") for r in res.records) <= (
        150 * KIB)
    assert [r.offset for r in res.records] == list(range(len(res.records)))


def _flat(fields: Any) -> list[Any]:
    """An entry's fields as ``[name, value, ...]`` (a cluster pipeline pairs them in a dict)."""
    return [x for kv in fields.items() for x in kv] if isinstance(fields, dict) else fields


def _bytes_read(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The stored size of every record read from Redis, as read (each XRANGE reply goes
    through ``_answer``)."""
    sizes: list[int] = []
    inner = fetch_module._answer

    def counting(offset: int, entries: Any, *rest: Any) -> Any:
        if isinstance(entries, list):
            sizes.extend(sum(map(len, _flat(fields))) for _, fields in entries)
        return inner(offset, entries, *rest)

    monkeypatch.setattr(fetch_module, "_answer", counting)
    return sizes


@pytest.mark.parametrize(("small", "large", "size", "limit"), [
    (1, 20, 100 * KIB, 150 * KIB),
    (40, 500, 20_000, 1024 * KIB),
    (10, 100, 60 * KIB, 1024 * KIB),
])
def test_what_a_bounded_fetch_reads_stays_near_its_limit_when_record_sizes_jump(
    topics: Topics, producer: Producer, redis_client: Any, namespace: str,
    monkeypatch: pytest.MonkeyPatch, small: int, large: int, size: int, limit: int,
) -> None:
    """Records of one byte, then large ones: what a byte-bounded fetch reads from Redis stays
    within twice its limit plus one record. A step is sized by the records before it, so it
    may ask for many large records; growth by 8 read 800 KiB for a limit of 150 KiB, and
    2.6 MiB for 1 MiB after ten small records."""
    topics.create("t", 1)
    producer.send_batch("t", [ProducerRecord(b"s", partition=0) for _ in range(small)])
    producer.send_batch("t", [ProducerRecord(b"b" * size, partition=0) for _ in range(large)])
    read = _bytes_read(monkeypatch)
    res = fetch(redis_client, namespace, "t", 0, 0, max_bytes=limit)
    assert sum(read) <= 2 * limit + size + 100, (len(read), sum(read))
    assert [r.offset for r in res.records] == list(range(len(res.records)))
    assert small + limit // 2 // size <= len(res.records), len(res.records)  # (cut at the
    # records' average size: the small ones make it low)
    assert sum(len(r.value or b"") for r in res.records) <= limit


def test_fetch_bounded_sizes_its_first_read_by_the_size_given_up_to_first_read(
    topics: Topics, producer: Producer, redis_client: Any, namespace: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The gateway's read of a partition: with no size, one record and then steps; with the
    size its records had, the first read asks for what fits, at most ``first_read``."""
    topics.create("t", 1)
    _big_records(producer, 1, 12, 100 * KIB)
    pipelines = _counts_asked(monkeypatch)
    res = fetch_module.fetch_bounded(redis_client, namespace, "t", 0, 0, 500, 350 * KIB)
    assert pipelines == [[1], [2]] and [r.offset for r in res.records] == [0, 1, 2]
    size = -(-res.read_bytes // len(res.records))
    pipelines.clear()
    res = fetch_module.fetch_bounded(redis_client, namespace, "t", 0, 3, 500, 350 * KIB,
                                     record_bytes=size)
    assert pipelines == [[3]] and [r.offset for r in res.records] == [3, 4, 5]
    pipelines.clear()
    res = fetch_module.fetch_bounded(redis_client, namespace, "t", 0, 3, 500, 350 * KIB,
                                     record_bytes=size, first_read=2)
    assert pipelines == [[2], [1]] and [r.offset for r in res.records] == [3, 4, 5]
    with pytest.raises(InvalidRequestError, match="first_read must be >= 1, got 0"):
        fetch_module.fetch_bounded(redis_client, namespace, "t", 0, 0, 500, 1, first_read=0)
    with pytest.raises(InvalidRequestError, match="max_bytes must be >= 1, got 0"):
        fetch_module.fetch_bounded(redis_client, namespace, "t", 0, 0, 500, 0)


def test_a_read_cut_to_the_limits_is_cut_at_its_records_own_sizes(
    topics: Topics, producer: Producer, redis_client: Any, namespace: str
) -> None:
    """A read sized by a small record size finds five records of 400 kB before small ones:
    what is kept fits the partition's bound, and ``read_bytes`` says what it weighs. Cut at
    the records' average size, 88 records were kept, 2 MB of values for a bound of 1 MiB,
    answered as 1 MB (the next read sized by 12 kB a record, the partitions after it given
    what that left): here, a fetch of max_bytes 1.5 MiB kept 4 MB of two partitions."""
    topics.create("t", 2)
    for p in range(2):
        producer.send_batch("t", [ProducerRecord(b"b" * 400_000, partition=p)
                                  for _ in range(5)])
        producer.send_batch("t", [ProducerRecord(b"s" * 100, partition=p) for _ in range(300)])
    reads = [("t", 0, 0), ("t", 1, 0)]
    got = fetch_module.fetch_many_as(redis_client, namespace, reads, 500, ConsumerRecord,
                                     max_bytes=1536 * KIB, partition_max_bytes=1024 * KIB,
                                     record_bytes=[120, 120])
    values = [sum(len(r.value or b"") for r in a.records) for a in got]
    assert values == [800_000, 400_000], values
    assert all(a.read_bytes >= v for a, v in zip(got, values, strict=True))
    assert [[r.offset for r in a.records] for a in got] == [[0, 1], [0]]


@pytest.mark.parametrize(("bounds", "message"), [
    ({"max_bytes": 0}, "max_bytes must be >= 1, got 0"),
    ({"partition_max_bytes": -1}, "partition_max_bytes must be >= 1, got -1"),
    ({"record_bytes": [1, 2]}, "record_bytes must give one size per read: 2 for 1 reads"),
    ({"record_bytes": [-1]}, "record_bytes must be >= 0, got -1"),
])
def test_fetch_byte_limits_are_checked(redis_client: Any, namespace: str, bounds: Any,
                                       message: str) -> None:
    with pytest.raises(InvalidRequestError, match=message):
        fetch_module.fetch_many_as(redis_client, namespace, [("t", 0, 0)], 10, ConsumerRecord,
                                   **bounds)
    with pytest.raises(InvalidRequestError, match="max_bytes must be >= 1, got 0"):
        fetch(redis_client, namespace, "t", 0, 0, max_bytes=0)


def test_fetch_many_as_builds_consumer_records_equal_to_constructed_ones(
    topics: Topics, producer: Producer, redis_client: Any, namespace: str
) -> None:
    """Every entry layout (value only, key only, key and headers, empty value, nothing) decoded
    straight into ConsumerRecords: equal to constructed ones, same repr, fields, vars, frozen."""
    topics.create("t", 2)
    metas = producer.send_batch("t", [
        ProducerRecord(b"v0", partition=1),
        ProducerRecord(None, key=b"k1", partition=1),
        ProducerRecord(b"v2", key=b"", headers={"a": b"\x00", "b": b""}, partition=1),
        ProducerRecord(b"", partition=1),
        ProducerRecord(None, partition=1),
    ])
    (res,) = fetch_module.fetch_many_as(redis_client, namespace, [("t", 1, 0)], 10, ConsumerRecord)
    want = [
        ConsumerRecord("t", 1, 0, None, b"v0", {}, metas[0].timestamp_ms),
        ConsumerRecord("t", 1, 1, b"k1", None, {}, metas[1].timestamp_ms),
        ConsumerRecord("t", 1, 2, b"", b"v2", {"a": b"\x00", "b": b""}, metas[2].timestamp_ms),
        ConsumerRecord("t", 1, 3, None, b"", {}, metas[3].timestamp_ms),
        ConsumerRecord("t", 1, 4, None, None, {}, metas[4].timestamp_ms),
    ]
    assert (res.error, res.log_start_offset, res.log_end_offset) == (Errors.NONE, 0, 5)
    assert res.records == want
    assert [repr(r) for r in res.records] == [repr(r) for r in want]
    assert [vars(r) for r in res.records] == [vars(r) for r in want]
    assert [dataclasses.astuple(r) for r in res.records] == [dataclasses.astuple(r) for r in want]
    assert all(type(r) is ConsumerRecord for r in res.records)
    assert res.records[0].topic_partition == ("t", 1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        res.records[0].offset = 5  # type: ignore[misc]
    # The Record path decodes the same entries to the same fields.
    plain = fetch(redis_client, namespace, "t", 1, 0).records
    assert [("t", 1, *dataclasses.astuple(r)) for r in plain] == [
        dataclasses.astuple(r) for r in want
    ]


def test_fetch_many_as_refuses_a_record_type_of_another_shape(
    topics: Topics, redis_client: Any, namespace: str
) -> None:
    topics.create("t", 1)
    with pytest.raises(TypeError, match="fields"):
        fetch_module.fetch_many_as(redis_client, namespace, [("t", 0, 0)], 10, Record)


def test_flat_and_paired_entries_decode_alike(single_client: Any, namespace: str) -> None:
    """The flat entries a callback-free read gets, the paired ones of ``client.xrange``, and a
    reply whose ids are not consecutive (parsed id by id): the same Records."""
    Topics(single_client, namespace).create("t", 1)
    Producer(single_client, namespace).send_batch("t", [
        ProducerRecord(b"v%d" % i, key=b"k" if i % 2 else None,
                       headers={"h": b"%d" % i} if i % 3 == 0 else None, partition=0)
        for i in range(9)
    ])
    key = partition_key(namespace, "t", 0)
    paired = single_client.xrange(key, "-", "+")
    flat = [[e_id, [x for kv in fields.items() for x in kv]] for e_id, fields in paired]
    want = _decode.decode_entries(paired)
    assert [r.offset for r in want] == list(range(9))
    assert _decode.decode_entries(flat) == want
    gappy = flat[:3] + flat[5:]
    assert _decode.decode_entries(gappy) == want[:3] + want[5:]
    assert fetch(single_client, namespace, "t", 0, 0).records == want


_NOT_RECORDS = [
    pytest.param(["v", b"a"], "it has no t (timestamp) field", id="no-t"),
    pytest.param(["x", b"1", "v", b"a"], "it has no t (timestamp) field", id="t-renamed"),
    pytest.param(["t", b"1.5", "v", b"a"], "field is b'1.5', not an integer", id="t-float"),
    pytest.param(["t", b"1", "h", b"\xc1"], "its h (headers) field is not msgpack",
                 id="h-not-msgpack"),
    pytest.param(["t", b"1", "h", msgpack.packb(5)], "holds 5", id="h-int"),
    pytest.param(["t", b"1", "h", msgpack.packb({"a": b"b"})], "holds {'a': b'b'}",
                 id="h-map"),
    pytest.param(["t", b"1", "h", msgpack.packb([["a", "text"]])], "holds (('a', 'text'),)",
                 id="h-text-value"),
    pytest.param(["t", b"1", "h", msgpack.packb([[b"a", b"b"]], use_bin_type=True)],
                 "holds ((b'a', b'b'),)", id="h-bytes-name"),
    pytest.param(["t", b"1", "h", msgpack.packb([["a"]])], "holds (('a',),)", id="h-single"),
]


@pytest.mark.parametrize(("fields", "why"), _NOT_RECORDS)
def test_an_entry_that_is_not_a_record_is_named_not_misread(
    redis_client: Any, namespace: str, topics: Topics, producer: Producer, fields: list[Any],
    why: str,
) -> None:
    """An entry added with XADD by hand is a TopicError naming its offset and what is wrong
    (the records before it still read; the several-partition fetches answer it for its
    partition, tests/test_topics_corrupt.py): it escaped as a bare KeyError, ValueError,
    TypeError or msgpack error, or read as a wrong record (``x 1 v a``: timestamp 1 from ``x``;
    headers of a map, of text values or of bytes names, of the wrong types)."""
    topics.create("t", 1)
    producer.send_batch("t", [ProducerRecord(b"ok", partition=0)])
    redis_client.execute_command("XADD", partition_key(namespace, "t", 0), "0-*", *fields)
    assert [r.value for r in fetch(redis_client, namespace, "t", 0, 0).records] == [b"ok"]
    with pytest.raises(TopicError) as caught:
        fetch(redis_client, namespace, "t", 0, 1)
    assert caught.value.error == Errors.UNKNOWN_SERVER_ERROR
    for text in (str(caught.value), *(
            got[0].detail for got in (
                fetch_module.fetch_many(redis_client, namespace, [("t", 0, 1)]),
                fetch_module.fetch_many_as(redis_client, namespace, [("t", 0, 1)], 9,
                                           ConsumerRecord, max_bytes=1 << 20)))):
        assert "entry at offset 1 (id 0-2) is not a record" in text
        assert why in text and "delete_records" in text
    topics.delete_records("t", {0: 2})  # (what the message says to do)
    assert fetch(redis_client, namespace, "t", 0, 2).records == []


def test_records_before_an_entry_that_is_not_a_record_are_answered(
    redis_client: Any, namespace: str, topics: Topics, producer: Producer
) -> None:
    """A read that meets an entry that is not a record after some records answers those (and
    the other partitions'), as Kafka's consumer returns the records before a corrupt one; only
    a read that begins at it answers an error (for that partition). The whole call raised
    before, so those records could only be skipped with the entry (delete_records, or a seek
    past it), and a consumer never had them."""
    topics.create("t", 2)
    producer.send_batch("t", [ProducerRecord(b"a", partition=0), ProducerRecord(b"b", partition=0),
                              ProducerRecord(b"c", partition=1)])
    redis_client.execute_command("XADD", partition_key(namespace, "t", 0), "0-*", "x", "1")
    producer.send("t", b"d", partition=0)
    reads = [("t", 0, 0), ("t", 1, 0)]
    for got in (fetch_module.fetch_many(redis_client, namespace, reads),
                fetch_module.fetch_many_as(redis_client, namespace, reads, 9, ConsumerRecord,
                                           max_bytes=1 << 20),
                fetch_module.fetch_many_as(redis_client, namespace, reads, 9, ConsumerRecord,
                                           max_bytes=1 << 20, record_bytes=[10, 10])):
        assert [[r.value for r in a.records] for a in got] == [[b"a", b"b"], [b"c"]]
        assert [(a.error, a.log_end_offset) for a in got] == [(Errors.NONE, 4), (Errors.NONE, 1)]
    assert [r.value for r in fetch(redis_client, namespace, "t", 0, 1).records] == [b"b"]
    got = fetch_module.fetch_many(redis_client, namespace, [("t", 0, 2), ("t", 1, 0)])
    assert [(a.error, len(a.records)) for a in got] == [(Errors.UNKNOWN_SERVER_ERROR, 0),
                                                         (Errors.NONE, 1)]
    assert "entry at offset 2 (id 0-3) is not a record" in got[0].detail


def test_entries_of_unknown_fields_and_ids_not_rcoords() -> None:
    """Fields of other names are ignored; an id not of the form 0-<offset + 1> (an XADD by
    hand: "5-3" was read as offset 2) is a CorruptEntry."""
    entries = [[b"0-1", [b"t", b"7", b"v", b"a", b"zz", b"q"]]]
    assert _decode.decode_entries(entries) == [Record(0, None, b"a", {}, 7)]
    for ids in ([b"5-3"], [b"0-1", b"5-3"]):
        with pytest.raises(_decode.CorruptEntry, match="its id is not 0-<offset"):
            _decode.decode_entries([[i, [b"t", b"7", b"v", b"a"]] for i in ids])


def _after_a_foreign_last_id(redis_client: Any, namespace: str, topics: Topics,
                             producer: Producer, calls: list[Callable[[], object]]) -> None:
    """Topic t (one partition, one record) whose stream then gets an XADD with an id of its
    own (``*``: milliseconds), leaving a last id that is not 0-<seq>: each of ``calls`` raises
    a TopicError (UNKNOWN_SERVER_ERROR) saying what happened and what mends it; then t is
    deleted and created again."""
    topics.create("t", 1)
    producer.send_batch("t", [ProducerRecord(b"ok", partition=0)])
    redis_client.execute_command("XADD", partition_key(namespace, "t", 0), "*", "t", 1)
    for call in calls:
        with pytest.raises(TopicError, match="not 0-<offset \\+ 1> as rcoord's") as caught:
            call()
        assert caught.value.error == Errors.UNKNOWN_SERVER_ERROR
        assert "delete and re-create the topic" in str(caught.value)
    topics.delete("t")
    topics.create("t", 1)


def test_a_stream_whose_last_id_is_not_rcoords_is_a_topic_error(
    redis_client: Any, namespace: str, topics: Topics, producer: Producer
) -> None:
    """The log offsets script answered without its log end, and fetch and log_offsets crashed
    with an IndexError. (``fetch_many`` answers it for its partition alone:
    tests/test_topics_corrupt.py.)"""
    _after_a_foreign_last_id(redis_client, namespace, topics, producer, [
        lambda: fetch(redis_client, namespace, "t", 0, 0),
        lambda: log_offsets(redis_client, namespace, "t", 0)])
    assert fetch(redis_client, namespace, "t", 0, 0).log_end_offset == 0


def test_appends_and_admin_calls_on_a_stream_whose_last_id_is_not_rcoords_say_so(
    redis_client: Any, namespace: str, topics: Topics, producer: Producer
) -> None:
    """Every ``XADD 0-*`` is refused there: sends of every kind failed with the server's bare
    ResponseError ("The ID specified in XADD is equal or smaller ..."), and
    ``describe`` with the log offsets' refusal as a raw ResponseError (``describe`` and
    ``delete_records`` now answer it for that partition, with that detail:
    tests/test_topic_offsets_each.py, tests/test_delete_records.py);
    an idempotent producer's next sends still go through once the topic is re-created."""
    plain = Producer(redis_client, namespace, idempotent=False)

    def described() -> None:
        info = topics.describe("t").partitions[0]
        raise TopicError(info.error, info.detail)

    _after_a_foreign_last_id(redis_client, namespace, topics, producer, [
        lambda: producer.send("t", b"x", partition=0),
        lambda: plain.send("t", b"x", partition=0),
        lambda: append_idempotent(redis_client, namespace, "t", 0, [b"x"],
                                  producer_id="kafka-7", producer_epoch=0, base_sequence=0),
        described])
    assert producer.send("t", b"y", partition=0).offset == 0


@pytest.mark.parametrize("fields", [["v", b"a"], ["t", b"abc", "v", b"a"]],
                         ids=["no-t", "t-not-a-number"])
def test_offsets_for_times_names_an_entry_with_no_timestamp(
    redis_client: Any, namespace: str, topics: Topics, producer: Producer, fields: list[Any]
) -> None:
    """The search by time that probes an entry added by hand with no integer ``t`` is a
    TopicError naming it, not a bare Lua error (comparing nil with a number)."""
    topics.create("t", 1)
    producer.send_batch("t", [ProducerRecord(b"ok", partition=0)])
    redis_client.execute_command("XADD", partition_key(namespace, "t", 0), "0-*", *fields)
    producer.send_batch("t", [ProducerRecord(b"ok", partition=0)])
    with pytest.raises(TopicError, match="the entry at offset 1 is not a record") as caught:
        offsets_for_times(redis_client, namespace, {("t", 0): 1})  # (probes offset 1 first)
    assert caught.value.error == Errors.UNKNOWN_SERVER_ERROR
    assert "delete_records to offset 2" in str(caught.value)


@pytest.mark.parametrize("fields", [["v", b"a"], ["t", b"abc", "v", b"a"]],
                         ids=["no-t", "t-not-a-number"])
def test_retention_by_age_names_an_entry_with_no_timestamp(
    redis_client: Any, namespace: str, topics: Topics, fields: list[Any]
) -> None:
    """Retention by age that probes an entry added by hand with no integer ``t`` is a
    TopicError naming it: one whose ``t`` is not a number failed with a bare Lua error, and one
    with no ``t`` was taken for a kept record, so retention stopped there for good (the expired
    record after it stayed) without a word. The records either side are expired (``t`` 1)."""
    topics.create("t", 1, retention_ms=1000)
    key = partition_key(namespace, "t", 0)
    for written in (["t", 1, "v", b"old"], fields, ["t", 1, "v", b"old"]):
        redis_client.execute_command("XADD", key, "0-*", *written)
    with pytest.raises(TopicError, match="the entry at offset 1 is not a record") as caught:
        topics.apply_retention("t")  # (probes the head, then offset 1)
    assert caught.value.error == Errors.UNKNOWN_SERVER_ERROR
    assert "delete_records to offset 2" in str(caught.value)
    topics.delete_records("t", {0: 2})  # (what the message says to do)
    assert topics.apply_retention("t") == {0: 3}


def test_fetch_many_over_resp3(redis_server: Any, namespace: str) -> None:
    """RESP3 replies (XINFO STREAM as a map) decode as RESP2 ones do."""
    resp2, resp3 = redis_server.client(), redis_server.client(protocol=3)
    try:
        Topics(resp2, namespace).create("t", 2)
        Producer(resp2, namespace).send_batch("t", [
            ProducerRecord(b"v%d" % i, key=b"k" if i % 2 else None, partition=i % 2)
            for i in range(6)
        ])
        reads = [("t", 0, 1), ("t", 1, 0), ("t", 1, 7), ("t", 2, 0)]
        got = fetch_module.fetch_many(resp3, namespace, reads)
        assert got == fetch_module.fetch_many(resp2, namespace, reads)
        assert [r.error for r in got] == [Errors.NONE, Errors.NONE, Errors.OFFSET_OUT_OF_RANGE,
                                          Errors.UNKNOWN_TOPIC_OR_PARTITION]
        assert [r.value for r in got[0].records] == [b"v2", b"v4"]
        # A read of no records (XRANGE COUNT 0: a null reply) for a share too small for one.
        bounded = fetch_module.fetch_many_as(resp3, namespace, reads[:2], 500, ConsumerRecord,
                                             max_bytes=1, record_bytes=[100, 100])
        assert [(len(a.records), a.error, a.log_end_offset) for a in bounded] == [
            (1, Errors.NONE, 3), (0, Errors.NONE, 3)]
    finally:
        resp2.close()
        resp3.close()


def test_a_wake_whose_connection_close_tore_down_ends_quietly() -> None:
    """``wake()`` runs ``CLIENT UNBLOCK`` on a thread of its own while a consumer's close may
    disconnect the pool under it: redis-py then raised TypeError (a connection whose socket
    was already None), which ended the close thread with an exception that failed a later
    test under ``filterwarnings = error``. The unblock is best effort: the wake ends quietly."""
    from rcoord.topics.fetch import FetchWaker

    class TornDown:
        calls = 0

        def client_unblock(self, conn_id: int) -> bool:
            TornDown.calls += 1
            raise TypeError("argument must be an int, or have a fileno() method.")

    waker = FetchWaker()
    waker._parked = (TornDown(), 7)  # type: ignore[assignment]
    waker.wake()
    assert waker.woken and TornDown.calls == 1
