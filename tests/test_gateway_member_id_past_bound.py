"""A member id past MAX_ID_BYTES through the gateway, in raw frames, at every version the
gateway serves of the requests that name one: JoinGroup v0-9, SyncGroup v0-5, Heartbeat v0-4,
OffsetCommit v2-8 and LeaveGroup v0-5 (flexible from JoinGroup v6, SyncGroup v4, Heartbeat v4,
OffsetCommit v8, LeaveGroup v4).

No member can have such an id, so Kafka's group coordinator, which sets no bound on it,
answers it as any id the group does not know: UNKNOWN_MEMBER_ID, or FENCED_INSTANCE_ID beside
another member's group.instance.id. A JoinGroup's error reply is GroupCoordinator.joinError's
(generation -1, no leader, no protocol, no members) with the request's member id echoed. The
gateway refused these INVALID_REQUEST (fatal to a Kafka client) until 2026-12-01, all but
LeaveGroup; each case below is checked against the same request with a short unknown id."""

from __future__ import annotations

import socket
from typing import Any

import pytest

pytest.importorskip("kio")

from gateway_harness import GatewayThread, connect, request_frame, response

from rcoord import Errors
from rcoord.protocol._checks import MAX_ID_BYTES
from rcoord.topics import Topics

OFFSET_COMMIT, JOIN_GROUP, HEARTBEAT, LEAVE_GROUP, SYNC_GROUP = 8, 11, 12, 13, 14
VERSIONS = {JOIN_GROUP: range(10), SYNC_GROUP: range(6), HEARTBEAT: range(5),
            OFFSET_COMMIT: range(2, 9), LEAVE_GROUP: range(6)}
FLEXIBLE_FROM = {JOIN_GROUP: 6, SYNC_GROUP: 4, HEARTBEAT: 4, OFFSET_COMMIT: 8, LEAVE_GROUP: 4}
# Where the request first carries group_instance_id (static membership, KIP-345).
INSTANCE_ID_FROM = {JOIN_GROUP: 5, SYNC_GROUP: 3, HEARTBEAT: 3, OFFSET_COMMIT: 7}

# Past the bound, and multi-byte: the bound is in UTF-8 bytes (1,026 here), not characters.
LONG = "ü" * (MAX_ID_BYTES // 2 + 1)
SHORT = "nobody"
GROUP = "g"
IID = "i1"


class _Raw:
    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.corr = sock, 0

    def call(self, key: int, version: int, body: dict[str, Any]) -> Any:
        self.corr += 1
        self.sock.sendall(request_frame(key, version, self.corr, body))
        return response(self.sock, key, version, 5 if version >= FLEXIBLE_FROM[key] else 4)


def _join_body(member_id: str, instance_id: str | None = None) -> dict[str, Any]:
    return {"group_id": GROUP, "session_timeout": 30_000, "rebalance_timeout": 30_000,
            "member_id": member_id, "group_instance_id": instance_id,
            "protocol_type": "consumer", "protocols": [{"name": "range", "metadata": b"a"}],
            "reason": None}


def _bodies(member_id: str, generation: int, instance_id: str | None
            ) -> dict[int, dict[str, Any]]:
    """Each API's request naming ``member_id`` (fields a version lacks are left out)."""
    return {
        JOIN_GROUP: _join_body(member_id, instance_id),
        SYNC_GROUP: {"group_id": GROUP, "generation_id": generation, "member_id": member_id,
                     "group_instance_id": instance_id, "protocol_type": "consumer",
                     "protocol_name": "range", "assignments": []},
        HEARTBEAT: {"group_id": GROUP, "generation_id": generation, "member_id": member_id,
                    "group_instance_id": instance_id},
        OFFSET_COMMIT: {"group_id": GROUP, "generation_id_or_member_epoch": generation,
                        "member_id": member_id, "group_instance_id": instance_id,
                        "retention_time": -1, "topics": [{"name": "t", "partitions": [
                            {"partition_index": 0, "committed_offset": 5,
                             "committed_leader_epoch": -1, "committed_metadata": ""}]}]},
    }


def _codes(key: int, resp: Any) -> Any:
    """The answer's error code(s): one per partition for OffsetCommit."""
    if key == OFFSET_COMMIT:
        return [p.error_code.value for t in resp.topics for p in t.partitions]
    return resp.error_code.value


def _expected(key: int, code: int) -> Any:
    return [code] if key == OFFSET_COMMIT else code


@pytest.fixture
def raw(gateway: GatewayThread, topics: Topics) -> Any:
    topics.create("t", 1)
    sock = connect(gateway)
    try:
        yield _Raw(sock)
    finally:
        sock.close()


def _stable_static_member(raw: _Raw) -> tuple[int, str]:
    """A group with one static member (instance id IID) that has synced: its generation and
    member id."""
    joined = raw.call(JOIN_GROUP, 5, _join_body("", IID))
    assert joined.error_code.value == Errors.NONE
    gen, mid = joined.generation_id, joined.member_id
    synced = raw.call(SYNC_GROUP, 3, {
        "group_id": GROUP, "generation_id": gen, "member_id": mid, "group_instance_id": IID,
        "assignments": [{"member_id": mid, "assignment": b"A"}]})
    assert (synced.error_code.value, synced.assignment) == (Errors.NONE, b"A")
    return gen, mid


def _check_join_error(resp: Any, version: int, member_id: str, code: int) -> None:
    """Kafka's JoinGroup error reply (GroupCoordinator.joinError): the request's member id."""
    assert resp.error_code.value == code
    assert (resp.generation_id, resp.leader, resp.member_id) == (-1, "", member_id)
    assert resp.protocol_name in (None, "")  # (nullable from v7; v0-6: the empty string)
    assert tuple(resp.members) == ()
    if version >= 7:
        assert resp.protocol_type is None
    if version >= 9:
        assert resp.skip_assignment is False


@pytest.mark.parametrize("key", [JOIN_GROUP, SYNC_GROUP, HEARTBEAT, OFFSET_COMMIT])
@pytest.mark.parametrize(("instance_id", "code"), [(None, Errors.UNKNOWN_MEMBER_ID),
                                                   (IID, Errors.FENCED_INSTANCE_ID)])
def test_an_id_past_the_bound_is_answered_as_a_short_unknown_id_at_every_version(
        raw: _Raw, key: int, instance_id: str | None, code: int) -> None:
    """An unknown member, or, beside a member's instance id (from the first version that
    carries one), a fenced one."""
    gen, mid = _stable_static_member(raw)
    for version in VERSIONS[key]:
        if instance_id is not None and version < INSTANCE_ID_FROM[key]:
            continue
        for who in (LONG, SHORT):
            resp = raw.call(key, version, _bodies(who, gen, instance_id)[key])
            assert _codes(key, resp) == _expected(key, code), (version, who)
            if key == JOIN_GROUP:
                _check_join_error(resp, version, who, code)
    # The group's member is untouched, in its generation.
    beat = raw.call(HEARTBEAT, 3, _bodies(mid, gen, IID)[HEARTBEAT])
    assert beat.error_code.value == Errors.NONE


@pytest.mark.parametrize("key", [JOIN_GROUP, SYNC_GROUP, HEARTBEAT])
def test_an_id_past_the_bound_in_a_group_that_does_not_exist(raw: _Raw, key: int) -> None:
    """Kafka answers a JoinGroup with a member id, a SyncGroup or a Heartbeat to a group it
    does not have UNKNOWN_MEMBER_ID (and makes no group)."""
    for version in VERSIONS[key]:
        for who in (LONG, SHORT):
            resp = raw.call(key, version, _bodies(who, 1, None)[key])
            assert _codes(key, resp) == Errors.UNKNOWN_MEMBER_ID, (version, who)
            if key == JOIN_GROUP:
                _check_join_error(resp, version, who, Errors.UNKNOWN_MEMBER_ID)


def test_a_leave_past_the_bound_is_answered_by_itself_at_every_version(raw: _Raw) -> None:
    gen, mid = _stable_static_member(raw)
    for version in VERSIONS[LEAVE_GROUP]:
        if version < 3:
            resp = raw.call(LEAVE_GROUP, version, {"group_id": GROUP, "member_id": LONG})
            assert resp.error_code.value == Errors.UNKNOWN_MEMBER_ID, version
            continue
        resp = raw.call(LEAVE_GROUP, version, {"group_id": GROUP, "members": [
            {"member_id": LONG, "group_instance_id": None, "reason": None}]})
        assert resp.error_code.value == Errors.NONE, version
        assert [(m.member_id, m.error_code.value) for m in resp.members] == [
            (LONG, Errors.UNKNOWN_MEMBER_ID)], version
    beat = raw.call(HEARTBEAT, 4, _bodies(mid, gen, IID)[HEARTBEAT])
    assert beat.error_code.value == Errors.NONE
