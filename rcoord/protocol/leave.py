"""LeaveGroup (batch form, KIP-345): member identities, checks and the result types.

Top-level errors: INVALID_GROUP_ID, COORDINATOR_NOT_AVAILABLE. Per member: UNKNOWN_MEMBER_ID
(unknown id, unknown instance id, or unknown group), FENCED_INSTANCE_ID (the instance id belongs
to another member id).

An identity that names no possible member (an id past MAX_ID_BYTES, an empty instance id) is
answered by itself, as Kafka's classicGroupLeaveToClassicGroup answers each identity: refusing
the request for it left every other member of an admin's batch removal in the group.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack

from ..errors import Errors, InvalidRequestError
from ._checks import MAX_ID_BYTES, MAX_ITEMS_PER_CALL, check_id, member_ref, require_str

__all__ = ["LeaveGroupResult", "LeaveMemberResult", "MemberIdentity", "leave_args"]

MAX_LEAVING = MAX_ITEMS_PER_CALL
"""Most members one LeaveGroup may name; a longer list is refused, not split."""

LEAVE_CHUNK = 100
"""Members one function call removes. A longer request is sent as consecutive calls of this many,
in request order; each call checks its members as if the earlier ones had left, as one call
checks its own, so the per-member answers are those of one call. What changes is that other
requests may come between two calls, which is a history Kafka allows too (members leaving a
moment apart). Removing 500 of 1,000 members in one call held the shard for 3-5.5 ms; 100 take
about 1 ms (``bench/leave_batch.py``)."""


@dataclass(frozen=True)
class MemberIdentity:
    """A member to remove: by member id, or by instance id with an empty member id."""

    member_id: str = ""
    group_instance_id: str | None = None
    reason: str | None = None


@dataclass(frozen=True)
class LeaveMemberResult:
    member_id: str
    group_instance_id: str | None
    error: Errors


@dataclass(frozen=True)
class LeaveGroupResult:
    error: Errors
    members: list[LeaveMemberResult] = field(default_factory=list)


def _names_no_static_member(member: MemberIdentity) -> bool:
    """An empty instance id or one past MAX_ID_BYTES is no static member's: Kafka answers
    UNKNOWN_MEMBER_ID whatever the member id, so it is not sent (the scripts read '' as "no
    instance id")."""
    if member.group_instance_id is None:
        return False
    size = len(require_str("group_instance_id", member.group_instance_id).encode())
    return not 0 < size <= MAX_ID_BYTES


def leave_args(group_id: Any, members: Any) -> tuple[str, list[MemberIdentity], list[bytes]]:
    """(group id, the identities, ARGV[3] of leave_group.lua for each call: ``LEAVE_CHUNK``
    members each, at least one call). An identity naming no static member is left out of the
    calls; ``decode_leave`` answers it."""
    group_id = check_id("group_id", group_id)
    if isinstance(members, (str, bytes)) or not isinstance(members, Sequence):
        raise TypeError("members must be a sequence of MemberIdentity")
    if len(members) > MAX_LEAVING:
        raise InvalidRequestError(f"at most {MAX_LEAVING} members may leave in one call")
    idents: list[MemberIdentity] = []
    packed = []
    for m in members:
        if not isinstance(m, MemberIdentity):
            raise TypeError(f"members must be MemberIdentity values, got {type(m).__name__}")
        if m.reason is not None:
            require_str("reason", m.reason)
        member_id = member_ref(m.member_id).encode()
        idents.append(m)
        if _names_no_static_member(m):
            continue
        packed.append([member_id,
                       (m.group_instance_id or "").encode()])
    chunks = [msgpack.packb(packed[i:i + LEAVE_CHUNK], use_bin_type=False)
              for i in range(0, len(packed), LEAVE_CHUNK)]
    return group_id, idents, chunks or [msgpack.packb([], use_bin_type=False)]


def decode_leave(replies: list[list[Any]], members: list[MemberIdentity]) -> LeaveGroupResult:
    """The result of a LeaveGroup sent as ``replies`` (one per call, in order; the caller stops
    after a top-level error). A top-level error of the first call is the request's; one of a
    later call (the group died between calls) is the answer of every member not yet removed,
    since those before it did leave. An identity naming no static member, which no call carried,
    is UNKNOWN_MEMBER_ID in its place."""
    unsent = [i for i, m in enumerate(members) if _names_no_static_member(m)]
    codes: list[Any] = []
    for reply in replies:
        top = Errors.from_name(reply[0])
        if top is not Errors.NONE:
            if not codes:
                return LeaveGroupResult(error=top)
            codes.extend([reply[0]] * (len(members) - len(unsent) - len(codes)))
            break
        codes.extend(reply[1] if len(reply) > 1 else [])
    for i in unsent:  # ascending, so each lands at its request position
        codes.insert(i, b"UNKNOWN_MEMBER_ID")
    return LeaveGroupResult(
        error=Errors.NONE,
        members=[
            LeaveMemberResult(m.member_id, m.group_instance_id, Errors.from_name(code))
            for m, code in zip(members, codes, strict=True)
        ],
    )
