"""ApiVersions, Metadata and FindCoordinator: where clients learn what to send, and to whom.

This gateway is the whole cluster for its clients: one broker (itself, at the advertised
address), the leader of every partition and the coordinator of every group. Any gateway of a
namespace can serve any group or partition, because all state is in Redis.
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Iterator
from typing import Any

from ..errors import Errors, InvalidRequestError
from ..protocol.offsets import TopicPartition
from ..topics import TopicError
from .acl import Operation, ResourceType
from .errors import (
    GROUP_AUTHORIZATION_FAILED,
    LEADER_NOT_AVAILABLE,
    TOPIC_AUTHORIZATION_FAILED,
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    TRANSACTIONS_NOT_SERVED,
    UNKNOWN_TOPIC_ID,
    UNREACHED,
    log_unreached,
    slot_unserved,
)
from .registry import REGISTRY, api
from .state import NODE_ID, Connection, GatewayState

__all__ = ["partition_counts", "readable_partitions"]

log = logging.getLogger("rcoord.gateway")

_ZERO_UUID = uuid.UUID(int=0)
_GROUP_KEY, _TXN_KEY = 0, 1
_KAFKA_MESSAGE = {Errors.NONE: "NONE", GROUP_AUTHORIZATION_FAILED: "Group authorization failed."}
"""Kafka's ``Errors.message()`` of the codes FindCoordinator answers without a message of its
own: what a v0-3 response carries in ``error_message`` (``handleFindCoordinatorRequestLessThanV4``
sets it on success, "NONE", the enum's name; ``FindCoordinatorResponse.prepareOldResponse`` on an
error). v4+ coordinators carry none (null), as here. rcoord's own messages (a transactional id,
a key type not served) are kept: they say what to change."""


_SOFTWARE = re.compile(r"[a-zA-Z0-9](?:[a-zA-Z0-9\-.]*[a-zA-Z0-9])?")
"""What ApiVersions v3+'s client software name and version must match (Kafka's
``ApiVersionsRequest.isValid``; they become metric tags)."""


@api(18, "ApiVersions", 0, 3)
async def api_versions(conn: Connection, req: Any, version: int) -> dict[str, Any]:
    if version >= 3 and not (_SOFTWARE.fullmatch(req.client_software_name)
                             and _SOFTWARE.fullmatch(req.client_software_version)):
        # Kafka answers INVALID_REQUEST with no API keys, and before a SASL handshake the
        # client may send ApiVersions again (SaslServerAuthenticator stays where it was).
        log.info("ApiVersions v%d refused: client software name %r or version %r is not "
                 "letters, digits, '-' and '.' (starting and ending with a letter or digit)",
                 version, req.client_software_name, req.client_software_version)
        conn.api_versions_answered = False
        return {"error_code": Errors.INVALID_REQUEST, "api_keys": [], "throttle_time": 0}
    keys = [{"api_key": a.key, "min_version": a.min_version, "max_version": a.max_version}
            for a in sorted(REGISTRY.values(), key=lambda a: a.key)]
    return {"error_code": Errors.NONE, "api_keys": keys, "throttle_time": 0}


def partition_counts(state: GatewayState, names: list[str] | None,
                     unreached: dict[str, BaseException] | None = None
                     ) -> dict[str, int | Errors]:
    """Blocking: topic -> partition count, or the error for that name (None: every topic).

    With ``unreached``, a topic whose count Redis could not serve (``UNREACHED``: on a
    cluster, its slot with no master) is put there, with its failure, instead of failing the
    whole call, unless every topic failed so and not every failure was its slot's own
    (``slot_unserved``: else Redis itself may be unreachable, and the last failure is raised).
    A request naming only topics whose slots have no master failed whole: an OffsetCommit of
    one such topic was COORDINATOR_NOT_AVAILABLE, on which Kafka's consumer drops its
    coordinator and looks it up again, where the same topic beside a served one was
    UNKNOWN_TOPIC_OR_PARTITION, which it retries as it is.
    """
    out: dict[str, int | Errors] = {}
    # (Its own name: ``names is None`` below still says "every topic" once they are listed.)
    listed = state.topics.list() if names is None else names
    for name in listed:
        try:
            out[name] = state.topics.partition_count(name)
        except UNREACHED as exc:
            if unreached is None or (len(unreached) + 1 == len(listed) and not all(
                    map(slot_unserved, [*unreached.values(), exc]))):
                raise
            unreached[name] = exc
        except TopicError as exc:
            if names is not None or exc.error != Errors.UNKNOWN_TOPIC_OR_PARTITION:
                out[name] = exc.error
            # else: listed, then deleted before its count was read: not a topic now, and
            # Kafka's answer for every topic lists only those it has (it was listed, unknown)
    return out


async def readable_partitions(conn: Connection, topics: Any
                              ) -> tuple[list[tuple[TopicPartition, Any]], dict[TopicPartition, int]]:
    """The partitions a request's ``topics`` name (each with ``name`` and ``partitions`` of
    ``partition_index``) that exist in a topic the caller may READ, each with its request
    entry; and the others with Kafka's answer for them: TOPIC_AUTHORIZATION_FAILED, or
    UNKNOWN_TOPIC_OR_PARTITION for a name not in its metadata cache (an illegal name too) or a
    partition the topic does not have (a negative index too). Both in request order; one
    partition-count read per topic named (not per partition), on the topic threads.

    A topic whose count Redis could not read (``UNREACHED``: on a cluster, its slot with no
    master) is UNKNOWN_TOPIC_OR_PARTITION too, as Kafka's broker answers a topic its metadata
    cache does not hold (yet): its clients retry that code on a commit (KAFKA-6829). It failed
    the whole request (COORDINATOR_NOT_AVAILABLE), so no partition of any other topic was
    committed for as long as that slot was down. When every topic's read fails so and not
    every failure is its slot's own (Redis itself may be unreachable), the request still fails
    as a whole (``partition_counts``)."""
    readable = {t.name for t in topics if conn.may(Operation.READ, ResourceType.TOPIC, t.name)}
    unreached: dict[str, BaseException] = {}
    counts = (await conn.state.blocking(partition_counts, conn.state, sorted(readable),
                                        unreached) if readable else {})
    if unreached:
        log_unreached(conn.state, f"topic {next(iter(unreached))!r}",
                      next(iter(unreached.values())))
        counts.update(dict.fromkeys(unreached, Errors.UNKNOWN_TOPIC_OR_PARTITION))
    known: list[tuple[TopicPartition, Any]] = []
    refused: dict[TopicPartition, int] = {}
    for t in topics:
        if t.name not in readable:
            refused.update({TopicPartition(t.name, p.partition_index): TOPIC_AUTHORIZATION_FAILED
                            for p in t.partitions})
            continue
        count = counts[t.name]
        for p in t.partitions:
            tp = TopicPartition(t.name, p.partition_index)
            if isinstance(count, Errors) or not 0 <= p.partition_index < count:
                refused[tp] = Errors.UNKNOWN_TOPIC_OR_PARTITION
            else:
                known.append((tp, p))
    return known, refused


def _partitions(count: int) -> Iterator[dict[str, Any]]:
    """A topic's partitions, all led by this gateway. An iterator: it runs where the response
    is built, on the topic threads (``offload``), not on the event loop. A topic an older
    rcoord created (before the 10,000-partition cap per call) can have millions."""
    for p in range(count):
        yield {"error_code": Errors.NONE, "partition_index": p, "leader_id": NODE_ID,
               "leader_epoch": 0, "replica_nodes": [NODE_ID], "isr_nodes": [NODE_ID],
               "offline_replicas": []}


_AUTHORIZED_OPERATIONS_SINCE = 8
_CLUSTER_OPERATIONS_UNTIL = 10
"""Metadata v8 (KIP-430) added ``include_topic_authorized_operations`` and
``include_cluster_authorized_operations``; v11 dropped the cluster's (DescribeCluster has it).
Not asked for, each field is Kafka's sentinel, -2**31; a topic the caller may not describe
keeps it, and the cluster's is 0 for a caller without DESCRIBE on the cluster, as in Kafka's
``KafkaApis.handleTopicMetadataRequest``."""


_TOPIC_IDS_SINCE = 12
"""Metadata v10 added topic ids to the request, but only v12 may name a topic by its id alone
(Kafka's ``KafkaApis.handleTopicMetadataRequest``: a v10/v11 topic without a name, or with an
id, is INVALID_REQUEST)."""


def _by_topic_id(req: Any, version: int) -> list[uuid.UUID]:
    """The topic ids a v10+ request names (none before v10). rcoord's topics have no id (every
    one is the zero id), so an id named is an unknown topic; as in Kafka, a request that names
    any id is answered for its ids alone."""
    if req.topics is None or version < 10:
        return []
    ids = [t.topic_id for t in req.topics
           if getattr(t, "topic_id", None) is not None and t.topic_id != _ZERO_UUID]
    if version < _TOPIC_IDS_SINCE and (ids or any(t.name is None for t in req.topics)):
        raise InvalidRequestError(f"Metadata v{version} names topics by name only "
                                  f"(by topic id since v{_TOPIC_IDS_SINCE})")
    if not ids and any(t.name is None for t in req.topics):
        raise InvalidRequestError("a Metadata topic has neither a name nor a topic id")
    return list(dict.fromkeys(ids))


@api(3, "Metadata", 0, 12, offload=True)
async def metadata(conn: Connection, req: Any, version: int) -> dict[str, Any]:
    state = conn.state
    by_id = _by_topic_id(req, version)
    wanted: list[str] | None = None
    if req.topics is not None and (req.topics or version > 0):  # v0: empty means all
        wanted = [t.name for t in req.topics if t.name is not None]
    topics: list[dict[str, Any]] = []
    if by_id:
        wanted = []
        topics += [{"error_code": UNKNOWN_TOPIC_ID, "name": None, "topic_id": topic_id,
                    "partitions": []} for topic_id in by_id]
    if wanted:
        refused = {n for n in wanted if not conn.may(Operation.DESCRIBE, ResourceType.TOPIC, n)}
        topics += [{"error_code": TOPIC_AUTHORIZATION_FAILED, "name": n, "topic_id": _ZERO_UUID,
                    "partitions": []} for n in sorted(refused)]
        wanted = [n for n in wanted if n not in refused]
    # A topic whose slot has no master is LEADER_NOT_AVAILABLE alone, as Kafka answers by
    # topic; it failed the whole request (every topic, or for all topics the connection).
    unreached: dict[str, BaseException] = {}
    counts = await state.blocking(partition_counts, state, wanted, unreached)
    if unreached:
        log_unreached(state, f"Metadata v{version}", next(iter(unreached.values())))
    if wanted is None:
        counts = {n: c for n, c in counts.items()
                  if conn.may(Operation.DESCRIBE, ResourceType.TOPIC, n, log_denied=False)}
        unreached = {n: e for n, e in unreached.items()
                     if conn.may(Operation.DESCRIBE, ResourceType.TOPIC, n, log_denied=False)}
    with_ops = version >= _AUTHORIZED_OPERATIONS_SINCE and bool(
        getattr(req, "include_topic_authorized_operations", False))
    for name, count in [*((n, None) for n in unreached), *counts.items()]:
        if count is None:
            topics.append({"error_code": LEADER_NOT_AVAILABLE, "name": name,
                           "topic_id": _ZERO_UUID, "partitions": []})
        elif isinstance(count, Errors):
            topics.append({"error_code": count, "name": name, "topic_id": _ZERO_UUID,
                           "partitions": []})
        else:
            topics.append({
                "error_code": Errors.NONE, "name": name, "topic_id": _ZERO_UUID,
                "is_internal": False,
                "partitions": _partitions(count),
            })
        if with_ops:  # every topic the caller may describe, an unknown one too (as Kafka)
            topics[-1]["topic_authorized_operations"] = conn.authorized_operations(
                ResourceType.TOPIC, name)
    host, port = state.advertised
    out = {
        "throttle_time": 0,
        "brokers": [{"node_id": NODE_ID, "host": host, "port": port, "rack": None}],
        "cluster_id": f"rcoord-{state.config.namespace}",
        "controller_id": NODE_ID,
        "topics": topics,
    }
    if _AUTHORIZED_OPERATIONS_SINCE <= version <= _CLUSTER_OPERATIONS_UNTIL and bool(
            getattr(req, "include_cluster_authorized_operations", False)):
        out["cluster_authorized_operations"] = (
            conn.authorized_operations(ResourceType.CLUSTER)
            if conn.may(Operation.DESCRIBE, ResourceType.CLUSTER, log_denied=False) else 0)
    return out


def _coordinator(conn: Connection, key: str, key_type: int) -> dict[str, Any]:
    host, port = conn.state.advertised
    if key_type == _GROUP_KEY and not conn.may(Operation.DESCRIBE, ResourceType.GROUP, key):
        return {"key": key, "node_id": -1, "host": "", "port": -1,
                "error_code": GROUP_AUTHORIZATION_FAILED, "error_message": None}
    if key_type == _GROUP_KEY:
        return {"key": key, "node_id": NODE_ID, "host": host, "port": port,
                "error_code": Errors.NONE, "error_message": None}
    if key_type == _TXN_KEY:  # (errors.TRANSACTIONS_NOT_SERVED says why this code)
        log.warning("transactional producer %r (client id %r, from %s) refused: %s", key,
                    conn.client_id, conn.client_host, TRANSACTIONS_NOT_SERVED)
        return {"key": key, "node_id": -1, "host": "", "port": -1,
                "error_code": TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                "error_message": TRANSACTIONS_NOT_SERVED}
    # Share groups are not served by this gateway.
    return {"key": key, "node_id": -1, "host": "", "port": -1,
            "error_code": Errors.INVALID_REQUEST,
            "error_message": f"key type {key_type} is not served by the rcoord gateway"}


@api(10, "FindCoordinator", 0, 4, group=True)
async def find_coordinator(conn: Connection, req: Any, version: int) -> dict[str, Any]:
    key_type = int(getattr(req, "key_type", _GROUP_KEY))
    if version >= 4:
        return {"throttle_time": 0,
                "coordinators": [_coordinator(conn, k, key_type)
                                 for k in req.coordinator_keys]}
    one = _coordinator(conn, req.key, key_type)
    del one["key"]
    if one["error_message"] is None:  # (null before, which Kafka never sends below v4)
        one["error_message"] = _KAFKA_MESSAGE.get(one["error_code"])
    return {"throttle_time": 0, **one}
