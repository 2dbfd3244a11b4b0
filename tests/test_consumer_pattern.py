"""Pattern subscriptions: a consumer subscribed with ``re.compile(...)`` follows the topics that
match, picking up topics created after it started and dropping deleted ones by a rebalance.
Real servers, one node and a cluster (the ``env`` fixture of test_consumer); every wait is on a
condition, bounded by ``wait_until``.
"""

from __future__ import annotations

import re
import threading
from typing import Any

import pytest
import test_consumer
from harness import wait_until
from test_consumer import Recorder

from rcoord import TopicPartition
from rcoord.client import Consumer, ConsumerGroupConfig, RedisCoordinator
from rcoord.client.errors import IllegalStateError
from rcoord.errors import ConfigError

TP = TopicPartition
env = test_consumer.env  # the fixture: a namespace, its topics, a producer, consumers of "g"

ORDERS = re.compile(r"orders-.*")
WATCH_MS = 100  # partition_watch_interval_ms: how often a member lists the topics again


class CountingCoordinator(RedisCoordinator):
    """The Redis coordinator, counting ``list_topics`` calls so a test can wait for the pattern
    watcher to have looked again (an explicit condition instead of a sleep)."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.listings = 0
        self._count_lock = threading.Lock()

    def list_topics(self) -> list[str]:
        with self._count_lock:
            self.listings += 1
        return super().list_topics()


def _pattern_consumer(env: Any, listener: Any = None, **kw: Any) -> Consumer:
    kw.setdefault("partition_watch_interval_ms", WATCH_MS)
    return env.consumer(listener, topics=[], topic_pattern=ORDERS, **kw)  # type: ignore[no-any-return]


def _poll_collect(consumers: list[Consumer], got: list[Any], cond: Any) -> None:
    def step() -> None:
        for c in consumers:
            got.extend(c.poll(timeout=0.02))

    wait_until(lambda: cond(got), step)


def _values(records: list[Any], topic: str) -> set[bytes]:
    return {r.value for r in records if r.topic == topic}


def test_pattern_subscription_gains_a_topic_created_later(env: Any) -> None:
    env.topics.create("orders-a", 2)
    env.topics.create("payments", 1)
    env.producer.send_batch("orders-a", [b"a%d" % i for i in range(4)])
    env.producer.send("payments", b"p0")
    listener = Recorder()
    consumer = _pattern_consumer(env, listener)
    got: list[Any] = []
    _poll_collect([consumer], got, lambda g: len(_values(g, "orders-a")) == 4)
    assert consumer.assignment() == [TP("orders-a", 0), TP("orders-a", 1)]
    assert consumer.subscription() == ["orders-a"]  # what the pattern matched (Kafka's)

    env.topics.create("orders-b", 2)
    env.topics.create("old-orders-c", 1)  # matches only partly: a pattern matches whole names
    env.producer.send_batch("orders-b", [b"b%d" % i for i in range(6)])
    env.producer.send("old-orders-c", b"c0")
    _poll_collect([consumer], got, lambda g: len(_values(g, "orders-b")) == 6)

    assert consumer.assignment() == [
        TP("orders-a", 0),
        TP("orders-a", 1),
        TP("orders-b", 0),
        TP("orders-b", 1),
    ]
    assert ("assigned", [TP("orders-b", 0), TP("orders-b", 1)]) in [
        (kind, [tp for tp in parts if tp.topic == "orders-b"]) for kind, parts in listener.events
    ]
    assert {r.topic for r in got} == {"orders-a", "orders-b"}
    assert len(got) == 10  # every record once: the rebalance committed orders-a's positions
    assert consumer.subscription() == ["orders-a", "orders-b"]


def test_pattern_subscription_of_two_members_spreads_a_new_topic(env: Any) -> None:
    env.topics.create("orders-a", 1)
    first, second = _pattern_consumer(env), _pattern_consumer(env)
    got: list[Any] = []
    _poll_collect(
        [first, second],
        got,
        lambda _: sorted(first.assignment() + second.assignment()) == [TP("orders-a", 0)],
    )

    env.topics.create("orders-new", 4)
    env.producer.send_batch("orders-new", [b"n%d" % i for i in range(20)])
    _poll_collect([first, second], got, lambda g: len(_values(g, "orders-new")) == 20)
    _poll_collect(
        [first, second],
        got,
        lambda _: (
            len([tp for tp in first.assignment() if tp.topic == "orders-new"]) == 2
            and len([tp for tp in second.assignment() if tp.topic == "orders-new"]) == 2
        ),
    )
    owned = first.assignment() + second.assignment()
    assert sorted(owned) == [TP("orders-a", 0)] + [TP("orders-new", p) for p in range(4)]
    assert len(set(owned)) == len(owned)  # each partition has exactly one owner


@pytest.mark.parametrize("assignors", [["range"], ["cooperative-sticky"]])
def test_pattern_subscription_loses_a_deleted_topic(env: Any, assignors: list[str]) -> None:
    env.topics.create("orders-a", 1)
    env.topics.create("orders-gone", 2)
    env.producer.send("orders-a", b"a0")
    env.producer.send_batch("orders-gone", [b"g0", b"g1"])
    coord = CountingCoordinator(env.client, env.namespace)
    coord.start()
    listener = Recorder()
    consumer = _pattern_consumer(env, listener, coordinator=coord, assignors=assignors)
    got: list[Any] = []
    _poll_collect([consumer], got, lambda g: len(g) == 3)
    assert [tp.topic for tp in consumer.assignment()] == ["orders-a", "orders-gone", "orders-gone"]

    env.topics.delete("orders-gone")
    _poll_collect([consumer], got, lambda _: consumer.assignment() == [TP("orders-a", 0)])
    revoked = [tp for kind, parts in listener.events if kind == "revoked" for tp in parts]
    assert TP("orders-gone", 0) in revoked and TP("orders-gone", 1) in revoked
    assert "lost" not in listener.kinds()  # revoked: the member stayed in the group
    # Eager: everything was revoked, orders-a comes back; cooperative: orders-a was kept.
    added = [] if assignors == ["cooperative-sticky"] else [TP("orders-a", 0)]
    assert listener.events[-1] == ("assigned", added)

    # No error loop: the member stays in one generation while its watcher looks again and
    # again, and it goes on consuming the topic that is left. Cooperative: no follow-up rejoin
    # either (KIP-429's is for partitions the member reported owned; it no longer reported the
    # deleted topic's), as Kafka's onJoinPrepare revokes them before the JoinGroup. That rejoin
    # ended the generation just delivered, a rebalance of the whole group for nothing.
    gen = consumer.generation
    assert gen is not None and not gen.done.is_set() and gen.revoked == []
    seen = coord.listings
    env.producer.send_batch("orders-a", [b"a1", b"a2"])
    _poll_collect(
        [consumer], got, lambda g: len(_values(g, "orders-a")) == 3 and coord.listings >= seen + 3
    )
    assert consumer.generation is gen
    assert not gen.done.is_set()
    assert consumer.assignment() == [TP("orders-a", 0)]


def test_pattern_subscription_that_matches_nothing_yet_waits_for_a_topic(env: Any) -> None:
    consumer = _pattern_consumer(env)
    assert consumer.poll(timeout=0.1) == []
    wait_until(lambda: consumer.generation is not None, lambda: consumer.poll(timeout=0.02))
    assert consumer.assignment() == []
    env.topics.create("orders-late", 1)
    env.producer.send("orders-late", b"late")
    got: list[Any] = []
    _poll_collect([consumer], got, lambda g: _values(g, "orders-late") == {b"late"})
    assert consumer.assignment() == [TP("orders-late", 0)]


def test_subscribe_method_takes_a_pattern(env: Any) -> None:
    env.topics.create("orders-x", 1)
    env.producer.send("orders-x", b"x")
    consumer = env.consumer(topics=[], partition_watch_interval_ms=WATCH_MS)
    consumer.subscribe(pattern=ORDERS)
    got: list[Any] = []
    _poll_collect([consumer], got, lambda g: _values(g, "orders-x") == {b"x"})
    consumer.subscribe(pattern=re.compile(r"orders-y"))  # same kind: replaces the pattern
    env.topics.create("orders-y", 1)
    env.producer.send("orders-y", b"y")
    _poll_collect([consumer], got, lambda g: _values(g, "orders-y") == {b"y"})
    assert consumer.assignment() == [TP("orders-y", 0)]


def test_mixing_pattern_with_topics_or_assign_raises_illegal_state(env: Any) -> None:
    env.topics.create("orders-a", 1)
    by_pattern = _pattern_consumer(env)
    with pytest.raises(IllegalStateError, match="subscribed by a pattern"):
        by_pattern.subscribe(["orders-a"])
    with pytest.raises(IllegalStateError, match="unsubscribe"):
        by_pattern.assign([TP("orders-a", 0)])

    by_topics = env.consumer(topics=["orders-a"])
    with pytest.raises(IllegalStateError, match="subscribed by topics"):
        by_topics.subscribe(pattern=ORDERS)
    with pytest.raises(IllegalStateError, match="both topics and a pattern"):
        by_topics.subscribe(["orders-a"], pattern=ORDERS)

    assigned = env.consumer(topics=[])
    assigned.assign([TP("orders-a", 0)])
    with pytest.raises(IllegalStateError, match="after assign"):
        assigned.subscribe(pattern=ORDERS)

    # After unsubscribe() the other kind is allowed, as in Kafka.
    by_topics.unsubscribe()
    by_topics.subscribe(pattern=ORDERS)
    wait_until(
        lambda: by_topics.assignment() == [TP("orders-a", 0)], lambda: by_topics.poll(timeout=0.02)
    )

    with pytest.raises(ConfigError, match="mutually exclusive"):
        ConsumerGroupConfig(group_id="g", topics=["orders-a"], topic_pattern=ORDERS)
    with pytest.raises(ConfigError, match="topic_pattern must be a compiled"):
        ConsumerGroupConfig(group_id="g", topics=[], topic_pattern="orders-.*")  # type: ignore[arg-type]
