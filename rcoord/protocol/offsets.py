"""OffsetCommit and OffsetFetch: types, checks, encoding and decoding.

Commit errors (per partition; a group-level error is repeated for every partition, as Kafka
does): GROUP_ID_NOT_FOUND (a generation given for a group that does not exist),
UNKNOWN_MEMBER_ID (unknown member, or a simple commit to a group that has members),
FENCED_INSTANCE_ID, ILLEGAL_GENERATION (a zombie of an older generation),
REBALANCE_IN_PROGRESS (CompletingRebalance), COORDINATOR_NOT_AVAILABLE,
OFFSET_METADATA_TOO_LARGE (that partition only; the others are committed).

The empty group id is an ordinary group for OffsetCommit and OffsetFetch: Kafka's
GroupCoordinatorService accepts it there "for backwards compatibility" (only a null id is
INVALID_GROUP_ID), as it does for DescribeGroups and DeleteGroups.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import msgpack

from ..errors import Errors, InvalidRequestError
from ._checks import (
    MAX_ITEMS_PER_CALL,
    MAX_REQUEST_BYTES,
    check_count,
    check_id,
    check_total,
    require_int32,
    require_int64,
    require_str,
    text,
    utf8,
)

__all__ = [
    "OffsetAndMetadata",
    "OffsetFetchResult",
    "TopicPartition",
    "encode_commit",
    "fetch_batches",
    "field_of",
    "metadata_length",
    "retention_arg",
]

MAX_RETENTION_MS = 1 << 52
"""Longest per-commit retention that is kept exact (see ``retention_arg``)."""


class TopicPartition(NamedTuple):
    topic: str
    partition: int


@dataclass(frozen=True)
class OffsetAndMetadata:
    """A committed position: the next offset to read, plus free-form metadata."""

    offset: int
    metadata: str = ""
    leader_epoch: int | None = None
    commit_timestamp_ms: int | None = field(default=None, compare=False)


@dataclass(frozen=True)
class OffsetFetchResult:
    error: Errors
    offsets: dict[TopicPartition, OffsetAndMetadata] = field(default_factory=dict)


def field_of(tp: Any) -> str:
    """The offsets hash field of a partition: ``<partition>:<topic>``."""
    if not isinstance(tp, tuple) or len(tp) != 2:
        raise TypeError("partitions must be TopicPartition(topic, partition) values")
    topic = check_id("topic", tp[0])
    partition = require_int32("partition", tp[1])
    if not topic:
        raise InvalidRequestError("topic must not be empty")
    if partition < 0:
        raise InvalidRequestError(f"partition must be >= 0, got {partition}")
    return f"{partition}:{topic}"


def parse_field(raw: bytes) -> TopicPartition:
    p, _, topic = text(raw).partition(":")
    return TopicPartition(topic, int(p))


def metadata_length(metadata: str) -> int:
    """Commit metadata's length as ``offset.metadata.max.bytes`` bounds it: Kafka compares
    ``String.length()``, UTF-16 code units, not bytes."""
    return len(metadata.encode("utf-16-le")) // 2


def encode_commit(offsets: Mapping[Any, Any], max_metadata: int | None = None
                  ) -> tuple[list[TopicPartition], bytes, bool]:
    """(partitions in request order, ARGV[7] of commit_offsets.lua, whether ``max_metadata``
    refused an entry).

    A commit is stored in one script call, so that it is atomic, as Kafka's is: every accepted
    partition or, on a group-level error, none. It is therefore refused, not split, above
    MAX_ITEMS_PER_CALL partitions or MAX_REQUEST_BYTES of topics and metadata.

    Metadata longer than ``max_metadata`` (the namespace's ``offset_metadata_max_bytes``, when
    known) is not sent: its entry is marked, and the script refuses that partition alone with
    OFFSET_METADATA_TOO_LARGE, as Kafka does. Counted in the request's size, one partition's
    17 MB of metadata refused the whole commit with INVALID_REQUEST.

    Offsets and leader epochs travel as decimal strings and are stored as such: Lua numbers are
    doubles, exact only up to 2**53, and Kafka's offsets are int64. No script computes with them.
    """
    if not isinstance(offsets, Mapping):
        raise TypeError("offsets must map TopicPartition -> OffsetAndMetadata or int")
    check_count("offsets", offsets)
    order: list[TopicPartition] = []
    entries = []
    total = 0
    any_refused = False
    for tp, value in offsets.items():
        f = field_of(tp).encode()
        if isinstance(value, int) and not isinstance(value, bool):
            value = OffsetAndMetadata(value)
        if not isinstance(value, OffsetAndMetadata):
            raise TypeError(f"offset for {tp} must be an OffsetAndMetadata or an int")
        offset = require_int64("offset", value.offset)
        meta = utf8("metadata", require_str("metadata", value.metadata))
        epoch = -1 if value.leader_epoch is None else require_int32("leader_epoch", value.leader_epoch)
        utf16_len = metadata_length(value.metadata)
        refused = max_metadata is not None and utf16_len > max_metadata
        any_refused = any_refused or refused
        total += len(f) + (0 if refused else len(meta))
        check_total("offsets (topics and metadata)", total, MAX_REQUEST_BYTES)
        entry = [f, str(offset).encode(), b"" if refused else meta, str(epoch).encode(), utf16_len]
        entries.append([*entry, 1] if refused else entry)
        order.append(TopicPartition(tp[0], tp[1]))
    return order, msgpack.packb(entries, use_bin_type=False), any_refused


def retention_arg(retention_ms: Any) -> str:
    """ARGV[6] of commit_offsets.lua (OffsetCommit v2-v4 retention).

    None or -1 (Kafka's DEFAULT_RETENTION_TIME) mean the group's retention: ''. Otherwise the
    offset expires that long after the commit. The script adds it to its clock, a Lua double, so
    values above MAX_RETENTION_MS (about 142,700 years) count as MAX_RETENTION_MS: the sum stays
    exact and the offset still never expires in practice.
    """
    if retention_ms is None:
        return ""
    value = require_int64("retention_ms", retention_ms)
    if value == -1:
        return ""
    if value < 0:
        raise InvalidRequestError(f"retention_ms must be >= 0 or -1 (the default), got {value}")
    return str(min(value, MAX_RETENTION_MS))


def decode_record(blob: bytes) -> OffsetAndMetadata:
    """A stored offset record; ``o`` and ``le`` are decimal strings (numbers in old records)."""
    rec = msgpack.unpackb(blob, raw=True)
    epoch = int(rec[b"le"])
    return OffsetAndMetadata(
        offset=int(rec[b"o"]),
        metadata=text(rec[b"m"]),
        leader_epoch=None if epoch == -1 else epoch,  # (Kafka keeps -2 and below as given)
        commit_timestamp_ms=int(rec[b"t"]),
    )


def decode_fetch(flat: list[Any]) -> dict[TopicPartition, OffsetAndMetadata]:
    out: dict[TopicPartition, OffsetAndMetadata] = {}
    for i in range(0, len(flat), 2):
        tp = parse_field(flat[i])
        blob = flat[i + 1]
        out[tp] = decode_record(blob) if blob else OffsetAndMetadata(-1)
    return out


def partitions_args(partitions: Iterable[Any] | None) -> list[str]:
    """The fields of a partition list that one script call handles whole (OffsetDelete).

    OffsetDelete decides once for the group and deletes in the same call, as Kafka's single
    write does, so a list above MAX_ITEMS_PER_CALL is refused, not split.
    """
    if partitions is None:
        return []
    items = list(partitions)
    check_count("partitions", items)
    return [field_of(tp) for tp in items]


def fetch_batches(partitions: Iterable[Any]) -> list[list[str]]:
    """The fields of an OffsetFetch, in script calls of at most MAX_ITEMS_PER_CALL each.

    Kafka accepts any number of partitions, and a fetch only reads, so a long list is split
    rather than refused. Each call reads its partitions at one instant; a commit that lands
    between two calls may show in the later one only.
    """
    fields = [field_of(tp) for tp in partitions]
    return [fields[i : i + MAX_ITEMS_PER_CALL] for i in range(0, len(fields), MAX_ITEMS_PER_CALL)]
