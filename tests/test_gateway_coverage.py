"""The gateway while one partition's slot is served by no master (a master lost with no replica
to promote, under ``cluster-require-full-coverage no``): it starts, and serves the other
partitions, as Kafka keeps serving the partitions whose leaders are up; the unserved one is
answered with a code Kafka clients retry. On a cluster of the module's own."""

from __future__ import annotations

from typing import Any

import pytest
from gateway_harness import (
    GatewayThread,
    call_once,
    connect,
    fetch_body,
    fetched_records,
    produced_batch,
    request_frame,
    response,
    settle_fast_groups,
)
from harness import blocked_xreads, wait_until
from test_gateway_slot_moves import _unserved

from rcoord.errors import Errors
from rcoord.gateway.errors import NOT_LEADER_OR_FOLLOWER
from rcoord.topics import Producer, Record, Topics, partition_key
from rcoord.topics._base import meta_key


def _produce(gw: GatewayThread, partitions: list[int]) -> dict[int, int]:
    answer = call_once(gw, 0, 9, {"acks": -1, "timeout": 10000, "topic_data": [
        {"name": "t", "partition_data": [
            {"index": p, "records": produced_batch([Record(0, None, b"v%d" % p, {}, 0)])}
            for p in partitions]}]})
    return {r.index: r.error_code.value for r in answer.responses[0].partition_responses}


def _fetch(gw: GatewayThread, partitions: list[int]) -> dict[int, Any]:
    answer = call_once(gw, 1, 12, fetch_body("t", partitions, 0))
    return {p.partition_index: p for p in answer.responses[0].partitions}


def test_the_gateway_starts_and_serves_the_covered_partitions(own_cluster, namespace):
    """The gateway's cluster clients kept redis-py's ``require_full_coverage=True``, which
    refused to start them while any slot was unserved ("All slots are not covered"): no Kafka
    client could reach any partition or group through a gateway started then, nor through one
    whose client refreshed its topology (a failover) meanwhile. Partition 0 is produced to and
    fetched from; partition 1, whose slot has no master, is answered NOT_LEADER_OR_FOLLOWER
    to a Produce (not sent, so certainly not appended) and to a Fetch, which Kafka's producer
    and consumer retry."""
    client = own_cluster.client()
    try:
        settle_fast_groups(client, namespace)
        Topics(client, namespace).create("t", 2)
        slots = {client.keyslot(k) for k in (partition_key(namespace, "t", 0),
                                             partition_key(namespace, "t", 1),
                                             meta_key(namespace, "t"))}
        assert len(slots) == 3
    finally:
        client.close()
    with _unserved(own_cluster, partition_key(namespace, "t", 1)):
        gw = GatewayThread(own_cluster.url, namespace).start()
        try:
            meta = call_once(gw, 3, 9, {"topics": [{"name": "t"}],
                                        "allow_auto_topic_creation": False})
            assert meta.topics[0].error_code.value == Errors.NONE
            assert len(meta.topics[0].partitions) == 2
            assert _produce(gw, [0]) == {0: Errors.NONE}
            assert _produce(gw, [1]) == {1: NOT_LEADER_OR_FOLLOWER}
            fetched = _fetch(gw, [0])
            assert fetched[0].error_code.value == Errors.NONE
            assert fetched[0].high_watermark == 1
            assert _fetch(gw, [1])[1].error_code.value == NOT_LEADER_OR_FOLLOWER
        finally:
            gw.stop()


def _started(cluster: Any, namespace: str) -> GatewayThread:
    """A gateway over ``cluster`` for topic "t" (2 partitions, made now)."""
    client = cluster.client()
    try:
        settle_fast_groups(client, namespace)
        Topics(client, namespace).create("t", 2)
        Producer(client, namespace, idempotent=False).send("t", b"a", partition=0)
    finally:
        client.close()
    return GatewayThread(cluster.url, namespace).start()


def test_a_fetch_of_a_covered_and_an_unserved_partition_answers_each_its_own(own_cluster,
                                                                            namespace):
    """A consumer fetches all its partitions from the one broker the gateway is, in one
    Fetch. One partition's slot unserved failed the whole Fetch, every partition
    NOT_LEADER_OR_FOLLOWER, so the consumer made no progress on any partition for as long as
    one slot was down. As Kafka answers by partition, the covered partition sends its records
    and only the unserved one is NOT_LEADER_OR_FOLLOWER."""
    gw = _started(own_cluster, namespace)
    try:
        with _unserved(own_cluster, partition_key(namespace, "t", 1)):
            fetched = _fetch(gw, [0, 1])
    finally:
        gw.stop()
    assert fetched[0].error_code.value == Errors.NONE
    assert (fetched[0].high_watermark, len(fetched_records(bytes(fetched[0].records)))) == (1, 1)
    assert fetched[1].error_code.value == NOT_LEADER_OR_FOLLOWER
    assert (fetched[1].high_watermark, fetched[1].log_start_offset) == (-1, -1)


def test_a_parked_fetch_beside_an_unserved_partition_waits_for_the_covered_ones(own_cluster,
                                                                                namespace):
    """The unserved partition does not end the wait on the others: a record produced to a
    covered partition while the Fetch waits is what answers it."""
    gw = _started(own_cluster, namespace)
    client, nodes = own_cluster.client(), own_cluster.node_clients()
    try:
        with _unserved(own_cluster, partition_key(namespace, "t", 1)):
            sock = connect(gw)
            try:
                sock.sendall(request_frame(1, 12, 1, fetch_body("t", (0, 1), 1, 60_000)))
                wait_until(lambda: any(blocked_xreads(n) for n in nodes))
                Producer(client, namespace, idempotent=False).send("t", b"b", partition=0)
                answer = response(sock, 1, 12, 5)
            finally:
                sock.close()
    finally:
        for node in nodes:
            node.close()
        client.close()
        gw.stop()
    parts = {p.partition_index: p for p in answer.responses[0].partitions}
    assert [r.value for r in fetched_records(bytes(parts[0].records))] == [b"b"]
    assert parts[1].error_code.value == NOT_LEADER_OR_FOLLOWER


def test_list_offsets_of_a_covered_and_an_unserved_partition_answers_each_its_own(
        own_cluster, namespace):
    """ListOffsets (a consumer's offset reset) failed whole likewise; the covered partition
    is answered its offset, the unserved one NOT_LEADER_OR_FOLLOWER."""
    gw = _started(own_cluster, namespace)
    try:
        with _unserved(own_cluster, partition_key(namespace, "t", 1)):
            listed = call_once(gw, 2, 7, {"replica_id": -1, "isolation_level": 0, "topics": [
                {"name": "t", "partitions": [{"partition_index": p, "timestamp": -1}
                                             for p in (0, 1)]}]})
    finally:
        gw.stop()
    parts = {p.partition_index: p for p in listed.topics[0].partitions}
    assert (parts[0].error_code.value, parts[0].offset) == (Errors.NONE, 1)
    assert (parts[1].error_code.value, parts[1].offset) == (NOT_LEADER_OR_FOLLOWER, -1)


def test_a_group_whose_slot_is_unserved_is_retriable_and_others_are_served(own_cluster,
                                                                           namespace):
    """Groups are served by the gateway's asyncio cluster client, whose redis-py slot lookup
    raised KeyError for a slot no master serves once it no longer required full coverage:
    answered UNKNOWN_SERVER_ERROR. A commit to the group on that slot is
    COORDINATOR_NOT_AVAILABLE (retried by Kafka clients); another group's is stored."""
    from rcoord import CoordinatorConfig
    from rcoord.keys import GroupKeys

    gw = _started(own_cluster, namespace)
    probe = own_cluster.client()
    try:
        n = CoordinatorConfig(namespace=namespace).num_partitions
        down = GroupKeys.of(namespace, n, "g").group
        other = next(g for g in (f"h{i}" for i in range(1000))
                     if probe.keyslot(GroupKeys.of(namespace, n, g).group)
                     != probe.keyslot(down))

        def commit(group: str) -> int:
            answer = call_once(gw, 8, 8, {
                "group_id": group, "generation_id_or_member_epoch": -1, "member_id": "",
                "topics": [{"name": "t", "partitions": [
                    {"partition_index": 0, "committed_offset": 1}]}]})
            return int(answer.topics[0].partitions[0].error_code.value)

        with _unserved(own_cluster, down):
            assert commit("g") == Errors.COORDINATOR_NOT_AVAILABLE
            assert commit(other) == Errors.NONE
    finally:
        probe.close()
        gw.stop()


def test_metadata_answers_a_topic_whose_slot_is_unserved_by_itself(own_cluster, namespace):
    """Metadata reads each topic's partition count on the topic's slot. One topic's slot
    unserved failed the whole request: every topic named LEADER_NOT_AVAILABLE (a producer
    could send to none of them). As Kafka answers by topic, that topic alone is
    LEADER_NOT_AVAILABLE; the others are described. A Metadata for all topics lists them
    first (a SCAN of every master), which is refused while a slot has no master
    (``connect.refuse_partial_listing``: the topics lost with that master would be left out
    without a word, and a pattern subscription would drop them): the request fails, as it did
    before the clients stopped requiring full coverage, and its client asks again."""
    from rcoord.gateway.errors import LEADER_NOT_AVAILABLE

    gw = _started(own_cluster, namespace)
    probe = own_cluster.client()
    try:
        Topics(probe, namespace).create("u", 1)
        assert probe.keyslot(meta_key(namespace, "t")) != probe.keyslot(meta_key(namespace, "u"))
        with _unserved(own_cluster, meta_key(namespace, "t")):
            named = call_once(gw, 3, 9, {"topics": [{"name": "t"}, {"name": "u"}],
                                         "allow_auto_topic_creation": False})
            with pytest.raises(ConnectionError, match="closed"):
                call_once(gw, 3, 9, {"topics": None, "allow_auto_topic_creation": False})
        every = call_once(gw, 3, 9, {"topics": None, "allow_auto_topic_creation": False})
    finally:
        probe.close()
        gw.stop()
    by_name = {t.name: t for t in named.topics}
    assert (by_name["t"].error_code.value, by_name["t"].partitions) == (
        LEADER_NOT_AVAILABLE, ())
    assert by_name["u"].error_code.value == Errors.NONE
    assert len(by_name["u"].partitions) == 1
    assert {t.name for t in every.topics} >= {"t", "u"}
