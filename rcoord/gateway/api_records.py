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
import collections
import functools
import logging
from collections.abc import Iterable
from typing import Any, TypeVar, cast

import redis.exceptions

from ..asyncio.cancel import cancel_and_wait
from ..connect import one_operation, refused_unrun
from ..errors import Errors, InvalidRequestError, reraise_as_rcoord
from ..partitioning import keyslot
from ..topics import (
    PartitionRecords,
    Record,
    RecordMetadata,
    TopicError,
    fetch,
    log_offsets,
    partition_key,
)
from ..topics import offsets_for_times as topic_offsets_for_times
from ..topics._base import unreadable_partition
from ..topics.fetch import fetch_bounded
from ..topics.producer import append_idempotent
from .acl import Operation, ResourceType
from .api_producers import kafka_producer_name
from .errors import (
    FETCH_SESSION_ID_NOT_FOUND,
    INVALID_PRODUCER_EPOCH,
    INVALID_RECORD,
    INVALID_REQUIRED_ACKS,
    NOT_LEADER_OR_FOLLOWER,
    TOPIC_AUTHORIZATION_FAILED,
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    TRANSACTIONS_NOT_SERVED,
    UNREACHED,
    UNREACHED_MESSAGE,
    log_unreached,
)
from .records import (
    BatchError,
    IncomingBatch,
    check_request_records,
    decode_batches,
    encode_fetched,
    fetched_sizes,
    first_batch_transactional,
)
from .registry import api
from .state import Connection, GatewayState
from .wire import millis

__all__: list[str] = []

log = logging.getLogger(__name__)

K = TypeVar("K")
V = TypeVar("V")

FETCH_MAX_RECORDS = 500
"""Records read from one partition per Fetch (fewer if ``partition_max_bytes`` is reached)."""
FETCH_FIRST_READ = 32
"""Records the first read of a partition sized by its last Fetch's records asks for at most
(they may have grown since); later reads are sized by the bytes those took (``_read``)."""
RECORD_SIZES_KEPT = 1 << 16
"""Partitions whose record size the gateway keeps at most (``GatewayState.record_bytes``)."""
MAX_SLOT_WAITS = 8
"""Slot groups (``XREAD BLOCK``s, one unit each) a Fetch waits on at once on a Redis Cluster."""
ROTATION_BLOCK_MS = 100
"""The longest block of a round while the Fetch has slot groups that round does not cover."""
_EARLIEST, _LATEST, _MAX_TIMESTAMP, _EARLIEST_LOCAL, _LATEST_TIERED = -2, -1, -3, -4, -5
_SPECIAL_TIMESTAMPS = {_EARLIEST: 1, _LATEST: 1, _MAX_TIMESTAMP: 7, _EARLIEST_LOCAL: 8,
                       _LATEST_TIERED: 9}
"""ListOffsets' negative timestamps served, each with the first version that has it (Kafka's
``ReplicaManager.timestampMinSupportedVersion``). Another negative timestamp, or one before its
version, is answered UNSUPPORTED_VERSION for its partition, as Kafka answers it."""


# -- Produce ----------------------------------------------------------------------------------


def _append_batch(state: GatewayState, topic: str, partition: int, batch: IncomingBatch
                  ) -> RecordMetadata:
    """Blocking: append one batch; where its first record is (the original place for an
    idempotent producer's exact resend).

    One script call per batch however many records it has (``atomic``): Kafka appends a batch
    whole, and the client takes base offset + index as each record's offset, so nothing may
    land in between. ``message_max_bytes`` bounds the batch (``decode_batches``).
    """
    if not batch.records:
        raise BatchError(Errors.INVALID_REQUEST, "a record batch without records")
    if batch.producer_id < 0:
        return state.producer.send_batch(topic, batch.records, atomic=True)[0]
    if batch.base_sequence < 0:  # (Kafka's LogValidator.validateBatch)
        raise BatchError(INVALID_RECORD, f"invalid sequence number {batch.base_sequence} in a "
                         f"record batch with producer id {batch.producer_id}")
    if batch.producer_epoch < 0:
        # Kafka's ProducerAppendInfo.checkProducerEpoch: an epoch below the partition's for the
        # producer (-1 when it has none) is INVALID_PRODUCER_EPOCH. Kafka takes epoch -1 from a
        # producer the partition has no epoch for (with no sequence check); rcoord keeps no
        # such producer state, so that one is refused too. INVALID_REQUEST was no answer
        # Kafka gives here.
        raise BatchError(INVALID_PRODUCER_EPOCH,
                         f"producer id {batch.producer_id} with epoch {batch.producer_epoch}: "
                         "the epoch must be >= 0 (InitProducerId gives epoch 0)")
    try:
        metas = append_idempotent(
            state.sync_redis, state.config.namespace, topic, partition, batch.records,
            producer_id=kafka_producer_name(batch.producer_id),
            producer_epoch=batch.producer_epoch, base_sequence=batch.base_sequence,
            atomic=True, wrapping=True)  # Kafka's sequences go from 2**31 - 1 to 0
    except TopicError as exc:
        if exc.error == Errors.PRODUCER_FENCED:  # what Kafka answers a Produce with (KIP-588)
            raise BatchError(INVALID_PRODUCER_EPOCH, exc.detail or str(exc)) from None
        raise
    # A duplicate is a whole batch the partition remembers, with its offsets (wrapping=True):
    # never DUPLICATE_SEQUENCE_NUMBER, which a Kafka client counts as success.
    return metas[0]


def _append(state: GatewayState, topic: str, partition: int, data: bytes | None, *,
            version: int) -> dict[str, Any]:
    """Blocking: append one partition's batch (Kafka's clients send one); its response.

    An idempotent producer's exact resend is answered as Kafka does: success, with the offset
    and timestamp of the original append; one no longer remembered is out of order, as in Kafka.
    """
    out: dict[str, Any] = {"index": partition, "error_code": Errors.NONE, "base_offset": -1,
                           "log_append_time": -1, "log_start_offset": -1}
    missing = _missing(state, topic, partition) if partition < 0 else None
    if missing:
        out.update(error_code=Errors.UNKNOWN_TOPIC_OR_PARTITION, error_message=missing)
        return out
    try:
        batches = decode_batches(data or b"", partition, version,
                                 state.config.message_max_bytes)
        unserved = _unserved_slot(state, topic, partition)
        if unserved:
            out.update(error_code=NOT_LEADER_OR_FOLLOWER, error_message=unserved)
            return out
        # (one at most, as Kafka's ProduceRequest.validateRecords: appending the first before
        # a later one failed would leave half a request written)
        with one_operation(state.sync_redis):  # (a reload's resend judged with its first send)
            metas = [_append_batch(state, topic, partition, b) for b in batches]
    except BatchError as exc:
        # Kafka looks the partition up before it reads the records (handleProduceRequest).
        missing = _missing(state, topic, partition)
        out.update(error_code=Errors.UNKNOWN_TOPIC_OR_PARTITION if missing else exc.code,
                   error_message=missing or str(exc))
        return out
    except TopicError as exc:
        out.update(error_code=_as_unknown(exc), error_message=str(exc))
        return out
    out.update(base_offset=metas[0].offset, log_append_time=metas[0].timestamp_ms,
               log_start_offset=_log_start(state, topic, partition))
    return out


def _unserved_slot(state: GatewayState, topic: str, partition: int) -> str | None:
    """Blocking: why the partition's slot has no master in the cluster client's slot map (read
    again first, at most once a second: ``rcoord.connect.refresh_uncovered``), or None.

    An append to such a slot is not sent, so it certainly did not run: NOT_LEADER_OR_FOLLOWER,
    as Kafka answers a partition whose leader it is not, on which Kafka's producer reads its
    metadata again and resends. Sent, it failed the same way (redis-py's
    ``SlotNotCoveredError``) and was answered REQUEST_TIMED_OUT, "maybe written", which is all
    that failure can say there: redis-py raises it too on the retry after a lost connection,
    whose call may have run."""
    if not state.cluster:
        return None
    try:
        state.sync_redis.get_node_from_key(partition_key(state.config.namespace, topic,
                                                         partition))
    except redis.exceptions.SlotNotCoveredError as exc:
        return (f"partition {partition} of {topic!r} is on a Redis Cluster slot no master "
                f"serves now; nothing was appended ({exc})")
    return None


def _log_start(state: GatewayState, topic: str, partition: int) -> int:
    """Blocking: the partition's log start offset for a Produce answer, or -1 (Kafka's "not
    known") when it cannot be read. The batch is stored by then: a failure of this read made
    the answer REQUEST_TIMED_OUT (or the topic's error), and the client resent a batch already
    appended, a duplicate unless it was idempotent."""
    try:
        return log_offsets(state.sync_redis, state.config.namespace, topic, partition)[0]
    except (TopicError, *UNREACHED) as exc:
        log.info("produce to %s-%d: appended, log start offset not read (%s)", topic,
                 partition, exc)
        return -1


def _missing(state: GatewayState, topic: str, partition: int) -> str | None:
    """Blocking: why the partition does not exist, or None when it does (the append's own
    check is in its script; this one is for the answers Kafka gives before appending)."""
    if partition >= 0:
        try:
            if partition < state.topics.partition_count(topic):
                return None
        except TopicError as exc:
            if _as_unknown(exc) != Errors.UNKNOWN_TOPIC_OR_PARTITION:
                raise
            return f"topic {topic!r} does not exist"
    return f"partition {partition} of {topic!r} does not exist"


def _bad_acks(state: GatewayState, topic: str, partition: int, data: bytes | None, *,
              acks: int, version: int) -> dict[str, Any]:
    """Blocking: the answer of a writable partition in a request with an invalid ``acks``.

    As Kafka's ``handleProduceRequest``: the partition's existence, then the record checks
    it makes while it parses the request (``check_request_records``: no batch, magic, zstd
    before v7, two batches), and only then ``ReplicaManager.appendRecords``' acks check. The
    acks answer came before the record checks, so such a partition was INVALID_REQUIRED_ACKS
    where Kafka says what is wrong with its records."""
    out: dict[str, Any] = {"index": partition, "base_offset": -1, "log_append_time": -1,
                           "log_start_offset": -1}
    missing = _missing(state, topic, partition)
    if missing:
        return {**out, "error_code": Errors.UNKNOWN_TOPIC_OR_PARTITION, "error_message": missing}
    try:
        check_request_records(data or b"", version)
    except BatchError as exc:
        return {**out, "error_code": exc.code, "error_message": str(exc)}
    return {**out, "error_code": INVALID_REQUIRED_ACKS,
            "error_message": f"acks must be -1, 0 or 1, got {acks}"}


def _last_of_each(entries: Iterable[tuple[K, V]]) -> list[tuple[K, V]]:
    """One entry per key, the last given, in the order each key first came: how Kafka reads a
    Produce or Fetch that names a partition twice (``KafkaApis.handleProduceRequest``'s map of
    partition to records; ``FetchRequest.fetchData``, a ``LinkedHashMap``), so the partition is
    appended to or read once, and answered once."""
    return list(dict(entries).items())


@api(0, "Produce", 3, 9)
async def produce(conn: Connection, req: Any, version: int) -> dict[str, Any] | None:
    state = conn.state
    entries = _last_of_each(((t.name, p.index), p.records)
                           for t in req.topic_data for p in t.partition_data)
    try:
        if any(first_batch_transactional(p.records)
               for t in req.topic_data for p in t.partition_data):
            return _no_transactions(conn, [key for key, _ in entries], acks=req.acks)
    except BatchError as exc:  # a corrupt first batch, read before all else as in Kafka
        return _corrupt(conn, [key for key, _ in entries], exc, acks=req.acks)
    writable = {t.name for t in req.topic_data
                if conn.may(Operation.WRITE, ResourceType.TOPIC, t.name)}

    async def refused(partition: int) -> dict[str, Any]:
        return {"index": partition, "error_code": TOPIC_AUTHORIZATION_FAILED, "base_offset": -1,
                "log_append_time": -1, "log_start_offset": -1}

    # An invalid acks appends nothing (Kafka's appendRecords); as in Kafka, a partition the
    # caller may not write, that does not exist, or whose records fail the checks Kafka makes
    # on parsing (``_bad_acks``) still answers that first.
    append = (functools.partial(_append, version=version) if req.acks in (-1, 0, 1)
              else functools.partial(_bad_acks, acks=req.acks, version=version))
    jobs = [(topic, index,
             state.blocking(append, state, topic, index, records) if topic in writable
             else refused(index))
            for (topic, index), records in entries]
    # Every partition's append ends before the response is sent: one answered early while
    # another still ran let a client resend into an append in flight.
    outcomes = await asyncio.gather(*(job for _, _, job in jobs), return_exceptions=True)
    results = [_unreached(state, f"Produce v{version}", index, out)
               if isinstance(out, BaseException) else out
               for (_, index, _), out in zip(jobs, outcomes, strict=True)]
    if req.acks == 0:
        # acks=0: Kafka sends no response at all. A partition that failed closes the
        # connection instead (KafkaApis' closeConnection): the one sign such a producer gets,
        # which makes it refresh its metadata rather than go on sending into the void.
        failed = [f"{topic}-{res['index']}: error {int(res['error_code'])}"
                  for (topic, _, _), res in zip(jobs, results, strict=True)
                  if res["error_code"] != Errors.NONE]
        if failed:
            log.info("acks=0 produce from %s failed (%s); closing the connection, as Kafka "
                     "does", conn.client_id, ", ".join(failed))
            conn.close_after_response = True
        return None
    return _answer([(topic, res) for (topic, _, _), res in zip(jobs, results, strict=True)])


def _no_transactions(conn: Connection, partitions: list[tuple[str, int]], *, acks: int
                     ) -> dict[str, Any] | None:
    """The answer to a Produce with a transactional batch: every partition
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED, nothing appended, as Kafka answers one whose
    transactional id the caller may not use (``KafkaApis.handleProduceRequest``, before the
    topics' ACLs and existence; acks=0 closes the connection). The gateway serves no
    transactions, and answers a transactional id so everywhere (``errors.TRANSACTIONS_NOT_SERVED``
    says why). The partition's INVALID_REQUEST, before, let the other partitions of the request
    be appended."""
    log.warning("transactional produce from client id %r (%s) refused: %s", conn.client_id,
                conn.client_host, TRANSACTIONS_NOT_SERVED)
    return _refused_whole(conn, partitions, TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                          TRANSACTIONS_NOT_SERVED, acks=acks)


def _corrupt(conn: Connection, partitions: list[tuple[str, int]], exc: BatchError, *,
             acks: int) -> dict[str, Any] | None:
    """The answer to a Produce whose first batch of a partition has a corrupt length or magic
    (``first_batch_transactional``): the error on every partition, nothing appended, as Kafka
    answers the CorruptRecordException ``hasTransactionalRecords`` raises (before the ACLs and
    the topics' existence; ``ProduceRequest.getErrorResponse``); acks=0 closes the connection
    (``RequestHandlerHelper.sendErrorOrCloseConnection``)."""
    log.info("produce from client id %r (%s) refused whole: %s", conn.client_id,
             conn.client_host, exc)
    return _refused_whole(conn, partitions, exc.code, str(exc), acks=acks)


def _refused_whole(conn: Connection, partitions: list[tuple[str, int]], code: int, message: str,
                   *, acks: int) -> dict[str, Any] | None:
    """``code`` and ``message`` on every partition of a Produce of which nothing was appended;
    with acks=0, which has no response, the connection is closed instead, as Kafka's
    ``RequestHandlerHelper.sendErrorOrCloseConnection`` does."""
    if acks == 0:
        conn.close_after_response = True
        return None
    return _answer([(topic, {"index": index, "error_code": code, "error_message": message,
                             "base_offset": -1, "log_append_time": -1, "log_start_offset": -1})
                    for topic, index in partitions])


def _unreached(state: GatewayState, what: str, partition: int, exc: BaseException
               ) -> dict[str, Any]:
    """The response of a partition whose append could not reach Redis (whether it was stored
    is not known): REQUEST_TIMED_OUT, retriable, as Kafka answers a write whose outcome it does
    not know; the partitions that were reached keep their own answers. Anything else is a fault
    of the request as a whole (``dispatch`` answers it), raised once every append has ended.
    Logged as ``dispatch`` logs it for other requests (``log_unreached``: once, then at most
    once a while; a refused login of the gateway's own by ``log_login_refused``): answered
    here, Redis unreachable was logged nowhere, and a gateway only producers used gave no sign
    of the outage.

    An append every attempt of which Redis refused unrun (a slot move's ``TRYAGAIN``, its
    keys split between two masters; CLUSTERDOWN: ``rcoord.connect.refused_unrun``) was
    certainly not stored: NOT_LEADER_OR_FOLLOWER, as Kafka answers a partition whose leader
    moved (``Partition.appendRecordsToLeader``), on which its producer reads its metadata
    again and resends (``_unserved_slot``'s answer). It was REQUEST_TIMED_OUT too, "maybe
    written", which a producer without idempotence resends as a possible duplicate."""
    if not isinstance(exc, UNREACHED):
        raise exc
    log_unreached(state, what, exc)
    # The client is told what happened, never redis-py's words: they name the Redis server's
    # address (or its refused login), which only the gateway's log may hold, as Kafka's broker
    # answers a storage failure with its code alone.
    out = {"index": partition, "error_code": Errors.REQUEST_TIMED_OUT,
           "error_message": UNREACHED_MESSAGE, "base_offset": -1,
           "log_append_time": -1, "log_start_offset": -1}
    if refused_unrun(exc):
        out.update(error_code=NOT_LEADER_OR_FOLLOWER, error_message=(
            f"partition {partition}: Redis refused the append for now (a slot moving or "
            "failing over); nothing was appended"))
    return out


def _answer(partitions: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """A Produce response of each topic's partition responses, in request order."""
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for topic, res in partitions:
        by_topic.setdefault(topic, []).append(res)
    return {"throttle_time": 0, "responses": [
        {"name": topic, "partition_responses": parts} for topic, parts in by_topic.items()]}


# -- Fetch ------------------------------------------------------------------------------------


def _bounds(state: GatewayState, topic: str, partition: int, offset: int
            ) -> PartitionRecords[Record]:
    """Blocking: a partition's answer without records: its log offsets, and whether ``offset``
    is in them (``_read`` reads its records once the bytes it may take are known). A stream
    whose last id is not rcoord's is CORRUPT_MESSAGE here too, as ``_read`` answers it: it was
    UNKNOWN_SERVER_ERROR for a partition read this way first, which Kafka's consumer fetches
    again for ever, without a word to the application (``_unreadable_or_unknown``)."""
    try:
        start, end = log_offsets(state.sync_redis, state.config.namespace, topic, partition)
    except (TopicError, InvalidRequestError) as exc:
        return PartitionRecords([], -1, -1, _unreadable_or_unknown(exc))
    # Kafka answers a fetch offset outside the log (a negative one too) OFFSET_OUT_OF_RANGE
    # for that partition, with its log offsets so the client can reset.
    error = Errors.NONE if start <= offset <= end else Errors.OFFSET_OUT_OF_RANGE
    return PartitionRecords([], start, end, error)


def _read(state: GatewayState, topic: str, partition: int, offset: int, max_bytes: int
          ) -> PartitionRecords[Record]:
    """Blocking: records from ``offset`` on, up to ``FETCH_MAX_RECORDS`` and about ``max_bytes``
    (at least one record, as Kafka sends a record larger than the limit whole).

    ``rcoord.topics``' byte-bounded reader (``fetch_bounded``) reads in steps sized by the
    records' bytes, each at most a few times the records before it, so what is read from Redis
    stays near ``max_bytes`` even when the records grow. The first read asks for what
    ``max_bytes`` holds at the size the partition's records had in its last Fetch
    (``state.record_bytes``, kept here), at most ``FETCH_FIRST_READ`` as they may have grown
    since. Before, the gateway stepped on its own with no cap on a step's growth: 40 records of
    a byte, then records of 20 kB, read 9.2 MB for a limit of 1 MiB; and at first
    ``FETCH_FIRST_READ`` records whatever their size (32 MB read to send one record of 1 MB)."""
    if offset < 0:
        return _bounds(state, topic, partition, offset)
    key = (topic, partition)
    try:
        res = fetch_bounded(state.sync_redis, state.config.namespace, topic, partition, offset,
                            FETCH_MAX_RECORDS, max(1, max_bytes),
                            record_bytes=state.record_bytes.get(key, 0),
                            first_read=FETCH_FIRST_READ)
    except (TopicError, InvalidRequestError) as exc:
        return PartitionRecords([], -1, -1, _unreadable_or_unknown(exc))
    if res.records:
        if len(state.record_bytes) >= RECORD_SIZES_KEPT and key not in state.record_bytes:
            state.record_bytes.clear()  # (partitions of deleted topics, say)
        state.record_bytes[key] = -(-res.read_bytes // len(res.records))
    return res


def _worth_reading(state: GatewayState, topic: str, partition: int, offset: int,
                   res: PartitionRecords[Record], budget: int, first: bool) -> bool:
    """Whether a partition answered by ``_bounds`` is read, with ``budget`` of the response
    left: it has records at ``offset``, and either it is the first partition with records
    (which sends one however large) or ``budget`` holds a record of the size its records had
    in its last Fetch (a partition of no known size is read, to learn it: one record, dropped
    if it does not fit, ``_within``)."""
    if res.error != Errors.NONE or offset >= res.log_end_offset:
        return False
    return first or budget >= max(1, state.record_bytes.get((topic, partition), 0))


def _as_unknown(exc: TopicError | InvalidRequestError) -> Errors:
    """The error a Fetch or ListOffsets answers for one partition: as Kafka, a partition its
    metadata does not have (a negative index, an illegal topic name) is
    UNKNOWN_TOPIC_OR_PARTITION for that partition alone, not the request refused whole."""
    if isinstance(exc, InvalidRequestError) or exc.error == Errors.INVALID_TOPIC_EXCEPTION:
        return Errors.UNKNOWN_TOPIC_OR_PARTITION
    return Errors(exc.error)


def _unreadable_or_unknown(exc: TopicError | InvalidRequestError) -> Errors:
    """The error a Fetch answers for one partition its read refused: ``_as_unknown``, but
    CORRUPT_MESSAGE for a stream entry that is not a record (an XADD by hand; the read's
    UNKNOWN_SERVER_ERROR with a detail naming it, ``rcoord.topics.fetch``). Kafka's consumer
    throws on CORRUPT_MESSAGE ("Encountered corrupt message when fetching offset ..."), so
    the application hears of it and can seek past it; UNKNOWN_SERVER_ERROR it only logs at
    WARN and fetches again, for ever: the partition stalled without a word to the
    application."""
    if unreadable_partition(exc):
        return Errors.CORRUPT_MESSAGE
    return _as_unknown(exc)


def _within(records: list[Record], max_bytes: int, whole: bool) -> tuple[list[Record], int]:
    """The first records of ``records`` that fit ``max_bytes`` (with ``whole``, at least the
    first, which Kafka sends even when it alone is larger), and the bytes they take."""
    out: list[Record] = []
    used = 0
    for rec, size in zip(records, fetched_sizes(records), strict=True):
        if used + size > max_bytes and (out or not whole):
            break
        out.append(rec)
        used += size
    return out, used


def _partition_data(partition: int, res: PartitionRecords[Record], records: list[Record]
                    ) -> dict[str, Any]:
    return {
        "partition_index": partition, "error_code": res.error,
        "high_watermark": res.log_end_offset, "last_stable_offset": res.log_end_offset,
        "log_start_offset": res.log_start_offset, "aborted_transactions": None,
        "preferred_read_replica": -1, "records": encode_fetched(records),
    }


async def _wait_for_records(state: GatewayState, wanted: list[tuple[str, int, int]],
                            deadline: float) -> None:
    """Block until a record lands at or after one of the wanted offsets, or until ``deadline``
    (the event loop's time at which the Fetch's ``max_wait`` ends).

    One ``XREAD BLOCK`` over every stream on one node. A Redis Cluster refuses a multi-key
    command across slots, and every partition has a slot of its own, so there each slot group
    gets its own ``XREAD BLOCK``; the first to return ends the wait and the others are cancelled
    (redis-py drops a connection whose command was cancelled, so no late reply is misread).

    The client's ``max_wait`` is any int32, and a blocked command must return before the Redis
    client's socket timeout or redis-py gives up on it; so the wait is made of blocks of at most
    ``state.block_limit_ms`` (half that timeout), repeated until a record comes or the client's
    wait is over.

    Each ``XREAD BLOCK`` holds a pooled connection, so a round first takes one of the gateway's
    ``fetch_wait_limit`` units (``state.fetch_waits``) per block, and gives them back after:
    parked Fetches without a bound took every connection of the pool, and heartbeats, joins and
    other Fetches failed. A round blocks on at most ``MAX_SLOT_WAITS`` slot groups (and never
    more than the units there are); a Fetch with more takes the next ones each round, in turn,
    in blocks of at most ``ROTATION_BLOCK_MS`` so the turn goes round. An ``XREAD`` from an
    offset answers at once when the stream already has a record past it, so a record that
    landed in a slot not blocked on is seen by the round that comes to its slot, or else by the
    read that follows the wait. Blocking on every slot at once, one idle Fetch over 100
    partitions held 100 connections, and a few of them overran a cluster node's pool of 100.

    A Fetch that gets no units before its deadline stops waiting and is answered with what it
    has, as Kafka's purgatory answers an expired Fetch. A block is timed from when its units
    are taken, ends by the deadline, and is never ``BLOCK 0`` (for ever).

    A slot group whose wait fails unreached (``_UNAVAILABLE``: on a cluster, its slot lost its
    master while the Fetch waited) is logged and no longer waited on; the others are, and the
    read that follows the wait answers its partitions by themselves (NOT_LEADER_OR_FOLLOWER
    while the slot is down). It failed the whole Fetch: every partition NOT_LEADER_OR_FOLLOWER,
    the records that came meanwhile to the others not sent. Only when every group's wait has
    failed so (Redis itself unreachable) is the first failure raised, as before.
    """
    loop = asyncio.get_running_loop()
    if not wanted or deadline <= loop.time():
        return
    by_slot: dict[int, dict[str, str]] = {}
    for t, p, o in wanted:
        key = partition_key(state.config.namespace, t, p)
        by_slot.setdefault(keyslot(key) if state.cluster else 0, {})[key] = f"0-{o}"
    groups = list(by_slot.values())
    units = state.fetch_waits()
    per_round = min(len(groups), MAX_SLOT_WAITS, units.units)
    rotating = per_round < len(groups)
    turn = 0
    state.fetch_waiting += 1
    try:
        while (left_s := deadline - loop.time()) > 0:
            taken = per_round
            if not await units.take(taken, left_s):
                return  # no units before max_wait: answer with what there is
            try:
                block_ms = min(int((deadline - loop.time()) * 1000), state.block_limit_ms)
                if rotating:
                    block_ms = min(block_ms, ROTATION_BLOCK_MS)
                these = [groups[(turn + i) % len(groups)] for i in range(taken)]
                turn = (turn + taken) % len(groups)
                failed: dict[int, BaseException] = {}
                if block_ms < 1 or await _xread_any(state, these, block_ms, failed):
                    return
            finally:
                units.give(taken)
            if failed:
                gone = [these[i] for i in failed]
                groups = [g for g in groups if all(g is not f for f in gone)]
                first = next(iter(failed.values()))
                if not groups:
                    reraise_as_rcoord("fetch wait", first)
                    raise first
                log_unreached(state, "Fetch", first)
                per_round = min(len(groups), MAX_SLOT_WAITS, units.units)
                rotating = per_round < len(groups)
                turn %= len(groups)
    finally:
        state.fetch_waiting -= 1


_UNAVAILABLE = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError,
                redis.exceptions.ClusterError, redis.exceptions.RedisClusterException)
"""What a wait raises as ``ConnectionLost`` (``reraise_as_rcoord``): no connection to be had
(the pool's wait ran out), Redis unreachable, a slot moving. The dispatcher answers it with the
Fetch's retriable code (NOT_LEADER_OR_FOLLOWER), not UNKNOWN_SERVER_ERROR at once."""

_NOT_NOW = (*_UNAVAILABLE, redis.exceptions.ResponseError)
"""What a single wait translates (``reraise_as_rcoord``): ``_UNAVAILABLE``, and the replies
that say "not now" (``ServerUnavailable``), such as the ``UNBLOCKED`` with which a master
turned replica by a failover ends every blocked ``XREAD``. That reply escaped as redis-py's
ResponseError: every parked Fetch logged a traceback at ERROR and was answered
UNKNOWN_SERVER_ERROR (below Fetch v7, on each partition: kafka-python raises it from
``poll()``). Another reply is raised as it came."""


async def _xread_any(state: GatewayState, by_slot: list[dict[str, str]], block_ms: int,
                     failed: dict[int, BaseException]) -> bool:
    """One ``XREAD BLOCK`` per slot group given; True once one returned something (or failed
    with an error other than ``_UNAVAILABLE``: the read that follows the wait reports it). A
    group whose wait failed with ``_UNAVAILABLE`` is put in ``failed`` (its index in
    ``by_slot``, with its failure) and the others are waited on."""
    try:
        if len(by_slot) == 1:
            try:
                return bool(await state.redis.xread(by_slot[0], count=1, block=block_ms))
            except _UNAVAILABLE as exc:
                failed[0] = exc
                return False
        return await _xread_first(state, by_slot, block_ms, failed)
    except _NOT_NOW as exc:
        reraise_as_rcoord("fetch wait", exc)
        raise


async def _xread_first(state: GatewayState, by_slot: list[dict[str, str]], block_ms: int,
                       failed: dict[int, BaseException]) -> bool:
    waits = [asyncio.ensure_future(state.redis.xread(streams, count=1, block=block_ms))
             for streams in by_slot]
    try:
        pending: set[asyncio.Future[Any]] = set(waits)
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for w in done:
                if isinstance(exc := w.exception(), _UNAVAILABLE):
                    failed[waits.index(w)] = exc
            if any(not isinstance(w.exception(), _UNAVAILABLE)
                   and (w.exception() is not None or w.result()) for w in done):
                return True
        return False
    finally:
        await cancel_and_wait(waits)  # (a cancel() alone can be lost on 3.11)


async def _collect(state: GatewayState, wanted: list[tuple[str, int, int, int]],
                   max_bytes: int
                   ) -> tuple[list[PartitionRecords[Record]], list[list[Record]], int]:
    """Read the wanted partitions: what each answers, the records each sends, and their bytes.

    The request's ``max_bytes`` (fetch.max.bytes) bounds the whole response: partitions in
    request order take what is left of it, as Kafka's ``readFromLog`` does: only the first
    partition with records gets one however large (a record over partition_max_bytes, or over
    what is left, is sent there alone); every other partition sends only the records that fit
    (``_within``), so a response is at most about max_bytes plus one record. Without this
    bound a response could grow past the client's own receive limit (100 MB for librdkafka),
    which dropped the connection and asked again.

    The partitions whose partition_max_bytes all fit max_bytes together (the first ones, in
    request order; every one with librdkafka's defaults up to 50 partitions) are read at once,
    each to its own limit. Each partition after them has its log offsets read at once (no
    records, ``_bounds``), and is read, in request order, only with what the response has left,
    and only if that holds one of its records at the size they had (``_worth_reading``):
    reading every partition to its own limit first read 40 MB to send 1 MB (40 backlogged
    partitions, max_bytes 1 MB); reading one record of each of them, 7 MB in every Fetch, as
    a read then also carried the partition's first and last records (``XINFO STREAM``, no
    longer read: ``rcoord.topics.fetch._read``).
    """
    limit = max(0, max_bytes)  # 0: the first partition with records sends one, as in Kafka
    room, ample = limit, 0
    for *_, partition_max in wanted:
        if partition_max > room:
            break
        room -= partition_max
        ample += 1
    firsts = _unreached_partitions(state, await asyncio.gather(*(
        state.blocking(_read, state, t, p, o, pmax) if i < ample
        else state.blocking(_bounds, state, t, p, o)
        for i, (t, p, o, pmax) in enumerate(wanted)), return_exceptions=True))
    left = limit
    results: list[PartitionRecords[Record]] = []
    chosen: list[list[Record]] = []
    total = 0
    for i, ((topic, partition, offset, partition_max), res) in enumerate(zip(wanted, firsts,
                                                                             strict=True)):
        budget = min(partition_max, left)
        if i >= ample and _worth_reading(state, topic, partition, offset, res, budget,
                                         not any(chosen)):
            try:
                res = await state.blocking(_read, state, topic, partition, offset, budget)
            except UNREACHED as exc:  # (another partition was read: answered by partition)
                log_unreached(state, "Fetch", exc)
                res = _UNREACHED_PARTITION
        # Only the first partition with records may go over (Kafka's readFromLog turns
        # minOneMessage off after it): one more record whole would exceed max_bytes.
        records, used = _within(res.records, budget, whole=not any(chosen))
        results.append(res)
        chosen.append(records)
        left = max(0, left - used)
        total += used
    return results, chosen, total


_UNREACHED_PARTITION: PartitionRecords[Record] = PartitionRecords(
    [], -1, -1, cast(Errors, NOT_LEADER_OR_FOLLOWER))
"""A Fetch's answer for a partition Redis could not serve (``UNREACHED``: its slot has no
master, or is moving) while others of the Fetch were read: NOT_LEADER_OR_FOLLOWER and offsets
-1, as Kafka's ``FetchResponse.partitionResponse``. (The code is the gateway's, not in
``Errors``; it is only encoded.)"""


def _unreached_partitions(state: GatewayState, outcomes: list[Any]
                          ) -> list[PartitionRecords[Record]]:
    """A Fetch's partition reads (``asyncio.gather``'s, exceptions returned), each failed by
    ``UNREACHED`` answered as ``_UNREACHED_PARTITION``, as Kafka answers by partition: one
    partition's slot with no master (a cluster) failed the whole Fetch, and a consumer, which
    fetches all its partitions from the one broker the gateway is, got nothing from any of
    them for as long as that slot was down. When every partition failed so (Redis itself
    unreachable) the first failure is raised: the Fetch fails as a whole, answered no sooner
    than its ``max_wait`` (docs/gateway.md, "Bad requests"). Any other failure is raised."""
    failed = [out for out in outcomes if isinstance(out, BaseException)]
    for exc in failed:
        if not isinstance(exc, UNREACHED) or len(failed) == len(outcomes):
            raise exc
    if failed:
        log_unreached(state, "Fetch", failed[0])
    return [_UNREACHED_PARTITION if isinstance(out, BaseException) else out for out in outcomes]


@api(1, "Fetch", 4, 12)
async def fetch_records(conn: Connection, req: Any, version: int) -> dict[str, Any]:
    state = conn.state
    if int(getattr(req, "session_epoch", -1)) > 0:  # (v7+)
        # An incremental fetch (KIP-227) names a session, and the gateway opens none (it
        # answers session id 0): Kafka's FetchManager answers a session it does not have so,
        # and the client starts over with a full fetch. Served as a full fetch, it was told
        # NONE for only the partitions it named.
        return {"throttle_time": 0, "error_code": FETCH_SESSION_ID_NOT_FOUND, "session_id": 0,
                "responses": []}
    readable = {t.topic for t in req.topics if conn.may(Operation.READ, ResourceType.TOPIC,
                                                        t.topic)}
    wanted = [(topic, partition, *read) for (topic, partition), read in _last_of_each(
        ((t.topic, p.partition), (int(p.fetch_offset), int(p.partition_max_bytes)))
        for t in req.topics for p in t.partitions if t.topic in readable)]
    max_bytes = int(req.max_bytes)
    results, chosen, total = await _collect(state, wanted, max_bytes)
    # As Kafka's fetchMessages: answer now if max_wait <= 0, on an error, or once min_bytes are
    # readable (min_bytes <= 0: at once; a min_bytes over the response's max_bytes counts as
    # max_bytes, which is all a response can hold); else wait for records, up to max_wait.
    enough = min(int(req.min_bytes), max_bytes) if max_bytes > 0 else int(req.min_bytes)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + millis(req.max_wait) / 1000
    # A partition Redis could not serve does not end the wait (nor is waited on): the others
    # are, as when the whole Fetch fails (answered at its max_wait), so that a client does not
    # fetch again at once, for as long as that partition's slot is down.
    while wanted and total < enough and all(
            r.error == Errors.NONE or r is _UNREACHED_PARTITION for r in results):
        if int((deadline - loop.time()) * 1000) <= 0:
            break
        # New records: at or after what each partition's read reached (its log end).
        await _wait_for_records(state, [(t, p, max(o, r.log_end_offset))
                                        for (t, p, o, _), r in zip(wanted, results, strict=True)
                                        if r is not _UNREACHED_PARTITION], deadline)
        results, chosen, total = await _collect(state, wanted, max_bytes)
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for (topic, partition), _ in _last_of_each(((t.topic, p.partition), None) for t in req.topics
                                               for p in t.partitions if t.topic not in readable):
        by_topic.setdefault(topic, []).append({
            "partition_index": partition, "error_code": TOPIC_AUTHORIZATION_FAILED,
            "high_watermark": -1, "last_stable_offset": -1, "log_start_offset": -1,
            "aborted_transactions": None, "preferred_read_replica": -1,
            "records": b"",  # as Kafka's MemoryRecords.EMPTY: null reads as size -1
        })
    encoded = await asyncio.gather(*(state.blocking(_partition_data, partition, res, records)
                                     for (_, partition, _, _), res, records
                                     in zip(wanted, results, chosen, strict=True)))
    for (topic, _, _, _), data in zip(wanted, encoded, strict=True):
        by_topic.setdefault(topic, []).append(data)
    return {"throttle_time": 0, "error_code": Errors.NONE, "session_id": 0,
            "responses": [{"topic": t, "partitions": parts} for t, parts in by_topic.items()]}


# -- ListOffsets ------------------------------------------------------------------------------


def _list_offset(state: GatewayState, topic: str, partition: int, ts: int) -> dict[str, Any]:
    # No record found (a timestamp past the last, an empty log under MAX_TIMESTAMP) is
    # offset -1, timestamp -1 and leader epoch -1, as Kafka's buildErrorResponse(NONE); what is
    # found carries the one epoch the gateway advertises, 0.
    out: dict[str, Any] = {"partition_index": partition, "error_code": Errors.NONE,
                           "timestamp": -1, "offset": -1, "leader_epoch": -1}
    ns = state.config.namespace
    try:
        start, end = log_offsets(state.sync_redis, ns, topic, partition)
        # Tiered storage's (KIP-405, KIP-1005) as Kafka's UnifiedLog.fetchOffsetByTimestamp
        # answers them with no remote storage, which rcoord has: the local log start is the log
        # start, and there is no tiered offset (offset, timestamp and leader epoch -1, no error).
        if ts in (_EARLIEST, _EARLIEST_LOCAL):
            out.update(offset=start, leader_epoch=0)
        elif ts == _LATEST_TIERED:
            pass
        elif ts == _LATEST:
            out.update(offset=end, leader_epoch=0)
        elif ts == _MAX_TIMESTAMP:
            # KIP-734: the largest timestamp, with the first record that has it (Kafka's
            # offsetOfMaxTimestamp; records appended in one millisecond share it). Timestamps
            # only grow (one clock), so the last record has it. An empty log has none: -1, -1.
            if end > start:
                last = fetch(state.sync_redis, ns, topic, partition, end - 1, 1)
                if last.records:
                    out.update(_at_or_after(state, topic, partition, last.records[0].timestamp_ms))
        else:
            out.update(_at_or_after(state, topic, partition, ts))
    except (TopicError, InvalidRequestError) as exc:
        out["error_code"] = _as_unknown(exc)
    return out


def _at_or_after(state: GatewayState, topic: str, partition: int, ts: int) -> dict[str, int]:
    """The first record at or after ``ts``: its offset and timestamp (none: nothing to add)."""
    found = topic_offsets_for_times(state.sync_redis, state.config.namespace,
                                    {(topic, partition): ts})
    hit = found[(topic, partition)]
    return {} if hit is None else {"offset": hit.offset, "timestamp": hit.timestamp_ms,
                                   "leader_epoch": 0}


@api(2, "ListOffsets", 1, 9)
async def list_offsets(conn: Connection, req: Any, version: int) -> dict[str, Any]:
    state = conn.state
    described = {t.name for t in req.topics
                 if conn.may(Operation.DESCRIBE, ResourceType.TOPIC, t.name)}

    async def refused(partition: int, code: int) -> dict[str, Any]:
        return {"partition_index": partition, "error_code": code,
                "timestamp": -1, "offset": -1, "leader_epoch": -1}

    # A partition named twice (in a topic the caller may describe) is answered once, with
    # INVALID_REQUEST, as Kafka's v1+ ListOffsets (ListOffsetsRequest.duplicatePartitions;
    # ReplicaManager.fetchOffset answers by partition, so one entry for all its copies).
    named = collections.Counter((t.name, p.partition_index) for t in req.topics
                                if t.name in described for p in t.partitions)
    jobs = []
    for t in req.topics:
        for p in t.partitions:
            copies = named.pop((t.name, p.partition_index), 0)  # 0: a later copy, answered
            if t.name not in described:
                jobs.append((t.name, p.partition_index,
                             refused(p.partition_index, TOPIC_AUTHORIZATION_FAILED)))
            elif copies > 1:
                jobs.append((t.name, p.partition_index,
                             refused(p.partition_index, Errors.INVALID_REQUEST)))
            elif p.timestamp < 0 and version < _SPECIAL_TIMESTAMPS.get(p.timestamp, 1 << 15):
                jobs.append((t.name, p.partition_index,
                             refused(p.partition_index, Errors.UNSUPPORTED_VERSION)))
            elif copies == 1:
                jobs.append((t.name, p.partition_index,
                             state.blocking(_list_offset, state, t.name, p.partition_index,
                                            int(p.timestamp))))
    # A partition Redis could not serve (its slot has no master, or is moving) is
    # NOT_LEADER_OR_FOLLOWER alone, as Kafka answers by partition; it failed the whole request,
    # and a consumer resetting its offsets reset none while one slot was down.
    outcomes = await asyncio.gather(*(job for *_, job in jobs), return_exceptions=True)
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for (topic, partition, _), res in zip(jobs, outcomes, strict=True):
        if isinstance(res, UNREACHED):
            log_unreached(state, f"ListOffsets v{version}", res)
            res = {"partition_index": partition, "error_code": NOT_LEADER_OR_FOLLOWER,
                   "timestamp": -1, "offset": -1, "leader_epoch": -1}
        elif isinstance(res, BaseException):
            raise res
        by_topic.setdefault(topic, []).append(res)
    return {"throttle_time": 0, "topics": [{"name": t, "partitions": parts}
                                           for t, parts in by_topic.items()]}
