"""The gateway items of review 76: the TLS handshake's bound, and a committed leader epoch
below -1 (kept, as Kafka keeps it)."""

from __future__ import annotations

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
    running_gateway,
)

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
