"""An unstarted partition's start after ``assign()`` replaced the assignment, as Kafka's.

Kafka's ``assign()`` drops what the consumer knew of the partitions it gives up, a held-up
commit of them included: the next poll() fetches the committed offsets of the new ones (and
drops a fetch answer of a partition whose position was reset meanwhile). Here the first
fetch of the new partitions waited for a commit of a partition no longer assigned, and the
answer of a fetch sent before a partition was given up and assigned again filled its buffer
while its start was still to be set by a commit.
"""

from __future__ import annotations

import threading
from typing import Any

from harness import WAIT_S, wait_until
from test_consumer import env, poll_until  # noqa: F401 - env: the fixture

from rcoord import TopicPartition
from rcoord.client import Consumer
from rcoord.client.coordinator import RedisCoordinator

TP0 = TopicPartition("t", 0)
U0 = TopicPartition("u", 0)


class _Held(RedisCoordinator):
    """Holds every commit until ``commits`` is set, and, while ``hold_fetches`` is set,
    every fetch until ``fetches`` is set."""

    def __init__(self, env: Any) -> None:  # noqa: F811 - the fixture object
        super().__init__(env.client, env.namespace)
        self.commits = threading.Event()
        self.hold_fetches = threading.Event()
        self.fetches = threading.Event()
        self.fetching = threading.Event()  # a held fetch began

    def commit_offsets(self, *args: Any, **kw: Any) -> Any:
        assert self.commits.wait(WAIT_S)
        return super().commit_offsets(*args, **kw)

    def fetch_many_as(self, *args: Any, **kw: Any) -> Any:
        if self.hold_fetches.is_set():
            self.fetching.set()
            assert self.fetches.wait(WAIT_S)
        return super().fetch_many_as(*args, **kw)


def test_new_partitions_do_not_wait_for_a_commit_of_one_given_up(
        env: Any) -> None:  # noqa: F811 - the fixture
    """assign([t-0]), commit_async() of t-0 (held up), assign([u-0]): poll() returned nothing
    until that commit landed (each poll() waited for it until its deadline), though u-0's
    start owes it nothing."""
    env.topics.create("t", 1)
    env.topics.create("u", 1)
    env.producer.send_batch("u", [b"%d" % i for i in range(5)])
    coord = _Held(env)
    consumer: Consumer = env.consumer(topics=[], enable_auto_commit=False,
                                      coordinator=coord)
    try:
        consumer.assign([TP0])
        consumer.commit_async({TP0: 3})
        consumer.assign([U0])
        got = poll_until(consumer, lambda g: len(g) >= 5)
        assert [(r.topic, r.offset) for r in got] == [("u", i) for i in range(5)]
        assert consumer._committer.pending == 1  # (still held: the poll did not wait for it)
    finally:
        coord.commits.set()


def test_a_fetch_sent_before_a_partition_was_assigned_again_is_dropped(
        env: Any) -> None:  # noqa: F811 - the fixture
    """A fetch of t-0 from 0 in flight; assign([u-0]), assign([t-0]) (its start 0 again), and
    commit_async() of t-0 at 5, held up: the fetch's answer filled t-0's buffer, and poll()
    handed out records 0 to 4 that the commit had put before t-0's start (then 5 to 9 twice,
    when the commit landed and set the position back)."""
    env.topics.create("t", 1)
    env.topics.create("u", 1)
    env.producer.send_batch("t", [b"%d" % i for i in range(10)])
    coord = _Held(env)
    consumer: Consumer = env.consumer(topics=[], enable_auto_commit=False,
                                      coordinator=coord)
    try:
        consumer.assign([TP0])
        coord.hold_fetches.set()
        wait_until(coord.fetching.is_set, lambda: consumer.poll(timeout=0.05) and None)
        consumer.assign([U0])
        consumer.assign([TP0])
        consumer.commit_async({TP0: 5})
        coord.hold_fetches.clear()
        coord.fetches.set()
        assert consumer._fetching.wait_finished(WAIT_S)
        got = consumer.poll(timeout=0.05)  # (the commit still held: t-0 unstarted)
        coord.commits.set()
        got += poll_until(consumer, lambda g: any(r.offset == 9 for r in got + g))
        assert [r.offset for r in got] == [5, 6, 7, 8, 9]
    finally:
        coord.fetches.set()
        coord.commits.set()
