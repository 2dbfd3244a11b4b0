"""Review of the leader's check of its assignor's plan (b441b23, ``join.check_assignment``).

Against a real server (one node). Every wait is on a condition, bounded by ``WAIT_S``.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import pytest
from test_client_ended_generation import _Giving, rejoined_past_a_stuck_heartbeat
from test_review75_group_client import (  # (one node, as there)
    WAIT_S,
    StallingHeartbeats,
    _config,
    backend,  # noqa: F401 - the fixture
)

from rcoord import TopicPartition
from rcoord.client import ConsumerGroup, InvalidAssignmentError
from rcoord.topics import Topics

# A topic the group subscribes to that does not exist has no partitions at all, but the leader
# left it out of the check (partition_counts leaves unknown topics out, and the check looked
# only at topics with a count): the plan giving "gone-0" was synced, and the member was handed
# a partition that does not exist, which is what b441b23 refuses for "t-2" of a 2-partition t.


def test_a_partition_of_a_subscribed_topic_that_does_not_exist_is_refused(
    redis_client: Any, namespace: str, make_coordinator: Any
) -> None:
    make_coordinator()
    Topics(redis_client, namespace).create("t", 2)
    extra = [TopicPartition("gone", 0)]
    config = dataclasses.replace(_config(redis_client, namespace), topics=["t", "gone"],
                                 assignors=[_Giving(extra)], join_backoff_ms=100)
    group = ConsumerGroup(config)
    try:
        with pytest.raises(InvalidAssignmentError, match=r"'giving'.*gone-0") as raised:
            gen = group.next(timeout=WAIT_S)
            pytest.fail(f"handed out {gen.partitions}")
        assert raised.value.partitions == extra
    finally:
        group.close(timeout=WAIT_S)


class _Keyed:
    """A custom assignor whose plan names, besides every member, one more id of another type
    (bytes, or None): both no member."""

    name = "keyed"
    supported_protocols = _Giving.supported_protocols

    def __init__(self, stray: Any) -> None:
        self.stray = stray

    def assign(self, members: Any, partitions_per_topic: Any, **kw: Any) -> Any:
        plan: dict[Any, list[TopicPartition]] = {mid: [] for mid in members}
        plan[self.stray] = [TopicPartition("t", 0)]
        return plan


# check_assignment walks the plan in sorted(plan) order: a plan whose ids are not all str
# raised TypeError ("'<' not supported between ...") from the check itself, so next() reported
# the check's crash, not the id that is no member, the clear error it gives for a str id.


@pytest.mark.parametrize("stray", [b"ghost", None], ids=["bytes", "none"])
def test_a_plan_naming_an_id_of_another_type_is_refused_clearly(
    redis_client: Any, namespace: str, make_coordinator: Any, stray: Any
) -> None:
    make_coordinator()
    Topics(redis_client, namespace).create("t", 2)
    config = dataclasses.replace(_config(redis_client, namespace), assignors=[_Keyed(stray)],
                                 join_backoff_ms=100)
    group = ConsumerGroup(config)
    try:
        with pytest.raises(InvalidAssignmentError, match="which is not a member") as raised:
            group.next(timeout=WAIT_S)
        assert raised.value.partitions == [TopicPartition("t", 0)]
    finally:
        group.close(timeout=WAIT_S)


# c52573b: collect waits for a heartbeat stuck in a call (the rest of Redis answering) until the
# session since its last answered beat passes, then calls the generation lost. But the member
# stopped beating when its routines returned, and its rejoin, which would refresh the session
# (JoinGroup), is what collect holds back: the wait itself makes the session pass. A
# cooperative member whose generation ended on its side (new partitions) so gives up the
# partitions it would have carried, though nothing else failed. Kafka's rebalance never waits
# for its heartbeat thread's request in flight, and its member rejoins owning them.
# (A session of 10 s: a rejoin made at once has seconds of margin on a loaded machine.)


def test_a_heartbeat_stuck_after_a_member_side_end_does_not_cost_the_carried_partitions(
    redis_client: Any, namespace: str, make_coordinator: Any
) -> None:
    make_coordinator()
    topics = Topics(redis_client, namespace)
    topics.create("t", 2)
    stalling = StallingHeartbeats(redis_client, namespace)
    stalling.start()
    config = dataclasses.replace(_config(redis_client, namespace), join_backoff_ms=100,
                                 session_timeout_ms=10_000, rebalance_timeout_ms=20_000,
                                 assignors=["cooperative-sticky"])
    group = ConsumerGroup(config, coordinator=stalling)

    try:
        old, new = rejoined_past_a_stuck_heartbeat(group, topics, stalling, WAIT_S + 10)
        assert old.partitions == [TopicPartition("t", 0), TopicPartition("t", 1)]
        assert not old.lost, "the carried partitions were given up: " + repr(old.end_error)
        assert new.owned_before == old.partitions
    finally:
        stalling.release.set()
        group.close(timeout=WAIT_S)


# 98b730b: unsubscribed_error checks a ConsumerGroup's partitions against the topics its
# pattern matched when it joined (``gen.watched_matched``), not against the pattern. A topic
# made since, which the leader's view already takes, is refused: next() raises
# InvalidAssignmentError, and the member leaves and backs off. Kafka's member checks the
# pattern (``SubscriptionState.checkAssignmentMatchedSubscription``: ``subscribedPattern.
# matcher(topic).matches()``), and so does rcoord's Consumer (``subscription._subscribes``):
# both take such a generation. Here the leader's assignor (this member) makes "p-b" between the
# member's listing and the assignment, the leader's view of a topic the member had not seen.


class _Making(_Giving):
    """``_Giving``, which first makes the topic of its extra partitions (once)."""

    def __init__(self, topics: Topics, extra: list[TopicPartition]) -> None:
        super().__init__(extra)
        self.topics = topics

    def assign(self, members: Any, partitions_per_topic: Any, **kw: Any) -> Any:
        for topic in {tp.topic for tp in self.extra}:
            if topic not in self.topics.list():
                self.topics.create(topic, 1)
        return super().assign(members, partitions_per_topic, **kw)


def test_a_pattern_member_takes_a_topic_its_pattern_matches_made_since_it_joined(
    redis_client: Any, namespace: str, make_coordinator: Any
) -> None:
    make_coordinator()
    topics = Topics(redis_client, namespace)
    topics.create("p-a", 1)
    extra = [TopicPartition("p-b", 0)]
    config = dataclasses.replace(_config(redis_client, namespace), topics=[],
                                 topic_pattern=re.compile(r"p-.*"),
                                 assignors=[_Making(topics, extra)], join_backoff_ms=100)
    group = ConsumerGroup(config)
    try:
        gen = group.next(timeout=WAIT_S)  # raised InvalidAssignmentError
        assert gen.partitions == [TopicPartition("p-a", 0), TopicPartition("p-b", 0)]
    finally:
        group.close(timeout=WAIT_S)
