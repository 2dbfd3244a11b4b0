"""SASL/PLAIN on the gateway's listener: kafka-python and confluent-kafka authenticate; wrong
passwords and unauthenticated requests are refused the way Kafka's broker refuses them."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("kio")
kafka = pytest.importorskip("kafka")

from gateway_harness import (
    GatewayThread,
    connect,
    request_frame,
    response,
    running_gateway,
    take,
    topics_of,
)

from rcoord.gateway.auth import load_auth_file
from rcoord.topics import Topics

USERS = {"alice": "alice-secret"}


@pytest.fixture
def auth_file(tmp_path: Path) -> Path:
    path = tmp_path / "auth.json"
    path.write_text(json.dumps({"users": USERS}))
    return path


@pytest.fixture
def gateway(redis_server: Any, namespace: str, auth_file: Path) -> Iterator[GatewayThread]:
    with running_gateway(redis_server, namespace, auth=load_auth_file(auth_file)) as gw:
        yield gw


@pytest.fixture
def topics(redis_server: Any, namespace: str) -> Iterator[Topics]:
    with topics_of(redis_server, namespace) as t:
        yield t


def _kp_conf(gw: GatewayThread, password: str) -> dict[str, Any]:
    return {"bootstrap_servers": gw.bootstrap, "security_protocol": "SASL_PLAINTEXT",
            "sasl_mechanism": "PLAIN", "sasl_plain_username": "alice",
            "sasl_plain_password": password}


def test_kafka_python_authenticates(
    gateway: GatewayThread, topics: Topics,
) -> None:
    topics.create("secured", 1)
    producer = kafka.KafkaProducer(**_kp_conf(gateway, "alice-secret"))
    try:
        assert producer.send("secured", value=b"in").get(10).offset == 0
    finally:
        producer.close()
    consumer = kafka.KafkaConsumer("secured", group_id="sg", auto_offset_reset="earliest",
                                   consumer_timeout_ms=5000, **_kp_conf(gateway, "alice-secret"))
    try:
        assert "secured" in consumer.topics()  # (after subscribing: see poll_until)
        assert [m.value for m in take(consumer, 1)] == [b"in"]
    finally:
        consumer.close()


def test_confluent_kafka_authenticates_and_a_wrong_password_is_refused(
    gateway: GatewayThread, topics: Topics,
) -> None:
    ck = pytest.importorskip("confluent_kafka")
    topics.create("secured", 1)
    base = {"bootstrap.servers": gateway.bootstrap, "broker.address.family": "v4",
            "security.protocol": "SASL_PLAINTEXT", "sasl.mechanisms": "PLAIN",
            "sasl.username": "alice"}
    producer = ck.Producer({**base, "sasl.password": "alice-secret"})
    producer.produce("secured", value=b"rd")
    assert producer.flush(20) == 0
    errors: list[Any] = []
    bad = ck.Producer({**base, "sasl.password": "wrong",
                       "error_cb": lambda err: errors.append(err)})
    bad.produce("secured", value=b"never")
    deadline = time.monotonic() + 30
    while not any(e.code() == ck.KafkaError._AUTHENTICATION for e in errors):
        assert time.monotonic() < deadline, errors
        bad.poll(0.1)
    assert bad.flush(0) == 1  # not delivered
    assert [p.log_end_offset for p in topics.describe("secured").partitions] == [1]


def test_requests_before_authentication_close_the_connection(gateway: GatewayThread) -> None:
    with connect(gateway) as sock:
        sock.sendall(request_frame(3, 12, 1, {"topics": None}))  # Metadata, unauthenticated
        assert sock.recv(1) == b""


@pytest.mark.parametrize("password", ["wrong", None])
def test_a_failed_authentication_is_answered_then_closed(gateway: GatewayThread,
                                                         password: str | None) -> None:
    with connect(gateway) as sock:
        sock.sendall(request_frame(17, 1, 1, {"mechanism": "PLAIN"}))
        assert response(sock, 17, 1, 4).error_code.value == 0
        token = b"\0alice\0" + password.encode() if password else b"garbage"
        sock.sendall(request_frame(36, 2, 2, {"auth_bytes": token}))
        answer = response(sock, 36, 2, 5)
        assert answer.error_code.value == 58  # SASL_AUTHENTICATION_FAILED
        assert sock.recv(1) == b""
    with connect(gateway) as sock:  # and a mechanism the gateway does not offer
        sock.sendall(request_frame(17, 1, 1, {"mechanism": "SCRAM-SHA-256"}))
        offered = response(sock, 17, 1, 4)
        assert offered.error_code.value == 33 and list(offered.mechanisms) == ["PLAIN"]


def test_auth_file_errors_say_what_is_expected(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"users": {}}))
    with pytest.raises(ValueError, match="at least one user"):
        load_auth_file(bad)
    with pytest.raises(ValueError, match="cannot read"):
        load_auth_file(tmp_path / "missing.json")


def test_a_frame_over_512_kb_before_authentication_closes_the_connection(
        gateway: GatewayThread) -> None:
    """Kafka caps requests at 512 KB until the client authenticated; after, the listener's
    ``max_frame_bytes`` applies. Only the size prefix is sent: the gateway must not wait for
    the body."""
    big = 512 * 1024 + 1
    with connect(gateway) as sock:
        sock.sendall(big.to_bytes(4, "big"))
        assert sock.recv(1) == b""
    with connect(gateway) as sock:
        sock.sendall(request_frame(17, 1, 1, {"mechanism": "PLAIN"}))
        assert response(sock, 17, 1, 4).error_code.value == 0
        sock.sendall(request_frame(36, 2, 2, {"auth_bytes": b"\0alice\0alice-secret"}))
        assert response(sock, 36, 2, 5).error_code.value == 0
        padding = "x" * big  # a Metadata request naming one long (unknown) topic
        sock.sendall(request_frame(3, 12, 3, {"topics": [{"name": padding}]}))
        answer = response(sock, 3, 12, 5)
        assert [t.name for t in answer.topics] == [padding]
