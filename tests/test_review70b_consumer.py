"""Review 70b: the retry of a changed subscription's revocation commit under the generation the
member joins meanwhile (``Consumer._commit_carried``, ``ConsumerGroup.newest_after``, 6767418
and 2e30f28) waits on the committer thread for that join, up to the rebalance timeout.

The wait looks only at the group's close and exit and at the member id. ``close()`` (no
timeout) first waits for the committer (``_close``: ``wait_idle(None)``) and closes the group
only afterwards, and its bound (one session timeout, ``_give_up_waiting``) stops retries,
not this wait: a join that does not complete (here a SyncGroup parked until the group
closes, as a coordinator parks it until the leader's assignment or a LeaveGroup) holds
``close()`` for the whole rebalance timeout."""

from __future__ import annotations

import threading
from typing import Any

from harness import wait_until
from test_consumer import Recorder, env  # noqa: F401 - env: the fixture
from test_consumer_review70 import _group_state, _JoinGated, arrives_in_the_next_join, rejoining
from test_review69_consumer_wait import _Held

SESSION_MS = 10_000
REBALANCE_MS = 120_000


class _SyncParked(_JoinGated):
    """``_JoinGated`` whose held SyncGroup is parked until ``syncs`` is set or ``group``
    closes (a LeaveGroup would answer it then), the rebalance timeout at most."""

    group: Any = None

    def sync_group(self, *args: Any, **kw: Any) -> Any:
        if not self.syncs.is_set():
            self.sync_held.set()
            for _ in range(int(REBALANCE_MS / 50)):
                if self.syncs.wait(0.05) or (
                        self.group is not None and self.group._closing.is_set()):
                    break
        return super(_JoinGated, self).sync_group(*args, **kw)


def test_close_is_not_held_for_the_rebalance_timeout_by_a_refused_revocation_commits_wait(
        env: Any) -> None:  # noqa: F811 - the fixture
    """Session timeout 10 s, rebalance timeout 120 s. As in test_consumer_review70's third
    test, the revocation commit of t-0 under generation 1 is refused while the member's
    SyncGroup of generation 2 is parked; then close(). It should return within its bound (a
    session timeout, then it gives up waiting) and seconds more. It did not: the
    committer waited in ``newest_after`` for the join, which only the group's close (after
    the committer's wait) ends, so close() stayed for the rebalance timeout."""
    listener = Recorder()
    held = _Held()
    with rejoining(env, listener, held, "joins", coordinator=_SyncParked,
                   session_timeout_ms=SESSION_MS, heartbeat_interval_ms=1_000,
                   rebalance_timeout_ms=REBALANCE_MS) as (consumer, coord, _, threads):
        assert isinstance(coord, _SyncParked)
        coord.group = consumer._group
        wait_until(coord.join_held.is_set)
        assert _group_state(env) == ("PreparingRebalance", 1)
        consumer.subscribe(["u"])
        assert consumer.poll(timeout=0.5) == []
        assert [event for event, _ in listener.events] == ["assigned", "revoked"]
        arrives_in_the_next_join(env, coord, held)
        assert coord.commits[0][0] == 1  # refused: the group is in generation 2
        closer = threading.Thread(target=consumer.close, daemon=True)
        threads.append(closer)
        closer.start()
        # Within its bound (one session timeout, then it gives up waiting) and seconds more,
        # not at the rebalance timeout.
        wait_until(lambda: not closer.is_alive(), timeout_s=SESSION_MS / 1000 + 30,
                   why=lambda: f"close() still waiting; {consumer._committer.pending} commit(s) "
                               "pending")
