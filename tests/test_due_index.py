"""The partition's due index holds, for each group, a time no later than the group's earliest
deadline, and the group hash's 'ea' field holds the same value (lua/deadline_index.lua).

A step publishes at once a deadline earlier than the published one (else it would be acted on
late), and leaves the index alone when it only postpones or removes deadlines: in a steady
group the member whose session is the earliest is the next to heartbeat, so an exact index
would be rewritten by nearly every heartbeat. The first step (or timer run) that finds the
published time passed with nothing due publishes the real earliest. Time is a MockTime moved
with ``clock.sleep`` alone (no timer run unless a test runs one).
"""

from __future__ import annotations

from typing import Any

from harness import wait_until

from rcoord import Errors, MemberIdentity, TopicPartition

TP = TopicPartition("t", 0)


def earliest_and_published(ctx: Any) -> tuple[float | None, float | None]:
    """(the group's earliest deadline, the due index's time for it), after checking that the
    group's 'ea' holds the published time."""
    keys = ctx._keys()
    r = ctx.coord._redis
    first = r.zrange(keys.deadlines, 0, 0, withscores=True)
    published = r.zscore(keys.named("due"), ctx.group_id)
    ea = r.hget(keys.group, "ea")
    assert ea == (b"-" if published is None else b"%d" % published), (ea, published)
    return (first[0][1] if first else None), published


def commit(ctx: Any, member_id: str, gen: int) -> None:
    res = ctx.coord.commit_offsets(ctx.group_id, {TP: 1}, member_id=member_id, generation_id=gen)
    assert res[TP] == Errors.NONE, res


def test_postponing_the_earliest_session_leaves_the_index_earlier_until_it_passes(ctx):
    gen, (mid,) = ctx.stable_group(1)
    commit(ctx, mid, gen)  # settles the retention check ('gc') the first commit schedules
    before, published = earliest_and_published(ctx)
    assert before is not None and published is not None and published <= before
    if published < before:
        # stable_group's settle() moves the clock in 100 ms steps until the join's reply is
        # seen; on a loaded machine one more step passes before it is, and the sync then
        # postpones the session past the time published. A step at that time publishes it.
        ctx.clock.sleep(int(published - ctx.clock.milliseconds()))
        commit(ctx, mid, gen)
        before, published = earliest_and_published(ctx)
    assert before is not None and published == before
    for _ in range(3):  # each heartbeat pushes the session, the group's earliest, 1 s later
        ctx.clock.sleep(1000)
        assert ctx.heartbeat(mid, gen) == Errors.NONE
    after, published = earliest_and_published(ctx)
    assert after == before + 3000
    assert published == before  # still the old time: earlier than the real one, never later
    # The published time passes with nothing due: the next heartbeat looks, publishes the
    # real earliest, and the member is not expired.
    ctx.clock.sleep(int(before - ctx.clock.milliseconds()) + 1)
    assert ctx.heartbeat(mid, gen) == Errors.NONE
    earliest, published = earliest_and_published(ctx)
    assert published == earliest
    assert ctx.member_ids() == {mid}


def test_a_timer_run_at_a_passed_published_time_publishes_the_real_earliest(ctx):
    gen, (mid,) = ctx.stable_group(1)
    commit(ctx, mid, gen)
    before, _ = earliest_and_published(ctx)
    ctx.clock.sleep(2000)
    commit(ctx, mid, gen)  # the session is now 2 s later; the index keeps the old time
    assert earliest_and_published(ctx)[1] == before
    ctx.clock.sleep(int(before - ctx.clock.milliseconds()))
    assert ctx.coord.run_timers() == 0  # came at the published time: nothing was due
    earliest, published = earliest_and_published(ctx)
    assert earliest == before + 2000 and published == earliest
    assert ctx.state() == "Stable" and ctx.member_ids() == {mid}


def test_a_step_at_a_passed_published_time_publishes_the_earliest_after_its_own_writes(ctx):
    # The step reads the deadlines once to find nothing due, then refreshes the session: what
    # it publishes is the earliest after that write, not the one it read before it.
    gen, (mid,) = ctx.stable_group(1)
    commit(ctx, mid, gen)
    before, _ = earliest_and_published(ctx)
    ctx.clock.sleep(2000)
    assert ctx.heartbeat(mid, gen) == Errors.NONE  # the session ends 2 s later; index stays
    ctx.clock.sleep(int(before - ctx.clock.milliseconds()) + 1)
    commit(ctx, mid, gen)  # the published time passed: it looks, then moves the session on
    earliest, published = earliest_and_published(ctx)
    assert earliest is not None and earliest > before + 2000
    assert published == earliest


def test_a_deadline_earlier_than_the_published_one_is_published_at_once(ctx):
    # One member with a long session and a short rebalance timeout: the published time is its
    # session's end, a minute away; a second member's join starts a rebalance whose join timer
    # is due in 2 s, and the index must say so at once.
    join_kw = {"session_timeout_ms": 60_000, "rebalance_timeout_ms": 2000}
    first_id = ctx.new_member_id(**join_kw)
    (first,) = ctx.settle([ctx.join_async(first_id, **join_kw)])
    assert first.error == Errors.NONE, first
    synced = ctx.sync(first_id, first.generation_id, {first_id: b""})
    assert synced.error == Errors.NONE, synced
    # The published time is a lower bound (the join phase's timer, passed over by the sync):
    # once it passes, the sweep finds nothing due and publishes the real earliest.
    _, bound = earliest_and_published(ctx)
    assert bound is not None
    ctx.clock.sleep(max(0, int(bound - ctx.clock.milliseconds()) + 1))
    ctx.coord.run_timers()
    earliest, published = earliest_and_published(ctx)
    assert published == earliest and earliest > ctx.clock.milliseconds() + 50_000
    second_id = ctx.new_member_id(**join_kw)
    ctx.join_async(second_id, **join_kw)
    wait_until(lambda: ctx.state() == "PreparingRebalance")
    earliest, published = earliest_and_published(ctx)
    assert earliest is not None and earliest <= ctx.clock.milliseconds() + 2000
    assert published == earliest


def test_a_heartbeat_earlier_than_the_published_time_is_published_at_once(ctx):
    # A new member's parked JoinGroup may wait new_member_join_timeout_ms (minutes), and the
    # rebalance it starts a minute; its first heartbeat sets a 5 s session, earlier than both.
    gen, (old,) = ctx.stable_group(1, session_timeout_ms=60_000, rebalance_timeout_ms=60_000)
    ctx.coord.run_timers()
    _, published = earliest_and_published(ctx)
    assert published is not None and published > ctx.clock.milliseconds() + 50_000
    ctx.join_async(session_timeout_ms=5000, rebalance_timeout_ms=60_000,
                   require_known_member_id=False)
    wait_until(lambda: len(ctx.member_ids()) == 2)
    (new,) = ctx.member_ids() - {old}
    assert ctx.heartbeat(new, gen) == Errors.REBALANCE_IN_PROGRESS
    earliest, published = earliest_and_published(ctx)
    assert earliest == ctx.clock.milliseconds() + 5000
    assert published == earliest


def test_leaving_member_with_the_earliest_session_leaves_a_lower_bound(ctx):
    gen, ids = ctx.stable_group(2)
    # Once the published bound passes, the commit looks at the deadlines, moves ids[1]'s
    # session on, and publishes the earliest: ids[0]'s session.
    _, bound = earliest_and_published(ctx)
    assert bound is not None
    ctx.clock.sleep(max(0, int(bound - ctx.clock.milliseconds()) + 1))
    commit(ctx, ids[1], gen)
    earliest, published = earliest_and_published(ctx)
    assert earliest == float(ctx.coord._redis.zscore(ctx._keys().deadlines, f"hb:{ids[0]}"))
    assert published == earliest
    ctx.coord.leave_group(ctx.group_id, [MemberIdentity(ids[0])])
    after, published = earliest_and_published(ctx)
    assert after is not None and after > earliest
    assert published == earliest  # removing a deadline cannot make the index late


def test_a_deleted_group_leaves_the_index(ctx):
    _, (mid,) = ctx.stable_group(1)
    ctx.coord.leave_group(ctx.group_id, [MemberIdentity(mid)])
    assert ctx.coord.delete_groups([ctx.group_id])[ctx.group_id] == Errors.NONE
    keys = ctx._keys()
    assert ctx.coord._redis.zscore(keys.named("due"), ctx.group_id) is None
    assert not ctx.coord._redis.exists(keys.group)
