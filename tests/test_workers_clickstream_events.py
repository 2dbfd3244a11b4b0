"""The clickstream pipeline's event times and late records, on a real SparkSession over Spark's
Parquet file source (``build_query(source=...)``): one file per micro-batch, no Redis."""

from __future__ import annotations

import datetime as dt
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark", reason="pyspark is not installed (pip install -e '.[spark]')")

from harness import wait_until

ROOT = Path(__file__).resolve().parent.parent
QUERY_S = 120
T0 = 1_700_000_000_000  # a multiple of the window
WINDOW_MS = 10_000
SCHEMA = "topic string, partition int, offset long, key binary, value binary, timestamp timestamp"

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    path = os.environ.get("PYTHONPATH", "")
    if str(ROOT) not in path.split(os.pathsep):
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), path) if p)
    from pyspark.sql import SparkSession

    session = (SparkSession.builder.master("local[1]").appName("rcoord-clickstream-events")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "1")
               .config("spark.sql.session.timeZone", "UTC").getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        session.stop()


class _Files:
    """A folder Spark's file source reads, one Parquet file of records a micro-batch."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        folder.mkdir()
        self.offset = 0

    def put(self, values: list[bytes], timestamp_ms: int = T0) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        n = len(values)
        when = dt.datetime.fromtimestamp(timestamp_ms / 1000, dt.UTC)
        table = pa.table({
            "topic": ["ev"] * n, "partition": pa.array([0] * n, pa.int32()),
            "offset": list(range(self.offset, self.offset + n)), "key": [b"k"] * n,
            "value": values, "timestamp": pa.array([when] * n, pa.timestamp("us", tz="UTC"))})
        tmp = self.folder / f".{self.offset}"
        pq.write_table(table, tmp)
        os.replace(tmp, self.folder / f"batch-{self.offset:06d}.parquet")  # Spark skips .files
        self.offset += n


def _query(spark: Any, tmp_path: Path, **kw: Any) -> tuple[Any, _Files]:
    from workers.clickstream import build_query

    files = _Files(tmp_path / "src")
    source = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).parquet(
        str(files.folder))
    query = build_query(spark, topics="ev", group="-", out=str(tmp_path / "out"),
                        trigger="100ms", source=source, window=f"{WINDOW_MS}ms", **kw)
    return query, files


def _processed(query: Any, records: int) -> None:
    sink = query._rcoord_sink
    wait_until(lambda: sink.records >= records or query.exception() is not None,
               timeout_s=QUERY_S)
    assert query.exception() is None, query.exception()


def test_a_ts_that_is_not_whole_milliseconds_falls_back_or_rounds_instead_of_failing(
        spark: Any, tmp_path: Path) -> None:
    # Spark 4 casts with ANSI on: "ts" written as a float (Python's time.time() * 1000),
    # in exponent form, as a word or past what a timestamp holds failed the cast, the query
    # died, and it died again on that record after every restart (its offset never committed).
    # A number is now taken to the millisecond; anything else is the record's timestamp.
    from workers.clickstream import read_counts

    query, files = _query(spark, tmp_path)
    try:
        files.put([json.dumps({"ts": T0 + 25_000}).encode(),      # whole: window T0+20s
                   json.dumps({"ts": T0 + 31_000.5}).encode(),    # a float: window T0+30s
                   b'{"ts": 1.70000004E12}',                      # exponent: window T0+40s
                   b'{"ts": "soon"}', b'{"ts": true}', b'{"ts": 1e300}',
                   b'{"ts": 9000000000000000000}', b"not json"],  # the record's timestamp
                  timestamp_ms=T0 + 1_000)
        _processed(query, 8)
    finally:
        query.stop()
    assert read_counts(tmp_path / "out") == {
        (T0, "k"): 5, (T0 + 20_000, "k"): 1, (T0 + 30_000, "k"): 1, (T0 + 40_000, "k"): 1}
