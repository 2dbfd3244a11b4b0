"""Reading a partition from a Kafka offset, and the log start and end offsets."""

from __future__ import annotations

from typing import Any, Literal

import redis.exceptions

from ..errors import Errors, InvalidRequestError, translate_redis_errors
from ._base import (
    OFFSETS,
    FetchResult,
    TopicError,
    _check_client,
    _check_int,
    _check_topic,
    _name,
    _offset_id,
    _run,
    partition_key,
)
from ._decode import decode_entries, log_offsets_of

# -- fetching ---------------------------------------------------------------------------------


def _fetch_once(client: Any, key: str, offset: int, max_records: int) -> FetchResult:
    """One MULTI/EXEC on the partition's stream: XINFO STREAM (log offsets), then XRANGE.

    Both commands name the same key, so in a cluster the transaction runs on the partition's
    node like a script did, and MULTI/EXEC makes the records and the log offsets one instant.
    XINFO STREAM fails on a missing key (or one that is not a stream): the partition does not
    exist. The checks run on the reply, so the server does only the two reads; records XRANGE
    returned for an offset outside the log are dropped.
    """
    pipe = client.pipeline(transaction=True)
    pipe.xinfo_stream(key)
    pipe.xrange(key, _offset_id(offset), "+", count=max_records)
    info, entries = pipe.execute(raise_on_error=False)
    if isinstance(info, redis.exceptions.ResponseError):
        return FetchResult([], -1, -1, Errors.UNKNOWN_TOPIC_OR_PARTITION)
    if isinstance(info, Exception):
        raise info
    if isinstance(entries, Exception):
        raise entries
    start, end = log_offsets_of(info)
    if offset < start or offset > end:
        return FetchResult([], start, end, Errors.OFFSET_OUT_OF_RANGE)
    return FetchResult(decode_entries(entries), start, end, Errors.NONE)


@translate_redis_errors
def fetch(
    redis_client: Any,
    namespace: str,
    topic: str,
    partition: int,
    offset: int,
    max_records: int = 500,
    block_ms: int | None = None,
) -> FetchResult:
    """Kafka's Fetch for one partition: up to ``max_records`` records from ``offset`` on.

    ``offset`` may be anything from the log start to the log end inclusive (the end gives no
    records); anything else answers OFFSET_OUT_OF_RANGE with the current log offsets, so the
    caller can apply its reset policy (``resolve_offset``). Records and log offsets are read
    in one MULTI/EXEC (XINFO STREAM, XRANGE), so they describe the same instant.

    With ``block_ms`` > 0 and no records at ``offset``, waits up to ``block_ms`` for one
    (Kafka's ``fetch.max.wait.ms``) with ``XREAD BLOCK`` from the id just before ``offset``:
    a record appended between the first read and the XREAD is still seen, so no wake-up is
    lost. The client's ``socket_timeout`` must exceed ``block_ms``.
    """
    _check_client(redis_client)
    _check_topic(topic)
    _check_int("partition", partition, 0)
    _check_int("offset", offset, 0)
    _check_int("max_records", max_records, 1)
    key = partition_key(namespace, topic, partition)
    result = _fetch_once(redis_client, key, offset, max_records)
    if result.records or result.error != Errors.NONE or not block_ms or block_ms <= 0:
        return result
    # Entries with id > 0-<offset> are those at offsets >= offset.
    redis_client.xread({key: f"0-{offset}"}, count=1, block=int(block_ms))
    return _fetch_once(redis_client, key, offset, max_records)


@translate_redis_errors
def log_offsets(redis_client: Any, namespace: str, topic: str, partition: int) -> tuple[int, int]:
    """(log start offset, log end offset) of a partition: Kafka's ListOffsets earliest/latest."""
    _check_topic(topic)
    _check_int("partition", partition, 0)
    (res,) = _run(redis_client, [(OFFSETS, [partition_key(namespace, topic, partition)], [])])
    if _name(res[0]) != Errors.NONE:
        raise TopicError(_name(res[0]), f"{topic}-{partition}")
    return int(res[1]), int(res[2])


def resolve_offset(
    offset_reset: Literal["earliest", "latest"],
    redis_client: Any,
    namespace: str,
    topic: str,
    partition: int,
) -> int:
    """Kafka's ``auto.offset.reset``: where to start with no valid committed offset.

    "earliest" is the log start offset, "latest" the log end offset (only new records).
    """
    if offset_reset not in ("earliest", "latest"):
        raise InvalidRequestError(f"offset_reset must be 'earliest' or 'latest': {offset_reset!r}")
    start, end = log_offsets(redis_client, namespace, topic, partition)
    return start if offset_reset == "earliest" else end
