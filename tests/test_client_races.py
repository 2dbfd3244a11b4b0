"""Races between a worker's reads and the world changing between them.

``start_offsets`` judges a committed offset by its topic's creation time (a commit older than
its topic is a deleted topic's, ``rcoord.topics.incarnation``) and reads the logs of the
partitions to start by the policy, and, for ``assign()``, of the committed ones to see that
they exist. A topic deleted and created again between those reads must not start at the deleted
topic's commit, nor at the deleted topic's log edges.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from rcoord.client import ConsumerGroupConfig
from rcoord.client.coordinator import RedisCoordinator
from rcoord.client.join import start_offsets
from rcoord.errors import Errors
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
