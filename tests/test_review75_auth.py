"""Review 75 (the gateway's authentication, ACLs and TLS): reproductions of the defects found.

Each test fails on the code it was written against and shows one defect; see the review's
report for the fix suggested and the Kafka source that says what is right.
"""

from __future__ import annotations

import contextlib
import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("kio")

from gateway_harness import (
    produced_batch,
    request_frame,
    response,
    running_gateway,
    sasl_connect,
    topics_of,
)

from rcoord.errors import Errors
from rcoord.gateway.auth import load_auth_file
from rcoord.topics import Record


@contextlib.contextmanager
def _refused_port() -> Iterator[int]:
    """A loopback port bound and not listening while the block runs: a connection to it is
    refused at once, as to a Redis server that went away, and no other server can take it."""
    sock = socket.socket()
    try:
        sock.bind(("127.0.0.1", 0))
        yield int(sock.getsockname()[1])
    finally:
        sock.close()


@pytest.fixture
def alice_gateway(redis_server: Any, namespace: str, tmp_path: Path) -> Iterator[Any]:
    """A gateway where user alice (password pw) may do everything, with topic "t"."""
    path = tmp_path / "auth.json"
    path.write_text(json.dumps({"users": {"alice": "pw"}}))
    with running_gateway(redis_server, namespace, auth=load_auth_file(path)) as gw, \
            topics_of(redis_server, namespace) as topics:
        topics.create("t", 1)
        yield gw


@contextlib.contextmanager
def _redis_gone(gw: Any) -> Iterator[int]:
    """The gateway's blocking Redis client sent to a refused port while the block runs (every
    new connection refused, as when its Redis server went away); that port."""
    with _refused_port() as port:
        assert gw.gateway is not None
        pool = gw.gateway.state.sync_redis.connection_pool
        pool.connection_kwargs["port"] = port
        pool.reset()
        yield port


def test_a_kafka_client_is_not_told_where_the_gateways_redis_is(alice_gateway: Any) -> None:
    # Only the gateway holds Redis credentials and reaches Redis (docs/gateway.md,
    # "Authentication"); a tenant's Kafka client should learn nothing of it. A Produce whose
    # append could not reach Redis was answered REQUEST_TIMED_OUT (right) with the redis-py
    # error as the partition's error_message: "Redis unreachable or unavailable: send_batch:
    # Error 111 connecting to HOST:PORT. Connection refused.", the Redis server's address given
    # to any authenticated producer. Kafka's broker answers such a partition with the error
    # alone (ReplicaManager's LogAppendResult.errorMessage is null unless the records were
    # refused, KIP-467) and keeps the cause in its own log, as the gateway also does.
    batch = produced_batch([Record(0, b"k", b"v", {}, 0)])
    with _redis_gone(alice_gateway) as port, sasl_connect(alice_gateway, "alice", "pw") as sock:
        sock.sendall(request_frame(0, 9, 3, {"acks": -1, "timeout": 1000, "topic_data": [
            {"name": "t", "partition_data": [{"index": 0, "records": batch}]}]}))
        (answer,) = [p for t in response(sock, 0, 9, 5).responses
                     for p in t.partition_responses]
    assert answer.error_code.value == Errors.REQUEST_TIMED_OUT
    assert f":{port}" not in (answer.error_message or ""), answer.error_message


def test_an_admin_client_is_not_told_where_the_gateways_redis_is(alice_gateway: Any) -> None:
    # The same through CreateTopics (api_topics._unreached, also DeleteTopics and
    # CreatePartitions): the topic's error_message named the Redis server's address. Kafka's
    # ControllerApis answers a topic the controller could not create with ApiError's message,
    # never with where its metadata is kept.
    with _redis_gone(alice_gateway) as port, sasl_connect(alice_gateway, "alice", "pw") as sock:
        sock.sendall(request_frame(19, 7, 3, {"timeout": 1000, "validate_only": False,
                                              "topics": [{"name": "n", "num_partitions": 1,
                                                          "replication_factor": 1,
                                                          "assignments": [], "configs": []}]}))
        (answer,) = response(sock, 19, 7, 5).topics
    assert answer.error_code.value == Errors.REQUEST_TIMED_OUT
    assert f":{port}" not in (answer.error_message or ""), answer.error_message
