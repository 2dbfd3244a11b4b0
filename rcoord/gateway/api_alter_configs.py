"""AlterConfigs and IncrementalAlterConfigs (``kafka-configs --alter``, AdminClient's
``incrementalAlterConfigs`` and legacy ``alterConfigs``) over ``Topics.alter_configs``.

IncrementalAlterConfigs changes the configs it names (SET, DELETE: back to the default, APPEND
and SUBTRACT for list configs); the legacy AlterConfigs replaces a resource's configs whole, so
a setting it does not name goes back to its default, as Kafka's ``legacyAlterConfigs``. The
configs are those of ``rcoord.topics.configs``; ``cleanup.policy`` and
``message.timestamp.type`` take only the value every rcoord topic has.

Checks, in Kafka's order and words (``ConfigAdminManager.preprocess``, then the controller's
``ConfigurationControlManager``): a resource named twice is INVALID_REQUEST on both; a config
named twice in one resource, a null value (but for DELETE) and an unknown operation are
INVALID_REQUEST; ALTER_CONFIGS on the topic (TOPIC_AUTHORIZATION_FAILED) or the cluster, for
the broker (CLUSTER_AUTHORIZATION_FAILED); then an empty topic name INVALID_REQUEST, an illegal
one INVALID_TOPIC_EXCEPTION, an unknown config, a value out of bounds or APPEND to a config that
is not a list INVALID_CONFIG, an absent topic UNKNOWN_TOPIC_OR_PARTITION. A resource's changes
are checked whole before any is written, and written in one script: all land or none.

The broker's configs are this gateway's command-line flags (STATIC_BROKER_CONFIG): changing one
is INVALID_REQUEST, as Kafka answers a static config; an empty change of this broker (or of the
cluster defaults, the empty name) succeeds, and so does a DELETE, which has no dynamic value to
take back. Other resource types are INVALID_REQUEST. A topic
whose call cannot reach Redis is REQUEST_TIMED_OUT alone.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass
from typing import Any

from ..errors import Errors
from ..topics import TopicError
from ..topics.configs import DELETE, OP_NAMES, SET, settings_change
from .acl import Operation, ResourceType
from .api_configs import BROKER, TOPIC
from .errors import (
    CLUSTER_AUTHORIZATION_FAILED,
    TOPIC_AUTHORIZATION_FAILED,
    UNREACHED,
    log_unreached,
)
from .registry import api
from .state import NODE_ID, Connection, GatewayState

__all__: list[str] = []




@dataclass(frozen=True)
class _Op:
    name: str
    op: int
    value: str | None


class _Refused(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


def _check_request(ops: list[_Op]) -> None:
    """What Kafka's ``ConfigAdminManager.preprocess`` refuses of one resource's changes."""
    if any(n > 1 for n in Counter(o.name for o in ops).values()):
        raise _Refused(Errors.INVALID_REQUEST, "Error due to duplicate config keys")
    unknown = [o.op for o in ops if o.op not in OP_NAMES]
    if unknown:
        raise _Refused(Errors.INVALID_REQUEST, f"Unknown operations type {unknown[0]}")
    nulls = [o.name for o in ops if o.value is None and o.op != DELETE]
    if nulls:
        raise _Refused(Errors.INVALID_REQUEST, f"Null value not supported for : {', '.join(nulls)}")


def _alter_topic(state: GatewayState, name: str, ops: list[_Op], replace: bool,
                 validate_only: bool) -> None:
    """Blocking: the change of one topic (TopicError or _Refused if refused)."""
    if not name:
        raise _Refused(Errors.INVALID_REQUEST, "Default topic resources are not allowed.")
    changes = settings_change([(o.name, o.op, o.value or "") for o in ops])
    state.topics.alter_configs(name, changes, replace=replace, validate_only=validate_only)


def _check_broker(name: str, ops: list[_Op]) -> None:
    if name:
        if not name.lstrip("-").isdigit():
            raise _Refused(Errors.INVALID_REQUEST, f"Node id must be an integer, but it is: {name}")
        if int(name) != NODE_ID:
            raise _Refused(Errors.INVALID_REQUEST,
                           f"Unexpected broker id, expected {NODE_ID}, but received {name}")
    # A DELETE takes a dynamic value back to the static one, and the gateway has no dynamic
    # value: nothing to do, as Kafka answers a DELETE of a name never set dynamically (its
    # ConfigAdminManager drops deleted names before validating). Tools that bring a cluster to
    # a wanted set of configs send such DELETEs.
    changes = [o for o in ops if o.op != DELETE]
    if changes:
        raise _Refused(Errors.INVALID_REQUEST,
                       "Cannot update these configs dynamically: "
                       f"{', '.join(sorted(o.name for o in changes))} (the gateway's broker configs "
                       "are its command-line flags: restart it with other values)")


async def _alter(conn: Connection, kind: int, name: str, ops: list[_Op], replace: bool,
                 validate_only: bool) -> tuple[int, str | None]:
    """One resource's change: (error code, message)."""
    try:
        _check_request(ops)
        if kind == TOPIC:
            if not conn.may(Operation.ALTER_CONFIGS, ResourceType.TOPIC, name):
                return TOPIC_AUTHORIZATION_FAILED, "Authorization failed."
            await conn.state.blocking(_alter_topic, conn.state, name, ops, replace,
                                      validate_only)
        elif kind == BROKER:
            if not conn.may(Operation.ALTER_CONFIGS, ResourceType.CLUSTER):
                return CLUSTER_AUTHORIZATION_FAILED, "Authorization failed."
            _check_broker(name, ops)
        else:
            raise _Refused(Errors.INVALID_REQUEST,
                           f"resource type {kind} is not served: only topics ({TOPIC}) and the "
                           f"broker ({BROKER})")
    except _Refused as exc:
        return exc.code, exc.message
    except TopicError as exc:
        return exc.error, exc.detail or None
    except UNREACHED as exc:
        log_unreached(conn.state, f"configs of {name!r}", exc)
        # (not "nothing was changed": the write may have run and its reply been lost, or
        # a producer_id_expiration_ms change have failed after the setting was written)
        return Errors.REQUEST_TIMED_OUT, ("Redis could not be reached; the change may have "
                                          "been made or not: asking again does no harm")
    return Errors.NONE, None


async def _answer(conn: Connection, req: Any, replace: bool) -> dict[str, Any]:
    resources = [(int(r.resource_type), r.resource_name,
                  [_Op(c.name, int(getattr(c, "config_operation", SET)), c.value)
                   for c in r.configs]) for r in req.resources]
    twice = {k for k, n in Counter((kind, name) for kind, name, _ in resources).items() if n > 1}
    validate_only = bool(req.validate_only)

    async def one(kind: int, name: str, ops: list[_Op]) -> tuple[int, str | None]:
        if (kind, name) in twice:
            return Errors.INVALID_REQUEST, "Each resource must appear at most once."
        return await _alter(conn, kind, name, ops, replace, validate_only)

    answers = await asyncio.gather(*(one(*r) for r in resources))
    return {"throttle_time": 0, "responses": [
        {"error_code": code, "error_message": message, "resource_type": kind,
         "resource_name": name}
        for (kind, name, _), (code, message) in zip(resources, answers)]}


@api(33, "AlterConfigs", 0, 2)
async def alter_configs(conn: Connection, req: Any, version: int) -> dict[str, Any]:
    return await _answer(conn, req, replace=True)


@api(44, "IncrementalAlterConfigs", 0, 1)
async def incremental_alter_configs(conn: Connection, req: Any, version: int) -> dict[str, Any]:
    return await _answer(conn, req, replace=False)
