"""A commit in ``on_partitions_assigned`` sets where reading starts, as in Kafka.

Kafka's consumer runs the listener in ``onJoinComplete``, before the partitions have a
position; its ``updateFetchPositions`` then fetches the committed offsets of the partitions
without one (``initWithCommittedOffsetsIfNeeded``), so an offset the listener committed is
where they start, unless the listener gave them a position itself (``seek``, ``position``).
Here the positions came from the committed offsets read before the listener ran, and the
next commit wrote them back, silently undoing the listener's commit.
"""

from __future__ import annotations

from typing import Any

import pytest
from harness import WAIT_S, wait_until
from test_consumer import env, poll_until  # noqa: F401 - env: the fixture

from rcoord import TopicPartition
from rcoord.client import Consumer, ConsumerRebalanceListener, ConsumerRecord

TP0 = TopicPartition("t", 0)


class _Committing(ConsumerRebalanceListener):
    """``on_partitions_assigned`` runs ``steps`` (``(call, offset)``) on t-0 the first time."""

    def __init__(self, *steps: tuple[str, int]) -> None:
        self.steps = list(steps)
        self.consumer: Consumer | None = None
        self.positions: list[int] = []  # what each "position" step read

    def on_partitions_assigned(self, partitions: list[TopicPartition]) -> None:
        c, steps, self.steps = self.consumer, self.steps, []
        assert c is not None
        for call, offset in steps:
            if call == "commit":
                c.commit({TP0: offset})
            elif call == "commit_async":
                c.commit_async({TP0: offset})
            elif call == "seek":
                c.seek(TP0, offset)
            else:
                self.positions.append(c.position(TP0))


def _run(env: Any, *steps: tuple[str, int], committed: bool = True,  # noqa: F811
         **kw: Any) -> tuple[Consumer, _Committing, list[ConsumerRecord]]:
    env.topics.create("t", 1)
    env.producer.send_batch("t", [b"%d" % i for i in range(10)])
    if committed:
        env.coord.commit_offsets("g", {TP0: 2})
    listener = _Committing(*steps)
    consumer: Consumer = env.consumer(listener, **kw)
    listener.consumer = consumer
    got = poll_until(consumer, lambda g: bool(g) and g[-1].offset == 9)
    return consumer, listener, got


@pytest.mark.parametrize("how", ["commit", "commit_async"])
def test_a_commit_in_on_partitions_assigned_sets_the_start(
        env: Any, how: str) -> None:  # noqa: F811 - the fixture
    """Reading started at 2 (the offset committed before the rebalance), records 2 to 5
    came again. Now it starts at 6; an async commit too, as it lands before the first fetch
    (which waits for the commits the listener queued, as Kafka's fetch of the committed
    offsets is answered after them)."""
    _, _, got = _run(env, (how, 6), enable_auto_commit=False)
    assert [r.offset for r in got] == [6, 7, 8, 9]


def test_position_after_a_commit_in_the_listener_reads_it(
        env: Any) -> None:  # noqa: F811 - the fixture
    """As Kafka's position(), which fetches the committed offset of a partition that has no
    position: it gives the partition one, so a later commit does not move it."""
    _, listener, got = _run(env, ("commit", 6), ("position", 0), ("commit", 8),
                            enable_auto_commit=False)
    assert listener.positions == [6]
    assert [r.offset for r in got] == [6, 7, 8, 9]


def test_a_commit_in_on_partitions_assigned_is_not_undone_by_the_next_commit(
        env: Any) -> None:  # noqa: F811 - the fixture
    """The consumer's own next commit (of its positions) sent the old start, 2 (or 3 past a
    record), undoing the listener's commit of 6; now it commits from 6 on."""
    env.topics.create("t", 1)
    env.producer.send_batch("t", [b"%d" % i for i in range(10)])
    env.coord.commit_offsets("g", {TP0: 2})
    listener = _Committing(("commit", 6))
    consumer: Consumer = env.consumer(listener, enable_auto_commit=False, max_poll_records=1)
    listener.consumer = consumer
    wait_until(lambda: consumer.generation is not None,
               lambda: consumer.poll(timeout=0, max_records=1) and None)
    consumer.commit()
    assert consumer.committed([TP0])[TP0] in (6, 7)


@pytest.mark.parametrize("steps", [
    (("seek", 4), ("commit", 6)),  # the seek gave it a position: the commit does not move it
    (("commit", 6), ("seek", 4)),  # the seek comes later: it wins
    (("position", 0), ("commit", 6)),  # position() gave it one already, as Kafka's does
])
def test_a_position_the_listener_set_wins_over_its_commit(
        env: Any, steps: tuple[tuple[str, int], ...]) -> None:  # noqa: F811 - the fixture
    _, _, got = _run(env, *steps, enable_auto_commit=False)
    start = 4 if steps[0][0] == "seek" or steps[1][0] == "seek" else 2
    assert [r.offset for r in got] == list(range(start, 10))


def test_two_commits_in_the_listener_the_last_one_sets_the_start(
        env: Any) -> None:  # noqa: F811 - the fixture
    _, _, got = _run(env, ("commit", 6), ("commit_async", 3), ("commit", 8),
                     enable_auto_commit=False)
    assert [r.offset for r in got] == [8, 9]


def test_an_async_commit_after_a_sync_one_in_the_listener_sets_the_start(
        env: Any) -> None:  # noqa: F811 - the fixture
    _, _, got = _run(env, ("commit", 6), ("commit_async", 3), enable_auto_commit=False)
    assert [r.offset for r in got] == [3, 4, 5, 6, 7, 8, 9]


def test_a_commit_after_the_first_fetch_does_not_move_the_position(
        env: Any) -> None:  # noqa: F811 - the fixture
    """Outside the listener, once reading started, a commit is only a commit (as Kafka's)."""
    env.topics.create("t", 1)
    env.producer.send_batch("t", [b"%d" % i for i in range(10)])
    consumer: Consumer = env.consumer(enable_auto_commit=False, max_poll_records=3)
    got = poll_until(consumer, bool)
    assert got[0].offset == 0
    consumer.commit({TP0: 8}, timeout=WAIT_S)
    assert consumer.position(TP0) == got[-1].offset + 1


def test_a_commit_in_the_listener_gives_a_start_where_start_offset_none_had_none(
        env: Any) -> None:  # noqa: F811 - the fixture
    """With nothing committed and ``start_offset="none"``, poll() raised
    NoOffsetForPartitionError though the listener had committed where to start."""
    _, _, got = _run(env, ("commit", 6), committed=False, start_offset="none",
                     enable_auto_commit=False)
    assert [r.offset for r in got] == [6, 7, 8, 9]


def test_a_commit_after_assign_before_the_first_poll_sets_the_start(
        env: Any) -> None:  # noqa: F811 - the fixture
    """Kafka's ``assign()`` gives the partitions no position; the first ``poll()`` fetches
    their committed offsets, so a commit made in between is where they start. Here the
    committed offset was read by ``assign()``: reading started at 2, and the next commit of
    the positions wrote 2 back over the application's 6."""
    env.topics.create("t", 2)
    env.producer.send_batch("t", [b"%d" % i for i in range(20)])  # 10 a partition
    env.coord.commit_offsets("g", {TP0: 2})
    tp1 = TopicPartition("t", 1)
    consumer: Consumer = env.consumer(topics=[], enable_auto_commit=False)
    consumer.assign([TP0, tp1])
    consumer.commit({TP0: 6}, timeout=WAIT_S)
    consumer.seek(tp1, 7)
    consumer.commit({tp1: 1}, timeout=WAIT_S)  # (the seek gave it a position: it wins)
    got = poll_until(consumer, lambda g: len(g) >= 7)
    assert sorted((r.partition, r.offset) for r in got) == (
        [(0, o) for o in range(6, 10)] + [(1, o) for o in range(7, 10)])
