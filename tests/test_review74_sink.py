"""Review 74 of the Spark sink's write path: reproductions (no JVM), each failing on the code
reviewed.

A write task places each row as it comes and sends them per topic in batches of up to 1000
rows (``write.write_rows``). A row that names a partition the topic does not have, or that is
larger than ``maxRequestSize``, is refused only when its topic's batch is sent; the batches of
the topics flushed before it in the same round are appended by then. So whether the rows
before a bad row are written depends on which topic their rows came in first: the task fails,
and the rows of the other topics stay written (a batch write's retried task appends them
again, once per attempt; a stream's batch stays half-written, and the query stops). Within one
topic the same bad row fails the call before anything of it is appended
(``Producer._send`` checks every record first), as it should for the others.
"""

from __future__ import annotations

from typing import Any

import pytest

from rcoord.errors import Errors
from rcoord.spark.options import OptionError
from rcoord.spark.write import make_producer, write_rows
from rcoord.topics import TopicError, Topics

# A batch write task's producer (an id Redis allocates) and a stream's (named, epoch = batch).
PRODUCERS = [pytest.param(None, None, id="batch"), pytest.param("spark:q:0", 4, id="stream")]


def _log_end(topics: Topics, topic: str) -> int:
    return sum(p.log_end_offset for p in topics.describe(topic).partitions)


@pytest.mark.parametrize(("producer_id", "epoch"), PRODUCERS)
def test_a_row_naming_a_partition_the_topic_lacks_leaves_no_other_topics_rows_written(
        single_client: Any, namespace: str, topics: Topics, producer_id: str | None,
        epoch: int | None) -> None:
    # Before: topic a's row (placed first) was appended, then b's batch was refused with
    # UNKNOWN_TOPIC_OR_PARTITION "b has no partition 5 (count 1)": the task failed with a's
    # row written. Rows the other way round (b's first) wrote nothing.
    topics.create("a", 1)
    topics.create("b", 1)
    rows = [{"topic": "a", "value": b"fine"}, {"topic": "b", "value": b"bad", "partition": 5}]
    producer = make_producer(single_client, namespace, producer_id, epoch)
    with pytest.raises((TopicError, OptionError), match="partition 5"):
        write_rows(producer, rows, None)
    assert (_log_end(topics, "a"), _log_end(topics, "b")) == (0, 0)


@pytest.mark.parametrize(("producer_id", "epoch"), PRODUCERS)
def test_a_row_larger_than_max_request_size_leaves_no_other_topics_rows_written(
        single_client: Any, namespace: str, topics: Topics, producer_id: str | None,
        epoch: int | None) -> None:
    # Before: a's row was appended, then b's row failed with MESSAGE_TOO_LARGE "b: record 0 is
    # 100 bytes ...; nothing of this call was appended", while a's was.
    topics.create("a", 1)
    topics.create("b", 1)
    rows = [{"topic": "a", "value": b"fine"}, {"topic": "b", "value": b"x" * 100}]
    producer = make_producer(single_client, namespace, producer_id, epoch, max_request_size=64)
    with pytest.raises(TopicError) as err:
        write_rows(producer, rows, None)
    assert err.value.error == Errors.MESSAGE_TOO_LARGE
    assert (_log_end(topics, "a"), _log_end(topics, "b")) == (0, 0)
