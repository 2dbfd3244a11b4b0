"""Review 72, items left open: a batch of heartbeats and a parked caller meeting changes of the
partition count. Each test fails on the code it was written against (see the report)."""

from __future__ import annotations

from typing import Any

import pytest
from harness import InThread, blocked_xreads, wait_until

from rcoord import GroupCoordinator, settings
from rcoord.config import CoordinatorConfig
from rcoord.errors import Errors
from rcoord.flow import Flow
from rcoord.keys import GroupKeys
from rcoord.steps import NOT_COORDINATOR_RETRIES

pytestmark = pytest.mark.parametrize("backend", ["single"])

GROUP = "g"


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



def test_a_join_parked_in_a_stranded_group_is_woken_by_its_deletion(
        redis_client: Any, namespace: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A JoinGroup parks in a group formed under the old count in the instant a change of
    count checks for groups; the change deletes the group (``_drop_stranded``), and its
    ``drop`` must leave a wake-up for the parked caller: else it waits on until its wait
    ends by itself (here the group's deadline, 30 s on: one wait may last up to
    ``max_block_ms``, raised to 60 s for this test), refused then and settling again. Woken,
    it settles again at once and is answered under the count in force, where it is unknown:
    it rejoins there."""
    cfg = CoordinatorConfig(namespace=namespace, group_min_session_timeout_ms=10,
                            group_max_session_timeout_ms=600_000,
                            group_initial_rebalance_delay_ms=30_000)
    old = GroupCoordinator(redis_client, cfg).start()
    old._steps.max_block_ms = 60_000
    group = GroupKeys.of(namespace, 50, GROUP).group
    parked: list[InThread] = []
    real = settings._count_groups

    def racing(ns: str, n: int) -> Any:
        count = yield from real(ns, n)
        if not parked:  # the change's check found no group; one forms, its join parked
            parked.append(InThread(lambda: old.join_group(
                GROUP, protocol_type="consumer", protocols=[("range", b"m")],
                session_timeout_ms=60_000, rebalance_timeout_ms=60_000,
                require_known_member_id=False)))
            wait_until(lambda: parked[0].outcome or (
                redis_client.exists(group) and blocked_xreads(redis_client) == 1))
            assert not parked[0].outcome, parked[0].outcome  # (the initial delay holds it)
        return count

    monkeypatch.setattr(settings, "_count_groups", racing)
    _change_count(redis_client, namespace, 10)
    monkeypatch.undo()
    assert parked and not redis_client.exists(group)
    try:
        parked[0].thread.join(10)
        assert not parked[0].thread.is_alive(), "the parked join was not woken by the drop"
    finally:
        parked[0].thread.join(90)  # (not woken: it ends at the group's deadline)
    answer = parked[0].outcome[0]
    assert getattr(answer, "error", None) is Errors.UNKNOWN_MEMBER_ID, answer
    assert old.config.num_partitions == 10
