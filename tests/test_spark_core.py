"""The Spark-free core of rcoord.spark: options, planning, resolution, group member, write rows.

No JVM: these run with or without pyspark installed. Redis-backed tests use the suite's
single-node server fixture.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import redis
from harness import wait_until
from test_client_group import OneMemberGroup, fast_config

from rcoord import CoordinatorConfig, Errors, GroupCoordinator, TopicPartition
from rcoord.client import ConsumerGroup
from rcoord.client.errors import JoinRefusedError
from rcoord.errors import AuthenticationFailedError, ConnectionLost, MissingPermissionError
from rcoord.keys import replays_key
from rcoord.spark.member import (
    MEMBER_METADATA,
    TOKEN_METADATA,
    ReplayNotRecordedError,
    StreamMember,
    member_config,
)
from rcoord.spark.options import (
    READ_OPTIONS,
    UNSUPPORTED,
    OptionError,
    ReadKind,
    parse_read_options,
    parse_write_options,
)
from rcoord.spark.plan import OffsetRange, Position, limit_end, ranges_between, split_ranges
from rcoord.spark.replays import replayed_generation
from rcoord.spark.resolve import (
    DataLossError,
    log_bounds,
    log_snapshot,
    next_position,
    read_range,
    resolve_offsets,
    resolve_partitions,
)
from rcoord.spark.write import check_write_plan, make_producer, row_to_record, write_rows
from rcoord.topics import (
    Producer,
    ProducerRecord,
    TopicError,
    Topics,
    fetch,
    fetch_many,
    partition_key,
)
from rcoord.topics.times import server_ms

TP = TopicPartition
URL = {"url": "redis://127.0.0.1:1/0"}


def opts(kind: ReadKind = ReadKind.STREAM, **kw: str) -> Any:
    return parse_read_options({**URL, **kw}, kind, env={})


# -- options -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "given", "names"),
    [
        (ReadKind.BATCH, {"subscribe": "a", "assign": '{"a": [0]}'}, "subscribe/assign"),
        (ReadKind.BATCH, {}, "subscribe"),
        (ReadKind.BATCH, {"assign": "{a: [0]}"}, "assign: malformed JSON"),
        (ReadKind.BATCH, {"assign": '{"a": []}'}, "assign"),
        (ReadKind.BATCH, {"subscribe": "a", "startingOffsets": '{"a": {"0": 1'},
         "startingOffsets: malformed JSON"),
        (ReadKind.BATCH, {"subscribe": "a", "startingOffsets": '{"a": {"x": 1}}'},
         "startingOffsets"),
        (ReadKind.BATCH, {"subscribe": "a", "startingOffsets": "latest"},
         "startingOffsets: .*cannot start at latest, which is for streams"),
        (ReadKind.BATCH, {"subscribe": "a", "startingOffsets": '{"a": {"0": -1}}'},
         "startingOffsets: .*cannot start at latest"),
        (ReadKind.BATCH, {"subscribe": "a", "endingOffsets": '{"a": {"0": -2}}'},
         "endingOffsets: .*cannot end at earliest"),
        (ReadKind.BATCH, {"subscribe": "a", "endingOffsets": "earliest"},
         "endingOffsets: .*cannot end at earliest"),
        (ReadKind.BATCH, {"subscribe": "a", "groupId": "g"},
         "groupId: group mode is for streaming reads"),
        (ReadKind.STREAM, {"assign": '{"a": [0]}', "groupId": "g"}, "groupId"),
        (ReadKind.STREAM, {"subscribe": "a", "endingOffsets": "latest"}, "endingOffsets"),
        (ReadKind.STREAM, {"subscribe": "a", "endingOffsets": "earliest"},
         "endingOffsets: only for batch reads"),
        # before: schema()'s check (no kind) told a stream's user "a batch read cannot end at
        # earliest", as if the read were a batch
        (None, {"subscribe": "a", "endingOffsets": "earliest"},
         "endingOffsets: .*cannot end at earliest .*; a stream .*takes none"),
        (ReadKind.STREAM, {"subscribe": "a", "maxOffsetsPerTrigger": "0"},
         "maxOffsetsPerTrigger"),
        (ReadKind.STREAM, {"subscribe": "a", "failOnDataLoss": "maybe"}, "failOnDataLoss"),
        (ReadKind.STREAM, {"subscribePattern": "(", }, "subscribePattern"),
        (ReadKind.STREAM, {"subscribe": "a", "groupId": "g", "startingOffsets": '{"a": {"0": 1}}'},
         "startingOffsets"),
        (ReadKind.STREAM, {"subscribe": "a", "sessionTimeoutMs": "3000"}, "sessionTimeoutMs"),
        (ReadKind.STREAM, {"subscribe": "a", "groupId": "g", "sessionTimeoutMs": "3000",
                           "heartbeatIntervalMs": "2000"}, "heartbeatIntervalMs"),
        # before: the option the user did not set was named
        (ReadKind.STREAM, {"subscribe": "a", "groupId": "g", "sessionTimeoutMs": "1"},
         "sessionTimeoutMs: 1 is too short"),
        # before: accepted and never used
        (ReadKind.BATCH, {"subscribe": "a", "maxOffsetsPerTrigger": "10"},
         "maxOffsetsPerTrigger: only for streams"),
        # before: taken as unset (an empty groupId made a stream without a group, from latest)
        (ReadKind.STREAM, {"subscribe": "a", "groupId": ""}, "groupId: empty value"),
        (ReadKind.STREAM, {"subscribe": "a", "groupId": "  "}, "groupId: empty value"),
        (ReadKind.STREAM, {"subscribe": "a", "startingOffsets": ""}, "startingOffsets: empty"),
        (ReadKind.STREAM, {"subscribe": "a", "failOnDataLoss": ""}, "failOnDataLoss: empty"),
        (ReadKind.BATCH, {"subscribe": "a", "namespace": ""}, "namespace: empty"),
        # before: read by Python's int(), which Spark's Kafka source (Java's parseLong) refuses:
        # 10 and partition 0
        (ReadKind.BATCH, {"subscribe": "a", "fetchSize": "1_0"},
         "fetchSize: must be a positive integer"),
        (ReadKind.BATCH, {"subscribe": "a", "startingOffsets": '{"a": {" 0": 1}}'},
         "startingOffsets: partition ' 0' of topic 'a' is not an integer"),
    ],
)
def test_bad_options_name_the_option(kind: ReadKind | None, given: dict[str, str], names: str) -> None:
    with pytest.raises(OptionError, match="^" + names.replace("/", "/").replace("(", r"\(")):
        parse_read_options({**URL, **given}, kind, env={})


def test_an_unknown_option_fails_naming_it_and_the_nearest_valid_name() -> None:
    # Spark's Kafka source ignores unknown options: a typo silently started this stream at
    # latest. Spark hands options over lower-cased (its CaseInsensitiveDict).
    with pytest.raises(OptionError, match=r"^startingoffset: not an option of an rcoord read; "
                                          r"did you mean startingOffsets\?"):
        opts(subscribe="a", startingoffset="earliest")
    with pytest.raises(OptionError, match=r"^maxoffsetpertrigger: .*maxOffsetsPerTrigger\?"):
        opts(subscribe="a", maxoffsetpertrigger="10")
    with pytest.raises(OptionError, match="^zzz: .*the read options are url, namespace"):
        opts(subscribe="a", zzz="1")
    with pytest.raises(OptionError, match=r"^topics: not an option of an rcoord write; did you "
                                          r"mean topic\?"):
        parse_write_options({**URL, "topics": "t"}, env={})
    with pytest.raises(OptionError, match="^topic: is a write option"):
        opts(subscribe="a", topic="b")
    with pytest.raises(OptionError, match="^startingOffsets: is a read option"):
        parse_write_options({**URL, "startingoffsets": "earliest"}, env={})
    # the keys Spark itself adds (load(path), load(p1, p2), writeStream) pass, in any case
    spark_keys = {"path": "p", "paths": '["a", "b"]', "checkpointlocation": "/c", "queryName": "q"}
    assert opts(subscribe="a", **spark_keys).topics == ("a",)
    assert parse_write_options({**URL, **spark_keys, "TOPIC": "t"}, env={}).topic == "t"
    assert opts(ReadKind.BATCH, subscribe="a", includeHeaders="true").topics == ("a",)
    # every documented read option is known (none is taken for a typo)
    everything = {n: "1" for n in READ_OPTIONS if n not in ("subscribePattern", "assign")}
    with pytest.raises(OptionError) as info:
        opts(**everything)
    assert "not an option" not in str(info.value)


@pytest.mark.parametrize(
    ("given", "message"),
    [
        *[({name: "1"}, f"^{name.lower()}: {reason}") for name, reason in UNSUPPORTED.items()],
        ({"kafka.bootstrap.servers": "h:9092"}, r"^kafka.bootstrap.servers: .*give url"),
        ({"kafka.group.id": "g"}, "^kafka.group.id: use groupId"),
        ({"kafka.security.protocol": "SSL"}, "^kafka.security.protocol: rcoord takes no Kafka"),
        ({"includeHeaders": "false"}, "^includeHeaders: rcoord's rows always have the headers"),
    ],
)
def test_kafka_source_options_rcoord_lacks_say_what_to_use(given: dict[str, str],
                                                           message: str) -> None:
    with pytest.raises(OptionError, match=message.replace("(", r"\(").replace(")", r"\)")):
        opts(subscribe="a", **{k.lower(): v for k, v in given.items()})


def test_url_comes_from_the_option_or_the_environment() -> None:
    with pytest.raises(OptionError, match="^url: no Redis URL"):
        parse_read_options({"subscribe": "a"}, ReadKind.BATCH, env={})
    got = parse_read_options({"subscribe": "a"}, ReadKind.BATCH,
                             env={"RCOORD_REDIS_URL": "redis://h:1/2"})
    assert got.url == "redis://h:1/2"
    with pytest.raises(OptionError, match="^subscribe: is a read option"):
        parse_write_options({**URL, "subscribe": "a"}, env={})


def test_options_are_case_insensitive_and_follow_kafka_defaults() -> None:
    batch = parse_read_options({**URL, "SUBSCRIBE": "a, b,a"}, ReadKind.BATCH, env={})
    assert batch.topics == ("a", "b") and batch.starting == "earliest" and batch.ending == "latest"
    stream = opts(subscribe="a")
    assert stream.starting == "latest" and stream.fail_on_data_loss
    group = opts(subscribe="a", groupId="g")
    assert group.starting == "earliest" and group.group_id == "g"
    # rebalanceTimeoutMs stands for max.poll.interval.ms, whose default is 300000
    assert (group.session_timeout_ms, group.rebalance_timeout_ms) == (10_000, 300_000)
    spec = opts(ReadKind.BATCH, assign='{"a": [1, 0, 1]}',
                startingOffsets='{"a": {"0": 23, "1": -2}}', endingOffsets='{"a": {"0": -1}}')
    assert spec.assign == {"a": (0, 1)}
    assert spec.starting == {"a": {0: 23, 1: -2}} and spec.ending == {"a": {0: -1}}


# -- planning ----------------------------------------------------------------------------------


def test_limit_end_shares_the_limit_by_lag_exactly() -> None:
    a, b, c = TP("t", 0), TP("t", 1), TP("t", 2)
    start = {a: 0, b: 10, c: 5}
    latest = {a: 100, b: 10, c: 55}
    end = limit_end(start, latest, 30)
    assert sum(end[tp] - start[tp] for tp in start) == 30
    assert end == {a: 20, b: 10, c: 15}
    assert limit_end(start, latest, None) == latest
    assert limit_end(start, latest, 1000) == latest
    # ties: deterministic, the lowest partition gets the record left over
    assert limit_end({a: 0, b: 0, c: 0}, {a: 5, b: 5, c: 5}, 4) == {a: 2, b: 1, c: 1}


def test_limit_end_starves_no_partition() -> None:
    """A reviewer's repro: one record waiting on a partition while another is 5,000 behind,
    limit 100. Its share (100 / 5,001 of a record) rounded down to none, batch after batch,
    while the busy partition kept its backlog: the record was never read. As Spark's Kafka
    source, a partition behind gets at least one record per batch."""
    hot, cold, idle = TP("t", 0), TP("t", 1), TP("t", 2)
    start, latest = {hot: 0, cold: 0, idle: 7}, {hot: 5000, cold: 1, idle: 7}
    end = limit_end(start, latest, 100)
    assert end == {hot: 99, cold: 1, idle: 7}  # the limit exactly, the cold record in it
    # A limit below the number of partitions behind: one each, over the limit (Spark too).
    assert limit_end({hot: 0, cold: 0}, {hot: 5, cold: 5}, 1) == {hot: 1, cold: 1}
    assert limit_end({hot: 0, cold: 0, idle: 0}, {hot: 1, cold: 1, idle: 1}, 2) == {
        hot: 1, cold: 1, idle: 1}  # (every lag 1: nothing beyond the first records to share)
    # No share over a partition's lag, and the total is the limit, across many shapes.
    for lags in ([1, 1, 998], [3, 0, 2, 995], [1] * 50 + [10_000], [1] * 70):
        tps = [TP("t", i) for i in range(len(lags))]
        zero = dict.fromkeys(tps, 0)
        for limit in (60, 100, 999):
            got = limit_end(zero, dict(zip(tps, lags, strict=True)), limit)
            assert all(0 <= got[tp] <= lag for tp, lag in zip(tps, lags, strict=True))
            assert all(got[tp] >= 1 for tp, lag in zip(tps, lags, strict=True) if lag)
            if limit < sum(lags):
                assert sum(got.values()) == max(limit, sum(1 for lag in lags if lag))


def test_positions_round_trip_and_rebase_with_starts() -> None:
    a, b = TP("t", 0), TP("t", 1)
    prev = Position({a: 10, b: 4}, generation=3, member="m")
    assert Position.from_json(prev.to_json()) == prev
    same = Position({a: 15, b: 4}, generation=3, member="m")
    assert ranges_between(prev, same) == [OffsetRange("t", 0, 10, 15)]
    # a new generation starts every partition at its starts (the group's committed offsets)
    nxt = Position({a: 12, TP("t", 2): 9}, starts={a: 8, TP("t", 2): 7}, generation=4,
                   member="m")
    assert ranges_between(prev, nxt) == [OffsetRange("t", 0, 8, 12), OffsetRange("t", 2, 7, 9)]
    with pytest.raises(ValueError, match="no start"):
        ranges_between(prev, Position({a: 12}, generation=4, member="m"))
    assert split_ranges([OffsetRange("t", 0, 0, 5)], 2) == [
        OffsetRange("t", 0, 0, 2), OffsetRange("t", 0, 2, 4), OffsetRange("t", 0, 4, 5)]


# -- resolution against Redis ------------------------------------------------------------------


@pytest.fixture
def topics(single_client: Any, namespace: str) -> Topics:
    return Topics(single_client, namespace)


def test_a_subscribe_pattern_is_trimmed_as_in_sparks_kafka_source(
        redis_server: Any, namespace: str, topics: Topics) -> None:
    # A pattern with a stray blank or newline (read from a file) matched no topic, so the
    # query silently read nothing; Spark's Kafka source trims it (SubscribePatternStrategy).
    topics.create("ev", 2)
    o = parse_read_options({"url": redis_server.url, "namespace": namespace,
                            "subscribePattern": " ev.*\n"}, ReadKind.BATCH, env={})
    assert o.pattern == "ev.*"
    assert resolve_partitions(topics, o) == [TP("ev", 0), TP("ev", 1)]


def test_resolve_partitions_and_offsets(redis_server: Any, single_client: Any, namespace: str,
                                        topics: Topics) -> None:
    topics.create("ev", 3)
    topics.create("ev2", 1)
    Producer(single_client, namespace, "round_robin").send_batch("ev", [b"x"] * 30)
    base = {"url": redis_server.url, "namespace": namespace}
    o = parse_read_options({**base, "subscribePattern": "ev.*"}, ReadKind.BATCH, env={})
    parts = resolve_partitions(topics, o)
    assert parts == [TP("ev", 0), TP("ev", 1), TP("ev", 2), TP("ev2", 0)]
    with pytest.raises(OptionError, match="^subscribe: unknown topic 'nope'"):
        resolve_partitions(topics, parse_read_options({**base, "subscribe": "ev,nope"},
                                                      ReadKind.BATCH, env={}))
    with pytest.raises(OptionError, match="^assign: topic 'ev' has 3 partitions"):
        resolve_partitions(topics, parse_read_options({**base, "assign": '{"ev": [3]}'},
                                                      ReadKind.BATCH, env={}))
    bounds = log_bounds(topics, parts)
    ends = {tp: hi for tp, (_, hi) in bounds.items()}
    got = resolve_offsets("startingOffsets", {"ev": {0: 2, 1: -1}}, parts, bounds, -2)
    assert got == {TP("ev", 0): 2, TP("ev", 1): ends[TP("ev", 1)], TP("ev", 2): 0,
                   TP("ev2", 0): 0}
    with pytest.raises(OptionError, match="^startingOffsets: zz-0 is not among"):
        resolve_offsets("startingOffsets", {"zz": {0: 1}}, parts, bounds, -2)
    with pytest.raises(OptionError, match="past its log end"):
        resolve_offsets("startingOffsets", {"ev": {0: 10_000}}, parts, bounds, -2)


def test_data_loss_fails_or_skips(single_client: Any, namespace: str, topics: Topics) -> None:
    topics.create("ret", 1, retention_records=5)
    Producer(single_client, namespace).send_batch("ret", [str(i).encode() for i in range(20)])
    topics.apply_retention("ret")
    rng = OffsetRange("ret", 0, 0, 20)
    with pytest.raises(DataLossError, match="failOnDataLoss=false"):
        list(read_range(single_client, namespace, rng, 3, True))
    chunks = list(read_range(single_client, namespace, rng, 3, False))
    assert [r.offset for c in chunks for r in c] == list(range(15, 20))
    bounds = log_bounds(topics, [TP("ret", 0)])
    with pytest.raises(DataLossError):
        resolve_offsets("startingOffsets", {"ret": {0: 1}}, [TP("ret", 0)], bounds, -2)
    assert resolve_offsets("startingOffsets", {"ret": {0: 1}}, [TP("ret", 0)], bounds, -2,
                           fail_on_data_loss=False) == {TP("ret", 0): 15}


def test_a_starting_offset_below_the_log_start_is_warned_about_without_failondataloss(
        single_client: Any, namespace: str, topics: Topics,
        caplog: pytest.LogCaptureFixture) -> None:
    # failOnDataLoss=false goes on from the log start, but says so, as Spark's Kafka source
    # reports it and as every other skip here does. Before, the read lacked records 1-14 that
    # startingOffsets asked for, and nothing in the logs said why.
    topics.create("ret", 1, retention_records=5)
    Producer(single_client, namespace).send_batch("ret", [str(i).encode() for i in range(20)])
    topics.apply_retention("ret")
    bounds = log_bounds(topics, [TP("ret", 0)])
    with caplog.at_level(logging.WARNING, "rcoord.spark"):
        assert resolve_offsets("startingOffsets", {"ret": {0: 1}}, [TP("ret", 0)], bounds, -2,
                               fail_on_data_loss=False) == {TP("ret", 0): 15}
    assert "startingOffsets: offset 1 of ret-0 is below its log start offset 15" in caplog.text
    assert "failOnDataLoss=false" in caplog.text


def test_a_range_planned_past_the_log_end_is_data_loss(single_client: Any, namespace: str,
                                                       topics: Topics) -> None:
    # A range planned before the log lost its last records (a failover to a replica that did
    # not have them) starts past the log end. That fetch answers OFFSET_OUT_OF_RANGE, which
    # read_range raised as a TopicError: the query failed even with failOnDataLoss=false, and
    # with true not as data loss. A range that began at or below the end already was.
    topics.create("lost", 1)
    Producer(single_client, namespace).send_batch("lost", [b"a", b"b", b"c"])
    token = topics.create_token("lost")
    rng = OffsetRange("lost", 0, 5, 8)
    with pytest.raises(DataLossError, match=r"lost-0: offsets 5\.\.7 were planned but the log "
                                            r"now ends at offset 3.*failOnDataLoss=false"):
        list(read_range(single_client, namespace, rng, 10, True, token))
    assert list(read_range(single_client, namespace, rng, 10, False, token)) == []


def test_every_record_a_task_skips_without_fail_on_data_loss_is_reported(
        single_client: Any, namespace: str, topics: Topics, caplog: Any) -> None:
    # With failOnDataLoss=false, a range running past the log end, one starting at it, one
    # of a deleted topic and records retention removed were skipped without a word: a batch
    # came out short with nothing in the logs. Spark's Kafka source warns on every skip.
    caplog.set_level(logging.WARNING, "rcoord.spark")
    topics.create("lost", 1)
    Producer(single_client, namespace).send_batch("lost", [b"a", b"b", b"c"])
    token = topics.create_token("lost")

    def skipped(rng: OffsetRange, tok: str | None = token) -> tuple[list[int], list[str]]:
        caplog.clear()
        with pytest.raises(DataLossError, match="failOnDataLoss=false"):
            list(read_range(single_client, namespace, rng, 10, True, tok))
        chunks = list(read_range(single_client, namespace, rng, 10, False, tok))
        return [r.offset for c in chunks for r in c], [r.getMessage() for r in caplog.records]

    got, warned = skipped(OffsetRange("lost", 0, 0, 8))
    assert got == [0, 1, 2]
    assert len(warned) == 1 and "lost-0: offsets 3..7 were planned" in warned[0]
    assert "skipping them (failOnDataLoss=false)" in warned[0]
    got, warned = skipped(OffsetRange("lost", 0, 3, 5))
    assert got == [] and len(warned) == 1 and "lost-0: offsets 3..4 were planned" in warned[0]
    topics.create("ret", 1, retention_records=5)
    Producer(single_client, namespace).send_batch("ret", [str(i).encode() for i in range(20)])
    topics.apply_retention("ret")
    got, warned = skipped(OffsetRange("ret", 0, 0, 20), None)
    assert got == list(range(15, 20))
    assert len(warned) == 1 and "ret-0: offsets 0..14 were removed by retention" in warned[0]
    # A task's range (of a split batch) wholly below the log start names only its offsets.
    got, warned = skipped(OffsetRange("ret", 0, 3, 6), None)
    assert got == [] and len(warned) == 1
    assert "ret-0: offsets 3..5 were removed by retention" in warned[0]
    topics.delete("lost")  # a range whose topic's create token was not known when planned
    got, warned = skipped(OffsetRange("lost", 0, 1, 3), "")
    assert got == [] and len(warned) == 1
    assert "lost-0: offsets 1..2 were planned but the partition no longer exists" in warned[0]


def test_a_task_reads_about_max_partition_fetch_bytes_at_once(
        single_client: Any, namespace: str, topics: Topics) -> None:
    """``maxPartitionFetchBytes`` (Kafka's ``max.partition.fetch.bytes``, 1 MiB) bounds each
    read of a task, not only ``fetchSize``: before, 2,000 records of 1 MiB were one 2 GiB read.
    The range is still read whole and in order, a record larger than the bound alone."""
    assert opts(ReadKind.BATCH, subscribe="a").max_partition_fetch_bytes == 1 << 20
    got = opts(ReadKind.BATCH, subscribe="a", maxPartitionFetchBytes="300000")
    assert got.max_partition_fetch_bytes == 300_000
    for bad in ("0", "x"):
        with pytest.raises(OptionError, match="^maxPartitionFetchBytes: must be"):
            opts(subscribe="a", maxpartitionfetchbytes=bad)
    for kafka_name in ("kafka.max.partition.fetch.bytes", "kafka.fetch.max.bytes"):
        with pytest.raises(OptionError, match=f"^{kafka_name}: use maxPartitionFetchBytes"):
            opts(subscribe="a", **{kafka_name: "5"})
    topics.create("big", 1)
    producer = Producer(single_client, namespace)
    for i in range(10):
        producer.send("big", bytes([i]) * 100_000)
    rng = OffsetRange("big", 0, 0, 10)
    chunks = list(read_range(single_client, namespace, rng, 2000, True, max_bytes=250_000))
    assert [(r.offset, r.value) for c in chunks for r in c] == [
        (i, bytes([i]) * 100_000) for i in range(10)]
    assert max(len(c) for c in chunks) == 2  # (2 * 100 kB fits 250 kB, 3 do not)
    chunks = list(read_range(single_client, namespace, rng, 2000, True, max_bytes=10))
    assert [[r.offset for r in c] for c in chunks] == [[i] for i in range(10)]


def test_a_partition_added_after_retention_trimmed_it_is_data_loss(
        single_client: Any, namespace: str, topics: Topics, caplog: Any) -> None:
    # Before, a partition new to the read started at its log start without a word, also when
    # retention had deleted records there before the query saw them (Spark's Kafka source:
    # "Added partition ... starts from X instead of 0").
    topics.create("t", 1, retention_records=2)
    start = Position({TP("t", 0): 0}, {TP("t", 0): 0})
    topics.add_partitions("t", 3)
    producer = Producer(single_client, namespace)
    producer.send_batch("t", [ProducerRecord(b"x", partition=1) for _ in range(10)])
    producer.send_batch("t", [ProducerRecord(b"y", partition=2)])  # kept whole: starts at 0, no loss
    topics.apply_retention("t")
    parts = [TP("t", p) for p in range(3)]
    bounds, tokens = log_snapshot(topics, parts)
    assert bounds[TP("t", 1)] == (8, 10)
    with pytest.raises(DataLossError, match=r"^topic 't' partition 1 is new to the query but its "
                                            r"log starts at offset 8, not 0: records 0-7"):
        next_position(start, parts, bounds, tokens, None, True)
    with caplog.at_level("WARNING", logger="rcoord.spark"):
        nxt = next_position(start, parts, bounds, tokens, None, False)
    assert nxt is not None and nxt.starts == {TP("t", 1): 8, TP("t", 2): 0}
    assert nxt.offsets == {TP("t", 0): 0, TP("t", 1): 10, TP("t", 2): 1}
    assert caplog.text.count("is new to the query") == 1


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"subscribe": "a", "maxOffsetPerTrigger": "5"},
         (r"^maxoffsetpertrigger: not an option of an rcoord read; did you mean "
          r"maxOffsetsPerTrigger\?")),
        ({"assign": '{"a": [0]}', "groupId": "g"}, "^groupId: a group divides"),
        ({"subscribe": "a", "sessionTimeoutMs": "6000"},
         "^sessionTimeoutMs: only meaningful with groupId"),
        ({"subscribe": "a", "kafka.bootstrap.servers": "x:9092"},
         "^kafka.bootstrap.servers: rcoord reads and writes Redis"),
    ],
)
def test_the_data_sources_schema_checks_a_reads_options(given: dict[str, str],
                                                        message: str) -> None:
    """Spark calls schema() in load(): before, a stream's bad options raised only in
    streamReader(), after start(), where pyspark's runner hid them behind an UnboundLocalError
    (Spark's Kafka source checks them in sourceSchema, at load())."""
    source = pytest.importorskip("rcoord.spark.source")  # pyspark, but no JVM
    with pytest.raises(OptionError, match=message):
        source.RcoordDataSource({**URL, **given}).schema()


def test_the_data_sources_schema_leaves_the_kind_of_read_to_its_reader() -> None:
    # schema() does not know a batch read from a stream: options valid for either pass.
    source = pytest.importorskip("rcoord.spark.source")
    for given in ({"subscribe": "a", "endingOffsets": "latest"},
                  {"subscribe": "a", "groupId": "g", "maxOffsetsPerTrigger": "5"},
                  {"subscribe": "a", "startingOffsets": "latest"}):
        assert source.RcoordDataSource({**URL, **given}).schema().startswith("key ")


def test_a_read_refuses_a_schema_given_by_the_user() -> None:
    # A user schema was taken, and every task failed in a Python worker with Spark's
    # DATA_SOURCE_RETURN_SCHEMA_MISMATCH; Spark's Kafka source refuses it when planned.
    source = pytest.importorskip("rcoord.spark.source")
    import json

    from pyspark.sql.types import StringType, StructField, StructType
    from spark_runner import SCHEMA_JSON

    kafka = StructType.fromJson(json.loads(SCHEMA_JSON))
    data_source = source.RcoordDataSource({**URL, "subscribe": "a"})
    assert isinstance(data_source.reader(kafka), source.BatchReader)  # the schema() Spark got
    assert isinstance(data_source.streamReader(kafka), source.StreamReader)
    mine = StructType([StructField("value", StringType())])
    for make in (data_source.reader, data_source.streamReader):
        with pytest.raises(OptionError, match=r"^schema: an rcoord read has the fixed schema .*"
                                              r"got struct<value:string>"):
            make(mine)


def _stream_reader(url: str, namespace: str, **kw: str) -> Any:
    source = pytest.importorskip("rcoord.spark.source")  # pyspark, but no JVM
    default = {} if {"assign", "subscribe", "subscribePattern"} & set(kw) else {"subscribe": "re"}
    return source.StreamReader(parse_read_options(
        {"url": url, "namespace": namespace, **default, "startingOffsets": "earliest", **kw},
        ReadKind.STREAM, env={}))


def _offsets(reader: Any, start: Any, end: Any) -> list[tuple[int, int]]:
    out = []
    for part in reader.partitions(start, end):
        for batch in reader.read(part):
            out += zip(batch.column("partition").to_pylist(), batch.column("offset").to_pylist())
    return sorted(out)


def test_a_stream_fails_on_a_recreated_topic_or_starts_it_over(
        redis_server: Any, single_client: Any, namespace: str, topics: Topics) -> None:
    # The topic is deleted and created again while the query runs (or between restarts from
    # its checkpoint): offsets begin again at 0. Before, the next plan took max(planned, end)
    # and silently waited, then read the new topic from the old offset on (skipping its first
    # records); a replayed batch read whatever the new topic had at those offsets.
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    every = ReadAllAvailable()
    topics.create("re", 2)
    Producer(single_client, namespace, "round_robin").send_batch("re", [b"old"] * 10)
    reader = _stream_reader(redis_server.url, namespace)
    first = reader.initialOffset()
    batch = reader.latestOffset(first, every)
    assert Position.from_json(batch).offsets == {TP("re", 0): 5, TP("re", 1): 5}

    topics.delete("re")
    topics.create("re", 2)
    Producer(single_client, namespace, "round_robin").send_batch("re", [b"new"] * 4)
    restarted = _stream_reader(redis_server.url, namespace)
    with pytest.raises(DataLossError, match=r"^topic 're' partition 0: the topic was deleted and "
                                            r"created again since offset 5 was planned \(the new "
                                            r"topic holds offsets 0 to 1, other records\).*"
                                            r"failOnDataLoss"):
        restarted.latestOffset(batch, every)
    # the batch Spark replays from the checkpoint was planned in the old topic
    part = reader.partitions(first, batch)[0]
    with pytest.raises(DataLossError, match="planned in a topic that has since been deleted and "
                                            "created again"):
        list(restarted.read(part))
    lenient = _stream_reader(redis_server.url, namespace, failOnDataLoss="false")
    assert list(lenient.read(lenient.partitions(first, batch)[0])) == []
    nxt = lenient.latestOffset(batch, every)
    assert _offsets(lenient, batch, nxt) == [(0, 0), (0, 1), (1, 0), (1, 1)]  # all of the new
    assert lenient.latestOffset(nxt, every) == nxt  # and it goes on from there


def test_a_stream_whose_log_lost_its_last_records_goes_on_at_the_log_end(
        single_client: Any, namespace: str, topics: Topics) -> None:
    # The query's next offset (5) is past the log end (3) of the same topic (same create
    # token): the log lost its last records, as a failover to a replica that did not have them
    # does. Without failOnDataLoss the partition started again at its log start, so records
    # 0-2, read before, were read a second time; Spark's Kafka source goes on from the offset
    # the partition "was changed" to. The message blamed a re-creation the tokens rule out.
    topics.create("tail", 1)
    producer = Producer(single_client, namespace)
    producer.send_batch("tail", [b"a", b"b", b"c"])
    tp = TP("tail", 0)
    bounds, tokens = log_snapshot(topics, [tp])
    start = Position({tp: 5}, tokens=dict(tokens))
    with pytest.raises(DataLossError, match=r"^topic 'tail' partition 0: the planned start "
                                            r"offset 5 is past the log end offset 3 of the same "
                                            r"topic: the log lost records from its end .*go on "
                                            r"from the log end offset \(3\)$"):
        next_position(start, [tp], bounds, tokens, None, True)
    nxt = next_position(start, [tp], bounds, tokens, None, False)
    assert nxt == Position({tp: 3}, {tp: 3}, tokens=dict(tokens))
    producer.send_batch("tail", [b"d"])  # offset 3 again: a new record, read next
    bounds, tokens = log_snapshot(topics, [tp])
    after = next_position(nxt, [tp], bounds, tokens, None, False)
    assert after is not None and ranges_between(nxt, after) == [OffsetRange("tail", 0, 3, 4)]


def test_a_stream_from_latest_starts_once_however_often_spark_asks(
        redis_server: Any, single_client: Any, namespace: str, topics: Topics) -> None:
    # Spark asks initialOffset() twice as a query starts: for the start of its first plan, then
    # for the start of that batch's partitions(). "latest" was resolved again the second time,
    # so the records appended in between were in no batch at all.
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    topics.create("re", 1)
    producer = Producer(single_client, namespace, "round_robin")
    producer.send_batch("re", [b"before"] * 2)
    reader = _stream_reader(redis_server.url, namespace, startingOffsets="latest")
    first = reader.initialOffset()
    producer.send_batch("re", [b"meanwhile"] * 3)
    batch = reader.latestOffset(first, ReadAllAvailable())
    assert reader.initialOffset() == first
    assert _offsets(reader, reader.initialOffset(), batch) == [(0, 2), (0, 3), (0, 4)]


def test_a_plain_query_continues_a_checkpoint_written_in_group_mode(
        redis_server: Any, single_client: Any, namespace: str, topics: Topics,
        coord: GroupCoordinator) -> None:
    """The query ran with groupId, then restarts on its checkpoint without it: it goes on from
    the checkpoint's offsets, as Spark's Kafka source's plain-offset checkpoints survive option
    changes. Before, every plan from the group-mode position failed (``offset of ev-0 has no
    start``), so the checkpoint could not be continued at all."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    every = ReadAllAvailable()
    topics.create("ev", 2)
    producer = Producer(single_client, namespace, "round_robin")
    producer.send_batch("ev", [b"a"] * 6)
    group = _stream_reader(redis_server.url, namespace, **GROUP_READ)
    try:
        first = group.initialOffset()
        end = group.latestOffset(first, every)
    finally:
        group.stop()
    assert Position.from_json(end).generation is not None
    producer.send_batch("ev", [b"b"] * 4)
    plain = _stream_reader(redis_server.url, namespace, subscribe="ev")
    nxt = plain.latestOffset(end, every)
    assert _offsets(plain, end, nxt) == [(0, 3), (0, 4), (1, 3), (1, 4)]  # only the new ones
    assert plain.latestOffset(nxt, every) == nxt


def test_a_plain_query_refuses_a_group_checkpoint_of_some_of_the_partitions(
        redis_server: Any, single_client: Any, namespace: str, topics: Topics) -> None:
    """A group-mode checkpoint holds only its member's partitions; the others' offsets are the
    group's. Before, a restart without groupId read those from their log start: rows the
    group's other members had read came again (here ev-1's 3 records)."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    topics.create("ev", 2)
    Producer(single_client, namespace, "round_robin").send_batch("ev", [b"a"] * 6)
    held = Position({TP("ev", 0): 3}, generation=4, member="m-1",
                    tokens={"ev": topics.create_token("ev")})
    plain = _stream_reader(redis_server.url, namespace, subscribe="ev", failOnDataLoss="false")
    with pytest.raises(OptionError, match=r"^groupId: the checkpoint was written in group mode "
                                          r"\(member 'm-1', generation 4\).* would read ev-1 "
                                          r"from their log start.*Restart with the groupId"):
        plain.latestOffset(held.to_json(), ReadAllAvailable())
    every = Position({TP("ev", 0): 3, TP("ev", 1): 3}, generation=4, member="m-1",
                     tokens=held.tokens)
    assert plain.latestOffset(every.to_json(), ReadAllAvailable()) == every.to_json()


def test_a_streams_specific_starting_offsets_must_name_every_partition(
        redis_server: Any, single_client: Any, namespace: str, topics: Topics) -> None:
    # Before, the partitions a stream's JSON left out started at latest: re-1's five records
    # were skipped without a word. Spark's Kafka source refuses such a start; a batch read
    # keeps its documented defaults (earliest to latest: nothing is skipped).
    topics.create("re", 2)
    Producer(single_client, namespace, "round_robin").send_batch("re", [b"x"] * 10)
    partial = _stream_reader(redis_server.url, namespace, startingOffsets='{"re": {"0": 0}}')
    with pytest.raises(OptionError, match=r"^startingOffsets: specific offsets must name every "
                                          r"partition .*\(-1 for latest, -2 for earliest\); "
                                          r"missing: re-1$"):
        partial.initialOffset()
    whole = _stream_reader(redis_server.url, namespace,
                           startingOffsets='{"re": {"0": 0, "1": -2}}')
    assert Position.from_json(whole.initialOffset()).offsets == {TP("re", 0): 0, TP("re", 1): 0}


def test_a_batch_reads_json_ending_offsets_only_when_they_name_every_partition(
        redis_server: Any, single_client: Any, namespace: str, topics: Topics) -> None:
    # Before, a partition endingOffsets left out (a partition added since the ends were
    # noted, a topic subscribed to by mistake) was read to its log end: past the end the read
    # pins, a different range on every run. Spark's Kafka source refuses such ends; a batch
    # start may still leave partitions out (they start at earliest: nothing is skipped).
    source = pytest.importorskip("rcoord.spark.source")  # pyspark, but no JVM
    topics.create("re", 2)
    Producer(single_client, namespace, "round_robin").send_batch("re", [b"x"] * 10)

    def read(**kw: str) -> list[OffsetRange]:
        return [t.range for t in source.BatchReader(parse_read_options(
            {"url": redis_server.url, "namespace": namespace, "subscribe": "re", **kw},
            ReadKind.BATCH, env={})).partitions()]

    with pytest.raises(OptionError, match=r"^endingOffsets: specific offsets must name every "
                                          r"partition .*\(-1 for latest\); missing: re-1$"):
        read(endingOffsets='{"re": {"0": 2}}')
    assert read(endingOffsets='{"re": {"0": 2, "1": -1}}') == [OffsetRange("re", 0, 0, 2),
                                                               OffsetRange("re", 1, 0, 5)]
    assert read(startingOffsets='{"re": {"0": 3}}') == [OffsetRange("re", 0, 3, 5),
                                                        OffsetRange("re", 1, 0, 5)]


@pytest.mark.parametrize("starting", ["latest", "earliest"])
def test_batch_0_replayed_after_a_restart_reads_what_it_planned(
        starting: str, redis_server: Any, single_client: Any, namespace: str,
        topics: Topics) -> None:
    # Batch 0 failed (no commits/0) and the query restarts on its checkpoint: Spark replays it
    # from the *new* process's initialOffset(). Before, under latest that was a new log end
    # past the batch's records (they were in no batch); under earliest, a log start retention
    # had moved (the trimmed records were lost without failOnDataLoss's error).
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    topics.create("re", 1, retention_records=4)
    producer = Producer(single_client, namespace)
    producer.send_batch("re", [b"before"] * 2)
    first = _stream_reader(redis_server.url, namespace, startingOffsets=starting)
    init = first.initialOffset()
    producer.send_batch("re", [b"batch 0"] * 2)
    end0 = first.latestOffset(init, ReadAllAvailable())
    planned = _offsets(first, init, end0)
    assert planned == [(0, n) for n in (range(2, 4) if starting == "latest" else range(4))]

    producer.send_batch("re", [b"while down"] * 2)  # offsets 4, 5
    again = _stream_reader(redis_server.url, namespace, startingOffsets=starting)
    if starting == "latest":
        assert _offsets(again, again.initialOffset(), end0) == planned
        after = again.latestOffset(end0, ReadAllAvailable())
        assert _offsets(again, end0, after) == [(0, 4), (0, 5)]
    else:
        topics.apply_retention("re")  # keeps the last 4: offsets 0 and 1 go
        with pytest.raises(DataLossError, match="offsets 0..1 were removed by retention"):
            _offsets(again, again.initialOffset(), end0)


@pytest.mark.parametrize("subscription", [
    {"subscribe": "re,keep"}, {"assign": '{"re": [0, 1], "keep": [0]}'}])
def test_a_stream_reports_a_deleted_topic_as_data_loss_and_reads_it_anew_if_created_again(
        subscription: dict[str, str], redis_server: Any, single_client: Any, namespace: str,
        topics: Topics, caplog: Any) -> None:
    # A named topic deleted while the query runs. Before, every plan after the deletion failed
    # with "subscribe: unknown topic" whatever failOnDataLoss said; Spark's Kafka source reports
    # the partitions as gone (data loss) and, without failOnDataLoss, goes on without them.
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    every = ReadAllAvailable()
    topics.create("re", 2)
    topics.create("keep", 1)
    producer = Producer(single_client, namespace, "round_robin")
    producer.send_batch("re", [b"old"] * 10)
    producer.send_batch("keep", [b"k"] * 3)
    strict = _stream_reader(redis_server.url, namespace, **subscription)
    first = strict.initialOffset()
    batch = strict.latestOffset(first, every)
    assert Position.from_json(batch).offsets == {TP("re", 0): 5, TP("re", 1): 5,
                                                 TP("keep", 0): 3}

    topics.delete("re")
    producer.send_batch("keep", [b"k"] * 2)
    with pytest.raises(DataLossError, match=r"^topic 're' partition 0 is gone \(the topic was "
                                            r"deleted\) .* from offset 5 on.*failOnDataLoss=false"):
        strict.latestOffset(batch, every)
    # a query that starts now: the topic is unknown, a plain option error as before
    with pytest.raises(OptionError, match="unknown topic 're'"):
        _stream_reader(redis_server.url, namespace, **subscription).initialOffset()

    lenient = _stream_reader(redis_server.url, namespace, failOnDataLoss="false", **subscription)
    with caplog.at_level("WARNING", logger="rcoord.spark"):
        nxt = lenient.latestOffset(batch, every)
    assert Position.from_json(nxt).offsets == {TP("keep", 0): 5}
    assert _offsets(lenient, batch, nxt) == [(0, 3), (0, 4)]  # keep's new records only
    assert "topic 're' partition 1 is gone" in caplog.text
    assert lenient.latestOffset(nxt, every) == nxt  # nothing new: no second report

    # created again: its partitions are new to the query, read from their log start
    topics.create("re", 2)
    producer.send_batch("re", [b"new"] * 4)
    again = lenient.latestOffset(nxt, every)
    assert Position.from_json(again).starts == {TP("re", 0): 0, TP("re", 1): 0}
    assert _offsets(lenient, nxt, again) == [(0, 0), (0, 1), (1, 0), (1, 1)]


def _delete_before_the_snapshot(source: Any, monkeypatch: Any, topic: str) -> None:
    """``topic``, whenever it exists then, is deleted between a batch read's listing of its
    partitions and the reading of their bounds (``log_snapshot``): the race a batch read must
    report."""
    snapshot = source.log_snapshot

    def deleted_first(admin: Topics, parts: Any) -> Any:
        if topic in admin.list():
            admin.delete(topic)
        return snapshot(admin, parts)

    monkeypatch.setattr(source, "log_snapshot", deleted_first)


def test_a_batch_read_reports_a_topic_deleted_while_it_was_planned_as_data_loss(
        redis_server: Any, single_client: Any, namespace: str, topics: Topics,
        monkeypatch: Any, caplog: Any) -> None:
    # The topic goes between listing the partitions and reading their bounds. Before, its
    # partitions took the bounds (0, 0): empty ranges, an empty read without a word, also
    # with failOnDataLoss=true.
    source = pytest.importorskip("rcoord.spark.source")  # pyspark, but no JVM
    topics.create("gone", 2)
    topics.create("keep", 1)
    producer = Producer(single_client, namespace, "round_robin")
    producer.send_batch("gone", [b"g"] * 4)
    producer.send_batch("keep", [b"k"] * 3)
    _delete_before_the_snapshot(source, monkeypatch, "gone")

    def reader(**kw: str) -> Any:
        return source.BatchReader(parse_read_options(
            {"url": redis_server.url, "namespace": namespace, "subscribe": "gone,keep", **kw},
            ReadKind.BATCH, env={}))

    with pytest.raises(DataLossError, match=r"^topic 'gone' partition 0 was deleted while the "
                                            r"batch read was planned.*failOnDataLoss=false"):
        reader().partitions()
    topics.create("gone", 2)
    with caplog.at_level("WARNING", logger="rcoord.spark"):
        tasks = reader(failOnDataLoss="false").partitions()
    assert [t.range for t in tasks] == [OffsetRange("keep", 0, 0, 3)]
    assert "topic 'gone' partition 1 was deleted while the batch read" in caplog.text


def test_a_batch_read_with_json_offsets_reads_on_without_a_topic_deleted_while_planned(
        redis_server: Any, single_client: Any, namespace: str, topics: Topics,
        monkeypatch: Any) -> None:
    # failOnDataLoss=false reads on without a topic deleted between listing its partitions
    # and reading their bounds; its entries in startingOffsets/endingOffsets (JSON naming
    # every partition, as a batch read often does) then failed the read with "gone-0 is not
    # among the partitions this read covers (check the topic name and partition count)".
    source = pytest.importorskip("rcoord.spark.source")  # pyspark, but no JVM
    topics.create("gone", 1)
    topics.create("keep", 1)
    Producer(single_client, namespace).send_batch("keep", [b"k"] * 3)
    _delete_before_the_snapshot(source, monkeypatch, "gone")
    tasks = source.BatchReader(parse_read_options(
        {"url": redis_server.url, "namespace": namespace, "subscribe": "gone,keep",
         "failOnDataLoss": "false", "startingOffsets": '{"gone": {"0": 0}, "keep": {"0": 1}}',
         "endingOffsets": '{"gone": {"0": -1}, "keep": {"0": 3}}'},
        ReadKind.BATCH, env={})).partitions()
    assert [t.range for t in tasks] == [OffsetRange("keep", 0, 1, 3)]


def test_continuity_loss_names_topic_partition_and_offsets(
        single_client: Any, namespace: str, topics: Topics) -> None:
    tp = TP("gap", 0)
    topics.create("gap", 1, retention_records=5)
    Producer(single_client, namespace).send_batch("gap", [b"x"] * 8)
    bounds, tokens = log_snapshot(topics, [tp])
    planned = Position({tp: 2}, tokens=tokens)
    assert next_position(planned, [tp], bounds, tokens, None, True) == Position({tp: 8},
                                                                                tokens=tokens)
    topics.apply_retention("gap")  # offsets 0..2 go
    bounds = log_bounds(topics, [tp])
    with pytest.raises(DataLossError, match=r"^topic 'gap' partition 0: offsets 2 to 2 were "
                                            r"removed by retention .*\(3\)$"):
        next_position(planned, [tp], bounds, tokens, None, True)
    got = next_position(planned, [tp], bounds, tokens, None, False)
    assert got is not None and ranges_between(planned, got) == [OffsetRange("gap", 0, 3, 8)]
    # a position checkpointed before tokens existed: a start past the log end still shows
    with pytest.raises(DataLossError, match="start offset 9 is past the log end offset 8"):
        next_position(Position({tp: 9}), [tp], bounds, tokens, None, True)
    # availableNow's target (here 6) below a start records moved past it is no loss
    assert next_position(Position({tp: 7}, tokens=tokens), [tp], bounds, tokens, None, True,
                         lambda b, _tokens: {t: (lo, 6) for t, (lo, _) in b.items()}) is None


# -- rows to records ---------------------------------------------------------------------------


def test_rows_become_records(single_client: Any, namespace: str, topics: Topics) -> None:
    topic, rec = row_to_record({"value": "v", "key": b"k", "partition": 1,
                                "headers": [{"key": "h", "value": b"1"}]}, "dflt")
    assert topic == "dflt" and rec.value == b"v" and rec.key == b"k" and rec.partition == 1
    assert rec.headers == [("h", b"1")]
    with pytest.raises(OptionError, match="^topic:"):
        row_to_record({"value": b"v"}, None)
    topics.create("w", 4)
    res = write_rows(Producer(single_client, namespace),
                     [{"value": b"a", "key": b"k1"}, {"value": b"b", "topic": "w"}], "w")
    assert res.appended == 2


def test_max_request_size_is_a_write_option_that_bounds_each_row(
        single_client: Any, namespace: str, topics: Topics) -> None:
    """``maxRequestSize`` (Spark's Kafka sink takes ``kafka.max.request.size``): a row larger
    than it fails with MESSAGE_TOO_LARGE, as Kafka's producer does, and nothing of it is
    written; the default is Kafka's 1 MiB."""
    assert parse_write_options(URL, env={}).max_request_size == 1 << 20
    got = parse_write_options({**URL, "maxrequestsize": "10485760"}, env={})
    assert got.max_request_size == 10 << 20
    for bad in ("0", "x", str((1 << 29) + 1)):
        with pytest.raises(OptionError, match="^maxRequestSize: must be"):
            parse_write_options({**URL, "maxrequestsize": bad}, env={})
    with pytest.raises(OptionError, match="^kafka.max.request.size: use maxRequestSize"):
        parse_write_options({**URL, "kafka.max.request.size": "5"}, env={})
    topics.create("big", 1)
    for producer_id in (None, "spark:q:0"):
        producer = make_producer(single_client, namespace, producer_id, 0, max_request_size=64)
        with pytest.raises(TopicError) as err:
            write_rows(producer, [{"value": b"a"}, {"value": b"v" * 65}], "big")
        assert err.value.error == Errors.MESSAGE_TOO_LARGE
        assert write_rows(producer, [{"value": b"v" * 64}], "big").appended == 1
    assert topics.describe("big").partitions[0].log_end_offset == 2


def test_rows_keep_repeated_and_null_headers_both_ways(
        single_client: Any, namespace: str, topics: Topics) -> None:
    # Spark's Kafka rows carry headers as an array of (key, value) structs: names may repeat
    # and values may be null, as in Kafka; a write keeps them all, in order, and a read gives
    # them back the same way (before, both went through a dict and kept one per name).
    pa = pytest.importorskip("pyarrow")
    from rcoord.spark.rows import records_to_batch

    rows_headers = [{"key": "a", "value": b"1"}, {"key": "n", "value": None},
                    {"key": "a", "value": b"2"}]
    topics.create("hdr", 1)
    res = write_rows(Producer(single_client, namespace),
                     [{"value": b"v", "partition": 0, "headers": rows_headers}], "hdr")
    assert res.appended == 1
    records = fetch(single_client, namespace, "hdr", 0, 0, 10).records
    assert records[0].header_list == (("a", b"1"), ("n", None), ("a", b"2"))
    batch = records_to_batch("hdr", 0, records)
    assert isinstance(batch, pa.RecordBatch)
    assert batch.column("headers").to_pylist() == [rows_headers]
    # A record without headers reads as null, as in Spark's Kafka source (it was []).
    assert write_rows(Producer(single_client, namespace), [{"value": b"w", "partition": 0}],
                      "hdr").appended == 1
    records = fetch(single_client, namespace, "hdr", 0, 0, 10).records
    assert records_to_batch("hdr", 0, records).column("headers").to_pylist() == [
        rows_headers, None]
    # The struct's fields are read by position, as Spark's sink does: their names passed the
    # type check in any case (it failed every task with KeyError: 'key').
    assert row_to_record({"value": b"v", "headers": [{"KEY": "h", "VALUE": b"x"}]},
                         "hdr")[1].headers == [("h", b"x")]
    # A null key was stored as a header named 'None'; Spark's Kafka sink fails the task.
    with pytest.raises(OptionError, match="headers: a header's key is null"):
        row_to_record({"value": b"v", "headers": [{"key": None, "value": b"x"}]}, "hdr")
    # A null element (F.array(F.when(cond, F.struct(...)))) failed with a TypeError about
    # 'NoneType' not being subscriptable.
    with pytest.raises(OptionError, match=r"^headers: a header \(an element .*\) is null"):
        row_to_record({"value": b"v", "headers": [{"key": "h", "value": b"x"}, None]}, "hdr")


def test_the_topic_option_wins_over_the_topic_column() -> None:
    # As Spark's Kafka sink: a stream read from "in" (its rows carry topic "in") and written
    # with option("topic", "out") goes to "out", not back into "in" for ever.
    assert row_to_record({"value": b"x", "topic": "in"}, "out")[0] == "out"
    assert row_to_record({"value": b"x", "topic": "in"}, None)[0] == "in"
    with pytest.raises(OptionError, match="^topic: a row's topic is null or empty"):
        row_to_record({"value": b"x", "topic": ""}, None)  # (it said there was no column)


def test_a_write_is_checked_when_planned_and_never_overwrites() -> None:
    """Spark's Kafka sink refuses SaveMode.Overwrite; before, ``mode("overwrite")`` appended
    silently (measured on Spark 4.3: a 32-record topic had 33 after it), and a write without a
    topic failed only inside each task."""
    with pytest.raises(OptionError, match=r'^mode: .*\.mode\("append"\)'):
        check_write_plan(["key", "value"], "out", overwrite=True)
    with pytest.raises(OptionError, match="^topic: set .option"):
        check_write_plan(["key", "value"], None, overwrite=False)
    with pytest.raises(OptionError, match="^value: a write needs a value column"):
        check_write_plan(["key", "topic"], None, overwrite=False)
    # Names are exact, as every task reads its rows: "Value" passed here, then failed in each.
    with pytest.raises(OptionError, match=r"^value: .*lower case.*\['Topic', 'Value'\]"):
        check_write_plan(["Value", "Topic"], None, overwrite=False)
    with pytest.raises(OptionError, match="^topic: set .option"):
        check_write_plan(["value", "Topic"], None, overwrite=False)
    check_write_plan(["value", "topic"], None, overwrite=False)
    check_write_plan(["value"], "out", overwrite=False)


@pytest.mark.parametrize(("types", "message"), [
    ({"value": "int"}, (r"^value: the value column is int; a write takes string or binary "
                        r"\(cast it, e\.g\. col\('value'\)\.cast\('string'\)\)")),
    ({"value": "binary", "key": "double"}, "^key: the key column is double"),
    ({"value": "string", "partition": "string"}, "^partition: the partition column is string"),
    ({"value": "string", "topic": "binary"}, "^topic: the topic column is binary"),
    ({"value": "string", "headers": "map<string,binary>"}, "^headers: the headers column is map"),
])
def test_a_write_of_a_column_of_the_wrong_type_fails_when_planned(
        types: dict[str, str], message: str) -> None:
    # Spark's Kafka sink checks the types when the query is analysed; before, an int value or a
    # string partition passed the plan and failed in every task.
    with pytest.raises(OptionError, match=message):
        check_write_plan(list(types), None if "topic" in types else "out", overwrite=False,
                         types=types)


def test_a_write_takes_the_types_the_kafka_sink_takes() -> None:
    check_write_plan(["topic", "key", "value", "partition", "headers"], None, overwrite=False,
                     types={"topic": "string", "key": "binary", "value": "string",
                            "partition": "bigint",
                            "headers": "array<struct<key:string,value:binary>>"})
    # a column of nulls only (lit(None)) is read as None, as before
    check_write_plan(["key", "value", "partition"], "out", overwrite=False,
                     types={"key": "void", "value": "binary", "partition": "void"})
    # ... but not value: Spark's Kafka sink refuses a void value (a lit(None) by mistake wrote a
    # tombstone in every record); a null value of a typed column is still written
    with pytest.raises(OptionError, match=r"^value: the value column is void .*cast\('binary'\)"):
        check_write_plan(["value"], "out", overwrite=False, types={"value": "void"})
    with pytest.raises(OptionError, match="^topic: the topic column is void"):
        check_write_plan(["topic", "value"], None, overwrite=False,
                         types={"topic": "void", "value": "binary"})
    # with the topic option the topic column is not read, whatever its type
    check_write_plan(["topic", "value"], "out", overwrite=False,
                     types={"topic": "int", "value": "binary"})


def test_the_data_source_refuses_a_batch_overwrite_and_accepts_append() -> None:
    pytest.importorskip("pyspark")
    from pyspark.sql.types import BinaryType, IntegerType, NullType, StructField, StructType

    from rcoord.spark.source import RcoordDataSource

    source = RcoordDataSource({**URL, "topic": "out"})
    schema = StructType([StructField("value", BinaryType())])
    with pytest.raises(OptionError, match="^mode: "):
        source.writer(schema, True)
    assert source.writer(schema, False) is not None
    assert source.streamWriter(schema, True) is not None  # Complete output mode: appends
    wrong = StructType([StructField("value", IntegerType())])
    void = StructType([StructField("value", NullType())])  # lit(None).alias("value")
    for make in (source.writer, source.streamWriter):
        with pytest.raises(OptionError, match="^value: the value column is int"):
            make(wrong, False)
        with pytest.raises(OptionError, match="^value: the value column is void"):
            make(void, False)


def test_a_retried_write_task_of_keyless_rows_appends_each_row_once(
        single_client: Any, namespace: str, topics: Topics) -> None:
    # A streaming write task is an idempotent producer named by the query and task, at the
    # batch's epoch; a retried (or speculative) attempt sends the same rows in the same order
    # and must put each where the first attempt did, or dedup (per-partition sequence numbers)
    # drops other rows as duplicates and appends some twice. The first attempt dies half-way.
    topics.create("out", 4)
    rows = [{"value": f"v{i}".encode() * 20} for i in range(3000)]
    first = write_rows(make_producer(single_client, namespace, "spark:q:0", 7), rows[:1500],
                       "out")
    retry = write_rows(make_producer(single_client, namespace, "spark:q:0", 7), rows, "out")
    assert (first.appended, retry.duplicates, retry.appended) == (1500, 1500, 1500)
    stored: list[bytes] = []
    for p in range(4):
        got = fetch(single_client, namespace, "out", p, 0, max_records=5000).records
        stored += [r.value for r in got if r.value is not None]
    assert sorted(stored) == sorted(r["value"] for r in rows)  # each row once, none lost
    assert len({p for p in range(4) if fetch(single_client, namespace, "out", p, 0, 1).records}) > 1


def test_a_retried_keyed_row_is_checked_off_only_in_its_keys_partition(
        single_client: Any, namespace: str, topics: Topics) -> None:
    """A keyed row without a partition was checked off against any record with its content:
    a retry in another order let it take the record of an explicit-partition row with the same
    key, value and headers, which was then appended again, and no copy reached the key's
    partition, where its readers look (a reviewer's reproduction)."""
    from rcoord.murmur2 import partition_for_key

    topics.create("kp", 4)
    home = partition_for_key(b"K", 4)
    other = (home + 1) % 4
    explicit = {"value": b"V", "key": b"K", "partition": other}
    keyed = {"value": b"V", "key": b"K"}
    first = write_rows(make_producer(single_client, namespace, "spark:q:0", 0), [explicit], "kp")
    retry = write_rows(make_producer(single_client, namespace, "spark:q:0", 0),
                       [keyed, explicit], "kp")
    assert (first.appended, retry.appended, retry.duplicates) == (1, 1, 1)
    assert _stored(single_client, namespace, "kp", 4) == Counter({
        (home, b"K", b"V", ()): 1, (other, b"K", b"V", ()): 1})


def _dies_after(rows: list[dict[str, Any]], n: int) -> Any:
    """A task's input that fails after ``n`` rows (an executor lost mid-task)."""
    for i, row in enumerate(rows):
        if i == n:
            raise ConnectionError("executor lost")
        yield row


def _stored(client: Any, namespace: str, topic: str, partitions: int) -> Counter[Any]:
    """Every record of the topic as (partition if keyed else None, key, value, headers)."""
    out: Counter[Any] = Counter()
    for p in range(partitions):
        for r in fetch(client, namespace, topic, p, 0, max_records=100_000).records:
            out[(p if r.key is not None else None, r.key, r.value, r.header_list)] += 1
    return out


def _expected(rows: list[dict[str, Any]], partitions: int) -> Counter[Any]:
    from rcoord.murmur2 import partition_for_key

    return Counter(
        (None if r.get("key") is None else partition_for_key(r["key"], partitions),
         r.get("key"), r["value"],
         tuple((h["key"], h["value"]) for h in r.get("headers") or ()))
        for r in rows)


def _shuffled_rows() -> list[dict[str, Any]]:
    # What a task after a shuffle sees: keyed and keyless rows, repeated values among them
    # (counts often repeat), some with headers.
    rows: list[dict[str, Any]] = []
    for i in range(3000):
        row: dict[str, Any] = {"value": f"v{i % 700}".encode() * 5}
        if i % 3:
            row["key"] = f"k{i % 50}".encode()
        if i % 7 == 0:
            row["headers"] = [{"key": "h", "value": str(i % 4).encode()}]
        rows.append(row)
    return rows


@pytest.mark.parametrize("died_after", [1500, 2500])
def test_a_retried_write_task_that_sees_its_rows_in_another_order_loses_none(
        single_client: Any, namespace: str, topics: Topics, died_after: int) -> None:
    # After a shuffle Spark does not keep the order of a task's rows across attempts (shuffle
    # blocks arrive in any order). The first attempt appended some rows and died; the retry
    # (same producer id and epoch) sees the same rows in another order. Numbering by position
    # took the retry's first rows for duplicates of different rows: those were lost, and the
    # first attempt's rows the retry sent later were stored twice.
    import random

    topics.create("out", 4)
    rows = _shuffled_rows()
    with pytest.raises(ConnectionError):
        write_rows(make_producer(single_client, namespace, "spark:q:3", 9),
                   _dies_after(rows, died_after), "out")
    stored_first = sum(_stored(single_client, namespace, "out", 4).values())
    assert 0 < stored_first < len(rows)
    again = list(rows)
    random.Random(5).shuffle(again)
    retry = write_rows(make_producer(single_client, namespace, "spark:q:3", 9), again, "out")
    assert _stored(single_client, namespace, "out", 4) == _expected(rows, 4)  # once each
    assert (retry.duplicates, retry.appended) == (stored_first, len(rows) - stored_first)


def test_a_retry_of_a_retry_reads_back_what_every_attempt_stored(
        single_client: Any, namespace: str, topics: Topics) -> None:
    # Three attempts, each in its own order; the first two die at different points. Rows with
    # an explicit partition are checked off only against that partition.
    import random

    topics.create("out", 4)
    rows = _shuffled_rows()[:2000]
    for i, r in enumerate(rows[:300]):
        r["partition"] = i % 4
        r.pop("key", None)
    orders = [list(rows) for _ in range(3)]
    for seed, order in enumerate(orders):
        random.Random(seed).shuffle(order)
    with pytest.raises(ConnectionError):
        write_rows(make_producer(single_client, namespace, "spark:q:1", 2),
                   _dies_after(orders[0], 1200), "out")
    with pytest.raises(ConnectionError):
        write_rows(make_producer(single_client, namespace, "spark:q:1", 2),
                   _dies_after(orders[1], 1900), "out")
    stored_before = sum(_stored(single_client, namespace, "out", 4).values())
    last = write_rows(make_producer(single_client, namespace, "spark:q:1", 2), orders[2], "out")
    assert (last.duplicates, last.appended) == (stored_before, len(rows) - stored_before)
    stored = Counter()
    for p in range(4):
        for rec in fetch(single_client, namespace, "out", p, 0, max_records=10_000).records:
            stored[(rec.key, rec.value, rec.header_list)] += 1
    assert stored == Counter((r.get("key"), r["value"],
                              tuple((h["key"], h["value"]) for h in r.get("headers") or ()))
                             for r in rows)
    for i, r in enumerate(rows[:300]):  # each explicit partition holds its rows
        got = fetch(single_client, namespace, "out", i % 4, 0, max_records=10_000).records
        assert r["value"] in {rec.value for rec in got}
    # the next batch (a higher epoch) is a first attempt again: it checks nothing off
    nxt = write_rows(make_producer(single_client, namespace, "spark:q:1", 3), rows[:10], "out")
    assert (nxt.appended, nxt.duplicates) == (10, 0)


def test_a_keyless_row_does_not_take_the_stored_record_an_explicit_partition_row_needs(
        single_client: Any, namespace: str, topics: Topics) -> None:
    # The same content twice: once keyless (stored wherever the sticky partitioner put it) and
    # once with an explicit partition 0. A retry that checked the keyless row off against the
    # partition-0 record (the first partition holding that content) left the explicit row
    # nothing to match, so it was appended again: stored three times instead of twice.
    rows: list[dict[str, Any]] = [{"value": b"same"}, {"value": b"same", "partition": 0}]
    for n in range(20):  # a producer id whose keyless record lands off partition 0
        topic, pid = f"mix{n}", f"spark:q:mix{n}"
        topics.create(topic, 4)
        write_rows(make_producer(single_client, namespace, pid, 0), rows, topic)
        if len(fetch(single_client, namespace, topic, 0, 0, max_records=10).records) == 1:
            break
    else:
        pytest.fail("every producer id put the keyless row on partition 0")
    retry = write_rows(make_producer(single_client, namespace, pid, 0), rows, topic)
    assert (retry.duplicates, retry.appended) == (2, 0)
    per_part = [len(fetch(single_client, namespace, topic, p, 0, max_records=10).records)
                for p in range(4)]
    assert sum(per_part) == 2 and per_part[0] == 1


def test_an_attempt_running_beside_another_in_another_order_fails_and_loses_nothing(
        single_client: Any, namespace: str, topics: Topics) -> None:
    # A speculative copy (or a zombie) appends under the same id and epoch at the same time as
    # another attempt, in another order. Here the second attempt runs whole while the first is
    # half-way; the first then sends sequence numbers the second already used for other rows.
    # It must not report success (its rows were not stored under those numbers): it fails,
    # and every row is stored (some twice: two live attempts cannot both be exact).
    import random

    from rcoord.spark.retry import AttemptConflict

    topics.create("out", 4)
    rows = _shuffled_rows()[:2000]
    other = list(rows)
    random.Random(3).shuffle(other)
    second: list[Any] = []

    def first_attempt() -> Any:
        for i, row in enumerate(rows):
            if i == 1000:
                second.append(write_rows(make_producer(single_client, namespace, "spark:q:2", 0),
                                         other, "out"))
            yield row

    with pytest.raises(AttemptConflict):
        write_rows(make_producer(single_client, namespace, "spark:q:2", 0), first_attempt(),
                   "out")
    assert second[0].duplicates == 1000 and second[0].appended == 1000
    lost = _expected(rows, 4) - _stored(single_client, namespace, "out", 4)
    assert not lost


def test_two_attempts_in_the_same_order_interleaved_store_each_keyless_row_once(
        single_client: Any, namespace: str, topics: Topics) -> None:
    # A speculative copy (launched once its original runs slow, so after that one stored some
    # rows) or a retry beside a zombie, without a shuffle: both see the rows in the same order.
    # The later attempt skips the rows it finds stored; it placed the rest by a partitioner
    # that had not seen the skipped ones, so its keyless rows went to other partitions than
    # the first attempt's, under the sequence numbers the first one uses for them. Interleaved,
    # each then found the other's rows under its numbers: both attempts failed
    # (AttemptConflict) and rows were stored twice. The partitioner now places every row,
    # skipped or not, so both attempts place and number each row alike.
    topics.create("out", 4)
    rows = [{"value": f"v{i}".encode() * 20} for i in range(3000)]
    b_paused, b_go = threading.Event(), threading.Event()
    results: dict[str, Any] = {}

    def attempt(name: str, source: Any) -> None:
        try:
            results[name] = write_rows(make_producer(single_client, namespace, "spark:q:4", 6),
                                       source, "out")
        except Exception as exc:  # noqa: BLE001 (reported by the assertions below)
            results[name] = exc

    def b_rows() -> Any:
        for i, row in enumerate(rows):
            if i == 2500:  # it has stored rows 1000..1999 of its own
                b_paused.set()
                assert b_go.wait(30)
            yield row

    b = threading.Thread(target=attempt, args=("b", b_rows()))

    def a_rows() -> Any:
        for i, row in enumerate(rows):
            if i == 1500:  # it has stored rows 0..999
                b.start()
                assert b_paused.wait(30)
            yield row

    try:
        attempt("a", a_rows())
    finally:
        b_go.set()
        b.join(30)
    a, b_res = results["a"], results["b"]
    assert not isinstance(a, Exception), a
    assert not isinstance(b_res, Exception), b_res
    assert (a.appended, a.duplicates) == (2000, 1000)
    assert (b_res.appended, b_res.duplicates) == (1000, 2000)
    stored: Counter[bytes | None] = Counter()
    for p in range(4):
        stored.update(r.value for r in fetch(single_client, namespace, "out", p, 0,
                                             max_records=10_000).records)
    assert stored == Counter(r["value"] for r in rows)


def test_a_zombie_is_fenced_only_where_its_own_task_of_a_newer_batch_wrote(
        single_client: Any, namespace: str, topics: Topics) -> None:
    # docs/guarantees.md said a zombie of an older batch is fenced "in every partition the
    # newer batch has written to"; the producer is per task, so only its own task's appends
    # of a newer batch fence it.
    topics.create("z", 2)
    write_rows(make_producer(single_client, namespace, "spark:q:0", 7),
               [{"value": b"a", "partition": 0}], "z")
    write_rows(make_producer(single_client, namespace, "spark:q:0", 8),
               [{"value": b"b", "partition": 0}], "z")
    write_rows(make_producer(single_client, namespace, "spark:q:1", 8),
               [{"value": b"c", "partition": 1}], "z")
    with pytest.raises(TopicError) as err:
        write_rows(make_producer(single_client, namespace, "spark:q:0", 7),
                   [{"value": b"z", "partition": 0}], "z")
    assert err.value.error == Errors.PRODUCER_FENCED
    zombie = write_rows(make_producer(single_client, namespace, "spark:q:0", 7),
                        [{"value": b"z", "partition": 1}], "z")
    assert (zombie.appended, zombie.duplicates) == (1, 0)  # task 1's batch 8 fences nothing


def test_an_attempt_refused_its_sequence_numbers_fails_as_a_conflict(
        single_client: Any, namespace: str, topics: Topics) -> None:
    """A zombie attempt's call fails (not appended) and its next is accepted with the gap
    declared lost, while a new attempt of the same id and epoch has read the state and resumes
    into that gap: the partition refuses it (OUT_OF_ORDER_SEQUENCE_NUMBER), and the attempt
    fails as the AttemptConflict write_rows names (before: a TopicError whose advice, a higher
    producer_epoch, a Spark task cannot take). A reviewer's repro."""
    from rcoord.spark.retry import AttemptConflict

    class FailOnce:
        def __init__(self, inner: Any) -> None:
            self._inner, self.fail = inner, False

        def __getattr__(self, name: str) -> Any:
            return getattr(self._inner, name)

        def evalsha(self, *args: Any) -> Any:
            if self.fail:
                self.fail = False
                raise redis.exceptions.ConnectionError("lost before sending")
            return self._inner.evalsha(*args)

    topics.create("t", 1)
    client = FailOnce(single_client)
    zombie = make_producer(client, namespace, "spark:q:5", 0)  # type: ignore[arg-type]
    zombie.send_batch("t", [ProducerRecord(b"A", partition=0)])

    def rows() -> Any:
        yield {"value": b"A", "partition": 0}  # checked off: the attempt has read the state
        client.fail = True
        with pytest.raises(ConnectionLost):
            zombie.send_batch("t", [ProducerRecord(b"Z1", partition=0)])
        zombie.send_batch("t", [ProducerRecord(b"Z2", partition=0)])  # sequence 1 skipped
        yield {"value": b"B", "partition": 0}  # sequence 1 again

    with pytest.raises(AttemptConflict, match="refused this attempt's sequence numbers"):
        write_rows(make_producer(single_client, namespace, "spark:q:5", 0), rows(), "t")
    assert [r.value for r in fetch(single_client, namespace, "t", 0, 0).records] == [b"A", b"Z2"]


def test_a_duplicate_answer_is_checked_against_the_row_sent(
        single_client: Any, namespace: str, topics: Topics) -> None:
    # A call run twice (redis-py resends after a lost reply) answers duplicates of this very
    # row: fine. A duplicate of a different row means another attempt took the number.
    from rcoord.spark.retry import AttemptConflict, check_duplicates
    from rcoord.topics import ProducerRecord

    topics.create("d", 2)
    recs = [ProducerRecord(f"r{i}".encode(), partition=i % 2) for i in range(6)]
    Producer(single_client, namespace, producer_id="p", producer_epoch=1).send_batch("d", recs)
    resend = Producer(single_client, namespace, producer_id="p", producer_epoch=1)
    metas = resend.send_batch("d", recs)
    assert all(m.duplicate for m in metas)
    check_duplicates(resend, "d", recs, metas)  # the same rows: no error
    swapped = [recs[2], recs[1], recs[0], *recs[3:]]
    with pytest.raises(AttemptConflict, match="d partition 0: producer p epoch 1: .*offset 0"):
        check_duplicates(resend, "d", swapped, metas)


# -- the group member (Spark's runner calls, without Spark) ------------------------------------


@pytest.fixture
def coord(single_client: Any, namespace: str) -> GroupCoordinator:
    cfg = CoordinatorConfig(namespace=namespace, group_min_session_timeout_ms=10,
                            group_initial_rebalance_delay_ms=0)
    return GroupCoordinator(single_client, cfg).start()


@pytest.fixture
def latest(topics: Topics) -> Any:
    """``StreamMember.plan``'s ``latest``: the log snapshot of the partitions asked for."""
    return lambda parts: log_snapshot(topics, parts)


def _member(url: str, namespace: str, client: Any, first_join_wait_s: float | None = None,
            **kw: str) -> StreamMember:
    o = parse_read_options({"url": url, "namespace": namespace, "subscribe": "ev",
                            "groupId": "g", "sessionTimeoutMs": "1500",
                            "heartbeatIntervalMs": "200", "rebalanceTimeoutMs": "5000", **kw},
                           ReadKind.STREAM, env={})
    return StreamMember(ConsumerGroup(member_config(o, ["ev"], client)), rejoin_wait_s=0.2,
                        fail_on_data_loss=o.fail_on_data_loss, first_join_wait_s=first_join_wait_s)


def test_member_rebases_commits_fenced_and_leaves(redis_server: Any, single_client: Any,
                                                  namespace: str, topics: Topics,
                                                  coord: GroupCoordinator, latest: Any) -> None:
    topics.create("ev", 4)
    Producer(single_client, namespace, "round_robin").send_batch("ev", [b"x"] * 40)

    a = _member(redis_server.url, namespace, single_client)
    b = _member(redis_server.url, namespace, single_client)
    try:
        first = a.initial(10)
        assert first == a.initial(10)  # Spark asks twice; the same answer
        assert sorted(first.offsets) == [TP("ev", p) for p in range(4)]
        end = a.plan(first, latest, 8)  # 2 per partition
        assert sum(end.offsets.values()) == 8 and end.generation == first.generation

        # b joins: a's generation ends; a's next plan commits its batch, then rebases
        joined: dict[str, Any] = {}
        t = threading.Thread(target=lambda: joined.update(pos=b.initial(10)))
        t.start()
        wait_until(lambda: a.generation is not None and a.generation.done.is_set(),
                   timeout_s=10)
        got = {"pos": end}

        def a_rebased() -> bool:
            got["pos"] = a.plan(end, latest, None)
            return got["pos"].generation != end.generation

        wait_until(a_rebased, timeout_s=10)
        nxt = got["pos"]
        t.join(10)
        assert nxt.generation == joined["pos"].generation == end.generation + 1
        committed = {tp: o.offset for tp, o in coord.fetch_offsets("g").offsets.items()}
        assert committed == end.offsets  # a's batch was committed before it rejoined
        mine, theirs = set(nxt.offsets), set(joined["pos"].offsets)
        assert mine.isdisjoint(theirs) and len(mine | theirs) == 4
        # gained/kept partitions start at the group's committed offsets
        assert nxt.starts == {tp: committed[tp] for tp in mine}

        # a commit stamped with the old generation is refused, moves nothing, raises nothing
        stale = Position({tp: 10 for tp in end.offsets}, generation=end.generation,
                         member=end.member)
        outcome = a.commit(stale)
        assert outcome is not None and not outcome.accepted
        assert {tp: o.offset for tp, o in coord.fetch_offsets("g").offsets.items()} == committed
        # and one this process did not plan (an old checkpoint's) is not even sent
        foreign = Position({tp: 10 for tp in theirs}, generation=nxt.generation, member="other")
        assert a.commit(foreign) is None
        assert {tp: o.offset for tp, o in coord.fetch_offsets("g").offsets.items()} == committed

        # a leaves: b takes every partition from the committed offsets without a restart
        a.close()
        state = {"pos": joined["pos"]}

        def b_has_all() -> bool:
            state["pos"] = b.plan(state["pos"], latest, None)
            return len(state["pos"].offsets) == 4

        wait_until(b_has_all, timeout_s=10)
        pos = state["pos"]
        assert all(pos.starts[tp] == committed[tp] for tp in mine)
    finally:
        a.close(5)
        b.close(5)


def _rebased(member: StreamMember, start: Position, latest: Any) -> Position:
    """``member``'s first plan in a generation after ``start``'s (it rejoins from plan())."""
    got = {"pos": start}

    def moved() -> bool:
        got["pos"] = member.plan(start, latest, None)
        return got["pos"].generation != start.generation

    wait_until(moved, timeout_s=10)
    return got["pos"]


@pytest.mark.parametrize("starting", ["earliest", "latest"])
def test_group_mode_reports_a_partition_new_to_the_query_whose_log_was_trimmed(
        starting: str, redis_server: Any, single_client: Any, namespace: str, topics: Topics,
        coord: GroupCoordinator, latest: Any, caplog: Any) -> None:
    # The topic grows while the query runs, and retention trims the new partition before the
    # query is given it. Before, group mode read it from its trimmed start without a word
    # (outside group mode that is data loss: "is new to the query"); a partition there at the
    # query's start begins wherever its log begins, as before.
    topics.create("ev", 1, retention_records=2)
    producer = Producer(single_client, namespace)
    producer.send_batch("ev", [b"before"] * 5)
    topics.apply_retention("ev")  # ev-0 starts at 3 when the query starts: no loss
    strict = _member(redis_server.url, namespace, single_client, startingOffsets=starting)
    try:
        first = strict.initial(10)
        assert first.offsets == {TP("ev", 0): 3 if starting == "earliest" else 5}
        topics.add_partitions("ev", 2)
        producer.send_batch("ev", [ProducerRecord(b"x", partition=1) for _ in range(10)])
        topics.apply_retention("ev")  # ev-1 holds offsets 8 and 9
        with pytest.raises(DataLossError, match=r"^topic 'ev' partition 1 is new to the query "
                                                r"but its log starts at offset 8, not 0: "
                                                r"records 0-7 were deleted"):
            _rebased(strict, first, latest)
    finally:
        strict.close(5)

    lenient = _member(redis_server.url, namespace, single_client, startingOffsets=starting,
                      failOnDataLoss="false", groupId="g2")
    try:
        first = lenient.initial(10)  # both partitions are the query's start: no loss
        assert first.offsets == ({TP("ev", 0): 3, TP("ev", 1): 8} if starting == "earliest"
                                 else {TP("ev", 0): 5, TP("ev", 1): 10})
        topics.add_partitions("ev", 3)
        producer.send_batch("ev", [ProducerRecord(b"y", partition=2) for _ in range(3)])
        topics.apply_retention("ev")  # ev-2 holds offsets 1 and 2
        with caplog.at_level("WARNING", logger="rcoord.spark"):
            nxt = _rebased(lenient, first, latest)
        assert nxt.starts[TP("ev", 2)] == 1 and nxt.offsets[TP("ev", 2)] == 3
        assert "partition 2 is new to the query but its log starts at offset 1" in caplog.text
    finally:
        lenient.close(5)


@pytest.mark.parametrize("trimmed_since", [False, True])
def test_a_partition_there_at_the_querys_start_taken_over_uncommitted_begins_at_its_log_start(
        trimmed_since: bool, redis_server: Any, single_client: Any, namespace: str,
        topics: Topics, coord: GroupCoordinator, latest: Any) -> None:
    # Retention trimmed the topic before the pipeline existed. Query b holds a partition and
    # stops before committing it; query a takes it over. Before, a reported "new to the
    # query but its log starts at offset 10" (DataLossError, failing the query) though the
    # partition was there when a started: only records trimmed since then are a loss.
    topics.create("ev", 2, retention_records=10)
    producer = Producer(single_client, namespace, "round_robin")
    producer.send_batch("ev", [b"x"] * 40)
    topics.apply_retention("ev")  # each partition holds offsets 10-19
    b = _member(redis_server.url, namespace, single_client)
    a = _member(redis_server.url, namespace, single_client)
    joined: dict[str, Position] = {}
    try:
        first_b = b.initial(10)
        assert len(first_b.offsets) == 2
        t = threading.Thread(target=lambda: joined.update(a=a.initial(10)), daemon=True)
        t.start()
        planned = _rebased(b, first_b, latest)  # b plans its partition in generation 2
        t.join(10)
        (held,) = planned.offsets
        assert held not in joined["a"].offsets
        if trimmed_since:
            producer.send_batch("ev", [ProducerRecord(b"y", partition=held.partition)] * 5)
            topics.apply_retention("ev")  # the held partition now starts at 15
        b.close(5)  # b stops before committing its batch
        assert held not in coord.fetch_offsets("g").offsets
        state = {"pos": joined["a"]}

        def a_has_both() -> bool:
            state["pos"] = a.plan(state["pos"], latest, None)
            return len(state["pos"].offsets) == 2

        if trimmed_since:
            lost = f"partition {held.partition}: offsets 10 to 14 were removed by retention"
            with pytest.raises(DataLossError, match=lost):
                wait_until(a_has_both, timeout_s=10)
        else:
            wait_until(a_has_both, timeout_s=10)
            assert state["pos"].starts[held] == 10
    finally:
        a.close(5)
        b.close(5)


def test_a_latest_member_loses_no_record_to_a_rebalance_before_its_first_batch(
        redis_server: Any, single_client: Any, namespace: str, topics: Topics,
        coord: GroupCoordinator, latest: Any) -> None:
    # Under startingOffsets=latest the first generation starts at the log end. Before, that
    # start was never committed, so when a member joined before the query's first non-empty
    # batch, the next generation placed the partitions at the log end again: the records
    # appended between the two ends were read by nobody.
    topics.create("ev", 4)
    producer = Producer(single_client, namespace, "round_robin")
    producer.send_batch("ev", [b"before"] * 8)  # 2 per partition, before the query: not read

    a = _member(redis_server.url, namespace, single_client, startingOffsets="latest")
    b = _member(redis_server.url, namespace, single_client, startingOffsets="latest")
    try:
        first = a.initial(10)
        assert first.offsets == {TP("ev", p): 2 for p in range(4)}
        producer.send_batch("ev", [b"new"] * 20)  # 5 per partition, before any batch
        joined: dict[str, Any] = {}
        t = threading.Thread(target=lambda: joined.update(pos=b.initial(10)))
        t.start()
        wait_until(lambda: a.generation is not None and a.generation.done.is_set(),
                   timeout_s=10)
        nxt = _rebased(a, first, latest)
        t.join(10)
        theirs = joined["pos"]
        assert set(nxt.offsets).isdisjoint(theirs.offsets)
        assert len(set(nxt.offsets) | set(theirs.offsets)) == 4
        # both begin where the query began, so together they read all 20 new records
        assert nxt.starts == {tp: 2 for tp in nxt.offsets}
        assert nxt.offsets == {tp: 7 for tp in nxt.offsets}
        assert theirs.offsets == {tp: 2 for tp in theirs.offsets}
        assert _committed(coord) == {TP("ev", p): 2 for p in range(4)}
    finally:
        a.close(5)
        b.close(5)


def test_a_latest_members_placed_start_names_its_topic(
        redis_server: Any, single_client: Any, namespace: str, topics: Topics,
        coord: GroupCoordinator, latest: Any) -> None:
    # Under startingOffsets=latest the first generation commits where it starts. Before, that
    # commit carried no create token: a topic deleted and created again before the first
    # batch, holding more records than the placed start, was read from the placed offset of
    # the old topic on, silently skipping the new topic's first records.
    topics.create("ev", 2)
    producer = Producer(single_client, namespace, "round_robin")
    producer.send_batch("ev", [b"old"] * 4)  # 2 per partition, before the query
    token = topics.create_token("ev")

    strict = _member(redis_server.url, namespace, single_client, startingOffsets="latest")
    try:
        first = strict.initial(10)
        assert first.offsets == {TP("ev", 0): 2, TP("ev", 1): 2}
        committed = coord.fetch_offsets("g").offsets
        assert {tp: o.offset for tp, o in committed.items()} == first.offsets
        assert all(o.metadata.startswith(TOKEN_METADATA + token + MEMBER_METADATA)
                   for o in committed.values())
        topics.delete("ev")
        topics.create("ev", 2)
        producer.send_batch("ev", [b"new"] * 10)  # 5 per partition: past the placed start
        with pytest.raises(DataLossError, match=r"^topic 'ev' partition 0: the topic was deleted "
                                                r"and created again since offset 2 was planned"):
            strict.plan(first, latest, None)
    finally:
        strict.close(5)
    # A member of a later query: the commit was made to the deleted topic, so it counts as none
    # (Kafka deletes it with the topic; rcoord.topics.incarnation) and the query starts where
    # startingOffsets=latest says. (Before, the stale commit was data loss, and without
    # failOnDataLoss the query read the new topic from 0.)
    lenient = _member(redis_server.url, namespace, single_client, startingOffsets="latest",
                      failOnDataLoss="false")
    try:
        init = lenient.initial(10)
        assert init.offsets == {TP("ev", 0): 5, TP("ev", 1): 5}
        producer.send_batch("ev", [b"newer"] * 2)
        assert lenient.plan(init, latest, None).offsets == {TP("ev", 0): 6, TP("ev", 1): 6}
    finally:
        lenient.close(5)


def test_an_available_now_group_member_checks_continuity_against_the_real_log_end(
        redis_server: Any, single_client: Any, namespace: str, topics: Topics,
        coord: GroupCoordinator) -> None:
    # availableNow reads up to the log ends of when the run began; records written after it
    # put a latest member's start past that target. Before, the data-loss check compared the
    # start with the clamped end: a DataLossError ("past the log end: the topic was deleted
    # and created again"), or, without failOnDataLoss, a restart at the log start that read
    # the history again and committed the group's offset backwards.
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    topics.create("ev", 1)
    producer = Producer(single_client, namespace)
    producer.send_batch("ev", [b"x"] * 5)
    reader = _stream_reader(redis_server.url, namespace, subscribe="ev", groupId="g",
                            startingOffsets="latest", sessionTimeoutMs="1500",
                            heartbeatIntervalMs="200", rebalanceTimeoutMs="5000")
    try:
        reader.prepareForTriggerAvailableNow()  # the run reads ev-0 up to 5
        producer.send_batch("ev", [b"y"] * 3)  # written after the run began
        start = reader.initialOffset()
        assert Position.from_json(start).offsets == {TP("ev", 0): 8}
        end = Position.from_json(reader.latestOffset(start, ReadAllAvailable()))
        assert end.offsets == {TP("ev", 0): 8}  # nothing to read within the target
        assert {tp: o.offset for tp, o in coord.fetch_offsets("g").offsets.items()} == {
            TP("ev", 0): 8}
    finally:
        reader.stop()


@pytest.mark.parametrize("group", [False, True])
def test_an_available_now_run_leaves_a_topic_created_again_meanwhile_for_the_next_run(
        redis_server: Any, single_client: Any, namespace: str, topics: Topics,
        coord: GroupCoordinator, group: bool) -> None:
    # Trigger.AvailableNow reads what the topics held when the run began. A topic deleted and
    # created again during the run (failOnDataLoss=false: a warning, then its new log from
    # the start) held nothing of its new log then: its records wait for the next run, as a
    # partition added during the run does. Before, the run's target was the old topic's log
    # end (5), so the new topic's records up to that offset were read (and, in group mode,
    # committed) though appended after the run began.
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    every = ReadAllAvailable()
    topics.create("ev", 1)
    producer = Producer(single_client, namespace)
    producer.send_batch("ev", [b"old"] * 5)
    opts = {**GROUP_READ} if group else {"subscribe": "ev"}
    reader = _stream_reader(redis_server.url, namespace, failOnDataLoss="false", **opts)
    try:
        reader.prepareForTriggerAvailableNow()  # the run reads ev-0 up to 5
        start = reader.initialOffset()
        end = reader.latestOffset(start, every)
        assert Position.from_json(end).offsets == {TP("ev", 0): 5}
        assert len(_offsets(reader, start, end)) == 5
        topics.delete("ev")
        topics.create("ev", 1)
        producer.send_batch("ev", [b"new, after the run began"] * 4)
        nxt = reader.latestOffset(end, every)
        assert _offsets(reader, end, nxt) == []
    finally:
        reader.stop()
    # The next run reads them.
    again = _stream_reader(redis_server.url, namespace, failOnDataLoss="false", **opts)
    try:
        again.prepareForTriggerAvailableNow()
        later = again.latestOffset(nxt, every)
        assert _offsets(again, nxt, later) == [(0, o) for o in range(4)]
    finally:
        again.stop()


def test_a_restarted_querys_first_plan_waits_for_its_first_generation(
        redis_server: Any, single_client: Any, namespace: str, topics: Topics,
        latest: Any) -> None:
    # A query restarted on its checkpoint plans (latestOffset) before it ever joined; the
    # group's initial delay holds that first join. Before, the plan waited only the rejoin
    # wait and answered "no new data": under availableNow, Spark ends the run on that.
    GroupCoordinator(single_client, CoordinatorConfig(
        namespace=namespace, group_min_session_timeout_ms=10,
        group_initial_rebalance_delay_ms=1500)).start()
    topics.create("ev", 1)
    producer = Producer(single_client, namespace)
    producer.send_batch("ev", [b"x"] * 4)
    old = _member(redis_server.url, namespace, single_client)
    try:
        done = old.plan(old.initial(10), latest, None)
        assert done.offsets == {TP("ev", 0): 4}
        old.plan(done, latest, None)  # commits the batch
    finally:
        old.close(5)
    producer.send_batch("ev", [b"y"] * 3)  # while the query is down
    restarted = _member(redis_server.url, namespace, single_client, first_join_wait_s=10)
    try:
        nxt = restarted.plan(done, latest, None)
        assert nxt.offsets == {TP("ev", 0): 7}
    finally:
        restarted.close(5)


def test_an_available_now_plan_waits_out_a_rebalance_instead_of_ending_the_run(
        redis_server: Any, single_client: Any, namespace: str, topics: Topics,
        coord: GroupCoordinator, latest: Any) -> None:
    # Spark ends an availableNow run on the first plan that reads nothing. Before, a plan
    # whose generation had ended waited 1 s (the rejoin wait) for the next one and then
    # answered "nothing to read": a member slow to rejoin ended the run with records unread
    # and no error. Now it waits as long as for a first join, and then fails the query.
    topics.create("ev", 3)
    Producer(single_client, namespace, "round_robin").send_batch("ev", [b"x"] * 30)
    a = _member(redis_server.url, namespace, single_client, first_join_wait_s=10)
    b = _member(redis_server.url, namespace, single_client)
    c = _member(redis_server.url, namespace, single_client)
    d = _member(redis_server.url, namespace, single_client)
    joined: dict[str, Position] = {}

    def join(name: str, member: StreamMember) -> None:
        try:
            joined[name] = member.initial(10)
        except Exception:  # noqa: BLE001, S110 - d is closed while it waits: nothing to report
            pass

    try:
        first = a.initial(10)
        threading.Thread(target=join, args=("b", b), daemon=True).start()
        end = _rebased(a, first, latest)  # a and b share generation 2
        wait_until(lambda: "b" in joined)
        threading.Thread(target=join, args=("c", c), daemon=True).start()
        wait_until(lambda: a.generation is not None and a.generation.done.is_set())
        # b plans (and so rejoins) only a second later; a's plan waits for it.
        late = threading.Timer(1.0, lambda: b.plan(joined["b"], latest, None))
        late.start()
        nxt = a.plan(end, latest, None, until_target=True)
        late.join(10)
        assert a.generation is not None and not a.generation.done.is_set()
        assert nxt.generation == a.generation.generation_id == end.generation + 1
        wait_until(lambda: "c" in joined)
        # d joins while b holds the rebalance (it does not plan): c's plan, which waits only
        # its first-join wait (0.2 s here), fails the run rather than end it as complete.
        threading.Thread(target=join, args=("d", d), daemon=True).start()
        wait_until(lambda: c.generation is not None and c.generation.done.is_set())
        with pytest.raises(TimeoutError, match="cannot read up to its target"):
            c.plan(joined["c"], latest, None, until_target=True)
    finally:
        for member in (a, b, c, d):
            member.close(5)


def test_a_generation_that_ends_while_it_is_being_taken_waits_for_the_members_plan(
        redis_server: Any, single_client: Any, namespace: str, topics: Topics,
        coord: GroupCoordinator, latest: Any, monkeypatch: Any) -> None:
    # Taking a generation reads the group's committed offsets first. Before, its routine
    # started after those round trips: a generation another member's join ended meanwhile
    # was collected without it, and initial() (the query's start) failed with
    # GenerationEndedError. The routine now starts first and holds the generation.
    topics.create("ev", 2)
    a = _member(redis_server.url, namespace, single_client)
    b = _member(redis_server.url, namespace, single_client)
    joined: list[Position] = []
    slow_read = a._committed_metadata

    def read_while_b_joins(gen: Any) -> Any:
        out = slow_read(gen)
        threading.Thread(target=lambda: joined.append(b.initial(10)), daemon=True).start()
        wait_until(gen.done.is_set)  # b's join ended the generation being taken
        return out

    monkeypatch.setattr(a, "_committed_metadata", read_while_b_joins)
    try:
        first = a.initial(10)
        assert first.generation == 1
        monkeypatch.undo()
        state = {"pos": first}

        def plan() -> None:
            state["pos"] = a.plan(state["pos"], latest, None)

        wait_until(lambda: bool(joined), plan)
        both = set(state["pos"].offsets) | set(joined[0].offsets)
        assert both == {TP("ev", 0), TP("ev", 1)}
        assert not set(state["pos"].offsets) & set(joined[0].offsets)
    finally:
        a.close(5)
        b.close(5)


def _records_before_the_query(client: Any, namespace: str, topics: Topics) -> Producer:
    """Topic ``ev`` (2 partitions) holding 2 records each before a query starts."""
    topics.create("ev", 2)
    producer = Producer(client, namespace, "round_robin")
    producer.send_batch("ev", [b"before"] * 4)
    return producer


def _add_two_partitions_with_records(topics: Topics, producer: Producer) -> None:
    """``ev`` grows to 4 partitions; each new one gets 3 records."""
    topics.add_partitions("ev", 4)
    for p in (2, 3):
        for _ in range(3):
            producer.send("ev", b"added", partition=p)


def test_a_latest_member_reads_a_partition_added_mid_stream_from_its_start(
        redis_server: Any, single_client: Any, namespace: str, topics: Topics,
        coord: GroupCoordinator, latest: Any) -> None:
    # startingOffsets=latest places the query's start; a partition that appears later is
    # read from its log start, as Spark's Kafka source reads one it discovers. Before, the
    # generation that gained it started it at its log end, past its first records.
    producer = _records_before_the_query(single_client, namespace, topics)

    a = _member(redis_server.url, namespace, single_client, startingOffsets="latest")
    try:
        first = a.initial(10)
        assert first.offsets == {TP("ev", 0): 2, TP("ev", 1): 2}
        _add_two_partitions_with_records(topics, producer)
        wait_until(lambda: a.generation is not None and a.generation.done.is_set(),
                   timeout_s=10)  # the leader's partition watcher rebalances
        nxt = _rebased(a, first, latest)
        assert nxt.starts == {TP("ev", 0): 2, TP("ev", 1): 2, TP("ev", 2): 0, TP("ev", 3): 0}
        assert nxt.offsets == {TP("ev", 0): 2, TP("ev", 1): 2, TP("ev", 2): 3, TP("ev", 3): 3}
        assert _committed(coord) == {TP("ev", 0): 2, TP("ev", 1): 2, TP("ev", 2): 0,
                                     TP("ev", 3): 0}
    finally:
        a.close(5)


def test_a_latest_query_restarted_on_its_checkpoint_reads_partitions_added_while_down(
        redis_server: Any, single_client: Any, namespace: str, topics: Topics,
        coord: GroupCoordinator, latest: Any) -> None:
    # latest places a query's start (initialOffset) only: a restarted query plans from its
    # checkpoint, and Spark's Kafka source reads the partitions it does not know from their log
    # start. Before, the restarted member placed (and committed) them at their log end.
    producer = _records_before_the_query(single_client, namespace, topics)

    old = _member(redis_server.url, namespace, single_client, startingOffsets="latest")
    try:
        first = old.initial(10)
        producer.send_batch("ev", [b"x"] * 4)
        e1 = old.plan(first, latest, None)
        assert e1.offsets == {TP("ev", 0): 4, TP("ev", 1): 4}
    finally:
        old.close(5)
    _add_two_partitions_with_records(topics, producer)  # while the query is down
    new = _member(redis_server.url, namespace, single_client, startingOffsets="latest")
    try:
        nxt = _rebased(new, e1, latest)  # restarted on the checkpoint: Spark plans from e1
        assert nxt.starts == {TP("ev", 0): 4, TP("ev", 1): 4, TP("ev", 2): 0, TP("ev", 3): 0}
        assert nxt.offsets == {TP("ev", 0): 4, TP("ev", 1): 4, TP("ev", 2): 3, TP("ev", 3): 3}
    finally:
        new.close(5)


def test_a_member_whose_group_closed_on_a_fatal_error_fails_the_query() -> None:
    """The group closes on an error no retry mends (here the Redis user lost a permission the
    rejoin needs): plan() raises it, as initial() would. Before, plan() took it for a join that
    backs off, logged it and returned ``start``; the next trigger then failed with
    GroupClosedError, which does not say why (a JoinRefusedError or FencedInstanceIdError
    after the start likewise)."""
    state = OneMemberGroup(topic="ev", partitions=2)
    group = ConsumerGroup(fast_config(topics=["ev"]), coordinator=state.fake)  # type: ignore[arg-type]
    member = StreamMember(group, rejoin_wait_s=0.05)
    try:
        first = member.initial(10)
        gen = member.generation
        assert gen is not None
        state.join_answers.append(redis.exceptions.ResponseError(
            "ACL failure in script: User w has no permissions to run the 'xadd' command "
            "script: rcoord_0123456789ab_join_group, on @user_function:233."))
        state.heartbeat_answers.append(Errors.REBALANCE_IN_PROGRESS)
        wait_until(gen.done.is_set)
        failed: list[MissingPermissionError] = []

        def plan_fails() -> bool:
            try:
                member.plan(first, lambda parts: ({tp: (0, 0) for tp in parts}, {}), None)
            except MissingPermissionError as exc:
                failed.append(exc)
                return True
            return False  # the rejoin has not been refused yet

        wait_until(plan_fails)
        assert "run the 'xadd' command" in str(failed[0])
        assert state.joins == ["", state.id(1)]  # one rejoin, refused
    finally:
        member.close(5)


def test_a_restarted_query_never_commits_the_batch_it_skipped(
        redis_server: Any, single_client: Any, namespace: str, topics: Topics,
        coord: GroupCoordinator, latest: Any) -> None:
    # The old query's process planned batch N and died before committing it; its member's
    # session still runs. The restarted query (another process) replays N from the checkpoint
    # and skips it (another membership planned it), then plans from N's end: before, that
    # committed N's end in the old member's name, which the coordinator accepted (the old
    # generation still current while the new member's join was pending), and N's records,
    # which nobody processed, were skipped for good.
    topics.create("ev", 4)
    Producer(single_client, namespace, "round_robin").send_batch("ev", [b"x"] * 40)

    old = _member(redis_server.url, namespace, single_client, sessionTimeoutMs="60000",
                  rebalanceTimeoutMs="60000")
    new = _member(redis_server.url, namespace, single_client, sessionTimeoutMs="60000",
                  rebalanceTimeoutMs="60000")
    try:
        first = old.initial(10)
        batch_n = old.plan(first, latest, 8)  # planned, never processed, never committed
        assert sum(batch_n.offsets.values()) == 8
        new.replaying(batch_n)  # the source's replay of N read nothing (not its plan)
        new.plan(batch_n, latest, None)
        committed = {tp: o.offset for tp, o in coord.fetch_offsets("g").offsets.items()}
        assert all(o <= 0 for o in committed.values()), committed  # N's end not committed
        assert not new.outcomes
    finally:
        old.close(5)
        new.close(5)


def _two_batches_then_stop(url: str, namespace: str, client: Any, topics: Topics,
                           latest: Any) -> tuple[Position, Position]:
    """A query's member plans batch 0 (2 records per partition of a 2-partition topic of 20)
    and batch 1, committing batch 0 as it plans 1, then its process stops: (end 0, end 1)."""
    topics.create("ev", 2)
    Producer(client, namespace, "round_robin").send_batch("ev", [b"x"] * 20)
    old = _member(url, namespace, client)
    try:
        e1 = old.plan(old.initial(10), latest, 4)
        return e1, old.plan(e1, latest, 4)
    finally:
        old.close(5)


def _shifted(e1: Position, e2: Position) -> list[OffsetRange]:
    """Batch e1 -> e2's ranges begun one offset early: not at the group's committed offsets,
    so a member replaying them reads none."""
    return [OffsetRange(r.topic, r.partition, r.start - 1, r.end) for r in ranges_between(e1, e2)]


def _replay_of_nothing_then_record_gone(url: str, namespace: str, client: Any, e1: Position,
                                        e2: Position) -> None:
    """A restarted member replays batch e1 -> e2 and reads none of it; then the replay's
    record is gone (expired, days on)."""
    new = _member(url, namespace, client)
    try:
        assert new.replay(e2, _shifted(e1, e2), 10) == set()
    finally:
        new.close(5)
    client.delete(replays_key(namespace, "g"))


def _restart_plans_batch_again(url: str, namespace: str, client: Any, coord: GroupCoordinator,
                               e1: Position, e2: Position, latest: Any) -> None:
    """Restarted on batch e1 -> e2's end, the member plans that batch again (at least once):
    it starts, and the group's committed offsets stay, at e1."""
    again = _member(url, namespace, client, first_join_wait_s=10)
    try:
        nxt = again.plan(e2, latest, None)
        assert nxt.starts == e1.offsets  # batch 1 comes again, never skipped
        assert _committed(coord) == e1.offsets
    finally:
        again.close(5)


def _no_clock(client: Any) -> int:
    raise redis.ConnectionError("TIME: the node is down")


@pytest.mark.parametrize("rewound", [False, True])
def test_a_query_restarted_after_a_finished_batch_goes_on_where_it_ended(
        redis_server: Any, single_client: Any, namespace: str, topics: Topics,
        coord: GroupCoordinator, rewound: bool, latest: Any) -> None:
    # A query stops after its last batch finished: Spark's commit log records the batch, but
    # Spark never called commit() for it, so the member committed only up to its start. The
    # restarted query's first call is latestOffset(that batch's end). Before, the new member
    # took the group's committed offsets, and the batch was delivered again under the next
    # batch id (the rcoord sink stored it twice).
    e1, e2 = _two_batches_then_stop(redis_server.url, namespace, single_client, topics, latest)  # batch 1 processed, then the stop
    assert _committed(coord) == e1.offsets
    if rewound:  # an operator sets the group back while the query is down (reset-offsets)
        zero = {TP("ev", 0): 0, TP("ev", 1): 0}
        assert set(coord.commit_offsets("g", zero).values()) == {Errors.NONE}

    new = _member(redis_server.url, namespace, single_client)
    try:
        nxt = _rebased(new, e2, latest)
        want = {TP("ev", 0): 0, TP("ev", 1): 0} if rewound else e2.offsets
        assert nxt.starts == want  # the operator's offsets win; else batch 1 is not read again
        assert nxt.offsets == {TP("ev", 0): 10, TP("ev", 1): 10}
        assert _committed(coord) == want
    finally:
        new.close(5)


def test_a_query_restarted_after_its_first_batch_on_a_handed_over_partition_goes_on(
        redis_server: Any, single_client: Any, namespace: str, topics: Topics,
        coord: GroupCoordinator, latest: Any) -> None:
    # Query B reads and commits [0, 10) of each partition and stops; query A (same group)
    # takes them over where B committed, finishes one batch, [10, 15), and stops (Spark does
    # not call commit() for it). A restarted on its checkpoint must go on at 15: the group's
    # offsets are where A's batch began them. Before, they named B's member, not A's, so A's
    # restart read [10, 15) again under a new batch id.
    topics.create("ev", 2)
    producer = Producer(single_client, namespace, "round_robin")
    producer.send_batch("ev", [b"x"] * 20)
    b = _member(redis_server.url, namespace, single_client)
    try:
        b1 = b.plan(b.initial(10), latest, None)
        assert b.plan(b1, latest, None) == b1  # its batch finished: committed at the next plan
    finally:
        b.close(5)
    assert _committed(coord) == b1.offsets == {TP("ev", 0): 10, TP("ev", 1): 10}

    producer.send_batch("ev", [b"y"] * 10)
    a = _member(redis_server.url, namespace, single_client, first_join_wait_s=10)
    try:
        a1 = a.plan(a.initial(10), latest, None)
    finally:
        a.close(5)
    assert a1.starts == b1.offsets and a1.offsets == {TP("ev", 0): 15, TP("ev", 1): 15}
    assert _committed(coord) == b1.offsets  # A committed nothing

    again = _member(redis_server.url, namespace, single_client, first_join_wait_s=10)
    try:
        nxt = again.plan(a1, latest, None)
        assert {tp: nxt.starts.get(tp, a1.offsets[tp]) for tp in nxt.offsets} == a1.offsets
        assert _committed(coord) == a1.offsets
    finally:
        again.close(5)
    # An operator's reset to where such a batch began is not taken for one: it wins.
    assert set(coord.commit_offsets("g", b1.offsets).values()) == {Errors.NONE}
    last = _member(redis_server.url, namespace, single_client, first_join_wait_s=10)
    try:
        assert last.plan(a1, latest, None).starts == b1.offsets
    finally:
        last.close(5)


def test_a_replayed_batch_end_is_no_finished_batch_even_if_nothing_was_replayed(
        redis_server: Any, single_client: Any, namespace: str, topics: Topics,
        coord: GroupCoordinator, latest: Any) -> None:
    # The restarted query replays the unfinished batch 1 first; its member reads none of it
    # (the ranges do not begin at the group's committed offsets). Spark then plans from its end,
    # which must not be taken for a finished batch: the group's committed offsets stay the start.
    e1, e2 = _two_batches_then_stop(redis_server.url, namespace, single_client, topics, latest)  # batch 1 never finishes

    new = _member(redis_server.url, namespace, single_client)
    try:
        assert new.replay(e2, _shifted(e1, e2), 10) == set()
        nxt = new.plan(e2, latest, None)  # replay() took the generation
        assert nxt.starts == e1.offsets  # the group's committed offsets: batch 1 comes again
        assert _committed(coord) == e1.offsets
    finally:
        new.close(5)


@pytest.mark.parametrize("how", ["shifted", "old plan", "in full"])
def test_a_replay_that_read_nothing_is_no_finished_batch_for_the_next_restart_either(
        how: str, redis_server: Any, single_client: Any, namespace: str, topics: Topics,
        coord: GroupCoordinator, latest: Any) -> None:
    # The restarted query replays the unfinished batch 1 and reads none of it (its ranges do
    # not begin at the group's committed offsets; or, "old plan", the source could not tell
    # where its partitions began: ``StreamReader._replay`` passes no ranges). Spark counts the
    # replay as finished, and the query stops before it plans again (a long trigger interval,
    # a stop). Restarted once more, Spark plans from batch 1's end, and its commit log says the
    # batch finished. Before, that member took the end for one whose sink had stored it
    # (``_resume``) and committed it: batch 1's records, read by nobody, were skipped for good.
    # A replay that read the batch in full is still gone on from where it ended.
    e1, e2 = _two_batches_then_stop(redis_server.url, namespace, single_client, topics, latest)

    new = _member(redis_server.url, namespace, single_client)
    try:
        ranges = {"old plan": [], "in full": ranges_between(e1, e2)}.get(how, _shifted(e1, e2))
        assert new.replay(e2, ranges, 10) == (set(e2.offsets) if how == "in full" else set())
    finally:
        new.close(5)
    again = _member(redis_server.url, namespace, single_client, first_join_wait_s=10)
    try:
        nxt = again.plan(e2, latest, None)
        want = e2.offsets if how == "in full" else e1.offsets  # else batch 1 comes again
        assert nxt.starts == want
        assert _committed(coord) == want
    finally:
        again.close(5)


@pytest.mark.parametrize("how", ["shifted", "in full", "no replay"])
def test_a_batch_older_than_a_replay_record_lasts_comes_again_after_a_restart(
        how: str, redis_server: Any, single_client: Any, namespace: str, topics: Topics,
        coord: GroupCoordinator, latest: Any, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    # As above, but the query stays stopped longer than a replay's record lasts (REPLAY_TTL_S,
    # 7 days; the hash expires with it). Restarted then, its member finds no record of the
    # replay. Before, it took that for a batch its planner's process had run (_resume) and
    # committed its end: a replay that read only part of the batch, then a stop (a long
    # trigger interval, a query stopped for a week), had the rest skipped for good. Now the
    # batch comes again from the group's committed offsets (at least once), as when Redis
    # cannot tell, with a warning: the replay, or its absence, cannot be told any more.
    e1, e2 = _two_batches_then_stop(redis_server.url, namespace, single_client, topics, latest)
    if how != "no replay":
        new = _member(redis_server.url, namespace, single_client)
        try:
            ranges = ranges_between(e1, e2) if how == "in full" else _shifted(e1, e2)
            assert new.replay(e2, ranges, 10) == (set(e2.offsets) if how == "in full" else set())
        finally:
            new.close(5)
    # 8 days on: the record's hash has expired, and the server's clock says so.
    single_client.delete(replays_key(namespace, "g"))
    later = server_ms(single_client) + 8 * 24 * 3600 * 1000
    monkeypatch.setattr("rcoord.spark.member._server_ms", lambda client: later, raising=False)
    again = _member(redis_server.url, namespace, single_client, first_join_wait_s=10)
    try:
        with caplog.at_level(logging.WARNING, "rcoord.spark"):
            nxt = again.plan(e2, latest, None)
        assert nxt.starts == e1.offsets  # batch 1 comes again, never skipped
        assert _committed(coord) == e1.offsets
        assert "older than a replay record lasts" in caplog.text
    finally:
        again.close(5)


def test_a_batch_whose_age_cannot_be_told_comes_again_after_a_restart(
        redis_server: Any, single_client: Any, namespace: str, topics: Topics,
        coord: GroupCoordinator, latest: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # As above, but the restarted member finds no replay record and cannot read the server's
    # clock (TIME fails: in a cluster it goes to any node). Whether the record has expired
    # cannot be told, so the batch comes again (at least once). Before, a clock that could not
    # be read counted as "not expired": the batch's end was committed, and what a replay had
    # left unread was skipped for good.
    e1, e2 = _two_batches_then_stop(redis_server.url, namespace, single_client, topics, latest)
    _replay_of_nothing_then_record_gone(redis_server.url, namespace, single_client, e1, e2)
    assert e2.planned_ms is not None
    monkeypatch.setattr("rcoord.spark.member.server_ms", _no_clock)
    _restart_plans_batch_again(redis_server.url, namespace, single_client, coord, e1, e2, latest)


def test_a_batch_planned_without_the_servers_clock_comes_again_after_a_restart(
        redis_server: Any, single_client: Any, namespace: str, topics: Topics,
        coord: GroupCoordinator, latest: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # The server's clock cannot be read while batch 1 is planned (TIME fails: in a cluster it
    # goes to any node), but can on the restart, which finds no replay record (expired, days
    # on, after a replay that read only part of the batch). Before, the batch's end carried no
    # planned_ms, which the restart took for a position of an older rcoord, "not expired": it
    # committed the batch's end, and what the replay had left unread was skipped for good. Now
    # it carries 0 (as long ago as can be), and the batch comes again (at least once).
    topics.create("ev", 2)
    Producer(single_client, namespace, "round_robin").send_batch("ev", [b"x"] * 20)
    old = _member(redis_server.url, namespace, single_client)
    try:
        e1 = old.plan(old.initial(10), latest, 4)
        with monkeypatch.context() as m:
            m.setattr("rcoord.spark.member.server_ms", _no_clock)
            e2 = old.plan(e1, latest, 4)
    finally:
        old.close(5)
    assert e2.planned_ms == 0 and e2.offsets != e1.offsets
    e2 = Position.from_json(e2.to_json())  # (through Spark's checkpoint)
    _replay_of_nothing_then_record_gone(redis_server.url, namespace, single_client, e1, e2)
    _restart_plans_batch_again(redis_server.url, namespace, single_client, coord, e1, e2, latest)


def test_a_position_keeps_when_its_group_mode_batch_was_planned() -> None:
    # The planning time survives Spark's checkpoint (the JSON), or a restart could not tell.
    pos = Position({TP("ev", 0): 3}, generation=2, member="m", planned_ms=1_700_000_000_000)
    assert pos.to_json()["planned_ms"] == 1_700_000_000_000
    assert Position.from_json(pos.to_json()) == pos
    assert Position.from_json({"offsets": {}, "generation": 1}).planned_ms is None


@pytest.mark.parametrize("fatal", [False, True])
def test_a_replay_whose_generation_cannot_be_recorded_fails_its_batch(
        fatal: bool, redis_server: Any, single_client: Any, namespace: str, topics: Topics,
        coord: GroupCoordinator, latest: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # The member could replay batch 1 exactly (its ranges begin at the group's committed
    # offsets), but Redis refuses the record of the replaying generation, which a sink naming
    # its output by generation needs. Before, the replay read nothing and Spark counted batch 1
    # as finished; when the query then failed (a refused login fails its next plan) and
    # restarted, the next member took batch 1's end for a finished batch's and committed it:
    # batch 1's records, read by nobody, were skipped. Now the replay fails, and the restarted
    # query replays batch 1 again.
    e1, e2 = _two_batches_then_stop(redis_server.url, namespace, single_client, topics, latest)
    error = (AuthenticationFailedError("the login was refused") if fatal
             else redis.ConnectionError("Redis went away"))

    def refused(*_: Any) -> None:
        raise error

    monkeypatch.setattr("rcoord.spark.member.record_replay", refused)
    new = _member(redis_server.url, namespace, single_client)
    try:
        with pytest.raises(AuthenticationFailedError if fatal else ReplayNotRecordedError,
                           match="the login was refused" if fatal else
                           "cannot record that generation .*Redis went away"):
            new.replay(e2, ranges_between(e1, e2), 10)
    finally:
        new.close(5)
    monkeypatch.undo()
    assert replayed_generation(single_client, namespace, "g", e2) is None
    again = _member(redis_server.url, namespace, single_client)
    try:  # the restarted query: batch 1 still unfinished, Spark replays it
        assert again.replay(e2, ranges_between(e1, e2), 10) == set(e2.offsets)
        nxt = again.plan(e2, latest, None)
        assert nxt.starts == e2.offsets  # it goes on from the replayed batch's end
        assert _committed(coord) == e2.offsets  # the replay's commit, under its generation
    finally:
        again.close(5)


# -- a batch Spark replays after a restart, in group mode (the runner's calls, without Spark) ---

GROUP_READ = {"subscribe": "ev", "groupId": "g", "sessionTimeoutMs": "1500",
              "heartbeatIntervalMs": "200", "rebalanceTimeoutMs": "5000",
              "maxRecordsPerPartition": "3"}


def _run_batch(reader: Any, client: Any, namespace: str, batch_id: int, start: Any, end: Any,
               slots: set[int] | None = None) -> tuple[list[OffsetRange], list[tuple[int, int]]]:
    """Spark's side of one micro-batch: ``partitions(start, end)``, then each task (or only the
    ``slots`` given: a first attempt cut short) reads its range and writes the rows through the
    rcoord sink as task ``slot`` of query ``q`` (producer ``spark:q:<slot>``, epoch
    ``batch_id``) to topic ``out``. Returns the tasks' ranges and the (partition, offset) pairs
    read."""
    parts = reader.partitions(start, end)
    read: list[tuple[int, int]] = []
    for slot, part in enumerate(parts):
        if slots is not None and slot not in slots:
            continue
        rows = []
        for batch in reader.read(part):
            for r in batch.to_pylist():
                read.append((r["partition"], r["offset"]))
                rows.append({"key": r["key"], "value": r["value"], "partition": r["partition"]})
        write_rows(make_producer(client, namespace, f"spark:q:{slot}", batch_id), rows, "out")
    return [p.range for p in parts], read


def _committed(coord: GroupCoordinator) -> dict[TopicPartition, int]:
    return {tp: o.offset for tp, o in coord.fetch_offsets("g").offsets.items()}


def _empty(r: OffsetRange) -> OffsetRange:
    return OffsetRange(r.topic, r.partition, r.start, r.start)


@pytest.mark.parametrize(("replayed", "starting"), [(0, "earliest"), (1, "earliest"),
                                                    (0, "latest")])
def test_a_batch_replayed_after_a_restart_is_read_exactly_and_committed_by_the_new_member(
        replayed: int, starting: str, redis_server: Any, single_client: Any, namespace: str,
        topics: Topics, coord: GroupCoordinator) -> None:
    # The query fails in batch ``replayed`` after task slots 0 and 1 (partition 0) appended
    # through the sink; it restarts on its checkpoint in a new runner process. Spark's first
    # call there is partitions(start, end) of that batch (for batch 0 after initialOffset, and
    # ``start`` is then the new process's initial position). Before, the replay read nothing
    # (another membership planned it), the group redelivered its records under the next batch
    # id, and partition 0's rows were stored twice (under startingOffsets=latest, with nothing
    # committed, the group skipped them instead, and partition 1's were never read).
    from pyspark.sql.streaming.datasource import ReadMaxRows

    topics.create("ev", 2)
    topics.create("out", 2)
    producer = Producer(single_client, namespace, "round_robin")
    skip = 2 if starting == "latest" else 0  # records per partition before the query started
    producer.send_batch("ev", [b"before"] * 2 * skip)
    values = [f"v{i}".encode() for i in range(20)]
    url = redis_server.url
    reads: dict[int, list[tuple[int, int]]] = {}
    old = _stream_reader(url, namespace, **GROUP_READ, startingOffsets=starting)
    try:
        ends = [old.initialOffset()]
        producer.send_batch("ev", values)
        ends.append(old.latestOffset(ends[0], ReadMaxRows(8)))  # 4 + 4, in 2 + 2 tasks
        if replayed == 1:
            reads[0] = _run_batch(old, single_client, namespace, 0, ends[0], ends[1])[1]
            ends.append(old.latestOffset(ends[1], ReadMaxRows(8)))  # commits batch 0
        start, end = ends[replayed], ends[replayed + 1]
        planned = [p.range for p in old.partitions(start, end)]
        assert [(r.partition, r.size) for r in planned] == [(0, 3), (0, 1), (1, 3), (1, 1)]
        _run_batch(old, single_client, namespace, replayed, start, end, slots={0, 1})
    finally:
        old.stop()  # the query failed; its runner leaves the group
    before = _committed(coord)
    # under latest the old member committed the start it placed the partitions at
    assert before == ({} if (replayed, starting) == (0, "earliest")
                      else Position.from_json(start).offsets)

    new = _stream_reader(url, namespace, **GROUP_READ, startingOffsets=starting)
    try:
        if replayed == 0:
            start = new.initialOffset()  # Spark asks for it before replaying batch 0
            assert new.initialOffset() == start
        ranges, reads[replayed] = _run_batch(new, single_client, namespace, replayed, start, end)
        assert ranges == planned  # the same ranges in the same task slots
        nxt = new.latestOffset(end, ReadMaxRows(100))
        gen = new._member.generation
        last = new._member.outcomes[-1]
        # the replayed end is committed, in the new member's name and generation
        assert _committed(coord) == Position.from_json(end).offsets
        assert last.accepted and (last.generation, last.member) == (gen.generation_id,
                                                                    gen.member_id)
        assert (last.generation, last.member) != (Position.from_json(end).generation,
                                                  Position.from_json(end).member)
        # and a sink learns that generation, not the planned one (rcoord.spark.replays)
        assert replayed_generation(single_client, namespace, "g",
                                   Position.from_json(end)) == gen.generation_id
        reads[replayed + 1] = _run_batch(new, single_client, namespace, replayed + 1, end,
                                         nxt)[1]
        assert new.latestOffset(nxt, ReadMaxRows(100)) == nxt  # nothing new; commits nxt
        assert _committed(coord) == {TP("ev", 0): skip + 10, TP("ev", 1): skip + 10}
    finally:
        new.stop()
    # every record in exactly one batch id, and the sink stored each once
    everything = [x for batch in reads.values() for x in batch]
    assert sorted(everything) == [(p, o) for p in (0, 1) for o in range(skip, skip + 10)]
    stored = Counter(r.value for p in (0, 1) for r in fetch(
        single_client, namespace, "out", p, 0, max_records=100).records)
    assert stored == Counter(values)


def test_a_replay_whose_join_is_refused_for_good_fails_at_once(
        redis_server: Any, single_client: Any, namespace: str, topics: Topics,
        coord: GroupCoordinator) -> None:
    """The restarted query's first call replays a batch, and joining for it meets a refusal no
    retry can mend (here the group's member shares no assignor with the query). Before, the
    replay read nothing and logged a warning, and the query failed only at its next plan();
    now partitions() raises the refusal, with the setting to change."""
    from pyspark.sql.streaming.datasource import ReadMaxRows

    topics.create("ev", 2)
    old = _stream_reader(redis_server.url, namespace, **GROUP_READ)
    try:
        start = old.initialOffset()
        Producer(single_client, namespace, "round_robin").send_batch("ev", [b"v"] * 8)
        end = old.latestOffset(start, ReadMaxRows(8))
    finally:
        old.stop()
    other = coord.join_group("g", protocol_type="consumer", protocols=[("other", b"")],
                             session_timeout_ms=60_000)
    coord.join_group("g", other.member_id, protocol_type="consumer",
                     protocols=[("other", b"")], session_timeout_ms=60_000)
    new = _stream_reader(redis_server.url, namespace, **GROUP_READ)
    try:
        with pytest.raises(JoinRefusedError, match="common assignor") as info:
            new.partitions(start, end)
        assert info.value.error is Errors.INCONSISTENT_GROUP_PROTOCOL
    finally:
        new.stop()


def test_a_replay_that_gets_no_generation_fails_its_batch(
        redis_server: Any, single_client: Any, namespace: str, topics: Topics,
        coord: GroupCoordinator, monkeypatch: pytest.MonkeyPatch) -> None:
    """The restarted query's first call replays a batch, and no generation comes in time (or
    Redis is away). Before, the replay read nothing and Spark counted the batch as finished; a
    query restarted after that went on from the batch's end, and its records, read by nobody,
    were skipped. Now partitions() raises, and the next restart replays the batch whole."""
    from pyspark.sql.streaming.datasource import ReadMaxRows

    topics.create("ev", 2)
    old = _stream_reader(redis_server.url, namespace, **GROUP_READ)
    try:
        start = old.initialOffset()
        Producer(single_client, namespace, "round_robin").send_batch("ev", [b"v"] * 8)
        end = old.latestOffset(start, ReadMaxRows(8))
    finally:
        old.stop()

    def no_generation(*_: Any) -> set[TP]:
        raise TimeoutError("no generation of group 'g' within 1 s")

    monkeypatch.setattr(StreamMember, "replay", no_generation)
    new = _stream_reader(redis_server.url, namespace, **GROUP_READ)
    try:
        with pytest.raises(TimeoutError, match="^no generation") as info:
            new.partitions(start, end)
        assert "fails rather than read nothing" in " ".join(info.value.__notes__)
    finally:
        new.stop()
    monkeypatch.undo()
    again = _stream_reader(redis_server.url, namespace, **GROUP_READ)
    try:
        assert sum(p.range.size for p in again.partitions(start, end)) == 8
    finally:
        again.stop()


def test_a_session_timeout_outside_the_namespace_bounds_names_the_spark_option(
        redis_server: Any, single_client: Any, namespace: str, topics: Topics,
        coord: GroupCoordinator) -> None:
    """The coordinator refuses such a JoinGroup (INVALID_SESSION_TIMEOUT, as Kafka's outside
    group.min/max.session.timeout.ms), and its refusal named the group client's
    session_timeout_ms. Now the query fails before it joins, naming sessionTimeoutMs and the
    namespace's bounds, whichever call comes first (a new query's initialOffset, a restarted
    one's latestOffset or replay)."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    topics.create("ev", 1)
    high = coord.config.group_max_session_timeout_ms
    message = (rf"^sessionTimeoutMs: {high + 1} is outside 10\.\.{high}, the session timeouts "
               rf"namespace '{namespace}' allows")
    planned = Position({TP("ev", 0): 0}, {TP("ev", 0): 0}, 1, "gone").to_json()
    for call in (lambda r: r.initialOffset(),
                 lambda r: r.latestOffset(planned, ReadAllAvailable()),
                 lambda r: r.partitions(planned, planned)):
        reader = _stream_reader(redis_server.url, namespace,
                                **{**GROUP_READ, "sessionTimeoutMs": str(high + 1)})
        try:
            with pytest.raises(OptionError, match=message):
                call(reader)
        finally:
            reader.stop()
    assert coord.describe_group("g").members == []  # it never joined


def test_an_unreplayable_batch_0_is_read_again_after_the_next_restart_too(
        redis_server: Any, single_client: Any, namespace: str, topics: Topics,
        coord: GroupCoordinator) -> None:
    # Batch 0 was planned by an rcoord that did not record where its partitions began (its
    # end has no ``starts``), and the query failed in it. The restarted query cannot replay it
    # (StreamReader._replay reads nothing) and Spark counts it as finished; the query stops
    # before it plans again. Restarted once more, Spark plans from batch 0's end. Before, that
    # member took the end for one whose sink had stored it and committed it: batch 0's
    # records, read by nobody, were skipped for good.
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    topics.create("ev", 2)
    Producer(single_client, namespace, "round_robin").send_batch("ev", [b"x"] * 8)
    url = redis_server.url
    old = _stream_reader(url, namespace, **GROUP_READ)
    try:
        e0 = old.latestOffset(old.initialOffset(), ReadAllAvailable())
    finally:
        old.stop()
    e0 = {k: v for k, v in e0.items() if k != "starts"}  # as an older rcoord planned it
    new = _stream_reader(url, namespace, **GROUP_READ)
    try:
        assert new.partitions(new.initialOffset(), e0) == []
    finally:
        new.stop()
    again = _stream_reader(url, namespace, **GROUP_READ)
    try:
        nxt = Position.from_json(again.latestOffset(e0, ReadAllAvailable()))
        assert nxt.starts == {TP("ev", 0): 0, TP("ev", 1): 0}  # batch 0 comes again
        assert not _committed(coord)
    finally:
        again.stop()


def test_a_batch_planned_without_a_group_is_replayed_by_a_query_restarted_in_one(
        redis_server: Any, single_client: Any, namespace: str, topics: Topics,
        coord: GroupCoordinator) -> None:
    # A query without groupId fails in a batch and is restarted on its checkpoint with one
    # (a plain query's checkpoint is taken up in group mode: StreamMember.plan). Spark replays
    # the unfinished batch, whose end names no generation. Before, the replay failed with "a
    # replayed batch's end names the generation that planned it" (record_replay), and so did
    # every restart after it: the query could not go on from its checkpoint at all.
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    topics.create("ev", 2)
    Producer(single_client, namespace, "round_robin").send_batch("ev", [b"x"] * 8)
    url = redis_server.url
    plain = _stream_reader(url, namespace, subscribe="ev")
    try:
        e0 = plain.latestOffset(plain.initialOffset(), ReadAllAvailable())
    finally:
        plain.stop()
    group = _stream_reader(url, namespace, **GROUP_READ)
    try:
        read = [(p.range.partition, p.range.start, p.range.end)
                for p in group.partitions(group.initialOffset(), e0) if p.range.size]
        assert sorted(read) == [(0, 0, 3), (0, 3, 4), (1, 0, 3), (1, 3, 4)]
        nxt = group.latestOffset(e0, ReadAllAvailable())  # commits the replayed batch
        assert Position.from_json(nxt).offsets == Position.from_json(e0).offsets
        assert _committed(coord) == Position.from_json(e0).offsets
    finally:
        group.stop()


@pytest.mark.parametrize(("starting", "replayed"), [("earliest", False), ("latest", False),
                                                    ("earliest", True)])
def test_a_plain_querys_checkpoint_is_taken_up_by_a_query_restarted_with_a_group(
        starting: str, replayed: bool, redis_server: Any, single_client: Any, namespace: str,
        topics: Topics, coord: GroupCoordinator) -> None:
    # A query without groupId finishes batches 0 and 1 (records 0-5 of each partition; with
    # ``replayed``, batch 1 fails and the restarted query replays it), and is restarted on its
    # checkpoint with groupId, in a group that has committed nothing. Spark's Kafka source goes
    # on from its checkpoint whatever its options say. Before, the member began every
    # partition at the group's start policy, and under ``latest`` too at the log start (a
    # restarted query's generation places there): batches 0 and 1 were delivered again, and a
    # replayed batch 1 read nothing. A partition the group has an offset for goes on there.
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

    topics.create("ev", 2)
    producer = Producer(single_client, namespace, "round_robin")
    producer.send_batch("ev", [b"x"] * 12)
    plain = _stream_reader(redis_server.url, namespace, subscribe="ev")
    try:
        e0 = plain.latestOffset(plain.initialOffset(), ReadMaxRows(6))
        e1 = plain.latestOffset(e0, ReadMaxRows(6))
    finally:
        plain.stop()
    assert Position.from_json(e1).offsets == {TP("ev", 0): 6, TP("ev", 1): 6}
    producer.send_batch("ev", [b"y"] * 4)
    assert set(coord.commit_offsets("g", {TP("ev", 1): 1}).values()) == {Errors.NONE}
    group = _stream_reader(redis_server.url, namespace,
                           **{**GROUP_READ, "startingOffsets": starting})
    try:
        if replayed:
            read = sorted((p.range.partition, p.range.start, p.range.end)
                          for p in group.partitions(e0, e1) if p.range.size)
            assert read == [(0, 3, 6)]  # 1's committed offset is not where the batch began
        nxt = Position.from_json(group.latestOffset(e1, ReadAllAvailable()))
        assert nxt.starts == {TP("ev", 0): 6, TP("ev", 1): 1}
        assert nxt.offsets == {TP("ev", 0): 8, TP("ev", 1): 8}
        assert _committed(coord) == {TP("ev", 0): 6, TP("ev", 1): 1}
    finally:
        group.stop()


def test_a_replayed_batch_reads_only_what_the_member_owns_and_rewinds_no_commit(
        redis_server: Any, single_client: Any, namespace: str, topics: Topics,
        coord: GroupCoordinator) -> None:
    # Batch 1 was planned over 4 partitions by a query that then failed. Before it restarts,
    # another member took every partition and moved partitions 0 and 2 two records past the
    # batch's start (1 and 3 stay there). The restarted query gets half the partitions: it
    # replays exactly the one of them still at the batch's start, leaves the one the other
    # member moved (no rewind) and the other member's two empty, in their task slots.
    from pyspark.sql.streaming.datasource import ReadMaxRows

    topics.create("ev", 4)
    topics.create("out", 4)
    Producer(single_client, namespace, "round_robin").send_batch(
        "ev", [f"v{i}".encode() for i in range(40)])
    url = redis_server.url
    old = _stream_reader(url, namespace, **GROUP_READ)
    try:
        p0 = old.initialOffset()
        e0 = old.latestOffset(p0, ReadMaxRows(8))  # offsets 0-1 of each partition
        _run_batch(old, single_client, namespace, 0, p0, e0)
        e1 = old.latestOffset(e0, ReadMaxRows(16))  # offsets 2-5 of each partition
        planned = [p.range for p in old.partitions(e0, e1)]
        assert len(planned) == 8
    finally:
        old.stop()
    start = Position.from_json(e0).offsets
    assert _committed(coord) == start

    def capped(parts: Any) -> Any:  # the other member's reads: partitions 0 and 2, 2 records
        bounds, tokens = log_snapshot(topics, parts)
        return {tp: (lo, start[tp] + (2 if tp.partition % 2 == 0 else 0))
                for tp, (lo, _) in bounds.items()}, tokens

    other = _member(url, namespace, single_client)
    stop = threading.Event()
    thread: threading.Thread | None = None
    try:
        pos = other.plan(other.initial(10), capped, None)
        pos = other.plan(pos, capped, None)  # commits the batch before
        moved = {tp: o + (2 if tp.partition % 2 == 0 else 0) for tp, o in start.items()}
        assert _committed(coord) == moved
        state = {"pos": pos}

        def triggers() -> None:  # the other query keeps planning, so the group can rebalance
            while not stop.wait(0.05):
                state["pos"] = other.plan(state["pos"], capped, None)

        thread = threading.Thread(target=triggers, daemon=True)
        thread.start()
        new = _stream_reader(url, namespace, **GROUP_READ)
        try:
            ranges, read = _run_batch(new, single_client, namespace, 1, e0, e1)
            owned = set(new._member.generation.offsets)
            assert len(owned) == 2
            exact = {tp for tp in owned if tp.partition % 2 == 1}
            assert len(exact) == 1
            assert ranges == [r if TP(r.topic, r.partition) in exact else _empty(r)
                              for r in planned]
            (tp,) = exact
            assert sorted(read) == [(tp.partition, o) for o in range(start[tp], 6)]
            nxt = Position.from_json(new.latestOffset(e1, ReadMaxRows(100)))
            # the replayed end is committed; the other member's commits are not rewound
            assert _committed(coord) == {**moved, tp: 6}
            # the next batch goes on from the replayed end and from the other member's commit
            assert {(r.partition, r.start) for r in ranges_between(Position.from_json(e1), nxt)} \
                == {(p.partition, 6 if p == tp else moved[p]) for p in owned}
        finally:
            new.stop()
    finally:
        # The thread's plan is over before the other member closes: new.stop() ends the
        # generation, and a plan that waits for the next one while the member closes raises
        # GroupClosedError in the thread (an unhandled thread exception fails the test).
        stop.set()
        if thread is not None:
            thread.join(10)
            assert not thread.is_alive()
        other.close(5)


def test_a_group_member_treats_a_recreated_topic_as_data_loss(
        redis_server: Any, single_client: Any, namespace: str, topics: Topics,
        coord: GroupCoordinator, latest: Any) -> None:
    # The topic was deleted and created again under the member, and then holds more records
    # than the group's committed offset (5). Before 2026-11-23 a start past the new log end
    # was the only sign (and before that, the member jumped to the log end whatever
    # failOnDataLoss said); a committed offset within the new topic was taken as it was, and
    # the new topic's first records were skipped. Commits now carry the topic's create token.
    topics.create("ev", 2)
    producer = Producer(single_client, namespace, "round_robin")
    producer.send_batch("ev", [b"x"] * 10)

    strict = _member(redis_server.url, namespace, single_client)
    try:
        batch = strict.plan(strict.initial(10), latest, None)
        assert batch.offsets == {TP("ev", 0): 5, TP("ev", 1): 5}
        topics.delete("ev")
        topics.create("ev", 2)
        producer.send_batch("ev", [b"y"] * 4)
        with pytest.raises(DataLossError, match=r"^topic 'ev' partition 0: the topic was deleted "
                                                r"and created again since offset 5 was planned"):
            strict.plan(batch, latest, None)
    finally:
        strict.close(5)
    committed = coord.fetch_offsets("g").offsets
    assert {tp: o.offset for tp, o in committed.items()} == batch.offsets  # the old topic's
    producer.send_batch("ev", [b"y"] * 10)  # 7 per partition now: 5 is within the new topic
    lenient = _member(redis_server.url, namespace, single_client, failOnDataLoss="false")
    try:
        # the group committed 5 in the old topic; the new topic is read from its start
        nxt = lenient.plan(lenient.initial(10), latest, None)
        assert nxt.starts == {TP("ev", 0): 0, TP("ev", 1): 0}
        assert nxt.offsets == {TP("ev", 0): 7, TP("ev", 1): 7}
    finally:
        lenient.close(5)


def test_a_group_member_whose_log_lost_its_last_records_goes_on_at_the_log_end(
        redis_server: Any, single_client: Any, namespace: str, topics: Topics,
        coord: GroupCoordinator, latest: Any) -> None:
    # As outside group mode: an offset this member planned past the log end of the same topic
    # (the log lost its last records) started again at the log start without failOnDataLoss,
    # and the records read before were read again.
    topics.create("ev", 1)
    producer = Producer(single_client, namespace)
    producer.send_batch("ev", [b"x"] * 3)
    member = _member(redis_server.url, namespace, single_client, failOnDataLoss="false")
    try:
        batch = member.plan(member.initial(10), latest, None)
        assert batch.offsets == {TP("ev", 0): 3}
        ahead = replace(batch, offsets={TP("ev", 0): 5})  # planned before records 3, 4 went
        nxt = member.plan(ahead, latest, None)
        assert (nxt.starts, nxt.offsets) == ({TP("ev", 0): 3}, {TP("ev", 0): 3})
        producer.send_batch("ev", [b"y"])
        after = member.plan(nxt, latest, None)
        assert ranges_between(nxt, after) == [OffsetRange("ev", 0, 3, 4)]
    finally:
        member.close(5)


def test_a_group_member_reports_a_deleted_topic_as_data_loss_and_reads_it_anew(
        redis_server: Any, single_client: Any, namespace: str, topics: Topics,
        coord: GroupCoordinator, caplog: Any, latest: Any) -> None:
    # Before, a subscribed topic deleted under a group member was dropped without a word
    # whatever failOnDataLoss said: its partitions read as empty until the leader's partition
    # watcher rebalanced them away, and the rebase forgot them.
    topics.create("ev", 2)
    topics.create("keep", 1)
    producer = Producer(single_client, namespace, "round_robin")
    producer.send_batch("ev", [b"x"] * 10)
    producer.send_batch("keep", [b"k"] * 3)

    def member(group: str, **kw: str) -> StreamMember:
        o = parse_read_options({"url": redis_server.url, "namespace": namespace,
                                "subscribe": "ev,keep", "groupId": group,
                                "sessionTimeoutMs": "1500", "heartbeatIntervalMs": "200",
                                "rebalanceTimeoutMs": "5000", **kw}, ReadKind.STREAM, env={})
        return StreamMember(ConsumerGroup(member_config(o, ["ev", "keep"], single_client)),
                            rejoin_wait_s=0.2, fail_on_data_loss=o.fail_on_data_loss)

    lenient = member("g", failOnDataLoss="false")
    try:
        batch = lenient.plan(lenient.initial(10), latest, None)
        assert batch.offsets == {TP("ev", 0): 5, TP("ev", 1): 5, TP("keep", 0): 3}
        topics.delete("ev")
        producer.send_batch("keep", [b"k"] * 2)
        with caplog.at_level("WARNING", logger="rcoord.spark"):
            nxt = lenient.plan(batch, latest, None)
        assert nxt.offsets == {TP("keep", 0): 5}
        assert "topic 'ev' partition 0 is gone" in caplog.text
        assert "topic 'ev' partition 1 is gone" in caplog.text

        # the leader's partition watcher rebalances the deleted topic away
        state: dict[str, Any] = {"pos": nxt, "read": []}

        def rebalanced() -> bool:
            state["pos"] = lenient.plan(state["pos"], latest, None)
            return bool(state["pos"].generation != batch.generation)

        wait_until(rebalanced, timeout_s=10)
        assert state["pos"].offsets == {TP("keep", 0): 5}
        # created again, with more records than the offsets the group committed (5, in the
        # deleted topic): the next rebalance gives it back at those offsets, and the member
        # reads it from its log start (the commits' create token is not the new topic's)
        topics.create("ev", 2)
        producer.send_batch("ev", [b"y"] * 14)

        def reads_ev_again() -> bool:
            prev = state["pos"]
            state["pos"] = lenient.plan(prev, latest, None)
            state["read"] += [r for r in ranges_between(prev, state["pos"]) if r.topic == "ev"]
            return any(r.topic == "ev" for r in state["read"])

        wait_until(reads_ev_again, timeout_s=10)
        assert sorted(state["read"], key=lambda r: r.partition) == [OffsetRange("ev", 0, 0, 7),
                                                                   OffsetRange("ev", 1, 0, 7)]
    finally:
        lenient.close(5)

    strict = member("s")
    try:
        batch = strict.plan(strict.initial(10), latest, None)
        assert batch.offsets == {TP("ev", 0): 7, TP("ev", 1): 7, TP("keep", 0): 5}
        topics.delete("ev")
        with pytest.raises(DataLossError, match=r"^topic 'ev' partition 0 is gone \(the topic "
                                                r"was deleted\) .* from offset 7 on.*"
                                                r"failOnDataLoss=false"):
            strict.plan(batch, latest, None)
    finally:
        strict.close(5)


# -- how the runner process ends (rcoord.spark.shutdown) -----------------------------------------

_SHUTDOWN_CHILD = """
import signal
from rcoord.spark import shutdown

shutdown.install()
with shutdown.shielded():  # stop() on the end-of-file path: a SIGTERM must not cut it short
    signal.raise_signal(signal.SIGTERM)
    print("shielded", flush=True)
try:
    signal.raise_signal(signal.SIGTERM)  # the first SIGTERM outside stop(): unwind into finally
except SystemExit as exc:
    print("exit", exc.code, flush=True)
    signal.raise_signal(signal.SIGTERM)  # Spark's second SIGTERM: ignored
    with shutdown.shielded():
        pass
    signal.raise_signal(signal.SIGTERM)  # the shield restored "ignore", not the handler
    print("ignored", flush=True)
"""


def test_sigterm_unwinds_once_and_never_inside_the_shield() -> None:
    root = Path(__file__).resolve().parent.parent
    out = subprocess.run([sys.executable, "-c", _SHUTDOWN_CHILD], check=False, cwd=root,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n") == ["shielded", "exit 143", "ignored", ""]


def _group_reader(url: str, namespace: str, **kw: str) -> Any:
    """A group-mode stream reader (group ``g``, quick sessions), as a Spark runner makes it."""
    return _stream_reader(url, namespace, groupId="g", sessionTimeoutMs="1500",
                          heartbeatIntervalMs="200", rebalanceTimeoutMs="3000", **kw)


def test_a_group_pattern_reads_topics_created_after_the_query_started(
        redis_server: Any, single_client: Any, namespace: str, topics: Topics,
        coord: GroupCoordinator) -> None:
    # Before, the pattern became the topics it matched at the start: a topic created later
    # was never read, and a pattern that matched nothing yet failed the start.
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    reader = _group_reader(redis_server.url, namespace, subscribePattern="ev-.*")
    try:
        pos = reader.initialOffset()
        assert reader.latestOffset(pos, ReadAllAvailable())["offsets"] == {}
        topics.create("ev-a", 1)
        topics.create("other", 1)
        producer = Producer(single_client, namespace)
        producer.send_batch("ev-a", [b"a"] * 3)
        producer.send_batch("other", [b"o"] * 2)
        state = {"pos": pos}

        def planned(want: dict[str, Any]) -> bool:
            state["pos"] = reader.latestOffset(state["pos"], ReadAllAvailable())
            return bool(state["pos"]["offsets"] == want)

        wait_until(lambda: planned({"ev-a": {"0": 3}}), timeout_s=10)
        topics.create("ev-b", 1)
        producer.send_batch("ev-b", [b"b"] * 5)
        wait_until(lambda: planned({"ev-a": {"0": 3}, "ev-b": {"0": 5}}), timeout_s=10)
        assert state["pos"]["starts"]["ev-b"] == {"0": 0}  # from its log start
    finally:
        reader.stop()


@pytest.mark.parametrize("fail_on_data_loss", ["true", "false"])
def test_a_group_query_restarted_after_a_subscribed_topic_was_deleted_reports_the_loss(
        redis_server: Any, single_client: Any, namespace: str, topics: Topics,
        coord: GroupCoordinator, fail_on_data_loss: str, caplog: Any) -> None:
    # Before, the restarted runner refused to join: "subscribe: unknown topic 'b'", whatever
    # failOnDataLoss said, so the query could not be restarted on its checkpoint.
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    topics.create("a", 1)
    topics.create("b", 1)
    producer = Producer(single_client, namespace)
    producer.send_batch("a", [b"a"] * 3)
    producer.send_batch("b", [b"b"] * 3)
    kw = {"subscribe": "a,b", "failOnDataLoss": fail_on_data_loss}
    first = _group_reader(redis_server.url, namespace, **kw)
    try:
        end = first.latestOffset(first.initialOffset(), ReadAllAvailable())
        assert end["offsets"] == {"a": {"0": 3}, "b": {"0": 3}}
    finally:
        first.stop()
    topics.delete("b")
    producer.send_batch("a", [b"a"] * 2)
    restarted = _group_reader(redis_server.url, namespace, **kw)
    try:
        if fail_on_data_loss == "true":
            with pytest.raises(DataLossError, match="topic 'b' partition 0 is gone"):
                restarted.latestOffset(end, ReadAllAvailable())
        else:
            with caplog.at_level("WARNING", logger="rcoord.spark"):
                assert restarted.latestOffset(end, ReadAllAvailable())["offsets"] == {"a": {"0": 5}}
            assert "topic 'b' partition 0 is gone" in caplog.text
    finally:
        restarted.stop()
    # a new query still insists that what it names exists
    with pytest.raises(OptionError, match="subscribe: unknown topic 'b'"):
        _group_reader(redis_server.url, namespace, **kw).initialOffset()


def test_a_group_stream_fails_once_redis_is_out_of_reach_past_a_session(
        own_server: Any, namespace: str) -> None:
    """A reviewer's repro: with Redis gone, a group-mode plan found no generation and returned
    its start, which Spark takes for "no new data": the query stayed up reading nothing, for
    ever, with only warnings (the plain reader fails at once). A blip within the session
    timeout is ridden out; past it the plan raises ConnectionLost."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    every = ReadAllAvailable()
    admin = own_server.client()
    try:
        GroupCoordinator(admin, CoordinatorConfig(namespace=namespace, num_partitions=1,
                                                  group_initial_rebalance_delay_ms=0,
                                                  group_min_session_timeout_ms=10)).start()
        Topics(admin, namespace).create("ev", 1)
    finally:
        admin.close()
    reader = _group_reader(own_server.url, namespace, subscribe="ev")
    try:
        start = reader.initialOffset()
        planned = reader.latestOffset(start, every)
        own_server.stop()

        def plan() -> str:
            try:
                reader.latestOffset(planned, every)
            except ConnectionLost as exc:
                return str(exc)
            return "no new data"

        # While the generation lives, a plan's own read fails at once (as a plain reader's);
        # once its heartbeat has ended it, a plan finds no generation: no new data, at first.
        wait_until(lambda: plan() == "no new data", timeout_s=30)
        wait_until(lambda: "out of reach for more than the session timeout (1.5 s)" in plan(),
                   timeout_s=20)
    finally:
        reader.stop()


@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_a_partition_a_task_cannot_read_is_not_data_loss(
        single_client: Any, namespace: str, topics: Topics, fail_on_data_loss: bool) -> None:
    """A stream entry an XADD by hand made (not a record, with an id not rcoord's) leaves the
    records unreadable, not lost: the task fails with the TopicError that names the stream and
    what mends it, whatever failOnDataLoss says. It was a DataLossError, whose message was
    taken for loss, and which failOnDataLoss=false, the setting for loss, did not skip."""
    topics.create("odd", 1)
    Producer(single_client, namespace).send_batch("odd", [b"a", b"b", b"c"])
    single_client.execute_command("XADD", partition_key(namespace, "odd", 0), "*", "x", "1")
    rng = OffsetRange("odd", 0, 0, 3)
    with pytest.raises(TopicError) as info:
        list(read_range(single_client, namespace, rng, 10, fail_on_data_loss,
                        topics.create_token("odd")))
    assert info.value.error is Errors.UNKNOWN_SERVER_ERROR
    assert partition_key(namespace, "odd", 0) in str(info.value)


def test_a_partition_whose_offsets_cannot_be_read_is_not_taken_for_a_deleted_one(
        single_client: Any, namespace: str, topics: Topics, caplog: Any) -> None:
    """A stream whose last id is not rcoord's (an XADD by hand with an id of its own) has no
    log offsets: ``Topics.describe`` answers it UNKNOWN_SERVER_ERROR for that partition alone
    (17320c7), with a detail naming the stream and what mends it. The bounds a plan reads
    raise that TopicError, as the whole describe did before. Left out of them, the partition
    was taken for one whose topic was deleted: a DataLossError ("was deleted") with
    failOnDataLoss, else, without a word of the cause, a plan without it, and a stream that
    dropped it took it for a new partition when it could be read again (from its log start:
    every record read before came again)."""
    topics.create("odd", 2)
    Producer(single_client, namespace).send_batch(
        "odd", [ProducerRecord(v, partition=0) for v in (b"a", b"b", b"c")])
    single_client.execute_command("XADD", partition_key(namespace, "odd", 0), "*", "x", "1")
    parts = [TP("odd", 0), TP("odd", 1)]
    with pytest.raises(TopicError) as info:
        log_snapshot(topics, parts)
    assert info.value.error is Errors.UNKNOWN_SERVER_ERROR
    assert partition_key(namespace, "odd", 0) in str(info.value)
    assert "XADD by hand" in info.value.detail
    assert log_bounds(topics, [TP("odd", 1)]) == {TP("odd", 1): (0, 0)}  # (the other: read)


def _with_gaps(client: Any, namespace: str, topics: Topics, *removed: int) -> str:
    """Topic "gap" of one partition holding records v0..v7 at offsets 0..7, less those at
    ``removed`` (XDEL by hand; rcoord removes records only from a log's start). Its token.
    (The log start read after an XDEL is up by the entries removed, from the stream's length:
    the reads here begin at or past it.)"""
    topics.create("gap", 1)
    Producer(client, namespace).send_batch("gap", [b"v%d" % i for i in range(8)])
    key = partition_key(namespace, "gap", 0)
    for offset in removed:
        client.execute_command("XDEL", key, f"0-{offset + 1}")
    return topics.create_token("gap")


@pytest.mark.parametrize("size", [2, 10], ids=["gap-begins-a-read", "gap-inside-a-read"])
def test_a_gap_in_a_partition_is_data_loss_for_a_task(
        single_client: Any, namespace: str, topics: Topics, size: int,
        caplog: pytest.LogCaptureFixture) -> None:
    """Records removed from a stream's middle by hand (offsets 4 and 5) are lost to the query,
    as Spark's Kafka source takes records missing between the offset asked and the one it got:
    with failOnDataLoss a DataLossError naming the offsets, without it a warning and the
    records after the gap. Before, a read that began at the gap raised a TopicError whatever
    failOnDataLoss said (the query could never get past it), and one that began before it
    skipped the missing offsets without a word, also with failOnDataLoss."""
    token = _with_gaps(single_client, namespace, topics, 4, 5)
    rng = OffsetRange("gap", 0, 2, 8)
    with pytest.raises(DataLossError, match=r"gap-0: offsets 4\.\.5 are missing.*XDEL"):
        list(read_range(single_client, namespace, rng, size, True, token))
    with caplog.at_level(logging.WARNING, "rcoord.spark"):
        got = [r.value for c in read_range(single_client, namespace, rng, size, False, token)
               for r in c]
    assert got == [b"v2", b"v3", b"v6", b"v7"]
    assert "offsets 4..5 are missing" in caplog.text and "skipping them" in caplog.text


def test_a_gap_past_a_range_is_skipped_to_the_range_end(
        single_client: Any, namespace: str, topics: Topics) -> None:
    """A gap that runs past the range's end (offsets 5..7 gone, the range 4..6) skips to the
    range's end, never into the next batch's records; one up to the log end too."""
    token = _with_gaps(single_client, namespace, topics, 5, 6)
    got = [r.value for c in read_range(single_client, namespace, OffsetRange("gap", 0, 4, 7),
                                       10, False, token) for r in c]
    assert got == [b"v4"]
    single_client.execute_command("XDEL", partition_key(namespace, "gap", 0), "0-8")
    assert list(read_range(single_client, namespace, OffsetRange("gap", 0, 5, 8), 10, False,
                           token)) == []
    with pytest.raises(DataLossError, match=r"offsets 7\.\.7 are missing"):
        list(read_range(single_client, namespace, OffsetRange("gap", 0, 7, 8), 10, True, token))


def test_a_fetch_says_where_the_records_after_a_gap_begin(
        single_client: Any, namespace: str, topics: Topics) -> None:
    """``FetchResult.next_offset``: a gap's next offset as a field, not only in the detail."""
    _with_gaps(single_client, namespace, topics, 2, 3)
    at_gap, before = fetch_many(single_client, namespace, [("gap", 0, 2), ("gap", 0, 4)])
    assert (at_gap.error, at_gap.next_offset) == (Errors.UNKNOWN_SERVER_ERROR, 4)
    assert (before.error, before.next_offset) == (Errors.NONE, -1)
