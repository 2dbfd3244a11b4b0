"""Idempotent appends (Kafka KIP-98): a retried append is never appended twice.

Every test that takes ``redis_client`` runs on one node and on a 3-master cluster. The fault test
at the end runs its own server, because it stops and continues that process.
"""

from __future__ import annotations

import concurrent.futures
import os
import random
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import msgpack
import pytest
import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from rcoord import ConnectionLost, Errors, InvalidRequestError, MockTime
from rcoord.testing.embedded import EmbeddedServer
from rcoord.topics import (
    Producer,
    ProducerRecord,
    RecordMetadata,
    TopicError,
    Topics,
    admin,
    fetch,
    log_offsets,
    producer_state_keys,
)
from rcoord.topics._base import (
    APPEND_IDEMPOTENT,
    PRODUCER_ID_EXPIRATION_MS,
    PRODUCER_PRUNE_PER_CALL,
    PRODUCER_TTL,
    _encode_record,
    _run,
    partition_keys,
    producer_log_key,
)
from rcoord.topics.producer import append_idempotent

WAIT_S = 15.0


@pytest.fixture
def topics(redis_client: Any, namespace: str) -> Topics:
    return Topics(redis_client, namespace)


def values(ns: str, client: Any, topic: str, partition: int) -> list[bytes | None]:
    return [r.value for r in fetch(client, ns, topic, partition, 0, max_records=1_000_000).records]


def append(
    client: Any, ns: str, topic: str, partition: int, pid: str, epoch: int, first: int,
    vals: Sequence[bytes], *, lost: int | None = None, now: int | None = None,
    expiration: int = PRODUCER_ID_EXPIRATION_MS, modulus: int | None = None,
) -> list[Any]:
    """One call of the append script, exactly as the Producer sends it (so a test can resend it);
    ``modulus``: as ``append_idempotent(wrapping=True)`` sends Kafka's sequences."""
    args: list[Any] = [
        "" if now is None else now, pid, epoch, first, "" if lost is None else lost,
        expiration, PRODUCER_PRUNE_PER_CALL, "" if modulus is None else modulus,
    ]
    for v in vals:
        args.extend(_encode_record(ProducerRecord(v)))
    (res,) = _run(client, [(APPEND_IDEMPOTENT, partition_keys(ns, topic, partition), args)])
    return list(res)


def ok(res: list[Any]) -> tuple[int, int, list[int]]:
    """(offset of the first appended record or -1, duplicates, their offsets) of a NONE reply."""
    assert res[0] == b"NONE", res
    first = int(res[1].decode().split("-")[1]) - 1 if res[1] else -1
    return first, int(res[3]), [int(o) for o in res[4]]


def error(res: list[Any]) -> Errors:
    return Errors.from_name(res[0])


class ReplayingClient:
    """Runs every script call twice and returns the second reply: what redis-py does when it
    resends a command on a new connection after the first attempt already ran."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.replays = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def evalsha(self, *args: Any) -> Any:
        self._inner.evalsha(*args)
        self.replays += 1
        return self._inner.evalsha(*args)

    def pipeline(self, transaction: bool = False) -> ReplayingPipeline:
        return ReplayingPipeline(self)


class ReplayingPipeline:
    def __init__(self, owner: ReplayingClient) -> None:
        self._owner = owner
        self._commands: list[tuple[Any, ...]] = []

    def execute_command(self, *args: Any) -> None:
        self._commands.append(args)

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        result: list[Any] = []
        for _ in range(2):
            pipe = self._owner._inner.pipeline(transaction=False)
            for command in self._commands:
                pipe.execute_command(*command)
            result = pipe.execute(raise_on_error=raise_on_error)
        self._owner.replays += 1
        return result


# -- duplicates -------------------------------------------------------------------------------


def test_a_resent_script_call_appends_nothing(
    topics: Topics, redis_client: Any, namespace: str
) -> None:
    topics.create("t", 1)
    vals = [f"v{i}".encode() for i in range(5)]
    assert ok(append(redis_client, namespace, "t", 0, "p", 0, 0, vals)) == (0, 0, [])
    # The same call again (a retry whose first attempt ran): all five are duplicates.
    assert ok(append(redis_client, namespace, "t", 0, "p", 0, 0, vals)) == (-1, 5, [0, 1, 2, 3, 4])
    assert values(namespace, redis_client, "t", 0) == vals
    assert log_offsets(redis_client, namespace, "t", 0) == (0, 5)


def test_client_that_resends_every_call(
    topics: Topics, redis_client: Any, namespace: str
) -> None:
    topics.create("t", 3)
    client = ReplayingClient(redis_client)
    recs = [ProducerRecord(f"v{i}".encode(), partition=i % 3) for i in range(30)]

    metas = Producer(client, namespace, producer_id="a").send_batch("t", recs)  # one pipeline
    metas += [Producer(client, namespace, producer_id="b").send("t", b"single", partition=1)]
    assert client.replays == 2
    # The second run of each call found its records appended; the caller sees the offsets.
    assert all(m.duplicate for m in metas)
    assert [m.offset for m in metas] == [i // 3 for i in range(30)] + [10]
    for p in range(3):
        expected = [r.value for r in recs if r.partition == p] + ([b"single"] if p == 1 else [])
        assert values(namespace, redis_client, "t", p) == expected

    # Control: without idempotence the same client writes every record twice.
    Producer(client, namespace, idempotent=False).send("t", b"twice", partition=0)
    assert values(namespace, redis_client, "t", 0)[-2:] == [b"twice", b"twice"]


def test_spark_replay_same_id_and_epoch_then_a_later_epoch(
    topics: Topics, redis_client: Any, namespace: str
) -> None:
    """The Spark sink: a fresh Producer per task, id per (query, task partition), epoch = batch."""
    topics.create("t", 3)
    pid = "spark:q-1f3a:4"
    recs = [ProducerRecord(f"row{i}".encode(), key=f"k{i}".encode()) for i in range(40)]

    first = Producer(redis_client, namespace, producer_id=pid, producer_epoch=7)
    assert first.producer_id == pid
    metas = first.send_batch("t", recs[:25]) + first.send_batch("t", recs[25:])
    assert not any(m.duplicate for m in metas)
    before = {p: values(namespace, redis_client, "t", p) for p in range(3)}

    # The task is retried: a new instance, same id and epoch, same records in the same order,
    # batched differently. Nothing is appended; every record reports where it already is.
    replay = Producer(redis_client, namespace, producer_id=pid, producer_epoch=7)
    again = replay.send_batch("t", recs[:10]) + replay.send_batch("t", recs[10:])
    assert all(m.duplicate for m in again)
    assert [(m.partition, m.offset, m.timestamp_ms) for m in again] == [
        (m.partition, m.offset, m.timestamp_ms) for m in metas
    ]
    assert {p: values(namespace, redis_client, "t", p) for p in range(3)} == before

    # The next micro-batch (a later epoch) appends, from sequence 0 again.
    later = Producer(redis_client, namespace, producer_id=pid, producer_epoch=8)
    new = later.send_batch("t", recs[:5])
    assert not any(m.duplicate for m in new)
    for p in range(3):
        mine = [r.value for r, m in zip(recs[:5], new) if m.partition == p]
        assert values(namespace, redis_client, "t", p) == before[p] + mine

    # The old epoch's task, still running somewhere (a zombie), is fenced.
    with pytest.raises(TopicError) as err:
        first.send_batch("t", recs[:5])
    assert err.value.error == Errors.PRODUCER_FENCED
    assert not err.value.retriable


def test_replay_with_more_records_appends_only_the_new_tail(
    topics: Topics, redis_client: Any, namespace: str
) -> None:
    topics.create("t", 1)
    recs = [ProducerRecord(f"r{i}".encode(), partition=0) for i in range(8)]
    Producer(redis_client, namespace, producer_id="x", producer_epoch=1).send_batch("t", recs[:5])
    metas = Producer(redis_client, namespace, producer_id="x", producer_epoch=1).send_batch("t", recs)
    assert [(m.offset, m.duplicate) for m in metas] == [
        (0, True), (1, True), (2, True), (3, True), (4, True), (5, False), (6, False), (7, False)
    ]
    assert values(namespace, redis_client, "t", 0) == [r.value for r in recs]


def test_partial_overlap_at_the_script(topics: Topics, redis_client: Any, namespace: str) -> None:
    topics.create("t", 1)
    vals = [f"v{i}".encode() for i in range(8)]
    append(redis_client, namespace, "t", 0, "p", 0, 0, vals[:5])
    # Sequences 3..7: 3 and 4 are duplicates, 5..7 are appended at offsets 5..7.
    assert ok(append(redis_client, namespace, "t", 0, "p", 0, 3, vals[3:])) == (5, 2, [3, 4])
    assert values(namespace, redis_client, "t", 0) == vals


def test_old_batches_are_forgotten_after_five(
    topics: Topics, redis_client: Any, namespace: str
) -> None:
    topics.create("t", 1)
    for b in range(7):  # seven one-record batches: sequences 0..6
        append(redis_client, namespace, "t", 0, "p", 0, b, [f"b{b}".encode()])
    # Still duplicates, but only the last five batches' offsets are remembered.
    first, dup, offsets = ok(append(redis_client, namespace, "t", 0, "p", 0, 0,
                                    [f"b{b}".encode() for b in range(7)]))
    assert (first, dup, offsets) == (-1, 7, [-1, -1, 2, 3, 4, 5, 6])
    assert log_offsets(redis_client, namespace, "t", 0) == (0, 7)


# -- sequence and epoch checks ----------------------------------------------------------------


def test_a_gap_is_out_of_order_and_changes_nothing(
    topics: Topics, redis_client: Any, namespace: str
) -> None:
    topics.create("t", 1)
    append(redis_client, namespace, "t", 0, "p", 0, 0, [b"a", b"b"])
    res = append(redis_client, namespace, "t", 0, "p", 0, 3, [b"d"])
    assert error(res) == Errors.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert b"expected 2" in res[1]
    assert log_offsets(redis_client, namespace, "t", 0) == (0, 2)
    # The state did not move: sequence 2 is still the next one.
    assert ok(append(redis_client, namespace, "t", 0, "p", 0, 2, [b"c"])) == (2, 0, [])


def test_a_gap_the_producer_declares_lost_is_accepted_and_stays_lost(
    topics: Topics, redis_client: Any, namespace: str
) -> None:
    topics.create("t", 1)
    append(redis_client, namespace, "t", 0, "p", 0, 0, [b"a", b"b"])
    # Sequences 2..3 went out in a call whose outcome the producer never learnt.
    assert ok(append(redis_client, namespace, "t", 0, "p", 0, 4, [b"e"], lost=2)) == (2, 0, [])
    # If that call reaches the server late, it is refused, never appended: not a duplicate
    # either, which would tell a replay (below) that its records are stored.
    res = append(redis_client, namespace, "t", 0, "p", 0, 2, [b"c", b"d"])
    assert error(res) == Errors.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert b"sequence 2 again, which it declared lost when it went on at sequence 4" in res[1]
    assert res[2:] == [5, b"lost"]
    # A call overlapping the gap by one record is refused whole; around it, duplicates.
    assert error(append(redis_client, namespace, "t", 0, "p", 0, 1, [b"b", b"c"])) == \
        Errors.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert ok(append(redis_client, namespace, "t", 0, "p", 0, 0, [b"a", b"b"])) == (-1, 2, [0, 1])
    assert ok(append(redis_client, namespace, "t", 0, "p", 0, 4, [b"e"])) == (-1, 1, [2])
    assert values(namespace, redis_client, "t", 0) == [b"a", b"b", b"e"]
    # A declared loss does not excuse a gap before it.
    res = append(redis_client, namespace, "t", 0, "p", 0, 9, [b"x"], lost=7)
    assert error(res) == Errors.OUT_OF_ORDER_SEQUENCE_NUMBER


def test_a_replay_is_told_a_record_its_first_run_lost_is_not_stored(
    topics: Topics, redis_client: Any, namespace: str
) -> None:
    """A replay (a new Producer, same id and epoch, same records in the same order) of a run
    in which one call failed before it was appended: that record is refused, not reported
    stored. Before, it came back ``duplicate=True`` at offset -1 and was never appended."""
    topics.create("t", 1)
    recs = [ProducerRecord(v, partition=0) for v in (b"A", b"B", b"C")]
    client = FailingClient(redis_client)
    first = Producer(client, namespace, producer_id="job-1", producer_epoch=3)
    first.send_batch("t", recs[:1])
    client.fail = "before"
    with pytest.raises(ConnectionLost):
        first.send_batch("t", recs[1:2])
    assert first.send_batch("t", recs[2:])[0].offset == 1  # the gap is accepted once
    assert values(namespace, redis_client, "t", 0) == [b"A", b"C"]

    replay = Producer(redis_client, namespace, producer_id="job-1", producer_epoch=3)
    assert replay.send_batch("t", recs[:1])[0].duplicate
    with pytest.raises(TopicError) as err:
        replay.send_batch("t", recs[1:2])
    assert err.value.error == Errors.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert "sequence 1 again, which it declared lost" in str(err.value)
    assert "higher producer_epoch" in str(err.value)
    # The same replay in one call: refused whole, nothing appended, nothing said stored.
    again = Producer(redis_client, namespace, producer_id="job-1", producer_epoch=3)
    with pytest.raises(TopicError):
        again.send_batch("t", recs)
    assert values(namespace, redis_client, "t", 0) == [b"A", b"C"]
    # A higher epoch stores the record.
    Producer(redis_client, namespace, producer_id="job-1", producer_epoch=4).send_batch(
        "t", recs[1:2])
    assert values(namespace, redis_client, "t", 0) == [b"A", b"C", b"B"]


def test_a_replay_split_in_several_script_calls_stops_at_the_refused_one(
    topics: Topics, redis_client: Any, namespace: str
) -> None:
    """A replay whose call spans several script calls of one partition (over
    ``max_request_size`` here; over 1,000 records by default): the script call that resends
    the lost sequence is refused, and the calls after it are not sent, so the call appended
    nothing from that sequence on, as its error says. Before, the later calls were sent and
    their new records appended while the error said "This call appended nothing": resent
    under a higher epoch as it advised, they were stored twice."""
    topics.create("t", 1)
    recs = [ProducerRecord(b"%04d" % i + b"x" * 396, partition=0) for i in range(8)]
    client = FailingClient(redis_client)
    first = Producer(client, namespace, producer_id="job", producer_epoch=0,
                     max_request_size=1000)  # two records per script call
    first.send_batch("t", recs[0:2])
    client.fail = "before"
    with pytest.raises(ConnectionLost):
        first.send_batch("t", recs[2:4])
    first.send_batch("t", recs[4:6])  # the gap (sequences 2 and 3) declared lost
    stored = [b"0000", b"0001", b"0004", b"0005"]
    assert [v[:4] for v in values(namespace, redis_client, "t", 0)] == stored

    replay = Producer(redis_client, namespace, producer_id="job", producer_epoch=0,
                      max_request_size=1000)
    with pytest.raises(TopicError) as err:
        replay.send_batch("t", recs)  # script calls [0,1] [2,3] [4,5] [6,7]
    assert err.value.error == Errors.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert "This call appended nothing;" in str(err.value)
    assert [v[:4] for v in values(namespace, redis_client, "t", 0)] == stored
    # Its advice holds: the records it did not store, sent under a higher epoch, are stored once.
    Producer(redis_client, namespace, producer_id="job", producer_epoch=1).send_batch(
        "t", recs[2:4] + recs[6:])
    assert [v[:4] for v in values(namespace, redis_client, "t", 0)] == stored + [
        b"0002", b"0003", b"0006", b"0007"]


def _skipped_ranges(client: Any, namespace: str) -> list[list[int]]:
    """The skipped-range entries of producer "p"'s state in t-0: (first, -2 - last, kind, 0).
    Each also reads, to an older rcoord's script, as a batch that holds no sequence."""
    state, _ = producer_state_keys(namespace, "t", 0)
    v = msgpack.unpackb(client.hget(state, "p"))
    entries = [v[i:i + 4] for i in range(3, len(v), 4)]
    return [e for e in entries if e[1] < e[0] and e[1] < 0]


def test_gaps_beyond_those_kept_make_their_sequences_unknown_not_duplicates(
    topics: Topics, redis_client: Any, namespace: str
) -> None:
    """The state keeps the last 16 declared gaps of an epoch; an older one joins a range of
    unknown outcome, where a sequence in no remembered batch is refused (it may be a gap), while
    the kept batches, and sequences below that range, still answer as duplicates."""
    topics.create("t", 1)
    seq = 0
    for i in range(19):  # a record, then a gap of one and a record, 18 times: gaps 1, 3, ..., 35
        assert ok(append(redis_client, namespace, "t", 0, "p", 0, seq, [b"%d" % i],
                         lost=None if i == 0 else seq - 1))[1] == 0
        seq += 2
    ranges = _skipped_ranges(redis_client, namespace)
    assert ranges[0] == [1, -2 - 3, -2, 0]  # gaps 1 and 3 (and 2 between them): unknown
    assert [r[0] for r in ranges[1:]] == list(range(5, 36, 2)) and len(ranges) == 17
    assert all(r[2] == -1 for r in ranges[1:])
    # Sequence 0, below them, is a duplicate; 2 was appended but is no longer known to be.
    assert ok(append(redis_client, namespace, "t", 0, "p", 0, 0, [b"0"])) == (-1, 1, [-1])
    res = append(redis_client, namespace, "t", 0, "p", 0, 2, [b"1"])
    assert error(res) == Errors.OUT_OF_ORDER_SEQUENCE_NUMBER and res[3] == b"unknown"
    assert b"sequence 2 again, whose call failed and whose outcome is no longer known" in res[1]
    # Sequence 34, the last batch's, is a duplicate; 33, a kept gap, is refused as lost.
    assert ok(append(redis_client, namespace, "t", 0, "p", 0, 34, [b"17"])) == (-1, 1, [17])
    assert append(redis_client, namespace, "t", 0, "p", 0, 33, [b"x"])[3] == b"lost"
    # A new epoch starts without any.
    assert ok(append(redis_client, namespace, "t", 0, "p", 1, 0, [b"e1"]))[1] == 0
    assert _skipped_ranges(redis_client, namespace) == []


def test_a_loss_declared_after_the_state_expired_is_of_unknown_outcome(
    topics: Topics, redis_client: Any, namespace: str
) -> None:
    """A reviewer's repro: the state expired between the failed call and the next one, so the
    next call started a new state, and a replay of the lost record was told it was a
    duplicate. Those sequences are now of unknown outcome; those below them were acknowledged."""
    topics.create("t", 1)
    exp = 10_000
    for first, vals, lost, now in ((0, [b"a", b"b"], None, 1_000),
                                   (4, [b"e"], 2, 1_000 + exp)):  # 2..3 failed; idle till expiry
        assert ok(append(redis_client, namespace, "t", 0, "p", 0, first, vals, lost=lost,
                         now=now, expiration=exp))[1] == 0
    assert _skipped_ranges(redis_client, namespace) == [[2, -2 - 3, -2, 0]]
    res = append(redis_client, namespace, "t", 0, "p", 0, 3, [b"d"], now=1_000 + exp,
                 expiration=exp)
    assert error(res) == Errors.OUT_OF_ORDER_SEQUENCE_NUMBER and res[3] == b"unknown"
    assert ok(append(redis_client, namespace, "t", 0, "p", 0, 1, [b"b"], now=1_000 + exp,
                     expiration=exp)) == (-1, 1, [-1])
    assert values(namespace, redis_client, "t", 0) == [b"a", b"b", b"e"]


def expire_twice_declaring_losses(topics: Topics, redis_client: Any, namespace: str) -> int:
    """Producer "p" on t-0: a and b stored (0, 1); after an expiry e at 4, declaring 2..3 lost;
    after a second g at 6, declaring 5 lost. The expiration used (the clock ends at 1,000 ms
    plus twice that)."""
    topics.create("t", 1)
    exp = 10_000
    for first, vals, lost, now in ((0, [b"a", b"b"], None, 1_000),
                                   (4, [b"e"], 2, 1_000 + exp),
                                   (6, [b"g"], 5, 1_000 + 2 * exp)):
        assert ok(append(redis_client, namespace, "t", 0, "p", 0, first, vals, lost=lost,
                         now=now, expiration=exp))[1] == 0
    return exp


def test_ranges_of_unknown_outcome_outlive_a_second_expiry(
    topics: Topics, redis_client: Any, namespace: str
) -> None:
    """The range of unknown outcome a state started with (2..3, declared lost after an expiry)
    is carried by the next state started after another expiry, beside that one's declared loss
    (5): before, the second new state dropped 2..3, and a replay of sequence 2 was answered a
    duplicate at offset -1, though it may never have been stored. Kept apart, not joined: 4
    was stored in between (test_review72b_appends)."""
    exp = expire_twice_declaring_losses(topics, redis_client, namespace)
    assert _skipped_ranges(redis_client, namespace) == [[2, -2 - 3, -2, 0], [5, -2 - 5, -2, 0]]
    for resent in (2, 5):
        res = append(redis_client, namespace, "t", 0, "p", 0, resent, [b"x"],
                     now=1_000 + 2 * exp, expiration=exp)
        assert error(res) == Errors.OUT_OF_ORDER_SEQUENCE_NUMBER and res[3] == b"unknown"
    assert values(namespace, redis_client, "t", 0) == [b"a", b"b", b"e", b"g"]


def test_ranges_of_unknown_outcome_beyond_those_kept_join_the_oldest(
    topics: Topics, redis_client: Any, namespace: str
) -> None:
    """Each of 17 states, started after an expiry, declares one sequence lost (1, 3, ... 33):
    the ranges are kept apart up to 16, and then the oldest two join, with the stored sequence
    between them (2), whose replay is refused as unknown from then on; the state stays
    bounded."""
    topics.create("t", 1)
    exp = 10_000
    assert ok(append(redis_client, namespace, "t", 0, "p", 0, 0, [b"a"], now=1_000,
                     expiration=exp))[1] == 0
    for i in range(1, 18):
        assert ok(append(redis_client, namespace, "t", 0, "p", 0, 2 * i, [b"x"], lost=2 * i - 1,
                         now=1_000 + i * exp, expiration=exp))[1] == 0
    ranges = _skipped_ranges(redis_client, namespace)
    assert ranges == [[1, -2 - 3, -2, 0]] + [[s, -2 - s, -2, 0] for s in range(5, 35, 2)]
    res = append(redis_client, namespace, "t", 0, "p", 0, 2, [b"x"], now=1_000 + 17 * exp,
                 expiration=exp)
    assert error(res) == Errors.OUT_OF_ORDER_SEQUENCE_NUMBER and res[3] == b"unknown"


SEQ_MAX = (1 << 31) - 1  # a Kafka producer's top sequence; 0 comes next


def test_kafka_sequences_wrap_after_int_max(
    topics: Topics, redis_client: Any, namespace: str
) -> None:
    """wrapping=True (the gateway's Kafka producers): sequence 0 follows 2**31 - 1, as Kafka's
    ProducerAppendInfo.inSequence has it, and a batch may span the wrap. Before, sequences
    after the wrap were below the last one: taken for duplicates, acknowledged, never appended
    (data loss)."""
    topics.create("t", 1)

    def send(first: int, vals: list[bytes], pid: str = "k") -> list[tuple[int, bool]]:
        metas = append_idempotent(redis_client, namespace, "t", 0, vals, producer_id=pid,
                                  producer_epoch=0, base_sequence=first, atomic=True,
                                  wrapping=True)
        return [(m.offset, m.duplicate) for m in metas]

    assert send(SEQ_MAX - 1, [b"a", b"b"]) == [(0, False), (1, False)]  # ends at the top
    assert send(0, [b"c"]) == [(2, False)]  # the wrap: next is 0
    # A batch spanning the wrap (2**31 - 3 .. 1), then the one after it.
    assert send(SEQ_MAX - 2, [b"s0", b"s1", b"s2", b"s3", b"s4"], "span") == [
        (3 + i, False) for i in range(5)]
    assert send(2, [b"t"], "span") == [(8, False)]
    # Retries across the wrap are duplicates with their original offsets, appended nothing.
    assert send(SEQ_MAX - 2, [b"s0", b"s1", b"s2", b"s3", b"s4"], "span") == [
        (3 + i, True) for i in range(5)]
    assert send(SEQ_MAX - 1, [b"a", b"b"]) == [(0, True), (1, True)]
    # Out of order across the wrap: expected 3 (span) and 1 (k).
    for pid, first, expected in (("span", 4, 3), ("k", 2, 1), ("k", SEQ_MAX // 2, 1)):
        with pytest.raises(TopicError) as err:
            send(first, [b"x"], pid)
        assert err.value.error == Errors.OUT_OF_ORDER_SEQUENCE_NUMBER
        # The message speaks Kafka's numbers, not the unwrapped ones the state keeps.
        assert f"sent sequence {first}, expected {expected}" in str(err.value)
    assert send(3, [b"u"], "span") == [(9, False)]
    assert send(1, [b"d"]) == [(10, False)]
    assert values(namespace, redis_client, "t", 0) == [
        b"a", b"b", b"c", b"s0", b"s1", b"s2", b"s3", b"s4", b"t", b"u", b"d"]
    # A new epoch starts at 0 and only there, wrapped or not.
    with pytest.raises(TopicError):
        append_idempotent(redis_client, namespace, "t", 0, [b"x"], producer_id="k",
                          producer_epoch=1, base_sequence=SEQ_MAX, wrapping=True)
    # The wrapped state is not rcoord's native numbering: without wrapping, 0..2 after the top
    # stay what they are there, sequences already passed (duplicates).
    assert ok(append(redis_client, namespace, "t", 0, "native", 0, SEQ_MAX, [b"n"])) == (
        11, 0, [])
    assert ok(append(redis_client, namespace, "t", 0, "native", 0, SEQ_MAX + 1, [b"m"])) == (
        12, 0, [])
    assert ok(append(redis_client, namespace, "t", 0, "native", 0, 0, [b"n"])) == (-1, 1, [-1])


def test_a_kafka_batch_is_a_duplicate_only_when_it_is_one_the_partition_remembers(
    topics: Topics, redis_client: Any, namespace: str
) -> None:
    """A Kafka producer with batches in flight: B1 (sequences 0..2) fails before it is
    written, B2 (3..5) gets in and starts the producer's state (a new producer may start
    anywhere), B1 is sent again. Before, B1 counted as appended (its sequences are below the
    last), was answered duplicate with offset -1 (DUPLICATE_SEQUENCE_NUMBER through the
    gateway, which Kafka's Sender completes as a success) and never stored: lost. Kafka's
    broker answers OUT_OF_ORDER_SEQUENCE_NUMBER for any batch that is not exactly one it
    remembers (ProducerStateEntry.findDuplicateBatch), including one overlapping a stored
    batch, of which rcoord appended the part past the last sequence."""
    topics.create("t", 1)

    def send(first: int, vals: list[bytes]) -> list[tuple[int, bool]]:
        metas = append_idempotent(redis_client, namespace, "t", 0, vals, producer_id="k",
                                  producer_epoch=0, base_sequence=first, atomic=True,
                                  wrapping=True)
        return [(m.offset, m.duplicate) for m in metas]

    assert send(3, [b"b2-3", b"b2-4", b"b2-5"]) == [(0, False), (1, False), (2, False)]
    for first, vals in ((0, [b"b1-0", b"b1-1", b"b1-2"]), (4, [b"x4", b"x5", b"x6"]),
                        (3, [b"b2-3", b"b2-4"])):
        with pytest.raises(TopicError) as err:
            send(first, vals)
        assert err.value.error == Errors.OUT_OF_ORDER_SEQUENCE_NUMBER
        assert f"sent sequences {first}..{first + len(vals) - 1}, expected 6" in str(err.value)
    assert send(3, [b"b2-3", b"b2-4", b"b2-5"]) == [(0, True), (1, True), (2, True)]  # exact
    assert send(6, [b"c"]) == [(3, False)]
    assert values(namespace, redis_client, "t", 0) == [b"b2-3", b"b2-4", b"b2-5", b"c"]


def test_wrapping_arguments_are_checked(redis_client: Any, namespace: str) -> None:
    Topics(redis_client, namespace).create("t", 1)
    for kwargs, match in (({"base_sequence": 1 << 31}, "base_sequence must be < 2147483648"),
                          ({"base_sequence": 0, "lost_from": 0}, "lost_from")):
        with pytest.raises(InvalidRequestError, match=match):
            append_idempotent(redis_client, namespace, "t", 0, [b"x"], producer_id="k",
                              producer_epoch=0, wrapping=True, **kwargs)
    assert values(namespace, redis_client, "t", 0) == []


def test_epochs_fence_and_reset(topics: Topics, redis_client: Any, namespace: str) -> None:
    topics.create("t", 1)
    append(redis_client, namespace, "t", 0, "p", 3, 0, [b"a", b"b"])
    res = append(redis_client, namespace, "t", 0, "p", 2, 2, [b"zombie"])
    assert error(res) == Errors.PRODUCER_FENCED
    # A higher epoch starts again at sequence 0, and nowhere else.
    assert error(append(redis_client, namespace, "t", 0, "p", 4, 2, [b"c"])) == (
        Errors.OUT_OF_ORDER_SEQUENCE_NUMBER)
    assert ok(append(redis_client, namespace, "t", 0, "p", 4, 0, [b"c"])) == (2, 0, [])
    # Epoch 3's sequences are not duplicates any more, they are fenced.
    assert error(append(redis_client, namespace, "t", 0, "p", 3, 0, [b"a"])) == Errors.PRODUCER_FENCED
    assert values(namespace, redis_client, "t", 0) == [b"a", b"b", b"c"]
    # Other producers are not concerned.
    assert ok(append(redis_client, namespace, "t", 0, "other", 0, 0, [b"o"])) == (3, 0, [])


def test_producer_errors_name_the_partition(
    topics: Topics, redis_client: Any, namespace: str
) -> None:
    topics.create("t", 2)
    Producer(redis_client, namespace, producer_id="x", producer_epoch=5).send("t", b"a", partition=1)
    old = Producer(redis_client, namespace, producer_id="x", producer_epoch=4)
    with pytest.raises(TopicError) as err:
        old.send_batch("t", [ProducerRecord(b"b", partition=0), ProducerRecord(b"c", partition=1)])
    assert err.value.error == Errors.PRODUCER_FENCED
    assert "partition 1" in str(err.value)
    assert values(namespace, redis_client, "t", 0) == [b"b"]  # partition 0 had no state: appended


def test_invalid_arguments(redis_client: Any, namespace: str) -> None:
    with pytest.raises(InvalidRequestError):
        Producer(redis_client, namespace, idempotent=False, producer_id="x")
    with pytest.raises(InvalidRequestError):
        Producer(redis_client, namespace, producer_epoch=-1)
    with pytest.raises(InvalidRequestError):
        Producer(redis_client, namespace, producer_epoch=1 << 53)
    with pytest.raises(InvalidRequestError):
        Producer(redis_client, namespace, producer_id="")
    with pytest.raises(TypeError):
        Producer(redis_client, namespace, producer_id=7)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        Producer(redis_client, namespace, producer_epoch="1")  # type: ignore[arg-type]
    with pytest.raises(TopicError) as err:
        Topics(redis_client, namespace).create("t", 1, producer_id_expiration_ms=0)
    assert err.value.error == Errors.INVALID_CONFIG
    assert Producer(redis_client, namespace, idempotent=False).producer_id is None


def test_allocated_ids_are_unique(redis_client: Any, namespace: str) -> None:
    ids = {Producer(redis_client, namespace).producer_id for _ in range(5)}
    assert len(ids) == 5 and all(isinstance(i, str) and i for i in ids)



# -- a failover that loses acknowledged appends -------------------------------------------------


def lose_after(client: Any, ns: str, topic: str, partition: int) -> Callable[[], None]:
    """Snapshot the partition's keys (what an asynchronous replica holds) and return the
    failover: put the snapshot back, dropping every append acknowledged since."""
    snapshot = {k: client.dump(k) for k in partition_keys(ns, topic, partition)}

    def failover() -> None:
        for key, raw in snapshot.items():
            if raw is None:
                client.delete(key)
            else:
                client.restore(key, 0, raw, replace=True)

    return failover


def test_an_allocated_producer_reports_a_lost_append_and_goes_on_at_a_new_epoch(
    topics: Topics, redis_client: Any, namespace: str
) -> None:
    """KIP-360: the send that finds acknowledged records missing raises and names them; the
    producer raises its epoch, so its later sends to every partition are appended again."""
    topics.create("t", 2)
    # Every call runs twice (a resend after a lost reply), so duplicates stay recognised.
    client = ReplayingClient(redis_client)
    producer = Producer(client, namespace)
    producer.send_batch("t", [ProducerRecord(b"a%d" % i, partition=0) for i in range(3)])
    producer.send("t", b"x", partition=1)
    failover = lose_after(redis_client, namespace, "t", 0)
    metas = producer.send_batch("t", [ProducerRecord(b"b%d" % i, partition=0) for i in range(3)])
    assert [m.offset for m in metas] == [3, 4, 5]  # acknowledged ...
    failover()  # ... and lost
    with pytest.raises(TopicError) as err:
        producer.send("t", b"c0", partition=0)
    assert err.value.error == Errors.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert "sequences 3..5 of epoch 0 are missing" in err.value.detail
    assert "moved to epoch 1" in err.value.detail
    assert producer.producer_epoch == 1
    assert values(namespace, redis_client, "t", 0) == [b"a0", b"a1", b"a2"]
    # Later sends work again, on both partitions, from sequence 0 of epoch 1; the replayed
    # call is still taken for a duplicate (appended once, its offset reported).
    for i, value in enumerate([b"c1", b"c2"]):
        meta = producer.send("t", value, partition=0)
        assert (meta.offset, meta.duplicate) == (3 + i, True)
    assert producer.send("t", b"y", partition=1).offset == 1
    assert values(namespace, redis_client, "t", 0) == [b"a0", b"a1", b"a2", b"c1", b"c2"]
    assert values(namespace, redis_client, "t", 1) == [b"x", b"y"]
    pid = producer.producer_id
    assert pid is not None
    # A resend of epoch 1's first call is a duplicate; epoch 0's calls are fenced now.
    assert ok(append(redis_client, namespace, "t", 0, pid, 1, 0, [b"c1"])) == (-1, 1, [3])
    assert error(append(redis_client, namespace, "t", 0, pid, 0, 6, [b"b0"])) == (
        Errors.PRODUCER_FENCED)


def test_a_named_producer_is_told_what_a_lost_append_means_and_what_to_do(
    topics: Topics, redis_client: Any, namespace: str
) -> None:
    """A producer_id of the caller's own keeps its epoch: the partition refuses it from then on,
    and every refusal says which records were lost and to use a higher epoch."""
    topics.create("t", 1)
    producer = Producer(redis_client, namespace, producer_id="sink:q:0", producer_epoch=7)
    producer.send_batch("t", [ProducerRecord(b"a%d" % i, partition=0) for i in range(3)])
    failover = lose_after(redis_client, namespace, "t", 0)
    producer.send_batch("t", [ProducerRecord(b"b%d" % i, partition=0) for i in range(3)])
    failover()
    for attempt in range(2):
        with pytest.raises(TopicError) as err:
            producer.send("t", b"c%d" % attempt, partition=0)
        assert err.value.error == Errors.OUT_OF_ORDER_SEQUENCE_NUMBER
        assert "sequences 3..5 of epoch 7 are missing" in err.value.detail
        assert "higher producer_epoch" in err.value.detail
    assert producer.producer_epoch == 7
    assert values(namespace, redis_client, "t", 0) == [b"a0", b"a1", b"a2"]
    successor = Producer(redis_client, namespace, producer_id="sink:q:0", producer_epoch=8)
    assert successor.send("t", b"d", partition=0).offset == 3


# -- the producer's own bookkeeping -----------------------------------------------------------


class FailingClient:
    """Fails the next script call with a ConnectionError, before or after running it."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.fail: str | None = None  # "before" or "after"

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def evalsha(self, *args: Any) -> Any:
        mode, self.fail = self.fail, None
        if mode == "before":
            raise redis.exceptions.ConnectionError("lost before sending")
        result = self._inner.evalsha(*args)
        if mode == "after":
            raise redis.exceptions.ConnectionError("reply lost")
        return result


@pytest.mark.parametrize("when", ["before", "after"])
def test_a_failed_call_neither_duplicates_nor_blocks_the_partition(
    topics: Topics, redis_client: Any, namespace: str, when: str
) -> None:
    topics.create("t", 1)
    client = FailingClient(redis_client)
    producer = Producer(client, namespace)
    producer.send("t", b"a", partition=0)
    client.fail = when
    with pytest.raises(ConnectionLost):
        producer.send("t", b"b", partition=0)
    # The next append goes through whether or not "b" was appended; "b" is there at most once.
    meta = producer.send("t", b"c", partition=0)
    assert not meta.duplicate
    expected = [b"a", b"b", b"c"] if when == "after" else [b"a", b"c"]
    assert values(namespace, redis_client, "t", 0) == expected
    assert producer.send("t", b"d", partition=0).offset == len(expected)


def test_one_producer_shared_by_threads_keeps_sequences_in_order(
    topics: Topics, redis_client: Any, namespace: str
) -> None:
    topics.create("t", 2)
    producer = Producer(redis_client, namespace)
    threads, per_thread = 8, 40
    barrier = threading.Barrier(threads)

    def produce(t: int) -> list[RecordMetadata]:
        barrier.wait(WAIT_S)
        out = []
        for i in range(per_thread):
            recs = [ProducerRecord(f"{t}:{i}:{j}".encode(), partition=(i + j) % 2) for j in range(3)]
            out += producer.send_batch("t", recs)
        return out

    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        metas = [m for f in [pool.submit(produce, t) for t in range(threads)]
                 for m in f.result(WAIT_S)]
    assert not any(m.duplicate for m in metas)
    for p in (0, 1):
        offsets = sorted(m.offset for m in metas if m.partition == p)
        assert offsets == list(range(len(offsets)))
        vals = values(namespace, redis_client, "t", p)
        assert len(vals) == len(set(vals)) == len(offsets)


# -- expiry, pruning, topic lifecycle ---------------------------------------------------------


def test_state_expires_after_the_topic_setting(
    topics: Topics, redis_client: Any, namespace: str
) -> None:
    clock = MockTime()
    topics.create("t", 1, producer_id_expiration_ms=1000)
    assert topics.describe("t").producer_id_expiration_ms == 1000

    def resend() -> RecordMetadata:
        return Producer(redis_client, namespace, producer_id="x", clock=clock).send(
            "t", b"a", partition=0)

    assert not resend().duplicate
    clock.sleep(999)
    assert resend().duplicate  # a duplicate is not activity: the state still dates from t=0
    clock.sleep(1)
    # 1000 ms without an append: the state is gone, so the same sequence starts it afresh.
    assert not resend().duplicate
    assert values(namespace, redis_client, "t", 0) == [b"a", b"a"]


def test_after_expiry_a_lower_epoch_is_no_longer_fenced(
    topics: Topics, redis_client: Any, namespace: str
) -> None:
    """docs/guarantees.md, "State expires": fencing lives in the state, so it expires with it."""
    clock = MockTime()
    topics.create("t", 1, producer_id_expiration_ms=1000)

    def send(epoch: int, value: bytes) -> RecordMetadata:
        return Producer(redis_client, namespace, producer_id="x", producer_epoch=epoch,
                        clock=clock).send("t", value, partition=0)

    send(5, b"new")
    clock.sleep(999)
    with pytest.raises(TopicError) as err:
        send(4, b"zombie")
    assert err.value.error == Errors.PRODUCER_FENCED
    clock.sleep(1)  # 1000 ms since epoch 5's append (the refusal was no activity)
    meta = send(4, b"late")
    assert (meta.offset, meta.duplicate) == (1, False)
    assert values(namespace, redis_client, "t", 0) == [b"new", b"late"]


def test_state_expires_on_the_server_clock(
    topics: Topics, redis_client: Any, namespace: str
) -> None:
    topics.create("t", 1, producer_id_expiration_ms=200)
    Producer(redis_client, namespace, producer_id="x").send("t", b"a", partition=0)
    appended: list[RecordMetadata] = []

    def resent_and_appended() -> bool:
        meta = Producer(redis_client, namespace, producer_id="x").send("t", b"a", partition=0)
        if not meta.duplicate:
            appended.append(meta)
        return bool(appended)

    deadline = time.monotonic() + WAIT_S
    while not resent_and_appended():
        assert time.monotonic() < deadline, "producer state never expired"
        time.sleep(0.02)
    assert appended[0].offset == 1
    assert values(namespace, redis_client, "t", 0) == [b"a", b"a"]


def test_states_of_a_quiet_partition_expire(
    topics: Topics, redis_client: Any, namespace: str
) -> None:
    """Only a starting producer pruned expired states: once a partition's idempotent producers
    stopped (or only plain producers wrote to it), every state stayed for good, one per past
    producer id, where Kafka expires them after producer.id.expiration.ms. Now the state keys
    expire that long after the partition's last idempotent append (on the server's clock).
    (1 s: the states must still be there when counted after the last send; 100 ms was not
    always, on a loaded machine.)"""
    topics.create("t", 1, producer_id_expiration_ms=1_000)
    state, activity = producer_state_keys(namespace, "t", 0)
    for _ in range(20):  # short-lived producers, one record each
        Producer(redis_client, namespace).send("t", b"x", partition=0)
    assert redis_client.hlen(state) >= 1 and redis_client.zcard(activity) >= 1
    plain = Producer(redis_client, namespace, idempotent=False)
    deadline = time.monotonic() + WAIT_S
    while redis_client.exists(state, activity):
        assert time.monotonic() < deadline, "expired producer states were never removed"
        plain.send("t", b"y", partition=0)  # plain appends go on meanwhile
        time.sleep(0.02)
    # A producer that starts later finds nothing of them and starts afresh.
    meta = Producer(redis_client, namespace, producer_id="late").send("t", b"z", partition=0)
    assert not meta.duplicate
    assert redis_client.hkeys(state) == [b"late"]


def test_pruning_is_bounded_per_call(topics: Topics, redis_client: Any, namespace: str) -> None:
    clock = MockTime()
    topics.create("t", 1, producer_id_expiration_ms=1000)
    state, activity = producer_state_keys(namespace, "t", 0)
    old = 3 * PRODUCER_PRUNE_PER_CALL + 2
    for i in range(old):
        Producer(redis_client, namespace, producer_id=f"old{i}", clock=clock).send(
            "t", b"x", partition=0)
    assert redis_client.hlen(state) == redis_client.zcard(activity) == old
    clock.sleep(1000)
    # Only a starting producer (the one way the state grows) prunes, at most the bound.
    known = Producer(redis_client, namespace, producer_id="old0", clock=clock)
    known.send("t", b"restart", partition=0)  # its own state expired: it starts again
    # The oldest (by activity, then id) went, "old0" among them, which then started afresh.
    left = old - PRODUCER_PRUNE_PER_CALL
    assert redis_client.hlen(state) == redis_client.zcard(activity) == left + 1
    known.send("t", b"again", partition=0)  # a known producer's append does not prune
    assert redis_client.hlen(state) == left + 1
    fresh = 0
    while left:
        Producer(redis_client, namespace, producer_id=f"new{fresh}", clock=clock).send(
            "t", b"y", partition=0)
        fresh += 1
        left = max(0, left - PRODUCER_PRUNE_PER_CALL)
        assert redis_client.hlen(state) == redis_client.zcard(activity) == left + 1 + fresh
    assert sorted(redis_client.hkeys(state)) == sorted(
        [b"old0"] + [f"new{i}".encode() for i in range(fresh)])


def test_delete_and_recreate_starts_clean(
    topics: Topics, redis_client: Any, namespace: str
) -> None:
    topics.create("t", 2)
    Producer(redis_client, namespace, producer_id="x", producer_epoch=5).send_batch(
        "t", [ProducerRecord(b"a", partition=0), ProducerRecord(b"b", partition=1)])
    topics.delete("t")
    for p in (0, 1):
        for key in producer_state_keys(namespace, "t", p):
            assert not redis_client.exists(key)
    # A crashed delete could leave state behind; create clears it anyway.
    state, _ = producer_state_keys(namespace, "t", 0)
    redis_client.hset(state, "x", msgpack.packb([9, 100, 0]))
    topics.create("t", 2)
    assert not redis_client.exists(state)
    # A lower epoch is not fenced and sequence 0 is not a duplicate: the topic is new.
    metas = Producer(redis_client, namespace, producer_id="x", producer_epoch=1).send_batch(
        "t", [ProducerRecord(b"c", partition=0), ProducerRecord(b"d", partition=1)])
    assert [(m.offset, m.duplicate) for m in metas] == [(0, False), (0, False)]
    # Partitions added later start clean too, whatever a crash left.
    new_state, _ = producer_state_keys(namespace, "t", 2)
    redis_client.hset(new_state, "x", msgpack.packb([9, 100, 0]))
    topics.add_partitions("t", 3)
    assert not redis_client.exists(new_state)


# -- the fault that found it ------------------------------------------------------------------


class CountingRetry(Retry):
    """redis-py's Retry, counting the failures it retried (so the test cannot pass vacuously)."""

    def __init__(self) -> None:
        super().__init__(ExponentialBackoff(cap=0.05, base=0.005), retries=200)
        self.retried = 0
        self._count_lock = threading.Lock()

    def __deepcopy__(self, memo: dict[int, Any]) -> CountingRetry:
        return self  # redis-py deep-copies its retry into every connection: share one counter

    def call_with_retry(self, do: Callable[[], Any], fail: Callable[..., Any],
                        *args: Any, **kwargs: Any) -> Any:
        def counting_fail(*a: Any) -> Any:
            with self._count_lock:
                self.retried += 1
            return fail(*a)

        return super().call_with_retry(do, counting_fail, *args, **kwargs)


@pytest.fixture
def own_server(own_server: EmbeddedServer) -> Iterator[EmbeddedServer]:
    """conftest's own_server, never left stopped (these tests SIGSTOP it)."""
    try:
        yield own_server
    finally:
        if own_server.pid is not None:
            os.kill(own_server.pid, signal.SIGCONT)


def test_no_duplicates_when_the_server_stalls_and_redis_py_retries(
    own_server: EmbeddedServer,
) -> None:
    """The tester's fault, bounded: the server is SIGSTOPped 5 times while batches are sent
    through a client with a short socket timeout and redis-py retries; every value must be
    in the topic exactly once, at contiguous offsets."""
    ns, topic, partitions = "fault", "t", 4
    retry = CountingRetry()
    client = own_server.client(
        socket_timeout=0.1, socket_connect_timeout=0.1, retry=retry,
        retry_on_error=[redis.exceptions.TimeoutError, redis.exceptions.ConnectionError],
    )
    reader = own_server.client()
    try:
        Topics(reader, ns).create(topic, partitions)
        producer = Producer(client, ns, partitioner="round_robin")
        pid = own_server.pid
        assert pid is not None
        stalls_done = threading.Event()

        def stall() -> None:
            try:
                for _ in range(5):
                    time.sleep(0.25)
                    os.kill(pid, signal.SIGSTOP)
                    time.sleep(0.5)
                    os.kill(pid, signal.SIGCONT)
            finally:
                os.kill(pid, signal.SIGCONT)
                stalls_done.set()

        staller = threading.Thread(target=stall, daemon=True)
        staller.start()
        # Send until all stalls are over and at least 20k values went out (at most 100k).
        sent, batch = 0, 100
        while (sent < 20_000 or not stalls_done.is_set()) and sent < 100_000:
            producer.send_batch(topic, [f"v{sent + i}".encode() for i in range(batch)])
            sent += batch
        staller.join(WAIT_S)
        assert stalls_done.is_set()
    finally:
        client.close()

    try:
        assert retry.retried > 0, "no retry happened: the stalls missed every call"
        seen: list[bytes | None] = []
        for p in range(partitions):
            records = fetch(reader, ns, topic, p, 0, max_records=1_000_000).records
            assert [r.offset for r in records] == list(range(len(records)))  # contiguous
            seen += [r.value for r in records]
        assert len(seen) == sent
        assert set(seen) == {f"v{i}".encode() for i in range(sent)}  # each value exactly once
    finally:
        reader.close()


def _in_forked_child(send: Callable[[], Any]) -> str:
    """Run ``send`` in a forked child; what it returned or raised, as text."""
    import warnings

    read_end, write_end = os.pipe()
    with warnings.catch_warnings():  # (Python 3.12 warns of a fork in a threaded process)
        warnings.simplefilter("ignore", DeprecationWarning)
        child = os.fork()
    if child == 0:
        try:
            try:
                out = repr(send())
            except BaseException as exc:  # noqa: BLE001 - reported to the parent
                out = f"{type(exc).__name__}: {exc}"
            os.write(write_end, out.encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        text = pipe.read().decode()
    os.waitpid(child, 0)
    return text


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork")
def test_a_forked_child_never_has_its_records_or_the_parents_taken_for_duplicates(
    single_client: redis.Redis, namespace: str
) -> None:
    """A producer used before a fork and then in both processes: the child's copy numbered
    records under the parent's id from the same sequence, so whichever sent second had its
    record dropped as a duplicate and was told it was stored (at the other's offset). The
    child's copy now takes an id of its own; a named producer refuses to send in the child."""
    Topics(single_client, namespace).create("t", 1)
    producer = Producer(single_client, namespace)
    producer.send("t", b"parent before")
    assert "duplicate=False" in _in_forked_child(lambda: producer.send("t", b"child"))
    after = producer.send("t", b"parent after")
    assert not after.duplicate and after.offset == 2
    assert values(namespace, single_client, "t", 0) == [b"parent before", b"child",
                                                        b"parent after"]

    named = Producer(single_client, namespace, producer_id="app-1")
    named.send("t", b"named")
    refused = _in_forked_child(lambda: named.send("t", b"named child"))
    assert refused.startswith("InvalidRequestError") and "before the process forked" in refused
    assert not named.send("t", b"named again").duplicate
    assert values(namespace, single_client, "t", 0)[3:] == [b"named", b"named again"]


def test_an_exception_after_the_append_ran_still_spends_its_sequence_numbers(
    redis_client: Any, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An exception that came after the script call appended, while its reply was read (a
    signal handler's, Ctrl-C's KeyboardInterrupt), left the call's sequence numbers unspent:
    the next send reused them, and the partition dropped its records as duplicates of the
    interrupted call's and reported them stored at that call's offsets."""
    import rcoord.topics.producer as producer_module

    Topics(redis_client, namespace).create("t", 1)
    producer = Producer(redis_client, namespace)
    real = producer_module._id_offset

    def interrupted(entry_id: bytes | str) -> int:
        monkeypatch.setattr(producer_module, "_id_offset", real)
        raise KeyboardInterrupt

    monkeypatch.setattr(producer_module, "_id_offset", interrupted)
    with pytest.raises(KeyboardInterrupt):
        producer.send("t", b"interrupted", partition=0)
    after = producer.send("t", b"next", partition=0)
    assert not after.duplicate and after.offset == 1
    assert values(namespace, redis_client, "t", 0) == [b"interrupted", b"next"]


def test_a_producer_id_is_measured_in_utf8_bytes_and_must_be_utf8(redis_client: Any,
                                                                 namespace: str) -> None:
    """The limit is on bytes, and the error said the length in characters ("1..1024 bytes,
    got 600" for an id of 1,200 bytes); a lone surrogate raised the codec's
    UnicodeEncodeError."""
    with pytest.raises(InvalidRequestError, match=r"1\.\.1024 bytes of UTF-8, got 1200"):
        Producer(redis_client, namespace, producer_id="é" * 600)
    with pytest.raises(InvalidRequestError, match="is not valid UTF-8"):
        Producer(redis_client, namespace, producer_id="id-\udc80")
    with pytest.raises(InvalidRequestError, match=r"got 1200"):
        append_idempotent(redis_client, namespace, "t", 0, [b"v"], producer_id="é" * 600,
                          producer_epoch=0, base_sequence=0)
    assert Producer(redis_client, namespace, producer_id="é" * 512).producer_id == "é" * 512


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork")
def test_forked_children_choose_keyless_partitions_of_their_own(
    single_client: redis.Redis, namespace: str
) -> None:
    """The child's copy of the sticky partitioner's generator was the parent's: every forked
    worker picked the same keyless partitions in the same order (a pre-forking server's
    workers all writing to one partition at a time). A given ``rng`` is kept: it is seeded
    for placements that must repeat."""
    Topics(single_client, namespace).create("t", 64)
    big = ProducerRecord(b"x" * 20_000)  # over batch_size: each choice moves on

    def choices(producer: Producer) -> list[int]:
        return [producer.choose_partition("t", big) for _ in range(8)]

    for producer, alike in ((Producer(single_client, namespace), False),
                            (Producer(single_client, namespace, rng=random.Random(7)), True)):
        producer.choose_partition("t", big)
        in_child = _in_forked_child(lambda: choices(producer))  # noqa: B023 - run at once
        assert (in_child == repr(choices(producer))) is alike


def test_a_raised_expiration_keeps_the_state_keys_of_past_appends(
    topics: Topics, redis_client: Any, namespace: str
) -> None:
    """The state keys expire producer_id_expiration_ms after the partition's last idempotent
    append, set at that append. A later raise of the setting (alter_configs) left them to expire
    at the old, shorter time, though the producer's state is not expired by the new one (the
    script's rule, as Kafka's expiry check uses the current setting): a batch resent then was
    taken for a new producer's and appended twice. The raise now extends them. (The old
    setting is the window for the raise: 1 s, as a loaded machine can hold this thread for
    more than the 300 ms it was.)"""
    old_ms = 1_000
    topics.create("t", 1, producer_id_expiration_ms=old_ms)
    state, activity = producer_state_keys(namespace, "t", 0)
    first = append_idempotent(redis_client, namespace, "t", 0, [b"a"], producer_id="k",
                              producer_epoch=0, base_sequence=0)
    appended_at = _server_ms(redis_client)  # at or after the append
    topics.alter_configs("t", {"producer_id_expiration_ms": 86_400_000})
    deadline = time.monotonic() + WAIT_S
    assert redis_client.exists(state), "the raise came after the old expiry: nothing to keep"
    while _server_ms(redis_client) <= appended_at + old_ms:  # the old expiry is over
        assert time.monotonic() < deadline
        time.sleep(0.01)
    again = append_idempotent(redis_client, namespace, "t", 0, [b"a"], producer_id="k",
                              producer_epoch=0, base_sequence=0)
    assert again[0].duplicate and again[0].offset == first[0].offset
    assert values(namespace, redis_client, "t", 0) == [b"a"]
    assert redis_client.pttl(state) > 60_000 and redis_client.pttl(activity) > 60_000


def test_an_append_with_the_setting_before_a_raise_does_not_cut_the_keys_back(
    topics: Topics, redis_client: Any, namespace: str
) -> None:
    """A caller that still has the setting from before a raise (a Producer's cached metadata,
    up to metadata_max_age_ms) set the state keys to expire the old, shorter time after its
    append, undoing the raise's extension: the keys only ever expire later now."""
    topics.create("t", 1, producer_id_expiration_ms=300)
    state, activity = producer_state_keys(namespace, "t", 0)
    stale = Producer(redis_client, namespace, producer_id="s", metadata_max_age_ms=600_000)
    stale.send("t", b"a", partition=0)  # (reads and keeps the setting: 300 ms)
    topics.alter_configs("t", {"producer_id_expiration_ms": 86_400_000})
    assert redis_client.pttl(state) > 60_000  # (the raise extended them)
    stale.send("t", b"b", partition=0)  # with its cached 300 ms
    assert redis_client.pttl(state) > 60_000 and redis_client.pttl(activity) > 60_000


def test_a_raised_expiration_extends_the_append_logs_too(
    topics: Topics, redis_client: Any, namespace: str
) -> None:
    """A producer's append log (``Producer(log_appends=True)``, what a retried Spark task reads
    through ``epoch_appends``) lives as long as its state. A raise of the setting extended the
    state keys but left each log at the old time: a task retried between the two found its
    state but no log, and could store its rows again. An append by a caller with the setting
    from before the raise does not cut the log back either."""
    topics.create("t", 1, producer_id_expiration_ms=5_000)
    logger = Producer(redis_client, namespace, producer_id="spark:q:0", producer_epoch=7,
                      log_appends=True, metadata_max_age_ms=600_000)
    logger.send("t", b"x", partition=0)  # (keeps the setting it read: 5 s)
    log = producer_log_key(namespace, "t", 0, "spark:q:0")
    assert 0 < redis_client.pttl(log) <= 5_000
    topics.alter_configs("t", {"producer_id_expiration_ms": 600_000})
    assert redis_client.pttl(log) > 60_000
    logger.send("t", b"y", partition=0)  # with its cached 5 s
    assert redis_client.pttl(log) > 60_000


def test_a_log_started_under_a_setting_from_before_a_raise_gets_the_raised_one(
    topics: Topics, redis_client: Any, namespace: str
) -> None:
    """A producer whose cached setting predates a raise (``metadata_max_age_ms``) starts an
    append log (its first send to a partition in this epoch): the log got the old expiry, so
    a retried Spark task found the state but no log and could store its rows again."""
    topics.create("t", 2, producer_id_expiration_ms=5_000)
    Producer(redis_client, namespace, producer_id="spark:q:0", producer_epoch=6).send(
        "t", b"older epoch", partition=0)
    logger = Producer(redis_client, namespace, producer_id="spark:q:0", producer_epoch=7,
                      log_appends=True, metadata_max_age_ms=600_000)
    logger.send("t", b"x", partition=1)  # (keeps the setting it read: 5 s)
    topics.alter_configs("t", {"producer_id_expiration_ms": 600_000})
    logger.send("t", b"y", partition=0)  # a new epoch there: its log starts, cached 5 s
    assert redis_client.pttl(producer_log_key(namespace, "t", 0, "spark:q:0")) > 60_000


def test_a_raise_reaches_a_partition_without_producer_state_too(
    topics: Topics, redis_client: Any, namespace: str
) -> None:
    """A raise while a partition holds no producer state: a producer that starts there with the
    setting it read before gives its state and append log the raised lifetime too."""
    topics.create("t", 1, producer_id_expiration_ms=5_000)
    logger = Producer(redis_client, namespace, producer_id="spark:q:0", producer_epoch=1,
                      log_appends=True, metadata_max_age_ms=600_000)
    logger.partition_count("t")  # (reads the setting: 5 s)
    topics.alter_configs("t", {"producer_id_expiration_ms": 600_000})
    logger.send("t", b"x", partition=0)
    state, activity = producer_state_keys(namespace, "t", 0)
    assert redis_client.pttl(producer_log_key(namespace, "t", 0, "spark:q:0")) > 60_000
    assert redis_client.pttl(state) > 60_000 and redis_client.pttl(activity) > 60_000


def test_a_log_started_while_a_raise_is_stored_gets_the_raised_setting(
    topics: Topics, redis_client: Any, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """alter_configs reads each partition's producers, then extends their append logs in a
    script: a producer whose first append landed between the two, with the setting it read
    before the raise, kept its log at the old expiry (a retried Spark task then found the
    state but no log). The script names the producers it was not given, and they are extended
    too."""
    topics.create("t", 1, producer_id_expiration_ms=5_000)
    logger = Producer(redis_client, namespace, producer_id="spark:q:0", producer_epoch=1,
                      log_appends=True, metadata_max_age_ms=600_000)
    logger.partition_count("t")  # (reads the setting: 5 s)
    real, sent = admin._run_through_slot_moves, []

    def first_append_in_between(client: Any, calls: Any, timeout_s: float) -> list[Any]:
        if calls and calls[0][0] is PRODUCER_TTL and not sent:
            sent.append(logger.send("t", b"x", partition=0))  # its first append there
        return real(client, calls, timeout_s)

    monkeypatch.setattr(admin, "_run_through_slot_moves", first_append_in_between)
    topics.alter_configs("t", {"producer_id_expiration_ms": 600_000})
    assert sent
    assert redis_client.pttl(producer_log_key(namespace, "t", 0, "spark:q:0")) > 60_000


def test_keys_extended_by_a_raise_keep_the_raised_setting_after_a_stale_append(
    topics: Topics, redis_client: Any, namespace: str
) -> None:
    """A raise extends the state keys to the new setting after the partition's last append; a
    producer with the setting from before the raise that starts there later gave them only
    its old time from its append on, so they went while the setting still kept its state (a
    batch it resent then was appended twice)."""
    topics.create("t", 1, producer_id_expiration_ms=5_000)
    stale = Producer(redis_client, namespace, producer_id="late", metadata_max_age_ms=600_000)
    stale.partition_count("t")  # (reads the setting: 5 s)
    Producer(redis_client, namespace, producer_id="early").send("t", b"a", partition=0)
    state, activity = producer_state_keys(namespace, "t", 0)
    # The partition's last append as if 500 s ago; the raise keeps the keys 600 s after it.
    redis_client.zadd(activity, {"early": _server_ms(redis_client) - 500_000})
    topics.alter_configs("t", {"producer_id_expiration_ms": 600_000})
    assert 0 < redis_client.pttl(state) <= 100_000
    stale.send("t", b"b", partition=0)  # its state lives 600 s by the setting
    assert redis_client.pttl(state) > 500_000 and redis_client.pttl(activity) > 500_000


def test_a_caller_with_the_setting_from_before_a_raise_keeps_a_state_the_raise_keeps(
    topics: Topics, redis_client: Any, namespace: str
) -> None:
    """Whether a state expired was judged by the caller's setting alone: one read before a
    raise took a state idle for longer than the old setting for expired, and a batch resent
    then was appended twice. The topic's current setting rules, as in Kafka; a lowered one
    too, once the callers read it."""
    topics.create("t", 1, producer_id_expiration_ms=5_000)
    assert ok(append(redis_client, namespace, "t", 0, "p", 0, 0, [b"a"], now=1_000,
                     expiration=5_000))[1] == 0
    topics.alter_configs("t", {"producer_id_expiration_ms": 600_000})
    resent = append(redis_client, namespace, "t", 0, "p", 0, 0, [b"a"], now=20_000,
                    expiration=5_000)  # (the setting it read before the raise)
    assert ok(resent)[1] == 1 and values(namespace, redis_client, "t", 0) == [b"a"]
    topics.alter_configs("t", {"producer_id_expiration_ms": 5_000})
    assert ok(append(redis_client, namespace, "t", 0, "p", 0, 0, [b"a"], now=40_000,
                     expiration=5_000))[1] == 0  # expired by the lowered setting: new again


def _server_ms(redis_client: Any) -> int:
    sec, usec = redis_client.time()
    return int(sec) * 1000 + int(usec) // 1000
