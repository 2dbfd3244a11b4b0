"""Review 71: the wait of a refused final or revocation commit for the member's join
(``Consumer._commit_carried``, ``ConsumerGroup.newest_after``) ends when the member loses its
id (f6e2302: ``_react`` notifies the condition). ``leave_until_resumed`` (the poll timer's
leave: max_poll_interval_ms passed) forgets the member id too, but after its notify and
outside the condition: the commit waits on for a member that has left until some later
notify (here none: the member's SyncGroup is not answered yet) or the rebalance timeout, and
holds the committer (so ``unsubscribe()`` and ``commit()`` behind it) meanwhile. Answered,
that SyncGroup is refused UNKNOWN_MEMBER_ID and ``_react``'s notify ends the wait, so the
window is the time the member's call in flight (or a join backoff) lasts."""

from __future__ import annotations

from typing import Any

from test_consumer import env  # noqa: F401 - env: the fixture
from test_consumer_review70 import _revoked_while_rejoining, arrives_in_the_next_join

from rcoord.errors import Errors


def test_a_commit_waiting_for_the_members_join_ends_when_the_member_leaves(
        env: Any) -> None:  # noqa: F811 - the fixture
    """t-0's revocation commit under generation 1 is refused once the member's JoinGroup
    completed generation 2 (its SyncGroup held): it waits for that join (60 s rebalance
    timeout). The poll timer's leave (``leave_until_resumed``) then takes the member out of
    the group: there is no join left to wait for, and the wait should end at once (None: the
    commit is logged refused), as it does when ``_react`` resets the id."""
    with _revoked_while_rejoining(env) as (consumer, coord, held, _):
        group = consumer._group
        arrives_in_the_next_join(env, coord, held)
        assert coord.commits[0][0] == 1 and isinstance(coord.commits[0][2], set)
        assert Errors.ILLEGAL_GENERATION in coord.commits[0][2]
        assert consumer._committer.pending == 1  # waiting in newest_after
        group.leave_until_resumed("review 71: poll timeout")
        assert group._member_id == ""
        # Well inside the 60 s rebalance timeout the wait would otherwise last.
        assert consumer._committer.wait_idle(20), "the commit still waits for a member that left"
        assert [gen for gen, _, _ in coord.commits] == [1]
