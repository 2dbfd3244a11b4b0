"""Produce, Fetch and ListOffsets: Kafka's record APIs over rcoord topics (Redis Streams).

Offsets are rcoord's (a record's stream id is ``0-<offset+1>``), timestamps are the Redis
clock's at append (Kafka's LogAppendTime), and a partition's log start and end are the stream's.
The blocking ``rcoord.topics`` calls run on the gateway's topic threads; a Fetch that finds
nothing waits with an asyncio ``XREAD BLOCK`` on the partitions' streams (up to the client's
``max_wait``), so a waiting consumer holds no thread.

ACLs, as Kafka's ``KafkaApis``: Produce needs WRITE on the topic, Fetch READ, ListOffsets
DESCRIBE; a partition of a topic refused is answered TOPIC_AUTHORIZATION_FAILED and the
others of the same request are served.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ..errors import Errors
from ..partitioning import keyslot
from ..topics import (
    FetchResult,
    Record,
    RecordMetadata,
    TopicError,
    fetch,
    log_offsets,
    partition_key,
)
from ..topics import offsets_for_times as topic_offsets_for_times
from ..topics.producer import append_idempotent
from .acl import Operation, ResourceType
from .api_producers import kafka_producer_name
from .errors import INVALID_PRODUCER_EPOCH, TOPIC_AUTHORIZATION_FAILED
from .records import BatchError, IncomingBatch, decode_batches, encode_fetched
from .registry import api
from .state import Connection, GatewayState
from .wire import millis

__all__: list[str] = []

FETCH_MAX_RECORDS = 500
"""Records read from one partition per Fetch (fewer if ``partition_max_bytes`` is reached)."""
FETCH_FIRST_READ = 32
"""Records the first read of a partition asks for; later reads are sized by the bytes those
took (``_read``)."""
_RECORD_OVERHEAD = 24  # roughly what a record costs in a batch besides key, value and headers
_EARLIEST, _LATEST, _MAX_TIMESTAMP = -2, -1, -3


# -- Produce ----------------------------------------------------------------------------------


def _append_batch(state: GatewayState, topic: str, partition: int, batch: IncomingBatch
                  ) -> RecordMetadata:
    """Blocking: append one batch; where its first record is (the original place for an
    idempotent producer's exact resend).

    One script call per batch however many records it has (``atomic``): Kafka appends a batch
    whole, and the client takes base offset + index as each record's offset, so nothing may
    land in between. The frame limit (``max_frame_bytes``) bounds the batch.
    """
    if not batch.records:
        raise BatchError(Errors.INVALID_REQUEST, "a record batch without records")
    if batch.producer_id < 0:
        return state.producer.send_batch(topic, batch.records, atomic=True)[0]
    if batch.producer_epoch < 0 or batch.base_sequence < 0:
        raise BatchError(Errors.INVALID_REQUEST,
                         f"producer id {batch.producer_id} with epoch {batch.producer_epoch} "
                         f"and base sequence {batch.base_sequence}: both must be >= 0")
    try:
        metas = append_idempotent(
            state.sync_redis, state.config.namespace, topic, partition, batch.records,
            producer_id=kafka_producer_name(batch.producer_id),
            producer_epoch=batch.producer_epoch, base_sequence=batch.base_sequence,
            atomic=True, wrapping=True)  # Kafka's sequences go from 2**31 - 1 to 0
    except TopicError as exc:
        if exc.error == Errors.PRODUCER_FENCED:  # what Kafka answers a Produce with (KIP-588)
            raise BatchError(INVALID_PRODUCER_EPOCH, str(exc)) from None
        raise
    # A duplicate is a whole batch the partition remembers, with its offsets (wrapping=True):
    # never DUPLICATE_SEQUENCE_NUMBER, which a Kafka client counts as success.
    return metas[0]


def _append(state: GatewayState, topic: str, partition: int, data: bytes | None
            ) -> dict[str, Any]:
    """Blocking: append one partition's batches, in order; the partition's response.

    An idempotent producer's exact resend is answered as Kafka does: success, with the offset
    and timestamp of the original append; one no longer remembered is out of order, as in Kafka.
    """
    out: dict[str, Any] = {"index": partition, "error_code": Errors.NONE, "base_offset": -1,
                           "log_append_time": -1, "log_start_offset": -1}
    try:
        batches = decode_batches(data or b"", partition)
        if not batches:
            raise BatchError(Errors.INVALID_REQUEST, "no records")
        metas = [_append_batch(state, topic, partition, b) for b in batches]
        start, _ = log_offsets(state.sync_redis, state.config.namespace, topic, partition)
    except BatchError as exc:
        out.update(error_code=exc.code, error_message=str(exc))
        return out
    except TopicError as exc:
        out.update(error_code=exc.error, error_message=str(exc))
        return out
    out.update(base_offset=metas[0].offset, log_append_time=metas[0].timestamp_ms,
               log_start_offset=start)
    return out


@api(0, "Produce", 3, 9)
async def produce(conn: Connection, req: Any, version: int) -> dict[str, Any] | None:
    state = conn.state
    writable = {t.name for t in req.topic_data
                if conn.may(Operation.WRITE, ResourceType.TOPIC, t.name)}

    async def refused(partition: int) -> dict[str, Any]:
        return {"index": partition, "error_code": TOPIC_AUTHORIZATION_FAILED, "base_offset": -1,
                "log_append_time": -1, "log_start_offset": -1}

    jobs = [(t.name, p.index,
             state.blocking(_append, state, t.name, p.index, p.records) if t.name in writable
             else refused(p.index))
            for t in req.topic_data for p in t.partition_data]
    results = await asyncio.gather(*(job for _, _, job in jobs))
    if req.acks == 0:
        return None  # acks=0: Kafka sends no response at all
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for (topic, _, _), res in zip(jobs, results, strict=True):
        by_topic.setdefault(topic, []).append(res)
    return {"throttle_time": 0, "responses": [
        {"name": topic, "partition_responses": parts} for topic, parts in by_topic.items()]}


# -- Fetch ------------------------------------------------------------------------------------


def _record_bytes(rec: Record) -> int:
    """About what ``rec`` takes in a Fetch response (its key, value, headers and framing)."""
    return (len(rec.key or b"") + len(rec.value or b"") + _RECORD_OVERHEAD
            + sum(len(k) + len(v or b"") for k, v in rec.header_list))


def _read(state: GatewayState, topic: str, partition: int, offset: int, max_bytes: int
          ) -> FetchResult:
    """Blocking: records from ``offset`` on, up to ``FETCH_MAX_RECORDS`` and about ``max_bytes``
    (at least one record, as Kafka sends a record larger than the limit whole).

    Read in steps so that memory follows the byte limit, not the record count: the first read
    asks for ``FETCH_FIRST_READ`` records, and each later one for as many as the bytes left
    should hold at the size the records so far had. 500 records of 1 MB each, read at once,
    held 500 MB in the gateway to send one.
    """
    asked = min(FETCH_FIRST_READ, FETCH_MAX_RECORDS)
    try:
        if offset < 0:
            # Kafka answers a negative fetch offset OFFSET_OUT_OF_RANGE for that partition
            # (with its log offsets, so the client can reset), not the request as invalid.
            start, end = log_offsets(state.sync_redis, state.config.namespace, topic, partition)
            return FetchResult([], start, end, Errors.OFFSET_OUT_OF_RANGE)
        res = fetch(state.sync_redis, state.config.namespace, topic, partition, offset, asked)
    except TopicError as exc:
        return FetchResult([], -1, -1, exc.error)
    records, used = list(res.records), sum(_record_bytes(r) for r in res.records)
    last = res
    while (last.error == Errors.NONE and len(last.records) == asked and used < max_bytes
           and len(records) < FETCH_MAX_RECORDS):
        asked = min(FETCH_MAX_RECORDS - len(records),
                    int((max_bytes - used) * len(records) / used) + 1)
        try:
            last = fetch(state.sync_redis, state.config.namespace, topic, partition,
                         records[-1].offset + 1, asked)
        except TopicError:
            break
        if last.error != Errors.NONE:
            break  # (retention trimmed past the next offset meanwhile: send what was read)
        records.extend(last.records)
        used += sum(_record_bytes(r) for r in last.records)
    if last.error != Errors.NONE:
        last = res
    return FetchResult(records, res.log_start_offset, last.log_end_offset, res.error)


def _within(records: list[Record], max_bytes: int, whole: bool) -> tuple[list[Record], int]:
    """The first records of ``records`` that fit ``max_bytes`` (with ``whole``, at least the
    first, which Kafka sends even when it alone is larger), and the bytes they take."""
    out: list[Record] = []
    used = 0
    for rec in records:
        size = _record_bytes(rec)
        if used + size > max_bytes and (out or not whole):
            break
        out.append(rec)
        used += size
    return out, used


def _partition_data(partition: int, res: FetchResult, records: list[Record]) -> dict[str, Any]:
    return {
        "partition_index": partition, "error_code": res.error,
        "high_watermark": res.log_end_offset, "last_stable_offset": res.log_end_offset,
        "log_start_offset": res.log_start_offset, "aborted_transactions": None,
        "preferred_read_replica": -1, "records": encode_fetched(records),
    }


async def _wait_for_records(state: GatewayState, wanted: list[tuple[str, int, int]],
                            wait_ms: int) -> None:
    """Block until a record lands at or after one of the wanted offsets, or ``wait_ms``.

    One ``XREAD BLOCK`` over every stream on one node. A Redis Cluster refuses a multi-key
    command across slots, and every partition has a slot of its own, so there each slot gets
    its own ``XREAD BLOCK``; the first to return ends the wait and the others are cancelled
    (redis-py drops a connection whose command was cancelled, so no late reply is misread).

    ``wait_ms`` is the client's ``max_wait`` (any int32), and a blocked command must return
    before the Redis client's socket timeout or redis-py gives up on it; so the wait is made of
    blocks of at most ``state.block_limit_ms`` (half that timeout), repeated until a record
    comes or the client's wait is over.
    """
    if not wanted or wait_ms <= 0:
        return
    by_slot: dict[int, dict[str, str]] = {}
    for t, p, o in wanted:
        key = partition_key(state.config.namespace, t, p)
        by_slot.setdefault(keyslot(key) if state.cluster else 0, {})[key] = f"0-{o}"
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_ms / 1000
    while wait_ms > 0:
        if await _xread_any(state, list(by_slot.values()), min(wait_ms, state.block_limit_ms)):
            return
        wait_ms = int((deadline - loop.time()) * 1000)


async def _xread_any(state: GatewayState, by_slot: list[dict[str, str]], block_ms: int) -> bool:
    """One ``XREAD BLOCK`` per slot group; True once one returned something (or failed: the
    read that follows the wait reports the error)."""
    if len(by_slot) == 1:
        return bool(await state.redis.xread(by_slot[0], count=1, block=block_ms))
    waits = [asyncio.ensure_future(state.redis.xread(streams, count=1, block=block_ms))
             for streams in by_slot]
    try:
        pending: set[asyncio.Future[Any]] = set(waits)
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            if any(w.exception() is not None or w.result() for w in done):
                return True
        return False
    finally:
        for w in waits:
            w.cancel()
        await asyncio.gather(*waits, return_exceptions=True)


@api(1, "Fetch", 4, 12)
async def fetch_records(conn: Connection, req: Any, version: int) -> dict[str, Any]:
    state = conn.state
    readable = {t.topic for t in req.topics if conn.may(Operation.READ, ResourceType.TOPIC,
                                                        t.topic)}
    wanted = [(t.topic, p.partition, int(p.fetch_offset), int(p.partition_max_bytes))
              for t in req.topics for p in t.partitions if t.topic in readable]

    async def read_all() -> list[FetchResult]:
        return list(await asyncio.gather(*(state.blocking(_read, state, t, p, o, m)
                                           for t, p, o, m in wanted)))

    results = await read_all()
    if wanted and not any(r.records or r.error != Errors.NONE for r in results):
        await _wait_for_records(state, [(t, p, o) for t, p, o, _ in wanted],
                                millis(req.max_wait))
        results = await read_all()
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for t in req.topics:
        if t.topic not in readable:
            by_topic[t.topic] = [{
                "partition_index": p.partition, "error_code": TOPIC_AUTHORIZATION_FAILED,
                "high_watermark": -1, "last_stable_offset": -1, "log_start_offset": -1,
                "aborted_transactions": None, "preferred_read_replica": -1, "records": None,
            } for p in t.partitions]
    # The request's max_bytes (fetch.max.bytes) bounds the whole response: partitions in
    # request order take what is left of it. While some is left a partition gets at least one
    # record, however large (so a record over partition_max_bytes is still delivered), and the
    # first partition with records always does, as in Kafka; so a response is at most about
    # max_bytes plus one record. Without this bound a response could grow past the client's
    # own receive limit (100 MB for librdkafka), which dropped the connection and asked again.
    left = int(req.max_bytes) if int(req.max_bytes) > 0 else 1 << 62
    chosen: list[list[Record]] = []
    for (_, _, _, max_bytes), res in zip(wanted, results, strict=True):
        records, used = _within(res.records, min(max_bytes, left),
                                whole=left > 0 or not any(chosen))
        chosen.append(records)
        left = max(0, left - used)
    encoded = await asyncio.gather(*(state.blocking(_partition_data, partition, res, records)
                                     for (_, partition, _, _), res, records
                                     in zip(wanted, results, chosen, strict=True)))
    for (topic, _, _, _), data in zip(wanted, encoded, strict=True):
        by_topic.setdefault(topic, []).append(data)
    return {"throttle_time": 0, "error_code": Errors.NONE, "session_id": 0,
            "responses": [{"topic": t, "partitions": parts} for t, parts in by_topic.items()]}


# -- ListOffsets ------------------------------------------------------------------------------


def _list_offset(state: GatewayState, topic: str, partition: int, ts: int) -> dict[str, Any]:
    out: dict[str, Any] = {"partition_index": partition, "error_code": Errors.NONE,
                           "timestamp": -1, "offset": -1, "leader_epoch": 0}
    ns = state.config.namespace
    try:
        start, end = log_offsets(state.sync_redis, ns, topic, partition)
        if ts == _EARLIEST:
            out["offset"] = start
        elif ts == _LATEST:
            out["offset"] = end
        elif ts == _MAX_TIMESTAMP:
            # KIP-734: the record with the largest timestamp, with that timestamp; timestamps
            # only grow (one clock), so it is the last record. An empty log has none: -1, -1.
            if end > start:
                last = fetch(state.sync_redis, ns, topic, partition, end - 1, 1)
                if last.records:
                    out.update(offset=last.records[0].offset,
                               timestamp=last.records[0].timestamp_ms)
        elif ts < 0:
            out["error_code"] = Errors.INVALID_REQUEST
        else:
            found = topic_offsets_for_times(state.sync_redis, ns, {(topic, partition): ts})
            hit = found[(topic, partition)]
            if hit is not None:
                out.update(offset=hit.offset, timestamp=hit.timestamp_ms)
    except TopicError as exc:
        out["error_code"] = exc.error
    return out


@api(2, "ListOffsets", 1, 7)
async def list_offsets(conn: Connection, req: Any, version: int) -> dict[str, Any]:
    state = conn.state
    described = {t.name for t in req.topics
                 if conn.may(Operation.DESCRIBE, ResourceType.TOPIC, t.name)}

    async def refused(partition: int) -> dict[str, Any]:
        return {"partition_index": partition, "error_code": TOPIC_AUTHORIZATION_FAILED,
                "timestamp": -1, "offset": -1, "leader_epoch": -1}

    jobs = [(t.name, state.blocking(_list_offset, state, t.name, p.partition_index,
                                    int(p.timestamp)) if t.name in described
             else refused(p.partition_index))
            for t in req.topics for p in t.partitions]
    results = await asyncio.gather(*(job for _, job in jobs))
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for (topic, _), res in zip(jobs, results, strict=True):
        by_topic.setdefault(topic, []).append(res)
    return {"throttle_time": 0, "topics": [{"name": t, "partitions": parts}
                                           for t, parts in by_topic.items()]}
