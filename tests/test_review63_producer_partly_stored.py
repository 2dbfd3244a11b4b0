"""An idempotent send whose partition's records go in several script calls, the first of
which ran before a slot move split the partition's keys and refused the others until
``delivery_timeout_ms`` ran out: the error must not say that none of that partition's
records were appended (a caller resending them would store the first call's twice)."""

from __future__ import annotations

from typing import Any

import pytest
from test_parked_slot_moves import _Move
from test_producer_slot_moves import _end, _migrate, _start, _values

from rcoord import ConnectionLost
from rcoord.topics import ProducerRecord, Topics, partition_key
from rcoord.topics.producer import Producer


def test_the_timeout_says_which_records_of_a_partly_stored_partition_were_appended(
        own_cluster, namespace, monkeypatch):
    from rcoord.topics import _base

    client = own_cluster.client(socket_timeout=30)
    Topics(client, namespace).create("t", 1)
    stream = partition_key(namespace, "t", 0)
    # (each record alone in its script call: two calls of p0, sent one after the other)
    producer = Producer(client, namespace, delivery_timeout_ms=300, max_request_size=10)
    producer.send("t", b"a", partition=0)
    move = _Move(own_cluster, client, stream)
    run = _base._run_independent
    rounds: list[int] = []

    def moving_after_the_first(*args: Any, **kwargs: Any) -> Any:
        got = run(*args, **kwargs)
        rounds.append(1)
        if len(rounds) == 1:  # (the move begins between p0's two calls)
            _start(move)
            _migrate(move, [stream])
        return got

    try:
        monkeypatch.setattr(_base, "_run_independent", moving_after_the_first)
        with pytest.raises(ConnectionLost) as lost:
            producer.send_batch("t", [ProducerRecord(b"b1------", partition=0),
                                      ProducerRecord(b"b2------", partition=0)])
        monkeypatch.setattr(_base, "_run_independent", run)
        message = str(lost.value)
        assert "this call's records to those partitions were not appended" not in message
        assert "partition 0: 1 of its 2 records were appended (offsets 1..1)" in message
        move.keys()
        move.owner()
        assert _values(client, namespace, 0) == [b"a", b"b1------"]
        assert producer.send("t", b"c", partition=0).offset == 2  # (no gap, no duplicate)
        assert _values(client, namespace, 0) == [b"a", b"b1------", b"c"]
    finally:
        _end(move)
        client.close()


def test_the_timeout_names_the_partitions_refused_in_the_same_call(own_cluster, namespace):
    """A send_batch to a moving partition (p0) and one that refused its records (p1: the
    producer is fenced there) timed out: the ConnectionLost said p0's records were not
    appended and nothing of p1's, whose refusal (PRODUCER_FENCED) went unreported, so a
    caller resending what was "not appended" dropped p1's records without knowing it."""
    client = own_cluster.client(socket_timeout=30)
    Topics(client, namespace).create("t", 2)
    stream = partition_key(namespace, "t", 0)
    producer = Producer(client, namespace, producer_id="x", delivery_timeout_ms=300)
    producer.send_batch("t", [ProducerRecord(b"a", partition=0), ProducerRecord(b"b", partition=1)])
    Producer(client, namespace, producer_id="x", producer_epoch=1).send("t", b"c", partition=1)
    move = _Move(own_cluster, client, stream)
    assert client.keyslot(partition_key(namespace, "t", 1)) != move.slot
    try:
        _start(move)
        _migrate(move, [stream])
        with pytest.raises(ConnectionLost) as lost:
            producer.send_batch("t", [ProducerRecord(b"d", partition=0),
                                      ProducerRecord(b"e", partition=1)])
        message = str(lost.value)
        assert message.startswith("t partition(s) [0]: a slot move or failover refused")
        assert "; partition 1 refused its records (PRODUCER_FENCED: " in message
        move.keys()
        move.owner()
        assert _values(client, namespace, 0) == [b"a"]
        assert _values(client, namespace, 1) == [b"b", b"c"]
    finally:
        _end(move)
        client.close()
