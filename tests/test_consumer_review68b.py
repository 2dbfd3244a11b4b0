"""Review 68b: a changed subscription's revocation (``subscribe()`` to other topics, then
``poll()``) after an application's ``commit_async()`` of a revoked partition that is still in
flight, then refused.

cd54635 and b62a007 made a rebalance's revocation commits wait (until ``poll()``'s deadline,
a later ``poll()`` going on) for the application's commits in flight of the partitions they
commit and take their outcomes first (``Consumer._floors_landed``). The revocation a changed
subscription makes (``_revoke_unsubscribed``) reckoned its commit at once: the refused
commit's floor, past the position, kept the partition out of it, and the partition was left
uncommitted for its next owner (its records redelivered). Kafka's ``onJoinPrepare`` commits
the consumed positions before it revokes (its ``commitAsync`` pins nothing).
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from harness import WAIT_S, wait_until
from test_consumer import Recorder, _committed, env  # noqa: F401 - env: the fixture
from test_consumer_review67 import _Gated
from test_consumer_review68 import _Joiner, _polled_all

from rcoord import TopicPartition
from rcoord.client import Consumer, WakeupError

TP0 = TopicPartition("t", 0)


def _refused_in_flight(environment: Any, coord: _Gated, listener: Recorder,
                       **kw: Any) -> tuple[Consumer, list[BaseException | None]]:
    """A consumer of topics t (one partition, at 10) and u (empty) in group g, its commits
    held; commit_async({t-0: 11}) queued (to be refused), then subscribe(["u"])."""
    environment.topics.create("u", 1)
    consumer = _polled_all(environment, coord, 1, listener=listener, topics=["t", "u"], **kw)
    assert consumer.position(TP0) == 10
    coord.refused.add(11)
    refused: list[BaseException | None] = []
    consumer.commit_async({TP0: 11}, lambda offsets, exc: refused.append(exc))
    consumer.subscribe(["u"])
    return consumer, refused


def _revoked_and_committed(environment: Any, coord: _Gated, consumer: Consumer,
                           listener: Recorder) -> None:
    """Let the commits through and poll() until t-0 was revoked: its position 10 is what is
    committed, and the subscription is applied."""
    coord.open()
    wait_until(lambda: "revoked" in listener.kinds(), step=lambda: consumer.poll(timeout=0.05))
    wait_until(lambda: consumer._committer.pending == 0)
    assert _committed(environment, 1) == {TP0: 10}
    assert consumer._resubscribe is None


@pytest.mark.parametrize("assignor", ["cooperative-sticky", "range"])
def test_changed_subscription_commits_the_position_after_a_refused_async_commit_in_flight(
        env: Any, assignor: str) -> None:  # noqa: F811 - the fixture
    """The poll() after subscribe() revoked t-0 (cooperative) with the refused commit still
    held: its 11 held the 10 back, and t-0 was left uncommitted (-1). Now that poll() waits
    (until its deadline, the subscription change still pending) and takes its outcome first.
    Eager groups revoke in ``_settle``, which waited already."""
    coord = _Gated(env)
    listener = Recorder()
    consumer, refused = _refused_in_flight(env, coord, listener, assignors=[assignor])
    assert consumer.poll(timeout=0) == []  # (the refused commit is still held)
    _revoked_and_committed(env, coord, consumer, listener)
    wait_until(lambda: bool(refused), step=lambda: consumer.poll(timeout=0.05))
    assert refused[0] is not None
    wait_until(lambda: consumer.assignment() == [TopicPartition("u", 0)],
               step=lambda: consumer.poll(timeout=0.05))


def test_changed_subscription_waits_only_for_the_commits_in_flight_at_its_first_try(
        env: Any) -> None:  # noqa: F811 - the fixture
    """A poll(0) loop that queues a commit_async() of t-0 after each poll(): the revocation
    waits for the refused commit in flight at its first try, not for those queued since."""
    coord = _Gated(env)
    listener = Recorder()
    consumer, _ = _refused_in_flight(env, coord, listener, assignors=["cooperative-sticky"])
    for _ in range(3):
        assert consumer.poll(timeout=0) == []
        consumer.commit_async({TP0: 10})
    assert "revoked" not in listener.kinds() and consumer._resubscribe is not None
    coord.gate.release()  # the refused one only; the three behind it stay held

    def step() -> None:
        consumer.poll(timeout=0)
        if "revoked" not in listener.kinds():
            consumer.commit_async({TP0: 10})

    wait_until(lambda: "revoked" in listener.kinds(), step=step)
    assert consumer._committer.pending > 0  # (it did not wait for those)
    coord.open()
    wait_until(lambda: consumer._committer.pending == 0)
    assert _committed(env, 1) == {TP0: 10}


def test_wakeup_during_a_changed_subscriptions_wait_raises_and_the_next_poll_goes_on(
        env: Any) -> None:  # noqa: F811 - the fixture
    """wakeup() ends the wait: poll() raises WakeupError, nothing revoked, the subscription
    change still pending; a later poll() revokes t-0 and commits its position."""
    coord = _Gated(env)
    listener = Recorder()
    consumer, _ = _refused_in_flight(env, coord, listener, assignors=["cooperative-sticky"])
    consumer.wakeup()
    with pytest.raises(WakeupError):
        consumer.poll(timeout=WAIT_S)
    assert "revoked" not in listener.kinds() and consumer._resubscribe is not None
    _revoked_and_committed(env, coord, consumer, listener)


def test_close_during_a_changed_subscriptions_wait_ends_it_and_commits_the_position(
        env: Any) -> None:  # noqa: F811 - the fixture
    """close() from another thread ends the poll()'s wait (it returns no records) and, once
    the refused commit's outcome is in, commits t-0's position as it gives it up."""
    coord = _Gated(env)
    listener = Recorder()
    consumer, _ = _refused_in_flight(env, coord, listener, assignors=["cooperative-sticky"])
    got: list[Any] = []
    poller = threading.Thread(target=lambda: got.append(consumer.poll(timeout=WAIT_S * 4)),
                              daemon=True)
    poller.start()
    wait_until(lambda: consumer._floor_wait is not None)
    closer = threading.Thread(target=lambda: consumer.close(timeout=WAIT_S), daemon=True)
    closer.start()
    poller.join(WAIT_S)
    assert got == [[]]
    coord.open()
    closer.join(WAIT_S * 2)
    assert not closer.is_alive()
    assert _committed(env, 1) == {TP0: 10}


def test_a_subscription_the_revocation_callback_made_waits_for_the_commits_in_flight(
        env: Any) -> None:  # noqa: F811 - the fixture
    """Cooperative, t-0 and t-1 at 5, u-0: a second member (of t) takes one t partition, and
    on_partitions_revoked subscribes to ["u"]; the rejoin waits for the revocation's commits
    (``_finish_rejoin``), and meanwhile commit_async() of the t partition kept, at 6, is
    queued, then refused. Once the revocation's commits landed, that subscription revoked
    the kept partition while the refused commit was still in flight: it stayed uncommitted
    (-1). Now it waits for it (the rejoin too), and its 5 is committed."""
    coord = _Gated(env)
    env.topics.create("u", 1)

    class Resubscribing(Recorder):
        def on_partitions_revoked(self, partitions: list[TopicPartition]) -> None:
            super().on_partitions_revoked(partitions)
            if len(self.kinds()) == 2:  # ("assigned", then this first revocation)
                consumer.subscribe(["u"])

    listener = Resubscribing()
    consumer = _polled_all(env, coord, 2, listener=listener, topics=["t", "u"],
                           assignors=["cooperative-sticky"])
    joiner = _Joiner(env, assignors=["cooperative-sticky"])
    try:
        wait_until(lambda: "revoked" in listener.kinds(), step=lambda: consumer.poll(timeout=0))
        moved = listener.events[1][1]
        (kept,) = {TopicPartition("t", 0), TopicPartition("t", 1)} - set(moved)
        assert consumer._rejoin_after is not None and consumer._committer.pending > 0
        revocation_commits = consumer._committer.pending
        coord.refused.add(6)
        consumer.commit_async({kept: 6})
        coord.gate.release(revocation_commits)  # the refused one stays held
        wait_until(lambda: consumer._committer.pending == 1)
        assert consumer.poll(timeout=0) == []
        coord.open()
        wait_until(lambda: listener.kinds().count("revoked") == 2,
                   step=lambda: consumer.poll(timeout=0.05))
        assert [e for e in listener.events if e[0] == "revoked"][1] == ("revoked", [kept])
        wait_until(lambda: consumer._committer.pending == 0)
        assert _committed(env, 2)[kept] == 5
    finally:
        joiner.stop()


def test_a_changed_subscription_abandoned_while_waiting_does_not_shorten_a_later_ones_wait(
        env: Any) -> None:  # noqa: F811 - the fixture
    """subscribe(["u"]) waits for the refused commit of 11 in flight; subscribe(["t", "u"])
    back (nothing to revoke), that commit lands; then commit_async({t-0: 12}), refused too,
    and subscribe(["u"]) again: that revocation waits for the 12, not for the 11 its
    abandoned predecessor fixed, and commits 10."""
    coord = _Gated(env)
    listener = Recorder()
    consumer, _ = _refused_in_flight(env, coord, listener, assignors=["cooperative-sticky"])
    assert consumer.poll(timeout=0) == []
    consumer.subscribe(["t", "u"])
    consumer.poll(timeout=0)
    coord.gate.release()
    wait_until(lambda: consumer._committer.pending == 0)
    coord.refused.add(12)
    consumer.commit_async({TP0: 12})
    consumer.subscribe(["u"])
    assert consumer.poll(timeout=0) == []
    assert "revoked" not in listener.kinds()
    _revoked_and_committed(env, coord, consumer, listener)
