"""The clickstream pipeline's event times and late records, on a real SparkSession over Spark's
Parquet file source (``build_query(source=...)``): one file per micro-batch, no Redis."""

from __future__ import annotations

import datetime as dt
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark", reason="pyspark is not installed (pip install -e '.[spark]')")

from harness import prepare_spark_env, wait_until

ROOT = Path(__file__).resolve().parent.parent
QUERY_S = 120
T0 = 1_700_000_000_000  # a multiple of the window
WINDOW_MS = 10_000
SCHEMA = "topic string, partition int, offset long, key binary, value binary, timestamp timestamp"

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    prepare_spark_env(ROOT)  # (Spark's Python workers import this checkout's rcoord)
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


def test_a_record_is_late_once_its_window_ends_at_the_batchs_own_watermark(
        spark: Any, tmp_path: Path) -> None:
    # As Spark's windowed aggregation: a record counts until the watermark Spark runs its
    # micro-batch with (the newest event time of the batches before, minus --watermark) reaches
    # its window's end. Before, the sink took the watermark of the batch before (one batch
    # stale, from lastProgress) and compared it with the record's own event time: a record
    # behind the watermark in a window still open was dropped, and one 9 minutes behind the
    # watermark, right after the watermark jumped, was counted.
    from workers.clickstream import read_counts

    query, files = _query(spark, tmp_path, watermark="1m")
    sent = 0
    try:
        for ts in (T0, T0 + 65_000,  # the watermark is T0 + 5 s from the next batch on
                   T0 + 66_000,
                   T0 + 1_000,  # behind the watermark, in the window [T0, T0 + 10 s): counts
                   T0 + 600_000,  # the watermark is T0 + 540 s from the next batch on
                   T0 + 20_000):  # its window ended 510 s before the watermark: late
            files.put([json.dumps({"ts": ts}).encode()])
            sent += 1
            _processed(query, sent)
        assert query._rcoord_sink.late == 1
    finally:
        query.stop()
    assert read_counts(tmp_path / "out") == {
        (T0, "k"): 2, (T0 + 60_000, "k"): 2, (T0 + 600_000, "k"): 1}


def test_a_replay_whose_first_records_were_trimmed_supersedes_the_zombies_file(
        spark: Any, tmp_path: Path) -> None:
    # Generation 5's member read offsets 5-9 of ev-0 and wrote them (start 5), but never
    # committed: a zombie. Generation 6's member planned the same batch from the committed
    # offset 5, and retention trimmed 5-6 before it read (failOnDataLoss=false). Its file was
    # named by its smallest offset, start 7, which superseded nothing: 7-9 were counted twice.
    # It is named by where the plan began the partition, and replaces the zombie's.
    from workers.clickstream import _Sink, read_counts

    out, cp = tmp_path / "out", tmp_path / "cp"
    (cp / "offsets").mkdir(parents=True)
    meta = json.dumps({"batchWatermarkMs": 0, "batchTimestampMs": 1, "conf": {}})
    end = {"offsets": {"ev": {"0": 10}}, "starts": {"ev": {"0": 5}}, "generation": 6,
           "member": "m-6"}
    (cp / "offsets" / "0").write_text("\n".join(["v1", meta, json.dumps(end)]))
    zombie = _Sink(str(out), WINDOW_MS, str(cp))
    zombie._write("ev", 0, 5, [{"ws": T0, "k": "k", "n": 5}], 5)
    sink = _Sink(str(out), WINDOW_MS, str(cp))
    sink.batches = 1  # (the planned generation, without asking Redis about a replay)
    batch = spark.createDataFrame(
        [("ev", 0, offset, "k", T0 + offset) for offset in (7, 8, 9)],
        "topic string, partition int, offset long, k string, event_ms long")
    sink(batch, 0)
    assert read_counts(out) == {(T0, "k"): 3}
    assert sorted(p.name for p in (out / "counts" / "topic=ev" / "partition=0").iterdir()) \
        == ["start-5.gen-6.parquet"]


def test_a_zombies_batch_written_after_its_successor_began_past_a_trim_does_not_count(
        spark: Any, tmp_path: Path) -> None:
    # Generation 6's member began ev-0 at 7 (offsets 5-6 trimmed before it planned) and wrote
    # 7-9. Generation 5's zombie, planned at the committed offset 5 up to 10 before the trim,
    # writes its batch of 5-9 after that. The sink names the file's end from the batch's
    # planned end in the offset log, so the zombie's own settling sees that generation 6 began
    # before it and deletes it. Before, only files of one start superseded each other, and
    # 7-9 were counted twice.
    from workers.clickstream import _Sink, read_counts

    out, cp = tmp_path / "out", tmp_path / "cp"
    (cp / "offsets").mkdir(parents=True)
    meta = json.dumps({"batchWatermarkMs": 0, "batchTimestampMs": 1, "conf": {}})
    end = {"offsets": {"ev": {"0": 10}}, "starts": {"ev": {"0": 5}}, "generation": 5,
           "member": "m-5"}
    (cp / "offsets" / "0").write_text("\n".join(["v1", meta, json.dumps(end)]))
    _Sink(str(out), WINDOW_MS, str(tmp_path / "cp6"))._write(
        "ev", 0, 7, [{"ws": T0, "k": "k", "n": 3}], 6, end=10)
    zombie = _Sink(str(out), WINDOW_MS, str(cp))
    zombie.batches = 1  # (the planned generation, without asking Redis about a replay)
    batch = spark.createDataFrame(
        [("ev", 0, offset, "k", T0 + offset) for offset in (5, 6, 7, 8, 9)],
        "topic string, partition int, offset long, k string, event_ms long")
    zombie(batch, 0)
    assert read_counts(out) == {(T0, "k"): 3}
    assert sorted(p.name for p in (out / "counts" / "topic=ev" / "partition=0").iterdir()) \
        == ["start-7.gen-6.parquet"]
