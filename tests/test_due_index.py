"""The partition's due index holds each group's earliest deadline, exactly, after every group
step (a heartbeat that passes over a due retention check may leave it earlier, never later).

Steps skip the index when a deadline write cannot move the group's earliest (a later deadline
of another name), which saves two commands on most commits and heartbeat-like writes of a
large group; these tests pin the cases where the earliest does move. Time is a MockTime moved
with ``clock.sleep`` alone (no timer run, which would repair the index and hide a step that
left it wrong).
"""

from __future__ import annotations

from typing import Any

from rcoord import Errors, TopicPartition

TP = TopicPartition("t", 0)


def earliest_and_published(ctx: Any) -> tuple[float | None, float | None]:
    keys = ctx._keys()
    r = ctx.coord._redis
    first = r.zrange(keys.deadlines, 0, 0, withscores=True)
    return (first[0][1] if first else None), r.zscore(keys.named("due"), ctx.group_id)


def commit(ctx: Any, member_id: str, gen: int) -> None:
    res = ctx.coord.commit_offsets(ctx.group_id, {TP: 1}, member_id=member_id, generation_id=gen)
    assert res[TP] == Errors.NONE, res


def test_a_commit_that_pushes_back_the_earliest_session_moves_the_index(ctx):
    gen, (mid,) = ctx.stable_group(1)
    commit(ctx, mid, gen)  # settles the retention check ('gc') the first commit schedules
    before, published = earliest_and_published(ctx)
    assert before is not None and published == before
    ctx.clock.sleep(1000)
    commit(ctx, mid, gen)  # its session, the group's earliest deadline, is now 1 s later
    after, published = earliest_and_published(ctx)
    assert after == before + 1000
    assert published == after


def test_commits_of_members_whose_sessions_are_not_earliest_keep_the_index_exact(ctx):
    gen, ids = ctx.stable_group(3)
    for step, mid in enumerate(ids * 3):
        ctx.clock.sleep(100)
        commit(ctx, mid, gen)
        earliest, published = earliest_and_published(ctx)
        assert earliest is not None and published == earliest, (step, earliest, published)


def test_leaving_member_with_the_earliest_session_moves_the_index(ctx):
    from rcoord import MemberIdentity

    gen, ids = ctx.stable_group(2)
    ctx.clock.sleep(500)
    commit(ctx, ids[1], gen)  # ids[0]'s session is now the earliest deadline
    earliest, published = earliest_and_published(ctx)
    assert published == earliest
    ctx.coord.leave_group(ctx.group_id, [MemberIdentity(ids[0])])
    after, published = earliest_and_published(ctx)
    assert after is not None and after != earliest
    assert published == after
