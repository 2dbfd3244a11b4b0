"""Heartbeat and session expiry, after Kafka's classic heartbeat tests."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from harness import WAIT_S, drive_by_hand, wait_until

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


def test_heartbeat_many_refuses_a_heartbeat_of_the_wrong_shape(ctx):
    """A reviewer's repro: a heartbeat with two items failed with ``IndexError: tuple index out
    of range`` (naming neither the heartbeat nor its shape), and one with a fifth item lost it
    without a word; on both coordinators. Now a TypeError names the shape and the index."""
    for bad in [(ctx.group_id, 1), (ctx.group_id, 1, "m", None, "extra"), "g1m"]:
        with pytest.raises(TypeError, match=r"\(group_id, generation_id, member_id.* index 1"):
            ctx.coord.heartbeat_many([(ctx.group_id, 1, "m"), bad])


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


HBM_JOIN = {"protocol_type": "consumer", "protocols": [("range", b"")],
            "session_timeout_ms": 60_000, "rebalance_timeout_ms": 60_000}


def _one_group_per_master(port_of: Any) -> dict[int, str]:
    """A group id on each master of a 3-master cluster: {master's port: group id}."""
    by_port: dict[int, str] = {}
    n = 0
    while len(by_port) < 3:
        by_port.setdefault(port_of(f"g{n}"), f"g{n}")
        n += 1
    return by_port


def _fail_master(cluster: Any, port: int, how: str) -> Callable[[], None]:
    """Make the master on ``port`` fail: ``down`` stops it; ``refusing`` makes it refuse every
    function that may write with NOREPLICAS (it asks for more replicas than it has; not OOM:
    the heartbeat is flagged ``allow-oom`` and answers then). Returns what ends a refusal."""
    server = next(s for s in cluster.nodes if s.port == port)
    if how == "down":
        server.stop()
        return lambda: None
    node = server.client()
    node.config_set("min-replicas-to-write", 100)

    def serve() -> None:
        node.config_set("min-replicas-to-write", 0)
        node.close()

    return serve


@pytest.mark.parametrize("how", ["down", "refusing"])
def test_heartbeat_many_on_a_cluster_with_a_master_failing_answers_the_others(how):
    """One master of a cluster is down, or answers but refuses the call for now (too few
    replicas, a failed save, a slot migrating). redis-py fails a pipeline that addresses a
    down master as a whole, and a refused group's retry (expire_deadlines, then the heartbeat
    alone) raised out of the flow: heartbeat_many used to raise for every member, losing the
    answers of the groups on the healthy masters (REBALANCE_IN_PROGRESS among them) for as
    long as it lasted. Now those members get their answers and the failing master's
    COORDINATOR_NOT_AVAILABLE (Kafka's answer when a coordinator is unavailable, which
    clients retry)."""
    from rcoord import CoordinatorConfig, GroupCoordinator
    from rcoord.testing.embedded import EmbeddedCluster

    with EmbeddedCluster(masters=3).start() as cluster:
        client = cluster.client(socket_connect_timeout=2, socket_timeout=5)
        try:
            coord = GroupCoordinator(client, CoordinatorConfig(
                namespace="hbmany", group_min_session_timeout_ms=10,
                group_initial_rebalance_delay_ms=0)).start()
            by_port = _one_group_per_master(
                lambda gid: client.get_node_from_key(coord._keys(gid).group).port)
            members: dict[str, tuple[int, str]] = {}
            for gid in by_port.values():
                mid = coord.join_group(gid, **HBM_JOIN).member_id
                joined = coord.join_group(gid, mid, **HBM_JOIN)
                coord.sync_group(gid, joined.generation_id, mid, assignments={mid: b""})
                members[gid] = (joined.generation_id, mid)
            failing_port = next(iter(by_port))
            serve = _fail_master(cluster, failing_port, how)
            asked = [(gid, *members[gid]) for gid in by_port.values()]
            answers = dict(zip(by_port, coord.heartbeat_many(asked), strict=True))
            assert answers.pop(failing_port) == Errors.COORDINATOR_NOT_AVAILABLE
            assert list(answers.values()) == [Errors.NONE, Errors.NONE]
            if how == "refusing":
                serve()
                assert coord.heartbeat_many(asked) == [Errors.NONE] * 3
        finally:
            client.close()


@pytest.mark.parametrize("how", ["down", "refusing"])
def test_asyncio_heartbeat_many_on_a_cluster_with_a_master_failing_answers_the_others(how):
    """The asyncio driver shares the flow and the per-call fallback."""
    import asyncio
    import gc
    import warnings

    import redis.asyncio.cluster

    from rcoord import CoordinatorConfig
    from rcoord.asyncio import AsyncGroupCoordinator
    from rcoord.testing.embedded import EmbeddedCluster

    with EmbeddedCluster(masters=3).start() as cluster:
        async def run() -> None:
            seed = cluster.nodes[0]
            client = redis.asyncio.cluster.RedisCluster(
                host="127.0.0.1", port=seed.port, socket_connect_timeout=2, socket_timeout=5)
            try:
                coord = await AsyncGroupCoordinator(client, CoordinatorConfig(
                    namespace="ahbmany", group_min_session_timeout_ms=10,
                    group_initial_rebalance_delay_ms=0)).start()
                await client.initialize()
                by_port = _one_group_per_master(
                    lambda gid: client.get_node_from_key(coord._steps.keys(gid).group).port)
                members: dict[str, tuple[int, str]] = {}
                for gid in by_port.values():
                    mid = (await coord.join_group(gid, **HBM_JOIN)).member_id
                    joined = await coord.join_group(gid, mid, **HBM_JOIN)
                    await coord.sync_group(gid, joined.generation_id, mid, assignments={mid: b""})
                    members[gid] = (joined.generation_id, mid)
                failing_port = next(iter(by_port))
                serve = _fail_master(cluster, failing_port, how)
                try:
                    asked = [(gid, *members[gid]) for gid in by_port.values()]
                    got = await coord.heartbeat_many(asked)
                    answers = dict(zip(by_port, got, strict=True))
                    assert answers.pop(failing_port) == Errors.COORDINATOR_NOT_AVAILABLE
                    assert list(answers.values()) == [Errors.NONE, Errors.NONE]
                finally:
                    serve()
            finally:
                await client.aclose()

        asyncio.run(run())
        # redis-py's asyncio cluster client, rediscovering the cluster after the lost master,
        # replaces node objects without closing their connections (to healthy nodes too);
        # collect them here rather than let the next test's setup report them.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            gc.collect()


@pytest.mark.parametrize("refusal", [
    "NOREPLICAS Not enough good replicas to write.",
    # (a password rotated one master at a time: that master refuses the login, the batched
    # path already answered COORDINATOR_NOT_AVAILABLE for its groups alone)
    "WRONGPASS invalid username-password pair or user is disabled.",
], ids=["refusing", "refusing-the-login"])
def test_heartbeat_many_whose_due_group_is_refused_one_by_one_answers_the_others(
        refusal: str) -> None:
    """A group whose deadlines fell due is sent again (after expire_deadlines); when that
    answers DUE again its members go one by one through ``heartbeat``. Only the resend was
    guarded against a master that refuses the call for now (NOREPLICAS, MISCONF, TRYAGAIN):
    a refusal of a one-by-one heartbeat left the flow, so heartbeat_many raised for every
    member of every group. Now the members not answered yet get COORDINATOR_NOT_AVAILABLE,
    and the other groups' answers stand. Driven here as a flow, which both coordinators
    (blocking and asyncio) run as it is. A login the master refuses is answered so too: it
    was, as a lost connection, until a refused login became ``AuthenticationFailedError``."""
    import redis.exceptions

    from rcoord import CoordinatorConfig
    from rcoord.steps import GroupSteps

    cfg = CoordinatorConfig(namespace="hbdue")
    steps = GroupSteps(cfg, "hbdue", None)
    steps.config = cfg
    refused: redis.exceptions.RedisError = (
        redis.exceptions.AuthenticationError(refusal) if refusal.startswith("WRONGPASS")
        else redis.exceptions.ResponseError(refusal))

    def refuse() -> None:
        raise refused  # the master refuses the second member's heartbeat for now

    heartbeats_of_a, answer = _due_then_one_by_one(refuse)
    got = drive_by_hand(steps.heartbeat_many([("a", 1, "m1"), ("b", 1, "n1"), ("a", 1, "m2")]),
                        answer)
    assert got == [Errors.NONE, Errors.NONE, Errors.COORDINATOR_NOT_AVAILABLE]
    assert heartbeats_of_a == ["m1", "m1", "m2"]


def test_heartbeat_many_whose_due_group_stays_refused_one_by_one_answers_the_others() -> None:
    """As above, but the one-by-one heartbeat is refused under a stale layout (the partition
    count changed) at each of its re-settles: that heartbeat raises once they run out, and
    heartbeat_many raised it for every member of every group. Now this group's members not
    answered yet get NOT_COORDINATOR, as the resend's refusal answers them, and the other
    groups' answers stand."""
    import redis.exceptions

    from rcoord import CoordinatorConfig
    from rcoord.steps import NOT_COORDINATOR_RETRIES, GroupSteps

    steps = GroupSteps(CoordinatorConfig(namespace="hbdue"), "hbdue", None)
    steps.config = CoordinatorConfig(namespace="hbdue")

    def refuse() -> None:
        # The second member's: refused under a stale layout, each time after another process
        # settled (a new config in force: this call does not settle again itself).
        steps.config = CoordinatorConfig(namespace="hbdue")
        raise redis.exceptions.ResponseError(
            "RCOORD_NOT_COORDINATOR no settings at hbdue:{10.0.2}:cfg")

    heartbeats_of_a, answer = _due_then_one_by_one(refuse)
    batch = [("a", 1, "m1"), ("b", 1, "n1"), ("a", 1, "m2"), ("a", 1, "m3")]
    got = drive_by_hand(steps.heartbeat_many(batch), answer)
    assert got == [Errors.NONE, Errors.NONE, Errors.NOT_COORDINATOR, Errors.NOT_COORDINATOR]
    assert heartbeats_of_a == ["m1", "m1"] + ["m2"] * (NOT_COORDINATOR_RETRIES + 1)


def _due_then_one_by_one(refuse: Any) -> tuple[list[str], Any]:
    """A driver's answers for ``heartbeat_many`` of group "a" (two or more members) and "b":
    the batch finds "a" due and answers "b"; "a"'s resend falls due again, so its members go
    one by one; the first is answered NONE, and each later heartbeat calls ``refuse`` (which
    raises). Returns the member ids of "a"'s heartbeats as sent, and the answer function."""
    from rcoord.flow import Script, ScriptBatch

    heartbeats_of_a: list[str] = []

    def answer(op: Any) -> Any:
        if isinstance(op, ScriptBatch):  # group "a" falls due; "b" answers
            return [b"DUE" if args[1] == "a" else [b"NONE"] for _, args in op.calls]
        assert isinstance(op, Script) and op.args[1] == "a", op
        if op.name == "expire_deadlines":
            return [1]
        heartbeats_of_a.append(op.args[2])
        if len(heartbeats_of_a) == 1:
            return b"DUE"  # the resend falls due again
        if len(heartbeats_of_a) == 2:
            return [b"NONE"]  # the first member, alone
        refuse()
        raise AssertionError("refuse() must raise")

    return heartbeats_of_a, answer
