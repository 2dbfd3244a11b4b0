"""Review 69: a cooperative move that waits for the application's commits (``_interrupted``,
b62a007) meeting a ``subscribe()`` that drops a topic, and auto-commit's reckoning of the
positions without the finished commits' outcomes.

A cooperative member gives up what a generation revokes before it rejoins (KIP-429, Kafka's
``onJoinPrepare``/``onJoinComplete``): its commits of them land in the generation that still
accepts them, and the assignor hears the member's true holdings.
"""

from __future__ import annotations

import threading
from typing import Any

from harness import WAIT_S, wait_until
from test_consumer import Recorder, env  # noqa: F401 - env: the fixture
from test_consumer_review67 import _assigned_at_10, _Gated
from test_consumer_review68 import _Joiner

from rcoord import TopicPartition
from rcoord.client import Consumer

TOPICS = ["t", "u", "v"]
TP0 = TopicPartition("t", 0)


def _committed_of(environment: Any, tp: TopicPartition) -> int:
    fetched = environment.coord.fetch_offsets("g", [tp]).offsets
    return fetched[tp].offset if tp in fetched else -1


def _moving(environment: Any, coord: _Gated, listener: Recorder,
            ) -> tuple[Consumer, _Joiner, TopicPartition]:
    """Topics t, u, v (one partition each, ten records) and a cooperative consumer of them
    at 10 everywhere; each partition's commit_async() of 5 is queued (held: the application's
    commits in flight), then a second member joins: the consumer takes the next generation,
    which moves one partition (returned) to it, and waits to apply it (``_interrupted``)."""
    for name in TOPICS:
        environment.topics.create(name, 1)
        environment.producer.send_batch(name, [b"%d" % i for i in range(10)])
    consumer: Consumer = environment.consumer(
        coordinator=coord, listener=listener, topics=TOPICS, assignors=["cooperative-sticky"],
        auto_commit_interval_ms=3_600_000, rebalance_timeout_ms=60_000)
    coord.open()
    got: list[Any] = []
    wait_until(lambda: len(got) == 30, step=lambda: got.extend(consumer.poll(timeout=0.05)))
    wait_until(lambda: consumer._committer.pending == 0)
    coord.gate = threading.Semaphore(0)
    held = consumer.assignment()
    for tp in held:  # (one commit each: the floor a move waits for is its partition's own)
        consumer.commit_async({tp: 5})
    joiner = _Joiner(environment, topics=TOPICS, assignors=["cooperative-sticky"])
    wait_until(lambda: consumer._interrupted is not None, step=lambda: consumer.poll(timeout=0))
    new = consumer._interrupted
    assert new is not None
    (moved,) = sorted(set(held) - new.offsets.keys())
    assert consumer.assignment() == held  # (nothing applied yet)
    return consumer, joiner, moved


def test_dropping_the_moved_partitions_topic_keeps_the_member_from_rejoining_until_committed(
        env: Any) -> None:  # noqa: F811 - the fixture
    """While the move waits, subscribe() drops the moved partition's topic, and the next
    poll() revokes it for the subscription (its commit of 10 held behind the others).
    Applying the move then revoked nothing more, and let the member rejoin at once
    (``hold.applied``), its revocation commit still in flight: once the next generation
    completed, that commit was fenced and the partition's new owner started from 5."""
    coord = _Gated(env)
    listener = Recorder()
    consumer, joiner, moved = _moving(env, coord, listener)
    try:
        hold = consumer._hold
        assert hold is not None
        consumer.subscribe([t for t in TOPICS if t != moved.topic])
        consumer.seek(moved, 10)  # (its commit's floor goes: the subscription's revocation
        # need not wait for it, while the commits stay held)
        assert consumer.poll(timeout=0) == []
        assert ("revoked", [moved]) in listener.events
        assert moved not in consumer.assignment()
        assert not hold.applied.is_set()  # its revocation commit is still held
        coord.open()
        wait_until(lambda: _committed_of(env, moved) == 10,
                   step=lambda: consumer.poll(timeout=0.05))
        wait_until(lambda: moved in joiner.consumer.assignment(),
                   step=lambda: consumer.poll(timeout=0.05))
    finally:
        coord.open()
        joiner.stop()


def test_the_rejoin_a_dropped_topic_owes_waits_for_the_move_in_hand(
        env: Any) -> None:  # noqa: F811 - the fixture
    """While the move waits, subscribe() drops a kept partition's topic and poll() revokes
    it, then the commits (the moved partition's among them)
    land between the move's try (``_settle``, still waiting) and the rejoin's
    (``_finish_rejoin``, made reachable here by ``_release_hold``, between the two): the
    rejoin let the member go (``hold.applied``) with the move not applied, still holding the
    partition the generation took away (and no on_partitions_revoked for it)."""
    coord = _Gated(env)
    listener = Recorder()
    consumer, joiner, moved = _moving(env, coord, listener)
    try:
        hold = consumer._hold
        assert hold is not None
        dropped = next(tp for tp in consumer.assignment() if tp != moved)
        consumer.subscribe([t for t in TOPICS if t != dropped.topic])
        landed = threading.Event()
        release_hold = consumer._release_hold

        def commits_land_here(deadline: float | None) -> None:
            if not landed.is_set():
                landed.set()
                coord.open()
                wait_until(lambda: consumer._committer.pending == 0)
            release_hold(deadline)

        consumer.seek(dropped, 10)  # (as above: its revocation need not wait)
        consumer._release_hold = commits_land_here  # type: ignore[method-assign]
        assert consumer.poll(timeout=0) == []
        assert landed.is_set()
        assert ("revoked", [dropped]) in listener.events
        assert moved in consumer.assignment()  # (the move waits for the next poll())
        assert not hold.applied.is_set()  # ... and holds the member meanwhile
        wait_until(lambda: ("revoked", [moved]) in listener.events,
                   step=lambda: consumer.poll(timeout=0.05))
        wait_until(lambda: _committed_of(env, moved) == 10,  # (under the move's generation)
                   step=lambda: consumer.poll(timeout=0.05))
    finally:
        coord.open()
        joiner.stop()


def test_auto_commit_in_a_long_poll_takes_a_refused_commits_outcome(
        env: Any) -> None:  # noqa: F811 - the fixture
    """Position 10, 5 committed; commit_async({t-0: 11}) is held, then refused while a
    poll() with nothing to read blocks. Each auto-commit of that poll reckoned the positions
    without the refusal's outcome: its floor (11) kept the 10 out, for as long as the poll
    lasted (the whole timeout, unbounded with None), where Kafka's auto-commit sends the
    position at the next interval. Now it takes the finished commits' outcomes first."""
    coord = _Gated(env)
    consumer = _assigned_at_10(env, coord, auto_commit_interval_ms=1)
    coord.gate.release()
    consumer.commit({TP0: 5})
    coord.refused.add(11)
    refused: list[BaseException | None] = []
    consumer.commit_async({TP0: 11}, lambda offsets, exc: refused.append(exc))
    first = consumer._next_auto_commit
    failed: list[BaseException] = []

    def poll() -> None:
        try:
            consumer.poll(timeout=WAIT_S * 4)
        except BaseException as exc:  # noqa: BLE001 - the wakeup() ending it, or a failure
            failed.append(exc)

    polling = threading.Thread(target=poll, daemon=True)
    polling.start()
    try:
        # The poll's first auto-commit, the refused commit still held: nothing of t-0 to send.
        wait_until(lambda: consumer._next_auto_commit != first)
        assert consumer._committer.pending == 1
        coord.open()
        wait_until(lambda: _committed_of(env, TP0) == 10)
        assert polling.is_alive()  # (committed by that same poll)
    finally:
        consumer.wakeup()
        polling.join(WAIT_S)
    assert not polling.is_alive()
    assert [type(exc).__name__ for exc in failed] == ["WakeupError"]
    consumer.poll(timeout=0)
    assert refused and refused[0] is not None


def test_a_move_applied_after_a_subscription_revoked_a_topic_does_not_take_it_back(
        env: Any) -> None:  # noqa: F811 - the fixture
    """While the move waits, subscribe() drops a kept partition's topic and poll() revokes
    it; the move, applied afterwards, added it back (its generation, joined with the old
    subscription, still assigns it): announced, fetched from that generation's offsets, while
    the rejoin reported it no longer owned, so the next generation gave it to the other
    member with this one still consuming it. As Kafka, which takes no assignment that does
    not match the subscription, the move takes only the subscribed topics' partitions."""
    coord = _Gated(env)
    listener = Recorder()
    consumer, joiner, moved = _moving(env, coord, listener)
    try:
        dropped = next(tp for tp in consumer.assignment() if tp != moved)
        consumer.subscribe([t for t in TOPICS if t != dropped.topic])
        consumer.seek(dropped, 10)  # (as above: its revocation need not wait)
        assert consumer.poll(timeout=0) == []
        assert ("revoked", [dropped]) in listener.events
        since = len(listener.events)
        coord.open()
        wait_until(lambda: ("revoked", [moved]) in listener.events,
                   step=lambda: consumer.poll(timeout=0.05))
        assert dropped not in consumer.assignment()
        assert all(dropped not in parts for _, parts in listener.events[since:])
    finally:
        coord.open()
        joiner.stop()
