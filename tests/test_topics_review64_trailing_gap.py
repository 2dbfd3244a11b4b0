"""A read at offsets whose entries were all removed by hand (XDEL) up to the log end: no entry
from the offset on, though the log end is past it. It is a gap like one in a stream's middle,
answered UNKNOWN_SERVER_ERROR with ``next_offset`` the log end (``_unmatched``), so a consumer
there is told where to seek. It was answered no records and no error, so a consumer waited
there with a lag that never went (until an append made it a gap it was told of). A read at
the log end itself is no records and no error, as before. Real servers (the ``env`` fixture of
test_consumer: one node and the cluster)."""

from __future__ import annotations

import importlib
from typing import Any

import pytest
import test_consumer
from test_topics_xdel_start import _records_with_xdel

from rcoord import Errors, TopicPartition
from rcoord.topics import CorruptRecordError, TopicError

fetch_module = importlib.import_module("rcoord.topics.fetch")  # (`fetch` is the function)
env = test_consumer.env
TP = TopicPartition("t", 0)


@pytest.mark.parametrize("max_bytes", [None, 1 << 20], ids=["unbounded", "bytes"])
def test_a_read_in_a_gap_that_reaches_the_log_end_says_where_to_seek(
        env: Any, max_bytes: int | None) -> None:
    """Offsets 0 to 5 with 4 and 5 removed: a read at 4 is the gap, next_offset 6, the log
    end; at 6 it is no records and no error; one from 2 gives 2 and 3."""
    _records_with_xdel(env, 6, [4, 5])
    (got,) = fetch_module.fetch_many(env.client, env.namespace, [("t", 0, 4)],
                                     max_bytes=max_bytes)
    assert (got.error, got.next_offset, got.records) == (Errors.UNKNOWN_SERVER_ERROR, 6, [])
    assert "log end at offset 6" in got.detail and "seek to offset 6" in got.detail
    with pytest.raises(TopicError) as caught:
        fetch_module.fetch(env.client, env.namespace, "t", 0, 4, max_bytes=max_bytes)
    assert caught.value.error == Errors.UNKNOWN_SERVER_ERROR
    (end,) = fetch_module.fetch_many(env.client, env.namespace, [("t", 0, 6)],
                                     max_bytes=max_bytes)
    assert (end.error, end.records, end.log_end_offset) == (Errors.NONE, [], 6)
    (before,) = fetch_module.fetch_many(env.client, env.namespace, [("t", 0, 2)],
                                        max_bytes=max_bytes)
    assert (before.error, [r.offset for r in before.records]) == (Errors.NONE, [2, 3])


def test_a_consumer_in_a_gap_that_reaches_the_log_end_is_told(env: Any) -> None:
    """A consumer positioned at 4 raises CorruptRecordError naming offset 4 and saying to seek
    to 6; sought there, it polls nothing, at the log end. It polled nothing at 4 for ever."""
    _records_with_xdel(env, 6, [4, 5])
    consumer = env.consumer(enable_auto_commit=False, topics=[], start_offset="earliest")
    consumer.assign([TP])
    consumer.seek(TP, 4)
    with pytest.raises(CorruptRecordError) as caught:
        for _ in range(20):  # (a poll may end before its fetch is answered; short polls, as
            assert consumer.poll(1.0) == []  # the old code never raised: 20 s, not 20 WAIT_S)
    assert (caught.value.partition, caught.value.offset) == (0, 4)
    assert "seek to offset 6" in str(caught.value)
    consumer.seek(TP, 6)
    assert consumer.poll(0.05) == []
