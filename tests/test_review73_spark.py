"""Review 73 of the Spark data source's read path against Spark's Kafka source: reproductions
of defects.

Each test fails on the code it was written against; none needs a JVM.
"""

from __future__ import annotations

from typing import Any

import pytest

from rcoord.spark.options import ReadKind, parse_read_options
from rcoord.topics import Producer, ProducerRecord, Topics

pytestmark = [pytest.mark.spark, pytest.mark.timeout(120)]


def _send(client: Any, namespace: str, prefix: str, n: int) -> None:
    Producer(client, namespace).send_batch(
        "ev", [ProducerRecord(f"{prefix}{i}".encode(), None, 0) for i in range(n)])


@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_a_topic_created_again_while_a_task_reads_it_is_not_read_as_the_planned_one(
        redis_server: Any, single_client: Any, namespace: str, fail_on_data_loss: bool) -> None:
    source = pytest.importorskip("rcoord.spark.source")  # pyspark, but no JVM
    resolve = pytest.importorskip("rcoord.spark.resolve")
    topics = Topics(single_client, namespace)
    topics.create("ev", 1)
    _send(single_client, namespace, "old", 6)
    opts = {"url": redis_server.url, "namespace": namespace, "subscribe": "ev",
            "fetchSize": "2", "failOnDataLoss": str(fail_on_data_loss).lower()}
    reader = source.BatchReader(parse_read_options(opts, ReadKind.BATCH, env={}))
    (task,) = reader.partitions()  # ev-0, offsets 0..5 of the topic as it is now
    chunks = iter(reader.read(task))
    assert next(chunks).column("value").to_pylist() == [b"old0", b"old1"]
    # While the task reads (between two of its fetches), the topic is deleted and created
    # again, and the new topic gets records at the offsets the task has yet to read.
    topics.delete("ev")
    topics.create("ev", 1)
    _send(single_client, namespace, "new", 6)
    read: list[bytes] = []

    def rest() -> None:
        for chunk in chunks:
            read.extend(chunk.column("value").to_pylist())

    if fail_on_data_loss:
        # Before: no error, and the task's rows were old0, old1, new2, new3, new4, new5: one
        # range of one planned topic, half of it another topic's records.
        with pytest.raises(resolve.DataLossError, match="created again"):
            rest()
    else:
        rest()
    assert not [v for v in read if v.startswith(b"new")], read
