"""Review 71: ``wakeup()`` during ``unsubscribe()``'s final commit of a carried generation.

That commit, refused ILLEGAL_GENERATION because the member's background join completed the
next generation first, waits for that join to sync (``Consumer._commit_carried``), up to the
rebalance timeout. ``close(timeout)`` bounds the wait and close()'s give-up ends it, but
``unsubscribe()`` has neither, and ``wakeup()`` did not end it. Kafka's ``unsubscribe()``
blocks only in its revocation callback (``onLeavePrepare``; its LeaveGroup is sent with
``pollNoWakeup``), whose ``commitSync`` a ``wakeup()`` interrupts with a WakeupException that
``unsubscribe()`` raises. Here the wakeup ends the commit's wait and retries, the member
still leaves (revoking, its group closed), and ``unsubscribe()`` then raises ``WakeupError``:
nothing is left half-left, and the next owner reads from the last commit that landed."""

from __future__ import annotations

from typing import Any

from harness import InThread, wait_until
from test_consumer import Recorder, env  # noqa: F401 - env: the fixture
from test_consumer_review70 import _JoinGated, leaving_while_syncing, rejoining
from test_review69_consumer_wait import _Held
from test_review69_subscription_wait import T0, U0, _both_at_10, _committed_of

from rcoord.client.errors import WakeupError
from rcoord.errors import ConnectionLost
from rcoord.keys import GroupKeys


def _members(environment: Any) -> set[str]:
    """Group g's member ids, as Redis holds them."""
    key = GroupKeys.of(environment.namespace, environment.coord.config.num_partitions,
                       "g").members
    return {m.decode() if isinstance(m, bytes) else m for m in environment.client.hkeys(key)}


def test_wakeup_ends_unsubscribes_wait_for_the_members_join_and_the_member_leaves(
        env: Any) -> None:  # noqa: F811 - the fixture
    """The member's SyncGroup of generation 2 is held (rebalance timeout 60 s), and
    unsubscribe()'s commit under generation 1 is refused: it waits for that join. wakeup()
    left it waiting, and unsubscribe() with it, until the join completed (60 s at most). Now
    the commit ends at once, nothing committed under generation 2; the partitions are
    revoked, the member leaves the group (only the second member is left in it, which reads
    t-0 and u-0 from the last landed commit: none), and unsubscribe() raises WakeupError."""
    listener = Recorder()
    held = _Held()
    with rejoining(env, listener, held, "syncs") as (consumer, coord, _, threads):
        group = consumer._group
        assert group is not None
        member = group.member_id
        leaving = leaving_while_syncing(env, consumer, coord, threads, consumer.unsubscribe)
        held.release()
        wait_until(lambda: len(coord.commits) == 1)
        assert coord.commits[0][0] == 1 and coord.commits[0][1][1] == 2  # refused: waits
        consumer.wakeup()
        wait_until(lambda: consumer._committer.pending == 0)  # (the SyncGroup still held)
        coord.syncs.set()  # (the group's thread, parked in it, ends once the member left)
        wait_until(lambda: bool(leaving.outcome))
        assert isinstance(leaving.outcome[0], WakeupError)
        assert [gen for gen, _, _ in coord.commits] == [1]
        assert listener.events[-1] == ("revoked", [T0, U0])
        assert consumer._group is None and consumer.assignment() == []
        assert member not in _members(env) and len(_members(env)) == 1
        # (the wakeup was used up: committed() does not raise it again)
        assert consumer.committed([T0, U0]) == {T0: -1, U0: -1}


class _Unreachable(_JoinGated):
    """``_JoinGated``, whose commits, once let through, find Redis unreachable (counted)."""

    tries = 0

    def commit_offsets(self, *args: Any, **kw: Any) -> Any:
        assert self.gate.acquire(timeout=60)
        self.tries += 1
        raise ConnectionLost("Redis unreachable (the test's)")


def test_wakeup_ends_unsubscribes_final_commit_retrying_against_an_unreachable_redis(
        env: Any) -> None:  # noqa: F811 - the fixture
    """unsubscribe()'s final commit finds Redis unreachable and retries, for a session
    timeout (30 s): wakeup() left unsubscribe() waiting for those retries. Now they end at
    their next pause, the commit is given up, the member still leaves (its LeaveGroup is not
    a commit), and unsubscribe() raises WakeupError."""
    listener = Recorder()
    held = _Held()
    with rejoining(env, listener, held, "syncs", coordinator=_Unreachable) as (
            consumer, coord, _, threads):
        assert isinstance(coord, _Unreachable)
        member = consumer.member_id
        wait_until(coord.sync_held.is_set)
        assert consumer.poll(timeout=0) == []
        held.release()
        leaving = InThread(consumer.unsubscribe)
        threads.append(leaving.thread)
        wait_until(lambda: coord.tries >= 2)  # (retrying)
        consumer.wakeup()
        wait_until(lambda: consumer._committer.pending == 0)  # (the SyncGroup still held)
        coord.syncs.set()
        wait_until(lambda: bool(leaving.outcome))
        assert isinstance(leaving.outcome[0], WakeupError)
        assert listener.events[-1] == ("revoked", [T0, U0])
        assert member not in _members(env) and len(_members(env)) == 1
        assert _committed_of(env, T0, U0) == {T0: -1, U0: -1}


def test_unsubscribe_without_a_wakeup_still_waits_for_the_members_join(
        env: Any) -> None:  # noqa: F811 - the fixture
    """The same, no wakeup(): the commit waits for the join, is made under generation 2 and
    unsubscribe() returns, both partitions at 10 (the wait is bounded by the rebalance
    timeout, as Kafka's onJoinPrepare bounds its commit)."""
    listener = Recorder()
    held = _Held()
    with rejoining(env, listener, held, "syncs") as (consumer, coord, _, threads):
        leaving = leaving_while_syncing(env, consumer, coord, threads, consumer.unsubscribe)
        held.release()
        wait_until(lambda: len(coord.commits) == 1)
        assert not leaving.outcome
        coord.syncs.set()
        wait_until(lambda: bool(leaving.outcome))
        assert leaving.outcome == [None]
        assert [gen for gen, _, _ in coord.commits] == [1, 2]
        assert _committed_of(env, T0, U0) == {T0: 10, U0: 10}


def test_a_wakeup_pending_at_unsubscribe_is_raised_after_the_final_commit_and_the_leave(
        env: Any) -> None:  # noqa: F811 - the fixture
    """wakeup() before unsubscribe(), the group stable: the final commit is a blocking call,
    so, as Kafka's commitSync in onPartitionsRevoked, it takes the pending wakeup. It is
    still made (once, not retried) and lands, the member leaves, and then unsubscribe()
    raises WakeupError, once."""
    coord = _JoinGated(env)
    listener = Recorder()
    consumer = _both_at_10(env, coord, listener)
    coord.open()
    member = consumer.member_id
    consumer.wakeup()
    try:
        consumer.unsubscribe()
    except WakeupError:
        pass
    else:
        raise AssertionError("unsubscribe() did not raise the pending wakeup")
    assert [gen for gen, _, _ in coord.commits] == [1]
    assert _committed_of(env, T0, U0) == {T0: 10, U0: 10}
    assert listener.events[-1] == ("revoked", [T0, U0])
    assert member not in _members(env)
    assert consumer.committed([T0]) == {T0: 10}  # (used up)
