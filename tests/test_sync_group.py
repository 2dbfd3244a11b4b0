"""SyncGroup, after Kafka's classic SyncGroup tests."""

from __future__ import annotations

from harness import WAIT_S, wait_until
from rcoord import Errors, MemberIdentity
from rcoord.protocol._checks import MAX_ID_BYTES


def _completing(ctx, n):
    """A group of n members in CompletingRebalance: (generation, ids with the leader first)."""
    gen, ids = ctx.stable_group(n)
    futures = [ctx.join_async(ids[0])]
    wait_until(lambda: ctx.state() == "PreparingRebalance")
    futures += [ctx.join_async(i) for i in ids[1:]]
    results = [f.result(WAIT_S) for f in futures]
    assert ctx.state() == "CompletingRebalance"
    return results[0].generation_id, ids


def test_sync_empty_group_id(ctx):
    assert ctx.coord.sync_group("", 1, "m").error == Errors.INVALID_GROUP_ID


def test_sync_unknown_group_and_unknown_member(ctx):
    assert ctx.sync("m", 1).error == Errors.UNKNOWN_MEMBER_ID
    gen, ids = ctx.stable_group(1)
    assert ctx.sync("not-a-member", gen).error == Errors.UNKNOWN_MEMBER_ID


def test_leader_assignment_reaches_parked_followers_and_missing_ones_are_empty(ctx):
    gen, ids = _completing(ctx, 3)
    leader, f1, f2 = ids
    p1 = ctx.sync_async(f1, gen)
    wait_until(lambda: ctx.awaiting_sync(f1))
    assert not p1.done()
    res = ctx.sync(leader, gen, {leader: b"L", f1: b"F1", "not-a-member": b"x"})
    assert res.error == Errors.NONE and res.assignment == b"L"
    assert res.protocol_type == "consumer" and res.protocol_name == "range"
    assert p1.result(WAIT_S).assignment == b"F1"
    assert ctx.state() == "Stable"
    # A member that syncs after the leader gets its (empty) assignment from the Stable group.
    late = ctx.sync(f2, gen)
    assert late.error == Errors.NONE and late.assignment == b""


def test_a_leaders_entry_for_an_id_past_the_bound_is_ignored_as_any_non_members(ctx):
    # It raised InvalidRequestError: nothing was stored, the group stayed CompletingRebalance
    # and the parked follower waited out the rebalance timeout. Kafka keeps only its members'
    # entries (setAndPropagateAssignment); no member's id is longer than MAX_ID_BYTES.
    gen, (leader, follower) = _completing(ctx, 2)
    parked = ctx.sync_async(follower, gen)
    wait_until(lambda: ctx.awaiting_sync(follower))
    too_long = "x" * (MAX_ID_BYTES + 1)
    res = ctx.sync(leader, gen, {too_long: b"T", leader: b"L", follower: b"F"})
    assert (res.error, res.assignment) == (Errors.NONE, b"L")
    assert (parked.result(WAIT_S).error, parked.result(WAIT_S).assignment) == (Errors.NONE, b"F")
    assert ctx.state() == "Stable"


def test_sync_with_wrong_generation(ctx):
    gen, ids = ctx.stable_group(1)
    assert ctx.sync(ids[0], gen + 1).error == Errors.ILLEGAL_GENERATION


def test_sync_with_inconsistent_protocol(ctx):
    gen, ids = ctx.stable_group(1)
    assert ctx.sync(ids[0], gen, protocol_type="connect").error == Errors.INCONSISTENT_GROUP_PROTOCOL
    assert ctx.sync(ids[0], gen, protocol_name="roundrobin").error == Errors.INCONSISTENT_GROUP_PROTOCOL
    ok = ctx.sync(ids[0], gen, protocol_type="consumer", protocol_name="range")
    assert ok.error == Errors.NONE


def test_sync_during_preparing_rebalance(ctx):
    gen, ids = ctx.stable_group(2)
    ctx.join_async(ids[0])
    wait_until(lambda: ctx.state() == "PreparingRebalance")
    assert ctx.sync(ids[1], gen).error == Errors.REBALANCE_IN_PROGRESS


def test_parked_follower_sync_gets_rebalance_in_progress_when_rebalance_restarts(ctx):
    gen, ids = _completing(ctx, 2)
    leader, follower = ids
    parked = ctx.sync_async(follower, gen)
    wait_until(lambda: ctx.awaiting_sync(follower))
    # A new member arrives before the leader syncs: the rebalance starts over.
    ctx.join_async(ctx.new_member_id())
    assert parked.result(WAIT_S).error == Errors.REBALANCE_IN_PROGRESS
    assert ctx.state() == "PreparingRebalance"


def test_sync_in_stable_returns_stored_assignment_again(ctx):
    gen, ids = ctx.stable_group(2)
    for i in ids:
        assert ctx.sync(i, gen).assignment == i.encode()


def test_retried_leader_sync_is_harmless(ctx):
    gen, ids = _completing(ctx, 2)
    leader, follower = ids
    first = ctx.sync(leader, gen, {leader: b"a", follower: b"b"})
    again = ctx.sync(leader, gen, {leader: b"zzz", follower: b"zzz"})
    assert first == again  # the Stable group keeps the first assignment
    assert ctx.sync(follower, gen).assignment == b"b"


def test_members_that_do_not_sync_in_time_are_removed(ctx):
    ctx.session_timeout_ms = 60_000  # only the sync timeout may act
    gen, ids = _completing(ctx, 3)
    leader, f1, f2 = ids
    ctx.sync(leader, gen, {})
    parked = ctx.sync_async(f1, gen)
    assert parked.result(WAIT_S).error == Errors.NONE
    # f2 never syncs: after the rebalance timeout it is removed and the group rebalances.
    ctx.heartbeat(f2, gen)
    ctx.sleep(ctx.rebalance_timeout_ms)
    assert f2 not in ctx.member_ids()
    assert ctx.state() == "PreparingRebalance"


def test_sync_timeout_is_cancelled_once_everyone_synced(ctx):
    ctx.session_timeout_ms = 60_000
    gen, ids = _completing(ctx, 2)
    p = ctx.sync_async(ids[1], gen)
    ctx.sync(ids[0], gen, {})
    p.result(WAIT_S)
    ctx.sleep(ctx.rebalance_timeout_ms + 1)
    assert ctx.state() == "Stable" and ctx.member_ids() == set(ids)


def test_member_leaving_while_parked_in_sync_gets_unknown_member(ctx):
    gen, ids = _completing(ctx, 2)
    parked = ctx.sync_async(ids[1], gen)
    wait_until(lambda: ctx.awaiting_sync(ids[1]))
    ctx.coord.leave_group(ctx.group_id, [MemberIdentity(ids[1])])
    assert parked.result(WAIT_S).error in (Errors.UNKNOWN_MEMBER_ID, Errors.REBALANCE_IN_PROGRESS)



def test_leader_that_never_syncs_is_removed_and_followers_told_to_rejoin(ctx):
    """Kafka's testRebalanceTimesOutWhenSyncRequestIsNotReceivedFromLeaders."""
    ctx.session_timeout_ms = 60_000
    gen, ids = _completing(ctx, 3)
    leader, f1, f2 = ids
    parked = [ctx.sync_async(f, gen) for f in (f1, f2)]
    wait_until(lambda: ctx.awaiting_sync(f1) and ctx.awaiting_sync(f2))
    ctx.sleep(ctx.rebalance_timeout_ms)
    assert [p.result(WAIT_S).error for p in parked] == [Errors.REBALANCE_IN_PROGRESS] * 2
    assert ctx.member_ids() == {f1, f2}
    assert ctx.state() == "PreparingRebalance"
