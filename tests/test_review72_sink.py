"""Review 72: the Spark sink's fencing of attempts that run at the same time (no Spark).

A write task attempt reads its producer's state (``epoch_states``) and then, in another round
trip, the append log (``epoch_appends``). It resumes its numbering after the state's last
sequence, but counts every record the log names, which may be more: an attempt of the same id
and epoch still running (the original of a speculative copy, a zombie) can append between the
two reads.
"""

from __future__ import annotations

from typing import Any

import pytest

from rcoord.spark import retry
from rcoord.spark.write import make_producer, write_rows
from rcoord.topics import ProducerRecord, Topics, fetch


@pytest.fixture
def topics(single_client: Any, namespace: str) -> Topics:
    return Topics(single_client, namespace)


def test_an_append_between_reading_the_state_and_the_log_loses_no_identical_row(
        single_client: Any, namespace: str, topics: Topics,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Four identical rows (interchangeable: docs/guarantees.md, "The Spark pattern"). The
    # first attempt stores one, the second reads the state (last sequence 0), the first
    # stores two more (sequences 1, 2; the log now names three records), the second reads
    # the log: it checks three rows off and sends the fourth at sequence 1, which the
    # partition answers as a duplicate of the record it checked off already. It reports
    # success; the first attempt, killed as Spark does once a copy succeeds, never sends
    # the fourth: three of four rows stored.
    topics.create("t", 1)
    rows = [{"value": b"y", "partition": 0}] * 4
    first = make_producer(single_client, namespace, "spark:q:0", 3)
    first.send_batch("t", [ProducerRecord(b"y", partition=0)])

    real = retry.epoch_appends

    def first_appends_meanwhile(*args: Any, **kw: Any) -> Any:
        first.send_batch("t", [ProducerRecord(b"y", partition=0)] * 2)
        return real(*args, **kw)

    monkeypatch.setattr(retry, "epoch_appends", first_appends_meanwhile)
    try:
        second = write_rows(make_producer(single_client, namespace, "spark:q:0", 3), rows, "t")
    except retry.AttemptConflict:
        return  # failing is sound too: Spark runs the task again, and that attempt reads all
    stored = [r.value for r in fetch(single_client, namespace, "t", 0, 0).records]
    assert len(stored) == len(rows), (
        f"the second attempt reported {second.appended} appended and {second.duplicates} "
        f"already stored of {len(rows)} rows; the partition holds {len(stored)}")
