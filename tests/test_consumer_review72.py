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
from harness import wait_until
from test_consumer import Recorder, env  # noqa: F401 - env: the fixture
from test_consumer_review70 import _JoinGated, leaving_while_syncing, rejoining
from test_review69_consumer_wait import _Held
from test_review69_subscription_wait import T0, U0, _committed_of

from rcoord.errors import Errors, ProtocolError


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
