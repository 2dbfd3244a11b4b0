"""Offset positions and range planning for the data source, in plain Python.

A streaming query's offset (what Spark writes to ``offsets/N`` in its checkpoint and passes back
as ``start``/``end``) is a ``Position``: the next offset of every partition the query reads
after that batch. In group mode it also carries the generation and member id the batch was
planned under, so the commit made once the batch's sink has finished is fenced by exactly that
generation, and a plan that outlived its generation can be recognised.

``starts`` holds where partitions begin that did not continue from the previous position: a
partition that appeared (a topic grew, a pattern matched a new topic) or, in group mode, every
partition of a new generation (which starts at the group's committed offsets, not at whatever
the query read before). ``partitions(start, end)`` in Spark only gets the two positions, so the
end must say where such partitions begin.

``tokens`` holds, per topic, the create token of the topic the offsets belong to
(``TopicDescription.create_token``). A topic deleted and created again starts its offsets at 0
again; without the token, a position checkpointed in the old topic would be taken for one in
the new (see ``rcoord.spark.resolve.continuity_loss``). Positions checkpointed before tokens
existed have none and are taken as they are.

``planned_ms`` (group mode) is when the member planned the position, in ms of the Redis
server's clock (``TIME``, which a replay record's expiry runs on too; 0 when that read
failed: as long ago as can be, so a restart on it brings the batch again rather than skip
part of it): a query restarted on the end of a batch Spark counts as finished can tell whether
a record of a replay of that batch could have expired since (``StreamMember._resume``).
Positions checkpointed before it existed have none.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..protocol.offsets import TopicPartition

__all__ = ["OffsetRange", "Position", "limit_end", "ranges_between", "split_ranges"]

TP = TopicPartition


@dataclass(frozen=True)
class OffsetRange:
    """Records ``start`` (inclusive) to ``end`` (exclusive) of one partition."""

    topic: str
    partition: int
    start: int
    end: int

    @property
    def size(self) -> int:
        return self.end - self.start


def _nested(offsets: Mapping[TP, int]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for tp in sorted(offsets):
        out.setdefault(tp.topic, {})[str(tp.partition)] = int(offsets[tp])
    return out


def _flat(nested: Any, what: str) -> dict[TP, int]:
    if not isinstance(nested, dict):
        raise ValueError(f"{what} must map topics to {{partition: offset}}, got {nested!r}")  # noqa: TRY004
    out: dict[TP, int] = {}
    for topic, parts in nested.items():
        if not isinstance(parts, dict):
            raise ValueError(f"{what}: topic {topic!r} must map partitions to offsets")  # noqa: TRY004
        for p, off in parts.items():
            out[TP(str(topic), int(p))] = int(off)
    return out


@dataclass(frozen=True)
class Position:
    """A stream offset: next offset per partition, plus the group generation in group mode."""

    offsets: dict[TP, int]
    starts: dict[TP, int] = field(default_factory=dict)
    generation: int | None = None
    member: str | None = None
    tokens: dict[str, str] = field(default_factory=dict)
    planned_ms: int | None = None

    def to_json(self) -> dict[str, Any]:
        """The dict Spark checkpoints (JSON-encodable, keys are strings)."""
        out: dict[str, Any] = {"offsets": _nested(self.offsets)}
        if self.starts:
            out["starts"] = _nested(self.starts)
        if self.tokens:
            out["tokens"] = dict(sorted(self.tokens.items()))
        if self.generation is not None:
            out["generation"] = self.generation
            out["member"] = self.member or ""
        if self.planned_ms is not None:
            out["planned_ms"] = self.planned_ms
        return out

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Position:
        if not isinstance(raw, Mapping) or "offsets" not in raw:
            raise ValueError(f"not an rcoord stream offset: {raw!r}")
        gen = raw.get("generation")
        planned = raw.get("planned_ms")
        tokens = raw.get("tokens", {})
        if not isinstance(tokens, Mapping):
            raise ValueError(f"tokens must map topics to create tokens, got {tokens!r}")  # noqa: TRY004
        return cls(
            offsets=_flat(raw["offsets"], "offsets"),
            starts=_flat(raw.get("starts", {}), "starts"),
            generation=None if gen is None else int(gen),
            member=None if gen is None else str(raw.get("member", "")),
            tokens={str(t): str(v) for t, v in tokens.items()},
            planned_ms=None if planned is None else int(planned),
        )

    def same_plan(self, other: Position) -> bool:
        """True if ``other`` was planned by the same membership (or neither is in a group)."""
        return self.generation == other.generation and self.member == other.member

    def continues(self, previous: Position, tp: TP) -> bool:
        """True if ``tp`` goes on from ``previous`` rather than from ``starts``.

        A plan outside group mode (no generation) goes on from whatever position it was
        planned from, also one checkpointed in group mode: a query restarted without
        ``groupId`` continues from the checkpoint's offsets, as Spark's Kafka source's
        checkpoints (plain offsets) survive option changes. Before, every such plan failed."""
        same = self.generation is None or self.same_plan(previous)
        return same and tp in previous.offsets and tp not in self.starts


def ranges_between(start: Position, end: Position) -> list[OffsetRange]:
    """The records a batch from ``start`` to ``end`` reads, one range per partition of ``end``.

    Partitions only in ``start`` (lost in a rebalance, or of a deleted topic) are dropped;
    partitions that do not continue from ``start`` begin at ``end.starts``.
    """
    out: list[OffsetRange] = []
    for tp in sorted(end.offsets):
        hi = end.offsets[tp]
        if end.continues(start, tp):
            lo = start.offsets[tp]
        elif tp in end.starts:
            lo = end.starts[tp]
        else:
            raise ValueError(f"offset of {tp.topic}-{tp.partition} has no start: {end!r}")
        if hi > lo:
            out.append(OffsetRange(tp.topic, tp.partition, lo, hi))
    return out


def split_ranges(ranges: Iterable[OffsetRange], max_records: int) -> list[OffsetRange]:
    """Split every range into pieces of at most ``max_records`` (Spark tasks of bounded size)."""
    if max_records < 1:
        raise ValueError("max_records must be >= 1")
    out: list[OffsetRange] = []
    for r in ranges:
        lo = r.start
        while lo < r.end:
            hi = min(r.end, lo + max_records)
            out.append(OffsetRange(r.topic, r.partition, lo, hi))
            lo = hi
    return out


def limit_end(start: Mapping[TP, int], latest: Mapping[TP, int], limit: int | None) -> dict[TP, int]:
    """The end offsets of a batch that reads at most ``limit`` records in total.

    Spark's Kafka source shares ``maxOffsetsPerTrigger`` among partitions in proportion to how
    far behind each is, and gives every partition behind at least one record ("don't
    completely starve small topicpartitions", ``KafkaMicroBatchStream.rateLimit``): a share
    rounded down to none would leave a partition one record behind unread for as long as a busy
    one kept the others' shares (a reviewer's repro: 1 record behind 5,000 on another partition,
    limit 100, never read). Here each partition behind gets one record, and the rest of the
    limit is shared by what each has beyond it, by the largest-remainder method: the total is
    exactly ``min(limit, total lag)`` unless the limit is below the number of partitions behind
    (then one each, as Spark's rounding up), and no partition gets more than its lag. Ties go
    to the lower partition, so the plan is deterministic. ``start`` lacks nothing that
    ``latest`` has.
    """
    lags = {tp: max(0, latest[tp] - start[tp]) for tp in latest}
    total = sum(lags.values())
    if limit is None or total <= limit:
        return {tp: start[tp] + lags[tp] for tp in latest}
    behind = [tp for tp in sorted(lags) if lags[tp] > 0]
    shares = {tp: (1 if lags[tp] > 0 else 0) for tp in lags}
    rest, beyond = max(0, limit - len(behind)), total - len(behind)
    if rest == 0:  # (a limit below the partitions behind; beyond may be 0 then, every lag 1)
        return {tp: start[tp] + shares[tp] for tp in latest}
    remainders: list[tuple[int, TP]] = []
    for tp in behind:
        whole, rem = divmod(rest * (lags[tp] - 1), beyond)
        shares[tp] += whole
        remainders.append((-rem, tp))
    left = rest - sum(shares[tp] - 1 for tp in behind)
    for _, tp in sorted(remainders)[:left]:
        shares[tp] += 1
    return {tp: start[tp] + shares[tp] for tp in latest}
