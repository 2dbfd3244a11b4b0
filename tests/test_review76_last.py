"""Review 76: reproductions of defects left by the last session's commits.

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

from rcoord.client import ConsumerGroup, ConsumerGroupConfig, EndReason
from rcoord.topics import Topics

# b53d33c leaves a lost generation's helpers behind, so a heartbeat stuck in a call no longer
# holds back the rejoin. But only a *lost* generation's: one that ended on the member's side
# (resubscribe(), new partitions, a routine that raised, close()) while its heartbeat was stuck
# is not lost, and watch_session, the only thing that would mark it lost, stops as soon as the
# generation ends (heartbeat.watch_session: ``if gen.done.wait(left): return``). So
# Generation.collect still joins the stuck heartbeat without a bound (``for thread in helpers:
# thread.join()``): the member, its routines returned, cannot rejoin until a call it no longer
# needs returns (never, on a client without socket_timeout), and close() without a timeout
# waits as long. Kafka's heartbeat thread is never joined by a rebalance.


def test_a_heartbeat_stuck_in_a_call_does_not_hold_back_the_rejoin_after_a_member_side_end(
    redis_client: Any, namespace: str, make_coordinator: Any
) -> None:
    make_coordinator()  # the namespace's settings (short sessions allowed)
    topics = Topics(redis_client, namespace)
    topics.create("t", 2)
    topics.create("u", 1)
    stalling = StallingHeartbeats(redis_client, namespace)
    stalling.start()
    group = ConsumerGroup(ConsumerGroupConfig(
        redis_client=redis_client, namespace=namespace, group_id="g", topics=["t"],
        heartbeat_interval_ms=50, session_timeout_ms=SESSION_MS,
        rebalance_timeout_ms=REBALANCE_MS, retry_backoff_ms=10, retry_backoff_max_ms=100,
        join_backoff_ms=100), coordinator=stalling)
    try:
        gen = group.next(timeout=WAIT_S)
        returned = threading.Event()
        gen.start(lambda ctx: (ctx.done.wait(), returned.set()))  # returns at the end
        stalling.stall = True
        assert stalling.stalled.wait(WAIT_S)  # the heartbeat's call is stuck
        stalling.stall = False  # only the call in flight stays stuck
        group.resubscribe(["t", "u"])  # ends the generation on the member's side
        assert gen.done.wait(WAIT_S)
        assert gen.end_reason is EndReason.SUBSCRIPTION_CHANGED
        assert returned.wait(WAIT_S)
        assert gen.wait_routines(WAIT_S)  # collect saw them return; now it joins the helpers
        # The member's session on the coordinator passes meanwhile (nothing beats): it
        # rejoins (UNKNOWN_MEMBER_ID, then a new id) within a session and some seconds.
        wait_until(lambda: (new := group.newest()) is not None
                   and new.generation_id > gen.generation_id,
                   timeout_s=SESSION_MS / 1000 + REBALANCE_MS / 1000 + 10)
    finally:
        stalling.release.set()
        group.close(timeout=WAIT_S)
