"""Large groups (issue 12): join completion written in chunks, and the stored largest rebalance
timeout. A small chunk size (the partition settings field ``join_chunk_members``) makes a
10-member group use several chunks.

The raw tests call the library's functions one at a time with an explicit clock, so the state
between two chunks can be inspected; the scenario test runs the public API (both drivers; see
conftest.CTX_PAIRS for the backends), where parked callers drive the chunks themselves.
"""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from harness import RawGroup

from rcoord import Errors
from rcoord.protocol.consumer import ConsumerProtocolSubscription
from rcoord.protocol.join import JoinGroupResult, JoinRequest
from rcoord.protocol.sync import SyncGroupResult, SyncRequest

GROUP = "big"
T0 = 1_000_000
DELAY = 100


def set_chunk(coord: Any, group: str, size: int) -> None:
    coord._redis.hset(coord._keys(group).partition.cfg, "join_chunk_members", size)


def test_chunked_completion_through_the_api(ctx):
    set_chunk(ctx.coord, ctx.group_id, 3)
    _, ids = ctx.stable_group(10)
    # stable_group checked every join and sync answer; the leader saw all ten members.
    keys = ctx._keys()
    r = ctx.coord._redis
    assert r.zscore(keys.deadlines, "cj") is None
    assert ctx.group_field("cjk") is None and ctx.group_field("cjn") is None
    assert not [f for f in r.hkeys(keys.group) if f.startswith((b"cj:", b"cjm:"))]
    assert ctx.parked() == 0 and ctx.member_ids() == set(ids)


class Raw(RawGroup):
    """The library's functions for GROUP called one at a time at explicit times."""

    def __init__(self, coord: Any) -> None:
        super().__init__(coord, GROUP)

    def join(self, now: int, mid: str, rt: int = DELAY, i: int = 0, meta: bytes = b"") -> Any:
        return self.call("join_group", now, *JoinRequest.build(
            GROUP, mid, protocol_type="consumer", protocols=[("range", meta)],
            session_timeout_ms=60_000, rebalance_timeout_ms=rt, group_instance_id=None,
            client_id=f"c{i}", client_host="", require_known_member_id=True, reason=None,
        ).args())

    def await_join(self, now: int, mid: str) -> Any:
        return self.call("await_reply", now, mid, "j")

    def parked(self) -> set[str]:
        return {k.decode() for k in self.r.hkeys(self.keys.joining)}


def form_parked(raw: Raw, n: int, rts: list[int] | None = None, meta: bytes = b"") -> list[str]:
    """n members joined and parked in the initial rebalance (its delay timer at T0 + DELAY)."""
    ids = []
    for i in range(n):
        res = JoinGroupResult.decode(bytes(raw.join(T0, "", i=i, meta=meta)[1]))
        assert res.error is Errors.MEMBER_ID_REQUIRED
        ids.append(res.member_id)
    for i, mid in enumerate(ids):
        assert raw.join(T0, mid, rt=(rts[i] if rts else DELAY), i=i, meta=meta)[0] == b"W"
    return ids


@pytest.fixture
def raw(make_coordinator) -> Raw:
    # rebalance timeout == delay: the initial rebalance completes at its first timer.
    coord = make_coordinator(group_initial_rebalance_delay_ms=DELAY)
    set_chunk(coord, GROUP, 3)
    return Raw(coord)


def test_completion_between_chunks(raw):
    ids = form_parked(raw, 10)
    now = T0 + DELAY
    first = raw.await_join(now, ids[0])  # applies the join timer: completion, chunk 1 of 4
    assert raw.field("state") == "CompletingRebalance" and raw.field("gen") == "1"
    assert raw.field("cjk") == "2" and raw.field("cjn") == "4"
    assert raw.r.zscore(raw.keys.deadlines, "cj") == 0
    # The sync timer runs; the pending syncs are written with each member's chunk.
    assert raw.r.hlen(raw.keys.syncing) == 3
    assert raw.r.zscore(raw.keys.deadlines, "sync") == now + DELAY
    # The leader (oldest) is answered with the last chunk, whichever chunk it is in; the
    # members of chunks 2-4 are still parked (chunks follow the member hash's order).
    assert first[0] == b"W" and ids[0] in raw.parked() and len(raw.parked() - {ids[0]}) in (6, 7)
    # A heartbeat is answered as after a completion in one call (the pending chunks do not
    # hold it back): the old generation is illegal, the new one refreshes the session.
    hb = raw.coord._scripts.call("heartbeat", raw.keys.heartbeat_keys(),
                                 [str(now), GROUP, ids[5], 0, "", ids[6], 1, ""])
    assert hb == [b"ILLEGAL_GENERATION", b"NONE"]
    assert raw.r.zscore(raw.keys.deadlines, "cj") == 0  # no chunk written by it
    # Each later call writes one chunk.
    assert raw.call("expire_deadlines", now + 1)[0] == 1
    assert raw.field("cjk") == "3" and len(raw.parked() - {ids[0]}) in (3, 4)
    raw.call("expire_deadlines", now + 1)
    assert raw.field("cjk") == "4"
    last = raw.await_join(now + 2, ids[0])  # the last chunk: the leader's reply
    assert last[0] == b"R" and raw.field("cjk") is None and not raw.parked()
    assert {k.decode() for k in raw.r.hkeys(raw.keys.syncing)} == set(ids)
    assert raw.r.zscore(raw.keys.deadlines, "cj") is None
    lead = JoinGroupResult.decode(bytes(last[1]))
    assert lead.error is Errors.NONE and lead.leader_id == ids[0] and lead.generation_id == 1
    # All members, oldest first, as a completion in one call lists them.
    assert [m.member_id for m in lead.members] == ids
    for mid in ids[1:]:
        res = JoinGroupResult.decode(bytes(raw.await_join(now + 2, mid)[1]))
        assert res.error is Errors.NONE and res.generation_id == 1 and res.members == []
    # Session deadlines count from the completion, not from the call that wrote the chunk.
    scores = {raw.r.zscore(raw.keys.deadlines, f"hb:{m}") for m in ids}
    assert scores == {now + 60_000}
    # The metadata (b"") is no subscription: the topics are unknown, as Kafka computes them.
    assert raw.r.hget(raw.keys.group, "subs") is None


def test_a_caller_whose_reply_is_stored_gets_it_and_leaves_the_chunks_to_the_waiting(raw):
    """Every parked caller a chunk wakes and does not answer polls; when those answered by an
    earlier chunk ran the wrapper too, a 1,000-member completion cost 900 full calls more than
    its chunks (bench/leave_batch.py). A stored reply is final, so it is returned as it is."""
    ids = form_parked(raw, 10)
    now = T0 + DELAY
    assert raw.await_join(now, ids[0])[0] == b"W"  # completion, chunk 1 of 4
    answered = [m for m in ids if raw.r.hexists(raw.keys.replies, f"j:{m}")]
    waiting = [m for m in ids if m not in answered]
    # (The leader's reply comes with the last chunk, whichever chunk it is in.)
    assert len(answered) in (2, 3) and ids[0] not in answered and raw.field("cjk") == "2"
    before = {m: raw.r.hget(raw.keys.replies, f"j:{m}") for m in answered}
    for mid in answered:
        reply = raw.await_join(now + 1, mid)
        assert reply == [b"R", before[mid]]
        # No chunk written, and the continuation is still due (the waiting callers write it).
        assert raw.field("cjk") == "2" and raw.r.zscore(raw.keys.deadlines, "cj") == 0
    # The callers still waiting write one chunk each, as before, until every reply is stored.
    calls = 0
    while waiting:
        mid = waiting.pop(0)
        reply = raw.await_join(now + 1, mid)
        calls += 1
        if reply[0] == b"W":
            waiting.append(mid)
        else:
            res = JoinGroupResult.decode(bytes(reply[1]))
            assert res.error is Errors.NONE and res.generation_id == 1
        assert calls <= 3 * len(ids), "the chunks must be written by the waiting callers"
    assert raw.field("cjk") is None and raw.r.zscore(raw.keys.deadlines, "cj") is None
    assert not raw.parked()


def test_a_membership_change_during_a_completion_is_busy_until_the_completion_is_whole(raw):
    ids = form_parked(raw, 10)
    now = T0 + DELAY
    raw.await_join(now, ids[0])
    assert raw.field("cjk") == "2"
    # A LeaveGroup during the completion does not finish it in one call (that would block the
    # shard as long as the completion itself): each call writes the next chunk and, while
    # chunks remain, answers BUSY with the member still in place.
    busy = 0
    while (res := raw.call_once("leave_group", now + 1, msgpack.packb([[ids[9], ""]]))) == [b"B"]:
        busy += 1
        assert ids[9] in {m.decode() for m in raw.r.hkeys(raw.keys.members)}
        assert raw.field("state") == "CompletingRebalance"
    # Chunks 2 and 3 were written by calls that answered BUSY; the third wrote chunk 4, the
    # last, and then removed the member.
    assert busy == 2 and raw.field("cjk") is None
    assert res[0] == b"NONE" and res[1] == [b"NONE"]
    assert raw.r.zscore(raw.keys.deadlines, "cj") is None
    assert raw.field("state") == "PreparingRebalance"
    for mid in ids[:9]:  # every parked member was answered with generation 1
        reply = raw.await_join(now + 1, mid)
        assert reply[0] == b"R"
        res = JoinGroupResult.decode(bytes(reply[1]))
        assert res.error is Errors.NONE and res.generation_id == 1


def test_a_join_and_a_describe_during_a_completion_are_busy_too(raw):
    ids = form_parked(raw, 10)
    now = T0 + DELAY
    raw.await_join(now, ids[0])
    assert raw.field("cjk") == "2"
    # The leader re-sends its JoinGroup: that call writes chunk 2 and answers BUSY...
    join = JoinRequest.build(
        GROUP, ids[0], protocol_type="consumer", protocols=[("range", b"")],
        session_timeout_ms=60_000, rebalance_timeout_ms=DELAY, group_instance_id=None,
        client_id="c0", client_host="", require_known_member_id=True, reason=None).args()
    assert raw.call_once("join_group", now, *join) == [b"B"] and raw.field("cjk") == "3"
    # ...as does a describe (chunk 3); the next writes the last chunk and answers.
    assert raw.call_once("describe_group", now) == [b"B"] and raw.field("cjk") == "4"
    described = msgpack.unpackb(raw.call_once("describe_group", now), raw=False)
    assert raw.field("cjk") is None
    assert described["st"] == "CompletingRebalance" and len(described["mem"]) == 10
    lead = JoinGroupResult.decode(bytes(raw.call_once("join_group", now, *join)[1]))
    assert lead.error is Errors.NONE and [m.member_id for m in lead.members] == ids


def test_an_offset_delete_during_a_completion_waits_for_its_subscriptions(raw):
    # The subscribed topics are written with the completion's last chunk; until then they are
    # unknown, and an unknown set counts every topic as subscribed. Kafka knows them from the
    # start of CompletingRebalance, so a topic nobody subscribes to is deleted there.
    ids = form_parked(raw, 10, meta=ConsumerProtocolSubscription(topics=["orders"]).encode())
    now = T0 + DELAY
    raw.await_join(now, ids[0])
    assert raw.field("cjk") == "2" and raw.field("subs") is None
    raw.r.hset(raw.keys.offsets, mapping={"0:audit": b"x", "0:orders": b"x"})
    assert raw.call_once("delete_offsets", now, "0:audit", "0:orders") == [b"B"]
    assert raw.field("cjk") == "3" and raw.r.hlen(raw.keys.offsets) == 2  # (nothing deleted)
    reply = raw.call("delete_offsets", now, "0:audit", "0:orders")
    assert raw.field("cjk") is None and raw.field("state") == "CompletingRebalance"
    assert reply == [b"NONE", [b"NONE", b"GROUP_SUBSCRIBED_TO_TOPIC"]]
    assert raw.r.hkeys(raw.keys.offsets) == [b"0:orders"]


def test_leader_sync_during_completion_settles_it_first(raw):
    # A client that syncs before its join reply (it cannot have the member list yet, but it
    # can name the generation) is not turned away: the chunks are written first, in that call.
    ids = form_parked(raw, 7)
    now = T0 + DELAY
    raw.await_join(now, ids[0])
    assert raw.field("cjk") is not None
    sync = raw.call("sync_group", now, *SyncRequest.build(
        GROUP, 1, ids[0], assignments={m: m.encode() for m in ids}, group_instance_id=None,
        protocol_type=None, protocol_name=None).args())
    assert SyncGroupResult.decode(bytes(sync[1])).error is Errors.NONE
    assert raw.field("state") == "Stable" and raw.field("cjk") is None and not raw.parked()
    for mid in ids[1:]:
        res = JoinGroupResult.decode(bytes(raw.await_join(now, mid)[1]))
        assert res.error is Errors.NONE and res.generation_id == 1


def test_largest_rebalance_timeout_is_stored(raw):
    rts = [100, 900, 300, 900]
    ids = form_parked(raw, 4, rts)
    assert msgpack.unpackb(raw.r.hget(raw.keys.group, "rtc"), strict_map_key=False) == {
        100: 1, 300: 1, 900: 2}
    t = T0 + DELAY
    while raw.field("state") == "PreparingRebalance":
        raw.call("expire_deadlines", t)
        t += DELAY
    while raw.field("cjk") is not None:
        raw.call("expire_deadlines", t)
    assert raw.field("state") == "CompletingRebalance"
    assert raw.r.zscore(raw.keys.deadlines, "sync") is not None
    # Both members with 900 leave: the rebalance waits the largest remaining timeout (300).
    res = raw.call("leave_group", t, msgpack.packb([[ids[1], ""], [ids[3], ""]]))
    assert res[1] == [b"NONE", b"NONE"]
    assert raw.field("state") == "PreparingRebalance"
    assert raw.r.zscore(raw.keys.deadlines, "join") == t + 300
    assert msgpack.unpackb(raw.r.hget(raw.keys.group, "rtc"), strict_map_key=False) == {
        100: 1, 300: 1}


def test_group_without_stored_timeouts_counts_its_members(raw):
    ids = form_parked(raw, 3, [100, 700, 200])
    raw.r.hdel(raw.keys.group, "rtc")  # as stored before the field existed
    res = raw.call("leave_group", T0, msgpack.packb([[ids[0], ""]]))
    assert res[1] == [b"NONE"]
    assert msgpack.unpackb(raw.r.hget(raw.keys.group, "rtc"), strict_map_key=False) == {
        700: 1, 200: 1}
    # A rejoin with another timeout moves the count.
    assert raw.join(T0, ids[1], rt=400, i=1)[0] == b"W"
    assert msgpack.unpackb(raw.r.hget(raw.keys.group, "rtc"), strict_map_key=False) == {
        400: 1, 200: 1}


def sync(raw: Raw, now: int, mid: str, gen: int = 1, asg: dict[str, bytes] | None = None) -> Any:
    return raw.call("sync_group", now, *SyncRequest.build(
        GROUP, gen, mid, assignments=asg, group_instance_id=None, protocol_type=None,
        protocol_name=None).args())


def sync_all(raw: Raw, ids: list[str], now: int) -> None:
    """Every member sends SyncGroup, the leader (ids[0]) last, assigning each its own id."""
    for mid in ids[1:]:
        sync(raw, now, mid)
    sync(raw, now, ids[0], asg={m: m.encode() for m in ids})


def complete(raw: Raw, ids: list[str], now: int) -> None:
    """Completes the initial join (every chunk written) and collects the join replies."""
    raw.await_join(now, ids[0])
    while raw.field("cjk") is not None:
        raw.call("expire_deadlines", now)
    assert raw.field("state") == "CompletingRebalance" and not raw.parked()


def form_stable(raw: Raw, n: int) -> list[str]:
    """n members formed into a Stable generation at T0 + DELAY (the first one leads)."""
    ids = form_parked(raw, n)
    complete(raw, ids, T0 + DELAY)
    sync_all(raw, ids, T0 + DELAY)
    assert raw.field("state") == "Stable"
    return ids


def test_sync_propagation_between_chunks(raw):
    ids = form_parked(raw, 7)
    now = T0 + DELAY
    complete(raw, ids, now)
    for mid in ids[1:]:
        assert sync(raw, now, mid)[0] == b"W"
    lead = sync(raw, now + 1, ids[0], asg={m: m.encode() for m in ids})
    # Stable once the leader's assignment is stored, as in Kafka; the leader's own chunk is first.
    assert raw.field("state") == "Stable" and raw.field("csk") == "2" and raw.field("csn") == "3"
    assert raw.r.zscore(raw.keys.deadlines, "cs") == 0
    assert lead[0] == b"R"
    res = SyncGroupResult.decode(bytes(lead[1]))
    assert res.error is Errors.NONE and res.assignment == ids[0].encode()
    answered = {m for m in ids if raw.r.hexists(raw.keys.replies, f"s:{m}")}
    assert len(answered) == 3 and ids[0] in answered
    pending = [m for m in ids if m not in answered]
    # Heartbeats see Stable (no REBALANCE_IN_PROGRESS, not held back), and write no chunk; a
    # session a heartbeat refreshed is not shortened by its member's chunk later.
    hb = raw.coord._scripts.call("heartbeat", raw.keys.heartbeat_keys(),
                                 [str(now + 50), GROUP, pending[0], 1, "", ids[0], 1, ""])
    assert hb == [b"NONE", b"NONE"] and raw.field("csk") == "2"
    # A member whose chunk is pending and syncs again in Stable waits for its chunk.
    again = sync(raw, now + 50, pending[1])
    assert again[0] == b"W" or SyncGroupResult.decode(bytes(again[1])).assignment == \
        pending[1].encode()
    while raw.field("csk") is not None:
        assert raw.call("expire_deadlines", now + 60)[0] >= 1
    assert raw.r.zscore(raw.keys.deadlines, "cs") is None
    assert not [f for f in raw.r.hkeys(raw.keys.group) if f.startswith((b"cs:", b"cse", b"cst"))]
    for mid in ids:
        res = SyncGroupResult.decode(bytes(raw.call("await_reply", now + 60, mid, "s")[1]))
        assert res.error is Errors.NONE and res.assignment == mid.encode(), mid
    assert raw.r.zscore(raw.keys.deadlines, f"hb:{pending[0]}") == now + 50 + 60_000
    assert raw.r.zscore(raw.keys.deadlines, f"hb:{pending[2]}") == now + 1 + 60_000
    # A later SyncGroup in Stable reads the stored assignment.
    res = SyncGroupResult.decode(bytes(sync(raw, now + 70, pending[2])[1]))
    assert res.error is Errors.NONE and res.assignment == pending[2].encode()


def test_leave_during_sync_chunks_is_busy_until_they_are_written(raw):
    ids = form_parked(raw, 7)
    now = T0 + DELAY
    complete(raw, ids, now)
    sync_all(raw, ids, now)
    assert raw.field("csk") == "2"
    # Three chunks: the leader's call wrote the first; a leave writes the second and answers
    # BUSY, the next writes the last and removes the member.
    assert raw.call_once("leave_group", now + 1, msgpack.packb([[ids[6], ""]])) == [b"B"]
    assert raw.field("csk") == "3" and raw.field("state") == "Stable"
    res = raw.call_once("leave_group", now + 1, msgpack.packb([[ids[6], ""]]))
    assert res[1] == [b"NONE"] and raw.field("csk") is None
    assert raw.field("state") == "PreparingRebalance"
    for mid in ids[:6]:  # every parked SyncGroup got its assignment before the member left
        res = SyncGroupResult.decode(bytes(raw.call("await_reply", now + 1, mid, "s")[1]))
        assert res.error is Errors.NONE and res.assignment == mid.encode()


def order(raw: Raw) -> list[str]:
    """The group's order key, oldest first."""
    return [m.decode() for m in raw.r.zrange(raw.keys.order, 0, -1)]


def test_leader_election_reads_the_join_order(raw):
    ids = form_parked(raw, 10)
    complete(raw, ids, T0 + DELAY)
    assert raw.field("leader") == ids[0]
    # The order key scores each member by its join sequence; no record is read to elect, and
    # the group hash holds no field per member.
    assert raw.r.zrange(raw.keys.order, 0, -1, withscores=True) == [
        (m.encode(), float(i + 1)) for i, m in enumerate(ids)]
    assert not [f for f in raw.r.hkeys(raw.keys.group) if f.startswith(b"o:")]
    leaving = [ids[0], ids[1], ids[2], ids[4]]
    res = raw.call("leave_group", T0 + DELAY, msgpack.packb([[m, ""] for m in leaving]))
    assert res[1] == [b"NONE"] * 4
    assert raw.field("leader") == ids[3] and order(raw) == [ids[3], *ids[5:]]
    raw.call("leave_group", T0 + DELAY, msgpack.packb([[ids[3], ""]]))
    assert raw.field("leader") == ids[5] and order(raw) == ids[5:]
    # Everyone leaves: no leader, and the order key is gone with its last member.
    raw.call("leave_group", T0 + DELAY, msgpack.packb([[m, ""] for m in ids[5:]]))
    assert raw.field("leader") == "" and not raw.r.exists(raw.keys.order)


def test_leader_election_after_a_batch_leave_of_the_oldest_hundreds(raw):
    # The scan reads a small first batch, then larger ones: after the oldest 130 left, the
    # next oldest is elected (it heads the order key).
    ids = form_parked(raw, 150)
    complete(raw, ids, T0 + DELAY)
    leaving = ids[:130] + [ids[131]]
    res = raw.call("leave_group", T0 + DELAY, msgpack.packb([[m, ""] for m in leaving]))
    assert res[1] == [b"NONE"] * len(leaving)
    assert raw.field("leader") == ids[130] and order(raw) == [ids[130], *ids[132:]]
    raw.call("leave_group", T0 + DELAY, msgpack.packb([[ids[130], ""]]))
    assert raw.field("leader") == ids[132] and order(raw) == ids[132:]


def test_the_oldest_rejoined_member_leads_when_the_leader_did_not_rejoin(raw):
    # The join timer removes the 20 oldest members (the leader among them), which did not
    # rejoin: the new leader is the head of the order key after their removal.
    ids = form_stable(raw, 40)
    now = T0 + DELAY
    changed = JoinRequest.build(
        GROUP, ids[20], protocol_type="consumer", protocols=[("range", b"new")],
        session_timeout_ms=60_000, rebalance_timeout_ms=DELAY, group_instance_id=None,
        client_id="c20", client_host="", require_known_member_id=True, reason=None).args()
    assert raw.call("join_group", now + 1, *changed)[0] == b"W"  # new metadata: a rebalance
    assert raw.field("state") == "PreparingRebalance"
    for i, mid in enumerate(ids[21:], start=21):
        assert raw.join(now + 1, mid, i=i)[0] == b"W"
    raw.call("expire_deadlines", now + 1 + DELAY)
    assert raw.field("state") == "CompletingRebalance"
    assert raw.field("leader") == ids[20] and order(raw) == ids[20:]


def test_a_replaced_static_member_keeps_its_place_in_the_join_order(raw):
    # A static member that restarts (a new member id for its instance id) keeps its join
    # sequence: when the leader, older than it, leaves, it leads, not a younger member.
    def static_join(now: int, mid: str) -> Any:
        return raw.call("join_group", now, *JoinRequest.build(
            GROUP, mid, protocol_type="consumer", protocols=[("range", b"")],
            session_timeout_ms=60_000, rebalance_timeout_ms=DELAY, group_instance_id="s1",
            client_id="s", client_host="", require_known_member_id=True, reason=None).args())

    (leader,) = form_parked(raw, 1)
    assert static_join(T0, "")[0] == b"W"
    static_old = next(m for m in raw.parked() if m != leader)
    younger = form_parked(raw, 1)[0]
    ids = [leader, static_old, younger]
    now = T0 + DELAY
    complete(raw, ids, now)
    sync_all(raw, ids, now)
    assert raw.field("state") == "Stable" and order(raw) == ids
    seq = int(raw.field("seq"))
    res = JoinGroupResult.decode(bytes(static_join(now + 1, "")[1]))
    assert res.error is Errors.NONE and res.member_id != static_old
    assert order(raw) == [leader, res.member_id, younger]
    # The join sequence moves on all the same (a paged describe sees that the members changed).
    assert int(raw.field("seq")) == seq + 1
    raw.call("leave_group", now + 2, msgpack.packb([[leader, ""]]))
    assert raw.field("leader") == res.member_id


def test_a_group_an_older_rcoord_made_elects_from_the_records(raw):
    # A group made before the order key existed has order fields in the group hash and no
    # 'oq': elections read the member records, and removals drop the old fields.
    ids = form_parked(raw, 6)
    complete(raw, ids, T0 + DELAY)
    raw.r.hdel(raw.keys.group, "oq")
    raw.r.delete(raw.keys.order)
    raw.r.hset(raw.keys.group, mapping={"oi": 1, **{f"o:{i + 1}": m for i, m in enumerate(ids)}})
    res = raw.call("leave_group", T0 + DELAY, msgpack.packb([[ids[0], ""], [ids[2], ""]]))
    assert res[1] == [b"NONE"] * 2
    assert raw.field("leader") == ids[1]
    assert sorted(f.decode() for f in raw.r.hkeys(raw.keys.group) if f.startswith(b"o:")) == [
        "o:2", "o:4", "o:5", "o:6"]
    assert not raw.r.exists(raw.keys.order)


def test_heartbeat_retries_while_chunks_make_progress(make_coordinator):
    from rcoord.testing.clock import MockTime

    clock = MockTime(T0)
    coord = make_coordinator(clock=clock, group_initial_rebalance_delay_ms=DELAY)
    coord._redis.hset(coord._keys(GROUP).partition.cfg, "join_chunk_members", 1)
    raw = Raw(coord)
    # More chunks than MAX_DUE_RETRIES, and a passed session deadline behind them: each sweep
    # writes one chunk, and the heartbeat is answered once the completion is whole.
    from rcoord.steps import MAX_DUE_RETRIES

    ids = form_parked(raw, MAX_DUE_RETRIES + 5)
    now = T0 + DELAY
    raw.await_join(now, ids[0])
    assert int(raw.field("cjn")) > MAX_DUE_RETRIES + 1
    raw.r.zadd(raw.keys.deadlines, {"hb:not-a-member": now})
    clock.sleep(DELAY + 1)
    assert clock() >= now
    assert coord.heartbeat(GROUP, 1, ids[1]) is Errors.NONE
    assert raw.field("cjk") is None and raw.r.zscore(raw.keys.deadlines, "hb:not-a-member") is None


# -- bursts of deadlines ---------------------------------------------------------------------


def set_due_per_call(coord: Any, n: int) -> None:
    coord._redis.hset(coord._keys(GROUP).partition.cfg, "due_per_call", n)


def members(raw: Raw) -> set[str]:
    return {m.decode() for m in raw.r.hkeys(raw.keys.members)}


def burst(raw: Raw, n: int, staying: int) -> tuple[list[str], int]:
    """A Stable group of ``n``, whose first ``staying`` members heartbeat late, so the sessions
    of the others pass together at the time returned."""
    ids = form_stable(raw, n)
    now = T0 + DELAY
    # The sync chunks still to write, and what fell due with the sync (the offsets check).
    while raw.field("csk") is not None:
        raw.call("expire_deadlines", now + 1)
    raw.call("expire_deadlines", now + 1)
    assert raw.r.zcount(raw.keys.deadlines, "-inf", now + 1) == 0
    args = [str(now + 30_000), GROUP]
    for mid in ids[:staying]:
        args += [mid, 1, ""]
    hb = raw.coord._scripts.call("heartbeat", raw.keys.heartbeat_keys(), args)
    assert hb == [b"NONE"] * staying
    return ids, now + 60_001


def test_a_burst_of_session_expiries_is_applied_a_share_per_call(raw):
    # Seven sessions pass at once and a call applies three: a step that finds them due applies
    # its share and answers BUSY (nothing of the step done) until none is left, then runs.
    set_due_per_call(raw.coord, 3)
    ids, later = burst(raw, 10, staying=3)
    assert raw.call_once("describe_group", later) == [b"B"] and len(members(raw)) == 7
    assert raw.call_once("describe_group", later) == [b"B"] and len(members(raw)) == 4
    described = msgpack.unpackb(raw.call_once("describe_group", later), raw=False)
    assert members(raw) == set(ids[:3]) == {m["id"] for m in described["mem"]}
    assert described["st"] == "PreparingRebalance"


def test_the_sweep_applies_a_share_per_call_and_stays_due_for_the_rest(raw):
    set_due_per_call(raw.coord, 3)
    ids, later = burst(raw, 10, staying=3)
    due = raw.r.zscore(raw.keys.partition.due, GROUP)
    assert due is not None and due <= later
    reply = raw.call_once("expire_deadlines", later)
    assert reply[0] == 3 and [int(x) for x in reply[1:]] == [1] * 3  # lateness, ms
    assert len(members(raw)) == 7
    assert raw.r.zscore(raw.keys.partition.due, GROUP) <= later  # still due: the sweep returns
    assert raw.call_once("expire_deadlines", later)[0] == 3
    assert raw.call_once("expire_deadlines", later)[0] == 1
    assert members(raw) == set(ids[:3])
    assert raw.r.zscore(raw.keys.partition.due, GROUP) > later


def test_every_expiry_of_a_burst_is_applied_through_the_api(make_coordinator):
    # The public API hides the shares: run_timers sweeps until nothing is due, a heartbeat
    # applies the deadlines first, and a step answered BUSY is sent again.
    from rcoord import TopicPartition
    from rcoord.testing.clock import MockTime

    clock = MockTime(T0)
    coord = make_coordinator(clock=clock, group_initial_rebalance_delay_ms=DELAY)
    set_due_per_call(coord, 2)
    raw = Raw(coord)
    ids, later = burst(raw, 9, staying=2)
    clock.sleep(later - clock())
    tp = TopicPartition("t", 0)
    # A commit from an expired member: its session is gone (deadlines act first).
    assert coord.commit_offsets(GROUP, {tp: 1}, member_id=ids[5], generation_id=1) == {
        tp: Errors.UNKNOWN_MEMBER_ID}
    assert members(raw) == set(ids[:2])
    # Another burst, swept by run_timers, then a heartbeat that finds none left to apply.
    set_due_per_call(coord, 1)
    assert coord.heartbeat(GROUP, 1, ids[0]) is Errors.REBALANCE_IN_PROGRESS
    # (Deadlines of no member, due now: each is applied, to no effect. The group's published
    # earliest is a lower bound of its deadlines, so it is lowered with them.)
    raw.r.zadd(raw.keys.deadlines, {f"hb:ghost-{i}": clock() for i in range(5)})
    raw.r.hset(raw.keys.group, "ea", clock())
    raw.r.zadd(raw.keys.partition.due, {GROUP: clock()})
    assert coord.run_timers() == 5
    assert raw.r.zcount(raw.keys.deadlines, "-inf", clock()) == 0


def test_a_reset_during_completing_rebalance_writes_only_the_members_that_synced(raw):
    # Kafka clears every assignment and answers the parked SyncGroups; only the latter can be
    # observed (an assignment is read in Stable only, and Stable is reached with the leader's),
    # so only the members that synced are written.
    ids = form_parked(raw, 7)
    now = T0 + DELAY
    complete(raw, ids, now)
    synced, waiting = ids[1:3], ids[3:]
    for mid in synced:
        assert sync(raw, now, mid)[0] == b"W"
    before = {mid: raw.r.hget(raw.keys.members, mid) for mid in waiting}
    # A member leaves: a rebalance, and the reset of the pending assignment.
    res = raw.call("leave_group", now, msgpack.packb([[ids[6], ""]]))
    assert res[1] == [b"NONE"] and raw.field("state") == "PreparingRebalance"
    for mid in synced:
        reply = raw.call("await_reply", now, mid, "s")
        assert reply[0] == b"R"
        assert SyncGroupResult.decode(bytes(reply[1])).error is Errors.REBALANCE_IN_PROGRESS
        assert msgpack.unpackb(raw.r.hget(raw.keys.members, mid), raw=True)[b"as"] == 0
    for mid in waiting[:-1]:
        assert raw.r.hget(raw.keys.members, mid) == before[mid]
        assert not raw.r.hexists(raw.keys.replies, f"s:{mid}")


def test_a_description_whose_group_changed_between_pages_starts_again(make_coordinator,
                                                                        monkeypatch):
    import rcoord.steps
    from rcoord.steps import GroupSteps
    from rcoord.testing.clock import MockTime

    clock = MockTime(T0 + DELAY)
    coord = make_coordinator(clock=clock, group_initial_rebalance_delay_ms=DELAY)
    set_chunk(coord, GROUP, 3)
    raw = Raw(coord)
    ids = form_stable(raw, 6)
    monkeypatch.setattr(rcoord.steps, "DESCRIBE_PAGE", 2)
    calls = []
    call = GroupSteps.call

    def changing(self, step, keys, args):
        reply = yield from call(self, step, keys, args)
        if step == "describe_group":
            calls.append(list(args))
            if len(calls) == 1:  # between the first and second page, a member leaves
                raw.call("leave_group", clock(), msgpack.packb([[ids[5], ""]]))
        return reply

    monkeypatch.setattr(GroupSteps, "call", changing)
    desc = coord.describe_group(GROUP)
    assert calls == [[0, 2], [2, 2], [0, 2], [2, 2], [4, 2]]  # the second page started it again
    assert desc.state == "PreparingRebalance"
    assert [m.member_id for m in desc.members] == ids[:5]  # (join order)
    # A group that keeps changing: the last try lists it in one call.
    monkeypatch.setattr(rcoord.steps, "DESCRIBE_RESTARTS", 0)
    calls.clear()
    assert [m.member_id for m in coord.describe_group(GROUP).members] == ids[:5]
    assert calls == [[0, ""]]


def test_a_page_that_lacks_a_member_its_ids_named_starts_the_description_again(
        make_coordinator, monkeypatch):
    # (Nothing leaves an id in the order key without its member; if something did, the pages
    # would drift. A page shorter than its ids is taken for a change: the last try lists the
    # group in one call.)
    import rcoord.steps
    from rcoord.testing.clock import MockTime

    coord = make_coordinator(clock=MockTime(T0 + DELAY), group_initial_rebalance_delay_ms=DELAY)
    set_chunk(coord, GROUP, 3)
    raw = Raw(coord)
    ids = form_stable(raw, 5)
    raw.r.zadd(raw.keys.order, {"ghost": 2.5})  # between the second and third member
    raw.r.hdel(raw.keys.members, ids[4])  # (so the order key's count still matches)
    monkeypatch.setattr(rcoord.steps, "DESCRIBE_PAGE", 2)
    assert [m.member_id for m in coord.describe_group(GROUP).members] == ids[:4]


def test_a_group_an_older_rcoord_made_is_described_in_one_call(raw):
    # Members an older rcoord added during a rolling upgrade are missing from the join order
    # key; without the key at all, the same: the members are listed whole, in join order.
    ids = form_stable(raw, 5)
    raw.r.zrem(raw.keys.order, ids[4])
    blob = raw.call("describe_group", T0 + DELAY, 0, 2)
    described = msgpack.unpackb(blob, raw=False)
    assert [m["id"] for m in described["mem"]] == ids and described["n"] == 5
    raw.r.hdel(raw.keys.group, "oq")
    raw.r.delete(raw.keys.order)
    blob = raw.call("describe_group", T0 + DELAY, 0, 2)
    described = msgpack.unpackb(blob, raw=False)
    assert [m["id"] for m in described["mem"]] == ids and described["n"] == 5


@pytest.mark.parametrize("backend", ["single"])
def test_a_completion_of_more_chunks_than_one_unpack_holds_finishes(make_coordinator):
    """The last chunk of a join completion drops two group fields per chunk: in one HDEL
    spread with Lua's unpack (about 8,000 values at most), a completion of more than 4,000
    chunks failed after that chunk's writes, on every call after it, and the group was stuck
    (reachable with the default chunk of 100 at about 400,000 members; here chunks of one)."""
    coord = make_coordinator(group_initial_rebalance_delay_ms=DELAY)
    set_chunk(coord, GROUP, 1)
    raw = Raw(coord)
    n = 4_002

    def new_member() -> list[Any]:
        return JoinRequest.build(
            GROUP, "", protocol_type="consumer", protocols=[("range", b"")],
            session_timeout_ms=600_000, rebalance_timeout_ms=DELAY, group_instance_id=None,
            client_id="c", client_host="", require_known_member_id=False, reason=None).args()

    first = raw.call("join_group", T0, *new_member())
    assert first[0] == b"W"
    # The other joins in pipelines (the same calls RawGroup makes, sent in bulk).
    fn, keys = f"{coord._scripts.library}_join_group", raw.keys.all()
    for start in range(1, n, 500):
        pipe = raw.r.pipeline(transaction=False)
        for _ in range(start, min(n, start + 500)):
            pipe.fcall(fn, len(keys), *keys, str(T0), GROUP, *new_member())
        assert {reply[0] for reply in pipe.execute()} == {b"W"}
    assert raw.r.hlen(raw.keys.members) == n
    leader = first[4].decode()
    # The delay passes; the sweep writes the completion a chunk per call (the first starts it).
    now = T0 + DELAY
    for _ in range(n + 1):
        raw.call_once("expire_deadlines", now)
        if raw.field("cjk") is None:
            break
    reply = raw.await_join(now, leader)
    assert reply[0] == b"R"
    res = JoinGroupResult.decode(bytes(reply[1]))
    assert res.error is Errors.NONE and res.leader_id == leader and len(res.members) == n
    assert raw.field("cjk") is None and raw.r.zscore(raw.keys.deadlines, "cj") is None
    assert not [f for f in raw.r.hkeys(raw.keys.group) if f.startswith((b"cj:", b"cjm:"))]
    assert raw.field("state") == "CompletingRebalance" and raw.r.hlen(raw.keys.joining) == 0
    assert raw.call("expire_deadlines", T0 + DELAY + 1)[0] == 0  # the group goes on


def test_a_sync_reply_written_by_a_later_chunk_carries_the_time_of_the_session_refresh(raw):
    """A parked follower counts its session from the sending of its SyncGroup plus the server
    time it was parked (``SyncGroupResult.parked_ms``: the reply's ``at`` less the time it
    parked; rcoord.client's join_generation). A later chunk refreshes the sessions from the
    propagation, not from the call that writes it, so its replies must say that time: stamped
    with the writing call's, the member counted its session later than the coordinator did, by
    the time between the chunks."""
    ids = form_parked(raw, 7)
    now = T0 + DELAY
    complete(raw, ids, now)
    for mid in ids[1:]:
        assert sync(raw, now, mid)[0] == b"W"
    sync(raw, now + 1, ids[0], asg={m: m.encode() for m in ids})
    assert raw.field("csk") == "2"
    while raw.field("csk") is not None:
        assert raw.call("expire_deadlines", now + 5000)[0] >= 1
    for mid in ids[1:]:
        res = SyncGroupResult.decode(bytes(raw.call("await_reply", now + 5000, mid, "s")[1]), now)
        assert res.error is Errors.NONE and res.assignment == mid.encode()
        assert raw.r.zscore(raw.keys.deadlines, f"hb:{mid}") == now + 1 + 60_000
        assert res.parked_ms == 1, mid  # parked at now, refreshed at now + 1


def test_a_group_made_again_with_the_same_counts_between_pages_starts_again(make_coordinator,
                                                                            monkeypatch):
    # The pages' token held the state, the generation, the join sequence and the member count:
    # a group emptied, deleted and formed again alike between two pages matched all four, and
    # the description mixed the two groups' members. Its incarnation tells them apart.
    import rcoord.steps
    from rcoord.steps import GroupSteps
    from rcoord.testing.clock import MockTime

    clock = MockTime(T0 + DELAY)
    coord = make_coordinator(clock=clock, group_initial_rebalance_delay_ms=DELAY)
    raw = Raw(coord)
    old = form_stable(raw, 4)
    monkeypatch.setattr(rcoord.steps, "DESCRIBE_PAGE", 2)
    made: list[list[str]] = []
    call = GroupSteps.call

    def remaking(self, step, keys, args):
        reply = yield from call(self, step, keys, args)
        if step == "describe_group" and not made:
            raw.call("leave_group", clock(), msgpack.packb([[m, ""] for m in old]))
            assert coord.delete_groups([GROUP]) == {GROUP: Errors.NONE}
            made.append(form_stable(raw, 4))
        return reply

    monkeypatch.setattr(GroupSteps, "call", remaking)
    desc = coord.describe_group(GROUP)
    assert [m.member_id for m in desc.members] == made[0]
