"""Spark pipeline benchmark: workers/clickstream over rcoord in group mode, vs Parquet files.

Run from the repository root (needs the spark extra and Java 17+)::

    python bench/spark_pipeline.py              # N=200,000 records (~3-4 min on 2 vCPU)
    python bench/spark_pipeline.py --records 50000
    python bench/spark_pipeline.py --redis-url redis://127.0.0.1:6379/0

Sections (one SparkSession, local[2]; a warm-up query first, so the cold start of Spark's
Python workers is not in any figure):

1. **Throughput.** N click events (JSON values with an event time, 7 keys) are produced into a
   6-partition topic first. The pipeline (the same windowed count and Parquet sink for every
   row) runs with one instance, then with two instances of the same group in the same Spark
   application (they share local[2]'s two cores); the rate is N / (time from the first query's
   start to the moment the sinks have seen N records).
2. **Ceiling.** The same records, written once as Parquet files (not timed), read by the same
   pipeline through Spark's file source (``readStream.parquet``): the best this machine does
   for this pipeline without rcoord.
3. **Hand-over.** Two caught-up instances; one stops gracefully (commits and leaves the group),
   one record is produced into every partition right after, and the time is from the stop to
   the surviving instance's first output file for a partition it gained. Repeated; median.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
_path = os.environ.get("PYTHONPATH", "")
if str(ROOT) not in _path.split(os.pathsep):
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), _path) if p)

from rcoord import CoordinatorConfig, GroupCoordinator
from rcoord.client import client_from_url
from rcoord.protocol.consumer import ConsumerProtocolAssignment
from rcoord.topics import Producer, ProducerRecord, Topics
from workers.clickstream import build_query, stop_gracefully

TOPIC = "events"
PARTITIONS = 6
T0 = 1_700_000_000_000
OPTS = {"sessionTimeoutMs": "6000", "heartbeatIntervalMs": "300", "rebalanceTimeoutMs": "20000",
        "maxOffsetsPerTrigger": "50000"}
WAIT_S = 600.0


def produce(r: Any, ns: str, n: int, start: int = 0) -> None:
    producer = Producer(r, ns)
    chunk = []
    for i in range(start, start + n):
        key = f"u{i % 7}"
        chunk.append(ProducerRecord(json.dumps({"ts": T0 + i * 10}).encode(), key.encode(),
                                    i % PARTITIONS))
        if len(chunk) == 5000:
            producer.send_batch(TOPIC, chunk)
            chunk = []
    if chunk:
        producer.send_batch(TOPIC, chunk)


def wait(cond: Any, what: str, timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.02)


def seen(queries: list[Any]) -> int:
    for q in queries:
        if q.exception() is not None:
            raise RuntimeError(f"query failed: {q.exception()}")
    return sum(q._rcoord_sink.records for q in queries)


def members(coord: GroupCoordinator, group: str) -> dict[str, list[int]]:
    desc = coord.describe_group(group)
    if str(desc.state).lower() != "stable":
        return {}
    return {m.member_id: sorted(tp.partition for tp in
                                ConsumerProtocolAssignment.decode(m.assignment).partitions)
            for m in desc.members}


def run_rcoord(spark: Any, url: str, ns: str, n: int, instances: int, out: str) -> float:
    group = f"g{uuid.uuid4().hex[:6]}"
    t = time.monotonic()
    qs = [build_query(spark, topics=TOPIC, group=group, out=out, url=url, namespace=ns,
                      trigger="200ms", options=OPTS) for _ in range(instances)]
    wait(lambda: seen(qs) >= n, "rcoord pipeline did not finish")
    elapsed = time.monotonic() - t
    for q in qs:
        q.stop()
    return n / elapsed


def run_parquet(spark: Any, files: str, n: int, out: str) -> float:
    schema = spark.read.parquet(files).schema
    src = spark.readStream.schema(schema).option("maxFilesPerTrigger", 1000).parquet(files)
    t = time.monotonic()
    q = build_query(spark, topics=TOPIC, group="-", out=out, trigger="200ms", source=src)
    wait(lambda: seen([q]) >= n, "parquet pipeline did not finish")
    elapsed = time.monotonic() - t
    q.stop()
    return n / elapsed


def handover(spark: Any, coord: GroupCoordinator, r: Any, url: str, ns: str, out: str,
             produced: int) -> tuple[float, int]:
    """Seconds from a graceful stop to the survivor's first output for a gained partition."""
    group = f"h{uuid.uuid4().hex[:6]}"
    qa = build_query(spark, topics=TOPIC, group=group, out=out, url=url, namespace=ns,
                     trigger="200ms", options=OPTS)
    wait(lambda: seen([qa]) >= produced, "first instance did not catch up")
    qb = build_query(spark, topics=TOPIC, group=group, out=out, url=url, namespace=ns,
                     trigger="200ms", options=OPTS)
    wait(lambda: len(members(coord, group)) == 2, "second instance did not join")
    before = members(coord, group)
    time.sleep(1.0)  # both idle and committed
    ends = {p.partition: p.log_end_offset for p in Topics(r, ns).describe(TOPIC).partitions}
    t = time.monotonic()
    stop_gracefully(qa, timeout_s=5)
    produce(r, ns, PARTITIONS, produced)
    after: dict[str, list[int]] = {}

    def survivor_wrote() -> bool:
        nonlocal after
        if not after:
            after = members(coord, group)
            if len(after) != 1:
                after = {}
                return False
        (mid,) = after
        gained = set(after[mid]) - set(before.get(mid, []))
        return any(any(Path(out, "counts", f"topic={TOPIC}", f"partition={p}").glob(
            f"start-{ends[p]}.gen-*.parquet")) for p in gained)

    wait(survivor_wrote, "survivor never processed a gained partition", 60)
    elapsed = time.monotonic() - t
    stop_gracefully(qb, timeout_s=5)
    return elapsed, produced + PARTITIONS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--handovers", type=int, default=3)
    parser.add_argument("--redis-url", default=None)
    args = parser.parse_args()

    server = None
    url = args.redis_url
    if url is None:
        from rcoord.testing.embedded import EmbeddedServer

        server = EmbeddedServer().start()
        url = server.url
    work = tempfile.mkdtemp(prefix="rcoord-spark-bench-")
    ns = f"sb{uuid.uuid4().hex[:8]}"
    r = client_from_url(url)
    spark = None
    try:
        coord = GroupCoordinator(r, CoordinatorConfig(
            namespace=ns, group_min_session_timeout_ms=10,
            group_initial_rebalance_delay_ms=0)).start()
        Topics(r, ns).create(TOPIC, PARTITIONS)
        t = time.monotonic()
        produce(r, ns, args.records)
        print(f"produced {args.records} records in {time.monotonic() - t:.1f} s", flush=True)

        from pyspark.sql import SparkSession

        spark = (SparkSession.builder.master("local[2]").appName("rcoord-bench")
                 .config("spark.ui.enabled", "false")
                 .config("spark.ui.showConsoleProgress", "false")
                 .config("spark.sql.shuffle.partitions", "2").getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        from rcoord.spark import register

        register(spark)
        # Warm-up (cold Python workers) and the Parquet copy of the records, untimed.
        files = os.path.join(work, "parquet")
        (spark.read.format("rcoord").option("url", url).option("namespace", ns)
         .option("subscribe", TOPIC).load().repartition(PARTITIONS).write.parquet(files))
        print("warm-up done", flush=True)

        rows = []
        n = args.records
        rows.append(("pipeline over rcoord, 1 instance (group mode)",
                     run_rcoord(spark, url, ns, n, 1, os.path.join(work, "o1"))))
        rows.append(("pipeline over rcoord, 2 instances (same group, same app)",
                     run_rcoord(spark, url, ns, n, 2, os.path.join(work, "o2"))))
        rows.append(("pipeline over Parquet files (Spark file source): ceiling",
                     run_parquet(spark, files, n, os.path.join(work, "o3"))))
        times = []
        produced = n
        for i in range(args.handovers):  # (a group of its own each, so an output of its own)
            secs, produced = handover(spark, coord, r, url, ns, os.path.join(work, f"oh{i}"),
                                      produced)
            times.append(secs)

        print()
        print(f"Spark pipeline benchmark: {n} records, {PARTITIONS} partitions, local[2], "
              f"{platform.machine()} {os.cpu_count()} CPUs")
        print(f"| {'measure':<58} | {'value':>16} |")
        print(f"|{'-' * 60}|{'-' * 18}|")
        ceiling = rows[2][1]
        for name, rate in rows:
            print(f"| {name:<58} | {rate:>10,.0f} rec/s |")
        for label, (_, rate) in zip(("1 instance / ceiling", "2 instances / ceiling"), rows):
            print(f"| {label:<58} | {rate / ceiling:>15.0%} |")
        print(f"| {'graceful leave -> survivor first batch, median':<58} | "
              f"{statistics.median(times):>14.2f} s |")
        print(f"| {'  all trials':<58} | {', '.join(f'{x:.2f}' for x in times):>16} |")
    finally:
        if spark is not None:
            spark.stop()
        try:
            for key in r.scan_iter(match=f"{ns}:*", count=1000):
                r.delete(key)
        finally:
            r.close()
            if server is not None:
                server.stop()
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
