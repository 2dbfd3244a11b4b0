"""Review 69b: the waits of the consumer's implicit commits for the application's commits in
flight (``Consumer._floors_landed``), kept apart for a rebalance and for each changed
subscription."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from harness import wait_until
from test_consumer import Recorder, env  # noqa: F401 - env: the fixture
from test_consumer_review67 import _Gated
from test_consumer_review68 import _Joiner, _polled_all
from test_review69_consumer_wait import _Held
from test_review69_subscription_wait import _both_at_10

from rcoord import TopicPartition

TP0 = TopicPartition("t", 0)


def test_subscribing_at_every_poll_does_not_restart_a_rebalances_wait_for_the_commits_in_flight(
        env: Any) -> None:  # noqa: F811 - the fixture
    """Eager; the generation ended with commit_async({t-0: 11}) held, so the revocation waits
    for it. A poll(0) loop then commits asynchronously and changes the subscription (t, or
    t and u) before each poll(), each commit held until the next turn. Each change dropped the
    generation's wait (ef2ecb0, keyed by the generation), so the revocation waited for the
    newest commit, still held, at every poll(): it never went on. It waits for the 11 only,
    then for its own commit, and revokes."""
    env.topics.create("u", 1)
    coord = _Gated(env)
    listener = Recorder()
    consumer = _polled_all(env, coord, 1, listener=listener, topics=["t", "u"])
    coord.refused.add(11)
    consumer.commit_async({TP0: 11})
    gen = consumer.generation
    assert gen is not None
    joiner = _Joiner(env)
    try:
        wait_until(gen.done.is_set)
        assert consumer.poll(timeout=0) == []  # (the 11 is held)
        assert consumer._floor_wait is not None
        for turn in range(6):
            consumer.commit_async({TP0: 10})
            coord.gate.release(consumer._committer.pending - 1)  # all but this newest one
            wait_until(lambda: consumer._committer.pending == 1)
            consumer.subscribe(["t", "u"] if turn % 2 else ["t"])
            consumer.poll(timeout=0)
            if "revoked" in listener.kinds():
                break
        assert "revoked" in listener.kinds()
    finally:
        coord.open()
        joiner.stop()


def test_a_changed_subscription_after_the_generation_ended_rejoins_once_its_commit_landed(
        env: Any) -> None:  # noqa: F811 - the fixture
    """Cooperative; a second member ends the generation, then subscribe(["u"]). The poll()
    that revokes t-0 returns by its deadline while Redis holds the revocation's commit; the
    member does not rejoin with the new subscription before that commit landed (as Kafka's
    onJoinPrepare commits before the JoinGroup): the change stays pending, and a later poll()
    applies it once the commit is let through."""
    listener = Recorder()
    with _ended_then_changed(env, listener) as (consumer, group, held):
        assert consumer.poll(timeout=0.5) == []
        assert "revoked" in listener.kinds()
        assert consumer.poll(timeout=0) == []  # (still held: not applied)
        assert (consumer._resubscribe is not None, set(group._config.topics)) == (
            True, {"t", "u"})
        held.release()
        wait_until(lambda: consumer._resubscribe is None,
                   step=lambda: consumer.poll(timeout=0.05))
        assert set(group._config.topics) == {"u"}


@contextlib.contextmanager
def _ended_then_changed(
        env: Any, listener: Recorder) -> Iterator[tuple[Any, Any, _Held]]:  # noqa: F811
    """Cooperative, t-0 and u-0 at 10 (``_both_at_10``); a second member ends the generation,
    Redis then holds commits (``_Held``), and the subscription changes to u alone: the
    consumer, its group and the hold (released, and the second member stopped, at the end)."""
    coord = _Gated(env)
    consumer = _both_at_10(env, coord, listener, session_timeout_ms=30_000)
    joiner = _Joiner(env, assignors=["cooperative-sticky"])
    held = _Held()
    group = consumer._group
    assert group is not None
    try:
        wait_until(lambda: consumer._gen is not None and consumer._gen.done.is_set())
        coord.gate = held  # type: ignore[assignment]
        consumer.subscribe(["u"])
        yield consumer, group, held
    finally:
        held.release()
        joiner.stop()
