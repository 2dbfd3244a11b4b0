"""Review 71b: what else ``wakeup()`` did not cut in ``unsubscribe()`` (after review 71).

``unsubscribe()`` waits for the async commits queued before it (``_await_committer``), so its
final commit never overtakes one. Against an unreachable Redis each retries for a session
timeout, and ``wakeup()`` did not end that wait. Kafka's ``unsubscribe()`` does not wait for
them at all; here they are still waited for (ordered, their outcomes taken before the final
commit is reckoned), but ``wakeup()`` ends their retries as it ends the final commit's
(``Consumer._leave_woken``): each made once, its failure given to its callback, the member
leaves, and ``unsubscribe()`` raises ``WakeupError``."""

from __future__ import annotations

from typing import Any

from harness import InThread, wait_until
from test_consumer import Recorder, env  # noqa: F401 - env: the fixture
from test_consumer_review71 import _members, _Unreachable
from test_review69_consumer_wait import _Held
from test_review69_subscription_wait import T0, U0, _both_at_10, _committed_of

from rcoord.client.errors import WakeupError
from rcoord.errors import ConnectionLost


def test_wakeup_ends_unsubscribes_wait_for_async_commits_retrying_and_the_member_leaves(
        env: Any) -> None:  # noqa: F811 - the fixture
    """commit_async({t-0: 5}) finds Redis unreachable and retries, for a session timeout
    (30 s); unsubscribe() waits for it before revoking. wakeup() left unsubscribe() waiting
    until those retries ran out (the test's wait ended first). Now they end at their next
    pause: the callback gets the failure, the final commit is made once (failed too), the
    partitions are revoked, the member leaves, and unsubscribe() raises WakeupError."""
    coord = _Unreachable(env)
    listener = Recorder()
    consumer = _both_at_10(env, coord, listener, session_timeout_ms=30_000)
    coord.gate = _Held()  # type: ignore[assignment]
    coord.gate.release()
    member = consumer.member_id
    outcomes: list[tuple[Any, Any]] = []
    consumer.commit_async({T0: 5}, lambda offsets, error: outcomes.append((offsets, error)))
    leaving = InThread(consumer.unsubscribe)
    try:
        wait_until(lambda: coord.tries >= 2)  # (the async commit retrying)
        assert not leaving.outcome
        consumer.wakeup()
        wait_until(lambda: bool(leaving.outcome))
    finally:
        consumer.close(timeout=0)
        leaving.thread.join(60)
    assert isinstance(leaving.outcome[0], WakeupError)
    assert [(offsets, type(error)) for offsets, error in outcomes] == [({T0: 5}, ConnectionLost)]
    assert listener.events[-1] == ("revoked", [T0, U0])
    assert member not in _members(env)
    assert _committed_of(env, T0, U0) == {T0: -1, U0: -1}
