"""The log starts a Spark group member reads, counted in round trips: the query's start reads
every partition of every subscribed topic (``_log_starts_now``), and a generation that gains
partitions without a committed offset reads theirs (``_place``), each in one pipeline per node
(``join.log_offsets_of``). One ``log_offsets`` each cost a round trip per partition.

The batched reads must answer as the one-by-one reads did: a partition with no log (deleted
meanwhile, out of range) or a read that fails (Redis away) is warned about, and then left out
(``_log_starts_now``) or started at its log end (``_place``).
"""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import pytest
from harness import this_threads
from test_client_rebalance_reads import RoundTrips

from rcoord.client import ConsumerGroup, ConsumerGroupConfig
from rcoord.client.coordinator import RedisCoordinator
from rcoord.errors import ConnectionLost
from rcoord.protocol.offsets import TopicPartition as TP
from rcoord.spark.member import StreamMember, _parse_metadata
from rcoord.topics import Producer, ProducerRecord, Topics

PARTITIONS = 40


@pytest.fixture
def member(make_coordinator: Any, redis_client: Any, namespace: str) -> Any:
    """A member (its group never started: no thread sends anything) of a query on topic "ev",
    whose partition 1 starts at 2 and partition 2 at 1; the partition counts it reads name two
    partitions of "ev" past its last (as if the topic had been deleted and created again
    smaller meanwhile)."""
    make_coordinator()  # (loads the coordinator's functions)
    topics = Topics(redis_client, namespace)
    topics.create("ev", PARTITIONS)
    Producer(redis_client, namespace).send_batch(
        "ev", [ProducerRecord(b"x", partition=p) for p in (1, 1, 1, 2, 2)])
    topics.delete_records("ev", {1: 2, 2: 1})
    coordinator = RedisCoordinator(redis_client, namespace)
    coordinator.log_offsets("ev", 0)  # (loads the script: a cold pipeline resends each call)
    group = ConsumerGroup(ConsumerGroupConfig(
        group_id="g", topics=["ev"], redis_client=redis_client, namespace=namespace,
        start_offset="latest"), coordinator=coordinator)
    counts = coordinator.partition_counts

    def more_partitions(names: Any) -> dict[str, int]:
        return {t: n + 2 for t, n in counts(names).items()}

    setattr(coordinator, "partition_counts", more_partitions)  # noqa: B010
    return StreamMember(group)


def starts_of() -> dict[TP, int]:
    return {TP("ev", p): {1: 2, 2: 1}.get(p, 0) for p in range(PARTITIONS)}


def warned(caplog: pytest.LogCaptureFixture) -> list[str]:
    """What the test's calls of the member logged (on its thread: another test's group "g"
    may log on a thread of its own meanwhile)."""
    return [r.getMessage().split(" (")[0] for r in this_threads(caplog.records)]


def test_the_querys_start_reads_every_log_start_in_one_round_trip(
    member: Any, redis_client: Any, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    trips = RoundTrips(redis_client, monkeypatch)
    with caplog.at_level(logging.WARNING, "rcoord.spark"):
        got = member._log_starts_now()
    assert got == starts_of() and list(got) == sorted(got)
    # The partition counts, then the 42 logs in one pipeline: before, 42 round trips for them.
    assert trips.count <= 2, trips.count
    assert warned(caplog) == [
        "group 'g': no log start for ev-40", "group 'g': no log start for ev-41"]


def test_a_generation_places_its_partitions_with_one_read_of_their_log_starts(
    member: Any, redis_client: Any, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    member._seen.update(starts_of())  # all there when the query started: no data loss
    commits: list[dict[TP, Any]] = []
    gen = SimpleNamespace(
        group_id="g", member_id="m", committed={TP("ev", 3): 9},
        offsets={**{TP("ev", p): 5 for p in range(PARTITIONS)}, TP("ev", 40): 5},
        commit_offsets=commits.append)
    trips = RoundTrips(redis_client, monkeypatch)
    with caplog.at_level(logging.WARNING, "rcoord.spark"):
        placed = member._place(gen, False)
    expected = {**starts_of(), TP("ev", 40): 5}  # (no log: it starts at its log end)
    del expected[TP("ev", 3)]
    assert placed == expected
    assert [{tp: o.offset for tp, o in c.items()} for c in commits] == [expected]
    # The topic's create token, then the 40 logs in one pipeline: before, 40 round trips.
    assert trips.count <= 2, trips.count
    assert warned(caplog) == ["group 'g': no log start for ev-40"]


def test_log_starts_unread_with_redis_away_are_warned_about_each(
    member: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    coordinator = member._group.coordinator

    def away(*args: Any) -> Any:
        raise ConnectionLost("Redis away")

    monkeypatch.setattr(coordinator, "log_offsets_many", away)
    monkeypatch.setattr(coordinator, "log_offsets", away)
    with caplog.at_level(logging.WARNING, "rcoord.spark"):
        assert member._log_starts_now() == {}
    assert warned(caplog) == [f"group 'g': no log start for ev-{p}"
                              for p in range(PARTITIONS + 2)]


def test_a_start_chosen_in_a_topic_made_again_since_is_not_committed(
    member: Any, redis_client: Any, namespace: str,
) -> None:
    # Under latest, a start this process chose before (its commit did not land) is placed
    # again by the next generation. Before, when the topic had been deleted and created
    # again meanwhile, that generation committed the old topic's offset, stamped with the old
    # token, after the creation: a plain Consumer of the group counts such a commit as the new
    # topic's (rcoord.topics.incarnation) and would have skipped the new topic's first records.
    member._seen.update(starts_of())
    member._chosen[TP("ev", 0)] = (7, "the-deleted-topics-token")
    commits: list[dict[TP, Any]] = []
    gen = SimpleNamespace(group_id="g", member_id="m", committed={},
                          offsets={TP("ev", 0): 9, TP("ev", 1): 9},
                          commit_offsets=commits.append)
    assert member._place(gen, False) == {TP("ev", 0): 7, TP("ev", 1): 2}
    token = Topics(redis_client, namespace).create_token("ev")
    assert [{tp: (o.offset, _parse_metadata(o.metadata)[0]) for tp, o in c.items()}
            for c in commits] == [{TP("ev", 1): (2, token)}]
    # The plan starts ev-0 where it was chosen, in the old topic: data loss (continuity_loss).
    assert member._base_tokens[TP("ev", 0)] == "the-deleted-topics-token"
