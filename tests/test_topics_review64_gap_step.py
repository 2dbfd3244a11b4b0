"""A byte-bounded read (``_fetch_bounded``) whose step begins at a gap: entries removed from a
stream's middle by hand (XDEL) right after the records its earlier reads gave. A read that
starts before a gap reads across it (as Kafka's fetch skips the offsets compaction removed);
a step, which reads on from past the last record read, is the same read continued, so it
reads across the gap too. It stopped there (the step was answered UNKNOWN_SERVER_ERROR, as a
read that starts at a gap is, and its records dropped), so the answer ended before the gap
and the caller's next read, starting at it, failed. Real servers (the ``env`` fixture of
test_consumer: one node and the cluster)."""

from __future__ import annotations

import importlib
from typing import Any

import test_consumer
from test_client_group import WAIT_S
from test_topics_corrupt import _gap_in_p0
from test_topics_xdel_start import _records_with_xdel

from rcoord import Errors, TopicPartition
from rcoord.client.consumer import ConsumerRecord
from rcoord.topics import TopicError

fetch_module = importlib.import_module("rcoord.topics.fetch")  # (`fetch` is the function)
env = test_consumer.env

WANT = [(0, b"a0"), (1, b"a1"), (4, b"a4"), (5, b"a5"), (6, b"a6")]
"""Offsets 0 to 6 with 2 and 3 removed."""


def test_a_step_that_begins_at_a_gap_reads_across_it(env: Any) -> None:
    """A first read of two records (0 and 1, sized by ``record_bytes`` and ``first_read``)
    then a step from 2, removed: the step reads 4 on, as one read from 0 would. It answered
    0 and 1 alone."""
    _records_with_xdel(env, 7, [2, 3])
    one = fetch_module.fetch_bounded(env.client, env.namespace, "t", 0, 0, 100, 1 << 20,
                                     record_bytes=20, first_read=2)
    assert [(r.offset, r.value) for r in one.records] == WANT
    assert (one.error, one.log_end_offset) == (Errors.NONE, 7)


def test_a_consumers_step_that_begins_at_a_gap_reads_across_it(env: Any) -> None:
    """The consumer's read (``fetch_many_as``), whose first read a ``record_bytes`` of half
    the bound sizes to two records: the step from 2 reads 4 on."""
    _records_with_xdel(env, 7, [2, 3])
    (many,) = fetch_module.fetch_many_as(env.client, env.namespace, [("t", 0, 0)], 100,
                                         ConsumerRecord, max_bytes=1 << 20,
                                         record_bytes=[1 << 19])
    assert many.error == Errors.NONE
    assert [(r.offset, r.value) for r in many.records] == WANT


def test_a_read_that_begins_at_a_gap_still_says_where_to_seek(env: Any) -> None:
    """Where the caller's own offset is removed, the read is still refused for that
    partition with ``next_offset`` (``_unmatched``, by design): only a step continues."""
    _records_with_xdel(env, 7, [2, 3])
    (got,) = fetch_module.fetch_many(env.client, env.namespace, [("t", 0, 2)],
                                     max_bytes=1 << 20)
    assert (got.error, got.next_offset, got.records) == (Errors.UNKNOWN_SERVER_ERROR, 4, [])
    try:
        fetch_module.fetch_bounded(env.client, env.namespace, "t", 0, 2, 100, 1 << 20)
    except TopicError as exc:
        assert exc.error == Errors.UNKNOWN_SERVER_ERROR
    else:
        raise AssertionError("a read at a gap answered records")



def test_a_consumer_before_a_gap_reads_across_it(env: Any) -> None:
    """A consumer positioned at 1 (two partitions, t-0's offset 2 removed): its fetch reads 1
    and, by a step, 3 (its first read of a partition of unknown record size asks for one
    record), so every record comes and no poll raises. It got 1, then its next poll, at 2,
    raised CorruptRecordError as for a read that begins at a gap."""
    _gap_in_p0(env)
    consumer = env.consumer(enable_auto_commit=False, topics=[], start_offset="earliest")
    consumer.assign([TopicPartition("t", 0), TopicPartition("t", 1)])
    consumer.seek(TopicPartition("t", 0), 1)
    values: list[bytes] = []
    for _ in range(20):  # (a poll may end before its fetch is answered)
        values += [r.value for r in consumer.poll(WAIT_S)]
        if len(values) >= 3:
            break
    assert sorted(values) == [b"a1", b"a3", b"c"]
    assert consumer.position(TopicPartition("t", 0)) == 4
