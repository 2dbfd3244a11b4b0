"""Review 75: the worker-side ConsumerGroup / Generation lifecycle against kafka-go and Kafka.

Each test reproduces one defect found in the review, against a real server (one node: the
defects are in the client). Every wait is on a condition, bounded by ``wait_until``.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from harness import wait_until

from rcoord import GroupCoordinator
from rcoord.client import ConsumerGroup, ConsumerGroupConfig, EndReason
from rcoord.client.coordinator import RedisCoordinator
from rcoord.topics import Topics

WAIT_S = 15.0
REBALANCE_MS = 2000
SESSION_MS = 1000


@pytest.fixture
def backend() -> str:
    return "single"


@pytest.fixture
def coord(make_coordinator: Any) -> GroupCoordinator:
    return make_coordinator()  # type: ignore[no-any-return]


@pytest.fixture
def topics(redis_client: Any, namespace: str) -> Topics:
    return Topics(redis_client, namespace)


@pytest.fixture
def stuck() -> Iterator[threading.Event]:
    """Released at the end, so the routine that ignored ctx.done returns and its group closes."""
    release = threading.Event()
    yield release
    release.set()


@pytest.fixture
def group(redis_client: Any, namespace: str, stuck: threading.Event) -> Iterator[ConsumerGroup]:
    g = ConsumerGroup(_config(redis_client, namespace))
    yield g
    stuck.set()
    g.close(timeout=WAIT_S)


def _config(redis_client: Any, namespace: str) -> ConsumerGroupConfig:
    return ConsumerGroupConfig(
        redis_client=redis_client, namespace=namespace, group_id="g", topics=["t"],
        heartbeat_interval_ms=50, session_timeout_ms=SESSION_MS,
        rebalance_timeout_ms=REBALANCE_MS, partition_watch_interval_ms=50,
        retry_backoff_ms=10, retry_backoff_max_ms=100)


def _members(coord: GroupCoordinator) -> list[str]:
    return [m.member_id for m in coord.describe_group("g").members]


# The module docstring of rcoord.client.group says "The rebalance timeout still bounds the
# revocation: a member that has not rejoined by then is removed by the coordinator". That holds
# only when the coordinator is rebalancing. A generation that ends on the member's side alone
# (the leader's watcher sees new partitions, a routine raises, resubscribe(), close()) leaves the
# coordinator Stable: the heartbeat, which beats until the routines have returned, is answered
# NONE for ever, so a routine that ignores ctx.done keeps the member (and its partitions) in the
# group for ever, and the group never rebalances. kafka-go stops the heartbeat as soon as the
# generation ends (its session expires); Kafka's heartbeat thread sends LeaveGroup once
# max.poll.interval.ms (the rebalance timeout) passes without the application coming back.


def test_a_routine_that_ignores_done_after_new_partitions_does_not_hold_the_group_for_ever(
    group: ConsumerGroup, coord: GroupCoordinator, topics: Topics, stuck: threading.Event
) -> None:
    topics.create("t", 2)
    gen = group.next(timeout=WAIT_S)
    gen.start(lambda ctx: stuck.wait())  # ignores ctx.done
    topics.add_partitions("t", 4)
    assert gen.done.wait(WAIT_S)
    assert gen.end_reason is EndReason.PARTITIONS_CHANGED
    # Removed (or left) once the rebalance timeout has passed; a margin of seconds on top.
    wait_until(lambda: gen.member_id not in _members(coord),
               timeout_s=REBALANCE_MS / 1000 + SESSION_MS / 1000 + 10)


def test_close_with_a_routine_that_ignores_done_does_not_keep_the_member_for_ever(
    group: ConsumerGroup, coord: GroupCoordinator, topics: Topics, stuck: threading.Event
) -> None:
    topics.create("t", 2)
    gen = group.next(timeout=WAIT_S)
    gen.start(lambda ctx: stuck.wait())  # ignores ctx.done
    group.close(timeout=0.2)  # gives up waiting for the routine
    assert gen.done.is_set() and group.closed
    wait_until(lambda: gen.member_id not in _members(coord),
               timeout_s=REBALANCE_MS / 1000 + SESSION_MS / 1000 + 10)


class StallingHeartbeats(RedisCoordinator):
    """A coordinator whose heartbeat calls, while ``stall`` is on, hang until ``release``: a
    heartbeat thread paused (GC) or its call stuck on a black-holed connection, while the
    member's other calls, on other connections, are answered."""

    def __init__(self, client: Any, namespace: str) -> None:
        super().__init__(client, namespace)
        self.stall = False
        self.stalled = threading.Event()
        self.release = threading.Event()

    def heartbeat(self, group_id: str, generation_id: int, member_id: str,
                  group_instance_id: str | None = None) -> Any:
        if self.stall:
            self.stalled.set()
            self.release.wait()
        return super().heartbeat(group_id, generation_id, member_id, group_instance_id)


# watch_session ends the generation with its partitions lost once no heartbeat has been
# answered for a session timeout, and the routines return; but Generation.collect then joins
# the heartbeat thread without a bound (generation.py, ``for thread in helpers:
# thread.join()``), and the heartbeat's own retries (``_retry_until_finished``) go on for a
# session timeout after the call in flight returns. So the member, whose generation is already
# over and whose routines have all returned, cannot rejoin until a call it no longer needs
# comes back: with a redis_client made without socket_timeout (redis-py's default), never.
# Kafka's heartbeat thread is never joined by a rebalance; kafka-go bounds each heartbeat by
# its connection's deadline and stops the heartbeat when the generation ends.


def test_a_heartbeat_stuck_in_a_call_does_not_hold_back_the_rejoin(
    redis_client: Any, namespace: str, coord: GroupCoordinator, topics: Topics
) -> None:
    topics.create("t", 2)
    stalling = StallingHeartbeats(redis_client, namespace)
    stalling.start()
    config = dataclasses.replace(_config(redis_client, namespace), join_backoff_ms=100)
    group = ConsumerGroup(config, coordinator=stalling)
    try:
        gen = group.next(timeout=WAIT_S)
        returned = threading.Event()
        gen.start(lambda ctx: (ctx.done.wait(), returned.set()))  # returns at the end
        stalling.stall = True
        assert stalling.stalled.wait(WAIT_S)
        assert gen.done.wait(WAIT_S) and gen.lost  # watch_session: the session passed
        stalling.stall = False  # only the call in flight stays stuck
        assert returned.wait(WAIT_S)
        assert gen.wait_routines(WAIT_S)  # collect saw them return; now it joins the helpers
        # (newest, not next(): next() first reports the lost session's error once)
        wait_until(lambda: (new := group.newest()) is not None
                   and new.generation_id > gen.generation_id,
                   timeout_s=SESSION_MS / 1000 + 10)
    finally:
        stalling.release.set()
        group.close(timeout=WAIT_S)
