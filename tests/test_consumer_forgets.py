"""A long-running consumer keeps per-partition state only for the partitions it holds: topics
that came and went (a pattern subscription over short-lived topics, an ``assign()`` moved from
topic to topic) leave nothing behind, so its memory follows the live partitions, not the past
ones. Real servers (the ``env`` fixture of test_consumer); every wait is on a condition."""

from __future__ import annotations

import re
from typing import Any

import test_consumer
from harness import wait_until

from rcoord import TopicPartition
from rcoord.client import Consumer

TP = TopicPartition
env = test_consumer.env  # the fixture: a namespace, its topics, a producer, consumers of "g"

TOPICS = 4  # topics made and dropped, one after the other


def _per_partition(consumer: Consumer) -> dict[str, set[TopicPartition]]:
    """The partitions each of the consumer's per-partition tables names."""
    names = ("_seeks", "_record_bytes", "_fetched_turn", "_caught_up", "_position",
             "_fetch_pos", "_buffers", "_committed", "_invalid", "_resets", "_paused")
    return {name: set(getattr(consumer, name)) for name in names}


def _stale(consumer: Consumer) -> dict[str, set[TopicPartition]]:
    held = set(consumer.assignment())
    return {name: tps - held for name, tps in _per_partition(consumer).items() if tps - held}


class _SeekOnAssign:
    """Seeks every partition it is given to its start, as an application that keeps its own
    offsets does in ``on_partitions_assigned``."""

    consumer: Consumer

    def on_partitions_assigned(self, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            self.consumer.seek(tp, 0)


def test_pattern_consumer_forgets_the_partitions_of_deleted_topics(env: Any) -> None:
    listener = _SeekOnAssign()
    consumer = env.consumer(listener, topics=[], topic_pattern=re.compile(r"short-.*"),
                            partition_watch_interval_ms=50)
    listener.consumer = consumer
    for i in range(TOPICS):
        topic = f"short-{i}"
        env.topics.create(topic, 2)
        env.producer.send_batch(topic, [b"a", b"b"])
        got: list[Any] = []
        wait_until(lambda: len([r for r in got if r.topic == topic]) >= 2,  # noqa: B023
                   lambda: got.extend(consumer.poll(timeout=0.02)))  # noqa: B023
        env.topics.delete(topic)
        wait_until(lambda: not any(tp.topic == topic for tp in consumer.assignment()),  # noqa: B023
                   lambda: consumer.poll(timeout=0.02))
        assert _stale(consumer) == {}, f"after topic {i}"


def test_assigned_consumer_forgets_the_partitions_it_was_moved_off(env: Any) -> None:
    consumer = env.consumer(topics=[])
    for i in range(TOPICS):
        topic = f"moving-{i}"
        env.topics.create(topic, 2)
        env.producer.send_batch(topic, [b"a", b"b"])
        consumer.assign([TP(topic, 0), TP(topic, 1)])
        consumer.seek(TP(topic, 0), 0)
        got: list[Any] = []
        wait_until(lambda: len(got) >= 2,  # noqa: B023
                   lambda: got.extend(consumer.poll(timeout=0.02)))  # noqa: B023
        assert _stale(consumer) == {}, f"after topic {i}"
    consumer.unsubscribe()
    assert _stale(consumer) == {}


def test_async_commits_that_land_after_a_move_leave_no_entry(env: Any) -> None:
    """An async commit of partitions the consumer was moved off before its callback ran, and a
    commit of offsets of partitions it does not hold, leave nothing behind either."""
    consumer = env.consumer(topics=[], enable_auto_commit=False)
    env.topics.create("other", 1)
    for i in range(TOPICS):
        topic = f"hopping-{i}"
        env.topics.create(topic, 2)
        env.producer.send_batch(topic, [b"a", b"b"])
        consumer.assign([TP(topic, 0), TP(topic, 1)])
        got: list[Any] = []
        wait_until(lambda: len(got) >= 2,  # noqa: B023
                   lambda: got.extend(consumer.poll(timeout=0.02)))  # noqa: B023
        consumer.commit({TP("other", 0): i})
        consumer.commit_async()
        assert _stale(consumer) == {}, f"after topic {i}"
    consumer.assign([TP("other", 0)])
    consumer.poll(timeout=0)  # runs the callbacks of the commits still pending
    assert _stale(consumer) == {}
