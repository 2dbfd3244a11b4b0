"""A commit of the positions leaves out the partitions still unstarted, as Kafka's.

Kafka's consumer commits ``allConsumed()``: the partitions with a valid position. One it was
just assigned (``assign()``, or a generation before the poll that ran the listener fetched
its committed offset) has none, so ``close()``, ``commitSync()`` or an auto-commit before that
poll commits nothing of it; after the poll reset it by the policy, it commits that position.
Here the start-offset policy's edge (read when the partition was assigned) was committed as
the group's offset, and the old committed offset was written back over a listener's commit.
"""

from __future__ import annotations

from typing import Any

from harness import WAIT_S
from test_consumer import env, poll_until  # noqa: F401 - env: the fixture

from rcoord import TopicPartition
from rcoord.client import Consumer, ConsumerRebalanceListener

TP0 = TopicPartition("t", 0)


def _committed(env: Any, tp: TopicPartition) -> int:  # noqa: F811 - the fixture
    """The group's committed offset of ``tp`` (-1: none)."""
    got = env.coord.fetch_offsets("g", [tp]).offsets.get(tp)
    return -1 if got is None else int(got.offset)


def test_close_after_assign_before_any_poll_commits_nothing(
        env: Any) -> None:  # noqa: F811 - the fixture
    """With ``start_offset="latest"``, close() committed the log end read by assign(): a
    later consumer of the group under "earliest" started there, and the ten records no one
    had read were skipped. Kafka's close() commits nothing of a partition without a
    position."""
    env.topics.create("t", 1)
    env.producer.send_batch("t", [b"%d" % i for i in range(10)])
    consumer: Consumer = env.consumer(topics=[], start_offset="latest")
    consumer.assign([TP0])
    consumer.close(timeout=WAIT_S)
    assert _committed(env, TP0) == -1
    after: Consumer = env.consumer(topics=[], start_offset="earliest")
    after.assign([TP0])
    got = poll_until(after, lambda g: len(g) >= 10)
    assert [r.offset for r in got] == list(range(10))


def test_commit_after_assign_before_any_poll_commits_nothing_of_it(
        env: Any) -> None:  # noqa: F811 - the fixture
    """commit() of the positions: only the partitions with one (a seek gave t-1 one)."""
    env.topics.create("t", 2)
    env.producer.send_batch("t", [b"%d" % i for i in range(20)])
    tp1 = TopicPartition("t", 1)
    consumer: Consumer = env.consumer(topics=[], start_offset="latest",
                                      enable_auto_commit=False)
    consumer.assign([TP0, tp1])
    consumer.seek(tp1, 3)
    consumer.commit(timeout=WAIT_S)
    assert (_committed(env, TP0), _committed(env, tp1)) == (-1, 3)


def test_close_after_a_poll_commits_the_policy_position(
        env: Any) -> None:  # noqa: F811 - the fixture
    """Once a poll() gave the partition its position (the policy's), it is committed, as in
    Kafka (whose poll resets it, and allConsumed() then holds it)."""
    env.topics.create("t", 1)
    env.producer.send_batch("t", [b"%d" % i for i in range(10)])
    consumer: Consumer = env.consumer(topics=[], start_offset="latest")
    consumer.assign([TP0])
    assert consumer.poll(timeout=0.05) == []
    consumer.close(timeout=WAIT_S)
    assert _committed(env, TP0) == 10


class _AsyncThenAll(ConsumerRebalanceListener):
    """``on_partitions_assigned``: commit_async() of t-0 at 6, then commit_async() of the
    positions, the first time."""

    def __init__(self) -> None:
        self.consumer: Consumer | None = None
        self.done = False

    def on_partitions_assigned(self, partitions: list[TopicPartition]) -> None:
        c = self.consumer
        assert c is not None
        if not self.done:
            self.done = True
            c.commit_async({TP0: 6})
            c.commit_async()


def test_a_commit_of_the_positions_in_the_listener_keeps_its_async_commit(
        env: Any) -> None:  # noqa: F811 - the fixture
    """The listener's commit_async() of the positions sent t-0's old committed offset (2)
    behind its commit_async() of 6: the group's offset went back to 2 while reading started
    at 6, so a restart read records 2 to 5 again. Kafka's commitAsync() there sends nothing
    of t-0, which has no position yet."""
    env.topics.create("t", 1)
    env.producer.send_batch("t", [b"%d" % i for i in range(10)])
    env.coord.commit_offsets("g", {TP0: 2})
    listener = _AsyncThenAll()
    consumer: Consumer = env.consumer(listener, enable_auto_commit=False)
    listener.consumer = consumer
    got = poll_until(consumer, lambda g: bool(g) and g[-1].offset == 9)
    assert [r.offset for r in got] == [6, 7, 8, 9]
    assert _committed(env, TP0) == 6
