"""LeaveGroup (batch form, KIP-345): member identities, checks and the result types.

Top-level errors: INVALID_GROUP_ID, COORDINATOR_NOT_AVAILABLE. Per member: UNKNOWN_MEMBER_ID
(unknown id, unknown instance id, or unknown group), FENCED_INSTANCE_ID (the instance id belongs
to another member id).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack

from ..errors import Errors, InvalidRequestError
from ._checks import MAX_ITEMS_PER_CALL, check_id, check_instance_id, require_str

__all__ = ["MemberIdentity", "LeaveMemberResult", "LeaveGroupResult", "leave_args"]

MAX_LEAVING = MAX_ITEMS_PER_CALL
"""Most members one LeaveGroup may name: they leave in one script call (one rebalance), so a
longer list is refused, not split."""


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


def leave_args(group_id: Any, members: Any) -> tuple[str, list[MemberIdentity], bytes]:
    """(group id, the identities, ARGV[3] of leave_group.lua)."""
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
        packed.append([check_id("member_id", m.member_id).encode(),
                       check_instance_id(m.group_instance_id).encode()])
        idents.append(m)
    return group_id, idents, msgpack.packb(packed, use_bin_type=False)


def decode_leave(reply: list[Any], members: list[MemberIdentity]) -> LeaveGroupResult:
    top = Errors.from_name(reply[0])
    codes = reply[1] if len(reply) > 1 else []
    if top is not Errors.NONE:
        return LeaveGroupResult(error=top)
    return LeaveGroupResult(
        error=top,
        members=[
            LeaveMemberResult(m.member_id, m.group_instance_id, Errors.from_name(code))
            for m, code in zip(members, codes, strict=True)
        ],
    )
