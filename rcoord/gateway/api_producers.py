"""InitProducerId: Kafka's idempotent producers get their producer id here (KIP-98).

A Kafka producer id is a 64-bit integer; rcoord's idempotent appends key their state by a
string. The gateway allocates the number as rcoord's ``Producer`` does (the namespace's counter
plus a random part, so a counter that was ever reset cannot hand an old producer's sequence
numbers to a new one) and names the producer ``kafka-<id>`` in the partitions' producer state,
a name rcoord's own producers (``rcoord-<n>-<hex>``) never take.

Without a transactional id, Kafka's coordinator answers every InitProducerId with a new id and
epoch 0, also when the request names the producer's current id and epoch (KIP-360: a Java
producer bumps its epoch itself after an unknown outcome; librdkafka asks for a new id). The
gateway does the same. A request naming only one of the two (v3 on) is INVALID_REQUEST, as
Kafka answers it. Transactions are not served: a transactional id gets
TRANSACTIONAL_ID_AUTHORIZATION_FAILED, as Kafka answers one the caller may not use
(``errors.TRANSACTIONS_NOT_SERVED`` says why that code).

ACLs, as Kafka 3.x: IDEMPOTENT_WRITE on the cluster, or WRITE on some topic, else
CLUSTER_AUTHORIZATION_FAILED.
"""

from __future__ import annotations

import logging
import secrets
from typing import Any

from ..errors import Errors
from ..topics.producer import allocate_producer_number
from .acl import Operation, ResourceType
from .errors import (
    CLUSTER_AUTHORIZATION_FAILED,
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    TRANSACTIONS_NOT_SERVED,
)
from .registry import api
from .state import Connection

__all__ = ["kafka_producer_name", "new_producer_id"]

log = logging.getLogger("rcoord.gateway")

_RANDOM_BITS = 24
_NUMBER_MASK = (1 << (63 - _RANDOM_BITS)) - 1  # producer ids are non-negative int64


def kafka_producer_name(producer_id: int) -> str:
    """The producer state name of a Kafka producer id (``rcoord.topics.append_idempotent``)."""
    return f"kafka-{producer_id}"


def new_producer_id(number: int) -> int:
    """A Kafka producer id from a counter number: the number, then 24 random bits."""
    return ((number & _NUMBER_MASK) << _RANDOM_BITS) | secrets.randbits(_RANDOM_BITS)


@api(22, "InitProducerId", 0, 5)
async def init_producer_id(conn: Connection, req: Any, version: int) -> dict[str, Any]:
    state = conn.state
    if req.transactional_id is not None:  # (FindCoordinator refuses it first, likewise)
        log.warning("transactional producer %r (client id %r, from %s) refused: %s",
                    req.transactional_id, conn.client_id, conn.client_host,
                    TRANSACTIONS_NOT_SERVED)
        return {"throttle_time": 0, "error_code": TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                "producer_id": -1, "producer_epoch": -1}
    if not (conn.may(Operation.IDEMPOTENT_WRITE, ResourceType.CLUSTER, log_denied=False)
            or conn.may_any(Operation.WRITE, ResourceType.TOPIC)):
        return {"throttle_time": 0, "error_code": CLUSTER_AUTHORIZATION_FAILED,
                "producer_id": -1, "producer_epoch": -1}
    # v3+ may name the current id and epoch: both or neither (KafkaApis checks after the ACLs).
    if (getattr(req, "producer_id", -1) == -1) != (getattr(req, "producer_epoch", -1) == -1):
        return {"throttle_time": 0, "error_code": Errors.INVALID_REQUEST,
                "producer_id": -1, "producer_epoch": -1}
    number = await state.blocking(allocate_producer_number, state.sync_redis,
                                  state.config.namespace)
    return {"throttle_time": 0, "error_code": Errors.NONE,
            "producer_id": new_producer_id(number), "producer_epoch": 0}
