"""OffsetCommit / OffsetFetch with generation fencing (the first part of the offsets issue)."""

from __future__ import annotations

from harness import WAIT_S, wait_until
from rcoord import Errors, OffsetAndMetadata, TopicPartition

T0, T1 = TopicPartition("orders", 0), TopicPartition("orders", 1)


def test_member_of_current_generation_commits_and_fetches(ctx):
    gen, (mid,) = ctx.stable_group(1)
    res = ctx.coord.commit_offsets(ctx.group_id, {T0: OffsetAndMetadata(42, "m", 3), T1: 7},
                                   member_id=mid, generation_id=gen)
    assert res == {T0: Errors.NONE, T1: Errors.NONE}
    fetched = ctx.coord.fetch_offsets(ctx.group_id)
    assert fetched.error == Errors.NONE
    assert fetched.offsets == {T0: OffsetAndMetadata(42, "m", 3), T1: OffsetAndMetadata(7)}
    assert fetched.offsets[T0].commit_timestamp_ms == ctx.clock()


def test_zombie_of_an_older_generation_cannot_overwrite(ctx):
    gen, ids = ctx.stable_group(2)
    ctx.coord.commit_offsets(ctx.group_id, {T0: 10}, member_id=ids[1], generation_id=gen)
    # A rebalance completes without ids[1]'s knowledge: it is now a zombie of generation gen.
    f0 = ctx.join_async(ids[0])
    wait_until(lambda: ctx.state() == "PreparingRebalance")
    f1 = ctx.join_async(ids[1])
    new_gen = f0.result(WAIT_S).generation_id
    f1.result(WAIT_S)
    assert ctx.coord.commit_offsets(ctx.group_id, {T0: 5}, member_id=ids[1], generation_id=gen) == {
        T0: Errors.ILLEGAL_GENERATION
    }
    assert ctx.coord.fetch_offsets(ctx.group_id, [T0]).offsets[T0].offset == 10
    assert new_gen == gen + 1


def test_commit_errors_follow_kafka(ctx):
    c = ctx.coord
    # Unknown group with a generation: GROUP_ID_NOT_FOUND (OffsetCommit v9+).
    assert c.commit_offsets(ctx.group_id, {T0: 1}, member_id="m", generation_id=1) == {T0: Errors.GROUP_ID_NOT_FOUND}
    gen, (mid,) = ctx.stable_group(1)
    assert c.commit_offsets(ctx.group_id, {T0: 1}, member_id="ghost", generation_id=gen) == {T0: Errors.UNKNOWN_MEMBER_ID}
    # A simple commit to a group with members is refused.
    assert c.commit_offsets(ctx.group_id, {T0: 1}) == {T0: Errors.UNKNOWN_MEMBER_ID}
    # Kafka accepts the empty group id for OffsetCommit (tests/test_bounds.py).
    assert c.commit_offsets("", {T0: 1}) == {T0: Errors.NONE}


def test_commit_during_completing_rebalance_and_preparing_rebalance(ctx):
    mid = ctx.new_member_id()
    res = ctx.join(mid)
    assert ctx.state() == "CompletingRebalance"
    assert ctx.coord.commit_offsets(ctx.group_id, {T0: 1}, member_id=mid,
                                    generation_id=res.generation_id) == {T0: Errors.REBALANCE_IN_PROGRESS}
    ctx.sync(mid, res.generation_id, {})
    ctx.join_async(ctx.new_member_id())  # starts a rebalance
    wait_until(lambda: ctx.state() == "PreparingRebalance")
    # A member of the current generation may still commit (revocation commits).
    assert ctx.coord.commit_offsets(ctx.group_id, {T0: 9}, member_id=mid,
                                    generation_id=res.generation_id) == {T0: Errors.NONE}


def test_simple_commit_creates_an_offsets_only_group(ctx):
    assert ctx.coord.commit_offsets(ctx.group_id, {T0: 3}) == {T0: Errors.NONE}
    assert ctx.state() == "Empty"
    assert ctx.coord.fetch_offsets(ctx.group_id, [T0, T1]).offsets == {
        T0: OffsetAndMetadata(3), T1: OffsetAndMetadata(-1)
    }


def test_metadata_too_large_fails_only_that_partition(make_coordinator, clock, pool):
    from harness import Ctx

    c = Ctx(make_coordinator(clock=clock, offset_metadata_max_bytes=4), clock, pool)
    res = c.coord.commit_offsets(c.group_id, {T0: OffsetAndMetadata(1, "12345"), T1: OffsetAndMetadata(2, "1234")})
    assert res == {T0: Errors.OFFSET_METADATA_TOO_LARGE, T1: Errors.NONE}
    assert c.coord.fetch_offsets(c.group_id).offsets == {T1: OffsetAndMetadata(2, "1234")}


def test_metadata_judged_by_the_limit_in_force_not_the_one_read_at_start(make_coordinator, clock):
    """A process that read the default limit at its start, after another process raised it:
    its commit was refused OFFSET_METADATA_TOO_LARGE (the metadata was not even sent), though
    the namespace stores such metadata. Kafka judges it by the limit in force."""
    early = make_coordinator(clock=clock)
    assert early.config.offset_metadata_max_bytes == 4096
    make_coordinator(clock=clock, offset_metadata_max_bytes=10_000)  # raises the limit
    meta = "m" * 5000
    assert early.commit_offsets("g", {T0: OffsetAndMetadata(1, meta)}) == {T0: Errors.NONE}
    assert early.fetch_offsets("g").offsets == {T0: OffsetAndMetadata(1, meta)}
    assert early.config.offset_metadata_max_bytes == 10_000
    # Past the limit in force, still refused.
    res = early.commit_offsets("g", {T0: OffsetAndMetadata(2, "m" * 10_001)})
    assert res == {T0: Errors.OFFSET_METADATA_TOO_LARGE}
    assert early.fetch_offsets("g").offsets[T0].offset == 1


def test_metadata_past_the_request_limit_fails_only_that_partition(ctx):
    """Kafka refuses such a partition alone (OFFSET_METADATA_TOO_LARGE); counted in the
    request's size, it failed the whole commit with INVALID_REQUEST."""
    from rcoord.protocol._checks import MAX_REQUEST_BYTES

    huge = OffsetAndMetadata(1, "m" * (MAX_REQUEST_BYTES + 1))
    res = ctx.coord.commit_offsets(ctx.group_id, {T0: huge, T1: OffsetAndMetadata(2, "kept")})
    assert res == {T0: Errors.OFFSET_METADATA_TOO_LARGE, T1: Errors.NONE}
    assert ctx.coord.fetch_offsets(ctx.group_id).offsets == {T1: OffsetAndMetadata(2, "kept")}


def test_fenced_static_instance_cannot_commit(ctx):
    first = ctx.join(group_instance_id="s")
    ctx.sync(first.member_id, first.generation_id, {}, group_instance_id="s")
    ctx.join(group_instance_id="s")  # replaces the member id
    res = ctx.coord.commit_offsets(ctx.group_id, {T0: 1}, member_id=first.member_id,
                                   generation_id=first.generation_id, group_instance_id="s")
    assert res == {T0: Errors.FENCED_INSTANCE_ID}


def test_commit_counts_as_heartbeat(ctx):
    gen, (mid,) = ctx.stable_group(1)
    for _ in range(4):
        ctx.sleep(ctx.session_timeout_ms - 1000)
        assert ctx.coord.commit_offsets(ctx.group_id, {T0: 1}, member_id=mid, generation_id=gen) == {T0: Errors.NONE}
    assert ctx.member_ids() == {mid}


def test_fetch_unknown_group(ctx):
    assert ctx.coord.fetch_offsets(ctx.group_id).offsets == {}
    assert ctx.coord.fetch_offsets(ctx.group_id, [T0]).offsets == {T0: OffsetAndMetadata(-1)}



def test_retention_minus_one_means_the_default(ctx):
    from rcoord import InvalidRequestError
    import pytest

    assert ctx.coord.commit_offsets(ctx.group_id, {T0: 5}, retention_ms=-1) == {T0: Errors.NONE}
    ctx.sleep(1)
    assert ctx.coord.fetch_offsets(ctx.group_id, [T0]).offsets[T0].offset == 5
    with pytest.raises(InvalidRequestError, match="retention_ms"):
        ctx.coord.commit_offsets(ctx.group_id, {T0: 5}, retention_ms=-2)


def test_a_fetch_of_all_offsets_whose_pages_come_from_two_servers_misses_none(
        redis_server, own_server, namespace):
    """A fetch of all offsets reads a page per call (HSCAN); a cursor means something only to
    the server process that gave it. Pages continued on another process that holds a copy of
    the hash (a promoted replica, a restart, a slot's new master) skipped about a fifth of the
    offsets, and the fetch answered without them: a `reset-offsets --all-topics` left those
    partitions as they were. It now starts again on the new process."""
    import pytest

    from rcoord import CoordinatorConfig, GroupCoordinator
    from rcoord.errors import CoordinatorNotAvailableError
    from rcoord.scripts import Scripts

    a, b = redis_server.client(), own_server.client()
    try:
        coord = GroupCoordinator(a, CoordinatorConfig(namespace=namespace)).start()
        tps = [TopicPartition(f"t{p % 3}", p) for p in range(2_000)]  # (several pages)
        assert set(coord.commit_offsets("g", {tp: tp.partition for tp in tps}).values()) == {
            Errors.NONE}
        for key in a.scan_iter(match=f"{namespace}:*"):  # the other process's copy
            b.restore(key, 0, a.dump(key), replace=True)
        other = Scripts(b)
        other.load()
        # The first page from the first server, every later one from the other.
        flow, pages = coord._steps.fetch_offsets("g"), 0
        op = next(flow)
        try:
            while True:
                scripts = coord._scripts if pages == 0 else other
                pages += 1
                op = flow.send(scripts.call(op.name, op.keys, op.args))
        except StopIteration as done:
            fetched = done.value
        assert pages > 2
        assert {tp: o.offset for tp, o in fetched.offsets.items()} == {
            tp: tp.partition for tp in tps}
        # Pages that keep changing process: a retriable error, not an endless fetch.
        flow, pages = coord._steps.fetch_offsets("g"), 0
        op = next(flow)
        with pytest.raises(CoordinatorNotAvailableError, match="another server process"):
            while True:
                op = flow.send((other if pages % 2 else coord._scripts).call(
                    op.name, op.keys, op.args))
                pages += 1
    finally:
        a.close()
        b.close()


def test_a_retention_walk_continued_on_another_server_process_expires_every_offset(
        redis_server, own_server, namespace):
    """The retention check walks a group's offsets a page per call (HSCAN) and keeps its
    cursor in the group hash; the cursor means something only to the server process that gave
    it. A walk continued on another process holding a copy (a failover, a restart, a slot's new
    master between two pages) skipped offsets: for an Empty group whose offsets had all expired,
    it deleted those it saw, scheduled no next check, and the rest stayed with the group for
    good (237 of 2,000 here). The walk now starts again on the new process."""
    from rcoord import CoordinatorConfig, GroupCoordinator, MockTime

    a, b = redis_server.client(), own_server.client()
    try:
        clock = MockTime()
        cfg = CoordinatorConfig(namespace=namespace, offsets_retention_ms=60_000,
                                offsets_retention_check_interval_ms=10_000)
        first = GroupCoordinator(a, cfg, clock=clock).start()
        tps = [TopicPartition(f"t{p % 3}", p) for p in range(2_000)]  # (several pages)
        assert set(first.commit_offsets("g", {tp: 1 for tp in tps}).values()) == {Errors.NONE}
        clock.sleep(60_000)
        keys = first._keys("g")
        first._call("expire_deadlines", keys, [])  # the walk's first page, on the first server
        assert 0 < a.hlen(keys.offsets) < 2_000 and a.hget(keys.group, "gcw")
        for key in a.scan_iter(match=f"{namespace}:*"):  # the other process's copy
            b.restore(key, 0, a.dump(key), replace=True)
        other = GroupCoordinator(b, cfg, clock=clock).start()
        for _ in range(20):  # (a page a millisecond; far more than the walk needs)
            clock.sleep(1)
            other.run_timers()
        clock.sleep(86_400_000)
        other.run_timers()
        assert b.hlen(keys.offsets) == 0
        assert other.fetch_offsets("g").offsets == {}
        assert not b.exists(keys.group)  # the Empty group with no offsets left is gone
    finally:
        a.close()
        b.close()
