"""OffsetCommit and OffsetFetch, through the same flows as rcoord's Python API.

Offsets are fenced by generation exactly as for rcoord's own members (the script decides), and
the empty member id with generation -1 is the simple (``assign()``) commit.

ACLs, as Kafka's ``KafkaApis``: OffsetCommit needs READ on the group (else every partition is
answered GROUP_AUTHORIZATION_FAILED) and READ on each topic (else that topic's partitions get
TOPIC_AUTHORIZATION_FAILED and are not committed). Then, as ``handleOffsetCommitRequest`` checks
its metadata cache, a partition of a topic that does not exist, or one outside the topic's
partitions (a negative index too), is answered UNKNOWN_TOPIC_OR_PARTITION and not committed; the
other partitions of the request are committed as usual. OffsetFetch needs DESCRIBE on the group and
DESCRIBE on a topic to see its offsets: a topic asked for by name is answered
TOPIC_AUTHORIZATION_FAILED, and a fetch of all the group's offsets leaves it out. It checks no
name or partition against the topics, as Kafka's ``handleOffsetFetchRequest``: a partition with
no commit answers -1 with no error, a negative one or one of a name no commit can be stored
under too (``_may_be_stored``), without being asked for.

Both answer every entry of the request, in its order, a partition named twice twice (Kafka's
``OffsetMetadataManager`` builds its response from the request's entries); an OffsetCommit
v2-v4 ``retention_time_ms`` is Kafka's (``_retention_ms``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator
from typing import Any

import redis.exceptions

from ..errors import Errors, InvalidRequestError, reraise_as_rcoord
from ..protocol.offsets import OffsetAndMetadata, TopicPartition, field_of, metadata_length
from ..topics.incarnation import created_times_async, older_than_their_topic, topics_to_judge
from .acl import Operation, ResourceType
from .api_admin import may_exist
from .api_meta import readable_partitions
from .errors import (
    GROUP_AUTHORIZATION_FAILED,
    TOPIC_AUTHORIZATION_FAILED,
    UNREACHED,
    log_unreached,
)
from .registry import api
from .state import Connection
from .wire import millis

__all__: list[str] = []


def _by_topic(items: dict[TopicPartition, Any]) -> dict[str, list[tuple[int, Any]]]:
    out: dict[str, list[tuple[int, Any]]] = defaultdict(list)
    for tp, value in items.items():
        out[tp.topic].append((tp.partition, value))
    return out


_GROUP_ID_NOT_FOUND_SINCE = 9
"""A commit with a generation to a group that does not exist is GROUP_ID_NOT_FOUND from
OffsetCommit v9 on; older versions get ILLEGAL_GENERATION, the code their clients know how to
handle (rejoin), as Kafka's ``OffsetMetadataManager.validateOffsetCommit`` answers them."""


@api(8, "OffsetCommit", 2, 8, group=True)
async def offset_commit(conn: Connection, req: Any, version: int) -> dict[str, Any]:
    if not conn.may(Operation.READ, ResourceType.GROUP, req.group_id):
        return {"throttle_time": 0, "topics": [
            {"name": t.name, "partitions": [
                {"partition_index": p.partition_index, "error_code": GROUP_AUTHORIZATION_FAILED}
                for p in t.partitions]} for t in req.topics]}
    known, refused = await readable_partitions(conn, req.topics)
    limit = conn.state.coordinator.config.offset_metadata_max_bytes
    # Per partition, the entry Kafka's records leave stored: the last one whose metadata fits,
    # else the last (refused). Only that one reaches the script (``_commit_answer``).
    entries: dict[TopicPartition, Any] = {}
    for tp, p in known:
        if tp not in entries or _fits(p, limit) or not _fits(entries[tp], limit):
            entries[tp] = p
    offsets: dict[TopicPartition, OffsetAndMetadata | int] = {}
    for tp, p in entries.items():
        # Only -1 means "no epoch"; Kafka stores any other as given (``Utils.ofSentinel``).
        epoch = int(getattr(p, "committed_leader_epoch", -1))
        offsets[tp] = OffsetAndMetadata(
            p.committed_offset, p.committed_metadata or "", None if epoch == -1 else epoch)
    codes: dict[TopicPartition, Any] = {}
    if offsets or not refused:
        codes = dict(await conn.state.coordinator.commit_offsets(
            req.group_id,
            offsets,
            member_id=req.member_id,
            generation_id=req.generation_id_or_member_epoch,
            group_instance_id=getattr(req, "group_instance_id", None),
            retention_ms=_retention_ms(req),
            required_acks=conn.state.config.commit_required_acks,
            ack_timeout_ms=conn.state.config.commit_ack_timeout_ms,
        ))
    if version < _GROUP_ID_NOT_FOUND_SINCE:
        codes = {tp: Errors.ILLEGAL_GENERATION if code == Errors.GROUP_ID_NOT_FOUND else code
                 for tp, code in codes.items()}
    codes.update(refused)
    return {"throttle_time": 0, "topics": [
        {"name": t.name, "partitions": [_commit_answer(t.name, p, codes, entries, limit)
                                        for p in t.partitions]} for t in req.topics]}


def _commit_answer(topic: str, p: Any, codes: dict[TopicPartition, Any],
                   entries: dict[TopicPartition, Any], limit: int) -> dict[str, Any]:
    """The answer to one entry of an OffsetCommit, as Kafka's ``OffsetMetadataManager
    .commitOffset`` gives it: every entry of the request is answered, in its order, one that
    names a partition again too, and their records are written in that order. An entry that
    did not reach the script shares its partition's answer, except that one whose metadata is
    too large is refused alone (OFFSET_METADATA_TOO_LARGE) when the commit went through;
    before, a partition named twice was answered once."""
    tp = TopicPartition(topic, p.partition_index)
    code = codes[tp]
    if code == Errors.NONE and entries[tp] is not p and not _fits(p, limit):
        code = Errors.OFFSET_METADATA_TOO_LARGE
    return {"partition_index": p.partition_index, "error_code": code}


def _fits(p: Any, limit: int) -> bool:
    """Whether an entry's metadata is within ``offset.metadata.max.bytes``, counted as Kafka
    counts it and as ``encode_commit`` does (``metadata_length``)."""
    return metadata_length(p.committed_metadata or "") <= limit


def _retention_ms(req: Any) -> int | None:
    """OffsetCommit v2-v4's ``retention_time_ms`` as ``commit_offsets`` takes it (None: the
    group's retention, Kafka's DEFAULT_RETENTION_TIME -1, and the field v5+ no longer have).
    Kafka's ``OffsetMetadataManager.expireTimestampMs`` takes any other value as commit time +
    retention, and ``OffsetExpirationConditionImpl`` expires an offset once the clock reaches
    that: a retention below -1 puts it in the past, and the offset is expired at the first
    retention check. 0 does the same here (it expires at the commit's own millisecond; rcoord
    takes no negative retention); it was taken for the default, a week."""
    retention = getattr(req, "retention_time", None)
    retention_ms = None if retention is None else millis(retention)
    if retention_ms is None or retention_ms == -1:
        return None
    return max(retention_ms, 0)


async def _fetch_group(conn: Connection, group_id: str, topics: Any, version: int
                       ) -> dict[str, Any]:
    if not conn.may(Operation.DESCRIBE, ResourceType.GROUP, group_id):
        # Kafka's OffsetFetchRequest.getErrorResponse: the partitions named, each with the
        # error, only in v0-1, which have no group-level error; from v2, none.
        return {"group_id": group_id, "error_code": GROUP_AUTHORIZATION_FAILED, "topics": [
            {"name": t.name, "partitions": [
                {"partition_index": p, "committed_offset": -1, "committed_leader_epoch": -1,
                 "metadata": "", "error_code": GROUP_AUTHORIZATION_FAILED}
                for p in t.partition_indexes]} for t in topics or ()] if version < 2 else []}
    wanted = None
    refused: list[dict[str, Any]] = []
    described: list[Any] = []  # the request's topics it may describe, in request order
    named = 0  # partitions named in those
    unasked = False  # a partition named that no commit can be stored under (``_may_be_stored``)
    if topics is not None:
        wanted = []
        for t in topics:
            if conn.may(Operation.DESCRIBE, ResourceType.TOPIC, t.name):
                described.append(t)
                named += len(t.partition_indexes)
                if _may_be_stored(t.name):
                    wanted += [TopicPartition(t.name, p) for p in t.partition_indexes if p >= 0]
                unasked = unasked or len(wanted) < named
            else:
                refused.append({"name": t.name, "partitions": [
                    {"partition_index": p, "committed_offset": -1, "committed_leader_epoch": -1,
                     "metadata": "", "error_code": TOPIC_AUTHORIZATION_FAILED}
                    for p in t.partition_indexes]})
    error, offsets = Errors.NONE, dict[TopicPartition, OffsetAndMetadata]()
    exists = may_exist(group_id)  # else no offsets: answered as a group that does not exist
    if exists and (wanted != [] or not (refused or unasked)):
        res = await conn.state.coordinator.fetch_offsets(group_id, wanted)
        error = res.error
        offsets = await _without_stale(conn, dict(res.offsets), listed=wanted is None)
    if wanted is None:  # all the group's offsets: only those of topics the caller may see
        answered = [{"name": topic, "partitions": _fetched(parts)}
                    for topic, parts in _by_topic(offsets).items()
                    if conn.may(Operation.DESCRIBE, ResourceType.TOPIC, topic, log_denied=False)]
    else:  # every entry asked for, in request order (one with no commit: -1, no error)
        answered = [{"name": t.name, "partitions": _fetched(_asked(t, offsets))}
                    for t in described]
    # Kafka's fetchOffsetsForGroup: the coordinator's answers, then the topics refused.
    return {"group_id": group_id, "error_code": error, "topics": answered + refused}


async def _fetch_group_alone(conn: Connection, group_id: str, topics: Any, version: int
                             ) -> dict[str, Any]:
    """One group of an OffsetFetch v8+, a failure to reach Redis for it (on a cluster, its
    slot, or a slot of one of its topics, with no master) answered for that group alone,
    COORDINATOR_NOT_AVAILABLE with no topics, as Kafka answers by group: it failed every group
    of the request, so an admin client's listing of several groups' offsets got none."""
    try:
        return await _fetch_group(conn, group_id, topics, version)
    except UNREACHED as exc:
        log_unreached(conn.state, f"OffsetFetch v{version} of {group_id!r}", exc)
        return {"group_id": group_id, "error_code": Errors.COORDINATOR_NOT_AVAILABLE,
                "topics": []}


def _asked(topic: Any, offsets: dict[TopicPartition, OffsetAndMetadata]
           ) -> Iterator[tuple[int, OffsetAndMetadata]]:
    """Each partition index of an OffsetFetch topic with its offset, twice if it is named
    twice: Kafka's ``OffsetMetadataManager.fetchOffsets`` answers every index of every topic
    entry of the request, in its order. Lazy, as ``_fetched``."""
    for p in topic.partition_indexes:
        yield p, offsets.get(TopicPartition(topic.name, p), _NO_COMMIT)


_NO_COMMIT = OffsetAndMetadata(-1)


def _may_be_stored(topic: str) -> bool:
    """Whether a commit can be stored under ``topic``'s name (``field_of``): not the empty
    name, nor one too long or not valid text. OffsetFetch does not check names or partitions
    against the topics (Kafka's ``handleOffsetFetchRequest`` asks its coordinator for any):
    one no commit can have, or a negative partition, is answered -1 with no error, not asked
    for, so the request's other partitions and groups get their real answers."""
    try:
        field_of(TopicPartition(topic, 0))
    except InvalidRequestError:
        return False
    return True


async def _without_stale(conn: Connection, offsets: dict[TopicPartition, OffsetAndMetadata],
                         listed: bool) -> dict[TopicPartition, OffsetAndMetadata]:
    """``offsets`` without the commits made to a deleted topic of the same name
    (``rcoord.topics.incarnation``), which Kafka deletes with the topic: a partition asked for
    answers -1, as with no commit; a listing of all the group's offsets leaves it out."""
    judged = topics_to_judge(offsets)
    if not judged:
        return offsets
    state = conn.state
    try:
        created = await created_times_async(state.redis, state.config.namespace, judged)
    except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException) as exc:
        # (a raw pipeline, no rcoord boundary: a topic's slot not served, CLUSTERDOWN or
        # "TTL exhausted" escaped as redis-py's errors, answered UNKNOWN_SERVER_ERROR, which
        # Kafka's consumer raises from poll(); as ConnectionLost the group gets the retriable
        # COORDINATOR_NOT_AVAILABLE, as when its own read fails)
        reraise_as_rcoord("offset fetch", exc)
        raise
    for tp in older_than_their_topic(offsets, created):
        if listed:
            del offsets[tp]
        else:
            offsets[tp] = OffsetAndMetadata(-1)
    return offsets


def _fetched(parts: Iterable[tuple[int, OffsetAndMetadata]]) -> Iterator[dict[str, Any]]:
    """A topic's committed offsets in the response. An iterator: it runs where the response
    is encoded, on the topic threads (``offload``), not on the event loop; a group can hold
    the offsets of 100,000 partitions."""
    for p, om in parts:
        yield {"partition_index": p, "committed_offset": om.offset,
               "committed_leader_epoch": -1 if om.leader_epoch is None else om.leader_epoch,
               "metadata": om.metadata, "error_code": Errors.NONE}


@api(9, "OffsetFetch", 1, 8, group=True, offload=True)
async def offset_fetch(conn: Connection, req: Any, version: int) -> dict[str, Any]:
    if version >= 8:
        return {"throttle_time": 0, "groups": [
            await _fetch_group_alone(conn, g.group_id, g.topics, version) for g in req.groups]}
    one = await _fetch_group(conn, req.group_id, req.topics, version)
    return {"throttle_time": 0, "topics": one["topics"], "error_code": one["error_code"]}
