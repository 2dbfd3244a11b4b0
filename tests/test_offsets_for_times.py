"""offsets_for_times: the first offset at or after a timestamp, on one node and on a cluster.

Records are stamped with a test clock (the idempotent producer's injected ``clock``), so the
timestamps are known; every answer is checked against a linear scan of the partition.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from rcoord import Errors, InvalidRequestError
from rcoord.topics import (
    OffsetAndTimestamp,
    Producer,
    ProducerRecord,
    TopicError,
    Topics,
    fetch,
    offsets_for_times,
)
from rcoord.topics._base import last_timestamp_key


class Clock:
    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        return self.now


def append_at(producer: Producer, clock: Clock, topic: str, partition: int,
              stamps: list[int]) -> None:
    """One record per stamp, each appended with the clock at that stamp."""
    for ts in stamps:
        clock.now = ts
        producer.send_batch(topic, [ProducerRecord(f"at {ts}".encode(), partition=partition)])


@pytest.fixture
def setup(redis_client: Any, namespace: str) -> tuple[Topics, Producer, Clock]:
    clock = Clock()
    return Topics(redis_client, namespace), Producer(redis_client, namespace, clock=clock), clock


def test_first_offset_at_or_after_each_timestamp(setup, redis_client, namespace):
    topics, producer, clock = setup
    topics.create("t", 1)
    append_at(producer, clock, "t", 0, [1000, 1000, 2000, 3000, 3000, 5000])
    want = {
        0: (0, 1000), 1000: (0, 1000), 1001: (2, 2000), 2000: (2, 2000), 2500: (3, 3000),
        3000: (3, 3000), 3001: (5, 5000), 5000: (5, 5000),
    }
    for ts, (offset, stamp) in want.items():
        got = offsets_for_times(redis_client, namespace, {("t", 0): ts})
        assert got[("t", 0)] == OffsetAndTimestamp(offset, stamp), ts
    # Nothing that recent: None, as Kafka answers null.
    assert offsets_for_times(redis_client, namespace, {("t", 0): 5001}) == {("t", 0): None}


def test_matches_a_linear_scan_on_a_long_partition(setup, redis_client, namespace):
    topics, producer, clock = setup
    topics.create("t", 1)
    rng = random.Random(7)
    stamps, ts = [], 10_000
    for _ in range(300):
        ts += rng.choice([0, 0, 1, 3, 50])
        stamps.append(ts)
    for i in range(0, len(stamps), 7):  # an append's records share its stamp: the batch's last
        batch = stamps[i:i + 7]
        clock.now = batch[-1]
        producer.send_batch("t", [ProducerRecord(b"x", partition=0) for _ in batch])
    records = fetch(redis_client, namespace, "t", 0, 0, max_records=1000).records
    assert len(records) == 300
    for target in sorted({s + d for s in stamps for d in (-1, 0, 1)} | {0, ts + 1_000}):
        want = next((OffsetAndTimestamp(r.offset, r.timestamp_ms) for r in records
                     if r.timestamp_ms >= target), None)
        got = offsets_for_times(redis_client, namespace, {("t", 0): target})[("t", 0)]
        assert got == want, target


def test_many_partitions_and_topics_in_one_call(setup, redis_client, namespace):
    topics, producer, clock = setup
    topics.create("a", 4)
    topics.create("b", 2)
    for p in range(4):
        append_at(producer, clock, "a", p, [100 * (p + 1), 100 * (p + 2)])
    append_at(producer, clock, "b", 0, [50])
    got = offsets_for_times(redis_client, namespace,
                            {("a", p): 250 for p in range(4)} | {("b", 0): 10, ("b", 1): 10})
    assert got == {
        ("a", 0): None,                          # 100, 200
        ("a", 1): OffsetAndTimestamp(1, 300),    # 200, 300
        ("a", 2): OffsetAndTimestamp(0, 300),    # 300, 400
        ("a", 3): OffsetAndTimestamp(0, 400),    # 400, 500
        ("b", 0): OffsetAndTimestamp(0, 50),
        ("b", 1): None,                          # empty
    }
    assert offsets_for_times(redis_client, namespace, {}) == {}


def test_records_removed_by_retention_are_not_searched(redis_client, namespace):
    clock = Clock()
    topics = Topics(redis_client, namespace)
    producer = Producer(redis_client, namespace, clock=clock)
    topics.create("t", 1, retention_records=3)
    append_at(producer, clock, "t", 0, [10, 20, 30, 40, 50, 60])
    assert topics.apply_retention("t") == {0: 3}
    got = offsets_for_times(redis_client, namespace, {("t", 0): 0})
    assert got == {("t", 0): OffsetAndTimestamp(3, 40)}  # the log start, not offset 0
    assert offsets_for_times(redis_client, namespace, {("t", 0): 55}) == {
        ("t", 0): OffsetAndTimestamp(5, 60)}


def test_unknown_partition_and_negative_timestamp(setup, redis_client, namespace):
    topics, _, _ = setup
    topics.create("t", 1)
    with pytest.raises(TopicError) as err:
        offsets_for_times(redis_client, namespace, {("t", 0): 0, ("t", 1): 0})
    assert err.value.error == Errors.UNKNOWN_TOPIC_OR_PARTITION and "t-1" in str(err.value)
    with pytest.raises(TopicError):
        offsets_for_times(redis_client, namespace, {("nope", 0): 0})
    with pytest.raises(InvalidRequestError, match="timestamp of t-0 must be >= 0"):
        offsets_for_times(redis_client, namespace, {("t", 0): -1})


def test_a_clock_stepped_back_lowers_no_timestamp_and_hides_no_record(
        setup, redis_client, namespace):
    """The node's clock steps back (NTP, a failover to a node whose clock is behind): records
    carry max(clock, previous record's timestamp), so a partition's timestamps never decrease
    and the binary search finds the first record at or after any target, as Kafka's time index
    (the largest timestamp so far) does."""
    topics, producer, clock = setup
    topics.create("t", 1)
    stamped = []
    for ts in (1000, 2000, 500, 600, 3000):  # stepped back after offset 1
        clock.now = ts
        stamped.append(producer.send("t", b"at %d" % ts, partition=0).timestamp_ms)
    assert stamped == [1000, 2000, 2000, 2000, 3000]
    records = fetch(redis_client, namespace, "t", 0, 0).records
    assert [r.timestamp_ms for r in records] == [1000, 2000, 2000, 2000, 3000]
    assert offsets_for_times(redis_client, namespace, {("t", 0): 1500}) == {
        ("t", 0): OffsetAndTimestamp(1, 2000)}
    for target in range(0, 3200, 100):
        want = next((OffsetAndTimestamp(r.offset, r.timestamp_ms) for r in records
                     if r.timestamp_ms >= target), None)
        assert offsets_for_times(redis_client, namespace, {("t", 0): target}) == {
            ("t", 0): want}, target
    # The plain append script stamps the same way: after a record stamped far ahead of the
    # node's TIME, a record appended by TIME carries that later timestamp.
    clock.now = 10**13
    producer.send("t", b"ahead", partition=0)
    plain = Producer(redis_client, namespace, idempotent=False)
    assert plain.send("t", b"plain", partition=0).timestamp_ms == 10**13
    assert fetch(redis_client, namespace, "t", 0, 6).records[0].timestamp_ms == 10**13
    # A partition an older rcoord appended to has no recorded last timestamp: the last
    # record's is read instead.
    redis_client.delete(last_timestamp_key(namespace, "t", 0))
    clock.now = 5000
    assert producer.send("t", b"behind", partition=0).timestamp_ms == 10**13
    mark = redis_client.get(last_timestamp_key(namespace, "t", 0)).split()  # (and the end)
    assert [int(n) for n in mark] == [10**13, 8]  # kept now
