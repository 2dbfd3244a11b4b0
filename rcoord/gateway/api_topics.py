"""CreateTopics, DeleteTopics and CreatePartitions over ``rcoord.topics.Topics``.

A topic's configs are those of ``rcoord.topics.configs`` (``retention.ms``, -1: unlimited;
rcoord's own ``retention.records``; ``producer.id.expiration.ms``; and ``cleanup.policy`` and
``message.timestamp.type`` at the one value they have); any other config or value is refused
with INVALID_CONFIG rather than silently ignored, and so is a config with a null value, as
Kafka refuses it (it created the topic with the default before). With one broker, the
replication factor must be -1 (the default) or 1.

ACLs, as Kafka's ``ControllerApis``: CreateTopics needs CREATE on the cluster or on the topic,
DeleteTopics DELETE on the cluster (an ALL rule on it: Kafka defines no DELETE rule there) or on
the topic, CreatePartitions ALTER on the topic; a topic refused is answered
TOPIC_AUTHORIZATION_FAILED.

A topic created (or that would be, with ``validate_only``) is answered from v5 on with its
partition count, replication factor and configs (KIP-525; the configs DescribeConfigs gives
for it), as Kafka's ``ReplicationControlManager.createTopic``: Java's AdminClient reads them
for every topic answered without error, and a null list failed its ``createTopics`` with a
NullPointerException. A caller without DESCRIBE_CONFIGS on the topic gets
``topic_config_error_code`` TOPIC_AUTHORIZATION_FAILED instead (the topic is created).
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Iterable
from typing import Any

from ..errors import Errors
from ..topics import TopicError
from ..topics.configs import FixedConfig, check_fixed, parse_setting, setting_named
from .acl import Operation, ResourceType
from .api_configs import configs_of
from .errors import (
    INVALID_REPLICA_ASSIGNMENT,
    INVALID_REPLICATION_FACTOR,
    TOPIC_AUTHORIZATION_FAILED,
    UNREACHED,
    UNREACHED_MESSAGE,
    log_unreached,
    unreached_topic_code,
)
from .registry import api
from .state import NODE_ID, Connection, GatewayState
from .wire import millis

__all__: list[str] = []


DEFAULT_PARTITIONS = 1
"""Partitions of a topic created with ``num_partitions = -1`` (Kafka's ``num.partitions``)."""


def _assignment_error(topic: Any) -> tuple[int, str] | None:
    """Kafka's checks of a manual partition assignment (``ReplicationControlManager.createTopic``
    and ``validateManualPartitionAssignment``), with this gateway the only broker."""
    if int(topic.replication_factor) != -1:
        return Errors.INVALID_REQUEST, ("A manual partition assignment was specified, but "
                                        "replication factor was not set to -1.")
    if int(topic.num_partitions) != -1:
        return Errors.INVALID_REQUEST, ("A manual partition assignment was specified, but "
                                        "numPartitions was not set to -1.")
    seen: set[int] = set()
    for assignment in topic.assignments:
        index = int(assignment.partition_index)
        if index in seen:
            return INVALID_REPLICA_ASSIGNMENT, ("Found multiple manual partition assignments "
                                                f"for partition {index}")
        seen.add(index)
        error = _replicas_error(assignment.broker_ids)
        if error is not None:
            return error
    if seen != set(range(len(seen))):
        return INVALID_REPLICA_ASSIGNMENT, ("partitions should be a consecutive 0-based integer "
                                            "sequence")
    return None


def _replicas_error(broker_ids: Iterable[Any]) -> tuple[int, str] | None:
    """Kafka's ``validateManualPartitionAssignment`` of one partition's replicas, with this
    gateway the only broker: so a valid list is ``[NODE_ID]``, one replica, the replication
    factor of every partition here."""
    brokers = sorted(int(b) for b in broker_ids)
    if not brokers:
        return INVALID_REPLICA_ASSIGNMENT, ("The manual partition assignment includes an "
                                            "empty replica list.")
    for broker in brokers:
        if broker != NODE_ID:
            return INVALID_REPLICA_ASSIGNMENT, (
                f"The manual partition assignment includes broker {broker}, but no such "
                f"broker is registered (the rcoord gateway is broker {NODE_ID}).")
    if len(brokers) > 1:
        return INVALID_REPLICA_ASSIGNMENT, (f"The manual partition assignment includes the "
                                            f"broker {NODE_ID} more than once.")
    return None


def _create(state: GatewayState, topic: Any, validate_only: bool, describable: bool
            ) -> dict[str, Any]:
    out: dict[str, Any] = {"name": topic.name, "error_code": Errors.NONE, "error_message": None,
                           "num_partitions": -1, "replication_factor": -1}
    try:
        # The name, then whether it is taken, before the rest, as Kafka's createTopics: an
        # existing topic asked for with, say, replication factor 3 is TOPIC_ALREADY_EXISTS (it
        # was INVALID_REPLICATION_FACTOR, which a tool creating "if not exists" took as a
        # failure). The create itself checks again, atomically.
        if _exists(state, topic.name):
            raise TopicError(Errors.TOPIC_ALREADY_EXISTS, topic.name)
    except TopicError as exc:
        out.update(error_code=exc.error, error_message=str(exc))
        return out
    if topic.assignments:
        error = _assignment_error(topic)
        if error is not None:
            out.update(error_code=error[0], error_message=error[1])
            return out
    count = len(topic.assignments) or int(topic.num_partitions)
    count = DEFAULT_PARTITIONS if count == -1 else count
    if int(topic.replication_factor) not in (-1, 1):
        out.update(error_code=INVALID_REPLICATION_FACTOR,
                   error_message="the rcoord gateway is a single broker: use 1 or -1")
        return out
    settings: dict[str, int | None] = {}
    unset = [cfg.name for cfg in topic.configs if cfg.value is None]
    if unset:  # Kafka's ReplicationControlManager.computeConfigChanges, in its words
        out.update(error_code=Errors.INVALID_CONFIG, error_message="Null value not supported "
                   f"for topic configs: {','.join(unset)}")
        return out
    try:
        for cfg in topic.configs:
            found = setting_named(cfg.name)
            if isinstance(found, FixedConfig):
                check_fixed(found, cfg.value)
            else:
                settings[found.field] = parse_setting(found, cfg.value)
    except TopicError as exc:
        out.update(error_code=exc.error, error_message=exc.detail)
        return out
    try:
        if validate_only:
            # Every check the real create makes (name, count, settings; the name was found
            # free above, by one read of its metadata: listing the topics SCANs the whole
            # keyspace, every namespace's keys).
            state.topics.check_create(topic.name, count, **settings)
        else:
            state.topics.create(topic.name, count, **settings)
    except TopicError as exc:
        out.update(error_code=exc.error, error_message=str(exc))
        return out
    if not describable:  # created, but its configs are not the caller's to read (as Kafka)
        out.update(topic_config_error_code=TOPIC_AUTHORIZATION_FAILED)
        return out
    configs = configs_of(settings)
    out.update(num_partitions=count, replication_factor=1, configs=[
        {"name": e.name, "value": e.value, "read_only": e.read_only, "config_source": e.source,
         "is_sensitive": False} for e in configs])
    return out


def _exists(state: GatewayState, name: str) -> bool:
    """Blocking: whether topic ``name`` (a legal name) exists."""
    try:
        state.topics.partition_count(name)
    except TopicError as exc:
        if exc.error != Errors.UNKNOWN_TOPIC_OR_PARTITION:
            raise
        return False
    return True


@api(19, "CreateTopics", 2, 7)
async def create_topics(conn: Connection, req: Any, version: int) -> dict[str, Any]:
    state = conn.state
    cluster_create = conn.may(Operation.CREATE, ResourceType.CLUSTER, log_denied=False)

    async def one(topic: Any) -> dict[str, Any]:
        if not cluster_create and not conn.may(Operation.CREATE, ResourceType.TOPIC, topic.name):
            return {"name": topic.name, "error_code": TOPIC_AUTHORIZATION_FAILED,
                    "error_message": "Authorization failed.", "num_partitions": -1,
                    "replication_factor": -1}
        describable = conn.may(Operation.DESCRIBE_CONFIGS, ResourceType.TOPIC, topic.name,
                               log_denied=False)
        try:
            return await state.blocking(_create, state, topic, bool(req.validate_only),
                                        describable)
        except UNREACHED as exc:
            return {**_unreached(conn.state, topic.name, exc, millis(req.timeout)),
                    "num_partitions": -1, "replication_factor": -1}

    twice = _named_twice(t.name for t in req.topics)
    results = await asyncio.gather(*(one(t) for t in req.topics if t.name not in twice))
    return {"throttle_time": 0, "topics": [*results, *(
        {"name": name, "error_code": Errors.INVALID_REQUEST,
         "error_message": "Duplicate topic name.", "num_partitions": -1,
         "replication_factor": -1} for name in twice)]}


def _unreached(state: GatewayState, name: str, exc: BaseException, timeout_ms: int
               ) -> dict[str, Any]:
    """The answer for a topic whose create, delete or growth could not reach Redis (whether it
    was done is not known): ``unreached_topic_code``, retriable. The other topics of the
    request keep their own answers: one unreachable call failed the whole request, so topics
    created or deleted by it were answered as not, and a retry found them
    TOPIC_ALREADY_EXISTS or unknown (Kafka applies a request's topics together; rcoord cannot,
    so it says which)."""
    log_unreached(state, f"topic {name!r}", exc)
    return {"name": name, "error_code": unreached_topic_code(timeout_ms),
            "error_message": UNREACHED_MESSAGE}  # (no Redis address: ``api_records._unreached``)


def _named_twice(names: Iterable[str]) -> list[str]:
    """The names a request gives more than once, each once: Kafka's ``ControllerApis`` acts on
    none of their entries and answers each such name INVALID_REQUEST, "Duplicate topic name."
    (one entry was created or deleted, and the other refused or answered twice)."""
    return [name for name, n in collections.Counter(names).items() if n > 1]


def _delete(state: GatewayState, name: str) -> dict[str, Any]:
    try:
        state.topics.delete(name)
    except TopicError as exc:
        if exc.error == Errors.INVALID_TOPIC_EXCEPTION:
            # Kafka's controller looks a name up without judging it: an illegal name is a
            # topic it does not have.
            return _unknown(name)
        return {"name": name, "error_code": exc.error, "error_message": str(exc)}
    return {"name": name, "error_code": Errors.NONE, "error_message": None}


def _unknown(name: str) -> dict[str, Any]:
    return {"name": name, "error_code": Errors.UNKNOWN_TOPIC_OR_PARTITION,
            "error_message": f"topic {name!r} does not exist"}


def _missing(state: GatewayState, name: str) -> bool:
    """Blocking: whether no topic ``name`` exists (an illegal name names none)."""
    try:
        return not _exists(state, name)
    except TopicError as exc:
        if exc.error != Errors.INVALID_TOPIC_EXCEPTION:
            raise
        return True


@api(20, "DeleteTopics", 1, 5)
async def delete_topics(conn: Connection, req: Any, version: int) -> dict[str, Any]:
    state = conn.state
    cluster_delete = conn.may(Operation.DELETE, ResourceType.CLUSTER, log_denied=False)

    async def one(name: str) -> dict[str, Any]:
        try:
            if cluster_delete or conn.may(Operation.DELETE, ResourceType.TOPIC, name):
                return await state.blocking(_delete, state, name)
            # As Kafka's ControllerApis.deleteTopics: a topic the caller may see but not
            # delete is refused only if it exists; one it may see that does not exist is
            # unknown (it was refused, which said it existed and was protected).
            if conn.may(Operation.DESCRIBE, ResourceType.TOPIC, name, log_denied=False) and (
                    await state.blocking(_missing, state, name)):
                return _unknown(name)
        except UNREACHED as exc:
            return _unreached(conn.state, name, exc, millis(req.timeout))
        return {"name": name, "error_code": TOPIC_AUTHORIZATION_FAILED,
                "error_message": "Authorization failed."}

    twice = _named_twice(req.topic_names)
    results = await asyncio.gather(*(one(n) for n in req.topic_names if n not in twice))
    return {"throttle_time": 0, "responses": [*results, *(
        {"name": name, "error_code": Errors.INVALID_REQUEST,
         "error_message": "Duplicate topic name."} for name in twice)]}


def _grow(state: GatewayState, topic: Any, validate_only: bool) -> dict[str, Any]:
    """Blocking: one topic of a CreatePartitions, checked in the order of Kafka's
    ``ReplicationControlManager.createPartitions``, in its words."""
    name, count = topic.name, int(topic.count)
    try:
        current = state.topics.partition_count(name)
    except TopicError as exc:
        if exc.error in (Errors.UNKNOWN_TOPIC_OR_PARTITION, Errors.INVALID_TOPIC_EXCEPTION):
            return _unknown(name)  # (an illegal name names no topic, as in DeleteTopics)
        raise
    out: dict[str, Any] = {"name": name, "error_code": Errors.NONE, "error_message": None}
    if count <= current:
        out.update(error_code=Errors.INVALID_PARTITIONS, error_message=(
            f"Topic already has {current} partition(s)." if count == current else
            f"The topic {name} currently has {current} partition(s); {count} would not be an "
            "increase."))
        return out
    if topic.assignments is not None:
        if len(topic.assignments) != count - current:
            out.update(error_code=INVALID_REPLICA_ASSIGNMENT, error_message=(
                f"Attempted to add {count - current} additional partition(s), but only "
                f"{len(topic.assignments)} assignment(s) were specified."))
            return out
        for assignment in topic.assignments:
            error = _replicas_error(assignment.broker_ids)
            if error is not None:
                out.update(error_code=error[0], error_message=error[1])
                return out
    try:
        if validate_only:
            state.topics.check_growth(name, current, count)
        else:
            # Checks again against the count it reads (another request may have grown it
            # since), and makes the new partitions' streams before raising the count.
            state.topics.add_partitions(name, count)
    except TopicError as exc:
        if exc.error == Errors.UNKNOWN_TOPIC_OR_PARTITION:
            return _unknown(name)  # (deleted meanwhile)
        out.update(error_code=exc.error, error_message=exc.detail or str(exc))
    return out


@api(37, "CreatePartitions", 0, 3)
async def create_partitions(conn: Connection, req: Any, version: int) -> dict[str, Any]:
    """Kafka's CreatePartitions (``kafka-topics --alter --partitions``, AdminClient's
    ``createPartitions``) over ``Topics.add_partitions``; ALTER on the topic, as Kafka's
    ``ControllerApis``. A consumer subscribed to the topic takes the new partitions at its
    next metadata refresh, as with Kafka."""
    state = conn.state

    async def one(topic: Any) -> dict[str, Any]:
        if not conn.may(Operation.ALTER, ResourceType.TOPIC, topic.name):
            return {"name": topic.name, "error_code": TOPIC_AUTHORIZATION_FAILED,
                    "error_message": "Authorization failed."}
        try:
            return await state.blocking(_grow, state, topic, bool(req.validate_only))
        except UNREACHED as exc:
            return _unreached(conn.state, topic.name, exc, millis(req.timeout))

    twice = _named_twice(t.name for t in req.topics)
    results = await asyncio.gather(*(one(t) for t in req.topics if t.name not in twice))
    return {"throttle_time": 0, "results": [*results, *(
        {"name": name, "error_code": Errors.INVALID_REQUEST,
         "error_message": "Duplicate topic name."} for name in twice)]}
