"""ConsumerGroup and Generation: the worker-side lifecycle and the error policy table.

Two layers: a function-field fake ``Coordinator`` (kafka-go's mockCoordinator) drives the error
paths and the lifecycle rules deterministically; then the same client runs against a real server,
one node and a 3-master cluster. Every wait is on a condition, bounded by ``wait_until``.
"""

from __future__ import annotations

import ast
import concurrent.futures
import dataclasses
import inspect
import pickle
import re
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
from harness import wait_until

from rcoord import (
    ConnectionLost,
    CoordinatorConfig,
    Errors,
    GroupCoordinator,
    JoinGroupMember,
    JoinGroupResult,
    LeaveGroupResult,
    OffsetAndMetadata,
    OffsetFetchResult,
    ProtocolError,
    SyncGroupResult,
    TopicPartition,
)
from rcoord.client import (
    ERROR_POLICY,
    OTHERWISE,
    CommitFailedError,
    ConsumerGroup,
    ConsumerGroupConfig,
    EndReason,
    GenerationEndedError,
    GroupClosedError,
    JoinRefusedError,
    PartitionAssignment,
    Reaction,
    reaction_for,
)
from rcoord.client import policy as policy_module
from rcoord.client.coordinator import RedisCoordinator
from rcoord.errors import (
    AuthenticationFailedError,
    ConfigError,
    FencedInstanceIdError,
    MissingPermissionError,
    RebalanceInProgressError,
)
from rcoord.protocol.consumer import (
    PROTOCOL_TYPE,
    ConsumerProtocolAssignment,
    ConsumerProtocolSubscription,
    MalformedMetadataError,
    metadata_encoding,
)
from rcoord.protocol.join import new_member_id
from rcoord.topics import FetchResult, PartitionRecords, Producer, ProducerRecord, Record, Topics

TP = TopicPartition
WAIT_S = 15.0

# -- the fake coordinator ---------------------------------------------------------------------

METHODS = (
    "join_group",
    "sync_group",
    "heartbeat",
    "leave_group",
    "commit_offsets",
    "fetch_offsets",
    "partition_counts",
    "log_offsets",
    "log_offsets_many",
    "created_times",
    "fetch",
    "fetch_many_as",
)


def _unset(name: str) -> Callable[..., Any]:
    def fail(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"unexpected call to {name}")

    return fail


class FakeCoordinator:
    """kafka-go's mockCoordinator: each method is a function field; an unset one fails loudly."""

    def __init__(self, **fns: Callable[..., Any]) -> None:
        unknown = set(fns) - set(METHODS)
        assert not unknown, unknown
        for name in METHODS:
            setattr(self, name, fns.get(name) or _unset(name))


class OneMemberGroup:
    """An in-memory group for one member (plus optional extra members), built on the fake.

    ``events`` is a shared, ordered log of coordinator calls; tests append their own events
    (listener calls) to it, so orders across the two can be checked.
    """

    def __init__(self, topic: str = "t", partitions: int = 4, records: int = 0) -> None:
        self.topic = topic
        self.events: list[tuple[Any, ...]] = []
        self.lock = threading.Lock()
        self.generation = 0
        self.new_ids: list[str] = []  # the ids new members named themselves with, in order
        self.leader: str | None = None  # None: the joining member leads
        self.extra_members: list[JoinGroupMember] = []
        self.join_answers: deque[Errors | BaseException | None] = deque()  # None: as usual
        self.sync_answers: deque[Errors] = deque()
        self.heartbeat_answers: deque[Errors | BaseException] = deque()
        self.heartbeat_default: Errors | BaseException = Errors.NONE
        self.heartbeats = 0
        # Cleared: a heartbeat hangs until it is set (or WAIT_S), as a call to a Redis that
        # black-holes its packets waits for the client's socket timeout.
        self.heartbeats_flow = threading.Event()
        self.heartbeats_flow.set()
        self.leaves_flow = threading.Event()
        self.leaves_flow.set()
        self.hanging = 0
        self.commit_answers: deque[Errors] = deque()
        self.committed: dict[TP, int] = {}
        self.counts = {topic: partitions}
        self.logs: dict[TP, list[Record]] = {
            TP(topic, p): [Record(o, None, b"%d-%d" % (p, o), {}, 0) for o in range(records)]
            for p in range(partitions)
        }
        self.park_join = threading.Event()  # set: a join with a member id parks until leave
        self.left = threading.Event()
        self.leaves: list[str] = []
        self.joins: list[str] = []
        self.fake = FakeCoordinator(
            join_group=self.join_group,
            sync_group=self.sync_group,
            heartbeat=self.heartbeat,
            leave_group=self.leave_group,
            commit_offsets=self.commit_offsets,
            fetch_offsets=self.fetch_offsets,
            partition_counts=self.partition_counts,
            log_offsets=self.log_offsets,
            log_offsets_many=lambda tps: [self.log_offsets(*tp) for tp in tps],
            created_times=lambda topics: {},  # (its commits carry no time: none is judged)
            fetch=self.fetch,
            fetch_many_as=self.fetch_many_as,
        )

    def id(self, n: int) -> str:
        """The id of the n-th new member (1-based) that joined."""
        return self.new_ids[n - 1]

    def log(self, *event: Any) -> None:
        with self.lock:
            self.events.append(event)

    def kinds(self) -> list[str]:
        with self.lock:
            return [e[0] for e in self.events]

    # -- the protocol

    def join_group(self, group_id: str, member_id: str = "", **kw: Any) -> JoinGroupResult:
        self.log("join", member_id)
        self.joins.append(member_id)
        if not member_id:  # as the coordinator: the new member's id comes with the request
            assert kw["require_known_member_id"] is False, "the worker skips KIP-394's round"
            member_id = new_member_id(
                kw["client_id"], kw.get("group_instance_id") or "", kw["new_member_uuid"])
            if member_id not in self.new_ids:
                self.new_ids.append(member_id)
        answer = self.join_answers.popleft() if self.join_answers else None
        if isinstance(answer, BaseException):
            raise answer
        if answer is not None:
            return JoinGroupResult.failed(answer, member_id)
        if self.park_join.is_set():
            assert self.left.wait(WAIT_S), "a parked join was never released"
            return JoinGroupResult.failed(Errors.UNKNOWN_MEMBER_ID, member_id)
        self.generation += 1
        name, metadata = kw["protocols"][0]
        leader = self.leader or member_id
        return JoinGroupResult(
            Errors.NONE,
            self.generation,
            "consumer",
            name,
            leader,
            member_id,
            [JoinGroupMember(member_id, None, metadata), *self.extra_members]
            if leader == member_id
            else [],
        )

    def sync_group(
        self, group_id: str, generation_id: int, member_id: str, **kw: Any
    ) -> SyncGroupResult:
        self.log("sync", generation_id)
        if self.sync_answers:
            return SyncGroupResult(self.sync_answers.popleft())
        plan = kw.get("assignments")
        if plan is None:  # a follower: everything goes to it
            blob = ConsumerProtocolAssignment(
                [TP(self.topic, p) for p in range(self.counts[self.topic])]
            ).encode()
        else:
            blob = plan[member_id]
        return SyncGroupResult(Errors.NONE, "consumer", kw.get("protocol_name"), blob)

    def heartbeat(
        self, group_id: str, generation_id: int, member_id: str, iid: Any = None
    ) -> Errors:
        if not self.heartbeats_flow.is_set():
            with self.lock:
                self.hanging += 1
            self.heartbeats_flow.wait(WAIT_S)
            with self.lock:
                self.hanging -= 1
        with self.lock:
            self.heartbeats += 1
            answer = (
                self.heartbeat_answers.popleft()
                if self.heartbeat_answers
                else self.heartbeat_default
            )
        if isinstance(answer, BaseException):
            raise answer
        if answer is not Errors.NONE:
            self.log("heartbeat", answer)
        return answer

    def leave_group(self, group_id: str, members: Any) -> LeaveGroupResult:
        if not self.leaves_flow.is_set():  # (hangs as heartbeats do: heartbeats_flow)
            with self.lock:
                self.hanging += 1
            self.leaves_flow.wait(WAIT_S)
            with self.lock:
                self.hanging -= 1
        self.log("leave", members[0].member_id)
        self.leaves.append(members[0].member_id)
        self.left.set()
        return LeaveGroupResult(Errors.NONE)

    def commit_offsets(
        self, group_id: str, offsets: Any, *, member_id: str, generation_id: int, **kw: Any
    ) -> dict[TP, Errors]:
        plain = {
            tp: (o.offset if isinstance(o, OffsetAndMetadata) else o) for tp, o in offsets.items()
        }
        self.log("commit", generation_id, plain)
        if self.commit_answers:
            answer = self.commit_answers.popleft()
            return {tp: answer for tp in offsets}
        self.committed.update(plain)
        return {tp: Errors.NONE for tp in offsets}

    def fetch_offsets(self, group_id: str, partitions: Any = None) -> OffsetFetchResult:
        return OffsetFetchResult(
            Errors.NONE, {tp: OffsetAndMetadata(self.committed.get(tp, -1)) for tp in partitions}
        )

    def partition_counts(self, topics: Any) -> dict[str, int]:
        with self.lock:
            return {t: self.counts[t] for t in topics if t in self.counts}

    def log_offsets(self, topic: str, partition: int) -> tuple[int, int]:
        return 0, len(self.logs.get(TP(topic, partition), []))

    def fetch(
        self, topic: str, partition: int, offset: int, max_records: int, block_ms: Any,
        **bounds: Any,
    ) -> FetchResult:
        log = self.logs.get(TP(topic, partition), [])
        records = log[offset : offset + max_records]
        if not records and block_ms:
            threading.Event().wait(min(block_ms, 20) / 1000)  # the fake's "XREAD BLOCK"
        return FetchResult(records, 0, len(log))

    def fetch_many_as(
        self, reads: Any, max_records: int, record_type: Any, **bounds: Any
    ) -> list[Any]:
        """Byte bounds (``bounds``) are not applied: the fake's records are small."""
        out = []
        for topic, partition, offset in reads:
            res = self.fetch(topic, partition, offset, max_records, None)
            records = [
                record_type(topic, partition, *dataclasses.astuple(r)) for r in res.records
            ]
            out.append(PartitionRecords(records, res.log_start_offset, res.log_end_offset))
        return out


def fast_config(**overrides: Any) -> ConsumerGroupConfig:
    settings: dict[str, Any] = {
        "group_id": "g",
        "topics": ["t"],
        "heartbeat_interval_ms": 10,
        # 60 heartbeats: long enough that a loaded machine never misses every heartbeat of a
        # session (heartbeat.watch_session then ended a generation no test meant to end; 90 ms
        # did once), short enough for the tests that wait one out.
        "session_timeout_ms": 600,
        "rebalance_timeout_ms": 5000,
        "join_backoff_ms": 20,
        "retry_backoff_ms": 1,
        "retry_backoff_max_ms": 5,
        "partition_watch_interval_ms": 10,
    }
    settings.update(overrides)
    return ConsumerGroupConfig(**settings)


def hold_joins(state: OneMemberGroup) -> tuple[threading.Event, threading.Event]:
    """The fake coordinator's JoinGroups wait: ``entered`` is set when one is sent, and it is
    answered once ``release`` is set (what a test does while a join is under way)."""
    entered, release = threading.Event(), threading.Event()
    join = state.fake.join_group

    def held_join(group_id: str, member_id: str = "", **kw: Any) -> Any:
        entered.set()
        release.wait(WAIT_S)
        return join(group_id, member_id, **kw)

    state.fake.join_group = held_join
    return entered, release


@pytest.fixture
def fake_group() -> Any:
    made: list[ConsumerGroup] = []

    def make(state: OneMemberGroup, **overrides: Any) -> ConsumerGroup:
        group = ConsumerGroup(fast_config(**overrides), coordinator=state.fake)  # type: ignore[arg-type]
        made.append(group)
        return group

    yield make
    for g in made:
        g.close(timeout=WAIT_S)


# -- configuration ----------------------------------------------------------------------------


def test_config_defaults_mirror_kafka_go() -> None:
    cfg = ConsumerGroupConfig(
        group_id="g", topics=["a", "b", "a"], redis_url="redis://127.0.0.1:1/0"
    )
    assert cfg.topics == ("a", "b")
    assert cfg.assignors == ("range", "roundrobin")
    assert (cfg.heartbeat_interval_ms, cfg.partition_watch_interval_ms, cfg.session_timeout_ms) == (
        3000,
        5000,
        30_000,
    )
    assert (cfg.rebalance_timeout_ms, cfg.join_backoff_ms, cfg.start_offset) == (
        60_000,
        5000,
        "earliest",
    )
    assert (
        cfg.watch_partition_changes and cfg.retention_ms is None and cfg.group_instance_id is None
    )
    assert [a.name for a in cfg.resolved_assignors()] == ["range", "roundrobin"]


@pytest.mark.parametrize(
    "field, value",
    [
        ("group_id", ""),
        ("topics", [""]),
        ("assignors", ["nope"]),
        ("assignors", []),
        ("heartbeat_interval_ms", 0),
        ("heartbeat_interval_ms", 10_001),  # > session_timeout_ms / 3
        ("session_timeout_ms", -5),
        ("rebalance_timeout_ms", 0),
        ("join_backoff_ms", -1),
        ("partition_watch_interval_ms", 0),
        ("retention_ms", -1),
        ("start_offset", "first"),
        ("group_instance_id", "has space"),
        ("namespace", "a{b}"),
        ("retry_backoff_max_ms", 1),
        ("redis_url", "localhost"),
    ],
)
def test_config_validate_names_the_bad_field(field: str, value: Any) -> None:
    settings: dict[str, Any] = {"group_id": "g", "topics": ["t"]}
    settings[field] = value
    with pytest.raises(ConfigError, match=field):
        ConsumerGroupConfig(**settings)


@pytest.mark.parametrize("field", ["session_timeout_ms", "rebalance_timeout_ms",
                                   "heartbeat_interval_ms", "retry_backoff_max_ms"])
def test_config_durations_are_kafkas_int(field: str) -> None:
    """Past Kafka's INT (Long.MAX, a Java user's "no limit") a duration failed later, in a
    wait threading cannot take or a join the coordinator refuses, naming no setting."""
    settings: dict[str, Any] = {"group_id": "g", "topics": ["t"], "session_timeout_ms": 2**31 - 1,
                                "retry_backoff_max_ms": 2**31 - 1}
    largest = (2**31 - 1) // 3 if field == "heartbeat_interval_ms" else 2**31 - 1
    assert getattr(ConsumerGroupConfig(**{**settings, field: largest}), field) == largest
    with pytest.raises(ConfigError, match=f"{field} must be at most 2147483647"):
        ConsumerGroupConfig(**{**settings, field: 2**63 - 1})


@pytest.mark.parametrize("topic", ["my topic", "a/b", "t:1", "x" * 250, ".", ".."])
def test_config_refuses_a_topic_name_rcoord_topics_refuse(topic: str) -> None:
    """Every subscribed topic is read through rcoord.topics, which refuses such a name. Before,
    the config took it, and the leader's partition counts failed (INVALID_TOPIC_EXCEPTION) in
    every round: the member backed off and rejoined for ever, consuming nothing."""
    with pytest.raises(ConfigError, match=r"^topics: illegal topic name .*a-z A-Z 0-9 \. _ -"):
        ConsumerGroupConfig(group_id="g", topics=["t", topic], redis_url="redis://127.0.0.1:1")
    good = ConsumerGroupConfig(group_id="g", topics=["t"], redis_url="redis://127.0.0.1:1")
    with pytest.raises(ConfigError, match="illegal topic name"):  # (Consumer.subscribe's way)
        dataclasses.replace(good, topics=[topic])
    assert ConsumerGroupConfig(group_id="g", topics=["a.B-c_9", "x" * 249],
                               redis_url="redis://127.0.0.1:1").topics == ("a.B-c_9", "x" * 249)


def test_empty_topics_are_for_a_consumer_only() -> None:
    # A Consumer subscribes or assigns later; a ConsumerGroup needs a topic to join with.
    cfg = ConsumerGroupConfig(group_id="g", topics=[], redis_url="redis://127.0.0.1:1/0")
    with pytest.raises(ConfigError, match="topics"):
        ConsumerGroup(cfg)


def test_group_needs_redis_or_a_coordinator() -> None:
    with pytest.raises(ConfigError, match="redis_url or redis_client"):
        ConsumerGroup(ConsumerGroupConfig(group_id="g", topics=["t"]))


# -- the error policy table -------------------------------------------------------------------


def _documented_policy() -> dict[str, tuple[str, ...]]:
    """The rows of the table in ERROR_POLICY's docstring, parsed from the source."""
    tree = ast.parse(Path(inspect.getsourcefile(policy_module) or "").read_text())
    body = tree.body
    doc = next(
        body[i + 1].value.value  # type: ignore[attr-defined]
        for i, node in enumerate(body)
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", None) == "ERROR_POLICY"
    )
    lines = doc.splitlines()
    borders = [i for i, line in enumerate(lines) if line.startswith("=====")]
    assert len(borders) == 3, "the table has a header and a body"
    rows: dict[str, tuple[str, ...]] = {}
    last: tuple[str, ...] = ()
    for line in lines[borders[1] + 1 : borders[2]]:
        cells = line.split()
        if len(cells) == 1:  # one more name of the row above (its cells are on that line)
            assert last, "a continued name needs a row above it"
            rows[cells[0].rstrip(",")] = last
            continue
        last = tuple(cells[-4:])
        rows[" ".join(cells[:-4]).rstrip(",")] = last
    return rows


def test_error_policy_docstring_matches_the_table() -> None:
    documented = _documented_policy()
    actual = {
        **{e.name: r for e, r in ERROR_POLICY.items()},
        "``ConnectionLost`` (exception)": reaction_for(ConnectionLost("x")),
        "a missing permission (exception)": reaction_for(MissingPermissionError("x")),
        "a refused login (exception)": reaction_for(AuthenticationFailedError("x")),
        "anything else": OTHERWISE,
    }
    assert set(documented) == set(actual)
    for name, r in actual.items():
        assert documented[name] == (
            "yes" if r.retry else "no",
            r.member_id,
            r.partitions,
            r.then,
        ), name


def test_reaction_for_maps_codes_exceptions_and_unknowns() -> None:
    assert reaction_for(Errors.UNKNOWN_MEMBER_ID) == Reaction(False, "reset", "lost", "rejoin")
    assert reaction_for(ProtocolError.of(Errors.REBALANCE_IN_PROGRESS)).partitions == "revoked"
    assert reaction_for(ConnectionLost("down")).retry
    assert reaction_for(Errors.UNKNOWN_SERVER_ERROR) is OTHERWISE
    assert reaction_for(Errors.INCONSISTENT_GROUP_PROTOCOL).fatal
    assert not reaction_for(Errors.REBALANCE_IN_PROGRESS).fatal
    assert reaction_for(ValueError("bug")) is OTHERWISE


@pytest.mark.parametrize(
    "error",
    [
        redis.exceptions.NoPermissionError(
            "User w has no permissions to run the 'fcall' command"),
        # The same refusal met inside a function: a plain error, without the NOPERM code.
        redis.exceptions.ResponseError(
            "ACL failure in script: User w has no permissions to run the 'xadd' command "
            "script: rcoord_0123456789ab_join_group, on @user_function:233."),
        MissingPermissionError("the Redis user may not run CLUSTER SLOTS"),
    ],
    ids=["noperm", "in-function", "rcoord"],
)
def test_a_missing_permission_is_fatal_and_raised_as_missing_permission_error(
    fake_group: Any, error: Exception
) -> None:
    """A permission no retry can give. Before, it was "anything else": next() raised the
    server's error once, then the member left, backed off and joined again every
    join_backoff_ms, for ever. Now the group closes after one join, and every next() raises
    MissingPermissionError with the server's message."""
    assert reaction_for(error) == Reaction(False, "leave", "lost", "fatal")
    assert reaction_for(redis.exceptions.ResponseError("WRONGTYPE not a hash")) is OTHERWISE
    state, raised = _refused_for_good(fake_group, error, MissingPermissionError)
    for info in raised:
        assert str(error).rstrip(".") in str(info.value)
    if not isinstance(error, MissingPermissionError):
        assert "docs/security.md" in str(info.value) and info.value.__cause__ is error
    assert state.leaves == [state.id(1)]


def test_a_heartbeat_refused_a_permission_closes_the_group(fake_group: Any) -> None:
    """The same refusal at a heartbeat, after the member joined: the generation ends with its
    partitions lost, and the group closes instead of joining again (before, it rejoined and
    was refused again at the next beat, every generation)."""
    state = OneMemberGroup()
    state.heartbeat_default = redis.exceptions.NoPermissionError(
        "User w has no permissions to run the 'fcall' command")
    # The first heartbeat waits until the generation is taken: it could otherwise close the
    # group first, and next() raise at once (a loaded machine running two test processes).
    state.heartbeats_flow.clear()
    group = fake_group(state)
    gen = group.next(timeout=WAIT_S)
    state.heartbeats_flow.set()
    with pytest.raises(MissingPermissionError, match="run the 'fcall' command"):
        group.next(timeout=WAIT_S)
    assert gen.done.is_set() and gen.lost and group.closed
    assert state.joins == [""]


@pytest.mark.parametrize(
    "error",
    [
        Errors.REBALANCE_IN_PROGRESS,
        Errors.ILLEGAL_GENERATION,
        Errors.UNKNOWN_MEMBER_ID,
        Errors.FENCED_INSTANCE_ID,
        Errors.COORDINATOR_NOT_AVAILABLE,
        Errors.GROUP_AUTHORIZATION_FAILED,  # fatal, as in Kafka's heartbeat handler
        Errors.UNKNOWN_SERVER_ERROR,  # "anything else"
    ],
)
def test_heartbeat_error_follows_the_policy_row(fake_group: Any, error: Errors) -> None:
    row = reaction_for(error)
    state = OneMemberGroup()
    group = fake_group(state)
    gen = group.next(timeout=WAIT_S)
    assert gen.member_id == state.id(1) and gen.generation_id == 1
    # Only once it is taken: a generation that ends before anyone takes it is withdrawn, and
    # next() raises its error instead (a heartbeat every 10 ms could win that race).
    if row.retry:
        state.heartbeat_default = error  # keeps failing for the whole session timeout
    else:
        state.heartbeat_answers.append(error)
    assert gen.done.wait(WAIT_S)
    state.heartbeat_default = Errors.NONE
    # A retriable error for a whole session timeout: no heartbeat was answered, so the
    # coordinator may have given the partitions away: lost (heartbeat.watch_session).
    assert gen.lost is (row.lost or row.retry)
    assert gen.end_reason is EndReason.of(error)
    if row.retry:
        assert state.heartbeats > 3  # it was retried for a session timeout before giving up
    if row.then == "fatal":
        with pytest.raises(ProtocolError) as info:
            group.next(timeout=WAIT_S)
        assert info.value.error is error
        if error is Errors.FENCED_INSTANCE_ID:
            assert isinstance(info.value, FencedInstanceIdError)
        with pytest.raises(ProtocolError) as info:  # and for good: the group closed itself
            group.next(timeout=WAIT_S)
        assert info.value.error is error
        if row.member_id == "leave":
            assert state.leaves == [state.id(1)]
        return
    if row.then == "backoff":
        with pytest.raises((ProtocolError, ConnectionLost)) as info:
            group.next(timeout=WAIT_S)
        if row.retry:  # the session ran out before the retries did (heartbeat.watch_session)
            assert isinstance(info.value, ConnectionLost)
            assert "no heartbeat answered for session_timeout_ms" in str(info.value)
        else:
            assert isinstance(info.value, ProtocolError) and info.value.error is error
    nxt = group.next(timeout=WAIT_S)
    assert nxt.generation_id == 2
    expect_id = state.id(2) if row.member_id in ("reset", "leave") else state.id(1)
    assert nxt.member_id == expect_id
    assert state.leaves == ([state.id(1)] if row.member_id == "leave" else [])
    # The rejoin after the error used the member id the row says.
    assert state.joins[1] == ("" if row.member_id in ("reset", "leave") else state.id(1))


def test_a_member_whose_heartbeats_hang_for_a_session_timeout_loses_its_partitions(
        fake_group: Any) -> None:
    # Redis black-holed (no reset): each heartbeat call hangs for the client's socket timeout
    # and is retried, so the generation ended about 30 s later, long after the coordinator gave
    # the partitions to another member, and poll() went on handing out what it had fetched.
    state = OneMemberGroup()
    group = fake_group(state)
    gen = group.next(timeout=WAIT_S)
    beats = state.heartbeats
    wait_until(lambda: state.heartbeats > beats)  # one answered: the session counts from it
    state.heartbeats_flow.clear()
    try:
        assert gen.done.wait(WAIT_S)
        with state.lock:
            assert state.hanging == 1  # the heartbeat is still waiting: the session's watch ended it
        assert gen.lost and gen.end_reason is EndReason.COORDINATOR_UNREACHABLE
        assert gen.session_left(fast_config().session_timeout_ms / 1000) <= 0
    finally:
        state.heartbeats_flow.set()


def test_combine_keeps_what_each_row_calls_for() -> None:
    lost_conn = reaction_for(ConnectionLost("down"))
    unknown = reaction_for(Errors.UNKNOWN_MEMBER_ID)
    both = policy_module.combine(lost_conn, unknown)
    assert (both.member_id, both.partitions, both.then) == ("reset", "lost", "backoff")
    assert policy_module.combine(unknown, lost_conn) == both
    revoked = reaction_for(Errors.REBALANCE_IN_PROGRESS)
    assert policy_module.combine(revoked, revoked) == revoked
    fenced = policy_module.combine(OTHERWISE, reaction_for(Errors.FENCED_INSTANCE_ID))
    assert (fenced.member_id, fenced.then) == ("leave", "fatal")


def test_a_fenced_commit_after_a_lost_connection_forgets_the_member_id(fake_group: Any) -> None:
    """The heartbeat gives up on an unreachable coordinator (back off, keep the id), then the
    routine's final commit is answered UNKNOWN_MEMBER_ID (forget the id): the rejoin after the
    back-off must come as a new member, not with the id the coordinator has removed."""
    state = OneMemberGroup()
    state.heartbeat_default = ConnectionLost("down")
    group = fake_group(state)
    gen = group.next(timeout=WAIT_S)
    refused: list[CommitFailedError] = []

    def routine(ctx: Any) -> None:
        ctx.wait(WAIT_S)
        state.heartbeat_default = Errors.NONE
        state.commit_answers.append(Errors.UNKNOWN_MEMBER_ID)
        try:
            ctx.generation.commit_offsets({("t", 0): 1})
        except CommitFailedError as exc:
            refused.append(exc)

    gen.start(routine)
    assert gen.done.wait(WAIT_S)
    with pytest.raises(ConnectionLost):
        group.next(timeout=WAIT_S)  # the back-off reports the first error
    nxt = group.next(timeout=WAIT_S)
    assert [exc.error for exc in refused] == [Errors.UNKNOWN_MEMBER_ID]
    assert state.joins[1] == "" and nxt.member_id == state.id(2)


def test_leave_until_resumed_loses_a_carried_generation_during_the_rejoin(
    fake_group: Any,
) -> None:
    """Cooperative: a generation's partitions are carried into the rejoin. If the member is
    made to leave while that rejoin is under way, the carried generation is the one its
    consumer still reads from: it must end lost at once, not once a later answer says so."""
    state = OneMemberGroup()
    group = fake_group(state, assignors=("cooperative-sticky",))
    gen = group.next(timeout=WAIT_S)
    gen.acknowledge()
    entered, release = threading.Event(), threading.Event()
    join = state.fake.join_group
    owned: list[tuple[TP, ...]] = []  # what each join's subscription says the member owns

    def held_join(group_id: str, member_id: str = "", **kw: Any) -> Any:
        owned.append(ConsumerProtocolSubscription.decode(kw["protocols"][0][1]).owned_partitions)
        entered.set()
        release.wait(WAIT_S)
        if member_id in state.leaves:  # as the coordinator: a member that left is unknown
            return JoinGroupResult.failed(Errors.UNKNOWN_MEMBER_ID, member_id)
        return join(group_id, member_id, **kw)

    state.fake.join_group = held_join
    state.heartbeat_answers.append(Errors.REBALANCE_IN_PROGRESS)
    try:
        assert entered.wait(WAIT_S)  # the rejoin is under way, the partitions carried
        assert gen.carried and not gen.lost
        group.leave_until_resumed("max.poll.interval.ms passed")
        assert gen.lost
        assert state.leaves == [state.id(1)]
    finally:
        release.set()
    group.resume()
    wait_until(lambda: len(owned) >= 2)  # the parked rejoin, then the new member's join
    assert owned[0] == tuple(TP("t", p) for p in range(4))  # carried into the rejoin
    assert owned[-1] == ()  # it left: it comes back owning nothing


def test_leave_until_resumed_while_a_carried_generation_is_collected_owns_nothing(
    fake_group: Any,
) -> None:
    """Cooperative: the member is made to leave after its generation ended carried, while a
    routine of it still runs (a Consumer's slow revocation callback: the poll timer counts
    it). The run thread recorded the generation's partitions as owned once the routine
    returned, lost or not, so the member came back as a new one claiming them in its
    subscription, as Kafka's does not: a reset generation reports nothing owned."""
    state = OneMemberGroup()
    group = fake_group(state, assignors=("cooperative-sticky",))
    gen = group.next(timeout=WAIT_S)
    gen.acknowledge()
    release = threading.Event()
    gen.start(lambda ctx: release.wait(WAIT_S))
    join = state.fake.join_group
    owned: list[tuple[TP, ...]] = []  # what each join's subscription says the member owns

    def spied_join(group_id: str, member_id: str = "", **kw: Any) -> Any:
        owned.append(ConsumerProtocolSubscription.decode(kw["protocols"][0][1]).owned_partitions)
        return join(group_id, member_id, **kw)

    state.fake.join_group = spied_join
    state.heartbeat_answers.append(Errors.REBALANCE_IN_PROGRESS)
    try:
        assert gen.wait_decided(WAIT_S) and gen.carried  # the routine still runs
        group.leave_until_resumed("max.poll.interval.ms passed")
        assert gen.lost and state.leaves == [state.id(1)]
        group.resume()
    finally:
        release.set()
    nxt = group.next(timeout=WAIT_S)
    assert nxt.member_id == state.id(2)
    assert owned == [()]  # it left: it comes back owning nothing
    assert nxt.owned_before == [] and nxt.revoked == []


@pytest.mark.parametrize("instance_id", [None, "worker-1"], ids=["dynamic", "static"])
def test_leave_until_resumed_during_a_join_loses_the_generation_it_makes(
    fake_group: Any, instance_id: str | None,
) -> None:
    """The poll timer makes the member leave while its rejoin is under way (no generation in
    hand): the generation that join then makes must not be handed out as live. A static
    member sends no LeaveGroup, so the coordinator completed the join, and the member went on
    heartbeating a generation whose partitions its stuck application never read: they never
    moved to another member, which is what max_poll_interval_ms is for."""
    state = OneMemberGroup()
    group = fake_group(state, group_instance_id=instance_id)
    first = group.next(timeout=WAIT_S)
    entered, release = hold_joins(state)
    first._end(EndReason.REBALANCE, Errors.REBALANCE_IN_PROGRESS)
    try:
        assert entered.wait(WAIT_S)  # rejoining: no generation in hand
        group.leave_until_resumed("max.poll.interval.ms passed")
    finally:
        release.set()
    wait_until(lambda: group.newest() is not first)
    made = group.newest()
    assert made.done.wait(WAIT_S)  # ended at once, not heartbeating as a live generation
    assert made.lost and made.end_reason is EndReason.MEMBER_LOST
    with pytest.raises(CommitFailedError):
        made.commit_offsets({TP("t", 0): 1})
    assert group.peek() is None
    group.resume()
    nxt = group.next(timeout=WAIT_S)
    assert nxt.generation_id > made.generation_id and not nxt.done.is_set()
    if instance_id is None:  # left for good, and back as a new member
        assert state.leaves[-1] == made.member_id and nxt.member_id != made.member_id
    else:  # a static member never leaves
        assert state.leaves == []


def test_revoking_member_keeps_heartbeating_lost_member_stops(fake_group: Any) -> None:
    state = OneMemberGroup()
    state.heartbeat_default = Errors.REBALANCE_IN_PROGRESS
    group = fake_group(state)
    gen = group.next(timeout=WAIT_S)
    release = threading.Event()
    gen.start(lambda ctx: release.wait(WAIT_S))
    assert gen.done.wait(WAIT_S)
    beats = state.heartbeats
    wait_until(lambda: state.heartbeats >= beats + 3)  # still beating while the routine runs
    assert state.joins == [""]  # and not rejoining yet
    state.heartbeat_default = Errors.UNKNOWN_MEMBER_ID  # the rebalance timeout removed it
    wait_until(lambda: gen.lost)
    heartbeat_thread = gen._helpers[0]
    wait_until(lambda: not heartbeat_thread.is_alive())  # it stopped though the routine runs
    assert state.joins == [""]
    state.heartbeat_default = Errors.NONE
    release.set()
    nxt = group.next(timeout=WAIT_S)
    assert nxt.member_id == state.id(2) and state.joins[1] == ""


def test_retriable_errors_are_retried_without_ending_anything(fake_group: Any) -> None:
    state = OneMemberGroup()
    state.join_answers.extend([Errors.COORDINATOR_NOT_AVAILABLE, ConnectionLost("blip")])
    state.heartbeat_answers.extend([ConnectionLost("blip"), Errors.COORDINATOR_LOAD_IN_PROGRESS])
    group = fake_group(state)
    gen = group.next(timeout=WAIT_S)
    assert gen.generation_id == 1
    wait_until(lambda: state.heartbeats >= 6)
    assert not gen.done.is_set()


# -- join errors ------------------------------------------------------------------------------


def test_join_error_is_reported_once_then_the_member_leaves_backs_off_and_rejoins(
    fake_group: Any,
) -> None:
    state = OneMemberGroup()
    state.join_answers.append(Errors.UNKNOWN_SERVER_ERROR)
    group = fake_group(state)
    with pytest.raises(ProtocolError, match="UNKNOWN_SERVER_ERROR") as info:
        group.next(timeout=WAIT_S)
    assert info.value.error is Errors.UNKNOWN_SERVER_ERROR
    gen = group.next(timeout=WAIT_S)
    assert state.leaves == [state.id(1)]  # kafka-go: leave, forget the id, back off
    assert gen.member_id == state.id(2)
    assert state.joins == ["", ""]


@pytest.mark.parametrize(
    ("error", "says"),
    [
        (Errors.INVALID_SESSION_TIMEOUT,
         r"session_timeout_ms=\d+ is outside the namespace's group_min_session_timeout_ms"),
        (Errors.INCONSISTENT_GROUP_PROTOCOL, r"share none of this member's assignors \[range"),
        (Errors.GROUP_MAX_SIZE_REACHED, r"group_max_size members"),
        (Errors.INVALID_GROUP_ID, r"group_id='g' is not a valid group id"),
        (Errors.GROUP_AUTHORIZATION_FAILED, r"may not use group 'g'"),
    ],
)
def test_a_join_refusal_says_which_setting_to_change(
    fake_group: Any, error: Errors, says: str
) -> None:
    """Before, the message was only the code ("JoinGroup of 'g' failed: INVALID_SESSION_TIMEOUT"),
    repeated every join_backoff_ms, with nothing naming session_timeout_ms or its bounds."""
    state = OneMemberGroup()
    state.join_answers.append(error)
    group = fake_group(state)
    with pytest.raises(JoinRefusedError, match=says) as info:
        group.next(timeout=WAIT_S)
    assert info.value.error is error
    assert re.search(says, info.value.hint)
    again = pickle.loads(pickle.dumps(info.value))  # crosses processes (Spark executors)
    assert (type(again), again.error, again.hint, str(again)) == (
        JoinRefusedError, error, info.value.hint, str(info.value)
    )


def _refused_for_good(fake_group: Any, error: Any, raised: type[BaseException]) -> tuple[
        OneMemberGroup, list[pytest.ExceptionInfo[Any]]]:
    """The JoinGroup is answered ``error``: next() raises
    ``raised``, once and for good (asked twice), the group closes, its thread ends and nothing
    joins again. The group's fake state, and what each next() raised."""
    state = OneMemberGroup()
    state.join_answers.append(error)
    group = fake_group(state)
    infos = []
    for _ in range(2):  # once, and for good
        with pytest.raises(raised) as info:
            group.next(timeout=WAIT_S)
        infos.append(info)
    assert group.closed
    thread = group._thread
    assert thread is not None
    thread.join(WAIT_S)
    assert not thread.is_alive()
    assert state.joins == [""]  # no join after the refusal
    return state, infos


@pytest.mark.parametrize(
    "error",
    [
        Errors.INVALID_SESSION_TIMEOUT,
        Errors.INCONSISTENT_GROUP_PROTOCOL,
        Errors.GROUP_MAX_SIZE_REACHED,
        Errors.INVALID_GROUP_ID,
        Errors.GROUP_AUTHORIZATION_FAILED,
    ],
)
def test_a_join_refusal_no_retry_can_mend_is_fatal(fake_group: Any, error: Errors) -> None:
    """Kafka's JoinGroupResponseHandler raises these to the application as fatal. Before, they
    were "anything else": next() raised once, then the member backed off and joined again, for
    ever (every join_backoff_ms), and the next next() handed out a generation once the refusal
    stopped. Now the group closes: every next() raises the refusal, nothing joins again.
    GROUP_MAX_SIZE_REACHED: the coordinator removed the member already (and answered without a
    member id), so there is nothing to leave; the others leave with the id they named themselves."""
    state, raised = _refused_for_good(fake_group, error, JoinRefusedError)
    for info in raised:
        assert info.value.error is error and info.value.hint
    assert state.leaves == ([] if error is Errors.GROUP_MAX_SIZE_REACHED else [state.id(1)])


@pytest.mark.parametrize("where", ["join", "heartbeat"])
def test_a_fenced_static_member_is_told_another_process_took_its_instance_id(
    fake_group: Any, where: str
) -> None:
    """A reviewer's repro: two running processes with one group_instance_id (the new copy of a
    deployment started before the old one stopped) fence the older one, fatally, and it was
    told only the code: "the coordinator answered FENCED_INSTANCE_ID (generation 1)" from a
    heartbeat, "JoinGroup of 'g' failed: FENCED_INSTANCE_ID" from a parked join. Kafka's
    FencedInstanceIdException says another consumer registered with the same
    group.instance.id; so does this now, naming the instance id."""
    state = OneMemberGroup()
    group = fake_group(state, group_instance_id="node-7")
    if where == "join":
        state.join_answers.append(Errors.FENCED_INSTANCE_ID)
    else:
        gen = group.next(timeout=WAIT_S)
        state.heartbeat_answers.append(Errors.FENCED_INSTANCE_ID)
        assert gen.done.wait(WAIT_S)
    for _ in range(2):  # fatal: once, and for good
        with pytest.raises(FencedInstanceIdError) as info:
            group.next(timeout=WAIT_S)
        assert info.value.error is Errors.FENCED_INSTANCE_ID
        assert "another process joined with group_instance_id='node-7'" in str(info.value)


def test_sync_rebalance_in_progress_rejoins_quietly(fake_group: Any) -> None:
    state = OneMemberGroup()
    state.sync_answers.append(Errors.REBALANCE_IN_PROGRESS)
    group = fake_group(state)
    gen = group.next(timeout=WAIT_S)  # no error surfaces: rejoining is routine
    assert gen.generation_id == 2 and gen.member_id == state.id(1)
    assert state.leaves == []


def test_undecodable_subscription_is_a_clear_error(fake_group: Any) -> None:
    state = OneMemberGroup()
    state.extra_members = [JoinGroupMember("bad-member", None, b"\xc1 not msgpack")]
    group = fake_group(state)
    with pytest.raises(MalformedMetadataError, match="bad-member.*not a consumer subscription"):
        group.next(timeout=WAIT_S)
    assert state.leaves == [state.id(1)]


def test_close_unparks_a_parked_join_with_leave_group(fake_group: Any) -> None:
    state = OneMemberGroup()
    state.park_join.set()
    group = fake_group(state)
    with pytest.raises(TimeoutError):
        group.next(timeout=0.05)
    wait_until(lambda: state.joins == [""])
    group.close(timeout=WAIT_S)
    assert state.leaves == [state.id(1)]
    assert not group._thread.is_alive()  # type: ignore[union-attr]
    with pytest.raises(GroupClosedError):
        group.next(timeout=WAIT_S)


def test_close_bounds_the_leave_group_of_a_parked_join_by_its_timeout(fake_group: Any) -> None:
    # Redis black-holed while the member is parked in JoinGroup: the LeaveGroup close() sends to
    # unpark it hangs for the socket timeout. Before, close(timeout=2) sent it first and waited
    # for it: 10 s. Now close() returns while the LeaveGroup still hangs.
    state = OneMemberGroup()
    state.park_join.set()
    state.leaves_flow.clear()
    group = fake_group(state)
    with pytest.raises(TimeoutError):
        group.next(timeout=0.05)
    wait_until(lambda: state.joins == [""])
    try:
        group.close(timeout=0.2)
        with state.lock:
            assert state.hanging == 1  # close() returned with its LeaveGroup still under way
    finally:
        state.leaves_flow.set()
    wait_until(lambda: state.leaves == [state.id(1)])  # and the LeaveGroup is still sent
    wait_until(lambda: not group._thread.is_alive())  # type: ignore[union-attr]


# -- the generation lifecycle -----------------------------------------------------------------


def test_consecutive_generations_keep_the_member_id(fake_group: Any) -> None:
    state = OneMemberGroup(partitions=3)
    state.committed[TP("t", 1)] = 7
    group = fake_group(state)
    gen = group.next(timeout=WAIT_S)
    assert gen.assignments == {
        "t": [PartitionAssignment(0, 0), PartitionAssignment(1, 7), PartitionAssignment(2, 0)]
    }
    assert gen.committed == {TP("t", 1): 7}
    assert gen.is_leader and gen.group_id == "g"
    state.heartbeat_answers.append(Errors.REBALANCE_IN_PROGRESS)
    assert gen.done.wait(WAIT_S) and not gen.lost
    nxt = group.next(timeout=WAIT_S)
    assert (nxt.generation_id, nxt.member_id, nxt.group_id) == (2, gen.member_id, "g")


def test_the_next_generation_waits_for_every_routine(fake_group: Any) -> None:
    state = OneMemberGroup()
    group = fake_group(state)
    gen = group.next(timeout=WAIT_S)
    releases = [threading.Event() for _ in range(3)]
    finished: list[int] = []
    for i, ev in enumerate(releases):
        gen.start(lambda ctx, i=i, ev=ev: (ctx.wait(WAIT_S), ev.wait(WAIT_S), finished.append(i)))
    state.heartbeat_answers.append(Errors.REBALANCE_IN_PROGRESS)
    assert gen.done.wait(WAIT_S)
    for ev in releases[:2]:
        ev.set()
    wait_until(lambda: len(finished) == 2)
    beats = state.heartbeats
    wait_until(lambda: state.heartbeats >= beats + 3)
    assert state.joins == [""]  # one routine still runs: no rejoin
    with pytest.raises(TimeoutError):
        group.next(timeout=0.01)
    releases[2].set()
    nxt = group.next(timeout=WAIT_S)
    assert sorted(finished) == [0, 1, 2] and nxt.generation_id == 2
    with pytest.raises(GenerationEndedError):
        gen.start(lambda ctx: None)


def test_a_raising_routine_ends_the_generation(fake_group: Any) -> None:
    state = OneMemberGroup()
    group = fake_group(state)
    gen = group.next(timeout=WAIT_S)
    gen.start(lambda ctx: None)  # returning normally changes nothing
    boom = RuntimeError("boom")

    def fail(ctx: Any) -> None:
        raise boom

    gen.start(fail)
    assert gen.done.wait(WAIT_S)
    assert gen.end_reason is EndReason.ROUTINE_FAILED and gen.exceptions == [boom] and not gen.lost
    assert group.next(timeout=WAIT_S).member_id == gen.member_id


def test_a_generation_that_ends_before_next_is_withdrawn(fake_group: Any) -> None:
    state = OneMemberGroup()
    state.heartbeat_answers.append(Errors.REBALANCE_IN_PROGRESS)
    group = fake_group(state)
    group.start()
    wait_until(lambda: state.generation >= 2)  # gen 1 ended unseen; the member rejoined
    gen = group.next(timeout=WAIT_S)
    assert gen.generation_id >= 2 and not gen.done.is_set()


@pytest.mark.parametrize("answer", [Errors.ILLEGAL_GENERATION, Errors.UNKNOWN_MEMBER_ID])
def test_fenced_commit_raises_commit_failed_and_ends_the_generation(
    fake_group: Any, answer: Errors
) -> None:
    state = OneMemberGroup()
    group = fake_group(state)
    gen = group.next(timeout=WAIT_S)
    gen.commit_offsets({TP("t", 0): 5})
    assert state.committed == {TP("t", 0): 5}
    state.commit_answers.append(answer)
    with pytest.raises(CommitFailedError, match="rebalanced") as info:
        gen.commit_offsets({("t", 0): 6})
    assert info.value.error is answer and info.value.partitions == {TP("t", 0): answer}
    assert answer.name in str(info.value)
    assert gen.done.is_set() and gen.lost
    assert state.committed == {TP("t", 0): 5}


def test_a_commit_refused_as_rebalance_in_progress_raises_rebalance_in_progress(
    fake_group: Any,
) -> None:
    """As Kafka's OffsetCommitResponseHandler: REBALANCE_IN_PROGRESS (the group is between
    JoinGroup and SyncGroup) raises RebalanceInProgressException and requests a rejoin, the
    partitions revoked, not lost; CommitFailedError said they were gone."""
    state = OneMemberGroup()
    group = fake_group(state)
    gen = group.next(timeout=WAIT_S)
    state.commit_answers.append(Errors.REBALANCE_IN_PROGRESS)
    with pytest.raises(RebalanceInProgressError, match="not lost") as info:
        gen.commit_offsets({("t", 0): 6})
    assert not isinstance(info.value, CommitFailedError)
    assert info.value.error is Errors.REBALANCE_IN_PROGRESS
    assert gen.done.is_set() and not gen.lost and gen.end_reason is EndReason.REBALANCE
    assert state.committed == {}


def test_a_commit_of_a_carried_generation_refused_by_the_next_one_is_rebalance_in_progress(
    fake_group: Any,
) -> None:
    """Cooperative: the generation carried through the member's rejoin commits until the next
    one is taken. Once the coordinator has completed that join (CompletingRebalance), it
    refuses the old generation (ILLEGAL_GENERATION) although the member, which it knows, keeps
    the partitions: Kafka raises RebalanceInProgressException then. A refusal saying the
    member is unknown is still CommitFailedError."""
    state = OneMemberGroup()
    group = fake_group(state, assignors=("cooperative-sticky",))
    gen = group.next(timeout=WAIT_S)
    entered, release = hold_joins(state)
    state.heartbeat_answers.append(Errors.REBALANCE_IN_PROGRESS)
    try:
        assert entered.wait(WAIT_S)  # the rejoin is under way, the partitions carried
        assert gen.carried
        state.commit_answers.append(Errors.ILLEGAL_GENERATION)
        with pytest.raises(RebalanceInProgressError, match="ILLEGAL_GENERATION") as info:
            gen.commit_offsets({("t", 0): 6})
        assert not isinstance(info.value, CommitFailedError)
        assert info.value.error is Errors.ILLEGAL_GENERATION and not gen.lost
        state.commit_answers.append(Errors.UNKNOWN_MEMBER_ID)
        with pytest.raises(CommitFailedError, match="UNKNOWN_MEMBER_ID"):
            gen.commit_offsets({("t", 0): 6})
    finally:
        release.set()
    assert group.next(timeout=WAIT_S).generation_id == 2


def test_commit_offsets_retries_a_lost_connection(fake_group: Any) -> None:
    state = OneMemberGroup()
    group = fake_group(state)
    gen = group.next(timeout=WAIT_S)
    original = state.fake.commit_offsets  # type: ignore[attr-defined]
    failures = deque([ConnectionLost("blip")])

    def flaky(*args: Any, **kwargs: Any) -> Any:
        if failures:
            raise failures.popleft()
        return original(*args, **kwargs)

    state.fake.commit_offsets = flaky  # type: ignore[attr-defined]
    gen.commit_offsets({TP("t", 1): 3})
    assert state.committed == {TP("t", 1): 3}


def test_leader_watches_partition_counts(fake_group: Any) -> None:
    state = OneMemberGroup(partitions=2)
    group = fake_group(state)
    gen = group.next(timeout=WAIT_S)
    assert len(gen.partitions) == 2
    with state.lock:
        state.counts["t"] = 3
    assert gen.done.wait(WAIT_S)
    assert gen.end_reason is EndReason.PARTITIONS_CHANGED and not gen.lost
    nxt = group.next(timeout=WAIT_S)
    assert nxt.partitions == [TP("t", 0), TP("t", 1), TP("t", 2)]


def test_followers_do_not_watch_partition_counts(fake_group: Any) -> None:
    state = OneMemberGroup(partitions=2)
    state.leader = "someone-else"
    group = fake_group(state)
    gen = group.next(timeout=WAIT_S)
    assert not gen.is_leader and len(gen.partitions) == 2
    with state.lock:
        state.counts["t"] = 3
    beats = state.heartbeats
    wait_until(lambda: state.heartbeats >= beats + 5)  # many watch intervals pass
    assert not gen.done.is_set()
    assert len(gen._helpers) == 2  # the heartbeat and the session's watch only


def test_static_member_does_not_leave_on_close(fake_group: Any) -> None:
    state = OneMemberGroup()
    group = fake_group(state, group_instance_id="worker-1")
    gen = group.next(timeout=WAIT_S)
    group.close(timeout=WAIT_S)
    assert gen.done.is_set() and gen.end_reason is EndReason.CLOSED
    assert state.leaves == []


def test_close_ends_the_generation_waits_for_routines_and_leaves(fake_group: Any) -> None:
    state = OneMemberGroup()
    group = fake_group(state)
    gen = group.next(timeout=WAIT_S)
    order: list[str] = []
    gen.start(lambda ctx: (ctx.wait(WAIT_S), order.append("routine returned")))
    group.close(timeout=WAIT_S)
    order.append("closed")
    assert order == ["routine returned", "closed"]
    assert state.leaves == [state.id(1)] and gen.end_reason is EndReason.CLOSED
    with pytest.raises(GroupClosedError):
        group.next()
    group.close()  # idempotent


def test_close_timeout_bounds_the_retries_of_a_final_commit(fake_group: Any) -> None:
    """Retries of a routine's final commit go on after close() (see the real-server test), but
    no longer than close()'s timeout, even when the session timeout would allow more."""
    state = OneMemberGroup()
    group = fake_group(state, session_timeout_ms=60_000, heartbeat_interval_ms=10)
    gen = group.next(timeout=WAIT_S)

    def unreachable(*args: Any, **kwargs: Any) -> Any:
        raise ConnectionLost("Redis is unreachable")

    outcome: list[BaseException] = []
    ended = threading.Event()

    def routine(ctx: Any) -> None:
        ctx.wait()
        state.fake.commit_offsets = unreachable  # type: ignore[attr-defined]
        try:
            ctx.generation.commit_offsets({TP("t", 0): 4})
        except ConnectionLost as exc:
            outcome.append(exc)
        finally:
            ended.set()

    gen.start(routine)
    group.close(timeout=0.2)
    assert ended.wait(WAIT_S)  # the session timeout (60 s) would have kept it retrying
    assert len(outcome) == 1 and "unreachable" in str(outcome[0])


def test_close_does_not_wait_out_the_heartbeat_retries_once_the_routines_returned(
    fake_group: Any,
) -> None:
    """Heartbeats keep retrying during close() (for the routines' final commits), but stop
    once the routines have returned: close() without a timeout does not wait for the retries
    of a heartbeat to an unreachable Redis to use up the session timeout."""
    state = OneMemberGroup()
    group = fake_group(state, session_timeout_ms=60_000, heartbeat_interval_ms=10)
    gen = group.next(timeout=WAIT_S)
    gen.start(lambda ctx: ctx.wait())
    state.heartbeat_default = ConnectionLost("Redis is unreachable")
    beats = state.heartbeats
    wait_until(lambda: state.heartbeats >= beats + 3)  # a heartbeat is being retried
    closed = threading.Event()
    closer = threading.Thread(target=lambda: (group.close(), closed.set()), daemon=True)
    closer.start()
    assert closed.wait(WAIT_S)  # not after the 60 s session timeout
    assert gen.end_reason is EndReason.CLOSED and state.leaves == [state.id(1)]


def test_close_from_inside_a_routine_does_not_deadlock(fake_group: Any) -> None:
    state = OneMemberGroup()
    group = fake_group(state)
    gen = group.next(timeout=WAIT_S)
    closed = threading.Event()
    gen.start(lambda ctx: (group.close(), closed.set()))
    assert closed.wait(WAIT_S)
    wait_until(lambda: not group._thread.is_alive())  # type: ignore[union-attr]
    assert state.leaves == [state.id(1)] and gen.end_reason is EndReason.CLOSED


# -- against a real server (one node and a cluster) -------------------------------------------


@pytest.fixture
def real(make_coordinator: Any, redis_client: Any, namespace: str) -> Any:
    """A coordinator with short test bounds, the topics admin, and a group factory."""
    coord: GroupCoordinator = make_coordinator()
    topics = Topics(redis_client, namespace)
    groups: list[ConsumerGroup] = []

    class Real:
        pass

    r = Real()
    r.coord, r.topics, r.client, r.namespace = coord, topics, redis_client, namespace  # type: ignore[attr-defined]

    def group(**overrides: Any) -> ConsumerGroup:
        settings: dict[str, Any] = {
            "redis_client": redis_client,
            "namespace": namespace,
            "heartbeat_interval_ms": 50,
            "session_timeout_ms": 1000,
            "rebalance_timeout_ms": 3000,
            "partition_watch_interval_ms": 50,
            "retry_backoff_ms": 10,
            "retry_backoff_max_ms": 100,
        }
        settings.update(overrides)
        settings.setdefault("group_id", "g")
        settings.setdefault("topics", ["t"])
        g = ConsumerGroup(ConsumerGroupConfig(**settings))
        groups.append(g)
        return g

    r.group = group  # type: ignore[attr-defined]
    yield r
    for g in groups:
        g.close(timeout=WAIT_S)


def test_real_single_member_lifecycle(real: Any) -> None:
    real.topics.create("t", 4)
    group = real.group()
    gen = group.next(timeout=WAIT_S)
    assert gen.is_leader and gen.generation_id == 1
    assert gen.offsets == {TP("t", p): 0 for p in range(4)}
    gen.commit_offsets({TP("t", 2): 0})
    group.close(timeout=WAIT_S)
    desc = real.coord.describe_group("g")
    assert desc.state == "Empty" and desc.members == []
    assert real.coord.fetch_offsets("g", [TP("t", 2)]).offsets[TP("t", 2)].offset == 0


def test_a_member_names_its_host_for_describe(real: Any) -> None:
    """Kafka's broker records the address each member connects from (the HOST column of
    ``kafka-consumer-groups --describe``); an rcoord member names its machine instead, since
    no server sees it connect. A join that names a host keeps it."""
    real.topics.create("t", 1)
    group = real.group(client_id="worker")
    group.next(timeout=WAIT_S)
    (member,) = real.coord.describe_group("g").members
    assert (member.client_id, member.client_host) == ("worker", socket.gethostname())
    coord = RedisCoordinator(real.client, real.namespace).start()
    coord.join_group("named", protocol_type="consumer", protocols=[("range", b"")],
                     session_timeout_ms=10_000, client_host="/10.0.0.9",
                     require_known_member_id=False)
    assert [m.client_host for m in coord.describe_group("named").members] == ["/10.0.0.9"]


def test_real_two_members_split_and_fence_the_old_generation(real: Any) -> None:
    real.topics.create("t", 6)
    a = real.group()
    gen_a1 = a.next(timeout=WAIT_S)
    assert len(gen_a1.partitions) == 6
    b = real.group()
    b.start()
    assert gen_a1.done.wait(WAIT_S)  # b's join makes a's heartbeat answer "rebalance"
    assert gen_a1.end_reason is EndReason.REBALANCE and not gen_a1.lost
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        ga, gb = pool.map(lambda g: g.next(timeout=WAIT_S), [a, b])
    assert ga.generation_id == gb.generation_id == 2
    assert ga.member_id == gen_a1.member_id  # the member id is kept across generations
    assert set(ga.partitions).isdisjoint(gb.partitions)
    assert set(ga.partitions) | set(gb.partitions) == {TP("t", p) for p in range(6)}
    with pytest.raises(CommitFailedError) as info:
        gen_a1.commit_offsets({TP("t", 0): 1})
    assert info.value.error is Errors.ILLEGAL_GENERATION
    ga.commit_offsets({tp: 0 for tp in ga.partitions})  # the live generation's commit succeeds


def test_real_start_offsets_use_commits_then_the_policy(real: Any) -> None:
    real.topics.create("t", 2)
    Producer(real.client, real.namespace).send_batch(
        "t", [ProducerRecord(b"x", partition=p) for p in (0, 0, 1)]
    )
    assert real.coord.commit_offsets("g", {TP("t", 0): 1})[TP("t", 0)] is Errors.NONE
    group = real.group(start_offset="latest")
    gen = group.next(timeout=WAIT_S)
    assert gen.offsets == {TP("t", 0): 1, TP("t", 1): 1}  # committed; else the log end
    assert gen.committed == {TP("t", 0): 1}


def test_real_partition_watcher_sees_new_partitions(real: Any) -> None:
    real.topics.create("t", 2)
    group = real.group()
    gen = group.next(timeout=WAIT_S)
    real.topics.add_partitions("t", 5)
    assert gen.done.wait(WAIT_S)
    assert gen.end_reason is EndReason.PARTITIONS_CHANGED
    nxt = group.next(timeout=WAIT_S)
    assert nxt.generation_id == gen.generation_id + 1
    assert nxt.partitions == [TP("t", p) for p in range(5)]


def test_real_undecodable_member_metadata_is_reported_by_the_leader(real: Any) -> None:
    real.topics.create("t", 2)
    group = real.group()
    gen = group.next(timeout=WAIT_S)
    coord = real.coord
    first = coord.join_group(
        "g", protocol_type="consumer", protocols=[("range", b"\xc1junk")], session_timeout_ms=1000
    )
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        parked = pool.submit(
            coord.join_group,
            "g",
            first.member_id,
            protocol_type="consumer",
            protocols=[("range", b"\xc1junk")],
            session_timeout_ms=1000,
            rebalance_timeout_ms=3000,
        )
        assert gen.done.wait(WAIT_S)
        with pytest.raises(MalformedMetadataError, match=first.member_id):
            group.next(timeout=WAIT_S)
        parked.result(WAIT_S)


class CommitBlips(RedisCoordinator):
    """The Redis coordinator; each exception queued in ``failures`` fails one commit call."""

    def __init__(self, redis_client: Any, namespace: str) -> None:
        super().__init__(redis_client, namespace)
        self.failures: deque[BaseException] = deque()
        self.calls = 0

    def commit_offsets(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        if self.failures:
            raise self.failures.popleft()
        return super().commit_offsets(*args, **kwargs)


def test_real_final_commit_on_close_is_retried_after_a_lost_connection(real: Any) -> None:
    """close() stops joining at once, but a routine's final commit is still retried (as a
    commit is while the group runs), so one lost connection does not lose it."""
    real.topics.create("t", 1)
    coord = CommitBlips(real.client, real.namespace)
    coord.start()
    cfg = ConsumerGroupConfig(
        group_id="g", topics=["t"], redis_client=real.client, namespace=real.namespace,
        heartbeat_interval_ms=50, session_timeout_ms=3000, rebalance_timeout_ms=3000,
        retry_backoff_ms=10, retry_backoff_max_ms=100,
    )
    group = ConsumerGroup(cfg, coordinator=coord)
    outcome: list[object] = []

    def routine(ctx: Any) -> None:
        ctx.wait()  # until close() ends the generation
        coord.failures.append(ConnectionLost("a blip"))
        try:
            ctx.generation.commit_offsets({TP("t", 0): 7})
            outcome.append("committed")
        except Exception as exc:  # noqa: BLE001 - asserted on below
            outcome.append(exc)

    try:
        gen = group.next(timeout=WAIT_S)
        gen.start(routine)
        group.close(timeout=WAIT_S)
    finally:
        group.close(timeout=WAIT_S)
    assert outcome == ["committed"] and coord.calls == 2
    assert real.coord.fetch_offsets("g", [TP("t", 0)]).offsets[TP("t", 0)].offset == 7


def test_real_static_member_keeps_its_place_on_close(real: Any) -> None:
    real.topics.create("t", 2)
    group = real.group(group_instance_id="static-1", session_timeout_ms=3000)
    gen = group.next(timeout=WAIT_S)
    group.close(timeout=WAIT_S)
    desc = real.coord.describe_group("g")
    assert [m.member_id for m in desc.members] == [gen.member_id]  # no LeaveGroup was sent
    again = real.group(group_instance_id="static-1", session_timeout_ms=3000)
    back = again.next(timeout=WAIT_S)
    # KIP-345: the restarted static member gets its partitions back without a rebalance.
    assert back.generation_id == gen.generation_id and back.partitions == gen.partitions


def test_real_static_leader_back_from_leave_until_resumed_rebalances_nothing(real: Any) -> None:
    """A static leader made to leave (``leave_until_resumed``: its poll timer ran out) and back
    within its session: Kafka's member resets its generation on leaving, so it joins again with
    its instance id alone and the coordinator takes it as the static member returning (same
    generation, KIP-814's skip for a leader). rcoord's kept its member id, and a known leader's
    join in a Stable group rebalances, so the whole group moved to a new generation."""
    real.topics.create("t", 4)
    a = real.group(group_instance_id="static-a", session_timeout_ms=3000)
    b = real.group(group_instance_id="static-b", session_timeout_ms=3000)
    a.start()
    b.start()
    gens: dict[str, Any] = {}

    def both_in_one_generation() -> bool:
        for name, group in (("a", a), ("b", b)):
            newest = group.newest()
            if newest is not None and newest is not gens.get(name):
                gens[name] = group.next(timeout=WAIT_S)
                gens[name].acknowledge()
        return (len(gens) == 2 and gens["a"].generation_id == gens["b"].generation_id
                and len(real.coord.describe_group("g").members) == 2
                and real.coord.describe_group("g").state == "Stable")

    wait_until(both_in_one_generation)
    leader_name = "a" if gens["a"].is_leader else "b"
    leader, follower = (a, b) if leader_name == "a" else (b, a)
    before, follower_gen = gens[leader_name], gens["b" if leader_name == "a" else "a"]
    leader.leave_until_resumed("max.poll.interval.ms passed")
    assert before.lost
    leader.resume()
    back = leader.next(timeout=WAIT_S)
    assert back.generation_id == before.generation_id  # no rebalance
    assert back.member_id != before.member_id  # the old id was replaced, as Kafka's
    assert sorted(back.partitions) == sorted(before.partitions)
    assert not follower_gen.lost and follower_gen.generation_id == before.generation_id
    desc = real.coord.describe_group("g")
    assert desc.state == "Stable" and sorted(m.member_id for m in desc.members) == sorted(
        [back.member_id, follower_gen.member_id])
    assert follower.newest() is follower_gen


def test_real_static_member_left_during_its_join_forgets_the_id_the_join_answers(
        real: Any) -> None:
    """``leave_until_resumed`` while a static member's join is under way (parked in the
    coordinator): the join's answer comes after and names the member id again. Kafka's member
    drops such an answer (``UnjoinedGroupException``), its generation reset; rcoord's kept that
    id, so ``resume()`` joined as a known member, and a known leader's join in a Stable group
    rebalances: the group moved to a new generation, as the id kept by leave_until_resumed
    itself made it before (``..._back_from_leave_until_resumed_rebalances_nothing``)."""
    real.topics.create("t", 2)
    a = real.group(group_instance_id="static-a", session_timeout_ms=3000)
    calls: list[str] = []
    set_member_id = a._set_member_id

    def leave_while_parked(member_id: str) -> None:
        set_member_id(member_id)
        calls.append(member_id)
        if len(calls) == 1:  # (the id a new member names itself by, before its join is sent)
            a.leave_until_resumed("max.poll.interval.ms passed")

    made: list[Any] = []  # (a generation ended before next() took it is not offered)
    start_threads = a._start_threads

    def recorded(gen: Any) -> None:
        made.append(gen)
        start_threads(gen)

    a._set_member_id = leave_while_parked  # type: ignore[method-assign]
    a._start_threads = recorded  # type: ignore[method-assign]
    a.start()
    wait_until(lambda: bool(made) and real.coord.describe_group("g").state == "Stable")
    first = made[0]
    assert first.lost and first.is_leader and first.member_id == calls[-1]
    a.resume()
    back = a.next(timeout=WAIT_S)
    assert back.generation_id == first.generation_id  # no rebalance
    assert back.member_id != first.member_id  # the old id was replaced, as Kafka's
    assert [m.member_id for m in real.coord.describe_group("g").members] == [back.member_id]


def test_real_static_member_close_gives_up_its_parked_join(real: Any) -> None:
    """A static member sends no LeaveGroup on close, so nothing answers its parked JoinGroup:
    close() gives the call up instead (``abandon_parked_when``), within one 1 s wait, rather
    than waiting for the rebalance to complete (here a minute: the other member never rejoins),
    and the member stays in the group."""
    real.topics.create("t", 2)
    group = real.group(group_instance_id="static-1", session_timeout_ms=3000)
    protocols = [(a.name, b"") for a in group.config.resolved_assignors()]

    def join(member_id: str = "") -> Any:
        return real.coord.join_group("g", member_id, protocol_type=PROTOCOL_TYPE,
                                     protocols=protocols, session_timeout_ms=60_000,
                                     rebalance_timeout_ms=60_000)

    # A member that holds the group for a minute and never rejoins (its process hangs).
    hung = join(join().member_id)
    assert hung.error is Errors.NONE
    assert real.coord.sync_group("g", hung.generation_id, hung.member_id,
                                 assignments={hung.member_id: b""}).error is Errors.NONE
    group.start()

    def static_members() -> list[str]:
        desc = real.coord.describe_group("g")
        return [m.member_id for m in desc.members if m.group_instance_id == "static-1"]

    # Its first JoinGroup is parked (the member id it was given is still in the parked reply).
    wait_until(lambda: bool(static_members()) and group._in_call, timeout_s=WAIT_S)
    [member_id] = static_members()
    group.close(timeout=5.0)  # far below the minute the parked join would wait
    assert not group._thread.is_alive()  # type: ignore[union-attr]
    with pytest.raises(GroupClosedError):
        group.next(timeout=WAIT_S)
    # No LeaveGroup was sent: the static member keeps its place and the round still waits.
    desc = real.coord.describe_group("g")
    assert desc.state == "PreparingRebalance"
    assert {(m.member_id, m.group_instance_id) for m in desc.members} == {
        (hung.member_id, None), (member_id, "static-1")}


@pytest.mark.parametrize("how", ["from a routine", "past its timeout"])
def test_real_a_group_closes_the_client_it_made_from_redis_url_even_when_close_did_not_wait(
    redis_server: Any, single_client: redis.Redis, namespace: str, how: str
) -> None:
    """A group given ``redis_url`` makes its own client, and closing the group closes it, also
    when close() does not wait for the group's thread (called from one of its routines, which
    the thread waits for; or its timeout passed): the thread closes it as it exits. (Before,
    only a close() that saw the thread end did, and the connections stayed open for the life
    of the process.)"""
    GroupCoordinator(single_client, CoordinatorConfig(
        namespace=namespace, group_min_session_timeout_ms=10,
        group_initial_rebalance_delay_ms=0)).start()
    Topics(single_client, namespace).create("t", 2)
    name = f"rcoord-test-{namespace}"

    def connections() -> int:
        return sum(1 for c in single_client.client_list() if c.get("name") == name)

    group = ConsumerGroup(ConsumerGroupConfig(
        group_id="g", topics=["t"], namespace=namespace,
        redis_url=f"{redis_server.url}?client_name={name}", heartbeat_interval_ms=50,
        session_timeout_ms=1000, rebalance_timeout_ms=3000, retry_backoff_ms=10,
        retry_backoff_max_ms=100))
    gen = group.next(timeout=WAIT_S)
    assert connections() >= 1
    if how == "from a routine":
        gen.start(lambda ctx: group.close())
    else:
        stop = threading.Event()
        gen.start(lambda ctx: stop.wait(WAIT_S))  # a routine still running when close() gives up
        group.close(timeout=0)
        stop.set()
    wait_until(lambda: group._exited.is_set())
    wait_until(lambda: connections() == 0)


class SyncWatch(RedisCoordinator):
    """The Redis coordinator; notes when this member's SyncGroup is sent, and counts the
    heartbeats answered."""

    def __init__(self, redis_client: Any, namespace: str) -> None:
        super().__init__(redis_client, namespace)
        self.sync_sent = threading.Event()
        self.sent_at = 0.0
        self.beats = 0

    def sync_group(self, *args: Any, **kwargs: Any) -> Any:
        self.sent_at = time.monotonic()
        self.sync_sent.set()
        return super().sync_group(*args, **kwargs)

    def heartbeat(self, *args: Any, **kwargs: Any) -> Any:
        error = super().heartbeat(*args, **kwargs)
        if error is Errors.NONE:
            self.beats += 1
        return error


def test_real_a_follower_counts_its_session_from_the_leaders_sync_not_its_own(real: Any) -> None:
    """The coordinator refreshes a follower's session when the leader's SyncGroup arrives (its
    parked SyncGroup kept it alive until then, as Kafka's awaiting-sync member). The client
    counted its session from the sending of its own SyncGroup, so a leader that synced more than
    a session timeout later (one heartbeating while it computes: heartbeat.JoinBeats) had the
    follower end its new generation as lost at once, although the coordinator held it."""
    real.topics.create("t", 2)
    coord = real.coord
    sub = ConsumerProtocolSubscription(["t"]).encode()
    join: dict[str, Any] = {"protocol_type": PROTOCOL_TYPE, "protocols": [("range", sub)],
                            "session_timeout_ms": 10_000, "rebalance_timeout_ms": 10_000}
    first = coord.join_group("g", require_known_member_id=False, **join)
    lead = first.member_id
    assert coord.sync_group("g", first.generation_id, lead, assignments={
        lead: ConsumerProtocolAssignment([TP("t", 0), TP("t", 1)]).encode()}).error is Errors.NONE
    watch = SyncWatch(real.client, real.namespace)
    group = ConsumerGroup(ConsumerGroupConfig(
        group_id="g", topics=["t"], heartbeat_interval_ms=50, session_timeout_ms=1000,
        rebalance_timeout_ms=10_000, retry_backoff_ms=10, retry_backoff_max_ms=100),
        coordinator=watch)
    try:
        group.start()
        wait_until(lambda: coord.heartbeat("g", first.generation_id, lead)
                   is Errors.REBALANCE_IN_PROGRESS)
        second = coord.join_group("g", lead, **join)
        assert second.leader_id == lead and len(second.members) == 2
        assert watch.sync_sent.wait(WAIT_S)
        # The leader computes for longer than the follower's session, heartbeating meanwhile.
        wait_until(lambda: time.monotonic() - watch.sent_at > 1.3,
                   step=lambda: coord.heartbeat("g", second.generation_id, lead))
        (follower,) = (m for m in second.members if m.member_id != lead)
        kind, version = metadata_encoding(follower.metadata)
        assert coord.sync_group("g", second.generation_id, lead, assignments={
            lead: ConsumerProtocolAssignment([TP("t", 0)]).encode(),
            follower.member_id: ConsumerProtocolAssignment([TP("t", 1)]).encode(
                kind, min(version, 3)),
        }).error is Errors.NONE
        gen = group.next(timeout=WAIT_S)
        assert gen.generation_id == second.generation_id and gen.partitions == [TP("t", 1)]
        beats = watch.beats
        wait_until(lambda: watch.beats >= beats + 2 or gen.done.is_set())
        assert not gen.done.is_set() and not gen.lost
        assert real.coord.describe_group("g").state == "Stable"
    finally:
        group.close(timeout=WAIT_S)
