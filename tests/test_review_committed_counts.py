"""committed() and the cached partition counts: a count read within the partition watch
interval proves the partitions below it exist, never that one past it is missing (the topic
may have grown since). Real servers (the ``env`` fixture of test_consumer)."""

from __future__ import annotations

from typing import Any

import test_consumer

from rcoord import TopicPartition

TP = TopicPartition
env = test_consumer.env


def test_committed_of_a_partition_added_after_the_cached_count_is_answered(env: Any) -> None:
    """A topic grows after the consumer read its count; a commit to a new partition (another
    member's) is the committed offset, as Kafka answers it. Before, the count kept for the
    watch interval answered that the partition did not exist, and committed() said none
    (a caller seeking to it would start over from start_offset)."""
    env.topics.create("t", 2)
    env.coord.commit_offsets("g", {TP("t", 0): 2})
    consumer = env.consumer(enable_auto_commit=False, topics=[],
                            partition_watch_interval_ms=600_000)
    assert consumer.committed([TP("t", 0)]) == {TP("t", 0): 2}  # (reads and keeps count 2)
    env.topics.add_partitions("t", 4)
    env.coord.commit_offsets("g", {TP("t", 3): 7})
    assert consumer.committed([TP("t", 0), TP("t", 3)]) == {TP("t", 0): 2, TP("t", 3): 7}
    assert consumer.committed([TP("t", 3)], metadata=True)[TP("t", 3)] is not None
    consumer.close()
