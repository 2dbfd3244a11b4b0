"""A gateway Produce refused by a slot move (``TRYAGAIN`` until redis-py's "TTL exhausted"):
every attempt refused before running is a certain "not stored", answered
NOT_LEADER_OR_FOLLOWER (Kafka's ``Partition.appendRecordsToLeader`` for a partition whose
leader moved: the producer reads its metadata again and resends); an append one of whose
attempts lost its connection may have run, and stays REQUEST_TIMED_OUT ("maybe written")."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import redis
from gateway_harness import (
    connect,
    produced_batch,
    request_frame,
    response,
    running_gateway,
    topics_of,
)
from test_parked_slot_moves import _Move
from test_producer_slot_moves import _end, _migrate, _start

from rcoord.connect import ClusterClient, refused_unrun
from rcoord.errors import Errors
from rcoord.gateway.errors import NOT_LEADER_OR_FOLLOWER
from rcoord.topics import Record, partition_key
from rcoord.topics.fetch import fetch


class _LostOnce(ClusterClient):
    """A cluster client whose first EVALSHA fails on a lost connection (redis-py's
    ``ConnectionError``, which it retries), as one whose reply was lost after it ran would."""

    lose = True
    sending: Any = None

    def _execute_command(self, target_node: Any, *args: Any, **kwargs: Any) -> Any:
        self.sending = args[0]
        return super()._execute_command(target_node, *args, **kwargs)

    def get_redis_connection(self, node: Any) -> Any:
        if self.sending == "EVALSHA" and self.lose:
            self.lose = False
            raise redis.exceptions.ConnectionError("connection lost")
        return super().get_redis_connection(node)


@contextlib.contextmanager
def _split(cluster: Any, namespace: str) -> Iterator[tuple[Any, _Move]]:
    """Topic ``t`` (one partition, one record ``a``) whose slot is migrating with its stream
    moved and its other keys not: an append is refused (``TRYAGAIN``) until the move ends."""
    with topics_of(cluster, namespace) as topics:
        topics.create("t", 1)
    client = cluster.client()
    stream = partition_key(namespace, "t", 0)
    move = _Move(cluster, client, stream)
    try:
        yield client, move
    finally:
        _end(move)
        client.close()


def _produce(sock: Any, corr: int, value: bytes, **ids: int) -> Any:
    batch = produced_batch([Record(0, None, value, {}, 0)], **ids)
    sock.sendall(request_frame(0, 9, corr, {"acks": -1, "timeout": 10000, "topic_data": [
        {"name": "t", "partition_data": [{"index": 0, "records": batch}]}]}))
    return response(sock, 0, 9, 5).responses[0].partition_responses[0]


def test_a_produce_every_attempt_of_which_a_move_refused_is_not_leader(own_cluster, namespace):
    """A plain producer's batch refused through the move is answered NOT_LEADER_OR_FOLLOWER
    (it was REQUEST_TIMED_OUT, "maybe written", though no attempt ran); nothing of it is
    stored, and once the move is over its resend is appended once."""
    with _split(own_cluster, namespace) as (client, move), \
            running_gateway(own_cluster, namespace) as gw, \
            contextlib.closing(connect(gw)) as sock:
        assert _produce(sock, 1, b"a").error_code.value == 0
        _start(move)
        _migrate(move, [move.key])
        refused = _produce(sock, 2, b"b")
        assert (refused.error_code.value, refused.base_offset) == (NOT_LEADER_OR_FOLLOWER, -1)
        assert "nothing was appended" in refused.error_message
        move.keys()
        move.owner()
        resent = _produce(sock, 3, b"b")
        assert (resent.error_code.value, resent.base_offset) == (0, 1)
        values = [r.value for r in fetch(client, namespace, "t", 0, 0).records]
        assert values == [b"a", b"b"]


def test_a_call_that_lost_a_reply_before_the_refusals_may_have_run(own_cluster, namespace):
    """redis-py retries a call whose connection failed (it may have run), and that retry met
    the move's refusals until "TTL exhausted": the final error is a refusal, but the call is
    not marked refused unrun; one refused throughout is, and each call is judged alone."""
    with _split(own_cluster, namespace) as (_, move):
        flaky = _LostOnce.from_url(own_cluster.url)
        try:
            _start(move)
            _migrate(move, [move.key])
            script = "return redis.call('EXISTS', KEYS[1], KEYS[2])"
            sha = flaky.script_load(script)
            keys = (move.key, move.key + ":other")  # (the same hash tag, not moved)
            assert flaky.keyslot(keys[0]) == flaky.keyslot(keys[1])
            outcomes = []
            for _ in range(2):
                try:
                    flaky.evalsha(sha, 2, *keys)
                except redis.exceptions.RedisError as exc:
                    outcomes.append(exc)
            assert [type(e) for e in outcomes] == [redis.exceptions.ClusterError] * 2
            assert [refused_unrun(e) for e in outcomes] == [False, True]
        finally:
            flaky.close()


def test_a_produce_that_may_have_run_stays_timed_out(own_cluster, namespace):
    """The gateway's append whose first attempt lost its reply, then met the move's
    refusals: REQUEST_TIMED_OUT, since it may have been stored."""
    with _split(own_cluster, namespace) as (_, move), \
            running_gateway(own_cluster, namespace) as gw, \
            contextlib.closing(connect(gw)) as sock:
        assert _produce(sock, 1, b"a").error_code.value == 0
        _start(move)
        _migrate(move, [move.key])
        assert gw.gateway is not None
        gw.gateway.state.sync_redis.__class__ = _LostOnce
        refused = _produce(sock, 2, b"b")
        assert refused.error_code.value == Errors.REQUEST_TIMED_OUT


def test_the_calls_of_one_operation_are_judged_together(own_cluster, namespace):
    """Inside ``one_operation`` (the gateway's append: a script reload's resend is a second
    call), a refused call after one that may have run is not marked either; the block's end
    judges each call alone again, and a plain client's block marks nothing."""
    from rcoord.connect import one_operation

    with _split(own_cluster, namespace) as (_, move):
        flaky = _LostOnce.from_url(own_cluster.url)
        try:
            _start(move)
            _migrate(move, [move.key])
            sha = flaky.script_load("return redis.call('EXISTS', KEYS[1], KEYS[2])")
            keys = (move.key, move.key + ":other")
            outcomes = []

            def send() -> None:
                try:
                    flaky.evalsha(sha, 2, *keys)
                except redis.exceptions.ClusterError as exc:
                    outcomes.append(exc)

            with one_operation(flaky):
                send()  # its first attempt lost its connection, then refusals
                send()  # refused throughout, but in the same operation
            send()
            with one_operation(flaky):
                send()
            assert [refused_unrun(e) for e in outcomes] == [False, False, True, True]
            with one_operation(redis.Redis()):  # (not a cluster client: nothing to judge)
                pass
        finally:
            flaky.close()
