"""Rows to records for the ``rcoord`` sink, and the producer a write task uses (no Spark).

Columns follow Spark's Kafka sink: ``value`` (required; binary or string), optional ``key``,
``topic`` (used only when no ``topic`` option is set: the option wins, as in Spark's Kafka sink,
so a stream read from one topic, whose rows carry its name, can be written to another),
``partition`` (else the producer's murmur2 partitioner for keyed records) and ``headers``
(array of (key string, value binary) structs).

A streaming write task appends through an idempotent producer (KIP-98) whose id names the query
and the task's partition and whose epoch is the micro-batch id, so a batch Spark runs again
after a failure appends nothing twice. A first attempt numbers its records per partition from
0 within the epoch. An attempt that finds records stored under its id and epoch (a retried,
speculative or replayed task) checks its rows off against them by content, in whatever order
they come, and appends only the others (``retry``): after a shuffle, Spark does not keep a
task's row order across attempts. Keyless rows go by a sticky partitioner seeded by the
producer id and epoch, and every row is placed as it comes, those an attempt skips too, so an
attempt that sees the same order places each row the same way and numbers it alike: one that
takes over from an attempt still running (a speculative copy, a zombie's retry) finds that
one's rows under its own numbers, the same rows.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Iterable, Mapping
from typing import Any

from ..errors import Errors
from ..topics import Producer, ProducerRecord, RecordMetadata, TopicError
from ..topics.producer import MAX_REQUEST_SIZE
from .options import OptionError
from .retry import AttemptConflict, EarlierAttempts, check_duplicates

__all__ = ["WriteResult", "check_write_plan", "make_producer", "row_to_record", "write_rows"]

log = logging.getLogger("rcoord.spark")

_BATCH = 1000


def _bytes(name: str, value: Any) -> bytes | None:
    if value is None:
        return None
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, str):
        return value.encode()
    raise TypeError(f"column {name} must be binary or string, got {type(value).__name__}")


_TYPES = {
    "topic": ("string",),
    "key": ("string", "binary"),
    "value": ("string", "binary"),
    "partition": ("int", "bigint", "smallint", "tinyint"),
    "headers": ("array<struct<key:string,value:binary>>", "array<struct<key:string,value:string>>"),
}
"""The Spark SQL types (``DataType.simpleString()``) each column a write reads may have: those
Spark's Kafka sink takes, and the other integer types for ``partition`` and string header
values, which ``row_to_record`` converts exactly."""


def check_write_plan(columns: Iterable[str], topic_option: str | None, overwrite: bool,
                     types: Mapping[str, str] | None = None) -> None:
    """What a write can be told before any task runs (Spark's Kafka sink checks the same when
    the query is analysed), so a bad write fails once, naming what to change, not in every
    task: at ``save()``, and for a stream at its first micro-batch (Spark makes a Python
    stream writer only when it plans that batch, so ``start()`` returns and the query stops
    with this error before any task runs).

    * ``overwrite``: a topic is a log, so a batch write only appends; Spark's Kafka sink refuses
      ``Overwrite`` too. Before, ``mode("overwrite")`` appended silently. (The default
      ``ErrorIfExists`` never reaches a data source: Spark refuses it for Python data sources
      and asks for Append or Overwrite, so the message here says which.)
    * a ``value`` column, and a topic: the ``topic`` option or a ``topic`` column. Names are
      matched exactly, as each task's rows are read (``row_to_record``) and as Spark's Kafka
      sink finds its columns: a ``Value`` column passed this check, then failed in every task.
    * with ``types`` (column -> ``DataType.simpleString()``), the type of each column a write
      reads (``_TYPES``), as Spark's Kafka sink checks them: an int ``value`` or a string
      ``partition`` failed in every task before. A ``void`` column (all null: ``lit(None)``)
      is read as None, except ``topic`` and ``value``: a void ``value`` wrote a null value in
      every record, almost surely by mistake (a string or binary column's nulls are still
      written, as in Spark). Spark's sink refuses every void column; a void ``key``,
      ``partition`` or ``headers`` means what leaving the column out means, so it is taken.
    """
    if overwrite:
        raise OptionError('mode: an rcoord topic is a log that writes only append to; use '
                          '.mode("append") (Spark\'s Kafka sink refuses Overwrite too)')
    names = set(columns)
    if "value" not in names:
        raise OptionError("value: a write needs a value column (binary or string, named in "
                          f"lower case); the DataFrame has {sorted(names)}")
    if not topic_option and "topic" not in names:
        raise OptionError("topic: set .option('topic', NAME) or give the DataFrame a topic "
                          f"column; it has {sorted(names)}")
    for name, allowed in _TYPES.items():
        if name == "topic" and topic_option:
            continue  # the option wins; the column is not read
        given = (types or {}).get(name)
        if given == "void" and name == "value":
            raise OptionError("value: the value column is void (a null literal, e.g. lit(None)), "
                              "so every record would have a null value; Spark's Kafka sink "
                              "refuses it too. To write null values on purpose, cast it: "
                              "col('value').cast('binary')")
        if given is None or (given == "void" and name != "topic"):  # all null: read as None
            continue
        if given.replace(" ", "").lower() not in allowed:
            raise OptionError(f"{name}: the {name} column is {given}; a write takes "
                              f"{' or '.join(allowed)} (cast it, e.g. "
                              f"col('{name}').cast('{allowed[0]}'))")


def row_to_record(row: Mapping[str, Any], default_topic: str | None) -> tuple[str, ProducerRecord]:
    """(topic, record) for one row given as a mapping of column name to value."""
    if "value" not in row:
        raise OptionError("value: a write needs a value column (binary or string)")
    topic = default_topic or row.get("topic")
    if not topic:
        raise OptionError("topic: a row's topic is null or empty (or the DataFrame has no "
                          "topic column) and no topic option is set")
    headers: list[tuple[str, bytes | None]] | None = None
    raw_headers = row.get("headers")
    if raw_headers:
        # Pairs in order: a row may repeat a header name, and each is kept (as Kafka does).
        headers = []
        for h in raw_headers:
            if h is None:  # (h[0] failed with "'NoneType' object is not subscriptable")
                raise OptionError("headers: a header (an element of the headers array) is null; "
                                  "every header needs a key: drop the null ones, e.g. "
                                  "filter(col('headers'), lambda h: h.isNotNull())")
            # By position, as Spark's sink: the struct's field names passed the check in any case.
            k, v = tuple(h.values()) if isinstance(h, Mapping) else (h[0], h[1])
            if k is None:  # (str() stored it as a header named 'None')
                raise OptionError("headers: a header's key is null; every header needs a key "
                                  "(its value may be null), as in Spark's Kafka sink")
            headers.append((str(k), _bytes("headers.value", v)))  # null stays null
    partition = row.get("partition")
    return str(topic), ProducerRecord(
        value=_bytes("value", row.get("value")),
        key=_bytes("key", row.get("key")),
        partition=None if partition is None else int(partition),
        headers=headers,
    )


def make_producer(client: Any, namespace: str, producer_id: str | None,
                  epoch: int | None, max_request_size: int = MAX_REQUEST_SIZE) -> Producer:
    """An idempotent producer named ``producer_id`` at ``epoch`` (a streaming write task), or
    one with an id Redis allocates (a batch write task: only its own retried calls dedupe).

    A named producer logs its appends, so a later attempt of the same id and epoch reads back
    what this one stored and checks its rows off by content (``retry``), in whatever order
    they come. Its keyless records are partitioned with a random generator seeded by its id and
    epoch, so an attempt that sees the same rows in the same order places them the same way
    (before the content check, sequence numbers alone decided: unseeded, a retry of 3,000
    keyless rows over 4 partitions stored 68 rows twice and lost 68 others)."""
    if producer_id is None:
        return Producer(client, namespace, max_request_size=max_request_size)
    epoch = int(epoch or 0)
    # log_appends: a later attempt reads back what this one stored (rcoord.spark.retry).
    return Producer(client, namespace, idempotent=True, producer_id=producer_id,
                    producer_epoch=epoch, rng=random.Random(f"{producer_id}:{epoch}"),
                    log_appends=True, max_request_size=max_request_size)


class WriteResult:
    """Counts of one write task: records appended and rows found already stored (by an
    earlier attempt, or by this one's own call that a lost reply made run twice)."""

    def __init__(self) -> None:
        self.appended = 0
        self.duplicates = 0

    def add(self, metas: Iterable[RecordMetadata]) -> None:
        for m in metas:
            if getattr(m, "duplicate", False):
                self.duplicates += 1
            else:
                self.appended += 1


def write_rows(producer: Producer, rows: Iterable[Mapping[str, Any]],
               default_topic: str | None) -> WriteResult:
    """Append every row, in order, in batches of up to 1000 per topic.

    With a producer that logs its appends (``make_producer`` with an id), rows an earlier
    attempt of the same id and epoch stored are skipped, whatever their order
    (``retry.EarlierAttempts``). Raises ``retry.AttemptConflict`` if a record came back as a
    duplicate of a different row, or the partition refused its sequence numbers
    (OUT_OF_ORDER_SEQUENCE_NUMBER: another attempt appending at the same time, under the same
    id and epoch, skipped or used them); the next attempt reads back what was stored.
    """
    result = WriteResult()
    earlier = EarlierAttempts(producer) if producer.logs_appends else None
    pending: dict[str, list[ProducerRecord]] = {}
    count = 0

    def flush() -> None:
        for t, recs in pending.items():
            try:
                metas = producer.send_batch(t, recs)
            except TopicError as exc:
                if exc.error != Errors.OUT_OF_ORDER_SEQUENCE_NUMBER:
                    raise
                raise AttemptConflict(
                    f"{t}: producer {producer.producer_id} epoch {producer.producer_epoch}: the "
                    f"partition refused this attempt's sequence numbers ({exc.detail}); another "
                    "attempt of this task appends concurrently, or appended since this one "
                    "started. Failing this attempt so Spark runs it again") from exc
            check_duplicates(producer, t, recs, metas)
            result.add(metas)

    for row in rows:
        topic, rec = row_to_record(row, default_topic)
        # Every row is placed as it comes, a skipped one too: an attempt that takes over from
        # one still running in the same order (a speculative copy, a zombie's retry) then puts
        # each keyless row where that one does, under the same sequence number. Placed only
        # when sent, it placed them elsewhere, and each attempt found the other's rows under
        # its numbers: both failed, and rows were stored twice.
        placed = ProducerRecord(rec.value, rec.key, producer.choose_partition(topic, rec),
                                rec.headers)  # (replace() costs 3x)
        # A keyed row is checked off only in its key's partition: taken from any, it could
        # take the record of an explicit-partition row with the same content, which was then
        # appended again, and the keyed row's only copy sat outside its key's partition, where
        # no reader of that partition finds it. (Partitions added between attempts move a key:
        # its row is then stored twice, never misplaced.) Keyless rows go where the sticky
        # partitioner put them, which depends on the order rows come in: any partition.
        if earlier is not None and earlier.take(topic, rec if rec.key is None else placed):
            result.duplicates += 1
            continue
        pending.setdefault(topic, []).append(placed)
        count += 1
        if count >= _BATCH:
            flush()
            pending, count = {}, 0
    flush()
    return result
