"""The gateway's answers where a Redis Cluster slot has no master (a master lost with no
replica to promote, under ``cluster-require-full-coverage no``): what a Kafka client is told
must say whether the request may have run."""

from __future__ import annotations

from typing import Any

from gateway_harness import (
    INIT_PRODUCER_ID_BODY,
    GatewayThread,
    call_once,
    produced_batch,
    settle_fast_groups,
)
from harness import wait_until
from test_gateway_review64_coverage import _codes, _started
from test_gateway_slot_moves import _unserved

from rcoord.errors import Errors
from rcoord.gateway.errors import NOT_LEADER_OR_FOLLOWER
from rcoord.topics import Record, Topics, partition_key
from rcoord.topics._base import meta_key
from rcoord.topics.fetch import fetch


def _produce(gw: Any, batches: dict[int, bytes]) -> dict[int, tuple[int, int]]:
    """Each partition's (error code, base offset) for a Produce of ``batches`` to topic "t"."""
    answer = call_once(gw, 0, 9, {"acks": -1, "timeout": 10000, "topic_data": [
        {"name": "t", "partition_data": [{"index": p, "records": b}
                                         for p, b in batches.items()]}]})
    return {r.index: (r.error_code.value, r.base_offset)
            for r in answer.responses[0].partition_responses}


def test_a_produce_to_a_partition_whose_slot_has_no_master_is_not_leader_or_follower(
        own_cluster, namespace):
    """An append to a partition whose slot no master serves is not sent at all (redis-py has
    no node for it), yet it was answered REQUEST_TIMED_OUT, which tells the producer the batch
    may have been written. It is NOT_LEADER_OR_FOLLOWER, as Kafka answers a partition whose
    leader it is not: the producer reads its metadata again and resends, and nothing was
    appended meanwhile. The partition served in the same request is appended; an idempotent
    resend once the slot has a master again is appended once."""
    client = own_cluster.client()
    try:
        settle_fast_groups(client, namespace)
        Topics(client, namespace).create("t", 2)
        keys = (partition_key(namespace, "t", 0), partition_key(namespace, "t", 1),
                meta_key(namespace, "t"))
        assert len({client.keyslot(k) for k in keys}) == 3
        gw = None
        try:
            with _unserved(own_cluster, keys[1]):
                gw = GatewayThread(own_cluster.url, namespace).start()
                pid = int(call_once(gw, 22, 4, INIT_PRODUCER_ID_BODY).producer_id)
                resend = {1: produced_batch([Record(0, None, b"c", {}, 0)], producer_id=pid,
                                            producer_epoch=0, base_sequence=0)}
                plain = _produce(gw, {0: produced_batch([Record(0, None, b"a", {}, 0)]),
                                      1: produced_batch([Record(0, None, b"b", {}, 0)])})
                assert plain == {0: (Errors.NONE, 0), 1: (NOT_LEADER_OR_FOLLOWER, -1)}
                assert _produce(gw, resend) == {1: (NOT_LEADER_OR_FOLLOWER, -1)}
            answers: list[dict[int, tuple[int, int]]] = []
            # (the gateway reads the slot map again at most once a second)
            wait_until(lambda: answers.append(_produce(gw, resend))
                       or answers[-1] != {1: (NOT_LEADER_OR_FOLLOWER, -1)})
        finally:
            if gw is not None:
                gw.stop()
        assert answers[-1] == {1: (Errors.NONE, 0)}
        assert [r.value for r in fetch(client, namespace, "t", 0, 0).records] == [b"a"]
        assert [r.value for r in fetch(client, namespace, "t", 1, 0).records] == [b"c"]
    finally:
        client.close()


def test_an_offset_commit_or_delete_of_only_an_unserved_topic_answers_it_by_itself(
        own_cluster, namespace):
    """An OffsetCommit naming only a topic whose metadata slot has no master failed whole,
    COORDINATOR_NOT_AVAILABLE, on which Kafka's consumer drops its coordinator and looks it up
    again (``OffsetCommitResponseHandler``), though the group's coordinator was fine; beside a
    served topic the same topic was UNKNOWN_TOPIC_OR_PARTITION, which it just retries. It is
    that here too, as Kafka answers a commit of only unknown topics without asking the
    coordinator; OffsetDelete likewise (its group's error was COORDINATOR_NOT_AVAILABLE).
    Nothing of the refused commit or delete is applied."""
    gw, group = _started(own_cluster, namespace)

    def commit(offset: int) -> Any:
        return call_once(gw, 8, 8, {
            "group_id": group, "generation_id_or_member_epoch": -1, "member_id": "",
            "topics": [{"name": "t", "partitions": [
                {"partition_index": 0, "committed_offset": offset}]}]})

    try:
        assert _codes(commit(7)) == {"t": Errors.NONE}
        with _unserved(own_cluster, meta_key(namespace, "t")):
            committed = commit(9)
            deleted = call_once(gw, 47, 0, {"group_id": group, "topics": [
                {"name": "t", "partitions": [{"partition_index": 0}]}]}, header_bytes=4)
        fetched = call_once(gw, 9, 8, {"groups": [{"group_id": group, "topics": [
            {"name": "t", "partition_indexes": [0]}]}], "require_stable": False})
    finally:
        gw.stop()
    assert _codes(committed) == {"t": Errors.UNKNOWN_TOPIC_OR_PARTITION}
    assert deleted.error_code.value == Errors.NONE
    assert _codes(deleted) == {"t": Errors.UNKNOWN_TOPIC_OR_PARTITION}
    assert fetched.groups[0].topics[0].partitions[0].committed_offset == 7
