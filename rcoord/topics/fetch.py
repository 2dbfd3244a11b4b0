"""Reading a partition from a Kafka offset, and the log start and end offsets."""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import chain
from operator import itemgetter
from types import MappingProxyType
from typing import Any, Generic, Literal, TypeVar

import redis
import redis.client
import redis.exceptions

from ..errors import Errors, InvalidRequestError, translate_redis_errors
from ..scripts import route_fcall_locally
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
    _foreign_ids,
    _id_offset,
    _name,
    _offset_id,
    _offsets_of,
    last_timestamp_key_of,
    partition_key,
)
from ._decode import CorruptEntry, decode_entries, decode_entries_as

R = TypeVar("R")

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PartitionRecords(Generic[R]):
    """A fetch answer whose records are of the caller's type (``fetch_many_as``); the fields
    mean what ``FetchResult``'s mean. ``read_bytes`` is what the records weigh as the byte
    limits count them (``_entry_bytes``; ``_record_weight`` once cut to the limits): a caller
    that passes it back, divided by the records, as ``record_bytes`` lets the next read of the
    partition be sized in one step."""

    records: list[R]
    log_start_offset: int
    log_end_offset: int
    error: Errors = Errors.NONE
    read_bytes: int = 0
    detail: str = ""
    next_offset: int = -1


_Decode = Callable[[Sequence[Any]], list[Any]]
"""Stream entries to records (``_decode``)."""

# -- fetching ---------------------------------------------------------------------------------


_STALE_RETRIES = 3
"""Re-reads of a partition whose stream was replaced between the two reads of one fetch."""


def _read(pipe: Any, key: str, offset: int, max_records: int) -> None:
    pipe.execute_command("XRANGE", key, _offset_id(offset), "+", "COUNT", max_records)
    pipe.execute_command("EVALSHA", OFFSETS.sha, 2, key, last_timestamp_key_of(key))


def _log_offsets_after(client: Any, key: str, reply: Any) -> Any:
    """The log offsets read after an XRANGE (``_read``): ``reply``, or, where the script was not
    loaded (NOSCRIPT: a restart, ``SCRIPT FLUSH``; it did not run), the script called again,
    which loads it; still after the XRANGE, which is all ``_answer`` needs (an error reply of
    that call is returned as the pipeline's would be, for ``_answer`` to raise)."""
    if isinstance(reply, redis.exceptions.NoScriptError):
        try:
            return OFFSETS(client, [key, last_timestamp_key_of(key)], [])
        except redis.exceptions.ResponseError as exc:
            return exc
    return reply


_RAW_REPLIES: Mapping[str, Any] = MappingProxyType({})
"""No reply callbacks: XRANGE answers as the server sent them (read-only, as every pipeline
made here shares it)."""


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
    route_fcall_locally(client)  # (its EVALSHA of the log offsets: no COMMAND GETKEYS)
    return client.pipeline(transaction=False)


_EXACT_ENTRIES = 64
"""Replies of more entries than this are weighed by a sample of about half as many
(``_entry_bytes``)."""


def _entry_bytes(entries: Sequence[Sequence[Any]]) -> int:
    """What XRANGE entries weigh against a fetch's byte limits: the lengths of their fields'
    names and values as stored (timestamp, key, value, headers; about a record's size in a
    Kafka batch), summed by C iterators. A reply of more than ``_EXACT_ENTRIES`` is weighed by
    every k-th entry, scaled: counting every field of every entry cost 80 ns a record, 5% of
    a consumer's time per record with 100-byte values, and a long reply is one of small
    records (its count was sized by the byte limits), where a sample tells the size well."""
    n = len(entries)
    if not n:
        return 0
    sample = entries if n <= _EXACT_ENTRIES else entries[::n // (_EXACT_ENTRIES // 2)]
    fields = map(itemgetter(1), sample)
    if isinstance(entries[0][1], dict):  # (a cluster pipeline's paired form)
        total = sum(map(len, chain.from_iterable(chain.from_iterable(map(dict.items, fields)))))
    else:
        total = sum(map(len, chain.from_iterable(fields)))
    return total if sample is entries else total * n // len(sample)


def _answer(
    key: str, offset: int, entries: Any, offsets: Any, decode: _Decode = decode_entries,
    continued: bool = False,
) -> PartitionRecords[Any] | None:
    """The fetch answer from an XRANGE and the log offsets read after it on the same
    connection (``topic_offsets.lua``'s reply); None when the two reads saw different streams
    (deleted and re-created).

    ``continued``: the read goes on right after records this fetch already read (a step of
    ``_fetch_bounded``), so its first entry may lie past ``offset``, across a gap (entries
    removed by hand, XDEL), as within one read that began before the gap.

    Why the two reads need no transaction: within one stream, the log start and end only grow
    and the record at an offset never changes, so the entries read first are still the records
    at those offsets when the offsets are read (start <= offset), and all of them lie below the
    end read. The answer is therefore the state at that second instant, with possibly fewer
    records than that instant held, which a fetch may return anyway. An offset below the start
    or above the end is OFFSET_OUT_OF_RANGE with those offsets. If the stream was replaced in
    between, the entries do not start at ``offset`` or reach past the end; the caller reads
    again.
    """
    if isinstance(offsets, Exception):
        failed = _foreign_ids(offsets)
        if not isinstance(failed, TopicError):
            raise failed
        return PartitionRecords([], -1, -1, failed.error, detail=failed.detail)
    if _name(offsets[0]) != Errors.NONE:
        return PartitionRecords([], -1, -1, Errors.UNKNOWN_TOPIC_OR_PARTITION)
    start, end = int(offsets[1]), int(offsets[2])
    if offset < start or offset > end:
        return PartitionRecords([], start, end, Errors.OFFSET_OUT_OF_RANGE)
    if isinstance(entries, Exception):
        raise entries
    if entries is None:  # (XRANGE ... COUNT 0: a read of none, for the log offsets alone)
        entries = []
    if entries and ((_id_offset(entries[0][0]) != offset and not continued)
                    or _id_offset(entries[-1][0]) >= end):
        return None
    try:
        records = decode(entries)
    except CorruptEntry as exc:
        if exc.at == 0:
            # An entry that is not a record (``_decode``) where the read begins: Kafka's broker
            # answers a partition it cannot read with an error code for that partition alone.
            return PartitionRecords([], start, end, Errors.UNKNOWN_SERVER_ERROR,
                                    detail=f"{key}: {exc}")
        # Past the first: the records before it are the answer (the next read begins at it).
        entries = entries[:exc.at]
        records = decode(entries)
    return PartitionRecords(records, start, end, Errors.NONE, _entry_bytes(entries))


class _After(int):
    """A read's offset that goes on right after records the same fetch read (a step of
    ``_fetch_bounded``): ``_answer`` lets its first entry lie past it, across a gap. (Marked on
    the offset, so the reads keep their shape for ``_fetch_many`` and whoever wraps it.)"""


def _fetch_many(
    client: Any, reads: list[tuple[str, int, int, _Decode]]
) -> list[PartitionRecords[Any]]:
    """Fetch answers for ``(stream key, offset, max records, decode)`` reads, in one pipeline;
    an offset that is an ``_After`` continues records read (``_answer``'s ``continued``).

    Every read is an XRANGE then the log offsets (``topic_offsets.lua`` with the partition's
    mark: three small reads, where XINFO STREAM copied the first and last records, 2 MB a read
    for records of 1 MB) on its own keys (see ``_answer``), so in a cluster each pair goes to
    its partition's node and the pipeline costs one round trip per node. A stream entry that is
    not a record (an XADD by hand) ends its partition's answer before it (raising there lost
    the records before it for good), and once a read begins at it, that partition alone is
    answered UNKNOWN_SERVER_ERROR with a ``detail`` saying which entry and what to do, as is a
    stream whose last id is not rcoord's. Either raised TopicError for the whole call before,
    so every other partition read with it got nothing for as long as the entry was there.
    """
    results: list[PartitionRecords[Any] | None] = [None] * len(reads)
    todo = list(range(len(reads)))
    found: dict[int, int] = {}  # the offset of the entry a read that did not fit began at
    empty: set[int] = set()  # reads that found no entry before the log end
    for _ in range(_STALE_RETRIES):
        pipe = _pipeline(client)
        for i in todo:
            _read(pipe, *reads[i][:3])
        replies = pipe.execute(raise_on_error=False)
        for n, i in enumerate(todo):
            offsets = _log_offsets_after(client, reads[i][0], replies[2 * n + 1])
            results[i] = _answer(reads[i][0], reads[i][1], replies[2 * n], offsets, reads[i][3],
                                 isinstance(reads[i][1], _After))
            got = results[i]
            if got is None:
                found[i] = _id_offset(replies[2 * n][0][0])
                empty.discard(i)
            elif (not got.records and got.error == Errors.NONE and reads[i][2] > 0
                  and reads[i][1] < got.log_end_offset):
                # No entry from the offset to the log end: a record appended between the two
                # reads (or the stream replaced), which the next read finds, or entries removed
                # up to the log end by hand (XDEL), answered as a gap (``_unmatched``). It was
                # no records and no error, so a consumer there waited with a lag that never
                # went, until an append made it a gap it was told of.
                results[i], found[i] = None, got.log_end_offset
                empty.add(i)
            replies[2 * n] = None  # let the raw entries go as soon as they are decoded
        todo = [i for i in todo if results[i] is None]
        if not todo:
            return [r for r in results if r is not None]
    for i in todo:
        results[i] = _unmatched(reads[i][0], reads[i][1], found[i], i in empty)
    return [r for r in results if r is not None]


def _unmatched(key: str, offset: int, found: int, end: bool = False) -> PartitionRecords[Any]:
    """The answer for a partition whose entries read from ``offset`` did not fit its log
    offsets in any of ``_STALE_RETRIES`` reads (the first began at offset ``found``): a stream
    edited by hand (an XDEL in its middle, which rcoord never makes, or an XADD with an id past
    its end), as a stream replaced between the two reads of every one of them is not to be
    expected. That partition alone is UNKNOWN_SERVER_ERROR with a ``detail`` (``_answer``'s
    for an entry that is not a record), and with ``next_offset`` ``found`` where that is past
    ``offset`` (a gap: offsets ``offset`` to ``found - 1`` hold no entry), so a consumer can
    seek past it, and a reader that skips lost records (Spark's ``failOnDataLoss=false``)
    knows where to without parsing the detail; it raised TopicError
    (UNKNOWN_TOPIC_OR_PARTITION, "replaced") for the whole fetch, and so stalled every
    partition read with it for as long as the gap was there. A read that found no entry though
    the log end is past ``offset`` in every read comes with ``found`` that log end (``end``):
    the entries up to it were removed by hand."""
    past = f"seek to offset {found}" if found > offset else "seek past it"
    first = f"the log end at offset {found}" if end else f"the first at offset {found}"
    return PartitionRecords([], -1, -1, Errors.UNKNOWN_SERVER_ERROR, next_offset=(
        found if found > offset else -1), detail=(
        f"{key}: its entries read from offset {offset} ({first}) do not fit "
        f"its log offsets in any of {_STALE_RETRIES} reads: an entry was removed from its "
        f"middle by hand (XDEL) or added with an id of its own; {past} to read on, or remove "
        f"the records up to there with Topics.delete_records"))


_FIRST_READ = 1
"""Records a byte-bounded fetch first asks of a partition whose record size it was not given
(``record_bytes``); the reads after it are sized by the bytes those took."""

_MAX_STEPS = 8
"""Reads after the first, at most, in one byte-bounded fetch (one pipeline each)."""

_STEP_GROWTH = 2
"""A step asks a partition for at most this many times the records it gave so far (so its
records at most triple a step): the records after those may be far larger than the size the
step is sized by. A read cannot be bounded by bytes (XRANGE counts records), so this bounds
what one step can read past the limits when sizes jump: 40 records of 1 byte before records of
20 kB read about 1.1 MB for a 1 MiB bound. Growth by 8 read up to 8 records of 100 KiB after a
first one of a byte for a bound of 150 KiB (800 KiB); the gateway's Fetch, with no cap, read
9.2 MB in the case above, [32, 468] records, to send 92."""

_UNBOUNDED = 1 << 62
"""The byte limit of a fetch given none."""


def _fetch_bounded(
    client: Any,
    reads: list[tuple[str, int, int, _Decode]],
    max_bytes: int,
    partition_max_bytes: int,
    record_bytes: Sequence[int] | None = None,
    first_read: int | None = None,
) -> list[PartitionRecords[Any]]:
    """Fetch answers for ``reads`` (as ``_fetch_many``) of about ``max_bytes`` in all and
    ``partition_max_bytes`` per partition (Kafka's ``fetch.max.bytes`` and
    ``max.partition.fetch.bytes``), going over only by the first record of the first partition
    with records, as Kafka's ``readFromLog`` does (its ``minOneMessage`` holds until a partition
    has given records), so that a fetch always progresses.

    XRANGE bounds a read by count alone, so the reads go in steps (the gateway's Fetch reads
    with this too, ``fetch_bounded``): the first asks each partition, in one pipeline,
    for what its share of the bytes holds at the record size ``record_bytes`` gives it
    (``_FIRST_READ`` records where it gives none); partitions take their shares in request
    order, each what its own bound and what the earlier ones' reads left (a read of 167 small
    records leaves the rest of its 1 MiB to the others, so a fetch of 100 partitions that
    fits ``max_bytes`` is still one round trip). A share too small for one record of the known
    size reads none, unless no partition before it reads any (it may be the first with
    records). Each later step asks every partition whose last read came back full, or that
    read none, with bytes left, for what those should hold at the size its records so far had
    (the larger of their average and its last read's, or the size given; at most
    ``_STEP_GROWTH`` times the records it gave), again in one pipeline; and one record of the
    first partition with records if no read found any. ``first_read`` caps what a first read
    sized by ``record_bytes`` asks (a size from an earlier fetch may be that of smaller
    records). So
    what a fetch holds follows the byte limits, not the count: 500 records of 1 MiB read at
    once held 500 MiB in the client (and as much in Redis's reply buffer). Records beyond the
    limits (a partition whose records grew past the size given, one of unknown size whose
    first record did not fit) are dropped from the answer, each at its own size; a step that
    finds the partition gone or trimmed keeps what was read before. Before, every partition
    with records got at least one, so a fetch of 1,000 partitions of 1 MiB records held
    1,000 MiB whatever ``max_bytes``.
    """
    sizes = [0] * len(reads) if record_bytes is None else record_bytes
    answers, asked = _first_reads(client, reads, max_bytes, partition_max_bytes, sizes,
                                  first_read)
    got = [len(a.records) for a in answers]
    last = [-(-a.read_bytes // max(1, len(a.records))) for a in answers]  # last read's size
    for _ in range(_MAX_STEPS):
        left = max_bytes - sum(a.read_bytes for a in answers)
        progress = any(a.records for a in answers)
        steps: list[tuple[int, int]] = []
        for i, (a, (_, offset, most, _)) in enumerate(zip(answers, reads, strict=True)):
            have = len(a.records)
            if (a.error != Errors.NONE or got[i] < asked[i] or have >= most
                    or _next_offset(offset, a.records) >= a.log_end_offset):
                continue  # at its log end, its count, or failed
            room = min(partition_max_bytes - a.read_bytes, left)
            if have:
                size = max(-(-a.read_bytes // have), last[i], 1)
                count = min(most - have, room // size, have * _STEP_GROWTH) if room > 0 else 0
            elif sizes[i] > 0:  # (read none: its share was too small)
                count = min(most, max(0, room) // sizes[i])
            else:
                count = _FIRST_READ if room > 0 else 0
            if not progress:
                count = max(count, 1)  # the first partition with records: one, however large
            if count > 0:
                left -= max(0, room)
                progress = True
                steps.append((i, count))
        if not steps:
            break
        # A step that goes on past records read is one read continued: a gap where it begins
        # is crossed as within a read (``_answer``). Refused as a read that begins at a gap is
        # (``_unmatched``), the fetch ended before it, and the caller's next read, which then
        # began at it, failed where one that began earlier crossed it.
        more = _fetch_many(client, [(reads[i][0], _step_offset(reads[i][1], answers[i].records),
                                     count, reads[i][3]) for i, count in steps])
        for (i, count), b in zip(steps, more, strict=True):
            asked[i], got[i] = count, len(b.records)
            if b.error != Errors.NONE:
                # Trimmed past the next offset meanwhile, gone, or not readable there (an entry
                # that is not a record; a gap where a first read began: ``_unmatched``): keep
                # what was read.
                got[i] = -1
                continue
            a = answers[i]
            if b.records:
                last[i] = -(-b.read_bytes // len(b.records))
            a.records.extend(b.records)
            answers[i] = PartitionRecords(a.records, a.log_start_offset, b.log_end_offset,
                                          a.error, a.read_bytes + b.read_bytes)
    return _within_limits(answers, max_bytes, partition_max_bytes)


def _next_offset(offset: int, records: Sequence[Any]) -> int:
    """Where a read that began at ``offset`` and gave ``records`` goes on: past the last of
    them. Not ``offset + len(records)``: records read across a gap (entries removed from a
    stream's middle by hand, XDEL) hold fewer records than offsets, and a step that read on
    from that count read the records before it again, so a fetch answered them twice."""
    return records[-1].offset + 1 if records else offset


def _step_offset(offset: int, records: Sequence[Any]) -> int:
    """Where a step of a read that began at ``offset`` and gave ``records`` begins
    (``_next_offset``): an ``_After`` once it gave records, so a gap there is crossed."""
    return _After(records[-1].offset + 1) if records else offset


def _first_reads(
    client: Any,
    reads: list[tuple[str, int, int, _Decode]],
    max_bytes: int,
    partition_max_bytes: int,
    sizes: Sequence[int],
    first_read: int | None,
) -> tuple[list[PartitionRecords[Any]], list[int]]:
    """The first reads of ``_fetch_bounded``, in one pipeline: the answers, and the records
    each read asked for."""
    left = max_bytes
    first: list[tuple[str, int, int, _Decode]] = []
    reading = False  # whether a read before this one may give records
    for (key, offset, most, decode), size in zip(reads, sizes, strict=True):
        share = min(partition_max_bytes, left)
        if size > 0:
            count = min(most, share // size, most if first_read is None else first_read)
        else:
            count = _FIRST_READ if share > 0 else 0
        if not reading:
            count = max(count, 1)  # (perhaps the first partition with records)
        left -= min(share, count * size)  # what the read should take, not the whole bound
        reading = reading or count > 0
        first.append((key, offset, count, decode))
    return _fetch_many(client, first), [count for _, _, count, _ in first]


def _within_limits(
    answers: list[PartitionRecords[Any]], max_bytes: int, partition_max_bytes: int
) -> list[PartitionRecords[Any]]:
    """``answers`` cut to Kafka's limits: in order, each partition's records up to its bound
    and what the earlier ones left of ``max_bytes``, at each record's own size
    (``_record_weight``), with the first record of the first partition with records kept
    however large (``_fetch_bounded``).

    Cut at the records' average size, a read of large records then small ones kept far more
    than its bound (five of 400 kB before small ones: 2 MB kept for a bound of 1 MiB), and
    answered ``read_bytes`` of 1 MB for them, which misled the partitions after it and the
    next read's size."""
    left, taken = max_bytes, False
    for i, a in enumerate(answers):
        if not a.records:
            continue
        room = max(0, min(partition_max_bytes, left))
        if a.read_bytes > room:
            keep, used = 0, 0
            for record in a.records:
                size = _record_weight(record)
                if used + size > room and (keep or taken):
                    break
                keep, used = keep + 1, used + size
            a = answers[i] = PartitionRecords(a.records[:keep], a.log_start_offset,
                                              a.log_end_offset, a.error, used)
        left -= a.read_bytes
        taken = taken or bool(a.records)
    return answers


_ENTRY_FIELDS = 16
"""What a stream entry holds beside a record's key, value and headers, about: the field names
and the timestamp's digits (``_entry_bytes`` counts them)."""


def _record_weight(record: Any) -> int:
    """A decoded record's weight against the byte limits, as ``_entry_bytes`` weighs its
    entry (about: the headers' packing is not counted)."""
    return (_ENTRY_FIELDS + len(record.key or b"") + len(record.value or b"")
            + sum(len(name) + len(value or b"") for name, value in record.header_list))


def _fetch_once(
    client: Any, key: str, offset: int, max_records: int, max_bytes: int | None
) -> FetchResult:
    reads: list[tuple[str, int, int, _Decode]] = [(key, offset, max_records, decode_entries)]
    return _result(_raise_failed(_fetch_bounds(client, reads, max_bytes, max_bytes, None)[0]))


def _raise_failed(answer: PartitionRecords[R]) -> PartitionRecords[R]:
    """``answer`` of a one-partition read (``fetch``, ``fetch_bounded``), raised as a
    TopicError where its error has a ``detail`` (the partition cannot be read there): with one
    partition there is no other answer to keep, and the gateway answers the error for that
    partition from it."""
    if answer.detail:
        raise TopicError(answer.error, answer.detail)
    return answer


def _result(answer: PartitionRecords[Record]) -> FetchResult:
    return FetchResult(
        answer.records, answer.log_start_offset, answer.log_end_offset, answer.error,
        answer.detail, answer.next_offset,
    )


def _checked_read(redis_client: Any, namespace: str, topic: str, partition: int, offset: int,
                  max_records: int) -> str:
    """The stream key of a one-partition read (``fetch``, ``fetch_bounded``), once its
    arguments are checked (InvalidRequestError or TypeError naming the one to fix)."""
    _check_client(redis_client)
    _check_namespace(namespace)
    _check_topic(topic)
    _check_int("partition", partition, 0)
    _check_int("offset", offset, 0)
    _check_int("max_records", max_records, 1, INT32_MAX)
    return partition_key(namespace, topic, partition)


@translate_redis_errors
def fetch(
    redis_client: Any,
    namespace: str,
    topic: str,
    partition: int,
    offset: int,
    max_records: int = 500,
    block_ms: int | None = None,
    *,
    max_bytes: int | None = None,
    waker: FetchWaker | None = None,
) -> FetchResult:
    """Kafka's Fetch for one partition: up to ``max_records`` records from ``offset`` on, and
    with ``max_bytes`` about that many bytes of them (Kafka's ``max.partition.fetch.bytes``;
    at least one record, however large; ``_fetch_bounded``).

    ``offset`` may be anything from the log start to the log end inclusive (the end gives no
    records); anything else answers OFFSET_OUT_OF_RANGE with the current log offsets, so the
    caller can apply its reset policy (``resolve_offset``). Records and log offsets describe one
    instant: the log offsets are read right after the records, and the log only grows at its
    end and is trimmed at its start (``_answer``).

    With ``block_ms`` > 0 and no records at ``offset``, waits up to ``block_ms`` for one
    (Kafka's ``fetch.max.wait.ms``) with ``XREAD BLOCK`` from the id just before ``offset``:
    a record appended between the first read and the XREAD is still seen, so no wake-up is
    lost. The client's ``socket_timeout`` must exceed ``block_ms``. ``waker``: ends that
    wait from another thread (``FetchWaker.wake()``).

    ``block_ms`` is a whole number of milliseconds (``None`` or 0: do not wait); anything else
    raises, because ``XREAD BLOCK 0`` waits forever, so a fraction truncated to 0 would turn a
    short wait into an endless one.
    """
    key = _checked_read(redis_client, namespace, topic, partition, offset, max_records)
    if block_ms is not None:
        _check_int("block_ms", block_ms, 0, INT32_MAX)
    result = _fetch_once(redis_client, key, offset, max_records, max_bytes)
    if result.records or result.error != Errors.NONE or not block_ms:
        return result
    # Entries with id > 0-<offset> are those at offsets >= offset.
    node = _node_client(redis_client, key) if waker is not None else None
    if waker is None or node is None:
        redis_client.xread({key: f"0-{offset}"}, count=1, block=block_ms)
    else:
        waker._park(node, key, f"0-{offset}", block_ms,
                    functools.partial(_redirect_client, redis_client))
        if waker.woken:
            return result  # (its caller is closing: no read on a client about to close)
    return _fetch_once(redis_client, key, offset, max_records, max_bytes)


def _node_client(redis_client: Any, key: str) -> redis.Redis | None:
    """The ``redis.Redis`` of the node holding ``key`` (the client itself, standalone); None
    for another kind of client, which parks with its own ``xread`` and cannot be woken."""
    if isinstance(redis_client, redis.cluster.RedisCluster):
        node = redis_client.get_redis_connection(redis_client.get_node_from_key(key))
        return node if isinstance(node, redis.Redis) else None
    return redis_client if isinstance(redis_client, redis.Redis) else None


def _redirect_client(redis_client: Any, host: str, port: int) -> redis.Redis | None:
    """The ``redis.Redis`` of the cluster node at ``host:port`` (an ``ASK`` or ``MOVED``
    reply's), or None where ``redis_client`` is not a cluster client or does not know it."""
    if not isinstance(redis_client, redis.cluster.RedisCluster):
        return None
    found = redis_client.get_node(host=host, port=port)
    node = redis_client.get_redis_connection(found) if found is not None else None
    return node if isinstance(node, redis.Redis) else None


class FetchWaker:
    """Lets another thread end a ``fetch(..., block_ms=...)`` parked in ``XREAD BLOCK`` at
    once (``wake()``), as Kafka's ``wakeup()`` ends a consumer's wait: the fetch then returns
    what its first read found (no records) without reading again, for its caller is closing
    the client (a record that came during the wait is read by a later fetch, not this one).

    Why: a consumer's close() used to leave the read parked for up to ``fetch_max_wait_ms``,
    and the client was closed under it (by the caller, or by the group for a client made from
    ``redis_url``); a cluster client whose read fails reads the topology again on a new socket
    that nobody closed (a ResourceWarning at some later collection). A waker may serve one
    fetch after another, one at a time; once woken, it wakes every later fetch at once.

    The parked read runs on a connection taken from the node's pool, after ``CLIENT ID`` in
    the same round trip: ``wake()`` sends ``CLIENT UNBLOCK <id>`` on another connection. A
    server that refuses ``CLIENT ID`` (an ACL without it) leaves the read unwakeable, as
    before; so does a client that is neither a ``redis.Redis`` nor a ``RedisCluster``.
    """

    _UNBLOCK_RETRY_S = 0.005
    """Between ``CLIENT UNBLOCK``s while the read, sent before its id was known, has not
    reached the server yet (the unblock answers 0 then)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._woken = False
        self._parked: tuple[redis.Redis, int] | None = None  # (node, connection id)

    @property
    def woken(self) -> bool:
        with self._cond:
            return self._woken

    def wake(self) -> None:
        """End the parked read, if any, and any later one at once. Blocks for the unblock's
        round trip (run it on a thread of its own where the server may not answer)."""
        with self._cond:
            self._woken = True
            parked = self._parked
            self._cond.notify_all()
        if parked is not None:
            self._unblock(*parked, lambda: self._parked != parked)

    def _unblock(self, node: redis.Redis, conn_id: int, done: Callable[[], bool]) -> None:
        """``CLIENT UNBLOCK conn_id`` until it unblocks or the read is ``done``: it answers 0
        while the XREAD, sent before the id was known, has not reached the server yet."""
        try:
            while not done() and not node.client_unblock(conn_id):
                with self._cond:
                    self._cond.wait(self._UNBLOCK_RETRY_S)
        except (redis.exceptions.RedisError, OSError, TypeError, AttributeError):
            # (Best effort. A consumer's close() disconnects the pool while this runs on its
            # own thread: redis-py then meets a connection whose socket is already None and
            # raises TypeError from its parser's readiness check, which, uncaught, ended the
            # thread with an exception; CI failed a later test on it.)
            log.debug("CLIENT UNBLOCK failed; the fetch ends by its own wait", exc_info=True)

    def _park(
        self,
        node: redis.Redis,
        key: str,
        after_id: str,
        block_ms: int,
        redirect: Callable[[str, int], redis.Redis | None] | None = None,
    ) -> None:
        """``XREAD COUNT 1 BLOCK block_ms STREAMS key after_id`` on a connection of
        ``node``'s pool whose id ``wake()`` can unblock; the reply is not needed (the fetch
        reads again).

        In a cluster whose slot of ``key`` moves, ``node`` may answer at once with ``ASK``
        (the stream went to the importing master) or ``MOVED``: the read is then made on the
        node named, which ``redirect`` gives (after ``ASKING`` for an ``ASK``), for what is
        left of ``block_ms``; where that fails too, the rest of the wait passes here, ended by
        ``wake()``. Before, the redirection ended the wait at once, and since an ``ASK`` does
        not change the client's slot map, a consumer at the log end re-read in a busy loop for
        as long as the migration lasted."""
        deadline = time.monotonic() + block_ms / 1000
        moved = self._park_on(node, key, after_id, block_ms, asking=False)
        if moved is None or redirect is None:
            return
        target = redirect(moved.host, moved.port)
        left = int((deadline - time.monotonic()) * 1000)
        if target is not None and left > 0:
            asking = not isinstance(moved, redis.exceptions.MovedError)
            if self._park_on(target, key, after_id, left, asking=asking) is None:
                return
            left = int((deadline - time.monotonic()) * 1000)
        if left > 0:  # (moved again meanwhile, or to a node the client does not know yet)
            with self._cond:
                self._cond.wait_for(lambda: self._woken, left / 1000)

    def _park_on(
        self, node: redis.Redis, key: str, after_id: str, block_ms: int, *, asking: bool
    ) -> redis.exceptions.AskError | None:
        """``_park``'s read on ``node`` (after ``ASKING``, with ``asking``): the ``ASK`` or
        ``MOVED`` it was answered with, else None."""
        if self.woken:
            return None
        pool = node.connection_pool
        conn = pool.get_connection()
        moved: redis.exceptions.AskError | None = None
        try:
            conn.send_packed_command(conn.pack_commands([
                ("CLIENT", "ID"),
                *([("ASKING",)] if asking else []),
                ("XREAD", "COUNT", 1, "BLOCK", block_ms, "STREAMS", key, after_id),
            ]))
            try:
                conn_id: int | None = int(conn.read_response())
            except redis.exceptions.ResponseError:
                conn_id = None  # (not allowed): the read cannot be woken
            if asking:
                try:
                    conn.read_response()  # (OK)
                except redis.exceptions.ResponseError:
                    pass  # (the XREAD is then answered with the redirection again)
            with self._cond:
                if conn_id is not None:
                    self._parked = (node, conn_id)
                woken = self._woken
            try:
                if woken and conn_id is not None:  # woken between the check and the send
                    self._unblock(node, conn_id, lambda: bool(conn.can_read(timeout=0)))
                try:
                    conn.read_response()
                except redis.exceptions.AskError as exc:  # (or its subclass MovedError)
                    moved = exc
                except redis.exceptions.ResponseError:
                    pass  # the read that follows the wait reports it
            finally:
                with self._cond:
                    self._parked = None
                    self._cond.notify_all()
        except redis.exceptions.ConnectionError:
            # The connection was lost under the wait (killed, a restart, a failover): the wait
            # ended as if it ran out, and the read that follows goes through the client's own
            # command path, which retries (as the client's xread, used before, did here).
            conn.disconnect()
            log.debug("the connection of a parked fetch was lost; reading again", exc_info=True)
        except BaseException:
            conn.disconnect()  # its reply may still come: never reuse it
            raise
        finally:
            pool.release(conn)
        return moved


@translate_redis_errors
def fetch_bounded(
    redis_client: Any,
    namespace: str,
    topic: str,
    partition: int,
    offset: int,
    max_records: int,
    max_bytes: int,
    *,
    record_bytes: int = 0,
    first_read: int | None = None,
) -> PartitionRecords[Record]:
    """``fetch`` without the wait, answered with what its records weigh (``read_bytes``): the
    byte-bounded read the gateway's Fetch makes of a partition (``_fetch_bounded``; one reader,
    so both bound what they read from Redis alike).

    ``record_bytes`` (0: not known) is the partition's expected bytes per record, which sizes
    the first read, and ``first_read`` caps what that read asks.
    """
    key = _checked_read(redis_client, namespace, topic, partition, offset, max_records)
    _check_int("record_bytes", record_bytes, 0)
    if first_read is not None:
        _check_int("first_read", first_read, 1)
    _check_int("max_bytes", max_bytes, 1)
    reads: list[tuple[str, int, int, _Decode]] = [(key, offset, max_records, decode_entries)]
    return _raise_failed(_fetch_bounded(redis_client, reads, max_bytes, max_bytes,
                                        [record_bytes], first_read)[0])


@translate_redis_errors
def fetch_many(
    redis_client: Any,
    namespace: str,
    reads: Sequence[tuple[str, int, int]],
    max_records: int = 500,
    *,
    max_bytes: int | None = None,
    partition_max_bytes: int | None = None,
) -> list[FetchResult]:
    """Kafka's Fetch for several partitions at once: ``reads`` are ``(topic, partition,
    offset)``, and the answers come in the same order, each as ``fetch`` would give it (up to
    ``max_records`` records, OFFSET_OUT_OF_RANGE with the log offsets, or
    UNKNOWN_TOPIC_OR_PARTITION for a partition that does not exist), except that a partition
    that cannot be read at its offset (a stream entry there that is not a record, a stream
    whose last id is not rcoord's, an entry removed there by hand: ``_unmatched``; ``fetch``
    raises TopicError for it) is answered UNKNOWN_SERVER_ERROR with a ``detail`` saying why,
    as Kafka answers errors per partition.

    ``max_bytes`` and ``partition_max_bytes`` (Kafka's ``fetch.max.bytes`` and
    ``max.partition.fetch.bytes``; None: no bound) bound the bytes read, in all and per
    partition, going over only by one record of the first partition that has records, as in
    Kafka (``_fetch_bounded``, which takes a round trip per step). So the order of ``reads``
    matters: a caller that always asks in the same order may get nothing of a partition
    behind one with a backlog of records over the limits; Kafka's consumer, and rcoord's
    (``Consumer._send_fetch``), ask the partitions that gave records last.

    All reads go in one pipeline, so the call costs one round trip per node holding one of the
    partitions (a cluster client sends each node its part), instead of one per partition. It
    never blocks: a consumer with nothing to read waits with ``fetch(..., block_ms=...)``.
    """
    keyed = _keyed_reads(redis_client, namespace, reads, max_records, None)
    answers = _fetch_bounds(redis_client, keyed, max_bytes, partition_max_bytes, None)
    return [_result(answer) for answer in answers]


@translate_redis_errors
def fetch_many_as(
    redis_client: Any,
    namespace: str,
    reads: Sequence[tuple[str, int, int]],
    max_records: int,
    record_type: type[R],
    *,
    max_bytes: int | None = None,
    partition_max_bytes: int | None = None,
    record_bytes: Sequence[int] | None = None,
) -> list[PartitionRecords[R]]:
    """``fetch_many`` whose records are ``record_type``s built directly from the entries: a
    frozen dataclass without slots with the fields ``topic``, ``partition`` and then Record's
    (the consumer's ``ConsumerRecord``; ``_decode.decode_entries_as``).

    ``record_bytes`` (one per read, 0: not known) is each partition's expected bytes per
    record, such as the last answer's ``read_bytes`` over its records: with it, a byte-bounded
    read of records of that size takes one round trip, not two."""
    keyed = _keyed_reads(redis_client, namespace, reads, max_records, record_type)
    return _fetch_bounds(redis_client, keyed, max_bytes, partition_max_bytes, record_bytes)


def _fetch_bounds(
    redis_client: Any,
    keyed: list[tuple[str, int, int, _Decode]],
    max_bytes: int | None,
    partition_max_bytes: int | None,
    record_bytes: Sequence[int] | None,
) -> list[PartitionRecords[Any]]:
    """``_fetch_many``, or ``_fetch_bounded`` when a byte limit is given (checked here)."""
    if max_bytes is not None:
        _check_int("max_bytes", max_bytes, 1)
    if partition_max_bytes is not None:
        _check_int("partition_max_bytes", partition_max_bytes, 1)
    if record_bytes is not None:
        if len(record_bytes) != len(keyed):
            raise InvalidRequestError(f"record_bytes must give one size per read: "
                                      f"{len(record_bytes)} for {len(keyed)} reads")
        for size in record_bytes:
            _check_int("record_bytes", size, 0)
    if not keyed:
        return []
    if max_bytes is None and partition_max_bytes is None:
        return _fetch_many(redis_client, keyed)
    return _fetch_bounded(redis_client, keyed, _UNBOUNDED if max_bytes is None else max_bytes,
                          _UNBOUNDED if partition_max_bytes is None else partition_max_bytes,
                          record_bytes)


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
    (got,) = log_offsets_many(redis_client, namespace, [(topic, partition)])
    if isinstance(got, Errors):
        raise TopicError(got, f"{topic}-{partition}")
    return got


@translate_redis_errors
def log_offsets_many(
    redis_client: Any, namespace: str, partitions: Sequence[tuple[str, int]]
) -> list[tuple[int, int] | Errors]:
    """``log_offsets`` of several partitions in one round trip (per node), answers in the same
    order: (log start offset, log end offset), or the error code (UNKNOWN_TOPIC_OR_PARTITION
    for a partition that does not exist), as Kafka's ListOffsets answers per partition.

    A partition whose stream's last id is not rcoord's raises its TopicError
    (UNKNOWN_SERVER_ERROR naming it) for the whole call, the first such in ``partitions``;
    ``log_offsets_each`` answers it in its place instead.

    A partition named twice is read once and answered twice: ``_run`` sends a key's second
    call in a later round trip, and none after an error reply (its answer is None), so a
    missing partition named twice crashed here with a TypeError."""
    answers: list[tuple[int, int] | Errors] = []
    for got in log_offsets_each(redis_client, namespace, partitions):
        if isinstance(got, TopicError):
            raise got
        answers.append(got)
    return answers


@translate_redis_errors
def log_offsets_each(
    redis_client: Any, namespace: str, partitions: Sequence[tuple[str, int]]
) -> list[tuple[int, int] | Errors | TopicError]:
    """``log_offsets_many`` that answers a partition it cannot read in its place, as Kafka's
    ListOffsets answers each partition's error alone: a stream whose last id is not rcoord's
    (an XADD by hand with an id of its own) is a TopicError (UNKNOWN_SERVER_ERROR) whose
    ``detail`` names the stream and what mends it, and the other partitions are answered
    their offsets. ``log_offsets_many`` raised that error for every partition read with it
    (``Topics.describe`` failed so for the whole topic)."""
    _check_client(redis_client)
    _check_namespace(namespace)
    index: dict[tuple[str, int], int] = {}
    keys: list[str] = []
    for topic, partition in partitions:
        _check_topic(topic)
        _check_int("partition", partition, 0)
        if (topic, partition) not in index:
            index[topic, partition] = len(keys)
            keys.append(partition_key(namespace, topic, partition))
    answers = _offsets_of(redis_client, keys)
    return [answers[index[topic, partition]] for topic, partition in partitions]


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
