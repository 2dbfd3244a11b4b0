"""Reading a partition from a Kafka offset, and the log start and end offsets."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Generic, Literal, TypeVar

import redis
import redis.client
import redis.exceptions

from ..errors import Errors, InvalidRequestError, translate_redis_errors
from ._base import (
    INT32_MAX,
    OFFSETS,
    FetchResult,
    Record,
    TopicError,
    _check_client,
    _check_int,
    _check_namespace,
    _check_topic,
    _id_offset,
    _name,
    _offset_id,
    _run,
    partition_key,
)
from ._decode import decode_entries, decode_entries_as, log_offsets_of

R = TypeVar("R")


@dataclass(frozen=True)
class PartitionRecords(Generic[R]):
    """A fetch answer whose records are of the caller's type (``fetch_many_as``); the fields
    mean what ``FetchResult``'s mean."""

    records: list[R]
    log_start_offset: int
    log_end_offset: int
    error: Errors = Errors.NONE


_Decode = Callable[[Sequence[Any]], list[Any]]
"""Stream entries to records (``_decode``)."""

# -- fetching ---------------------------------------------------------------------------------


_STALE_RETRIES = 3
"""Re-reads of a partition whose stream was replaced between the two reads of one fetch."""


def _read(pipe: Any, key: str, offset: int, max_records: int) -> None:
    pipe.execute_command("XRANGE", key, _offset_id(offset), "+", "COUNT", max_records)
    pipe.execute_command("XINFO", "STREAM", key)


_RAW_REPLIES: Mapping[str, Any] = MappingProxyType({})
"""No reply callbacks: XRANGE and XINFO STREAM answers as the server sent them (read-only, as
every pipeline made here shares it)."""


def _pipeline(client: Any) -> Any:
    """A non-transactional pipeline whose replies skip redis-py's callbacks, where possible.

    redis-py's XRANGE callback pairs every entry's fields into a dict, which cost as much client
    time as decoding the records (``_decode``); the decoder reads the flat form directly. A
    standalone ``redis.Redis`` gets a ``Pipeline`` built on its own connection pool with no
    callbacks (redis-py's public constructor, as ``Redis.pipeline`` calls it). A cluster client
    keeps its own pipeline, which routes each key to its node and follows redirections; its
    replies come paired, and the decoder takes that form too.
    """
    if isinstance(client, redis.Redis):
        return redis.client.Pipeline(client.connection_pool, _RAW_REPLIES, False, None)
    return client.pipeline(transaction=False)


def _no_stream(exc: Exception) -> bool:
    """XINFO STREAM's answer for a missing key, or for a key that is not a stream."""
    text = str(exc)
    return "no such key" in text or text.startswith("WRONGTYPE")


def _answer(
    offset: int, entries: Any, info: Any, decode: _Decode = decode_entries
) -> PartitionRecords[Any] | None:
    """The fetch answer from an XRANGE and the XINFO STREAM that followed it on the same
    connection; None when the two reads saw different streams (deleted and re-created).

    Why the two reads need no transaction: within one stream, the log start and end only grow
    and the record at an offset never changes, so the entries read first are still the records
    at those offsets when XINFO runs (start <= offset), and all of them lie below the end XINFO
    reports. The answer is therefore the state at the XINFO instant, with possibly fewer
    records than that instant held, which a fetch may return anyway. An offset below the start
    or above the end is OFFSET_OUT_OF_RANGE with those offsets, as the script answered. If the
    stream was replaced in between, the entries do not start at ``offset`` or reach past the
    end; the caller reads again.
    """
    if isinstance(info, Exception):
        if isinstance(info, redis.exceptions.ResponseError) and _no_stream(info):
            return PartitionRecords([], -1, -1, Errors.UNKNOWN_TOPIC_OR_PARTITION)
        raise info
    start, end = log_offsets_of(info)
    if offset < start or offset > end:
        return PartitionRecords([], start, end, Errors.OFFSET_OUT_OF_RANGE)
    if isinstance(entries, Exception):
        raise entries
    if entries and (_id_offset(entries[0][0]) != offset or _id_offset(entries[-1][0]) >= end):
        return None
    return PartitionRecords(decode(entries), start, end, Errors.NONE)


def _fetch_many(
    client: Any, reads: list[tuple[str, int, int, _Decode]]
) -> list[PartitionRecords[Any]]:
    """Fetch answers for ``(stream key, offset, max records, decode)`` reads, in one pipeline.

    Every read is an XRANGE then an XINFO STREAM on its own key (see ``_answer``), so in a
    cluster each pair goes to its partition's node and the pipeline costs one round trip per
    node. No script runs: the server does two plain reads per partition.
    """
    results: list[PartitionRecords[Any] | None] = [None] * len(reads)
    todo = list(range(len(reads)))
    for _ in range(_STALE_RETRIES):
        pipe = _pipeline(client)
        for i in todo:
            _read(pipe, *reads[i][:3])
        replies = pipe.execute(raise_on_error=False)
        for n, i in enumerate(todo):
            results[i] = _answer(reads[i][1], replies[2 * n], replies[2 * n + 1], reads[i][3])
            replies[2 * n] = None  # let the raw entries go as soon as they are decoded
        todo = [i for i in todo if results[i] is None]
        if not todo:
            return [r for r in results if r is not None]
    key = reads[todo[0]][0]
    raise TopicError(Errors.UNKNOWN_TOPIC_OR_PARTITION,
                     f"{key} was replaced during each of {_STALE_RETRIES} reads")


def _fetch_once(client: Any, key: str, offset: int, max_records: int) -> FetchResult:
    return _result(_fetch_many(client, [(key, offset, max_records, decode_entries)])[0])


def _result(answer: PartitionRecords[Record]) -> FetchResult:
    return FetchResult(
        answer.records, answer.log_start_offset, answer.log_end_offset, answer.error
    )


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
    caller can apply its reset policy (``resolve_offset``). Records and log offsets describe one
    instant: the log offsets are read right after the records, and the log only grows at its
    end and is trimmed at its start (``_answer``).

    With ``block_ms`` > 0 and no records at ``offset``, waits up to ``block_ms`` for one
    (Kafka's ``fetch.max.wait.ms``) with ``XREAD BLOCK`` from the id just before ``offset``:
    a record appended between the first read and the XREAD is still seen, so no wake-up is
    lost. The client's ``socket_timeout`` must exceed ``block_ms``.

    ``block_ms`` is a whole number of milliseconds (``None`` or 0: do not wait); anything else
    raises, because ``XREAD BLOCK 0`` waits forever, so a fraction truncated to 0 would turn a
    short wait into an endless one.
    """
    _check_client(redis_client)
    _check_namespace(namespace)
    _check_topic(topic)
    _check_int("partition", partition, 0)
    _check_int("offset", offset, 0)
    _check_int("max_records", max_records, 1, INT32_MAX)
    if block_ms is not None:
        _check_int("block_ms", block_ms, 0, INT32_MAX)
    key = partition_key(namespace, topic, partition)
    result = _fetch_once(redis_client, key, offset, max_records)
    if result.records or result.error != Errors.NONE or not block_ms:
        return result
    # Entries with id > 0-<offset> are those at offsets >= offset.
    redis_client.xread({key: f"0-{offset}"}, count=1, block=block_ms)
    return _fetch_once(redis_client, key, offset, max_records)


@translate_redis_errors
def fetch_many(
    redis_client: Any,
    namespace: str,
    reads: Sequence[tuple[str, int, int]],
    max_records: int = 500,
) -> list[FetchResult]:
    """Kafka's Fetch for several partitions at once: ``reads`` are ``(topic, partition,
    offset)``, and the answers come in the same order, each as ``fetch`` would give it (up to
    ``max_records`` records, OFFSET_OUT_OF_RANGE with the log offsets, or
    UNKNOWN_TOPIC_OR_PARTITION for a partition that does not exist).

    All reads go in one pipeline, so the call costs one round trip per node holding one of the
    partitions (a cluster client sends each node its part), instead of one per partition. It
    never blocks: a consumer with nothing to read waits with ``fetch(..., block_ms=...)``.
    """
    keyed = _keyed_reads(redis_client, namespace, reads, max_records, None)
    return [_result(answer) for answer in _fetch_many(redis_client, keyed)] if keyed else []


@translate_redis_errors
def fetch_many_as(
    redis_client: Any,
    namespace: str,
    reads: Sequence[tuple[str, int, int]],
    max_records: int,
    record_type: type[R],
) -> list[PartitionRecords[R]]:
    """``fetch_many`` whose records are ``record_type``s built directly from the entries: a
    frozen dataclass without slots with the fields ``topic``, ``partition`` and then Record's
    (the consumer's ``ConsumerRecord``; ``_decode.decode_entries_as``)."""
    keyed = _keyed_reads(redis_client, namespace, reads, max_records, record_type)
    return _fetch_many(redis_client, keyed) if keyed else []


def _keyed_reads(
    redis_client: Any,
    namespace: str,
    reads: Sequence[tuple[str, int, int]],
    max_records: int,
    record_type: type[Any] | None,
) -> list[tuple[str, int, int, _Decode]]:
    _check_client(redis_client)
    _check_namespace(namespace)
    _check_int("max_records", max_records, 1, INT32_MAX)
    keyed: list[tuple[str, int, int, _Decode]] = []
    for topic, partition, offset in reads:
        _check_topic(topic)
        _check_int("partition", partition, 0)
        _check_int("offset", offset, 0)
        decode: _Decode = decode_entries
        if record_type is not None:
            decode = functools.partial(
                decode_entries_as, record_type=record_type, topic=topic, partition=partition
            )
        keyed.append((partition_key(namespace, topic, partition), offset, max_records, decode))
    return keyed


@translate_redis_errors
def log_offsets(redis_client: Any, namespace: str, topic: str, partition: int) -> tuple[int, int]:
    """(log start offset, log end offset) of a partition: Kafka's ListOffsets earliest/latest."""
    _check_client(redis_client)
    _check_namespace(namespace)
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
