"""The existence check of the consumer's own commits (``Consumer._skip_missing``) when the
partition counts cannot be read: it must not hold the commit back. Real servers (the ``env``
fixture of test_consumer)."""

from __future__ import annotations

import threading
from typing import Any

import test_consumer

from rcoord import ConnectionLost, TopicPartition
from rcoord.client.coordinator import RedisCoordinator

TP = TopicPartition
env = test_consumer.env


class _CountsLost(RedisCoordinator):
    """Its partition count reads from the test's thread fail as a node out of reach fails
    them (the leader's reads, on other threads, go through); counts the attempts."""

    def __init__(self, env: Any) -> None:
        super().__init__(env.client, env.namespace)
        self.attempts = 0
        self._thread = threading.current_thread()

    def partition_counts(self, topics: Any) -> dict[str, int]:
        if threading.current_thread() is self._thread:
            self.attempts += 1
            raise ConnectionLost("the node of the topic's metadata is out of reach (test)")
        return super().partition_counts(topics)


def test_an_own_commit_whose_counts_cannot_be_read_tries_the_check_once(env: Any) -> None:
    """commit() of the positions, the counts' node out of reach (a cluster node down, the
    group's node up): the check makes one attempt, then the positions are committed. Before,
    it retried for a whole session timeout (30 s by default) before committing everything
    anyway, so each own commit needing the check (commit(), a revocation's on the poll
    thread) stalled that long, and with Redis down commit() took twice as long to fail."""
    env.topics.create("t", 1)
    coord = _CountsLost(env)
    consumer = env.consumer(enable_auto_commit=False, topics=[], coordinator=coord,
                            partition_watch_interval_ms=600_000, session_timeout_ms=2000,
                            retry_backoff_ms=1, retry_backoff_max_ms=2)
    consumer.assign([TP("t", 0)])
    consumer.seek(TP("t", 0), 3)
    consumer.commit()
    assert coord.attempts == 1
    got = env.coord.fetch_offsets("g", [TP("t", 0)]).offsets[TP("t", 0)].offset
    assert got == 3
