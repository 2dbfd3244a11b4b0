"""Review 69c: what a cooperative consumer does with an assignment its subscription does not
take (987d483's filter in ``Consumer._transition``), and a changed subscription's revocation
after the generation ended whose callback raised (a2d26ad's ``_unsubscribed_commit``)."""

from __future__ import annotations

from typing import Any

from harness import wait_until
from test_consumer import env  # noqa: F401 - env: the fixture

from rcoord import TopicPartition
from rcoord.assignors import CooperativeStickyAssignor

FOREIGN = TopicPartition("u", 0)


class _Foreign(CooperativeStickyAssignor):
    """cooperative-sticky, which once ``armed`` also gives u-0, a topic no member subscribes
    to, to the first member: as a custom or foreign leader's assignor may."""

    def __init__(self) -> None:
        self.armed = False

    def assign(self, *args: Any, **kwargs: Any) -> Any:
        result = super().assign(*args, **kwargs)
        if self.armed:
            self.armed = False
            result[min(result)].append(FOREIGN)
        return result


def test_an_assignment_of_a_topic_not_subscribed_is_answered_with_a_rejoin(
        env: Any) -> None:  # noqa: F811 - the fixture
    """The leader assigns u-0 to a consumer of t alone, no subscription change pending. The
    move left it out (987d483) and asked for nothing more: nobody consumed u-0 until some
    other rebalance. As Kafka's onJoinComplete ("received assignment does not match the
    current subscription"), the member rejoins, and the next generation assigns it anew."""
    env.topics.create("t", 2)
    env.topics.create("u", 1)
    assignor = _Foreign()
    consumer = env.consumer(assignors=[assignor])
    wait_until(lambda: len(consumer.assignment()) == 2, step=lambda: consumer.poll(timeout=0.05))
    first = consumer.generation
    assert first is not None
    assignor.armed = True
    first.request_rejoin()
    wait_until(lambda: consumer.generation is not first, step=lambda: consumer.poll(timeout=0.05))
    foreign = consumer.generation
    assert foreign is not None and FOREIGN in foreign.offsets
    assert FOREIGN not in consumer.assignment()
    wait_until(lambda: consumer.generation is not foreign,
               step=lambda: consumer.poll(timeout=0.05))
    later = consumer.generation
    assert later is not None and FOREIGN not in later.offsets
    assert FOREIGN not in consumer.assignment() and len(consumer.assignment()) == 2

