"""A restarted group-mode query whose resume commit is fenced plans no batch in the ended
generation.

``StreamMember._resume`` commits the end of the batch the old process finished (Spark's commit
log has it; Spark never called ``commit`` for it) under the restarted query's first generation.
When a rebalance fenced that commit, the same ``plan`` went on planning in the ended
generation from the group's committed offset: the finished batch's records came again in the
next batch, and the sink stored them twice.
"""

from __future__ import annotations

from typing import Any

import pytest
from harness import wait_until
from test_spark_review63_commit_hold import (  # noqa: F401  (fixtures)
    EV0,
    NOT_MADE,
    Planned,
    _committed,
    _member,
    _read,
    coord,
    planned,
    topics,
)

from rcoord import GroupCoordinator
from rcoord.client import Generation
from rcoord.protocol.leave import MemberIdentity
from rcoord.spark.member import CommitNotMadeError
from rcoord.spark.plan import Position


def _fence_first_commit(admin: GroupCoordinator, monkeypatch: pytest.MonkeyPatch) -> None:
    """The next generation commit is fenced for real: the member is removed from group "g"
    just before it is sent (as an operator's removal or a session expiry does), so the
    coordinator refuses it (UNKNOWN_MEMBER_ID) and the generation ends."""
    real, left = Generation.commit_offsets, [1]

    def commit(gen: Generation, offsets: Any) -> None:
        if left[0] > 0:
            left[0] -= 1
            admin.leave_group("g", [MemberIdentity(gen.member_id)])
        real(gen, offsets)

    monkeypatch.setattr(Generation, "commit_offsets", commit)


@pytest.mark.parametrize("until_target", [False, True])
def test_a_fenced_resume_commit_plans_no_batch_in_the_ended_generation(
        until_target: bool, planned: Planned, redis_server: Any,  # noqa: F811
        single_client: Any, namespace: str, coord: GroupCoordinator,  # noqa: F811
        monkeypatch: pytest.MonkeyPatch) -> None:
    end1, latest = planned.end1, planned.latest  # batch 0: records 0-3, finished, uncommitted
    planned.member.close(5)  # the query's process stops after batch 0's sink finished
    planned.producer.send_batch("ev", [b"y"] * 6)
    _fence_first_commit(coord, monkeypatch)
    b = _member(redis_server.url, namespace, single_client)  # the restarted query
    try:
        got = {"pos": end1}

        def planned_a_batch() -> bool:
            # Without availableNow a plan may read nothing while the group rebalances; under
            # it the first plan must read (an empty one would end the run).
            got["pos"] = b.plan(end1, latest, None, until_target=until_target)
            return got["pos"] != end1

        if until_target:
            assert planned_a_batch()
        else:
            wait_until(planned_a_batch, timeout_s=20)
        after: Position = got["pos"]
        assert _read(end1, after) == list(range(4, 10))  # batch 0's records not again
        assert _committed(coord) == {EV0: 4}
        gen = b.generation  # planned in the generation the query rejoined, which is live
        assert gen is not None and not gen.done.is_set()
        assert (after.generation, after.member) == (gen.generation_id, gen.member_id)
    finally:
        b.close(5)


def test_a_resume_commit_refused_for_a_session_fails_the_query(
        planned: Planned, redis_server: Any, single_client: Any,  # noqa: F811 - fixtures
        namespace: str, coord: GroupCoordinator,  # noqa: F811
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A resume commit Redis keeps refusing (4864cb5 holds the plan on it): each plan() first
    # ran _held for its own batch, which had nothing to commit, found no failure and cleared
    # the failing clock; the resume's refusal started it again, so the query held for ever.
    end1, latest = planned.end1, planned.latest
    planned.member.close(5)
    planned.producer.send_batch("ev", [b"y"] * 6)

    def commit(gen: Generation, offsets: Any) -> None:
        raise NOT_MADE["metadata-too-large"]()

    monkeypatch.setattr(Generation, "commit_offsets", commit)
    b = _member(redis_server.url, namespace, single_client)  # the restarted query
    failed: list[CommitNotMadeError] = []

    def plan_fails() -> bool:
        try:
            assert b.plan(end1, latest, None) == end1  # held: the resume commit is not made
        except CommitNotMadeError as exc:
            failed.append(exc)
        return bool(failed)

    try:
        # (session timeout 1.5 s; before: held, every plan restarting the clock, for ever)
        wait_until(plan_fails, timeout_s=20)
        assert "OFFSET_METADATA_TOO_LARGE" in str(failed[0])
        assert _committed(coord) == {}
    finally:
        b.close(5)
