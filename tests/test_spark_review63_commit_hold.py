"""A group-mode query plans no batch past one whose commit Redis did not answer.

Before, ``StreamMember.plan`` logged "will retry" and planned on: a crash then left two
finished-or-running batches behind the group's committed offset, the restarted query's replay
of the last one read nothing (the group's offset was short of its start), and the group
delivered the finished batch's records again under a new batch id.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from harness import wait_until

from rcoord import CoordinatorConfig, GroupCoordinator, TopicPartition
from rcoord.client import ConsumerGroup, Generation
from rcoord.client.errors import ReadOnlyReplicaError
from rcoord.errors import ConnectionLost, Errors, MissingPermissionError, ProtocolError, RcoordError
from rcoord.spark.member import CommitNotMadeError, LatestFn, StreamMember, member_config
from rcoord.spark.options import ReadKind, parse_read_options
from rcoord.spark.plan import Position, ranges_between
from rcoord.spark.resolve import log_snapshot
from rcoord.topics import Producer, Topics

TP = TopicPartition
EV0 = TP("ev", 0)


@pytest.fixture
def topics(single_client: Any, namespace: str) -> Topics:
    return Topics(single_client, namespace)


@pytest.fixture
def coord(single_client: Any, namespace: str) -> GroupCoordinator:
    cfg = CoordinatorConfig(namespace=namespace, group_min_session_timeout_ms=10,
                            group_initial_rebalance_delay_ms=0)
    return GroupCoordinator(single_client, cfg).start()


def _member(url: str, namespace: str, client: Any) -> StreamMember:
    o = parse_read_options({"url": url, "namespace": namespace, "subscribe": "ev",
                            "groupId": "g", "sessionTimeoutMs": "1500",
                            "heartbeatIntervalMs": "200", "rebalanceTimeoutMs": "5000"},
                           ReadKind.STREAM, env={})
    return StreamMember(ConsumerGroup(member_config(o, ["ev"], client)), rejoin_wait_s=0.05,
                        first_join_wait_s=10)


def _lose_commits(member: StreamMember, monkeypatch: pytest.MonkeyPatch, times: int,
                  error: Callable[[], RcoordError] = lambda: ConnectionLost("Redis away"),
                  ) -> None:
    """The next ``times`` commits of ``member``'s generation raise ``error()`` (by default:
    find Redis away)."""
    gen = member.generation
    assert gen is not None
    real, left = gen.commit_offsets, [times]

    def commit(offsets: Any) -> None:
        if left[0] > 0:
            left[0] -= 1
            raise error()
        real(offsets)

    monkeypatch.setattr(gen, "commit_offsets", commit)


def _read(start: Position, end: Position) -> list[int]:
    return [o for r in ranges_between(start, end) for o in range(r.start, r.end)]


def _committed(coord: GroupCoordinator) -> dict[TP, int]:
    return {tp: om.offset for tp, om in coord.fetch_offsets("g").offsets.items()}


@dataclass
class Planned:
    """A member of group "g" that planned batch 0 (``first`` to ``end1``: offsets 0-3 of ev-0,
    not committed yet) with ``latest``; ``producer`` appends to ev."""

    member: StreamMember
    first: Position
    end1: Position
    latest: LatestFn
    producer: Producer


@pytest.fixture
def planned(redis_server: Any, single_client: Any, namespace: str, topics: Topics,
            coord: GroupCoordinator) -> Iterator[Planned]:
    topics.create("ev", 1)
    producer = Producer(single_client, namespace)
    producer.send_batch("ev", [b"x"] * 4)

    def latest(parts: Any) -> Any:
        return log_snapshot(topics, parts)

    a = _member(redis_server.url, namespace, single_client)
    try:
        first = a.initial(10)
        yield Planned(a, first, a.plan(first, latest, None), latest, producer)
    finally:
        a.close(5)


# Commits not made that leave the member in its generation: Redis did not answer (the outcome
# is unknown), or answered with an error no fencing code (those end the generation). All but
# ConnectionLost planned on before (review 64).
NOT_MADE: dict[str, Callable[[], RcoordError]] = {
    "unanswered": lambda: ConnectionLost("Redis away"),
    "coordinator-not-available": lambda: ProtocolError(
        "commit failed", Errors.COORDINATOR_NOT_AVAILABLE),
    "metadata-too-large": lambda: ProtocolError(
        "commit of generation 1 failed for ev-0: OFFSET_METADATA_TOO_LARGE",
        Errors.OFFSET_METADATA_TOO_LARGE),
}


@pytest.mark.parametrize("error", NOT_MADE)
def test_a_crash_after_a_lost_commit_delivers_no_record_twice(
        error: str, planned: Planned, redis_server: Any, single_client: Any, namespace: str,
        coord: GroupCoordinator, monkeypatch: pytest.MonkeyPatch) -> None:
    a, end1, latest = planned.member, planned.end1, planned.latest
    delivered = _read(planned.first, end1)  # batch 0: offsets 0-3, its sink stores them
    assert delivered == [0, 1, 2, 3]
    planned.producer.send_batch("ev", [b"y"] * 6)
    _lose_commits(a, monkeypatch, 1, NOT_MADE[error])
    nxt = a.plan(end1, latest, None)  # batch 0's commit is not made
    assert nxt == end1  # no batch 1 until batch 0's commit lands
    a.close(5)  # the query's process dies here: nothing more is committed
    assert _committed(coord) == {}

    b = _member(redis_server.url, namespace, single_client)  # the restarted query
    try:
        if nxt == end1:  # Spark's commit log has batch 0: it plans batch 1 from its end
            after = b.plan(end1, latest, None)
            delivered += _read(end1, after)
        else:  # batch 1 was running: Spark replays it, then plans on from its end
            b.replaying(nxt)
            keep = b.replay(nxt, ranges_between(end1, nxt), 10)
            delivered += [o for r in ranges_between(end1, nxt)
                          if TP(r.topic, r.partition) in keep for o in range(r.start, r.end)]
            after = b.plan(nxt, latest, None)
            delivered += _read(nxt, after)
        assert sorted(delivered) == list(range(10))  # each record in one batch, none twice
    finally:
        b.close(5)


@pytest.mark.parametrize("error", NOT_MADE)
@pytest.mark.parametrize("until_target", [False, True])
def test_planning_goes_on_once_the_lost_commit_lands(
        until_target: bool, error: str, planned: Planned, coord: GroupCoordinator,
        monkeypatch: pytest.MonkeyPatch) -> None:
    a, end1, latest = planned.member, planned.end1, planned.latest
    planned.producer.send_batch("ev", [b"y"] * 6)
    _lose_commits(a, monkeypatch, 1, NOT_MADE[error])
    if not until_target:
        # a plan that reads nothing; the next one commits and plans on
        assert a.plan(end1, latest, None) == end1
        assert _committed(coord) == {}
    # availableNow: a plan that reads nothing would end the run, so it tries again itself
    end2 = a.plan(end1, latest, None, until_target=until_target)
    assert _committed(coord) == {EV0: 4}
    assert _read(end1, end2) == list(range(4, 10))


@pytest.mark.parametrize("until_target", [False, True])
def test_a_commit_unanswered_for_a_session_fails_the_query_instead_of_holding_for_ever(
        until_target: bool, planned: Planned, monkeypatch: pytest.MonkeyPatch) -> None:
    a, end1, latest = planned.member, planned.end1, planned.latest
    _lose_commits(a, monkeypatch, 10**9)
    failed: list[ConnectionLost] = []

    def plan_fails() -> bool:
        try:
            assert a.plan(end1, latest, None, until_target=until_target) == end1
        except ConnectionLost as exc:
            failed.append(exc)
        return bool(failed)

    wait_until(plan_fails, timeout_s=20)
    assert "out of reach for more than the session timeout" in str(failed[0])


@pytest.mark.parametrize("until_target", [False, True])
def test_a_commit_refused_for_a_session_fails_the_query_with_what_refused_it(
        until_target: bool, planned: Planned, coord: GroupCoordinator,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A lasting refusal (a group's offset.metadata.max.bytes below rcoord's metadata) held the
    # query for ever if it held; it planned on before, committing nothing, batch after batch.
    a, end1, latest = planned.member, planned.end1, planned.latest
    planned.producer.send_batch("ev", [b"y"] * 6)
    _lose_commits(a, monkeypatch, 10**9, NOT_MADE["metadata-too-large"])
    failed: list[CommitNotMadeError] = []

    def plan_fails() -> bool:
        try:
            assert a.plan(end1, latest, None, until_target=until_target) == end1
        except CommitNotMadeError as exc:
            failed.append(exc)
        return bool(failed)

    wait_until(plan_fails, timeout_s=20)
    assert "for more than the session timeout" in str(failed[0])
    assert "OFFSET_METADATA_TOO_LARGE" in str(failed[0])
    assert isinstance(failed[0].__cause__, ProtocolError)
    assert _committed(coord) == {}


@pytest.mark.parametrize("until_target", [False, True])
@pytest.mark.parametrize("error", [
    lambda: ReadOnlyReplicaError("group 'g': Redis answered READONLY to commit_offsets for "
                                 "1500 ms: give it the URL of the master"),
    lambda: MissingPermissionError("the Redis user may not run 'fcall'"),
    lambda: ProtocolError("commit refused", Errors.GROUP_AUTHORIZATION_FAILED),
], ids=["replica", "permission", "group-acl"])
def test_a_commit_no_retry_mends_fails_the_query_at_once(
        until_target: bool, error: Callable[[], RcoordError], planned: Planned,
        coord: GroupCoordinator, monkeypatch: pytest.MonkeyPatch) -> None:
    # Before, such a commit (the URL of a replica: READONLY past the retries) was warned about
    # and the query planned on, every later commit failing the same way: batches delivered
    # again after any restart, with only warnings to show for it.
    a, end1, latest = planned.member, planned.end1, planned.latest
    planned.producer.send_batch("ev", [b"y"] * 6)
    _lose_commits(a, monkeypatch, 10**9, error)
    with pytest.raises(type(error())) as got:
        a.plan(end1, latest, None, until_target=until_target)
    assert any("stops rather than plan further batches" in n for n in got.value.__notes__)
    assert _committed(coord) == {}


@pytest.mark.parametrize("error", NOT_MADE)
@pytest.mark.parametrize("until_target", [False, True])
def test_a_restart_whose_resume_commit_is_not_made_delivers_no_record_twice(
        until_target: bool, error: str, planned: Planned, redis_server: Any,
        single_client: Any, namespace: str, coord: GroupCoordinator,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Spark's commit log has batch 0 (records 0-3) but the old process never committed it; the
    # restarted query commits its end under its own generation (StreamMember._resume). When
    # that commit failed, the plan went on from the group's committed offset (none): records
    # 0-3 came again in batch 1 and the sink stored them twice.
    end1, latest = planned.end1, planned.latest
    planned.member.close(5)
    planned.producer.send_batch("ev", [b"y"] * 6)
    real, left = Generation.commit_offsets, [1]

    def commit(gen: Generation, offsets: Any) -> None:
        if left[0] > 0:
            left[0] -= 1
            raise NOT_MADE[error]()
        real(gen, offsets)

    monkeypatch.setattr(Generation, "commit_offsets", commit)
    b = _member(redis_server.url, namespace, single_client)  # the restarted query
    try:
        if not until_target:
            assert b.plan(end1, latest, None) == end1  # held: no batch 1 yet
            assert _committed(coord) == {}
        after = b.plan(end1, latest, None, until_target=until_target)
        assert _committed(coord) == {EV0: 4}
        assert _read(end1, after) == list(range(4, 10))
    finally:
        b.close(5)
