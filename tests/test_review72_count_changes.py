"""Review 72, items left open: a batch of heartbeats and a parked caller meeting changes of the
partition count. Each test fails on the code it was written against (see the report)."""

from __future__ import annotations

from typing import Any

import pytest

from rcoord import GroupCoordinator
from rcoord.config import CoordinatorConfig
from rcoord.errors import Errors
from rcoord.flow import Flow
from rcoord.steps import NOT_COORDINATOR_RETRIES

pytestmark = pytest.mark.parametrize("backend", ["single"])


def _change_count(redis_client: Any, namespace: str, count: int) -> None:
    """Change the namespace's partition count to ``count`` (it holds no group)."""
    GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace,
                                                     num_partitions=count)).start()


@pytest.mark.parametrize("changes", [1, NOT_COORDINATOR_RETRIES + 1])
def test_heartbeat_many_resent_after_a_settle_follows_further_changes_of_count(
        redis_client: Any, namespace: str, monkeypatch: pytest.MonkeyPatch,
        changes: int) -> None:
    """A batch refused under a stale layout is sent again after a settle; a change of count
    landing between the settle's retried ``expire_deadlines`` and the resent heartbeats was
    refused too, and that refusal raised NotCoordinatorError for the whole batch. Now the
    resend settles again and is sent again, within the bound every group step keeps
    (``NOT_COORDINATOR_RETRIES``); past it the group's members are answered NOT_COORDINATOR,
    each, as Kafka answers each request, and nothing is raised."""
    old = GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace)).start()
    assert old.config.num_partitions == 50
    _change_count(redis_client, namespace, 10)  # the batch below is refused under 50
    steps = old._steps
    real = steps.call
    counts = iter([20, 30, 40, 60, 70, 80][:changes])

    def call(step: str, keys: Any, args: Any) -> Flow[Any]:
        reply = yield from real(step, keys, args)
        if step == "expire_deadlines":  # the resend's sweep passed; the count moves on
            count = next(counts, None)
            if count is not None:
                _change_count(redis_client, namespace, count)
        return reply

    monkeypatch.setattr(steps, "call", call)
    answers = old.heartbeat_many([("g", 1, "m1"), ("h", 1, "n1"), ("g", 1, "m2")])
    if changes <= NOT_COORDINATOR_RETRIES:
        # No such members under the count in force: they rejoin there.
        assert answers == [Errors.UNKNOWN_MEMBER_ID] * 3
        assert old.config.num_partitions == 20
    else:
        # "g" spent the bound (its members are answered so); "h", sent after the last
        # change, is answered under the count in force.
        assert answers == [Errors.NOT_COORDINATOR, Errors.UNKNOWN_MEMBER_ID,
                           Errors.NOT_COORDINATOR]
