"""Static membership (KIP-345), after Kafka's classic static member tests."""

from __future__ import annotations

from harness import WAIT_S, wait_until
from rcoord import Errors, MemberIdentity, TopicPartition
from rcoord.protocol.consumer import ConsumerProtocolSubscription


def _static_group(ctx, instances, protocols=None):
    """Form a Stable group of static members; returns (generation, {instance: member id})."""
    if protocols is not None:
        join_async = ctx.join_async
        ctx.join_async = lambda *a, **kw: join_async(*a, **{"protocols": protocols, **kw})
    first = ctx.join(group_instance_id=instances[0])  # static members need no second join
    assert first.error == Errors.NONE and first.member_id.startswith(instances[0] + "-")
    ctx.sync(first.member_id, first.generation_id, {first.member_id: b"a0"}, group_instance_id=instances[0])
    ids = {instances[0]: first.member_id}
    # New static members park first (there is no pending phase for them), then the leader.
    others = [ctx.join_async(group_instance_id=i) for i in instances[1:]]
    wait_until(lambda: ctx.parked() == len(instances) - 1)
    futures = [ctx.join_async(first.member_id, group_instance_id=instances[0]), *others]
    results = [f.result(WAIT_S) for f in futures]
    for inst, res in zip(instances, results):
        assert res.error == Errors.NONE, res
        ids[inst] = res.member_id
    gen = results[0].generation_id
    leader = results[0].leader_id
    syncs = [
        ctx.sync_async(ids[i], gen, {m: i.encode() for i, m in ids.items()} if ids[i] == leader else None,
                       group_instance_id=i)
        for i in instances
    ]
    for s in syncs:
        assert s.result(WAIT_S).error == Errors.NONE
    assert ctx.state() == "Stable"
    if protocols is not None:
        del ctx.join_async
    return gen, ids


def test_static_member_rejoining_with_unknown_id_replaces_old_without_rebalance(ctx):
    gen, ids = _static_group(ctx, ["a", "b"])
    res = ctx.join(group_instance_id="b")
    assert res.error == Errors.NONE
    assert res.member_id != ids["b"] and res.member_id.startswith("b-")
    assert res.generation_id == gen and ctx.state() == "Stable"
    assert res.members == [] and res.skip_assignment is False
    # The old id is fenced; the new one keeps the old assignment.
    assert ctx.heartbeat(ids["b"], gen, group_instance_id="b") == Errors.FENCED_INSTANCE_ID
    assert ctx.heartbeat(res.member_id, gen, group_instance_id="b") == Errors.NONE
    assert ctx.sync(res.member_id, gen, group_instance_id="b").assignment == b"b"


def test_static_leader_rejoin_gets_members_and_skip_assignment(ctx):
    gen, ids = _static_group(ctx, ["a", "b"])
    leader_instance = next(i for i, m in ids.items() if m == ctx.group_field("leader"))
    res = ctx.join(group_instance_id=leader_instance)
    assert res.error == Errors.NONE and res.generation_id == gen
    assert res.leader_id == res.member_id  # leadership moved to the new member id
    assert res.skip_assignment is True
    assert {m.group_instance_id for m in res.members} == {"a", "b"}
    assert ctx.state() == "Stable"


def test_static_leader_rejoin_without_skip_assignment_is_told_to_follow(ctx):
    """A client that cannot read SkipAssignment (Kafka's JoinGroup below v9, as librdkafka's
    v5) is answered as Kafka answers it (GroupMetadataManager's static member in Stable):
    the leader it replaced and no members, so it follows and does not run its assignor. It was
    told it leads, with every member, and assigned for nothing. A follower's rejoin is
    answered the same either way; the group keeps its generation and the new id leads."""
    gen, ids = _static_group(ctx, ["a", "b"])
    old_leader = ctx.group_field("leader")
    leader_instance = next(i for i, m in ids.items() if m == old_leader)
    res = ctx.join(group_instance_id=leader_instance, supports_skip_assignment=False)
    assert (res.error, res.generation_id, res.skip_assignment) == (Errors.NONE, gen, False)
    assert res.member_id != old_leader and res.leader_id == old_leader
    assert res.members == []
    assert ctx.group_field("leader") == res.member_id and ctx.state() == "Stable"
    follower = next(i for i in ids if i != leader_instance)
    res = ctx.join(group_instance_id=follower, supports_skip_assignment=False)
    assert (res.error, res.skip_assignment, res.members) == (Errors.NONE, False, [])
    assert res.leader_id == ctx.group_field("leader")


def test_static_member_with_changed_protocol_triggers_rebalance(ctx):
    gen, ids = _static_group(ctx, ["a", "b"])
    f = ctx.join_async(group_instance_id="b", protocols=[("roundrobin", b""), ("range", b"x")])
    wait_until(lambda: ctx.state() != "Stable" or f.done())
    # "range" is still the only common protocol, so the selected protocol does not change.
    assert f.result(WAIT_S).generation_id == gen
    f2 = ctx.join_async(group_instance_id="a", protocols=[("roundrobin", b"")])
    # No protocol in common for a -> rejected; group untouched.
    assert f2.result(WAIT_S).error == Errors.INCONSISTENT_GROUP_PROTOCOL


def _subscribing(*topics, owned=(), generation=-1):
    return [("range", ConsumerProtocolSubscription(
        topics=list(topics), owned_partitions=list(owned), generation_id=generation).encode())]


def test_static_member_back_with_other_topics_rebalances(ctx):
    """A reviewer's repro: a static member restarted with another subscription was handed its
    old assignment with no rebalance (Kafka's classic coordinator looks at the selected protocol
    only; KAFKA-12759 proposes this): it read a topic it no longer subscribes to, and nobody read
    its new one. The same topics in other bytes (owned partitions) still rebalance nothing."""
    gen, ids = _static_group(ctx, ["a", "b"], protocols=_subscribing("t"))
    same = ctx.join(group_instance_id="b", protocols=_subscribing(
        "t", owned=[TopicPartition("t", 0)], generation=gen))
    assert same.error == Errors.NONE and same.generation_id == gen
    assert ctx.state() == "Stable"
    other = ctx.join_async(group_instance_id="b", protocols=_subscribing("t", "u"))
    wait_until(lambda: ctx.state() == "PreparingRebalance")
    back = ctx.join(ids["a"], group_instance_id="a", protocols=_subscribing("t"))
    joined = other.result(WAIT_S)
    assert (back.error, joined.error) == (Errors.NONE, Errors.NONE)
    assert back.generation_id == joined.generation_id == gen + 1


def test_fenced_static_member_id_cannot_join_sync_or_leave(ctx):
    gen, ids = _static_group(ctx, ["a"])
    new = ctx.join(group_instance_id="a")
    old = ids["a"]
    assert ctx.join(old, group_instance_id="a").error == Errors.FENCED_INSTANCE_ID
    assert ctx.sync(old, gen, group_instance_id="a").error == Errors.FENCED_INSTANCE_ID
    res = ctx.coord.leave_group(ctx.group_id, [MemberIdentity(old, "a")])
    assert res.members[0].error == Errors.FENCED_INSTANCE_ID
    assert new.member_id in ctx.member_ids()


def test_unknown_instance_id_with_member_id_is_unknown_member(ctx):
    gen, ids = _static_group(ctx, ["a"])
    assert ctx.heartbeat(ids["a"], gen, group_instance_id="zzz") == Errors.UNKNOWN_MEMBER_ID


def test_static_member_rejoin_during_completing_rebalance_restarts_rebalance(ctx):
    gen, ids = _static_group(ctx, ["a", "b"])
    leader = ctx.group_field("leader")
    leader_inst = next(i for i, m in ids.items() if m == leader)
    other_inst = next(i for i in ids if i != leader_inst)
    fl = ctx.join_async(leader, group_instance_id=leader_inst)
    wait_until(lambda: ctx.state() == "PreparingRebalance")
    fo = ctx.join_async(ids[other_inst], group_instance_id=other_inst)
    fl.result(WAIT_S), fo.result(WAIT_S)
    assert ctx.state() == "CompletingRebalance"
    # The other member restarts with no member id: a new rebalance must start.
    fn = ctx.join_async(group_instance_id=other_inst)
    wait_until(lambda: ctx.state() == "PreparingRebalance")
    fl2 = ctx.join_async(leader, group_instance_id=leader_inst)
    assert fn.result(WAIT_S).generation_id == fl2.result(WAIT_S).generation_id == gen + 2


def test_parked_join_of_replaced_static_member_is_fenced(ctx):
    ctx.session_timeout_ms = 60_000
    gen, ids = _static_group(ctx, ["a", "b"])
    leader = ctx.group_field("leader")
    inst = next(i for i, m in ids.items() if m == leader)
    parked = ctx.join_async(leader, group_instance_id=inst)
    wait_until(lambda: ctx.state() == "PreparingRebalance")
    replacement = ctx.join_async(group_instance_id=inst)
    assert parked.result(WAIT_S).error == Errors.FENCED_INSTANCE_ID
    other = next(i for i in ids if i != inst)
    fo = ctx.join_async(ids[other], group_instance_id=other)
    assert replacement.result(WAIT_S).generation_id == fo.result(WAIT_S).generation_id == gen + 1


def test_static_member_not_removed_when_it_misses_a_rebalance(ctx):
    ctx.session_timeout_ms = 60_000
    gen, ids = _static_group(ctx, ["a", "b"])
    leader = ctx.group_field("leader")
    inst = next(i for i, m in ids.items() if m == leader)
    f = ctx.join_async(leader, group_instance_id=inst)
    wait_until(lambda: ctx.state() == "PreparingRebalance")
    ctx.sleep(ctx.rebalance_timeout_ms)
    res = f.result(WAIT_S)
    assert res.generation_id == gen + 1
    # The absent static member stays (only its session timeout can remove it).
    assert ctx.member_ids() == set(ids.values())


def test_leave_by_instance_id(ctx):
    gen, ids = _static_group(ctx, ["a", "b"])
    res = ctx.coord.leave_group(ctx.group_id, [MemberIdentity("", "b"), MemberIdentity("", "nope")])
    assert [m.error for m in res.members] == [Errors.NONE, Errors.UNKNOWN_MEMBER_ID]
    assert ctx.member_ids() == {ids["a"]}


def test_pending_member_join_with_instance_id_is_server_error(ctx):
    pending = ctx.new_member_id()
    assert ctx.join(pending, group_instance_id="x").error == Errors.UNKNOWN_SERVER_ERROR


def test_group_waits_in_preparing_rebalance_for_an_absent_static_member(ctx):
    """Kafka's testGroupStuckInRebalanceTimeoutDueToNonjoinedStaticMember."""
    ctx.session_timeout_ms = 10_000
    ctx.rebalance_timeout_ms = 5_000
    gen, ids = _static_group(ctx, ["leader", "follower"])
    # A dynamic member joins; the static members do not rejoin before the rebalance timeout.
    f = ctx.join_async(require_known_member_id=False)
    wait_until(lambda: ctx.state() == "PreparingRebalance")
    ctx.sleep(ctx.rebalance_timeout_ms)
    res = f.result(WAIT_S)
    assert res.error == Errors.NONE and res.leader_id == res.member_id  # the new member leads
    assert len(res.members) == 3 and res.generation_id == gen + 1
    assert ctx.state() == "CompletingRebalance"
    # The static follower leaves; at the next timeout only the static leader is kept, and with
    # nobody rejoined the group stays in PreparingRebalance (generation unchanged).
    ctx.coord.leave_group(ctx.group_id, [MemberIdentity(ids["follower"], "follower")])
    assert ctx.state() == "PreparingRebalance"
    ctx.sleep(ctx.rebalance_timeout_ms)
    assert ctx.member_ids() == {ids["leader"]}
    assert ctx.group_field("gen") == str(gen + 1) and ctx.state() == "PreparingRebalance"


def test_parked_sync_of_replaced_static_member_is_fenced(ctx):
    """Kafka's testStaticMemberFenceDuplicateSyncingFollowerAfterMemberIdChanged."""
    ctx.session_timeout_ms = 60_000
    gen, ids = _static_group(ctx, ["a", "b"])
    leader = ctx.group_field("leader")
    leader_inst = next(i for i, m in ids.items() if m == leader)
    follower_inst = next(i for i in ids if i != leader_inst)
    fl = ctx.join_async(leader, group_instance_id=leader_inst)
    wait_until(lambda: ctx.state() == "PreparingRebalance")
    ff = ctx.join_async(ids[follower_inst], group_instance_id=follower_inst)
    new_gen = fl.result(WAIT_S).generation_id
    assert ff.result(WAIT_S).generation_id == new_gen
    parked = ctx.sync_async(ids[follower_inst], new_gen, group_instance_id=follower_inst)
    wait_until(lambda: ctx.awaiting_sync(ids[follower_inst]))
    # The same instance restarts with no member id: the parked sync of the old id is fenced,
    # and the group rebalances (the leader may have assigned to the old id).
    ctx.join_async(group_instance_id=follower_inst)
    assert parked.result(WAIT_S).error == Errors.FENCED_INSTANCE_ID
    wait_until(lambda: ctx.state() == "PreparingRebalance")


def test_a_static_member_restarting_in_a_full_group_takes_its_place(make_coordinator, clock, pool):
    """A reviewer's repro: a static member that restarted (no member id) in a group at
    group_max_size was counted as a new member and got GROUP_MAX_SIZE_REACHED, fatal to its
    client, though it only replaces its own member. A new instance is still turned away."""
    from harness import Ctx

    c = Ctx(make_coordinator(clock=clock, group_max_size=2), clock, pool)
    gen, ids = _static_group(c, ["a", "b"])
    res = c.join(group_instance_id="b")
    assert res.error == Errors.NONE and res.generation_id == gen
    assert c.state() == "Stable" and c.member_ids() == {ids["a"], res.member_id}
    assert c.join(group_instance_id="c").error == Errors.GROUP_MAX_SIZE_REACHED


def test_a_static_member_restarting_while_its_old_join_is_parked_in_a_full_group(
        make_coordinator, clock, pool):
    """The same during a rebalance whose parked joins fill the group: the replaced member was
    parked, so the replacement is accepted (its old join is fenced) and the group forms."""
    from harness import Ctx

    c = Ctx(make_coordinator(clock=clock, group_max_size=2, group_initial_rebalance_delay_ms=1000),
            clock, pool)
    fa, fb = c.join_async(group_instance_id="a"), c.join_async(group_instance_id="b")
    wait_until(lambda: c.parked() == 2)
    again = c.join_async(group_instance_id="b")
    assert fb.result(WAIT_S).error == Errors.FENCED_INSTANCE_ID
    ra, rb = c.settle([fa, again])
    assert (ra.error, rb.error) == (Errors.NONE, Errors.NONE)
    assert ra.generation_id == rb.generation_id == 1
    assert c.member_ids() == {ra.member_id, rb.member_id}
