"""``Consumer.position()`` and the pending offset resets it evaluates (``seek_to_beginning``,
``seek_to_end``), against Kafka's ``ClassicKafkaConsumer.position`` and
``updateFetchPositions``. Real servers (the ``env`` fixture of test_consumer)."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import test_consumer
from harness import wait_until
from test_client_group import WAIT_S
from test_consumer_commit_exists import _CountsLookups

from rcoord import Errors, TopicPartition
from rcoord.client import IllegalStateError, NoOffsetForPartitionError, WakeupError
from rcoord.client.coordinator import RedisCoordinator
from rcoord.topics import TopicError

TP = TopicPartition
env = test_consumer.env


class _CreatesOnFirstMiss(RedisCoordinator):
    """Once ``armed``, creates the topic ``t`` (and appends ``records`` to t-0) when a read
    of log offsets has found it missing: the position() asking next must find it."""

    def __init__(self, env: Any, records: int) -> None:
        super().__init__(env.client, env.namespace)
        self._env, self._records = env, records
        self.armed = False
        self.misses = 0

    def log_offsets_many(self, partitions: Any) -> Any:
        found = super().log_offsets_many(partitions)
        if self.armed and any(not isinstance(got, tuple) for got in found):
            self.misses += 1
            if self.misses == 1:
                self._env.topics.create("t", 1)
                for i in range(self._records):
                    self._env.producer.send("t", b"r%d" % i, partition=0)
        return found


def test_position_waits_for_a_topic_created_after_the_first_try(env: Any) -> None:
    """As Kafka's position(), which retries the pending reset until its timeout: a
    seek_to_end() of an assign()ed partition whose topic appears while position() runs
    resolves to the end the topic then has. Before, the first UNKNOWN_TOPIC_OR_PARTITION
    was raised at once."""
    coord = _CreatesOnFirstMiss(env, 2)
    consumer = env.consumer(enable_auto_commit=False, topics=[], coordinator=coord)
    consumer.assign([TP("t", 0)])
    consumer.seek_to_end()
    coord.armed = True
    assert consumer.position(TP("t", 0), timeout=WAIT_S) == 2
    assert coord.misses == 1


def test_position_of_a_missing_topic_times_out(env: Any) -> None:
    """Kafka's position() raises a TimeoutException once its timeout passed without the
    position; here TimeoutError, naming the partition and what is missing. Before, the
    TopicError of the first read, at once, whatever the timeout."""
    consumer = env.consumer(enable_auto_commit=False, topics=[])
    consumer.assign([TP("t", 0)])
    consumer.seek_to_beginning()
    with pytest.raises(TimeoutError, match="t-0 .*UNKNOWN_TOPIC_OR_PARTITION"):
        consumer.position(TP("t", 0), timeout=0.05)
    # The seek stays pending: once the topic exists, the position is its start.
    env.topics.create("t", 1)
    assert consumer.position(TP("t", 0), timeout=WAIT_S) == 0


def test_wakeup_ends_positions_wait_for_a_missing_topic(env: Any) -> None:
    """wakeup() from another thread ends position()'s retries (Kafka's position() polls the
    network client, which a wakeup() interrupts)."""
    consumer = env.consumer(enable_auto_commit=False, topics=[], retry_backoff_ms=60_000,
                            retry_backoff_max_ms=60_000)
    consumer.assign([TP("t", 0)])
    consumer.seek_to_end()
    failed: list[Exception] = []

    def ask() -> None:
        try:
            consumer.position(TP("t", 0), timeout=WAIT_S)
        except Exception as exc:  # noqa: BLE001 (the test looks at what it was)
            failed.append(exc)

    asking = threading.Thread(target=ask)
    asking.start()
    consumer.wakeup()
    asking.join(WAIT_S)
    assert not asking.is_alive()
    assert len(failed) == 1 and isinstance(failed[0], WakeupError)


def test_position_evaluates_every_pending_reset(env: Any) -> None:
    """Kafka's position() runs updateFetchPositions, which resets every partition awaiting a
    reset, not only the one asked about: after seek_to_end() of two partitions, position() of
    one fixes the other's at the end it has then, and records appended after that are read.
    Before, the other's edge was read only at the next poll(), past those records. A
    partition of a topic that does not exist yet stays pending and does not hold up the
    answer."""
    env.topics.create("t", 2)
    for p in (0, 1):
        env.producer.send("t", b"old", partition=p)
    consumer = env.consumer(enable_auto_commit=False, topics=[])
    consumer.assign([TP("t", 0), TP("t", 1), TP("u", 0)])
    consumer.seek_to_end()
    assert consumer.position(TP("t", 0), timeout=WAIT_S) == 1
    env.producer.send("t", b"new", partition=1)
    assert consumer.lag() == {TP("t", 0): 0, TP("t", 1): 1}  # (u-0: still no position)
    assert consumer.position(TP("t", 1), timeout=0) == 1
    with pytest.raises(TimeoutError):
        consumer.position(TP("u", 0), timeout=0)


class _CountsLogOffsetReads(RedisCoordinator):
    """Counts the reads of log offsets: one per partition, or one per batch."""

    def __init__(self, env: Any) -> None:
        super().__init__(env.client, env.namespace)
        self.single = 0
        self.batches: list[int] = []

    def log_offsets(self, topic: str, partition: int) -> tuple[int, int]:
        self.single += 1
        return super().log_offsets(topic, partition)

    def log_offsets_many(self, partitions: Any) -> Any:
        self.batches.append(len(partitions))
        return super().log_offsets_many(partitions)


@pytest.mark.parametrize("by", ["position", "poll"])
def test_pending_resets_are_read_in_one_round_trip(env: Any, by: str) -> None:
    """Kafka's resetPositionsIfNeeded sends one ListOffsets per leader for every partition
    awaiting a reset. Before, position() and a poll()'s fetch read each partition's log
    offsets in a round trip of its own. The answers keep their partitions apart: the missing
    topic's partition stays pending, the others get their own edges."""
    env.topics.create("t", 3)
    for p in range(3):
        for _ in range(p + 1):
            env.producer.send("t", b"x", partition=p)
    coord = _CountsLogOffsetReads(env)
    consumer = env.consumer(enable_auto_commit=False, topics=[], coordinator=coord)
    consumer.assign([TP("t", 0), TP("t", 1), TP("t", 2), TP("u", 0)])
    consumer.seek_to_end()
    coord.single, coord.batches = 0, []
    if by == "position":
        assert consumer.position(TP("t", 2), timeout=WAIT_S) == 3
        assert coord.batches == [4]
    else:  # (the fetch runs on the fetch thread: poll until a poll() collected it)
        ends = {TP("t", 0): 0, TP("t", 1): 0, TP("t", 2): 0}
        wait_until(lambda: consumer.lag() == ends, lambda: consumer.poll(timeout=0.05))
        assert coord.batches[:1] == [4]
    assert coord.single == 0
    assert consumer.lag() == {TP("t", 0): 0, TP("t", 1): 0, TP("t", 2): 0}
    assert [consumer.position(TP("t", p), timeout=0) for p in range(3)] == [1, 2, 3]


def test_end_offsets_of_a_partition_named_twice(env: Any) -> None:
    """end_offsets()/beginning_offsets() read every partition in one round trip; one named
    twice is read once and answered once (Kafka's endOffsets takes a collection, answers a
    map). Before, the second read of a missing partition was never sent (``_run`` sends no
    call of a key after its error reply), and its None answer crashed with a TypeError
    instead of the UNKNOWN_TOPIC_OR_PARTITION TopicError."""
    env.topics.create("t", 1)
    env.producer.send("t", b"x", partition=0)
    coord = _CountsLogOffsetReads(env)
    consumer = env.consumer(enable_auto_commit=False, topics=[], coordinator=coord)
    assert consumer.end_offsets([TP("t", 0), TP("t", 0)], timeout=WAIT_S) == {TP("t", 0): 1}
    with pytest.raises(TopicError) as raised:
        consumer.beginning_offsets([TP("u", 0), TP("t", 0), TP("u", 0)], timeout=WAIT_S)
    assert raised.value.error is Errors.UNKNOWN_TOPIC_OR_PARTITION
    assert coord.batches == [2, 3]


class _TopicGone(RedisCoordinator):
    """Once ``armed``, answers every read of log offsets as if the topic had been deleted."""

    def __init__(self, env: Any) -> None:
        super().__init__(env.client, env.namespace)
        self.armed = False
        self.misses = 0

    def log_offsets_many(self, partitions: Any) -> Any:
        if not self.armed:
            return super().log_offsets_many(partitions)
        self.misses += 1
        return [Errors.UNKNOWN_TOPIC_OR_PARTITION for _ in partitions]


def test_close_from_another_thread_ends_positions_wait(env: Any) -> None:
    """close() from another thread ends position()'s wait for a missing partition; the
    position() then raises IllegalStateError (closed). Before, it woke while close() had
    dropped the assignment but not yet marked the consumer closed, found no pending reset,
    and read the dropped position: a KeyError."""
    env.topics.create("t", 1)
    coord = _TopicGone(env)
    consumer = env.consumer(enable_auto_commit=False, coordinator=coord,
                            retry_backoff_ms=60_000, retry_backoff_max_ms=60_000)
    wait_until(lambda: consumer.assignment() == [TP("t", 0)],
               lambda: consumer.poll(timeout=0.05))
    consumer.seek_to_end()
    coord.armed = True
    dropped, done = threading.Event(), threading.Event()
    failed: list[BaseException] = []
    pause, drop = consumer._pause, consumer._drop_assignment

    def pause_then_wait_for_the_drop(seconds: float) -> None:
        pause(seconds)  # (ended by close())
        assert dropped.wait(WAIT_S)

    def ask() -> None:
        try:
            consumer.position(TP("t", 0), timeout=WAIT_S)
        except BaseException as exc:  # noqa: BLE001 (the test looks at what it was)
            failed.append(exc)
        finally:
            done.set()

    asking = threading.Thread(target=ask)

    def drop_then_wait_for_position() -> None:
        drop()
        dropped.set()  # (close() goes on once position() answered or waits for the lock)
        wait_until(lambda: done.is_set() or consumer._owner == asking.ident)

    consumer._pause = pause_then_wait_for_the_drop  # type: ignore[method-assign]
    consumer._drop_assignment = drop_then_wait_for_position  # type: ignore[method-assign]
    asking.start()
    wait_until(lambda: coord.misses >= 1)
    consumer.close(timeout=WAIT_S)
    asking.join(WAIT_S)
    assert not asking.is_alive()
    assert len(failed) == 1 and isinstance(failed[0], IllegalStateError), failed


def test_close_ends_a_listeners_wait_for_a_missing_partition(env: Any) -> None:
    """position() in on_partitions_assigned (poll() holds the consumer there) waiting for a
    missing partition, and close() from another thread: the wait ends with one more read and
    IllegalStateError (closing), and the close goes on. Before, the pause returned at once
    once close() had begun, so position() read Redis in a busy loop until its timeout, and
    close() waited as long."""
    env.topics.create("t", 1)
    coord = _TopicGone(env)
    outcome: list[BaseException | int] = []

    class SeeksToEnd:
        def on_partitions_assigned(self, partitions: list[TopicPartition]) -> None:
            consumer.seek_to_end(partitions)
            coord.armed = True
            try:
                outcome.append(consumer.position(TP("t", 0), timeout=WAIT_S))
            except BaseException as exc:  # noqa: BLE001 (the test looks at what it was)
                outcome.append(exc)

    consumer = env.consumer(SeeksToEnd(), enable_auto_commit=False, coordinator=coord,
                            retry_backoff_ms=60_000, retry_backoff_max_ms=60_000)
    polling = threading.Thread(target=lambda: wait_until(
        lambda: bool(outcome), lambda: consumer.poll(timeout=0.05)))
    polling.start()
    wait_until(lambda: coord.misses >= 1)
    consumer.close(timeout=WAIT_S)
    polling.join(WAIT_S)
    assert not polling.is_alive()
    assert len(outcome) == 1 and isinstance(outcome[0], IllegalStateError), outcome
    assert "closing" in str(outcome[0])
    assert coord.misses == 2


def test_assign_of_a_topic_not_created_yet_starts_at_its_end_once_created(env: Any) -> None:
    """As Kafka's consumer, which retries the auto.offset.reset of a partition missing from its
    metadata and then resets to the end the log has at that time: under "latest", an assign()ed
    partition of a topic created later starts at the end it has once it exists; the records
    appended before are not read. Before, it started at 0 and read them all."""
    consumer = env.consumer(enable_auto_commit=False, topics=[], start_offset="latest")
    consumer.assign([TP("t", 0)])
    assert consumer.poll(timeout=0.05) == []
    with pytest.raises(TimeoutError, match="t-0 .*UNKNOWN_TOPIC_OR_PARTITION"):
        consumer.position(TP("t", 0), timeout=0)
    env.topics.create("t", 1)
    for i in range(2):
        env.producer.send("t", b"before%d" % i, partition=0)
    wait_until(lambda: consumer.lag() == {TP("t", 0): 0}, lambda: consumer.poll(timeout=0.05))
    assert consumer.position(TP("t", 0)) == 2
    env.producer.send("t", b"after", partition=0)
    got = test_consumer.poll_until(consumer, lambda g: len(g) >= 1)
    assert [r.offset for r in got] == [2]


def test_assign_of_a_partition_past_the_count_waits_for_it(env: Any) -> None:
    """The same for a partition number past its topic's count, until add_partitions makes it:
    its position is the end it then has. Before, 0."""
    env.topics.create("t", 1)
    consumer = env.consumer(enable_auto_commit=False, topics=[], start_offset="latest")
    consumer.assign([TP("t", 0), TP("t", 1)])
    assert consumer.position(TP("t", 0)) == 0  # (it exists: no wait)
    with pytest.raises(TimeoutError, match="t-1 .*UNKNOWN_TOPIC_OR_PARTITION"):
        consumer.position(TP("t", 1), timeout=0)
    env.topics.add_partitions("t", 2)
    env.producer.send("t", b"x", partition=1)
    assert consumer.position(TP("t", 1), timeout=WAIT_S) == 1


def test_assign_of_a_missing_topic_under_earliest_has_no_position_to_commit(env: Any) -> None:
    """Under "earliest" too the partition has no position until it exists (Kafka's position()
    blocks, then times out): close()'s auto-commit leaves it uncommitted. Before, position()
    answered 0 at once, and that 0 was committed for a partition that did not exist."""
    consumer = env.consumer(topics=[], start_offset="earliest")
    consumer.assign([TP("t", 0)])
    with pytest.raises(TimeoutError, match="t-0"):
        consumer.position(TP("t", 0), timeout=0)
    consumer.close()
    assert env.coord.fetch_offsets("g", [TP("t", 0)]).offsets[TP("t", 0)].offset == -1
    env.topics.create("t", 1)
    env.producer.send("t", b"first", partition=0)
    again = env.consumer(enable_auto_commit=False, topics=[], start_offset="earliest")
    again.assign([TP("t", 0)])
    assert [r.offset for r in test_consumer.poll_until(again, lambda g: len(g) >= 1)] == [0]


def test_assign_of_a_missing_topic_under_none_raises_no_offset(env: Any) -> None:
    """Under "none", as Kafka's NoOffsetForPartitionException: nothing committed, no position,
    whether the partition exists or not."""
    consumer = env.consumer(enable_auto_commit=False, topics=[], start_offset="none")
    consumer.assign([TP("t", 0)])
    with pytest.raises(NoOffsetForPartitionError):
        consumer.position(TP("t", 0))
    with pytest.raises(NoOffsetForPartitionError):
        consumer.poll(timeout=0)


def test_assign_of_a_topic_created_between_its_reads_starts_at_its_end(env: Any) -> None:
    """The partition is judged missing by the log read that found no offsets, not by a later
    read of the counts: a topic created (and written) between the two made the second read
    find it, so it started at the 0 the first had given for "no offsets", and under "latest"
    read the records appended before. Now its reset waits for it: position 2."""
    coord = _CreatesOnFirstMiss(env, 2)
    coord.armed = True
    consumer = env.consumer(enable_auto_commit=False, topics=[], start_offset="latest",
                            coordinator=coord)
    consumer.assign([TP("t", 0)])
    assert consumer.position(TP("t", 0), timeout=WAIT_S) == 2
    assert coord.misses == 1  # (the read of the start, by position(), found it missing)


def test_assign_of_a_missing_partition_logs_that_it_waits(
        env: Any, caplog: pytest.LogCaptureFixture) -> None:
    """The warning says the partition waits for its topic and then starts by start_offset;
    it said "starting at 0", which assign() no longer does (the position waits)."""
    consumer = env.consumer(enable_auto_commit=False, topics=[], start_offset="latest")
    def logged() -> str:
        return "\n".join(r.getMessage() for r in caplog.records)

    got: list[Any] = []
    with caplog.at_level("WARNING", logger="rcoord.client"):
        consumer.assign([TP("t", 0)])
        # (poll() reads the start, none yet, on a thread of its own: _collect_starts)
        wait_until(lambda: "does not exist yet" in logged(),
                   lambda: got.extend(consumer.poll(timeout=0)))
    text = logged()
    assert got == []
    assert "t-0 does not exist yet" in text and "start_offset='latest'" in text, text
    assert "starting at 0" not in text, text


def test_assign_of_a_deleted_topic_does_not_start_at_its_old_commit(env: Any) -> None:
    """A commit to a topic deleted since (rcoord keeps it; Kafka deletes a topic's offsets with
    it) is no start for an assign()ed partition of a topic that does not exist: it waits for
    the topic as one without a commit, and starts by start_offset once it exists. Before, the
    old offset was the position (the creation-time check cannot judge a topic that does not
    exist), so the re-created topic was read from 5: its records 0..4 were skipped."""
    env.topics.create("t", 1)
    first = env.consumer(enable_auto_commit=False, topics=[])
    first.assign([TP("t", 0)])
    first.commit({TP("t", 0): 5})
    first.close()
    env.topics.delete("t")
    consumer = env.consumer(enable_auto_commit=False, topics=[], start_offset="earliest")
    consumer.assign([TP("t", 0)])
    with pytest.raises(TimeoutError, match="t-0"):
        consumer.position(TP("t", 0), timeout=0)
    env.topics.create("t", 1)
    for i in range(7):
        env.producer.send("t", b"r%d" % i, partition=0)
    got = test_consumer.poll_until(consumer, lambda g: len(g) >= 7)
    assert [r.offset for r in got] == list(range(7))


def test_committed_of_a_deleted_topic_is_none_as_assign_takes_it(env: Any) -> None:
    """committed() answers none for a deleted topic's partition, as assign() takes its commit
    (a06559b) and as Kafka, which deletes a topic's offsets with it. Before, it answered the
    old offset while start_offset="none" raised NoOffsetForPartitionError ("no committed
    offset") for that very partition. A topic that exists costs no extra read."""
    env.topics.create("t", 1)
    env.topics.create("u", 1)
    first = env.consumer(enable_auto_commit=False, topics=[])
    first.assign([TP("t", 0), TP("u", 0)])
    first.commit({TP("t", 0): 5, TP("u", 0): 3})
    first.close()
    coord = _CountsLookups(env)
    consumer = env.consumer(enable_auto_commit=False, topics=[], start_offset="none",
                            coordinator=coord)
    consumer.assign([TP("t", 0), TP("u", 0)])
    assert consumer.position(TP("t", 0)) == 5  # (read with u-0's: both are held now)
    assert consumer.committed() == {TP("t", 0): 5, TP("u", 0): 3}
    assert len(coord.lookups) == 0
    env.topics.delete("t")
    consumer.assign([TP("u", 0), TP("t", 1)])
    consumer.assign([TP("t", 0), TP("u", 0)])
    with pytest.raises(NoOffsetForPartitionError, match="t-0"):
        consumer.position(TP("t", 0), timeout=0)
    assert consumer.committed() == {TP("t", 0): -1, TP("u", 0): 3}
    got = consumer.committed([TP("t", 0)], metadata=True)
    assert got == {TP("t", 0): None}


def test_committed_of_an_illegal_topic_name_is_none_and_does_not_raise(env: Any) -> None:
    """A commit stored under an illegal topic name (only a commit bypassing the consumer's
    check can store one) is of no topic: committed() answers none for it, and does not raise
    INVALID_TOPIC_EXCEPTION from the read that looks for deleted topics."""
    env.coord.commit_offsets("g", {TP("bad name!", 0): 4})
    consumer = env.consumer(enable_auto_commit=False, topics=[])
    assert consumer.committed([TP("bad name!", 0)]) == {TP("bad name!", 0): -1}


def test_committed_of_a_partition_past_the_count_is_none(env: Any) -> None:
    """A commit to a partition number past an existing topic's count (stored by a path that
    skips the consumer's check) is none for committed(), as Kafka answers no offset for a
    partition that does not exist and as assign() takes it. Before, committed() answered it.
    Partitions the consumer holds cost no read; a partition past the count is read again
    each time (the topic may have grown: test_review_committed_counts.py)."""
    env.topics.create("t", 1)
    env.coord.commit_offsets("g", {TP("t", 0): 2, TP("t", 3): 4})
    coord = _CountsLookups(env)
    consumer = env.consumer(enable_auto_commit=False, topics=[], coordinator=coord,
                            partition_watch_interval_ms=600_000)
    consumer.assign([TP("t", 0)])
    assert consumer.position(TP("t", 0)) == 2  # (its start read: it is held now)
    assert consumer.committed() == {TP("t", 0): 2}
    assert len(coord.lookups) == 0
    assert consumer.committed([TP("t", 0), TP("t", 3)]) == {TP("t", 0): 2, TP("t", 3): -1}
    assert consumer.committed([TP("t", 3)], metadata=True) == {TP("t", 3): None}
    assert len(coord.lookups) == 2
    consumer.assign([TP("t", 0), TP("t", 3)])  # (t-3 waits for the partition to exist)
    assert consumer.committed() == {TP("t", 0): 2, TP("t", 3): -1}
    assert len(coord.lookups) == 3
    consumer.assign([TP("t", 3)])
    assert consumer.committed([TP("t", 0)]) == {TP("t", 0): 2}
    assert len(coord.lookups) == 3  # (t-0, below the count kept, costs none)
