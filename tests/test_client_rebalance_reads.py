"""The reads every rebalance makes, counted in round trips: the leader's partition counts and
each member's start offsets (``join.start_offsets``) go in one pipeline per node, whatever the
number of topics and partitions. One read each cost a round trip per partition: with 2000
partitions and a 1 ms network round trip, two seconds added to every rebalance.

The batched reads must answer as the one-by-one reads did: committed offsets first, else the
``start_offset`` policy, and a partition with no log (a deleted topic, a partition out of
range) starts at 0 with a warning.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest

from rcoord.client import ConsumerGroupConfig
from rcoord.client.coordinator import RedisCoordinator
from rcoord.client.join import NO_POSITION, start_offsets
from rcoord.errors import Errors
from rcoord.protocol.offsets import TopicPartition as TP
from rcoord.topics import Producer, ProducerRecord, TopicError, Topics

PARTITIONS = 40


class RoundTrips:
    """Counts the requests a client sends: each single command and each pipeline's execute
    (a pipeline is one round trip per node)."""

    def __init__(self, client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        single = client.execute_command
        make_pipeline = client.pipeline

        def execute_command(*args: Any, **kwargs: Any) -> Any:
            self.count += 1
            return single(*args, **kwargs)

        def pipeline(*args: Any, **kwargs: Any) -> Any:
            pipe = make_pipeline(*args, **kwargs)
            execute = pipe.execute

            def counted(*a: Any, **k: Any) -> Any:
                self.count += 1
                return execute(*a, **k)

            pipe.execute = counted
            return pipe

        monkeypatch.setattr(client, "execute_command", execute_command)
        monkeypatch.setattr(client, "pipeline", pipeline)


def no_retry(call: Any, error_of: Any) -> Any:
    return call()


def config(redis_client: Any, namespace: str, start_offset: str) -> ConsumerGroupConfig:
    return ConsumerGroupConfig(group_id="g", topics=["t"], redis_client=redis_client,
                               namespace=namespace, start_offset=start_offset)  # type: ignore[arg-type]


@pytest.fixture
def world(make_coordinator: Any, redis_client: Any, namespace: str) -> Any:
    """Topic "t" with records in its first partitions (and some deleted from partition 1), a
    few committed offsets, a deleted topic "gone", and a partition of "t" out of range."""
    make_coordinator()  # (loads the coordinator's functions)
    topics = Topics(redis_client, namespace)
    topics.create("t", PARTITIONS)
    topics.create("gone", 2)
    topics.delete("gone")
    Producer(redis_client, namespace).send_batch(
        "t", [ProducerRecord(b"x", partition=p) for p in (0, 0, 1, 1, 1, 2)])
    topics.delete_records("t", {1: 2})
    coord = RedisCoordinator(redis_client, namespace)
    assert coord.commit_offsets("g", {TP("t", 3): 7, TP("t", 5): 0}) == {
        TP("t", 3): Errors.NONE, TP("t", 5): Errors.NONE}
    assigned = [TP("t", p) for p in range(PARTITIONS)] + [
        TP("gone", 0), TP("gone", 1), TP("t", 99)]
    return coord, assigned


def _this_threads(records: list[logging.LogRecord]) -> list[logging.LogRecord]:
    """The records the test's own thread logged (``start_offsets`` runs on it): not a warning
    some other test's consumer, still ending in this process, logged meanwhile."""
    return [r for r in records if r.thread == threading.get_ident()]


def one_by_one(coord: RedisCoordinator, tp: TP) -> tuple[int, int]:
    """What a partition's start was read as before: one log_offsets, (0, 0) if it has none."""
    try:
        return coord.log_offsets(tp.topic, tp.partition)
    except TopicError:
        return 0, 0


@pytest.mark.parametrize("policy", ["earliest", "latest", "none"])
def test_start_offsets_read_the_logs_in_one_round_trip_with_the_same_answers(
    world: Any, redis_client: Any, namespace: str, policy: str,
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    coord, assigned = world
    committed = {TP("t", 3): 7, TP("t", 5): 0}
    expected = {
        tp: committed[tp] if tp in committed
        else NO_POSITION if policy == "none"
        else one_by_one(coord, tp)[0 if policy == "earliest" else 1]
        for tp in assigned
    }
    if policy == "earliest":
        assert expected[TP("t", 1)] == 2 and expected[TP("t", 0)] == 0
    if policy == "latest":
        assert expected[TP("t", 1)] == 3 and expected[TP("t", 2)] == 1
    trips = RoundTrips(redis_client, monkeypatch)
    with caplog.at_level(logging.WARNING, "rcoord.client"):
        offsets, got_committed = start_offsets(
            assigned, coord, config(redis_client, namespace, policy), no_retry)
    assert offsets == expected and list(offsets) == assigned
    assert got_committed == committed
    # OffsetFetch, then the logs of the 40 partitions in one pipeline: before, 41 round trips
    # more.
    assert trips.count <= 3, trips.count
    warned = sorted(r.getMessage().split(" (")[0] for r in _this_threads(caplog.records))
    assert warned == ([] if policy == "none" else [
        "no log offsets for gone-0", "no log offsets for gone-1", "no log offsets for t-99"])


def test_start_offsets_of_an_illegal_topic_name_start_at_0_as_before(
    world: Any, redis_client: Any, namespace: str, caplog: pytest.LogCaptureFixture,
) -> None:
    """A leader's assignment naming a topic the topics refuse (an illegal name) fails the
    batched read before it is sent: each partition is then read by itself, as before."""
    coord, _ = world
    assigned = [TP("t", 1), TP("bad name", 0)]
    with caplog.at_level(logging.WARNING, "rcoord.client"):
        offsets, _ = start_offsets(
            assigned, coord, config(redis_client, namespace, "latest"), no_retry)
    assert offsets == {TP("t", 1): 3, TP("bad name", 0): 0}
    assert [r.getMessage() for r in _this_threads(caplog.records)] == [(
        "no log offsets for bad name-0 (INVALID_TOPIC_EXCEPTION: illegal topic name "
        "'bad name'); starting at 0")]


def test_partition_counts_are_read_in_one_round_trip(
    world: Any, redis_client: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    coord, _ = world
    names = ["t", "gone", "never", *(f"x{i}" for i in range(20)), "t"]
    trips = RoundTrips(redis_client, monkeypatch)
    assert coord.partition_counts(names) == {"t": PARTITIONS}
    assert trips.count == 1
    assert coord.partition_counts([]) == {}
    with pytest.raises(TopicError) as info:
        coord.partition_counts(["t", "bad name"])
    assert info.value.error is Errors.INVALID_TOPIC_EXCEPTION
