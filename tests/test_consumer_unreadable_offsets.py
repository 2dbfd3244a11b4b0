"""The Consumer's offset queries when one partition's stream cannot be read (its last id is not
rcoord's: an XADD by hand with an id of its own). Kafka answers ListOffsets per partition:
``end_offsets()`` of a set holding such a partition raises (as Kafka's ``endOffsets`` throws
for the set), but ``lag()`` leaves that partition out (Kafka's ``currentLag`` is empty for it)
and ``position()`` of another partition is not failed by it. Before, one such stream made
``lag()`` and ``position()`` of every partition raise its error. Real servers (the ``env``
fixture of test_consumer: one node and a cluster)."""

from __future__ import annotations

from typing import Any

import pytest
import test_consumer

from rcoord import Errors, TopicPartition
from rcoord.topics import TopicError, partition_key

env = test_consumer.env
TP = TopicPartition


def _foreign_t0(env: Any) -> Any:
    """Topic t of 2 partitions: a record in t-1, and t-0's stream given an entry by hand with
    an id of its own; a consumer with both assigned."""
    env.topics.create("t", 2)
    env.producer.send("t", b"c", partition=1)
    env.client.execute_command("XADD", partition_key(env.namespace, "t", 0), "*", "t", 1)
    consumer = env.consumer(enable_auto_commit=False, topics=[], start_offset="earliest")
    consumer.assign([TP("t", 0), TP("t", 1)])
    return consumer


def test_end_offsets_raises_the_partitions_own_error_for_the_set(env: Any) -> None:
    """t-1 alone is answered; t-0 with it raises t-0's TopicError keeping its detail (what
    mends the stream), as Kafka's endOffsets throws for the set."""
    consumer = _foreign_t0(env)
    assert consumer.end_offsets([TP("t", 1)]) == {TP("t", 1): 1}
    with pytest.raises(TopicError) as caught:
        consumer.end_offsets([TP("t", 0), TP("t", 1)])
    assert caught.value.error is Errors.UNKNOWN_SERVER_ERROR
    assert "delete and re-create the topic" in caught.value.detail


def test_lag_leaves_an_unreadable_partition_out(env: Any) -> None:
    """t-0 has no log end to measure against: it is left out, as a missing partition is;
    t-1's lag is there. Before, lag() raised t-0's TopicError for every partition."""
    consumer = _foreign_t0(env)
    consumer.seek(TP("t", 0), 0)
    consumer.seek(TP("t", 1), 0)
    assert consumer.lag() == {TP("t", 1): 1}


def test_position_is_not_failed_by_another_pending_partition(env: Any) -> None:
    """seek_to_end() of both: position(t-1) reads every pending edge, and t-0's cannot be
    read; t-1's position is answered, t-0 stays pending and position(t-0) raises its own
    error with its detail. Before, position(t-1) raised t-0's error."""
    consumer = _foreign_t0(env)
    consumer.seek_to_end()
    assert consumer.position(TP("t", 1), timeout=5) == 1
    with pytest.raises(TopicError) as caught:
        consumer.position(TP("t", 0), timeout=5)
    assert caught.value.error is Errors.UNKNOWN_SERVER_ERROR
    assert "delete and re-create the topic" in caught.value.detail
    assert TP("t", 0) in consumer._resets  # (still pending: a seek or the mend resolves it)
    consumer.seek(TP("t", 0), 0)
    assert consumer.position(TP("t", 0)) == 0
