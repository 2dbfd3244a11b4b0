"""Bounded and exact inputs (issue 8 item 3): every per-call list and payload has a limit that
is named in the error; int64 values are stored exactly; generated member ids are accepted back;
bad text is InvalidRequestError wherever an id enters; the empty group id is accepted exactly
where Kafka accepts it.

Each test of a reported defect failed before its fix (checked by running this file against
the code before it). ``test_topics_answer_a_bad_topic_name_with_kafkas_error`` pins behaviour
that was already right.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis.asyncio
import redis.asyncio.cluster
from harness import PROTOCOLS, Ctx

from rcoord import (
    ConfigError,
    CoordinatorConfig,
    Errors,
    InvalidRequestError,
    MemberIdentity,
    OffsetAndMetadata,
    TopicPartition,
)
from rcoord.asyncio import AsyncGroupCoordinator
from rcoord.client import ConsumerGroupConfig
from rcoord.protocol._checks import (
    MAX_ID_BYTES,
    MAX_ITEMS_PER_CALL,
    MAX_MEMBER_METADATA_BYTES,
    MAX_METADATA_BYTES,
    MAX_PROTOCOLS,
    MAX_REQUEST_BYTES,
)

T0 = TopicPartition("t", 0)
MIB = 1 << 20
SURROGATE = "a\ud800b"


def _tps(n: int, topic: str = "t") -> list[TopicPartition]:
    return [TopicPartition(topic, p) for p in range(n)]


def _limit_error(limit: int) -> Any:
    """pytest.raises for an InvalidRequestError whose message names ``limit``."""
    return pytest.raises(InvalidRequestError, match=str(limit))


# -- 1. bounded lists -------------------------------------------------------------------------


def test_commit_of_more_partitions_than_the_limit_is_refused_whole(ctx):
    # One commit of 1,000,000 partitions held the server for 4 s. Now the limit is checked
    # before any partition is looked at, and nothing is written.
    huge = dict.fromkeys(_tps(1_000_000), 1)
    with _limit_error(MAX_ITEMS_PER_CALL):
        ctx.coord.commit_offsets(ctx.group_id, huge)
    with _limit_error(MAX_ITEMS_PER_CALL):
        ctx.coord.commit_offsets(ctx.group_id, dict.fromkeys(_tps(MAX_ITEMS_PER_CALL + 1), 1))
    assert ctx.coord.fetch_offsets(ctx.group_id).offsets == {}
    assert ctx.state() == "Dead"  # not even the offsets-only group was created
    # At the limit, the commit goes through, atomically.
    at_limit = {tp: tp.partition for tp in _tps(MAX_ITEMS_PER_CALL)}
    assert set(ctx.coord.commit_offsets(ctx.group_id, at_limit).values()) == {Errors.NONE}
    fetched = ctx.coord.fetch_offsets(ctx.group_id).offsets
    assert {tp: o.offset for tp, o in fetched.items()} == at_limit


def test_commit_bytes_are_bounded(ctx):
    # Metadata of the largest size the namespace stores (offset_metadata_max_bytes): longer
    # metadata is refused per partition and not sent.
    meta = "m" * 4096
    too_big = {tp: OffsetAndMetadata(1, meta) for tp in _tps(MAX_REQUEST_BYTES // 4096)}
    with _limit_error(MAX_REQUEST_BYTES):
        ctx.coord.commit_offsets(ctx.group_id, too_big)
    assert ctx.coord.fetch_offsets(ctx.group_id).offsets == {}


def test_long_fetch_is_split_and_complete(ctx):
    # OffsetFetch only reads: Kafka accepts any number of partitions, so rcoord splits the
    # list into script calls of MAX_ITEMS_PER_CALL and answers for every partition.
    wanted = _tps(MAX_ITEMS_PER_CALL + 2)
    last, first = wanted[-1], wanted[0]
    assert ctx.coord.commit_offsets(ctx.group_id, {first: 5, last: 7}) == {
        first: Errors.NONE, last: Errors.NONE}
    res = ctx.coord.fetch_offsets(ctx.group_id, wanted)
    assert res.error == Errors.NONE
    assert len(res.offsets) == len(wanted)
    assert res.offsets[first].offset == 5 and res.offsets[last].offset == 7
    assert {o.offset for tp, o in res.offsets.items() if tp not in (first, last)} == {-1}


def test_offset_delete_list_is_bounded(ctx):
    ctx.coord.commit_offsets(ctx.group_id, {T0: 1})
    with _limit_error(MAX_ITEMS_PER_CALL):
        ctx.coord.delete_offsets(ctx.group_id, _tps(MAX_ITEMS_PER_CALL + 1))
    assert ctx.coord.fetch_offsets(ctx.group_id, [T0]).offsets[T0].offset == 1
    res = ctx.coord.delete_offsets(ctx.group_id, _tps(MAX_ITEMS_PER_CALL))
    assert res.error == Errors.NONE and res.partitions[T0] == Errors.NONE


def test_sync_assignments_are_bounded_in_count_and_bytes(ctx):
    mid = ctx.new_member_id()
    gen = ctx.join(mid).generation_id
    many = {f"m{i}": b"" for i in range(MAX_ITEMS_PER_CALL + 1)}
    with _limit_error(MAX_ITEMS_PER_CALL):
        ctx.coord.sync_group(ctx.group_id, gen, mid, assignments=many)
    big = {f"m{i}": b"x" * MAX_METADATA_BYTES for i in range(MAX_REQUEST_BYTES // MIB)}
    big[mid] = b"mine"
    with _limit_error(MAX_REQUEST_BYTES):
        ctx.coord.sync_group(ctx.group_id, gen, mid, assignments=big)
    assert ctx.state() == "CompletingRebalance"  # nothing was stored
    assert ctx.sync(mid, gen, {mid: b"mine"}).assignment == b"mine"


def test_join_protocols_are_bounded_in_total_not_only_each(ctx):
    # 64 protocols of 1 MiB each used to be accepted: 64 MiB stored for one member.
    each_max = [(f"p{i}", b"x" * MAX_METADATA_BYTES) for i in range(MAX_PROTOCOLS)]
    with _limit_error(MAX_MEMBER_METADATA_BYTES):
        ctx.join(protocols=each_max)
    two_halves = [("a", b"x" * (MIB // 2)), ("b", b"x" * (MIB // 2))]
    with _limit_error(MAX_MEMBER_METADATA_BYTES):
        ctx.join(protocols=two_halves)
    with _limit_error(MAX_PROTOCOLS):
        ctx.join(protocols=[(f"p{i}", b"") for i in range(MAX_PROTOCOLS + 1)])
    assert ctx.state() == "Dead"
    # Exactly at the limit (name plus metadata) is accepted.
    exact = [("r", b"x" * (MAX_MEMBER_METADATA_BYTES - 1))]
    assert ctx.join(protocols=exact).error == Errors.MEMBER_ID_REQUIRED


def test_names_in_requests_are_bounded(ctx):
    long_name = "n" * (MAX_ID_BYTES + 1)
    with _limit_error(MAX_ID_BYTES):
        ctx.join(protocols=[(long_name, b"")])
    with _limit_error(MAX_ID_BYTES):
        ctx.join(protocol_type=long_name)
    with _limit_error(MAX_ID_BYTES):
        ctx.coord.commit_offsets(ctx.group_id, {TopicPartition(long_name, 0): 1})
    with _limit_error(MAX_ID_BYTES):
        ctx.coord.sync_group(ctx.group_id, 1, "m", protocol_name=long_name)


def test_list_and_leave_filters_are_bounded(ctx):
    with _limit_error(MAX_ITEMS_PER_CALL):
        ctx.coord.list_groups(["empty"] * (MAX_ITEMS_PER_CALL + 1))
    with _limit_error(MAX_ITEMS_PER_CALL):
        ctx.coord.leave_group(ctx.group_id, [MemberIdentity("m")] * (MAX_ITEMS_PER_CALL + 1))
    with pytest.raises(TypeError):
        ctx.coord.list_groups("empty")  # one str is not a list of states


# -- 3. int64 and int32 fields ------------------------------------------------------------------

INT64_EDGES = [2**53 + 1, 2**63 - 1, -(2**63), 2**53, 2**62 + 3]


def test_offsets_and_epochs_round_trip_exactly(ctx):
    # 2**53 + 1 came back as 2**53, and 2**63 - 1 as 2**63 (outside int64).
    offsets = {TopicPartition("t", i): OffsetAndMetadata(o, "", 2**31 - 1)
               for i, o in enumerate(INT64_EDGES)}
    assert set(ctx.coord.commit_offsets(ctx.group_id, offsets).values()) == {Errors.NONE}
    fetched = ctx.coord.fetch_offsets(ctx.group_id).offsets
    assert {tp: (o.offset, o.leader_epoch) for tp, o in fetched.items()} == {
        tp: (o.offset, o.leader_epoch) for tp, o in offsets.items()}


@pytest.mark.parametrize("offset", [2**63, 2**64, -(2**63) - 1])
def test_offsets_outside_int64_are_refused(ctx, offset):
    # 2**64 raised a raw OverflowError from the msgpack encoder.
    with pytest.raises(InvalidRequestError, match="int64"):
        ctx.coord.commit_offsets(ctx.group_id, {T0: 1, TopicPartition("t", 1): offset})
    assert ctx.coord.fetch_offsets(ctx.group_id).offsets == {}


def test_int32_fields_are_range_checked(ctx):
    with pytest.raises(InvalidRequestError, match="int32"):
        ctx.coord.commit_offsets(ctx.group_id, {T0: OffsetAndMetadata(1, "", 2**31)})
    with pytest.raises(InvalidRequestError, match="int32"):
        ctx.coord.commit_offsets(ctx.group_id, {TopicPartition("t", 2**31): 1})
    with pytest.raises(InvalidRequestError, match="int32"):
        ctx.coord.commit_offsets(ctx.group_id, {T0: 1}, member_id="m", generation_id=2**64)
    with pytest.raises(InvalidRequestError, match="int32"):
        ctx.coord.heartbeat(ctx.group_id, 2**53 + 1, "m")
    with pytest.raises(InvalidRequestError, match="int32"):
        ctx.coord.sync_group(ctx.group_id, -(2**31) - 1, "m")
    with pytest.raises(InvalidRequestError, match="int32"):
        ctx.join(session_timeout_ms=2**31)
    assert ctx.state() == "Dead"


def test_retention_ms_is_int64_and_a_huge_one_never_expires(ctx):
    with pytest.raises(InvalidRequestError, match="int64"):
        ctx.coord.commit_offsets(ctx.group_id, {T0: 1}, retention_ms=2**63)
    assert ctx.coord.commit_offsets(ctx.group_id, {T0: 1}, retention_ms=2**63 - 1) == {
        T0: Errors.NONE}
    ctx.sleep(100 * 365 * 24 * 3600 * 1000)  # a century
    assert ctx.coord.fetch_offsets(ctx.group_id, [T0]).offsets[T0].offset == 1


@pytest.mark.parametrize(("name", "top"), [
    ("offsets_retention_ms", (2**31 - 1) * 60_000),  # Kafka's minutes are a Java int
    ("offsets_retention_check_interval_ms", 2**52),
    ("group_max_session_timeout_ms", 2**31 - 1),
    ("new_member_join_timeout_ms", 2**31 - 1),
])
def test_settings_are_bounded_and_the_largest_work(make_coordinator, name, top):
    """A commit under offsets_retention_ms = 2**63 - 1 failed with a raw server error (the
    retention deadline, past the server's expire range); now each setting has a bound, named
    in the error, and a group works at it."""
    with pytest.raises(ConfigError, match=f"{name} must be <= {top}"):
        CoordinatorConfig(**{name: top + 1})
    coord = make_coordinator(**{name: top})
    assert coord.commit_offsets("simple", {T0: 7}) == {T0: Errors.NONE}
    assert coord.fetch_offsets("simple", [T0]).offsets[T0].offset == 7
    # A member joins and leaves: the group is Empty, its retention check far ahead.
    joined = coord.join_group("g", "", protocol_type="consumer", protocols=PROTOCOLS,
                              session_timeout_ms=10_000, require_known_member_id=False)
    assert joined.error is Errors.NONE
    assert coord.leave_group("g", [MemberIdentity(joined.member_id)]).error is Errors.NONE
    assert coord.describe_group("g").state == "Empty"


# -- 4. generated member ids ----------------------------------------------------------------------


@pytest.mark.parametrize("client_id", [
    "c" * 987,            # the longest client id kept whole
    "c" * 988,            # used to give a 1,025-byte member id
    "c" * MAX_ID_BYTES,
    "é" * (MAX_ID_BYTES // 2),   # two-byte characters: the cut must not split one
    "€" * (MAX_ID_BYTES // 3),   # three-byte characters
])
def test_generated_member_id_is_accepted_back(ctx, client_id):
    res = ctx.join(client_id=client_id)
    assert res.error == Errors.MEMBER_ID_REQUIRED
    raw = res.member_id.encode("utf-8")  # strict: a split character would fail here
    assert len(raw) <= MAX_ID_BYTES
    prefix = res.member_id[: -37]
    assert client_id.startswith(prefix) and len(raw) > MAX_ID_BYTES - 3
    joined = ctx.join(res.member_id, client_id=client_id)
    assert joined.error == Errors.NONE and joined.member_id == res.member_id
    assert ctx.coord.describe_group(ctx.group_id).members[0].client_id == client_id


def test_short_client_id_is_kept_whole(ctx):
    res = ctx.join(client_id="worker-1")
    assert res.member_id.startswith("worker-1-") and len(res.member_id) == len("worker-1-") + 36


# -- 5. text that is not valid Unicode --------------------------------------------------------------


def _surrogate_calls(ctx: Ctx) -> list[tuple[str, Any]]:
    c, g = ctx.coord, ctx.group_id
    join = dict(protocol_type="consumer", protocols=PROTOCOLS, session_timeout_ms=5000)
    return [
        ("group id: join", lambda: c.join_group(SURROGATE, **join)),
        ("group id: sync", lambda: c.sync_group(SURROGATE, 1, "m")),
        ("group id: heartbeat", lambda: c.heartbeat(SURROGATE, 1, "m")),
        ("group id: heartbeat_many", lambda: c.heartbeat_many([(SURROGATE, 1, "m")])),
        ("group id: leave", lambda: c.leave_group(SURROGATE, [MemberIdentity("m")])),
        ("group id: commit", lambda: c.commit_offsets(SURROGATE, {T0: 1})),
        ("group id: fetch", lambda: c.fetch_offsets(SURROGATE)),
        ("group id: describe", lambda: c.describe_group(SURROGATE)),
        ("group id: delete", lambda: c.delete_groups([SURROGATE])),
        ("group id: delete offsets", lambda: c.delete_offsets(SURROGATE, [T0])),
        ("member id: join", lambda: c.join_group(g, SURROGATE, **join)),
        ("member id: sync", lambda: c.sync_group(g, 1, SURROGATE)),
        ("member id: heartbeat", lambda: c.heartbeat(g, 1, SURROGATE)),
        ("member id: leave", lambda: c.leave_group(g, [MemberIdentity(SURROGATE)])),
        ("member id: commit", lambda: c.commit_offsets(g, {T0: 1}, member_id=SURROGATE)),
        ("member id: assignment", lambda: c.sync_group(g, 1, "m", assignments={SURROGATE: b""})),
        ("client id", lambda: c.join_group(g, client_id=SURROGATE, **join)),
        ("client host", lambda: c.join_group(g, client_host=SURROGATE, **join)),
        ("instance id", lambda: c.join_group(g, group_instance_id=SURROGATE, **join)),
        ("instance id: leave", lambda: c.leave_group(g, [MemberIdentity("", SURROGATE)])),
        ("protocol name", lambda: c.join_group(g, **{**join, "protocols": [(SURROGATE, b"")]})),
        ("protocol type", lambda: c.join_group(g, **{**join, "protocol_type": SURROGATE})),
        ("reason", lambda: c.join_group(g, reason=SURROGATE, **join)),
        ("topic: commit", lambda: c.commit_offsets(g, {TopicPartition(SURROGATE, 0): 1})),
        ("topic: fetch", lambda: c.fetch_offsets(g, [TopicPartition(SURROGATE, 0)])),
        ("metadata", lambda: c.commit_offsets(g, {T0: OffsetAndMetadata(1, SURROGATE)})),
        ("state filter", lambda: c.list_groups([SURROGATE])),
    ]


def test_lone_surrogates_are_invalid_requests(ctx):
    # Each of these raised a raw UnicodeEncodeError from the Redis client.
    for what, call in _surrogate_calls(ctx):
        with pytest.raises(InvalidRequestError):
            call()
            pytest.fail(f"{what}: accepted")
    assert ctx.coord.list_groups() == []  # nothing was created


def _async_client(request: pytest.FixtureRequest, backend: str) -> Any:
    if backend == "single":
        server = request.getfixturevalue("redis_server")
        return redis.asyncio.Redis(host="127.0.0.1", port=server.port)
    cluster = request.getfixturevalue("redis_cluster")
    return redis.asyncio.cluster.RedisCluster(host="127.0.0.1", port=cluster.ports[0])


def test_asyncio_coordinator_shares_the_checks(request, backend, ctx):
    async def scenario() -> None:
        client = _async_client(request, backend)
        coord = AsyncGroupCoordinator(client, ctx.coord.config.namespace)
        try:
            with pytest.raises(InvalidRequestError):
                await coord.join_group(SURROGATE, protocol_type="consumer", protocols=PROTOCOLS,
                                       session_timeout_ms=5000)
            with pytest.raises(InvalidRequestError):
                await coord.commit_offsets("g", {T0: 1}, member_id=SURROGATE)
            with _limit_error(MAX_ITEMS_PER_CALL):
                await coord.commit_offsets("g", dict.fromkeys(_tps(MAX_ITEMS_PER_CALL + 1), 1))
            big = 2**63 - 1
            assert await coord.commit_offsets("", {T0: big}) == {T0: Errors.NONE}
            assert (await coord.fetch_offsets("", [T0])).offsets[T0].offset == big
            many = await coord.fetch_offsets("", _tps(MAX_ITEMS_PER_CALL + 1))
            assert len(many.offsets) == MAX_ITEMS_PER_CALL + 1 and many.offsets[T0].offset == big
        finally:
            await client.aclose()

    asyncio.run(scenario())


def test_topics_answer_a_bad_topic_name_with_kafkas_error(redis_client, namespace):
    from rcoord.topics import Producer, TopicError, Topics

    topics = Topics(redis_client, namespace)
    for call in (lambda: topics.create(SURROGATE, 1), lambda: topics.describe(SURROGATE),
                 lambda: Producer(redis_client, namespace).send(SURROGATE, b"v")):
        with pytest.raises(TopicError) as info:
            call()
        assert info.value.error == Errors.INVALID_TOPIC_EXCEPTION


@pytest.mark.parametrize("field", ["group_id", "client_id", "topics"])
def test_client_config_refuses_ids_the_coordinator_would(field):
    # Before, these were accepted here and failed later, inside the group's background loop.
    for bad in (SURROGATE, "x" * (MAX_ID_BYTES + 1)):
        kw: dict[str, Any] = dict(group_id="g", topics=["t"], redis_url="redis://127.0.0.1:1")
        kw[field] = [bad] if field == "topics" else bad
        with pytest.raises(ConfigError, match="Unicode|1024"):
            ConsumerGroupConfig(**kw)


# -- 6. the empty group id --------------------------------------------------------------------------


def test_empty_group_id_is_a_group_for_commit_fetch_describe_and_delete(ctx):
    # Kafka's GroupCoordinatorService: OffsetCommit, OffsetFetch, DescribeGroups and
    # DeleteGroups accept "" "for backwards compatibility"; only a null id is INVALID_GROUP_ID.
    c = ctx.coord
    assert c.describe_group("").error == Errors.NONE and c.describe_group("").state == "Dead"
    assert c.delete_groups([""]) == {"": Errors.GROUP_ID_NOT_FOUND}
    assert c.commit_offsets("", {T0: 4}) == {T0: Errors.NONE}
    fetched = c.fetch_offsets("")
    assert fetched.error == Errors.NONE and fetched.offsets == {T0: OffsetAndMetadata(4)}
    assert c.describe_group("").state == "Empty"
    assert [g.group_id for g in c.list_groups()] == [""]
    assert c.delete_groups([""]) == {"": Errors.NONE}
    assert c.fetch_offsets("", [T0]).offsets[T0].offset == -1


def test_empty_group_id_is_invalid_for_membership_and_offset_delete(ctx):
    # JoinGroup, SyncGroup, Heartbeat, LeaveGroup and OffsetDelete use isGroupIdNotEmpty.
    c = ctx.coord
    assert ctx.join(group_id="").error == Errors.INVALID_GROUP_ID
    assert c.sync_group("", 1, "m").error == Errors.INVALID_GROUP_ID
    assert c.heartbeat("", 1, "m") == Errors.INVALID_GROUP_ID
    assert c.leave_group("", [MemberIdentity("m")]).error == Errors.INVALID_GROUP_ID
    assert c.delete_offsets("", [T0]).error == Errors.INVALID_GROUP_ID
