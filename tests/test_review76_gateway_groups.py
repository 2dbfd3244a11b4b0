"""Review 76: the gateway's consumer-group handlers, where they answer otherwise than Kafka's
classic group coordinator.

Each test here fails on the code it was written against (see the review's report)."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("kio")

from gateway_harness import call_once

from rcoord.errors import Errors

TOO_LONG = "x" * 1025  # past MAX_ID_BYTES: no member can have this id


def _join_static(gateway: Any, group: str, instance: str) -> Any:
    """A static member's JoinGroup v5 into a new group: it leads at once (no member id round)."""
    joined = call_once(gateway, 11, 5, {
        "group_id": group, "session_timeout": 30_000, "rebalance_timeout": 30_000,
        "member_id": "", "group_instance_id": instance, "protocol_type": "consumer",
        "protocols": [{"name": "range", "metadata": b"a"}]}, 4)
    assert joined.error_code.value == Errors.NONE
    return joined


def _leave(gateway: Any, group: str, *members: tuple[str, str | None]) -> Any:
    return call_once(gateway, 13, 5, {"group_id": group, "members": [
        {"member_id": m, "group_instance_id": i, "reason": None} for m, i in members]})


def _states(gateway: Any, *groups: str) -> list[str]:
    described = call_once(gateway, 15, 5, {"groups": list(groups),
                                           "include_authorized_operations": False})
    return [g.group_state for g in described.groups]


@pytest.mark.parametrize("stranger", [(TOO_LONG, None), ("", ""), ("", TOO_LONG)],
                         ids=["long-member-id", "empty-instance-id", "long-instance-id"])
def test_a_leave_batch_answers_an_identity_no_member_can_have_by_itself(gateway, stranger):
    """Kafka's classicGroupLeaveToClassicGroup answers each identity of a LeaveGroup v3+ by
    itself: one that names no member (an id longer than any member's, or an instance id no
    static member has, the empty one too) is UNKNOWN_MEMBER_ID, and the other members of the
    batch leave. The gateway refused the whole request INVALID_REQUEST, so an admin's batch
    removal (``removeMembersFromConsumerGroup``) removed none of the members it named."""
    _join_static(gateway, "g", "i1")
    left = _leave(gateway, "g", ("", "i1"), stranger)
    assert left.error_code.value == Errors.NONE
    assert [(m.member_id, m.group_instance_id, m.error_code.value) for m in left.members] == [
        ("", "i1", Errors.NONE), (*stranger, Errors.UNKNOWN_MEMBER_ID)]
    assert _states(gateway, "g") == ["Empty"]


def test_a_leaders_assignment_for_an_id_no_member_can_have_is_ignored(gateway):
    """Kafka's classicGroupSyncToClassicGroup keeps, of the leader's assignments, those of the
    group's members (``assignment.getOrDefault(member.memberId(), EMPTY_ASSIGNMENT)``): an
    entry for any other member id is ignored and the generation completes. The gateway refused
    the leader's SyncGroup INVALID_REQUEST when one entry's member id was longer than any
    member's can be, so the group never became Stable and its followers waited out the
    rebalance timeout."""
    joined = _join_static(gateway, "g", "i1")
    synced = call_once(gateway, 14, 5, {
        "group_id": "g", "generation_id": joined.generation_id, "member_id": joined.member_id,
        "group_instance_id": "i1", "protocol_type": "consumer", "protocol_name": "range",
        "assignments": [{"member_id": joined.member_id, "assignment": b"A"},
                        {"member_id": TOO_LONG, "assignment": b"B"}]})
    assert (synced.error_code.value, synced.assignment) == (Errors.NONE, b"A")
    assert _states(gateway, "g") == ["Stable"]
