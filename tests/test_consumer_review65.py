"""The iterator and a partition given up and assigned again, and ``close()``'s bound over a
pending start.

Kafka's ``assign()`` forgets a partition's position when it gives the partition up: assigned
again, the partition starts at its committed offset, and ``position()`` reads it now.
"""

from __future__ import annotations

from typing import Any

from test_consumer import env, poll_until  # noqa: F401 - env: the fixture

from rcoord import TopicPartition
from rcoord.client import Consumer

TP0 = TopicPartition("t", 0)
U0 = TopicPartition("u", 0)


def test_loop_left_after_position_of_a_reassigned_partition_keeps_its_start(
        env: Any) -> None:  # noqa: F811 - the fixture
    """The loop body commits 5, gives t-0 up and assigns it again, asks its position() (5:
    it is started now) and breaks: leaving the loop sought t-0 back to the record the loop
    was on (3), the previous assignment's (its seek count, forgotten with it, matched the
    batch's again), so records 3 and 4 came again."""
    env.topics.create("t", 1)
    env.topics.create("u", 1)
    env.producer.send_batch("t", [b"%d" % i for i in range(10)])
    consumer: Consumer = env.consumer(topics=[], enable_auto_commit=False)
    consumer.assign([TP0])
    consumer.commit({TP0: 3})
    for _ in consumer:
        consumer.commit({TP0: 5})
        consumer.assign([U0])
        consumer.assign([TP0])
        assert consumer.position(TP0) == 5
        break
    assert consumer.position(TP0) == 5
    got = poll_until(consumer, lambda g: bool(g) and g[-1].offset == 9)
    assert [r.offset for r in got] == [5, 6, 7, 8, 9]


def test_loop_body_reassigning_and_starting_a_partition_drops_the_rest_of_its_batch(
        env: Any) -> None:  # noqa: F811 - the fixture
    """The loop body gives t-0 up, assigns it again and asks its position() (3, its
    committed offset): the loop went on handing out the rest of the old batch (4 to 9), its
    position moved past them while its fetch started at 3, so the next poll() handed 3 to 9
    out again."""
    env.topics.create("t", 1)
    env.topics.create("u", 1)
    env.producer.send_batch("t", [b"%d" % i for i in range(10)])
    consumer: Consumer = env.consumer(topics=[], enable_auto_commit=False)
    consumer.assign([TP0])
    consumer.commit({TP0: 3})
    got: list[int] = []
    for record in consumer:
        got.append(record.offset)
        if len(got) == 1:
            consumer.assign([U0])
            consumer.assign([TP0])
            assert consumer.position(TP0) == 3
        if len(got) == 8:
            break
    assert got == [3, 3, 4, 5, 6, 7, 8, 9]
