"""A routine or helper thread that cannot be started (the process is at its thread limit:
a container's pids.max, ulimit -u) must not kill the group's run thread.

``Generation.start`` recorded the thread before starting it, so when ``Thread.start`` raised
"can't start new thread" the generation kept a thread that never ran, and collecting the
generation's routines at its end joined it: ``RuntimeError: cannot join thread before it is
started`` on the run thread, which then stopped, and ``next()`` said only that the group was
closed. The same held for a helper (the heartbeat, the watchers).
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from harness import wait_until
from test_client_group import (  # noqa: F401 - the fixture
    WAIT_S,
    OneMemberGroup,
    fake_group,
    fast_config,
)
from test_consumer import fake_consumer  # noqa: F401 - the fixture
from test_consumer_callbacks import Scripted

from rcoord import Errors
from rcoord.client import Consumer, ConsumerGroup, EndReason
from rcoord.spark.member import StreamMember


def _refusing_start(monkeypatch: pytest.MonkeyPatch, refuse: Any) -> None:
    """Make ``Thread.start`` raise as at the process's thread limit for threads ``refuse``
    picks by name."""
    original = threading.Thread.start

    def start(self: threading.Thread) -> None:
        if refuse(self.name):
            raise RuntimeError("can't start new thread")
        original(self)

    monkeypatch.setattr(threading.Thread, "start", start)


def _refuse_first_routine(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Refuse the start of the first routine thread only; the event is set once it was."""
    refused = threading.Event()

    def refuse(name: str) -> bool:
        if "routine" in name and not refused.is_set():
            refused.set()
            return True
        return False

    _refusing_start(monkeypatch, refuse)
    return refused


def _poller(consumer: Any, got: list[Any], raised: list[BaseException]) -> Any:
    """One poll() of ``consumer``: its records into ``got``, a RuntimeError into ``raised``."""

    def step() -> None:
        try:
            got.extend(consumer.poll(timeout=0.05))
        except RuntimeError as exc:
            raised.append(exc)

    return step


def test_a_routine_that_cannot_start_leaves_the_group_running(
    fake_group: Any, monkeypatch: pytest.MonkeyPatch,  # noqa: F811 - the fixture
) -> None:
    state = OneMemberGroup()
    group = fake_group(state)
    gen = group.next(timeout=WAIT_S)
    _refusing_start(monkeypatch, lambda name: "routine" in name)
    with pytest.raises(RuntimeError, match="can't start new thread"):
        gen.start(lambda ctx: None)  # the caller hears of it
    monkeypatch.undo()
    gen._end(EndReason.REBALANCE)
    nxt = group.next(timeout=WAIT_S)  # the run thread collected the generation and rejoined
    assert nxt.generation_id == gen.generation_id + 1


def test_a_helper_that_cannot_start_ends_its_generation_and_the_group_rejoins(
    fake_group: Any, monkeypatch: pytest.MonkeyPatch,  # noqa: F811 - the fixture
) -> None:
    state = OneMemberGroup()
    group = fake_group(state)
    refused = threading.Event()

    def refuse(name: str) -> bool:
        if name.endswith("-heartbeat") and not refused.is_set():
            refused.set()
            return True
        return False

    _refusing_start(monkeypatch, refuse)
    # Without its heartbeat the generation cannot keep its session: it ends before it is
    # handed out, the error is reported once, and the member leaves and joins again.
    with pytest.raises(RuntimeError, match="can't start new thread"):
        group.next(timeout=WAIT_S)
    assert refused.is_set() and state.leaves == [state.id(1)]
    nxt = group.next(timeout=WAIT_S)
    assert nxt.generation_id == 2 and not nxt.done.is_set()


def test_a_consumer_whose_hold_cannot_start_leaves_and_joins_again(
    fake_consumer: Any, monkeypatch: pytest.MonkeyPatch,  # noqa: F811 - the fixture
) -> None:
    """``Consumer`` holds each generation with a routine (``Generation.start``). When that
    thread could not start, the RuntimeError left poll() with the generation taken from the
    group but held by no one: it stayed live (its heartbeat beat on), every later poll()
    waited for a next generation that never came and returned nothing, and the member kept
    its partitions unread. Now the generation ends with the error: poll() raises it once, the
    member leaves and joins again, and polling goes on."""
    state = OneMemberGroup(partitions=2, records=3)
    refused = _refuse_first_routine(monkeypatch)
    consumer = fake_consumer(state)
    got: list[Any] = []
    raised: list[BaseException] = []
    step = _poller(consumer, got, raised)
    wait_until(lambda: len(got) == 6, step)
    assert refused.is_set() and [str(e) for e in raised] == ["can't start new thread"]
    assert state.leaves == [state.id(1)]  # it left, and joined again as a new member
    assert consumer.generation is not None and consumer.generation.member_id == state.id(2)


def test_a_cooperative_consumer_whose_next_hold_cannot_start_leaves_and_joins_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same when the consumer moves to the next generation cooperatively (it keeps what
    it holds and takes the added partitions): the next generation was orphaned live, and the
    partitions it added were never read."""
    state = OneMemberGroup(partitions=2, records=3)
    cfg = fast_config(assignors=[Scripted([0], [0, 1])])
    consumer = Consumer(cfg, coordinator=state.fake, fetch_max_wait_ms=5,  # type: ignore[arg-type]
                        auto_commit_interval_ms=100_000)
    try:
        got: list[Any] = []
        raised: list[BaseException] = []
        step = _poller(consumer, got, raised)
        wait_until(lambda: len(got) == 3, step)  # t-0's records
        refused = _refuse_first_routine(monkeypatch)
        gen = consumer.generation
        assert gen is not None
        state.heartbeat_answers.append(Errors.REBALANCE_IN_PROGRESS)
        assert gen.done.wait(WAIT_S)
        wait_until(lambda: any(r.partition == 1 for r in got) and len(raised) == 1, step)
        assert refused.is_set() and [str(e) for e in raised] == ["can't start new thread"]
    finally:
        consumer.close(timeout=WAIT_S)


def test_a_stream_member_whose_hold_cannot_start_leaves_and_joins_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The Spark member (``StreamMember``) holds each generation with a routine too. When
    that thread could not start, the RuntimeError left ``initial()`` (or a plan) with the
    generation taken from the group and held by no one: it stayed live, its heartbeat beat on,
    and the next call waited for a generation after it that never came (TimeoutError). Now
    the generation ends with the error: it is raised once, the member leaves and joins again,
    and the next call gets the next generation."""
    state = OneMemberGroup(partitions=2)
    group = ConsumerGroup(fast_config(), coordinator=state.fake)  # type: ignore[arg-type]
    member = StreamMember(group, rejoin_wait_s=0.05)
    refused = _refuse_first_routine(monkeypatch)
    try:
        with pytest.raises(RuntimeError, match="can't start new thread"):
            member.initial(WAIT_S)
        assert refused.is_set()
        member.initial(WAIT_S)
        gen = member.generation
        assert gen is not None and gen.member_id == state.id(2) and not gen.done.is_set()
        assert state.leaves == [state.id(1)]  # it left, and joined again as a new member
    finally:
        member.close(WAIT_S)
