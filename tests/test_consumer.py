"""Consumer: the poll loop, commits, offset resets and the rebalance listener.

The listener's call order and the buffer rules run on the function-field fake coordinator of
test_client_group (deterministic); the rest runs on a real server, one node and a cluster.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import threading
import tracemalloc
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from harness import wait_until, without_join_delay
from redis.backoff import NoBackoff
from redis.retry import Retry as RedisRetry
from test_client_group import WAIT_S, OneMemberGroup, fast_config

from rcoord import Errors, GroupCoordinator, MemberIdentity, OffsetAndMetadata, TopicPartition
from rcoord.client import (
    CommitFailedError,
    Consumer,
    ConsumerGroupConfig,
    ConsumerRebalanceListener,
    ConsumerRecord,
    IllegalStateError,
    JoinRefusedError,
    NoOffsetForPartitionError,
    OffsetOutOfRangeError,
    RebalanceInProgressError,
    WakeupError,
)
from rcoord.client import consumer as consumer_module
from rcoord.errors import ConfigError, ConnectionLost, RcoordError
from rcoord.protocol.join import JoinGroupResult
from rcoord.testing.embedded import EmbeddedServer
from rcoord.topics import Producer, ProducerRecord, Record, Topics
from rcoord.topics.incarnation import stale_commits

TP = TopicPartition


class Recorder(ConsumerRebalanceListener):
    """Appends every callback to the fake's shared event log (so coordinator calls interleave)."""

    def __init__(self, events: Any = None, commit_on_revoke: Consumer | None = None) -> None:
        self.events: list[tuple[Any, ...]] = [] if events is None else events
        self.consumer = commit_on_revoke
        self.lock = threading.Lock()

    def _add(self, kind: str, partitions: list[TopicPartition]) -> None:
        with self.lock:
            self.events.append((kind, sorted(partitions)))

    def on_partitions_revoked(self, partitions: list[TopicPartition]) -> None:
        self._add("revoked", partitions)
        if self.consumer is not None:
            self.consumer.commit()  # the generation is ending, but this commit still succeeds

    def on_partitions_assigned(self, partitions: list[TopicPartition]) -> None:
        self._add("assigned", partitions)

    def on_partitions_lost(self, partitions: list[TopicPartition]) -> None:
        self._add("lost", partitions)

    def kinds(self) -> list[str]:
        with self.lock:
            return [e[0] for e in self.events]


def poll_until(
    consumer: Consumer, cond: Any, *, max_records: int | None = None
) -> list[ConsumerRecord]:
    got: list[ConsumerRecord] = []

    def step() -> None:
        got.extend(consumer.poll(timeout=0.05, max_records=max_records))

    wait_until(lambda: cond(got), step)
    return got


@pytest.fixture
def fake_consumer() -> Iterator[Any]:
    made: list[Consumer] = []

    def make(state: OneMemberGroup, listener: Any = None, *, group_id: str = "g",
             **kw: Any) -> Consumer:
        settings: dict[str, Any] = {"fetch_max_wait_ms": 5, "auto_commit_interval_ms": 100_000}
        settings.update(kw)
        c = Consumer(fast_config(group_id=group_id), listener=listener,
                     coordinator=state.fake, **settings)  # type: ignore[arg-type]
        made.append(c)
        return c

    yield make
    for c in made:
        c.close(timeout=WAIT_S)


# -- listener order (fake coordinator) --------------------------------------------------------


def test_listener_order_revoked_before_assigned_and_lost_without_commit(fake_consumer: Any) -> None:
    state = OneMemberGroup(partitions=2, records=3)
    listener = Recorder(state.events)
    listener.lock = state.lock  # one lock, one ordered log
    consumer = fake_consumer(state, listener)
    all_tps = [TP("t", 0), TP("t", 1)]

    got = poll_until(consumer, lambda g: len(g) == 6)
    assert {(r.partition, r.offset) for r in got} == {(p, o) for p in (0, 1) for o in range(3)}
    assert state.kinds()[:2] == ["join", "sync"]
    assert listener.events[2] == ("assigned", all_tps)

    # A rebalance: auto-commit, then revoked (still committable), then assigned of the next one.
    mark = len(state.events)
    state.heartbeat_answers.append(Errors.REBALANCE_IN_PROGRESS)
    wait_until(lambda: consumer.generation is not None and consumer.generation.done.is_set())
    poll_until(
        consumer,
        lambda g: consumer.generation is not None and consumer.generation.generation_id == 2,
    )
    tail = [e for e in state.events[mark:] if e[0] != "heartbeat"]
    assert [e[0] for e in tail] == ["commit", "revoked", "join", "sync", "assigned"]
    assert tail[0] == ("commit", 1, {TP("t", 0): 3, TP("t", 1): 3})
    assert tail[1] == ("revoked", all_tps) and tail[4] == ("assigned", all_tps)

    # The member is removed: lost (no commit), then a fresh member id and assigned.
    consumer.poll(timeout=0)  # nothing new
    mark = len(state.events)
    state.heartbeat_answers.append(Errors.UNKNOWN_MEMBER_ID)
    poll_until(
        consumer,
        lambda g: consumer.generation is not None and consumer.generation.generation_id == 3,
    )
    tail = [e for e in state.events[mark:] if e[0] != "heartbeat"]
    assert [e[0] for e in tail] == ["lost", "join", "sync", "assigned"]
    assert tail[1] == ("join", "")
    assert consumer.member_id == state.id(2)

    # close(): a final commit, revoked, then LeaveGroup.
    state.logs[TP("t", 0)].append(Record(3, None, b"new", {}, 0))
    assert [r.offset for r in poll_until(consumer, lambda g: len(g) == 1)] == [3]
    mark = len(state.events)
    consumer.close(timeout=WAIT_S)
    tail = [e for e in state.events[mark:] if e[0] != "heartbeat"]
    assert [e[0] for e in tail] == ["commit", "revoked", "leave"]
    assert tail[0] == ("commit", 3, {TP("t", 0): 4})


def test_commit_inside_on_partitions_revoked_succeeds(fake_consumer: Any) -> None:
    state = OneMemberGroup(partitions=1, records=2)
    listener = Recorder()
    consumer = fake_consumer(state, listener, enable_auto_commit=False)
    listener.consumer = consumer
    poll_until(consumer, lambda g: len(g) == 2)
    assert state.committed == {}
    state.heartbeat_answers.append(Errors.REBALANCE_IN_PROGRESS)
    poll_until(consumer, lambda g: listener.kinds() == ["assigned", "revoked", "assigned"])
    assert state.committed == {TP("t", 0): 2}


def test_buffered_records_of_revoked_partitions_are_dropped(fake_consumer: Any) -> None:
    state = OneMemberGroup(partitions=1, records=10)
    consumer = fake_consumer(state, enable_auto_commit=False)
    first = poll_until(consumer, lambda g: len(g) >= 1, max_records=1)
    assert [r.offset for r in first] == [0]
    gen = consumer.generation
    assert gen is not None
    consumer.commit()  # position 1; offsets 1..9 sit in the buffer
    assert state.committed == {TP("t", 0): 1}
    state.heartbeat_answers.append(Errors.REBALANCE_IN_PROGRESS)
    assert gen.done.wait(WAIT_S)
    state.committed[TP("t", 0)] = 5  # as if another member had processed 1..4 meanwhile
    nxt = poll_until(consumer, lambda g: len(g) >= 1, max_records=1)
    # Nothing from the old buffer: the new generation starts at the committed offset.
    assert [r.offset for r in nxt] == [5]
    assert consumer.generation is not None and consumer.generation.generation_id == 2


def test_poll_without_generation_times_out_and_commit_is_a_noop(fake_consumer: Any) -> None:
    """While the member joins, a commit of given offsets raises RebalanceInProgressError, as
    Kafka's (poll() completes the join, then commit again); it raised CommitFailedError, which
    says the partitions are gone. Before any poll() the consumer is in no group: that one
    stays CommitFailedError, as Kafka's ("not part of an active group")."""
    state = OneMemberGroup(partitions=1)
    state.park_join.set()
    consumer = fake_consumer(state)
    with pytest.raises(CommitFailedError, match="no generation"):
        consumer.commit({TP("t", 0): 1})
    assert consumer.poll(timeout=0.05) == []
    consumer.commit()  # nothing assigned: nothing to do
    with pytest.raises(RebalanceInProgressError, match="no generation") as info:
        consumer.commit({TP("t", 0): 1})
    assert not isinstance(info.value, CommitFailedError)
    assert info.value.error is Errors.REBALANCE_IN_PROGRESS
    got: list[BaseException | None] = []
    consumer.commit_async({TP("t", 0): 1}, lambda offsets, error: got.append(error))
    wait_until(lambda: bool(got), lambda: consumer.poll(timeout=0.01))
    assert isinstance(got[0], RebalanceInProgressError)


def test_a_join_refusal_no_retry_can_mend_is_raised_by_every_poll(fake_consumer: Any) -> None:
    """Kafka's poll() throws InvalidSessionTimeoutException (and the other JoinGroup refusals) as
    fatal. Before, poll() raised it once and then went on joining every join_backoff_ms, and a
    later poll() consumed as if nothing had happened."""
    state = OneMemberGroup(partitions=1, records=3)
    state.join_answers.append(Errors.INVALID_SESSION_TIMEOUT)
    consumer = fake_consumer(state)
    for _ in range(3):
        with pytest.raises(JoinRefusedError, match="session_timeout_ms=600") as info:
            consumer.poll(timeout=WAIT_S)
        assert info.value.error is Errors.INVALID_SESSION_TIMEOUT
        assert "group_min_session_timeout_ms" in info.value.hint
    assert state.joins == [""]
    assert consumer.generation is None


@pytest.mark.parametrize("failure", ["connection", "coordinator"])
def test_poll_keeps_trying_while_the_coordinator_is_unreachable(
    fake_consumer: Any, caplog: Any, failure: str, namespace: str
) -> None:
    """Kafka's poll() never throws because the coordinator cannot be reached: it returns no
    records and keeps trying. Before, once the group's retries had failed for a whole session
    timeout, the next poll() raised that error (every loop needed an except around poll())."""
    state = OneMemberGroup(partitions=1, records=2)
    down = threading.Event()
    down.set()
    join = state.fake.join_group

    def unreachable_join(*args: Any, **kw: Any) -> Any:
        if down.is_set():
            if failure == "connection":
                raise ConnectionLost("Redis is unreachable")
            return JoinGroupResult.failed(Errors.COORDINATOR_NOT_AVAILABLE)
        return join(*args, **kw)

    state.fake.join_group = unreachable_join
    # (a group id of its own: the report must be this group's, not another test's consumer's
    # still retrying in this process)
    consumer = fake_consumer(state, group_id=namespace)
    caplog.set_level(logging.WARNING, logger="rcoord.client.group")
    reported = lambda: any(r.getMessage().startswith(f"consumer group {namespace!r}: ")
                           and "joining again" in r.getMessage() for r in caplog.records)
    wait_until(lambda: consumer.poll(timeout=0.01) == [] and reported())
    # The group has reported it (once, to whoever asks next): poll() still only returns nothing.
    assert consumer.poll(timeout=0.05) == []
    assert consumer.generation is None
    down.clear()
    got = poll_until(consumer, lambda g: len(g) == 2)
    assert [r.offset for r in got] == [0, 1]


def test_listener_exception_propagates_after_the_step_completes(fake_consumer: Any) -> None:
    state = OneMemberGroup(partitions=1, records=1)

    class Failing(ConsumerRebalanceListener):
        def on_partitions_revoked(self, partitions: list[TopicPartition]) -> None:
            raise RuntimeError("listener failed")

    consumer = fake_consumer(state, Failing())
    poll_until(consumer, lambda g: len(g) == 1)
    state.heartbeat_answers.append(Errors.REBALANCE_IN_PROGRESS)
    gen = consumer.generation
    assert gen is not None and gen.done.wait(WAIT_S)
    with pytest.raises(RuntimeError, match="listener failed"):
        consumer.poll(timeout=WAIT_S)
    assert consumer.generation is None  # the revocation completed despite the exception
    poll_until(consumer, lambda g: consumer.generation is not None)
    with pytest.raises(RuntimeError, match="listener failed"):
        consumer.close()  # the final revocation's, raised once the consumer is closed


def test_close_from_inside_on_partitions_revoked(fake_consumer: Any) -> None:
    state = OneMemberGroup(partitions=1, records=1)
    calls: list[list[TopicPartition]] = []
    consumer: Consumer

    class Closing(ConsumerRebalanceListener):
        def on_partitions_revoked(self, partitions: list[TopicPartition]) -> None:
            calls.append(partitions)
            consumer.close(timeout=WAIT_S)

    consumer = fake_consumer(state, Closing())
    poll_until(consumer, lambda g: len(g) == 1)
    state.heartbeat_answers.append(Errors.REBALANCE_IN_PROGRESS)
    gen = consumer.generation
    assert gen is not None and gen.done.wait(WAIT_S)
    assert consumer.poll(timeout=WAIT_S) == []
    assert calls == [[TP("t", 0)]]  # revoked once, not again by close()
    assert state.leaves == [state.id(1)]
    with pytest.raises(Exception, match="closed"):
        consumer.poll(timeout=0)


@pytest.mark.parametrize("end", ["close", "unsubscribe"])
def test_giving_up_after_the_hold_gave_up_reports_lost_without_committing(end: str) -> None:
    """A generation ended and poll() was not called within the rebalance timeout: the hold
    gave up and the member rejoined without this consumer. close() or unsubscribe() then
    reports the partitions lost and commits nothing, as the next poll() would have
    (``_partitions_lost``; unsubscribe() reported them revoked, and with auto-commit committed
    their positions)."""
    state = OneMemberGroup(partitions=1, records=3)
    listener = Recorder(state.events)
    listener.lock = state.lock
    consumer = Consumer(
        fast_config(rebalance_timeout_ms=200), listener=listener, coordinator=state.fake,  # type: ignore[arg-type]
        fetch_max_wait_ms=5, auto_commit_interval_ms=100_000,
    )
    try:
        poll_until(consumer, lambda g: len(g) == 3)  # positions 3, nothing committed yet
        state.park_join.set()  # the rejoin parks, as while waiting for other members
        mark = len(state.events)
        state.heartbeat_answers.append(Errors.REBALANCE_IN_PROGRESS)
        # No poll(): after the rebalance timeout the hold gives up and the member rejoins.
        wait_until(lambda: "join" in [e[0] for e in state.events[mark:]])
        if end == "close":
            consumer.close(timeout=WAIT_S)
        else:
            consumer.unsubscribe()
    finally:
        consumer.close(timeout=WAIT_S)
    tail = [e[0] for e in state.events[mark:] if e[0] != "heartbeat"]
    assert "lost" in tail and "revoked" not in tail and "commit" not in tail, tail
    assert state.committed == {}


# -- fetching (fake coordinator) -------------------------------------------------------------


def test_one_fetch_reads_every_fetchable_partition_sharing_max_poll_records(
    fake_consumer: Any,
) -> None:
    """One call per fetch covers every assigned partition that is not paused and has nothing
    buffered; it asks for four polls' worth of records in all, shared among the partitions not
    known to be at their log end (an empty partition is, after its first fetch), at most
    max_poll_records and at least 50 of each."""
    state = OneMemberGroup(partitions=8, records=300)
    state.logs[TP("t", 7)] = []
    calls: list[tuple[list[tuple[str, int, int]], int]] = []
    inner = state.fake.fetch_many_as

    def recording(reads: Any, max_records: int, record_type: Any, **bounds: Any) -> Any:
        calls.append(([tuple(r) for r in reads], max_records))
        return inner(reads, max_records, record_type, **bounds)

    state.fake.fetch_many_as = recording
    consumer = fake_consumer(state, max_poll_records=80)

    polls = [consumer.poll(timeout=WAIT_S) for _ in range(5)]
    assert calls == [([("t", p, 0) for p in range(8)], 50)]  # 4 * 80 / 8 is below the floor
    assert [len(got) for got in polls] == [80] * 4 + [30]  # the 7 * 50 buffered records
    assert sorted((r.partition, r.offset) for got in polls for r in got) == [
        (p, o) for p in range(7) for o in range(50)
    ]

    consumer.pause([TP("t", p) for p in range(2, 7)])
    again = consumer.poll(timeout=WAIT_S) + consumer.poll(timeout=WAIT_S)
    # 2-6 paused, 7 at its end: 0 and 1 share 4 * 80, at most 80 each; one fetch, two polls.
    assert calls[1:] == [([("t", 0, 50), ("t", 1, 50), ("t", 7, 0)], 80)]
    assert sorted((r.partition, r.offset) for r in again) == [
        (p, o) for p in (0, 1) for o in range(50, 130)
    ]
    assert all(r.value == b"%d-%d" % (r.partition, r.offset) for r in sum(polls, again))
    assert consumer.position(TP("t", 0)) == 130 and consumer.position(TP("t", 2)) == 50

    consumer.pause([TP("t", 0)])
    assert [r.offset for r in consumer.poll(timeout=WAIT_S)] == list(range(130, 210))
    assert calls[2] == ([("t", 1, 130), ("t", 7, 0)], 80)  # one busy partition: capped at 80


def test_consumer_records_from_records_equal_constructed_ones() -> None:
    """The blocking fetch's Records become ConsumerRecords by filling ``__dict__``: equal to
    constructed ones, with the same repr, fields and vars, and as immutable."""
    records = [
        Record(7, None, b"v", {}, 1_700_000_000_000),
        Record(8, b"k", None, {"h": b"\x00"}, 0),
    ]
    got = consumer_module._consumer_records("orders", 3, records)
    want = [
        ConsumerRecord("orders", 3, 7, None, b"v", {}, 1_700_000_000_000),
        ConsumerRecord("orders", 3, 8, b"k", None, {"h": b"\x00"}, 0),
    ]
    assert got == want and got != [ConsumerRecord("orders", 4, 7, None, b"v", {}, 0)] + want[1:]
    assert [repr(r) for r in got] == [repr(r) for r in want]
    assert [vars(r) for r in got] == [vars(r) for r in want]
    assert [dataclasses.asdict(r) for r in got] == [dataclasses.asdict(r) for r in want]
    assert all(type(r) is ConsumerRecord for r in got)
    with pytest.raises(dataclasses.FrozenInstanceError):
        got[0].value = b"changed"  # type: ignore[misc]


# -- against a real server --------------------------------------------------------------------


@pytest.fixture
def env(make_coordinator: Any, redis_client: Any, namespace: str) -> Iterator[Any]:
    coord: GroupCoordinator = make_coordinator()
    consumers: list[Consumer] = []

    class Env:
        pass

    e = Env()
    e.coord, e.client, e.namespace = coord, redis_client, namespace  # type: ignore[attr-defined]
    e.topics = Topics(redis_client, namespace)  # type: ignore[attr-defined]
    e.producer = Producer(redis_client, namespace, "round_robin")  # type: ignore[attr-defined]

    def consumer(listener: Any = None, **kw: Any) -> Consumer:
        cfg_kw: dict[str, Any] = {
            "group_id": "g",
            "topics": ["t"],
            "redis_client": redis_client,
            "namespace": namespace,
            "heartbeat_interval_ms": 50,
            "session_timeout_ms": 1000,
            "rebalance_timeout_ms": 3000,
            "retry_backoff_ms": 10,
            "retry_backoff_max_ms": 100,
        }
        for k in list(kw):
            if k in ConsumerGroupConfig.__dataclass_fields__:
                cfg_kw[k] = kw.pop(k)
        kw.setdefault("fetch_max_wait_ms", 20)
        c = Consumer(ConsumerGroupConfig(**cfg_kw), listener=listener, **kw)
        consumers.append(c)
        return c

    e.consumer = consumer  # type: ignore[attr-defined]
    yield e
    for c in consumers:
        c.close(timeout=WAIT_S)


def _log_ends(env: Any, n: int) -> dict[TopicPartition, int]:
    return {TP("t", p.partition): p.log_end_offset for p in env.topics.describe("t").partitions[:n]}


def _committed(env: Any, n: int, group_id: str = "g") -> dict[TopicPartition, int]:
    """Group ``group_id``'s committed offsets of partitions 0..n-1 of topic "t"."""
    fetched = env.coord.fetch_offsets(group_id, [TP("t", p) for p in range(n)]).offsets
    return {tp: o.offset for tp, o in fetched.items()}


def _async_committing_consumer(
    env: Any, partitions: int, records: int, queued: int
) -> tuple[Consumer, list[BaseException | None]]:
    """Topic "t" with ``records`` records over ``partitions`` partitions, and a consumer (no
    auto-commit) whose on_partitions_revoked queues ``queued`` async commits of its positions;
    returns it and the list their callbacks append their errors to."""
    env.topics.create("t", partitions)
    env.producer.send_batch("t", [b"%d" % i for i in range(records)])
    completions: list[BaseException | None] = []

    class Committing(ConsumerRebalanceListener):
        def on_partitions_revoked(self, parts: list[TopicPartition]) -> None:
            for _ in range(queued):
                consumer.commit_async(None, lambda offsets, exc: completions.append(exc))

    consumer: Consumer = env.consumer(Committing(), enable_auto_commit=False)
    return consumer, completions


def test_real_consume_everything_and_commit_on_close(env: Any) -> None:
    env.topics.create("t", 3)
    env.producer.send_batch("t", [b"v%d" % i for i in range(90)])
    consumer = env.consumer()
    got = poll_until(consumer, lambda g: len(g) >= 90)
    assert len(got) == 90 and len({(r.partition, r.offset) for r in got}) == 90
    assert {r.value for r in got} == {b"v%d" % i for i in range(90)}
    consumer.close(timeout=WAIT_S)
    assert _committed(env, 3) == _log_ends(env, 3)


KIB = 1024


def _buffered(consumer: Consumer) -> dict[int, int]:
    return {tp.partition: len(buf) for tp, buf in consumer._buffers.items()}


def test_real_a_fetch_of_large_records_reads_about_max_partition_fetch_bytes(env: Any) -> None:
    """Kafka's max.partition.fetch.bytes (1 MiB by default) bounds what a fetch reads of a
    partition: 200 KiB records are read about five at a time. Before, a fetch read up to
    max_poll_records (500) of them at once: all 24 here, 4.8 MiB held for a poll of one."""
    env.topics.create("t", 1)
    env.producer.send_batch("t", [bytes([i]) * 200 * KIB for i in range(24)])
    consumer = env.consumer()
    tracemalloc.start()
    try:
        first = poll_until(consumer, bool, max_records=1)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert [r.offset for r in first] == [0]
    assert _buffered(consumer) == {0: 4}  # 5 records, 1 MiB and a little more
    assert peak < 3 * 1024 * KIB, peak
    rest = poll_until(consumer, lambda g: len(g) >= 23)
    assert [(r.offset, r.value) for r in first + rest] == [
        (i, bytes([i]) * 200 * KIB) for i in range(24)]


def test_real_fetch_max_bytes_bounds_a_fetch_of_every_partition(env: Any) -> None:
    """Kafka's fetch.max.bytes bounds a fetch over all its partitions, which take it in turn;
    only the first with records may go over, and a partition left out is asked first next
    time, so all make progress. A partition whose size is known is then read in one step, to
    its own bound."""
    env.topics.create("t", 3)
    for p in range(3):
        env.producer.send_batch("t", [ProducerRecord(b"%d" % p * 100 * KIB, partition=p)
                                      for _ in range(8)])
    consumer = env.consumer(fetch_max_bytes=250 * KIB, max_partition_fetch_bytes=150 * KIB)
    got = poll_until(consumer, bool, max_records=1)
    read = {p: n + sum(r.partition == p for r in got) for p, n in _buffered(consumer).items()}
    # Two records of 100 KiB fit 250 KiB, a third does not. Before, each partition got one.
    assert len(got) == 1 and read == {0: 1, 1: 1, 2: 0}
    got += poll_until(consumer, lambda g: len(g) >= 23)
    for p in range(3):
        assert [r.offset for r in got if r.partition == p] == list(range(8))
        assert consumer._record_bytes[TP("t", p)] > 100 * KIB


def test_real_partitions_of_records_over_the_byte_limits_are_read_in_turn(env: Any) -> None:
    """Only the first partition of a fetch with records may go over the byte limits (Kafka's
    rule), so records larger than max_partition_fetch_bytes come one a fetch; the partitions
    take turns, as Kafka's consumer moves one that gave records to the end of its fetches.
    Asked in a fixed order, partition 1 got nothing until partition 0 was read to its end."""
    env.topics.create("t", 2)
    for p in range(2):
        env.producer.send_batch("t", [ProducerRecord(b"%d" % p * 300 * KIB, partition=p)
                                      for _ in range(3)])
    consumer = env.consumer(max_partition_fetch_bytes=200 * KIB)
    got: list[ConsumerRecord] = []
    for _ in range(6):
        got += poll_until(consumer, bool, max_records=1)
        assert sum(_buffered(consumer).values()) == 0  # one record a fetch
    assert [(r.partition, r.offset) for r in got] == [
        (0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2)]


@pytest.mark.parametrize("option", ["fetch_max_bytes", "max_partition_fetch_bytes"])
def test_real_byte_limits_must_be_positive_ints(env: Any, option: str) -> None:
    for bad in (0, 1.5, True):
        with pytest.raises(ConfigError, match=f"{option} must be an int >= 1, got {bad!r}"):
            env.consumer(**{option: bad})


def test_real_manual_commit_resumes_without_duplicates(env: Any) -> None:
    env.topics.create("t", 2)
    env.producer.send_batch("t", [b"a%d" % i for i in range(20)])
    first = env.consumer(enable_auto_commit=False)
    got = poll_until(first, lambda g: len(g) >= 20)
    first.commit()
    assert first.committed() == _log_ends(env, 2)
    first.close(timeout=WAIT_S)
    env.producer.send_batch("t", [b"b%d" % i for i in range(10)])
    second = env.consumer(enable_auto_commit=False)
    more = poll_until(second, lambda g: len(g) >= 10)
    assert sorted(r.value for r in more) == sorted(b"b%d" % i for i in range(10))
    assert not {(r.partition, r.offset) for r in got} & {(r.partition, r.offset) for r in more}
    assert second.lag() == {TP("t", 0): 0, TP("t", 1): 0}


def test_real_out_of_range_offset_resets_by_policy(env: Any) -> None:
    env.topics.create("t", 1, retention_records=5)
    env.producer.send_batch("t", [b"x%d" % i for i in range(10)])
    env.topics.apply_retention("t")  # the log now starts at 5
    assert env.coord.commit_offsets("g", {TP("t", 0): 2})[TP("t", 0)] is Errors.NONE  # below it
    consumer = env.consumer(start_offset="earliest")
    got = poll_until(consumer, lambda g: len(g) >= 5)
    assert [r.offset for r in got] == [5, 6, 7, 8, 9]
    consumer.close(timeout=WAIT_S)
    assert (
        env.coord.commit_offsets("g", {TP("t", 0): 50})[TP("t", 0)] is Errors.NONE
    )  # past the end
    latest = env.consumer(start_offset="latest")
    poll_until(latest, lambda g: latest.generation is not None)
    assert latest.poll(timeout=0.1) == []
    assert latest.position(TP("t", 0)) == 10
    env.producer.send("t", b"fresh")
    assert [r.value for r in poll_until(latest, lambda g: len(g) >= 1)] == [b"fresh"]


@pytest.mark.parametrize("policy", ["earliest", "none"])
def test_real_a_topic_created_again_is_not_resumed_at_the_deleted_ones_offset(
        env: Any, policy: str) -> None:
    # Kafka deletes a topic's committed offsets with it. Before, a group resumed the new topic
    # at the old topic's offset 50 (in range, as the new log holds 80): records 0-49 of the new
    # topic were skipped without a word, under either policy.
    env.topics.create("t", 1)
    assert env.coord.commit_offsets("g", {TP("t", 0): 50})[TP("t", 0)] is Errors.NONE
    env.topics.delete("t")
    env.topics.create("t", 1)
    env.producer.send_batch("t", [b"new%d" % i for i in range(80)])
    consumer = env.consumer(start_offset=policy)
    if policy == "earliest":
        got = poll_until(consumer, lambda g: len(g) >= 80)
        assert [r.offset for r in got] == list(range(80))
    else:
        raised: list[NoOffsetForPartitionError] = []

        def poll_once() -> bool:
            try:
                consumer.poll(timeout=0.05)
            except NoOffsetForPartitionError as exc:
                raised.append(exc)
            return bool(raised)

        wait_until(poll_once)
        assert raised[0].partitions == [TP("t", 0)]
    assert consumer.committed([TP("t", 0)]) == {TP("t", 0): -1}
    assert consumer.committed([TP("t", 0)], metadata=True) == {TP("t", 0): None}
    consumer.seek(TP("t", 0), 7)  # a commit made to the new topic counts again
    consumer.commit()
    assert consumer.committed([TP("t", 0)]) == {TP("t", 0): 7}


def test_a_commit_made_once_create_returned_is_the_new_topics(env: Any) -> None:
    # A commit made in the millisecond of its topic's creation counts as one of a deleted
    # topic of that name (rcoord.topics.incarnation), so a group resumed nothing it had
    # committed right after create() returned: 1 run in a few hundred of the test below failed
    # in CI, and 10-30 of these 60 on this machine. create() now returns only once the topic's
    # millisecond has passed on its node.
    for i in range(60):
        topic = f"fresh{i}"
        env.topics.create(topic, 1)
        assert env.coord.commit_offsets("g", {TP(topic, 0): 0})[TP(topic, 0)] is Errors.NONE
    fetched = env.coord.fetch_offsets("g", [TP(f"fresh{i}", 0) for i in range(60)]).offsets
    assert len(fetched) == 60 and all(om.offset == 0 for om in fetched.values())
    assert stale_commits(env.client, env.namespace, fetched) == set()


def test_real_start_offset_none_never_guesses_a_position(env: Any) -> None:
    """Kafka's auto.offset.reset=none: a partition with no committed offset has no position;
    poll() raises NoOffsetForPartitionError naming it, in each poll that has no records of
    other partitions, until it is sought, and nothing is committed for it meanwhile."""
    env.topics.create("t", 2)
    env.producer.send_batch("t", [b"%d" % i for i in range(10)])  # 5 a partition
    assert env.coord.commit_offsets("g", {TP("t", 0): 3})[TP("t", 0)] is Errors.NONE
    consumer = env.consumer(start_offset="none")
    raised: list[NoOffsetForPartitionError] = []
    got: list[ConsumerRecord] = []

    def poll_once() -> None:
        try:
            got.extend(consumer.poll(timeout=0.05))
        except NoOffsetForPartitionError as exc:
            raised.append(exc)

    wait_until(lambda: raised and len(got) >= 2, poll_once)  # t-0's records come all the same
    assert raised[0].partitions == [TP("t", 1)] and "t-1" in str(raised[0])
    assert sorted((r.partition, r.offset) for r in got) == [(0, 3), (0, 4)]
    with pytest.raises(NoOffsetForPartitionError):
        consumer.position(TP("t", 1))
    assert consumer.position(TP("t", 0)) == 5
    assert consumer.lag() == {TP("t", 0): 0}
    with pytest.raises(NoOffsetForPartitionError):
        consumer.poll(timeout=0.05)  # again (t-0 has nothing more), until sought
    consumer.commit()  # commits the partitions that have a position, only
    committed = env.coord.fetch_offsets("g", [TP("t", 0), TP("t", 1)]).offsets
    assert {tp: o.offset for tp, o in committed.items()} == {TP("t", 0): 5, TP("t", 1): -1}
    consumer.seek_to_beginning([TP("t", 1)])
    got = poll_until(consumer, lambda g: len(g) >= 5)
    assert sorted((r.partition, r.offset) for r in got) == [(1, o) for o in range(5)]


def test_real_start_offset_none_raises_when_the_position_falls_out_of_the_log(
    env: Any,
) -> None:
    """Retention deleted records this group never read: with start_offset="none" that is an
    OffsetOutOfRangeError naming the partition and position, not a silent jump."""
    env.topics.create("t", 1, retention_records=5)
    env.producer.send_batch("t", [b"x%d" % i for i in range(10)])
    env.topics.apply_retention("t")  # the log now starts at 5
    assert env.coord.commit_offsets("g", {TP("t", 0): 2})[TP("t", 0)] is Errors.NONE
    consumer = env.consumer(start_offset="none")
    raised: list[OffsetOutOfRangeError] = []

    def poll_once() -> bool:
        try:
            assert consumer.poll(timeout=0.05) == []
        except OffsetOutOfRangeError as exc:
            raised.append(exc)
        return bool(raised)

    wait_until(poll_once)
    assert raised[0].offsets == {TP("t", 0): 2} and "t-0 at 2" in str(raised[0])
    with pytest.raises(OffsetOutOfRangeError):
        consumer.poll(timeout=0.05)
    consumer.seek(TP("t", 0), 7)
    assert [r.offset for r in poll_until(consumer, lambda g: len(g) >= 3)] == [7, 8, 9]


def test_one_partition_out_of_range_does_not_stall_the_others(env: Any) -> None:
    """As Kafka's fetch collector, the other partitions' records come first and the error only
    in a poll that has none; pausing the partition stops the error. Before, every poll raised
    before fetching anything: the other partitions stalled, paused or not."""
    env.topics.create("t", 2, retention_records=5)
    env.producer.send_batch("t", [ProducerRecord(b"x%d" % i, partition=0) for i in range(10)])
    env.topics.apply_retention("t")  # t-0 starts at 5
    assert env.coord.commit_offsets("g", {TP("t", 0): 2, TP("t", 1): 0}) == {
        TP("t", 0): Errors.NONE, TP("t", 1): Errors.NONE}
    consumer = env.consumer(start_offset="none")
    got: list[tuple[int, int]] = []
    raised: list[OffsetOutOfRangeError] = []

    def poll_once() -> None:
        try:
            got.extend((r.partition, r.offset) for r in consumer.poll(timeout=0.05))
        except OffsetOutOfRangeError as exc:
            raised.append(exc)

    env.producer.send("t", b"y0", partition=1)
    wait_until(lambda: raised and got == [(1, 0)], poll_once)
    assert raised[-1].offsets == {TP("t", 0): 2}
    env.producer.send("t", b"y1", partition=1)
    wait_until(lambda: got == [(1, 0), (1, 1)], poll_once)
    consumer.pause([TP("t", 0)])
    errors = len(raised)
    env.producer.send("t", b"y2", partition=1)
    wait_until(lambda: got == [(1, 0), (1, 1), (1, 2)], poll_once)
    assert consumer.poll(timeout=0.05) == [] and len(raised) == errors  # paused: no error


def test_seek_to_an_edge_with_an_empty_list_seeks_every_assigned_partition(env: Any) -> None:
    # Kafka's seekToBeginning/seekToEnd: an empty collection means every assigned partition.
    env.topics.create("t", 2)
    env.producer.send_batch("t", [b"x%d" % i for i in range(4)])
    consumer = env.consumer()
    poll_until(consumer, lambda g: len(g) >= 4)
    consumer.seek_to_beginning([])
    assert {tp: consumer.position(tp) for tp in consumer.assignment()} == {
        TP("t", 0): 0, TP("t", 1): 0}
    consumer.seek_to_end([])
    assert {tp: consumer.position(tp) for tp in consumer.assignment()} == {
        TP("t", 0): 2, TP("t", 1): 2}


def test_start_offset_none_is_a_valid_policy_and_others_are_refused() -> None:
    cfg = ConsumerGroupConfig(group_id="g", topics=["t"], redis_url="redis://127.0.0.1:1/0",
                              start_offset="none")
    assert cfg.start_offset == "none"
    with pytest.raises(ConfigError, match="'earliest', 'latest' or 'none'"):
        ConsumerGroupConfig(group_id="g", topics=["t"], redis_url="redis://127.0.0.1:1/0",
                            start_offset="smallest")  # type: ignore[arg-type]


def test_real_two_consumers_listener_order_and_commit_in_revoke(env: Any) -> None:
    env.topics.create("t", 4)
    env.producer.send_batch("t", [b"%d" % i for i in range(40)])
    la = Recorder()
    a = env.consumer(la, enable_auto_commit=False)
    la.consumer = a
    poll_until(a, lambda g: len(g) >= 40)
    assert la.kinds() == ["assigned"] and la.events[0][1] == [TP("t", p) for p in range(4)]
    lb = Recorder()
    b = env.consumer(lb)
    stop = threading.Event()
    b_thread = threading.Thread(target=lambda: [b.poll(0.05) for _ in iter(stop.is_set, True)])
    b_thread.start()
    try:
        poll_until(a, lambda g: la.kinds() == ["assigned", "revoked", "assigned"])
        wait_until(lambda: lb.kinds() == ["assigned"])
    finally:
        stop.set()
        b_thread.join(WAIT_S)
    # a committed everything it had consumed inside on_partitions_revoked.
    assert _committed(env, 4) == _log_ends(env, 4)
    a_parts, b_parts = set(la.events[2][1]), set(lb.events[0][1])
    assert a_parts.isdisjoint(b_parts) and len(a_parts | b_parts) == 4


def test_real_async_commits_in_on_partitions_revoked_land_before_the_rejoin(env: Any) -> None:
    """Kafka sends a commitAsync made in onPartitionsRevoked before its JoinGroup, on the same
    connection, so the broker applies it in the old generation. poll() likewise lets the
    callback's async commits land before the member may rejoin: a rejoin that completed the
    next generation first would fence them (ILLEGAL_GENERATION) and the offsets would be lost.
    Many queued commits make the race wide; each must succeed."""
    queued = 200
    a, completions = _async_committing_consumer(env, 4, 40, queued)
    la = Recorder()
    poll_until(a, lambda g: len(g) >= 40)
    b = env.consumer(la)
    stop = threading.Event()
    b_thread = threading.Thread(target=lambda: [b.poll(0.05) for _ in iter(stop.is_set, True)])
    b_thread.start()
    try:
        # a's callbacks run from its own later poll(): wait until every one has run.
        poll_until(a, lambda g: len(completions) == queued)
        wait_until(lambda: la.kinds() == ["assigned"])
    finally:
        stop.set()
        b_thread.join(WAIT_S)
    assert [exc for exc in completions if exc is not None] == []
    assert _committed(env, 4) == _log_ends(env, 4)


def test_real_close_lets_the_listener_commit_in_on_partitions_revoked(env: Any) -> None:
    """Kafka's idiom for manual commits: commit in on_partitions_revoked. close() runs that
    callback while the consumer is still open, and flushes its async commits (callback
    included) before leaving the group."""
    env.topics.create("t", 2)
    env.producer.send_batch("t", [b"%d" % i for i in range(20)])
    completions: list[tuple[dict[TopicPartition, int], BaseException | None]] = []
    errors: list[BaseException] = []

    class Committing(ConsumerRebalanceListener):
        def on_partitions_revoked(self, partitions: list[TopicPartition]) -> None:
            try:
                consumer.commit({TP("t", 0): consumer.position(TP("t", 0))})
                consumer.commit_async(
                    {TP("t", 1): consumer.position(TP("t", 1))},
                    lambda offsets, exc: completions.append((offsets, exc)),
                )
            except Exception as exc:
                errors.append(exc)
                raise

    consumer = env.consumer(Committing(), enable_auto_commit=False)
    poll_until(consumer, lambda g: len(g) >= 20)
    consumer.close(timeout=WAIT_S)
    ends = _log_ends(env, 2)
    assert errors == []
    assert completions == [({TP("t", 1): ends[TP("t", 1)]}, None)]
    assert _committed(env, 2) == ends
    with pytest.raises(Exception, match="closed"):
        consumer.commit()


def test_real_expired_member_reports_lost_and_rejoins(env: Any) -> None:
    env.topics.create("t", 2)
    env.producer.send_batch("t", [b"%d" % i for i in range(4)])
    listener = Recorder()
    consumer = env.consumer(listener)
    poll_until(consumer, lambda g: len(g) >= 4)
    old = consumer.generation
    assert old is not None
    # Remove the member behind its back, as a session expiry would.
    env.coord.leave_group("g", [MemberIdentity(old.member_id)])
    poll_until(consumer, lambda g: listener.kinds() == ["assigned", "lost", "assigned"])
    assert consumer.member_id != old.member_id
    with pytest.raises(CommitFailedError) as info:
        old.commit_offsets({TP("t", 0): 1})
    assert info.value.error is Errors.UNKNOWN_MEMBER_ID


def test_real_group_max_size_reached_is_fatal_for_the_member_that_does_not_fit(
    make_coordinator: Any, redis_client: Any, namespace: str
) -> None:
    """A namespace with group_max_size=1: the second consumer's poll() raises
    JoinRefusedError(GROUP_MAX_SIZE_REACHED) with the hint, from every poll, and it never joins
    again; the first consumer keeps its partitions (no rebalance). Before, the second member
    joined again every join_backoff_ms, for ever."""
    coord = make_coordinator(group_max_size=1)
    topics = Topics(redis_client, namespace)
    topics.create("t", 2)
    Producer(redis_client, namespace).send_batch("t", [b"%d" % i for i in range(4)])
    consumers: list[Consumer] = []

    def make() -> Consumer:
        c = Consumer(
            ConsumerGroupConfig(
                group_id="g", topics=["t"], redis_client=redis_client, namespace=namespace,
                heartbeat_interval_ms=50, session_timeout_ms=1000, rebalance_timeout_ms=3000,
                retry_backoff_ms=10, retry_backoff_max_ms=100, join_backoff_ms=20,
            ),
            fetch_max_wait_ms=20,
        )
        consumers.append(c)
        return c

    try:
        first, second = make(), make()
        poll_until(first, lambda g: len(g) == 4)
        gen = first.generation
        assert gen is not None
        for _ in range(2):
            with pytest.raises(JoinRefusedError, match="group_max_size") as info:
                second.poll(timeout=WAIT_S)
            assert info.value.error is Errors.GROUP_MAX_SIZE_REACHED
        assert second.group.closed
        members = coord.describe_group("g").members
        assert [m.member_id for m in members] == [gen.member_id]
        first.poll(timeout=0.05)
        assert first.generation is gen and not gen.done.is_set()
    finally:
        for c in consumers:
            c.close(timeout=WAIT_S)


# -- close() from another thread --------------------------------------------------------------

OUTAGE_SESSION_MS = 20_000
"""The session timeout of the outage tests: long against close()'s timeout, so a close() that
waits for a commit's retries (one session timeout each) shows, and short enough for the old
behaviour's test run to end."""

CLOSE_BOUND_S = 10.0
"""How long those tests let close(timeout=CLOSE_TIMEOUT_S) take: far more than its timeout (a
loaded machine), less than the session timeout its retries used to wait for."""

CLOSE_TIMEOUT_S = 0.5


def _outage_client(server: EmbeddedServer) -> Any:
    """A client whose call fails within 0.3 s when the server is unreachable: no redis-py
    retries (the default retries a call ten times, with back-off), a 0.3 s socket timeout (a
    SIGSTOPped server never answers)."""
    return server.client(socket_timeout=0.3, retry=RedisRetry(NoBackoff(), 0))


def _cut_off(server: EmbeddedServer, outage: str) -> None:
    """Make ``server`` unreachable: stopped ("killed"), or SIGSTOPped (it never answers; the
    caller sends SIGCONT)."""
    if outage == "killed":
        server.stop()
    else:
        assert server.pid is not None
        os.kill(server.pid, signal.SIGSTOP)


def _outage_consumer(client: Any, namespace: str, mode: str = "subscribe",
                     auto_commit_interval_ms: int = 100_000) -> Consumer:
    """A consumer of topic "t" (one partition, five records) through ``client``, with a 20 s
    session and quick retries, auto-committing only on revocation or close() unless
    ``auto_commit_interval_ms`` says otherwise; subscribed, or with ``mode="assign"`` assigned
    the partition. The namespace's group settings have no initial rebalance delay."""
    without_join_delay(client, namespace)
    Topics(client, namespace).create("t", 1)
    Producer(client, namespace).send_batch("t", [b"%d" % i for i in range(5)])
    consumer = Consumer(
        ConsumerGroupConfig(
            group_id="g", topics=["t"] if mode == "subscribe" else [], redis_client=client,
            namespace=namespace,
            heartbeat_interval_ms=100, session_timeout_ms=OUTAGE_SESSION_MS,
            rebalance_timeout_ms=OUTAGE_SESSION_MS, retry_backoff_ms=10,
            retry_backoff_max_ms=100,
        ),
        fetch_max_wait_ms=20,
        auto_commit_interval_ms=auto_commit_interval_ms,
    )
    if mode == "assign":
        consumer.assign([TP("t", 0)])
    return consumer


@pytest.mark.parametrize("mode", ["subscribe", "assign"])
@pytest.mark.parametrize("commit", ["sync", "async"])
@pytest.mark.parametrize("outage", ["killed", "sigstopped"])
def test_real_close_from_another_thread_honours_its_timeout_when_redis_is_unreachable(
    own_server: EmbeddedServer, namespace: str, outage: str, commit: str, mode: str
) -> None:
    """A poll thread commits after each batch (Kafka's at-least-once loop; or queues async
    commits); Redis becomes unreachable; another thread calls close(timeout). The poll
    thread's commit retries for a session timeout and close() waited for it, then retried the
    final revocation commit for another one: close(0.5) took up to two session timeouts (and
    queued async commits one each). close() must return within its timeout (here: well before
    one session timeout, allowing for the one call in flight), from any thread. The same with
    assign(), whose close() makes a final auto-commit too (the "assign" cases pass on the code
    before that commit, which made none; they keep its bound)."""
    client = _outage_client(own_server)
    consumer = _outage_consumer(client, namespace, mode)
    got: list[ConsumerRecord] = []
    in_commit = threading.Event()  # the loop is inside commit(), or queued async ones
    outage_began = threading.Event()
    ended: list[BaseException | None] = []
    completions: list[BaseException | None] = []

    def loop() -> None:
        try:
            while True:
                got.extend(consumer.poll(timeout=0.05))
                if commit == "sync":
                    in_commit.set()
                    consumer.commit()
                    in_commit.clear()
                    continue
                for _ in range(20):
                    consumer.commit_async(None, lambda offsets, exc: completions.append(exc))
                if outage_began.is_set() and consumer._committer.pending >= 100:
                    in_commit.set()
        except BaseException as exc:  # noqa: BLE001 - the test looks at how the loop ended
            ended.append(exc)

    poller = threading.Thread(target=loop, daemon=True)
    poller.start()
    pid = own_server.pid
    assert pid is not None
    try:
        wait_until(lambda: len(got) == 5)
        _cut_off(own_server, outage)
        outage_began.set()
        assert in_commit.wait(WAIT_S)  # the loop commits (retrying, or about to) in the outage
        closer = threading.Thread(target=consumer.close, args=(CLOSE_TIMEOUT_S,), daemon=True)
        closer.start()
        closer.join(CLOSE_BOUND_S)
        assert not closer.is_alive(), "close() waited for the unreachable coordinator"
        poller.join(CLOSE_BOUND_S)
        assert not poller.is_alive()
        # The loop ended: its commit gave up (ConnectionLost), or the next call found the
        # consumer closed.
        assert len(ended) == 1 and isinstance(ended[0], RcoordError)
    finally:
        if outage == "sigstopped":
            os.kill(pid, signal.SIGCONT)
        consumer.close(timeout=WAIT_S)
        poller.join(3 * OUTAGE_SESSION_MS / 1000)  # the old behaviour's retries end by then
        client.close()


WAKEUP_BOUND_S = 10.0
"""How long the wakeup tests let a woken call take: far more than it needs, less than the
session timeout (OUTAGE_SESSION_MS) its retries used to run for."""


@pytest.mark.parametrize("outage", ["killed", "sigstopped"])
def test_real_wakeup_interrupts_a_commit_retrying_while_redis_is_unreachable(
    own_server: EmbeddedServer, namespace: str, outage: str
) -> None:
    """Kafka's wakeup() interrupts commitSync. Before, wakeup() was looked at only at the top of
    poll()'s loop, so a commit() retrying against an unreachable coordinator went on for a
    session timeout (here 20 s) before anything noticed it."""
    client = _outage_client(own_server)
    consumer = _outage_consumer(client, namespace)
    got: list[ConsumerRecord] = []
    # The poll thread's commit is retrying (its log says so: from the committer thread, where
    # commit() makes its commit, or from the poll thread's own calls).
    retrying = threading.Event()
    ended: list[BaseException] = []

    class Retries(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            name = record.threadName or ""
            if ((name == "poller" or name.endswith("-committer"))
                    and "retrying after" in record.getMessage()):
                retrying.set()

    handler = Retries(logging.INFO)
    rcoord_log = logging.getLogger("rcoord.client")
    level = rcoord_log.level
    rcoord_log.addHandler(handler)
    rcoord_log.setLevel(logging.INFO)

    def loop() -> None:
        try:
            while True:
                got.extend(consumer.poll(timeout=0.05))
                consumer.commit()
        except BaseException as exc:  # noqa: BLE001 - the test looks at how the loop ended
            ended.append(exc)

    poller = threading.Thread(target=loop, name="poller", daemon=True)
    poller.start()
    pid = own_server.pid
    assert pid is not None
    try:
        wait_until(lambda: len(got) == 5)
        _cut_off(own_server, outage)
        assert retrying.wait(WAIT_S)  # commit() (or the poll before it) retries in the outage
        consumer.wakeup()
        poller.join(WAKEUP_BOUND_S)
        assert not poller.is_alive(), "wakeup() waited for the commit's retries"
        assert len(ended) == 1 and isinstance(ended[0], WakeupError), ended
    finally:
        rcoord_log.removeHandler(handler)
        rcoord_log.setLevel(level)
        if outage == "sigstopped":
            os.kill(pid, signal.SIGCONT)
        consumer.close(timeout=0.5)
        poller.join(3 * OUTAGE_SESSION_MS / 1000)  # the old behaviour's retries end by then
        client.close()


def _waits_in(thread: threading.Thread, function: str) -> bool:
    """Whether ``thread`` is inside ``function`` now (its stack, read without touching it).

    With the garbage collector off: on Python 3.11 a collection that starts inside
    ``sys._current_frames()`` (which allocates while it holds the interpreter's thread-list
    lock) can deadlock the process (CPython issue 106883, fixed in 3.12 by doing the same);
    it hung a full run here once."""
    import gc
    import sys

    enabled = gc.isenabled()
    gc.disable()
    try:
        frame = sys._current_frames().get(thread.ident or -1)
        while frame is not None:
            if frame.f_code.co_name == function:
                return True
            frame = frame.f_back
        return False
    finally:
        if enabled:
            gc.enable()


def _recording_thread(call: Callable[[], object], ended: list[Any], name: str) -> threading.Thread:
    """A daemon thread (not started) running ``call`` that appends how it ended to ``ended``:
    None, or the exception it raised (the test looks at how it ended)."""

    def run() -> None:
        try:
            call()
            ended.append(None)
        except BaseException as exc:  # noqa: BLE001 - the test looks at how it ended
            ended.append(exc)

    return threading.Thread(target=run, name=name, daemon=True)


def _wakeup_ends_the_wait_for_an_async_commit(
    server: EmbeddedServer, consumer: Consumer, queued: dict[TopicPartition, int] | None,
    done: list[tuple[dict[TopicPartition, int], BaseException | None]],
    waiter: threading.Thread, ended: list[Any], queued_behind: int = 0,
) -> None:
    """The server stops answering (SIGSTOP); an async commit of ``queued`` is queued (its
    callback appends to ``done``) and retries; ``waiter`` starts and waits for it; wakeup() must
    end that wait at once, ``waiter`` recording one WakeupError in ``ended``, with the async
    commit still queued, and ``queued_behind`` commits the waiter queued after it. The server
    answers again afterwards (SIGCONT, also on a failure)."""
    pid = server.pid
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    try:
        consumer.commit_async(queued, lambda offsets, exc: done.append((offsets, exc)))
        waiter.start()
        wait_until(lambda: _waits_in(waiter, "wait_idle"))
        consumer.wakeup()
        waiter.join(WAKEUP_BOUND_S)
        assert not waiter.is_alive(), "wakeup() waited for the earlier async commit"
        assert len(ended) == 1 and isinstance(ended[0], WakeupError), ended
        assert consumer._committer.pending == 1 + queued_behind  # still queued, still retrying
    finally:
        os.kill(pid, signal.SIGCONT)


def test_real_wakeup_interrupts_a_commit_waiting_for_earlier_async_commits(
    own_server: EmbeddedServer, namespace: str
) -> None:
    """commit() first waits for the async commits queued before it (as Kafka's commitSync),
    up to two session timeouts when they retry against an unreachable coordinator; wakeup()
    from another thread must end that wait with WakeupError, as it ends commit()'s retries.
    Before, the wait went on until the queued commit's retries ran out (a session timeout, here
    20 s). The queued commit is neither lost nor made twice: it lands once the server answers
    again, and its callback runs once."""
    client = _outage_client(own_server)
    consumer = _outage_consumer(client, namespace)
    done: list[tuple[dict[TopicPartition, int], BaseException | None]] = []
    ended: list[BaseException | None] = []

    committer = _recording_thread(lambda: consumer.commit({TP("t", 0): 3}), ended, "committing")
    try:
        poll_until(consumer, lambda g: len(g) == 5)
        _wakeup_ends_the_wait_for_an_async_commit(own_server, consumer, None, done, committer,
                                                  ended)
        wait_until(lambda: done, lambda: consumer.poll(timeout=0.02))  # its callback runs
        assert done == [({TP("t", 0): 5}, None)]
        # The async commit landed, and the interrupted commit of 3 was never sent after it.
        assert consumer.committed([TP("t", 0)]) == {TP("t", 0): 5}
        consumer.commit()  # the wakeup was used up
        assert done == [({TP("t", 0): 5}, None)]  # its callback ran once
    finally:
        consumer.close(timeout=0.5)
        committer.join(3 * OUTAGE_SESSION_MS / 1000)  # the old behaviour's wait ends by then
        client.close()


def test_wakeup_interrupts_auto_commit_retries_in_poll_but_not_the_heartbeats() -> None:
    """An auto-commit inside poll() retries COORDINATOR_NOT_AVAILABLE (for a session timeout,
    30 s here); wakeup() ends it: poll() raises WakeupError. The heartbeat, retrying the same
    code in its own thread with the same retry function, goes on retrying, and the generation
    does not end. Before, poll() raised only after the auto-commit's retries ran out."""
    state = OneMemberGroup(partitions=1, records=3)
    consumer = Consumer(
        fast_config(session_timeout_ms=30_000),
        coordinator=state.fake,  # type: ignore[arg-type]
        fetch_max_wait_ms=5,
        auto_commit_interval_ms=1,
    )
    ended: list[BaseException] = []
    try:
        poll_until(consumer, lambda g: len(g) == 3)
        gen = consumer.generation
        assert gen is not None
        state.commit_answers.extend([Errors.COORDINATOR_NOT_AVAILABLE] * 1_000_000)
        state.heartbeat_default = Errors.COORDINATOR_NOT_AVAILABLE

        def loop() -> None:
            try:
                while True:
                    consumer.poll(timeout=0.05)
            except BaseException as exc:  # noqa: BLE001 - the test looks at how it ended
                ended.append(exc)

        poller = threading.Thread(target=loop, daemon=True)
        poller.start()
        wait_until(lambda: state.kinds().count("commit") >= 5)  # retrying the auto-commit
        consumer.wakeup()
        poller.join(WAKEUP_BOUND_S)
        assert not poller.is_alive(), "wakeup() waited for the auto-commit's retries"
        assert len(ended) == 1 and isinstance(ended[0], WakeupError), ended
        beats = state.heartbeats
        wait_until(lambda: state.heartbeats >= beats + 5)  # the heartbeat still retries
        assert not gen.done.is_set()
    finally:
        state.commit_answers.clear()
        state.heartbeat_default = Errors.NONE
        consumer.close(timeout=WAIT_S)


def test_wakeup_interrupts_poll_while_its_auto_commit_waits_for_earlier_async_commits() -> None:
    """poll()'s auto-commit is queued behind the async commits queued before it, so that it
    never overtakes one, and poll() waits for it (until its timeout: none here); against an
    unavailable coordinator they retry for a session timeout (30 s here). wakeup() must end
    that wait: poll() raises WakeupError at once. Before, the wait went on until the queued
    commit's retries ran out. Nothing is half done: the auto-commit was not sent, and once the
    coordinator answers again the queued commit lands, then the auto-commit behind it."""
    state = OneMemberGroup(partitions=1, records=3)
    tp = TP("t", 0)
    consumer = Consumer(
        fast_config(session_timeout_ms=30_000),
        coordinator=state.fake,  # type: ignore[arg-type]
        fetch_max_wait_ms=5,
        auto_commit_interval_ms=1,
    )
    done: list[tuple[dict[TopicPartition, int], BaseException | None]] = []
    ended: list[BaseException | None] = []

    def commits_of(offset: int) -> int:
        return sum(1 for e in list(state.events) if e[0] == "commit" and e[2] == {tp: offset})

    poller = _recording_thread(lambda: consumer.poll(timeout=WAIT_S), ended, "poller")
    try:
        poll_until(consumer, lambda g: len(g) == 3)  # position 3, not committed yet
        assert commits_of(3) == 0
        state.commit_answers.extend([Errors.COORDINATOR_NOT_AVAILABLE] * 1_000_000)
        consumer.commit_async({tp: 1}, lambda offsets, exc: done.append((offsets, exc)))
        wait_until(lambda: commits_of(1) >= 2)  # the committer thread retries it
        poller.start()
        wait_until(lambda: _waits_in(poller, "wait_idle"))  # the auto-commit waits for it
        consumer.wakeup()
        poller.join(WAKEUP_BOUND_S)
        assert not poller.is_alive(), "wakeup() waited for the earlier async commit"
        assert len(ended) == 1 and isinstance(ended[0], WakeupError), ended
        assert commits_of(3) == 0  # the auto-commit was not sent
        assert consumer._committer.pending == 2  # the async commit, the auto-commit behind it
        state.commit_answers.clear()  # the coordinator answers again
        wait_until(lambda: state.committed.get(tp) == 3 and done,
                   lambda: consumer.poll(timeout=0.02))  # (a later poll() runs the callback)
        assert done == [({tp: 1}, None)]
        commits = [e[2][tp] for e in state.events if e[0] == "commit" and tp in e[2]]
        assert commits.index(3) > max(i for i, o in enumerate(commits) if o == 1)
    finally:
        state.commit_answers.clear()
        consumer.close(timeout=WAIT_S)
        poller.join(WAIT_S)


def test_real_wakeup_interrupts_poll_while_its_auto_commit_waits_for_earlier_async_commits(
    own_server: EmbeddedServer, namespace: str
) -> None:
    """The same against a real server that stops answering (SIGSTOP): the queued async commit
    retries for a session timeout (20 s), poll()'s auto-commit is queued behind it and poll()
    waits for both, and wakeup() ends that wait. After SIGCONT the async commit lands, its
    callback runs once, and the auto-commit sends the positions: committed, never moved back."""
    client = _outage_client(own_server)
    consumer = _outage_consumer(client, namespace, auto_commit_interval_ms=1)
    tp = TP("t", 0)
    done: list[tuple[dict[TopicPartition, int], BaseException | None]] = []
    ended: list[BaseException | None] = []

    poller = _recording_thread(lambda: consumer.poll(timeout=WAIT_S), ended, "poller")
    try:
        poll_until(consumer, lambda g: len(g) == 5)
        _wakeup_ends_the_wait_for_an_async_commit(own_server, consumer, {tp: 2}, done, poller,
                                                  ended, queued_behind=1)
        wait_until(lambda: done and consumer.committed([tp]) == {tp: 5},
                   lambda: consumer.poll(timeout=0.02))
        assert done == [({tp: 2}, None)]
    finally:
        consumer.close(timeout=0.5)
        poller.join(3 * OUTAGE_SESSION_MS / 1000)  # the old behaviour's wait ends by then
        client.close()


def _poll_in_a_thread(
    consumer: Consumer,
) -> tuple[threading.Thread, list[ConsumerRecord], list[int]]:
    """A poll loop in its own thread, until the consumer is closed: the thread, the records it
    got, and (one item) how many of them it had when its latest poll() began, which is how
    many a close() from another thread counts as processed (the ones handed out after are
    not committed)."""
    got: list[ConsumerRecord] = []
    done = [0]

    def run() -> None:
        while True:
            done[0] = len(got)
            try:
                got.extend(consumer.poll(timeout=0.05))
            except IllegalStateError:
                return  # closed

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, got, done


@pytest.mark.parametrize("timeout", [0.0, WAIT_S])
def test_real_close_from_another_thread_commits_while_redis_answers(
    env: Any, timeout: float
) -> None:
    """close() from another thread than the poll loop's: the loop stops, close() revokes, and
    with a reachable coordinator the final commits land whatever the timeout: past it, a
    commit is no longer retried but still sent once (close(0) included)."""
    env.topics.create("t", 2)
    env.producer.send_batch("t", [b"%d" % i for i in range(20)])
    revoked: list[list[TopicPartition]] = []

    class Committing(ConsumerRebalanceListener):
        def on_partitions_revoked(self, partitions: list[TopicPartition]) -> None:
            revoked.append(sorted(partitions))
            consumer.commit()

    consumer = env.consumer(Committing(), enable_auto_commit=False)
    loop, _, done = _poll_in_a_thread(consumer)
    wait_until(lambda: done[0] == 20)
    consumer.close(timeout=timeout)
    loop.join(WAIT_S)
    assert not loop.is_alive()
    assert revoked == [[TP("t", 0), TP("t", 1)]]
    assert _committed(env, 2) == _log_ends(env, 2)
    # It leaves the group (after close(0), from the group's thread, in the background).
    wait_until(lambda: env.coord.describe_group("g").members == [])


def test_real_close_from_another_thread_flushes_async_commits_of_the_revocation(
    env: Any,
) -> None:
    """The async commits on_partitions_revoked makes during a close() from another thread land
    in the generation and their callbacks run, before the member leaves."""
    queued = 50
    consumer, completions = _async_committing_consumer(env, 2, 20, queued)
    loop, _, done = _poll_in_a_thread(consumer)
    wait_until(lambda: done[0] == 20)
    consumer.close(timeout=WAIT_S)
    loop.join(WAIT_S)
    assert not loop.is_alive()
    assert completions == [None] * queued
    assert _committed(env, 2) == _log_ends(env, 2)


def _close_while_busy(consumer: Any, run: Callable[[], None], busy: threading.Event,
                      release: threading.Event) -> None:
    """Run the loop ``run`` on a thread, close the consumer once the loop signals ``busy``
    (mid-record), then let the loop go on and wait for it to end."""
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert busy.wait(WAIT_S)
    consumer.close(timeout=WAIT_S)
    release.set()
    thread.join(WAIT_S)
    assert not thread.is_alive()


@pytest.mark.parametrize("loop", ["poll", "iterate"])
def test_real_close_from_another_thread_commits_only_what_the_loop_is_done_with(
    env: Any, loop: str
) -> None:
    """A shutdown thread closes the consumer while the loop is in the middle of its records:
    auto-commit commits what the loop has finished (a poll()'s records once it polls again;
    when iterating, each record once the loop asks for the next), never the records it is
    still on, which the partition's next owner then gets (at-least-once; before, close()
    committed every record handed out, and a process exiting after it lost them)."""
    env.topics.create("t", 1)
    env.producer.send_batch("t", [b"%d" % i for i in range(10)])
    consumer = env.consumer(max_poll_records=4)
    busy, release = threading.Event(), threading.Event()
    finished: list[int] = []

    def work(offset: int) -> None:
        if offset == 6:  # the second batch (offsets 4-7) is on its third record
            busy.set()
            release.wait(WAIT_S)
        finished.append(offset)

    def run() -> None:
        try:
            if loop == "iterate":
                for record in consumer:
                    work(record.offset)
            else:
                while True:
                    for record in consumer.poll(timeout=0.05):
                        work(record.offset)
        except IllegalStateError:
            pass  # closed

    _close_while_busy(consumer, run, busy, release)
    # Offsets 0-5 were finished; 6 was being processed: the iterator counts 4 and 5 done, a
    # poll loop only the batch before (0-3).
    assert _committed(env, 1) == {TP("t", 0): 6 if loop == "iterate" else 4}
    # The iterator yields nothing after close() (it went on with 7 from the closed consumer,
    # records its next owner gets too); a poll loop's list is the application's.
    assert finished == list(range(7 if loop == "iterate" else 8))
    nxt = env.consumer()
    got = poll_until(nxt, lambda got: len(got) >= 1)
    assert got[0].offset == (6 if loop == "iterate" else 4)


def _twelve_in_batches_of_four(env: Any) -> Consumer:
    """The iterator tests' setup: topic t (one partition) holding offsets 0-11, and a consumer
    whose polls hand out four records at a time."""
    env.topics.create("t", 1)
    env.producer.send_batch("t", [b"%d" % i for i in range(12)])
    return env.consumer(max_poll_records=4)


@pytest.mark.parametrize("then", ["break", "go_on"])
def test_real_close_inside_the_loop_body_commits_up_to_the_record_it_is_on(
        env: Any, then: str) -> None:
    """close() called in the body of ``for record in consumer`` (at offset 2 of a batch of
    0-3) commits 2, as an exception there does: the record the loop is on and the rest of its
    batch were not processed. And the loop yields nothing more, ``break`` or not. Before, that
    close() committed 4, past records the loop never reached (lost to the group), and a loop
    that went on was handed 3 from the closed consumer."""
    consumer = _twelve_in_batches_of_four(env)
    seen = []
    for record in consumer:
        seen.append(record.offset)
        if record.offset == 2:
            consumer.close(timeout=WAIT_S)
            if then == "break":
                break
    assert seen == [0, 1, 2]
    assert _committed(env, 1) == {TP("t", 0): 2}


def test_real_close_from_another_thread_keeps_the_partitions_the_loop_finished(
        env: Any) -> None:
    """Iterating one batch that holds two partitions' records, a close() from another thread
    while the loop is on the second partition's second record commits the first partition past
    all its records (the loop asked past them) and the second up to the record it is on.
    Before, the first partition went back to its last record, which its next owner got again."""
    env.topics.create("t", 2)
    for p in range(2):
        env.producer.send_batch("t", [ProducerRecord(b"%d" % i, partition=p) for i in range(3)])
    consumer = env.consumer(max_poll_records=100)
    busy, release = threading.Event(), threading.Event()
    order: list[tuple[int, int]] = []

    def run() -> None:
        for record in consumer:
            order.append((record.partition, record.offset))
            if record.partition != order[0][0] and record.offset == 1:
                busy.set()
                release.wait(WAIT_S)

    _close_while_busy(consumer, run, busy, release)
    first, second = order[0][0], 1 - order[0][0]
    assert order == [(first, 0), (first, 1), (first, 2), (second, 0), (second, 1)]
    assert _committed(env, 2) == {TP("t", first): 3, TP("t", second): 1}


def test_real_offset_queries_before_the_first_poll_do_not_join(env: Any) -> None:
    """A subscribed consumer's offset queries need no membership: before its first poll() it
    stays out of the group, as Kafka's does. Before, the first query joined, and the member
    held partitions while the application had not polled yet (no max_poll_interval watched
    it), so nobody read them."""
    env.topics.create("t", 2)
    env.producer.send_batch("t", [b"%d" % i for i in range(4)])
    # (a group id of its own: its threads, rcoord-<group id>-..., are told from another
    # test's consumer of group "g" that is still ending in this process)
    group = env.namespace
    consumer = env.consumer(group_id=group)
    tps = [TP("t", 0), TP("t", 1)]
    assert consumer.end_offsets(tps) == {TP("t", 0): 2, TP("t", 1): 2}
    assert consumer.beginning_offsets(tps) == {TP("t", 0): 0, TP("t", 1): 0}
    assert consumer.committed(tps) == {TP("t", 0): -1, TP("t", 1): -1}
    assert consumer.committed(tps, metadata=True) == {TP("t", 0): None, TP("t", 1): None}
    assert set(consumer.offsets_for_times({tp: 0 for tp in tps})) == set(tps)
    assert not [t for t in threading.enumerate() if t.name == f"rcoord-{group}-run"]
    assert env.coord.describe_group(group).members == []
    got = poll_until(consumer, lambda got: len(got) >= 4)
    assert sorted((r.partition, r.offset) for r in got) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert len(env.coord.describe_group(group).members) == 1


def test_real_committed_with_metadata_returns_what_was_committed(env: Any) -> None:
    """``committed(metadata=True)`` answers as Kafka's ``committed()``: the committed
    ``OffsetAndMetadata`` (metadata string and leader epoch included), None where nothing is
    committed; before, only the offsets could be read back through the consumer."""
    env.topics.create("t", 2)
    env.producer.send_batch("t", [b"%d" % i for i in range(4)])
    consumer = env.consumer()
    try:
        poll_until(consumer, lambda got: len(got) >= 4)
        consumer.commit({TP("t", 0): OffsetAndMetadata(2, "batch-7", leader_epoch=3)})
        got = consumer.committed([TP("t", 0), TP("t", 1)], metadata=True)
        first = got[TP("t", 0)]
        assert first is not None and got[TP("t", 1)] is None
        assert (first.offset, first.metadata, first.leader_epoch) == (2, "batch-7", 3)
        assert first.commit_timestamp_ms is not None and first.commit_timestamp_ms > 0
        assert consumer.committed([TP("t", 0), TP("t", 1)]) == {TP("t", 0): 2, TP("t", 1): -1}
    finally:
        consumer.close()


def test_real_an_endless_timeout_means_no_bound(env: Any) -> None:
    """``poll(float("inf"))`` (Kafka's ``poll(Long.MAX_VALUE)`` idiom) and ``close(inf)`` wait
    without a bound; before, the first wait they reached (an auto-commit due, close's final
    commit) raised OverflowError, and close() left its fetch thread running. A negative or
    non-number close() timeout is refused, as poll()'s is."""
    env.topics.create("t", 1)
    env.producer.send_batch("t", [b"%d" % i for i in range(6)])
    group = env.namespace  # (its threads told from another test's consumer of group "g")
    consumer = env.consumer(group_id=group, max_poll_records=3, auto_commit_interval_ms=1)
    # The fetch thread would end by itself once idle: only close() may end it here.
    consumer._fetching._idle_exit_s = WAIT_S * 10
    assert [r.offset for r in consumer.poll(timeout=float("inf"))] == [0, 1, 2]
    assert [r.offset for r in consumer.poll(timeout=1e10)] == [3, 4, 5]
    with pytest.raises(ValueError, match="must be >= 0"):
        consumer.close(timeout=-1)
    with pytest.raises(TypeError, match="must be seconds"):
        consumer.close(timeout="5")  # type: ignore[arg-type]
    consumer.close(timeout=float("inf"))
    assert _committed(env, 1, group) == {TP("t", 0): 6}
    # close() never waits for a fetch in flight (a silent server could hold it): the fetch
    # thread ends once that call returns, which a live server answers within its block time.
    wait_until(lambda: not [t for t in threading.enumerate()
                            if t.name.startswith(f"rcoord-{group}-")])


def test_a_loop_left_mid_batch_goes_on_from_the_record_it_was_on(env: Any) -> None:
    """Iterating, a ``break`` (or an exception in the loop's body) at a record of a poll's
    batch: the next loop starts at that record, and close() commits no further. Before, poll()
    had moved the position past the whole batch, so the next loop skipped the records after
    it and close() committed them, never handed to the application."""
    consumer = _twelve_in_batches_of_four(env)
    seen = []
    for record in consumer:
        seen.append(record.offset)
        if record.offset == 1:
            break
    for record in consumer:
        seen.append(record.offset)
        if record.offset == 6:
            break
    assert seen == [0, 1, 1, 2, 3, 4, 5, 6]
    consumer.close(timeout=WAIT_S)
    assert _committed(env, 1) == {TP("t", 0): 6}


def _ten_at_their_start(env: Any, partitions: int = 1) -> Consumer:
    """Topic t: offsets 0-9 in each of ``partitions``; a consumer without auto-commit that
    holds them all, at their log start, the next poll() handing out every record at once."""
    env.topics.create("t", partitions)
    for p in range(partitions):
        env.producer.send_batch("t", [ProducerRecord(b"%d" % i, partition=p)
                                      for i in range(10)])
    consumer = env.consumer(enable_auto_commit=False, max_poll_records=100)
    tps = [TP("t", p) for p in range(partitions)]
    poll_until(consumer, lambda _: consumer.assignment() == tps)
    consumer.seek_to_beginning()
    return consumer


def test_a_seek_in_the_loop_body_applies_to_the_rest_of_the_batch(env: Any) -> None:
    """As kafka-python's iterator: a ``seek()`` in the body of ``for record in consumer`` takes
    effect at once, and a ``break`` after it keeps it. Before, the rest of the batch came
    first (offsets 3, 4 where 8, 9 were asked for), and ``seek(offset + 1); break`` (skip a
    poison record, then leave) was undone by the break, so the poison record came again."""
    consumer = _ten_at_their_start(env)
    seen = []
    for record in consumer:
        seen.append(record.offset)
        if record.offset == 2:
            consumer.seek(TP("t", 0), 8)
        if len(seen) == 5:
            break
    assert seen == [0, 1, 2, 8, 9]
    consumer.seek(TP("t", 0), 0)
    for record in consumer:
        if record.offset == 2:
            consumer.seek(TP("t", 0), 3)  # skip it
            break
    assert consumer.position(TP("t", 0)) == 3
    assert [r.offset for r in consumer.poll(timeout=WAIT_S)] == list(range(3, 10))


def test_a_pause_in_the_loop_body_holds_back_the_rest_of_the_batch(env: Any) -> None:
    """A ``pause()`` in the loop body stops that partition's records at once (back-pressure);
    after ``resume()`` they come, none lost. Before, the rest of the batch came anyway."""
    consumer = _ten_at_their_start(env)
    seen = []
    with pytest.raises(WakeupError):
        for record in consumer:
            seen.append(record.offset)
            if record.offset == 2:
                consumer.pause([TP("t", 0)])
                consumer.wakeup()  # the loop's next poll() raises: nothing is left to hand out
    assert seen == [0, 1, 2]
    assert consumer.position(TP("t", 0)) == 3
    consumer.resume([TP("t", 0)])
    assert [r.offset for r in poll_until(consumer, lambda got: len(got) >= 7)] == list(
        range(3, 10))


def test_a_commit_in_the_loop_body_counts_the_records_handed_out(env: Any) -> None:
    """``for record in consumer: handle(record); consumer.commit()`` commits up to the record
    the loop is on (kafka-python's iterator moves the position record by record), and
    ``position()`` says the same; a partition of the batch the loop has not reached yet keeps
    its start. Before, both read the end of the whole batch (10 at offset 2): a crash then
    lost the records after it."""
    consumer = _ten_at_their_start(env, partitions=2)
    for record in consumer:
        first = record.partition
        if record.offset == 2:
            consumer.commit()
            assert consumer.position(TP("t", first)) == 3
            break
    assert consumer.committed([TP("t", 0), TP("t", 1)]) == {TP("t", first): 3,
                                                            TP("t", 1 - first): 0}


def test_an_exception_in_the_loop_inside_with_commits_up_to_the_record_it_failed_on(
        env: Any) -> None:
    """``with consumer: for record in consumer: handle(record)``, ``handle`` raising at offset
    1: the close() on the way out commits 1, so the failed record and the rest of its batch
    come again (it committed 4 before: offsets 1-3 lost)."""
    consumer = _twelve_in_batches_of_four(env)
    with pytest.raises(RuntimeError, match="handler failed"), consumer:
        for record in consumer:
            if record.offset == 1:
                raise RuntimeError("handler failed")
    assert _committed(env, 1) == {TP("t", 0): 1}


def test_real_close_from_the_loops_own_thread_commits_everything_handed_out(env: Any) -> None:
    """The usual shutdown (the loop ends, then close() in its thread) commits every record
    poll() handed out, as Kafka's close() does: the loop is done with them."""
    env.topics.create("t", 1)
    env.producer.send_batch("t", [b"%d" % i for i in range(10)])
    consumer = env.consumer(max_poll_records=4)
    got = poll_until(consumer, lambda got: len(got) >= 4)
    consumer.close(timeout=WAIT_S)
    assert _committed(env, 1) == {TP("t", 0): got[-1].offset + 1}


def test_real_close_from_a_signal_handler_inside_poll_closes_when_poll_returns(
    env: Any,
) -> None:
    """close() from a signal handler that interrupts the loop's own poll() (on its thread,
    with the consumer's state half-changed under it) is put off until that poll() returns:
    the poll() returns no records instead of failing inside (a KeyError from the buffers its
    revocation had emptied, before), the records it had drained are not committed, and the
    consumer is closed and has left the group. The handler is simulated where a signal can
    land: inside poll(), in the fetch of the next records, after a batch was drained."""
    env.topics.create("t", 1)
    env.producer.send_batch("t", [b"%d" % i for i in range(10)])
    consumer = env.consumer(max_poll_records=4)
    first = poll_until(consumer, lambda got: len(got) >= 4, max_records=4)
    assert [r.offset for r in first] == [0, 1, 2, 3]
    real_drain = consumer._drain

    def drain_then_signal(limit: int) -> list[ConsumerRecord]:
        records = real_drain(limit)
        if records:
            consumer.close(timeout=WAIT_S)  # what a SIGTERM handler calling close() does
        return records

    consumer._drain = drain_then_signal  # type: ignore[method-assign]
    assert consumer.poll(timeout=WAIT_S) == []
    with pytest.raises(IllegalStateError):
        consumer.poll(timeout=0)
    # The first batch was processed (the loop polled again); the drained one was never seen.
    assert _committed(env, 1) == {TP("t", 0): 4}
    wait_until(lambda: env.coord.describe_group("g").members == [])
