"""Review 72: ``unsubscribe()``'s final commit of a carried generation (``Consumer._commit_carried``).

Refused ILLEGAL_GENERATION because the member's background join completed the next generation
first, that commit waits for the member's join to sync and is made again under the generation
it joined. The member owns the carried partitions there only if that join did not lose them:
a SyncGroup failing with a "lost" reaction that keeps the member id (ILLEGAL_GENERATION, a
connection lost for its retries) marks the carried generation lost, and the member rejoins
with nothing owned under the same id. Kafka commits nothing of lost partitions
(``onPartitionsLost``)."""

from __future__ import annotations

from typing import Any

import pytest
from harness import InThread, wait_until
from test_consumer import Recorder, env  # noqa: F401 - env: the fixture
from test_consumer_review70 import _JoinGated, leaving_while_syncing, rejoining
from test_consumer_review71 import _members
from test_review69_consumer_wait import _Held
from test_review69_subscription_wait import T0, U0, _both_at_10, _committed_of

from rcoord.client.errors import WakeupError
from rcoord.errors import ConnectionLost, Errors, ProtocolError


class _SyncRefused(_JoinGated):
    """``_JoinGated``, whose first SyncGroup let through after a hold is answered
    ILLEGAL_GENERATION (the group went on without this member's join), as the coordinator
    answers one that arrives after the group moved on."""

    refuse = True

    def sync_group(self, *args: Any, **kw: Any) -> Any:
        held = not self.syncs.is_set()
        answer = super().sync_group(*args, **kw)
        if held and self.refuse:
            self.refuse = False
            raise ProtocolError.of(Errors.ILLEGAL_GENERATION, "SyncGroup refused (the test's)")
        return answer


def test_unsubscribes_final_commit_is_not_made_again_once_the_members_join_lost_the_partitions(
        env: Any, caplog: pytest.LogCaptureFixture) -> None:  # noqa: F811 - the fixture
    """unsubscribe()'s commit under generation 1 is refused (the member's JoinGroup completed
    generation 2, its SyncGroup held) and waits for that join. The SyncGroup is then refused
    ILLEGAL_GENERATION: generation 1's carried partitions are lost, and the member rejoins
    under the same id with nothing owned, completing generation 3. The commit was made again
    there, t-0 and u-0 committed at 10 by a member that no longer owned them; now it fails
    (logged), nothing more is committed, and the partitions are reported lost."""
    listener = Recorder()
    held = _Held()
    with rejoining(env, listener, held, "syncs", coordinator=_SyncRefused) as (
            consumer, coord, _, threads):
        leaving = leaving_while_syncing(env, consumer, coord, threads, consumer.unsubscribe)
        held.release()
        wait_until(lambda: len(coord.commits) == 1)
        assert coord.commits[0][0] == 1 and coord.commits[0][1][1] == 2  # refused: waits
        coord.syncs.set()
        wait_until(lambda: bool(leaving.outcome))
        assert leaving.outcome == [None]
        assert [gen for gen, _, _ in coord.commits] == [1]
        assert _committed_of(env, T0, U0) == {T0: -1, U0: -1}
        assert listener.events[-1] == ("lost", [T0, U0])
        assert "the member's rejoin lost the partitions" in caplog.text


class _GoesAway(_JoinGated):
    """``_JoinGated``, whose commits find Redis unreachable once ``away`` is set (counted):
    each is retried, for a session timeout, unless the group stops retrying."""

    away = False
    tries = 0

    def commit_offsets(self, *args: Any, **kw: Any) -> Any:
        if not self.away:
            return super().commit_offsets(*args, **kw)
        self.tries += 1
        raise ConnectionLost("Redis unreachable (the test's)")


class _CommitsAsyncOnRevoke(Recorder):
    """A ``Recorder`` whose ``on_partitions_revoked`` commits t-0 at 10 with ``commit_async``,
    noting the callback's outcome in ``outcomes``."""

    def __init__(self) -> None:
        super().__init__()
        self.committing: Any = None
        self.outcomes: list[tuple[dict[Any, int], BaseException | None]] = []

    def on_partitions_revoked(self, partitions: list[Any]) -> None:
        super().on_partitions_revoked(partitions)
        self.committing.commit_async({T0: 10}, lambda offsets, exc: self.outcomes.append(
            (offsets, exc)))


def test_wakeup_ends_unsubscribes_wait_for_a_listeners_async_commit_and_the_member_leaves(
        env: Any) -> None:  # noqa: F811 - the fixture
    """No auto-commit; the listener's ``on_partitions_revoked`` calls commit_async(), which
    finds Redis unreachable and retries, for a session timeout (30 s): unsubscribe() waits for
    it after the listener (``Consumer._revoke``) so that it lands before the member leaves.
    wakeup() ends those retries at their next pause: the commit is given up, the member still
    leaves (its LeaveGroup is not a commit), unsubscribe() raises WakeupError, and the
    commit's callback gets its failure (at close(), as Kafka runs the callbacks of finished
    async commits there); nothing is committed."""
    coord = _GoesAway(env)
    listener = _CommitsAsyncOnRevoke()
    consumer = _both_at_10(env, coord, listener, enable_auto_commit=False,
                           session_timeout_ms=30_000)
    listener.committing = consumer
    member = consumer.member_id
    coord.away = True
    leaving = InThread(consumer.unsubscribe)
    try:
        wait_until(lambda: coord.tries >= 2)  # (retrying, unsubscribe() waiting for it)
        assert not leaving.outcome
        consumer.wakeup()
        wait_until(lambda: bool(leaving.outcome))
        assert isinstance(leaving.outcome[0], WakeupError)
        assert listener.events[-1] == ("revoked", [T0, U0])
        assert member not in _members(env) and len(_members(env)) == 0
        assert consumer.assignment() == [] and consumer._committer.pending == 0
        assert listener.outcomes == []  # (finished, its callback not run yet)
        # (the wakeup was used up: committed() does not raise it again)
        assert consumer.committed([T0, U0]) == {T0: -1, U0: -1}
    finally:
        consumer.close()
        leaving.thread.join(60)
    assert len(listener.outcomes) == 1
    offsets, error = listener.outcomes[0]
    assert offsets == {T0: 10} and isinstance(error, ConnectionLost)
    assert _committed_of(env, T0, U0) == {T0: -1, U0: -1}
