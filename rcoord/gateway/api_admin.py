"""DescribeGroups, ListGroups, DeleteGroups and OffsetDelete, through the same flows as
rcoord's Python API (``rcoord.steps``): a group formed by Kafka clients and one formed by
rcoord's own members look the same to both front ends.

ACLs, as Kafka's ``KafkaApis``: DescribeGroups needs DESCRIBE on each group (else that group
is answered GROUP_AUTHORIZATION_FAILED), and from v3 on, when the request sets
``include_authorized_operations``, each group described without error carries the bitfield of
those of READ, DESCRIBE and DELETE the principal may do on it (all three when no ACLs are
configured); not asked for, or for a group answered with an error, the field is Kafka's
sentinel, -2**31. ListGroups lists every group to a principal with
DESCRIBE on the cluster, else only the groups it may DESCRIBE; DeleteGroups needs DELETE on each
group; OffsetDelete DELETE on the group and READ on each topic. Then, as Kafka's
``handleOffsetDeleteRequest`` checks its metadata cache, a partition of a topic that does not
exist, or one outside the topic's partitions (a negative index too), is answered
UNKNOWN_TOPIC_OR_PARTITION and not deleted; the request's other partitions are handled as usual.
A whole-group error (GROUP_ID_NOT_FOUND, NON_EMPTY_GROUP, ...) is answered alone with no topics,
as Kafka's ``OffsetDeleteResponse.Builder.merge`` drops the per-partition answers for it."""

from __future__ import annotations

from typing import Any

from ..errors import Errors, InvalidRequestError
from ..protocol._checks import check_id
from ..protocol.admin import GroupDescription
from ..protocol.offsets import TopicPartition
from ..state import GroupState
from .acl import Operation, ResourceType
from .api_meta import readable_partitions
from .errors import GROUP_AUTHORIZATION_FAILED, UNREACHED, log_unreached
from .registry import api
from .state import Connection

__all__: list[str] = []


_AUTHORIZED_OPERATIONS_SINCE = 3
"""DescribeGroups v3 (KIP-430) added ``include_authorized_operations``; a group's
``authorized_operations`` is Kafka's sentinel (-2**31) unless it is asked for."""


def may_exist(group_id: str) -> bool:
    """Whether a group can exist under ``group_id``: rcoord stores no id longer than
    MAX_ID_BYTES (docs/architecture.md, "Limits"), which Kafka's broker accepts. In a request
    naming several groups such an id is answered as a group that does not exist, so that the
    others get their real answers; refused with INVALID_REQUEST, it failed the whole request
    (every group's offsets hidden, none of a DeleteGroups' groups deleted)."""
    try:
        check_id("group_id", group_id)
    except InvalidRequestError:
        return False
    return True


@api(15, "DescribeGroups", 0, 5, group=True)
async def describe_groups(conn: Connection, req: Any, version: int) -> dict[str, Any]:
    with_operations = version >= _AUTHORIZED_OPERATIONS_SINCE and bool(
        getattr(req, "include_authorized_operations", False))
    groups: list[dict[str, Any]] = []
    for gid in req.groups:
        if not conn.may(Operation.DESCRIBE, ResourceType.GROUP, gid):
            groups.append({"error_code": GROUP_AUTHORIZATION_FAILED, "group_id": gid,
                           "group_state": "", "protocol_type": "", "protocol_data": "",
                           "members": []})
            continue
        try:
            d = await conn.state.coordinator.describe_group(gid) if may_exist(gid) \
                else GroupDescription(Errors.NONE, gid, GroupState.DEAD.value)
        except UNREACHED as exc:
            # This group alone (on a cluster, its slot with no master), as Kafka answers by
            # group: it failed the request for every group named.
            log_unreached(conn.state, f"DescribeGroups v{version} of {gid!r}", exc)
            d = GroupDescription(Errors.COORDINATOR_NOT_AVAILABLE, gid, "")
        groups.append({
            "error_code": d.error, "group_id": d.group_id, "group_state": d.state,
            "protocol_type": d.protocol_type, "protocol_data": d.protocol_name,
            "members": [{
                "member_id": m.member_id, "group_instance_id": m.group_instance_id,
                "client_id": m.client_id, "client_host": m.client_host,
                "member_metadata": m.metadata, "member_assignment": m.assignment,
            } for m in d.members],
        })
        if with_operations and d.error == Errors.NONE:
            groups[-1]["authorized_operations"] = conn.authorized_operations(
                ResourceType.GROUP, d.group_id)
    return {"throttle_time": 0, "groups": groups}


@api(16, "ListGroups", 0, 4, group=True)
async def list_groups(conn: Connection, req: Any, version: int) -> dict[str, Any]:
    listings = await conn.state.coordinator.list_groups(
        list(getattr(req, "states_filter", ()) or ()))
    if not conn.may(Operation.DESCRIBE, ResourceType.CLUSTER, log_denied=False):
        listings = [g for g in listings
                    if conn.may(Operation.DESCRIBE, ResourceType.GROUP, g.group_id,
                                log_denied=False)]
    return {"throttle_time": 0, "error_code": Errors.NONE, "groups": [
        {"group_id": g.group_id, "protocol_type": g.protocol_type, "group_state": g.state}
        for g in listings]}


@api(42, "DeleteGroups", 0, 2, group=True)
async def delete_groups(conn: Connection, req: Any, version: int) -> dict[str, Any]:
    names = list(req.groups_names)
    allowed = [g for g in names if conn.may(Operation.DELETE, ResourceType.GROUP, g)]
    results: dict[str, int] = {g: GROUP_AUTHORIZATION_FAILED for g in names if g not in allowed}
    results.update((g, Errors.GROUP_ID_NOT_FOUND) for g in allowed if not may_exist(g))
    for gid in dict.fromkeys(g for g in allowed if g not in results):
        # One group at a time (each was its own script call already), each failure to reach
        # it answered for it alone, as Kafka answers by group: in one call, a group whose
        # slot had no master failed the whole request after the groups before it were
        # deleted (told COORDINATOR_NOT_AVAILABLE, their retry GROUP_ID_NOT_FOUND), and the
        # groups after it were not tried.
        try:
            results.update(await conn.state.coordinator.delete_groups([gid]))
        except UNREACHED as exc:
            log_unreached(conn.state, f"DeleteGroups v{version} of {gid!r}", exc)
            results[gid] = Errors.COORDINATOR_NOT_AVAILABLE
    return {"throttle_time": 0, "results": [{"group_id": gid, "error_code": results[gid]}
                                            for gid in dict.fromkeys(names)]}


@api(47, "OffsetDelete", 0, 0, group=True)
async def offset_delete(conn: Connection, req: Any, version: int) -> dict[str, Any]:
    conn.require(Operation.DELETE, ResourceType.GROUP, req.group_id)
    if not may_exist(req.group_id):
        # (as OffsetFetch and DeleteGroups: a name too long to store names no group; the
        # script's refusal of it was answered INVALID_REQUEST)
        return {"throttle_time": 0, "error_code": Errors.GROUP_ID_NOT_FOUND, "topics": []}
    known, refused = await readable_partitions(conn, req.topics)
    res = await conn.state.coordinator.delete_offsets(
        req.group_id, list(dict.fromkeys(tp for tp, _ in known)))
    if res.error != Errors.NONE:  # the group's error alone, as Kafka's response builder
        return {"throttle_time": 0, "error_code": res.error, "topics": []}
    codes = {**res.partitions, **refused}  # (refused: not deleted)
    # Every entry of the request answered, in its order, a topic or partition named twice
    # twice, as Kafka's ``OffsetMetadataManager.deleteOffsets``; answers gathered by topic
    # and partition answered such a partition once.
    return {"throttle_time": 0, "error_code": res.error, "topics": [
        {"name": t.name, "partitions": [
            {"partition_index": p.partition_index,
             "error_code": codes[TopicPartition(t.name, p.partition_index)]}
            for p in t.partitions]}
        for t in req.topics]}
