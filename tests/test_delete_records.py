"""``Topics.delete_records``, Kafka's DeleteRecords, on a real server (one node and a cluster):
the new log start, Kafka's answers at the edges, a removal split into bounded calls, and what a
reader then sees."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from typing import Any

import pytest
import redis
import test_cli_groups
from test_cli_groups import ok, rows

from rcoord.errors import Errors, InvalidRequestError
from rcoord.topics import (
    DeletedRecords,
    Producer,
    ProducerRecord,
    TopicError,
    Topics,
    fetch,
    log_offsets,
)
from rcoord.topics import _base as topics_base
from rcoord.topics import admin as topics_admin


@pytest.fixture
def topics(redis_client: Any, namespace: str) -> Topics:
    return Topics(redis_client, namespace)


def _filled(redis_client: Any, namespace: str, topics: Topics, counts: list[int],
            value: bytes = b"v") -> None:
    topics.create("t", len(counts))
    producer = Producer(redis_client, namespace, idempotent=False)
    producer.send_batch("t", [ProducerRecord(value, partition=partition)
                              for partition, n in enumerate(counts) for _ in range(n)])


def _lose_redis_in_round(monkeypatch: Any, n: int,
                         before: Callable[[], None] = lambda: None) -> list[int]:
    """Make ``delete_records``' round ``n`` lose Redis (a dropped connection, after ``before``
    runs); the list returned gets each round's number of calls."""
    real, rounds = topics_admin._run, []

    def cut(client: Any, calls: Any, **kwargs: Any) -> Any:
        rounds.append(len(calls))
        if len(rounds) == n:
            before()
            raise redis.exceptions.ConnectionError("connection reset (test)")
        return real(client, calls, **kwargs)

    monkeypatch.setattr(topics_admin, "_run", cut)
    return rounds


def test_the_log_start_moves_to_the_offset_given(redis_client, namespace, topics):
    _filled(redis_client, namespace, topics, [10, 10, 0])
    got = topics.delete_records("t", {0: 4, 1: -1, 2: -1})
    assert got == {0: DeletedRecords(0, 4), 1: DeletedRecords(1, 10), 2: DeletedRecords(2, 0)}
    assert [log_offsets(redis_client, namespace, "t", p) for p in range(3)] == [
        (4, 10), (10, 10), (0, 0)]
    records = fetch(redis_client, namespace, "t", 0, 4).records
    assert [r.offset for r in records] == list(range(4, 10))
    below = fetch(redis_client, namespace, "t", 0, 3)  # a reader left behind resets
    assert (below.error, below.log_start_offset, below.records) == (
        Errors.OFFSET_OUT_OF_RANGE, 4, [])


def test_kafkas_answers_at_the_edges(redis_client, namespace, topics):
    """As Kafka's UnifiedLog.deleteRecordsOnLeader: past the log end or below -1 is
    OFFSET_OUT_OF_RANGE and removes nothing; at or below the log start removes nothing."""
    _filled(redis_client, namespace, topics, [5, 5, 5, 5])
    topics.delete_records("t", {3: 2})
    got = topics.delete_records("t", {0: 6, 1: -2, 2: 0, 3: 1, 7: 1})
    assert got == {
        0: DeletedRecords(0, -1, Errors.OFFSET_OUT_OF_RANGE),
        1: DeletedRecords(1, -1, Errors.OFFSET_OUT_OF_RANGE),
        2: DeletedRecords(2, 0), 3: DeletedRecords(3, 2),
        7: DeletedRecords(7, -1, Errors.UNKNOWN_TOPIC_OR_PARTITION)}
    assert [log_offsets(redis_client, namespace, "t", p)[0] for p in range(4)] == [0, 0, 0, 2]
    with pytest.raises(TopicError) as info:
        topics.delete_records("missing", {0: 1})
    assert info.value.error == Errors.UNKNOWN_TOPIC_OR_PARTITION
    with pytest.raises(InvalidRequestError, match="partition must be >= 0"):
        topics.delete_records("t", {-1: 1})


def test_a_large_removal_is_split_into_bounded_calls(redis_client, namespace, topics,
                                                     monkeypatch):
    """Each call removes about RETENTION_TRIM_BYTES of records (one at least), judged by the
    partition's first record, and the calls repeat until the offset is reached: one XTRIM of
    500 records of 1 MB held the server for 108 ms."""
    _filled(redis_client, namespace, topics, [40], value=b"x" * 1000)
    monkeypatch.setattr("rcoord.topics.admin.RETENTION_TRIM_BYTES", 5000)
    calls = []

    class Counted(topics_base._Lua):
        def __call__(self, client: Any, keys: Any, args: Any) -> Any:
            calls.append(list(args))  # (one partition: _run calls the script, no pipeline)
            return super().__call__(client, keys, args)

    monkeypatch.setattr("rcoord.topics.admin.DELETE_RECORDS", Counted("topic_delete_records"))
    assert topics.delete_records("t", {0: 30}) == {0: DeletedRecords(0, 30)}
    assert len(calls) == 8  # 30 records of a little over 1 KB: 4 a call (5,000 bytes)
    assert log_offsets(redis_client, namespace, "t", 0) == (30, 40)


def test_a_small_first_record_does_not_unbound_a_call(redis_client, namespace, topics,
                                                     monkeypatch):
    """A call judged its removal by the partition's first record alone: a record of 1 byte
    followed by 60 records of 1,000 let one call remove all 61 (60 KB for a bound of 5,000).
    Sizes are now read as the call goes, each round taking no more records than those before
    it, so here every call stays within twice the bound (sizes that alternate so that the
    records read are small and the others large can still pass it); the end state is the same."""
    topics.create("t", 1)
    producer = Producer(redis_client, namespace, idempotent=False)
    producer.send_batch("t", [ProducerRecord(b"s", partition=0)]
                        + [ProducerRecord(b"x" * 1000, partition=0) for _ in range(60)])
    monkeypatch.setattr("rcoord.topics.admin.RETENTION_TRIM_BYTES", 5000)
    starts = [0]

    class Noted(topics_base._Lua):
        def __call__(self, client: Any, keys: Any, args: Any) -> Any:
            reply = super().__call__(client, keys, args)
            starts.append(int(reply[1]))
            return reply

    monkeypatch.setattr("rcoord.topics.admin.DELETE_RECORDS", Noted("topic_delete_records"))
    assert topics.delete_records("t", {0: 61}) == {0: DeletedRecords(0, 61)}
    removed = [(b - a) * 1000 for a, b in itertools.pairwise(starts)]
    assert starts[-1] == 61 and max(removed) <= 2 * 5000, starts
    assert log_offsets(redis_client, namespace, "t", 0) == (61, 61)


def test_minus_one_is_the_log_end_when_the_call_starts(redis_client, namespace, topics,
                                                      monkeypatch):
    """-1 is resolved once: records appended while a split removal goes on are kept."""
    _filled(redis_client, namespace, topics, [12], value=b"x" * 1000)
    monkeypatch.setattr("rcoord.topics.admin.RETENTION_TRIM_BYTES", 5000)
    producer = Producer(redis_client, namespace, idempotent=False)
    appended = []

    class Appending(topics_base._Lua):
        def __call__(self, client: Any, keys: Any, args: Any) -> Any:
            reply = super().__call__(client, keys, args)
            if not appended:  # (after the first call: -1 was the log end, 12)
                appended.append(producer.send("t", b"late", partition=0).offset)
            return reply

    monkeypatch.setattr("rcoord.topics.admin.DELETE_RECORDS", Appending("topic_delete_records"))
    assert topics.delete_records("t", {0: -1}) == {0: DeletedRecords(0, 12)}
    assert appended == [12]
    assert [r.value for r in fetch(redis_client, namespace, "t", 0, 12).records] == [b"late"]


url = test_cli_groups.url  # fixtures: the backend's URL, and the command line on it
cli = test_cli_groups.cli


def test_the_command_line(cli, redis_client, namespace, topics):
    """``rcoord topics delete-records``: every partition or those named; exit 1 with the table
    when a partition refuses."""
    _filled(redis_client, namespace, topics, [5, 5])
    res = ok(cli("topics", "delete-records", "t", "--offset", "3"))
    assert rows(res.stdout, "TOPIC PARTITION") == [["t", "0", "3", "-"], ["t", "1", "3", "-"]]
    res = ok(cli("topics", "delete-records", "t", "--offset", "-1", "--partition", "1",
                 "--output", "json"))
    assert json.loads(res.stdout) == {"topic": "t", "partitions": [
        {"partition": 1, "low_watermark": 5, "error": None}]}
    res = cli("topics", "delete-records", "t", "--offset", "6", "--partition", "0")
    assert res.returncode == 1
    assert rows(res.stdout, "TOPIC PARTITION") == [["t", "0", "-1", "OFFSET_OUT_OF_RANGE"]]
    assert [log_offsets(redis_client, namespace, "t", p)[0] for p in range(2)] == [3, 5]
    res = cli("topics", "delete-records", "t", "--offset", "-2")
    assert res.returncode == 2 and "--offset must be >= 0, or -1" in res.stderr
    res = cli("topics", "delete-records", "missing", "--offset", "1")
    assert res.returncode == 1 and "UNKNOWN_TOPIC_OR_PARTITION" in res.stderr


def test_a_stream_whose_last_id_is_not_rcoords_is_refused_for_its_partition_alone(
        cli, redis_client, namespace, topics, monkeypatch):
    """As Kafka's DeleteRecords, which answers per partition: the partition whose stream got an
    XADD with an id of its own is UNKNOWN_SERVER_ERROR with a detail saying what mends it, and
    the others are answered their new log start, a removal of several calls finished too.
    Before, the whole call raised TopicError, though the other partitions' records were
    already removed (or partly, for a removal that takes several calls), which the caller
    was not told; the command line printed no table."""
    _filled(redis_client, namespace, topics, [1, 0, 40], value=b"x" * 1000)
    redis_client.execute_command("XADD", topics_base.partition_key(namespace, "t", 1), "*",
                                 "t", 1)
    monkeypatch.setattr("rcoord.topics.admin.RETENTION_TRIM_BYTES", 5000)  # (several calls)
    done = topics.delete_records("t", {0: 1, 1: 0, 2: 30})
    assert [(d.partition, d.low_watermark, d.error) for d in done.values()] == [
        (0, 1, Errors.NONE), (1, -1, Errors.UNKNOWN_SERVER_ERROR), (2, 30, Errors.NONE)]
    assert "delete and re-create the topic" in done[1].detail
    assert [log_offsets(redis_client, namespace, "t", p) for p in (0, 2)] == [(1, 1), (30, 40)]
    res = cli("topics", "delete-records", "t", "--offset", "-1")
    assert res.returncode == 1
    assert rows(res.stdout, "TOPIC PARTITION") == [
        ["t", "0", "1", "-"], ["t", "1", "-1", "UNKNOWN_SERVER_ERROR"], ["t", "2", "40", "-"]]
    assert "t-1: " in res.stderr and "delete and re-create the topic" in res.stderr


def test_a_topic_made_again_between_rounds_keeps_its_records(redis_client, namespace, topics,
                                                             monkeypatch):
    """A removal of several calls checks, in each, the creation token read when it began: the
    topic deleted and made again (same name, same partition) after the first call is another
    log, answered UNKNOWN_TOPIC_OR_PARTITION as Kafka answers for a deleted topic. The later
    calls trimmed the new topic's records before (its log start 30, of 40 fresh records)."""
    _filled(redis_client, namespace, topics, [40], value=b"x" * 1000)
    monkeypatch.setattr("rcoord.topics.admin.RETENTION_TRIM_BYTES", 5000)  # (several calls)
    made_again = []

    class Recreating(topics_base._Lua):
        def __call__(self, client: Any, keys: Any, args: Any) -> Any:
            reply = super().__call__(client, keys, args)
            if not made_again:  # (after the first call, which removed 4 records)
                topics.delete("t")
                _filled(redis_client, namespace, topics, [40], value=b"y" * 1000)
                made_again.append(int(reply[1]))
            return reply

    monkeypatch.setattr("rcoord.topics.admin.DELETE_RECORDS", Recreating("topic_delete_records"))
    assert topics.delete_records("t", {0: 30}) == {
        0: DeletedRecords(0, -1, Errors.UNKNOWN_TOPIC_OR_PARTITION)}
    assert made_again == [4]
    assert log_offsets(redis_client, namespace, "t", 0) == (0, 40)
