"""Topics while a partition's slot migrates between masters (the keys moved, the owner not yet:
the source answers ``ASK`` for them), on a cluster of the module's own."""

from __future__ import annotations

import concurrent.futures

import redis
from harness import wait_until
from test_parked_slot_moves import _Move

from rcoord.topics import Topics, partition_key
from rcoord.topics.fetch import FetchWaker, fetch
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
