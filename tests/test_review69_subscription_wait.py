"""Review 69: a changed subscription's wait for the application's commits in flight
(``Consumer._revoke_unsubscribed``, ``_floors_landed``; 81391cc, ef2ecb0).

``_floor_wait`` is fixed per generation at a change's first try; ef2ecb0 drops it only when a
later change revokes nothing. A later change that revokes other partitions still waits for
the ticket its abandoned predecessor fixed, not for the commits in flight of its own."""

from __future__ import annotations

import threading
from typing import Any

from harness import wait_until
from test_consumer import Recorder, env  # noqa: F401 - env: the fixture
from test_consumer_review67 import _Gated

from rcoord import TopicPartition
from rcoord.client import Consumer

T0, U0 = TopicPartition("t", 0), TopicPartition("u", 0)


def _committed_of(environment: Any, *partitions: TopicPartition) -> dict[TopicPartition, int]:
    fetched = environment.coord.fetch_offsets("g", list(partitions)).offsets
    return {tp: o.offset for tp, o in fetched.items()}


def _both_at_10(environment: Any, coord: _Gated, listener: Recorder, **kw: Any) -> Consumer:
    """Topics t and u (one partition each, ten records each) and a cooperative consumer of
    both in group g (configured as ``kw`` says) that has polled all twenty; its commits held
    from then on."""
    for topic in ("t", "u"):
        environment.topics.create(topic, 1)
        environment.producer.send_batch(topic, [b"%d" % i for i in range(10)])
    consumer: Consumer = environment.consumer(
        coordinator=coord, topics=["t", "u"], listener=listener,
        assignors=["cooperative-sticky"], auto_commit_interval_ms=3_600_000, **kw)
    coord.open()
    got: list[Any] = []
    wait_until(lambda: len(got) == 20, step=lambda: got.extend(consumer.poll(timeout=0.05)))
    wait_until(lambda: consumer._committer.pending == 0)
    coord.gate = threading.Semaphore(0)
    return consumer


def test_a_changed_subscription_revoking_other_partitions_waits_for_their_commits_in_flight(
        env: Any) -> None:  # noqa: F811 - the fixture
    """subscribe(["u"]) waits for the refused commit_async({t-0: 11}) in flight; then
    commit_async({u-0: 12}), refused too, and subscribe(["t"]), which revokes u-0 instead.
    That change waited only for the 11 its abandoned predecessor fixed (same generation), so
    it revoked u-0 with the 12 still in flight: its floor kept u-0's position 10 out of the
    revocation's commit, and once refused, u-0 was left uncommitted for its next owner."""
    coord = _Gated(env)
    listener = Recorder()
    consumer = _both_at_10(env, coord, listener)
    coord.refused.update({11, 12})
    consumer.commit_async({T0: 11})
    consumer.subscribe(["u"])
    assert consumer.poll(timeout=0) == []  # (waits for the 11)
    assert consumer._floor_wait is not None
    consumer.commit_async({U0: 12})
    consumer.subscribe(["t"])
    coord.gate.release()  # the 11 only (refused); the 12 stays held
    wait_until(lambda: consumer._committer.pending == 1)
    assert consumer.poll(timeout=0) == []
    revoked_early = "revoked" in listener.kinds()
    coord.open()
    wait_until(lambda: "revoked" in listener.kinds(), step=lambda: consumer.poll(timeout=0.05))
    wait_until(lambda: consumer._committer.pending == 0)
    assert (_committed_of(env, U0), revoked_early) == ({U0: 10}, False)


def test_a_later_change_revoking_the_same_partition_waits_for_its_commits_in_flight(
        env: Any) -> None:  # noqa: F811 - the fixture
    """The same root cause with the same partition revoked: subscribe(["u"]) waits for the
    refused 11; then commit_async({t-0: 12}), refused too, and subscribe(["u", "v"]), a new
    change revoking t-0 again. Its first try found the 12 in flight, yet it waited only for
    the 11 (ef2ecb0: "a later change waits for the commits in flight at its own first try"),
    and t-0 was left uncommitted. Keying the wait by the revoked set would not cover this:
    keyed by the change (the pending subscription), it would."""
    coord = _Gated(env)
    listener = Recorder()
    env.topics.create("v", 1)
    consumer = _both_at_10(env, coord, listener)
    coord.refused.update({11, 12})
    consumer.commit_async({T0: 11})
    consumer.subscribe(["u"])
    assert consumer.poll(timeout=0) == []  # (waits for the 11)
    consumer.commit_async({T0: 12})
    consumer.subscribe(["u", "v"])
    coord.gate.release()  # the 11 only (refused); the 12 stays held
    wait_until(lambda: consumer._committer.pending == 1)
    assert consumer.poll(timeout=0) == []
    revoked_early = "revoked" in listener.kinds()
    coord.open()
    wait_until(lambda: "revoked" in listener.kinds(), step=lambda: consumer.poll(timeout=0.05))
    wait_until(lambda: consumer._committer.pending == 0)
    assert (_committed_of(env, T0), revoked_early) == ({T0: 10}, False)
