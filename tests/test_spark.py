"""The rcoord data source on a real SparkSession (local[2]) against a real Redis.

One SparkSession for the whole module (JVM start-up costs seconds); every query is bounded by
``awaitTermination(timeout)`` or an explicit wait on a condition. Skipped only when pyspark is
not importable; CI installs the ``spark`` extra, so they run there.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pyspark = pytest.importorskip("pyspark", reason="pyspark is not installed (pip install -e "
                                                "'.[spark]' to run the Spark tests)")

from harness import prepare_spark_env, wait_until

from rcoord import CoordinatorConfig, GroupCoordinator
from rcoord.keys import GroupKeys
from rcoord.murmur2 import partition_for_key
from rcoord.protocol.consumer import ConsumerProtocolAssignment
from rcoord.topics import Producer, ProducerRecord, Topics, fetch

pytestmark = [pytest.mark.spark, pytest.mark.timeout(240)]

ROOT = Path(__file__).resolve().parent.parent
QUERY_S = 120  # bound of every awaitTermination / wait in this module
GROUP_OPTS = {"sessionTimeoutMs": "3000", "heartbeatIntervalMs": "300",
              "rebalanceTimeoutMs": "10000"}
WINDOW_MS = 10_000
# The test JVMs live for a minute: the quick (C1) compiler only and the serial collector start
# them and run these small jobs faster (about 12 s less for this module on two cores). They
# change how the JVM runs, not what Spark does.
JVM_OPTS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
T0 = 1_700_000_000_000


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    prepare_spark_env(ROOT)  # (Spark's Python workers import this checkout's rcoord)
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2]")
        .appName("rcoord-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.extraJavaOptions", JVM_OPTS)
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    from rcoord.spark import register

    register(session)
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture
def coord(single_client: Any, namespace: str) -> GroupCoordinator:
    cfg = CoordinatorConfig(namespace=namespace, group_min_session_timeout_ms=10,
                            group_initial_rebalance_delay_ms=0)
    return GroupCoordinator(single_client, cfg).start()


def reader(spark: Any, url: str, namespace: str, stream: bool = False) -> Any:
    base = spark.readStream if stream else spark.read
    return base.format("rcoord").option("url", url).option("namespace", namespace)


def committed(coord: GroupCoordinator, group: str) -> dict[int, int]:
    return {tp.partition: o.offset for tp, o in coord.fetch_offsets(group).offsets.items()}


def log_ends(topics: Topics, topic: str) -> dict[int, int]:
    return {p.partition: p.log_end_offset for p in topics.describe(topic).partitions}


def assignment(coord: GroupCoordinator, group: str) -> dict[str, list[int]]:
    """member id -> partitions, once the group is Stable (else {})."""
    desc = coord.describe_group(group)
    if str(desc.state).lower() != "stable":
        return {}
    return {m.member_id: sorted(tp.partition for tp in
                                ConsumerProtocolAssignment.decode(m.assignment).partitions)
            for m in desc.members}


# -- batch reads and writes --------------------------------------------------------------------


def test_batch_read_returns_exactly_a_range_with_every_column(spark: Any, redis_server: Any,
                                                              single_client: Any,
                                                              namespace: str) -> None:
    Topics(single_client, namespace).create("ev", 3)
    producer = Producer(single_client, namespace)
    for i in range(15):
        producer.send("ev", f"v{i}".encode(), key=None if i == 4 else f"k{i}".encode(),
                      partition=i % 3, headers={"n": str(i).encode()} if i % 2 else None)
    df = (reader(spark, redis_server.url, namespace).option("subscribe", "ev")
          .option("startingOffsets", '{"ev": {"0": 1, "1": -2, "2": -2}}')
          .option("endingOffsets", '{"ev": {"0": 4, "1": -1, "2": 2}}').load())
    assert [(f.name, f.dataType.simpleString()) for f in df.schema.fields] == [
        ("key", "binary"), ("value", "binary"), ("topic", "string"), ("partition", "int"),
        ("offset", "bigint"), ("timestamp", "timestamp"), ("timestampType", "int"),
        ("headers", "array<struct<key:string,value:binary>>")]
    got = sorted((r.partition, r.offset, r.key, r.value, r.topic, r.timestampType,
                  None if r.headers is None else {h.key: h.value for h in r.headers},
                  r.timestamp) for r in df.collect())
    want = []
    for p, lo, hi in ((0, 1, 4), (1, 0, 5), (2, 0, 2)):
        for rec in fetch(single_client, namespace, "ev", p, lo, max_records=hi - lo).records:
            import datetime as dt

            ts = dt.datetime.fromtimestamp(rec.timestamp_ms / 1000, dt.UTC)
            want.append((p, rec.offset, rec.key, rec.value, "ev", 1, rec.headers or None,
                         ts.replace(tzinfo=None)))
    assert got == sorted(want) and len(got) == 3 + 5 + 2


def test_a_session_whose_default_timestamp_is_ntz_reads_the_kafka_schema(
        spark: Any, redis_server: Any, single_client: Any, namespace: str) -> None:
    # schema()'s DDL said "timestamp", which Spark parses as the session's
    # spark.sql.timestampType: under TIMESTAMP_NTZ the reader was handed timestamp_ntz and
    # refused it as a schema given with .schema(...), so no read worked at all.
    Topics(single_client, namespace).create("ev", 1)
    Producer(single_client, namespace).send("ev", b"v", key=b"k")
    spark.conf.set("spark.sql.timestampType", "TIMESTAMP_NTZ")
    try:
        df = reader(spark, redis_server.url, namespace).option("subscribe", "ev").load()
        rows = df.collect()
    finally:
        spark.conf.unset("spark.sql.timestampType")
    types = {f.name: f.dataType.simpleString() for f in df.schema.fields}
    assert types["timestamp"] == "timestamp"
    assert [(r.key, r.value, r.offset) for r in rows] == [(b"k", b"v", 0)]


def test_bad_options_fail_naming_the_option(spark: Any, redis_server: Any, single_client: Any,
                                            namespace: str) -> None:
    Topics(single_client, namespace).create("ev", 1)
    cases = [
        ({"subscribe": "nope"}, "subscribe: unknown topic 'nope'"),
        ({"subscribe": "ev", "assign": '{"ev": [0]}'}, "give exactly one of subscribe"),
        ({"subscribe": "ev", "startingOffsets": '{"ev": {"0": '}, "startingOffsets: malformed"),
        ({"subscribe": "ev", "groupId": "g"}, "groupId: group mode is for streaming reads"),
        # a typo: Spark hands the name over lower-cased; before, it was ignored
        ({"subscribe": "ev", "startingOffset": "earliest"},
         "startingoffset: not an option of an rcoord read; did you mean startingOffsets"),
    ]
    for options, message in cases:
        with pytest.raises(Exception, match=message):
            reader(spark, redis_server.url, namespace).options(**options).load().collect()


def test_a_streams_bad_options_fail_at_load_naming_the_option(spark: Any, redis_server: Any,
                                                              namespace: str) -> None:
    # Spark's Kafka source checks a stream's options at load() (sourceSchema). Before, these
    # passed load() and start(), and the query then died with PYTHON_DATA_SOURCE_ERROR whose
    # last line was pyspark's runner's "UnboundLocalError: ... 'reader'".
    cases = [
        ({"subscribe": "ev", "maxOffsetPerTrigger": "5"},
         ("maxoffsetpertrigger: not an option of an rcoord read; did you mean "
          "maxOffsetsPerTrigger")),
        ({"assign": '{"ev": [0]}', "groupId": "g"}, "groupId: a group divides"),
        ({"subscribe": "ev", "sessionTimeoutMs": "6000"},
         "sessionTimeoutMs: only meaningful with groupId"),
        ({"subscribe": "ev", "kafka.bootstrap.servers": "x:9092"},
         "kafka.bootstrap.servers: rcoord reads and writes Redis"),
    ]
    for options, message in cases:
        with pytest.raises(Exception, match=message) as info:
            reader(spark, redis_server.url, namespace, stream=True).options(**options).load()
        assert "UnboundLocalError" not in str(info.value)
    assert spark.streams.active == []


def test_write_then_read_keeps_keys_values_headers_and_partitions(
        spark: Any, redis_server: Any, single_client: Any, namespace: str) -> None:
    Topics(single_client, namespace).create("out", 4)
    rows = [(f"k{i}".encode() if i % 3 else None, f"v{i}".encode(),
             i % 4 if i % 5 == 0 else None, [("h", str(i).encode())] if i % 2 else [])
            for i in range(24)]
    rows = [r for r in rows if r[0] is not None or r[2] is not None]  # keyless need a partition
    df = spark.createDataFrame(
        rows, "key binary, value binary, partition int, "
              "headers array<struct<key: string, value: binary>>")
    (df.write.format("rcoord").option("url", redis_server.url).option("namespace", namespace)
     .option("topic", "out").mode("append").save())
    back = reader(spark, redis_server.url, namespace).option("subscribe", "out").load().collect()
    got = sorted((r.value, r.key, r.partition,
                  None if r.headers is None else [(h.key, h.value) for h in r.headers])
                 for r in back)  # no headers read as null, as in Spark's Kafka source
    want = sorted((v, k, p if p is not None else partition_for_key(k, 4), h or None)
                  for k, v, p, h in rows)
    assert got == want


# -- streaming reads ---------------------------------------------------------------------------


def test_stream_honours_max_offsets_per_trigger_and_available_now(
        spark: Any, redis_server: Any, single_client: Any, namespace: str,
        tmp_path: Path) -> None:
    Topics(single_client, namespace).create("ev", 3)
    Producer(single_client, namespace, "round_robin").send_batch(
        "ev", [f"v{i}".encode() for i in range(40)])
    seen: list[list[tuple[int, int]]] = []

    def sink(batch: Any, batch_id: int) -> None:
        seen.append([(r.partition, r.offset) for r in batch.select("partition", "offset")
                     .collect()])

    q = (reader(spark, redis_server.url, namespace, stream=True).option("subscribe", "ev")
         .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "9").load()
         .writeStream.foreachBatch(sink).trigger(availableNow=True)
         .option("checkpointLocation", str(tmp_path / "cp")).start())
    assert q.awaitTermination(QUERY_S), "availableNow query did not end by itself"
    assert q.exception() is None
    sizes = [len(b) for b in seen if b]
    assert sizes and all(n <= 9 for n in sizes) and sizes.count(9) >= 4
    everything = sorted(x for b in seen for x in b)
    assert everything == sorted((p, o) for p, end in log_ends(
        Topics(single_client, namespace), "ev").items() for o in range(end))


def _src_and_dst(single_client: Any, namespace: str) -> Topics:
    """The topics of a copying query: ``src`` and ``dst``, two partitions each."""
    topics = Topics(single_client, namespace)
    topics.create("src", 2)
    topics.create("dst", 2)
    return topics


def test_replayed_micro_batch_does_not_append_twice(spark: Any, redis_server: Any,
                                                    single_client: Any, namespace: str,
                                                    tmp_path: Path) -> None:
    topics = _src_and_dst(single_client, namespace)
    Producer(single_client, namespace, "round_robin").send_batch(
        "src", [ProducerRecord(f"v{i}".encode(), f"k{i}".encode()) for i in range(20)])
    cp = tmp_path / "cp"

    def run() -> None:
        q = (reader(spark, redis_server.url, namespace, stream=True).option("subscribe", "src")
             .option("startingOffsets", "earliest").load().select("key", "value")
             .writeStream.format("rcoord").option("url", redis_server.url)
             .option("namespace", namespace).option("topic", "dst")
             .trigger(availableNow=True).option("checkpointLocation", str(cp)).start())
        assert q.awaitTermination(QUERY_S)
        assert q.exception() is None

    run()
    assert sum(log_ends(topics, "dst").values()) == 20
    # Forget that the last batch finished: Spark runs it again on restart (same query id,
    # same batch id, same rows), as after a crash between the sink and the commit log.
    last = max(int(p.name) for p in (cp / "commits").iterdir() if p.name.isdigit())
    (cp / "commits" / str(last)).unlink()
    (cp / "commits" / f".{last}.crc").unlink(missing_ok=True)  # Hadoop's checksum beside it
    run()
    assert sum(log_ends(topics, "dst").values()) == 20


# -- group mode --------------------------------------------------------------------------------


def _produce_events(single_client: Any, namespace: str, n: int, t0: int,
                    events: list[tuple[str, int]]) -> None:
    """n click events over 6 partitions (keys u0..u6, event times 100 ms apart)."""
    producer = Producer(single_client, namespace)
    recs = []
    for i in range(n):
        key, ts = f"u{i % 7}", t0 + i * 100
        events.append((key, ts))
        recs.append(ProducerRecord(json.dumps({"ts": ts}).encode(), key.encode(), i % 6))
    producer.send_batch("events", recs)


def _run_first_batch_then_stop(query: Any, cp: Path) -> None:
    """Wait until ``query`` (its next trigger far away) finished batch 0 (Spark's commit log
    has it), then stop it: batch 0's end was never committed to the group."""
    try:
        wait_until(lambda: (cp / "commits" / "0").exists() or query.exception() is not None,
                   timeout_s=QUERY_S)
        assert query.exception() is None
    finally:
        query.stop()


def _click_events(single_client: Any, namespace: str) -> tuple[Topics, list[tuple[str, int]]]:
    """The clickstream tests' topic, ``events`` (6 partitions), with 60 click events."""
    topics = Topics(single_client, namespace)
    topics.create("events", 6)
    events: list[tuple[str, int]] = []
    _produce_events(single_client, namespace, 60, T0, events)
    return topics, events


def _clicks_query(spark: Any, redis_server: Any, namespace: str, out: Any, **kw: Any) -> Any:
    """One instance of the clickstream pipeline in group ``clicks`` (``kw``: build_query's)."""
    from workers.clickstream import build_query

    kw.setdefault("trigger", "300ms")
    return build_query(spark, topics="events", group="clicks", out=str(out),
                       url=redis_server.url, namespace=namespace, options=GROUP_OPTS, **kw)


def test_group_queries_split_and_take_over_after_a_graceful_stop(
        spark: Any, redis_server: Any, single_client: Any, namespace: str,
        coord: GroupCoordinator, tmp_path: Path) -> None:
    from workers.clickstream import read_counts, stop_gracefully, window_counts

    topics, events = _click_events(single_client, namespace)
    out = str(tmp_path / "out")

    def start() -> Any:
        return _clicks_query(spark, redis_server, namespace, out)

    qa = start()
    qb = None
    try:
        wait_until(lambda: committed(coord, "clicks") == log_ends(topics, "events")
                   or qa.exception() is not None, timeout_s=QUERY_S)
        assert qa.exception() is None
        qb = start()
        wait_until(lambda: len(assignment(coord, "clicks")) == 2, timeout_s=QUERY_S)
        split = assignment(coord, "clicks")
        assert sorted(p for ps in split.values() for p in ps) == list(range(6))
        assert sorted(len(p) for p in split.values()) == [3, 3]
        _produce_events(single_client, namespace, 60, T0 + 60_000, events)
        wait_until(lambda: committed(coord, "clicks") == log_ends(topics, "events")
                   or qa.exception() is not None or qb.exception() is not None,
                   timeout_s=QUERY_S)
        assert qa.exception() is None and qb.exception() is None
        # No restart: both queries kept running through the rebalance.
        assert qa.isActive and qb.isActive

        stop_gracefully(qa)  # commits what it processed, leaves at once
        ends = log_ends(topics, "events")
        assert committed(coord, "clicks") == ends
        wait_until(lambda: len(assignment(coord, "clicks")) == 1, timeout_s=QUERY_S)
        assert list(assignment(coord, "clicks").values()) == [list(range(6))]
        _produce_events(single_client, namespace, 60, T0 + 120_000, events)
        wait_until(lambda: committed(coord, "clicks") == log_ends(topics, "events")
                   or qb.exception() is not None, timeout_s=QUERY_S)
        assert qb.exception() is None and qb.isActive
        stop_gracefully(qb)
    finally:
        for q in (qa, qb):
            if q is not None and q.isActive:
                q.stop()
    assert read_counts(out) == window_counts(events, WINDOW_MS)
    # every file names the generation its batch was planned in (read from Spark's offset log)
    gens = {int(p.name.split(".gen-")[1].split(".")[0])
            for p in Path(out, "counts").rglob("start-*.parquet")}
    assert len(gens) >= 2 and min(gens) >= 1, gens
    # The stopped queries' members are gone, and the group is Empty: their runners' stop()
    # sent LeaveGroup. That it was LeaveGroup and not session expiry (Spark's second SIGTERM
    # used to cut stop() short) is checked without a JVM, by the runner tests below.
    wait_until(lambda: coord.describe_group("clicks").members == [], timeout_s=QUERY_S)
    assert coord.describe_group("clicks").state == "Empty"


def test_a_restarted_pipeline_replays_its_batch_over_a_newer_members_uncommitted_file(
        spark: Any, redis_server: Any, single_client: Any, namespace: str,
        coord: GroupCoordinator, tmp_path: Path) -> None:
    # The pipeline ran batch 0 but failed before Spark recorded it as finished (its commit log
    # entry is removed here), so the restarted query replays batch 0. Meanwhile a member of a
    # newer generation took the partitions, wrote a file for partition 0 from the committed
    # offset (nothing committed: offset 0) covering part of the range, and stopped before
    # committing. Before, the replay's file was named by batch 0's planned generation, lost
    # to that member's file, and partition 0's other records went uncounted.
    from rcoord.client import ConsumerGroup, ConsumerGroupConfig
    from rcoord.spark.replays import checkpoint_position
    from workers.clickstream import _Sink, read_counts, stop_gracefully, window_counts

    topics, events = _click_events(single_client, namespace)
    out, cp = tmp_path / "out", tmp_path / "cp"

    def start(trigger: str) -> Any:
        return _clicks_query(spark, redis_server, namespace, out, trigger=trigger,
                             checkpoint=str(cp))

    _run_first_batch_then_stop(start("60m"), cp)
    planned = checkpoint_position(str(cp), 0)
    assert planned is not None and planned.generation is not None
    for name in ("0", ".0.crc"):
        (cp / "commits" / name).unlink(missing_ok=True)
    assert committed(coord, "clicks") in ({}, dict.fromkeys(range(6), 0))
    # the newer member: one generation of its own, one file of part of partition 0's range
    other = ConsumerGroup(ConsumerGroupConfig(
        group_id="clicks", topics=["events"], redis_client=single_client, namespace=namespace,
        session_timeout_ms=3000, heartbeat_interval_ms=300))
    try:
        newer = other.next(timeout=QUERY_S).generation_id
    finally:
        other.close()
    assert newer > planned.generation
    _Sink(str(out), WINDOW_MS, "")._write(
        "events", 0, 0, [{"ws": T0 - T0 % WINDOW_MS, "k": "u0", "n": 1}], newer)

    q2 = start("300ms")
    try:
        wait_until(lambda: committed(coord, "clicks") == log_ends(topics, "events")
                   or q2.exception() is not None, timeout_s=QUERY_S)
        assert q2.exception() is None
        stop_gracefully(q2)
    finally:
        if q2.isActive:
            q2.stop()
    assert read_counts(out) == window_counts(events, WINDOW_MS)
    # partition 0's file of start 0 is the replay's, named by the replaying generation
    files = sorted(p.name for p in (out / "counts" / "topic=events" / "partition=0").iterdir())
    assert len(files) == 1 and files[0].startswith("start-0.gen-"), files
    assert int(files[0].split(".gen-")[1].split(".")[0]) > newer, files


def test_a_checkpoint_on_another_file_system_is_read_through_spark(
        spark: Any, single_client: Any, namespace: str, tmp_path: Path) -> None:
    # A checkpoint on HDFS or S3 is read through the session's Hadoop file system, as Spark
    # reads it. Here Hadoop's http file system over a loopback HTTP server stands in for a
    # remote store. Before, such a checkpoint named no generation (-1) and the clickstream's
    # files of one start all took generation -1: a zombie's file could replace its successor's.
    import functools
    import http.server
    import threading

    from rcoord.spark import batch_generation
    from rcoord.spark.plan import Position
    from rcoord.spark.replays import record_replay
    from workers.clickstream import _Sink

    end = {"offsets": {"ev": {"0": 7}}, "generation": 4, "member": "spark-1"}
    (tmp_path / "cp" / "offsets").mkdir(parents=True)
    (tmp_path / "cp" / "offsets" / "2").write_text(
        "\n".join(["v1", json.dumps({"batchWatermarkMs": 0}), json.dumps({"ev": {"0": 7}}),
                   json.dumps(end)]))
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        cp = f"http://127.0.0.1:{server.server_address[1]}/cp"
        ask = functools.partial(batch_generation, cp, group="g", namespace=namespace,
                                client=single_client, spark=spark)
        assert ask(2) == 4
        assert ask(9) == -1  # not logged (the server answers 404)
        record_replay(single_client, namespace, "g", Position.from_json(end), 6)
        assert ask(2) == 6  # replayed by a restarted query's member
        assert ask(2, first=False) == 4
        sink = _Sink(str(tmp_path / "out"), WINDOW_MS, cp + "/", group="g", namespace=namespace)
        sink.batches = 1
        assert sink.generation(2, spark) == 4
        # A path without a scheme is on Spark's default file system, as Spark resolves a
        # checkpointLocation: before, it was read on this machine only (found nowhere: -1).
        assert ask(2, first=False) == 4
        spark.conf.set("fs.defaultFS", cp.removesuffix("/cp"))
        try:
            assert batch_generation("/cp", 2, group="g", client=single_client, spark=spark,
                                    first=False) == 4
        finally:
            spark.conf.unset("fs.defaultFS")
        assert batch_generation(str(tmp_path / "cp"), 2, group="g", client=single_client,
                                spark=spark, first=False) == 4  # the local file system's
    finally:
        server.shutdown()
        server.server_close()


def test_group_query_killed_with_sigkill_loses_its_partitions_to_the_other(
        spark: Any, redis_server: Any, single_client: Any, namespace: str,
        coord: GroupCoordinator, tmp_path: Path) -> None:
    from workers.clickstream import read_counts, stop_gracefully, window_counts

    topics, events = _click_events(single_client, namespace)
    out = str(tmp_path / "out")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get(
        "PYTHONPATH", "")]), PYSPARK_SUBMIT_ARGS=(
        f'--conf "spark.driver.extraJavaOptions={JVM_OPTS}" --conf spark.ui.enabled=false '
        'pyspark-shell'))  # (as the module's session: the UI's listeners only cost time)
    log_file = open(tmp_path / "killed.log", "w")  # noqa: SIM115 - closed in finally
    proc = subprocess.Popen(
        [sys.executable, "-m", "workers.clickstream", "--group", "clicks", "--topic", "events",
         "--out", out, "--redis-url", redis_server.url, "--namespace", namespace,
         "--trigger", "300ms", "--session-timeout-ms", GROUP_OPTS["sessionTimeoutMs"],
         "--heartbeat-interval-ms", GROUP_OPTS["heartbeatIntervalMs"]],
        cwd=ROOT, env=env, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True)
    qb = None
    try:
        # Both start at once (the other process's JVM takes most of the time); the test goes
        # on once the two are members of one generation.
        qb = _clicks_query(spark, redis_server, namespace, out)
        wait_until(lambda: len(assignment(coord, "clicks")) == 2 or proc.poll() is not None,
                   timeout_s=QUERY_S)
        assert proc.poll() is None, (tmp_path / "killed.log").read_text()[-3000:]
        _produce_events(single_client, namespace, 60, T0 + 60_000, events)
        wait_until(lambda: committed(coord, "clicks") == log_ends(topics, "events")
                   or qb.exception() is not None, timeout_s=QUERY_S)
        # SIGKILL the other instance's whole process tree (driver, JVM, Python workers):
        # no stop, no LeaveGroup, no last commit.
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
        _produce_events(single_client, namespace, 60, T0 + 120_000, events)
        # after its session timeout the group rebalances; qb takes all six partitions
        wait_until(lambda: list(assignment(coord, "clicks").values()) == [list(range(6))]
                   or qb.exception() is not None, timeout_s=QUERY_S)
        wait_until(lambda: committed(coord, "clicks") == log_ends(topics, "events")
                   or qb.exception() is not None, timeout_s=QUERY_S)
        assert qb.exception() is None and qb.isActive
        stop_gracefully(qb)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
        log_file.close()
        if qb is not None and qb.isActive:
            qb.stop()
    assert read_counts(out) == window_counts(events, WINDOW_MS)


def _copy_src_to_dst(spark: Any, url: str, namespace: str, cp: Path, columns: list[Any],
                     trigger: dict[str, Any], **options: str) -> Any:
    """A group-mode query (group ``g``, ``options`` added) that writes ``columns`` of topic
    ``src`` to topic ``dst`` through the rcoord sink, checkpointed at ``cp``."""
    reader_ = reader(spark, url, namespace, stream=True)
    for k, v in {"subscribe": "src", "groupId": "g", **GROUP_OPTS, **options}.items():
        reader_ = reader_.option(k, v)
    return (reader_.load().select(*columns)
            .writeStream.format("rcoord").option("url", url).option("namespace", namespace)
            .option("topic", "dst").trigger(**trigger)
            .option("checkpointLocation", str(cp)).start())


def test_a_group_query_restarted_mid_batch_replays_it_and_stores_every_row_once(
        spark: Any, redis_server: Any, single_client: Any, namespace: str,
        coord: GroupCoordinator, tmp_path: Path) -> None:
    # Batch 1 of a group-mode query fails after its partition-0 task appended its rows through
    # the rcoord sink; the query restarts on its checkpoint, and Spark replays batch 1 as the
    # restarted runner's first call. Before, the replay read nothing (the old runner's
    # membership had planned it), the group redelivered batch 1's records under batch id 2,
    # and partition 0's five rows were appended again (dst held 25 rows).
    from pyspark.sql import functions as F
    from pyspark.sql.utils import StreamingQueryException

    topics = _src_and_dst(single_client, namespace)
    Producer(single_client, namespace).send_batch(
        "src", [ProducerRecord(f"v{i}".encode(), partition=i % 2) for i in range(20)])
    cp, marker = tmp_path / "cp", tmp_path / "fail-batch-1"
    url = redis_server.url

    def gate(partition: int, offset: int, value: bytes) -> bytes:
        """Batch 1's partition-1 task fails once partition 0's task has appended its rows."""
        if partition == 1 and offset >= 5 and os.path.exists(str(marker)):
            import time

            from rcoord.client import client_from_url

            dst = Topics(client_from_url(url), namespace)
            deadline = time.monotonic() + QUERY_S
            while dst.describe("dst").partitions[0].log_end_offset < 10:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.01)
            raise RuntimeError("injected failure in batch 1")
        return value

    udf = F.udf(gate, "binary", useArrow=False)  # (Arrow UDFs need pandas)

    def start() -> Any:
        value = udf("partition", "offset", "value").alias("value")
        return _copy_src_to_dst(spark, url, namespace, cp, ["key", value, "partition"],
                                {"availableNow": True}, maxOffsetsPerTrigger="10")

    marker.touch()
    q1 = start()
    with pytest.raises(StreamingQueryException, match="injected failure in batch 1"):
        q1.awaitTermination(QUERY_S)
    assert log_ends(topics, "dst") == {0: 10, 1: 5}  # batch 0, and batch 1's partition 0
    assert committed(coord, "g") == {0: 5, 1: 5}  # batch 1 was planned, never committed
    assert (cp / "offsets" / "1").exists() and not (cp / "commits" / "1").exists()
    marker.unlink()
    q2 = start()
    assert q2.awaitTermination(QUERY_S), "availableNow query did not end by itself"
    assert q2.exception() is None
    assert committed(coord, "g") == {0: 10, 1: 10}
    stored = sorted(r.value for p in (0, 1) for r in fetch(
        single_client, namespace, "dst", p, 0, max_records=100).records)
    assert stored == sorted(f"v{i}".encode() for i in range(20))


def test_a_group_query_stopped_after_a_batch_and_restarted_stores_that_batch_once(
        spark: Any, redis_server: Any, single_client: Any, namespace: str,
        coord: GroupCoordinator, tmp_path: Path) -> None:
    # The query stops right after batch 0 finished (the next trigger is an hour away): Spark's
    # commit log records batch 0, but no later plan committed its end to the group. The query
    # restarts on its checkpoint. Before, the new member began at the group's committed offsets
    # (nothing), batch 0's records came again as batch 1, and dst held them twice.
    topics = _src_and_dst(single_client, namespace)
    producer = Producer(single_client, namespace, "round_robin")
    producer.send_batch("src", [f"a{i}".encode() for i in range(10)])
    cp, url = tmp_path / "cp", redis_server.url

    def start(trigger: dict[str, Any]) -> Any:
        return _copy_src_to_dst(spark, url, namespace, cp, ["key", "value", "partition"],
                                trigger)

    _run_first_batch_then_stop(start({"processingTime": "1 hour"}), cp)
    assert sum(log_ends(topics, "dst").values()) == 10
    assert committed(coord, "g") in ({}, {0: 0, 1: 0})  # batch 0's end never reached the group
    producer.send_batch("src", [f"b{i}".encode() for i in range(4)])
    q2 = start({"availableNow": True})
    assert q2.awaitTermination(QUERY_S), "availableNow query did not end by itself"
    assert q2.exception() is None
    assert committed(coord, "g") == {0: 7, 1: 7}
    stored = sorted(r.value for p in (0, 1) for r in fetch(
        single_client, namespace, "dst", p, 0, max_records=100).records)
    assert stored == sorted([f"a{i}".encode() for i in range(10)]
                            + [f"b{i}".encode() for i in range(4)])


# -- how the stream-source runner ends (no JVM: spark_runner.FakeJvm plays it) -----------------

RUNNER_OPTS = {"sessionTimeoutMs": "60000", "heartbeatIntervalMs": "300",
               "rebalanceTimeoutMs": "10000"}
LEAVE_S = 20  # well under the 60 s session: a member gone within it left, it did not expire


def _expired(single_client: Any, coord: GroupCoordinator, group: str) -> list[str]:
    """Members the coordinator removed by session expiry (its events stream)."""
    cfg = coord.config
    events = GroupKeys.of(cfg.namespace, cfg.num_partitions, group).partition.events
    return [fields[b"member"].decode() for _, fields in single_client.xrange(events)
            if fields[b"e"] == b"expired" and fields[b"g"] == group.encode()]


def _runner_in_group(source: Any, redis_server: Any, single_client: Any, namespace: str,
                     coord: GroupCoordinator, tmp_path: Path) -> Any:
    from spark_runner import FakeJvm

    Topics(single_client, namespace).create("events", 2)
    options = {"url": redis_server.url, "namespace": namespace, "subscribe": "events",
               "groupId": "clicks", **RUNNER_OPTS}
    jvm = FakeJvm(source, options, tmp_path / "runner.log")
    try:
        start = json.loads(jvm.initial_offset())  # joins and waits for its first generation
        assert start["offsets"] == {"events": {"0": 0, "1": 0}}, start
        assert len(assignment(coord, "clicks")) == 1
    except BaseException:
        jvm.close()
        raise
    return jvm


@pytest.mark.parametrize("source_name", ["RcoordDataSource", "LateSigtermSource"])
def test_a_runner_stopped_like_spark_leaves_the_group_at_once(
        source_name: str, redis_server: Any, single_client: Any, namespace: str,
        coord: GroupCoordinator, tmp_path: Path) -> None:
    # Spark's stop sends SIGTERM, closes the socket and sends SIGTERM again. The second one
    # usually arrives while stop() runs; LateSigtermSource makes sure it does. Either way the
    # member must send LeaveGroup (it used to be cut short: removed by session expiry).
    import spark_runner

    jvm = _runner_in_group(getattr(spark_runner, source_name), redis_server, single_client,
                           namespace, coord, tmp_path)
    _end_and_check_it_left(jvm, jvm.stop_like_spark, single_client, coord, tmp_path)


def _end_and_check_it_left(jvm: Any, end: Any, single_client: Any, coord: GroupCoordinator,
                           tmp_path: Path) -> None:
    """End the runner with ``end()``; its member must have left (LeaveGroup), not expired."""
    try:
        end()
        jvm.wait(LEAVE_S)
        log = (tmp_path / "runner.log").read_text()
        wait_until(lambda: coord.describe_group("clicks").members == [], timeout_s=LEAVE_S)
    finally:
        jvm.close()
    assert coord.describe_group("clicks").state == "Empty", log
    assert _expired(single_client, coord, "clicks") == [], log


def test_a_runner_whose_socket_closes_leaves_the_group(
        redis_server: Any, single_client: Any, namespace: str, coord: GroupCoordinator,
        tmp_path: Path) -> None:
    # No SIGTERM (the JVM died): the runner reads end of file, its finally runs stop().
    from rcoord.spark.source import RcoordDataSource

    jvm = _runner_in_group(RcoordDataSource, redis_server, single_client, namespace, coord,
                           tmp_path)
    _end_and_check_it_left(jvm, jvm.close_socket, single_client, coord, tmp_path)


def test_a_fenced_commit_stops_nothing_and_moves_no_offset(
        spark: Any, redis_server: Any, single_client: Any, namespace: str,
        coord: GroupCoordinator, tmp_path: Path) -> None:
    topics = Topics(single_client, namespace)
    topics.create("events", 2)
    producer = Producer(single_client, namespace, "round_robin")
    seen: list[tuple[int, int]] = []

    def sink(batch: Any, batch_id: int) -> None:
        seen.extend((r.partition, r.offset) for r in batch.select("partition", "offset")
                    .collect())

    def start(cp: Path) -> Any:
        reader_ = reader(spark, redis_server.url, namespace, stream=True)
        for k, v in {"subscribe": "events", "groupId": "g", **GROUP_OPTS}.items():
            reader_ = reader_.option(k, v)
        return (reader_.load().writeStream.foreachBatch(sink).trigger(processingTime="300 "
                                                                                  "milliseconds")
                .option("checkpointLocation", str(cp)).start())

    def caught_up(q: Any) -> Any:
        return lambda: committed(coord, "g") == log_ends(topics, "events") or \
            q.exception() is not None

    from workers.clickstream import stop_gracefully

    old_cp = tmp_path / "old"
    producer.send_batch("events", [b"a"] * 10)
    q1 = start(old_cp)
    wait_until(caught_up(q1), timeout_s=QUERY_S)
    stop_gracefully(q1)
    producer.send_batch("events", [b"b"] * 10)
    q2 = start(tmp_path / "new")  # the group moves on to offsets 10/10
    wait_until(caught_up(q2), timeout_s=QUERY_S)
    stop_gracefully(q2)
    after_q2 = committed(coord, "g")
    assert after_q2 == {0: 10, 1: 10}
    # q3 restarts on q1's checkpoint: Spark hands it q1's last plan (generation and member of
    # q1), whose commit would move the group back to 5/5. The coordinator refuses it; q3 goes
    # on from the group's offsets, reading only new records.
    seen.clear()
    producer.send_batch("events", [b"c"] * 4)
    q3 = start(old_cp)
    try:
        wait_until(caught_up(q3), timeout_s=QUERY_S)
        assert q3.exception() is None and q3.isActive
        assert committed(coord, "g") == {0: 12, 1: 12}
        assert sorted(seen) == [(0, 10), (0, 11), (1, 10), (1, 11)]
    finally:
        stop_gracefully(q3)
