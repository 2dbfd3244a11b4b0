"""Fetch through the gateway follows the byte limits: the request's ``max_bytes`` bounds the
whole response (a client drops a response over its own receive limit, then asks again, for
ever), and a partition is read from Redis in steps sized by its records' bytes, so large records
are not pulled 500 at a time into the gateway's memory to send a few."""

from __future__ import annotations

import importlib
from typing import Any

import pytest

pytest.importorskip("kio")

from gateway_harness import connect, fetched_records, fill_backlog, request_frame, response
from test_topics_fetch import _bytes_read, _flat

from rcoord.topics import Producer, ProducerRecord, partition_key

fetch_module = importlib.import_module("rcoord.topics.fetch")  # (`fetch` names the function)

BIG = 40_000


def _fetched(gw: Any, partitions: list[tuple[str, int]], max_bytes: int,
             partition_max_bytes: int) -> dict[tuple[str, int], bytes]:
    """One raw Fetch v12 from offset 0; each partition's records field."""
    by_topic: dict[str, list[int]] = {}
    for t, p in partitions:
        by_topic.setdefault(t, []).append(p)
    sock = connect(gw)
    try:
        sock.sendall(request_frame(1, 12, 7, {
            "replica_id": -1, "max_wait": 0, "min_bytes": 1, "max_bytes": max_bytes,
            "topics": [{"topic": t, "partitions": [
                {"partition": p, "fetch_offset": 0, "partition_max_bytes": partition_max_bytes}
                for p in ps]} for t, ps in by_topic.items()]}))
        fetched = response(sock, 1, 12, 5)
    finally:
        sock.close()
    out = {}
    for t in fetched.responses:
        for p in t.partitions:
            assert p.error_code.value == 0
            out[(t.topic, p.partition_index)] = bytes(p.records or b"")
    return out


def _fetch(gw: Any, partitions: list[tuple[str, int]], max_bytes: int,
           partition_max_bytes: int) -> dict[tuple[str, int], int]:
    """One raw Fetch v12 from offset 0; the number of records each partition got."""
    return {tp: len(fetched_records(data)) for tp, data
            in _fetched(gw, partitions, max_bytes, partition_max_bytes).items()}


def test_the_request_max_bytes_bounds_the_whole_response(gateway, redis_server, topics):
    topics.create("big", 3)
    client = redis_server.client()
    try:
        producer = Producer(client, gateway.config.namespace, idempotent=False)
        for p in range(3):
            producer.send_batch("big", [_record(p) for _ in range(10)])
    finally:
        client.close()
    parts = [("big", 0), ("big", 1), ("big", 2)]
    # 100 KB for the whole response: two records of the first partition, none of the others
    # (as Kafka's readFromLog, only the first partition with records may go over the limit;
    # until 2026-11-29 the second got one record while budget was left, over the limit).
    # Before that, each partition got its own 1 MB: all 30 records, 1.2 MB.
    got = _fetch(gateway, parts, max_bytes=100_000, partition_max_bytes=1 << 20)
    assert got == {("big", 0): 2, ("big", 1): 0, ("big", 2): 0}
    # A budget smaller than one record still delivers the first partition's first record.
    assert _fetch(gateway, parts, max_bytes=1_000, partition_max_bytes=1 << 20) == {
        ("big", 0): 1, ("big", 1): 0, ("big", 2): 0}
    # No budget (max_bytes 0): as Kafka's readFromLog, the first partition with records still
    # sends one, the others none. It was read as no limit: every record of every partition.
    assert _fetch(gateway, parts, max_bytes=0, partition_max_bytes=1 << 20) == {
        ("big", 0): 1, ("big", 1): 0, ("big", 2): 0}
    # A large budget: the partition limits apply (1 MB each: every record).
    assert _fetch(gateway, parts, max_bytes=50 << 20, partition_max_bytes=1 << 20) == {
        ("big", 0): 10, ("big", 1): 10, ("big", 2): 10}


def test_a_partition_of_large_records_is_read_in_steps(gateway, redis_server, topics,
                                                      monkeypatch):
    topics.create("steps", 2)
    client = redis_server.client()
    try:
        producer = Producer(client, gateway.config.namespace, idempotent=False)
        producer.send_batch("steps", [_record(0) for _ in range(100)])
        producer.send_batch("steps", [ProducerRecord(b"x", partition=1) for _ in range(300)])
    finally:
        client.close()
    read = _records_read(monkeypatch, gateway, "steps", 2)
    got = _fetch(gateway, [("steps", 0), ("steps", 1)], max_bytes=50 << 20,
                 partition_max_bytes=100_000)
    # Large records: two fit 100 KB, and two or three were read, not the 100 (up to 500)
    # that one read of FETCH_MAX_RECORDS took before.
    assert got[("steps", 0)] == 2
    assert read[0] <= 3
    # Small records: all 300 still come, in reads sized by the bytes of those before them.
    assert got[("steps", 1)] == 300 and read[1] == 300


def test_the_first_read_of_a_partition_follows_its_byte_limit(gateway, redis_server, topics,
                                                             monkeypatch):
    """Records of 1 MB, partition_max_bytes 1 MiB (librdkafka's and Kafka's default): a Fetch
    reads one or two of them from Redis to send one, the first time (the size not known yet)
    and after (sized by the last Fetch's records). Before, the first read of every partition
    took FETCH_FIRST_READ (32) records, whatever their size: 12 MB here to send 1 MB."""
    topics.create("huge", 1)
    client = redis_server.client()
    try:
        producer = Producer(client, gateway.config.namespace, idempotent=False)
        for _ in range(12):
            producer.send_batch("huge", [ProducerRecord(b"v" * 1_000_000, partition=0)])
    finally:
        client.close()
    reads = _records_read(monkeypatch, gateway, "huge", 1)
    for _ in range(2):
        reads[0] = 0
        assert _fetch(gateway, [("huge", 0)], max_bytes=50 << 20,
                      partition_max_bytes=1 << 20) == {("huge", 0): 1}
        assert 1 <= reads[0] <= 2, reads


def _records_read(monkeypatch: Any, gw: Any, topic: str, partitions: int) -> dict[int, int]:
    """Records read from Redis of each partition of ``topic`` (counted in
    ``rcoord.topics.fetch._fetch_many``, which every read of a Fetch goes through)."""
    keys = {partition_key(gw.config.namespace, topic, p): p for p in range(partitions)}
    read = dict.fromkeys(range(partitions), 0)
    inner = fetch_module._fetch_many

    def counting(client: Any, reads: Any) -> Any:
        answers = inner(client, reads)
        for (key, *_), answer in zip(reads, answers, strict=True):
            if key in keys:
                read[keys[key]] += len(answer.records)
        return answers

    monkeypatch.setattr(fetch_module, "_fetch_many", counting)
    return read


def _record(partition: int) -> ProducerRecord:
    return ProducerRecord(b"v" * BIG, partition=partition)


def _records_bytes(gw: Any, topic: str, partitions: int, max_bytes: int) -> tuple[int, int]:
    """One raw Fetch of every partition from offset 0, each partition's limit max_bytes:
    (bytes of the records fields in all, records)."""
    data = _fetched(gw, [(topic, p) for p in range(partitions)], max_bytes, max_bytes).values()
    return sum(map(len, data)), sum(len(fetched_records(d)) for d in data)


def test_max_bytes_counts_the_batches_a_response_is_made_of(gateway, redis_server, topics):
    """A reviewer's repro: records appended a millisecond apart are a batch each in a Fetch
    (one per timestamp, 61 bytes of header beside a 10-byte value), and the limits counted only
    the records: 1,000 bytes asked, 2,262 sent; librdkafka drops a response over its
    receive.message.max.bytes (fetch.max.bytes + 512) and asks again, for ever. Now what is
    sent is counted, batch headers included; and after the first partition with records none
    goes over the limit (a 900-byte record after three of 300 made 2,116 bytes of 1,000)."""
    import time

    topics.create("ms", 1)
    topics.create("mixed", 2)
    client = redis_server.client()
    try:
        producer = Producer(client, gateway.config.namespace, idempotent=False)
        for _ in range(60):
            producer.send_batch("ms", [ProducerRecord(b"0123456789", partition=0)])
            time.sleep(0.002)  # (a timestamp each, so a batch each: the case counted here)
        producer.send_batch("mixed", [ProducerRecord(b"a" * 250, partition=0)] * 3)
        producer.send_batch("mixed", [ProducerRecord(b"b" * 900, partition=1)])
    finally:
        client.close()
    for limit in (1_000, 4_000):
        sent, count = _records_bytes(gateway, "ms", 1, limit)
        assert 0 < count < 60 and sent <= limit, (limit, sent, count)
    sent, count = _records_bytes(gateway, "mixed", 2, 1_000)
    assert (count, sent <= 1_000) == (3, True), sent  # the 900-byte record waits its turn


@pytest.mark.parametrize(("warm", "behind"), [(False, False), (True, False), (False, True)])
def test_what_a_fetch_reads_follows_its_byte_limit_when_record_sizes_jump(
        gateway, redis_server, topics, monkeypatch, warm, behind):
    """40 records of one byte, then 500 of 20 kB, one Fetch of partition_max_bytes 1 MiB: the
    gateway reads at most about twice that (plus one record) from Redis, with or without the
    record size of an earlier Fetch of only the small records, and behind a partition that
    takes the response's first bytes (read one record first, then with what is left). Before,
    its steps were sized by the average so far with no cap on their growth: 9.2 MB read
    ([32, 468] records) to send 92."""
    topics.create("jump", 2)
    client = redis_server.client()
    try:
        producer = Producer(client, gateway.config.namespace, idempotent=False)
        producer.send_batch("jump", [ProducerRecord(b"s", partition=0) for _ in range(40)])
        if warm:  # (the gateway learns the small size)
            assert _fetch(gateway, [("jump", 0)], 50 << 20, 1 << 20) == {("jump", 0): 40}
        producer.send_batch("jump", [ProducerRecord(b"b" * 20_000, partition=0)
                                     for _ in range(500)])
    finally:
        client.close()
    sizes = _bytes_read(monkeypatch)
    if behind:  # (an empty partition first, and max_bytes leaves the other one no whole bound)
        got = _fetch(gateway, [("jump", 1), ("jump", 0)], max_bytes=(1 << 20) + 1000,
                     partition_max_bytes=1 << 20)
    else:
        got = _fetch(gateway, [("jump", 0)], max_bytes=50 << 20, partition_max_bytes=1 << 20)
    assert 40 + 45 <= got[("jump", 0)] <= 40 + 53, got
    assert sum(sizes) <= 2 * (1 << 20) + 20_100, (len(sizes), sum(sizes))


def _record_bytes_read(monkeypatch: Any) -> list[int]:
    """Bytes of records read from Redis by the gateway: XRANGE's entries (counted in
    ``_answer``; the log offsets read beside each carries no record since 3419b2a, where its
    XINFO STREAM carried the partition's first and last)."""
    read = [0]
    inner = fetch_module._answer

    def counting(offset: int, entries: Any, *rest: Any) -> Any:
        if isinstance(entries, list):
            read[0] += sum(sum(map(len, _flat(fields))) for _, fields in entries)
        return inner(offset, entries, *rest)

    monkeypatch.setattr(fetch_module, "_answer", counting)
    return read


def test_partitions_the_response_has_no_room_for_are_not_read(gateway, redis_server, topics,
                                                            monkeypatch):
    """40 backlogged partitions of 50 kB records, max_bytes and partition_max_bytes 1 MiB: the
    first partition fills the response, and the 39 others have their log offsets read, not
    their records. Before, each of them was read one record, which the response had no room
    for, and the XINFO STREAM beside that read carried two more (the partition's first and
    last records): 7 MB read from Redis in every Fetch to send 1 MB; now 1.1 MB. Once, the
    first Fetch reads a record of each to learn their size."""
    topics.create("many", 40)
    fill_backlog(redis_server, gateway.config.namespace, "many")
    read = _record_bytes_read(monkeypatch)
    parts = [("many", p) for p in range(40)]
    for _ in range(3):
        read[0] = 0
        got = _fetch(gateway, parts, max_bytes=1 << 20, partition_max_bytes=1 << 20)
        assert got[("many", 0)] == 20 and sum(got.values()) == 20
    assert read[0] <= 1_200_000, read


def _by_hand(redis_server: Any, *command: Any) -> Any:
    """One command on its own connection: a stream edited by hand, as rcoord never does."""
    import redis

    client = redis.Redis.from_url(redis_server.url)
    try:
        return client.execute_command(*command)
    finally:
        client.close()


def _fetch_t(gateway: Any, offsets: dict[int, int],
             partition_max_bytes: int = 1 << 20) -> dict[int, Any]:
    """A raw Fetch v12 of topic t's partitions at ``offsets``; the answer per partition."""
    sock = connect(gateway)
    try:
        sock.sendall(request_frame(1, 12, 7, {
            "replica_id": -1, "max_wait": 0, "min_bytes": 1, "max_bytes": 1 << 20,
            "topics": [{"topic": "t", "partitions": [
                {"partition": p, "fetch_offset": o, "partition_max_bytes": partition_max_bytes}
                for p, o in offsets.items()]}]}))
        fetched = response(sock, 1, 12, 5)
    finally:
        sock.close()
    return {p.partition_index: p for t in fetched.responses for p in t.partitions}


def test_an_entry_that_is_not_a_record_is_corrupt_message_for_its_partition_alone(
        gateway, redis_server, topics, namespace):
    """A stream entry added by hand (no timestamp) where a Fetch reads: that partition alone is
    answered CORRUPT_MESSAGE, the other keeps its record. It was UNKNOWN_SERVER_ERROR, which
    Kafka's consumer only logs at WARN before fetching again, for ever (the partition stalled
    without a word to the application); CORRUPT_MESSAGE it throws, so the application can
    seek past the entry (``FetchCollector.handleInitializeErrors``)."""
    topics.create("t", 2)
    Producer(topics._r, namespace).send("t", b"kept", partition=1)
    _by_hand(redis_server, "XADD", partition_key(namespace, "t", 0), "0-*", "v", b"by hand")
    answers = _fetch_t(gateway, {0: 0, 1: 0})
    assert answers[0].error_code.value == 2  # CORRUPT_MESSAGE
    assert answers[1].error_code.value == 0
    assert [r.value for r in fetched_records(bytes(answers[1].records or b""))] == [b"kept"]


def test_a_fetch_at_an_entry_removed_by_hand_is_corrupt_message_for_its_partition_alone(
        gateway, redis_server, topics, namespace):
    """A Fetch that begins at an offset whose entry was removed by hand (XDEL in a stream's
    middle; rcoord removes records only from a log's start): that partition alone is answered
    CORRUPT_MESSAGE, which Kafka's consumer throws so the application can seek past it, the
    other keeps its record, and a Fetch from the next offset reads on. The read raised
    "replaced during each of 3 reads" (UNKNOWN_TOPIC_OR_PARTITION) for an existing partition
    before e112b4f."""
    topics.create("t", 2)
    producer = Producer(topics._r, namespace)
    producer.send_batch("t", [*(ProducerRecord(b"a%d" % i, partition=0) for i in range(3)),
                              ProducerRecord(b"kept", partition=1)])
    assert _by_hand(redis_server, "XDEL", partition_key(namespace, "t", 0), "0-2") == 1
    answers = _fetch_t(gateway, {0: 1, 1: 0})  # (the removed entry held offset 1)
    assert answers[0].error_code.value == 2  # CORRUPT_MESSAGE
    assert answers[1].error_code.value == 0
    assert [r.value for r in fetched_records(bytes(answers[1].records or b""))] == [b"kept"]
    answers = _fetch_t(gateway, {0: 2, 1: 0})
    assert answers[0].error_code.value == 0
    assert [r.value for r in fetched_records(bytes(answers[0].records or b""))] == [b"a2"]


@pytest.mark.parametrize("partition_max_bytes", [1 << 20, 1 << 19], ids=["bounds", "read"])
def test_a_stream_whose_last_id_is_not_rcoords_is_corrupt_message_wherever_it_is_read(
        gateway, redis_server, topics, namespace, partition_max_bytes):
    """A partition whose stream's last id an XADD by hand made (not 0-<seq>) has no log
    offsets. Read with its records (its partition_max_bytes fits the response's max_bytes with
    the ones before it: ``_read``) it was answered CORRUPT_MESSAGE, which Kafka's consumer
    throws so the application hears of it; read for its log offsets alone first (it does not
    fit: ``_bounds``), UNKNOWN_SERVER_ERROR, which Kafka's consumer only logs at WARN before
    fetching again, for ever: the partition stalled without a word to the application."""
    topics.create("t", 2)
    Producer(topics._r, namespace).send("t", b"kept", partition=0)
    _by_hand(redis_server, "XADD", partition_key(namespace, "t", 1), "*", "v", b"by hand")
    answers = _fetch_t(gateway, {0: 0, 1: 0}, partition_max_bytes)
    assert answers[1].error_code.value == 2  # CORRUPT_MESSAGE
    assert answers[0].error_code.value == 0
    assert [r.value for r in fetched_records(bytes(answers[0].records or b""))] == [b"kept"]
