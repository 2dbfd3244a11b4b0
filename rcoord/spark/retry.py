"""A write task attempt that follows another: rows are checked off against what is stored.

A streaming write task appends through an idempotent producer named by the query and task, at
the batch's epoch (``write.make_producer``). Sequence numbers alone dedupe a retried attempt
only if it sees the same rows in the same order, and after a shuffle (a groupBy, a join, a
repartition) Spark fetches shuffle blocks in any order: numbered by position, a retry's first
rows were taken for duplicates of other rows and never stored (loss), and the first attempt's
rows came again later and were stored twice.

So an attempt first asks (one pipelined HGET per topic) whether its producer id has state at
its epoch in any partition. Only when it does (an earlier attempt appended something: the rare
path) does it read back the records stored under that id and epoch (``topics.epoch_log``),
count their contents (topic, key, value, headers) and, as rows come, skip each row whose
content is still counted, appending the others numbered after the stored ones
(``Producer.resume_sequence``). Contents are matched across partitions: a keyless row placed
by the sticky partitioner may land elsewhere in another order; a row with an explicit
``partition`` matches only records of that partition. Identical rows are interchangeable,
so which of them is skipped does not matter. A keyless row claims no particular record: it
claims one of the content's records still unclaimed, and a row with an explicit partition one
of that partition's too (``_Pool``), so a keyless row met first cannot take the only record an
explicit-partition row of the same content needs (it did, and that row was stored twice).

Rows whose content differs between attempts (``rand()``, a timestamp taken in the task) are
not the same rows; they are out of reach of any deduplication and may be stored twice.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from ..topics import Producer, ProducerRecord, Record, RecordMetadata, partition_key
from ..topics._decode import decode_entries
from ..topics.epoch_log import epoch_appends, epoch_states

__all__ = ["AttemptConflict", "EarlierAttempts", "check_duplicates"]

log = logging.getLogger("rcoord.spark")

Content = tuple[str, Any, Any, tuple[tuple[str, Any], ...]]


class AttemptConflict(RuntimeError):
    """Another attempt of this write task appends under the same producer id and epoch at the
    same time (a speculative copy, or a zombie of a lost executor), in another row order: a
    record the script took for a duplicate is not this row. The attempt fails so Spark runs it
    again; the next attempt reads back everything stored and checks its rows off against it."""


def content_of(topic: str, rec: ProducerRecord) -> Content:
    headers = rec.headers
    pairs = tuple(headers.items()) if isinstance(headers, dict) else tuple(headers or ())
    return (topic, rec.key, rec.value, tuple((str(k), v) for k, v in pairs))


def stored_content(topic: str, rec: Record) -> Content:
    return (topic, rec.key, rec.value, tuple(rec.header_list))


class _Pool:
    """The stored records of one content, and the rows checked off against them.

    A row with an explicit partition needs a record of that partition; a keyless row any
    record. Rows come one at a time, so a keyless row does not pick its record: it lowers
    ``free`` only. A row naming partition p is skipped while p has a record no such row took
    and some record is still free. Then the explicit rows fit their partitions, the keyless
    ones fit what is left, and no row that could be matched is refused."""

    __slots__ = ("free", "in_part")

    def __init__(self) -> None:
        self.free = 0  # records no row has claimed yet
        self.in_part: dict[int, int] = {}  # partition -> records not claimed by its explicit rows

    def add(self, partition: int) -> None:
        self.free += 1
        self.in_part[partition] = self.in_part.get(partition, 0) + 1

    def take(self, partition: int | None) -> bool:
        if self.free == 0:
            return False
        if partition is not None:
            if not self.in_part.get(partition):
                return False
            self.in_part[partition] -= 1
        self.free -= 1
        return True


class EarlierAttempts:
    """What earlier attempts of this producer id and epoch stored, read per topic when the
    topic's first row comes (the normal path: one pipelined HGET per topic, nothing stored)."""

    def __init__(self, producer: Producer) -> None:
        self._producer = producer
        self._seen: set[str] = set()
        self._pools: dict[Content, _Pool] = {}
        self.stored = 0  # records the earlier attempts stored, in the topics seen

    def take(self, topic: str, rec: ProducerRecord) -> bool:
        """Whether ``rec`` is stored already (and now checked off): the caller skips it."""
        if topic not in self._seen:
            self._load(topic)
        if not self._pools:
            return False
        pool = self._pools.get(content_of(topic, rec))
        return pool is not None and pool.take(rec.partition)

    def _load(self, topic: str) -> None:
        self._seen.add(topic)
        p = self._producer
        pid = p.producer_id
        assert pid is not None
        states = epoch_states(p.redis_client, p.namespace, topic, pid, p.partition_count(topic))
        if not any(s.epoch == p.producer_epoch for s in states.values()):
            return  # the first attempt (or the epoch's appends expired): nothing to check off
        appended = epoch_appends(p.redis_client, p.namespace, topic, pid, p.producer_epoch,
                                 list(states.values()))
        for part, a in sorted(appended.items()):
            p.resume_sequence(topic, part, a.last_sequence + 1)
            for r in a.records:
                self._pools.setdefault(stored_content(topic, r), _Pool()).add(part)
            self.stored += len(a.records)
            if not a.complete:
                log.warning("%s: producer %s epoch %d: partition %d's log of what earlier "
                            "attempts appended is incomplete (retention, or an older writer); "
                            "rows it lacks are appended again and may be stored twice",
                            topic, pid, p.producer_epoch, part)
        log.info("%s: producer %s epoch %d takes over from an earlier attempt that stored %d "
                 "records", topic, pid, p.producer_epoch, self.stored)


def check_duplicates(producer: Producer, topic: str, recs: Sequence[ProducerRecord],
                     metas: Sequence[RecordMetadata]) -> None:
    """Raise ``AttemptConflict`` unless every record answered as a duplicate is this one.

    Nothing a task sends is a duplicate by sequence unless its own call was run twice (a
    redis-py retry after a lost reply: the record at the given offset is this one) or another
    attempt appended under the same id and epoch meanwhile, maybe a different row: then this
    row may not be stored, and the attempt must not report success. Costs nothing when no
    record came back as a duplicate (the normal case)."""
    dups = [(rec, m) for rec, m in zip(recs, metas) if m.duplicate]
    if not dups:
        return
    client, ns = producer.redis_client, producer.namespace
    pipe = client.pipeline(transaction=False)
    for _, m in dups:
        entry = f"0-{m.offset + 1}"
        pipe.xrange(partition_key(ns, topic, m.partition), entry, entry)
    for (rec, m), entries in zip(dups, pipe.execute()):
        got = decode_entries(entries) if m.offset >= 0 else []
        if not got or stored_content(topic, got[0]) != content_of(topic, rec):
            raise AttemptConflict(
                f"{topic} partition {m.partition}: producer {producer.producer_id} epoch "
                f"{producer.producer_epoch}: a record taken for a duplicate (offset "
                f"{m.offset}) is not this row; another attempt of this task appends "
                "concurrently in another order. Failing this attempt so Spark runs it again")
