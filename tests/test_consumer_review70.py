"""Review 70: the commit of a changed subscription's revocation after the generation ended
(``Consumer._revoke_unsubscribed``), which a cooperative member makes while its group thread
is already rejoining with the old subscription.

The member's JoinGroup is held here (``_JoinGated``), so the group stays in PreparingRebalance
with generation 1 while poll() revokes t-0: its commit goes under generation 1, the newest the
member joined. Sent then, it is accepted, as Kafka accepts a commit of the current generation
during PreparingRebalance. Held until the member's join completed generation 2, it is refused
ILLEGAL_GENERATION, as Kafka refuses it too; but the member still owns t-0 in generation 2 (it
was carried through the join, and the change that gives it up waits for this commit), so the
consumer commits it again there rather than leave t-0 uncommitted for its next owner; refused
while that join is still under way (SyncGroup not returned), it waits for the join first."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

from harness import InThread, wait_until
from test_consumer import Recorder, env  # noqa: F401 - env: the fixture
from test_consumer_review67 import _Gated
from test_consumer_review68 import _Joiner
from test_review69_consumer_wait import _Held
from test_review69_subscription_wait import T0, U0, _both_at_10, _committed_of

from rcoord.errors import Errors
from rcoord.keys import GroupKeys


class _JoinGated(_Gated):
    """``_Gated``, whose JoinGroups also wait while ``joins`` is clear, and SyncGroups while
    ``syncs`` is (a minute at most),
    and which notes each commit as it reaches Redis: (its generation, the group's state and
    generation then, its answer or the error it raised)."""

    def __init__(self, env: Any) -> None:  # noqa: F811 - the fixture object
        super().__init__(env)
        self.env = env
        self.joins = threading.Event()
        self.joins.set()
        self.join_held = threading.Event()
        self.syncs = threading.Event()
        self.syncs.set()
        self.sync_held = threading.Event()
        self.commits: list[tuple[int, tuple[str, int], object]] = []

    def join_group(self, *args: Any, **kw: Any) -> Any:
        if not self.joins.is_set():
            self.join_held.set()
            assert self.joins.wait(60)
        return super().join_group(*args, **kw)

    def sync_group(self, *args: Any, **kw: Any) -> Any:
        if not self.syncs.is_set():
            self.sync_held.set()
            assert self.syncs.wait(60)
        return super().sync_group(*args, **kw)

    def commit_offsets(self, group_id: str, offsets: Any, *args: Any, **kw: Any) -> Any:
        assert self.gate.acquire(timeout=60)
        then = _group_state(self.env)
        try:
            answer = super(_Gated, self).commit_offsets(group_id, offsets, *args, **kw)
        except Exception as exc:
            self.commits.append((kw["generation_id"], then, exc))
            raise
        self.commits.append((kw["generation_id"], then, set(answer.values())))
        return answer


def _group_state(environment: Any) -> tuple[str, int]:
    """Group g's state and generation, as Redis holds them."""
    key = GroupKeys.of(environment.namespace, environment.coord.config.num_partitions, "g").group
    state, gen = environment.client.hmget(key, "state", "gen")
    return (state.decode() if isinstance(state, bytes) else state), int(gen)


@contextlib.contextmanager
def rejoining(env: Any, listener: Any, gate: Any, hold: str | None = None,  # noqa: F811
              coordinator: type[_JoinGated] = _JoinGated, **settings: Any
              ) -> Iterator[tuple[Any, _JoinGated, list[_Joiner], list[threading.Thread]]]:
    """Cooperative, t-0 and u-0 at 10 (``_both_at_10``; sessions of 30 s and rebalances of
    60 s unless ``settings`` say otherwise: the group's join waits for a held member that
    long), nothing committed. The consumer's commits go through ``gate`` (``_Held``, a
    turnstile), its JoinGroups or SyncGroups are held if ``hold`` names them ("joins",
    "syncs"), and a second member joins, ending generation 1. Yields the consumer, its
    coordinator, the members that joined (a test may add more) and a list for the threads
    the test starts; at the end the gate and the holds open, the members stop and the
    threads are joined (a rebalance timeout each at most)."""
    settings = {"session_timeout_ms": 30_000, "rebalance_timeout_ms": 60_000, **settings}
    coord = coordinator(env)
    consumer = _both_at_10(env, coord, listener, **settings)
    coord.gate = gate  # type: ignore[assignment]
    if hold is not None:
        getattr(coord, hold).clear()
    joiners = [_Joiner(env, assignors=["cooperative-sticky"])]
    threads: list[threading.Thread] = []
    try:
        yield consumer, coord, joiners, threads
    finally:
        gate.release(10)
        coord.joins.set()
        coord.syncs.set()
        for joiner in joiners:
            joiner.stop()
        for thread in threads:
            thread.join(settings["rebalance_timeout_ms"] / 1000)


@contextlib.contextmanager
def _revoked_while_rejoining(
        env: Any) -> Iterator[tuple[Any, _JoinGated, _Held, _Joiner]]:  # noqa: F811
    """``rejoining``, the member's JoinGroup held (the group PreparingRebalance); then
    subscribe(["u"]), and a poll() that revokes t-0 and queues its commit, which Redis holds
    (``_Held``): the consumer, its coordinator, the commit's hold and the second member."""
    listener = Recorder()
    held = _Held()
    with rejoining(env, listener, held, "joins") as (consumer, coord, joiners, _):
        wait_until(coord.join_held.is_set)
        assert _group_state(env) == ("PreparingRebalance", 1)
        consumer.subscribe(["u"])
        assert consumer.poll(timeout=0.5) == []
        assert listener.events == [("assigned", [T0, U0]),
                                   ("revoked", [T0])]
        yield consumer, coord, held, joiners[0]


def leaving_while_syncing(env: Any, consumer: Any, coord: _JoinGated,  # noqa: F811
                          threads: list[Any], leave: Callable[[], Any]) -> InThread:
    """In ``rejoining(..., "syncs")``: once the member's SyncGroup of generation 2 is held and
    the records handed out count as processed, ``leave`` (close() or unsubscribe()) in a
    thread, returned once its final commit is queued on the committer."""
    wait_until(coord.sync_held.is_set)
    wait_until(lambda: _group_state(env)[1] == 2)
    assert consumer.poll(timeout=0) == []
    leaving = InThread(leave)
    threads.append(leaving.thread)
    wait_until(lambda: consumer._committer.pending == 1)
    return leaving


def arrives_in_the_next_join(env: Any, coord: _JoinGated, held: _Held) -> None:  # noqa: F811
    """The member's JoinGroup let through, its SyncGroup held: once the group is in generation
    2, the held commit (queued under generation 1) is let through and answered."""
    coord.syncs.clear()
    coord.joins.set()
    wait_until(coord.sync_held.is_set)
    wait_until(lambda: _group_state(env)[1] == 2)
    held.release()
    wait_until(lambda: len(coord.commits) == 1)


def test_a_revocations_commit_sent_while_the_group_prepares_the_rebalance_is_accepted(
        env: Any) -> None:  # noqa: F811 - the fixture
    """The commit goes under generation 1 while the group, PreparingRebalance, is still in
    it: accepted (Kafka's validateOffsetCommit), t-0 committed at 10 before the member
    rejoins with the new subscription."""
    with _revoked_while_rejoining(env) as (consumer, coord, held, _):
        held.release()
        wait_until(lambda: len(coord.commits) == 1)
        assert coord.commits == [(1, ("PreparingRebalance", 1), {Errors.NONE})]
        assert _committed_of(env, T0) == {T0: 10}
        coord.joins.set()
        wait_until(lambda: consumer._resubscribe is None,
                   step=lambda: consumer.poll(timeout=0.05))
        assert set(consumer._group._config.topics) == {"u"}


def test_a_revocations_commit_refused_once_the_member_joined_the_next_generation_is_made_there(
        env: Any) -> None:  # noqa: F811 - the fixture
    """The commit under generation 1 is held until the member's join completed generation 2
    (Stable): refused ILLEGAL_GENERATION, as in Kafka. It was dropped (logged), t-0 left
    uncommitted (-1) for the second member, which read its ten records again; the member
    owns t-0 in generation 2 until the change's rejoin, which waits for this commit, so the
    consumer commits it again under generation 2: 10."""
    with _revoked_while_rejoining(env) as (consumer, coord, held, _):
        group = consumer._group
        coord.joins.set()
        wait_until(lambda: _group_state(env) == ("Stable", 2)
                   and group.newest() is not None and group.newest().generation_id == 2)
        held.release()
        wait_until(lambda: consumer._committer.pending == 0)
        assert _committed_of(env, T0) == {T0: 10}
        assert [(gen, then) for gen, then, _ in coord.commits] == [
            (1, ("Stable", 2)), (2, ("Stable", 2))]
        assert coord.commits[-1][2] == {Errors.NONE}
        wait_until(lambda: consumer._resubscribe is None,
                   step=lambda: consumer.poll(timeout=0.05))
        assert set(consumer._group._config.topics) == {"u"}


def test_a_revocations_commit_refused_while_the_members_join_completes_waits_for_it(
        env: Any) -> None:  # noqa: F811 - the fixture
    """The commit under generation 1 arrives once the member has joined generation 2 but
    before its SyncGroup returned (held): refused ILLEGAL_GENERATION with no newer generation
    to commit under yet. It waits for the member's join to complete (Kafka's onJoinPrepare
    would have committed before its JoinGroup), then commits under generation 2: t-0 at 10,
    where it was dropped (-1)."""
    with _revoked_while_rejoining(env) as (consumer, coord, held, _):
        group = consumer._group
        arrives_in_the_next_join(env, coord, held)
        assert coord.commits[0][0] == 1 and coord.commits[0][1][1] == 2
        assert group.newest().generation_id == 1
        coord.syncs.set()
        wait_until(lambda: consumer._committer.pending == 0)
        assert _committed_of(env, T0) == {T0: 10}
        assert [(gen, then) for gen, then, _ in coord.commits] == [
            (1, coord.commits[0][1]), (2, ("Stable", 2))]
