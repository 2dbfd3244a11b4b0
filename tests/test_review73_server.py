"""Review 73: the last session's server-side commits (0b01983, be93004, 7c03e45, 8e32664,
28f9652). Reproductions of the defects found; each fails on the code it was written against
(see the review's report)."""

from __future__ import annotations

from typing import Any

import pytest

from rcoord import GroupCoordinator, MockTime
from rcoord.config import CoordinatorConfig
from rcoord.errors import Errors

pytestmark = pytest.mark.parametrize("backend", ["single"])

FAST: dict[str, Any] = {"group_min_session_timeout_ms": 10,
                        "group_max_session_timeout_ms": 600_000,
                        "group_initial_rebalance_delay_ms": 0}


def test_heartbeat_many_answers_a_group_refused_twice_as_heartbeat_does(
        redis_client: Any, namespace: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """0b01983: a group whose heartbeat is refused under a stale layout (NOT_COORDINATOR) is
    sent again by ``heartbeat_many`` once only, after the deadline sweep that settles again.
    The count changing again in between (a second change of count: the layout adopted is
    withdrawn too) refuses that one resend, and ``heartbeat_many`` raises, losing the answers
    of every group of the batch, where ``heartbeat`` settles and sends again up to
    NOT_COORDINATOR_RETRIES times and answers. The members here are unknown in every layout
    (no group exists, so the count may change): each answer is UNKNOWN_MEMBER_ID."""
    clock = MockTime()
    old = GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace, **FAST),
                           clock=clock).start()
    assert old.config.num_partitions == 50

    def change_count(n: int) -> None:
        GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace, num_partitions=n,
                                                         **FAST), clock=clock).start()

    change_count(10)  # old's layout (50) is withdrawn: its heartbeats are refused
    real_call = old._steps.call
    changed: list[int] = []

    def call_then_change(step: str, keys: Any, args: Any) -> Any:
        reply = yield from real_call(step, keys, args)
        if step == "expire_deadlines" and not changed:
            changed.append(20)
            change_count(20)  # between the sweep's re-settle (to 10) and the resend
        return reply

    monkeypatch.setattr(old._steps, "call", call_then_change)
    try:
        answers = old.heartbeat_many([("x", 1, "m1"), ("y", 1, "m2")])
    except Exception as exc:  # noqa: BLE001 - the defect: raised, every answer lost
        answers = [exc]
    assert changed
    assert answers == [Errors.UNKNOWN_MEMBER_ID] * 2, (
        f"heartbeat_many raised/answered {answers!r} after a second change of count; "
        "heartbeat answers UNKNOWN_MEMBER_ID for each")
