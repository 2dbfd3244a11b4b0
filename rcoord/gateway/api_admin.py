"""DescribeGroups, ListGroups, DeleteGroups and OffsetDelete, through the same flows as
rcoord's Python API (``rcoord.steps``): a group formed by Kafka clients and one formed by
rcoord's own members look the same to both front ends."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from ..errors import Errors
from ..protocol.offsets import TopicPartition
from .registry import api
from .state import Connection

__all__: list[str] = []


@api(15, "DescribeGroups", 0, 5, group=True)
async def describe_groups(conn: Connection, req: Any, version: int) -> dict[str, Any]:
    groups = []
    for gid in req.groups:
        d = await conn.state.coordinator.describe_group(gid)
        groups.append({
            "error_code": d.error, "group_id": d.group_id, "group_state": d.state,
            "protocol_type": d.protocol_type, "protocol_data": d.protocol_name,
            "members": [{
                "member_id": m.member_id, "group_instance_id": m.group_instance_id,
                "client_id": m.client_id, "client_host": m.client_host,
                "member_metadata": m.metadata, "member_assignment": m.assignment,
            } for m in d.members],
        })
    return {"throttle_time": 0, "groups": groups}


@api(16, "ListGroups", 0, 4, group=True)
async def list_groups(conn: Connection, req: Any, version: int) -> dict[str, Any]:
    states = list(getattr(req, "states_filter", ()) or ()) or None
    listings = await conn.state.coordinator.list_groups(states)
    return {"throttle_time": 0, "error_code": Errors.NONE, "groups": [
        {"group_id": g.group_id, "protocol_type": g.protocol_type, "group_state": g.state}
        for g in listings]}


@api(42, "DeleteGroups", 0, 2, group=True)
async def delete_groups(conn: Connection, req: Any, version: int) -> dict[str, Any]:
    results = await conn.state.coordinator.delete_groups(list(req.groups_names))
    return {"throttle_time": 0, "results": [{"group_id": gid, "error_code": code}
                                            for gid, code in results.items()]}


@api(47, "OffsetDelete", 0, 0, group=True)
async def offset_delete(conn: Connection, req: Any, version: int) -> dict[str, Any]:
    wanted = [TopicPartition(t.name, p.partition_index) for t in req.topics for p in t.partitions]
    res = await conn.state.coordinator.delete_offsets(req.group_id, wanted)
    by_topic: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for tp, code in res.partitions.items():
        by_topic[tp.topic].append({"partition_index": tp.partition, "error_code": code})
    return {"throttle_time": 0, "error_code": res.error, "topics": [
        {"name": t, "partitions": parts} for t, parts in by_topic.items()]}
