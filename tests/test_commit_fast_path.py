"""The commit's fast path (``commit_fast`` in lua/commit_offsets.lua) answers and writes exactly
what the full step in the group_step wrapper does, and decides the common commit alone.

Each scenario forms a group on the MockTime clock, takes a snapshot of the namespace's keys and
sends one commit (the function call the public API would make) twice from that snapshot: to a
copy of the library whose fast path tags its replies, and to a copy with no fast path. The
replies (the tag aside) and every key afterwards must be equal; the tag says which path
answered, and each scenario names the path it expects, so a fast path that stopped deciding
the common case (or began deciding a case that needs the wrapper) fails here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from harness import Ctx

from rcoord import (
    CoordinatorConfig,
    Errors,
    GroupCoordinator,
    MemberIdentity,
    MockTime,
    OffsetAndMetadata,
    TopicPartition,
)
from rcoord.flow import Script, _perform
from rcoord.keys import GroupKeys
from rcoord.protocol.kafka_consumer import encode_subscription
from rcoord.scripts import library_source
from rcoord.testing.library import library_copy

T0, T1 = TopicPartition("orders", 0), TopicPartition("orders", 1)
FAST_CALL = "fast = commit_fast})"
TAG = b"FAST"


def library_variant(suffix: str, replacement: str) -> tuple[str, str]:
    """(library name, source) of a copy of the library under its own name, with the commit's
    ``fast`` option replaced."""
    name, source = library_source()
    assert source.count(FAST_CALL) == 1
    copy = f"{name}_{suffix}"
    return copy, library_copy(name, source.replace(FAST_CALL, replacement), copy)


@pytest.fixture
def client(single_client: redis.Redis) -> redis.Redis:
    return single_client


@pytest.fixture
def libs(client: redis.Redis) -> Iterator[tuple[str, str]]:
    """The two copies: (the fast path tagging its replies, no fast path)."""
    tagged, tagged_src = library_variant("tagged", (
        "fast = function(keys, args, req) local reply = commit_fast(keys, args, req) "
        f"if reply then reply[1] = '{TAG.decode()}' end return reply end}})"))
    full, full_src = library_variant("full", "})")
    client.function_load(tagged_src, replace=True)
    client.function_load(full_src, replace=True)
    try:
        yield tagged, full
    finally:
        for lib in (tagged, full):
            client.function_delete(lib)


@pytest.fixture
def group(client: redis.Redis, namespace: str, clock: MockTime, pool: Any) -> Ctx:
    cfg = CoordinatorConfig(namespace=namespace, group_min_session_timeout_ms=10,
                            group_initial_rebalance_delay_ms=0, offset_metadata_max_bytes=8)
    return Ctx(GroupCoordinator(client, cfg, clock=clock).start(), clock, pool)


def snapshot(r: redis.Redis, namespace: str) -> dict[bytes, Any]:
    """Every key of the namespace by content (stream entries without their ids, the group's
    last wake-up id 'wid' and the microseconds of its incarnation token 'inc', which come from
    the server's clock, not the mock one)."""
    out: dict[bytes, Any] = {}
    for key in sorted(r.scan_iter(match=f"{namespace}:*", count=1000)):
        kind = r.type(key)
        if kind == b"hash":
            value: Any = r.hgetall(key)
            value.pop(b"wid", None)
            if b"inc" in value:  # (its mock-time millisecond is kept)
                value[b"inc"] = value[b"inc"].split(b".")[0]
        elif kind == b"zset":
            value = r.zrange(key, 0, -1, withscores=True)
        elif kind == b"stream":
            value = [fields for _, fields in r.xrange(key)]
        elif kind == b"set":
            value = r.smembers(key)
        else:
            value = r.get(key)
        out[key] = (kind, value, r.pttl(key) > 0)
    return out


def restore(r: redis.Redis, namespace: str, dumped: dict[bytes, tuple[bytes, int]]) -> None:
    for key in r.scan_iter(match=f"{namespace}:*", count=1000):
        r.delete(key)
    for key, (payload, pttl) in dumped.items():
        r.restore(key, max(pttl, 0), payload, replace=True)


def commit_call(ctx: Ctx, offsets: dict[TopicPartition, Any], **kw: Any) -> Script:
    """The function call the coordinator's commit_offsets makes (after re-reading the settings,
    which it does first when metadata is past the limit it knows)."""
    flow = ctx.coord._steps.commit_offsets(ctx.group_id, offsets, **kw)
    op = next(flow)
    while not isinstance(op, Script):
        op = flow.send(_perform(ctx.coord._redis, ctx.coord._scripts, op))
    assert isinstance(op, Script) and op.name == "commit_offsets", op
    return op


def send(r: redis.Redis, lib: str, op: Script) -> Any:
    try:
        return r.fcall(f"{lib}_{op.name}", len(op.keys), *op.keys, *op.args)
    except redis.ResponseError as exc:
        return ("error", str(exc))


def both_paths(r: redis.Redis, libs: tuple[str, str], namespace: str,
               op: Script) -> tuple[Any, bool]:
    """Sends ``op`` to both copies from the same keys; asserts they answer and write alike.
    Returns the reply and whether the fast path gave it."""
    dumped = {key: (r.dump(key), r.pttl(key)) for key in r.scan_iter(match=f"{namespace}:*")}
    tagged, full = libs
    fast_reply = send(r, tagged, op)
    after_fast = snapshot(r, namespace)
    restore(r, namespace, dumped)
    full_reply = send(r, full, op)
    after_full = snapshot(r, namespace)
    took_fast = isinstance(fast_reply, list) and fast_reply[0] == TAG
    if took_fast:
        fast_reply = [b"NONE", *fast_reply[1:]]
    assert fast_reply == full_reply
    assert after_fast == after_full
    return full_reply, took_fast


def consumer_protocols() -> list[tuple[str, bytes]]:
    return [("range", encode_subscription(["orders"]))]


Setup = Callable[[Ctx, redis.Redis], Script]


def applied(ctx: Ctx) -> None:
    """Lets the group's passed deadlines act (the offset-retention check due as the group turns
    Stable), as the coordinator service does at once: until then every step applies them. Then
    a second passes (nothing falls due), so the commit's session refresh is a new score."""
    assert ctx.clock is not None
    ctx.coord.run_timers()
    ctx.clock.sleep(1000)


def stable_one(ctx: Ctx, r: redis.Redis) -> tuple[int, str]:
    gen, (mid,) = ctx.stable_group(1, protocols=consumer_protocols())
    applied(ctx)
    return gen, mid


def member_commit(ctx: Ctx, r: redis.Redis) -> Script:
    gen, mid = stable_one(ctx, r)
    return commit_call(ctx, {T0: OffsetAndMetadata(5, "m", 2)}, member_id=mid, generation_id=gen)


def undecodable_subscription(ctx: Ctx, r: redis.Redis) -> Script:
    gen, (mid,) = ctx.stable_group(1)  # ("range", b"range-meta"): no subscribed topics known
    applied(ctx)
    return commit_call(ctx, {T0: 5}, member_id=mid, generation_id=gen)


def metadata_too_large(ctx: Ctx, r: redis.Redis) -> Script:
    gen, mid = stable_one(ctx, r)
    return commit_call(ctx, {T0: OffsetAndMetadata(1, "123456789"), T1: OffsetAndMetadata(2, "ok")},
                       member_id=mid, generation_id=gen)


def every_partition_refused(ctx: Ctx, r: redis.Redis) -> Script:
    gen, mid = stable_one(ctx, r)
    return commit_call(ctx, {T0: OffsetAndMetadata(1, "123456789")}, member_id=mid,
                       generation_id=gen)


def explicit_retention(ctx: Ctx, r: redis.Redis) -> Script:
    gen, mid = stable_one(ctx, r)
    return commit_call(ctx, {T0: 9}, member_id=mid, generation_id=gen, retention_ms=3_600_000)


def first_timer_after_the_check(ctx: Ctx, r: redis.Redis) -> Script:
    """The group's retention timer ran (at the check interval after its creation) and found
    nothing to expire, so none is set: the commit sets it, at the check interval at the latest
    (a lowered retention then applies at that check), not at the offset's expiry."""
    assert ctx.clock is not None
    gen, mid = stable_one(ctx, r)
    deadlines = ctx._keys().deadlines
    while r.zscore(deadlines, "gc") is not None:
        ctx.clock.sleep(2000)
        assert ctx.heartbeat(mid, gen) is Errors.NONE
        ctx.coord.run_timers()
    return commit_call(ctx, {T0: 3}, member_id=mid, generation_id=gen)


def many_partitions(ctx: Ctx, r: redis.Redis) -> Script:
    gen, mid = stable_one(ctx, r)
    offsets = {TopicPartition(f"t{i % 3}", i): i for i in range(700)}  # three HSET batches
    return commit_call(ctx, offsets, member_id=mid, generation_id=gen)


def stable_static(ctx: Ctx) -> tuple[int, str]:
    res = ctx.join(group_instance_id="host-1", protocols=consumer_protocols())
    assert ctx.sync(res.member_id, res.generation_id, {res.member_id: b""},
                    group_instance_id="host-1").error == Errors.NONE
    assert ctx.state() == "Stable"
    applied(ctx)
    return res.generation_id, res.member_id


def static_member(ctx: Ctx, r: redis.Redis) -> Script:
    gen, mid = stable_static(ctx)
    return commit_call(ctx, {T0: 3}, member_id=mid, generation_id=gen,
                       group_instance_id="host-1")


def fenced_static_member(ctx: Ctx, r: redis.Redis) -> Script:
    gen, _ = stable_static(ctx)
    return commit_call(ctx, {T0: 3}, member_id="host-1-older", generation_id=gen,
                       group_instance_id="host-1")


def unknown_static_member(ctx: Ctx, r: redis.Redis) -> Script:
    gen, mid = stable_static(ctx)
    return commit_call(ctx, {T0: 3}, member_id=mid, generation_id=gen,
                       group_instance_id="host-2")


def preparing_rebalance(ctx: Ctx, r: redis.Redis) -> Script:
    # (A leave starts it with no call parked: a parked call's polling would write meanwhile.)
    gen, (mid, other) = ctx.stable_group(2, protocols=consumer_protocols())
    ctx.coord.leave_group(ctx.group_id, [MemberIdentity(other)])
    assert ctx.state() == "PreparingRebalance" and ctx.parked() == 0
    applied(ctx)
    return commit_call(ctx, {T0: 4}, member_id=mid, generation_id=gen)


def completing_rebalance(ctx: Ctx, r: redis.Redis) -> Script:
    mid = ctx.new_member_id()
    res = ctx.join(mid, protocols=consumer_protocols())
    assert ctx.state() == "CompletingRebalance"
    return commit_call(ctx, {T0: 4}, member_id=mid, generation_id=res.generation_id)


def old_generation(ctx: Ctx, r: redis.Redis) -> Script:
    gen, mid = stable_one(ctx, r)
    return commit_call(ctx, {T0: 4}, member_id=mid, generation_id=gen - 1)


def unknown_member(ctx: Ctx, r: redis.Redis) -> Script:
    gen, _ = stable_one(ctx, r)
    return commit_call(ctx, {T0: 4}, member_id="ghost", generation_id=gen)


def session_passed(ctx: Ctx, r: redis.Redis) -> Script:
    gen, mid = stable_one(ctx, r)
    assert ctx.clock is not None
    ctx.clock.sleep(ctx.session_timeout_ms + 1)  # due, not yet applied: the commit applies it
    return commit_call(ctx, {T0: 4}, member_id=mid, generation_id=gen)


def retention_before_the_published_deadline(ctx: Ctx, r: redis.Redis) -> Script:
    gen, mid = stable_one(ctx, r)
    return commit_call(ctx, {T0: 4}, member_id=mid, generation_id=gen, retention_ms=1)


def lowered_group_max_size(ctx: Ctx, r: redis.Redis) -> Script:
    gen, mid = stable_one(ctx, r)
    keys = GroupKeys.of(ctx.coord.config.namespace, ctx.coord.config.num_partitions, ctx.group_id)
    r.hset(keys.partition.cfg, "group_max_size", 5)  # the capacity check has not seen it
    return commit_call(ctx, {T0: 4}, member_id=mid, generation_id=gen)


def no_settings_copy(ctx: Ctx, r: redis.Redis) -> Script:
    gen, mid = stable_one(ctx, r)
    op = commit_call(ctx, {T0: 4}, member_id=mid, generation_id=gen)
    keys = GroupKeys.of(ctx.coord.config.namespace, ctx.coord.config.num_partitions, ctx.group_id)
    r.delete(keys.partition.cfg)
    return op


def simple_commit(ctx: Ctx, r: redis.Redis) -> Script:
    return commit_call(ctx, {T0: 4})


SCENARIOS: list[tuple[Setup, bool, str]] = [
    (member_commit, True, "NONE"),
    (undecodable_subscription, True, "NONE"),
    (metadata_too_large, True, "NONE"),
    (every_partition_refused, True, "NONE"),
    (explicit_retention, True, "NONE"),
    (many_partitions, True, "NONE"),
    (first_timer_after_the_check, True, "NONE"),
    (static_member, True, "NONE"),
    (preparing_rebalance, True, "NONE"),
    (fenced_static_member, False, "FENCED_INSTANCE_ID"),
    (unknown_static_member, False, "UNKNOWN_MEMBER_ID"),
    (completing_rebalance, False, "REBALANCE_IN_PROGRESS"),
    (old_generation, False, "ILLEGAL_GENERATION"),
    (unknown_member, False, "UNKNOWN_MEMBER_ID"),
    (session_passed, False, "UNKNOWN_MEMBER_ID"),
    (retention_before_the_published_deadline, False, "NONE"),
    (lowered_group_max_size, False, "NONE"),
    (no_settings_copy, False, "RCOORD_NOT_COORDINATOR"),
    (simple_commit, False, "NONE"),
]


@pytest.mark.parametrize(("setup", "fast", "answer"), SCENARIOS,
                         ids=[s.__name__ for s, _, _ in SCENARIOS])
def test_the_fast_path_answers_and_writes_as_the_step_does(
        group: Ctx, client: redis.Redis, libs: tuple[str, str], namespace: str, setup: Setup,
        fast: bool, answer: str) -> None:
    op = setup(group, client)
    reply, took_fast = both_paths(client, libs, namespace, op)
    assert took_fast is fast
    if isinstance(reply, tuple):
        assert answer in reply[1]
    else:
        assert reply[0].decode() == answer
