"""What a group step asks the server, command by command: a step does not read what it already
knows (the reply it just wrote, a member id that cannot exist, a count it just made non-zero, a
setting its first read could carry). Each command costs about a microsecond inside the server,
and the steps of a rebalance round run them once per member of a forming group.

The calls go through a recording copy of the library (rcoord.testing.library.recording_copy) on
the groups the public API formed; each test checks first that the call took the path it is
about (its reply), so a path that stopped being taken fails instead of passing empty.
"""

from __future__ import annotations

import concurrent.futures as cf
import uuid
from collections.abc import Iterator
from typing import Any

import msgpack
import pytest
import redis

from rcoord import CoordinatorConfig, GroupCoordinator
from rcoord.flow import Script
from rcoord.testing.library import RECORDED_FUNCTION, recording_copy

JOIN: dict[str, Any] = {"protocol_type": "consumer", "protocols": [("range", b"\x00\x01")],
                        "session_timeout_ms": 30_000, "rebalance_timeout_ms": 30_000,
                        "require_known_member_id": False}
COPY = "rcoord_recording"


@pytest.fixture
def client(single_client: redis.Redis) -> redis.Redis:
    return single_client


@pytest.fixture
def record(client: redis.Redis) -> Iterator[Any]:
    """record(coord, op) -> (reply, commands): ``op`` sent to the recording copy."""
    loaded: list[str] = []

    def run(coord: GroupCoordinator, op: Script) -> tuple[Any, list[list[bytes]]]:
        scripts = coord._scripts
        if not loaded:
            client.function_load(recording_copy(scripts.library, scripts._source, COPY),
                                 replace=True)
            loaded.append(COPY)
        client.fcall(RECORDED_FUNCTION, 0)  # (drops anything noted before)
        reply = client.fcall(f"{COPY}_{op.name}", len(op.keys), *op.keys, *op.args)
        return reply, client.fcall(RECORDED_FUNCTION, 0)

    yield run
    for lib in loaded:
        client.function_delete(lib)


def coordinator(client: redis.Redis, namespace: str, delay_ms: int) -> GroupCoordinator:
    return GroupCoordinator(client, CoordinatorConfig(
        namespace=namespace, group_initial_rebalance_delay_ms=delay_ms,
        group_min_session_timeout_ms=100)).start()


def first_call(flow: Any) -> Script:
    op = next(flow)
    flow.close()
    assert isinstance(op, Script), op
    return op


def on(key: str, commands: list[list[bytes]], *names: str) -> list[list[bytes]]:
    """The commands among ``commands`` on ``key`` (of the given names, if any)."""
    return [c for c in commands if len(c) > 1 and c[1] == key.encode()
            and (not names or c[0].decode().upper() in names)]


def test_a_new_members_join_asks_nothing_about_the_empty_member_id(
        client: redis.Redis, namespace: str, record: Any) -> None:
    # The initial rebalance's delay keeps the group in PreparingRebalance: the second member's
    # join adds it and parks, the common call of a forming group.
    coord = coordinator(client, namespace, delay_ms=60_000)
    keys = coord._keys("g")
    first = first_call(coord._steps.join_group("g", "", new_member_uuid=str(uuid.uuid4()), **JOIN))
    assert client.fcall(f"{coord._scripts.library}_join_group", len(first.keys), *first.keys,
                        *first.args)[0] == b"W"
    second = first_call(coord._steps.join_group("g", "", new_member_uuid=str(uuid.uuid4()),
                                                **JOIN))
    reply, commands = record(coord, second)
    assert reply[0] == b"W"
    assert len(on(keys.members, commands, "HSET")) == 1  # it added the member
    # Its own id is asked once (whether this is a resent join), the empty id never.
    assert on(keys.members, commands, "HGET", "HEXISTS") == [[b"HGET", keys.members.encode(),
                                                              reply[4]]]
    assert client.hlen(keys.members) == 2


def test_a_rebalance_round_answers_from_what_it_wrote(
        client: redis.Redis, namespace: str, record: Any) -> None:
    """The leader of a one-member Stable group rejoins: its JoinGroup completes the join in the
    same call, and its SyncGroup then stores the assignment and answers itself."""
    coord = coordinator(client, namespace, delay_ms=0)
    keys = coord._keys("g")
    joined = coord.join_group("g", **JOIN)
    mid = joined.member_id
    coord.sync_group("g", joined.generation_id, mid, assignments={mid: b"a"})

    reply, commands = record(coord, first_call(coord._steps.join_group("g", mid, **JOIN)))
    assert reply[0] == b"R"
    answer = msgpack.unpackb(reply[1])
    assert (answer["e"], answer["gen"], answer["ldr"]) == ("NONE", joined.generation_id + 1, mid)
    # The reply it wrote is the answer, not read back.
    assert [c[0] for c in on(keys.replies, commands, "HGET")] == []
    assert len(on(keys.replies, commands, "HSET")) == 1
    # The chunk size came with the settings (one read of them).
    assert len(on(keys.partition.cfg, commands)) == 1
    assert b"join_chunk_members" in on(keys.partition.cfg, commands)[0]
    # Whether the leader (or any member) is parked is not asked: the completion follows the
    # count that found every member parked; the chunk's pending syncs were just written, so
    # none is counted.
    assert on(keys.joining, commands, "HEXISTS") == []
    assert on(keys.joining, commands, "HMGET") == []
    assert on(keys.syncing, commands, "HLEN") == []
    # Its record is read once: selecting the protocol and completing the join reuse the record
    # the join read and rewrote.
    assert on(keys.members, commands, "HGET", "HMGET") == [
        [b"HGET", keys.members.encode(), mid.encode()]]
    # It rejoined with what it had: its record is not written again.
    assert on(keys.members, commands, "HSET") == []

    sync = first_call(coord._steps.sync_group("g", answer["gen"], mid, assignments={mid: b"b"}))
    reply, commands = record(coord, sync)
    assert reply[0] == b"R"
    assert msgpack.unpackb(reply[1])["asg"] == "b"  # (cmsgpack writes Lua strings as str)
    assert on(keys.replies, commands, "HGET") == []
    assert coord.describe_group("g").state == "Stable"
    # Its wake-up trims the stream a node at a time (an exact cap costs three times as much).
    assert [c[:5] for c in on(keys.wake, commands)] == [
        [b"XADD", keys.wake.encode(), b"MAXLEN", b"~", b"16"]]


def formed(coord: GroupCoordinator, n: int) -> tuple[list[str], str, int]:
    """A Stable group "g" of ``n`` members formed through the public API: (member ids, the
    leader's, the generation)."""
    with cf.ThreadPoolExecutor(n) as pool:
        joins = list(pool.map(lambda _: coord.join_group("g", **JOIN), range(n)))
        leader, gen = joins[0].leader_id, joins[0].generation_id
        ids = [j.member_id for j in joins]
        syncs = list(pool.map(lambda mid: coord.sync_group(
            "g", gen, mid, assignments={m: b"x" for m in ids} if mid == leader else None), ids))
    assert {s.error.name for s in syncs} == {"NONE"}
    return ids, leader, gen


def test_a_known_members_rejoin_reads_its_record_once_and_the_leaders_sync_writes_it_once(
        client: redis.Redis, namespace: str, record: Any) -> None:
    """The calls each member of a group makes in every rebalance: a member's JoinGroup while
    the group prepares a rebalance asks about its id once (its record: a member is never also a
    pending one), and the leader's SyncGroup, which brings the assignment, writes its own
    record and reply once (its parking would write both first) and reads the chunk size with
    the settings."""
    coord = coordinator(client, namespace, delay_ms=300)
    keys = coord._keys("g")
    lib = coord._scripts.library
    ids, leader, gen = formed(coord, 3)
    followers = [m for m in ids if m != leader]

    def send(op: Script) -> Any:
        return client.fcall(f"{lib}_{op.name}", len(op.keys), *op.keys, *op.args)

    assert send(first_call(coord._steps.join_group("g", leader, **JOIN)))[0] == b"W"
    assert client.hget(keys.group, "state") == b"PreparingRebalance"
    reply, commands = record(coord, first_call(coord._steps.join_group("g", followers[0], **JOIN)))
    assert reply[0] == b"W" and reply[4] == followers[0].encode()
    assert on(keys.members, commands, "HGET", "HEXISTS") == [
        [b"HGET", keys.members.encode(), followers[0].encode()]]
    assert on(keys.pending, commands) == []
    # The parked joins are counted once: whether the group has room, then (the count kept by
    # the join's own write) whether every member has joined.
    assert on(keys.joining, commands, "HLEN") == [[b"HLEN", keys.joining.encode()]]
    # With room in the group, whether the member is parked already does not matter: not asked.
    assert on(keys.joining, commands, "HEXISTS") == []

    # The last member's join completes the phase; the leader's SyncGroup then propagates.
    last, commands = record(coord, first_call(coord._steps.join_group("g", followers[1], **JOIN)))
    assert last[0] == b"R" and msgpack.unpackb(last[1])["gen"] == gen + 1
    # Every parked member's reply, the leader's (with the member list) too, is written in one
    # HSET, and all of them are unparked in one HDEL.
    [replies] = on(keys.replies, commands, "HSET")
    assert sorted(replies[2::2]) == sorted(f"j:{m}".encode() for m in ids)
    [unparked] = on(keys.joining, commands, "HDEL")
    assert sorted(unparked[2:]) == sorted(m.encode() for m in ids)
    assert len(msgpack.unpackb(client.hget(keys.replies, f"j:{leader}"))["mem"]) == 3
    assert client.hget(keys.group, "state") == b"CompletingRebalance"
    sync = first_call(coord._steps.sync_group(
        "g", gen + 1, leader, assignments={m: m.encode() for m in ids}))
    reply, commands = record(coord, sync)
    assert reply[0] == b"R"
    assert msgpack.unpackb(reply[1])["asg"] == leader  # (cmsgpack writes Lua strings as str)
    assert client.hget(keys.group, "state") == b"Stable"
    writes = on(keys.members, commands, "HSET")
    assert len(writes) == 1 and leader.encode() in writes[0][2::2]  # every record, once
    assert on(keys.replies, commands, "HDEL") == []
    assert len(on(keys.partition.cfg, commands)) == 1
    # The leader is answered as a parked member would be: its session counts from now.
    assert client.zscore(keys.deadlines, f"hb:{leader}") is not None
    member = coord.describe_group("g")
    assert {m.member_id: m.assignment for m in member.members} == {m: m.encode() for m in ids}


def test_a_rejoin_that_changes_the_session_timeout_rewrites_the_record(
        client: redis.Redis, namespace: str, record: Any) -> None:
    """Only a rejoin that changes nothing in the record leaves it unwritten: another session
    timeout (same metadata, same rebalance timeout) is stored."""
    coord = coordinator(client, namespace, delay_ms=0)
    keys = coord._keys("g")
    joined = coord.join_group("g", **JOIN)
    mid = joined.member_id
    coord.sync_group("g", joined.generation_id, mid, assignments={mid: b"a"})
    before = msgpack.unpackb(client.hget(keys.members, mid), raw=True)
    reply, commands = record(coord, first_call(coord._steps.join_group(
        "g", mid, **{**JOIN, "session_timeout_ms": 20_000})))
    assert reply[0] == b"R"
    assert len(on(keys.members, commands, "HSET")) == 1
    after = msgpack.unpackb(client.hget(keys.members, mid), raw=True)
    assert (before[b"st"], after[b"st"]) == (30_000, 20_000)
    assert {k: v for k, v in after.items() if k != b"st"} == {
        k: v for k, v in before.items() if k != b"st"}


def test_the_sweep_at_a_group_whose_published_deadline_lies_ahead_reads_no_deadline(
        client: redis.Redis, namespace: str, record: Any) -> None:
    """The timer sweep reaches a group from the partition's due index; when the group's 'ea'
    lies ahead, a step published it since the sweep read the index (both are written together),
    so nothing is due and the index already holds it: the call reads the clock, the settings
    and the group, and neither the deadlines nor the index. A group that is gone still has its
    stale index entry removed (the sweep repairs the index)."""
    coord = coordinator(client, namespace, delay_ms=0)
    keys = coord._keys("g")
    joined = coord.join_group("g", **JOIN)
    coord.sync_group("g", joined.generation_id, joined.member_id,
                     assignments={joined.member_id: b"a"})
    published = client.zscore(keys.partition.due, "g")
    assert published is not None and client.hget(keys.group, "ea") == b"%d" % published

    reply, commands = record(coord, first_call(coord._steps.call("expire_deadlines", keys, [])))
    assert reply == [0]
    assert on(keys.deadlines, commands) == []
    assert on(keys.partition.due, commands) == []
    assert [c[0].upper() for c in commands] == [b"TIME", b"HMGET", b"HMGET"]
    # Of the settings, the copy's existence and the capacity check's limit: the chunk size only
    # when the sweep continues a chunk.
    assert on(keys.partition.cfg, commands) == [
        [b"HMGET", keys.partition.cfg.encode(), b"num_partitions", b"group_max_size"]]
    assert client.zscore(keys.partition.due, "g") == published

    gone = coord._keys("gone")
    client.zadd(gone.partition.due, {"gone": 1})
    reply, commands = record(coord, first_call(coord._steps.call("expire_deadlines", gone, [])))
    assert reply == [0]
    assert client.zscore(gone.partition.due, "gone") is None
