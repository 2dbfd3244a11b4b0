"""A generation that ended without being lost: its heartbeat stuck in a call does not hold back
the rejoin (``Generation.collect`` waits for it no longer than the session, then the generation
is lost and its helpers are left behind), and a leader's assignor that gives a partition that
does not exist, or partitions to an id that is no member, is refused before anything is synced.

Against a real server (one node). Every wait is on a condition, bounded by ``wait_until``.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

import pytest
from harness import wait_until
from test_review75_group_client import (  # (one node, as there)
    WAIT_S,
    StallingHeartbeats,
    _config,
    backend,  # noqa: F401 - the fixture
)

from rcoord import TopicPartition
from rcoord.assignors import RebalanceProtocol
from rcoord.client import ConsumerGroup, EndReason, InvalidAssignmentError
from rcoord.client.generation import Generation, GenerationContext
from rcoord.topics import Topics

# The generation ends on the member's side (the leader's watcher sees new partitions), so the
# session watcher stops, and the heartbeat, which beats until the routines have returned, then
# sticks in a call. collect joined it without a bound: the member, its routines all returned,
# could not rejoin until that call came back (never, with a client without socket_timeout).


def rejoined_past_a_stuck_heartbeat(group: ConsumerGroup, topics: Topics,
                                    stalling: StallingHeartbeats, timeout_s: float,
                                    ) -> tuple[Generation, Generation]:
    """(the generation, the next one) once ``group``, on ``stalling``, has rejoined after its
    generation ended on the member's side (topic "t" grown to 4 partitions) and its heartbeat
    stuck in a call as the generation's one routine returned."""

    def revoking(ctx: GenerationContext) -> None:
        ctx.done.wait()
        stalling.stalled.wait()  # returns once the heartbeat is stuck

    old = group.next(timeout=WAIT_S)
    old.start(revoking)
    topics.add_partitions("t", 4)
    assert old.done.wait(WAIT_S)
    assert old.end_reason is EndReason.PARTITIONS_CHANGED and not old.lost
    stalling.stall = True  # the next beat sticks; the routine returns then
    assert stalling.stalled.wait(WAIT_S)
    stalling.stall = False  # only the call in flight stays stuck
    assert old.wait_routines(WAIT_S)
    wait_until(lambda: (new := group.newest()) is not None and new is not old,
               timeout_s=timeout_s)
    new = group.newest()
    assert new is not None
    return old, new


def test_a_heartbeat_stuck_after_a_member_side_end_does_not_hold_back_the_rejoin(
    redis_client: Any, namespace: str, make_coordinator: Any
) -> None:
    make_coordinator()  # the namespace's settings (short sessions allowed)
    topics = Topics(redis_client, namespace)
    topics.create("t", 2)
    stalling = StallingHeartbeats(redis_client, namespace)
    stalling.start()
    config = dataclasses.replace(_config(redis_client, namespace), join_backoff_ms=100)
    group = ConsumerGroup(config, coordinator=stalling)

    try:
        old, new = rejoined_past_a_stuck_heartbeat(group, topics, stalling, WAIT_S)
        # Not waited for (a heartbeat interval at most): not lost either, as Kafka's rebalance
        # never waits for a heartbeat in flight.
        assert old.left_behind and not old.lost
        beat = next(t for t in threading.enumerate()
                    if t.name == f"rcoord-g-gen{old.generation_id}-heartbeat")
        reason = old.end_reason
        stalling.release.set()  # the old heartbeat's call is answered now, late
        beat.join(WAIT_S)
        assert not beat.is_alive()
        assert not new.done.is_set() and not new.lost
        assert old.end_reason is reason
    finally:
        stalling.release.set()
        group.close(timeout=WAIT_S)


# The leader synced whatever a custom assignor returned: a partition that does not exist (the
# member started it at 0), or partitions given to an id that is no member (no one consumed
# them, silently). A topic no member subscribes to is let through, as Kafka's leader does; the
# Consumer refuses it and rejoins (test_consumer_review69c).


class _Giving:
    """A custom assignor: range's plan, plus ``extra`` given to ``to`` (the only member when
    None)."""

    name = "giving"
    supported_protocols = (RebalanceProtocol.EAGER,)

    def __init__(self, extra: list[TopicPartition], to: str | None = None) -> None:
        self.extra = extra
        self.to = to

    def assign(self, members: Any, partitions_per_topic: Any, **kw: Any) -> Any:
        plan = {mid: [TopicPartition(t, p) for t in sorted(sub.topics)
                      for p in range(partitions_per_topic.get(t, 0))]
                for mid, sub in members.items()}
        to = self.to if self.to is not None else next(iter(members))
        plan.setdefault(to, []).extend(self.extra)
        return plan


@pytest.mark.parametrize(("extra", "to", "said"), [
    ([TopicPartition("t", 2)], None, r"t-2 .* has 2 partitions"),
    ([TopicPartition("t", -1)], None, r"t--1 .* has 2 partitions"),
    ([TopicPartition("t", 0)], "ghost", r"'ghost', which is not a member"),
])
def test_a_leaders_assignor_that_gives_what_no_member_can_consume_is_refused(
    redis_client: Any, namespace: str, make_coordinator: Any,
    extra: list[TopicPartition], to: str | None, said: str
) -> None:
    make_coordinator()
    topics = Topics(redis_client, namespace)
    topics.create("t", 2)
    config = dataclasses.replace(_config(redis_client, namespace), assignors=[_Giving(extra, to)],
                                 join_backoff_ms=100)
    group = ConsumerGroup(config)
    try:
        with pytest.raises(InvalidAssignmentError, match=f"'giving'.*{said}") as raised:
            group.next(timeout=WAIT_S)
        assert raised.value.partitions == extra
        assert group.newest() is None  # nothing was synced, so no generation was handed out
    finally:
        group.close(timeout=WAIT_S)


# A topic outside the member's subscription passes the leader (as in Kafka); Consumer leaves it
# out and rejoins, but a ConsumerGroup handed the generation out whole, and its routines
# consumed a topic the member never subscribed to (one another application may own).


def test_a_group_member_given_a_topic_it_does_not_subscribe_to_refuses_the_generation(
    redis_client: Any, namespace: str, make_coordinator: Any
) -> None:
    make_coordinator()
    topics = Topics(redis_client, namespace)
    topics.create("t", 2)
    topics.create("u", 2)  # exists, but no member subscribes to it
    foreign = [TopicPartition("u", 0)]
    config = dataclasses.replace(_config(redis_client, namespace),
                                 assignors=[_Giving(foreign)], join_backoff_ms=100)
    group = ConsumerGroup(config)
    try:
        with pytest.raises(InvalidAssignmentError,
                           match=r"'giving' gave topic 'u' \(u-0\) to member '.+', which does "
                                 r"not subscribe to it") as raised:
            group.next(timeout=WAIT_S)
        assert raised.value.partitions == foreign and raised.value.member_id
    finally:
        group.close(timeout=WAIT_S)
