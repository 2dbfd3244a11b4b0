"""Topics on Redis Streams: Kafka offsets, partitioning, fetch, blocking fetch and retention.

Every test that takes ``redis_client`` runs on one node and on a 3-master cluster.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import random
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis.cluster
from redis.backoff import NoBackoff
from redis.retry import Retry
from test_murmur2 import KEY_I_12_PARTITIONS

from rcoord import Errors, InvalidRequestError, RcoordError
from rcoord.partitioning import SLOTS, keyslot
from rcoord.topics import (
    FetchResult,
    Producer,
    ProducerRecord,
    Record,
    TopicError,
    Topics,
    fetch,
    fetch_many,
    log_offsets,
    partition_key,
    partition_tag,
    resolve_offset,
)
from rcoord.topics import admin as topics_admin
from rcoord.topics._base import (
    DELETE_RECORDS,
    MAKE,
    RETENTION,
    _run,
    last_timestamp_key_of,
    make_keys,
    producer_log_key,
)
from rcoord.topics.producer import MAX_REQUEST_SIZE_LIMIT
from rcoord.topics.times import OFFSET_FOR_TIME

WAIT_S = 15.0


@pytest.fixture
def topics(redis_client: Any, namespace: str) -> Topics:
    return Topics(redis_client, namespace)


@pytest.fixture
def producer(redis_client: Any, namespace: str) -> Producer:
    return Producer(redis_client, namespace)


@pytest.fixture
def pool() -> Iterator[concurrent.futures.ThreadPoolExecutor]:
    executor = concurrent.futures.ThreadPoolExecutor(max_workers=16)
    try:
        yield executor
    finally:
        executor.shutdown(wait=True, cancel_futures=True)


def wait_until(predicate: Callable[[], bool], timeout: float = WAIT_S) -> None:
    """Poll a server-side condition with a deadline (never a bare sleep-and-hope)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.005)


def server_ms(client: Any, key: str) -> int:
    """Redis TIME of the node that holds ``key``."""
    if isinstance(client, redis.cluster.RedisCluster):
        sec, usec = client.time(target_nodes=client.get_node_from_key(key))
    else:
        sec, usec = client.time()
    return int(sec) * 1000 + int(usec) // 1000


def blocked_clients(client: Any, key: str) -> int:
    if isinstance(client, redis.cluster.RedisCluster):
        info = client.info("clients", target_nodes=client.get_node_from_key(key))
    else:
        info = client.info("clients")
    return int(info["blocked_clients"])


def fetch_all(client: Any, ns: str, topic: str, partition: int, offset: int = 0) -> FetchResult:
    return fetch(client, ns, topic, partition, offset, max_records=100_000)


# -- admin ------------------------------------------------------------------------------------


def test_create_describe_list_delete(topics: Topics, redis_client: Any, namespace: str) -> None:
    assert topics.list() == []
    topics.create("orders", 3, retention_records=100)
    topics.create("payments", 1, retention_ms=60_000)
    assert topics.list() == ["orders", "payments"]
    desc = topics.describe("orders")
    assert desc.name == "orders"
    assert [(p.partition, p.log_start_offset, p.log_end_offset, p.error) for p in desc.partitions] == [
        (0, 0, 0, Errors.NONE), (1, 0, 0, Errors.NONE), (2, 0, 0, Errors.NONE)
    ]
    assert (desc.retention_records, desc.retention_ms) == (100, None)
    assert desc.created_ms > 0
    assert topics.describe("payments").retention_ms == 60_000
    assert topics.partition_count("orders") == 3

    topics.delete("orders")
    assert topics.list() == ["payments"]
    for p in range(3):
        assert not redis_client.exists(partition_key(namespace, "orders", p))
    with pytest.raises(TopicError) as err:
        topics.describe("orders")
    assert err.value.error == Errors.UNKNOWN_TOPIC_OR_PARTITION
    assert err.value.retriable
    with pytest.raises(TopicError) as err:
        topics.delete("orders")
    assert err.value.error == Errors.UNKNOWN_TOPIC_OR_PARTITION


def test_duplicate_create_and_invalid_arguments(topics: Topics) -> None:
    topics.create("orders", 2)
    with pytest.raises(TopicError) as err:
        topics.create("orders", 5)
    assert err.value.error == Errors.TOPIC_ALREADY_EXISTS
    assert isinstance(err.value, RcoordError)
    assert topics.partition_count("orders") == 2  # the failed create changed nothing

    for bad in (0, -1):
        with pytest.raises(TopicError) as err:
            topics.create("other", bad)
        assert err.value.error == Errors.INVALID_PARTITIONS
    for name in ("", "a b", "x{y}", "a" * 250, ".."):
        with pytest.raises(TopicError) as err:
            topics.create(name, 1)
        assert err.value.error == Errors.INVALID_TOPIC_EXCEPTION
    with pytest.raises(TopicError) as err:
        topics.create("other", 1, retention_ms=-5)
    assert err.value.error == Errors.INVALID_CONFIG
    assert topics.list() == ["orders"]


def test_topic_settings_are_bounded_by_what_the_scripts_take(
    topics: Topics, redis_client: Any, namespace: str
) -> None:
    """Kafka's long is the limit: XTRIM MAXLEN refuses more, which made every apply_retention of
    a topic created with a larger retention_records fail with a raw server error."""
    for name in ("retention_records", "retention_ms", "producer_id_expiration_ms"):
        with pytest.raises(TopicError, match=name) as err:
            topics.create("t", 1, **{name: 2**63})
        assert err.value.error == Errors.INVALID_CONFIG
    assert topics.list() == []
    top = 2**63 - 1
    topics.create("t", 1, retention_records=top, retention_ms=top, producer_id_expiration_ms=top)
    producer = Producer(redis_client, namespace)
    assert producer.send("t", b"a", partition=0).offset == 0
    assert producer.send("t", b"b", partition=0).offset == 1
    assert topics.apply_retention("t") == {0: 0}  # nothing is old or many enough to go
    # A producer that logs its appends (the Spark sink's) gives its log the state's lifetime.
    # Before, a lifetime past the server's expire range failed the script after its records
    # were written: a retry could not see them in the log and wrote them again.
    logged = Producer(redis_client, namespace, producer_id="sink-0", log_appends=True)
    for offset in (2, 3):
        assert logged.send("t", b"c", partition=0).offset == offset
    assert [r.value for r in fetch(redis_client, namespace, "t", 0, 0).records] == [
        b"a", b"b", b"c", b"c"]
    log = producer_log_key(namespace, "t", 0, "sink-0")
    assert redis_client.pttl(log) > 10 * 365 * 86_400_000  # lives, and for ages


def test_partitions_per_call_are_bounded_as_kafkas_controller_bounds_them(topics: Topics) -> None:
    """A create of 100,000,000 partitions registered the topic, then ran for hours making its
    streams (and every describe walked them all). Kafka's controller refuses an operation of more
    than 10,000 records; here a create or add_partitions of more than 10,000 is refused first,
    with nothing written."""
    top = topics_admin.MAX_PARTITIONS_PER_CALL
    with pytest.raises(TopicError, match=f"<= {top} in one call") as err:
        topics.create("big", top + 1)
    assert err.value.error == Errors.INVALID_PARTITIONS
    assert topics.list() == []
    topics.create("t", 2)
    with pytest.raises(TopicError, match=f"at most {top} more in one call") as err:
        topics.add_partitions("t", top + 3)
    assert err.value.error == Errors.INVALID_PARTITIONS
    assert topics.partition_count("t") == 2


def test_recreated_topic_starts_at_offset_zero(
    topics: Topics, producer: Producer, redis_client: Any, namespace: str
) -> None:
    topics.create("t", 1)
    producer.send("t", b"a", partition=0)
    producer.send("t", b"b", partition=0)
    topics.delete("t")
    # Producing to the deleted topic neither works nor brings a stream back.
    with pytest.raises(TopicError) as err:
        producer.send("t", b"c", partition=0)
    assert err.value.error == Errors.UNKNOWN_TOPIC_OR_PARTITION
    assert not redis_client.exists(partition_key(namespace, "t", 0))
    assert fetch(redis_client, namespace, "t", 0, 0).error == Errors.UNKNOWN_TOPIC_OR_PARTITION

    topics.create("t", 1)
    assert producer.send("t", b"new", partition=0).offset == 0


def test_add_partitions(topics: Topics, redis_client: Any, namespace: str) -> None:
    producer = Producer(redis_client, namespace, metadata_max_age_ms=60_000)
    topics.create("t", 2)
    producer.send("t", b"x", partition=1)  # caches the count 2
    topics.add_partitions("t", 5)
    desc = topics.describe("t")
    assert [(p.partition, p.log_start_offset, p.log_end_offset) for p in desc.partitions] == [
        (0, 0, 0), (1, 0, 1), (2, 0, 0), (3, 0, 0), (4, 0, 0)
    ]
    # A partition beyond the cached count makes the producer re-read the metadata.
    assert producer.send("t", b"y", partition=4).offset == 0
    for total in (5, 3):
        with pytest.raises(TopicError) as err:
            topics.add_partitions("t", total)
        assert err.value.error == Errors.INVALID_PARTITIONS
    with pytest.raises(TopicError) as err:
        topics.add_partitions("missing", 3)
    assert err.value.error == Errors.UNKNOWN_TOPIC_OR_PARTITION
    assert topics.partition_count("t") == 5


def cached_topics(producer: Producer) -> dict[str, set[str]]:
    """The topics each of the producer's per-topic metadata caches holds."""
    return {name: set(getattr(producer, name))
            for name in ("_counts", "_expiration", "_sticky", "_used")}


def test_producer_forgets_deleted_topics(topics: Topics, redis_client: Any,
                                         namespace: str) -> None:
    """A producer that sends to ever new topics (the gateway's one Producer) kept every deleted
    topic's cached count, expiration setting and sticky partition for good; a read that finds
    the topic gone drops them (Kafka's producer drops a topic's metadata once it is gone)."""
    producer = Producer(redis_client, namespace, idempotent=False)
    for i in range(20):
        topics.create(f"t{i}", 2)
        producer.send(f"t{i}", b"v")
        topics.delete(f"t{i}")
        with pytest.raises(TopicError) as err:
            producer.send(f"t{i}", b"v")
        assert err.value.error == Errors.UNKNOWN_TOPIC_OR_PARTITION
    assert cached_topics(producer) == {name: set() for name in cached_topics(producer)}


def test_producer_forgets_idle_topics(topics: Topics, redis_client: Any, namespace: str) -> None:
    """Kafka's ``metadata.max.idle.ms``: a topic not sent to for that long loses its cached
    metadata, so a long-lived producer's caches hold the topics in use, not every one ever sent
    to. A caller's ``rng`` keeps its sticky partitions (placements that must repeat)."""
    now = [0.0]
    producer = Producer(redis_client, namespace, metadata_max_idle_ms=5000)
    producer._monotonic = lambda: now[0]
    seeded = Producer(redis_client, namespace, metadata_max_idle_ms=5000, rng=random.Random(1))
    seeded._monotonic = lambda: now[0]
    for i in range(10):
        topics.create(f"t{i}", 2)
        producer.send(f"t{i}", b"v")
        seeded.send(f"t{i}", b"v")
    assert cached_topics(producer)["_counts"] == {f"t{i}" for i in range(10)}
    now[0] += 4.9  # not idle yet: kept
    producer.send("t0", b"v")
    assert cached_topics(producer)["_counts"] == {f"t{i}" for i in range(10)}
    now[0] += 5.0  # t1..t9 idle for 9.9 s, t0 for 5 s: all past metadata_max_idle_ms
    topics.create("new", 2)
    for p in (producer, seeded):
        p.send("new", b"v")
    assert cached_topics(producer) == {name: {"new"} for name in cached_topics(producer)}
    assert set(seeded._sticky) == {"new"} | {f"t{i}" for i in range(10)}
    assert set(seeded._counts) == {"new"}
    # A forgotten topic is read again at its next send, and its expiration setting with it.
    topics.alter_configs("t3", {"producer_id_expiration_ms": 1234})
    producer.send("t3", b"v")
    assert producer._expiration["t3"] == 1234
    with pytest.raises(InvalidRequestError, match="metadata_max_idle_ms"):
        Producer(redis_client, namespace, metadata_max_idle_ms=4999)



def partition_keys_left(client: Any, ns: str, topic: str, partition: int) -> list[str]:
    return [k for k in make_keys(ns, topic, partition) if client.exists(k)]


def test_delete_racing_add_partitions_deletes_the_added_partitions(
    topics: Topics, redis_client: Any, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another admin adds a partition (and a producer fills it) between delete's count read and
    its deletions: delete reads the count again and deletes that partition too."""
    topics.create("t", 1)
    other = Topics(redis_client, namespace)
    real_count = topics.partition_count

    def count_then_race(topic: str) -> int:
        count = real_count(topic)
        other.add_partitions(topic, 3)
        Producer(redis_client, namespace).send_batch(
            topic, [ProducerRecord(b"old", partition=p) for p in (1, 2)])
        return count

    monkeypatch.setattr(topics, "partition_count", count_then_race)
    topics.delete("t")
    assert other.list() == []
    for p in range(3):
        assert partition_keys_left(redis_client, namespace, "t", p) == []


def _delete_stopped_after_partition_0(topics: Topics, monkeypatch: pytest.MonkeyPatch) -> None:
    """``topics.delete("t")`` that stops (its process gone) once it has removed partition 0;
    ``topics`` deletes as before afterwards."""
    real_delete = topics._delete_partitions

    def stop_after_the_first(topic: str, partitions: range) -> None:
        real_delete(topic, range(partitions.start, partitions.start + 1))
        raise redis.exceptions.ConnectionError("the delete's process went away")

    monkeypatch.setattr(topics, "_delete_partitions", stop_after_the_first)
    with pytest.raises(RcoordError):
        topics.delete("t")
    monkeypatch.setattr(topics, "_delete_partitions", real_delete)


def test_create_does_not_bring_back_what_a_delete_that_stopped_partway_removed(
    topics: Topics, redis_client: Any, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A delete that stops after removing partition 0's stream (its process dies, Redis goes
    away) left a topic that ``create`` made whole again: partition 0 empty, partition 1 with
    the old record, passed off as one topic. It answers TOPIC_ALREADY_EXISTS "queued for
    deletion" and makes nothing; ``delete`` again finishes, then ``create`` starts clean."""
    topics.create("t", 2)
    Producer(redis_client, namespace).send_batch(
        "t", [ProducerRecord(b"old", partition=p) for p in (0, 1)])
    _delete_stopped_after_partition_0(topics, monkeypatch)
    with pytest.raises(TopicError, match="queued for deletion") as info:
        topics.create("t", 2)
    assert info.value.error == Errors.TOPIC_ALREADY_EXISTS
    # Nor is it grown (Kafka: INVALID_TOPIC_EXCEPTION "The topic is queued for deletion"):
    # its new partitions would be streams the delete that finishes it may not see.
    with pytest.raises(TopicError, match="queued for deletion") as info:
        topics.add_partitions("t", 3)
    assert info.value.error == Errors.INVALID_TOPIC_EXCEPTION
    assert partition_keys_left(redis_client, namespace, "t", 2) == []
    assert partition_keys_left(redis_client, namespace, "t", 0) == []
    assert log_offsets(redis_client, namespace, "t", 1) == (0, 1)
    topics.delete("t")
    assert topics.list() == []
    topics.create("t", 2)
    assert [log_offsets(redis_client, namespace, "t", p) for p in (0, 1)] == [(0, 0), (0, 0)]


def test_a_delete_that_begins_while_a_topic_grows_stops_the_growth(
    topics: Topics, redis_client: Any, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A delete marks the topic between ``add_partitions``' check and its raise of the count:
    the count is not raised (``topic_grow_meta.lua`` refuses a topic marked for deletion)."""
    topics.create("t", 1)
    real_read = topics._count_and_token

    def read_then_delete_begins(topic: str) -> tuple[int, str]:
        read = real_read(topic)
        redis_client.hset(f"{namespace}:topicmeta:{{t}}", "deleting", "1")  # (delete's mark)
        return read

    monkeypatch.setattr(topics, "_count_and_token", read_then_delete_begins)
    with pytest.raises(TopicError, match="queued for deletion") as info:
        topics.add_partitions("t", 2)
    assert info.value.error == Errors.INVALID_TOPIC_EXCEPTION
    assert redis_client.hget(f"{namespace}:topicmeta:{{t}}", "partitions") == b"1"


def test_a_new_topic_does_not_adopt_a_partition_an_older_one_left(
    topics: Topics, redis_client: Any, namespace: str
) -> None:
    """What a delete that lost the race to an add_partitions leaves (the race's window is
    between delete's last count read and its metadata deletion): partition 1's stream, with
    records and producer state. A new topic of the same name grown to 2 partitions replaces it
    instead of taking its records, offsets and producer state."""
    topics.create("t", 2)
    Producer(redis_client, namespace, producer_id="x", producer_epoch=5).send_batch(
        "t", [ProducerRecord(b"old-%d" % i, partition=1) for i in range(3)])
    redis_client.delete(f"{namespace}:topicmeta:{{t}}", partition_key(namespace, "t", 0))
    topics.create("t", 1)
    topics.add_partitions("t", 2)
    assert log_offsets(redis_client, namespace, "t", 1) == (0, 0)
    # No state carried over: a lower epoch is not fenced, sequence 0 is not a duplicate.
    meta = Producer(redis_client, namespace, producer_id="x", producer_epoch=1).send(
        "t", b"new", partition=1)
    assert (meta.offset, meta.duplicate) == (0, False)
    assert [r.value for r in fetch_all(redis_client, namespace, "t", 1).records] == [b"new"]
    # A concurrent add_partitions of this same topic keeps what the first one made.
    topics.add_partitions("t", 3)
    Producer(redis_client, namespace).send("t", b"kept", partition=2)
    token = topics.create_token("t")
    (res,) = _run(redis_client, [(MAKE, make_keys(namespace, "t", 2), ["ensure", token])])
    assert int(res[0]) == 0
    assert [r.value for r in fetch_all(redis_client, namespace, "t", 2).records] == [b"kept"]


def test_an_add_partitions_that_outlived_its_topic_leaves_a_newer_one_alone(
    topics: Topics, redis_client: Any, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """add_partitions read the count of a topic that is then deleted and created again with
    more partitions: it must not replace the new topic's partitions, nor grow it."""
    topics.create("t", 1)
    stale = topics._count_and_token("t")
    topics.delete("t")
    topics.create("t", 3)
    Producer(redis_client, namespace).send("t", b"new", partition=1)
    reads = iter([stale])  # the first read is stale; any later one reads the topic again
    real_read = topics._count_and_token
    monkeypatch.setattr(topics, "_count_and_token", lambda topic: next(reads, None) or real_read(topic))
    with pytest.raises(TopicError) as err:
        topics.add_partitions("t", 4)
    assert err.value.error == Errors.UNKNOWN_TOPIC_OR_PARTITION
    monkeypatch.undo()
    assert topics.partition_count("t") == 3
    assert [r.value for r in fetch_all(redis_client, namespace, "t", 1).records] == [b"new"]

# -- producing --------------------------------------------------------------------------------


def test_offsets_start_at_zero_and_timestamps_are_server_time(
    topics: Topics, producer: Producer, redis_client: Any, namespace: str
) -> None:
    topics.create("t", 2)
    key = partition_key(namespace, "t", 1)
    before = server_ms(redis_client, key)
    metas = [producer.send("t", f"v{i}".encode(), partition=1) for i in range(5)]
    after = server_ms(redis_client, key)
    assert [m.offset for m in metas] == [0, 1, 2, 3, 4]
    assert all(m.topic == "t" and m.partition == 1 for m in metas)
    assert all(before <= m.timestamp_ms <= after for m in metas)
    res = fetch_all(redis_client, namespace, "t", 1)
    assert [r.timestamp_ms for r in res.records] == [m.timestamp_ms for m in metas]
    assert log_offsets(redis_client, namespace, "t", 0) == (0, 0)
    assert log_offsets(redis_client, namespace, "t", 1) == (0, 5)


def test_offsets_contiguous_under_concurrent_producers(
    topics: Topics, redis_client: Any, namespace: str,
    pool: concurrent.futures.ThreadPoolExecutor,
) -> None:
    topics.create("t", 2)
    threads, per_thread = 8, 60
    barrier = threading.Barrier(threads)

    def produce(t: int) -> list[tuple[int, int, bytes]]:
        producer = Producer(redis_client, namespace)  # one producer per worker, as in real life
        barrier.wait(WAIT_S)
        out = []
        for i in range(per_thread):
            value = f"{t}:{i}".encode()
            if i % 3 == 0:  # a small batch now and then, interleaved with single sends
                metas = producer.send_batch("t", [ProducerRecord(value, partition=i % 2)])
            else:
                metas = [producer.send("t", value, partition=i % 2)]
            out.append((metas[0].partition, metas[0].offset, value))
        return out

    results = [f.result(WAIT_S) for f in [pool.submit(produce, t) for t in range(threads)]]
    sent = [row for rows in results for row in rows]
    for p in (0, 1):
        offsets = sorted(o for part, o, _ in sent if part == p)
        assert offsets == list(range(threads * per_thread // 2))  # contiguous, no duplicates
        by_offset = {o: v for part, o, v in sent if part == p}
        records = fetch_all(redis_client, namespace, "t", p).records
        assert [(r.offset, r.value) for r in records] == sorted(by_offset.items())
    # Each producer's records to one partition keep their order (offsets increase).
    for rows in results:
        for p in (0, 1):
            mine = [o for part, o, _ in rows if part == p]
            assert mine == sorted(mine)


def test_key_partitioning_matches_kafka(
    topics: Topics, producer: Producer, redis_client: Any, namespace: str
) -> None:
    topics.create("keyed", 12)
    metas = [producer.send("keyed", b"v", key=f"key-{i}".encode()) for i in range(100)]
    assert [m.partition for m in metas] == KEY_I_12_PARTITIONS
    for p in range(12):
        keys = [r.key for r in fetch_all(redis_client, namespace, "keyed", p).records]
        assert keys == [f"key-{i}".encode() for i in range(100) if KEY_I_12_PARTITIONS[i] == p]


def test_batch_send_keeps_order(
    topics: Topics, producer: Producer, redis_client: Any, namespace: str
) -> None:
    topics.create("t", 3)
    producer.send("t", b"first", partition=2)
    batch = [
        ProducerRecord(f"v{i}".encode(), key=None, partition=i % 3,
                       headers={"i": str(i).encode()} if i % 2 else None)
        for i in range(30)
    ]
    metas = producer.send_batch("t", batch)
    assert [m.partition for m in metas] == [i % 3 for i in range(30)]
    for p in range(3):
        offsets = [m.offset for m in metas if m.partition == p]
        start = 1 if p == 2 else 0
        assert offsets == list(range(start, start + 10))
        recs = fetch_all(redis_client, namespace, "t", p, start).records
        assert [r.value for r in recs] == [f"v{i}".encode() for i in range(30) if i % 3 == p]
        assert [r.headers for r in recs] == [
            {"i": str(i).encode()} if i % 2 else {} for i in range(30) if i % 3 == p
        ]
    # One partition's records in one batch get one timestamp (one script call).
    assert len({m.timestamp_ms for m in metas if m.partition == 0}) == 1
    assert producer.send_batch("t", []) == []
    # Plain bytes are accepted as records; all-keyless records go through the partitioner.
    assert len(producer.send_batch("t", [b"a", b"b"])) == 2


def test_records_roundtrip_keys_values_headers(
    topics: Topics, producer: Producer, redis_client: Any, namespace: str
) -> None:
    topics.create("t", 1)
    producer.send("t", b"\x00\xff binary", key=b"\x80k", headers={"h1": b"", "h2": b"\x01"})
    producer.send("t", None, key=b"tombstone")
    producer.send("t", b"", partition=0)
    recs = fetch_all(redis_client, namespace, "t", 0).records
    assert [(r.offset, r.key, r.value, r.headers) for r in recs] == [
        (0, b"\x80k", b"\x00\xff binary", {"h1": b"", "h2": b"\x01"}),
        (1, b"tombstone", None, {}),
        (2, None, b"", {}),
    ]


def test_headers_keep_order_repeats_and_nulls(
    topics: Topics, producer: Producer, redis_client: Any, namespace: str
) -> None:
    """Headers are a list, as in Kafka: a name may repeat (Headers.add) and a value may be null.
    ``header_list`` has them all in order; ``headers`` the last value of each name
    (Kafka's lastHeader). A mapping is still accepted."""
    topics.create("t", 1)
    pairs = [("a", b"1"), ("b", None), ("a", b"2"), ("c", b"")]
    producer.send("t", b"x", headers=pairs)
    producer.send_batch("t", [ProducerRecord(b"y", headers=tuple(pairs[:2])),
                              ProducerRecord(b"z", headers={"m": b"1"})])
    producer.send("t", b"none", headers=[])
    recs = fetch_all(redis_client, namespace, "t", 0).records
    assert [r.header_list for r in recs] == [
        tuple(pairs), (("a", b"1"), ("b", None)), (("m", b"1"),), ()]
    assert [r.headers for r in recs] == [
        {"a": b"2", "b": None, "c": b""}, {"a": b"1", "b": None}, {"m": b"1"}, {}]
    # A Record built by hand derives either form from the other, and equals the decoded one.
    assert recs[0] == Record(0, None, b"x", {}, recs[0].timestamp_ms, header_list=tuple(pairs))
    assert recs[2] == Record(2, None, b"z", {"m": b"1"}, recs[2].timestamp_ms)
    with pytest.raises(ValueError, match="dict\\(header_list\\)"):
        Record(0, None, b"x", {"a": b"1"}, 0, header_list=(("a", b"2"),))
    for bad, match in (([("a", "text")], "value must be bytes or None"),
                       ([(1, b"v")], "name must be str"),
                       ([("a", b"1", b"2")], "pairs"), ("ab", "pairs")):
        with pytest.raises(TypeError, match=match):
            producer.send("t", b"bad", headers=bad)  # type: ignore[arg-type]
    assert log_offsets(redis_client, namespace, "t", 0) == (0, 4)


def test_sticky_and_round_robin_partitioners(
    topics: Topics, redis_client: Any, namespace: str
) -> None:
    topics.create("t", 4)
    sticky = Producer(redis_client, namespace, batch_size=1_000_000)
    assert len({m.partition for m in sticky.send_batch("t", [b"x"] * 20)}) == 1
    # A batch is "done" after batch_size bytes: then the producer moves to another partition.
    eager = Producer(redis_client, namespace, batch_size=10)
    parts = [eager.send("t", b"0123456789").partition for _ in range(20)]
    assert all(a != b for a, b in zip(parts, parts[1:]))
    # Records without a value (tombstones, data in headers) finish a batch too: counted as
    # 0 bytes, they all went to one partition for good.
    empty = Producer(redis_client, namespace, batch_size=2)
    parts = [m.partition for m in empty.send_batch(
        "t", [ProducerRecord(v, headers=[("h", b"x")]) for v in (b"", None) * 5])]
    assert all(a == b for a, b in zip(parts[::2], parts[1::2]))
    assert all(a != b for a, b in zip(parts[::2], parts[2::2]))
    rr = Producer(redis_client, namespace, partitioner="round_robin")
    metas = rr.send_batch("t", [ProducerRecord(b"x", key=b"same")] * 8)
    assert [m.partition for m in metas] == [0, 1, 2, 3, 0, 1, 2, 3]
    custom = Producer(redis_client, namespace, partitioner=lambda topic, key, n: n - 1)
    assert custom.send("t", b"x", key=b"k").partition == 3


def test_unknown_topic_and_partition(
    topics: Topics, producer: Producer, redis_client: Any, namespace: str
) -> None:
    with pytest.raises(TopicError) as err:
        producer.send("nope", b"x")
    assert err.value.error == Errors.UNKNOWN_TOPIC_OR_PARTITION
    topics.create("t", 2)
    with pytest.raises(TopicError) as err:
        producer.send("t", b"x", partition=2)
    assert err.value.error == Errors.UNKNOWN_TOPIC_OR_PARTITION
    # (-1 is no partition of any topic: test_a_negative_partition_..._are_refused)
    assert fetch(redis_client, namespace, "t", 7, 0).error == Errors.UNKNOWN_TOPIC_OR_PARTITION
    with pytest.raises(TopicError):
        log_offsets(redis_client, namespace, "nope", 0)
    with pytest.raises(TypeError):
        producer.send("t", "text", partition=0)  # type: ignore[arg-type]


def test_records_of_the_wrong_type_are_named_before_a_partition_is_chosen(
    topics: Topics, producer: Producer, redis_client: Any, namespace: str
) -> None:
    """Before, the partitioner met a bad key or value first: a str key failed with bytes()'s
    "string argument without an encoding", an int value with "object of type 'int' has no
    len()", int headers with "'int' object is not iterable"."""
    topics.create("t", 2)
    with pytest.raises(TypeError, match="key must be bytes or None, got str"):
        producer.send("t", b"x", key="k")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="value must be bytes or None, got int"):
        producer.send("t", 5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="key must be bytes or None, got int"):
        bad_key: Any = 7
        producer.send_batch("t", [ProducerRecord(b"a"), ProducerRecord(b"b", bad_key)])
    with pytest.raises(TypeError, match="headers must be a mapping or a sequence"):
        producer.send("t", b"x", headers=5)  # type: ignore[arg-type]
    assert [p.log_end_offset for p in topics.describe("t").partitions] == [0, 0]  # nothing sent
    with pytest.raises(TypeError, match="redis_client must be a redis.Redis"):
        Producer("redis://127.0.0.1:6379/0", namespace)
    with pytest.raises(TypeError, match="redis_client must be a redis.Redis"):
        Topics(None, namespace)


def test_a_negative_partition_a_bad_partitioner_and_a_bad_header_name_are_refused(
    topics: Topics, producer: Producer, redis_client: Any, namespace: str
) -> None:
    """A reviewer's repros: ``partition=-1`` raised a retriable UNKNOWN_TOPIC_OR_PARTITION (a
    caller that retries those looped for ever on a programming mistake; Kafka's ProducerRecord
    refuses it), a partitioner returning 1.9 wrote to partition 1, a header name with a lone
    surrogate failed inside msgpack with UnicodeEncodeError, and ``headers=""`` was taken for
    no headers while ``headers="abc"`` was refused."""
    topics.create("t", 2)
    for idempotent in (False, True):
        p = Producer(redis_client, namespace, idempotent=idempotent)
        with pytest.raises(InvalidRequestError, match="partition must be >= 0, got -1"):
            p.send("t", b"x", partition=-1)
    with pytest.raises(TypeError, match="partitioner must return an int partition, got float"):
        Producer(redis_client, namespace, partitioner=lambda t, k, n: 1.9).send("t", b"x")
    class IntLike:  # (numpy's integers are not int, and index like this)
        def __index__(self) -> int:
            return 1

    # A partitioner's negative partition was a retriable UNKNOWN_TOPIC_OR_PARTITION (Kafka's
    # producer refuses it: "The partitioner generated an invalid partition number").
    with pytest.raises(InvalidRequestError, match="chose partition -1 for topic 't'"):
        Producer(redis_client, namespace, partitioner=lambda t, k, n: -1).send("t", b"x")
    meta = Producer(redis_client, namespace, partitioner=lambda t, k, n: IntLike()).send("t", b"i")
    assert meta.partition == 1
    with pytest.raises(InvalidRequestError, match="is not valid UTF-8"):
        producer.send("t", b"x", headers={"\udc80": b"v"})
    with pytest.raises(TypeError, match="headers must be a mapping or a sequence"):
        producer.send("t", b"x", headers="")  # type: ignore[arg-type]
    assert [p.log_end_offset for p in topics.describe("t").partitions] == [0, 1]  # IntLike's
    producer.send("t", b"x", headers={})  # (an empty mapping is no headers)
    assert sum(p.log_end_offset for p in topics.describe("t").partitions) == 2


class CountingClient:
    """Counts the script calls (``evalsha``) made through it: one partition's calls are sent
    one by one (``_run``)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.calls = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def evalsha(self, *args: Any) -> Any:
        self.calls += 1
        return self._inner.evalsha(*args)


@pytest.mark.parametrize("idempotent", [False, True])
def test_a_record_over_max_request_size_is_refused_and_calls_are_split_by_bytes(
    topics: Topics, redis_client: Any, namespace: str, idempotent: bool
) -> None:
    """Kafka's ``max.request.size``: a record larger than it is MESSAGE_TOO_LARGE, before
    anything of the call is appended; smaller ones go in calls of at most that many bytes.
    Before, a record of any size was sent, and one over the server's ``proto-max-bulk-len``
    came back as a raw ResponseError ("invalid bulk length")."""
    topics.create("t", 1)
    client = CountingClient(redis_client)
    p = Producer(client, namespace, idempotent=idempotent, max_request_size=100)
    with pytest.raises(TopicError) as err:
        p.send_batch("t", [ProducerRecord(b"ok", partition=0),
                           ProducerRecord(b"v" * 60, key=b"k" * 30, partition=0,
                                          headers={"h": b"12345678"})])
    assert err.value.error == Errors.MESSAGE_TOO_LARGE and not err.value.retriable
    assert "record 1 is 1" in str(err.value) and "max_request_size 100" in str(err.value)
    assert topics.describe("t").partitions[0].log_end_offset == 0
    # A record of exactly the limit is taken (and the script is loaded: NOSCRIPT is a call).
    assert p.send("t", b"y" * 100, partition=0).offset == 0
    # Ten records of 40 bytes: calls of two (80 bytes; a third would make 120).
    vals = [b"%02d" % i + b"x" * 38 for i in range(10)]
    client.calls = 0
    metas = p.send_batch("t", [ProducerRecord(v, partition=0) for v in vals])
    assert client.calls == 5
    assert [m.offset for m in metas] == list(range(1, 11))
    assert [r.value for r in fetch(redis_client, namespace, "t", 0, 1).records] == vals
    for bad in (0, MAX_REQUEST_SIZE_LIMIT + 1):
        with pytest.raises(InvalidRequestError, match="max_request_size must be"):
            Producer(redis_client, namespace, max_request_size=bad)
    assert Producer(redis_client, namespace)._max_request_size == 1 << 20  # Kafka's default


def test_scripts_reload_after_script_flush(
    topics: Topics, producer: Producer, redis_client: Any, namespace: str
) -> None:
    topics.create("t", 3)
    producer.send_batch("t", [ProducerRecord(b"a", partition=p) for p in range(3)])
    redis_client.script_flush()
    metas = producer.send_batch("t", [ProducerRecord(b"b", partition=p) for p in range(3)])
    assert [m.offset for m in metas] == [1, 1, 1]
    assert [p.log_end_offset for p in topics.describe("t").partitions] == [2, 2, 2]


def test_decoding_client_is_rejected(redis_server: Any) -> None:
    client = redis_server.client(decode_responses=True)
    try:
        with pytest.raises(TypeError):
            Topics(client, "x")
        with pytest.raises(TypeError):
            Producer(client, "x")
    finally:
        client.close()


# -- fetching ---------------------------------------------------------------------------------


def test_fetch_from_offset_returns_the_next_records(
    topics: Topics, producer: Producer, redis_client: Any, namespace: str
) -> None:
    topics.create("t", 1)
    producer.send_batch("t", [ProducerRecord(f"v{i}".encode(), partition=0) for i in range(10)])
    res = fetch(redis_client, namespace, "t", 0, 4, max_records=3)
    assert res.error == Errors.NONE
    assert [(r.offset, r.value) for r in res.records] == [(4, b"v4"), (5, b"v5"), (6, b"v6")]
    assert (res.log_start_offset, res.log_end_offset) == (0, 10)
    res = fetch(redis_client, namespace, "t", 0, 7)
    assert [r.offset for r in res.records] == [7, 8, 9]
    at_end = fetch(redis_client, namespace, "t", 0, 10)
    assert (at_end.error, at_end.records) == (Errors.NONE, [])
    past = fetch(redis_client, namespace, "t", 0, 11)
    assert past.error == Errors.OFFSET_OUT_OF_RANGE
    assert (past.log_start_offset, past.log_end_offset, past.records) == (0, 10, [])


def test_out_of_range_below_log_start_after_count_retention(
    topics: Topics, producer: Producer, redis_client: Any, namespace: str
) -> None:
    topics.create("t", 2, retention_records=4)
    producer.send_batch("t", [ProducerRecord(f"v{i}".encode(), partition=0) for i in range(10)])
    producer.send_batch("t", [ProducerRecord(b"x", partition=1) for _ in range(3)])
    assert topics.apply_retention("t") == {0: 6, 1: 0}
    desc = topics.describe("t")
    assert [(p.log_start_offset, p.log_end_offset) for p in desc.partitions] == [(6, 10), (0, 3)]

    below = fetch(redis_client, namespace, "t", 0, 3)
    assert below.error == Errors.OFFSET_OUT_OF_RANGE
    assert (below.log_start_offset, below.log_end_offset) == (6, 10)
    assert resolve_offset("earliest", redis_client, namespace, "t", 0) == 6
    assert resolve_offset("latest", redis_client, namespace, "t", 0) == 10
    with pytest.raises(ValueError):
        resolve_offset("none", redis_client, namespace, "t", 0)  # type: ignore[arg-type]
    ok = fetch(redis_client, namespace, "t", 0, 6)
    assert [(r.offset, r.value) for r in ok.records] == [(6, b"v6"), (7, b"v7"), (8, b"v8"),
                                                         (9, b"v9")]
    # Offsets keep counting from the log end after trimming.
    assert producer.send("t", b"v10", partition=0).offset == 10


def test_retention_can_empty_a_partition_without_losing_the_log_end(
    topics: Topics, producer: Producer, redis_client: Any, namespace: str
) -> None:
    topics.create("t", 1, retention_records=0)
    producer.send_batch("t", [ProducerRecord(b"x", partition=0) for _ in range(5)])
    assert topics.apply_retention("t") == {0: 5}
    assert log_offsets(redis_client, namespace, "t", 0) == (5, 5)
    assert fetch(redis_client, namespace, "t", 0, 4).error == Errors.OFFSET_OUT_OF_RANGE
    assert producer.send("t", b"y", partition=0).offset == 5
    assert [r.offset for r in fetch(redis_client, namespace, "t", 0, 5).records] == [5]


def test_a_large_trim_by_count_is_split_into_bounded_calls(
    topics: Topics, producer: Producer, redis_client: Any, namespace: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Retention by count removes about RETENTION_TRIM_BYTES a call (one record at least),
    judged by the partition's first record, as DeleteRecords and retention by age do: one
    XTRIM MAXLEN removed the whole backlog at once (500 records of 1 MB held the server for
    108 ms). The count still keeps exactly the newest records, and the search by age, also
    set, begins once the count's removal is done, probing the head first."""
    topics.create("t", 2, retention_records=10, retention_ms=3_600_000)
    producer.send_batch("t", [ProducerRecord(b"x" * 1000, partition=p)
                              for p in (0, 1) for _ in range(40)])
    monkeypatch.setattr(topics_admin, "RETENTION_TRIM_BYTES", 5000)
    rounds = _retention_rounds(monkeypatch)
    assert topics.apply_retention("t") == {0: 30, 1: 30}
    # 30 records of a little over 1 KB, 4 a call: 8 calls; then one that searches by age.
    assert rounds == [["", ""]] * 9, rounds
    assert log_offsets(redis_client, namespace, "t", 0) == (30, 40)
    assert [r.offset for r in fetch_all(redis_client, namespace, "t", 1, 30).records] == list(
        range(30, 40))
    assert topics.apply_retention("t") == {0: 30, 1: 30}  # nothing more to remove


def _log_starts(monkeypatch: pytest.MonkeyPatch, starts: list[int]) -> list[int]:
    """``starts``, to which every retention call appends the log start it answers."""
    run = topics_admin._run

    def noted(r: Any, calls: Any, **kw: Any) -> Any:
        results = run(r, calls, **kw)
        starts.extend(int(res[1]) for res in results)
        return results

    monkeypatch.setattr(topics_admin, "_run", noted)
    return starts


def test_a_trim_by_count_behind_a_small_first_record_stays_bounded(
    topics: Topics, producer: Producer, redis_client: Any, namespace: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Retention by count judged a call's removal by the first record alone: one record of 1
    byte, then 60 of 1,000, with a bound of 5,000 bytes, removed 51 records (50 KB) in one call.
    Each call here stays within twice the bound (a call reads one record a round, so sizes
    that alternate can still pass it), and the newest records are kept exactly."""
    topics.create("t", 1, retention_records=10)
    producer.send_batch("t", [ProducerRecord(b"s", partition=0)]
                        + [ProducerRecord(b"x" * 1000, partition=0) for _ in range(60)])
    monkeypatch.setattr(topics_admin, "RETENTION_TRIM_BYTES", 5000)
    starts = _log_starts(monkeypatch, [0])
    assert topics.apply_retention("t") == {0: 51}
    removed = [(b - a) * 1000 for a, b in itertools.pairwise(starts)]
    assert starts[-1] == 51 and max(removed) <= 2 * 5000, starts
    assert log_offsets(redis_client, namespace, "t", 0) == (51, 61)


def test_no_retention_call_removes_by_count_and_by_age_at_once(
    topics: Topics, producer: Producer, redis_client: Any, namespace: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each of the two removals is bounded by about RETENTION_TRIM_BYTES a call; the call that
    finished the count's removal went on to remove by age as much again (a reviewer's repro:
    log starts 4, 8, ..., 28, 34: six records of 1 KB in one call of a 5,000-byte bound). The
    age's search now begins with the next call."""
    topics.create("t", 1, retention_records=10, retention_ms=1)
    sent = producer.send_batch("t", [ProducerRecord(b"x" * 1000, partition=0)
                                     for _ in range(40)])
    key = partition_key(namespace, "t", 0)
    wait_until(lambda: server_ms(redis_client, key) > sent[-1].timestamp_ms + 1)
    monkeypatch.setattr(topics_admin, "RETENTION_TRIM_BYTES", 5000)
    starts = _log_starts(monkeypatch, [])
    assert topics.apply_retention("t") == {0: 40}  # every record expired
    removed = [b - a for a, b in zip([0, *starts], starts, strict=False)]
    assert starts[-1] == 40 and max(removed) == 4, starts


def test_a_trim_by_age_stays_bounded_when_its_probes_miss_the_large_records(
    topics: Topics, producer: Producer, redis_client: Any, namespace: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Retention by age judged its removal by the records its binary search read, which may
    all be small: a record of 1 byte, 19 of 20 KB, then 21 of 1 byte, all expired, were all
    removed by one call (380 KB for a bound of 5,000; the probes at 0, 20, 30, ... read none of
    the large ones). The removal is now judged as the count's is, by the records it removes."""
    topics.create("t", 1, retention_ms=1)
    values = [b"s"] + [b"b" * 20_000] * 19 + [b"s"] * 21
    sent = producer.send_batch("t", [ProducerRecord(v, partition=0) for v in values])
    key = partition_key(namespace, "t", 0)
    wait_until(lambda: server_ms(redis_client, key) > sent[-1].timestamp_ms + 1)
    monkeypatch.setattr(topics_admin, "RETENTION_TRIM_BYTES", 5000)
    starts = _log_starts(monkeypatch, [0])
    assert topics.apply_retention("t") == {0: 41}  # every record expired
    removed = [sum(map(len, values[a:b])) for a, b in itertools.pairwise(starts)]
    assert starts[-1] == 41 and max(removed) <= 20_001, starts


def test_retention_by_age_uses_server_time(
    topics: Topics, producer: Producer, redis_client: Any, namespace: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(topics_admin, "RETENTION_SCAN", 3)  # force several scan rounds
    topics.create("t", 1, retention_ms=500)
    old = producer.send_batch("t", [ProducerRecord(b"old", partition=0) for _ in range(8)])
    key = partition_key(namespace, "t", 0)
    assert topics.apply_retention("t") == {0: 0}  # nothing is old enough yet
    # Wait on the server's clock (the one retention uses) until the old records expired.
    wait_until(lambda: server_ms(redis_client, key) > old[-1].timestamp_ms + 500)
    new = producer.send_batch("t", [ProducerRecord(b"new", partition=0) for _ in range(2)])
    assert topics.apply_retention("t") == {0: 8}
    res = fetch_all(redis_client, namespace, "t", 0, 8)
    assert [(r.offset, r.value) for r in res.records] == [(m.offset, b"new") for m in new]
    assert fetch(redis_client, namespace, "t", 0, 7).error == Errors.OFFSET_OUT_OF_RANGE


def test_a_set_stop_ends_a_trim_by_age_after_one_scan_round(
    topics: Topics, producer: Producer, redis_client: Any, namespace: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A stopping service does not wait for a whole expired backlog: with ``stop`` set, the
    trim ends after its first scan round; the next call (the next pass) goes on from there."""
    import threading

    monkeypatch.setattr(topics_admin, "RETENTION_SCAN", 3)
    topics.create("t", 2, retention_ms=1)
    old = producer.send_batch("t", [ProducerRecord(b"old", partition=p)
                                    for p in (0, 1) for _ in range(8)])
    key = partition_key(namespace, "t", 0)
    wait_until(lambda: server_ms(redis_client, key) > max(m.timestamp_ms for m in old) + 1)
    stop = threading.Event()
    stop.set()
    assert topics.apply_retention("t", stop) == {0: 3, 1: 3}
    assert topics.apply_retention("t") == {0: 8, 1: 8}


def test_a_trim_by_age_binary_searches_with_a_bounded_copy_per_call(
    topics: Topics, producer: Producer, redis_client: Any, namespace: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A record's age is a field of it, so reading it copies the whole record into the script;
    a linear scan read 1,000 records of 1 MB in one call (6.5 s with the server blocked, its
    memory doubled). Timestamps never decrease, so the trim binary-searches the first record
    to keep: with a budget smaller than one record, each call copies one record and the 64
    expired records go in about log2(64) calls, not 64; the fresh record stays."""
    topics.create("t", 1, retention_ms=1000)
    old = producer.send_batch("t", [ProducerRecord(b"v" * 1000, partition=0) for _ in range(64)])
    key = partition_key(namespace, "t", 0)
    wait_until(lambda: server_ms(redis_client, key) > old[-1].timestamp_ms + 1000)
    fresh = producer.send("t", b"fresh", partition=0)
    monkeypatch.setattr(topics_admin, "RETENTION_SCAN_BYTES", 1)
    rounds = _retention_rounds(monkeypatch)
    assert topics.apply_retention("t") == {0: 64}
    assert 6 <= len(rounds) <= 8, rounds
    assert rounds[0] == [""] and all(isinstance(r[0], int) for r in rounds[1:])
    assert [r.value for r in fetch_all(redis_client, namespace, "t", 0, 64).records] == [b"fresh"]
    assert log_offsets(redis_client, namespace, "t", 0) == (fresh.offset, fresh.offset + 1)


def test_a_trim_by_age_call_copies_its_budget_and_moves_on(
    topics: Topics, producer: Producer, redis_client: Any, namespace: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One round per call (``stop`` set): a partition's first call probes the head (usually
    nothing is due), then halves the rest while its copy budget lasts; a budget smaller than
    one record still removes the head, so every call moves on."""
    import threading

    topics.create("t", 1, retention_ms=1)
    old = producer.send_batch("t", [ProducerRecord(b"v" * 1000, partition=0) for _ in range(8)])
    key = partition_key(namespace, "t", 0)
    wait_until(lambda: server_ms(redis_client, key) > old[-1].timestamp_ms + 1)
    stop = threading.Event()
    stop.set()
    monkeypatch.setattr(topics_admin, "RETENTION_SCAN_BYTES", 1)
    assert topics.apply_retention("t", stop) == {0: 1}  # the head only
    # Three records' worth: the head (offset 1), then offsets 4 and 6 of [1, 8).
    monkeypatch.setattr(topics_admin, "RETENTION_SCAN_BYTES", 2500)
    assert topics.apply_retention("t", stop) == {0: 7}
    assert topics.apply_retention("t") == {0: 8}
    assert log_offsets(redis_client, namespace, "t", 0) == (8, 8)


def test_retention_delete_records_and_offsets_by_time_read_the_log_offsets_from_the_mark(
    topics: Topics, producer: Producer, redis_client: Any, namespace: str
) -> None:
    """topic_retention, topic_delete_records and topic_offset_for_time take the log offsets
    from the partition's mark (KEYS[2]) as topic_offsets.lua does, not from XINFO STREAM (which
    copies the first and last records): in every state a partition goes through, each answers
    with the mark what it answers without it (the XINFO STREAM read), and what a fetch says.
    The calls here write nothing: no retention setting, a DeleteRecords offset at the log start
    or past the end."""
    topics.create("t", 1)
    key = partition_key(namespace, "t", 0)
    mark = last_timestamp_key_of(key)

    def offsets() -> tuple[int, int]:
        s, e = log_offsets(redis_client, namespace, "t", 0)
        for keys in ([key, mark], [key]):
            calls = [(RETENTION, keys, ["", "", 10, 1 << 20, "", 1 << 20]),
                     (DELETE_RECORDS, keys, [0, 1 << 20]),
                     (DELETE_RECORDS, keys, [e + 1, 1 << 20]),
                     (OFFSET_FOR_TIME, keys, [0])]
            # (One _run a call: _run sends no later call of a key after a refused one.)
            retention, at_start, past_end, by_time = (_run(redis_client, [c])[0] for c in calls)
            assert [int(x) for x in retention[1:]] == [s, e, 0, e]
            assert [int(x) for x in at_start[1:]] == [s, e, 0]
            assert past_end[0] == b"OFFSET_OUT_OF_RANGE"
            assert [int(x) for x in past_end[1:]] == [s, e, 0]
            assert int(by_time[1]) == (s if s < e else -1)
        return s, e

    assert offsets() == (0, 0)  # (made empty: no mark)
    producer.send_batch("t", [ProducerRecord(b"x", partition=0) for _ in range(7)])
    assert offsets() == (0, 7)
    topics.delete_records("t", {0: 3})
    assert offsets() == (3, 7)
    redis_client.xtrim(key, maxlen=0)  # (retention emptied it: the end stays)
    assert offsets() == (7, 7)
    producer.send("t", b"y", partition=0)
    assert offsets() == (7, 8)
    ts = redis_client.get(mark).split()[0]
    for written in (ts, ts + b" 0"):  # an older rcoord's mark; one that does not fit
        redis_client.set(mark, written)
        assert offsets() == (7, 8)
    producer.send("t", b"z", partition=0)
    # An append that keeps no mark (an older rcoord's, or by hand): the entry past the mark's
    # end is seen, and the offsets are read with XINFO STREAM (the mark said 9: start 8).
    redis_client.execute_command("XADD", key, "0-*", "t", ts, "v", b"raw")
    assert offsets() == (7, 10)
    topics.delete("t")
    topics.create("t", 1)
    redis_client.set(mark, ts + b" 50")  # (an older rcoord's re-create kept the old mark)
    assert offsets() == (0, 0)


def test_block_fetch_wakes_on_a_new_record(
    topics: Topics, producer: Producer, redis_client: Any, namespace: str,
    pool: concurrent.futures.ThreadPoolExecutor,
) -> None:
    topics.create("t", 2)
    producer.send("t", b"before", partition=1)
    key = partition_key(namespace, "t", 1)
    baseline = blocked_clients(redis_client, key)
    future = pool.submit(fetch, redis_client, namespace, "t", 1, 1, 500, 30_000)
    # The fetch is parked in XREAD BLOCK on the partition's node before the record arrives.
    wait_until(lambda: blocked_clients(redis_client, key) > baseline)
    assert not future.done()
    meta = producer.send("t", b"wake", partition=1)
    res = future.result(timeout=WAIT_S)  # well before the 30 s block: woken by the record
    assert res.error == Errors.NONE
    assert [(r.offset, r.value) for r in res.records] == [(meta.offset, b"wake")]
    assert meta.offset == 1 and res.log_end_offset == 2


def test_block_fetch_times_out_empty(
    topics: Topics, redis_client: Any, namespace: str
) -> None:
    topics.create("t", 1)
    res = fetch(redis_client, namespace, "t", 0, 0, block_ms=200)
    assert (res.error, res.records, res.log_end_offset) == (Errors.NONE, [], 0)
    # Out-of-range answers at once, without blocking.
    res = fetch(redis_client, namespace, "t", 0, 5, block_ms=30_000)
    assert res.error == Errors.OFFSET_OUT_OF_RANGE


def test_block_fetch_takes_whole_milliseconds_only(redis_server: Any, namespace: str) -> None:
    """XREAD BLOCK 0 waits forever, so a fraction must not be truncated to 0. (The client's
    timeout, with redis-py's retries off, ends the endless wait the old code fell into.)"""
    client = redis_server.client(socket_timeout=2, retry=Retry(NoBackoff(), 0))
    try:
        Topics(client, namespace).create("t", 1)
        for bad in (0.5, 1.5, True):
            with pytest.raises(TypeError, match="block_ms must be int"):
                fetch(client, namespace, "t", 0, 0, block_ms=bad)  # type: ignore[arg-type]
        with pytest.raises(InvalidRequestError, match="block_ms must be >= 0"):
            fetch(client, namespace, "t", 0, 0, block_ms=-1)
        res = fetch(client, namespace, "t", 0, 0, block_ms=0)  # no wait at all
        assert (res.error, res.records) == (Errors.NONE, [])
    finally:
        client.close()


def test_counts_and_waits_past_kafkas_int32_and_bad_log_offsets_arguments_are_refused(
    redis_client: Any, namespace: str
) -> None:
    """``block_ms=2**62`` blocked for ever (the server took it), ``2**64`` and a ``max_records``
    of ``2**64`` failed with Redis's raw "out of range"; ``log_offsets`` took any client and
    namespace, and failed with an AttributeError or UNKNOWN_TOPIC_OR_PARTITION."""
    Topics(redis_client, namespace).create("t", 1)
    for kwargs in ({"block_ms": 2**62}, {"block_ms": 2**31}, {"max_records": 2**64}):
        with pytest.raises(InvalidRequestError, match="must be <= 2147483647"):
            fetch(redis_client, namespace, "t", 0, 0, **kwargs)
    with pytest.raises(InvalidRequestError, match="max_records must be <= 2147483647"):
        fetch_many(redis_client, namespace, [("t", 0, 0)], max_records=2**64)
    assert fetch(redis_client, namespace, "t", 0, 0, max_records=2**31 - 1).records == []
    with pytest.raises(TypeError, match="redis_client must be"):
        log_offsets("redis://127.0.0.1:1", namespace, "t", 0)
    with pytest.raises(InvalidRequestError, match="namespace must be"):
        log_offsets(redis_client, "", "t", 0)


# -- key layout -------------------------------------------------------------------------------


def test_each_partition_is_its_own_key_and_tags_do_not_depend_on_the_count() -> None:
    keys = {partition_key("ns", "orders", p) for p in range(50)}
    assert len(keys) == 50
    assert partition_key("ns", "orders", 7) == f"ns:topic:{{{partition_tag('orders', 7)}}}:orders:7"
    # A topic's partitions spread over the slot range: every third of it (one master of an
    # evenly split 3-master cluster) holds some, for any partition count from 6 on.
    for topic in ("orders", "payments", "t", "events.v2"):
        counts = [0, 0, 0]
        for p in range(64):
            counts[keyslot(partition_key("ns", topic, p)) * 3 // SLOTS] += 1
            if p + 1 >= 6:
                assert min(counts) >= 1
                assert max(counts) - min(counts) <= 4


def _retention_rounds(monkeypatch: pytest.MonkeyPatch) -> list[list[Any]]:
    """The rounds of script calls ``apply_retention`` makes from now on, each as the list of
    what its calls were told of the previous call's ``kept``."""
    rounds: list[list[Any]] = []
    run = topics_admin._run

    def counted(r: Any, calls: Any, **kw: Any) -> Any:
        rounds.append([argv[4] for _, _, argv in calls])
        return run(r, calls, **kw)

    monkeypatch.setattr(topics_admin, "_run", counted)
    return rounds
