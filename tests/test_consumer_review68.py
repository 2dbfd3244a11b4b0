"""Review 68: the consumer's implicit commits that 95e529a left out (a rebalance's revocation
commit, eager and cooperative) and an auto-commit landing after the application's commit.

95e529a made close(), ``unsubscribe()`` and ``assign()`` wait for the commits queued before
their final commit and take their outcomes (``_take_outcomes``) before they reckon the
positions, so that an application's ``commit_async()`` that is refused holds nothing back
(``_settle_commit_floor``). A rebalance reckoned its commit at once: a refused
``commit_async()`` past the position still in flight then kept it from committing the
partition (its records came again after the rebalance; Kafka, which pins nothing on a
``commitAsync``, commits the consumed positions in ``onJoinPrepare``).
"""

from __future__ import annotations

import threading
from typing import Any

from harness import WAIT_S, wait_until
from test_consumer import Recorder, _committed, env, poll_until  # noqa: F401 - env: the fixture
from test_consumer_review67 import _assigned_at_10, _Gated

from rcoord import TopicPartition
from rcoord.client import Consumer

TP0 = TopicPartition("t", 0)
TP1 = TopicPartition("t", 1)


def _polled_all(environment: Any, coord: _Gated, partitions: int, **kw: Any) -> Consumer:
    """Topic t (``partitions`` partitions, ten records) and a consumer of it in group g
    (commits through ``coord``, let through) that has polled all ten, its commits held from
    then on; auto-commit only when it gives partitions up (or as ``kw`` says)."""
    environment.topics.create("t", partitions)
    environment.producer.send_batch("t", [b"%d" % i for i in range(10)])
    kw.setdefault("auto_commit_interval_ms", 3_600_000)
    consumer: Consumer = environment.consumer(coordinator=coord, **kw)
    coord.open()
    got: list[Any] = []
    wait_until(lambda: len(got) == 10, step=lambda: got.extend(consumer.poll(timeout=0.05)))
    wait_until(lambda: consumer._committer.pending == 0)
    coord.gate = threading.Semaphore(0)
    return consumer


class _Joiner:
    """A second member of group g (no auto-commit), polling on its own thread until
    ``stop()``: its join ends the first member's generation."""

    def __init__(self, environment: Any, **kw: Any) -> None:
        self.consumer: Consumer = environment.consumer(enable_auto_commit=False, **kw)
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.done.is_set():
            self.consumer.poll(timeout=0.05)

    def stop(self) -> None:
        self.done.set()
        self.thread.join()


def test_eager_revocation_commits_the_position_after_a_refused_async_commit_in_flight(
        env: Any) -> None:  # noqa: F811 - the fixture
    """Position 10; commit_async({t-0: 11}) is held, then refused. A rebalance's revocation
    (poll()) reckoned its commit while that commit was in flight: its 11 held the 10 back,
    nothing of t-0 was committed (-1). Now the revocation waits (until poll()'s deadline, a
    later poll() going on) for the commits queued before it and takes their outcomes."""
    coord = _Gated(env)
    listener = Recorder()
    consumer = _polled_all(env, coord, 1, listener=listener)
    coord.refused.add(11)
    refused: list[BaseException | None] = []
    consumer.commit_async({TP0: 11}, lambda offsets, exc: refused.append(exc))
    gen = consumer.generation
    assert gen is not None
    joiner = _Joiner(env)
    try:
        wait_until(gen.done.is_set)
        assert consumer.poll(timeout=0) == []  # (the refused commit is still held)
        coord.open()
        wait_until(lambda: "revoked" in listener.kinds(),
                   step=lambda: consumer.poll(timeout=0.05))
        assert _committed(env, 1) == {TP0: 10}
        wait_until(lambda: bool(refused), step=lambda: consumer.poll(timeout=0.05))
        assert refused[0] is not None
    finally:
        joiner.stop()


def test_cooperative_revocation_commits_the_position_after_a_refused_async_commit_in_flight(
        env: Any) -> None:  # noqa: F811 - the fixture
    """Cooperative, t-0 and t-1 at 5; commit_async({t-0: 6, t-1: 6}) is held, then refused.
    A second member joins: the partition moved to it was committed (``_stop_revoked``) as
    reckoned while that commit was in flight, its 6 holding the 5 back, so it was left
    uncommitted (-1). Now the move waits for the application's commits in flight of the
    revoked partitions (until poll()'s deadline, a later poll() applying it) and takes their
    outcomes first."""
    coord = _Gated(env)
    listener = Recorder()
    consumer = _polled_all(env, coord, 2, listener=listener, assignors=["cooperative-sticky"])
    assert consumer.position(TP0) == consumer.position(TP1) == 5
    coord.refused.add(6)
    refused: list[BaseException | None] = []
    consumer.commit_async({TP0: 6, TP1: 6}, lambda offsets, exc: refused.append(exc))
    joiner = _Joiner(env, assignors=["cooperative-sticky"])
    try:
        # poll() until it took the next generation, with the refused commit still held: it
        # moved the partition (before), or waits (``_interrupted``: a later poll() applies it).
        wait_until(lambda: "revoked" in listener.kinds() or consumer._interrupted is not None,
                   step=lambda: consumer.poll(timeout=0))
        coord.open()
        wait_until(lambda: "revoked" in listener.kinds(),
                   step=lambda: consumer.poll(timeout=0.05))
        revoked = next(parts for kind, parts in listener.events if kind == "revoked")
        assert len(revoked) == 1
        wait_until(lambda: consumer._committer.pending == 0)
        assert _committed(env, 2)[revoked[0]] == 5
        wait_until(lambda: bool(refused), step=lambda: consumer.poll(timeout=0.05))
        assert refused[0] is not None
    finally:
        joiner.stop()


class _Counted(_Gated):
    """``_Gated``, counting the commits that reach the coordinator."""

    def __init__(self, env: Any) -> None:  # noqa: F811 - the fixture object
        super().__init__(env)
        self.sent = 0

    def commit_offsets(self, group_id: str, offsets: Any, *args: Any, **kw: Any) -> Any:
        self.sent += 1
        return super().commit_offsets(group_id, offsets, *args, **kw)


def test_an_auto_commit_landing_after_an_async_commit_that_landed_is_what_is_committed(
        env: Any) -> None:  # noqa: F811 - the fixture
    """Position 10: commit_async({t-0: 5}) is queued, then an auto-commit of 10 behind it;
    the 5 lands, then the 10. The books take 10 as committed (the 5's landing is not noted
    over it: the auto-commit after it was still pending), so close() sends nothing, and 10
    stays, as Kafka's auto-commit leaves the consumed position after the application's
    commit."""
    coord = _Counted(env)
    consumer = _assigned_at_10(env, coord, auto_commit_interval_ms=1)
    consumer.commit_async({TP0: 5})
    wait_until(lambda: consumer._committer.pending == 2,
               step=lambda: consumer.poll(timeout=0))  # the auto-commit of 10, behind it
    coord.gate.release()
    wait_until(lambda: consumer._committer.pending == 1)
    assert consumer.committed([TP0]) == {TP0: 5}
    coord.open()
    wait_until(lambda: consumer._committer.pending == 0)
    assert consumer.committed([TP0]) == {TP0: 10}
    sent = coord.sent
    assert consumer.poll(timeout=0) == []  # (takes the outcomes; no commit: nothing moved)
    consumer.close(timeout=WAIT_S)
    assert (coord.sent, _committed(env, 1)) == (sent, {TP0: 10})


def test_an_auto_commit_after_a_commit_that_landed_commits_the_position(
        env: Any) -> None:  # noqa: F811 - the fixture
    """Position 10: commit({t-0: 5}) lands, then the next poll()'s auto-commit sends 10 (the
    application's 5 is a floor, not a ceiling); close() then sends nothing, and 10 stays."""
    coord = _Counted(env)
    consumer = _assigned_at_10(env, coord, auto_commit_interval_ms=1)
    coord.open()
    consumer.commit({TP0: 5})
    assert consumer.committed([TP0]) == {TP0: 5}
    wait_until(lambda: consumer.committed([TP0]) == {TP0: 10},
               step=lambda: consumer.poll(timeout=0))
    wait_until(lambda: consumer._committer.pending == 0)
    sent = coord.sent
    assert consumer.poll(timeout=0) == []  # (takes the outcome; no commit: nothing moved)
    consumer.close(timeout=WAIT_S)
    assert (coord.sent, _committed(env, 1)) == (sent, {TP0: 10})
