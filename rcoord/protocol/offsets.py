"""OffsetCommit and OffsetFetch: types, checks, encoding and decoding.

Commit errors (per partition; a group-level error is repeated for every partition, as Kafka
does): INVALID_GROUP_ID, GROUP_ID_NOT_FOUND (a generation given for a group that does not exist),
UNKNOWN_MEMBER_ID (unknown member, or a simple commit to a group that has members),
FENCED_INSTANCE_ID, ILLEGAL_GENERATION (a zombie of an older generation),
REBALANCE_IN_PROGRESS (CompletingRebalance), COORDINATOR_NOT_AVAILABLE,
OFFSET_METADATA_TOO_LARGE (that partition only; the others are committed).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import msgpack

from ..errors import Errors
from ._checks import require_int, require_str, text

__all__ = ["TopicPartition", "OffsetAndMetadata", "OffsetFetchResult", "encode_commit", "field_of"]


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
    if not isinstance(tp, tuple) or len(tp) != 2:
        raise TypeError("partitions must be TopicPartition(topic, partition) values")
    topic = require_str("topic", tp[0])
    partition = require_int("partition", tp[1])
    if not topic:
        raise ValueError("topic must not be empty")
    if partition < 0:
        raise ValueError(f"partition must be >= 0, got {partition}")
    return f"{partition}:{topic}"


def parse_field(raw: bytes) -> TopicPartition:
    p, _, topic = text(raw).partition(":")
    return TopicPartition(topic, int(p))


def encode_commit(offsets: Mapping[Any, Any]) -> tuple[list[TopicPartition], bytes]:
    if not isinstance(offsets, Mapping):
        raise TypeError("offsets must map TopicPartition -> OffsetAndMetadata or int")
    order: list[TopicPartition] = []
    entries = []
    for tp, value in offsets.items():
        f = field_of(tp)
        if isinstance(value, int) and not isinstance(value, bool):
            value = OffsetAndMetadata(value)
        if not isinstance(value, OffsetAndMetadata):
            raise TypeError(f"offset for {tp} must be an OffsetAndMetadata or an int")
        require_int("offset", value.offset)
        meta = require_str("metadata", value.metadata)
        epoch = -1 if value.leader_epoch is None else require_int("leader_epoch", value.leader_epoch)
        # Kafka limits String.length(), i.e. UTF-16 code units.
        utf16_len = len(meta.encode("utf-16-le", "surrogatepass")) // 2
        entries.append([f.encode(), value.offset, meta.encode(), epoch, utf16_len])
        order.append(TopicPartition(tp[0], tp[1]))
    return order, msgpack.packb(entries, use_bin_type=False)


def decode_record(blob: bytes) -> OffsetAndMetadata:
    rec = msgpack.unpackb(blob, raw=True)
    epoch = int(rec[b"le"])
    return OffsetAndMetadata(
        offset=int(rec[b"o"]),
        metadata=text(rec[b"m"]),
        leader_epoch=None if epoch < 0 else epoch,
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
    if partitions is None:
        return []
    return [field_of(tp) for tp in partitions]
