"""From options to partitions and offsets, reading topic metadata from Redis (no Spark).

Runs where Spark plans: in a batch read's planner, or in the streaming source's runner process.
Every error is an ``OptionError`` naming the option that asked for something that is not there.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from ..errors import Errors
from ..protocol.offsets import TopicPartition
from ..topics import Record, TopicError, Topics, fetch_many
from .options import (
    EARLIEST,
    LATEST,
    MAX_PARTITION_FETCH_BYTES,
    OffsetSpec,
    OptionError,
    ReadOptions,
)
from .plan import OffsetRange, Position, limit_end

__all__ = [
    "Clamp",
    "DataLossError",
    "continuity_loss",
    "continuity_restart",
    "drop_after_loss",
    "gone_loss",
    "group_checkpoint_error",
    "log_bounds",
    "log_snapshot",
    "next_position",
    "read_range",
    "resolve_offsets",
    "resolve_partitions",
    "restart_after_loss",
    "still_present",
    "subscribed_topics",
    "without_gone",
]

TP = TopicPartition

log = logging.getLogger("rcoord.spark")


class DataLossError(RuntimeError):
    """Records a query was going to read are gone (retention trimmed them, or the topic went).

    Raised only with ``failOnDataLoss`` true (the default, as in Spark's Kafka source).
    """


def subscribed_topics(admin: Topics, opts: ReadOptions, *, must_exist: bool = True) -> list[str]:
    """The topics the subscription names that exist now (a pattern matches what exists now).

    With ``must_exist`` (where a read starts: a batch read, a stream's ``initialOffset``, joining
    the group) an unknown ``subscribe``/``assign`` topic is an ``OptionError``: a typo should
    not start a query that reads nothing. Without it (a running stream planning its next batch)
    a topic deleted meanwhile is left out, and the plan reports the partitions it was reading
    as gone (``gone_loss``), as Spark's Kafka source does.
    """
    if opts.pattern is not None:
        regex = re.compile(opts.pattern)
        return [t for t in admin.list() if regex.fullmatch(t)]
    names = list(opts.topics) if opts.assign is None else list(opts.assign)
    out = []
    for topic in names:
        try:
            admin.partition_count(topic)
        except TopicError as exc:
            if exc.error not in (Errors.UNKNOWN_TOPIC_OR_PARTITION, Errors.INVALID_TOPIC_EXCEPTION):
                raise
            if must_exist:
                raise OptionError(f"{opts.subscription}: unknown topic {topic!r} in namespace "
                                  f"{opts.namespace!r}") from None
            continue
        out.append(topic)
    return out


def resolve_partitions(admin: Topics, opts: ReadOptions, *, must_exist: bool = True) -> list[TP]:
    """Every partition the read covers, sorted (``must_exist`` as in ``subscribed_topics``:
    without it, an ``assign`` partition past the topic's count now is left out too)."""
    out: list[TP] = []
    for topic in subscribed_topics(admin, opts, must_exist=must_exist):
        try:
            count = admin.partition_count(topic)
        except TopicError as exc:  # deleted since it was listed
            if exc.error is Errors.UNKNOWN_TOPIC_OR_PARTITION and (opts.pattern is not None
                                                                   or not must_exist):
                continue
            raise
        if opts.assign is not None:
            for p in opts.assign[topic]:
                if p >= count:
                    if not must_exist:
                        continue  # re-created with fewer partitions: this one is gone
                    raise OptionError(f"assign: topic {topic!r} has {count} partitions; there "
                                      f"is no partition {p}")
                out.append(TP(topic, p))
        else:
            out.extend(TP(topic, p) for p in range(count))
    return sorted(out)


def log_bounds(admin: Topics, partitions: Iterable[TP]) -> dict[TP, tuple[int, int]]:
    """(log start, log end) of each partition, one pipelined round trip per topic."""
    return log_snapshot(admin, partitions)[0]


def log_snapshot(
    admin: Topics, partitions: Iterable[TP]
) -> tuple[dict[TP, tuple[int, int]], dict[str, str]]:
    """``log_bounds``, and the create token of each topic (``TopicDescription.create_token``).

    A partition whose log offsets cannot be read (UNKNOWN_SERVER_ERROR: its stream's last id
    is not rcoord's, an XADD by hand) raises that TopicError, which names the stream and what
    mends it. ``Topics.describe`` answers it for that partition alone since 17320c7; left out
    here, it was taken for a partition whose topic was deleted ("was deleted": a DataLossError,
    or without ``failOnDataLoss`` a plan without it, which took it for a new partition, read
    from its log start, once it could be read again). A partition answered
    UNKNOWN_TOPIC_OR_PARTITION (its stream gone: the topic is being deleted) is left out."""
    wanted: dict[str, set[int]] = {}
    for tp in partitions:
        wanted.setdefault(tp.topic, set()).add(tp.partition)
    out: dict[TP, tuple[int, int]] = {}
    tokens: dict[str, str] = {}
    for topic, parts in wanted.items():
        try:
            desc = admin.describe(topic)
        except TopicError as exc:
            if exc.error is not Errors.UNKNOWN_TOPIC_OR_PARTITION:
                raise
            continue  # deleted: the caller treats its partitions as gone
        if desc.create_token:
            tokens[topic] = desc.create_token
        for info in desc.partitions:
            if info.partition not in parts:
                continue
            if info.error is Errors.NONE:
                out[TP(topic, info.partition)] = (info.log_start_offset, info.log_end_offset)
            elif info.error is not Errors.UNKNOWN_TOPIC_OR_PARTITION:
                raise TopicError(info.error, info.detail or f"{topic}-{info.partition}")
    return out, tokens


def continuity_loss(
    tp: TP, planned: int, bounds: tuple[int, int], planned_token: str | None, token: str | None
) -> str | None:
    """Why a query cannot go on reading ``tp`` at ``planned`` (its next offset from the previous
    batch, or a checkpoint), or None when it can. ``bounds`` is (log start, log end) now.

    Three ways, as Spark's Kafka source reports data loss: the topic was deleted and created
    again (its create token changed; its offsets began again at 0, so ``planned`` names other
    records or none); ``planned`` is past the log end (a re-creation that a position without
    tokens cannot otherwise show); records from ``planned`` on were removed by retention.
    """
    lo, hi = bounds
    where = f"topic {tp.topic!r} partition {tp.partition}"
    if planned_token and token and planned_token != token:
        # ``hi`` is the log end, one past the last record: the new topic's records are lo..hi-1.
        holds = f"offsets {lo} to {hi - 1}, other records" if hi > lo else "no records yet"
        return (f"{where}: the topic was deleted and created again since offset {planned} was "
                f"planned (the new topic holds {holds})")
    if planned > hi and planned_token and token:  # the same topic (checked above)
        return (f"{where}: the planned start offset {planned} is past the log end offset {hi} "
                "of the same topic: the log lost records from its end (e.g. by a failover to a "
                "replica that did not have them)")
    if planned > hi:
        return (f"{where}: the planned start offset {planned} is past the log end offset {hi} "
                "(the topic was deleted and created again, so its offsets began again at 0)")
    if planned < lo:
        return (f"{where}: offsets {planned} to {lo - 1} were removed by retention before the "
                f"query read them (the log starts at {lo})")
    return None


def resolve_offsets(
    name: str,
    spec: OffsetSpec,
    partitions: Sequence[TP],
    bounds: Mapping[TP, tuple[int, int]],
    default: int,
    fail_on_data_loss: bool = True,
    complete: bool = False,
) -> dict[TP, int]:
    """Concrete offsets for ``spec`` (the option ``name``) on ``partitions``.

    JSON offsets may name only partitions of the read; partitions they leave out take
    ``default`` (EARLIEST or LATEST), unless ``complete``, where they must name every
    partition, as Spark's Kafka source insists: a stream's start, whose default is LATEST (a
    partition left out by mistake would silently skip its records), and a batch read's end
    (one left out read on to its log end, past the end the read pins, a different range on
    every run). An offset below the log start is
    data loss (an error, or the log start without ``failOnDataLoss``); one past the log end is
    an error. The log start taken without ``failOnDataLoss`` is logged as a warning.
    """
    wanted = set(partitions)
    explicit: dict[TP, int] = {}
    if isinstance(spec, dict):
        for topic, parts in spec.items():
            for p, off in parts.items():
                tp = TP(topic, p)
                if tp not in wanted:
                    raise OptionError(f"{name}: {topic}-{p} is not among the partitions this "
                                      "read covers (check the topic name and partition count)")
                explicit[tp] = off
        missing = [f"{tp.topic}-{tp.partition}" for tp in partitions if tp not in explicit]
        if complete and missing:
            sentinels = ("-1 for latest" if name == "endingOffsets"  # it cannot end at earliest
                         else "-1 for latest, -2 for earliest")
            raise OptionError(f"{name}: specific offsets must name every partition the query "
                              f"reads ({sentinels}); missing: "
                              f"{', '.join(missing[:20])}{' ...' if len(missing) > 20 else ''}")
        sentinel = default
    else:
        sentinel = EARLIEST if spec == "earliest" else LATEST
    out: dict[TP, int] = {}
    for tp in partitions:
        lo, hi = bounds.get(tp, (0, 0))
        want = explicit.get(tp, sentinel)
        if want == EARLIEST:
            out[tp] = lo
        elif want == LATEST:
            out[tp] = hi
        elif want > hi:
            raise OptionError(f"{name}: offset {want} of {tp.topic}-{tp.partition} is past its "
                              f"log end offset {hi}")
        elif want < lo:
            loss = (f"{name}: offset {want} of {tp.topic}-{tp.partition} is below its log "
                    f"start offset {lo} (retention removed those records)")
            if fail_on_data_loss:
                raise DataLossError(f"{loss}; set failOnDataLoss=false to take the log "
                                    "start instead")
            # Said, as every other skip is (Spark's Kafka source: "startingOffsets for ... was
            # ... but consumer reset to ..."): the read silently lacked the records asked for.
            log.warning("%s; taking the log start %d instead (failOnDataLoss=false)", loss, lo)
            out[tp] = lo
        else:
            out[tp] = want
    return out


def continuity_restart(
    planned: int, bounds: tuple[int, int], planned_token: str | None, token: str | None
) -> tuple[int, str]:
    """Where a partition goes on (without ``failOnDataLoss``) after ``continuity_loss`` found a
    gap at ``planned``, and what that offset is, for the messages: its log start, unless the
    log now ends before ``planned`` in the same topic (both create tokens known and equal).
    Then the log lost records from its end (a failover to a replica that did not have them);
    the records below them the query had read already, and it goes on at the log end, as
    Spark's Kafka source goes on from the offset a partition "was changed" to. From the log
    start it read every earlier record of the partition a second time. (Records appended
    between the loss and this plan, below the log end, are not told from those and are
    skipped with them, as in Spark; the warning reports the loss.)"""
    lo, hi = bounds
    if planned > hi and planned_token and token and planned_token == token:
        return hi, "the log end offset"
    return lo, "the earliest available offset"


def restart_after_loss(loss: str, log_start: int, fail_on_data_loss: bool,
                       what: str = "the earliest available offset") -> int:
    """What a plan does with a partition ``continuity_loss`` found a gap in: a
    ``DataLossError`` with ``failOnDataLoss``, else a warning, and the partition starts again
    at ``log_start`` (returned; ``what`` names it, see ``continuity_restart``). One rule for
    both modes (``next_position``, group mode's ``StreamMember``)."""
    if fail_on_data_loss:
        raise DataLossError(f"{loss}; set failOnDataLoss=false to go on from {what} "
                            f"({log_start})")
    log.warning("%s; going on from %s %d (failOnDataLoss=false)", loss, what, log_start)
    return log_start


def added_loss(tp: TP, log_start: int) -> str:
    """What a plan reports for a partition new to the read (added, or of a topic created since)
    whose log no longer starts at 0: records before ``log_start`` were deleted before the query
    saw them (Spark's Kafka source: "Added partition ... starts from X instead of 0")."""
    return (f"topic {tp.topic!r} partition {tp.partition} is new to the query but its log starts "
            f"at offset {log_start}, not 0: records 0-{log_start - 1} were deleted (retention) "
            "before the query could read them")


def gone_loss(tp: TP, planned: int) -> str:
    """What ``drop_after_loss`` reports for a partition a query was reading that no longer
    exists: its topic was deleted (or created again with fewer partitions)."""
    return (f"topic {tp.topic!r} partition {tp.partition} is gone (the topic was deleted) while "
            f"the query was reading it: records from offset {planned} on, if there were any, "
            "were never read")


def drop_after_loss(loss: str, fail_on_data_loss: bool) -> None:
    """What a plan does with a partition that is gone (``gone_loss``): a ``DataLossError`` with
    ``failOnDataLoss``, else a warning, and the plan goes on without it. Spark's Kafka source
    does the same with partitions that disappear between two batches ("... are gone. Some data
    may have been missed"). If the topic is created again, its partitions are new to the query
    and are read from their log start."""
    if fail_on_data_loss:
        raise DataLossError(f"{loss}; set failOnDataLoss=false to go on without it")
    log.warning("%s; going on without it (failOnDataLoss=false); if the topic is created "
                "again, the query reads it from its log start", loss)


def still_present(partitions: Sequence[TP], bounds: Mapping[TP, tuple[int, int]],
                  fail_on_data_loss: bool) -> list[TP]:
    """The ``partitions`` a batch read plans, less those ``bounds`` (their ``log_snapshot``,
    taken after they were listed) lacks: their topic was deleted in between. That is data
    loss, as ``drop_after_loss`` reports a stream's: an error with ``failOnDataLoss``, else a
    warning and a read without them. Before, such a partition took the bounds (0, 0), an
    empty range: the read came out empty without a word, also with ``failOnDataLoss`` (and
    an offset given for it was "past its log end offset 0"). Spark's Kafka source fails a
    batch read whose partitions change between resolving its start and its end ("different
    topic partitions for starting offsets ..."); here ``failOnDataLoss`` decides, as for
    every other partition a read finds gone."""
    out = []
    for tp in partitions:
        if tp in bounds:
            out.append(tp)
            continue
        loss = (f"topic {tp.topic!r} partition {tp.partition} was deleted while the batch "
                "read was planned: its records were not read")
        if fail_on_data_loss:
            raise DataLossError(f"{loss}; set failOnDataLoss=false to read without it")
        log.warning("%s; reading without it (failOnDataLoss=false)", loss)
    return out


def without_gone(spec: OffsetSpec, gone: Iterable[TP]) -> OffsetSpec:
    """``spec`` (a batch read's ``startingOffsets`` or ``endingOffsets``) less the entries of
    the partitions ``still_present`` dropped (``gone``). JSON offsets that named them failed
    the read that ``failOnDataLoss=false`` was to go on with, as naming partitions the read
    does not cover ("check the topic name and partition count"); other entries are still
    checked."""
    dropped = set(gone)
    if not isinstance(spec, dict) or not dropped:
        return spec
    return {topic: {p: off for p, off in parts.items() if TP(topic, p) not in dropped}
            for topic, parts in spec.items()}


Bounds = dict[TP, tuple[int, int]]
Clamp = Callable[[Bounds, Mapping[str, str]], Bounds]
"""availableNow's cap on log ends: given the bounds and the topics' create tokens now."""


def next_position(
    start: Position,
    partitions: Sequence[TP],
    bounds: Bounds,
    tokens: Mapping[str, str],
    limit: int | None,
    fail_on_data_loss: bool,
    clamp: Clamp | None = None,
) -> Position | None:
    """The end of a stream's next micro-batch (outside group mode), or None if there is nothing
    to read. ``bounds`` and ``tokens`` are ``log_snapshot`` of ``partitions`` now; ``clamp``
    lowers log ends (availableNow's target).

    A partition of ``start`` goes on from its offset unless ``continuity_loss`` finds a gap:
    with ``failOnDataLoss`` that is a ``DataLossError`` naming topic, partition and offsets;
    without, a warning, and the partition starts again at its log start (in ``starts``). The
    check uses the real log ends, not the clamped ones: records appended after availableNow's
    target was taken may have moved ``start`` past it. A partition new to the read starts at
    its log start, as in Spark's Kafka source, which is data loss (``added_loss``) if that is
    not 0.

    A partition of ``start`` that ``bounds`` lacks is gone (its topic was deleted; ``bounds``
    covers ``start``'s partitions too, so one the read no longer names but that still exists
    is simply dropped): ``drop_after_loss``, an error or a warning and a plan without it.

    A ``start`` planned in group mode (a checkpoint of a query that ran with ``groupId``) holds
    the offsets of only the partitions its member held; the others' are the group's committed
    offsets, which a query without ``groupId`` cannot know. Taken as new, they were read from
    their log start: every record the group's other members had read came again (or, trimmed
    by retention, failed as an added partition). So a plain plan continues such a checkpoint
    only if it holds every partition the query reads, else an ``OptionError`` says what to do.
    """
    if start.generation is not None:
        foreign = [tp for tp in partitions if tp not in start.offsets]
        if foreign:
            raise OptionError(group_checkpoint_error(start, foreign))
    for tp in sorted(start.offsets):
        if tp not in bounds:
            drop_after_loss(gone_loss(tp, start.offsets[tp]), fail_on_data_loss)
    begin: dict[TP, int] = {}
    starts: dict[TP, int] = {}
    for tp in partitions:
        if tp not in bounds:
            continue
        lo = bounds[tp][0]
        if tp not in start.offsets:
            if lo > 0:  # retention deleted records the query never saw
                restart_after_loss(added_loss(tp, lo), lo, fail_on_data_loss)
            begin[tp] = starts[tp] = lo
            continue
        begin[tp] = start.offsets[tp]
        was, now = start.tokens.get(tp.topic), tokens.get(tp.topic)
        loss = continuity_loss(tp, begin[tp], bounds[tp], was, now)
        if loss is not None:
            at, what = continuity_restart(begin[tp], bounds[tp], was, now)
            begin[tp] = starts[tp] = restart_after_loss(loss, at, fail_on_data_loss, what)
    if clamp is not None:
        bounds = clamp(bounds, tokens)
    end = limit_end(begin, {tp: max(begin[tp], bounds[tp][1]) for tp in begin}, limit)
    if (not starts and end == {tp: start.offsets[tp] for tp in end}
            and len(end) == len(start.offsets) and start.tokens == dict(tokens)):
        return None
    return Position(end, starts, tokens=dict(tokens))


def group_checkpoint_error(start: Position, foreign: Sequence[TP]) -> str:
    """Why a query without ``groupId`` cannot continue the group-mode checkpoint ``start``
    (``next_position``), and what to do instead."""
    names = ", ".join(f"{tp.topic}-{tp.partition}" for tp in foreign[:20])
    return (f"groupId: the checkpoint was written in group mode (member {start.member!r}, "
            f"generation {start.generation}) and holds offsets only for the partitions that "
            f"member held; without groupId the query would read {names}"
            f"{' ...' if len(foreign) > 20 else ''} from their log start, records the group's "
            "other members read already (a partition added since cannot be told from those). "
            "Restart with the groupId the query ran with, or on a new checkpoint with "
            "startingOffsets naming every partition (the group's committed offsets: rcoord "
            "groups describe)")


def read_range(
    client: Any,
    namespace: str,
    rng: OffsetRange,
    fetch_size: int,
    fail_on_data_loss: bool,
    token: str | None = None,
    max_bytes: int = MAX_PARTITION_FETCH_BYTES,
) -> Iterable[list[Record]]:
    """The records of ``rng``, in chunks of at most ``fetch_size`` records and about
    ``max_bytes`` (``maxPartitionFetchBytes``; at least one record, however large), one
    ``fetch`` each. Without the byte bound, 2,000 records of 1 MiB were one 2 GiB read, held
    whole in the executor and in Redis's reply buffer; Spark's Kafka source is bounded by its
    consumer's ``max.partition.fetch.bytes``. A chunk cut short by the bytes is followed by
    the next from its last offset on, so the range is still read whole and in order.

    Records trimmed by retention since planning, or no longer in the log (it ends before them),
    are data loss: an error, or skipped without ``failOnDataLoss``. Offsets are dense in a
    partition, so the range ends exactly at ``rng.end``. ``token`` is the create token of the
    topic the range was planned in: if the topic was created again since (a batch Spark replays
    after a restart was planned, perhaps long before), the offsets name other records, so it is
    data loss too (without ``failOnDataLoss`` the range reads nothing and the next plan starts
    over in the new topic). Any other error (a stream entry that is not a record, the server
    refusing the read) is a ``TopicError`` whatever ``failOnDataLoss`` says: nothing is lost
    and nothing skipped, and the error names what to fix. Offsets with no record below the log
    end (entries removed from the stream's middle by hand, an XDEL) are data loss too, as
    Spark's Kafka source takes records missing between the offset asked and the one it got.

    Every skip (``failOnDataLoss`` false) logs a warning naming the topic-partition and the
    offsets skipped, as Spark's Kafka source reports each one (``reportDataLoss``): a silent
    skip left a batch short with nothing in the logs to say so.
    """
    where = f"{rng.topic}-{rng.partition}"

    def lost(msg: str) -> None:
        """Data loss at a point of the range: an error, or a warning (the caller skips)."""
        if fail_on_data_loss:
            raise DataLossError(f"{msg}; set failOnDataLoss=false to skip them")
        log.warning("%s; skipping them (failOnDataLoss=false)", msg)

    def gone(at: int) -> str:
        return (f"{where}: offsets {at}..{rng.end - 1} were planned but the partition no "
                "longer exists (its topic was deleted)")

    def recreated(at: int) -> str | None:
        """Data loss from ``at`` on if the topic is no longer the one planned in: a token
        still the planned one after a fetch proves its records the planned topic's (tokens
        never repeat). Checked before the first fetch and after each, not only before: a
        topic deleted and created again between two fetches of one task had the new topic's
        records read as the rest of the planned range, no loss reported."""
        if not token:
            return None
        try:
            now = Topics(client, namespace).create_token(rng.topic)
        except TopicError as exc:
            if exc.error is not Errors.UNKNOWN_TOPIC_OR_PARTITION:
                raise
            now = ""
        if now == token:
            return None
        return (f"topic {rng.topic!r} partition {rng.partition}: offsets {at} to "
                f"{rng.end - 1} were planned in a topic that has since been deleted"
                f"{' and created again' if now else ''}")

    if (msg := recreated(rng.start)) is not None:
        lost(msg)
        return
    def missing(at: int, upto: int) -> str:
        return (f"{where}: offsets {at}..{upto - 1} are missing from the stream (removed from "
                "its middle by hand, e.g. an XDEL; rcoord removes records only from a log's "
                "start)")

    offset = rng.start
    while offset < rng.end:
        want = min(fetch_size, rng.end - offset)
        try:
            # fetch_many, not fetch: a partition it cannot read is answered, not raised, so a
            # gap's next offset comes as a field (``next_offset``).
            res = fetch_many(client, namespace, [(rng.topic, rng.partition, offset)], want,
                             max_bytes=max_bytes, partition_max_bytes=max_bytes)[0]
        except TopicError as exc:
            if exc.error is not Errors.UNKNOWN_TOPIC_OR_PARTITION:
                raise
            lost(gone(offset))
            return
        if (msg := recreated(offset)) is not None:
            # Before the answer is read: a topic made again answers past its (new) log end or
            # with a gap, and the loss was named a failover's or an XDEL's.
            lost(msg)
            return
        if res.next_offset > offset:
            # A gap where the read begins: no record at offset..next_offset-1 (an XDEL by hand).
            # Data loss, as Spark's Kafka source reports records missing between the offset
            # asked and the one returned ("Cannot fetch records in [...)"), and skipped to the
            # next record without failOnDataLoss. It was the TopicError below whatever
            # failOnDataLoss said, so the query could never get past it.
            upto = min(res.next_offset, rng.end)
            lost(missing(offset, upto))
            offset = upto
            continue
        if res.detail:
            # Not loss: the records are there but cannot be read now (a stream entry an XADD
            # by hand made, which the error names with what mends it). Raised whatever
            # failOnDataLoss says; a DataLossError told the user to set failOnDataLoss=false
            # for an error that setting does not skip.
            raise TopicError(res.error, res.detail)
        if res.error is Errors.OFFSET_OUT_OF_RANGE and res.log_start_offset > offset:
            # Only the range's own offsets: the rest are another task's (split_ranges) or a
            # later batch's, which each report theirs; these named them all, every task alike.
            upto = min(res.log_start_offset, rng.end) - 1
            lost(f"{where}: offsets {offset}..{upto} were removed by retention before this "
                 "batch read them")
            offset = res.log_start_offset
            continue
        if res.error is Errors.OFFSET_OUT_OF_RANGE and offset > res.log_end_offset:
            # The log ends before the planned range: records the plan saw are gone (a failover
            # to a replica that had not received them). Data loss, as where the range runs
            # past the end further on (below) and as the next plan reports it
            # (continuity_loss); this was a TopicError that failed the query whatever
            # failOnDataLoss said.
            lost(f"{where}: offsets {offset}..{rng.end - 1} were planned but the log now ends "
                 f"at offset {res.log_end_offset} (records lost since, e.g. by a failover to a "
                 "replica that did not have them)")
            return
        if res.error is Errors.UNKNOWN_TOPIC_OR_PARTITION:
            lost(gone(offset))
            return
        if res.error is not Errors.NONE:
            raise TopicError(res.error, f"{where} at offset {offset}")
        records = [r for r in res.records if r.offset < rng.end]
        if not records and offset < res.log_end_offset:
            lost(missing(offset, rng.end))  # (the entries up to the log end went by hand)
            return
        if not records:
            # Offsets are dense: no record here means the log ends at or before ``offset``.
            lost(f"{where}: offsets {offset}..{rng.end - 1} were planned but there is no "
                 f"record at offset {offset} (the log now ends at offset {res.log_end_offset}; "
                 "records lost since, e.g. by a failover to a replica that did not have them)")
            return
        # A gap inside the chunk (an XDEL by hand): the records before it, the loss, the rest.
        # They came as one chunk, the missing offsets skipped without a word, also with
        # failOnDataLoss; Spark's Kafka source checks every record's offset.
        run: list[Record] = []
        for r in records:
            if r.offset > offset:
                if run:
                    yield run
                    run = []
                lost(missing(offset, r.offset))
            run.append(r)
            offset = r.offset + 1
        yield run
