"""Edge answers of Fetch, ListOffsets and OffsetCommit, as Kafka gives them: a negative fetch
offset is out of range for its partition only; ListOffsets' MAX_TIMESTAMP (KIP-734) names the
record with the largest timestamp and that timestamp, or -1 and -1 for an empty log; an
OffsetCommit partition of a topic or partition that does not exist is UNKNOWN_TOPIC_OR_PARTITION
for that partition only, and the others are committed."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("kio")

from gateway_harness import call_once, connect, request_frame, response

from rcoord import GroupCoordinator, TopicPartition
from rcoord.errors import Errors
from rcoord.topics import Producer, ProducerRecord


def test_a_negative_fetch_offset_is_out_of_range_for_its_partition_only(gateway, redis_server,
                                                                        topics):
    topics.create("neg", 2)
    client = redis_server.client()
    try:
        Producer(client, gateway.config.namespace, idempotent=False).send_batch(
            "neg", [ProducerRecord(b"a", partition=0), ProducerRecord(b"b", partition=1)])
    finally:
        client.close()
    fetched = call_once(gateway, 1, 12, {
        "replica_id": -1, "max_wait": 0, "min_bytes": 1, "max_bytes": 1 << 20,
        "topics": [{"topic": "neg", "partitions": [
            {"partition": 0, "fetch_offset": -1, "partition_max_bytes": 1 << 20},
            {"partition": 1, "fetch_offset": 0, "partition_max_bytes": 1 << 20}]}]})
    assert fetched.error_code.value == 0
    parts = {p.partition_index: p for p in fetched.responses[0].partitions}
    assert parts[0].error_code.value == Errors.OFFSET_OUT_OF_RANGE
    assert (parts[0].log_start_offset, parts[0].high_watermark) == (0, 1)  # to reset from
    assert parts[1].error_code.value == 0 and parts[1].records


def _list_offsets(gw, version: int, topic: str, partitions: list[int], ts: int) -> dict[int, Any]:
    """ListOffsets of ``partitions`` at timestamp ``ts``: partition -> its answer."""
    sock = connect(gw)
    try:
        sock.sendall(request_frame(2, version, 1, {"replica_id": -1, "isolation_level": 0,
                                                   "topics": [{"name": topic, "partitions": [
                                                       {"partition_index": p, "timestamp": ts}
                                                       for p in partitions]}]}))
        listed = response(sock, 2, version, 5 if version >= 6 else 4)  # v6+: flexible
    finally:
        sock.close()
    return {p.partition_index: p for p in listed.topics[0].partitions}


def test_max_timestamp_names_the_first_record_with_it_or_nothing(gateway, redis_server, topics):
    """KIP-734 as Kafka answers it (UnifiedLog's MAX_TIMESTAMP, RecordBatch.offsetOfMaxTimestamp):
    the largest timestamp, with the first record that has it. It named the last record, which
    shares the timestamp of a whole batch appended in one millisecond."""
    topics.create("mx", 2)
    now = [1_000]
    client = redis_server.client()
    try:
        producer = Producer(client, gateway.config.namespace, clock=lambda: now[0])
        producer.send_batch("mx", [ProducerRecord(b"a", partition=0)])
        now[0] = 2_000
        metas = producer.send_batch("mx", [ProducerRecord(b"b", partition=0),
                                           ProducerRecord(b"c", partition=0)])
    finally:
        client.close()
    assert [m.timestamp_ms for m in metas] == [2_000, 2_000]
    parts = _list_offsets(gateway, 7, "mx", [0, 1], -3)
    assert parts[0].error_code.value == 0
    assert (parts[0].offset, parts[0].timestamp) == (metas[0].offset, 2_000)
    assert (parts[1].offset, parts[1].timestamp) == (-1, -1)  # empty: no such record
    assert (parts[0].leader_epoch, parts[1].leader_epoch) == (0, -1)


def test_a_timestamp_past_every_record_is_answered_with_no_leader_epoch(gateway, redis_server,
                                                                        topics):
    """Kafka answers a search that finds nothing with buildErrorResponse(NONE): offset,
    timestamp and leader epoch all -1 (the epoch was 0, an epoch of no record). A record found,
    and the earliest and latest offsets, carry the epoch the gateway advertises, 0."""
    topics.create("past", 1)
    client = redis_server.client()
    try:
        Producer(client, gateway.config.namespace, clock=lambda: 5_000).send_batch(
            "past", [ProducerRecord(b"a", partition=0)])
    finally:
        client.close()
    for version in (4, 7):
        missed = _list_offsets(gateway, version, "past", [0], 6_000)[0]
        assert (missed.error_code.value, missed.offset, missed.timestamp,
                missed.leader_epoch) == (0, -1, -1, -1)
        hit = _list_offsets(gateway, version, "past", [0], 4_000)[0]
        assert (hit.offset, hit.timestamp, hit.leader_epoch) == (0, 5_000, 0)
        for ts, offset in ((-2, 0), (-1, 1)):
            edge = _list_offsets(gateway, version, "past", [0], ts)[0]
            assert (edge.offset, edge.leader_epoch) == (offset, 0)


@pytest.mark.parametrize(("version", "timestamp"), [(1, -3), (4, -3), (6, -3), (7, -4),
                                                     (7, -5), (7, -6)])
def test_a_timestamp_its_version_lacks_is_unsupported_version(gateway, topics, version,
                                                              timestamp):
    """Kafka's ReplicaManager.isListOffsetsTimestampUnsupported: MAX_TIMESTAMP (-3) needs v7,
    tiered storage's -4 and -5 need v8 and v9, other negative timestamps none:
    UNSUPPORTED_VERSION for that partition. -3 was answered below v7, the others with
    INVALID_REQUEST. Earliest and latest are answered at every version."""
    topics.create("uv", 1)
    assert _list_offsets(gateway, version, "uv", [0], timestamp)[0].error_code.value == (
        Errors.UNSUPPORTED_VERSION)
    for ts in (-1, -2):
        got = _list_offsets(gateway, version, "uv", [0], ts)[0]
        assert (got.error_code.value, got.offset) == (0, 0)


def test_tiered_storages_timestamps_are_answered_as_kafka_without_it(gateway, redis_server,
                                                                     topics):
    """v8 and v9 (KIP-405, KIP-1005) add EARLIEST_LOCAL (-4) and LATEST_TIERED (-5), which
    Kafka's UnifiedLog.fetchOffsetByTimestamp answers, with no remote storage, as the log start
    (like -2) and as offset, timestamp and leader epoch -1 (no error); each below its version,
    and any other negative timestamp, is UNSUPPORTED_VERSION (isListOffsetsTimestampUnsupported).
    Both versions were not served (the gateway advertised 1-7), so a request of either was
    answered UNSUPPORTED_VERSION whole."""
    topics.create("tier", 1)
    client = redis_server.client()
    try:
        Producer(client, gateway.config.namespace, idempotent=False).send_batch(
            "tier", [ProducerRecord(b"x", partition=0) for _ in range(5)])
    finally:
        client.close()
    topics.delete_records("tier", {0: 2})  # (the log start is not 0)
    answers = {(version, ts): _list_offsets(gateway, version, "tier", [0], ts)[0]
               for version in (8, 9) for ts in (-2, -4, -5, -6)}
    codes = {key: got.error_code.value for key, got in answers.items()}
    assert codes == {(8, -2): 0, (8, -4): 0, (8, -5): Errors.UNSUPPORTED_VERSION,
                     (8, -6): Errors.UNSUPPORTED_VERSION, (9, -2): 0, (9, -4): 0, (9, -5): 0,
                     (9, -6): Errors.UNSUPPORTED_VERSION}
    for version in (8, 9):
        for ts in (-2, -4):
            got = answers[version, ts]
            assert (got.offset, got.timestamp, got.leader_epoch) == (2, -1, 0)
    got = answers[9, -5]
    assert (got.offset, got.timestamp, got.leader_epoch) == (-1, -1, -1)
    assert _list_offsets(gateway, 9, "tier", [3], -5)[3].error_code.value == (
        Errors.UNKNOWN_TOPIC_OR_PARTITION)  # (the partition is still looked up)


@pytest.mark.parametrize("version", [1, 7])
def test_a_partition_listed_twice_is_answered_once_invalid_request(gateway, topics, version):
    """Kafka's v1+ ListOffsets (ListOffsetsRequest.duplicatePartitions, ReplicaManager.fetchOffset):
    a partition named twice, in the same topic entry or in two, gets one answer,
    INVALID_REQUEST; the others are answered as usual. Each copy was answered, with its own
    offset, so which one a client took was arbitrary."""
    topics.create("d", 2)
    times = [{"partition_index": 0, "timestamp": -2}, {"partition_index": 0, "timestamp": -1},
             {"partition_index": 1, "timestamp": -1}]
    sock = connect(gateway)
    try:
        sock.sendall(request_frame(2, version, 1, {"replica_id": -1, "topics": [
            {"name": "d", "partitions": times}, {"name": "d", "partitions": [times[1]]}]}))
        listed = response(sock, 2, version, 5 if version >= 6 else 4)  # v6+: flexible
    finally:
        sock.close()
    assert [(t.name, p.partition_index, p.error_code.value, p.offset)
            for t in listed.topics for p in t.partitions] == [
        ("d", 0, Errors.INVALID_REQUEST, -1), ("d", 1, 0, 0)]


@pytest.mark.parametrize("version", [2, 8])
def test_a_commit_answers_each_missing_topic_or_partition_and_commits_the_rest(
        gateway, redis_server, topics, version):
    """KafkaApis.handleOffsetCommitRequest: UNKNOWN_TOPIC_OR_PARTITION for each partition not
    in the metadata (no such topic, an illegal name, an index past the last or below 0); the
    valid partitions of the same request are committed. A negative index once failed the whole
    request (INVALID_REQUEST on every partition), and a missing topic was committed."""
    topics.create("real", 2)
    wanted = {"real": [0, 1, 2, -1], "nosuch": [0], "bad{name}": [0], "": [0]}
    sock = connect(gateway)
    try:
        sock.sendall(request_frame(8, version, 1, {
            "group_id": "grp", "generation_id_or_member_epoch": -1, "member_id": "",
            "topics": [{"name": name, "partitions": [
                {"partition_index": p, "committed_offset": 10 + p} for p in parts]}
                for name, parts in wanted.items()]}))
        got = response(sock, 8, version, 4 if version < 8 else 5)
    finally:
        sock.close()
    codes = {(t.name, p.partition_index): int(p.error_code.value)
             for t in got.topics for p in t.partitions}
    unknown = Errors.UNKNOWN_TOPIC_OR_PARTITION
    assert codes == {("real", 0): 0, ("real", 1): 0, ("real", 2): unknown,
                     ("real", -1): unknown, ("nosuch", 0): unknown, ("bad{name}", 0): unknown,
                     ("", 0): unknown}
    client = redis_server.client()
    try:
        fetched = GroupCoordinator(client, gateway.config.namespace).fetch_offsets("grp", None)
    finally:
        client.close()
    assert {tp: om.offset for tp, om in fetched.offsets.items()} == {
        TopicPartition("real", 0): 10, TopicPartition("real", 1): 11}


def test_confluent_kafka_sees_the_missing_partition_and_keeps_the_valid_commit(gateway, topics):
    ck = pytest.importorskip("confluent_kafka")
    topics.create("real", 2)
    consumer = ck.Consumer({"bootstrap.servers": gateway.bootstrap, "group.id": "grp",
                            "broker.address.family": "v4"})
    try:
        with pytest.raises(ck.KafkaException) as failed:
            consumer.commit(offsets=[ck.TopicPartition("real", 0, 5),
                                     ck.TopicPartition("real", 7, 5),
                                     ck.TopicPartition("nosuch", 0, 3)], asynchronous=False)
        assert failed.value.args[0].code() == ck.KafkaError.UNKNOWN_TOPIC_OR_PART
        committed = consumer.committed([ck.TopicPartition("real", 0),
                                        ck.TopicPartition("real", 1)], timeout=30)
        assert [(tp.partition, tp.offset) for tp in committed] == [(0, 5), (1, ck.OFFSET_INVALID)]
    finally:
        consumer.close()
