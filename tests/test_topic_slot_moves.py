"""Topics while a partition's slot migrates between masters (the keys moved, the owner not yet:
the source answers ``ASK`` for them), on a cluster of the module's own."""

from __future__ import annotations

import concurrent.futures
from typing import Any

import pytest
import redis
from harness import wait_until
from test_parked_slot_moves import _Move

from rcoord import ConnectionLost, Errors
from rcoord.topics import TopicError, Topics, partition_key
from rcoord.topics._base import last_timestamp_key
from rcoord.topics.fetch import FetchWaker, fetch, fetch_many
from rcoord.topics.producer import Producer


def _blocked(node: redis.Redis) -> int:
    return int(node.info("clients")["blocked_clients"])


def test_a_wakeable_fetch_at_the_log_end_waits_on_the_importing_master(own_cluster, namespace):
    """The parked read follows the source's ``ASK`` to the importing master (with ``ASKING``)
    and waits there for the next record; it used to return at once, over and over."""
    client = own_cluster.client(socket_timeout=30)
    Topics(client, namespace).create("t", 1)
    producer = Producer(client, namespace, idempotent=False)
    producer.send("t", b"a", partition=0)
    move = _Move(own_cluster, client, partition_key(namespace, "t", 0))
    pool = concurrent.futures.ThreadPoolExecutor(1)
    try:
        move.keys()
        parked = pool.submit(fetch, client, namespace, "t", 0, 1, block_ms=20_000,
                             waker=FetchWaker())
        wait_until(lambda: _blocked(move.nodes[move.dst]) == 1 or parked.done())
        assert not parked.done(), parked.result()
        move.owner()
        producer.send("t", b"b", partition=0)
        result = parked.result(30)
        assert [(r.offset, r.value) for r in result.records] == [(1, b"b")]
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
        move.close()
        client.close()


def _start_move(move: _Move) -> None:
    """The slot of ``move.key`` migrating (no keys in it to move yet)."""
    src, dst = move.nodes[move.src], move.nodes[move.dst]
    dst.execute_command("CLUSTER", "SETSLOT", move.slot, "IMPORTING", move.ids[move.src])
    src.execute_command("CLUSTER", "SETSLOT", move.slot, "MIGRATING", move.ids[move.dst])


def test_create_again_finishes_a_topic_whose_partition_a_slot_move_refused(own_cluster,
                                                                           namespace):
    """A partition whose slot migrates cannot be made (its script's keys are split between
    the masters: TRYAGAIN until redis-py gives up), so ``create`` raises ConnectionLost after
    its claim; the retry answers TOPIC_ALREADY_EXISTS, as Kafka's does once the first went
    through, and makes the missing partition, where the topic used to stay without it."""
    client = own_cluster.client(socket_timeout=30)
    topics = Topics(client, namespace)
    move = _Move(own_cluster, client, partition_key(namespace, "t", 1))
    try:
        _start_move(move)
        with pytest.raises(ConnectionLost):
            topics.create("t", 2)
        move.owner()
        with pytest.raises(TopicError) as exc:
            topics.create("t", 2)
        assert exc.value.error == Errors.TOPIC_ALREADY_EXISTS
        assert [p.error for p in topics.describe("t").partitions] == [Errors.NONE] * 2
        sent = Producer(client, namespace, idempotent=False).send("t", b"v", partition=1)
        assert sent.offset == 0
    finally:
        move.close()
        client.close()


def test_a_partition_with_no_records_is_read_while_its_slot_moves(own_cluster, namespace):
    """A partition's log offsets are read with its last-record mark named beside its stream,
    and a migrating slot answers a command on two keys, one of them missing, TRYAGAIN: the
    mark of a partition with no records did not exist, so for as long as its slot moved a
    fetch of it raised ConnectionLost ("slot unavailable"), for every partition read with it
    too, as Kafka's fetch answers a partition that moves with an error for it alone. A new
    partition's mark now exists from the start and moves with the stream: it is read, empty,
    before its keys move, after, and once the slot is the other master's."""
    client = own_cluster.client(socket_timeout=30)
    Topics(client, namespace).create("t", 2)
    Producer(client, namespace, idempotent=False).send("t", b"a", partition=1)
    move = _Move(own_cluster, client, partition_key(namespace, "t", 0))
    reads = [("t", 0, 0), ("t", 1, 0)]
    try:
        for step in (_start_move, _Move.keys, _Move.owner):
            step(move)
            got = fetch_many(client, namespace, reads)
            assert [(a.error, a.log_end_offset, [r.value for r in a.records]) for a in got] == [
                (Errors.NONE, 0, []), (Errors.NONE, 1, [b"a"])]
            assert fetch(client, namespace, "t", 0, 0).log_end_offset == 0
        assert Producer(client, namespace, idempotent=False).send(
            "t", b"b", partition=0).offset == 0
    finally:
        move.close()
        client.close()


def _made_by_an_older_rcoord(client: Any, namespace: str, topic: str, partition: int) -> None:
    """A partition as an rcoord before 2cb33a6 made it: no last-record key until its first
    append."""
    client.delete(last_timestamp_key(namespace, topic, partition))


def _mend(client: Any, namespace: str) -> None:
    """The one-off repair docs/operations.md gives ("Rolling upgrades"), as written there."""
    topics = Topics(client, namespace)
    for topic in topics.list():
        for p in topics.describe(topic).partitions:
            if p.error.name == "NONE" and p.log_end_offset == 0:  # never appended to
                client.set(last_timestamp_key(namespace, topic, p.partition), "0 0", nx=True)


def test_the_mend_of_an_older_partition_with_no_records_keeps_it_read_while_its_slot_moves(
        own_cluster, namespace):
    """A partition an older rcoord made and nothing was appended to has no last-record key, so
    while its slot moves every read of it fails ConnectionLost (TRYAGAIN), and a fetch of the
    partitions read with it too. After docs/operations.md's repair (which leaves the key a
    partition with records has alone) it is read through the move, and appended to after."""
    client = own_cluster.client(socket_timeout=30)
    Topics(client, namespace).create("t", 2)
    Topics(client, namespace).create("u", 1)
    Producer(client, namespace, idempotent=False).send("t", b"a", partition=1)
    for topic, partition in (("t", 0), ("u", 0)):
        _made_by_an_older_rcoord(client, namespace, topic, partition)
    had = client.get(last_timestamp_key(namespace, "t", 1))
    reads = [("t", 0, 0), ("t", 1, 0)]
    unmended = _Move(own_cluster, client, partition_key(namespace, "u", 0))
    move = _Move(own_cluster, client, partition_key(namespace, "t", 0))
    try:
        _start_move(unmended)
        with pytest.raises(ConnectionLost):
            fetch_many(client, namespace, [("u", 0, 0)])
        unmended.owner()
        _mend(client, namespace)
        assert client.get(last_timestamp_key(namespace, "t", 1)) == had
        for step in (_start_move, _Move.keys, _Move.owner):
            step(move)
            got = fetch_many(client, namespace, reads)
            assert [(a.error, a.log_end_offset, [r.value for r in a.records]) for a in got] == [
                (Errors.NONE, 0, []), (Errors.NONE, 1, [b"a"])]
        assert Producer(client, namespace, idempotent=False).send(
            "t", b"b", partition=0).offset == 0
    finally:
        unmended.close()
        move.close()
        client.close()
