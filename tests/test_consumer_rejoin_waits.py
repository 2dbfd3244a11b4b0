"""A cooperative consumer's rejoin waits for its revocation's commits, and only for those.

The commits a revocation queues (auto-commit's, the listener's async ones) must land before the
member rejoins: a rejoin that completes the next generation first gets them refused
(ILLEGAL_GENERATION), and the partitions' next owner reads their records again. Commits queued
after the revocation (an application's ``commit_async()`` in its loop) are not waited for: the
rejoin would wait for the whole rebalance timeout. A slow coordinator (``_SlowCommits``: each
commit waits first) stands in for a slow Redis; every wait in a test is on a condition.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from harness import wait_until
from test_consumer import Recorder

from rcoord.client import Consumer, ConsumerGroupConfig, Generation
from rcoord.client.coordinator import RedisCoordinator
from rcoord.config import CoordinatorConfig
from rcoord.coordinator import GroupCoordinator
from rcoord.protocol.offsets import TopicPartition as TP
from rcoord.testing.embedded import EmbeddedServer
from rcoord.topics import Producer, Topics

A0, A1, B0 = TP("a", 0), TP("a", 1), TP("b", 0)
FAST = {"group_min_session_timeout_ms": 10, "group_initial_rebalance_delay_ms": 0}


class _SlowCommits(RedisCoordinator):
    """Commits wait ``delay`` seconds before they are sent."""

    delay = 0.0

    def commit_offsets(self, group_id: str, offsets: Any, **kw: Any) -> Any:
        if self.delay:
            time.sleep(self.delay)
        return super().commit_offsets(group_id, offsets, **kw)


class _Noted(Recorder):
    """``Recorder``, and ``on_revoked`` runs inside on_partitions_revoked."""

    on_revoked: Any = None

    def on_partitions_revoked(self, partitions: list[TP]) -> None:
        super().on_partitions_revoked(partitions)
        if self.on_revoked is not None:
            self.on_revoked(partitions)


@pytest.fixture
def env(redis_server: EmbeddedServer, single_client: Any, namespace: str) -> Iterator[Any]:
    GroupCoordinator(single_client, CoordinatorConfig(namespace=namespace, **FAST)).start()
    slow = _SlowCommits(single_client, namespace)
    slow.start()
    made: list[Consumer] = []

    class Env:
        client, ns, coord = single_client, namespace, slow
        topics = Topics(single_client, namespace)
        producer = Producer(single_client, namespace)

        @staticmethod
        def consumer(topics: list[str], listener: Any = None, **kw: Any) -> Consumer:
            config = ConsumerGroupConfig(
                group_id="g", topics=topics, redis_client=single_client, namespace=namespace,
                heartbeat_interval_ms=50, session_timeout_ms=3000, rebalance_timeout_ms=60_000,
                retry_backoff_ms=10, retry_backoff_max_ms=100, assignors=["cooperative-sticky"])
            c = Consumer(config, listener=listener, coordinator=kw.pop("coordinator", slow),
                         fetch_max_wait_ms=20, **kw)
            made.append(c)
            return c

        @staticmethod
        def committed(*tps: TP) -> dict[TP, int]:
            offsets = slow.fetch_offsets("g", list(tps)).offsets  # (only commits are slow)
            return {tp: o.offset for tp, o in offsets.items()}

    try:
        yield Env
    finally:
        slow.delay = 0.0
        for c in made:
            c.close(timeout=5)


def _fill(env: Any, topic: str, partitions: int, records: int) -> None:
    env.topics.create(topic, partitions)
    if records:
        env.producer.send_batch(topic, [b"%d" % i for i in range(records)])


def _read(consumer: Consumer, count: int) -> None:
    got: list[Any] = []
    wait_until(lambda: len(got) >= count, lambda: got.extend(consumer.poll(timeout=0.05)))


def test_a_new_subscription_waits_for_its_commits_when_the_held_generation_had_ended(
        env: Any) -> None:
    """The held generation ended before the poll() that applies the new subscription (another
    member joined; the next generation waits, untaken): the hold can no longer keep the member
    from rejoining, so that poll() waits for the revoked partition's commit itself. Before,
    the rejoin went ahead and the commit (slow) was refused: committed -1, not 10."""
    _fill(env, "a", 1, 10)
    _fill(env, "b", 1, 0)
    _fill(env, "c", 1, 0)
    first = env.consumer(["a", "b"], enable_auto_commit=True, auto_commit_interval_ms=100_000)
    _read(first, 10)
    held = first.generation
    assert held is not None
    second = env.consumer(["c"])
    group = first.group

    def next_waits() -> bool:
        second.poll(timeout=0.05)
        return bool(second.assignment()) and group.peek() is not None

    wait_until(next_waits)
    assert held.done.is_set() and first.generation is held
    env.coord.delay = 1.0
    first.subscribe(["b"])
    first.poll(timeout=0)

    def moved_on() -> bool:
        second.poll(timeout=0.02)
        gen = first.generation
        return gen is not None and gen.generation_id > held.generation_id + 1 \
            and first.assignment() == [B0]

    wait_until(moved_on, lambda: first.poll(timeout=0.02))
    env.coord.delay = 0.0
    assert env.committed(A0) == {A0: 10}


def test_unsubscribe_lets_the_member_go_only_after_its_own_final_commit(env: Any) -> None:
    """unsubscribe() while a new subscription's revocation still waits for its commit: the
    hold it leaves is let go only once unsubscribe()'s own final commit landed. Before, it was
    let go first: the member rejoined and that commit was refused (b-0 stayed -1)."""
    _fill(env, "a", 1, 10)
    _fill(env, "b", 1, 5)
    first = env.consumer(["a", "b"], enable_auto_commit=True, auto_commit_interval_ms=100_000)
    _read(first, 15)
    env.coord.delay = 0.3
    first.subscribe(["b"])
    first.poll(timeout=0)
    assert first._rejoin_after is not None  # the rejoin waits for a-0's commit
    first.unsubscribe()
    env.coord.delay = 0.0
    assert env.committed(A0, B0) == {A0: 10, B0: 5}


def test_the_rejoin_does_not_wait_for_commits_queued_after_the_revocation(env: Any) -> None:
    """An application that commits asynchronously after every poll() always has a commit
    queued: the rejoin waits only for those its revocation queued, not for the committer to
    be idle (it waited for the rebalance timeout, 60 s here)."""
    _fill(env, "a", 1, 10)
    _fill(env, "b", 1, 0)
    first = env.consumer(["a", "b"], enable_auto_commit=True, auto_commit_interval_ms=100_000)
    _read(first, 10)
    held = first.generation
    env.coord.delay = 0.05  # a commit takes longer than the loop's turn: the queue grows
    first.subscribe(["b"])

    def busy_loop() -> None:
        first.poll(timeout=0)
        first.commit_async()

    wait_until(lambda: first.generation is not held and first.assignment() == [B0], busy_loop)
    env.coord.delay = 0.0
    wait_until(lambda: env.committed(A0) == {A0: 10})


def test_close_inside_a_cooperative_revocation_commits_what_was_kept(env: Any) -> None:
    """close() from on_partitions_revoked of a cooperative revocation (a new subscription):
    the partitions kept are committed too, and the poll() that ran the listener returns
    instead of raising ("the committer is closed")."""
    _fill(env, "a", 1, 10)
    _fill(env, "b", 1, 5)
    noted = _Noted()
    first = env.consumer(["a", "b"], listener=noted, enable_auto_commit=True,
                         auto_commit_interval_ms=100_000)
    noted.on_revoked = lambda partitions: first.close(timeout=5)
    _read(first, 15)
    first.subscribe(["b"])
    assert first.poll(timeout=0.5) == []
    assert noted.events == [("assigned", [A0, B0]), ("revoked", [A0])]
    assert env.committed(A0, B0) == {A0: 10, B0: 5}


def test_partitions_added_are_announced_before_a_subscription_the_revocation_made(
        env: Any) -> None:
    """A cooperative generation revokes b-0 and adds a-1; on_partitions_revoked subscribes to
    "b" only. a-1 is announced (on_partitions_assigned) before the new subscription revokes it
    with a-0. Before, it was revoked before it was announced, and announced once revoked."""
    _fill(env, "a", 2, 0)
    _fill(env, "b", 1, 0)
    noted = _Noted()
    first = env.consumer(["a", "b"], listener=noted, enable_auto_commit=False)
    wait_until(lambda: len(first.assignment()) == 3, lambda: first.poll(timeout=0.05))
    held = first.generation
    assert held is not None
    # This consumer's view: it holds a-0 and b-0; the next generation gives it a-0 and a-1.
    first._assigned.remove(A1)
    for table in (first._position, first._fetch_pos, first._buffers, first._committed):
        table.pop(A1, None)
    noted.events.clear()
    noted.on_revoked = lambda partitions: first.subscribe(["b"]) if B0 in partitions else None
    nxt = Generation(group_id="g", generation_id=held.generation_id + 1,
                     member_id=held.member_id, leader_id=held.leader_id,
                     protocol_name=held.protocol_name, assignments={A0: 0, A1: 0}, committed={},
                     coordinator=first.group.coordinator)
    try:
        first._transition(nxt, time.monotonic() + 5)
        assert noted.events == [("revoked", [B0]), ("assigned", [A1]), ("revoked", [A0, A1])]
        assert first.assignment() == []
    finally:
        # No group thread knows this generation: end it, decide it, and collect its routine
        # (the consumer's hold) once close() let go of it.
        nxt.request_rejoin()
        nxt._decide(False)
        first.close(timeout=5)
        nxt.collect(warn_after=5)
