"""The sans-I/O core of each protocol step: argument checks, request encoding, reply decoding.

One module per step (join, sync, heartbeat, leave). They do no I/O, so the sync
``GroupCoordinator`` and any asyncio front end share them.
"""

from .heartbeat import decode_heartbeat
from .join import JoinGroupMember, JoinGroupResult, JoinRequest
from .leave import LeaveGroupResult, LeaveMemberResult, MemberIdentity
from .sync import SyncGroupResult, SyncRequest

__all__ = [
    "JoinGroupMember",
    "JoinGroupResult",
    "JoinRequest",
    "LeaveGroupResult",
    "LeaveMemberResult",
    "MemberIdentity",
    "SyncGroupResult",
    "SyncRequest",
    "decode_heartbeat",
]
