"""The iterator's batch after ``assign()`` gave a partition up and assigned it again.

Kafka's ``assign()`` forgets a partition's position when it gives the partition up; assigned
again, the partition starts at its committed offset at the next poll(), and the records
fetched for it before are dropped. Here the ``for record in consumer`` loop went on handing
out the rest of the batch of that partition (its seek count, forgotten with it, matched
again), and set its position past them while its fetch started at the committed offset:
the next poll() handed the same records out again.
"""

from __future__ import annotations

from typing import Any

import pytest
from test_consumer import env, poll_until  # noqa: F401 - env: the fixture

from rcoord import TopicPartition
from rcoord.client import Consumer

TP0 = TopicPartition("t", 0)
U0 = TopicPartition("u", 0)


def _t0_committed_at_3(environment: Any, enable_auto_commit: bool = False) -> Consumer:
    """A consumer assigned t-0 (records 0 to 9) at its committed offset 3, so that the loop
    is in a batch when t-0, given up for u-0 and assigned again, starts there anew."""
    environment.topics.create("t", 1)
    environment.topics.create("u", 1)
    environment.producer.send_batch("t", [b"%d" % i for i in range(10)])
    consumer: Consumer = environment.consumer(topics=[], enable_auto_commit=enable_auto_commit)
    consumer.assign([TP0])
    consumer.commit({TP0: 3})
    return consumer


@pytest.mark.parametrize("started", [False, True])
def test_loop_body_reassigning_a_partition_drops_the_rest_of_its_batch(
        env: Any, started: bool) -> None:  # noqa: F811 - the fixture
    """Started: the loop body also asks t-0's position() (3, its committed offset), which
    starts it now. The loop went on handing out the rest of the old batch (4 to 9), its
    position moved past them while its fetch started at 3, so the next poll() handed 3 to 9
    out again."""
    consumer = _t0_committed_at_3(env)
    got: list[int] = []
    for record in consumer:
        got.append(record.offset)
        if len(got) == 1:
            consumer.assign([U0])
            consumer.assign([TP0])  # again: it starts at its committed offset, 3
            if started:
                assert consumer.position(TP0) == 3
        if len(got) == 8:
            break
    # (before: [3, 4, 5, 6, 7, 8, 9, 3], then 4 to 9 again)
    assert got == [3, 3, 4, 5, 6, 7, 8, 9]


def test_loop_left_after_reassigning_a_partition_keeps_its_committed_start(
        env: Any) -> None:  # noqa: F811 - the fixture
    """The loop body commits 5, gives t-0 up and assigns it again (it starts at 5), and
    raises: leaving the loop sought t-0 back to the record the loop was on (3), the
    previous assignment's, so records 3 and 4 came again."""
    consumer = _t0_committed_at_3(env)
    with pytest.raises(RuntimeError, match="left"):
        for _ in consumer:
            consumer.commit({TP0: 5})
            consumer.assign([U0])
            consumer.assign([TP0])
            raise RuntimeError("left")
    got = poll_until(consumer, lambda g: bool(g) and g[-1].offset == 9)
    assert [r.offset for r in got] == [5, 6, 7, 8, 9]
