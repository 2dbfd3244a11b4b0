"""Member records: one cmsgpack map whose first entry is the session timeout, so a heartbeat and a
commit's session refresh decode one number instead of the record (lua/prelude.lua
``member_blob`` and ``member_session``), while whoever decodes the whole map (every other step,
an older rcoord during a rolling upgrade, these tests) reads the same record. Records an older
rcoord wrote, with the session timeout anywhere in the map, still work."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

from rcoord import Errors, TopicPartition

TP = TopicPartition("orders", 0)


def _blob(ctx: Any, member_id: str) -> bytes:
    return ctx.coord._redis.hget(ctx._keys().members, member_id)


def _record(ctx: Any, member_id: str) -> dict[bytes, Any]:
    return msgpack.unpackb(_blob(ctx, member_id), raw=True)


def _write_as_an_older_rcoord(ctx: Any, member_id: str, record: dict[bytes, Any]) -> None:
    # (str-typed strings, as the server's cmsgpack writes them)
    ctx.coord._redis.hset(ctx._keys().members, member_id, msgpack.packb(record, use_bin_type=False))


def _session_deadline(ctx: Any, member_id: str) -> float:
    return ctx.coord._redis.zscore(ctx._keys().deadlines, f"hb:{member_id}")


def test_every_record_written_leads_with_the_session_timeout(ctx):
    # Written by the joins, the join completion and the sync propagation.
    ctx.session_timeout_ms = 7000
    _gen, ids = ctx.stable_group(3)
    for mid in ids:
        rec = _record(ctx, mid)
        assert next(iter(rec)) == b"st"
        assert rec[b"st"] == 7000 and rec[b"id"] == mid.encode()


@pytest.mark.parametrize("layout", ["current", "older"])
def test_a_heartbeat_and_a_commit_refresh_the_session_the_record_holds(ctx, layout):
    ctx.session_timeout_ms = 7000
    gen, ids = ctx.stable_group(2)
    follower = ids[1]
    if layout == "older":
        rec = _record(ctx, follower)
        rec[b"st"] = rec.pop(b"st")  # last instead of first
        _write_as_an_older_rcoord(ctx, follower, rec)
        assert list(_record(ctx, follower))[-1] == b"st"
    ctx.sleep(1000)
    assert ctx.heartbeat(follower, gen) == Errors.NONE
    assert _session_deadline(ctx, follower) == ctx.clock.milliseconds() + 7000
    ctx.sleep(1000)
    assert ctx.coord.commit_offsets(ctx.group_id, {TP: 5}, member_id=follower,
                                    generation_id=gen) == {TP: Errors.NONE}
    assert _session_deadline(ctx, follower) == ctx.clock.milliseconds() + 7000
    # Neither changed the record.
    assert _record(ctx, follower)[b"st"] == 7000


def test_a_record_of_more_than_fifteen_entries_is_rewritten_led_by_its_session_timeout(ctx):
    # Fifteen entries fit msgpack's one-byte map header; more take a three-byte one. A record
    # carrying fields this rcoord does not know (a newer one wrote them) keeps them.
    ctx.session_timeout_ms = 7000
    gen, ids = ctx.stable_group(1)
    leader = ids[0]
    rec = _record(ctx, leader)
    extra = {f"x{i}".encode(): i for i in range(16 - len(rec) + 4)}
    rec.pop(b"st")
    _write_as_an_older_rcoord(ctx, leader, {**rec, **extra, b"st": 7000})
    # The leader's rejoin rewrites its record (and, alone in the group, completes the join).
    ctx.session_timeout_ms = 9000
    joined = ctx.join(leader)
    assert joined.error == Errors.NONE and joined.generation_id == gen + 1
    blob = _blob(ctx, leader)
    assert blob[0] == 0xDE  # map16
    rewritten = msgpack.unpackb(blob, raw=True)
    assert next(iter(rewritten)) == b"st" and rewritten[b"st"] == 9000
    assert {k: rewritten[k] for k in extra} == extra
    ctx.sleep(1000)
    assert ctx.heartbeat(leader, gen + 1) == Errors.NONE
    assert _session_deadline(ctx, leader) == ctx.clock.milliseconds() + 9000
