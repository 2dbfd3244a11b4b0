"""``subscribe()`` on a subscribed consumer, as in Kafka: the member keeps its id and rejoins with
the new subscription (one rebalance); cooperatively it gives up only the partitions of topics it
no longer subscribes to, before the rejoin lets another member take them. Real servers, one node
and a cluster (the ``env`` fixture of test_consumer); every wait is on a condition.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import test_consumer
from harness import wait_until
from test_consumer import Recorder

from rcoord import TopicPartition
from rcoord.client import Consumer
from rcoord.errors import ConfigError

TP = TopicPartition
env = test_consumer.env  # the fixture: a namespace, its topics, a producer, consumers of "g"
COOP = {"assignors": ["cooperative-sticky"], "auto_commit_interval_ms": 100_000}


def _fill(env: Any, topic: str, partitions: int, per_partition: int) -> None:
    env.topics.create(topic, partitions)
    for p in range(partitions):
        for i in range(per_partition):
            env.producer.send(topic, b"%s%d-%d" % (topic.encode(), p, i), partition=p)


def _poll_into(consumers: list[Consumer], got: list[Any], cond: Any) -> None:
    def step() -> None:
        for c in consumers:
            got.extend(c.poll(timeout=0.02))

    wait_until(lambda: cond(got), step)


def _committed(env: Any) -> dict[TopicPartition, int]:
    return {tp: o.offset for tp, o in env.coord.fetch_offsets("g").offsets.items()}


@pytest.mark.parametrize("assignors", [["range"], ["cooperative-sticky"]])
def test_subscribing_to_more_topics_keeps_the_member_and_rebalances_once(
        env: Any, assignors: list[str]) -> None:
    _fill(env, "t", 2, 3)
    _fill(env, "u", 2, 3)
    rec = Recorder()
    c = env.consumer(rec, topics=["t"], assignors=assignors)
    got: list[Any] = []
    _poll_into([c], got, lambda g: len(g) == 6)
    member, gen = c.member_id, c.generation
    assert gen is not None

    c.subscribe(["t", "u"])
    assert c.subscription() == ["t", "u"]
    _poll_into([c], got, lambda g: len(g) == 12)
    assert sorted(r.value for r in got if r.topic == "u") == [
        b"u%d-%d" % (p, i) for p in (0, 1) for i in range(3)]
    assert c.member_id == member  # the same member: no LeaveGroup, no new join
    now = c.generation
    assert now is not None and now.generation_id == gen.generation_id + 1  # one rebalance
    assert sorted(c.assignment()) == [TP(t, p) for t in ("t", "u") for p in (0, 1)]
    t_parts = [TP("t", 0), TP("t", 1)]
    u_parts = [TP("u", 0), TP("u", 1)]
    if assignors == ["range"]:  # eager: everything revoked and assigned again
        assert rec.events == [("assigned", t_parts), ("revoked", t_parts),
                              ("assigned", t_parts + u_parts)]
    else:  # cooperative: t kept through the rebalance, only u announced
        assert rec.events == [("assigned", t_parts), ("assigned", u_parts)]
    assert [m.member_id for m in env.coord.describe_group("g").members] == [member]


def test_a_cooperative_member_gives_up_a_dropped_topic_before_another_can_take_it(
        env: Any) -> None:
    # a reads t and u, b reads u. a drops u: subscribe() revokes a's u partitions at once
    # (committing the positions of what a returned), before a rejoins; b then takes them over
    # from exactly those offsets, so no record of u is read twice or skipped, and a keeps t
    # without a revocation.
    _fill(env, "t", 2, 4)
    _fill(env, "u", 4, 4)
    rec_a, rec_b = Recorder(), Recorder()
    a = env.consumer(rec_a, topics=["t", "u"], **COOP)
    got_a: list[Any] = []
    _poll_into([a], got_a, lambda g: len(g) == 24)
    b = env.consumer(rec_b, topics=["u"], **COOP)
    got_b: list[Any] = []

    def both() -> None:
        got_a.extend(a.poll(timeout=0.02))
        got_b.extend(b.poll(timeout=0.02))

    # b joins; the sticky assignor balances 3 and 3: a keeps t and one partition of u
    wait_until(lambda: len(b.assignment()) == 3 and len(a.assignment()) == 3, both)
    a_u = [tp for tp in a.assignment() if tp.topic == "u"]
    assert len(a_u) == 1
    for p in range(4):  # one more record per partition of u; a reads that of its partition
        env.producer.send("u", b"late%d" % p, partition=p)
    wait_until(lambda: sum(r.topic == "u" for r in got_a + got_b) >= 16 + 4, both)
    member, events_before = a.member_id, len(rec_a.events)

    a.subscribe(["t"])
    assert a.subscription() == ["t"]
    # nothing happens inside subscribe(): the records the last poll() returned may still be
    # being processed (Kafka: callbacks run only in poll())
    assert len(rec_a.events) == events_before and a_u[0] not in _committed(env)
    assert a.member_id == member
    got_a.extend(a.poll(timeout=0))
    # that poll() revoked them; their position's commit, queued, may land after it returned
    # (poll(0) does not wait for it), but before the rejoin, which waits for it
    assert rec_a.events[events_before:] == [("revoked", a_u)]
    wait_until(lambda: _committed(env).get(a_u[0]) == 5)
    assert a.assignment() == [TP("t", 0), TP("t", 1)]

    for p in range(4):
        env.producer.send("u", b"after%d" % p, partition=p)
    for p in (0, 1):
        env.producer.send("t", b"after%d" % p, partition=p)
    u_all = sorted([b"u%d-%d" % (p, i) for p in range(4) for i in range(4)]
                   + [b"late%d" % p for p in range(4)] + [b"after%d" % p for p in range(4)])
    wait_until(lambda: len(b.assignment()) == 4
               and {r.value for r in got_a + got_b if r.topic == "u"} == set(u_all)
               and sum(r.topic == "t" for r in got_a) == 10, both)
    assert a.member_id == member
    # every record of u read exactly once, by one of the two
    assert sorted(r.value for r in got_a + got_b if r.topic == "u") == u_all
    # a never read u after giving it up, and kept t without a revocation
    assert [e for e in rec_a.events[events_before:] if e[0] != "assigned" or e[1]] == [
        ("revoked", a_u)]
    assert rec_b.events[-1] == ("assigned", a_u)


def test_a_pattern_subscription_moves_to_another_pattern_without_leaving(env: Any) -> None:
    _fill(env, "orders-a", 1, 2)
    _fill(env, "refunds-a", 1, 2)
    rec = Recorder()
    c = env.consumer(rec, topics=[], topic_pattern=re.compile(r"orders-.*"),
                     partition_watch_interval_ms=100, **COOP)
    got: list[Any] = []
    _poll_into([c], got, lambda g: len(g) == 2)
    member = c.member_id
    c.subscribe(pattern=re.compile(r"refunds-.*"))
    got.extend(c.poll(timeout=0))
    assert rec.events[-1] == ("revoked", [TP("orders-a", 0)])  # first thing: cooperative
    _poll_into([c], got, lambda g: len(g) == 4)
    assert {r.topic for r in got[2:]} == {"refunds-a"}
    assert c.member_id == member
    assert c.subscription() == ["refunds-a"]


def test_a_subscription_changed_while_joining_is_joined_again(env: Any) -> None:
    # c's first JoinGroup is parked (x, which stopped polling, holds the rebalance) when c's
    # subscription changes: the generation that join forms is for the old topics, so c
    # rejoins at once, and the first generation it hands out has the new ones.
    _fill(env, "t", 1, 1)
    _fill(env, "u", 1, 1)
    x = env.consumer(topics=["t"], rebalance_timeout_ms=30_000)
    # x reads t's record now (a poll() may return before its fetch is collected, so the
    # assignment alone does not say so).
    _poll_into([x], [], lambda g: x.assignment() == [TP("t", 0)] and len(g) == 1)
    c = env.consumer(topics=["t"])
    assert c.poll(timeout=0.01) == []  # starts c's join
    wait_until(lambda: env.coord.describe_group("g").state == "PreparingRebalance")
    group = c.group
    assert group.generation is None  # still joining: x has not rejoined
    c.subscribe(["u"])
    got: list[Any] = []
    # Both assignments are waited for: x may still be inside the (eager) rebalance c's rejoin
    # started, with nothing assigned, when c already reads u.
    _poll_into([x, c], got, lambda g: c.assignment() == [TP("u", 0)] and len(g) >= 1
               and x.assignment() == [TP("t", 0)])
    assert [(r.topic, r.value) for r in got] == [("u", b"u0-0")]  # x had read t already


def test_the_same_topics_in_another_order_are_the_same_subscription(env: Any) -> None:
    _fill(env, "t", 1, 1)
    _fill(env, "u", 1, 1)
    c = env.consumer(topics=["t", "u"])
    _poll_into([c], [], lambda g: len(g) == 2)
    gen = c.generation
    c.subscribe(["u", "t"])
    assert c.poll(timeout=0.05) == [] and c.generation is gen  # no rebalance
    assert gen is not None and not gen.done.is_set()


def test_an_empty_resubscription_is_refused_and_changes_nothing(env: Any) -> None:
    _fill(env, "t", 1, 1)
    c = env.consumer(topics=["t"])
    _poll_into([c], [], lambda g: c.assignment() == [TP("t", 0)])
    group = c.group
    with pytest.raises(ConfigError, match="at least one topic"):
        group.resubscribe([])
    assert group.config.topics == ("t",)
    assert c.assignment() == [TP("t", 0)]


class _SubscribesOnFirstRevoke(Recorder):
    """Calls ``consumer.subscribe(topics)`` from inside its first ``on_partitions_revoked``
    (a listener that reacts to losing partitions by changing what it reads)."""

    def __init__(self, topics: list[str]) -> None:
        super().__init__()
        self.topics = topics
        self.consumer: Consumer | None = None
        self.subscribed = False

    def on_partitions_revoked(self, partitions: list[TopicPartition]) -> None:
        super().on_partitions_revoked(partitions)
        if not self.subscribed and self.consumer is not None:
            self.subscribed = True
            self.consumer.subscribe(self.topics)


def _each_record_once(got: list[Any], topic: str, partitions: int, per_partition: int) -> None:
    assert sorted(r.value for r in got if r.topic == topic) == [
        b"%s%d-%d" % (topic.encode(), p, i) for p in range(partitions)
        for i in range(per_partition)]


def _reading_t_and_u_until_a_revocation_subscribes_to_t_and_v(
        env: Any) -> tuple[Consumer, _SubscribesOnFirstRevoke, list[Any]]:
    """Topics t, u and v (2 partitions, 3 records each); a cooperative consumer of t and u that
    has read their 12 records, whose listener subscribes to t and v on its first revocation."""
    for topic in ("t", "u", "v"):
        _fill(env, topic, 2, 3)
    rec = _SubscribesOnFirstRevoke(["t", "v"])
    consumer = rec.consumer = env.consumer(rec, topics=["t", "u"], **COOP)
    got: list[Any] = []
    _poll_into([consumer], got, lambda g: len(g) == 12)
    return consumer, rec, got


def test_subscribe_from_inside_the_revocation_of_a_resubscription(env: Any) -> None:
    # c drops u; the poll() that revokes u calls back, and the callback subscribes to t and v:
    # the rejoin under way is for t alone, so c rejoins again, keeps its id, and reads v.
    c, rec, got = _reading_t_and_u_until_a_revocation_subscribes_to_t_and_v(env)
    member = c.member_id
    c.subscribe(["t"])
    _poll_into([c], got, lambda g: len(g) >= 18
               and sorted(c.assignment()) == [TP(t, p) for t in ("t", "v") for p in (0, 1)])
    assert rec.subscribed and c.subscription() == ["t", "v"]
    assert c.member_id == member
    assert rec.events[1:] == [("revoked", [TP("u", 0), TP("u", 1)]),
                              ("assigned", [TP("v", 0), TP("v", 1)])]
    for topic in ("t", "u", "v"):
        _each_record_once(got, topic, 2, 3)  # nothing read twice or skipped


def test_subscribe_from_inside_a_cooperative_rebalances_revocation(env: Any) -> None:
    # a reads t and u; b joins, so a's cooperative rebalance revokes what b is to take, and a's
    # callback subscribes to t and v from inside that revocation. The group settles with a on
    # t and v and b on t and u, and every record is read once.
    a, rec, got = _reading_t_and_u_until_a_revocation_subscribes_to_t_and_v(env)
    b = env.consumer(topics=["t", "u"], **COOP)
    everything = {TP(t, p) for t in ("t", "u", "v") for p in (0, 1)}
    _poll_into([a, b], got, lambda g: rec.subscribed and len(g) >= 18
               and set(a.assignment()) | set(b.assignment()) == everything
               and not set(a.assignment()) & set(b.assignment()))
    assert a.subscription() == ["t", "v"]
    assert {tp.topic for tp in a.assignment()} <= {"t", "v"}
    assert {tp.topic for tp in b.assignment()} <= {"t", "u"}
    for topic in ("t", "u", "v"):
        _each_record_once(got, topic, 2, 3)
