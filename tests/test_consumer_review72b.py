"""Review 72b: what ends close()'s final commit while it waits for the member's join
(``Consumer._commit_carried``, ``ConsumerGroup.newest_after``), its SyncGroup held, and what
bounds close() meanwhile: test_consumer_review70b's last test passed whichever of these
mechanisms was taken away, each ending the wait when another did not.

- close()'s give-up (``_give_up_waiting``: ``stop_retrying`` sets ``_finished``) ends the wait
  before the group closes, so the listener, called after the final commit, is not held
  behind it;
- close(timeout) waits for its final commit only until its bound, Redis holding it or not;
- close() with no timeout gives up one session timeout on (its timer), not at the end of the
  rebalance timeout the wait would otherwise last;
- the group's own close ends the wait (``_closing``), with the member's SyncGroup still held.
  Through ``Consumer.close`` the give-up always comes first (and the run thread's exit sets
  ``_finished`` before it notifies), so this is seen on the group itself."""

from __future__ import annotations

from typing import Any

from harness import InThread, wait_until
from test_consumer import Recorder, env  # noqa: F401 - env: the fixture
from test_consumer_review70 import _group_state, leaving_while_syncing, rejoining
from test_consumer_review70b import _CommittingListener
from test_review69_consumer_wait import _Held
from test_review69_subscription_wait import T0, U0, _committed_of
from test_review70b_consumer import _SyncParked

from rcoord.errors import Errors, RebalanceInProgressError

CLOSE_S = 5  # close()'s bound: the held commit is let through well before it passes


def test_the_listeners_commit_in_close_is_not_held_behind_the_final_commits_wait(
        env: Any) -> None:  # noqa: F811 - the fixture
    """close(timeout=5)'s final commit, refused under generation 1, waits for the member's
    join (its SyncGroup held; rebalance timeout 60 s). At close()'s bound the give-up ends
    that wait, and the revocation's listener, called next, commits: its commit() goes
    through the committer, behind the final commit, and is refused (generation 1), as
    Kafka's commitSync in onPartitionsRevoked once the generation moved on. Had only the
    group's close (after the listener) ended the wait, commit() would wait behind it for the
    rest of the rebalance timeout, and close() with it."""
    listener = _CommittingListener()
    held = _Held()
    with rejoining(env, listener, held, "syncs") as (consumer, coord, _, threads):
        listener.app = consumer
        closing = leaving_while_syncing(env, consumer, coord, threads,
                                        lambda: consumer.close(timeout=CLOSE_S))
        held.release()
        wait_until(lambda: bool(closing.outcome))  # (well within the rebalance timeout)
        assert closing.outcome == [None]
        assert not coord.syncs.is_set()  # the join never completed
        assert [type(e) for e in listener.raised] == [RebalanceInProgressError]
        assert [gen for gen, _, _ in coord.commits] == [1, 1]
        assert all(Errors.ILLEGAL_GENERATION in answer for _, _, answer in coord.commits)
        assert _committed_of(env, T0, U0) == {T0: -1, U0: -1}


def test_close_returns_by_its_bound_while_redis_holds_its_final_commit(
        env: Any) -> None:  # noqa: F811 - the fixture
    """The member's SyncGroup held, close(timeout=5)'s final commit is held in Redis and not
    let through until close() returned: close() stops waiting for it at its bound (the
    give-up stops retries, not a call Redis holds), the commit still in flight. Let through
    then, it is refused under generation 1 and does not wait for the join: close() gave up."""
    listener = Recorder()
    held = _Held()
    with rejoining(env, listener, held, "syncs") as (consumer, coord, _, threads):
        closing = leaving_while_syncing(env, consumer, coord, threads,
                                        lambda: consumer.close(timeout=CLOSE_S))
        wait_until(lambda: bool(closing.outcome))  # (the commit is held for a minute)
        assert closing.outcome == [None]
        assert consumer._committer.pending == 1 and coord.commits == []
        held.release()
        wait_until(lambda: consumer._committer.pending == 0)
        assert [gen for gen, _, _ in coord.commits] == [1]
        assert _committed_of(env, T0, U0) == {T0: -1, U0: -1}


SESSION_MS = 10_000
REBALANCE_MS = 120_000


def test_close_without_a_timeout_gives_up_the_final_commits_wait_after_a_session_timeout(
        env: Any) -> None:  # noqa: F811 - the fixture
    """Session timeout 10 s, rebalance timeout 120 s. close() (no timeout): its final commit,
    refused under generation 1, waits for the member's join (its SyncGroup parked until the
    group closes). close()'s timer gives up one session timeout on, which ends the wait, and
    close() returns then and seconds more, not at the end of the rebalance timeout."""
    listener = Recorder()
    held = _Held()
    with rejoining(env, listener, held, "syncs", coordinator=_SyncParked,
                   session_timeout_ms=SESSION_MS, heartbeat_interval_ms=1_000,
                   rebalance_timeout_ms=REBALANCE_MS) as (consumer, coord, _, threads):
        assert isinstance(coord, _SyncParked)
        coord.group = consumer._group
        closing = leaving_while_syncing(env, consumer, coord, threads, consumer.close)
        held.release()
        wait_until(lambda: bool(closing.outcome), timeout_s=SESSION_MS / 1000 + 30,
                   why=lambda: f"close() still waiting; {consumer._committer.pending} commit(s) "
                               "pending")
        assert closing.outcome == [None]
        assert [gen for gen, _, _ in coord.commits] == [1]
        assert _committed_of(env, T0, U0) == {T0: -1, U0: -1}


def test_a_wait_for_the_members_join_ends_when_the_group_closes(
        env: Any) -> None:  # noqa: F811 - the fixture
    """The member's SyncGroup of generation 2 held, a commit of generation 1 waits for that
    join (``newest_after``, up to 600 s). The group's close(timeout=60) ends the wait (None:
    no generation to commit under), while it still waits for the run thread, parked in that
    SyncGroup: the wait ends with the close, not with close()'s bound or the thread's exit."""
    listener = Recorder()
    held = _Held()
    with rejoining(env, listener, held, "syncs") as (consumer, coord, _, threads):
        group = consumer._group
        wait_until(coord.sync_held.is_set)
        wait_until(lambda: _group_state(env)[1] == 2)
        gen1 = group.newest()
        assert gen1 is not None and gen1.generation_id == 1
        # No generation is current: close() waits for no routines, so nothing sets
        # ``_finished`` before its 60 s bound or the run thread's exit (held in the SyncGroup).
        # Only ``_closing`` can end the wait, whether or not setting ``_finished`` notifies.
        assert group._current is None
        waiting = InThread(lambda: group.newest_after(gen1, 600))
        threads.append(waiting.thread)
        closing = InThread(lambda: group.close(timeout=60))
        threads.append(closing.thread)
        wait_until(lambda: bool(waiting.outcome))
        assert waiting.outcome == [None]
        assert not coord.syncs.is_set() and not group._exited.is_set()
        assert not group._finished.is_set() and group._member_id == gen1.member_id
