"""A partition or pattern watcher whose read fails with an error nothing expected.

The watchers caught only ``RcoordError``: any other exception (a non-numeric partition count
in a topic's metadata, a ``Coordinator`` raising its own errors) ended the watcher's thread
while its generation went on, so partitions added or topics newly matching the pattern were
never noticed for the rest of the generation. Now the read is tried again at the next
interval, as a failed metadata refresh is in Kafka's consumer; a fatal error (a permission the
Redis user lacks) ends the generation, as it ends any other call of the member's.
"""

from __future__ import annotations

import re
import threading
from typing import Any

import pytest
from test_client_group import WAIT_S, OneMemberGroup, fake_group  # noqa: F401 - the fixture

from rcoord.client import EndReason
from rcoord.errors import MissingPermissionError
from rcoord.protocol.offsets import TopicPartition as TP


def _failing(calls: Any, n: int, error: BaseException) -> tuple[Any, threading.Event]:
    """``calls`` wrapped to raise ``error`` ``n`` times (set ``failed`` after the last one)."""
    failed = threading.Event()
    left = [n]

    def call(*args: Any) -> Any:
        if left[0]:
            left[0] -= 1
            if not left[0]:
                failed.set()
            raise error
        return calls(*args)

    return call, failed


def test_a_partition_watcher_read_that_raises_is_tried_again(
    fake_group: Any,  # noqa: F811 - the fixture
) -> None:
    state = OneMemberGroup(partitions=2)
    group = fake_group(state)
    gen = group.next(timeout=WAIT_S)
    assert gen.is_leader
    state.fake.partition_counts, failed = _failing(  # type: ignore[attr-defined]
        state.partition_counts, 3, ValueError("invalid literal for int() with base 10: b'x'"))
    assert failed.wait(WAIT_S)
    assert not gen.done.is_set()  # a failed read ends nothing
    with state.lock:
        state.counts["t"] = 3
    assert gen.done.wait(WAIT_S)  # the watcher still runs, and sees the new partition
    assert gen.end_reason is EndReason.PARTITIONS_CHANGED and not gen.lost
    assert group.next(timeout=WAIT_S).partitions == [TP("t", 0), TP("t", 1), TP("t", 2)]


def test_a_pattern_watcher_read_that_raises_is_tried_again(
    fake_group: Any,  # noqa: F811 - the fixture
) -> None:
    state = OneMemberGroup(topic="t1", partitions=1)
    topics = ["t1"]
    state.fake.list_topics = lambda: list(topics)  # type: ignore[attr-defined]
    group = fake_group(state, topics=[], topic_pattern=re.compile(r"t\d"),
                       watch_partition_changes=False)
    gen = group.next(timeout=WAIT_S)
    state.fake.list_topics, failed = _failing(  # type: ignore[attr-defined]
        lambda: list(topics), 3, TypeError("'NoneType' object is not iterable"))
    assert failed.wait(WAIT_S)
    assert not gen.done.is_set()
    with state.lock:
        state.counts["t2"] = 1
    topics.append("t2")
    assert gen.done.wait(WAIT_S)  # the watcher still runs, and sees the newly matching topic
    assert gen.end_reason is EndReason.SUBSCRIPTION_CHANGED


def test_a_partition_watcher_refused_a_permission_closes_the_group(
    fake_group: Any,  # noqa: F811 - the fixture
) -> None:
    state = OneMemberGroup(partitions=2)
    group = fake_group(state)
    gen = group.next(timeout=WAIT_S)
    refused = MissingPermissionError("the Redis user may not do what rcoord needs: NOPERM hget")
    state.fake.partition_counts, _ = _failing(  # type: ignore[attr-defined]
        state.partition_counts, 1_000_000, refused)
    assert gen.done.wait(WAIT_S)
    assert gen.end_error is refused and gen.lost
    with pytest.raises(MissingPermissionError):
        group.next(timeout=WAIT_S)
