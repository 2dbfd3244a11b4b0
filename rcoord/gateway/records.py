"""Record batches (Kafka's message format v2) to and from rcoord records.

Decoding uses kio's reader (``kio.records.readers.read_batch``, which checks the CRC32C).
Encoding is done here (struct and zigzag varints, about 40 lines): kio's batch writer takes
timestamps as ``datetime`` and converts them back through a float, which can move a
millisecond, and rcoord timestamps are exact integers. Compressed batches are refused (UNSUPPORTED_COMPRESSION_TYPE):
kio does not decompress, and the Kafka clients tested here send uncompressed batches unless told
otherwise. Transactional and control batches are refused too (no transactions here).
"""

from __future__ import annotations

import io
import struct
from collections.abc import Sequence
from dataclasses import dataclass

import crc32c
from kio.records.readers import read_batch
from kio.records.schema import RecordHeader

from ..errors import Errors
from ..topics import ProducerRecord, Record
from .errors import CORRUPT_MESSAGE, INVALID_RECORD, INVALID_TIMESTAMP, UNSUPPORTED_COMPRESSION_TYPE
from .tags import encode_uvarint

__all__ = ["BATCH_HEADER_BYTES", "BatchError", "IncomingBatch", "decode_batches", "encode_batch",
           "encode_fetched", "fetched_sizes"]

_MAGIC_AT = 16  # base offset (8), batch length (4), partition leader epoch (4)
_ATTRIBUTES_AT = 21  # ... magic (1), crc (4)
_LAST_OFFSET_DELTA_AT = 23  # ... attributes (2)
_COUNT_AT = 57  # ... timestamps (16), producer id (8), epoch (2), base sequence (4)
_HEADER_BYTES = 61
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


def decode_batches(data: bytes, partition: int) -> list[IncomingBatch]:
    """The batches of one partition's ``records`` field of a ProduceRequest."""
    view = memoryview(data)
    out: list[IncomingBatch] = []
    pos = 0
    while pos < len(view):
        # Kafka's answers: ProduceRequest.validateRecords, then LogValidator.validateBatch
        # (INVALID_RECORD, per partition).
        if len(view) - pos > _MAGIC_AT and view[pos + _MAGIC_AT] != 2:
            raise BatchError(INVALID_RECORD, f"record batch magic {view[pos + _MAGIC_AT]}; "
                             "Produce takes only v2 batches (magic 2)")
        if len(view) - pos < _HEADER_BYTES:
            raise BatchError(CORRUPT_MESSAGE, "truncated record batch header")
        attributes = int.from_bytes(view[pos + _ATTRIBUTES_AT:pos + _ATTRIBUTES_AT + 2], "big")
        if attributes & _COMPRESSION_MASK:
            raise BatchError(UNSUPPORTED_COMPRESSION_TYPE,
                             "compressed batches are not accepted; produce uncompressed")
        if attributes & _CONTROL:
            raise BatchError(INVALID_RECORD, "clients are not allowed to write control records")
        if attributes & _TRANSACTIONAL:
            raise BatchError(Errors.INVALID_REQUEST, "transactions are not supported")
        _check_count(view, pos)
        try:
            batch, size = read_batch(view, pos)
        except Exception as exc:  # noqa: BLE001  (CRC mismatch, bad lengths, short buffer)
            raise BatchError(CORRUPT_MESSAGE, f"corrupt record batch: {exc}") from None
        if attributes & _LOG_APPEND_TIME:  # the broker stamps it (LogValidator.validateTimestamp)
            raise BatchError(INVALID_TIMESTAMP, "a producer may not set the batch's timestamp "
                             "type to LogAppendTime; send CreateTime batches")
        records = []
        for rec in batch.records:
            records.append(ProducerRecord(rec.value, rec.key, partition,
                                          _headers(rec.headers) if rec.headers else None))
        out.append(IncomingBatch(int(batch.producer_id), int(batch.producer_epoch),
                                 int(batch.base_sequence), records))
        pos += size
    return out


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


def _headers(headers: Sequence[RecordHeader]) -> list[tuple[str, bytes | None]]:
    """A record's headers as rcoord pairs: in order, repeated names kept, a null value kept as
    ``None`` (Kafka allows both). A null name is refused, as Kafka's broker refuses it
    (``DefaultRecord.readHeaders``: "Invalid negative header key size")."""
    out = []
    for h in headers:
        if h.key is None:
            raise BatchError(CORRUPT_MESSAGE, "a record header with a null key")
        out.append((h.key.decode("utf-8", "replace"), h.value))
    return out


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
