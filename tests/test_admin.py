"""Describe, list and delete groups; delete offsets (KIP-496); offsets retention (KIP-211)."""

from __future__ import annotations

from typing import Any

import pytest
from harness import wait_until

from rcoord import Errors, MemberIdentity, OffsetAndMetadata, TopicPartition
from rcoord import steps as steps_module
from rcoord.keys import GroupKeys, replays_key
from rcoord.protocol.consumer import ConsumerProtocolSubscription

ORDERS0, AUDIT0 = TopicPartition("orders", 0), TopicPartition("audit", 0)


def _sub(*topics: str) -> list[tuple[str, bytes]]:
    return [("range", ConsumerProtocolSubscription(topics=list(topics)).encode())]


def test_describe_unknown_group_is_dead(ctx):
    d = ctx.coord.describe_group("nobody")
    assert (d.error, d.group_id, d.state, d.members) == (Errors.NONE, "nobody", "Dead", [])


def test_a_group_made_again_in_the_same_millisecond_has_another_incarnation(
        ctx, redis_client, namespace):
    # Deleted and made again at the same (mock) time, the group's record has the same
    # 'created'; its incarnation token still differs, and group_incarnation (one read, for
    # callers with no coordinator) answers it with the generation.
    from rcoord.coordinator import group_incarnation

    assert ctx.coord.describe_group("g").incarnation == ""  # (Dead)
    assert group_incarnation(redis_client, namespace, "g") is None
    assert group_incarnation(redis_client, namespace + "-none", "g") is None  # (no settings)
    ctx.coord.commit_offsets("g", {ORDERS0: OffsetAndMetadata(5)})
    first = ctx.coord.describe_group("g").incarnation
    assert first and group_incarnation(redis_client, namespace, "g") == (first, 0)
    assert ctx.coord.delete_groups(["g"]) == {"g": Errors.NONE}
    ctx.coord.commit_offsets("g", {ORDERS0: OffsetAndMetadata(5)})
    again = ctx.coord.describe_group("g").incarnation
    assert again and again != first
    assert group_incarnation(redis_client, namespace, "g") == (again, 0)


def test_a_group_record_without_a_token_has_its_creation_time_for_incarnation(
        ctx, redis_client, namespace):
    # (a record an older rcoord made has no 'inc')
    from rcoord.coordinator import group_incarnation

    ctx.coord.commit_offsets("g", {ORDERS0: OffsetAndMetadata(5)})
    record = GroupKeys.of(namespace, ctx.coord.config.num_partitions, "g").group
    redis_client.hdel(record, "inc")
    created = redis_client.hget(record, "created").decode()
    assert ctx.coord.describe_group("g").incarnation == created
    assert group_incarnation(redis_client, namespace, "g") == (created, 0)


def test_describe_stable_group_shows_metadata_and_assignment(ctx):
    gen, ids = ctx.stable_group(2, client_id="cid", client_host="/10.0.0.1")
    d = ctx.coord.describe_group(ctx.group_id)
    assert d.state == "Stable" and d.protocol_type == "consumer" and d.protocol_name == "range"
    by_id = {m.member_id: m for m in d.members}
    assert set(by_id) == set(ids)
    m = by_id[ids[1]]
    assert (m.client_id, m.client_host, m.metadata, m.assignment) == (
        "cid", "/10.0.0.1", b"range-meta", ids[1].encode())


def test_a_group_larger_than_a_page_is_described_a_page_per_call(ctx, monkeypatch, namespace):
    # (lua/describe_group.lua: listing 1,000 members in one call held the shard 7-9 ms)
    import rcoord.steps
    from rcoord.steps import GroupSteps

    _gen, ids = ctx.stable_group(5, client_id="cid")
    whole = ctx.coord.describe_group(ctx.group_id)
    calls = []
    call = GroupSteps.call

    def counting(self, step, keys, args):
        if self.namespace == namespace and step == "describe_group":
            calls.append(list(args))
        return call(self, step, keys, args)

    monkeypatch.setattr(GroupSteps, "call", counting)
    monkeypatch.setattr(rcoord.steps, "DESCRIBE_PAGE", 2)
    paged = ctx.coord.describe_group(ctx.group_id)
    assert calls == [[0, 2], [2, 2], [4, 2]]
    assert paged == whole and len(paged.members) == 5 and paged.state == "Stable"
    assert {m.member_id: m.assignment for m in paged.members} == {m: m.encode() for m in ids}


def test_describe_rebalancing_group_hides_metadata(ctx):
    gen, ids = ctx.stable_group(2)
    ctx.join_async(ids[0])
    wait_until(lambda: ctx.state() == "PreparingRebalance")
    d = ctx.coord.describe_group(ctx.group_id)
    assert d.state == "PreparingRebalance" and d.protocol_name == ""
    assert {m.metadata for m in d.members} == {b""}


def test_list_groups_across_partitions_with_state_filter(ctx):
    ctx.stable_group(1)
    for i in range(5):
        assert ctx.coord.commit_offsets(f"simple-{i}", {ORDERS0: i})[ORDERS0] == Errors.NONE
    listed = {g.group_id: g for g in ctx.coord.list_groups()}
    assert listed[ctx.group_id].state == "Stable" and listed[ctx.group_id].protocol_type == "consumer"
    assert {f"simple-{i}" for i in range(5)} <= set(listed)
    assert listed["simple-0"].state == "Empty" and listed["simple-0"].protocol_type == ""
    assert {g.group_id for g in ctx.coord.list_groups(["STABLE"])} == {ctx.group_id}
    assert {g.group_id for g in ctx.coord.list_groups(["empty"])} == {f"simple-{i}" for i in range(5)}
    # An empty filter is no filter (Kafka's StatesFilter: "if empty, all groups are returned");
    # it matched no group.
    assert {g.group_id for g in ctx.coord.list_groups([])} == set(listed)


def test_delete_groups(ctx):
    gen, (mid,) = ctx.stable_group(1)
    ctx.coord.commit_offsets("offsets-only", {ORDERS0: 5})
    res = ctx.coord.delete_groups([ctx.group_id, "offsets-only", "unknown", ""])
    assert res == {
        ctx.group_id: Errors.NON_EMPTY_GROUP,
        "offsets-only": Errors.NONE,
        "unknown": Errors.GROUP_ID_NOT_FOUND,
        "": Errors.GROUP_ID_NOT_FOUND,  # Kafka accepts the empty id here (tests/test_bounds.py)
    }
    # Deleting removed the offsets too.
    assert ctx.coord.fetch_offsets("offsets-only", [ORDERS0]).offsets[ORDERS0].offset == -1
    assert ctx.coord.describe_group("offsets-only").state == "Dead"


def test_deleting_a_group_removes_its_spark_replay_record(ctx, redis_client, namespace):
    # The Spark source's record of replayed batches (rcoord.spark.replays) lives outside the
    # group's slot; only the deleted group's goes, and only when the group is deleted.
    for gid in ("offsets-only", "kept", ctx.group_id):
        redis_client.hset(replays_key(namespace, gid), "1:m", 3)
    ctx.stable_group(1)
    ctx.coord.commit_offsets("offsets-only", {ORDERS0: 5})
    ctx.coord.commit_offsets("kept", {ORDERS0: 5})
    assert ctx.coord.delete_groups(["offsets-only", ctx.group_id]) == {
        "offsets-only": Errors.NONE, ctx.group_id: Errors.NON_EMPTY_GROUP}
    assert not redis_client.exists(replays_key(namespace, "offsets-only"))
    assert redis_client.hget(replays_key(namespace, "kept"), "1:m") == b"3"
    assert redis_client.hget(replays_key(namespace, ctx.group_id), "1:m") == b"3"


def test_deleting_a_group_removes_its_parked_callers_claim(ctx, redis_client, namespace):
    # The claim (GroupKeys.claim) is no script's key: the group's script could not delete it,
    # and it outlived the group. Only the deleted group's goes.
    ctx.stable_group(1)
    ctx.coord.commit_offsets("offsets-only", {ORDERS0: 5})
    n = ctx.coord.config.num_partitions
    claims = {gid: GroupKeys.of(namespace, n, gid).claim for gid in ("offsets-only", ctx.group_id)}
    for claim in claims.values():
        redis_client.set(claim, "x", px=60_000)
    assert ctx.coord.delete_groups(["offsets-only", ctx.group_id]) == {
        "offsets-only": Errors.NONE, ctx.group_id: Errors.NON_EMPTY_GROUP}
    assert not redis_client.exists(claims["offsets-only"])
    assert redis_client.get(claims[ctx.group_id]) == b"x"


def test_delete_offsets_refused_for_subscribed_topic(ctx):
    first = ctx.join(require_known_member_id=False, protocols=_sub("orders"))
    ctx.sync(first.member_id, first.generation_id, {})
    ctx.coord.commit_offsets(ctx.group_id, {ORDERS0: 1, AUDIT0: 2}, member_id=first.member_id,
                             generation_id=first.generation_id)
    res = ctx.coord.delete_offsets(ctx.group_id, [ORDERS0, AUDIT0])
    assert res.error == Errors.NONE
    assert res.partitions == {ORDERS0: Errors.GROUP_SUBSCRIBED_TO_TOPIC, AUDIT0: Errors.NONE}
    assert set(ctx.coord.fetch_offsets(ctx.group_id).offsets) == {ORDERS0}


def test_delete_offsets_group_errors(ctx):
    assert ctx.coord.delete_offsets("nobody", [ORDERS0]).error == Errors.GROUP_ID_NOT_FOUND
    res = ctx.join(require_known_member_id=False, protocol_type="connect")
    ctx.sync(res.member_id, res.generation_id, {})
    assert ctx.coord.delete_offsets(ctx.group_id, [ORDERS0]).error == Errors.NON_EMPTY_GROUP


def test_undecodable_metadata_counts_as_subscribed_to_everything(ctx):
    first = ctx.join(require_known_member_id=False, protocols=[("range", b"\xc1 not msgpack")])
    ctx.sync(first.member_id, first.generation_id, {})
    res = ctx.coord.delete_offsets(ctx.group_id, [AUDIT0])
    assert res.partitions == {AUDIT0: Errors.GROUP_SUBSCRIBED_TO_TOPIC}


# -- retention ---------------------------------------------------------------------------------


def _retention_ctx(make_coordinator, clock, pool, **cfg):
    from harness import Ctx

    settings = dict(offsets_retention_ms=60_000, offsets_retention_check_interval_ms=10_000)
    settings.update(cfg)
    c = Ctx(make_coordinator(clock=clock, **settings), clock, pool)
    c.session_timeout_ms = 600_000
    c.rebalance_timeout_ms = 600_000
    return c


def test_offsets_of_an_empty_group_expire_after_retention_then_group_is_removed(make_coordinator, clock, pool):
    c = _retention_ctx(make_coordinator, clock, pool)
    first = c.join(require_known_member_id=False, protocols=_sub("orders"))
    c.sync(first.member_id, first.generation_id, {})
    c.coord.commit_offsets(c.group_id, {ORDERS0: 9}, member_id=first.member_id,
                           generation_id=first.generation_id)
    c.sleep(50_000)  # a long-lived member: its subscribed offsets never expire
    c.coord.leave_group(c.group_id, [MemberIdentity(first.member_id)])
    assert c.state() == "Empty"
    # Retention counts from the moment the group became Empty (KIP-211).
    c.sleep(59_999)
    assert c.coord.fetch_offsets(c.group_id).offsets == {ORDERS0: OffsetAndMetadata(9)}
    c.sleep(1)
    assert c.coord.fetch_offsets(c.group_id).offsets == {}
    # The Empty group with no offsets left is removed.
    assert c.coord.describe_group(c.group_id).state == "Dead"


def test_simple_group_offsets_expire_from_commit_time(make_coordinator, clock, pool):
    c = _retention_ctx(make_coordinator, clock, pool)
    c.coord.commit_offsets(c.group_id, {ORDERS0: 1})
    c.sleep(30_000)
    c.coord.commit_offsets(c.group_id, {AUDIT0: 2})
    c.sleep(30_000)
    assert set(c.coord.fetch_offsets(c.group_id).offsets) == {AUDIT0}
    c.sleep(30_000)
    assert c.coord.fetch_offsets(c.group_id).offsets == {}
    assert c.state() == "Dead"


def test_stable_consumer_group_expires_only_unsubscribed_topics(make_coordinator, clock, pool):
    c = _retention_ctx(make_coordinator, clock, pool)
    first = c.join(require_known_member_id=False, protocols=_sub("orders"))
    c.sync(first.member_id, first.generation_id, {})
    c.coord.commit_offsets(c.group_id, {ORDERS0: 1, AUDIT0: 2}, member_id=first.member_id,
                           generation_id=first.generation_id)
    for _ in range(3):
        c.sleep(30_000)
        c.heartbeat(first.member_id, first.generation_id)
    assert set(c.coord.fetch_offsets(c.group_id).offsets) == {ORDERS0}


def test_turning_stable_re_examines_offsets_at_once_only_when_there_are_offsets(
        make_coordinator, clock, pool):
    # (A check interval longer than the retention: the timer is the offsets' own expiry.)
    c = _retention_ctx(make_coordinator, clock, pool, offsets_retention_check_interval_ms=600_000)
    keys, r = c._keys(), c.coord._redis
    # Without offsets, reaching Stable leaves the retention timer where it was (the Empty
    # group's removal, a check interval after it was made): nothing to publish or apply.
    first = c.join(require_known_member_id=False, protocols=_sub("orders"))
    c.sync(first.member_id, first.generation_id, {})
    assert c.state() == "Stable"
    assert r.zscore(keys.deadlines, "gc") > clock.milliseconds()
    t0 = clock.milliseconds()
    committed = c.coord.commit_offsets(c.group_id, {AUDIT0: 2, ORDERS0: 1},
                                       member_id=first.member_id,
                                       generation_id=first.generation_id)
    assert set(committed.values()) == {Errors.NONE}
    # Empty: every offset counts from then (KIP-211), a retention after t0 + 1 s.
    c.sleep(1000)
    c.coord.leave_group(c.group_id, [MemberIdentity(first.member_id)])
    assert c.state() == "Empty"
    c.sleep(29_000)
    # Stable again: the topic nobody subscribes to counts from its commit once more, a
    # retention after t0, earlier than the Empty group's time: re-examined at once.
    second = c.join(require_known_member_id=False, protocols=_sub("orders"))
    c.sync(second.member_id, second.generation_id, {})
    assert c.state() == "Stable"
    assert r.zscore(keys.deadlines, "gc") <= clock.milliseconds()
    c.coord.run_timers()
    assert r.zscore(keys.deadlines, "gc") == t0 + 60_000
    c.sleep(t0 + 60_000 - clock.milliseconds() - 1)
    c.heartbeat(second.member_id, second.generation_id)
    assert set(c.coord.fetch_offsets(c.group_id).offsets) == {ORDERS0, AUDIT0}
    c.sleep(1)
    assert set(c.coord.fetch_offsets(c.group_id).offsets) == {ORDERS0}


def test_a_lowered_retention_applies_to_offsets_already_stored(make_coordinator, clock, pool):
    """Kafka's clean-up runs every offsets.retention.check.interval.ms with the retention then
    in force, so a lowered offsets.retention.minutes applies to stored offsets at the next
    check. Before, the retention timer stayed where the old retention had put it (a week),
    and so did the offsets. Now it runs at least once per check interval."""
    week, hour = 7 * 86_400_000, 3_600_000
    c = _retention_ctx(make_coordinator, clock, pool, offsets_retention_ms=week)
    keys, r = c._keys(), c.coord._redis
    c.coord.commit_offsets(c.group_id, {ORDERS0: 1})  # a simple group's
    c.sleep(10_000)  # the new group's first check: its offset expires in a week
    c.coord.run_timers()
    assert r.zscore(keys.deadlines, "gc") == clock.milliseconds() + 10_000
    lowered = make_coordinator(clock=clock, offsets_retention_ms=hour)
    assert lowered.config.offsets_retention_ms == hour
    c.sleep(hour - 10_000 - 1)
    assert set(c.coord.fetch_offsets(c.group_id).offsets) == {ORDERS0}
    c.sleep(1)
    assert c.coord.fetch_offsets(c.group_id).offsets == {}
    assert c.state() == "Dead"


def test_the_retention_check_reads_many_offsets_a_page_per_call(make_coordinator, clock, pool):
    """One call expiring 300,000 offsets held the shard for 1.2 s. The check now walks them a
    page per call (lua/prelude.lua, expire_offsets), keeping its place in the group hash and
    coming back a millisecond later, until the group is done with."""
    c = _retention_ctx(make_coordinator, clock, pool)
    keys, r = c._keys(), c.coord._redis
    tps = [TopicPartition("orders", p) for p in range(1_000)]
    assert set(c.coord.commit_offsets(c.group_id, dict.fromkeys(tps, 1)).values()) == {
        Errors.NONE}
    c.clock.sleep(60_000)  # every offset has expired
    left = []
    while r.exists(keys.group) and len(left) < 30:
        c.coord.run_timers()  # the page due now; the next one is a millisecond later
        left.append(r.hlen(keys.offsets))
        if r.exists(keys.group):
            assert r.hget(keys.group, "gcw") is not None
        c.clock.sleep(1)
    assert left[0] >= 500 and left[-1] == 0 and len(left) >= 3
    assert left == sorted(left, reverse=True)
    assert c.state() == "Dead"  # no offsets left: the simple group is removed


@pytest.mark.parametrize("group", ["simple", "stable"])
def test_a_commit_during_a_retention_walk_still_expires(make_coordinator, clock, pool, group):
    """A reviewer's repro: a commit made while the retention check walked a group's offsets a
    page per call, whose field landed behind the walk's cursor, was never seen by the walk; the
    walk's last page then set no timer, and the offset (and its group) stayed for ever. Where a
    field lands is the hash's affair, so each round commits late in a walk (behind the cursor
    about three times in four) and checks what must hold wherever it landed. ``stable``: a
    member's commit of a topic its group does not subscribe to (the commit's fast path)."""
    c = _retention_ctx(make_coordinator, clock, pool)
    r = c.coord._redis
    late = TopicPartition("late", 0)
    for trial in range(8):
        c.group_id = f"walked-{trial}"
        keys = c._keys()
        member: dict[str, Any] = {}
        if group == "stable":
            joined = c.join(require_known_member_id=False, protocols=_sub("orders"))
            c.sync(joined.member_id, joined.generation_id, {})
            member = dict(member_id=joined.member_id, generation_id=joined.generation_id)
        old = dict.fromkeys((TopicPartition("old", p) for p in range(1_000)), 1)
        assert set(c.coord.commit_offsets(c.group_id, old, **member).values()) == {Errors.NONE}
        c.clock.sleep(60_000)  # every old offset has expired
        c.coord.run_timers()  # the walk's first page
        for _ in range(2):  # two more pages, if the walk is that long
            if r.hget(keys.group, "gcw") is not None:
                c.clock.sleep(1)
                c.coord.run_timers()
        assert r.hget(keys.group, "gcw") is not None, "the walk ended before the commit"
        assert c.coord.commit_offsets(c.group_id, {late: 5}, **member) == {late: Errors.NONE}
        while r.hget(keys.group, "gcw") is not None:
            c.clock.sleep(1)
            c.coord.run_timers()
        assert set(c.coord.fetch_offsets(c.group_id).offsets) == {late}
        assert r.zscore(keys.deadlines, "gc") is not None  # (was None: nothing would expire)
        for _ in range(6):  # (the member's session is 600 s)
            c.sleep(10_000)
            if member:
                assert c.heartbeat(member["member_id"], member["generation_id"]) == Errors.NONE
        assert c.coord.fetch_offsets(c.group_id).offsets == {}
        if member:
            c.coord.leave_group(c.group_id, [MemberIdentity(member["member_id"])])
            c.sleep(10_000)  # the Empty group without offsets goes after the check interval
        assert c.state() == "Dead"


def test_a_fetch_of_all_offsets_reads_a_page_per_call(make_coordinator, monkeypatch):
    """One call reading 300,000 offsets held the shard for 200 ms; a fetch of all offsets now
    reads about FETCH_PAGE per call, and still answers every one."""
    monkeypatch.setattr(steps_module, "FETCH_PAGE", 50)
    coord = make_coordinator()
    tps = [TopicPartition(f"t{p % 3}", p) for p in range(1_000)]
    assert set(coord.commit_offsets("many", {tp: tp.partition for tp in tps}).values()) == {
        Errors.NONE}
    calls = []
    call = coord._steps.call

    def counted(step, keys, args):
        calls.append(step)
        return (yield from call(step, keys, args))

    monkeypatch.setattr(coord._steps, "call", counted)
    fetched = coord.fetch_offsets("many")
    assert {tp: o.offset for tp, o in fetched.offsets.items()} == {tp: tp.partition for tp in tps}
    assert calls.count("fetch_offsets") >= 10


def test_per_commit_retention_overrides(make_coordinator, clock, pool):
    c = _retention_ctx(make_coordinator, clock, pool)
    c.coord.commit_offsets(c.group_id, {ORDERS0: 1}, retention_ms=5_000)
    c.coord.commit_offsets(c.group_id, {AUDIT0: 1})
    c.sleep(5_000)
    assert set(c.coord.fetch_offsets(c.group_id).offsets) == {AUDIT0}


def test_empty_group_without_offsets_is_removed_after_check_interval(make_coordinator, clock, pool):
    c = _retention_ctx(make_coordinator, clock, pool)
    gen, (mid,) = c.stable_group(1)
    c.coord.leave_group(c.group_id, [MemberIdentity(mid)])
    assert c.state() == "Empty"
    c.sleep(9_999)
    assert c.state() == "Empty"
    c.sleep(1)
    assert c.state() == "Dead"
    assert c.group_id not in {g.group_id for g in c.coord.list_groups()}


def test_subscription_with_user_data_is_understood(ctx):
    meta = ConsumerProtocolSubscription(topics=["orders"], user_data=b"\x00\xffbinary").encode()
    first = ctx.join(require_known_member_id=False, protocols=[("range", meta)])
    ctx.sync(first.member_id, first.generation_id, {})
    res = ctx.coord.delete_offsets(ctx.group_id, [ORDERS0, AUDIT0])
    assert res.partitions == {ORDERS0: Errors.GROUP_SUBSCRIBED_TO_TOPIC, AUDIT0: Errors.NONE}


def test_deleting_a_group_right_after_its_member_expired_leaves_no_keys(ctx):
    gen, (mid,) = ctx.stable_group(1)
    ctx.clock.sleep(ctx.session_timeout_ms)  # the member's session passed; nobody touched it
    assert ctx.coord.delete_groups([ctx.group_id]) == {ctx.group_id: Errors.NONE}
    keys = ctx._keys().all()
    group_keys = keys[3:14]  # the group's own keys (the partition's keys stay)
    left = [k for k in group_keys if ctx.coord._redis.exists(k) and ctx.coord._redis.pttl(k) == -1]
    assert left == []


def test_list_groups_state_filter_ignores_case_and_spaces(ctx):
    ctx.stable_group(1)
    assert {g.group_id for g in ctx.coord.list_groups([" stable "])} == {ctx.group_id}


def test_group_incarnation_given_an_asyncio_client_says_it_takes_a_blocking_one():
    # It failed with int()'s message about a coroutine, leaving one never awaited (a
    # RuntimeWarning, an error under this suite's filterwarnings). No connection is made:
    # the asyncio client's call is a coroutine until awaited.
    import gc

    import redis.asyncio

    from rcoord.coordinator import group_incarnation

    client = redis.asyncio.Redis(host="127.0.0.1", port=1)
    with pytest.raises(TypeError, match=r"takes a blocking redis client .* redis\.asyncio"):
        group_incarnation(client, "ns", "g")
    gc.collect()  # a coroutine left unawaited would warn here
