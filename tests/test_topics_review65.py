"""Review 65: topic admin and the idempotent producer at their edges (a DeleteRecords that Redis
stopped partway, ...)."""

from __future__ import annotations

import json
import pickle
from collections.abc import Callable
from typing import Any

import pytest
import redis
import test_cli_groups
from test_cli_groups import ok
from test_delete_records import _filled, _lose_redis_in_round
from test_topics_review64_marked import _stopped_delete

from rcoord.errors import ConnectionLost, Errors
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
from rcoord.topics.admin import DeleteRecordsIncomplete

url = test_cli_groups.url  # fixtures: the backend's URL, and the command line on it
cli = test_cli_groups.cli


@pytest.fixture
def topics(redis_client: Any, namespace: str) -> Topics:
    return Topics(redis_client, namespace)


def test_a_delete_records_redis_stops_partway_says_what_it_did(redis_client, namespace, topics,
                                                              monkeypatch):
    """Partition 0's removal is done in the first round; partition 1's, split in bounded calls,
    loses Redis in its second. The call raised a bare ConnectionLost, so its caller took the
    whole call for failed though partition 0's records were gone; Kafka's AdminClient answers
    each partition on its own. The ConnectionLost now says which partitions are done (their
    answers) and which are not, with the offset to ask again: -1 as the log end the call read,
    so that asking again keeps the records appended since."""
    _filled(redis_client, namespace, topics, [3, 40], b"x" * 1000)
    monkeypatch.setattr(topics_admin, "RETENTION_TRIM_BYTES", 5000)
    rounds = _lose_redis_in_round(monkeypatch, 2)
    with pytest.raises(DeleteRecordsIncomplete) as info:
        topics.delete_records("t", {0: 2, 1: -1})
    assert isinstance(info.value, ConnectionLost)  # (retriable, as before)
    assert "connection reset (test)" in str(info.value)
    assert info.value.done == {0: DeletedRecords(0, 2)}
    assert info.value.unfinished == {1: 40}
    assert pickle.loads(pickle.dumps(info.value)).unfinished == {1: 40}
    assert rounds == [2, 1]
    monkeypatch.setattr(topics_admin, "_run", topics_base._run)
    assert [log_offsets(redis_client, namespace, "t", p)[0] for p in range(2)] == [2, 4]
    assert topics.delete_records("t", info.value.unfinished) == {1: DeletedRecords(1, 40)}


def _second_call_refused(monkeypatch: Any, refusal: Callable[[], Any]) -> None:
    """Every script round after a send's first answers ``refusal()`` (an error kept in its
    place, as ``_run`` keeps a slot move's), or runs it when it returns None: a partition's
    records in two calls, the first stored and the second refused."""
    run, rounds = topics_base._run_independent, []

    def refused(client: Any, calls: Any, keep_errors: bool = False,
                keep_slot_moves: bool = False) -> Any:
        rounds.append(len(calls))
        if len(rounds) > 1:
            answer = refusal()
            if answer is not None:
                return [answer for _ in calls]
        return run(client, calls, keep_errors, keep_slot_moves)

    monkeypatch.setattr(topics_base, "_run_independent", refused)


def test_a_partly_stored_send_declares_lost_only_what_was_not_stored(redis_client, namespace,
                                                                     monkeypatch):
    """A send whose partition's records go in two calls: the first stored, the second refused
    (a slot move) until ``delivery_timeout_ms``. It declared its numbers lost from the first
    call's, so once the state had expired the next append marked the stored record's sequence
    of unknown outcome, and a replay under the same id and epoch was refused
    OUT_OF_ORDER_SEQUENCE_NUMBER for the record the producer had been told was stored.
    Declared lost from the refused call's first sequence, the replay is answered duplicate."""
    Topics(redis_client, namespace).create("t", 1, producer_id_expiration_ms=1000)
    now = [1_000_000]

    def producer() -> Producer:  # (each record alone in its script call)
        return Producer(redis_client, namespace, producer_id="x", clock=lambda: now[0],
                        max_request_size=10, delivery_timeout_ms=300)

    first = producer()
    first.send("t", b"a", partition=0)
    with monkeypatch.context() as m:
        _second_call_refused(m, lambda: redis.exceptions.ClusterError("TTL exhausted (test)"))
        with pytest.raises(ConnectionLost, match=r"partition 0: 1 of its 2 records were "
                                                 r"appended \(offsets 1\.\.1\)"):
            first.send_batch("t", [ProducerRecord(b"b1------", partition=0),
                                   ProducerRecord(b"b2------", partition=0)])
    now[0] += 5000  # (the producer state expired)
    assert first.send("t", b"c", partition=0).offset == 2
    replay = producer().send_batch("t", [ProducerRecord(v, partition=0) for v in (b"a", b"b1------")])
    assert [m.duplicate for m in replay] == [True, True]
    assert [r.value for r in fetch(redis_client, namespace, "t", 0, 0).records] == [
        b"a", b"b1------", b"c"]


def test_a_refusal_after_a_stored_call_says_what_was_stored(redis_client, namespace,
                                                            monkeypatch):
    """A send whose partition's records go in two calls, the second refused PRODUCER_FENCED (a
    newer epoch appended in between): the TopicError said only that it was fenced, so a
    caller took none of its records for stored, and resent under the new epoch, stored the
    first call's twice. It now says which were appended."""
    Topics(redis_client, namespace).create("t", 1)
    old = Producer(redis_client, namespace, producer_id="x", max_request_size=10)
    old.send("t", b"a", partition=0)
    newer = Producer(redis_client, namespace, producer_id="x", producer_epoch=1)
    fenced: list[int] = []

    def fence() -> None:
        if not fenced:  # (once, before its own send's rounds come here)
            fenced.append(-1)
            fenced[0] = newer.send("t", b"n", partition=0).offset

    with monkeypatch.context() as m:
        _second_call_refused(m, fence)
        with pytest.raises(TopicError) as info:
            old.send_batch("t", [ProducerRecord(b"b1------", partition=0),
                                 ProducerRecord(b"b2------", partition=0)])
    assert info.value.error == Errors.PRODUCER_FENCED
    assert str(info.value).endswith(
        "to this partition (1 of its 2 records were appended (offsets 1..1), the rest not)")
    assert fenced == [2]
    assert [r.value for r in fetch(redis_client, namespace, "t", 0, 0).records] == [
        b"a", b"b1------", b"n"]


@pytest.mark.parametrize("backend", ["single"])
def test_list_notes_a_topic_whose_delete_stopped_partway(cli, redis_client, namespace,
                                                        monkeypatch):
    """``rcoord topics list`` gave no sign of it (``describe`` did): a note on stderr now says
    so and what finishes it; stdout, which scripts parse, is unchanged."""
    _stopped_delete(redis_client, namespace, monkeypatch)
    for args, out in (([], "t\nu\n"), (["--output", "json"], None)):
        res = ok(cli("topics", "list", *args))
        if out is None:
            assert json.loads(res.stdout) == ["t", "u"]
        else:
            assert res.stdout == out
        notes = [line for line in res.stderr.splitlines() if "marked for deletion" in line]
        assert len(notes) == 1 and ": t: marked for deletion" in notes[0], res.stderr
        assert "rcoord topics delete t" in notes[0]
    ok(cli("topics", "delete", "t"))
    assert "marked for deletion" not in ok(cli("topics", "list")).stderr
