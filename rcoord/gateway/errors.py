"""How a handler reports a request-wide failure (one Kafka error code for the whole response),
and the Kafka error codes only the gateway answers with (``rcoord.errors.Errors`` holds the
ones rcoord's own API uses; these are Kafka's numbers, ``org.apache.kafka.common.protocol``)."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import redis.exceptions

from ..errors import AuthenticationFailedError, ConnectionLost, Errors, as_authentication_failed
from .acl import ResourceType

if TYPE_CHECKING:
    from .state import GatewayState

__all__ = [
    "AUTHORIZATION_FAILED",
    "CLUSTER_AUTHORIZATION_FAILED",
    "CORRUPT_MESSAGE",
    "FETCH_SESSION_ID_NOT_FOUND",
    "GROUP_AUTHORIZATION_FAILED",
    "INVALID_PRODUCER_EPOCH",
    "INVALID_RECORD",
    "INVALID_REPLICATION_FACTOR",
    "INVALID_REPLICA_ASSIGNMENT",
    "INVALID_REQUIRED_ACKS",
    "INVALID_TIMESTAMP",
    "LEADER_NOT_AVAILABLE",
    "LOGIN_REFUSED",
    "NETWORK_EXCEPTION",
    "NOT_LEADER_OR_FOLLOWER",
    "TOPIC_AUTHORIZATION_FAILED",
    "TRANSACTIONAL_ID_AUTHORIZATION_FAILED",
    "TRANSACTIONS_NOT_SERVED",
    "UNKNOWN_TOPIC_ID",
    "UNREACHED",
    "UNSUPPORTED_COMPRESSION_TYPE",
    "RequestError",
    "log_login_refused",
    "log_unreached",
    "since_last",
    "slot_unserved",
    "throttled",
    "unreached_topic_code",
]

log = logging.getLogger("rcoord.gateway")

UNREACHED = (ConnectionLost, AuthenticationFailedError, redis.exceptions.ConnectionError,
             redis.exceptions.TimeoutError)
"""What a call raises when Redis could not be reached or answered "not now" (ServerUnavailable
is a ConnectionLost), and redis-py errors no rcoord boundary translated (no free connection in
the pool): retriable, whatever the request was. A login Redis refuses the gateway (its password
rotated under it) too: the gateway's credentials are not the Kafka client's to fix, and the
client retries until the gateway is restarted with the new ones."""


def slot_unserved(exc: BaseException) -> bool:
    """Whether ``exc`` (one of ``UNREACHED``) is a Redis Cluster slot with no master in the
    client's slot map (redis-py's ``SlotNotCoveredError``, which rcoord's boundary raises as
    ``ConnectionLost``): that slot alone, while the other slots' masters may well answer. A
    refused connection, a timeout or CLUSTERDOWN (which a cluster requiring full coverage
    answers for every slot) may be Redis itself, so they are not."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, redis.exceptions.SlotNotCoveredError):
            return True
        seen = seen.__cause__
    return False


LOGIN_REFUSED = (AuthenticationFailedError, redis.exceptions.AuthenticationError)
"""What a refused login of the gateway's own raises (rcoord's error, or redis-py's where no
rcoord boundary translated it): logged by ``log_login_refused``."""

LOGIN_REFUSED_LOG_INTERVAL_S = 60.0
"""How often a refused login of the gateway's own is logged again while it lasts."""

UNREACHED_LOG_INTERVAL_S = 10.0
"""How often the same failure to reach Redis is logged again while it lasts."""

LOG_KEYS_KEPT = 1000
"""Distinct failures remembered by each ``throttled`` table; past that many, forgotten."""


def throttled(table: dict[str, tuple[float, int]], key: str, interval_s: float) -> int | None:
    """Whether to log the failure ``key`` now: None if it was logged less than ``interval_s``
    ago (counted, for the next line), else how many were left unlogged since its last line
    (0 the first time). A failure every request meets (Redis away, the gateway's login or a
    command refused) logged per request buried everything else: a polling consumer's Fetches
    come back several times a second."""
    now = time.monotonic()
    last = table.get(key)
    if last is not None and now - last[0] < interval_s:
        table[key] = (last[0], last[1] + 1)
        return None
    if last is None and len(table) >= LOG_KEYS_KEPT:
        table.clear()
    table[key] = (now, 0)
    return 0 if last is None else last[1]


def since_last(count: int) -> str:
    """The words a repeated line adds: how many it stood for."""
    if not count:
        return ""
    return f" ({count} more call{'' if count == 1 else 's'} met it since the last such line)"


def log_login_refused(state: GatewayState, what: str, exc: BaseException) -> None:
    """Log a request, or one partition of a Produce, failed because Redis refused the
    gateway's own login (its password was changed, its user turned off); ``what`` names it
    ("Fetch v11"). A warning the first time, then at most one every
    ``LOGIN_REFUSED_LOG_INTERVAL_S`` with the number of calls refused meanwhile (``throttled``),
    and a debug line for each of those. A Produce answers each partition on its own
    (REQUEST_TIMED_OUT), so it calls this itself: it logged nothing, and a gateway only
    producers used gave no sign of the refusal. It lasts until the gateway runs with working
    credentials."""
    if not isinstance(exc, AuthenticationFailedError):
        exc = as_authentication_failed(what, exc)
    message = str(exc)
    why = message.partition(": ")[2] or message  # (without the call's name: one for all)
    count = throttled(state.login_refusals, why, LOGIN_REFUSED_LOG_INTERVAL_S)
    if count is None:
        log.debug("%s: Redis refused the gateway's login (logged before): %s", what, message)
        return
    log.warning("%s: %s; the gateway answers a retriable error to every request until it runs "
                "with working credentials%s", what, message, since_last(count))


UNREACHED_MESSAGE = "Redis unreachable or unavailable (the gateway's log says why)"
"""What a client is answered for a call that could not reach Redis: the why (redis-py's words,
with the server's address or its refused login) goes to the gateway's log alone."""


def log_unreached(state: GatewayState, what: str, exc: BaseException) -> None:
    """Log a call that could not reach Redis (``UNREACHED``); ``what`` names it ("Fetch v11",
    "topic 'orders'"). A refused login of the gateway's own goes through ``log_login_refused``.
    Others: a warning the first time, then at most one every ``UNREACHED_LOG_INTERVAL_S`` for
    the same failure while it lasts, the rest at DEBUG (a stopped Redis with one kafka-python
    consumer logged a warning per request, tens a second growing with the clients)."""
    if isinstance(exc, LOGIN_REFUSED):
        log_login_refused(state, what, exc)
        return
    message = f"{type(exc).__name__}: {exc}"
    count = throttled(state.unreached, message, UNREACHED_LOG_INTERVAL_S)
    if count is None:
        log.debug("%s: Redis unreachable or unavailable (logged before): %s", what, exc)
        return
    log.warning("%s: Redis unreachable or unavailable: %s%s", what, exc, since_last(count))

CORRUPT_MESSAGE = 2
LEADER_NOT_AVAILABLE = 5
NOT_LEADER_OR_FOLLOWER = 6
NETWORK_EXCEPTION = 13
INVALID_REQUIRED_ACKS = 21
INVALID_TIMESTAMP = 32
TOPIC_AUTHORIZATION_FAILED = 29
GROUP_AUTHORIZATION_FAILED = 30
CLUSTER_AUTHORIZATION_FAILED = 31
INVALID_REPLICATION_FACTOR = 38
INVALID_REPLICA_ASSIGNMENT = 39
INVALID_PRODUCER_EPOCH = 47
TRANSACTIONAL_ID_AUTHORIZATION_FAILED = 53
FETCH_SESSION_ID_NOT_FOUND = 70
UNSUPPORTED_COMPRESSION_TYPE = 76
INVALID_RECORD = 87
UNKNOWN_TOPIC_ID = 100


def unreached_topic_code(timeout_ms: int) -> int:
    """What CreateTopics, DeleteTopics and CreatePartitions answer a topic whose call could not
    reach Redis (whether it was done is not known), given the request's ``timeout_ms``.

    REQUEST_TIMED_OUT where the client waits. Asked not to wait (0 or less), a Kafka broker
    answers that code for a topic it began to create, delete or grow (``ZkAdminManager``:
    "if timeout <= 0 ... return immediately"), and librdkafka, asked so
    (``operation_timeout=0``), takes it for "in progress" and succeeds the topic's future
    (measured, confluent-kafka 2.16): a client was told a topic was created, deleted or grown
    that was not. NETWORK_EXCEPTION says the same thing, an answer lost before it came
    (retriable, as REQUEST_TIMED_OUT), and no client takes it for success."""
    return Errors.REQUEST_TIMED_OUT if timeout_ms > 0 else NETWORK_EXCEPTION


AUTHORIZATION_FAILED = {
    ResourceType.TOPIC: TOPIC_AUTHORIZATION_FAILED,
    ResourceType.GROUP: GROUP_AUTHORIZATION_FAILED,
    ResourceType.CLUSTER: CLUSTER_AUTHORIZATION_FAILED,
}
"""The error Kafka answers when an operation on a resource of this type is not allowed."""

TRANSACTIONS_NOT_SERVED = ("transactions are not supported by the rcoord gateway: produce "
                           "without transactional.id (enable.idempotence works)")
"""Why a transactional producer is refused, in FindCoordinator's error message (librdkafka puts
it in the error it raises) and in the gateway's warning. The code is
TRANSACTIONAL_ID_AUTHORIZATION_FAILED, what Kafka answers a transactional id the caller may not
use (``KafkaApis.getCoordinator``, ``handleInitProducerIdRequest``): librdkafka and
kafka-python fail ``init_transactions()`` at once with it, a fatal error (measured, librdkafka
2.16 and kafka-python 3.0.12). COORDINATOR_NOT_AVAILABLE (as before) made both retry until the
call's timeout, and say only that; INVALID_REQUEST, to FindCoordinator or to InitProducerId,
made librdkafka do the same."""


class RequestError(Exception):
    """Answer the request with ``code`` in its top-level error field (or close, if none)."""

    def __init__(self, code: int, message: str = "") -> None:
        super().__init__(message or f"error code {code}")
        self.code = int(code)
