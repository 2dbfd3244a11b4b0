"""Consumer API as Kafka users know it: seek, pause, offsets by time, async commits, the poll
interval, assign, and subscribe by pattern. Real servers, one node and a cluster (the ``env``
fixture of test_consumer); every wait is on a condition, bounded by ``wait_until``.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any

import pytest
import redis
import redis.cluster
import test_consumer
from harness import wait_until
from test_client_group import WAIT_S
from test_consumer import Recorder, poll_until

from rcoord import Errors, MemberIdentity, OffsetAndMetadata, TopicPartition
from rcoord.client import (
    CommitFailedError,
    ConcurrentModificationError,
    Consumer,
    NoOffsetForPartitionError,
    RebalanceInProgressError,
    WakeupError,
)
from rcoord.client.coordinator import RedisCoordinator
from rcoord.client.errors import IllegalStateError
from rcoord.errors import ConfigError, ConnectionLost

TP = TopicPartition
env = test_consumer.env  # the fixture: a namespace, its topics, a producer, consumers of "g"


def _fill(env: Any, partitions: int, per_partition: int) -> None:
    env.topics.create("t", partitions)
    for p in range(partitions):
        for i in range(per_partition):
            env.producer.send("t", b"p%d-%d" % (p, i), partition=p)


def _consume_all(consumer: Consumer, n: int) -> list[Any]:
    return poll_until(consumer, lambda g: len(g) >= n)


# -- 1. positions and flow control ------------------------------------------------------------


def test_seek_seek_to_beginning_and_end_and_position(env: Any) -> None:
    _fill(env, 2, 5)
    consumer = env.consumer(enable_auto_commit=False)
    assert len(_consume_all(consumer, 10)) == 10
    assert consumer.position(TP("t", 0)) == 5 and consumer.position(TP("t", 1)) == 5

    consumer.seek(TP("t", 0), 3)
    assert consumer.position(TP("t", 0)) == 3
    again = _consume_all(consumer, 2)
    assert sorted((r.partition, r.offset) for r in again) == [(0, 3), (0, 4)]

    consumer.seek_to_beginning([TP("t", 1)])
    assert consumer.position(TP("t", 1)) == 0
    assert sorted(r.offset for r in _consume_all(consumer, 5)) == [0, 1, 2, 3, 4]

    consumer.seek_to_beginning()
    assert len(_consume_all(consumer, 10)) == 10
    consumer.seek(TP("t", 0), 1)
    consumer.seek_to_end()
    assert consumer.position(TP("t", 0)) == 5 and consumer.position(TP("t", 1)) == 5
    assert consumer.poll(timeout=0.1) == []
    env.producer.send("t", b"new", partition=1)
    assert [(r.partition, r.offset) for r in _consume_all(consumer, 1)] == [(1, 5)]


def test_seek_to_end_is_evaluated_at_the_next_poll_not_at_the_call(env: Any) -> None:
    """Kafka's seekToEnd is lazy (requestOffsetReset): records appended between the call and
    the next poll() are past the end it seeks to. Before, the end was read at the call, and
    that poll() returned them."""
    _fill(env, 1, 3)
    consumer = env.consumer(enable_auto_commit=False)
    assert len(_consume_all(consumer, 3)) == 3
    consumer.seek_to_end()
    env.producer.send("t", b"before the poll", partition=0)  # offset 3
    assert consumer.poll(timeout=0.1) == []
    assert consumer.position(TP("t", 0)) == 4
    env.producer.send("t", b"after", partition=0)
    assert [r.offset for r in _consume_all(consumer, 1)] == [4]


def test_position_evaluates_a_pending_seek_to_end_and_commit_skips_it(env: Any) -> None:
    """Until a seek_to_* is evaluated the partition has no position, so commit() leaves its
    committed offset alone (Kafka commits only valid positions: allConsumed). Before, the
    edge read at the call was committed, records the application never read included;
    position() evaluates it, as Kafka's does."""
    _fill(env, 2, 2)
    consumer = env.consumer(enable_auto_commit=False)
    assert len(_consume_all(consumer, 4)) == 4
    consumer.commit()
    consumer.seek_to_beginning([TP("t", 0)])
    consumer.commit()
    committed = env.coord.fetch_offsets("g", [TP("t", 0), TP("t", 1)]).offsets
    assert {tp: o.offset for tp, o in committed.items()} == {TP("t", 0): 2, TP("t", 1): 2}
    assert consumer.lag() == {TP("t", 1): 0}  # (no position, no lag)
    env.producer.send("t", b"x", partition=1)
    consumer.seek_to_end([TP("t", 1)])
    env.producer.send("t", b"y", partition=1)
    assert consumer.position(TP("t", 1)) == 4 and consumer.position(TP("t", 0)) == 0
    assert sorted((r.partition, r.offset) for r in _consume_all(consumer, 2)) == [(0, 0), (0, 1)]
    consumer.commit()
    committed = env.coord.fetch_offsets("g", [TP("t", 0), TP("t", 1)]).offsets
    assert {tp: o.offset for tp, o in committed.items()} == {TP("t", 0): 2, TP("t", 1): 4}


def test_a_seek_to_end_not_evaluated_before_the_revocation_is_not_committed(env: Any) -> None:
    """close() revokes with a final auto-commit: a seek_to_end() no poll() evaluated leaves the
    partition's committed offset where it was, so its next owner reads the records this one
    skipped without reading (Kafka's reset is dropped with the partition). Before, the end
    read at the call was committed and those records were never processed by anyone."""
    _fill(env, 1, 3)
    consumer = env.consumer()
    assert len(_consume_all(consumer, 3)) == 3
    consumer.commit()
    env.producer.send_batch("t", [b"unread%d" % i for i in range(2)])
    consumer.seek_to_end()
    consumer.close()
    assert env.coord.fetch_offsets("g", [TP("t", 0)]).offsets[TP("t", 0)].offset == 3


def test_seek_to_end_of_a_topic_not_created_yet_waits_for_it(env: Any) -> None:
    """As Kafka's pending offset reset, which is retried until the partition exists: the
    seek_to_end() of an assign()ed partition of a topic not created yet resolves to the end
    the topic has when a poll() first finds it. Before, the call raised
    UNKNOWN_TOPIC_OR_PARTITION."""
    consumer = env.consumer(enable_auto_commit=False, topics=[])
    consumer.assign([TP("t", 0)])
    consumer.seek_to_end()
    assert consumer.poll(timeout=0.05) == []
    _fill(env, 1, 2)
    # (lag() has no entry for a partition without a position: the seek is pending)
    wait_until(lambda: consumer.lag() == {TP("t", 0): 0}, lambda: consumer.poll(timeout=0.05))
    assert consumer.position(TP("t", 0)) == 2
    env.producer.send("t", b"new", partition=0)
    assert [r.offset for r in _consume_all(consumer, 1)] == [2]


def test_a_paused_partitions_seek_to_end_is_evaluated_at_the_next_poll(env: Any) -> None:
    """Kafka's poll() resets every partition awaiting a reset, paused ones included
    (SubscriptionState.partitionsNeedingReset does not look at pausing): after seek_to_end(),
    pause() and a poll(), the position is the end at that poll, a commit sends it, and the
    records appended while paused come after resume(). Before, a paused partition's reset
    waited for resume(): those records were skipped, and nothing was committed meanwhile."""
    _fill(env, 1, 3)
    consumer = env.consumer(enable_auto_commit=False)
    assert len(_consume_all(consumer, 3)) == 3
    consumer.commit()
    consumer.pause([TP("t", 0)])
    consumer.seek(TP("t", 0), 1)
    consumer.seek_to_end()
    env.producer.send("t", b"before the poll", partition=0)  # offset 3
    wait_until(lambda: TP("t", 0) in consumer.lag(), lambda: consumer.poll(timeout=0.05))
    env.producer.send("t", b"while paused", partition=0)  # offset 4: after the reset
    consumer.commit()
    assert env.coord.fetch_offsets("g", [TP("t", 0)]).offsets[TP("t", 0)].offset == 4
    assert consumer.lag() == {TP("t", 0): 1}
    consumer.resume([TP("t", 0)])
    assert [r.offset for r in _consume_all(consumer, 1)] == [4]


def test_lag_leaves_out_a_partition_that_does_not_exist(env: Any) -> None:
    """lag() of an assignment with a partition that does not exist (not created yet) gives
    the others' lag and leaves that one out; before, the whole call raised TopicError
    (UNKNOWN_TOPIC_OR_PARTITION), so one missing partition hid every other's lag."""
    _fill(env, 1, 3)
    consumer = env.consumer(enable_auto_commit=False, topics=[])
    consumer.assign([TP("t", 0), TP("u", 0)])
    # (the starts are read by the first position() or poll(), as Kafka's: no lag before)
    assert consumer.position(TP("t", 0)) == 0
    assert consumer.lag() == {TP("t", 0): 3}
    env.topics.create("u", 1)
    env.producer.send("u", b"x", partition=0)
    # u-0 has a position once it exists and its reset ran (here by position(); start_offset
    # "earliest": 0), as Kafka's currentLag is empty until then.
    assert consumer.lag() == {TP("t", 0): 3}
    assert consumer.position(TP("u", 0), timeout=WAIT_S) == 0
    assert consumer.lag() == {TP("t", 0): 3, TP("u", 0): 1}


def test_seek_past_int64_is_refused_and_the_final_commit_keeps_the_others(env: Any) -> None:
    """A seek past int64 (which Kafka's long cannot hold) raises ValueError at the call.
    Before, it was taken, and close()'s final auto-commit, which carried that position, was
    refused whole: t-1's consumed position was never committed either."""
    _fill(env, 2, 3)
    consumer = env.consumer()
    assert len(_consume_all(consumer, 6)) == 6
    with pytest.raises(ValueError, match="int64"):
        consumer.seek(TP("t", 0), 2**63)
    consumer.seek(TP("t", 0), 2**63 - 1)  # the largest a Kafka offset can be
    consumer.seek(TP("t", 0), 1)
    consumer.close()
    committed = env.coord.fetch_offsets("g", [TP("t", 0), TP("t", 1)]).offsets
    assert {tp: o.offset for tp, o in committed.items()} == {TP("t", 0): 1, TP("t", 1): 3}


def test_seek_and_pause_of_unassigned_partitions_raise_illegal_state(env: Any) -> None:
    _fill(env, 1, 1)
    consumer = env.consumer()
    _consume_all(consumer, 1)
    for call in (
        lambda: consumer.seek(TP("t", 7), 0),
        lambda: consumer.seek_to_end([TP("other", 0)]),
        lambda: consumer.pause([TP("t", 3)]),
        lambda: consumer.resume([TP("t", 3)]),
        lambda: consumer.position(TP("t", 9)),
    ):
        with pytest.raises(IllegalStateError, match="not assigned to this consumer"):
            call()
    with pytest.raises(ValueError, match="offset must be an int >= 0"):
        consumer.seek(TP("t", 0), -1)
    assert consumer.paused() == []


def test_offsets_for_times(env: Any) -> None:
    env.topics.create("t", 2)
    metas = [env.producer.send("t", b"%d" % i, partition=0) for i in range(3)]
    consumer = env.consumer()
    got = _consume_all(consumer, 3)
    stamps = [r.timestamp_ms for r in sorted(got, key=lambda r: r.offset)]
    assert len(metas) == 3
    found = consumer.offsets_for_times(
        {TP("t", 0): stamps[1], TP("t", 1): 0, ("t", 0): stamps[-1] + 10**9}  # type: ignore[dict-item]
    )
    first_at_or_after = next(i for i, ts in enumerate(stamps) if ts >= stamps[1])
    assert found[TP("t", 0)] is None  # the last key given for t-0 wins: nothing that recent
    assert found[TP("t", 1)] is None  # an empty partition has no record at all
    one = consumer.offsets_for_times({TP("t", 0): stamps[1]})[TP("t", 0)]
    assert one is not None and one.offset == first_at_or_after and one.timestamp_ms == stamps[1]
    earliest = consumer.offsets_for_times({TP("t", 0): 0})[TP("t", 0)]
    assert earliest is not None and earliest.offset == 0


def test_pause_resume_and_pause_state_dropped_on_revoke(env: Any) -> None:
    _fill(env, 2, 3)
    listener = Recorder()
    consumer = env.consumer(listener, enable_auto_commit=False)
    poll_until(consumer, lambda g: consumer.assignment() == [TP("t", 0), TP("t", 1)])
    consumer.seek_to_beginning()  # the poll that saw the assignment may have returned records
    consumer.pause([TP("t", 0)])
    assert consumer.paused() == [TP("t", 0)]
    got = _consume_all(consumer, 3)
    assert {r.partition for r in got} == {1}
    assert consumer.poll(timeout=0.1) == []  # t-0 has records, but it is paused
    assert consumer.assignment() == [TP("t", 0), TP("t", 1)]  # still assigned
    consumer.resume([TP("t", 0)])
    assert consumer.paused() == []
    assert sorted(r.offset for r in _consume_all(consumer, 3)) == [0, 1, 2]
    assert {r.partition for r in got} == {1}

    consumer.pause([TP("t", 0), TP("t", 1)])
    other = env.consumer()  # a second member: the eager rebalance revokes everything

    def step() -> None:
        consumer.poll(timeout=0.02)
        other.poll(timeout=0.02)

    wait_until(lambda: listener.kinds()[-2:] == ["revoked", "assigned"], step)
    assert consumer.paused() == []


# -- 2. asynchronous commits ------------------------------------------------------------------


def _kill_connections(client: Any) -> int:
    """Close every connection of every node (a blip for the consumer), asked through a client
    of its own, so that the consumer's connections all go, the one it used last included (asked
    through the consumer's client, the asking connection was spared, and on a cluster it could
    be the only one there was: nothing closed); returns how many were closed."""
    kill = ("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
    if hasattr(client, "get_nodes"):  # a cluster: each node
        nodes = [redis.cluster.ClusterNode(n.host, n.port) for n in client.get_nodes()]
        with redis.RedisCluster(startup_nodes=nodes) as killer:
            return sum(int(killer.execute_command(*kill, target_nodes=n))
                       for n in killer.get_nodes())
    kwargs = client.connection_pool.connection_kwargs
    with redis.Redis(host=kwargs["host"], port=kwargs["port"]) as killer:
        return int(killer.execute_command(*kill))


def test_commit_async_callbacks_in_order_through_connection_blips(env: Any) -> None:
    _fill(env, 1, 1)
    consumer = env.consumer(enable_auto_commit=False)
    _consume_all(consumer, 1)
    poller = threading.current_thread()
    done: list[tuple[int, BaseException | None, bool]] = []

    def callback(i: int) -> Any:
        def call(offsets: dict[TopicPartition, int], exc: BaseException | None) -> None:
            assert offsets == {TP("t", 0): i}
            done.append((i, exc, threading.current_thread() is poller))

        return call

    n = 60
    killed = 0
    for i in range(1, n + 1):
        consumer.commit_async({TP("t", 0): i}, callback(i))
        if i % 15 == 0:
            killed += _kill_connections(env.client)  # the committer meets dead connections
    assert killed > 0
    wait_until(lambda: len(done) == n, lambda: consumer.poll(timeout=0.02))
    assert [d[0] for d in done] == list(range(1, n + 1))  # commit order
    assert all(d[1] is None for d in done)
    assert all(d[2] for d in done)  # from poll(), in the caller's thread
    assert consumer.committed([TP("t", 0)]) == {TP("t", 0): n}  # the last one won


def test_commit_waits_for_earlier_async_commits(env: Any) -> None:
    _fill(env, 1, 3)
    consumer = env.consumer(enable_auto_commit=False)
    _consume_all(consumer, 3)
    done: list[int] = []
    for i in (1, 2):
        consumer.commit_async({TP("t", 0): i}, lambda o, e, i=i: done.append(i))
    consumer.commit()  # the position, 3: after both async ones, whose callbacks ran first
    assert done == [1, 2]
    assert consumer.committed([TP("t", 0)]) == {TP("t", 0): 3}


def test_commit_async_refused_reports_commit_failed_in_order(env: Any) -> None:
    _fill(env, 1, 1)
    consumer = env.consumer(enable_auto_commit=False)
    results: list[tuple[str, Any]] = []
    consumer.commit_async({TP("t", 0): 1}, lambda o, e: results.append(("before", e)))
    _consume_all(consumer, 1)
    consumer.commit_async(None, lambda o, e: results.append(("after", o)))
    wait_until(lambda: len(results) == 2, lambda: consumer.poll(timeout=0.02))
    assert results[0][0] == "before" and isinstance(results[0][1], CommitFailedError)
    assert results[1] == ("after", {TP("t", 0): 1})


# -- 3. max_poll_interval_ms --------------------------------------------------------------------


def test_consumer_that_stops_polling_leaves_and_rejoins_on_next_poll(env: Any) -> None:
    _fill(env, 2, 1)
    la, lb = Recorder(), Recorder()
    a = env.consumer(la, max_poll_interval_ms=400)
    b = env.consumer(lb, max_poll_interval_ms=60_000)

    def both() -> None:
        a.poll(timeout=0.02)
        b.poll(timeout=0.02)

    wait_until(lambda: len(a.assignment()) == 1 and len(b.assignment()) == 1, both)
    a_member, mark = a.member_id, len(la.kinds())
    # a stops polling; b goes on and gets both partitions once a has left the group.
    wait_until(lambda: len(b.assignment()) == 2, lambda: b.poll(timeout=0.02))
    assert a_member not in {m.member_id for m in env.coord.describe_group("g").members}
    assert a.assignment() != []  # a has not polled: it learns only at its next poll()
    # a polls again: its partitions were lost (not revoked: another member may own them), and
    # it rejoins as a new member.
    wait_until(lambda: len(a.assignment()) == 1 and len(b.assignment()) == 1, both)
    assert la.kinds()[mark:] == ["lost", "assigned"]
    assert a.member_id != a_member


def test_a_listener_stuck_past_the_poll_interval_makes_the_member_leave(env: Any) -> None:
    """Kafka resets its poll timer when poll() begins and calls the rebalance listener later in
    that poll, so a listener blocked past max.poll.interval.ms makes the member leave and its
    partitions go to the others. Before, time in the listener did not count: the member went on
    heartbeating and kept its partitions unread for as long as the listener blocked. Once the
    listener returns, the member rejoins (as at the next poll() after a poll timeout)."""
    _fill(env, 2, 1)
    entered, release = threading.Event(), threading.Event()

    class Stuck(Recorder):
        def on_partitions_assigned(self, partitions: list[TP]) -> None:
            super().on_partitions_assigned(partitions)
            if not entered.is_set():
                entered.set()
                release.wait(WAIT_S)  # a listener waiting on a database

    la = Stuck()
    a = env.consumer(la, max_poll_interval_ms=300, rebalance_timeout_ms=60_000)

    def poll_until_assigned() -> None:
        end = time.monotonic() + WAIT_S
        while not entered.is_set() and time.monotonic() < end:
            a.poll(timeout=0.05)

    poller = threading.Thread(target=poll_until_assigned)
    poller.start()
    try:
        assert entered.wait(WAIT_S)
        member = a.member_id
        wait_until(lambda: member not in {m.member_id for m in env.coord.describe_group("g").members})
        assert not release.is_set() and poller.is_alive()  # left while the listener still ran
    finally:
        release.set()
        poller.join(WAIT_S)
    assert not poller.is_alive()
    wait_until(lambda: len(a.assignment()) == 2 and a.member_id not in ("", member),
               lambda: a.poll(timeout=0.02))
    assert la.kinds()[0] == "assigned" and "assigned" in la.kinds()[1:]


def test_a_poll_between_the_poll_timeout_and_the_leave_still_rejoins() -> None:
    """The watchdog marks the expiry, then leaves; a poll() that begins in between takes the
    expiry and resumes the member before the leave stops it. The watchdog then resumes it
    itself: before, the member stayed out of the group for good (poll() returned nothing,
    with no error). The group is a stand-in: this is the timer's own interleaving."""
    import logging

    from rcoord.client.polltimer import PollTimer

    class Group:
        def __init__(self) -> None:
            self.may_join, self.left = True, 0

        def leave_until_resumed(self, reason: str) -> None:
            self.may_join, self.left = False, self.left + 1

        def resume(self) -> None:
            self.may_join = True

    group, stop = Group(), threading.Event()
    timer = PollTimer("g", 50, lambda: group, stop)  # type: ignore[arg-type, return-value]

    class PollsJustThen(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "leaving the group" in record.getMessage():
                timer.poll_started()  # the application's poll() begins (and goes on)

    handler = PollsJustThen()
    logger = logging.getLogger("rcoord.client")
    logger.addHandler(handler)
    try:
        timer.poll_started()
        timer.poll_finished()  # then nothing for longer than the 50 ms limit
        wait_until(lambda: group.left == 1 and group.may_join)
    finally:
        stop.set()
        logger.removeHandler(handler)


# -- 4. assign, unsubscribe, subscribe as a method ------------------------------------------


def test_assign_with_start_offset_none_needs_a_seek_for_an_uncommitted_partition(
    env: Any,
) -> None:
    _fill(env, 2, 4)
    env.coord.commit_offsets("g", {TP("t", 0): 1})
    manual = env.consumer(topics=[], start_offset="none")
    manual.assign([TP("t", 0), TP("t", 1)])
    got: list[Any] = []
    raised: list[NoOffsetForPartitionError] = []

    def poll_once() -> None:  # t-0's records may come first: the error waits for a poll without
        try:
            got.extend(manual.poll(timeout=0.05))
        except NoOffsetForPartitionError as exc:
            raised.append(exc)

    wait_until(lambda: bool(raised), poll_once)
    assert raised[0].partitions == [TP("t", 1)]
    manual.seek(TP("t", 1), 2)
    got += _consume_all(manual, 5 - len(got))
    assert sorted((r.partition, r.offset) for r in got) == [(0, 1), (0, 2), (0, 3), (1, 2), (1, 3)]
    manual.assign([TP("t", 0)])  # dropping the partition drops what was known of it
    assert manual.assignment() == [TP("t", 0)]


def test_wakeup_interrupts_a_blocked_poll_once(env: Any) -> None:
    """Kafka's wakeup(): a poll() blocked in another thread raises WakeupError; the consumer
    is unchanged and the next poll() works; a wakeup() with no poll running hits the next."""
    _fill(env, 1, 2)
    consumer = env.consumer()
    assert len(_consume_all(consumer, 2)) == 2
    outcome: list[BaseException | list[Any]] = []

    def blocked() -> None:
        try:
            outcome.append(consumer.poll(timeout=None))  # nothing arrives: blocks for ever
        except BaseException as exc:  # noqa: BLE001 - the test asserts on it
            outcome.append(exc)

    thread = threading.Thread(target=blocked)
    thread.start()
    wait_until(lambda: consumer._poll_timer._in_poll)  # the poll is running
    consumer.wakeup()
    thread.join(WAIT_S)
    assert not thread.is_alive() and isinstance(outcome[0], WakeupError)
    env.producer.send("t", b"after", partition=0)
    assert [r.value for r in _consume_all(consumer, 1)] == [b"after"]  # unchanged
    consumer.wakeup()
    with pytest.raises(WakeupError):
        consumer.poll(timeout=0.05)
    assert consumer.poll(timeout=0.05) == []  # once per wakeup()


_WAKEUP_CALLS: dict[str, Any] = {
    "commit": lambda c: c.commit({TP("t", 0): 2}),
    "committed": lambda c: c.committed(),
    "position": lambda c: c.position(TP("t", 0)),
    "beginning_offsets": lambda c: c.beginning_offsets([TP("t", 0)]),
    "end_offsets": lambda c: c.end_offsets([TP("t", 0)]),
    "offsets_for_times": lambda c: c.offsets_for_times({TP("t", 0): 0}),
}


@pytest.mark.parametrize("call", sorted(_WAKEUP_CALLS))
def test_a_pending_wakeup_is_raised_by_the_next_blocking_call_not_only_poll(
    env: Any, call: str
) -> None:
    """Kafka's wakeup(): with no call blocked, the next call to a method that can throw
    WakeupException throws it (commitSync, committed, position, beginningOffsets, endOffsets,
    offsetsForTimes, not only poll), once. Before, only poll() raised it: a loop stopped by a
    signal while inside commit() or an offset query went on to its next poll(). A pending
    commit() raises before sending anything."""
    _fill(env, 1, 2)
    consumer = env.consumer(enable_auto_commit=False)
    assert len(_consume_all(consumer, 2)) == 2
    consumer.seek_to_end([TP("t", 0)])  # position() must read the log's edge, so it blocks
    consumer.wakeup()
    with pytest.raises(WakeupError, match=f"{call}\\(\\) interrupted by wakeup"):
        _WAKEUP_CALLS[call](consumer)
    assert env.coord.fetch_offsets("g", [TP("t", 0)]).offsets[TP("t", 0)].offset == -1
    _WAKEUP_CALLS[call](consumer)  # used up: the same call now works
    assert consumer.poll(timeout=0.05) == []  # and poll() does not raise it again


def test_a_pending_wakeup_is_not_raised_by_a_call_that_does_not_block(env: Any) -> None:
    """Kafka's position() of a partition with a valid position, and committed() of no
    partitions, never poll the network, so a pending wakeup stays for the next call that
    does; close() ignores it (Kafka's close disables wakeups), its listener's commit works."""
    _fill(env, 1, 2)
    committed_in_close: list[dict[Any, int]] = []

    class Listener(Recorder):
        def on_partitions_revoked(self, partitions: list[TopicPartition]) -> None:
            consumer.commit()
            committed_in_close.append(consumer.committed())

    consumer = env.consumer(Listener(), enable_auto_commit=False)
    assert len(_consume_all(consumer, 2)) == 2
    consumer.wakeup()
    assert consumer.position(TP("t", 0)) == 2
    assert consumer.committed([]) == {}
    consumer.close(timeout=WAIT_S)
    assert committed_in_close == [{TP("t", 0): 2}]


def test_subscription_names_the_subscribed_topics(env: Any) -> None:
    env.topics.create("t", 1)
    env.topics.create("u", 1)
    consumer = env.consumer(topics=["u", "t", "u"])
    assert consumer.subscription() == ["t", "u"]
    consumer.unsubscribe()
    assert consumer.subscription() == []
    consumer.assign([TP("t", 0)])
    assert consumer.subscription() == []  # assigned, not subscribed (Kafka: empty)


def test_beginning_and_end_offsets_of_any_partition(env: Any) -> None:
    env.topics.create("t", 2, retention_records=3)
    for i in range(5):
        env.producer.send("t", b"%d" % i, partition=0)
    env.topics.apply_retention("t")
    consumer = env.consumer(topics=[])  # assigned nothing: any partition may be asked
    tps = [TP("t", 0), TP("t", 1)]
    assert consumer.beginning_offsets(tps) == {TP("t", 0): 2, TP("t", 1): 0}
    assert consumer.end_offsets(tps) == {TP("t", 0): 5, TP("t", 1): 0}


def test_assign_commits_as_a_simple_group_only_while_the_group_is_empty(env: Any) -> None:
    _fill(env, 2, 4)
    manual = env.consumer(topics=[], enable_auto_commit=False)
    manual.assign([TP("t", 1)])
    assert manual.assignment() == [TP("t", 1)]
    got = _consume_all(manual, 4)
    assert {r.partition for r in got} == {1} and manual.member_id == ""
    manual.commit()  # the group has no members: accepted
    assert env.coord.fetch_offsets("g", [TP("t", 1)]).offsets[TP("t", 1)].offset == 4
    assert env.coord.describe_group("g").members == []  # assign() never joined

    member = env.consumer()
    poll_until(member, lambda g: member.assignment() == [TP("t", 0), TP("t", 1)])
    with pytest.raises(CommitFailedError, match="has active members") as info:
        manual.commit({TP("t", 1): 2})
    assert info.value.error is Errors.UNKNOWN_MEMBER_ID
    results: list[Any] = []
    manual.commit_async({TP("t", 1): 3}, lambda o, e: results.append(e))
    wait_until(lambda: results, lambda: manual.poll(timeout=0.02))
    assert isinstance(results[0], CommitFailedError)

    member.close(timeout=WAIT_S)  # the group is empty again
    manual.commit({TP("t", 1): 1})
    assert env.coord.fetch_offsets("g", [TP("t", 1)]).offsets[TP("t", 1)].offset == 1

    # A later assign() keeps the position of a kept partition, starts a new one at its commit.
    env.coord.commit_offsets("g", {TP("t", 0): 2})
    manual.assign([TP("t", 0), TP("t", 1)])
    assert manual.position(TP("t", 1)) == 4 and manual.position(TP("t", 0)) == 2


def test_close_with_auto_commit_commits_the_positions_after_assign(env: Any) -> None:
    """As Kafka's close() with enable.auto.commit, which commits the consumed positions after
    assign() too (as a simple group: generation -1, no member id; the group has no members).
    Before, close() committed only a subscribed consumer's positions."""
    _fill(env, 2, 4)
    tps = [TP("t", 0), TP("t", 1)]
    # The periodic auto-commit does not come round before close().
    manual = env.consumer(topics=[], auto_commit_interval_ms=3_600_000)
    unsaved = env.consumer(topics=[], group_id="g-off", enable_auto_commit=False)
    for consumer in (manual, unsaved):
        consumer.assign(tps)
        assert len(_consume_all(consumer, 8)) == 8
    assert {o.offset for o in env.coord.fetch_offsets("g", tps).offsets.values()} == {-1}
    manual.close(timeout=WAIT_S)
    unsaved.close(timeout=WAIT_S)
    assert {tp: o.offset for tp, o in env.coord.fetch_offsets("g", tps).offsets.items()} == {
        TP("t", 0): 4, TP("t", 1): 4}
    assert env.coord.describe_group("g").members == []  # committed without joining
    assert {o.offset for o in env.coord.fetch_offsets("g-off", tps).offsets.values()} == {-1}


def test_mixing_subscribe_and_assign_raises_until_unsubscribe(env: Any) -> None:
    _fill(env, 2, 1)
    subscribed = env.consumer()
    with pytest.raises(IllegalStateError, match="unsubscribe"):
        subscribed.assign([TP("t", 0)])
    manual = env.consumer(topics=[])
    with pytest.raises(IllegalStateError, match="subscribe\\(\\) or assign\\(\\)"):
        manual.poll(timeout=0)
    manual.assign([TP("t", 0)])
    with pytest.raises(IllegalStateError, match="unsubscribe"):
        manual.subscribe(["t"])
    manual.unsubscribe()
    assert manual.assignment() == []
    listener = Recorder()
    manual.subscribe(["t"], listener=listener)
    poll_until(manual, lambda g: len(manual.assignment()) == 2)
    assert listener.kinds() == ["assigned"] and manual.member_id != ""

    # Unsubscribing a member revokes its partitions and leaves the group.
    manual.unsubscribe()
    assert listener.kinds() == ["assigned", "revoked"] and manual.assignment() == []
    wait_until(lambda: env.coord.describe_group("g").members == [])
    manual.assign([TP("t", 1)])
    assert manual.assignment() == [TP("t", 1)]


def test_a_closed_consumer_raises_illegal_state_from_every_call(env: Any) -> None:
    """Kafka's ``IllegalStateException("This consumer has already been closed.")``. Before,
    ``poll``/``commit`` raised a bare RcoordError, ``seek``/``pause`` said the partition was
    "not assigned; wait for on_partitions_assigned", ``committed``/``end_offsets`` a
    GroupClosedError, and ``assignment``/``committed([])`` answered as if open."""
    _fill(env, 1, 1)
    consumer = env.consumer()
    poll_until(consumer, lambda g: consumer.assignment() == [TP("t", 0)])
    consumer.close(timeout=WAIT_S)
    tp = TP("t", 0)
    calls = {
        "poll": lambda: consumer.poll(timeout=0),
        "commit": lambda: consumer.commit(),
        "commit_async": lambda: consumer.commit_async(),
        "assignment": consumer.assignment,
        "subscription": consumer.subscription,
        "position": lambda: consumer.position(tp),
        "seek": lambda: consumer.seek(tp, 0),
        "seek_to_beginning": lambda: consumer.seek_to_beginning(),
        "seek_to_end": lambda: consumer.seek_to_end([tp]),
        "pause": lambda: consumer.pause([tp]),
        "resume": lambda: consumer.resume([tp]),
        "paused": consumer.paused,
        "committed": lambda: consumer.committed([tp]),
        "lag": consumer.lag,
        "beginning_offsets": lambda: consumer.beginning_offsets([tp]),
        "end_offsets": lambda: consumer.end_offsets([tp]),
        "offsets_for_times": lambda: consumer.offsets_for_times({tp: 0}),
        "subscribe": lambda: consumer.subscribe(["t"]),
        "assign": lambda: consumer.assign([tp]),
        "unsubscribe": consumer.unsubscribe,
    }
    for name, call in calls.items():
        with pytest.raises(IllegalStateError, match="has been closed; create a new Consumer"):
            call()
            pytest.fail(f"{name}() on a closed consumer did not raise")
    consumer.close()  # closing again is still fine
    consumer.wakeup()


def test_a_negative_commit_offset_is_refused_before_anything_is_sent(env: Any) -> None:
    """Kafka's client refuses a negative offset ("Invalid negative offset"). Before, a -5 was
    committed, read back by ``committed()`` and silently reset by the next owner."""
    _fill(env, 1, 3)
    consumer = env.consumer(enable_auto_commit=False)
    assert len(_consume_all(consumer, 3)) == 3
    consumer.commit({TP("t", 0): 2})
    gen = consumer.generation
    assert gen is not None
    for call in (
        lambda: consumer.commit({TP("t", 0): -5}),
        lambda: consumer.commit({TP("t", 0): OffsetAndMetadata(-1)}),
        lambda: consumer.commit_async({TP("t", 0): -7}),
        lambda: gen.commit_offsets({TP("t", 0): -3}),
    ):
        with pytest.raises(ValueError, match="offset for t-0 must be >= 0"):
            call()
    with pytest.raises(TypeError, match="offset for t-0 must be an int"):
        consumer.commit({TP("t", 0): "3"})
    consumer.poll(timeout=0)  # runs any async callback; none was queued
    assert consumer.committed([TP("t", 0)]) == {TP("t", 0): 2}
    assert env.coord.fetch_offsets("g", [TP("t", 0)]).offsets[TP("t", 0)].offset == 2


def test_poll_with_a_timeout_that_is_not_a_number_names_it(env: Any) -> None:
    consumer = env.consumer(topics=[])
    with pytest.raises(TypeError, match="timeout must be seconds"):
        consumer.poll(timeout="1")  # type: ignore[arg-type]


def test_bad_poll_and_commit_async_arguments_fail_at_the_call(env: Any) -> None:
    """A negative or NaN timeout (Kafka's poll: "Timeout must not be negative"), a bool as
    max_records, a callback that cannot be called: refused at the call (they used to return
    no records at once, or fail later inside another call)."""
    consumer = env.consumer(topics=[])
    for timeout in (-1, -0.5, float("nan")):
        with pytest.raises(ValueError, match="timeout must be >= 0"):
            consumer.poll(timeout=timeout)
    with pytest.raises(ValueError, match="max_records must be an int >= 1"):
        consumer.poll(timeout=0, max_records=True)
    with pytest.raises(TypeError, match="callback must be callable"):
        consumer.commit_async({}, callback="not callable")  # type: ignore[arg-type]


# -- 5. what the group's threads learn between two polls ----------------------------------------


def test_a_poll_that_learns_its_partitions_are_lost_hands_out_none_of_their_records(
    env: Any,
) -> None:
    """The auto-commit inside poll() is refused (UNKNOWN_MEMBER_ID: the member was removed, as
    a session expiry would): that same poll() hands out none of the buffered records of the lost
    partition, which its new owner reads from the committed offset too."""
    _fill(env, 1, 20)
    la = Recorder()
    a = env.consumer(la, heartbeat_interval_ms=10_000, session_timeout_ms=30_000,
                     auto_commit_interval_ms=1, max_poll_records=5)
    first = poll_until(a, lambda g: len(g) >= 2, max_records=2)
    assert [r.offset for r in first] == [0, 1]  # and more of t-0 are buffered
    gen = a.generation
    assert gen is not None
    env.coord.leave_group("g", [MemberIdentity(gen.member_id)])
    b = env.consumer()
    assert len(_consume_all(b, 20)) == 20  # b owns t-0 now, from the start
    assert a.poll(timeout=0.2, max_records=2) == []
    assert gen.lost and la.kinds()[-2:] == ["assigned", "lost"]


def _two_cooperative_consumers(env: Any) -> tuple[Consumer, Consumer, threading.Event, Any]:
    """a reads every record of t (2 partitions) alone, then stops polling while b joins and the
    group's threads rebalance cooperatively without it: a still holds the generation that
    ended, the group is Stable in the next one, which a's member is in."""
    _fill(env, 2, 10)
    coop: dict[str, Any] = {"assignors": ["cooperative-sticky"],
                            "auto_commit_interval_ms": 100_000,
                            "rebalance_timeout_ms": 30_000}
    a = env.consumer(**coop)
    assert len(_consume_all(a, 20)) == 20
    held = a.generation
    b = env.consumer(**coop)
    stop = threading.Event()

    def b_polls() -> None:
        while not stop.is_set():
            b.poll(timeout=0.05)

    runner = threading.Thread(target=b_polls, daemon=True)
    runner.start()
    group = a.group
    assert held is not None
    wait_until(lambda: held.done.is_set() and group.peek() is not None)
    assert a.generation is held
    return a, b, stop, runner


def test_close_between_a_cooperative_rebalance_and_the_next_poll_commits_everything(
    env: Any,
) -> None:
    """close() commits under the generation the member is in now: before, it committed under
    the ended one, was refused (ILLEGAL_GENERATION, logged) and the next owner read again what
    this consumer had processed."""
    a, _b, stop, runner = _two_cooperative_consumers(env)
    try:
        a.close()
        assert {tp: o.offset for tp, o in env.coord.fetch_offsets("g").offsets.items()} == {
            TP("t", 0): 10, TP("t", 1): 10}
    finally:
        stop.set()
        runner.join()


def test_close_after_a_next_generation_ended_untaken_commits_under_it(env: Any) -> None:
    """A reviewer's repro: the member joined generation 2 in the background, and it ended
    before poll() took it (another member joined: the group prepares generation 3, waiting for
    a member that has not rejoined). close() committed under generation 1, held, and was
    refused (ILLEGAL_GENERATION, logged): the next owner read again what had been processed.
    Kafka's consumer commits under the newest generation it joined, which the group, preparing
    the next one, still accepts."""
    from rcoord.protocol.consumer import PROTOCOL_TYPE, ConsumerProtocolSubscription

    _fill(env, 2, 10)
    a = env.consumer(assignors=["cooperative-sticky"], auto_commit_interval_ms=100_000,
                     rebalance_timeout_ms=30_000)
    assert len(_consume_all(a, 20)) == 20
    held, group = a.generation, a.group
    assert held is not None
    meta = ConsumerProtocolSubscription(["t"]).encode()
    joined: dict[str, Any] = {}

    def raw_join(name: str) -> None:
        joined[name] = env.coord.join_group(
            "g", "", protocol_type=PROTOCOL_TYPE, protocols=[("cooperative-sticky", meta)],
            session_timeout_ms=2_000, rebalance_timeout_ms=2_000, require_known_member_id=False)

    x = threading.Thread(target=raw_join, args=("x",), daemon=True)
    x.start()  # parks until A's group rejoins in the background
    x.join(WAIT_S)
    assert joined["x"].error == Errors.NONE
    ahead = joined["x"].generation_id
    assert env.coord.sync_group("g", ahead, joined["x"].member_id).error == Errors.NONE
    wait_until(lambda: group.peek() is not None)  # generation 2 offered, not taken
    y = threading.Thread(target=raw_join, args=("y",), daemon=True)
    y.start()  # the group prepares generation 3 and waits for X, which never rejoins
    try:
        wait_until(lambda: group.peek() is None)  # generation 2 ended untaken
        assert a.generation is held
        assert env.coord.describe_group("g").state == "PreparingRebalance"
        a.close()
        assert {tp: o.offset for tp, o in env.coord.fetch_offsets("g").offsets.items()} == {
            TP("t", 0): 10, TP("t", 1): 10}
    finally:
        y.join(WAIT_S)  # (X's rebalance timeout ends the round)
    assert joined["y"].error == Errors.NONE


class _JoinsAndLeaves(RedisCoordinator):
    """Records each JoinGroup and LeaveGroup; ``before_join`` runs before each JoinGroup."""

    def __init__(self, *args: Any, before_join: Any) -> None:
        super().__init__(*args)
        self.calls: list[str] = []
        self.before_join = before_join
        self.left = threading.Event()

    def join_group(self, *args: Any, **kw: Any) -> Any:
        self.calls.append("join")
        self.before_join(len(self.calls))
        return super().join_group(*args, **kw)

    def leave_group(self, *args: Any, **kw: Any) -> Any:
        self.calls.append("leave")
        try:
            return super().leave_group(*args, **kw)
        finally:
            self.left.set()  # (answered)


def _joined_members(env: Any) -> set[str]:
    return {m.member_id for m in env.coord.describe_group("g").members}


def test_close_during_a_join_retry_pause_sends_no_join_after_its_leave(env: Any) -> None:
    """A reviewer's repro: close() ended the pause before a JoinGroup's retry, and the retry
    still went out, after close()'s LeaveGroup: it added the member again, which held
    partitions in the group, never synced, until its session ended. Now the pause's end is the
    end of the retries; and a member that joins after close()'s LeaveGroup anyway (the next
    test) is left again."""
    def first_fails(n: int) -> None:
        if n == 1:
            raise ConnectionLost("connection reset")

    env.topics.create("t", 2)
    coordinator = _JoinsAndLeaves(env.client, env.namespace, before_join=first_fails).start()
    a = env.consumer(coordinator=coordinator, retry_backoff_ms=2_000, retry_backoff_max_ms=2_000,
                     session_timeout_ms=30_000)
    a.poll(timeout=0)  # starts joining: the first JoinGroup fails, its retry waits 2-4 s
    wait_until(lambda: coordinator.calls == ["join"])
    a.close()
    assert "join" not in coordinator.calls[1:]  # (the old code: join, leave, join)
    assert _joined_members(env) == set()


def test_a_join_that_reaches_the_group_after_close_left_it_is_left_again(env: Any) -> None:
    """A JoinGroup sent as close() began, and processed after close()'s LeaveGroup, added the
    member after it had left; the run thread did not leave again (it had left once), so the
    member stayed in the group until its session ended."""
    env.topics.create("t", 2)
    coordinator: _JoinsAndLeaves

    def after_the_leave(n: int) -> None:
        assert coordinator.left.wait(WAIT_S)

    coordinator = _JoinsAndLeaves(env.client, env.namespace, before_join=after_the_leave).start()
    a = env.consumer(coordinator=coordinator, session_timeout_ms=30_000)
    a.poll(timeout=0)  # starts joining; the JoinGroup waits for close()'s LeaveGroup
    wait_until(lambda: coordinator.calls == ["join"])
    a.close()
    assert coordinator.calls[:2] == ["join", "leave"]
    assert _joined_members(env) == set()  # (the old code: the member stayed)


def test_commit_between_a_cooperative_rebalance_and_the_next_poll_succeeds(env: Any) -> None:
    """commit() of partitions the member still owns succeeds in that window; it raised
    CommitFailedError (ILLEGAL_GENERATION), as if the partitions were gone."""
    a, _b, stop, runner = _two_cooperative_consumers(env)
    try:
        a.commit()
        assert {tp: o.offset for tp, o in env.coord.fetch_offsets("g").offsets.items()} == {
            TP("t", 0): 10, TP("t", 1): 10}
        wait_until(lambda: len(a.assignment()) == 1, lambda: a.poll(timeout=0.05))
    finally:
        stop.set()
        runner.join()


def test_a_commit_while_the_group_completes_a_rebalance_raises_rebalance_in_progress(
    env: Any,
) -> None:
    """Between JoinGroup and SyncGroup Kafka's commitSync raises RebalanceInProgressException
    (nothing is lost: poll() completes the rebalance, then the commit can be made again), and
    CommitFailedException only when the partitions are gone. Both windows raised
    CommitFailedError: a's first join (it holds no generation yet), and a cooperative rejoin
    (it committed under the generation it carries, which the coordinator, completing the
    next one, refused: ILLEGAL_GENERATION). A raw member X leads the group and holds it in
    CompletingRebalance by not syncing."""
    from rcoord.protocol.consumer import (
        PROTOCOL_TYPE,
        ConsumerProtocolAssignment,
        ConsumerProtocolSubscription,
    )

    _fill(env, 2, 10)
    coop = "cooperative-sticky"
    meta = ConsumerProtocolSubscription(["t"]).encode()

    def x_joins(member_id: str) -> Any:
        return env.coord.join_group(
            "g", member_id, protocol_type=PROTOCOL_TYPE, protocols=[(coop, meta)],
            session_timeout_ms=30_000, rebalance_timeout_ms=30_000,
            require_known_member_id=False)

    def x_syncs(joined: Any) -> None:
        everything = ConsumerProtocolAssignment([TP("t", 0), TP("t", 1)]).encode()
        plan = {m.member_id: everything if m.member_id != x else
                ConsumerProtocolAssignment([]).encode() for m in joined.members}
        assert env.coord.sync_group("g", joined.generation_id, x, assignments=plan,
                                    protocol_type=PROTOCOL_TYPE,
                                    protocol_name=coop).error == Errors.NONE

    first = x_joins("")
    x = first.member_id
    x_syncs(first)
    a = env.consumer(assignors=[coop], enable_auto_commit=False, rebalance_timeout_ms=30_000)

    def state() -> str:
        return str(env.coord.describe_group("g").state)

    rejoin: list[Any] = []
    rejoining = threading.Thread(target=lambda: rejoin.append(x_joins(x)), daemon=True)

    a.poll(timeout=0)  # a's JoinGroup: the group waits for X to rejoin
    wait_until(lambda: state() == "PreparingRebalance")
    rejoining.start()
    rejoining.join(WAIT_S)
    assert state() == "CompletingRebalance" and a.generation is None
    with pytest.raises(RebalanceInProgressError, match="Call poll"):
        a.commit({TP("t", 0): 1})
    x_syncs(rejoin.pop())
    assert len(_consume_all(a, 20)) == 20
    carried = a.generation
    assert carried is not None

    rejoining = threading.Thread(target=lambda: rejoin.append(x_joins(x)), daemon=True)
    rejoining.start()  # X (the leader) rejoins: a's generation ends, carried into a's rejoin
    rejoining.join(WAIT_S)
    assert state() == "CompletingRebalance"
    assert a.generation is carried and carried.carried and not carried.lost
    with pytest.raises(RebalanceInProgressError, match="ILLEGAL_GENERATION") as info:
        a.commit()
    assert not isinstance(info.value, CommitFailedError)
    assert not carried.lost
    x_syncs(rejoin.pop())
    wait_until(lambda: a.generation is not carried, lambda: a.poll(timeout=0.02))
    a.commit()  # the retry Kafka's exception asks for: the partitions were never lost
    assert {tp: o.offset for tp, o in env.coord.fetch_offsets("g").offsets.items()} == {
        TP("t", 0): 10, TP("t", 1): 10}


def test_a_static_member_that_stops_polling_lets_its_session_end(env: Any) -> None:
    """max_poll_interval_ms passes: a static member sends no LeaveGroup, and stops heartbeating
    (as Kafka's heartbeat thread does once the generation is reset), so its partitions move
    after its session timeout. Before, it kept beating until the consumer's hold gave up, a
    rebalance timeout later (here a minute, past the wait)."""
    _fill(env, 2, 2)
    a = env.consumer(group_instance_id="static-a", session_timeout_ms=1000,
                     rebalance_timeout_ms=60_000, max_poll_interval_ms=300)
    b = env.consumer()

    def both() -> None:
        a.poll(timeout=0.02)
        b.poll(timeout=0.02)

    wait_until(lambda: len(a.assignment()) == 1 and len(b.assignment()) == 1, both)
    # a's application stops polling; b gets both partitions once a's session has ended.
    wait_until(lambda: len(b.assignment()) == 2, lambda: b.poll(timeout=0.05))
    assert [m.group_instance_id for m in env.coord.describe_group("g").members] == [None]


def test_a_static_member_past_its_poll_interval_cannot_commit(env: Any) -> None:
    """Kafka fails the commit at once once the poll timeout has reset the generation. A static
    member sends no LeaveGroup, so the coordinator still knows it until its session ends, and
    took the commit of partitions the member had given up (the next poll() then reported them
    lost)."""
    _fill(env, 1, 1)
    a = env.consumer(group_instance_id="static-a", session_timeout_ms=6000,
                     rebalance_timeout_ms=60_000, max_poll_interval_ms=300,
                     enable_auto_commit=False)
    wait_until(lambda: len(a.assignment()) == 1, lambda: a.poll(timeout=0.02))
    gen = a.generation
    assert gen is not None
    wait_until(lambda: gen.lost)  # a's application stopped polling
    assert [m.group_instance_id for m in env.coord.describe_group("g").members] == ["static-a"]
    with pytest.raises(CommitFailedError, match="this member left the group"):
        a.commit({TP("t", 0): 1})
    assert env.coord.fetch_offsets("g", [TP("t", 0)]).offsets[TP("t", 0)].offset == -1


@pytest.mark.parametrize(("option", "message"), [
    ({"enable_auto_commit": "false"}, "enable_auto_commit must be True or False, got 'false'"),
    ({"listener": print}, "listener must be a ConsumerRebalanceListener"),
    ({"listener": object()}, "listener must be a ConsumerRebalanceListener"),
    ({"max_poll_records": 0}, "max_poll_records must be an int >= 1, got 0"),
])
def test_bad_consumer_options_are_config_errors(env: Any, option: dict[str, Any],
                                                message: str) -> None:
    # bool("false") is True: auto-commit came on, committing what was never processed; a
    # listener that is a function was never called.
    with pytest.raises(ConfigError, match=message):
        env.consumer(**option)


def test_subscribe_refuses_a_listener_that_would_never_be_called(env: Any) -> None:
    """subscribe()'s listener is checked as the constructor's is: a function (or an object
    without a listener method) raises ConfigError and the consumer keeps its listener and
    subscription. Before, it was taken, and its revocations, commits included, never ran."""
    listener = Recorder()
    consumer = env.consumer(listener, topics=[])
    with pytest.raises(ConfigError, match="listener must be a ConsumerRebalanceListener"):
        consumer.subscribe(["t"], listener=lambda partitions: None)
    assert consumer.subscription() == []
    _fill(env, 1, 1)
    consumer.subscribe(["t"])
    wait_until(lambda: listener.kinds()[-1:] == ["assigned"], lambda: consumer.poll(0.02))


def test_a_second_thread_is_refused_while_one_is_inside_a_call(env: Any) -> None:
    """Kafka's ConcurrentModificationException: while one thread is inside poll(), another's
    poll(), commit() or seek() raises at once, instead of waiting its turn (two threads
    polling were each handed records, and each auto-commit committed past what the other had
    not processed). wakeup() and close() may come from another thread."""
    _fill(env, 1, 3)
    consumer = env.consumer()
    assert len(_consume_all(consumer, 3)) == 3
    stop = threading.Event()

    def polls() -> None:
        while not stop.is_set():
            with contextlib.suppress(WakeupError):
                consumer.poll(timeout=5)

    runner = threading.Thread(target=polls, daemon=True)
    runner.start()

    def refused(call: Any) -> bool:
        try:
            call()
        except ConcurrentModificationError as exc:
            assert "not safe for multi-threaded access" in str(exc)
            return True
        return False

    try:
        wait_until(lambda: refused(consumer.commit))
        for call in (lambda: consumer.poll(timeout=0), lambda: consumer.seek(TP("t", 0), 0),
                     lambda: consumer.pause([TP("t", 0)]), consumer.unsubscribe):
            assert refused(call)
        assert isinstance(ConcurrentModificationError("x"), IllegalStateError)
    finally:
        stop.set()
        consumer.wakeup()
        runner.join(WAIT_S)
    assert not runner.is_alive()
    consumer.commit()  # the one thread left is welcome
    assert consumer.assignment() == [TP("t", 0)]


class _FailingRevocation(Recorder):
    """Records every callback; ``on_partitions_revoked`` then raises ``error``, or, with
    ``unsubscribe``, unsubscribes the consumer from inside the callback."""

    def __init__(self, error: Exception | None = None) -> None:
        super().__init__()
        self.error = error
        self.unsubscribe: Consumer | None = None

    def on_partitions_revoked(self, partitions: list[TopicPartition]) -> None:
        super().on_partitions_revoked(partitions)
        if self.unsubscribe is not None:
            self.unsubscribe.unsubscribe()
        if self.error is not None:
            raise self.error


def test_close_raises_what_the_listener_raised_once_it_is_closed(env: Any) -> None:
    """A reviewer's finding: an on_partitions_revoked that raised in close() was only logged,
    so a failed flush went unnoticed. As Kafka's close() ("User rebalance callback throws an
    error"), the close completes (the member leaves, the consumer is closed) and then raises
    it."""
    _fill(env, 1, 3)
    listener = _FailingRevocation(RuntimeError("flush failed"))
    a = env.consumer(listener)
    assert len(_consume_all(a, 3)) == 3
    with pytest.raises(RuntimeError, match="flush failed"):
        a.close()
    assert listener.events[-1] == ("revoked", [TP("t", 0)])
    assert env.coord.describe_group("g").members == []
    with pytest.raises(IllegalStateError):
        a.poll(timeout=0)
    a.close()  # (closed already: nothing to raise again)


def test_a_with_block_that_raised_keeps_its_error_over_the_listeners(env: Any) -> None:
    _fill(env, 1, 3)
    a = env.consumer(_FailingRevocation(RuntimeError("flush failed")))
    with pytest.raises(KeyError, match="the block's"), a:
        assert len(_consume_all(a, 3)) == 3
        raise KeyError("the block's")
    assert env.coord.describe_group("g").members == []


def test_close_with_no_partition_assigned_calls_no_listener(env: Any) -> None:
    """A reviewer's finding: a member assigned nothing was called on_partitions_revoked([]) by
    close(); Kafka's onLeavePrepare calls the listener only with partitions to drop."""
    _fill(env, 1, 1)
    listeners = [_FailingRevocation(), _FailingRevocation()]
    consumers = [env.consumer(listener) for listener in listeners]

    def one_idle() -> bool:
        for c in consumers:
            c.poll(timeout=0.02)
        return sorted(len(c.assignment()) for c in consumers) == [0, 1] and all(
            listener.events and listener.events[-1][0] == "assigned" for listener in listeners)

    wait_until(one_idle)
    idle = next(i for i, c in enumerate(consumers) if not c.assignment())
    before = list(listeners[idle].events)
    consumers[idle].close()
    assert listeners[idle].events == before  # (the old code: revoked [] added)


def test_unsubscribe_from_the_revocation_listener_does_not_revoke_again(env: Any) -> None:
    """unsubscribe() inside on_partitions_revoked started a second revocation of the same
    partitions, calling the listener again, nested (without end when the call is
    unconditional); close() already checked for a revocation in progress."""
    _fill(env, 1, 1)
    listener = _FailingRevocation()
    a = env.consumer(listener)
    assert len(_consume_all(a, 1)) == 1
    listener.unsubscribe = a
    a.unsubscribe()
    assert [e for e in listener.events if e[0] == "revoked"] == [("revoked", [TP("t", 0)])]
    assert a.subscription() == []
    a.close()
