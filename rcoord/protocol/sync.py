"""SyncGroup: request checks and encoding, and the result type.

Possible errors in ``SyncGroupResult.error``: INVALID_GROUP_ID, UNKNOWN_MEMBER_ID (unknown member,
unknown or Empty group), FENCED_INSTANCE_ID, ILLEGAL_GENERATION, INCONSISTENT_GROUP_PROTOCOL
(the given protocol type or name differs from the group's), REBALANCE_IN_PROGRESS (the group is
rebalancing, or the rebalance this sync waited on was aborted), COORDINATOR_NOT_AVAILABLE.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import msgpack

from ..errors import Errors
from ._checks import (
    MAX_ID_BYTES,
    MAX_REQUEST_BYTES,
    check_count,
    check_id,
    check_instance_id,
    check_total,
    member_ref,
    optional_text,
    require_bytes,
    require_int32,
    require_str,
)

__all__ = ["SyncGroupResult", "SyncRequest"]


@dataclass(frozen=True)
class SyncGroupResult:
    """Kafka's SyncGroupResponse: this member's assignment for the generation."""

    error: Errors
    protocol_type: str | None = None
    protocol_name: str | None = None
    assignment: bytes = b""
    parked_ms: int | None = field(default=None, compare=False)
    """For a call that parked (a follower's, until the leader's assignment is stored): the
    coordinator's time from the call's arrival to the answer, which refreshed the member's
    session (sync_group.lua). None for a call answered at once, whose arrival refreshed it.
    A member counts its session from the sending of its SyncGroup plus this (rcoord.client's
    ``join_generation``): only a difference of server times, so no clock offset enters."""

    @classmethod
    def decode(cls, blob: bytes, parked_at_ms: int | None = None) -> SyncGroupResult:
        """``parked_at_ms``: the server time at which the call parked, if it did."""
        rep = msgpack.unpackb(blob, raw=True)
        asg = rep.get(b"asg") or b""
        answered_at = rep.get(b"at")
        return cls(
            error=Errors.from_name(rep[b"e"]),
            protocol_type=optional_text(rep.get(b"pt")),
            protocol_name=optional_text(rep.get(b"pn")),
            assignment=bytes(asg),
            parked_ms=(int(answered_at) - parked_at_ms
                       if parked_at_ms is not None and isinstance(answered_at, int | float)
                       and not isinstance(answered_at, bool) else None),
        )


def _optional(name: str, value: Any) -> str:
    return "" if value is None else "=" + check_id(name, value)


def _pack_assignments(assignments: Any) -> bytes:
    """The leader's assignments, stored in one script call: a generation's assignment is one
    decision, so it is refused, not split, above MAX_ITEMS_PER_CALL members (no generation
    larger than that can complete) or MAX_REQUEST_BYTES in all. An entry whose member id is past
    MAX_ID_BYTES is no member's and is dropped: Kafka keeps only its members' entries
    (setAndPropagateAssignment), as the script does for an unknown id; refusing the sync for it
    left the group CompletingRebalance and its followers waiting out the rebalance timeout."""
    if not isinstance(assignments, Mapping):
        raise TypeError("assignments must be a mapping of member id -> bytes")
    check_count("assignments", assignments)
    out: dict[bytes, bytes] = {}
    total = 0
    for k, v in assignments.items():
        key = require_str("assignment member id", k).encode()
        value = require_bytes(f"assignment for {k!r}", v)
        if len(key) > MAX_ID_BYTES:
            continue
        total += len(key) + len(value)
        check_total("assignments", total, MAX_REQUEST_BYTES)
        out[key] = value
    packed: bytes = msgpack.packb(out, use_bin_type=False)
    return packed


@dataclass(frozen=True)
class SyncRequest:
    group_id: str
    generation_id: int
    member_id: str
    group_instance_id: str
    protocol_type: str
    protocol_name: str
    assignments: bytes

    @classmethod
    def build(
        cls,
        group_id: Any,
        generation_id: Any,
        member_id: Any,
        *,
        assignments: Any,
        group_instance_id: Any,
        protocol_type: Any,
        protocol_name: Any,
    ) -> SyncRequest:
        packed = b""
        if assignments is not None:
            packed = _pack_assignments(assignments)
        return cls(
            group_id=check_id("group_id", group_id),
            generation_id=require_int32("generation_id", generation_id),
            member_id=member_ref(member_id),
            group_instance_id=check_instance_id(group_instance_id),
            protocol_type=_optional("protocol_type", protocol_type),
            protocol_name=_optional("protocol_name", protocol_name),
            assignments=packed,
        )

    def args(self) -> list[Any]:
        """ARGV[3:] of sync_group.lua."""
        return [
            self.member_id,
            self.generation_id,
            self.group_instance_id,
            self.protocol_type,
            self.protocol_name,
            self.assignments,
        ]
