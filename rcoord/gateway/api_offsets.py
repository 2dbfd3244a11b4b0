"""OffsetCommit and OffsetFetch, through the same flows as rcoord's Python API.

Offsets are fenced by generation exactly as for rcoord's own members (the script decides), and
the empty member id with generation -1 is the simple (``assign()``) commit.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from ..errors import Errors
from ..protocol.offsets import OffsetAndMetadata, TopicPartition
from .registry import api
from .state import Connection
from .wire import millis

__all__: list[str] = []


def _by_topic(items: dict[TopicPartition, Any]) -> dict[str, list[tuple[int, Any]]]:
    out: dict[str, list[tuple[int, Any]]] = defaultdict(list)
    for tp, value in items.items():
        out[tp.topic].append((tp.partition, value))
    return out


@api(8, "OffsetCommit", 2, 8, group=True)
async def offset_commit(conn: Connection, req: Any, version: int) -> dict[str, Any]:
    offsets: dict[TopicPartition, OffsetAndMetadata | int] = {}
    for t in req.topics:
        for p in t.partitions:
            epoch = int(getattr(p, "committed_leader_epoch", -1))
            offsets[TopicPartition(t.name, p.partition_index)] = OffsetAndMetadata(
                p.committed_offset, p.committed_metadata or "", None if epoch < 0 else epoch)
    retention = getattr(req, "retention_time", None)
    retention_ms = None if retention is None else millis(retention)
    codes = await conn.state.coordinator.commit_offsets(
        req.group_id,
        offsets,
        member_id=req.member_id,
        generation_id=req.generation_id_or_member_epoch,
        group_instance_id=getattr(req, "group_instance_id", None),
        retention_ms=None if retention_ms is None or retention_ms < 0 else retention_ms,
    )
    return {"throttle_time": 0, "topics": [
        {"name": topic, "partitions": [{"partition_index": p, "error_code": code}
                                       for p, code in parts]}
        for topic, parts in _by_topic(codes).items()
    ]}


async def _fetch_group(conn: Connection, group_id: str, topics: Any) -> dict[str, Any]:
    wanted = None
    if topics is not None:
        wanted = [TopicPartition(t.name, p) for t in topics for p in t.partition_indexes]
    res = await conn.state.coordinator.fetch_offsets(group_id, wanted)
    return {"group_id": group_id, "error_code": res.error, "topics": [
        {"name": topic, "partitions": [{
            "partition_index": p,
            "committed_offset": om.offset,
            "committed_leader_epoch": -1 if om.leader_epoch is None else om.leader_epoch,
            "metadata": om.metadata,
            "error_code": Errors.NONE,
        } for p, om in parts]}
        for topic, parts in _by_topic(dict(res.offsets)).items()
    ]}


@api(9, "OffsetFetch", 1, 8, group=True)
async def offset_fetch(conn: Connection, req: Any, version: int) -> dict[str, Any]:
    if version >= 8:
        return {"throttle_time": 0, "groups": [
            await _fetch_group(conn, g.group_id, g.topics) for g in req.groups]}
    one = await _fetch_group(conn, req.group_id, req.topics)
    return {"throttle_time": 0, "topics": one["topics"], "error_code": one["error_code"]}
