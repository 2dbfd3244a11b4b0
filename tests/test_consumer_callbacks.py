"""The rebalance listener's callbacks when they raise, against Kafka's ConsumerCoordinator.

On the function-field fake coordinator of test_client_group (deterministic): the member leads
its one-member group and runs a scripted cooperative assignor, so each generation's revoked
and added partitions are chosen by the test.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from harness import wait_until
from test_client_group import WAIT_S, OneMemberGroup, fast_config
from test_consumer import Recorder, _waits_in, poll_until

from rcoord import Errors, TopicPartition
from rcoord.assignors import RebalanceProtocol
from rcoord.client import Consumer, IllegalStateError, WakeupError

TP = TopicPartition


class Scripted:
    """A cooperative assignor that gives the one member the next plan of ``plans`` each
    rebalance (the last one from then on)."""

    name = "scripted"
    supported_protocols: tuple[RebalanceProtocol, ...] = (RebalanceProtocol.COOPERATIVE,)

    def __init__(self, *plans: list[int], eager: bool = False) -> None:
        self.plans = list(plans)
        self.calls = 0
        if eager:
            self.supported_protocols = (RebalanceProtocol.EAGER,)

    def assign(self, members: Any, partitions_per_topic: Any, **kw: Any) -> Any:
        plan = self.plans[min(self.calls, len(self.plans) - 1)]
        self.calls += 1
        return {m: [TP("t", p) for p in plan] for m in members}


@pytest.fixture
def make() -> Iterator[Any]:
    made: list[Consumer] = []

    def consumer(state: OneMemberGroup, listener: Any, *plans: list[int],
                 **kw: Any) -> Consumer:
        settings: dict[str, Any] = {"fetch_max_wait_ms": 5, "auto_commit_interval_ms": 100_000}
        settings.update(kw)
        cfg = fast_config(assignors=[Scripted(*plans, eager=settings.pop("eager", False))],
                          rebalance_timeout_ms=settings.pop("rebalance_timeout_ms", 5000),
                          group_id=settings.pop("group_id", "g"))
        c = Consumer(cfg, listener=listener, coordinator=state.fake, **settings)
        made.append(c)
        return c

    yield consumer
    for c in made:
        c.close(timeout=WAIT_S)


def _rebalance(state: OneMemberGroup, consumer: Consumer) -> None:
    """End the current generation (the heartbeat hears REBALANCE_IN_PROGRESS)."""
    gen = consumer.generation
    assert gen is not None
    state.heartbeat_answers.append(Errors.REBALANCE_IN_PROGRESS)
    assert gen.done.wait(WAIT_S)


class WokenOnce(Recorder):
    """Its first ``on_partitions_revoked`` raises ``WakeupError`` (as a ``commit()`` in it
    does when ``wakeup()`` ends its wait); ``seen`` notes ``assignment()`` in each callback."""

    def __init__(self) -> None:
        super().__init__()
        self.consumer_ref: Consumer | None = None
        self.woken = False
        self.seen: list[tuple[str, list[int]]] = []

    def _see(self, kind: str) -> None:
        assert self.consumer_ref is not None
        self.seen.append((kind, [tp.partition for tp in self.consumer_ref.assignment()]))

    def on_partitions_revoked(self, partitions: list[TopicPartition]) -> None:
        super().on_partitions_revoked(partitions)
        self._see("revoked")
        if not self.woken:
            self.woken = True
            raise WakeupError("commit() interrupted by wakeup()")

    def on_partitions_assigned(self, partitions: list[TopicPartition]) -> None:
        super().on_partitions_assigned(partitions)
        self._see("assigned")


def _assigned_once(make: Any, state: OneMemberGroup, listener: Any, first: list[int],
                   then: list[int], **kw: Any) -> Consumer:
    """A consumer made by ``make`` whose ``listener`` (which may call it) has heard of its
    first assignment."""
    consumer = make(state, listener, first, then, **kw)
    listener.consumer_ref = consumer
    wait_until(lambda: listener.kinds() == ["assigned"], lambda: consumer.poll(timeout=0.01))
    return consumer


def _woken_mid_transition(make: Any, state: OneMemberGroup, **kw: Any) -> tuple[Consumer,
                                                                                WokenOnce]:
    """A consumer holding t-0 and t-1 whose move to [t-1, t-2] a WakeupError of its
    revocation callback cut short."""
    listener = WokenOnce()
    consumer = _assigned_once(make, state, listener, [0, 1], [1, 2], **kw)
    _rebalance(state, consumer)
    with pytest.raises(WakeupError):
        while True:
            consumer.poll(timeout=0.05)
    return consumer, listener


def test_wakeup_in_cooperative_on_partitions_revoked_keeps_the_old_assignment(
    make: Any,
) -> None:
    """Kafka's onJoinComplete changes the assignment only after the revocation callback, and a
    WakeupException from it leaves the join future in place, so the next poll() runs the
    revocation again and then announces the added partitions. Before, the added partition was
    already assigned (assignment(), position(), seek()) with no on_partitions_assigned, and
    the revoked one was forgotten with its callback cut short (its commit never made)."""
    state = OneMemberGroup(partitions=3, records=2)
    consumer, listener = _woken_mid_transition(make, state)
    # Still what the application was told: t-0 and t-1, not t-2.
    assert listener.seen == [("assigned", [0, 1]), ("revoked", [0, 1])]
    assert consumer.assignment() == [TP("t", 0), TP("t", 1)]
    with pytest.raises(IllegalStateError):
        consumer.position(TP("t", 2))
    assert consumer.position(TP("t", 0)) >= 0
    consumer.commit({TP("t", 0): 1})  # still assigned: committed under the new generation
    assert state.committed[TP("t", 0)] == 1
    # The next poll() runs the revocation again, then the assignment; having given up t-0,
    # the member joins once more (Kafka's cooperative follow-up round), which adds nothing
    # but is announced all the same (onPartitionsAssigned is called with an empty set). The
    # wait is for that last one: the poll that announced t-2 could already have run it, as
    # it did under load (15 of 300 runs failed a wait that stopped at t-2).
    wait_until(lambda: len(listener.kinds()) >= 5, lambda: consumer.poll(timeout=0.01))
    assert listener.events[1:] == [("revoked", [TP("t", 0)]), ("revoked", [TP("t", 0)]),
                                   ("assigned", [TP("t", 2)]), ("assigned", [])]
    assert listener.seen[2:] == [("revoked", [0, 1]), ("assigned", [1, 2]),
                                 ("assigned", [1, 2])]
    assert consumer.assignment() == [TP("t", 1), TP("t", 2)]
    assert consumer.generation is not None and consumer.generation.acknowledged


def test_close_after_a_wakeup_in_the_revocation_revokes_what_the_listener_was_told(
    make: Any,
) -> None:
    """close() between the WakeupError and the next poll(): the listener hears the revocation
    of what it holds (t-0 and t-1; never t-2, it was not told of it), the final commit goes
    under the generation the member is in, and the hold on that generation is let go, so the
    group leaves at once (not after the rebalance timeout, here longer than WAIT_S)."""
    state = OneMemberGroup(partitions=3, records=2)
    consumer, listener = _woken_mid_transition(make, state, rebalance_timeout_ms=600_000)
    group = consumer.group
    joined = group.newest()
    assert joined is not None and joined.generation_id == 2
    consumer.close(timeout=WAIT_S)
    assert listener.events[1:] == [("revoked", [TP("t", 0)]),
                                   ("revoked", [TP("t", 0), TP("t", 1)])]
    assert joined.wait_routines(WAIT_S)
    wait_until(lambda: bool(state.leaves))
    assert state.committed == {TP("t", 0): 2, TP("t", 1): 2}


class Unsubscribing(Recorder):
    """Its ``on_partitions_revoked`` unsubscribes the consumer (``consumer_ref``)."""

    consumer_ref: Consumer | None = None

    def on_partitions_revoked(self, partitions: list[TopicPartition]) -> None:
        super().on_partitions_revoked(partitions)
        assert self.consumer_ref is not None
        self.consumer_ref.unsubscribe()


@pytest.mark.parametrize("protocol", ["eager", "cooperative"])
def test_unsubscribe_inside_on_partitions_revoked_leaves_at_once(
    make: Any, caplog: Any, protocol: str, namespace: str
) -> None:
    """unsubscribe() from inside the revocation callback of a rebalance: as close() from there,
    the member leaves at once and the partitions the running revocation does not give up (the
    cooperative kept ones) are committed. Before, the consumer's hold on the generation was
    never let go, so unsubscribe() waited for it to give up (rebalance_timeout_ms, a minute by
    default, logged); cooperatively the consumer then announced the added partitions to the
    unsubscribed listener and reported the kept ones lost, uncommitted."""
    caplog.set_level(logging.WARNING, logger="rcoord.client")
    state = OneMemberGroup(partitions=3, records=2)
    listener = Unsubscribing()
    # (a group id of its own: its routines' threads, rcoord-<group id>-..., which would log
    # the hold giving up, are told from another test's consumer's still running)
    consumer = make(state, listener, [0, 1], [1, 2], eager=protocol == "eager",
                    rebalance_timeout_ms=3000, group_id=namespace)
    listener.consumer_ref = consumer
    poll_until(consumer, lambda got: len(got) == 4)
    _rebalance(state, consumer)
    with pytest.raises(IllegalStateError, match="neither subscribed nor assigned"):
        while True:
            consumer.poll(timeout=0.05)
    revoked = [TP("t", 0), TP("t", 1)] if protocol == "eager" else [TP("t", 0)]
    assert listener.events[1:] == [("revoked", revoked)]
    assert consumer.assignment() == [] and consumer.generation is None
    assert state.committed == {TP("t", 0): 2, TP("t", 1): 2}
    assert state.leaves
    assert not [r for r in caplog.records if "rebalance timeout" in r.getMessage()
                and r.threadName.startswith(f"rcoord-{namespace}-")]


class ClosedFromElsewhere(Recorder):
    """Its ``on_partitions_revoked`` starts ``close()`` in another thread and returns once
    that close() waits for this poll() to finish."""

    consumer_ref: Consumer | None = None
    closer: threading.Thread | None = None

    def on_partitions_revoked(self, partitions: list[TopicPartition]) -> None:
        super().on_partitions_revoked(partitions)
        consumer = self.consumer_ref
        assert consumer is not None
        if self.closer is None:
            self.closer = threading.Thread(target=consumer.close, args=(WAIT_S,), daemon=True)
            self.closer.start()
            closer = self.closer
            wait_until(lambda: _waits_in(closer, "_close"))


def test_close_from_another_thread_during_a_cooperative_revocation_revokes_what_was_announced(
    make: Any,
) -> None:
    """close() from another thread while a cooperative on_partitions_revoked runs: the
    listener hears of the added partitions (on_partitions_assigned) before close() revokes
    them, as every revocation follows the assignment it ends. Before, the revocation skipped
    on_partitions_assigned once close() had begun, and close() then revoked the added
    partition the listener was never told of."""
    state = OneMemberGroup(partitions=3, records=2)
    listener = ClosedFromElsewhere()
    consumer = _assigned_once(make, state, listener, [0, 1], [1, 2])
    _rebalance(state, consumer)
    wait_until(lambda: listener.closer is not None, lambda: consumer.poll(timeout=0.01))
    assert listener.closer is not None
    listener.closer.join(WAIT_S)
    assert not listener.closer.is_alive()
    assert listener.events[1:] == [("revoked", [TP("t", 0)]), ("assigned", [TP("t", 2)]),
                                   ("revoked", [TP("t", 1), TP("t", 2)])]


def test_wakeup_in_the_revocation_of_a_new_subscription_revokes_again_before_the_rejoin(
    make: Any,
) -> None:
    """subscribe() to other topics, then poll(): a cooperative consumer revokes the partitions
    of topics no longer subscribed, then rejoins. When on_partitions_revoked raises
    WakeupError there, they stay assigned and the member keeps the old subscription until the
    next poll() has revoked them again (as Kafka, which revokes them again in onJoinComplete
    before anyone else may have them). Before, they were dropped with their callback cut
    short (its commit never made) and the rejoin no longer reported them, so another member
    could take them at once."""
    state = OneMemberGroup(partitions=3, records=2)
    state.counts["u"] = 1
    listener = WokenOnce()
    consumer = _assigned_once(make, state, listener, [0, 1], [], enable_auto_commit=False)
    gen = consumer.generation
    assert gen is not None
    consumer.subscribe(["u"])
    with pytest.raises(WakeupError):
        consumer.poll(timeout=0.05)
    assert consumer.assignment() == [TP("t", 0), TP("t", 1)]
    assert not gen.done.is_set()  # no rejoin with the new subscription yet
    consumer.commit({TP("t", 0): 1, TP("t", 1): 1})  # still theirs: accepted
    assert state.committed == {TP("t", 0): 1, TP("t", 1): 1}
    wait_until(lambda: gen.done.is_set(), lambda: consumer.poll(timeout=0.01))
    assert listener.events[1:3] == [("revoked", [TP("t", 0), TP("t", 1)])] * 2
    assert [tp for tp in consumer.assignment() if tp.topic == "t"] == []


class _CommitsAdded(Recorder):
    """A listener that commits 3 for t-1 when it is added, with ``how`` (a method's name)."""

    consumer_ref: Consumer | None = None

    def __init__(self, how: str) -> None:
        super().__init__()
        self.how = how

    def on_partitions_assigned(self, partitions: list[TP]) -> None:
        super().on_partitions_assigned(partitions)
        assert self.consumer_ref is not None
        if TP("t", 1) in partitions:
            getattr(self.consumer_ref, self.how)({TP("t", 1): 3})


def test_a_commit_in_on_partitions_assigned_sets_the_start_of_a_cooperatively_added_partition(
    make: Any,
) -> None:
    """Cooperative: the partitions a generation adds start where the listener committed
    (as in Kafka, which fetches their committed offsets after ``onJoinComplete``); the kept
    ones go on from their positions. Before, t-1 started at 0, the offset committed before the
    listener ran, and the listener's commit of 3 was undone by the next one."""
    state = OneMemberGroup(partitions=2, records=5)

    listener = _CommitsAdded("commit")
    consumer = _assigned_once(make, state, listener, [0], [0, 1])
    wait_until(lambda: consumer.position(TP("t", 0)) == 5, lambda: consumer.poll(timeout=0.01))
    _rebalance(state, consumer)
    got = poll_until(consumer, lambda g: bool(g) and g[-1].offset == 4)
    assert [(r.partition, r.offset) for r in got] == [(1, 3), (1, 4)]
    assert consumer.position(TP("t", 0)) == 5
    consumer.commit()
    assert state.committed[TP("t", 1)] == 5


def test_an_async_commit_of_an_added_partition_held_up_does_not_hold_the_kept_ones_records(
    make: Any,
) -> None:
    """The first fetch after ``on_partitions_assigned`` waits for the async commits it made of
    added partitions (they may set the start). While one is held up, each ``poll()`` waits
    for it until its timeout, then goes on with the kept partitions (t-0), as Kafka's poll()
    fetches the partitions with a position when its fetch of committed offsets timed out
    (before, it returned nothing until the commit was done); once it lands, t-1 starts
    there."""
    state = OneMemberGroup(partitions=2, records=50)
    release = threading.Event()
    commit = state.fake.commit_offsets

    def held(*args: Any, **kw: Any) -> Any:
        offsets = args[1] if len(args) > 1 else kw["offsets"]
        if TP("t", 1) in offsets:
            assert release.wait(WAIT_S)
        return commit(*args, **kw)

    state.fake.commit_offsets = held

    listener = _CommitsAdded("commit_async")
    try:
        consumer = _assigned_once(make, state, listener, [0], [0, 1], max_poll_records=2)
        _rebalance(state, consumer)
        wait_until(lambda: listener.kinds() == ["assigned", "assigned"],
                   lambda: consumer.poll(timeout=0.01))
        got = poll_until(consumer, lambda g: len(g) >= 6)  # t-1's commit held up meanwhile
        assert {r.partition for r in got} == {0}
    finally:
        release.set()
    got = poll_until(consumer, lambda g: any(r.partition == 1 for r in g))
    assert min(r.offset for r in got if r.partition == 1) == 3
