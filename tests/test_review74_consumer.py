"""Review 74: the Consumer's modes against KafkaConsumer (ClassicKafkaConsumer,
ConsumerCoordinator, SubscriptionState).

Each test reproduces one defect found, on a real server (the ``env`` fixture of
test_consumer)."""

from __future__ import annotations

from typing import Any

import pytest
from harness import wait_until
from test_consumer import Recorder, env, poll_until  # noqa: F401 - env: the fixture

from rcoord import MemberIdentity, TopicPartition
from rcoord.client import Consumer

TP0 = TopicPartition("t", 0)


@pytest.mark.parametrize("read", ["poll", "position"])
def test_an_assigned_partition_starts_at_the_offset_committed_by_another_client_before_the_first_poll(
        env: Any, read: str) -> None:  # noqa: F811 - the fixture
    """``assign()``'s docstring: a new partition starts at its committed offset "as it is at
    the next ``poll()``", as Kafka's, whose ``assign()`` gives it no position and whose first
    ``poll()`` (or ``position()``) fetches the committed offset (ClassicKafkaConsumer
    ``updateFetchPositions`` -> ConsumerCoordinator ``initWithCommittedOffsetsIfNeeded``).
    Here the offset is read by ``assign()`` itself; only the consumer's own commits made
    since are applied (``_note_started``). A commit by any other client in between (another
    simple-group consumer, ``groups reset-offsets``, which the coordinator allows while the
    group has no members) is ignored: reading starts at the offset read by ``assign()``, and
    the next commit of the positions writes it back over the other one."""
    env.topics.create("t", 1)
    env.producer.send_batch("t", [b"%d" % i for i in range(10)])
    env.coord.commit_offsets("g", {TP0: 2})
    consumer: Consumer = env.consumer(topics=[], enable_auto_commit=False)
    consumer.assign([TP0])
    env.coord.commit_offsets("g", {TP0: 6})  # another client of the (memberless) group
    assert consumer.committed([TP0]) == {TP0: 6}
    if read == "position":
        assert consumer.position(TP0) == 6
    got = poll_until(consumer, lambda g: len(g) >= 1)
    assert got[0].offset == 6, f"started at {got[0].offset}, the offset assign() read"


@pytest.mark.parametrize("start", ["seek", "none"])
def test_an_assigned_partition_read_at_the_first_poll_keeps_a_seek_and_takes_a_late_commit(
        env: Any, start: str) -> None:  # noqa: F811 - the fixture
    """The committed offset read at the first ``poll()`` (not by ``assign()``) does not undo a
    ``seek()`` made before it, as Kafka's seek gives the partition a position that its fetch
    of committed offsets leaves alone; and under ``start_offset="none"`` a commit by another
    client before that poll is a start, where ``assign()``'s own read found none."""
    env.topics.create("t", 1)
    env.producer.send_batch("t", [b"%d" % i for i in range(10)])
    consumer: Consumer = env.consumer(topics=[], enable_auto_commit=False, start_offset="none")
    consumer.assign([TP0])
    env.coord.commit_offsets("g", {TP0: 6})  # another client of the (memberless) group
    if start == "seek":
        consumer.seek(TP0, 3)
    got = poll_until(consumer, lambda g: len(g) >= 1)
    assert got[0].offset == (3 if start == "seek" else 6)


@pytest.mark.parametrize("assignor", ["range", "cooperative-sticky"])
def test_a_member_that_held_nothing_is_not_told_it_lost_partitions(
        env: Any, assignor: str) -> None:  # noqa: F811 - the fixture
    """Kafka's ConsumerRebalanceListener contract (ConsumerRebalanceListener.java, class
    javadoc): ``onPartitionsLost`` "will only be called when there were non-empty partitions
    that were lost" (ConsumerCoordinator ``onJoinPrepare``: ``if
    (!revokedPartitions.isEmpty())`` around ``invokePartitionsLost``), under either protocol.
    Here a member that was assigned nothing (two members, one partition) and is removed from
    the group (as by a session expiry) hears ``on_partitions_lost([])`` before its next
    ``on_partitions_assigned``: ``Consumer._revoke`` calls the listener "if partitions or
    polling", the lost callback included, so a listener that alerts on lost partitions fires
    for none."""
    env.topics.create("t", 1)
    la, lb = Recorder(), Recorder()
    a: Consumer = env.consumer(la, assignors=[assignor])
    b: Consumer = env.consumer(lb, assignors=[assignor])

    def step() -> None:
        a.poll(timeout=0.02)
        b.poll(timeout=0.02)

    def settled() -> bool:
        last = [lst.events[-1] if lst.events else None for lst in (la, lb)]
        held = sorted([len(a.assignment()), len(b.assignment())])
        return all(e is not None and e[0] == "assigned" for e in last) and held == [0, 1]

    wait_until(settled, step)
    idle, heard = (a, la) if not a.assignment() else (b, lb)
    seen = len(heard.events)
    env.coord.leave_group("g", [MemberIdentity(idle.member_id)])  # as a session expiry would
    wait_until(lambda: "assigned" in heard.kinds()[seen:], step)
    assert "lost" not in heard.kinds()[seen:], heard.events[seen:]
