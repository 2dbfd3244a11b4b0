"""The worker's session between its JoinGroup answer and its generation's heartbeat thread.

Between the two the member is in the group (CompletingRebalance, then Stable) and the
coordinator counts its session, but no generation exists yet, so the generation's heartbeat
thread has not started: the leader reads the partition counts and runs its assignor, and every
member then reads its start offsets (OffsetFetch, log offsets). These tests make each step take
longer than the session timeout, on the real clock (the coordinator's session deadlines are
Redis TIME), waiting on elapsed time only; the member must keep its place meanwhile.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from harness import wait_until

from rcoord import GroupCoordinator
from rcoord.assignors import RangeAssignor
from rcoord.client import ConsumerGroup, ConsumerGroupConfig, Generation
from rcoord.client.coordinator import RedisCoordinator
from rcoord.errors import Errors
from rcoord.protocol.offsets import TopicPartition as TP
from rcoord.topics import Topics

WAIT_S = 15.0
SESSION_MS = 1000
SLOW_S = 1.6 * SESSION_MS / 1000  # how long the slow step takes: past the session timeout


def wait_out(seconds: float) -> None:
    """Return once ``seconds`` have passed: the step is slow by construction, whatever the
    machine's load."""
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        time.sleep(left)


class Watched(RedisCoordinator):
    """The Redis coordinator; counts the heartbeats answered NONE, and makes the first
    OffsetFetch slow when ``slow_fetch`` is set."""

    def __init__(self, redis_client: Any, namespace: str, slow_fetch: bool) -> None:
        super().__init__(redis_client, namespace)
        self.slow_fetch = slow_fetch
        self.beats = 0

    def heartbeat(self, *args: Any, **kwargs: Any) -> Any:
        error = super().heartbeat(*args, **kwargs)
        if error is Errors.NONE:
            self.beats += 1
        return error

    def fetch_offsets(self, *args: Any, **kwargs: Any) -> Any:
        if self.slow_fetch:
            self.slow_fetch = False
            wait_out(SLOW_S)
        return super().fetch_offsets(*args, **kwargs)


class SlowRange(RangeAssignor):
    """``range``, slower than a session timeout the first time it assigns."""

    def __init__(self) -> None:
        self.slow = True

    def assign(self, *args: Any, **kwargs: Any) -> Any:
        if self.slow:
            self.slow = False
            wait_out(SLOW_S)
        return super().assign(*args, **kwargs)


@pytest.fixture
def setup(make_coordinator: Any, redis_client: Any, namespace: str) -> Iterator[Any]:
    coord: GroupCoordinator = make_coordinator()
    Topics(redis_client, namespace).create("t", 2)
    groups: list[ConsumerGroup] = []

    def group(watched: Watched, **overrides: Any) -> ConsumerGroup:
        settings: dict[str, Any] = {
            "group_id": "g", "topics": ["t"], "heartbeat_interval_ms": 50,
            "session_timeout_ms": SESSION_MS, "rebalance_timeout_ms": 10_000,
            "retry_backoff_ms": 10, "retry_backoff_max_ms": 100,
        }
        settings.update(overrides)
        g = ConsumerGroup(ConsumerGroupConfig(**settings), coordinator=watched)
        groups.append(g)
        return g

    yield coord, redis_client, namespace, group
    for g in groups:
        g.close(timeout=WAIT_S)


def still_member(coord: GroupCoordinator, watched: Watched, gen: Generation) -> None:
    """The generation is the member's first, and survives two more heartbeats."""
    assert gen.generation_id == 1, "the member was expired and joined again"
    beats = watched.beats
    wait_until(lambda: watched.beats >= beats + 2 or gen.done.is_set())
    assert not gen.done.is_set() and not gen.lost
    described = coord.describe_group("g")
    assert described.state == "Stable"
    assert [m.member_id for m in described.members] == [gen.member_id]


def test_a_leader_whose_assignor_outlasts_the_session_keeps_its_place(setup: Any) -> None:
    """The coordinator counts the leader's session from the join's completion; the leader
    did not heartbeat while it ran its assignor, so an assignment slower than the session
    timeout had it removed, and its SyncGroup answered UNKNOWN_MEMBER_ID (a new member
    joined again, with every rebalance the same)."""
    coord, client, namespace, group = setup
    watched = Watched(client, namespace, slow_fetch=False)
    g = group(watched, assignors=[SlowRange()])
    g.start()
    gen = g.next(timeout=WAIT_S)
    assert gen.partitions == [TP("t", 0), TP("t", 1)]
    still_member(coord, watched, gen)


def test_a_member_whose_start_offsets_outlast_the_session_keeps_its_place(setup: Any) -> None:
    """After SyncGroup the member is Stable and its session counts, as Kafka's, whose
    heartbeat thread beats while the consumer fetches its committed offsets. The worker read
    its start offsets before its generation's heartbeat thread started, so reads slower than
    the session timeout had it removed, and the generation was lost as soon as it began."""
    coord, client, namespace, group = setup
    watched = Watched(client, namespace, slow_fetch=True)
    g = group(watched)
    g.start()
    gen = g.next(timeout=WAIT_S)
    still_member(coord, watched, gen)


def test_a_heartbeat_that_says_the_leader_is_out_ends_the_round_without_sync_group() -> None:
    """A heartbeat answered UNKNOWN_MEMBER_ID while the leader assigns (its session ended, or
    it was removed) ends the round before SyncGroup, as Kafka's member resets its generation:
    the member forgets its id (ERROR_POLICY) and joins again."""
    from test_client_group import OneMemberGroup, fast_config

    state = OneMemberGroup()
    earlier = set(threading.enumerate())  # (another test's group "g" may still be ending)

    class Answered(RangeAssignor):
        def assign(self, *args: Any, **kwargs: Any) -> Any:
            if state.generation == 1:
                with state.lock:
                    state.heartbeat_answers.append(Errors.UNKNOWN_MEMBER_ID)
                # Until the beats stop, having taken the answer (they stop at such a code).
                wait_until(lambda: not state.heartbeat_answers and not any(
                    t.name.endswith("-gen1-joinbeat") and t not in earlier
                    for t in threading.enumerate()))
            return super().assign(*args, **kwargs)

    group = ConsumerGroup(fast_config(assignors=[Answered()]),
                          coordinator=state.fake)  # type: ignore[arg-type]
    try:
        gen = group.next(timeout=WAIT_S)
        assert gen.generation_id == 2 and gen.member_id == state.id(2)
        assert state.joins == ["", ""]
        assert ("sync", 1) not in state.events and ("sync", 2) in state.events
    finally:
        group.close(timeout=WAIT_S)
