"""The response to a request that failed as a whole, built from the request itself.

Many Kafka responses have no top-level error code: Produce, ListOffsets, Metadata,
OffsetCommit, CreateTopics, ... carry an error per partition, topic, group or resource. A
response with an empty list in their place reads to a client as a success that covered nothing
(kafka-python's ``commit()`` returns, Produce waits until it times out, librdkafka drops the
message as malformed). So, as Kafka's ``AbstractRequest.getErrorResponse``, every item the
request named gets the error; where a request names nothing an error could be attached to
(Metadata for all topics, an empty list), there is no honest answer and ``None`` tells the
dispatcher to close the connection, which clients treat as a retriable network error.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from ..errors import Errors
from .errors import LEADER_NOT_AVAILABLE, NOT_LEADER_OR_FOLLOWER
from .wire import response_class

__all__ = ["UNAVAILABLE", "request_error_response"]

UNAVAILABLE: dict[int, int] = {
    0: Errors.REQUEST_TIMED_OUT,  # Produce: retriable, and says the outcome is not known
    1: NOT_LEADER_OR_FOLLOWER,  # Fetch: the client refreshes metadata and fetches again
    2: NOT_LEADER_OR_FOLLOWER,  # ListOffsets: likewise
    3: LEADER_NOT_AVAILABLE,  # Metadata: retriable per topic
    19: Errors.REQUEST_TIMED_OUT,  # CreateTopics
    20: Errors.REQUEST_TIMED_OUT,  # DeleteTopics
    21: Errors.REQUEST_TIMED_OUT,  # DeleteRecords
    # InitProducerId: what Kafka's ProducerIdManager answers while it cannot hand out an id
    # (its REQUEST_TIMED_OUT is fatal to older clients). UNKNOWN_SERVER_ERROR, before, is
    # fatal to Kafka's producer and kafka-python's (InitProducerIdHandler): it never sent again.
    22: Errors.COORDINATOR_LOAD_IN_PROGRESS,
    32: Errors.REQUEST_TIMED_OUT,  # DescribeConfigs
    33: Errors.REQUEST_TIMED_OUT,  # AlterConfigs
    37: Errors.REQUEST_TIMED_OUT,  # CreatePartitions
    44: Errors.REQUEST_TIMED_OUT,  # IncrementalAlterConfigs
}
"""The retriable code a non-group API answers when Redis is unreachable or refuses ("not
now": OOM, READONLY, BUSY). Group APIs answer COORDINATOR_NOT_AVAILABLE (``Api.group``)."""

_Builder = Callable[[Any, int], "dict[str, Any] | None"]


def _nonempty(items: list[Any], data: dict[str, Any]) -> dict[str, Any] | None:
    return data if items else None


def _topic(t: Any, name: str = "name") -> dict[str, Any]:
    """A request topic's key for its response: its name, or from Produce v13, Fetch v13,
    OffsetCommit v10 and OffsetFetch v10 on, its topic id (as Kafka's getErrorResponse). The
    gateway serves none of those versions, but answers them UNSUPPORTED_VERSION from here."""
    return {name: getattr(t, name, ""), "topic_id": getattr(t, "topic_id", None)}


def _produce(req: Any, code: int) -> dict[str, Any] | None:
    topics = [{**_topic(t), "partition_responses": [
        {"index": p.index, "error_code": code, "base_offset": -1, "log_append_time": -1,
         "log_start_offset": -1} for p in t.partition_data]} for t in req.topic_data]
    return _nonempty(topics, {"throttle_time": 0, "responses": topics})


def _fetch(req: Any, code: int) -> dict[str, Any] | None:
    # Empty records, as Kafka's MemoryRecords.EMPTY: null is a size of -1, which librdkafka
    # logs as "invalid MessageSetSize -1" and cannot parse.
    topics = [{**_topic(t, "topic"), "partitions": [
        {"partition_index": p.partition, "error_code": code, "high_watermark": -1,
         "last_stable_offset": -1, "log_start_offset": -1, "aborted_transactions": None,
         "preferred_read_replica": -1, "records": b""} for p in t.partitions]}
        for t in req.topics]
    return _nonempty(topics, {"throttle_time": 0, "error_code": code,
                                           "session_id": 0, "responses": topics})


def _list_offsets(req: Any, code: int) -> dict[str, Any] | None:
    topics = [{"name": t.name, "partitions": [
        {"partition_index": p.partition_index, "error_code": code, "timestamp": -1,
         "offset": -1, "leader_epoch": -1} for p in t.partitions]} for t in req.topics]
    return _nonempty(topics, {"throttle_time": 0, "topics": topics})


def _metadata(req: Any, code: int) -> dict[str, Any] | None:
    if not req.topics:  # all topics (None) or none: nothing names where the error belongs
        return None
    # A topic named by id alone gets "" for its name, as Kafka's MetadataRequest
    # getErrorResponse (the name is not nullable before v12).
    topics: list[dict[str, Any]] = [
        {"error_code": code, "name": "" if t.name is None else t.name,
         "topic_id": getattr(t, "topic_id", None), "partitions": []} for t in req.topics]
    return {"throttle_time": 0, "brokers": [], "cluster_id": None, "controller_id": -1,
            "topics": topics}


def _offset_commit(req: Any, code: int) -> dict[str, Any] | None:
    topics = [{**_topic(t), "partitions": [
        {"partition_index": p.partition_index, "error_code": code} for p in t.partitions]}
        for t in req.topics]
    return _nonempty(topics, {"throttle_time": 0, "topics": topics})


def _offset_fetch(req: Any, code: int) -> dict[str, Any] | None:
    def topics(ts: Any) -> list[dict[str, Any]]:
        return [{**_topic(t), "partitions": [
            {"partition_index": p, "committed_offset": -1, "committed_leader_epoch": -1,
             "metadata": "", "error_code": code} for p in t.partition_indexes]}
            for t in ts or ()]

    if hasattr(req, "groups"):
        groups = [{"group_id": g.group_id, "error_code": code, "topics": topics(g.topics)}
                  for g in req.groups]
        return _nonempty(groups, {"throttle_time": 0, "groups": groups})
    listed = topics(req.topics)  # v1: no group error code, only the partitions'
    return _nonempty(listed, {"topics": listed})


def _find_coordinator(req: Any, code: int) -> dict[str, Any] | None:
    keys = [{"key": k, "node_id": -1, "host": "", "port": -1, "error_code": code}
            for k in req.coordinator_keys]
    return _nonempty(keys, {"throttle_time": 0, "coordinators": keys})


_KAFKA_MESSAGES: dict[int, str] = {
    Errors.UNKNOWN_SERVER_ERROR: "The server experienced an unexpected error when processing "
                                 "the request.",
    Errors.COORDINATOR_NOT_AVAILABLE: "The coordinator is not available.",
    34: "Request is not valid given the current SASL state.",  # ILLEGAL_SASL_STATE
    Errors.INVALID_REQUEST: "This most likely occurs because of a request being malformed by "
                            "the client library or the message was sent to an incompatible "
                            "broker. See the broker logs for more details.",
}
"""Kafka's ``Errors.message()`` of the codes a FindCoordinator v0-3 can fail with as a whole:
what its ``error_message`` carries then (``_find_coordinator_old``)."""


def _find_coordinator_old(code: int) -> dict[str, Any]:
    """FindCoordinator v0-3 failed as a whole, as Kafka's ``FindCoordinatorRequest
    .getErrorResponse`` (``prepareOldResponse`` with ``Node.noNode()``): node -1, host "",
    port -1 and the error's message. Only the top-level code, as for any other response with
    one, left node 0 and port 0, a coordinator address that looks real, and no message."""
    return {"throttle_time": 0, "error_code": code, "node_id": -1, "host": "", "port": -1,
            "error_message": _KAFKA_MESSAGES.get(code)}


def _describe_groups(req: Any, code: int) -> dict[str, Any] | None:
    groups = [{"error_code": code, "group_id": g, "group_state": "", "protocol_type": "",
               "protocol_data": "", "members": []} for g in req.groups]
    return _nonempty(groups, {"throttle_time": 0, "groups": groups})


def _create_topics(req: Any, code: int) -> dict[str, Any] | None:
    topics = [{"name": t.name, "error_code": code, "num_partitions": -1,
               "replication_factor": -1, "configs": None} for t in req.topics]
    return _nonempty(topics, {"throttle_time": 0, "topics": topics})


def _delete_topics(req: Any, code: int) -> dict[str, Any] | None:
    names = list(req.topic_names) if hasattr(req, "topic_names") else [
        t.name for t in req.topics]
    results = [{"name": n, "error_code": code} for n in names]
    return _nonempty(results, {"throttle_time": 0, "responses": results})


def _create_partitions(req: Any, code: int) -> dict[str, Any] | None:
    results = [{"name": t.name, "error_code": code, "error_message": None} for t in req.topics]
    return _nonempty(results, {"throttle_time": 0, "results": results})


def _delete_records(req: Any, code: int) -> dict[str, Any] | None:
    topics = [{"name": t.name, "partitions": [
        {"partition_index": p.partition_index, "low_watermark": -1, "error_code": code}
        for p in t.partitions]} for t in req.topics]
    return _nonempty(topics, {"throttle_time": 0, "topics": topics})


def _describe_configs(req: Any, code: int) -> dict[str, Any] | None:
    results = [{"error_code": code, "error_message": None, "resource_type": r.resource_type,
                "resource_name": r.resource_name, "configs": []} for r in req.resources]
    return _nonempty(results, {"throttle_time": 0, "results": results})


def _alter_configs(req: Any, code: int) -> dict[str, Any] | None:
    results = [{"error_code": code, "error_message": None, "resource_type": r.resource_type,
                "resource_name": r.resource_name} for r in req.resources]
    return _nonempty(results, {"throttle_time": 0, "responses": results})


def _delete_groups(req: Any, code: int) -> dict[str, Any] | None:
    results = [{"group_id": g, "error_code": code} for g in dict.fromkeys(req.groups_names)]
    return _nonempty(results, {"throttle_time": 0, "results": results})


def _init_producer_id(code: int) -> dict[str, Any]:
    """InitProducerId failed as a whole, as Kafka's ``InitProducerIdRequest.getErrorResponse``:
    producer id -1 and epoch -1 (``RecordBatch.NO_PRODUCER_ID``, ``NO_PRODUCER_EPOCH``). The
    top-level code alone left the epoch at 0 (the schema gives only the id a default of -1),
    a real epoch beside no producer id (Redis unavailable: COORDINATOR_LOAD_IN_PROGRESS)."""
    return {"throttle_time": 0, "error_code": code, "producer_id": -1, "producer_epoch": -1}


_FETCH, _FIND_COORDINATOR, _FIND_COORDINATOR_BATCHED, _INIT_PRODUCER_ID = 1, 10, 4, 22
_BUILDERS: dict[int, _Builder] = {
    0: _produce, 1: _fetch, 2: _list_offsets, 3: _metadata, 8: _offset_commit,
    9: _offset_fetch, 10: _find_coordinator, 15: _describe_groups, 19: _create_topics,
    20: _delete_topics, 21: _delete_records, 32: _describe_configs, 33: _alter_configs,
    37: _create_partitions, 42: _delete_groups, 44: _alter_configs,
}


def _has_top_level_error(api_key: int, version: int) -> bool:
    return "error_code" in {f.name for f in dataclasses.fields(response_class(api_key, version))}


def request_error_response(api_key: int, version: int, request: Any, code: int
                           ) -> dict[str, Any] | None:
    """``code`` as the answer to the whole of ``request`` (None: the connection must close).

    A response with a top-level error code gets it there (Fetch v7-v12 also per partition, as
    Kafka's ``FetchRequest.getErrorResponse``; FindCoordinator v0-3 with no coordinator, as
    ``_find_coordinator_old``; InitProducerId with no producer id and epoch, as
    ``_init_producer_id``); one without gets it on every item the request named. ``request``
    may be None (not decoded): then only the top-level code can be used.
    """
    if _has_top_level_error(api_key, version):
        if api_key == _FETCH and request is not None and version < 13:
            return _fetch(request, code) or {"error_code": code}
        if api_key == _FIND_COORDINATOR and version < _FIND_COORDINATOR_BATCHED:
            return _find_coordinator_old(code)
        if api_key == _INIT_PRODUCER_ID:
            return _init_producer_id(code)
        return {"error_code": code}
    builder = _BUILDERS.get(api_key)
    if builder is None or request is None:
        return None
    return builder(request, code)
