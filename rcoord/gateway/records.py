"""Record batches (Kafka's message format v2) to and from rcoord records.

Both directions are done here (struct, kio's varint readers and zigzag varints). kio's batch
reader and writer take timestamps as ``datetime``: the writer converts them back through a
float, which can move a millisecond (rcoord timestamps are exact integers), and the reader
refused a record whose timestamp is past year 9999 (``_records``). Compressed batches are
refused (UNSUPPORTED_COMPRESSION_TYPE): kio does not decompress, and the Kafka clients tested
here send uncompressed batches unless told otherwise. Control batches are refused too, and a
Produce with a transactional batch is refused whole (no transactions here;
``first_batch_transactional``).
"""

from __future__ import annotations

import io
import struct
from collections.abc import Sequence
from dataclasses import dataclass

import crc32c
from kio.serial.readers import read_signed_varint, read_signed_varlong

from ..errors import Errors
from ..topics import ProducerRecord, Record
from .errors import CORRUPT_MESSAGE, INVALID_RECORD, INVALID_TIMESTAMP, UNSUPPORTED_COMPRESSION_TYPE
from .tags import encode_uvarint

__all__ = ["BATCH_HEADER_BYTES", "BatchError", "IncomingBatch", "check_request_records",
           "decode_batches", "encode_batch", "encode_fetched", "fetched_sizes",
           "first_batch_transactional"]

_LENGTH_AT = 8  # base offset (8)
_MAGIC_AT = 16  # ... batch length (4), partition leader epoch (4)
_CRC_AT = 17  # ... magic (1)
_ATTRIBUTES_AT = 21  # ... crc (4): what the CRC covers starts here
_LAST_OFFSET_DELTA_AT = 23  # ... attributes (2)
_PRODUCER_AT = 43  # ... last offset delta (4), timestamps (16)
_COUNT_AT = 57  # ... producer id (8), epoch (2), base sequence (4)
_HEADER_BYTES = 61
_PRODUCER = struct.Struct(">qhi")  # producer id, epoch, base sequence
_COMPRESSION_MASK = 0x07
_LOG_APPEND_TIME = 0x08
_TRANSACTIONAL = 0x10
_CONTROL = 0x20


class BatchError(Exception):
    """The records of a partition cannot be appended; ``code`` is Kafka's answer."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class IncomingBatch:
    """One produced batch: its producer identity (for idempotence) and its records."""

    producer_id: int
    producer_epoch: int
    base_sequence: int
    records: list[ProducerRecord]


_ZSTD = 4
_ZSTD_SINCE = 7
"""Produce v7 (KIP-110) is the first that may carry a zstd batch."""


def check_request_records(data: bytes, version: int) -> None:
    """Kafka's ``ProduceRequest.validateRecords``, the checks of one partition's ``records``
    that Kafka makes while it reads the request, before it appends (and so before the ``acks``
    check, the CRC, the base offset and the rest of the batch): at least one whole batch, magic
    2, no zstd before Produce v7 (UNSUPPORTED_COMPRESSION_TYPE), and one batch only; the others
    are INVALID_RECORD. Raises BatchError."""
    view = memoryview(data)
    end = _whole_batch_end(view, 0)
    if end is None and not len(view):
        raise BatchError(INVALID_RECORD, "a Produce request must carry at least one record "
                         "batch per partition")
    if end is None:
        first = (f" (the first declares {_batch_length(view, 0) + _BATCH_LENGTH_FROM} bytes, "
                 f"magic {view[_MAGIC_AT]})" if len(view) > _MAGIC_AT else "")
        raise BatchError(INVALID_RECORD, "a Produce request must carry at least one whole "
                         f"record batch per partition: the {len(view)} bytes sent hold "
                         f"none{first}")
    if view[_MAGIC_AT] != 2:
        raise BatchError(INVALID_RECORD, f"record batch magic {view[_MAGIC_AT]}; "
                         "Produce takes only v2 batches (magic 2)")
    if version < _ZSTD_SINCE and view[_ATTRIBUTES_AT + 1] & _COMPRESSION_MASK == _ZSTD:
        # Read from the attributes before the CRC is, as Kafka: its answer to a zstd batch on
        # v3-6 with a second fault (two batches, a base offset, a bad CRC) is this one.
        raise BatchError(UNSUPPORTED_COMPRESSION_TYPE, f"a zstd batch in Produce v{version} "
                         f"(Kafka takes zstd from v{_ZSTD_SINCE}); this gateway takes no "
                         "compression: produce uncompressed")
    if _whole_batch_end(view, end) is not None:
        # Kafka's validateRecords takes one v2 batch per partition and request, and counts
        # them before it reads a batch further. Counted after, a first batch with a bad CRC
        # or compressed was answered CORRUPT_MESSAGE (which producers retry) or
        # UNSUPPORTED_COMPRESSION_TYPE instead.
        raise BatchError(INVALID_RECORD, "more than one record batch for one partition in "
                         "one Produce request; Kafka takes one")


def decode_batches(data: bytes, partition: int, version: int,
                   max_batch_bytes: int | None = None) -> list[IncomingBatch]:
    """The whole batch of one partition's ``records`` field of a ProduceRequest (a second one
    is INVALID_RECORD). A batch of more than ``max_batch_bytes`` (None: any size) is
    MESSAGE_TOO_LARGE.

    Bytes after the last whole batch are dropped, as Kafka does: its reader stops at a batch
    whose bytes are not all there (``ByteBufferLogInputStream.nextBatch``) and the append trims
    what it did not read (``UnifiedLog.trimInvalidBytes``). Records with no whole batch are
    INVALID_RECORD (``ProduceRequest.validateRecords``). Both were CORRUPT_MESSAGE, which
    producers take for a transmission error and resend until their delivery timeout."""
    # Kafka's answers: ProduceRequest.validateRecords (``check_request_records``: one whole
    # v2 batch), then LogValidator.validateBatch (INVALID_RECORD, per partition).
    check_request_records(data, version)
    view = memoryview(data)
    out: list[IncomingBatch] = []
    pos = 0
    while (end := _whole_batch_end(view, pos)) is not None:
        base_offset = int.from_bytes(view[pos:pos + _LENGTH_AT], "big", signed=True)
        if base_offset != 0:
            # Kafka's UnifiedLog.analyzeAndValidateRecords, for a client's v2 batch, before its
            # size and CRC: offsets are the broker's to give. Such a batch was appended.
            raise BatchError(INVALID_RECORD, f"the record batch's base offset is {base_offset}; "
                             "a producer's batch must have base offset 0")
        if max_batch_bytes is not None and end - pos > max_batch_bytes:
            # (analyzeAndValidateRecords again: after the base offset, before the CRC)
            raise BatchError(Errors.MESSAGE_TOO_LARGE, f"the record batch is {end - pos} "
                             "bytes, more than the gateway's message.max.bytes "
                             f"({max_batch_bytes}, --message-max-bytes)")
        if end - pos < _HEADER_BYTES:  # (DefaultRecordBatch.ensureValid)
            raise BatchError(CORRUPT_MESSAGE, f"corrupt record batch: its {end - pos} bytes "
                             f"are fewer than a v2 batch header's {_HEADER_BYTES}")
        # The CRC before any field it covers is believed, as Kafka (analyzeAndValidateRecords,
        # then LogValidator): bytes damaged in flight are CORRUPT_MESSAGE, which producers
        # resend. Checked after the attributes and count, damage there was answered
        # INVALID_RECORD or UNSUPPORTED_COMPRESSION_TYPE, which fail the send for good.
        _check_crc(view, pos, end)
        attributes = int.from_bytes(view[pos + _ATTRIBUTES_AT:pos + _ATTRIBUTES_AT + 2], "big")
        if attributes & _COMPRESSION_MASK:
            raise BatchError(UNSUPPORTED_COMPRESSION_TYPE,
                             "compressed batches are not accepted; produce uncompressed")
        if attributes & _CONTROL:
            raise BatchError(INVALID_RECORD, "clients are not allowed to write control records")
        _check_count(view, pos)
        records = _records(view[:end], pos, partition)
        if attributes & _LOG_APPEND_TIME:  # the broker stamps it (LogValidator.validateTimestamp)
            raise BatchError(INVALID_TIMESTAMP, "a producer may not set the batch's timestamp "
                             "type to LogAppendTime; send CreateTime batches")
        producer_id, epoch, sequence = _PRODUCER.unpack_from(view, pos + _PRODUCER_AT)
        out.append(IncomingBatch(producer_id, epoch, sequence, records))
        pos = end
    return out


def first_batch_transactional(data: bytes | None) -> bool:
    """Whether a partition's records start with a whole transactional v2 batch: what Kafka's
    ``RequestUtils.hasTransactionalRecords`` looks at (the first batch of each partition) before
    it reads anything else of a Produce. A later batch is not looked at: a partition takes one
    (``api_records._append``).

    Raises BatchError (CORRUPT_MESSAGE) when the first batch's length or magic is corrupt: Kafka
    reads it there with ``ByteBufferLogInputStream.nextBatchSize``, whose CorruptRecordException
    fails the whole Produce, every partition CORRUPT_MESSAGE and nothing appended
    (``ProduceRequest.getErrorResponse``). It was taken for "not transactional", and only that
    partition failed while the others of the request were appended."""
    view = memoryview(data or b"")
    end = _whole_batch_end(view, 0)
    return (end is not None and view[_MAGIC_AT] == 2
            and bool(view[_ATTRIBUTES_AT + 1] & _TRANSACTIONAL))


_BATCH_LENGTH_FROM = _LENGTH_AT + 4
"""Where a batch's length counts from: its base offset and length fields are not counted."""
_LEAST_BATCH_LENGTH = 14
"""The least batch length Kafka reads on (``LegacyRecord.RECORD_OVERHEAD_V0``)."""


def _batch_length(view: memoryview, pos: int) -> int:
    return int.from_bytes(view[pos + _LENGTH_AT:pos + _BATCH_LENGTH_FROM], "big", signed=True)


def _whole_batch_end(view: memoryview, pos: int) -> int | None:
    """Where the batch at ``pos`` ends, or None when ``view`` does not hold all of it (nor a
    batch at all), as Kafka's ``ByteBufferLogInputStream.nextBatchSize`` reads it: a length
    below 14 or a magic other than 0, 1 or 2 is CORRUPT_MESSAGE, once enough bytes came to
    read it."""
    if len(view) - pos < _BATCH_LENGTH_FROM:
        return None
    length = _batch_length(view, pos)
    if length < _LEAST_BATCH_LENGTH:
        raise BatchError(CORRUPT_MESSAGE, f"corrupt record batch: its length {length} is "
                         f"below the least a batch has ({_LEAST_BATCH_LENGTH})")
    if len(view) - pos <= _MAGIC_AT:
        return None
    magic = int.from_bytes(view[pos + _MAGIC_AT:pos + _MAGIC_AT + 1], "big", signed=True)
    if not 0 <= magic <= 2:
        raise BatchError(CORRUPT_MESSAGE, f"corrupt record batch: magic {magic}")
    end = pos + _BATCH_LENGTH_FROM + length
    return end if end <= len(view) else None


def _check_crc(view: memoryview, pos: int, end: int) -> None:
    """Kafka's ``DefaultRecordBatch.ensureValid`` for the whole batch at ``pos``: its CRC32C
    (CORRUPT_MESSAGE)."""
    stored = int.from_bytes(view[pos + _CRC_AT:pos + _ATTRIBUTES_AT], "big")
    if crc32c.crc32c(view[pos + _ATTRIBUTES_AT:end]) != stored:
        raise BatchError(CORRUPT_MESSAGE, "corrupt record batch: CRC32C mismatch")


def _records(view: memoryview, pos: int, partition: int) -> list[ProducerRecord]:
    """The records of the batch at ``pos``, which ends where ``view`` does (its length and CRC
    checked), as Kafka's ``DefaultRecord.readFrom`` reads them: each must fill its declared
    size, and the batch's declared count must fill the batch.

    A batch whose CRC holds but whose records do not parse is INVALID_RECORD, Kafka's answer
    (its InvalidRecordException; CORRUPT_MESSAGE is for a bad CRC or batch length). It was
    CORRUPT_MESSAGE, which clients take for a transmission error and retry: Java's producer
    resent the same malformed batch until its delivery timeout, sarama up to its retries.

    A record's timestamp and offset deltas are read past, not kept: the broker sets both
    (LogAppendTime; offsets on append). kio's ``read_batch``, used before, made each timestamp
    a ``datetime``, so a record stamped past year 9999 (Kafka takes any int64) was refused
    CORRUPT_MESSAGE, which Kafka clients retry until their delivery timeout; it also compared
    the batch's max timestamp (ms) with each record's in seconds."""
    count = int.from_bytes(view[pos + _COUNT_AT:pos + _HEADER_BYTES], "big", signed=True)
    at = pos + _HEADER_BYTES
    out = []
    try:
        for _ in range(count):
            size, n = read_signed_varint(view, at)
            at += n
            start = at
            at += 1  # attributes (unused in v2)
            at += read_signed_varlong(view, at)[1]  # timestamp delta
            at += read_signed_varint(view, at)[1]  # offset delta
            key, at = _nullable_bytes(view, at)
            value, at = _nullable_bytes(view, at)
            header_count, n = read_signed_varint(view, at)
            at += n
            if header_count < 0:
                raise ValueError(f"a record with {header_count} headers")
            headers = []
            for _ in range(header_count):
                name, at = _nullable_bytes(view, at)
                if name is None:  # Kafka's readHeaders: "Invalid negative header key size"
                    raise BatchError(INVALID_RECORD, "a record header with a null key")
                header_value, at = _nullable_bytes(view, at)
                headers.append((name.decode("utf-8", "replace"), header_value))
            if at != start + size:
                raise ValueError(f"a record of {at - start} bytes declares {size}")
            out.append(ProducerRecord(value, key, partition, headers or None))
    except BatchError:
        raise
    except Exception as exc:  # noqa: BLE001  (kio's BufferUnderflow, a malformed varint)
        raise BatchError(INVALID_RECORD, f"invalid record structure: {exc}") from None
    if at != len(view):
        raise BatchError(INVALID_RECORD, f"invalid record batch: {len(view) - at} bytes "
                         f"after its {count} records")
    return out


def _nullable_bytes(view: memoryview, at: int) -> tuple[bytes | None, int]:
    """A record's key, value, header name or header value at ``at``: its bytes (None for a
    negative length, as Kafka reads it), and where the next field starts."""
    size, n = read_signed_varint(view, at)
    at += n
    if size < 0:
        return None, at
    if at + size > len(view):
        raise ValueError(f"a field of {size} bytes past the end of its batch")
    return bytes(view[at:at + size]), at + size


def _check_count(view: memoryview, pos: int) -> None:
    """Kafka's ``LogValidator.validateBatch`` for a client's v2 batch: its offset range
    (``lastOffsetDelta`` + 1) and its record count must be positive and agree. An idempotent
    producer's last sequence is counted from that range, so a batch whose two disagree would
    leave the producer and the log at different sequences."""
    def int32(at: int) -> int:
        return int.from_bytes(view[pos + at:pos + at + 4], "big", signed=True)

    from_offsets, count = int32(_LAST_OFFSET_DELTA_AT) + 1, int32(_COUNT_AT)
    if from_offsets <= 0:
        raise BatchError(INVALID_RECORD, f"the batch's offset range has {from_offsets} records "
                         "(lastOffsetDelta + 1 must be positive)")
    if count <= 0:
        raise BatchError(INVALID_RECORD, f"the batch reports {count} records")
    if from_offsets != count:
        raise BatchError(INVALID_RECORD, f"the batch's offset range has {from_offsets} records "
                         f"(lastOffsetDelta + 1) but it reports {count}")


def _varint(buf: io.BytesIO, value: int) -> None:
    """Kafka's signed varint/varlong: zigzag, then 7 bits a byte, low bits first."""
    buf.write(encode_uvarint((value << 1) ^ (value >> 63)))


def _bytes_field(buf: io.BytesIO, value: bytes | None) -> None:
    if value is None:
        _varint(buf, -1)
    else:
        _varint(buf, len(value))
        buf.write(value)


_BATCH_TAIL = struct.Struct(">hiqqqhii")  # attributes .. record count
_BATCH_HEAD = struct.Struct(">qiibI")  # base offset, length, leader epoch, magic, crc


BATCH_HEADER_BYTES = _BATCH_HEAD.size + _BATCH_TAIL.size  # 61
_RECORD_FRAMING = 27  # at most: its length, attributes, deltas, key and value lengths, headers
_HEADER_FRAMING = 10  # at most: a header's name and value lengths


def fetched_sizes(records: Sequence[Record]) -> list[int]:
    """At most what each record adds to ``encode_fetched(records)``: its own bytes, and a batch
    header for the first record of each run of equal timestamps.

    The Fetch byte limits are counted with these, so a response stays within them. Counting
    only the records (24 bytes of framing each, before 2026-11-29) made a response of records
    appended a millisecond apart, a batch each, two or three times ``max_bytes``: librdkafka
    drops a response over its ``receive.message.max.bytes`` (``fetch.max.bytes`` + 512) and
    sends the same Fetch again, for ever (a reviewer's repro: 0 of 400 records in 10 s)."""
    out: list[int] = []
    previous: int | None = None
    for rec in records:
        size = (len(rec.key or b"") + len(rec.value or b"") + _RECORD_FRAMING
                + sum(len(name.encode()) + len(value or b"") + _HEADER_FRAMING
                      for name, value in rec.header_list))
        if rec.timestamp_ms != previous:
            size += BATCH_HEADER_BYTES
            previous = rec.timestamp_ms
        out.append(size)
    return out


def encode_fetched(records: Sequence[Record]) -> bytes:
    """Fetched records as v2 batches, one per run of records with the same timestamp.

    A LogAppendTime batch gives every record one timestamp, the batch's max timestamp (clients
    ignore the per-record deltas then), so one batch over records of several appends would
    show them all with the newest one's time. rcoord stamps each append with the Redis clock,
    and an append's records share it: a batch per run of equal timestamps is what Kafka sends
    for a LogAppendTime topic (one batch per appended batch), and each record keeps its own.
    """
    out: list[bytes] = []
    lo = 0
    for hi in range(1, len(records) + 1):
        if hi == len(records) or records[hi].timestamp_ms != records[lo].timestamp_ms:
            out.append(encode_batch(records[lo:hi]))
            lo = hi
    return b"".join(out)


def encode_batch(records: Sequence[Record], producer_id: int = -1, producer_epoch: int = -1,
                 base_sequence: int = -1) -> bytes:
    """One v2 batch holding ``records`` (consecutive or not; offsets are deltas from the first),
    flagged LogAppendTime: rcoord stamps records with the Redis clock on append. Clients read
    every record's timestamp as the batch's newest, so a fetch sends one batch per timestamp
    (``encode_fetched``). The producer fields are -1 in fetched batches. A producer's batch is
    refused with this flag (``decode_batches``); the tests' producer batches clear it."""
    if not records:
        return b""
    base_offset, base_ts = records[0].offset, records[0].timestamp_ms
    body = io.BytesIO()
    body.write(_BATCH_TAIL.pack(
        _LOG_APPEND_TIME, records[-1].offset - base_offset, base_ts,
        max(r.timestamp_ms for r in records),
        producer_id, producer_epoch, base_sequence,
        len(records)))
    for r in records:
        rec = io.BytesIO()
        rec.write(b"\x00")  # record attributes
        _varint(rec, r.timestamp_ms - base_ts)
        _varint(rec, r.offset - base_offset)
        _bytes_field(rec, r.key)
        _bytes_field(rec, r.value)
        _varint(rec, len(r.header_list))
        for name, value in r.header_list:  # every header, in order (``headers`` drops repeats)
            _bytes_field(rec, name.encode())
            _bytes_field(rec, value)
        raw = rec.getvalue()
        _varint(body, len(raw))
        body.write(raw)
    post = body.getvalue()
    # The length counts from the leader epoch on: leader epoch (4), magic (1), crc (4).
    return _BATCH_HEAD.pack(base_offset, len(post) + 9, 0, 2, crc32c.crc32c(post)) + post
