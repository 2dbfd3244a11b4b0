"""Review 66: a DeleteRecords that loses Redis in its first round, after a partition asked at -1
was trimmed in that round: ``DeleteRecordsIncomplete`` says (its docstring) that a -1 it carries
is already the log end the call read, but in the first round it is the caller's -1, and the
gateway's retry trims to the log end of the retry, removing the records appended since."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

pytest.importorskip("kio")

import redis
from gateway_harness import call_once

from rcoord.errors import Errors
from rcoord.topics import Producer, ProducerRecord, log_offsets
from rcoord.topics import admin as topics_admin


def _three_and_four_records(client: Any, ns: str, topics: Any) -> Producer:
    """Topic t of two partitions holding 3 and 4 records; a producer on ``client``, to append
    more in the middle of a call."""
    topics.create("t", 2)
    producer = Producer(client, ns, idempotent=False)
    producer.send_batch("t", [ProducerRecord(b"x", partition=p)
                              for p, n in ((0, 3), (1, 4)) for _ in range(n)])
    return producer


def _first_round_runs_partition_0_alone(monkeypatch: Any, ends: Callable[[Any], list[Any]],
                                        producer: Producer | None = None) -> list[int]:
    """Make ``delete_records``' first round run partition 0's call alone, then (``producer``)
    append 5 records to partition 0, then end as ``ends(partition 0's result)`` returns or
    raises; later rounds run as they are. The list returned gets each round's number of
    calls (calls are in partition order)."""
    real, rounds = topics_admin._run, []

    def first_round(redis_client: Any, calls: Any, **kwargs: Any) -> Any:
        rounds.append(len(calls))
        if len(rounds) > 1:
            return real(redis_client, calls, **kwargs)
        (first,) = real(redis_client, calls[:1], **kwargs)
        if producer is not None:
            producer.send_batch("t", [ProducerRecord(b"y", partition=0) for _ in range(5)])
        return ends(first)

    monkeypatch.setattr(topics_admin, "_run", first_round)
    return rounds


def _gateway_deletes_0_at_minus_one_and_1_at_2(gateway: Any) -> dict[Any, Any]:
    """The gateway's DeleteRecords (v2) of t-0 at -1 and t-1 at 2: (error, low watermark) of
    each."""
    topics_body = {"timeout_ms": 5000, "topics": [{"name": "t", "partitions": [
        {"partition_index": 0, "offset": -1}, {"partition_index": 1, "offset": 2}]}]}
    answer = call_once(gateway, 21, 2, topics_body, 5).topics
    return {(t.name, p.partition_index): (p.error_code.value, p.low_watermark)
            for t in answer for p in t.partitions}


def _partition_1_read_only(first: Any) -> list[Any]:
    return [first, redis.exceptions.ReadOnlyError(
        "You can't write against a read only replica. (test)")]


def test_a_partition_done_in_the_round_that_failed_is_not_asked_again_at_minus_one(
        gateway, redis_server, topics, monkeypatch):
    # Partition 0 (asked at -1, its log end 3) is trimmed in the first round; partition 1's
    # call in that same round is refused READONLY (its node demoted). Then 5 records are
    # appended to partition 0. DeleteRecordsIncomplete should carry partition 0 as done (low
    # watermark 3) and only partition 1 to ask again; the gateway then keeps the 5 records.
    ns = gateway.config.namespace
    client = redis_server.client()
    try:
        producer = _three_and_four_records(client, ns, topics)
        _first_round_runs_partition_0_alone(monkeypatch, _partition_1_read_only, producer)
        got = _gateway_deletes_0_at_minus_one_and_1_at_2(gateway)
        assert got == {("t", 0): (Errors.NONE, 3), ("t", 1): (Errors.NONE, 2)}
        # The 5 records appended to partition 0 after its removal are still there.
        assert [log_offsets(client, ns, "t", p) for p in range(2)] == [(3, 8), (2, 4)]
    finally:
        client.close()


def test_delete_records_incomplete_names_a_partition_either_done_or_to_ask_again(
        redis_client, namespace, monkeypatch):
    # The same failure at the Topics level: partition 0 is both in ``done`` and, at its -1, in
    # ``unfinished`` (a caller asking again re-resolves -1 to a later log end).
    topics = topics_admin.Topics(redis_client, namespace)
    _three_and_four_records(redis_client, namespace, topics)
    _first_round_runs_partition_0_alone(monkeypatch, _partition_1_read_only)
    with pytest.raises(topics_admin.DeleteRecordsIncomplete) as info:
        topics.delete_records("t", {0: -1, 1: 2})
    assert info.value.done == {0: topics_admin.DeletedRecords(0, 3)}
    assert set(info.value.done).isdisjoint(info.value.unfinished), info.value.unfinished
    assert info.value.unfinished == {1: 2}


def test_a_pipeline_lost_in_the_first_round_after_a_removal_at_minus_one_keeps_later_records(
        gateway, redis_server, topics, monkeypatch):
    # The same through the branch where the round's pipeline raises (a cluster pipeline whose
    # other node's connection dropped, after partition 0's node ran its call): partition 0 is
    # left unfinished at -1, not at the log end (3) the call had resolved and trimmed to.
    ns = gateway.config.namespace

    def lost(first: Any) -> list[Any]:
        raise redis.exceptions.ConnectionError("connection reset (test)")

    client = redis_server.client()
    try:
        producer = _three_and_four_records(client, ns, topics)
        rounds = _first_round_runs_partition_0_alone(monkeypatch, lost, producer)
        got = _gateway_deletes_0_at_minus_one_and_1_at_2(gateway)
        assert rounds[0] == 2
        # The records appended to partition 0 after the removal it asked for are kept.
        assert log_offsets(client, ns, "t", 0) == (3, 8), got
    finally:
        client.close()
