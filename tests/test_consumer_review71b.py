"""Review 71b: what else ``wakeup()`` did not cut in ``unsubscribe()`` (after review 71).

``unsubscribe()`` waits for the async commits queued before it (``_await_committer``), so its
final commit never overtakes one. Against an unreachable Redis each retries for a session
timeout, and ``wakeup()`` did not end that wait. Kafka's ``unsubscribe()`` does not wait for
them at all; here they are still waited for (ordered, their outcomes taken before the final
commit is reckoned), but ``wakeup()`` ends their retries as it ends the final commit's
(``Consumer._leave_woken``): each made once, its failure given to its callback, the member
leaves, and ``unsubscribe()`` raises ``WakeupError``.

After ``assign()``, ``unsubscribe()`` auto-commits the positions of the partitions it forgets,
as a simple group, behind those queued commits; both waits were deaf to ``wakeup()`` too (a
session timeout of retries each). Kafka's makes no commit there. No group closes, so nothing
ends the retries: ``wakeup()`` ends the wait, the commits are left in flight, in order on the
committer (a failure logged), the partitions are forgotten, and ``WakeupError`` is raised."""

from __future__ import annotations

from typing import Any

from harness import InThread, wait_until
from test_consumer import Recorder, env  # noqa: F401 - env: the fixture
from test_consumer_review67 import TP0, _assigned_at_10, _Gated
from test_consumer_review71 import _members, _Unreachable
from test_review69_consumer_wait import _Held
from test_review69_subscription_wait import T0, U0, _both_at_10, _committed_of

from rcoord.client import Consumer
from rcoord.client.errors import WakeupError
from rcoord.errors import ConnectionLost


def wake_while_retrying(coord: Any, consumer: Any, leaving: Any) -> None:
    """``wakeup()`` once the commit ``leaving`` (an ``unsubscribe()`` in a thread) waits for
    has been tried twice and failed, and wait until that call has ended."""
    wait_until(lambda: coord.tries >= 2)  # (the async commit retrying)
    assert not leaving.outcome
    consumer.wakeup()
    wait_until(lambda: bool(leaving.outcome))


def unreachable_at_10(env: Any, listener: Any) -> tuple[_Unreachable, Any]:  # noqa: F811
    """A consumer owning t-0 and u-0 (committed at 10; 30 s sessions) whose commits, from
    now on, find Redis unreachable (the coordinator's gate held open)."""
    coord = _Unreachable(env)
    consumer = _both_at_10(env, coord, listener, session_timeout_ms=30_000)
    coord.gate = _Held()  # type: ignore[assignment]
    coord.gate.release()
    return coord, consumer


def test_wakeup_ends_unsubscribes_wait_for_async_commits_retrying_and_the_member_leaves(
        env: Any) -> None:  # noqa: F811 - the fixture
    """commit_async({t-0: 5}) finds Redis unreachable and retries, for a session timeout
    (30 s); unsubscribe() waits for it before revoking. wakeup() left unsubscribe() waiting
    until those retries ran out (the test's wait ended first). Now they end at their next
    pause: the callback gets the failure, the final commit is made once (failed too), the
    partitions are revoked, the member leaves, and unsubscribe() raises WakeupError."""
    listener = Recorder()
    coord, consumer = unreachable_at_10(env, listener)
    member = consumer.member_id
    outcomes: list[tuple[Any, Any]] = []
    consumer.commit_async({T0: 5}, lambda offsets, error: outcomes.append((offsets, error)))
    leaving = InThread(consumer.unsubscribe)
    try:
        wake_while_retrying(coord, consumer, leaving)
    finally:
        consumer.close(timeout=0)
        leaving.thread.join(60)
    assert isinstance(leaving.outcome[0], WakeupError)
    assert [(offsets, type(error)) for offsets, error in outcomes] == [({T0: 5}, ConnectionLost)]
    assert listener.events[-1] == ("revoked", [T0, U0])
    assert member not in _members(env)
    assert _committed_of(env, T0, U0) == {T0: -1, U0: -1}


class _Down(_Gated):
    """``_Gated``, whose commits, once ``down``, find Redis unreachable (counted)."""

    down = False
    tries = 0

    def commit_offsets(self, *args: Any, **kw: Any) -> Any:
        if not self.down:
            return super().commit_offsets(*args, **kw)
        self.tries += 1
        raise ConnectionLost("Redis unreachable (the test's)")


def _assigned_at_4(env: Any) -> tuple[Consumer, _Down]:  # noqa: F811 - the fixture object
    """``_assigned_at_10`` (sessions of 30 s, no timed auto-commit), sought back to 4, so
    unsubscribe() has a position to commit; Redis unreachable for commits from then on."""
    coord = _Down(env)
    consumer = _assigned_at_10(env, coord, session_timeout_ms=30_000,
                               auto_commit_interval_ms=3_600_000)
    consumer.seek(TP0, 4)
    coord.open()
    coord.down = True
    return consumer, coord


def _woken_unsubscribe(consumer: Consumer, coord: _Down, tries: int) -> None:
    """unsubscribe() once ``tries`` commits failed (retrying), then wakeup(): it raises
    WakeupError, the partitions forgotten (Redis still unreachable)."""
    leaving = InThread(consumer.unsubscribe)
    try:
        wait_until(lambda: coord.tries >= tries)
        assert not leaving.outcome
        consumer.wakeup()
        wait_until(lambda: bool(leaving.outcome))
    finally:
        coord.down = False  # (an unsubscribe() still waiting returns)
        leaving.thread.join(60)
    assert isinstance(leaving.outcome[0], WakeupError)
    assert consumer.assignment() == []


def test_wakeup_ends_unsubscribes_wait_for_its_auto_commit_after_assign_left_in_flight(
        env: Any) -> None:  # noqa: F811 - the fixture
    """unsubscribe()'s auto-commit of t-0 at 4 retries against the unreachable Redis for a
    session timeout (30 s), and wakeup() did not end unsubscribe()'s wait (the test's wait
    ended first). Now it raises WakeupError, t-0 forgotten, the commit in flight: it lands
    once Redis is back, and the wakeup was used up."""
    consumer, coord = _assigned_at_4(env)
    _woken_unsubscribe(consumer, coord, 2)
    wait_until(lambda: consumer._committer.pending == 0)
    assert _committed_of(env, TP0) == {TP0: 4}
    assert consumer.committed([TP0]) == {TP0: 4}  # (no wakeup left to raise)


def test_wakeup_ends_unsubscribes_wait_for_async_commits_after_assign_order_kept(
        env: Any) -> None:  # noqa: F811 - the fixture
    """commit_async({t-0: 3}) retries against the unreachable Redis, and unsubscribe() waited
    for it (a session timeout), deaf to wakeup(). Now wakeup() ends that wait: the auto-commit
    of 4 is queued behind the async commit, both in flight, and they land in order once
    Redis is back (4 last: the auto-commit did not overtake it)."""
    consumer, coord = _assigned_at_4(env)
    outcomes: list[tuple[Any, Any]] = []
    consumer.commit_async({TP0: 3}, lambda offsets, error: outcomes.append((offsets, error)))
    _woken_unsubscribe(consumer, coord, 2)
    wait_until(lambda: consumer._committer.pending == 0)
    assert _committed_of(env, TP0) == {TP0: 4}
    consumer.commit({})  # (runs the callbacks of the commits finished)
    assert outcomes == [({TP0: 3}, None)]
