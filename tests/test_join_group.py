"""JoinGroup, case by case, after Kafka's GroupMetadataManagerTest (classic group join tests)."""

from __future__ import annotations

import pytest

from harness import PROTOCOLS, WAIT_S, wait_until
from rcoord import Errors, GroupCoordinator


def test_join_with_empty_group_id_is_invalid_group_id(ctx):
    res = ctx.join(group_id="")
    assert res.error == Errors.INVALID_GROUP_ID


@pytest.mark.parametrize("timeout_ms", [9, 600_001])
def test_join_with_session_timeout_out_of_bounds(ctx, timeout_ms):
    res = ctx.join(session_timeout_ms=timeout_ms)
    assert res.error == Errors.INVALID_SESSION_TIMEOUT


def test_join_unknown_member_of_unknown_group(ctx):
    res = ctx.join("some-member")
    assert res.error == Errors.UNKNOWN_MEMBER_ID
    assert res.member_id == "some-member"


def test_new_member_gets_member_id_required_with_client_id_prefix(ctx):
    res = ctx.join(client_id="client")
    assert res.error == Errors.MEMBER_ID_REQUIRED
    assert res.member_id.startswith("client-") and len(res.member_id) == len("client-") + 36
    # A second join with an empty id hands out a different id.
    assert ctx.join(client_id="client").member_id != res.member_id


def test_first_member_forms_generation_one_and_leads(ctx):
    mid = ctx.new_member_id()
    res = ctx.join(mid)
    assert res.error == Errors.NONE
    assert res.generation_id == 1
    assert res.leader_id == mid and res.member_id == mid
    assert res.protocol_type == "consumer" and res.protocol_name == "range"
    assert [m.member_id for m in res.members] == [mid]
    assert res.members[0].metadata == b"range-meta"
    assert res.skip_assignment is False
    assert ctx.state() == "CompletingRebalance"


def test_join_without_required_known_member_id_adds_member_at_once(ctx):
    res = ctx.join(require_known_member_id=False)
    assert res.error == Errors.NONE and res.generation_id == 1


def test_inconsistent_protocol_type_rejected(ctx):
    ctx.stable_group(1)
    res = ctx.join(require_known_member_id=False, protocol_type="connect")
    assert res.error == Errors.INCONSISTENT_GROUP_PROTOCOL
    assert res.member_id == ""


def test_empty_protocol_type_or_list_on_empty_group_rejected(ctx):
    assert ctx.join(protocol_type="").error == Errors.INCONSISTENT_GROUP_PROTOCOL
    assert ctx.join(protocols=[]).error == Errors.INCONSISTENT_GROUP_PROTOCOL


def test_no_protocol_in_common_rejected(ctx):
    ctx.stable_group(1)
    res = ctx.join(require_known_member_id=False, protocols=[("roundrobin", b"")])
    assert res.error == Errors.INCONSISTENT_GROUP_PROTOCOL


def test_existing_member_with_inconsistent_protocols_keeps_its_id(ctx):
    gen, (leader,) = ctx.stable_group(1)
    res = ctx.join(leader, protocols=[("other", b"")])
    assert res.error == Errors.INCONSISTENT_GROUP_PROTOCOL
    assert res.member_id == leader


@pytest.fixture
def slow_ctx(make_coordinator, clock, pool):
    """First generations wait the (Kafka default) initial delay, so several members can join."""
    from harness import Ctx

    return Ctx(make_coordinator(clock=clock, group_initial_rebalance_delay_ms=3000), clock, pool)


def test_protocol_selected_by_vote_among_common_protocols(slow_ctx):
    ctx = slow_ctx
    # Two members prefer "roundrobin", one prefers "range"; all support both.
    prefs = [
        [("roundrobin", b"rr"), ("range", b"r")],
        [("roundrobin", b"rr"), ("range", b"r")],
        [("range", b"r"), ("roundrobin", b"rr")],
    ]
    ids = [ctx.new_member_id(protocols=p) for p in prefs]
    futures = [ctx.join_async(i, protocols=p) for i, p in zip(ids, prefs)]
    results = ctx.settle(futures)
    assert {r.protocol_name for r in results} == {"roundrobin"}
    leader = [r for r in results if r.members][0]
    assert {m.metadata for m in leader.members} == {b"rr"}


def test_protocol_only_one_member_supports_is_not_chosen(slow_ctx):
    ctx = slow_ctx
    a = [("sticky", b""), ("range", b"")]
    b = [("range", b"")]
    ia, ib = ctx.new_member_id(protocols=a), ctx.new_member_id(protocols=b)
    ra, rb = ctx.settle([ctx.join_async(ia, protocols=a), ctx.join_async(ib, protocols=b)])
    assert ra.protocol_name == rb.protocol_name == "range"


def test_leader_is_first_member_to_join(ctx):
    first, second = ctx.new_member_id(), ctx.new_member_id()
    r1 = ctx.join(first)
    assert r1.leader_id == first
    ctx.sync(first, r1.generation_id, {})  # Stable: the leader's rejoin below always rebalances
    f2 = ctx.join_async(second)
    f1 = ctx.join_async(first)
    r2, r1 = f2.result(WAIT_S), f1.result(WAIT_S)
    assert r1.leader_id == r2.leader_id == first
    assert {m.member_id for m in r1.members} == {first, second} and r2.members == []


def test_pending_member_blocks_join_completion_until_it_joins(ctx):
    gen, (leader,) = ctx.stable_group(1)
    pending = ctx.new_member_id()
    # The leader rejoins; the pending member has not yet joined with its id.
    f_leader = ctx.join_async(leader)
    ctx.sleep(0)
    assert not f_leader.done()
    assert ctx.state() == "PreparingRebalance"
    f_pending = ctx.join_async(pending)
    r_leader, r_pending = f_leader.result(WAIT_S), f_pending.result(WAIT_S)
    assert r_leader.generation_id == r_pending.generation_id == gen + 1
    assert {m.member_id for m in r_leader.members} == {leader, pending}


def test_pending_member_expires_after_session_timeout(ctx):
    gen, (leader,) = ctx.stable_group(1)
    pending = ctx.new_member_id()
    f_leader = ctx.join_async(leader)
    ctx.sleep(ctx.session_timeout_ms - 1)
    assert not f_leader.done()
    ctx.sleep(1)  # the pending member's session passes: the join phase can complete
    res = f_leader.result(WAIT_S)
    assert res.error == Errors.NONE and [m.member_id for m in res.members] == [leader]
    # Joining with the expired id is now an unknown member.
    assert ctx.join(pending).error == Errors.UNKNOWN_MEMBER_ID


def test_rebalance_completes_when_all_members_rejoin(ctx):
    gen, ids = ctx.stable_group(3)
    futures = [ctx.join_async(ids[0])]  # the leader's rejoin starts the rebalance
    wait_until(lambda: ctx.state() == "PreparingRebalance")
    futures += [ctx.join_async(i) for i in ids[1:]]
    results = [f.result(WAIT_S) for f in futures]
    assert {r.generation_id for r in results} == {gen + 1}
    assert results[0].leader_id == ids[0]
    assert len(results[0].members) == 3
    assert all(r.members == [] for r in results[1:])


def test_rebalance_timeout_drops_members_that_did_not_rejoin(ctx):
    ctx.session_timeout_ms = 30_000  # longer than the rebalance timeout: only it can act
    gen, ids = ctx.stable_group(3)
    keep = ids[:2]
    futures = [ctx.join_async(keep[0])]  # the leader's rejoin starts the rebalance
    wait_until(lambda: ctx.state() == "PreparingRebalance")
    futures.append(ctx.join_async(keep[1]))
    wait_until(lambda: ctx.parked() == 2)
    ctx.sleep(ctx.rebalance_timeout_ms - 1)
    assert not any(f.done() for f in futures)
    ctx.sleep(1)
    results = [f.result(WAIT_S) for f in futures]
    assert {r.generation_id for r in results} == {gen + 1}
    assert ctx.member_ids() == set(keep)


def test_leader_reelected_when_leader_does_not_rejoin(ctx):
    ctx.session_timeout_ms = 30_000
    gen, ids = ctx.stable_group(2)
    old_leader, follower = ids
    f = ctx.join_async(follower, protocols=[("range", b"changed")])  # starts a rebalance
    wait_until(lambda: ctx.state() == "PreparingRebalance")
    ctx.sleep(ctx.rebalance_timeout_ms)
    res = f.result(WAIT_S)
    assert res.leader_id == follower
    assert [m.member_id for m in res.members] == [follower]


def test_leader_rejoin_in_stable_triggers_rebalance(ctx):
    gen, ids = ctx.stable_group(2)
    f = ctx.join_async(ids[0])
    wait_until(lambda: ctx.state() == "PreparingRebalance")
    assert ctx.heartbeat(ids[1], gen) == Errors.REBALANCE_IN_PROGRESS
    f2 = ctx.join_async(ids[1])
    assert f.result(WAIT_S).generation_id == f2.result(WAIT_S).generation_id == gen + 1


def test_follower_rejoin_in_stable_with_same_metadata_returns_current_generation(ctx):
    gen, ids = ctx.stable_group(2)
    res = ctx.join(ids[1])
    assert res.error == Errors.NONE
    assert res.generation_id == gen and res.leader_id == ids[0] and res.members == []
    assert ctx.state() == "Stable"


def test_follower_rejoin_in_stable_with_new_metadata_triggers_rebalance(ctx):
    gen, ids = ctx.stable_group(2)
    f = ctx.join_async(ids[1], protocols=[("range", b"changed")])
    wait_until(lambda: ctx.state() == "PreparingRebalance")
    f0 = ctx.join_async(ids[0])
    leader_res = f0.result(WAIT_S)
    assert f.result(WAIT_S).generation_id == gen + 1
    assert {m.member_id: m.metadata for m in leader_res.members}[ids[1]] == b"changed"


def test_join_in_completing_rebalance_with_same_metadata_resends_response(ctx):
    mid = ctx.new_member_id()
    first = ctx.join(mid)
    assert ctx.state() == "CompletingRebalance"
    again = ctx.join(mid)
    assert again == first  # the same generation, leader and member list


def test_join_in_completing_rebalance_with_new_metadata_triggers_rebalance(ctx):
    mid = ctx.new_member_id()
    first = ctx.join(mid)
    again = ctx.join(mid, protocols=[("range", b"new")])
    assert again.generation_id == first.generation_id + 1
    assert again.members[0].metadata == b"new"


def test_join_with_member_id_to_empty_group_is_unknown_member(ctx):
    gen, (mid,) = ctx.stable_group(1)
    assert ctx.coord.leave_group(ctx.group_id, [__import__("rcoord").MemberIdentity(mid)]).error == Errors.NONE
    assert ctx.state() == "Empty"
    assert ctx.join(mid).error == Errors.UNKNOWN_MEMBER_ID


def test_new_member_join_timeout_removes_parked_new_member(ctx, make_coordinator, clock, pool):
    from harness import Ctx

    c = Ctx(make_coordinator(clock=clock, new_member_join_timeout_ms=2000), clock, pool)
    c.session_timeout_ms = 60_000
    c.rebalance_timeout_ms = 120_000
    gen, (leader,) = c.stable_group(1)
    # A new member parks, but the leader never rejoins: the new member times out first.
    newbie = c.new_member_id()
    f = c.join_async(newbie)
    wait_until(lambda: c.state() == "PreparingRebalance")
    c.sleep(1999)
    assert not f.done()
    c.sleep(1)
    assert f.result(WAIT_S).error == Errors.UNKNOWN_MEMBER_ID
    assert newbie not in c.member_ids()


def test_initial_rebalance_delay_waits_and_extends_for_new_members(make_coordinator, clock, pool):
    from harness import Ctx

    c = Ctx(make_coordinator(clock=clock, group_initial_rebalance_delay_ms=3000), clock, pool)
    c.rebalance_timeout_ms = 10_000
    c.session_timeout_ms = 60_000
    a = c.new_member_id()
    fa = c.join_async(a)
    wait_until(lambda: c.state() == "PreparingRebalance")
    c.sleep(2999)
    b = c.new_member_id()
    fb = c.join_async(b)
    wait_until(lambda: len(c.member_ids()) == 2)
    c.sleep(1)  # first delay passes, but a member arrived: extended by another delay
    assert not fa.done()
    c.sleep(2999)
    assert not fa.done()
    c.sleep(1)
    ra, rb = fa.result(WAIT_S), fb.result(WAIT_S)
    assert ra.generation_id == rb.generation_id == 1
    assert ra.leader_id == a and len(ra.members) == 2


def test_initial_rebalance_delay_is_capped_by_rebalance_timeout(make_coordinator, clock, pool):
    from harness import Ctx

    c = Ctx(make_coordinator(clock=clock, group_initial_rebalance_delay_ms=3000), clock, pool)
    c.rebalance_timeout_ms = 5000
    c.session_timeout_ms = 60_000
    a = c.new_member_id()
    fa = c.join_async(a)
    wait_until(lambda: c.state() == "PreparingRebalance")
    waited = 0
    futures = [fa]
    # A member arrives in every delay window; completion still comes by the rebalance timeout.
    while not fa.done() and waited < 20_000:
        futures.append(c.join_async(c.new_member_id()))
        n = len(futures)
        wait_until(lambda: len(c.member_ids()) == n)
        c.sleep(1000)
        waited += 1000
    assert fa.done()
    assert waited <= 5000 + 3000
    assert fa.result(WAIT_S).generation_id == 1


def test_a_later_initial_rebalance_is_not_extended_by_an_arrival_in_an_earlier_one(
        make_coordinator, clock, pool):
    """The new-member flag of one initial rebalance does not outlive it (docs/architecture.md,
    deliberate differences: Kafka only clears it when it extends the delay)."""
    from harness import Ctx
    from rcoord import MemberIdentity

    c = Ctx(make_coordinator(clock=clock, group_initial_rebalance_delay_ms=3000), clock, pool)
    c.session_timeout_ms = 60_000
    c.rebalance_timeout_ms = 3000  # no time left after the first delay: no extension
    a, b = c.new_member_id(), c.new_member_id()
    fa = c.join_async(a)
    wait_until(lambda: c.state() == "PreparingRebalance")
    fb = c.join_async(b)  # arrives during the initial rebalance
    wait_until(lambda: len(c.member_ids()) == 2)
    c.sleep(3000)
    assert fa.result(WAIT_S).generation_id == fb.result(WAIT_S).generation_id == 1
    assert c.coord.leave_group(c.group_id, [MemberIdentity(a), MemberIdentity(b)]).error == Errors.NONE
    assert c.state() == "Empty"
    # A later initial rebalance, with time to extend: nobody arrives during its delay, so it
    # completes when the first delay ends.
    c.rebalance_timeout_ms = 10_000
    d = c.new_member_id()
    fd = c.join_async(d)
    wait_until(lambda: c.state() == "PreparingRebalance")
    c.sleep(3000)
    wait_until(fd.done, lambda: c.sleep(0), timeout_s=2)
    assert fd.result(WAIT_S).generation_id == 3


def test_group_max_size_reached_for_new_member(make_coordinator, clock, pool):
    from harness import Ctx

    c = Ctx(make_coordinator(clock=clock, group_max_size=2), clock, pool)
    c.stable_group(2)
    res = c.join(require_known_member_id=False)
    assert res.error == Errors.GROUP_MAX_SIZE_REACHED and res.member_id == ""
    assert c.state() == "Stable"


def test_oversized_group_shrinks_after_max_size_lowered(redis_client, namespace, clock, pool):
    from harness import Ctx
    from rcoord import CoordinatorConfig

    base = dict(group_min_session_timeout_ms=10, group_initial_rebalance_delay_ms=0, namespace=namespace)
    c = Ctx(GroupCoordinator(redis_client, CoordinatorConfig(**base), clock=clock).start(), clock, pool)
    gen, ids = c.stable_group(3)
    # The operator lowers group_max_size; the group rebalances and turns the last rejoiner away.
    GroupCoordinator(redis_client, CoordinatorConfig(group_max_size=2, **base), clock=clock).start()
    assert c.heartbeat(ids[0], gen) == Errors.REBALANCE_IN_PROGRESS
    f0, f1 = c.join_async(ids[0]), c.join_async(ids[1])
    wait_until(lambda: c.group_field("wid") is not None and len(ids) == 3 and c.parked() == 2)
    late = c.join(ids[2])
    assert late.error == Errors.GROUP_MAX_SIZE_REACHED
    c.sleep(c.rebalance_timeout_ms)
    assert {f0.result(WAIT_S).generation_id, f1.result(WAIT_S).generation_id} == {gen + 1}
    assert c.member_ids() == set(ids[:2])


def test_join_timer_acts_before_a_session_timer_due_at_the_same_moment(ctx):
    """Kafka's testRebalanceCompletesBeforeMemberJoins: the join completes, keeping the member."""
    ctx.session_timeout_ms = ctx.rebalance_timeout_ms = 10_000
    first = ctx.join(group_instance_id="a")
    ctx.sync(first.member_id, first.generation_id, {}, group_instance_id="a")
    ctx.clock.sleep(1000)
    f_b = ctx.join_async(group_instance_id="b")  # a new static member starts a rebalance
    wait_until(lambda: ctx.state() == "PreparingRebalance")
    # Same millisecond: a's session deadline now equals the join deadline.
    assert ctx.heartbeat(first.member_id, first.generation_id, group_instance_id="a") == Errors.REBALANCE_IN_PROGRESS
    ctx.sleep(10_000)
    res = f_b.result(WAIT_S)
    assert res.error == Errors.NONE and res.generation_id == first.generation_id + 1
    assert len(ctx.member_ids()) == 2  # a, static and absent, is kept and rescheduled


def test_pending_member_turned_away_by_max_size_is_forgotten(make_coordinator, clock, pool):
    from harness import Ctx

    c = Ctx(make_coordinator(clock=clock, group_max_size=1), clock, pool)
    first, pending = c.new_member_id(), c.new_member_id()  # an Empty group hands out ids freely
    assert c.join(first).error == Errors.NONE
    assert c.join(pending).error == Errors.GROUP_MAX_SIZE_REACHED
    assert c.coord._redis.hlen(c._keys().pending) == 0  # no longer pending


def test_rebalance_timeout_must_be_positive(ctx):
    from rcoord import InvalidRequestError

    with pytest.raises(InvalidRequestError, match="rebalance_timeout_ms"):
        ctx.coord.join_group("g", protocol_type="consumer", protocols=PROTOCOLS,
                             session_timeout_ms=5000, rebalance_timeout_ms=0)
    # Without one it is the session timeout (JoinGroup v0): a session timeout that makes it
    # < 1 is answered as out of bounds, as Kafka answers it (it was InvalidRequestError).
    for session in (0, -1):
        res = ctx.coord.join_group("g", protocol_type="consumer", protocols=PROTOCOLS,
                                   session_timeout_ms=session)
        assert res.error == Errors.INVALID_SESSION_TIMEOUT


def test_a_protocol_listed_twice_is_refused_before_anything_is_written(ctx):
    """Kafka's broker takes a JoinGroup naming one protocol twice (its metadata, which one?);
    rcoord refuses it, naming the protocol, and the group is not created."""
    from rcoord import InvalidRequestError

    with pytest.raises(InvalidRequestError, match="'range' is listed twice"):
        ctx.coord.join_group("g", protocol_type="consumer",
                             protocols=[("range", b"a"), ("range", b"b")],
                             session_timeout_ms=5000, rebalance_timeout_ms=5000)
    assert ctx.coord.describe_group("g").state == "Dead"


def test_a_member_that_joins_twice_while_parked_gets_the_answer_on_both_calls(ctx):
    """After Kafka's testDynamicMembersCanRejoinGroupWithMaxSizeWhileRebalancing: a rejoin while
    parked replaces the parked request; here the earlier caller gets the same answer too."""
    gen, ids = ctx.stable_group(2)
    first = ctx.join_async(ids[0])
    wait_until(lambda: ctx.state() == "PreparingRebalance")
    again = ctx.join_async(ids[0])  # the same member, still parked
    wait_until(lambda: ctx.parked() == 1)
    other = ctx.join_async(ids[1])
    r_first, r_again, r_other = first.result(WAIT_S), again.result(WAIT_S), other.result(WAIT_S)
    assert r_first == r_again and r_first.error == Errors.NONE
    assert r_first.generation_id == r_other.generation_id == gen + 1


def test_max_size_turns_away_the_extra_member_while_the_others_rejoin(make_coordinator, clock, pool):
    """Kafka's testDynamicMembersCanRejoinGroupWithMaxSizeWhileRebalancing."""
    from harness import Ctx

    c = Ctx(make_coordinator(clock=clock, group_max_size=3, group_initial_rebalance_delay_ms=50), clock, pool)
    ids = [c.new_member_id() for _ in range(4)]
    second = [c.join_async(i) for i in ids]
    wait_until(lambda: sum(f.done() for f in second) == 1)  # the 4th is turned away at once
    assert [f.result(WAIT_S).error for f in second if f.done()] == [Errors.GROUP_MAX_SIZE_REACHED]
    assert len(c.member_ids()) == 3 and c.parked() == 3
    third = [c.join_async(i) for i in ids]  # members may rejoin while rebalancing
    c.sleep(50)
    c.sleep(50)
    results = [f.result(WAIT_S) for f in third]
    assert sorted(r.error for r in results) == sorted([Errors.NONE] * 3 + [Errors.GROUP_MAX_SIZE_REACHED])
    assert c.state() == "CompletingRebalance" and c.parked() == 0
