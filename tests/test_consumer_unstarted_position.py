"""``position()`` of an unstarted partition reads an async commit made of it before, as Kafka.

Kafka's ``position()`` of a partition without a position fetches its committed offset, and
the coordinator answers that fetch after the commits sent before it: a ``commitAsync()`` in
``on_partitions_assigned`` (or after ``assign()``) followed by ``position()`` gives the
committed offset. Here ``position()`` returned the start read before the listener ran and
kept it (the partition was started), so reading began there, and the next commit of the
positions undid the application's commit.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from harness import WAIT_S, wait_until
from test_consumer import env, poll_until  # noqa: F401 - env: the fixture

from rcoord import TopicPartition
from rcoord.client import Consumer, ConsumerRebalanceListener
from rcoord.client.coordinator import RedisCoordinator

TP0 = TopicPartition("t", 0)


class _AsyncThenPosition(ConsumerRebalanceListener):
    """``on_partitions_assigned``, the first time: commit_async() of t-0 at 6, then
    position() of t-0."""

    def __init__(self) -> None:
        self.consumer: Consumer | None = None
        self.positions: list[int] = []

    def on_partitions_assigned(self, partitions: list[TopicPartition]) -> None:
        c = self.consumer
        assert c is not None
        if not self.positions:
            c.commit_async({TP0: 6})
            self.positions.append(c.position(TP0))


@pytest.mark.parametrize("start_offset", ["earliest", "none"])
def test_position_after_an_async_commit_in_the_listener_reads_it(
        env: Any, start_offset: str) -> None:  # noqa: F811 - the fixture
    """position() said 2 (the offset committed before; under "none" with nothing committed
    it raised NoOffsetForPartitionError), and records 2 to 5 were read."""
    env.topics.create("t", 1)
    env.producer.send_batch("t", [b"%d" % i for i in range(10)])
    if start_offset == "earliest":
        env.coord.commit_offsets("g", {TP0: 2})
    listener = _AsyncThenPosition()
    consumer: Consumer = env.consumer(listener, enable_auto_commit=False,
                                      start_offset=start_offset)
    listener.consumer = consumer
    got = poll_until(consumer, lambda g: bool(g) and g[-1].offset == 9)
    assert listener.positions == [6]
    assert [r.offset for r in got] == [6, 7, 8, 9]


def test_position_after_assign_and_an_async_commit_reads_it(
        env: Any) -> None:  # noqa: F811 - the fixture
    env.topics.create("t", 1)
    env.producer.send_batch("t", [b"%d" % i for i in range(10)])
    consumer: Consumer = env.consumer(topics=[], enable_auto_commit=False)
    consumer.assign([TP0])
    consumer.commit_async({TP0: 7})
    assert consumer.position(TP0, timeout=WAIT_S) == 7
    got = poll_until(consumer, lambda g: bool(g) and g[-1].offset == 9)
    assert [r.offset for r in got] == [7, 8, 9]


class _HeldCommits(RedisCoordinator):
    """Holds every commit until ``release`` is set."""

    def __init__(self, env: Any) -> None:  # noqa: F811 - the fixture object
        super().__init__(env.client, env.namespace)
        self.release = threading.Event()

    def commit_offsets(self, *args: Any, **kw: Any) -> Any:
        assert self.release.wait(WAIT_S)
        return super().commit_offsets(*args, **kw)


def test_position_while_that_commit_is_held_up_times_out_then_reads_it(
        env: Any) -> None:  # noqa: F811 - the fixture
    """Its ``timeout`` bounds the wait, as Kafka's position(tp, timeout); the partition
    stays unstarted, and once the commit landed position() gives it."""
    env.topics.create("t", 1)
    env.producer.send_batch("t", [b"%d" % i for i in range(10)])
    coord = _HeldCommits(env)
    consumer: Consumer = env.consumer(topics=[], enable_auto_commit=False,
                                      coordinator=coord)
    try:
        consumer.assign([TP0])
        consumer.commit_async({TP0: 7})
        with pytest.raises(TimeoutError, match="still in flight"):
            consumer.position(TP0, timeout=0.05)
    finally:
        coord.release.set()
    assert consumer.position(TP0, timeout=WAIT_S) == 7


class _RevokedReadsPosition(ConsumerRebalanceListener):
    """``on_partitions_assigned``: commit_async() of t-0 at 6 (the first time);
    ``on_partitions_revoked``: position() of t-0 (or the error it raised)."""

    def __init__(self) -> None:
        self.consumer: Consumer | None = None
        self.assigned = 0
        self.revoked: list[object] = []

    def on_partitions_assigned(self, partitions: list[TopicPartition]) -> None:
        assert self.consumer is not None
        self.assigned += 1
        if self.assigned == 1:
            self.consumer.commit_async({TP0: 6})

    def on_partitions_revoked(self, partitions: list[TopicPartition]) -> None:
        assert self.consumer is not None
        try:
            self.revoked.append(self.consumer.position(TP0, timeout=WAIT_S))
        except Exception as exc:  # noqa: BLE001 - what the test looks at
            self.revoked.append(exc)


def test_position_in_close_s_revocation_waits_for_that_commit(
        env: Any) -> None:  # noqa: F811 - the fixture
    """close()'s on_partitions_revoked reading the position of a partition whose start
    commit was still in flight got IllegalStateError ('the consumer is closing') at once;
    it waits for the commit within close()'s bound, as the listener's commits do."""
    env.topics.create("t", 1)
    env.producer.send_batch("t", [b"%d" % i for i in range(10)])
    coord = _HeldCommits(env)
    listener = _RevokedReadsPosition()
    consumer: Consumer = env.consumer(listener, enable_auto_commit=False, coordinator=coord)
    listener.consumer = consumer
    try:
        wait_until(lambda: listener.assigned > 0, lambda: consumer.poll(timeout=0.05) and None)
        assert consumer.poll(timeout=0.05) == []  # (t-0 unstarted: its commit is held)
        waits = consumer._committer.wait_idle

        def released(*args: Any, **kw: Any) -> bool:
            coord.release.set()  # once close()'s listener waits for it
            return waits(*args, **kw)

        consumer._committer.wait_idle = released  # type: ignore[method-assign]
        consumer.close(timeout=WAIT_S)
    finally:
        coord.release.set()
    assert listener.revoked == [6]
