"""The plan of ``rcoord groups reset-offsets``: which offset each partition goes to, and why.

As Kafka's ConsumerGroupCommand: ``--to-earliest`` (log start), ``--to-latest`` (log end),
``--to-current`` (the committed offset, else the log end), ``--to-offset N``, ``--shift-by N``
(from the committed offset), ``--to-datetime`` and
``--by-duration`` (the first record at or after that time, ``rcoord.topics.offsets_for_times``;
the log end where there is none), ``--from-file`` (the offsets of a CSV file, as ``--export``
writes it: ``topic,partition,offset`` lines, or ``group,topic,partition,offset``). Every
target is clamped into [log start, log end], as Kafka does, and the plan says where it was; but
a committed offset ``--to-current`` keeps is kept as it is, out of range or not (Kafka's
``resetToCurrent`` does not check it either), and so is an offset found by time above the log
end read before the search (its record was appended since).

Times are read on Redis' clock (``TIME``), the clock that stamped the records, so
``--by-duration PT1H`` means an hour before now as the server counts it.
"""

from __future__ import annotations

import csv
import datetime as dt
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..cli import UsageError
from ..protocol.offsets import TopicPartition
from .common import INTEGER, Failure

__all__ = ["MODES", "Mode", "Row", "export_csv", "parse_datetime", "parse_duration",
           "parse_reset_file", "parse_topics", "plan"]

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)

MODES = ("to_earliest", "to_latest", "to_current", "to_offset", "shift_by", "to_datetime",
         "by_duration", "from_file")

_DURATION = re.compile(
    r"([-+]?)P(?:([-+]?\d+)D)?(?:T(?:([-+]?\d+)H)?(?:([-+]?\d+)M)?(?:([-+]?\d+)(?:[.,](\d{0,9}))?S)?)?",
    re.IGNORECASE,
)


def parse_duration(text: str) -> int:
    """An ISO-8601 duration as Java's ``Duration.parse`` reads it (``PnDTnHnMn.nS``), in ms."""
    m = _DURATION.fullmatch(text.strip())
    if not m or not any(m.group(i) for i in (2, 3, 4, 5)) or text.strip().upper().endswith("T"):
        raise UsageError(
            f"--by-duration {text!r} is not a duration; write PnDTnHnMnS, e.g. P1D, PT2H30M, "
            "PT0.5S"
        )
    sign, days, hours, minutes, seconds, frac = m.groups()
    ms = (int(days or 0) * 86_400_000 + int(hours or 0) * 3_600_000
          + int(minutes or 0) * 60_000 + int(seconds or 0) * 1000)
    if frac:
        sub = int((frac + "000")[:3])
        ms += -sub if (seconds or "").startswith("-") else sub
    return -ms if sign == "-" else ms


_DATETIME = re.compile(r"(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3})"
                       r"(?:(Z)|([-+])(\d{2})(?:(:?)(\d{2}))?)?", re.ASCII)
"""Kafka's ``--to-datetime`` forms (``Utils.getDateTime``): the date, ``T``, the time to the
millisecond, and a zone or none: ``Z``, ``+hh``, ``+hh:mm``, or ``+hh00``. Kafka reads
``+hhmm`` with ``SimpleDateFormat``'s ``X`` (``+hh``), ignoring the minutes after it, so
``+0530`` is +05:00 there: such a zone is refused, where reading it as +05:30 reset 30 minutes
away from what the same command does with Kafka's tool."""


def parse_datetime(text: str) -> int:
    """An ISO-8601 date and time in epoch ms, in the forms Kafka's ``--to-datetime`` takes
    (``_DATETIME``); without a zone it is UTC, as Kafka reads it (``Utils.getDateTime``
    appends ``Z``), whatever the machine's zone. Any other form is refused, as Kafka's (and a
    few Kafka's ``SimpleDateFormat`` reads loosely: single-digit fields, ``.5`` as 5 ms,
    text after the zone, ``+hhmm`` with minutes, whose minutes it ignores): a date
    alone (``2024-05-01``) was read as midnight UTC, a time without milliseconds or another
    ISO-8601 spelling as Python reads it, so a command copied from or to Kafka's tool reset
    where neither said."""
    m = _DATETIME.fullmatch(text.strip())
    try:
        if not m:
            raise ValueError(text)
        when = dt.datetime.fromisoformat(m[1])
        zone = dt.UTC
        if m[3]:
            hours, minutes = int(m[4]), int(m[6] or 0)
            if hours > 23 or minutes > 59 or (m[6] and not m[5] and minutes):
                raise ValueError(text)
            offset = dt.timedelta(hours=hours, minutes=minutes)
            zone = dt.timezone(-offset if m[3] == "-" else offset)
    except ValueError:
        raise UsageError(
            f"--to-datetime {text!r} is not an ISO-8601 date-time as Kafka takes it; write "
            "YYYY-MM-DDTHH:mm:SS.sss, optionally with a zone (Z, +hh, +hh:mm), e.g. "
            "2024-05-01T00:00:00.000 (a zone +hhmm is taken only as +hh00: Kafka's tool reads "
            "+0530 as +05:00)"
        ) from None
    # Integer arithmetic: ``timestamp() * 1000`` is a float, which truncates some instants to
    # the millisecond before (2038-06-23T00:35:34.595Z gave ...594).
    return (when.replace(tzinfo=zone) - _EPOCH) // dt.timedelta(milliseconds=1)


def parse_topics(specs: Sequence[str]) -> list[tuple[str, list[int] | None]]:
    """``--topic T`` (every partition) or ``--topic T:0,2`` (those), repeatable. The partitions
    follow the last colon, so offsets committed under a name with a colon (a group may commit
    for names that are not rcoord topics) can be named: ``--topic files:2026:0``."""
    out: list[tuple[str, list[int] | None]] = []
    for spec in specs:
        topic, colon, parts = spec.rpartition(":")
        if not colon:
            topic = parts
        if not topic:
            raise UsageError(f"--topic {spec!r}: write TOPIC or TOPIC:PARTITION[,PARTITION...]")
        if not colon:
            out.append((topic, None))
            continue
        if not all(INTEGER.fullmatch(p) for p in parts.split(",")):
            raise UsageError(f"--topic {spec!r}: partitions must be numbers, as in {topic}:0,1,2")
        numbers = [int(p) for p in parts.split(",")]
        if any(n < 0 for n in numbers):
            raise UsageError(f"--topic {spec!r}: partitions are >= 0")
        out.append((topic, sorted(set(numbers))))
    return out



_FORMATS = {3: "topic,partition,offset", 4: "group,topic,partition,offset"}


def parse_reset_file(text: str, group: str, source: str) -> dict[TopicPartition, int]:
    """The offsets a ``--from-file`` CSV gives ``group``: lines ``topic,partition,offset`` (one
    group's plan, what ``--export`` writes) or ``group,topic,partition,offset`` (Kafka's plan of
    several groups: the lines of other groups are skipped). The first line sets which, and
    every line must have its fields, as Kafka's reader reads the file in the first line's
    format: a line with a field too many in a ``topic,partition,offset`` file (``t,1,7,9``)
    was read as another group's and skipped, so its partition kept its offset without a word.
    An empty last field (``t,1,7,``: a trailing comma) is none, as Kafka's CSV reader takes it.
    Blank lines are skipped; a line that does not parse, or a partition given twice, is a usage
    error naming its line, and a file with nothing for ``group`` a failure: nothing is reset
    from a plan read in part."""
    out: dict[TopicPartition, int] = {}
    lines: dict[TopicPartition, int] = {}
    width = 0  # the fields of the file's lines, set by its first
    for number, line in enumerate(text.splitlines(), 1):
        where = f"{source}, line {number}"
        try:
            # CSV, not split(","): Kafka's writer quotes a group id with a comma or a quote in
            # it ("eu,orders",t,0,5), which was read as five fields and refused.
            fields = [f.strip() for f in next(csv.reader([line], strict=True), [])]
        except csv.Error as exc:
            raise UsageError(f"{where}: not a CSV line ({exc}), got {line!r}") from None
        if fields in ([], [""]):
            continue
        if len(fields) > 1 and not fields[-1]:
            fields.pop()
        if not width and len(fields) in (3, 4):
            width = len(fields)
        if len(fields) != width or not fields[-3]:
            raise UsageError(f"{where}: expected " + (
                "topic,partition,offset (or group,topic,partition,offset)" if not width else
                f"{_FORMATS[width]}, the format of the file's first line") + f", got {line!r}")
        if width == 4:
            if fields[0] != group:
                continue
            fields = fields[1:]
        # (digits: a minus sign is refused below, and a plus a file never needs)
        if not all(INTEGER.fullmatch(f) and f[0] != "+" for f in fields[1:3]):
            raise UsageError(f"{where}: the partition and offset must be integers, got "
                             f"{line!r}")
        partition, offset = int(fields[1]), int(fields[2])
        if partition < 0 or offset < 0:
            raise UsageError(f"{where}: the partition and offset must be >= 0, got {line!r}")
        tp = TopicPartition(fields[0], partition)
        if tp in lines:
            raise UsageError(f"{where}: {tp.topic}-{tp.partition} was given on line "
                             f"{lines[tp]} already")
        lines[tp] = number
        out[tp] = offset
    if not out:
        raise Failure(f"{source} has no offsets for group {group!r}; nothing was changed")
    return out


def export_csv(rows: Sequence[Row]) -> str:
    """The plan as ``--from-file`` reads it (Kafka's ``--export``): ``topic,partition,offset``
    lines of the new offsets."""
    return "".join(f"{r.tp.topic},{r.tp.partition},{r.new}\n" for r in rows)


@dataclass(frozen=True)
class Mode:
    """The chosen reset and its argument (an offset, a shift, or a timestamp in ms)."""

    name: str
    value: int = 0

    def describe(self) -> str:
        return self.name.replace("_", "-")


@dataclass(frozen=True)
class Row:
    """One partition of the plan."""

    tp: TopicPartition
    current: int | None
    log_start: int
    log_end: int
    requested: int
    new: int
    note: str = ""

    def as_json(self, group: str) -> dict[str, Any]:
        return {
            "group": group, "topic": self.tp.topic, "partition": self.tp.partition,
            "current_offset": self.current, "new_offset": self.new,
            "log_start_offset": self.log_start, "log_end_offset": self.log_end,
            "requested_offset": self.requested, "note": self.note or None,
        }


def plan(
    mode: Mode,
    partitions: Sequence[TopicPartition],
    committed: Mapping[TopicPartition, int],
    offsets: Mapping[TopicPartition, tuple[int, int]],
    by_time: Mapping[TopicPartition, int | None],
    from_file: Mapping[TopicPartition, int] | None = None,
) -> list[Row]:
    """The new offset of every partition. ``offsets`` maps each to (log start, log end);
    ``by_time`` holds the offsets found for a time-based mode (None: no record that recent),
    ``from_file`` those of ``--from-file``."""
    rows = []
    for tp in partitions:
        start, end = offsets[tp]
        current = committed.get(tp)
        note = ""
        if mode.name == "to_earliest":
            requested = start
        elif mode.name == "to_latest":
            requested = end
        elif mode.name == "to_current":
            # Kafka's --to-current: the committed offset where there is one, else the log end
            # (what a consumer of the group with auto.offset.reset=latest would start from).
            if current is None:
                requested, note = end, "no committed offset: the log end"
            else:
                requested = current
        elif mode.name == "to_offset":
            requested = mode.value
        elif mode.name == "shift_by":
            if current is None:
                raise Failure(
                    f"cannot shift the offset of {tp.topic}-{tp.partition}: the group has no "
                    "committed offset there; use --to-offset, --to-earliest or --to-latest"
                )
            requested = current + mode.value
        elif mode.name in ("to_datetime", "by_duration"):
            found = by_time[tp]
            if found is None:
                requested, note = end, "no record at or after that time: the log end"
            else:
                requested = found
        elif mode.name == "from_file":
            assert from_file is not None
            requested = from_file[tp]
        else:  # pragma: no cover - argparse allows only MODES
            raise AssertionError(mode.name)
        if mode.name == "to_current" and current is not None:
            # Kafka's --to-current keeps the committed offset as it is (no checkOffsetsRange):
            # it is what the group's consumers resume from, out of the log's range or not.
            new = requested
            if not start <= requested <= end:
                note = (f"{requested} is outside the log's offsets [{start}, {end}]; kept, as "
                        "committed")
        elif mode.name in ("to_datetime", "by_duration") and requested > end:
            # A record found is in the log, searched after its offsets were read: above that
            # log end only when appended since (and the first appended removed since, else it
            # is found at the log end). Clamped, it planned an offset perhaps below the log
            # start by then, out of range, with a note that blamed the offset found.
            new = requested
            note = (f"{requested}: the first record at or after that time, appended after the "
                    f"log end offset ({end}) was read")
        else:
            new = min(max(requested, start), end)
            if requested > end:
                note = f"{requested} is above the log end offset; clamped to {end}"
            elif requested < start:
                note = f"{requested} is below the log start offset; clamped to {start}"
        rows.append(Row(tp, current, start, end, requested, new, note))
    return rows
