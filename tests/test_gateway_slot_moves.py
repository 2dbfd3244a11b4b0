"""The gateway's answers while Redis briefly cannot run a call (a failover, a slot not served):
each must be an error code a Kafka client retries without telling the application, never
UNKNOWN_SERVER_ERROR, which Kafka's consumer raises from ``poll()`` for an OffsetFetch
("Unexpected error in fetch offset response") and its producer takes as fatal for an
InitProducerId."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from gateway_harness import (
    INIT_PRODUCER_ID_BODY,
    call_once,
    connect,
    demoted,
    produced_batch,
    request_frame,
    response,
    running_gateway,
    topics_of,
)
from harness import blocked_xreads, wait_until

from rcoord.errors import Errors
from rcoord.gateway.errors import NOT_LEADER_OR_FOLLOWER
from rcoord.topics._base import meta_key


def test_a_parked_fetch_ended_by_a_failover_is_answered_retriable(own_server, namespace,
                                                                  refused_port):
    """A master turned replica (a failover; here ``REPLICAOF``) ends every blocked ``XREAD``
    with ``UNBLOCKED``, the wait of a parked Fetch among them. That reply escaped the Fetch's
    wait untranslated, and the Fetch was answered UNKNOWN_SERVER_ERROR (with a traceback in
    the gateway's log; below v7, on each partition, which kafka-python raises from
    ``poll()``); it is answered NOT_LEADER_OR_FOLLOWER, as any Fetch that found Redis unable
    to serve it."""
    with topics_of(own_server, namespace) as topics:
        topics.create("idle", 1)
    admin = own_server.client()
    try:
        with running_gateway(own_server, namespace) as gw, contextlib.closing(connect(gw)) as sock:
            sock.sendall(request_frame(1, 12, 1, {
                "replica_id": -1, "max_wait": 0x7FFFFFFF, "min_bytes": 1, "max_bytes": 1 << 20,
                "topics": [{"topic": "idle", "partitions": [
                    {"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1 << 20}]}]}))
            wait_until(lambda: blocked_xreads(admin) > 0)
            with demoted(admin, refused_port):
                fetched = response(sock, 1, 12, 5)
            part = fetched.responses[0].partitions[0]
            assert (fetched.error_code.value, part.error_code.value) == (
                NOT_LEADER_OR_FOLLOWER, NOT_LEADER_OR_FOLLOWER)
    finally:
        admin.close()



@contextlib.contextmanager
def _unserved(cluster, key: str) -> Iterator[None]:
    """``key``'s slot served by no master while the block runs (a master lost with no replica
    to promote, under ``cluster-require-full-coverage no``: the other slots are still served),
    then by its owner again, on every node."""
    client = cluster.client()
    nodes = {p: n for p, n in zip(cluster.ports, cluster.node_clients(), strict=True)}
    try:
        slot, owner = client.keyslot(key), int(client.get_node_from_key(key).port)
        owner_id = nodes[owner].execute_command("CLUSTER", "MYID")
        for node in nodes.values():
            node.config_set("cluster-require-full-coverage", "no")
            node.execute_command("CLUSTER", "DELSLOTS", slot)
        try:
            yield
        finally:
            for node in nodes.values():
                node.execute_command("CLUSTER", "SETSLOT", slot, "NODE", owner_id)
            wait_until(lambda: all(n.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot) >= 0
                                   for n in nodes.values()))
    finally:
        for node in nodes.values():
            node.close()
        client.close()


def test_offset_fetch_while_a_topics_slot_is_not_served_is_retriable(own_cluster, namespace):
    """OffsetFetch reads the creation time of each topic with a commit (a commit older than
    its topic is a deleted topic's: ``rcoord.topics.incarnation``), on the topic's slot. That
    read went through no rcoord boundary: a slot not served (CLUSTERDOWN, then redis-py's
    SlotNotCoveredError) failed the request UNKNOWN_SERVER_ERROR, which Kafka's consumer
    raises from ``poll()`` ("Unexpected error in fetch offset response"). It is answered
    COORDINATOR_NOT_AVAILABLE, as when the group's own read fails so, which clients retry."""
    with topics_of(own_cluster, namespace) as topics:
        topics.create("t", 1)
    with running_gateway(own_cluster, namespace) as gw:
        committed = call_once(gw, 8, 8, {
            "group_id": "g", "generation_id_or_member_epoch": -1, "member_id": "",
            "topics": [{"name": "t", "partitions": [
                {"partition_index": 0, "committed_offset": 5}]}]})
        assert committed.topics[0].partitions[0].error_code.value == 0
        asked = {"groups": [{"group_id": "g", "topics": [
            {"name": "t", "partition_indexes": [0]}]}]}
        with _unserved(own_cluster, meta_key(namespace, "t")):
            during = call_once(gw, 9, 8, asked)
        after = call_once(gw, 9, 8, asked)
    assert during.groups[0].error_code.value == Errors.COORDINATOR_NOT_AVAILABLE
    assert after.groups[0].topics[0].partitions[0].committed_offset == 5


def test_an_idempotent_produce_through_split_keys_is_retriable_and_appended_once(own_cluster,
                                                                                 namespace):
    """While a partition's keys are split between two masters, an append is refused
    (TRYAGAIN, then redis-py's "TTL exhausted"): the gateway answers NOT_LEADER_OR_FOLLOWER
    (nothing was stored: tests/test_gateway_tryagain69.py), which a Kafka producer retries
    with the same producer id, epoch and sequence; once the move is over, that resend is
    appended once, and a second resend is answered as the duplicate it is, with the first's
    offset."""
    from test_parked_slot_moves import _Move
    from test_producer_slot_moves import _end, _migrate, _start

    from rcoord.topics import Record, partition_key
    from rcoord.topics.fetch import fetch

    with topics_of(own_cluster, namespace) as topics:
        topics.create("t", 1)
    client = own_cluster.client()
    stream = partition_key(namespace, "t", 0)
    move = _Move(own_cluster, client, stream)
    try:
        with running_gateway(own_cluster, namespace) as gw, \
                contextlib.closing(connect(gw)) as sock:
            corr = iter(range(1, 100))

            def call(api_key: int, version: int, body: dict) -> object:
                sock.sendall(request_frame(api_key, version, next(corr), body))
                return response(sock, api_key, version, 5)

            def produce(seq: int, value: bytes) -> object:
                batch = produced_batch([Record(0, None, value, {}, 0)], producer_id=pid,
                                       producer_epoch=0, base_sequence=seq)
                answer = call(0, 9, {"acks": -1, "timeout": 10000, "topic_data": [
                    {"name": "t", "partition_data": [{"index": 0, "records": batch}]}]})
                return answer.responses[0].partition_responses[0]

            init = call(22, 4, INIT_PRODUCER_ID_BODY)
            pid = int(init.producer_id)
            assert produce(0, b"a").error_code.value == 0  # (the producer's state exists)
            _start(move)
            _migrate(move, [stream])  # the stream moved, the producer state not yet
            refused = produce(1, b"b")
            assert refused.error_code.value == NOT_LEADER_OR_FOLLOWER
            move.keys()  # the rest of the move
            move.owner()
            resent = produce(1, b"b")
            again = produce(1, b"b")
            assert (resent.error_code.value, resent.base_offset) == (0, 1)
            assert (again.error_code.value, again.base_offset) == (0, 1)
        values = [r.value for r in fetch(client, namespace, "t", 0, 0).records]
        assert values == [b"a", b"b"]
    finally:
        _end(move)
        client.close()


def test_init_producer_id_while_redis_refuses_writes_is_retriable(own_server, namespace,
                                                                  refused_port):
    """InitProducerId allocates the producer id in Redis. A master that cannot run it (a
    failover demoted it: READONLY; or unreachable) answered UNKNOWN_SERVER_ERROR, which Kafka's
    producer (``TransactionManager.InitProducerIdHandler``) and kafka-python take as a fatal
    error: the producer cannot send again. It is COORDINATOR_LOAD_IN_PROGRESS, what Kafka's
    ``ProducerIdManager`` answers while it cannot hand out an id, which they retry."""
    with topics_of(own_server, namespace) as topics:
        topics.create("t", 1)
    admin = own_server.client()
    try:
        with running_gateway(own_server, namespace) as gw:
            with demoted(admin, refused_port):
                during = call_once(gw, 22, 4, INIT_PRODUCER_ID_BODY)
            after = call_once(gw, 22, 4, INIT_PRODUCER_ID_BODY)
    finally:
        admin.close()
    assert during.error_code.value == Errors.COORDINATOR_LOAD_IN_PROGRESS
    assert after.error_code.value == 0 and after.producer_id >= 0


def test_an_offset_commit_through_split_group_keys_is_retriable(own_cluster, namespace):
    """While a group's keys are split between two masters its commit cannot run (TRYAGAIN,
    then redis-py's "TTL exhausted"): the partitions are answered COORDINATOR_NOT_AVAILABLE,
    which Kafka's consumer retries (a commitSync until its timeout), and the commit resent
    after the move is stored."""
    from test_parked_slot_moves import _Move
    from test_producer_slot_moves import _end, _migrate, _start

    from rcoord.keys import GroupKeys

    with topics_of(own_cluster, namespace) as topics:
        topics.create("t", 1)
    client = own_cluster.client()
    move = None
    try:
        with running_gateway(own_cluster, namespace) as gw:
            assert gw.gateway is not None
            parts = gw.gateway.state.coordinator.config.num_partitions
            keys = GroupKeys.of(namespace, parts, "g")

            def commit(offset: int) -> int:
                answer = call_once(gw, 8, 8, {
                    "group_id": "g", "generation_id_or_member_epoch": -1, "member_id": "",
                    "topics": [{"name": "t", "partitions": [
                        {"partition_index": 0, "committed_offset": offset}]}]})
                return int(answer.topics[0].partitions[0].error_code.value)

            assert commit(1) == 0  # (the group's offsets exist)
            move = _Move(own_cluster, client, keys.offsets)
            _start(move)
            _migrate(move, [keys.offsets])  # the offsets moved, the group's other keys not
            assert commit(2) == Errors.COORDINATOR_NOT_AVAILABLE
            move.keys()
            move.owner()
            assert commit(2) == 0
            fetched = call_once(gw, 9, 8, {"groups": [{"group_id": "g", "topics": [
                {"name": "t", "partition_indexes": [0]}]}]})
        assert fetched.groups[0].topics[0].partitions[0].committed_offset == 2
    finally:
        if move is not None:
            _end(move)
        client.close()
