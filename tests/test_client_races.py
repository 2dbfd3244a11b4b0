"""Races between a worker's reads and the world changing between them.

``start_offsets`` judges a committed offset by its topic's creation time (a commit older than
its topic is a deleted topic's, ``rcoord.topics.incarnation``) and reads the logs of the
partitions to start by the policy, and, for ``assign()``, of the committed ones to see that
they exist. A topic deleted and created again between those reads must not start at the deleted
topic's commit, nor at the deleted topic's log edges.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import pytest
from harness import WAIT_S, wait_until

from rcoord.client import ConsumerGroupConfig, Generation
from rcoord.client.coordinator import RedisCoordinator
from rcoord.client.generation import EndReason
from rcoord.client.heartbeat import JoinBeats
from rcoord.client.join import start_offsets
from rcoord.client.policy import combine, reaction_for
from rcoord.errors import Errors, ProtocolError
from rcoord.protocol.offsets import TopicPartition as TP
from rcoord.topics import Producer, ProducerRecord, Topics


def no_retry(call: Any, error_of: Any) -> Any:
    return call()


class RecreatedAfterTheLogRead(RedisCoordinator):
    """A coordinator whose first log read is followed at once by the deletion of topic "t", its
    creation again and one record sent to it: what another process may do in the milliseconds
    between two reads of ``start_offsets``."""

    recreated = False

    def log_offsets_many(self, partitions: Sequence[TP]) -> list[tuple[int, int] | Errors]:
        got = super().log_offsets_many(partitions)
        if not self.recreated:
            self.recreated = True
            topics = Topics(self._redis, self._ns)
            topics.delete("t")
            topics.create("t", 1)
            Producer(self._redis, self._ns).send("t", b"new", partition=0)
        return got


@pytest.mark.parametrize(("policy", "manual"), [
    ("earliest", True), ("latest", True), ("earliest", False), ("latest", False)])
def test_a_topic_created_again_between_the_reads_does_not_start_at_the_old_commit(
    make_coordinator: Any, redis_client: Any, namespace: str, policy: str, manual: bool,
) -> None:
    make_coordinator()  # (loads the coordinator's functions)
    topics = Topics(redis_client, namespace)
    topics.create("t", 1)
    topics.create("other", 1)
    producer = Producer(redis_client, namespace)
    producer.send_batch("t", [ProducerRecord(b"old", partition=0) for _ in range(10)])
    topics.delete_records("t", {0: 3})  # the old topic's log: 3..10; the new one's: 0..1
    coord = RecreatedAfterTheLogRead(redis_client, namespace)
    assert coord.commit_offsets("g", {TP("t", 0): 5}) == {TP("t", 0): Errors.NONE}
    cfg = ConsumerGroupConfig(group_id="g", topics=["t"], redis_client=redis_client,
                              namespace=namespace, start_offset=policy)  # type: ignore[arg-type]
    # "other" has no commit, so the log read comes with or without assign()'s existence check.
    assigned = [TP("other", 0), TP("t", 0)]
    missing: set[TP] = set()
    offsets, committed = start_offsets(assigned, coord, cfg, no_retry,
                                       missing=missing if manual else None)
    assert coord.recreated
    # The commit (5) is the deleted topic's; the new topic starts by the policy at its own log
    # edges (0 or 1), not at the deleted topic's (3 or 10).
    assert offsets == {TP("other", 0): 0, TP("t", 0): 0 if policy == "earliest" else 1}
    assert committed == {} and missing == set()


class ScriptedBeats:
    """A coordinator whose heartbeats answer ``answers`` in turn, then the last one again;
    ``answered`` is set once all of them were given."""

    def __init__(self, *answers: Errors) -> None:
        self.answers = list(answers)
        self.given = 0
        self.answered = threading.Event()

    def heartbeat(self, group_id: str, generation_id: int, member_id: str,
                  group_instance_id: str | None = None) -> Errors:
        error = self.answers[min(self.given, len(self.answers) - 1)]
        self.given += 1
        if self.given >= len(self.answers):
            self.answered.set()
        return error


@pytest.mark.parametrize("out", [
    Errors.UNKNOWN_MEMBER_ID, Errors.ILLEGAL_GENERATION, Errors.FENCED_INSTANCE_ID],
    ids=lambda e: e.name)
def test_join_beats_hand_over_a_later_out_of_generation_answer(out: Errors) -> None:
    """A beat answered REBALANCE_IN_PROGRESS, then one answered UNKNOWN_MEMBER_ID (the member
    missed the rebalance timeout): the member is out, and must rejoin as a new member, as
    Kafka's heartbeat handler resets the generation on the later answer whatever an earlier one
    said. JoinBeats kept only the first error: ``check`` let the SyncGroup go out, and the
    generation ended as a mere rebalance, so the member rejoined with a removed member id."""
    coord = ScriptedBeats(Errors.REBALANCE_IN_PROGRESS, out)
    cfg = ConsumerGroupConfig(group_id="g", topics=["t"], redis_client=object(),
                              heartbeat_interval_ms=10, session_timeout_ms=6000)
    with JoinBeats(coord, cfg, 3, "m-1") as beats:  # type: ignore[arg-type]
        assert coord.answered.wait(WAIT_S)
        wait_until(lambda: not beats._thread.is_alive())  # (it stops on an out answer)
        with pytest.raises(ProtocolError) as raised:
            beats.check()
        assert raised.value.error is out
        gen = Generation(group_id="g", generation_id=3, member_id="m-1", leader_id="m-1",
                         protocol_name="range", assignments={}, committed={},
                         coordinator=coord)  # type: ignore[arg-type]
        beats.hand_over(gen)
    pending = gen.pending_reaction
    assert pending is not None
    reaction, error = pending
    assert reaction == combine(reaction_for(Errors.REBALANCE_IN_PROGRESS), reaction_for(out))
    assert reaction.lost and gen.lost
    assert gen.end_reason is EndReason.MEMBER_LOST and gen.end_error is error is out


class DeletedAfterTheLogRead(RedisCoordinator):
    """A coordinator that deletes topic "t" just before it reads the creation times (after the
    log read): the topic is gone, and may be created again at any time later."""

    deleted = False

    def created_times(self, topics: Sequence[str]) -> dict[str, int]:
        if not self.deleted:
            self.deleted = True
            Topics(self._redis, self._ns).delete("t")
        return super().created_times(topics)


def test_assign_of_a_topic_deleted_after_the_log_read_has_no_position(
    make_coordinator: Any, redis_client: Any, namespace: str,
) -> None:
    """A committed partition whose topic was deleted between the log read and the creation
    times' read gets no position (it is reset once the topic exists again), as one the log read
    found missing: kept at its old commit, a topic created again later was read from there."""
    make_coordinator()
    Topics(redis_client, namespace).create("t", 1)
    coord = DeletedAfterTheLogRead(redis_client, namespace)
    assert coord.commit_offsets("g", {TP("t", 0): 5}) == {TP("t", 0): Errors.NONE}
    cfg = ConsumerGroupConfig(group_id="g", topics=["t"], redis_client=redis_client,
                              namespace=namespace, start_offset="earliest")
    missing: set[TP] = set()
    offsets, committed = start_offsets([TP("t", 0)], coord, cfg, no_retry, missing=missing)
    assert coord.deleted
    assert committed == {} and missing == {TP("t", 0)} and offsets == {TP("t", 0): 0}
