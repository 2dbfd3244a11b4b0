"""A generation's stuck threads: a routine that ignores ``ctx.done`` (the member gives its
partitions up after the rebalance timeout, ``ConsumerGroup._leave_stuck``, and the routine's late
commit is refused), and a heartbeat stuck in a call (the member rejoins without it, and its late
answer acts on nothing, ``heartbeat._abandoned``).

Against a real server (one node). Every wait is on a condition, bounded by ``wait_until``.
"""

from __future__ import annotations

import threading
from typing import Any

from harness import wait_until
from test_review75_group_client import (  # (one node, as there)
    REBALANCE_MS,
    SESSION_MS,
    WAIT_S,
    StallingHeartbeats,
    backend,  # noqa: F401 - the fixture
)

from rcoord import GroupCoordinator, TopicPartition
from rcoord.client import CommitFailedError, ConsumerGroup, ConsumerGroupConfig, EndReason
from rcoord.client.generation import GenerationContext
from rcoord.topics import Topics


def test_a_static_member_whose_routine_ignores_done_stops_beating_and_its_commit_is_refused(
    redis_client: Any, namespace: str, make_coordinator: Any
) -> None:
    coord: GroupCoordinator = make_coordinator()
    Topics(redis_client, namespace).create("t", 2)
    group = ConsumerGroup(ConsumerGroupConfig(
        redis_client=redis_client, namespace=namespace, group_id="g", topics=["t"],
        group_instance_id="i1", heartbeat_interval_ms=50, session_timeout_ms=SESSION_MS,
        rebalance_timeout_ms=REBALANCE_MS, retry_backoff_ms=10, retry_backoff_max_ms=100))
    release = threading.Event()
    refused: list[BaseException] = []

    def stuck(ctx: GenerationContext) -> None:
        release.wait()  # ignores ctx.done
        try:
            ctx.generation.commit_offsets({TopicPartition("t", 0): 1})
        except CommitFailedError as exc:
            refused.append(exc)

    try:
        gen = group.next(timeout=WAIT_S)
        gen.start(stuck)
        group.resubscribe(["t", "u"])  # ends the generation on the member's side alone
        assert gen.done.wait(WAIT_S)
        assert gen.end_reason is EndReason.SUBSCRIPTION_CHANGED
        # A rebalance timeout later the generation is lost; the static member sends no
        # LeaveGroup, so the coordinator removes it when its session, no longer refreshed, ends.
        wait_until(lambda: gen.lost, timeout_s=REBALANCE_MS / 1000 + 10)
        wait_until(lambda: not coord.describe_group("g").members,
                   timeout_s=SESSION_MS / 1000 + 10)
        release.set()
        wait_until(lambda: bool(refused), timeout_s=WAIT_S)
        tp = TopicPartition("t", 0)
        assert coord.fetch_offsets("g", [tp]).offsets[tp].offset == -1  # nothing committed
    finally:
        release.set()
        group.close(timeout=WAIT_S)


def test_a_late_answer_of_a_lost_generations_heartbeat_leaves_the_next_one_alone(
    redis_client: Any, namespace: str, make_coordinator: Any
) -> None:
    make_coordinator()  # the namespace's settings (short sessions allowed)
    Topics(redis_client, namespace).create("t", 2)
    stalling = StallingHeartbeats(redis_client, namespace)
    stalling.start()
    group = ConsumerGroup(ConsumerGroupConfig(
        redis_client=redis_client, namespace=namespace, group_id="g", topics=["t"],
        heartbeat_interval_ms=50, session_timeout_ms=SESSION_MS,
        rebalance_timeout_ms=REBALANCE_MS, retry_backoff_ms=10, retry_backoff_max_ms=100,
        join_backoff_ms=100), coordinator=stalling)
    try:
        old = group.next(timeout=WAIT_S)
        stalling.stall = True
        assert stalling.stalled.wait(WAIT_S)
        assert old.done.wait(WAIT_S) and old.lost  # watch_session: the session passed
        stalling.stall = False  # only the call in flight stays stuck
        wait_until(lambda: (new := group.newest()) is not None and new is not old,
                   timeout_s=SESSION_MS / 1000 + 10)
        new = group.newest()
        assert new is not None
        beat = next(t for t in threading.enumerate()
                    if t.name == f"rcoord-g-gen{old.generation_id}-heartbeat")
        reason, error = old.end_reason, old.end_error
        stalling.release.set()  # the old heartbeat's call is answered now, late
        beat.join(WAIT_S)
        assert not beat.is_alive()
        assert not new.done.is_set() and not new.lost
        assert (old.end_reason, old.end_error) == (reason, error)
    finally:
        stalling.release.set()
        group.close(timeout=WAIT_S)
