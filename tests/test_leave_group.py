"""LeaveGroup, single and batch (KIP-345), after Kafka's classic leave tests."""

from __future__ import annotations

from harness import WAIT_S, wait_until
from rcoord import Errors, MemberIdentity
from rcoord.protocol._checks import MAX_ID_BYTES

TOO_LONG = "x" * (MAX_ID_BYTES + 1)  # no member's id or instance id can be this long


def test_leave_empty_group_id(ctx):
    assert ctx.coord.leave_group("", [MemberIdentity("m")]).error == Errors.INVALID_GROUP_ID


def test_leave_unknown_group_reports_each_member_unknown(ctx):
    res = ctx.coord.leave_group(ctx.group_id, [MemberIdentity("a"), MemberIdentity("", "inst")])
    assert res.error == Errors.NONE
    assert [(m.member_id, m.group_instance_id, m.error) for m in res.members] == [
        ("a", None, Errors.UNKNOWN_MEMBER_ID),
        ("", "inst", Errors.UNKNOWN_MEMBER_ID),
    ]


def test_leave_last_member_makes_group_empty(ctx):
    gen, (mid,) = ctx.stable_group(1)
    res = ctx.coord.leave_group(ctx.group_id, [MemberIdentity(mid, reason="bye")])
    assert res.members[0].error == Errors.NONE
    assert ctx.state() == "Empty" and ctx.member_ids() == set()


def test_leave_triggers_rebalance_for_the_rest(ctx):
    gen, ids = ctx.stable_group(3)
    res = ctx.coord.leave_group(ctx.group_id, [MemberIdentity(ids[0])])
    assert res.members[0].error == Errors.NONE
    assert ctx.state() == "PreparingRebalance"
    results = [f.result(WAIT_S) for f in [ctx.join_async(i) for i in ids[1:]]]
    assert {r.generation_id for r in results} == {gen + 1}
    # The leader left: a new one was elected among those who rejoined.
    assert results[0].leader_id in ids[1:]


def test_batch_leave_in_request_order_with_unknown_members(ctx):
    gen, ids = ctx.stable_group(3)
    res = ctx.coord.leave_group(
        ctx.group_id,
        [MemberIdentity(ids[2]), MemberIdentity("ghost"), MemberIdentity(ids[1])],
    )
    assert [m.member_id for m in res.members] == [ids[2], "ghost", ids[1]]
    assert [m.error for m in res.members] == [Errors.NONE, Errors.UNKNOWN_MEMBER_ID, Errors.NONE]
    assert ctx.member_ids() == {ids[0]}


def test_leave_of_pending_member(ctx):
    gen, ids = ctx.stable_group(1)
    pending = ctx.new_member_id()
    res = ctx.coord.leave_group(ctx.group_id, [MemberIdentity(pending)])
    assert res.members[0].error == Errors.NONE
    assert ctx.join(pending).error == Errors.UNKNOWN_MEMBER_ID
    # As in Kafka, a successful leave of a Stable group's (pending) member starts a rebalance.
    assert ctx.state() == "PreparingRebalance"


def test_leave_completes_a_waiting_join_phase(ctx):
    ctx.session_timeout_ms = 60_000
    gen, ids = ctx.stable_group(2)
    f = ctx.join_async(ids[0])
    wait_until(lambda: ctx.state() == "PreparingRebalance")
    ctx.coord.leave_group(ctx.group_id, [MemberIdentity(ids[1])])
    assert f.result(WAIT_S).generation_id == gen + 1


def test_member_leaving_while_parked_in_join_gets_unknown_member(ctx):
    ctx.session_timeout_ms = 60_000
    gen, ids = ctx.stable_group(2)
    f_leader = ctx.join_async(ids[0])
    wait_until(lambda: ctx.state() == "PreparingRebalance")
    ctx.coord.leave_group(ctx.group_id, [MemberIdentity(ids[0])])
    assert f_leader.result(WAIT_S).error == Errors.UNKNOWN_MEMBER_ID


def test_a_long_leave_is_sent_in_chunks_with_the_answers_of_one_call(ctx, monkeypatch, namespace):
    # Two members per call: six names make three calls, in request order, and each member's
    # answer is what one call would give (a member named again after it left is unknown,
    # whichever call names it).
    from rcoord.protocol import leave
    from rcoord.steps import GroupSteps

    monkeypatch.setattr(leave, "LEAVE_CHUNK", 2)
    calls = []
    call = GroupSteps.call

    def counting(self, step, keys, *args, **kwargs):
        # Only this test's namespace: a thread an earlier test left behind may still run a step
        # for a group of the same name (CI caught an await_reply counted here).
        if self.namespace == namespace and keys.group_id == ctx.group_id:
            calls.append(step)
        return call(self, step, keys, *args, **kwargs)

    monkeypatch.setattr(GroupSteps, "call", counting)
    _gen, ids = ctx.stable_group(4)
    calls.clear()
    names = [MemberIdentity(ids[3]), MemberIdentity("ghost"), MemberIdentity(ids[1]),
             MemberIdentity(ids[3]), MemberIdentity("", "no-such-instance"), MemberIdentity(ids[0])]
    res = ctx.coord.leave_group(ctx.group_id, names)
    assert calls == ["leave_group"] * 3
    assert res.error == Errors.NONE
    assert [(m.member_id, m.error) for m in res.members] == [
        (ids[3], Errors.NONE), ("ghost", Errors.UNKNOWN_MEMBER_ID), (ids[1], Errors.NONE),
        (ids[3], Errors.UNKNOWN_MEMBER_ID), ("", Errors.UNKNOWN_MEMBER_ID), (ids[0], Errors.NONE),
    ]
    assert ctx.member_ids() == {ids[2]}
    assert ctx.state() == "PreparingRebalance"


def test_a_top_level_error_of_a_later_call_answers_every_member_not_yet_removed():
    # The first call removed its members; the group died before the second: those members
    # did leave, and the others get the second call's error (they may try again).
    from rcoord.protocol.leave import decode_leave

    names = [MemberIdentity("a"), MemberIdentity("b"), MemberIdentity("c")]
    res = decode_leave([[b"NONE", [b"NONE"]], [b"COORDINATOR_NOT_AVAILABLE", []]], names)
    assert res.error == Errors.NONE
    assert [m.error for m in res.members] == [
        Errors.NONE, Errors.COORDINATOR_NOT_AVAILABLE, Errors.COORDINATOR_NOT_AVAILABLE]
    # The first call's top-level error is the request's.
    assert decode_leave([[b"COORDINATOR_NOT_AVAILABLE", []]], names).error == \
        Errors.COORDINATOR_NOT_AVAILABLE


def test_identities_no_member_can_have_are_answered_each_as_kafka_would(ctx):
    # Each was refused InvalidRequestError, for the whole batch, and nobody left. Kafka answers
    # each identity by itself: an instance id no static member has is unknown whatever the
    # member id; a member id past the bound is nobody's, so with a static member's instance id
    # it is fenced (validateMember), as any other member id would be.
    mid = ctx.join(group_instance_id="i1").member_id
    res = ctx.coord.leave_group(ctx.group_id, [
        MemberIdentity(TOO_LONG, "i1"), MemberIdentity(TOO_LONG), MemberIdentity("", ""),
        MemberIdentity(mid, TOO_LONG), MemberIdentity("", "i1")])
    assert res.error == Errors.NONE
    assert [(m.member_id, m.group_instance_id, m.error) for m in res.members] == [
        (TOO_LONG, "i1", Errors.FENCED_INSTANCE_ID), (TOO_LONG, None, Errors.UNKNOWN_MEMBER_ID),
        ("", "", Errors.UNKNOWN_MEMBER_ID), (mid, TOO_LONG, Errors.UNKNOWN_MEMBER_ID),
        ("", "i1", Errors.NONE)]
    assert ctx.member_ids() == set()


def test_an_identity_no_call_carried_keeps_its_place_beside_a_later_calls_error():
    from rcoord.protocol.leave import decode_leave

    names = [MemberIdentity("a"), MemberIdentity("", ""), MemberIdentity("b"),
             MemberIdentity("", TOO_LONG), MemberIdentity("c")]
    res = decode_leave([[b"NONE", [b"NONE"]], [b"COORDINATOR_NOT_AVAILABLE", []]], names)
    assert [m.error for m in res.members] == [
        Errors.NONE, Errors.UNKNOWN_MEMBER_ID, Errors.COORDINATOR_NOT_AVAILABLE,
        Errors.UNKNOWN_MEMBER_ID, Errors.COORDINATOR_NOT_AVAILABLE]
