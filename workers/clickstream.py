"""A streaming pipeline on Spark: per-key click counts over event-time windows, as Parquet.

    python -m workers.clickstream --group clicks --topic events --out DIR \
        [--redis-url redis://127.0.0.1:6379/0] [--master local[2]]

Each instance is a Spark streaming query in *group mode*: a member of the consumer group
``--group``. Start several (on one machine or many, in one Spark application or many) and they
split the topic's partitions; stop one (Ctrl-C / SIGTERM) and the others take its partitions
over from the offsets it committed; kill one and they take them over after its session
timeout. No query restarts when partitions move. A micro-batch reads at most
``--max-offsets-per-trigger`` records (default 100,000; -1: no limit): its aggregated rows are
collected on the driver.

Records: the key is what is counted (a user, a page); the value is JSON with an event time
``{"ts": <epoch milliseconds>}`` (a number, taken to the millisecond; the record's timestamp when
missing or not a number). Windows are tumbling, ``--window`` long. A record whose window has
closed is late and not counted, as in Spark's windowed aggregations: its window ends at or behind
the watermark Spark runs its micro-batch with (the newest event time of the query's batches
before it minus ``--watermark``; a restarted query starts over from 0 unless ``build_query`` was
given the checkpoint it ran on).

Output: every micro-batch writes, per topic partition it read, one Parquet file
``DIR/counts/topic=T/partition=P/start-S.gen-G.parquet`` with columns ``window_start``,
``window_end``, ``key``, ``count`` for the records from offset S on, committed under generation
G of the group (``rcoord.spark.batch_generation``: the generation that planned the batch, or,
for a batch Spark replays after a restart, the one that replayed it). The file name holds the
offset the batch's planned range of that partition begins at (``_Sink.planned_starts``; the
smallest offset read for another source); the hidden index, ``DIR/counts/.index/topic=T/
partition=P``, holds where its range ends (``_Sink.planned_ends``) and where each generation
began writing the partition. A partition's new owner begins at the group's committed offset C
(or further on, past a retention trim, failOnDataLoss=false), and processes again every record
from there that its old owner had processed but not committed (a crash, a zombie whose batch
outlived the rebalance timeout, or one whose commit failed and that went on planning); since
no older generation's commit is taken once a newer one began, an older generation's file that
ends past where a newer generation began the partition holds records nobody committed, and is
*superseded*: it does not count, whatever the order of the writes, while every file that ends
at or before it was committed. The writer of a file deletes the files it supersedes, and its
own if a newer generation began before its end (``_settle``, which looks in the index around
its own range, not by listing the folder: a write's cost does not grow with the folder's
history; a zombie's file outside them is deleted when a newer generation's write reads its
offsets again, or, if none does (a batch of over 1,024 records begun before a trim), by a run's
first write in the folder or by ``settle``). So a zombie cannot overwrite its successor's file,
nor count records twice, and a restarted query's replay supersedes the file
of a member that took the partition meanwhile and stopped before committing. The counts of a
(window, key) are the sum over the files that count; ``read_counts(DIR)`` does that, and so
does ``spark.read.parquet(DIR + "/counts").groupBy("window_start", "key").sum("count")`` once
no batch is being written and ``settle(DIR)`` deleted the superseded files after that
(between a zombie's write and its settling, both files are there, and a writer killed in between
is settled by the partition's next write, ``_UNSETTLED``; a batch begun before a trim, above,
stays until a run's first write). The rule takes a group's generations to grow for ever: a group
deleted and created again (its generations start over), or a topic created again (its offsets
start over), needs a new DIR. A topic's is checked: the topic folder's index records the
create token of the topic its files are of, and a batch of the topic created again fails
(``_same_topic``; a topic made before tokens is not checked). So is a group's: the output's
index records the group and its incarnation token (``group_incarnation``, read from Redis at
each write), and a write of another group, or of the group made again, fails (``_same_group``;
not checked without a Redis URL; an output written before this record is refused if a
generation there is above the group's now, else taken for the group's).
(Offsets an operator resets backwards are read again by a newer generation, whose files
supersede the older ones they overlap: each record counts once.)
"""

from __future__ import annotations

import argparse
import bisect
import hashlib
import json
import logging
import os
import re
import signal
import sys
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

log = logging.getLogger("clickstream")

__all__ = ["MAX_OFFSETS_PER_TRIGGER", "build_query", "main", "read_counts", "settle",
           "stop_gracefully", "window_counts"]


def _ms(text: str) -> int:
    """'10s', '500ms', '2m', '1h', or a number of milliseconds; a ``ValueError`` naming those
    forms for anything else (Spark's "10 seconds" too), or the longest taken for one longer
    than the span of event times (years 1 to 9999, ``_MIN_MS`` to ``_MAX_MS``): a 400-digit
    number was inf to float(), and int() raised an OverflowError, which argparse let through
    as a traceback where any other bad value is a usage error."""
    text = text.strip().lower()
    for suffix, factor in (("ms", 1), ("s", 1000), ("m", 60_000), ("h", 3_600_000), ("", 1)):
        number = text[: len(text) - len(suffix)].strip()
        # (ASCII digits: isdigit() took "\u0663" as 3, and "\u00b2" for float() to refuse)
        if text.endswith(suffix) and re.fullmatch(r"[0-9]+(?:\.[0-9]*)?|\.[0-9]+", number):
            ms = float(number) * factor
            if ms > _MAX_MS - _MIN_MS:
                raise ValueError(f"{text!r} is too long a duration: at most "
                                 f"{_MAX_MS - _MIN_MS} ms, the span of event times Spark's "
                                 "timestamps hold (years 1 to 9999)")
            return int(ms)
    raise ValueError(f"{text!r} is no duration: write a number with ms, s, m or h after it "
                     "('500ms', '10s', '1m'), or a number of milliseconds")


def _duration(least: int) -> Any:
    """An argparse ``type``: a duration (``_ms``) of at least ``least`` ms, checked before
    Spark starts (a bad one used to fail after it, behind a traceback)."""
    def parse(text: str) -> int:
        try:
            ms = _ms(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        if ms < least:
            raise argparse.ArgumentTypeError(f"{text!r}: must be at least {least} ms")
        return ms
    return parse


def _timeout_ms(text: str) -> int:
    """An argparse ``type``: a group timeout, a positive number of milliseconds within Kafka's
    INT, as the source takes it (``rcoord.spark.options``), but checked before Spark starts:
    the source refused '10s' or '0' only once Spark had started, behind a traceback."""
    from rcoord.ops.common import integer
    from rcoord.protocol._checks import INT32_MAX

    ms = integer(text)  # (digits and a sign, as every rcoord command reads a number)
    if not 1 <= ms <= INT32_MAX:
        raise argparse.ArgumentTypeError(
            f"{text!r}: a number of milliseconds from 1 to {INT32_MAX} (Kafka's INT), no unit")
    return ms


MAX_OFFSETS_PER_TRIGGER = 100_000
"""The default cap on a micro-batch's records (the source's ``maxOffsetsPerTrigger``). Each
batch collects its aggregated rows, up to one per record, on the driver, and must end within
the group's rebalance timeout; without a cap (Spark's Kafka source has none by default) the
first batch over a large backlog read all of it at once."""


def _limit(text: str) -> int | None:
    """An argparse ``type``: a positive number of records, or -1 for no limit (None)."""
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n == -1:
        return None
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: a number of records >= 1, or -1 (no limit)")
    return n


def window_counts(events: Any, window_ms: int) -> dict[tuple[int, str], int]:
    """The expected output in plain Python: (window start ms, key) -> count, for
    ``events`` as (key, event time ms) pairs (what the tests and the bench compare with)."""
    out: dict[tuple[int, str], int] = defaultdict(int)
    for key, ts in events:
        out[(ts - ts % window_ms, key)] += 1
    return dict(out)


_FILE = re.compile(r"start-(\d+)\.gen-(-?\d+)\.parquet")


def _counting(folder: Path) -> list[Path]:
    """A partition folder's files that count (``_superseded``), by its files and its whole
    index (whether or not a write settled them yet)."""
    files: dict[tuple[int, int], Path] = {}
    for path in folder.glob("start-*.gen-*.parquet"):
        m = _FILE.fullmatch(path.name)
        if m is not None:
            files[(int(m[1]), int(m[2]))] = path
    gens = _index_of(folder) / _GENS
    entries = [_entry(name) for bucket in (os.listdir(gens) if gens.is_dir() else [])
               for name in os.listdir(gens / bucket)]
    firsts = _firsts(folder)
    for start, gen in [*files, *entries]:
        if start >= 0:
            firsts[gen] = min(start, firsts.get(gen, start))
    gone = _superseded(files, firsts, folder)
    return [path for key, path in files.items() if key not in gone]


_READS = 10
"""How many times ``read_counts`` reads a partition folder whose files a running pipeline's
writes keep deleting between its listing and its reads."""


def read_counts(out_dir: str | os.PathLike[str]) -> dict[tuple[int, str], int]:
    """The pipeline's output summed per (window start ms, key); reads Parquet with pyarrow.

    Only the files that count (``_counting``): not those a newer generation supersedes, even
    before their settling deleted them. A file that a write of the running pipeline deleted
    after the listing (it superseded it) makes its partition folder be listed and read again;
    it failed the read with ``FileNotFoundError``."""
    totals: dict[tuple[int, str], int] = defaultdict(int)
    for folder in sorted(Path(out_dir, "counts").glob("topic=*/partition=*")):
        for attempt in range(_READS):
            try:
                counts = _read_folder(folder)
                break
            except FileNotFoundError as exc:
                if attempt == _READS - 1:
                    exc.add_note(f"{folder}: files were deleted while they were read, "
                                 f"{_READS} times (a write superseded them); read again")
                    raise
        for key, count in counts.items():
            totals[key] += count
    return dict(totals)


def settle(out_dir: str | os.PathLike[str]) -> None:
    """Delete every file of the output that does not count, so that a plain
    ``spark.read.parquet(DIR + "/counts")`` sums what ``read_counts`` does: what a run's
    first write does to its partition folder (``_index``), for every partition folder.

    A write settles only the index buckets around its own range, so an older generation's
    file that began over 1,024 offsets before a trim its successor began after stayed on disk
    (``read_counts`` leaves it out) until a later run's first write in the folder: a plain
    read of the output of a stopped pipeline counted the records its successor read again
    twice. Safe while instances run (a run's first write does the same), but its cost grows
    with the output's history (a listing of each folder and its index)."""
    for folder in sorted(Path(out_dir, "counts").glob("topic=*/partition=*")):
        if folder.is_dir():
            _index(folder)


def _read_folder(folder: Path) -> dict[tuple[int, str], int]:
    """``read_counts`` of one partition folder."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    totals: dict[tuple[int, str], int] = defaultdict(int)
    for path in sorted(_counting(folder)):
        table = pq.read_table(path)
        # The window starts as integer ms, read exactly: through a datetime's float
        # timestamp() some came back 1 ms off (about 1 in 170 of the times after 2038).
        starts = table["window_start"].cast(pa.int64()).to_pylist()
        for start, key, count in zip(starts, table["key"].to_pylist(),
                                     table["count"].to_pylist(), strict=True):
            totals[(int(start), key)] += int(count)
    return totals


class _Sink:
    """The ``foreachBatch`` function: one aggregation, one file per (topic partition, start)."""

    def __init__(self, out_dir: str, window_ms: int, checkpoint: str, *, group: str = "",
                 namespace: str = "rcoord", url: str | None = None) -> None:
        self.out_dir = out_dir
        self.window_ms = window_ms
        self.checkpoint = checkpoint
        self.group, self.namespace, self.url = group, namespace, url
        self.batches = 0
        self.records = 0
        self.late = 0
        self._indexed: set[Path] = set()
        self._tokens: set[tuple[str, str]] = set()  # (topic, create token) checked
        self._firsts: dict[tuple[Path, int], int] = {}  # (folder, generation): first marked
        self._run: str | None = None  # (``run``)

    def run(self, spark: Any = None) -> str:
        """Which query this sink writes for: its checkpoint, and the id Spark gave the query
        there (``<checkpoint>/metadata``, written as the query starts), read once. A run's
        replay of its own batch is told from another run's read of the same offsets by it
        (``_start_of_run``), and a restart's temporary files from another writer's
        (``_run_tag``). The path alone named the same run for a checkpoint deleted and made
        again there, or a local checkpoint of the same name on another machine: the first
        such run's file was replaced by the second's batch (2,500 of 3,000 offsets lost), and
        a live writer's temporary file removed under it. The path alone where no id is
        written (a sink used without Spark)."""
        if self._run is None:
            from rcoord.spark.replays import _read_log

            text = _read_log(self.checkpoint, "metadata", spark)
            try:
                query = json.loads(text.splitlines()[0])["id"] if text else None
            except (ValueError, KeyError, TypeError, IndexError):
                query = None
            self._run = self.checkpoint if not query else f"{self.checkpoint} (query {query})"
        return self._run

    def watermark_ms(self, batch_id: int, spark: Any = None) -> int:
        """The watermark Spark runs micro-batch ``batch_id`` with: the ``batchWatermarkMs``
        it wrote in the checkpoint's offset log (``offsets/<batch id>``, its second line)
        before running the batch, so also the one a restarted query restored; 0 if none is
        logged. (``lastProgress`` is the batch before's progress, and the watermark it reports
        is the one that batch ran with: one batch stale, so a record far behind the watermark
        right after it jumped was counted.) Read as ``batch_generation`` reads the log."""
        from rcoord.spark.replays import _read_log

        text = _read_log(self.checkpoint, f"offsets/{batch_id}", spark)
        lines = (text or "").splitlines()
        try:
            return int(json.loads(lines[1])["batchWatermarkMs"])
        except (IndexError, KeyError, TypeError, ValueError):
            return 0

    def generation(self, batch_id: int, spark: Any = None) -> int:
        """The group generation the batch is committed under (``rcoord.spark.batch_generation``):
        the one it was planned in, from its planned end in the checkpoint's offset log, or,
        for a batch replayed after a restart, the replaying member's (only this run's first
        batch can be one, so only it asks Redis). -1 where the offset log names none (a source
        other than group mode's). A checkpoint on another file system
        (``build_query(checkpoint="hdfs://...")``) is read through ``spark``, the batch's
        session."""
        from rcoord.spark import batch_generation

        return batch_generation(self.checkpoint, batch_id, group=self.group,
                                namespace=self.namespace, url=self.url,
                                first=self.batches == 0, spark=spark)

    def planned_ends(self, batch_id: int, spark: Any = None) -> dict[tuple[str, int], int]:
        """Where the batch's planned range of each (topic, partition) ends (the offset after
        it), from the checkpoint's offset log; empty for a source other than group mode's."""
        from rcoord.spark.replays import checkpoint_position

        end = checkpoint_position(self.checkpoint, batch_id, spark=spark)
        return {} if end is None else {(tp.topic, tp.partition): o
                                       for tp, o in end.offsets.items()}

    def planned_starts(self, batch_id: int, spark: Any = None) -> dict[tuple[str, int], int]:
        """Where the batch's planned range of each (topic, partition) begins: what Spark's
        rcoord source read it from (``partitions(start, end)``), from the batch's end and the
        one before in the checkpoint's offset log (``checkpoint_position``); a partition that
        does not go on from the batch before begins where the end's ``starts`` says. Empty
        for a source other than group mode's (its files are named by their smallest offset).

        Not the smallest offset read: records trimmed by retention between a zombie's read of
        the batch and its successor's (``failOnDataLoss=false``) made the two name different
        starts, and the records after the trim were counted in both files."""
        from rcoord.spark.replays import checkpoint_position

        end = checkpoint_position(self.checkpoint, batch_id, spark=spark)
        if end is None:
            return {}
        before = checkpoint_position(self.checkpoint, batch_id - 1, spark=spark) \
            if batch_id > 0 else None
        out: dict[tuple[str, int], int] = {}
        for tp in end.offsets:
            if before is not None and end.continues(before, tp):
                out[(tp.topic, tp.partition)] = before.offsets[tp]
            elif tp in end.starts:
                out[(tp.topic, tp.partition)] = end.starts[tp]
        return out

    def created_tokens(self, batch_id: int, spark: Any = None) -> dict[str, str]:
        """The create token of each topic the batch read (``Position.tokens``: the topic its
        offsets belong to), from the checkpoint's offset log; empty for a source other than
        group mode's, and a topic made before tokens has none."""
        from rcoord.spark.replays import checkpoint_position

        end = checkpoint_position(self.checkpoint, batch_id, spark=spark)
        return {} if end is None else dict(end.tokens)

    def __call__(self, batch: Any, batch_id: int) -> None:
        from pyspark.sql import functions as F

        wm = self.watermark_ms(batch_id, batch.sparkSession)
        window_start = F.col("event_ms") - F.pmod(F.col("event_ms"), F.lit(self.window_ms))
        # as Spark's windowed aggregation drops a row: once its window's end is at or behind
        # the watermark (a record behind the watermark in a window still open counts)
        late = window_start + F.lit(self.window_ms) <= F.lit(wm)
        rows = (
            batch.groupBy("topic", "partition", window_start.alias("ws"), "k")
            .agg(
                F.sum(F.when(late, 0).otherwise(1)).alias("n"),
                F.count(F.lit(1)).alias("all"),
                F.min("offset").alias("lo"),
                F.max("offset").alias("hi"),
            )
            .collect()
        )
        self.run(batch.sparkSession)
        gen = self.generation(batch_id, batch.sparkSession)
        starts = self.planned_starts(batch_id, batch.sparkSession)
        ends = self.planned_ends(batch_id, batch.sparkSession)
        tokens = self.created_tokens(batch_id, batch.sparkSession)
        by_part: dict[tuple[str, int], list[Any]] = defaultdict(list)
        for row in rows:
            by_part[(row["topic"], row["partition"])].append(row)
            self.records += row["all"]
            self.late += row["all"] - row["n"]
        for (topic, partition), group in by_part.items():
            first = min(r["lo"] for r in group)
            last = max(r["hi"] for r in group) + 1
            self._write(topic, partition, min(first, starts.get((topic, partition), first)),
                        group, gen, end=max(last, ends.get((topic, partition), last)),
                        token=tokens.get(topic, ""))
        self.batches += 1

    def _write(self, topic: str, partition: int, start: int, rows: list[Any],
               generation: int, *, end: int | None = None, token: str = "") -> None:
        """Write the file of ``rows``, the counts of offsets ``start`` to ``end`` (exclusive;
        None: not known, taken for ``start + 1``) of ``generation``, and settle the files
        around it (``_settle``). ``token``: the topic's create token, checked against the
        folder's (``_same_topic``); "" where none is known."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        kept = [r for r in rows if r["n"] > 0]
        ms = pa.timestamp("ms", tz="UTC")  # (from integer ms: exact, no float in between)
        table = pa.table({
            "window_start": pa.array([int(r["ws"]) for r in kept], ms),
            "window_end": pa.array([int(r["ws"]) + self.window_ms for r in kept], ms),
            "key": pa.array([r["k"] for r in kept], pa.string()),
            "count": pa.array([r["n"] for r in kept], pa.int64()),
        })
        folder = Path(self.out_dir, "counts", f"topic={topic}", f"partition={partition}")
        if token and (topic, token) not in self._tokens:  # once per topic and run
            _same_topic(folder, topic, token)
            self._tokens.add((topic, token))
        self._check_group(generation)
        folder.mkdir(parents=True, exist_ok=True)
        if folder not in self._indexed:  # once per folder and run: files from before the index
            _index(folder, _run_tag(self.run()))
            self._indexed.add(folder)
        if generation < 0:
            start = _start_of_run(folder, start, end, self.run())
        attempt = f"{_run_tag(self.run())}-{uuid.uuid4().hex}"
        tmp = folder / f".tmp-{attempt}"
        unsettled = _index_of(folder) / _UNSETTLED / f"{start}.{generation}.{attempt}"
        try:
            pq.write_table(table, tmp)
            # before the rename, for _settle; a run without a group names its checkpoint
            _mark(folder, start, generation, end,
                  self.run() if generation < 0 else "")
            if start < self._firsts.get((folder, generation), start + 1):
                _mark_first(folder, start, generation)
                self._firsts[(folder, generation)] = start
            unsettled.parent.mkdir(parents=True, exist_ok=True)
            unsettled.touch()
            # atomic: a retry of the batch (same range, same generation) replaces its first
            # attempt
            try:
                os.replace(tmp, _data(folder, start, generation))
            except FileNotFoundError as exc:
                raise RuntimeError(
                    f"{tmp} was gone before its rename: a write of another member took it for "
                    f"a crashed writer's ({_STALE_S} s or more after it was written) and "
                    "removed it, or the output folder was removed; this batch is not written "
                    "(the query fails, and reads it again when restarted)") from exc
        except BaseException:
            # A write that fails before its rename (a full disk in write_table) left its
            # temporary file, a whole batch's Parquet, in the folder for good, and one per
            # retry; its index entry would then be settled by every later write.
            tmp.unlink(missing_ok=True)
            unsettled.unlink(missing_ok=True)
            raise
        _settle(folder, start, end)
        _settle_unsettled(folder, unsettled.name)
        unsettled.unlink(missing_ok=True)

    def _check_group(self, generation: int) -> None:
        """Refuse a write of another group, or of another incarnation of this one, into the
        output (``_same_group``): asked of Redis at each write in group mode (one read, beside
        a file's write). A group made again while the run went on may hand out any
        generation, the run's last one too: until 2026-11-30 it was asked again only for a
        generation below the run's highest, and the group made again, back at that
        generation, wrote into the old output, its records counted twice. Not checked
        without a group or a Redis URL (``batch_generation`` wants one), nor while the group
        record is not there."""
        if generation < 0 or not self.group:
            return
        url = self.url or os.environ.get("RCOORD_REDIS_URL", "")
        incarnation = _group_incarnation(url, self.namespace, self.group) if url else None
        if incarnation is not None:
            _same_group(self.out_dir, self.group, *incarnation)


_TOKEN = "create_token"
"""The create token of the topic a topic folder's files are of (``Topics.create_token``):
``DIR/counts/.index/topic=T/create_token``, made by the first write that knows it."""


def _same_topic(folder: Path, topic: str, token: str) -> None:
    """Refuse a write of the topic created with ``token`` into the partition folder ``folder``
    whose topic folder holds files of the topic as created by another call. A topic deleted and
    created again starts its offsets over, and its files were told from the old topic's by
    offset and generation only: the old topic's superseded the new one's, or the other way
    round (50 records counted of 350). The first write that knows a token records it, by a
    link (which fails where one is there), so that of two first writes one records and the
    other compares."""
    recorded = _index_of(folder).parent / _TOKEN
    found = _record_once(recorded, token)
    if found != token:
        raise RuntimeError(
            f"{folder.parent}: its files are of topic {topic!r} as created "
            f"with token {found}, and this batch read the topic created again since (token "
            f"{token}), whose offsets start over: files of both in one output would supersede "
            "each other and lose records; give the new topic's pipeline a new output folder "
            f"(or move {folder.parent} and {recorded.parent} away)")


def _record_once(path: Path, text: str) -> str:
    """What ``path`` holds, written ``text`` first if nothing was there: by a link, which fails
    where a file is, so that of two first writers one records and the other reads its text."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".tmp-{uuid.uuid4().hex}")
    tmp.write_text(text)
    try:
        os.link(tmp, path)
    except FileExistsError:
        pass
    finally:
        tmp.unlink()
    return path.read_text()


_GROUP = "group"
"""The group, and its incarnation token, whose files the output holds:
``DIR/counts/.index/group``, ``{"group": ..., "created": ...}`` (the key named when the token
was the creation's millisecond, which a group an older rcoord made still has), made by the
first write of a run in group mode that read them (``_same_group``)."""


def _group_incarnation(url: str, namespace: str, group: str) -> tuple[str, int] | None:
    """The incarnation token of ``group`` (``rcoord.coordinator.group_incarnation``: what tells
    it from the group made again under its id after a deletion) and its generation now; None
    if the group or the namespace's settings are not there. Redis is asked here, not the
    checkpoint's offset log: the source records the generation a batch was planned in, not the
    incarnation. Until 2026-11-30 the token was the record's ``created``, a millisecond: the
    group deleted and made again within it was taken for the old one."""
    from rcoord.coordinator import group_incarnation
    from rcoord.spark.clients import leased

    with leased(url) as client:
        return group_incarnation(client, namespace, group)


def _same_group(out_dir: str, group: str, created: str, generation: int) -> None:
    """Refuse a write of ``group`` of incarnation ``created`` (at ``generation`` now) into an
    output whose files are of another group, or of this one as created before (deleted since,
    or removed by offset retention, and made again). Generations start over at 1 in a group
    made again, and any group's are compared alike: a file of the new one was deleted as
    superseded where a higher-numbered generation of the old one began before its end
    (records lost). The first write that knows its group records it (``_record_once``); in an
    output written before the record was kept, only if no generation there is above the
    group's now (one a group made again has not reached)."""
    mine = json.dumps({"group": group, "created": created})
    recorded = Path(out_dir, "counts", ".index", _GROUP)
    if not recorded.exists():
        top = max((gen for folder in Path(out_dir, "counts").glob("topic=*/partition=*")
                   for gen in _firsts(folder)), default=-1)
        if top > generation:
            raise RuntimeError(
                f"{out_dir}: its files were written by generation {top}, and group {group!r} "
                f"(incarnation {created}) is at generation {generation}: the group "
                "was made again since (its generations start over), or the files are of "
                "another group; files of both in one output would supersede each other and "
                f"lose records; give this pipeline a new output folder (--out), or move "
                f"{out_dir} away")
    found = _record_once(recorded, mine)
    if found == mine:
        return
    try:
        theirs = json.loads(found)
        if theirs["group"] == group and _older_token_of(str(theirs["created"]), created):
            return
        was = f"group {theirs['group']!r} of incarnation {theirs['created']}"
    except (ValueError, KeyError, TypeError):
        was = f"what {recorded} names ({found!r})"
    raise RuntimeError(
        f"{out_dir}: its files are of {was}, and this run is of group {group!r} of incarnation "
        f"{created}: generations start over in a group made again (and differ between "
        "groups), so files of both in one output would supersede each other and lose records; "
        f"give this pipeline a new output folder (--out), or move {out_dir} away")


def _older_token_of(recorded: str, token: str) -> bool:
    """Whether ``recorded``, an output's record made by a worker older than the incarnation
    token (the group's ``created``, a millisecond), names the incarnation ``token`` stands for
    (``created``, then Redis TIME's microseconds): a worker upgraded after its output's first
    write refused its own output before. Such a record cannot tell a group made again within
    its millisecond, as it could not when it was written."""
    return "." not in recorded and token.partition(".")[0] == recorded


def _index_of(folder: Path) -> Path:
    """A partition folder's index: ``DIR/counts/.index/topic=T/partition=P``, beside the data
    folders rather than in them (a partition folder holds its data files only). Hidden from
    Spark's and pyarrow's readers of ``DIR/counts`` by its dot."""
    return folder.parent.parent / ".index" / folder.parent.name / folder.name


_GENS = "gens"
"""A partition's index of the generations each start offset was written under:
``gens/<start // 1024>/<start>.<generation>``, a file made before the data file's rename and
never removed, holding the offset the file's range ends at (the one after it; empty where
that is not known: an entry of a file written before, taken to end at ``start + 1``). A write
lists only the buckets of its own range and the one before it (at most 1,024 starts each,
one per batch of 1,024 records or more), so its cost does not grow with the folder, which
gains a file per micro-batch for ever (globbing the whole folder on every write took 192 ms
at 100,000 files); a bucket, not a directory per start, which would take a directory block
(4 KB) a batch.
"""
_FIRSTS = "firsts"
"""Where each generation began writing the partition: ``firsts/<generation>.<start>``, made
(with ``_GENS``'s entry, before the rename) by a sink's first write of a generation in the
partition, and by any write of it that begins lower; the smallest start of a generation
counts. One entry a generation, so a write's one listing of it grows with the partition's
rebalances, not with its batches."""
_BUCKET = 1024


def _bucket(folder: Path, start: int) -> Path:
    return _index_of(folder) / _GENS / str(start // _BUCKET)


_UNSETTLED = "unsettled"
"""A partition's writes that may be between their rename and their ``_settle`` (in its index):
``unsettled/<start>.<generation>.<attempt>``, made before the rename (after ``.tmp-<attempt>``
is written) and removed after the settling. A writer killed in between (a zombie SIGKILLed
right after its rename) left its older generation's file beside its successor's for good, and
a plain ``spark.read.parquet`` counted those records twice: every write settles the starts
listed there too, and removes an entry once its attempt's temporary file is gone (renamed),
or, after ``_STALE_S``, removes that file itself (the writer died before its rename: its entry,
and a whole batch's Parquet in ``.tmp-<attempt>``, stayed for good, settled again by every
write)."""

_STALE_S = 3600
"""How old (by its modification time) a write's temporary file must be before another write
takes its writer for dead and removes it (``_abandon``): a live writer renames it right after
writing it. One that was only paused that long finds it gone and fails its batch (rather than
rename a file nobody would settle)."""


def _abandon(tmp: Path) -> bool:
    """Whether the write whose temporary file is ``tmp`` is over: renamed (``tmp`` is gone),
    or abandoned (``tmp`` is ``_STALE_S`` old: it is removed now, so a rename cannot follow).
    Removing it decides a race with its rename: whichever comes first wins."""
    try:
        if time.time() - tmp.stat().st_mtime < _STALE_S:
            return False
        tmp.unlink()
        log.warning("removed %s, written over %d s ago and never renamed (its writer died)",
                    tmp, _STALE_S)
    except FileNotFoundError:
        pass
    return True


def _data(folder: Path, start: int, generation: int) -> Path:
    return folder / f"start-{start}.gen-{generation}.parquet"


def _mark(folder: Path, start: int, generation: int, end: int | None = None,
          run: str = "") -> None:
    """Index the file of ``start`` and ``generation`` ending at ``end`` (``_GENS``; None: not
    known, an entry already made keeps its end), before its rename. ``run``, the checkpoint of
    a run without a group, goes on a second line: only it tells that run's replay of a batch
    from another run's read of the same offsets (``_start_of_run``)."""
    bucket = _bucket(folder, start)
    bucket.mkdir(parents=True, exist_ok=True)
    entry = bucket / f"{start}.{generation}"
    if end is None:
        entry.touch()
    else:
        entry.write_text(f"{end}\n{run}" if run else str(end))


def _read_entry(entry: Path, start: int) -> tuple[int, str]:
    """The end and the run (``_mark``; "" where none is recorded) of the ``_GENS`` entry of
    ``start``; an entry with no end, or gone, is taken to end at ``start + 1``."""
    try:
        lines = entry.read_text().splitlines()
    except FileNotFoundError:
        lines = []
    end = lines[0].strip() if lines else ""
    return int(end) if end.isdigit() else start + 1, lines[1] if len(lines) > 1 else ""


def _mark_first(folder: Path, start: int, generation: int) -> None:
    """Note that ``generation`` wrote the partition from ``start`` (``_FIRSTS``)."""
    firsts = _index_of(folder) / _FIRSTS
    firsts.mkdir(parents=True, exist_ok=True)
    (firsts / f"{generation}.{start}").touch()


def _entry(name: str) -> tuple[int, int]:
    """(start, generation) of a ``_GENS`` entry's name; (-1, 0) for another name."""
    start, _, gen = name.partition(".")
    if not start.isdigit() or not gen.lstrip("-").isdigit():
        return -1, 0
    return int(start), int(gen)


def _firsts(folder: Path) -> dict[int, int]:
    """``_FIRSTS``: generation -> the smallest start it wrote the partition from."""
    try:
        names = os.listdir(_index_of(folder) / _FIRSTS)
    except FileNotFoundError:
        return {}
    out: dict[int, int] = {}
    for name in names:
        gen, _, start = name.rpartition(".")
        if start.isdigit() and gen.lstrip("-").isdigit():
            out[int(gen)] = min(int(start), out.get(int(gen), int(start)))
    return out


def _superseded(keys: Iterable[tuple[int, int]], firsts: dict[int, int],
                folder: Path) -> set[tuple[int, int]]:
    """Of the files ``keys`` ((start, generation)), those that do not count.

    A generation G' of the group begins a partition at the offset committed when it began (or
    further on, where retention trimmed the log meanwhile, failOnDataLoss=false), and no older
    generation's commit is taken after that (fencing). So an older generation's file whose
    range ends past where G' began (``firsts``) holds records nobody committed that G' (or a
    newer one) reads again; every file of the older generations that ends at or before it was
    committed (offsets committed never go back). A file is superseded when a newer generation
    began before its end: one of the same start (a replay), but also a zombie's later
    uncommitted batches (its commit failed and it went on planning), and one that began before
    the trim its successor began after. Only a generation's highest start below that can end
    past it (a generation's ranges do not overlap), so only that file's end is read from
    its ``_GENS`` entry; where none is known, its start + 1."""
    gens = sorted(firsts)
    least: list[int] = []  # least[i]: the smallest first of gens[i:]
    for gen in reversed(gens):
        least.append(min(firsts[gen], least[-1]) if least else firsts[gen])
    least.reverse()

    def newer(gen: int) -> int | None:
        i = bisect.bisect_right(gens, gen)
        return least[i] if i < len(least) else None

    out: set[tuple[int, int]] = set()
    below: dict[int, int] = {}
    for start, gen in keys:
        first = newer(gen)
        if first is None:
            continue
        if first <= start:
            out.add((start, gen))
        elif start > below.get(gen, -1):
            below[gen] = start
    for gen, start in below.items():
        first = newer(gen)
        end, _ = _read_entry(_bucket(folder, start) / f"{start}.{gen}", start)
        if first is not None and first < end:
            out.add((start, gen))
    return out


def _run_tag(run: str) -> str:
    """What a write's temporary file is named by before its attempt (``.tmp-<tag>-<attempt>``):
    its query (``_Sink.run``), so that its restart knows the files of its own dead run."""
    return hashlib.sha256(run.encode()).hexdigest()[:16]


def _index(folder: Path, run: str = "") -> None:
    """Index the folder's files that have no ``_GENS`` entry (written before there was an
    index) and the generations with no ``_FIRSTS`` entry, and settle the whole folder: a
    sink's first write in a folder does it, once, so that a file written by an earlier
    version and superseded by a replay is settled too.

    The entries are read a bucket at a time (one listing each), not looked up one per file:
    that took a ``stat`` per file of the folder's history, 1.7 s at 100,000 files (0.2 s so),
    on every restart, in the first batch and per partition, which must end within the group's
    rebalance timeout. An entry made meanwhile is made again, which is harmless.

    A writer killed while writing its temporary file has no ``_UNSETTLED`` entry yet: the
    folder's one listing here removes such a file once it is ``_STALE_S`` old (``_abandon``),
    and at once one of the query ``run`` (``_Sink.run``: the checkpoint and Spark's id of the
    query there), which is its restart: Spark runs a query once at a time, so that file's
    writer is dead. Before, the file (a
    whole batch's Parquet) stayed until a restart over an hour later."""
    gens = _index_of(folder) / _GENS
    try:
        buckets = os.listdir(gens)
    except FileNotFoundError:
        buckets = []
    indexed = {_entry(name) for bucket in buckets for name in os.listdir(gens / bucket)}
    found: set[tuple[int, int]] = set()
    for name in os.listdir(folder):
        if run and name.startswith(f".tmp-{run}-"):
            (folder / name).unlink(missing_ok=True)
            log.warning("removed %s, a write of this query's run before its restart", name)
        elif name.startswith(".tmp-"):
            _abandon(folder / name)
        m = _FILE.fullmatch(name)
        if m is not None:
            found.add((int(m[1]), int(m[2])))
    for start, gen in found - indexed:
        _mark(folder, start, gen)
    firsts = _firsts(folder)
    least: dict[int, int] = {}
    for start, gen in found | indexed:
        if start >= 0:
            least[gen] = min(start, least.get(gen, start))
    for gen, start in least.items():
        if start < firsts.get(gen, start + 1):
            firsts[gen] = start
            _mark_first(folder, start, gen)
    for start, gen in _superseded(found, firsts, folder):
        _data(folder, start, gen).unlink(missing_ok=True)


def _settle(folder: Path, start: int, end: int | None = None) -> None:
    """Delete the files that do not count (``_superseded``) of the starts indexed in the
    buckets of offsets ``start`` to ``end`` (exclusive; None: ``start + 1``) and the bucket
    before: the file just written at ``start``, if a newer generation began the partition
    before its end (a zombie's write after its successor's), and the older generations'
    files its range supersedes (a zombie's, whoever wrote last). Each writer indexes its file
    and its generation's first start (``_mark``, ``_mark_first``) before its rename and
    settles after it, so of two writers, the later to settle sees both files. Looks up only
    those buckets and ``_FIRSTS``, never the whole folder: an older generation's file further
    ahead is deleted by the write of a newer generation that reads its offsets again, and one
    that began a bucket or more before them (a batch of over 1,024 records that a trim cut)
    by a run's first write in the folder (``_index``); ``read_counts`` leaves them out
    before that."""
    index = _index_of(folder) / _GENS
    last = max(start, start + 1 if end is None else end) - 1
    keys: list[tuple[int, int]] = []
    for bucket in range(max(0, start // _BUCKET - 1), last // _BUCKET + 1):
        try:
            names = os.listdir(index / str(bucket))
        except FileNotFoundError:
            continue
        keys.extend(key for key in map(_entry, names) if key[0] >= 0)
    firsts = _firsts(folder)
    for s, gen in keys:  # (an entry made without its _FIRSTS entry, by hand or by a crash)
        firsts[gen] = min(s, firsts.get(gen, s))
    for s, gen in _superseded(keys, firsts, folder):
        _data(folder, s, gen).unlink(missing_ok=True)


def _start_of_run(folder: Path, start: int, end: int | None, run: str) -> int:
    """Where a write of generation -1 (a run without a group, ``build_query(source=...)``,
    the query ``run``: ``_Sink.run``) of offsets ``start`` to ``end`` goes: at ``start``, or at the start of
    the file of the same run its range overlaps, which it replaces. One run's batches never
    overlap, so that is its restart replaying a batch, which began later where retention
    trimmed its first records meanwhile: written at its own start, beside the first attempt,
    both counted the records after the trim. A file of another run (another checkpoint: the
    default is a new one per run; or a checkpoint made again at the same path, another query
    id) that it overlaps makes it fail, as nothing supersedes a
    generation -1 file: both would count the records read again (``read_counts`` too).

    A run's files do not overlap each other, so of those that begin before ``start`` only the
    one that begins last can reach into its range: the buckets are looked in from its range's
    down to the first that has one, not only those ``_settle`` looks in (a batch of over 1,024
    records, which a second run's reading its end again went past unseen)."""
    gens = _index_of(folder) / _GENS
    stop = start + 1 if end is None else max(end, start + 1)
    try:
        buckets = sorted((int(b) for b in os.listdir(gens) if b.isdigit()), reverse=True)
    except FileNotFoundError:
        return start
    own: list[int] = []
    for bucket in buckets:
        if bucket > (stop - 1) // _BUCKET:
            continue
        below = False
        for s, gen in map(_entry, os.listdir(gens / str(bucket))):
            if gen != -1 or s < 0 or s >= stop:
                continue
            other, other_run = _read_entry(gens / str(bucket) / f"{s}.{gen}", s)
            below = below or s < start
            if s < start and other <= start:
                continue
            if (other_run and other_run == run) or (s == start and not other_run):
                own.append(s)  # (an entry from before runs were recorded: a restart's replay)
                continue
            by = (f"a run on checkpoint {other_run}" if other_run else
                  "a run before runs were recorded, which may be this one")
            raise RuntimeError(
                f"{folder}: offsets {start} to {stop - 1}, read by a run without a group on "
                f"checkpoint {run}, overlap those of {_data(folder, s, gen).name} ({s} to "
                f"{other - 1}), written by {by}: both would count, and nothing tells which is "
                "right; give each run without a group its own output folder, or restart a "
                "run on its own checkpoint")
        if below and bucket <= start // _BUCKET:
            break
    if len(own) > 1:
        raise RuntimeError(
            f"{folder}: offsets {start} to {stop - 1}, read by a run without a group on "
            f"checkpoint {run}, overlap {len(own)} of its files (starts "
            f"{', '.join(map(str, sorted(own)))}), where a replay reads one batch again; "
            "give each run without a group its own output folder")
    return own[0] if own else start


def _settle_unsettled(folder: Path, own: str) -> None:
    """Settle the starts of the other writes ``_UNSETTLED`` lists. An entry goes once its
    attempt is over (``_abandon``: renamed, or its writer died before renaming), as found
    before the settling (so the settling saw its file). One in flight stays, and is settled
    again by every write of the folder until it is over."""
    pending = _index_of(folder) / _UNSETTLED
    for name in os.listdir(pending):
        start, _, attempt = name.split(".") if name.count(".") == 2 else ("", "", "")
        if name == own or not start.isdigit():
            continue
        over = _abandon(folder / f".tmp-{attempt}")
        _settle(folder, int(start))
        if over:
            (pending / name).unlink(missing_ok=True)


# The event times a window's bounds can have: years 1 to 9999, what Spark's timestamps and a
# Python datetime hold.
_MIN_MS, _MAX_MS = -62_135_596_800_000, 253_402_300_799_999


def _event_ms(window_ms: int) -> Any:
    """A record's event time in ms: its value's JSON ``ts`` (a number, taken to the
    millisecond), else its timestamp. A ``ts`` that is no number, or one no window of
    ``window_ms`` around it can be written for, is the record's timestamp too: Spark 4 casts
    with ANSI on, so a plain cast failed the query on ``{"ts": 1.7e12}``, on a float (Python's
    ``time.time() * 1000``) or on a word, and failed it again after every restart, on the same
    uncommitted record."""
    from pyspark.sql import functions as F

    raw = F.get_json_object(F.col("value").cast("string"), "$.ts")
    ms = F.coalesce(raw.try_cast("long"), raw.try_cast("double").try_cast("long"))
    fits = ms.between(_MIN_MS + window_ms, _MAX_MS - window_ms)
    return F.coalesce(F.when(fits, ms), F.unix_millis(F.col("timestamp")))


def build_query(
    spark: Any,
    *,
    topics: str,
    group: str,
    out: str,
    url: str | None = None,
    namespace: str = "rcoord",
    window: str = "10s",
    watermark: str = "1m",
    trigger: str = "500ms",
    checkpoint: str | None = None,
    options: dict[str, str] | None = None,
    source: Any = None,
    max_offsets_per_trigger: int | None = MAX_OFFSETS_PER_TRIGGER,
) -> Any:
    """Start one instance of the pipeline in ``spark``; returns the ``StreamingQuery``.

    ``max_offsets_per_trigger`` caps a micro-batch (``MAX_OFFSETS_PER_TRIGGER``; None: no
    limit); a ``maxOffsetsPerTrigger`` in ``options`` takes its place.

    ``source`` replaces the rcoord group-mode stream with any streaming DataFrame of the same
    columns (the benchmark runs the pipeline over Spark's Parquet file source that way). Its
    files are of generation -1, which nothing supersedes: a restart on ``checkpoint`` replaces
    the file of the batch it replays, but a run on another checkpoint (the default: a new one
    per run), or on one made again at the same path (another query id), that reads offsets
    again which a file of ``out`` holds fails its batch (``_start_of_run``); give such a run
    its own ``out``.
    """
    from pyspark.sql import functions as F

    from rcoord.spark import register

    register(spark)
    window_ms = _ms(window)
    if window_ms <= 0:
        raise ValueError(f"window {window!r}: a window must be at least 1 ms long")
    # the sink asks the group the source reads (options may name its Redis and namespace)
    url = (options or {}).get("url", url)
    namespace = (options or {}).get("namespace", namespace)
    if source is None:
        reader = (
            spark.readStream.format("rcoord")
            .option("subscribe", topics)
            .option("groupId", group)
            .option("namespace", namespace)
            .option("startingOffsets", "earliest")
        )
        if url:
            reader = reader.option("url", url)
        if max_offsets_per_trigger is not None and not any(
                k.lower() == "maxoffsetspertrigger" for k in options or {}):
            reader = reader.option("maxOffsetsPerTrigger", str(max_offsets_per_trigger))
        for k, v in (options or {}).items():
            reader = reader.option(k, v)
        source = reader.load()
    events = source.select(
        "topic",
        "partition",
        "offset",
        F.col("key").cast("string").alias("k"),
        _event_ms(window_ms).alias("event_ms"),
    )
    events = events.withColumn("event_time", F.timestamp_millis("event_ms")) \
        .withWatermark("event_time", f"{_ms(watermark)} milliseconds")
    # Group mode keeps the offsets in the group; a fresh checkpoint per run is enough.
    location = checkpoint or os.path.join(out, "_checkpoints", uuid.uuid4().hex)
    sink = _Sink(out, window_ms, location, group=group, namespace=namespace, url=url)
    writer = events.writeStream.foreachBatch(sink).trigger(
        processingTime=f"{_ms(trigger)} milliseconds")
    query = writer.option("checkpointLocation", location).start()
    query._rcoord_sink = sink  # for tests and the bench: batches, records, late
    return query


def stop_gracefully(query: Any, timeout_s: float = 10.0) -> None:
    """Stop after the query has caught up, so its last batch's offsets are committed.

    Spark commits a batch's offsets to the group when it plans the next trigger; a trigger
    that found no new data means everything processed is committed. Waits up to
    ``timeout_s`` for such a trigger, then stops (leaving the group) either way.
    """
    deadline = time.monotonic() + timeout_s
    while query.isActive and time.monotonic() < deadline:
        status = query.status
        if not status["isDataAvailable"] and not status["isTriggerActive"]:
            break
        time.sleep(0.05)
    query.stop()


def main(argv: list[str] | None = None) -> int:
    from rcoord.cli import ENV_REDIS_URL, UsageError, check_url, env_default
    from rcoord.ops.common import nonnegative_seconds
    from rcoord.spark.options import ReadOptions

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--group", required=True, help="consumer group of the instances")
    parser.add_argument("--topic", required=True, help="topic(s) to read, comma-separated")
    parser.add_argument("--out", required=True, help="output directory (Parquet)")
    parser.add_argument("--redis-url", default=env_default(ENV_REDIS_URL),
                        help=f"Redis or Redis Cluster to read from (default ${ENV_REDIS_URL})")
    parser.add_argument("--namespace", default=env_default("RCOORD_NAMESPACE", "rcoord"),
                        help="the rcoord namespace (default $RCOORD_NAMESPACE, else rcoord)")
    parser.add_argument("--master", default=None, help="Spark master (default local[2])")
    parser.add_argument("--window", default="10s", type=_duration(1),
                        help="tumbling window length (500ms, 10s, 1m, 1h; default 10s)")
    parser.add_argument("--watermark", default="1m", type=_duration(0),
                        help="how late an event may come (default 1m)")
    parser.add_argument("--trigger", default="500ms", type=_duration(0),
                        help="micro-batch interval (default 500ms)")
    parser.add_argument("--max-offsets-per-trigger", type=_limit,
                        default=MAX_OFFSETS_PER_TRIGGER,
                        help="records a micro-batch reads at most, over all partitions "
                        f"(default {MAX_OFFSETS_PER_TRIGGER:,}; -1: no limit)")
    parser.add_argument("--session-timeout-ms", type=_timeout_ms, default=None,
                        help=f"the group's session timeout (default {ReadOptions.session_timeout_ms})")
    parser.add_argument("--heartbeat-interval-ms", type=_timeout_ms, default=None,
                        help="at most a third of the session timeout (default "
                        f"{ReadOptions.heartbeat_interval_ms}, or that third if smaller)")
    parser.add_argument("--rebalance-timeout-ms", type=_timeout_ms, default=None,
                        help="the source's rebalanceTimeoutMs: above the trigger interval plus "
                        "the longest batch (docs/architecture.md)")
    # (float() took "nan" and "inf", the query never stopped, and -1, it stopped at once)
    parser.add_argument("--run-for", type=nonnegative_seconds(), default=None,
                        help="stop gracefully after this many seconds (default: until signalled)")
    args = parser.parse_args(argv)
    if not args.redis_url:  # said before Spark starts, naming this command's flag
        parser.error("no Redis to read from: give --redis-url URL or set RCOORD_REDIS_URL")
    try:  # (an http:// URL was refused by the source ~25 s later, behind two tracebacks)
        check_url(args.redis_url)
    except UsageError as exc:
        parser.error(str(exc))
    # the source's rule (rcoord.spark.options), said before Spark starts and naming the flags
    session = args.session_timeout_ms or ReadOptions.session_timeout_ms
    beat = args.heartbeat_interval_ms or min(ReadOptions.heartbeat_interval_ms,
                                             max(1, session // 3))
    if beat * 3 > session:
        if args.heartbeat_interval_ms is None:
            parser.error(f"--session-timeout-ms: {session} is too short; it must hold three "
                         "heartbeat intervals of at least 1 ms (at least 3)")
        parser.error(f"--heartbeat-interval-ms: {beat} must be at most --session-timeout-ms / 3 "
                     f"({session / 3:g})")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(f"clickstream-{args.group}")
    if args.master or not os.environ.get("SPARK_HOME"):
        builder = builder.master(args.master or "local[2]")
    spark = (builder.config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "4").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    options = {}
    for opt, val in (("sessionTimeoutMs", args.session_timeout_ms),
                     ("heartbeatIntervalMs", args.heartbeat_interval_ms),
                     ("rebalanceTimeoutMs", args.rebalance_timeout_ms)):
        if val:
            options[opt] = str(val)
    query = build_query(spark, topics=args.topic, group=args.group, out=args.out,
                        url=args.redis_url, namespace=args.namespace,
                        window=f"{args.window}ms", watermark=f"{args.watermark}ms",
                        trigger=f"{args.trigger}ms", options=options,
                        max_offsets_per_trigger=args.max_offsets_per_trigger)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    print(f"clickstream: query {query.id} started (group {args.group})", flush=True)
    deadline = None if args.run_for is None else time.monotonic() + args.run_for
    while query.isActive and not stop.is_set():
        if deadline is not None and time.monotonic() >= deadline:
            break
        stop.wait(0.5)
    if query.isActive:
        stop_gracefully(query)
    # read after the stop: a batch that fails while stop_gracefully waits for it fails the run
    failed = query.exception()
    sink = query._rcoord_sink
    print(f"clickstream: stopped after {sink.batches} batches, {sink.records} records "
          f"({sink.late} late)", flush=True)
    spark.stop()
    if failed is not None:
        print(f"clickstream: query failed: {failed}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
