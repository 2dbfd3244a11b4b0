"""The gateway items of review 76: the TLS handshake's bound, a committed leader epoch below -1
(kept, as Kafka keeps it), and SaslHandshake v0, after which the PLAIN token comes as a raw
frame (Kafka's ``SaslServerAuthenticator`` without SaslAuthenticate headers)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("kio")

from gateway_harness import (
    GatewayThread,
    call_once,
    closed_by_gateway,
    connect,
    make_certs,
    recv_frame,
    request_frame,
    response,
    running_gateway,
)

from rcoord.gateway.auth import load_auth_file
from rcoord.gateway.framing import frame

HANDSHAKE_LIMIT_S = 0.5
"""The TLS handshake limit the test gateway gets: far below the 10 s default, so a peer the
gateway closes within CLOSED_WITHIN_S was closed by this limit and not by the default."""
CLOSED_WITHIN_S = 8.0


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl CLI")
    d = tmp_path_factory.mktemp("gateway-tls")
    make_certs(d)
    return d


@pytest.fixture
def tls(redis_server: Any, namespace: str, certs: Path) -> Iterator[GatewayThread]:
    # (``redis_kwargs`` are the Gateway's keyword arguments, of which this is one)
    with running_gateway(redis_server, namespace, tls_cert_file=str(certs / "server.pem"),
                         tls_key_file=str(certs / "server.key"),
                         redis_kwargs={"tls_handshake_timeout_s": HANDSHAKE_LIMIT_S}) as gw:
        yield gw


def test_a_peer_that_never_sends_a_client_hello_is_closed_after_the_handshake_limit(
        tls: GatewayThread) -> None:
    with connect(tls) as sock:
        assert closed_by_gateway(sock, CLOSED_WITHIN_S)


def test_the_handshake_limit_must_be_positive(redis_server: Any, namespace: str) -> None:
    from rcoord.gateway import Gateway, GatewayConfig

    config = GatewayConfig(listen_host="127.0.0.1", listen_port=0, namespace=namespace)
    with pytest.raises(ValueError, match="tls_handshake_timeout_s must be > 0, got 0"):
        Gateway(config, redis_server.url, tls_handshake_timeout_s=0)


def test_a_committed_leader_epoch_below_minus_one_is_fetched_as_it_was_committed(
        gateway: Any, topics: Any) -> None:
    """Kafka stores a committed leader epoch as given, only -1 meaning none
    (``OffsetAndMetadata.fromRequest``, ``Utils.ofSentinel``), and OffsetFetch answers it so;
    it was read back as -1."""
    epochs = {0: -2, 1: -1, 2: -(2 ** 31), 3: 7}
    topics.create("t", len(epochs))
    got = call_once(gateway, 8, 8, {
        "group_id": "g", "generation_id_or_member_epoch": -1, "member_id": "",
        "group_instance_id": None, "topics": [{"name": "t", "partitions": [
            {"partition_index": p, "committed_offset": 10 + p, "committed_leader_epoch": e,
             "committed_metadata": ""} for p, e in epochs.items()]}]})
    assert [p.error_code.value for t in got.topics for p in t.partitions] == [0] * len(epochs)
    fetched = call_once(gateway, 9, 8, {"groups": [{"group_id": "g", "topics": [
        {"name": "t", "partition_indexes": list(epochs)}]}], "require_stable": False})
    assert [(p.partition_index, p.committed_offset, p.committed_leader_epoch)
            for g in fetched.groups for t in g.topics for p in t.partitions] == [
        (p, 10 + p, e) for p, e in epochs.items()]


@pytest.fixture
def sasl(redis_server: Any, namespace: str, tmp_path: Path) -> Iterator[GatewayThread]:
    path = tmp_path / "auth.json"
    path.write_text(json.dumps({"users": {"alice": "alice-pw"}}))
    with running_gateway(redis_server, namespace, auth=load_auth_file(path)) as gw:
        yield gw


def _handshake_v0(sock: Any) -> None:
    sock.sendall(request_frame(17, 0, 1, {"mechanism": "PLAIN"}))
    got = response(sock, 17, 0, 4)
    assert (got.error_code.value, list(got.mechanisms)) == (0, ["PLAIN"])


def test_api_versions_advertises_sasl_handshake_v0_and_v1(sasl: GatewayThread) -> None:
    with connect(sasl) as sock:
        sock.sendall(request_frame(18, 3, 1, {"client_software_name": "t",
                                              "client_software_version": "1"}))
        got = response(sock, 18, 3, 4)
    assert [(k.min_version, k.max_version) for k in got.api_keys if k.api_key == 17] == [(0, 1)]


def test_sasl_handshake_v0_then_a_raw_plain_token_logs_in(sasl: GatewayThread) -> None:
    with connect(sasl) as sock:
        _handshake_v0(sock)
        sock.sendall(frame(b"\0alice\0alice-pw"))
        assert recv_frame(sock) == b""  # PLAIN's empty challenge, size-prefixed
        # Authenticated: requests are served (ApiVersions once more, as after SaslAuthenticate).
        sock.sendall(request_frame(18, 3, 2, {"client_software_name": "t",
                                              "client_software_version": "1"}))
        assert response(sock, 18, 3, 4).error_code.value == 0


@pytest.mark.parametrize("token", [b"\0alice\0wrong", b"not a PLAIN token",
                                   b"bob\0alice\0alice-pw"])
def test_sasl_handshake_v0_then_a_refused_raw_token_closes_the_connection_unanswered(
        sasl: GatewayThread, token: bytes) -> None:
    with connect(sasl) as sock:
        _handshake_v0(sock)
        sock.sendall(frame(token))
        assert closed_by_gateway(sock, 30)


def test_kafka_python_logs_in_with_sasl_handshake_v0(sasl: GatewayThread) -> None:
    """kafka-python told the broker is 0.10 sends SaslHandshake v0 and the raw PLAIN token."""
    kafka = pytest.importorskip("kafka")
    admin = kafka.KafkaAdminClient(
        bootstrap_servers=sasl.bootstrap, api_version=(0, 10, 2),
        security_protocol="SASL_PLAINTEXT", sasl_mechanism="PLAIN",
        sasl_plain_username="alice", sasl_plain_password="alice-pw", request_timeout_ms=30000)
    try:
        assert admin.list_topics() == []
    finally:
        admin.close()
