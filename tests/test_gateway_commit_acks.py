"""The gateway's ``--commit-required-acks`` (Kafka's ``offsets.commit.required.acks``): every
OffsetCommit it serves waits for that many replicas, whatever client sent it."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from gateway_harness import GatewayThread, connect, request_frame, response
from harness import wait_until

from rcoord import GroupCoordinator, TopicPartition
from rcoord.gateway.state import GatewayConfig
from rcoord.testing.embedded import EmbeddedServer
from rcoord.topics import Topics

COORDINATOR_NOT_AVAILABLE = 15


@pytest.fixture(scope="module")
def primary() -> Iterator[EmbeddedServer]:
    from cluster_replicas import NO_SYNC_DELAY

    server, replica = EmbeddedServer(extra_args=NO_SYNC_DELAY).start(), EmbeddedServer().start()
    try:
        with replica.client() as r:
            r.execute_command("REPLICAOF", "127.0.0.1", server.port)
        with server.client() as c:
            wait_until(lambda: c.info("replication").get("slave0", {}).get("state") == "online",
                       timeout_s=30)
        yield server
    finally:
        replica.stop()
        server.stop()


def _commit(gw: GatewayThread, group: str, offset: int) -> int:
    sock = connect(gw)
    try:
        sock.sendall(request_frame(8, 8, 1, {
            "group_id": group, "generation_id_or_member_epoch": -1, "member_id": "",
            "topics": [{"name": "t", "partitions": [
                {"partition_index": 0, "committed_offset": offset}]}]}))
        got: Any = response(sock, 8, 8, 5)
        return int(got.topics[0].partitions[0].error_code.value)
    finally:
        sock.close()


@pytest.mark.parametrize(("acks", "expected"), [(1, 0), (2, COORDINATOR_NOT_AVAILABLE)])
def test_every_commit_waits_for_the_configured_replicas(primary, acks, expected):
    ns = "g" + uuid.uuid4().hex[:10]
    # The one replica acknowledges as soon as it is scheduled: give it time enough for a loaded
    # machine (50 ms was missed once in a full run); the refusal waits out the short timeout.
    with primary.client() as c:
        Topics(c, ns).create("t", 1)  # a commit to a topic that does not exist is refused
    gw = GatewayThread(f"redis://127.0.0.1:{primary.port}/0", ns, commit_required_acks=acks,
                       commit_ack_timeout_ms=5000 if expected == 0 else 50).start()
    try:
        assert _commit(gw, "grp", 7) == expected
        with primary.client() as c:  # on the master either way (Kafka's ISR would hide it)
            fetched = GroupCoordinator(c, ns).fetch_offsets("grp", [TopicPartition("t", 0)])
            assert fetched.offsets[TopicPartition("t", 0)].offset == 7
    finally:
        gw.stop()


@pytest.mark.parametrize("bad", [dict(commit_required_acks=-1), dict(commit_ack_timeout_ms=0)])
def test_bad_values_are_refused(bad):
    with pytest.raises(ValueError, match="commit_required_acks must be >= 0"):
        GatewayConfig(**bad).validate()
