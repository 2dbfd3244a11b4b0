"""Review 70b: the auto-commits of revoked partitions other than a changed subscription's
(``Consumer._commit_carried``, review 70), made while the member's group thread rejoins in the
background, when the next generation's join completes before the commit arrives.

A cooperative rebalance's revocation (``_transition``) commits under the generation it moves
to, whose hold keeps the member from rejoining until that commit has landed: however long the
commit is held, and whatever ends that generation meanwhile, it is accepted there. close()'s
final commit has no such hold (the generation was taken in hand, so its routine let the
member rejoin at once): refused because the member's join went on meanwhile, it was dropped,
the partitions left uncommitted for their next owners; so was unsubscribe()'s, and the commit
of the kept partitions by a close() or unsubscribe() from a revocation callback. They now wait
for that join (within close()'s bound) and are made under the new generation. The
application's own commit() is not: refused, it raises, as Kafka's commitSync does."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from harness import InThread, wait_until
from test_consumer import Recorder, env  # noqa: F401 - env: the fixture
from test_consumer_review68 import _Joiner
from test_consumer_review70 import _group_state, leaving_while_syncing, rejoining
from test_review69_consumer_wait import _Held
from test_review69_subscription_wait import T0, U0, _committed_of

from rcoord.client.errors import IllegalStateError
from rcoord.errors import Errors, RebalanceInProgressError


def test_a_cooperative_revocations_commit_held_past_its_generations_end_lands_there(
        env: Any) -> None:  # noqa: F811 - the fixture
    """A second member joins: generation 2 moves one partition away (``_transition``), whose
    commit under generation 2 Redis holds. A third member then ends generation 2. The hold
    on generation 2 keeps the member from rejoining while the commit is held (its routines
    have not returned, it sends no JoinGroup), so the commit, let through, is made while the
    group still prepares the rebalance in generation 2, and accepted."""
    listener = Recorder()
    held = _Held()
    with rejoining(env, listener, held) as (consumer, coord, joiners, _):
        group = consumer._group
        wait_until(lambda: "revoked" in listener.kinds(),
                   step=lambda: consumer.poll(timeout=0.05))
        (revoked,) = next(parts for kind, parts in listener.events if kind == "revoked")
        gen2 = consumer.generation
        assert gen2 is not None and gen2.generation_id == 2
        assert consumer._committer.pending == 1  # the revoked partition's commit, held
        joiners.append(_Joiner(env, assignors=["cooperative-sticky"]))
        wait_until(lambda: gen2.done.is_set()
                   and _group_state(env) == ("PreparingRebalance", 2))
        assert consumer.poll(timeout=0) == []
        # (the group thread waits in collecting generation 2: no JoinGroup sent)
        assert not gen2.wait_routines(0) and group.newest() is gen2
        held.release()
        wait_until(lambda: consumer._committer.pending == 0,
                   step=lambda: consumer.poll(timeout=0.05))
        assert coord.commits == [(2, ("PreparingRebalance", 2), {Errors.NONE})]
        assert _committed_of(env, revoked) == {revoked: 10}


@pytest.mark.parametrize("leave", ["close", "unsubscribe"])
def test_a_final_commit_refused_while_the_members_join_completes_waits_for_it(
        env: Any, leave: str) -> None:  # noqa: F811 - the fixture
    """A second member ends generation 1; the member, carrying t-0 and u-0, rejoins in the
    background and its SyncGroup is held. close() (or unsubscribe()) commits under generation
    1 (the newest the member completed), which arrives after the JoinGroup completed
    generation 2: refused ILLEGAL_GENERATION, and it was dropped, both partitions left
    uncommitted (-1) for the second member. The member still owns them until it leaves
    generation 2, so the commit waits for that join and is made there: both at 10."""
    listener = Recorder()
    held = _Held()
    with rejoining(env, listener, held, "syncs") as (consumer, coord, _, threads):
        group = consumer._group
        closing = leaving_while_syncing(
            env, consumer, coord, threads,
            lambda: consumer.close(timeout=30) if leave == "close" else consumer.unsubscribe())
        assert group.newest().generation_id == 1
        held.release()
        wait_until(lambda: len(coord.commits) == 1)
        assert coord.commits[0][0] == 1 and coord.commits[0][1][1] == 2
        coord.syncs.set()
        wait_until(lambda: bool(closing.outcome))
        assert closing.outcome == [None]
        assert [gen for gen, _, _ in coord.commits] == [1, 2]
        assert coord.commits[-1][2] == {Errors.NONE}
        assert _committed_of(env, T0, U0) == {T0: 10, U0: 10}


class _LeavingListener(Recorder):
    """``Recorder``, which calls ``leave`` from ``on_partitions_revoked``."""

    leave: Any = None

    def on_partitions_revoked(self, partitions: list[Any]) -> None:
        super().on_partitions_revoked(partitions)
        self.leave()


class _Turnstile:
    """A gate for ``_Gated`` that lets a commit through per ``release()`` (waiting a minute at
    most), counting the commits that reached it."""

    def __init__(self) -> None:
        self.permits = threading.Semaphore(0)
        self.arrived = 0

    def acquire(self, timeout: float | None = None) -> bool:
        self.arrived += 1
        return self.permits.acquire(timeout=60)

    def release(self, n: int = 1) -> None:
        self.permits.release(n)


@pytest.mark.parametrize("leave", ["close", "unsubscribe"])
def test_leaving_inside_a_changed_subscriptions_revocation_commits_the_kept_partitions_there(
        env: Any, leave: str) -> None:  # noqa: F811 - the fixture
    """Generation 1 ended by a second member, the member rejoining (its JoinGroup held);
    subscribe(["u"]) and poll() revoke t-0 (committed at once, under generation 1), and the
    listener closes the consumer (or unsubscribes): that commits u-0, which it keeps, under
    generation 1 too. Held until the member's JoinGroup completed generation 2 (its SyncGroup
    held), it was refused ILLEGAL_GENERATION and dropped, u-0 left uncommitted (-1) for the
    second member; it now waits for that join and is made under generation 2."""
    listener = _LeavingListener()
    gate = _Turnstile()
    with rejoining(env, listener, gate, "joins") as (consumer, coord, _, threads):
        listener.leave = (lambda: consumer.close(timeout=30)) if leave == "close" else (
            consumer.unsubscribe)
        wait_until(coord.join_held.is_set)
        assert _group_state(env) == ("PreparingRebalance", 1)
        consumer.subscribe(["u"])
        polled = InThread(lambda: consumer.poll(timeout=0.5))
        threads.append(polled.thread)
        wait_until(lambda: gate.arrived == 1)
        gate.release()
        wait_until(lambda: gate.arrived == 2)  # u-0's commit, held
        assert coord.commits == [(1, ("PreparingRebalance", 1), {Errors.NONE})]
        coord.syncs.clear()
        coord.joins.set()
        wait_until(coord.sync_held.is_set)
        wait_until(lambda: _group_state(env)[1] == 2)
        gate.release(2)
        wait_until(lambda: len(coord.commits) == 2)
        assert coord.commits[1][0] == 1 and coord.commits[1][1][1] == 2
        coord.syncs.set()
        wait_until(lambda: bool(polled.outcome))
        if leave == "close":
            assert polled.outcome == [[]]
        else:  # (as Kafka's poll() once unsubscribed)
            assert [type(o) for o in polled.outcome] == [IllegalStateError]
        assert [gen for gen, _, _ in coord.commits] == [1, 1, 2]
        assert coord.commits[-1][2] == {Errors.NONE}
        assert _committed_of(env, T0, U0) == {T0: 10, U0: 10}


def test_a_final_commit_waiting_for_the_members_join_ends_with_closes_timeout(
        env: Any) -> None:  # noqa: F811 - the fixture
    """As above, but the member's SyncGroup stays held: close(timeout=2)'s commit, refused
    under generation 1, waits for a join that does not complete within the rebalance timeout
    (60 s). close() returns by its own bound, and the wait on the committer thread ends with
    close()'s give-up at that bound (``stop_retrying``), nothing committed (the partitions go
    to the second member at -1, as when a close() times out before its commit lands). What
    each mechanism does alone: test_consumer_review72b."""
    listener = Recorder()
    held = _Held()
    with rejoining(env, listener, held, "syncs") as (consumer, coord, _, threads):
        closing = leaving_while_syncing(env, consumer, coord, threads,
                                        lambda: consumer.close(timeout=2))
        held.release()
        wait_until(lambda: bool(closing.outcome))  # (well within the rebalance timeout)
        assert closing.outcome == [None]
        assert not coord.syncs.is_set()  # the join never completed
        wait_until(lambda: consumer._committer.pending == 0)
        assert [gen for gen, _, _ in coord.commits] == [1]
        assert _committed_of(env, T0, U0) == {T0: -1, U0: -1}


class _CommittingListener(Recorder):
    """``Recorder``, whose ``on_partitions_revoked`` calls ``commit()`` and notes what it
    raised (None if nothing)."""

    app: Any = None

    def __init__(self) -> None:
        super().__init__()
        self.raised: list[BaseException | None] = []

    def on_partitions_revoked(self, partitions: list[Any]) -> None:
        super().on_partitions_revoked(partitions)
        try:
            self.app.commit()
        except RebalanceInProgressError as exc:
            self.raised.append(exc)
        else:
            self.raised.append(None)


def test_the_applications_commit_in_the_revocation_callback_is_not_made_again(
        env: Any) -> None:  # noqa: F811 - the fixture
    """As above, but the listener calls commit(): reckoned under generation 1 and held until
    the member's JoinGroup completed generation 2, it is refused and raises
    ``RebalanceInProgressError``, as Kafka's commitSync in onPartitionsRevoked does once the
    generation moved on; it is not made again under generation 2 (``_commit_carried`` is
    for the consumer's own commits of partitions it gives up)."""
    listener = _CommittingListener()
    gate = _Turnstile()
    with rejoining(env, listener, gate, "joins") as (consumer, coord, _, threads):
        listener.app = consumer
        wait_until(coord.join_held.is_set)
        consumer.subscribe(["u"])
        polled = InThread(lambda: consumer.poll(timeout=0.5))
        threads.append(polled.thread)
        wait_until(lambda: gate.arrived == 1)
        gate.release()  # t-0's auto-commit, under generation 1 (PreparingRebalance)
        wait_until(lambda: gate.arrived == 2)  # the listener's commit(), held
        coord.syncs.clear()
        coord.joins.set()
        wait_until(coord.sync_held.is_set)
        wait_until(lambda: _group_state(env)[1] == 2)
        gate.release(10)
        wait_until(lambda: bool(listener.raised))
        coord.syncs.set()
        wait_until(lambda: bool(polled.outcome))
        wait_until(lambda: consumer._committer.pending == 0)
        assert [type(e) for e in listener.raised] == [RebalanceInProgressError]
        assert [gen for gen, _, _ in coord.commits] == [1, 1]
        assert coord.commits[0][2] == {Errors.NONE}
