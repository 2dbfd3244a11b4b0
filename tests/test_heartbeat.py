"""Heartbeat and session expiry, after Kafka's classic heartbeat tests."""

from __future__ import annotations

from harness import WAIT_S, wait_until
from rcoord import Errors


def test_heartbeat_empty_group_id(ctx):
    assert ctx.coord.heartbeat("", 1, "m") == Errors.INVALID_GROUP_ID


def test_heartbeat_unknown_group_and_member(ctx):
    assert ctx.heartbeat("m", 1) == Errors.UNKNOWN_MEMBER_ID
    gen, ids = ctx.stable_group(1)
    assert ctx.heartbeat("other", gen) == Errors.UNKNOWN_MEMBER_ID


def test_heartbeat_in_stable_and_completing_rebalance(ctx):
    mid = ctx.new_member_id()
    res = ctx.join(mid)
    assert ctx.state() == "CompletingRebalance"
    assert ctx.heartbeat(mid, res.generation_id) == Errors.NONE
    ctx.sync(mid, res.generation_id, {mid: b""})
    assert ctx.heartbeat(mid, res.generation_id) == Errors.NONE


def test_heartbeat_wrong_generation(ctx):
    gen, ids = ctx.stable_group(1)
    assert ctx.heartbeat(ids[0], gen - 1) == Errors.ILLEGAL_GENERATION


def test_heartbeat_during_rebalance_says_rebalance_in_progress_and_keeps_session(ctx):
    gen, ids = ctx.stable_group(2)
    ctx.join_async(ids[0])
    wait_until(lambda: ctx.state() == "PreparingRebalance")
    # The follower heartbeats past its session timeout, within the rebalance timeout.
    for _ in range(2):
        ctx.sleep(ctx.session_timeout_ms - 100)
        assert ctx.heartbeat(ids[1], gen) == Errors.REBALANCE_IN_PROGRESS
    assert ids[1] in ctx.member_ids()


def test_heartbeat_to_empty_group_is_unknown_member(ctx):
    from rcoord import MemberIdentity

    gen, ids = ctx.stable_group(1)
    ctx.coord.leave_group(ctx.group_id, [MemberIdentity(ids[0])])
    assert ctx.state() == "Empty"
    assert ctx.heartbeat(ids[0], gen + 1) == Errors.UNKNOWN_MEMBER_ID


def test_session_expiry_removes_member_and_rebalances(ctx):
    gen, ids = ctx.stable_group(2)
    leader, follower = ids
    ctx.sleep(ctx.session_timeout_ms - 1)
    assert ctx.heartbeat(leader, gen) == Errors.NONE  # leader stays alive
    ctx.sleep(1)  # the follower's session passes
    assert follower not in ctx.member_ids()
    assert ctx.heartbeat(leader, gen) == Errors.REBALANCE_IN_PROGRESS
    res = ctx.join(leader)
    assert res.generation_id == gen + 1 and [m.member_id for m in res.members] == [leader]


def test_heartbeats_keep_a_member_alive_past_its_session_timeout(ctx):
    gen, (mid,) = ctx.stable_group(1)
    for _ in range(5):
        ctx.sleep(ctx.session_timeout_ms // 2)
        assert ctx.heartbeat(mid, gen) == Errors.NONE
    assert ctx.member_ids() == {mid} and ctx.state() == "Stable"


def test_parked_member_is_not_expired_by_its_session(ctx):
    ctx.rebalance_timeout_ms = 20_000
    gen, ids = ctx.stable_group(2)
    f = ctx.join_async(ids[0])
    wait_until(lambda: ctx.state() == "PreparingRebalance")
    ctx.sleep(ctx.session_timeout_ms + 1)
    # The parked leader is alive; the silent follower has expired; the join completes.
    res = f.result(WAIT_S)
    assert res.error == Errors.NONE and res.generation_id == gen + 1
    assert ctx.member_ids() == {ids[0]}


def test_last_member_expiring_makes_group_empty(ctx):
    gen, (mid,) = ctx.stable_group(1)
    ctx.sleep(ctx.session_timeout_ms)
    assert ctx.state() == "Empty"
    assert ctx.group_field("gen") == str(gen + 1)


def test_heartbeat_many_matches_single_heartbeats(ctx):
    gen, ids = ctx.stable_group(2)
    res = ctx.coord.heartbeat_many([
        (ctx.group_id, gen, ids[0]),
        (ctx.group_id, gen, "ghost"),
        ("", gen, ids[0]),
        (ctx.group_id, gen - 1, ids[1], None),
    ])
    assert res == [Errors.NONE, Errors.UNKNOWN_MEMBER_ID, Errors.INVALID_GROUP_ID, Errors.ILLEGAL_GENERATION]


def test_heartbeat_many_applies_passed_deadlines_first(ctx):
    gen, ids = ctx.stable_group(2)
    ctx.clock.sleep(ctx.session_timeout_ms)  # both sessions passed; nobody ran the timers
    res = ctx.coord.heartbeat_many([(ctx.group_id, gen, ids[0])])
    assert res == [Errors.UNKNOWN_MEMBER_ID]


def test_heartbeat_many_survives_script_flush(ctx, redis_client):
    import redis as redis_mod

    gen, ids = ctx.stable_group(1)
    if isinstance(redis_client, redis_mod.RedisCluster):
        for node in redis_client.get_primaries():
            redis_client.get_redis_connection(node).script_flush()
    else:
        redis_client.script_flush()
    assert ctx.coord.heartbeat_many([(ctx.group_id, gen, ids[0])]) == [Errors.NONE]


def test_heartbeat_many_as_the_first_call(redis_client, namespace):
    from rcoord import CoordinatorConfig, GroupCoordinator

    coord = GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace))
    assert coord.heartbeat_many([("g", 1, "m")]) == [Errors.UNKNOWN_MEMBER_ID]


def test_pending_member_that_never_rejoins_times_out_and_the_group_stays_stable(ctx):
    """Kafka's testSecondMemberPartiallyJoinAndTimeout."""
    ctx.session_timeout_ms = 5000
    first = ctx.join(group_instance_id="leader-instance-id")
    ctx.sync(first.member_id, first.generation_id, {})
    pending = ctx.new_member_id()
    assert ctx.state() == "Stable"
    for _ in range(2):
        ctx.sleep(2500)
        assert ctx.heartbeat(first.member_id, first.generation_id) == Errors.NONE
    assert ctx.member_ids() == {first.member_id}
    assert ctx.coord._redis.hlen(ctx._keys().pending) == 0  # no pending member left
    assert ctx.state() == "Stable" and ctx.group_field("gen") == str(first.generation_id)
    assert ctx.join(pending).error == Errors.UNKNOWN_MEMBER_ID
