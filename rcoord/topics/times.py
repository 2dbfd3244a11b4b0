"""Offsets by time: the first offset of a partition whose record is at or after a timestamp.

Kafka's ``Consumer.offsetsForTimes`` and ListOffsets with a timestamp, which the operator's
``--to-datetime`` and ``--by-duration`` resets and a consumer's ``offsets_for_times`` both need.

Each record carries the time its partition's node appended it (Redis ``TIME``, field ``t``), and
offsets are stream sequence numbers (see ``rcoord.topics``), so the answer is a binary search over
offsets: ``lua/topic_offset_for_time.lua``, one read-only script per partition, all partitions
in one pipeline. It is exact while a partition's timestamps never decrease, which holds while its
node's clock does; Kafka's time index makes the same assumption about the largest timestamp so
far.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import redis.exceptions

from ..errors import Errors, translate_redis_errors
from ._base import (
    TopicError,
    _check_client,
    _check_int,
    _check_namespace,
    _check_topic,
    _foreign_ids,
    _Lua,
    _name,
    _run,
    last_timestamp_key_of,
    partition_key,
)

__all__ = ["OffsetAndTimestamp", "offsets_for_times", "server_ms"]

OFFSET_FOR_TIME = _Lua("topic_offset_for_time")


@dataclass(frozen=True)
class OffsetAndTimestamp:
    """Kafka's ``OffsetAndTimestamp``: the offset found and the timestamp of its record."""

    offset: int
    timestamp_ms: int


def server_ms(client: Any) -> int:
    """Now in ms on Redis' clock (``TIME``; any node of a cluster): the clock that stamps the
    records and runs every rcoord deadline, for a caller that must compare a time with it."""
    secs, micros = client.time()
    return int(secs) * 1000 + int(micros) // 1000


@translate_redis_errors
def offsets_for_times(
    redis_client: Any,
    namespace: str,
    timestamps: Mapping[tuple[str, int], int],
) -> dict[tuple[str, int], OffsetAndTimestamp | None]:
    """For each ``(topic, partition) -> timestamp ms``: the earliest offset whose record's
    timestamp is at or after it, or ``None`` when no record is that recent (as Kafka answers
    null; a caller that must seek somewhere uses the log end then).

    Records removed by retention are not searched: a timestamp older than the oldest kept record
    answers the log start offset. Raises ``TopicError`` (UNKNOWN_TOPIC_OR_PARTITION) naming the
    first missing partition, and ``InvalidRequestError`` for a negative timestamp (Kafka: "the
    target time cannot be negative"). A record with no integer timestamp (an entry added
    with XADD by hand) is a TopicError (UNKNOWN_SERVER_ERROR) naming it.
    """
    _check_client(redis_client)
    _check_namespace(namespace)
    order: list[tuple[str, int]] = []
    calls = []
    for tp, ts in timestamps.items():
        topic, partition = tp
        _check_topic(topic)
        _check_int("partition", partition, 0)
        _check_int(f"timestamp of {topic}-{partition}", ts, 0)
        order.append((topic, partition))
        # With the partition's mark, which gives the log offsets without XINFO STREAM's copy
        # of the first and last records (topic_offsets.lua reads them the same way).
        key = partition_key(namespace, topic, partition)
        calls.append((OFFSET_FOR_TIME, [key, last_timestamp_key_of(key)], [ts]))
    if not calls:
        return {}
    try:
        replies = _run(redis_client, calls)
    except redis.exceptions.ResponseError as exc:
        raise _foreign_ids(exc) from exc
    out: dict[tuple[str, int], OffsetAndTimestamp | None] = {}
    for tp, res in zip(order, replies, strict=True):
        error = _name(res[0])
        if error != Errors.NONE:
            raise TopicError(error, f"{tp[0]}-{tp[1]}")
        offset, ts = int(res[1]), int(res[2])
        out[tp] = None if offset < 0 else OffsetAndTimestamp(offset, ts)
    return out
