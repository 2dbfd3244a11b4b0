"""A partition that cannot be read (a stream entry added with XADD by hand, a stream whose last
id is not rcoord's) is answered with an error for that partition alone, as Kafka's Fetch
answers errors per partition; the Consumer raises it as a ``CorruptRecordError`` naming the
partition and offset, after handing out the other partitions' records. Before, one such
partition raised TopicError for the whole ``fetch_many`` call, so every partition read with it
stalled for as long as the entry was there. Real servers (the ``env`` fixture of
test_consumer)."""

from __future__ import annotations

import concurrent.futures
import importlib
import pickle
from typing import Any

import pytest
import test_consumer
from harness import this_threads, wait_until
from test_client_group import WAIT_S

from rcoord import Errors, TopicPartition
from rcoord.client.consumer import ConsumerRecord
from rcoord.topics import CorruptRecordError, ProducerRecord, TopicError, partition_key

fetch_module = importlib.import_module("rcoord.topics.fetch")  # (`fetch` is the function)
env = test_consumer.env
TP = TopicPartition


def _corrupt_p0(env: Any) -> None:
    """Topic t of 2 partitions: t-0 holds a record, then an entry that is not a record (offset
    1), then another record; t-1 holds two records."""
    env.topics.create("t", 2)
    env.producer.send_batch("t", [ProducerRecord(b"a", partition=0),
                                  ProducerRecord(b"c", partition=1),
                                  ProducerRecord(b"d", partition=1)])
    env.client.execute_command("XADD", partition_key(env.namespace, "t", 0), "0-*", "x", "1")
    env.producer.send("t", b"b", partition=0)


@pytest.mark.parametrize("bounded", [False, True], ids=["unbounded", "bytes"])
def test_fetch_many_answers_an_unreadable_partition_alone(env: Any, bounded: bool) -> None:
    """t-0 read at the entry answers UNKNOWN_SERVER_ERROR with the log offsets and a detail
    naming the entry and the fix; t-1 is answered its records."""
    _corrupt_p0(env)
    kw: dict[str, Any] = {"max_bytes": 1 << 20} if bounded else {}
    reads = [("t", 0, 1), ("t", 1, 0)]
    for got in (fetch_module.fetch_many(env.client, env.namespace, reads, **kw),
                fetch_module.fetch_many_as(env.client, env.namespace, reads, 9, ConsumerRecord,
                                           **kw)):
        assert [[r.value for r in a.records] for a in got] == [[], [b"c", b"d"]]
        assert [(a.error, a.log_start_offset, a.log_end_offset) for a in got] == [
            (Errors.UNKNOWN_SERVER_ERROR, 0, 3), (Errors.NONE, 0, 2)]
        assert "entry at offset 1 (id 0-2) is not a record" in got[0].detail
        assert "delete_records" in got[0].detail and got[1].detail == ""


def test_fetch_many_answers_a_stream_whose_last_id_is_not_rcoords_alone(env: Any) -> None:
    """The log offsets script refuses such a stream: that partition is UNKNOWN_SERVER_ERROR
    (offsets -1) saying what mends it, and the other partition is read."""
    env.topics.create("t", 2)
    env.producer.send_batch("t", [ProducerRecord(b"c", partition=1)])
    env.client.execute_command("XADD", partition_key(env.namespace, "t", 0), "*", "t", 1)
    got = fetch_module.fetch_many(env.client, env.namespace, [("t", 0, 0), ("t", 1, 0)])
    assert [(a.error, a.log_end_offset) for a in got] == [
        (Errors.UNKNOWN_SERVER_ERROR, -1), (Errors.NONE, 1)]
    assert [r.value for r in got[1].records] == [b"c"]
    assert "delete and re-create the topic" in got[0].detail


def test_the_consumer_raises_a_corrupt_record_error_after_the_other_records(env: Any) -> None:
    """As Kafka's consumer ("please seek past the record to continue consumption"): the records
    before the entry and the other partition's come first, then poll() raises
    CorruptRecordError naming t-0 and offset 1, again while the position stays there; a seek
    past it goes on. Before, every poll() raised a TopicError of the whole fetch, and t-1's
    records never came."""
    _corrupt_p0(env)
    consumer = env.consumer(enable_auto_commit=False, topics=[], start_offset="earliest")
    consumer.assign([TP("t", 0), TP("t", 1)])
    values: list[bytes] = []
    with pytest.raises(CorruptRecordError) as caught:
        for _ in range(20):  # (a poll may end before its fetch is answered)
            values += [r.value for r in consumer.poll(WAIT_S)]
    assert sorted(values) == [b"a", b"c", b"d"]
    err = caught.value
    assert (err.topic, err.partition, err.offset, err.error) == (
        "t", 0, 1, Errors.UNKNOWN_SERVER_ERROR)
    assert "t-0 cannot be read at offset 1" in str(err) and "seek(" in str(err)
    assert "entry at offset 1 (id 0-2) is not a record" in str(err)
    copy = pickle.loads(pickle.dumps(err))
    assert (copy.topic, copy.partition, copy.offset, str(copy)) == ("t", 0, 1, str(err))
    with pytest.raises(CorruptRecordError):
        consumer.poll(WAIT_S)  # (the position is still at the entry)
    consumer.seek(TP("t", 0), 2)
    assert [r.value for r in consumer.poll(WAIT_S)] == [b"b"]


def test_an_entry_met_by_a_waiting_fetch_is_the_same_error(env: Any) -> None:
    """The consumer's fetch that waits at the log end (one partition, ``fetch`` with
    ``block_ms``) is woken by the entry: poll() raises CorruptRecordError for it too. Before,
    that one fetch's TopicError was raised by poll() as it was (a plain TopicError, once)."""
    env.topics.create("t", 1)
    env.producer.send("t", b"a", partition=0)
    consumer = env.consumer(enable_auto_commit=False, topics=[], start_offset="earliest",
                            fetch_max_wait_ms=20_000)
    consumer.assign([TP("t", 0)])
    assert [r.value for r in consumer.poll(WAIT_S)] == [b"a"]
    key = partition_key(env.namespace, "t", 0)
    node = env.client
    if hasattr(node, "get_node_from_key"):  # (a cluster: the partition's master)
        node = node.get_redis_connection(node.get_node_from_key(key))
    pool = concurrent.futures.ThreadPoolExecutor(1)
    try:
        polled = pool.submit(consumer.poll, 30)
        wait_until(lambda: int(node.info("clients")["blocked_clients"]) >= 1 or polled.done())
        env.client.execute_command("XADD", key, "0-*", "x", "1")
        with pytest.raises(CorruptRecordError) as caught:
            polled.result(30)
        assert (caught.value.partition, caught.value.offset) == (0, 1)
    finally:
        pool.shutdown(wait=True)


def test_a_pending_seek_to_beginning_of_an_unreadable_stream_stalls_no_other(env: Any) -> None:
    """seek_to_beginning() of t-0, whose stream's last id is not rcoord's, and of t-1: the
    log offsets of t-0 cannot be read, and poll() hands out t-1's record, then raises
    CorruptRecordError for t-0 (offset -1: no position yet) saying what mends it. Before, the
    read of both edges failed every fetch: each poll() raised, t-1's record never came."""
    env.topics.create("t", 2)
    env.producer.send("t", b"c", partition=1)
    env.client.execute_command("XADD", partition_key(env.namespace, "t", 0), "*", "t", 1)
    consumer = env.consumer(enable_auto_commit=False, topics=[])
    consumer.assign([TP("t", 0), TP("t", 1)])
    consumer.seek_to_beginning()
    values: list[bytes] = []
    with pytest.raises(CorruptRecordError) as caught:
        for _ in range(20):  # (a poll may end before its fetch is answered)
            values += [r.value for r in consumer.poll(WAIT_S)]
    assert values == [b"c"]
    assert (caught.value.partition, caught.value.offset) == (0, -1)
    assert "seek_to_beginning()" in str(caught.value)
    assert "delete and re-create the topic" in str(caught.value)


def test_the_warning_of_an_unreadable_partition_comes_once(
        env: Any, caplog: pytest.LogCaptureFixture) -> None:
    """Each fetch of the partition meets the entry again (a poll() loop that catches the error
    fetches it each time): its warning is logged once per position, not at every fetch."""
    env.topics.create("t", 1)
    consumer = env.consumer(enable_auto_commit=False, topics=[])
    consumer.assign([TP("t", 0)])
    answer = fetch_module.PartitionRecords([], 0, 3, Errors.UNKNOWN_SERVER_ERROR, detail="why")
    for _ in range(3):
        consumer._take(TP("t", 0), answer)
    consumer.seek(TP("t", 0), 2)
    consumer._take(TP("t", 0), answer)
    # (the records of the _take calls above: not another test's consumer's, of its own t-0)
    assert sum("fetch of t-0" in r.getMessage() for r in this_threads(caplog.records)) == 2


def _gap_in_p0(env: Any) -> None:
    """Topic t of 2 partitions: t-0 holds records at offsets 0 to 3 of which offset 2 was
    removed by hand (XDEL; rcoord removes records only from a log's start); t-1 holds one."""
    env.topics.create("t", 2)
    env.producer.send_batch("t", [*(ProducerRecord(b"a%d" % i, partition=0) for i in range(4)),
                                  ProducerRecord(b"c", partition=1)])
    env.client.execute_command("XDEL", partition_key(env.namespace, "t", 0), "0-3")


@pytest.mark.parametrize("bounded", [False, True], ids=["unbounded", "bytes"])
def test_fetch_many_answers_a_partition_with_a_gap_alone(env: Any, bounded: bool) -> None:
    """A read that begins at the removed offset finds entries that never fit the log offsets:
    that partition alone is UNKNOWN_SERVER_ERROR with a detail saying where to seek, and the
    other is answered its records. Before, the whole fetch_many raised TopicError
    (UNKNOWN_TOPIC_OR_PARTITION, "was replaced during each of 3 reads") for the existing
    partition, so every partition read with it got nothing for as long as the gap was there."""
    _gap_in_p0(env)
    kw: dict[str, Any] = {"max_bytes": 1 << 20} if bounded else {}
    got = fetch_module.fetch_many(env.client, env.namespace, [("t", 0, 2), ("t", 1, 0)], **kw)
    assert [(a.error, [r.value for r in a.records]) for a in got] == [
        (Errors.UNKNOWN_SERVER_ERROR, []), (Errors.NONE, [b"c"])]
    assert "from offset 2 (the first at offset 3)" in got[0].detail
    assert "XDEL" in got[0].detail and "seek to offset 3" in got[0].detail
    with pytest.raises(TopicError) as caught:  # (one partition: raised, as for an entry)
        fetch_module.fetch(env.client, env.namespace, "t", 0, 2)
    assert caught.value.error is Errors.UNKNOWN_SERVER_ERROR and "XDEL" in caught.value.detail


def test_the_consumer_raises_a_corrupt_record_error_at_a_gap(env: Any) -> None:
    """As for an entry that is not a record: positioned at the gap, t-1's records come, then
    poll() raises CorruptRecordError naming t-0 at offset 2; a seek to 3 reads on. (A consumer
    positioned before the gap reads across it, as one read does: test_topics_review64_gap_step.)
    """
    _gap_in_p0(env)
    consumer = env.consumer(enable_auto_commit=False, topics=[], start_offset="earliest")
    consumer.assign([TP("t", 0), TP("t", 1)])
    consumer.seek(TP("t", 0), 2)
    values: list[bytes] = []
    with pytest.raises(CorruptRecordError) as caught:
        for _ in range(20):  # (a poll may end before its fetch is answered)
            values += [r.value for r in consumer.poll(WAIT_S)]
    assert values == [b"c"]
    assert (caught.value.topic, caught.value.partition, caught.value.offset) == ("t", 0, 2)
    assert "seek to offset 3" in str(caught.value)
    consumer.seek(TP("t", 0), 3)
    assert [r.value for r in consumer.poll(WAIT_S)] == [b"a3"]
