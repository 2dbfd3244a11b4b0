"""Admin calls a slot move refused unrun (``TRYAGAIN`` until redis-py's "TTL exhausted":
``rcoord.connect.refused_unrun``). A DeleteRecords partition so refused is answered
NOT_LEADER_OR_FOLLOWER, as Kafka's ``ReplicaManager.deleteRecords`` answers a partition whose
leader moved: kafka-python's AdminClient asks it again with fresh metadata until its timeout,
where it raised REQUEST_TIMED_OUT at once. One an attempt of which lost its connection stays
REQUEST_TIMED_OUT. An AlterConfigs whose write may have run is not answered "nothing was
changed"."""

from __future__ import annotations

from typing import Any

import redis
from gateway_harness import call_once, running_gateway
from test_gateway_tryagain69 import _LostOnce, _split
from test_producer_slot_moves import _migrate, _split_p0, _start

from rcoord.errors import Errors
from rcoord.gateway.errors import NOT_LEADER_OR_FOLLOWER
from rcoord.topics import Producer, log_offsets

TOPIC, SET = 2, 0  # (IncrementalAlterConfigs' resource type and operation)


class _RepliesLost(redis.Redis):
    """A client each script call of which runs, then loses its reply (a dropped connection)."""

    def execute_command(self, *args: Any, **options: Any) -> Any:
        out = super().execute_command(*args, **options)
        if args[0] == "EVALSHA":
            raise redis.exceptions.ConnectionError("reply lost (test)")
        return out


def _delete_records(gw: Any, offset: int) -> tuple[int, int]:
    """(error code, low watermark) of DeleteRecords v2 of partition 0 of ``t`` to ``offset``."""
    answer = call_once(gw, 21, 2, {"topics": [{"name": "t", "partitions": [
        {"partition_index": 0, "offset": offset}]}], "timeout_ms": 5000})
    (part,) = answer.topics[0].partitions
    return part.error_code.value, part.low_watermark


def test_a_delete_records_a_move_refused_throughout_is_not_leader(own_cluster, namespace):
    """The removal's script names the stream (moved) and its mark (not): refused until the
    move ends. Answered NOT_LEADER_OR_FOLLOWER (it was REQUEST_TIMED_OUT), nothing removed;
    asked again once the move is over, the records go."""
    with _split(own_cluster, namespace) as (client, move), \
            running_gateway(own_cluster, namespace) as gw:
        producer = Producer(client, namespace, idempotent=False)
        for value in (b"a", b"b", b"c"):
            producer.send("t", value, partition=0)
        _start(move)
        _migrate(move, [move.key])
        assert _delete_records(gw, 2) == (NOT_LEADER_OR_FOLLOWER, -1)
        move.keys()
        move.owner()
        assert log_offsets(client, namespace, "t", 0) == (0, 3)
        assert _delete_records(gw, 2) == (Errors.NONE, 2)
        assert log_offsets(client, namespace, "t", 0) == (2, 3)


def test_a_partition_refused_throughout_is_answered_alone(own_cluster, namespace):
    """Of a topic's two partitions, the one whose slot is moving is refused (the topic's call,
    a pipeline, then that partition asked alone): it alone is NOT_LEADER_OR_FOLLOWER, the
    other's records are removed."""
    with _split_p0(own_cluster, namespace, 2, idempotent=False) as (client, _, _), \
            running_gateway(own_cluster, namespace) as gw:
        answer = call_once(gw, 21, 2, {"topics": [{"name": "t", "partitions": [
            {"partition_index": p, "offset": 1} for p in (0, 1)]}], "timeout_ms": 5000})
        parts = {p.partition_index: (p.error_code.value, p.low_watermark)
                 for p in answer.topics[0].partitions}
        assert parts == {0: (NOT_LEADER_OR_FOLLOWER, -1), 1: (Errors.NONE, 1)}
        assert log_offsets(client, namespace, "t", 1) == (1, 1)


def test_a_delete_records_that_may_have_run_stays_timed_out(own_cluster, namespace):
    """The removal's first attempt lost its connection (it may have run), then met the move's
    refusals: REQUEST_TIMED_OUT."""
    with _split(own_cluster, namespace) as (client, move), \
            running_gateway(own_cluster, namespace) as gw:
        Producer(client, namespace, idempotent=False).send("t", b"a", partition=0)
        _start(move)
        _migrate(move, [move.key])
        assert gw.gateway is not None
        gw.gateway.state.sync_redis.__class__ = _LostOnce
        assert _delete_records(gw, 1) == (Errors.REQUEST_TIMED_OUT, -1)


def test_an_alter_configs_whose_reply_was_lost_is_not_said_to_have_changed_nothing(
        gateway, topics):
    """The topic's settings were written and the reply lost: REQUEST_TIMED_OUT (retriable; a
    setting written again does no harm), whose message said "nothing was changed"."""
    topics.create("t", 1)
    state = gateway.gateway.state
    state.sync_redis.__class__ = _RepliesLost
    try:
        answer = call_once(gateway, 44, 1, {"validate_only": False, "resources": [
            {"resource_type": TOPIC, "resource_name": "t", "configs": [
                {"name": "retention.ms", "config_operation": SET, "value": "60000"}]}]})
    finally:
        state.sync_redis.__class__ = redis.Redis
    (res,) = answer.responses
    assert res.error_code.value == Errors.REQUEST_TIMED_OUT
    assert topics.describe("t").retention_ms == 60_000
    assert "nothing was changed" not in res.error_message
    assert "may have been made" in res.error_message
