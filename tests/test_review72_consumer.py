"""Review 72: ``wakeup()`` in ``unsubscribe()`` (3684efa, 7a69ed5..5074474).

``unsubscribe()`` keeps the wakeup it took in ``_woken_leaving`` and raises it once the
member has left; a listener's own ``unsubscribe()`` inside that revocation (which the consumer
takes: ``_leave_inside_revocation``) resets it."""

from __future__ import annotations

from typing import Any

from harness import InThread
from test_consumer import Recorder, env  # noqa: F401 - env: the fixture
from test_consumer_review71 import _members
from test_consumer_review71b import unreachable_at_10, wake_while_retrying
from test_review69_subscription_wait import T0, U0

from rcoord.client.errors import WakeupError


class _UnsubscribingInRevoke(Recorder):
    """A listener whose ``on_partitions_revoked`` calls ``unsubscribe()`` itself."""

    leaver: Any = None

    def on_partitions_revoked(self, partitions: list[Any]) -> None:
        super().on_partitions_revoked(partitions)
        if self.leaver is not None:
            self.leaver.unsubscribe()


def test_a_wakeup_taken_by_unsubscribe_is_raised_when_its_listener_unsubscribes_too(
        env: Any) -> None:  # noqa: F811 - the fixture
    """commit_async({t-0: 5}) retries against an unreachable Redis; unsubscribe() waits for it
    and wakeup() ends that wait: the wakeup is used up (cleared) and kept for unsubscribe() to
    raise once the member left. The revocation's listener calls unsubscribe() too; its own
    call set ``_woken_leaving`` to False and then None, so the outer unsubscribe() returned
    normally: the wakeup was lost, no call raised it (nor does a later one)."""
    listener = _UnsubscribingInRevoke()
    coord, consumer = unreachable_at_10(env, listener)
    listener.leaver = consumer
    member = consumer.member_id
    consumer.commit_async({T0: 5})
    leaving = InThread(consumer.unsubscribe)
    try:
        wake_while_retrying(coord, consumer, leaving)
        assert listener.events[-1] == ("revoked", [T0, U0])
        assert member not in _members(env)
        assert isinstance(leaving.outcome[0], WakeupError), (
            f"unsubscribe() took the wakeup and returned {leaving.outcome[0]!r}; "
            f"a wakeup is still pending: {consumer._wakeup.is_set()}")
    finally:
        consumer.close(timeout=0)
        leaving.thread.join(60)
