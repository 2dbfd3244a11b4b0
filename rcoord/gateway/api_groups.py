"""JoinGroup, SyncGroup, Heartbeat, LeaveGroup: Kafka's group requests, served by the same
flows as rcoord's Python API (``rcoord.asyncio.AsyncGroupCoordinator`` over ``rcoord.steps``).

Metadata and assignments are opaque bytes to the coordinator, so a Kafka client's own
ConsumerProtocol subscription and assignment pass through unchanged, and the Kafka client that
is elected leader computes the assignment, as with a Kafka broker. A parked JoinGroup or
SyncGroup awaits its reply on this connection's task only; other connections go on.

With ACLs, each of these needs READ on the group (Kafka's ``KafkaApis``), else the request is
answered GROUP_AUTHORIZATION_FAILED without touching the group.
"""

from __future__ import annotations

from typing import Any

from ..errors import Errors
from ..protocol.leave import MemberIdentity
from .acl import Operation, ResourceType
from .errors import GROUP_AUTHORIZATION_FAILED
from .registry import api
from .state import Connection
from .wire import millis

__all__: list[str] = []

# JoinGroup v4 (KIP-394): a member without an id is first given one (MEMBER_ID_REQUIRED).
_MEMBER_ID_REQUIRED_FROM = 4
# JoinGroup v9 (KIP-814): SkipAssignment, for a static leader back in a Stable group.
_SKIP_ASSIGNMENT_FROM = 9


@api(11, "JoinGroup", 0, 9, group=True)
async def join_group(conn: Connection, req: Any, version: int) -> dict[str, Any]:
    if not conn.may(Operation.READ, ResourceType.GROUP, req.group_id):
        return {"throttle_time": 0, "error_code": GROUP_AUTHORIZATION_FAILED,
                "generation_id": -1, "protocol_name": None, "leader": "", "member_id": "",
                "members": []}
    session_ms = millis(req.session_timeout)
    rebalance = getattr(req, "rebalance_timeout", None)
    if rebalance is not None:
        # Kafka takes any rebalance timeout (it bounds only the session timeout): one below
        # 1 ms waits for no member. rcoord refuses it, and was answered INVALID_REQUEST; 1 ms is
        # the least it takes, the same wait to a millisecond.
        rebalance = max(1, millis(rebalance))
    res = await conn.state.coordinator.join_group(
        req.group_id,
        req.member_id,
        protocol_type=req.protocol_type,
        protocols=[(p.name, p.metadata) for p in req.protocols],
        session_timeout_ms=session_ms,
        rebalance_timeout_ms=rebalance,  # v0: None, the session timeout
        group_instance_id=getattr(req, "group_instance_id", None),
        client_id=conn.client_id,
        client_host=f"/{conn.client_host}",  # Kafka's form: InetAddress.toString
        require_known_member_id=version >= _MEMBER_ID_REQUIRED_FROM,
        reason=getattr(req, "reason", None),
        supports_skip_assignment=version >= _SKIP_ASSIGNMENT_FROM,
    )
    return {
        "throttle_time": 0,
        "error_code": res.error,
        "generation_id": res.generation_id,
        "protocol_type": res.protocol_type,
        "protocol_name": res.protocol_name,
        "leader": res.leader_id,
        "skip_assignment": res.skip_assignment,
        "member_id": res.member_id,
        "members": [{"member_id": m.member_id, "group_instance_id": m.group_instance_id,
                     "metadata": m.metadata} for m in res.members],
    }


@api(14, "SyncGroup", 0, 5, group=True)
async def sync_group(conn: Connection, req: Any, version: int) -> dict[str, Any]:
    if version >= 5 and (req.protocol_type is None or req.protocol_name is None):
        # Mandatory from v5 (Kafka's SyncGroupRequest.areMandatoryProtocolTypeAndNamePresent),
        # checked before the group is touched, and before the ACL, as KafkaApis does.
        return {"throttle_time": 0, "error_code": Errors.INCONSISTENT_GROUP_PROTOCOL,
                "protocol_type": None, "protocol_name": None, "assignment": b""}
    conn.require(Operation.READ, ResourceType.GROUP, req.group_id)
    res = await conn.state.coordinator.sync_group(
        req.group_id,
        req.generation_id,
        req.member_id,
        assignments={a.member_id: a.assignment for a in req.assignments},
        group_instance_id=getattr(req, "group_instance_id", None),
        protocol_type=getattr(req, "protocol_type", None),
        protocol_name=getattr(req, "protocol_name", None),
    )
    return {"throttle_time": 0, "error_code": res.error, "protocol_type": res.protocol_type,
            "protocol_name": res.protocol_name, "assignment": res.assignment}


@api(12, "Heartbeat", 0, 4, group=True)
async def heartbeat(conn: Connection, req: Any, version: int) -> dict[str, Any]:
    conn.require(Operation.READ, ResourceType.GROUP, req.group_id)
    code = await conn.state.coordinator.heartbeat(
        req.group_id, req.generation_id, req.member_id, getattr(req, "group_instance_id", None))
    return {"throttle_time": 0, "error_code": code}


@api(13, "LeaveGroup", 0, 5, group=True)
async def leave_group(conn: Connection, req: Any, version: int) -> dict[str, Any]:
    conn.require(Operation.READ, ResourceType.GROUP, req.group_id)
    if version < 3:
        members = [MemberIdentity(req.member_id)]
    else:
        members = [MemberIdentity(m.member_id, m.group_instance_id, getattr(m, "reason", None))
                   for m in req.members]
    res = await conn.state.coordinator.leave_group(req.group_id, members)
    if version < 3 and res.members and res.error == 0:
        # One member, answered by the top-level code as before batch leave (KIP-345).
        return {"throttle_time": 0, "error_code": res.members[0].error}
    return {
        "throttle_time": 0,
        "error_code": res.error,
        "members": [{"member_id": m.member_id, "group_instance_id": m.group_instance_id,
                     "error_code": m.error} for m in res.members],
    }
