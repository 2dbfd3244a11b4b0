"""Records as rows of Spark's Kafka schema, built as Arrow record batches.

Arrow batches go to the JVM without a per-value Python conversion (about twice as fast as
tuples for a million rows, see ``/work/shared/notes/pyspark.md``). ``pyarrow`` is imported only
when a batch is built, in the executor's Python worker.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..topics import Record

__all__ = ["COLUMNS", "SCHEMA_DDL", "SCHEMA_STRING", "TIMESTAMP_TYPE_LOG_APPEND", "arrow_schema",
           "records_to_batch"]

COLUMNS = (
    ("key", "binary"), ("value", "binary"), ("topic", "string"), ("partition", "int"),
    ("offset", "bigint"), ("timestamp", "timestamp"), ("timestampType", "int"),
    ("headers", "array<struct<key:string,value:binary>>"),
)
"""The row schema of Spark's Kafka source, column for column: (name, Spark type name)."""

_DDL_TYPES = {"timestamp": "timestamp_ltz"}
"""DDL spellings where a type's ``simpleString`` is not what DDL means by it: DDL's bare
``timestamp`` is the session's ``spark.sql.timestampType``, so a session set to TIMESTAMP_NTZ
made the column ``timestamp_ntz``, and the reader refused its own schema as one given with
``.schema(...)``. Spark's Kafka source's timestamp is always ``TimestampType``, as the Arrow
rows' (UTC) is."""

SCHEMA_DDL = ", ".join(f"{name} {_DDL_TYPES.get(kind, kind)}" for name, kind in COLUMNS)
"""``COLUMNS`` as DDL: the data source's ``schema()``."""

SCHEMA_STRING = "struct<" + ",".join(f"{name}:{kind}" for name, kind in COLUMNS) + ">"
"""``COLUMNS`` as Spark's ``StructType.simpleString()`` writes it: what a reader is handed."""

TIMESTAMP_TYPE_LOG_APPEND = 1
"""Kafka's LogAppendTime: the timestamp is the partition node's Redis ``TIME`` at append."""


def arrow_schema() -> Any:
    import pyarrow as pa

    header = pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])
    return pa.schema([
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", pa.timestamp("us", tz="UTC")),
        pa.field("timestampType", pa.int32()),
        pa.field("headers", pa.list_(header)),
    ])


def records_to_batch(topic: str, partition: int, records: Sequence[Record]) -> Any:
    """One ``pyarrow.RecordBatch`` of the records of one partition."""
    import pyarrow as pa

    schema = arrow_schema()
    n = len(records)
    # header_list: every header in order, repeated names and null values included, as
    # Spark's Kafka source gives them (``headers`` keeps one value per name); a record without
    # headers has null, not an empty array, as there.
    headers = [
        [{"key": k, "value": v} for k, v in r.header_list] if r.header_list else None
        for r in records
    ]
    return pa.RecordBatch.from_arrays(
        [
            pa.array([r.key for r in records], pa.binary()),
            pa.array([r.value for r in records], pa.binary()),
            pa.array([topic] * n, pa.string()),
            pa.array([partition] * n, pa.int32()),
            pa.array([r.offset for r in records], pa.int64()),
            pa.array([r.timestamp_ms * 1000 for r in records], pa.timestamp("us", tz="UTC")),
            pa.array([TIMESTAMP_TYPE_LOG_APPEND] * n, pa.int32()),
            pa.array(headers, schema.field("headers").type),
        ],
        schema=schema,
    )
