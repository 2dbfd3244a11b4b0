"""Heartbeat: checks and the reply decoding.

Possible errors: INVALID_GROUP_ID, UNKNOWN_MEMBER_ID, FENCED_INSTANCE_ID, ILLEGAL_GENERATION,
REBALANCE_IN_PROGRESS (rejoin; the session was still refreshed), COORDINATOR_NOT_AVAILABLE.
"""

from __future__ import annotations

from typing import Any

from ..errors import Errors
from ._checks import check_id, check_instance_id, member_ref, require_int32

__all__ = ["decode_heartbeat", "heartbeat_args"]


def heartbeat_args(
    group_id: Any, generation_id: Any, member_id: Any, group_instance_id: Any
) -> tuple[str, list[Any]]:
    """(group id, ARGV[3:] of heartbeat.lua)."""
    return check_id("group_id", group_id), [
        member_ref(member_id),
        require_int32("generation_id", generation_id),
        check_instance_id(group_instance_id),
    ]


def decode_heartbeat(reply: bytes | str) -> Errors:
    return Errors.from_name(reply)
