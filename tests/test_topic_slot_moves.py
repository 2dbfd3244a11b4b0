"""Topics while a partition's slot migrates between masters (the keys moved, the owner not yet:
the source answers ``ASK`` for them), on a cluster of the module's own."""

from __future__ import annotations

import concurrent.futures

import pytest
import redis
from harness import wait_until
from test_parked_slot_moves import _Move

from rcoord import ConnectionLost, Errors
from rcoord.topics import TopicError, Topics, partition_key
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
