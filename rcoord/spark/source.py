"""The PySpark adapter: the ``rcoord`` Python data source (imported only with pyspark present).

A thin layer: options, planning, group membership and the write path are the Spark-free
modules beside it. What runs where (measured, see ``docs/architecture.md``):

* ``RcoordDataSource.reader`` / ``streamReader`` / ``writer`` run in Spark's Python planner or
  runner processes; their objects are pickled to the executors, so they hold only options and
  open Redis connections lazily, never at construction: a task, a batch plan or a write
  leases the process's client (``clients.leased``); the stream reader owns one for the query.
* The stream reader in the *runner* process lives as long as the query: it holds the group
  membership in group mode (``StreamMember``).
* ``read`` and ``write`` run in executor Python workers, on unpickled copies.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from ..client import ConsumerGroup, client_from_url
from ..config import CoordinatorConfig
from ..coordinator import GroupCoordinator
from ..errors import RcoordError
from ..protocol.offsets import TopicPartition
from ..topics import Topics
from ..urls import repr_redacting
from . import shutdown
from .clients import leased
from .member import StreamMember, member_config
from .options import (
    EARLIEST,
    LATEST,
    MAX_PARTITION_FETCH_BYTES,
    OptionError,
    ReadKind,
    ReadOptions,
    check_session_timeout,
    parse_read_options,
    parse_write_options,
)
from .plan import OffsetRange, Position, ranges_between, split_ranges
from .resolve import (
    log_snapshot,
    next_position,
    read_range,
    resolve_offsets,
    resolve_partitions,
    still_present,
    subscribed_topics,
    without_gone,
)
from .rows import SCHEMA_DDL, SCHEMA_STRING, records_to_batch
from .write import check_write_plan, make_producer, write_rows

__all__ = ["RcoordDataSource"]

log = logging.getLogger("rcoord.spark")

TP = TopicPartition

@dataclass(frozen=True)
class RangePartition(InputPartition):
    """One Spark task: a range of one partition, and how to reach it (plain, picklable)."""

    url: str
    namespace: str
    range: OffsetRange
    fetch_size: int
    fail_on_data_loss: bool
    token: str = ""  # the create token of the topic the range was planned in ("" unknown)
    max_bytes: int = MAX_PARTITION_FETCH_BYTES  # about the most one read takes

    def __repr__(self) -> str:
        # Spark prints a failed task's partition in its logs and UI; the URL holds the password.
        return repr_redacting(self, "url")


def _read(part: RangePartition) -> Iterator[Any]:
    rng = part.range
    with leased(part.url) as client:
        for records in read_range(client, part.namespace, rng, part.fetch_size,
                                  part.fail_on_data_loss, part.token, part.max_bytes):
            yield records_to_batch(rng.topic, rng.partition, records)


def _tasks(opts: ReadOptions, ranges: Sequence[OffsetRange],
           tokens: Mapping[str, str]) -> list[RangePartition]:
    return [
        RangePartition(opts.url, opts.namespace, r, opts.fetch_size, opts.fail_on_data_loss,
                       tokens.get(r.topic, ""), opts.max_partition_fetch_bytes)
        for r in split_ranges(ranges, opts.max_records_per_partition)
    ]


class RcoordDataSource(DataSource):
    """``spark.read.format("rcoord")``, ``readStream``, ``write`` and ``writeStream``."""

    @classmethod
    def name(cls) -> str:
        return "rcoord"

    def schema(self) -> str:
        # Spark asks for the schema in load(), so a bad option fails there, as Spark's Kafka
        # source checks its options in sourceSchema (validateStreamOptions). Raised only in
        # streamReader(), it surfaced after start(), behind pyspark's runner's
        # UnboundLocalError. schema() is not told the kind of read: the checks both share.
        parse_read_options(self.options, None)
        return SCHEMA_DDL

    def reader(self, schema: Any) -> DataSourceReader:
        _check_schema(schema)
        return BatchReader(parse_read_options(self.options, ReadKind.BATCH))

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        _check_schema(schema)
        return StreamReader(parse_read_options(self.options, ReadKind.STREAM))

    def writer(self, schema: Any, overwrite: bool) -> DataSourceWriter:
        opts = parse_write_options(self.options)
        check_write_plan([f.name for f in schema.fields], opts.topic, overwrite,
                         _column_types(schema))
        return BatchWriter(opts)

    def streamWriter(self, schema: Any, overwrite: bool) -> DataSourceStreamWriter:
        # ``overwrite`` is the Complete output mode here, which Spark's Kafka sink accepts
        # (every result row is appended each trigger), so only the batch writer refuses it.
        opts = parse_write_options(self.options)
        check_write_plan([f.name for f in schema.fields], opts.topic, False,
                         _column_types(schema))
        return StreamWriter(opts)


def _check_schema(schema: Any) -> None:
    """A read's rows have the Kafka source's fixed schema. One given with ``.schema(...)`` was
    taken, and every task then failed inside a Python worker (Spark's
    DATA_SOURCE_RETURN_SCHEMA_MISMATCH); Spark's Kafka source refuses it when the query is
    planned ("does not allow user-specified schemas"), and so does this."""
    given = schema.simpleString() if hasattr(schema, "simpleString") else str(schema)
    if given != SCHEMA_STRING:
        raise OptionError(f"schema: an rcoord read has the fixed schema of Spark's Kafka source "
                          f"({SCHEMA_DDL}) and takes none given with .schema(...); got {given} "
                          "(select or cast columns after load() instead)")


def _column_types(schema: Any) -> dict[str, str]:
    return {f.name: f.dataType.simpleString() for f in schema.fields}


# -- batch read --------------------------------------------------------------------------------


class BatchReader(DataSourceReader):
    """Exact offset ranges, one Spark partition per topic partition (split when large)."""

    def __init__(self, opts: ReadOptions) -> None:
        self.opts = opts

    def partitions(self) -> Sequence[InputPartition]:
        opts = self.opts
        with leased(opts.url) as client:
            admin = Topics(client, opts.namespace)
            listed = resolve_partitions(admin, opts)
            bounds, tokens = log_snapshot(admin, listed)
        parts = still_present(listed, bounds, opts.fail_on_data_loss)
        gone = set(listed) - set(parts)
        start = resolve_offsets("startingOffsets", without_gone(opts.starting, gone), parts,
                                bounds, EARLIEST, opts.fail_on_data_loss)
        end = resolve_offsets("endingOffsets", without_gone(opts.ending, gone), parts, bounds,
                              LATEST, opts.fail_on_data_loss, complete=True)
        ranges = []
        for tp in parts:
            if start[tp] > end[tp]:
                raise OptionError(f"startingOffsets: offset {start[tp]} of {tp.topic}-"
                                  f"{tp.partition} is past its endingOffsets {end[tp]}")
            ranges.append(OffsetRange(tp.topic, tp.partition, start[tp], end[tp]))
        tasks = _tasks(opts, [r for r in ranges if r.size > 0], tokens)
        # Spark wants at least one partition; an empty range reads nothing.
        return tasks or [RangePartition(opts.url, opts.namespace, OffsetRange("-", 0, 0, 0),
                                        opts.fetch_size, opts.fail_on_data_loss)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, RangePartition)
        if partition.range.size == 0:
            return iter(())
        return _read(partition)


# -- streaming read ----------------------------------------------------------------------------


class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """A streaming read; in group mode, the query is a member of the consumer group."""

    def __init__(self, opts: ReadOptions) -> None:
        self.opts = opts
        self._member: StreamMember | None = None
        self._target: dict[TP, int] | None = None  # availableNow: never plan past these
        self._target_tokens: dict[str, str] = {}  # ... in the topics as they were then
        # Where this run's query starts (no group): resolved once. Spark asks initialOffset()
        # twice (the start of the first plan, then of its partitions()); "latest" resolved
        # again the second time skipped every record appended in between.
        self._initial: dict[str, Any] | None = None
        # The runner's client, for the query's life (its membership's heartbeats use it):
        # closed by stop(), not left to the process's shared clients (clients.leased).
        self._client: Any = None

    def __getstate__(self) -> dict[str, Any]:
        # The planner pickles a copy for the executors: no membership, no connection.
        return {"opts": self.opts, "_member": None, "_target": None, "_target_tokens": {},
                "_initial": None, "_client": None}

    # -- shared

    def _redis(self) -> Any:
        if self._client is None:
            self._client = client_from_url(self.opts.url)
        return self._client

    def _admin(self) -> Topics:
        return Topics(self._redis(), self.opts.namespace)

    def _snapshot(self, parts: Sequence[TP]) -> tuple[dict[TP, tuple[int, int]], dict[str, str]]:
        """Group mode's ``latest``: the real log bounds (the member clamps only its ends, with
        ``_clamp``) and the topics' create tokens."""
        return log_snapshot(self._admin(), parts)

    def _clamp(self, bounds: dict[TP, tuple[int, int]],
               tokens: Mapping[str, str]) -> dict[TP, tuple[int, int]]:
        """availableNow: no log end past the target (the ends when the run began). A topic
        deleted and created again since (another create token than ``tokens`` gives now) held
        nothing of its new log then: its partitions end at their log start, as partitions
        added since do (its records were read up to the old topic's end, records appended
        after the run began)."""
        if self._target is None:
            return bounds
        target, then = self._target, self._target_tokens
        return {tp: (lo, min(hi, target.get(tp, lo))
                     if then.get(tp.topic) == tokens.get(tp.topic) else lo)
                for tp, (lo, hi) in bounds.items()}

    def _limit(self, limit: ReadLimit | None) -> int | None:
        if isinstance(limit, ReadAllAvailable):
            return None
        if isinstance(limit, ReadMaxRows):
            return int(limit.max_rows)
        return self.opts.max_offsets_per_trigger

    def _membership(self) -> StreamMember:
        if self._member is None:
            opts = self.opts
            namespace = GroupCoordinator(self._redis(), CoordinatorConfig(
                namespace=opts.namespace)).config
            check_session_timeout(opts, namespace)  # before the join refuses it less clearly
            # Every named topic, existing or not: one deleted while the query was stopped has
            # no partitions, which the plan reports as data loss (failOnDataLoss); only a new
            # query insists that they exist (initialOffset).
            group = ConsumerGroup(member_config(opts, opts.topics, self._redis()))
            self._member = StreamMember(group, fail_on_data_loss=opts.fail_on_data_loss,
                                        first_join_wait_s=self._join_wait())
            shutdown.install()  # Spark ends the runner with SIGTERM: run stop() first
        return self._member

    # -- Spark's calls (runner process)

    def _join_wait(self) -> float:
        """How long a first join may take: a dead member of the old process may hold the
        rebalance up to its rebalance timeout, or stay until its session expires."""
        opts = self.opts
        return (opts.rebalance_timeout_ms + opts.session_timeout_ms) / 1000 + 5

    def _replay(self, begin: Position, finish: Position) -> list[RangePartition]:
        """The tasks of a batch another process's membership planned, which Spark replays after
        a restart: the planned tasks in their planned order, each reading its range again if
        ``StreamMember.replay`` takes its partition, else an empty range in its place. The
        order is what lines the replay up with the first attempt: the sink's producer is named
        by the task's index (``spark:<query>:<index>``) and the batch id."""
        self._membership().replaying(finish)
        try:
            ranges = ranges_between(begin, finish)
        except ValueError:
            # Batch 0 planned by an rcoord that did not record every partition's start. The
            # member still records that the replay reads none of it: Spark counts the batch as
            # finished, and a query restarted after it must not take its end for a batch read
            # in full (StreamMember._resume).
            log.warning("not replaying a batch planned in generation %s by %s: it does not say "
                        "where its partitions began; the group delivers its records again",
                        finish.generation, finish.member)
            ranges = []
        try:
            keep = self._membership().replay(finish, ranges, self._join_wait())
        except (TimeoutError, RcoordError) as exc:
            # No generation (a join that timed out, Redis away, or a refusal no retry mends):
            # the batch fails. Read as nothing, Spark counted it as finished, and a query
            # restarted after it went on from its end (StreamMember._resume): its records,
            # read by nobody, were skipped for good.
            exc.add_note(f"rcoord: the batch planned in generation {finish.generation} by "
                         f"{finish.member}, which Spark replays after a restart, fails rather "
                         "than read nothing (Spark would count it as finished, and a later "
                         "restart would skip its records); restart the query once the group "
                         "can be joined")
            raise
        return [t if TP(t.range.topic, t.range.partition) in keep
                else replace(t, range=OffsetRange(t.range.topic, t.range.partition,
                                                  t.range.start, t.range.start))
                for t in _tasks(self.opts, ranges, finish.tokens)]

    def initialOffset(self) -> dict[str, Any]:
        opts = self.opts
        if opts.group_id is not None:
            if opts.pattern is None:
                subscribed_topics(self._admin(), opts)  # a typo must not start a query at all
            return self._membership().initial(self._join_wait()).to_json()
        if self._initial is None:
            parts = resolve_partitions(self._admin(), opts)
            bounds, tokens = log_snapshot(self._admin(), parts)
            start = resolve_offsets("startingOffsets", opts.starting, parts, bounds, LATEST,
                                    opts.fail_on_data_loss, complete=True)
            self._initial = Position(start, dict(start), tokens=tokens).to_json()
        return self._initial

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.opts.max_offsets_per_trigger
        return ReadMaxRows(n) if n is not None else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        # Spark calls this before initialOffset, also when a query restarts on a checkpoint:
        # a topic deleted meanwhile is for latestOffset to report (data loss).
        parts = resolve_partitions(self._admin(), self.opts, must_exist=False)
        bounds, self._target_tokens = log_snapshot(self._admin(), parts)
        self._target = {tp: hi for tp, (_, hi) in bounds.items()}

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        pos = Position.from_json(start)
        n = self._limit(limit)
        if self.opts.group_id is not None:
            return self._membership().plan(pos, self._snapshot, n, self._clamp,
                                           until_target=self._target is not None).to_json()
        # A topic deleted since the query started is data loss (next_position), not an
        # unknown topic: only initialOffset insists that every named topic exists.
        parts = resolve_partitions(self._admin(), self.opts, must_exist=False)
        bounds, tokens = log_snapshot(self._admin(), sorted(set(parts) | set(pos.offsets)))
        read = {tp.topic for tp in parts}
        tokens = {t: v for t, v in tokens.items() if t in read}
        nxt = next_position(pos, parts, bounds, tokens, n, self.opts.fail_on_data_loss,
                            self._clamp)
        if nxt is None:
            return start
        if self._initial is not None and pos == Position.from_json(self._initial):
            # Batch 0: after a restart Spark replays it from the *new* process's initial
            # position (a new "latest" past its records, or a log start retention moved), so
            # its end says where every partition began, as group mode's does.
            nxt = replace(nxt, starts={tp: nxt.starts.get(tp, pos.offsets.get(tp, 0))
                                       for tp in nxt.offsets})
        return nxt.to_json()

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        begin, finish = Position.from_json(start), Position.from_json(end)
        if self.opts.group_id is not None:
            gen = self._membership().generation
            if gen is None or (finish.generation, finish.member) != (gen.generation_id,
                                                                     gen.member_id):
                # A batch replayed from a checkpoint of another membership (Spark's first call
                # after a restart): read again what this member holds at the batch's start.
                return self._replay(begin, finish)
        return _tasks(self.opts, ranges_between(begin, finish), finish.tokens)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, RangePartition)
        if partition.range.size == 0:  # a replayed batch's range another member reads
            return iter(())
        return _read(partition)

    def commit(self, end: dict[str, Any]) -> None:
        if self._member is not None:
            self._member.commit(Position.from_json(end))

    def stop(self) -> None:
        if self._member is not None:
            # Spark's second SIGTERM (or one after the socket closed) must not cut the
            # LeaveGroup short; see rcoord.spark.shutdown.
            with shutdown.shielded():
                self._member.close()
        if self._client is not None:
            client, self._client = self._client, None
            client.close()


# -- writes ------------------------------------------------------------------------------------


@dataclass
class WriteMessage(WriterCommitMessage):
    appended: int
    duplicates: int


def _rows(iterator: Iterator[Any]) -> Iterator[dict[str, Any]]:
    for row in iterator:
        yield row.asDict(recursive=True)


class BatchWriter(DataSourceWriter):
    """``df.write.format("rcoord")``: append every row (at-least-once if a task is retried)."""

    def __init__(self, opts: Any) -> None:
        self.opts = opts

    def write(self, iterator: Iterator[Any]) -> WriteMessage:
        with leased(self.opts.url) as client:
            producer = make_producer(client, self.opts.namespace, None, None,
                                     self.opts.max_request_size)
            res = write_rows(producer, _rows(iterator), self.opts.topic)
        return WriteMessage(res.appended, res.duplicates)


class StreamWriter(DataSourceStreamWriter):
    """``writeStream.format("rcoord")``: an idempotent producer per (query, task partition),
    epoch = batch id, so a micro-batch Spark runs again appends nothing twice."""

    def __init__(self, opts: Any) -> None:
        self.opts = opts

    def write(self, iterator: Iterator[Any]) -> WriteMessage:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        query = ctx.getLocalProperty("sql.streaming.queryId") if ctx else None
        batch = ctx.getLocalProperty("streaming.sql.batchId") if ctx else None
        if ctx is None or query is None or batch is None:
            raise RuntimeError("rcoord stream writer: Spark gave the task no query id or batch "
                               "id (sql.streaming.queryId / streaming.sql.batchId)")
        producer_id = f"spark:{query}:{ctx.partitionId()}"
        with leased(self.opts.url) as client:
            producer = make_producer(client, self.opts.namespace, producer_id, int(batch),
                                     self.opts.max_request_size)
            res = write_rows(producer, _rows(iterator), self.opts.topic)
        return WriteMessage(res.appended, res.duplicates)

    def commit(self, messages: list[Any], batchId: int) -> None:
        return None

    def abort(self, messages: list[Any], batchId: int) -> None:
        return None
