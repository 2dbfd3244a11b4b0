"""Review 69c: what a cooperative consumer does with an assignment its subscription does not
take (987d483's filter in ``Consumer._transition``), and a changed subscription's revocation
after the generation ended whose callback raised (a2d26ad's ``_unsubscribed_commit``)."""

from __future__ import annotations

from typing import Any

import pytest
from harness import wait_until
from test_consumer import Recorder, env  # noqa: F401 - env: the fixture
from test_consumer_review69b import _ended_then_changed

from rcoord import TopicPartition
from rcoord.assignors import CooperativeStickyAssignor, RangeAssignor

FOREIGN = TopicPartition("u", 0)


class _GivesForeign:
    """An assignor which, once ``armed``, also gives u-0, a topic no member subscribes to, to
    the first member: as a custom or foreign leader's assignor may."""

    armed = False

    def assign(self, *args: Any, **kwargs: Any) -> Any:
        result = super().assign(*args, **kwargs)  # type: ignore[misc]
        if self.armed:
            self.armed = False
            result[min(result)].append(FOREIGN)
        return result


class _Foreign(_GivesForeign, CooperativeStickyAssignor):
    """cooperative-sticky, giving u-0 once armed."""


class _ForeignRange(_GivesForeign, RangeAssignor):
    """range (eager), giving u-0 once armed."""


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


class _Failing(Recorder):
    """Its first on_partitions_revoked raises (the others, close()'s among them, do not)."""

    failed = False

    def on_partitions_revoked(self, partitions: list[TopicPartition]) -> None:
        super().on_partitions_revoked(partitions)
        if not self.failed:
            self.failed = True
            raise ValueError("the application's revocation failed")


def test_a_changed_subscription_whose_revocation_callback_raised_still_waits_for_its_commit(
        env: Any) -> None:  # noqa: F811 - the fixture
    """As review 69b's test, with on_partitions_revoked raising a ValueError: poll() raises
    it, as Kafka's listener exceptions propagate, but the change must still wait for the
    revocation's commit held in Redis. It was applied at once (the member rejoined with
    that commit in flight); it stays pending until the commit landed."""
    listener = _Failing()
    with _ended_then_changed(env, listener) as (consumer, group, held):
        with pytest.raises(ValueError, match="revocation failed"):
            consumer.poll(timeout=0.5)
        assert "revoked" in listener.kinds()
        assert (consumer._resubscribe is not None, set(group._config.topics)) == (
            True, {"t", "u"})
        assert consumer.poll(timeout=0) == []  # (still held: not applied)
        assert set(group._config.topics) == {"t", "u"}
        held.release()
        wait_until(lambda: consumer._resubscribe is None,
                   step=lambda: consumer.poll(timeout=0.05))
        assert set(group._config.topics) == {"u"}


@pytest.mark.parametrize("assignor", [_Foreign, _ForeignRange])
def test_a_first_generation_assigning_a_topic_not_subscribed_takes_none_of_it_and_rejoins(
        env: Any, assignor: type) -> None:  # noqa: F811 - the fixture
    """The same in the member's first generation (cooperative) and in an eager one: u-0 was
    consumed and announced in on_partitions_assigned, and no rejoin followed."""
    env.topics.create("t", 2)
    env.topics.create("u", 1)
    foreign = assignor()
    foreign.armed = True
    listener = Recorder()
    consumer = env.consumer(assignors=[foreign], listener=listener)

    def rejoined() -> bool:  # (generation 1 had u-0; the one after, asked for, has not)
        gen = consumer.generation
        return (not foreign.armed and gen is not None and gen.generation_id >= 2
                and FOREIGN not in gen.offsets and len(consumer.assignment()) == 2)

    wait_until(rejoined, step=lambda: consumer.poll(timeout=0.05))
    assert FOREIGN not in consumer.assignment()
    assert listener.events and all(FOREIGN not in parts for _, parts in listener.events)
