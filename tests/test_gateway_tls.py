"""TLS on the gateway's listener: SASL_SSL with confluent-kafka and kafka-python, mutual TLS,
and clients that cannot complete a handshake, which must not disturb the others. Certificates
are made here with the ``openssl`` command line (a throwaway CA) and deleted afterwards."""

from __future__ import annotations

import json
import shutil
import ssl
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("kio")
kafka = pytest.importorskip("kafka")
ck = pytest.importorskip("confluent_kafka")

from gateway_harness import (
    GatewayThread,
    connect,
    make_certs,
    request_frame,
    running_gateway,
    take,
    topics_of,
)
from harness import wait_until

from rcoord.gateway import GatewayConfig
from rcoord.gateway.auth import load_auth_file
from rcoord.topics import Topics

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl CLI")

WAIT_S = 60.0
USERS = {"alice": "alice-pw"}


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("gateway-tls")
    make_certs(d)
    return d


@pytest.fixture
def auth(tmp_path: Path) -> Any:
    path = tmp_path / "auth.json"
    path.write_text(json.dumps({"users": USERS}))
    return load_auth_file(path)


@pytest.fixture
def topics(redis_server: Any, namespace: str) -> Iterator[Topics]:
    with topics_of(redis_server, namespace) as t:
        t.create("sealed", 1)
        yield t


@pytest.fixture
def sasl_ssl(redis_server: Any, namespace: str, certs: Path, auth: Any
             ) -> Iterator[GatewayThread]:
    with running_gateway(redis_server, namespace, auth=auth,
                         tls_cert_file=str(certs / "server.pem"),
                         tls_key_file=str(certs / "server.key")) as gw:
        yield gw


@pytest.fixture
def mutual(redis_server: Any, namespace: str, certs: Path) -> Iterator[GatewayThread]:
    with running_gateway(redis_server, namespace, tls_cert_file=str(certs / "server.pem"),
                         tls_key_file=str(certs / "server.key"),
                         tls_ca_file=str(certs / "ca.pem")) as gw:
        yield gw


def _ck_sasl_ssl(gw: GatewayThread, ca: Path) -> dict[str, Any]:
    return {"bootstrap.servers": gw.bootstrap, "broker.address.family": "v4",
            "security.protocol": "SASL_SSL", "ssl.ca.location": str(ca),
            "sasl.mechanisms": "PLAIN", "sasl.username": "alice", "sasl.password": "alice-pw"}


def _consume(conf: dict[str, Any], topic: str, want: int) -> list[bytes]:
    consumer = ck.Consumer({**conf, "group.id": "sealed-readers",
                            "auto.offset.reset": "earliest", "session.timeout.ms": 6000,
                            "heartbeat.interval.ms": 200})
    consumer.subscribe([topic])
    values: list[bytes] = []

    def step() -> None:
        msg = consumer.poll(0.2)
        if msg is not None and not msg.error():
            values.append(msg.value())

    try:
        wait_until(lambda: len(values) >= want, step, timeout_s=WAIT_S)
    finally:
        consumer.close()
    return values


def _refused(conf: dict[str, Any], topic: str) -> list[Any]:
    """Errors a librdkafka producer reports when it cannot connect (nothing is delivered).

    The connection error is waited for explicitly; the message then only has to expire, and a
    short message.timeout.ms keeps flush from waiting longer than that.
    """
    errors: list[Any] = []
    producer = ck.Producer({**conf, "error_cb": errors.append, "message.timeout.ms": 1000})
    producer.produce(topic, value=b"never")
    deadline = time.monotonic() + WAIT_S
    while not errors:
        assert time.monotonic() < deadline, "no connection error reported"
        producer.poll(0.1)
    assert producer.flush(10) == 0  # the message expired undelivered (delivery error)
    return errors


def test_confluent_kafka_over_sasl_ssl(sasl_ssl: GatewayThread, topics: Topics,
                                       certs: Path) -> None:
    conf = _ck_sasl_ssl(sasl_ssl, certs / "ca.pem")
    producer = ck.Producer({**conf, "enable.idempotence": True})
    for i in range(5):
        producer.produce("sealed", key=b"k", value=b"v%d" % i, headers=[("h", b"x")])
    assert producer.flush(30) == 0
    assert _consume(conf, "sealed", 5) == [b"v%d" % i for i in range(5)]


def test_kafka_python_over_sasl_ssl(sasl_ssl: GatewayThread, topics: Topics,
                                    certs: Path) -> None:
    conf = {"bootstrap_servers": sasl_ssl.bootstrap, "security_protocol": "SASL_SSL",
            "ssl_cafile": str(certs / "ca.pem"), "sasl_mechanism": "PLAIN",
            "sasl_plain_username": "alice", "sasl_plain_password": "alice-pw"}
    producer = kafka.KafkaProducer(**conf)
    try:
        assert producer.send("sealed", value=b"kp").get(10).offset == 0
    finally:
        producer.close()
    consumer = kafka.KafkaConsumer("sealed", group_id="kp", auto_offset_reset="earliest",
                                   consumer_timeout_ms=5000, **conf)
    try:
        assert "sealed" in consumer.topics()  # (after subscribing: see poll_until)
        assert [m.value for m in take(consumer, 1)] == [b"kp"]
    finally:
        consumer.close()


def test_failed_handshakes_do_not_disturb_other_clients(sasl_ssl: GatewayThread,
                                                       topics: Topics, certs: Path) -> None:
    good = _ck_sasl_ssl(sasl_ssl, certs / "ca.pem")
    producer = ck.Producer(good)
    producer.produce("sealed", value=b"before")
    assert producer.flush(30) == 0
    # A client that trusts another CA refuses the gateway's certificate.
    errors = _refused(_ck_sasl_ssl(sasl_ssl, certs / "other-ca.pem"), "sealed")
    assert any(e.code() in (ck.KafkaError._SSL, ck.KafkaError._TRANSPORT,
                            ck.KafkaError._ALL_BROKERS_DOWN) for e in errors), errors
    # A plaintext client speaks Kafka to a TLS listener: the handshake fails, it is closed.
    with connect(sasl_ssl) as sock:
        sock.sendall(request_frame(18, 3, 1, {"client_software_name": "plain",
                                              "client_software_version": "1"}))
        sock.settimeout(15)
        try:
            data = sock.recv(1024)
        except ConnectionResetError:
            data = b""
        assert not data.startswith(b"\x00\x00")  # no Kafka response, whatever TLS said
    # The open producer's connection is still served, and so is a new consumer.
    producer.produce("sealed", value=b"after")
    assert producer.flush(30) == 0
    assert _consume(good, "sealed", 2) == [b"before", b"after"]
    assert [p.log_end_offset for p in topics.describe("sealed").partitions] == [2]


def test_mutual_tls_requires_a_client_certificate_from_the_ca(mutual: GatewayThread,
                                                              topics: Topics,
                                                              certs: Path) -> None:
    base = {"bootstrap.servers": mutual.bootstrap, "broker.address.family": "v4",
            "security.protocol": "SSL", "ssl.ca.location": str(certs / "ca.pem")}
    with_cert = {**base, "ssl.certificate.location": str(certs / "client.pem"),
                 "ssl.key.location": str(certs / "client.key")}
    producer = ck.Producer(with_cert)
    producer.produce("sealed", value=b"mtls")
    assert producer.flush(30) == 0
    assert _consume(with_cert, "sealed", 1) == [b"mtls"]
    assert _refused(base, "sealed")  # no certificate
    stranger = {**base, "ssl.certificate.location": str(certs / "stranger.pem"),
                "ssl.key.location": str(certs / "stranger.key")}
    assert _refused(stranger, "sealed")  # signed by another CA
    assert [p.log_end_offset for p in topics.describe("sealed").partitions] == [1]


def test_python_ssl_client_sees_the_certificate(sasl_ssl: GatewayThread, certs: Path) -> None:
    """The listener presents the configured chain and speaks TLS 1.2 or later."""
    ctx = ssl.create_default_context(cafile=str(certs / "ca.pem"))
    with connect(sasl_ssl) as raw, ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
        assert tls.version() in ("TLSv1.2", "TLSv1.3")
        cert = tls.getpeercert()
        assert cert is not None and ("IP Address", "127.0.0.1") in cert["subjectAltName"]


def test_tls_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="need tls_cert_file"):
        GatewayConfig(tls_key_file="server.key").validate()
    with pytest.raises(ValueError, match="need tls_cert_file"):
        GatewayConfig(tls_key_password_file="pass-phrase").validate()
