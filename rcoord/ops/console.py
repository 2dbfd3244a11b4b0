"""``rcoord topics produce`` and ``rcoord topics consume``: Kafka's console producer and consumer.

``produce`` appends one record per line of stdin (``--key-separator`` splits a key off each
line), with the idempotent producer and Kafka's partitioner. It sends in batches when stdin is a
file or a pipe, and line by line when it is a terminal, so what is typed is sent at once; a
batch that waits for more lines is sent after ``LINGER_S`` without one, so a slow pipe (``tail
-f app.log |``) is not held back (Kafka's console producer lingers 1 s, its ``--timeout``). On
Ctrl-C or SIGTERM the lines read are sent before it stops, as Kafka's closes its producer.

``consume`` prints records, one per line. With ``--group`` it is a member of that consumer group
(its partitions are assigned; its positions are committed); without, it reads every partition
of the topic directly (or only ``--partition P``, from ``--offset``), from the log end (or the
log start with ``--from-beginning``), and the partitions added while it runs from their start.
It stops after ``--max-messages`` records, or after ``--timeout-ms`` without a record, or on
Ctrl-C, and then says how many records it printed (stderr), as Kafka's console consumer does.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import select
import sys
import time
from collections.abc import Iterator
from typing import Any

from ..cli import UsageError, explain
from ..errors import InvalidRequestError, ProtocolError
from ..protocol._checks import INT32_MAX, INT64_MAX
from .common import Context, Failure, Progress, StopSignals, integer, leaf, stdout_gone

__all__ = ["add_console_arguments"]

BATCH = 500
"""Lines per append when stdin is not a terminal."""
LINGER_S = 1.0
"""How long read lines wait for more before they are sent (Kafka's console producer's
``--timeout``, 1000 ms by default)."""
FETCH_WAIT_MS = 500
"""How long one read of a caught-up consumer waits for a record."""
PARTITIONS_REFRESH_S = 1.0
"""How often a caught-up direct consumer looks for partitions added to its topic."""
FETCH_MAX_RECORDS = 500
"""The most records one read of a direct consumer takes (Kafka's ``max.poll.records``)."""
FETCH_MAX_BYTES = 1 << 20
"""About the most bytes of records one read of a direct consumer takes, at least one record
(Kafka's ``max.partition.fetch.bytes`` default: its console consumer's fetches are so bounded).
Bounded by count alone, 500 records of 1 MiB were one 500 MiB read, in the CLI and in Redis's
reply buffer, to print them."""


def add_console_arguments(sub: Any) -> None:
    q = leaf(sub, "produce", "append the lines of stdin to a topic, one record each", _produce)
    q.add_argument("topic")
    q.add_argument("--key-separator", metavar="SEP",
                   help="each line is KEY SEP VALUE (split at the first SEP)")
    q.add_argument("--partition", type=integer, metavar="P",
                   help="append to this partition (default: Kafka's partitioner)")
    q.dash_values = frozenset({"--key-separator"})  # (a separator may start with one: ->)
    q = leaf(sub, "consume", "print a topic's records (as a group member with --group)",
             _consume)
    q.add_argument("topic")
    q.add_argument("--group", metavar="G",
                   help="consume as a member of consumer group G (not empty or blank)")
    q.add_argument("--from-beginning", action="store_true",
                   help="start at the log start where there is no committed offset (default: "
                   "the log end, only new records)")
    q.add_argument("--partition", type=integer, metavar="P",
                   help="read only partition P (not with --group); from the log end unless "
                   "--offset or --from-beginning says otherwise")
    q.add_argument("--offset", metavar="O",
                   help="with --partition: where to start, 'earliest', 'latest' or an offset")
    q.add_argument("--max-messages", type=integer, metavar="N",
                   help="stop after N records (-1, the default: no limit)")
    q.add_argument("--timeout-ms", type=integer, metavar="MS",
                   help="stop after MS without a record (-1, the default: run until Ctrl-C)")
    q.add_argument("--print-key", action="store_true", help="print KEY SEP VALUE")
    q.add_argument("--print-offset", action="store_true",
                   help="print the partition and offset before each record")
    q.add_argument("--key-separator", default="\t", metavar="SEP",
                   help="between the printed key and value (a tab)")
    q.dash_values = frozenset({"--key-separator"})


# -- produce ----------------------------------------------------------------------------------


class _LineEnds:
    """Cuts input into lines as Kafka's console producer reads them (``BufferedReader.readLine``
    in LineMessageReader): a line ends at ``\n``, ``\r`` or ``\r\n``, and a last line without
    a line end is a line too, while an input ending in a line end has no empty line after it.
    Lines were cut at ``\n`` alone, with every ``\r`` and ``\n`` at their end stripped: a file
    of ``\r``-ended lines (classic Mac OS) was one record, and ``a\r\r\n`` one line, not two.

    ``feed`` takes the input as it comes, in chunks of any size: a ``\r`` ends its line at once
    (what is typed is sent without waiting for the next byte), and a ``\n`` right after it, in
    the next chunk too, is the same line end."""

    _END = re.compile(rb"\r\n|\r|\n")

    def __init__(self) -> None:
        self._partial: list[bytes] = []  # the line being read, in the chunks it came in
        self._after_cr = False

    def feed(self, data: bytes) -> list[bytes]:
        """The lines ``data`` completes, without their line ends."""
        if self._after_cr and data.startswith(b"\n"):
            data = data[1:]
        self._after_cr = data.endswith(b"\r")
        *complete, rest = self._END.split(data)
        lines = []
        for piece in complete:
            lines.append(b"".join([*self._partial, piece]))
            self._partial = []
        if rest:
            self._partial.append(rest)
        return lines

    def end(self) -> bytes | None:
        """The last line, if the input ended inside one."""
        return b"".join(self._partial) if self._partial else None


def _lines(linger_s: float) -> Iterator[tuple[int, bytes] | None]:
    """stdin's lines as bytes (``_LineEnds``), numbered: a record holds the line's bytes as
    they are (Kafka's console producer would replace bytes that are not UTF-8; here a value
    is never changed, and no line can stop the run half-way).

    None when no further line came for ``linger_s`` (once per pause): the lines read so far
    are to be sent. stdin is read from its file descriptor as it comes, where it has one
    that ``select`` takes (else, as an embedding program's in-memory stdin, by lines)."""
    stream = sys.stdin.buffer
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):
        fd = -1
    ends = _LineEnds()
    number = 0
    if fd < 0 or sys.platform == "win32":
        for data in stream:
            for line in ends.feed(data):
                number += 1
                yield number, line
    else:
        while True:
            if not select.select([fd], [], [], linger_s)[0]:
                yield None
                select.select([fd], [], [])  # wait for more, however long
            data = os.read(fd, 1 << 16)
            if not data:
                break
            for line in ends.feed(data):
                number += 1
                yield number, line
    last = ends.end()
    if last is not None:
        yield number + 1, last


def _produce(ctx: Context) -> int:
    from ..topics import Producer, ProducerRecord
    from ..topics.producer import MAX_REQUEST_SIZE

    a = ctx.args
    if a.key_separator == "":
        raise UsageError("--key-separator must not be empty")
    if a.partition is not None and a.partition < 0:
        raise UsageError(f"--partition must be >= 0, got {a.partition}")
    count = ctx.topics().partition_count(a.topic)  # a missing topic fails before any input
    if a.partition is not None and a.partition >= count:
        raise Failure(f"topic {a.topic!r} has {count} partitions; there is no partition "
                      f"{a.partition}")
    # Before any input is read: appended to it, a line failed on a partition the delete had
    # removed and was said to be one that "may or may not have been" produced.
    ctx.refuse_marked_for_deletion([a.topic], "no line was produced")
    # The separator as typed: argv's bytes (os.fsencode undoes Python's decoding of them).
    separator = None if a.key_separator is None else os.fsencode(a.key_separator)
    producer = Producer(ctx.client, ctx.namespace)
    batch_size = 1 if sys.stdin.isatty() else BATCH
    progress = Progress(ctx)
    sent: dict[int, int] = {}
    batch: list[ProducerRecord] = []
    first_unsent = 1  # the line of the first record not known to be produced
    signals = StopSignals().install()

    def flush(upto: int) -> None:
        """Send the batch (lines up to ``upto``): a stop signal waits until it is sent and
        counted, so what the note after a stop says was produced was."""
        nonlocal first_unsent
        with signals.held():
            for meta in producer.send_batch(a.topic, batch):
                sent[meta.partition] = sent.get(meta.partition, 0) + 1
            batch.clear()
            first_unsent = upto + 1
        progress(lambda: f"produced {sum(sent.values())} records")

    number = 0
    try:
        for item in _lines(LINGER_S):
            if item is None:
                if batch:
                    flush(number)
                continue
            number, line = item
            key: bytes | None = None
            value = line
            if separator is not None:
                k, found, v = line.partition(separator)
                if not found:
                    flush(number - 1)
                    raise Failure(f"line {number} has no key separator {a.key_separator!r}; "
                                  f"the {sum(sent.values())} records before it were produced")
                key, value = k, v
            size = len(value) + len(key or b"")
            if size > MAX_REQUEST_SIZE:
                # Checked here, not by the append: its refusal named the record's place in the
                # batch, not its line, and the batch's lines came out as "may or may not have
                # been" produced though none was.
                flush(number - 1)
                raise Failure(f"line {number} is {size} bytes (key and value), more than the "
                              f"producer's max_request_size {MAX_REQUEST_SIZE}; the "
                              f"{sum(sent.values())} records before it were produced")
            batch.append(ProducerRecord(value, key=key, partition=a.partition))
            if len(batch) >= batch_size:
                flush(number)
        if batch:
            flush(number)
    except KeyboardInterrupt:
        # Ctrl-C or SIGTERM (Terminated): the lines read are sent first, as Kafka's console
        # producer's shutdown hook closes (flushes) its producer; then the run stops (130, 143).
        # The lines of a batch it stopped while sending were (``flush`` holds the signal).
        if batch:
            flush(number)
        ctx.note(f"stopped; lines 1-{first_unsent - 1} were produced ({sum(sent.values())} "
                 "records)" if first_unsent > 1 else "stopped; no line was produced")
        raise
    except Failure:
        raise
    except Exception as exc:
        # Say exactly what is stored, so the input can be sent again from the right line
        # (a batch whose append failed may or may not be stored: the error says which lines).
        # The failure in the words every command uses (a Kafka error as it is, the rest as
        # ``explain`` says it): the raw error of a read-only replica said "Redis cannot run
        # this now; try again", not to give the master's URL, so the operator retried against
        # the replica.
        why = (" ".join(str(exc).split()) if isinstance(exc, (ProtocolError, InvalidRequestError))
               else explain(exc, ctx.url)[1])
        done = (f"lines 1-{first_unsent - 1} were produced ({sum(sent.values())} records)"
                if first_unsent > 1 else "no line was produced")
        unsure = (f"; lines {first_unsent}-{number} may or may not have been"
                  if batch else "")
        raise Failure(f"{why}; {done}{unsure}") from exc
    finally:
        signals.restore()
    total = sum(sent.values())
    if ctx.json:
        print_json_line({"topic": a.topic, "records": total,
                         "partitions": {str(p): n for p, n in sorted(sent.items())}})
    else:
        spread = ", ".join(f"{p}: {n}" for p, n in sorted(sent.items()))
        print(f"Produced {total} records to {a.topic}" + (f" (partitions {spread})."
                                                          if spread else "."), flush=True)
    return 0


# -- consume ----------------------------------------------------------------------------------


def print_json_line(data: Any) -> None:
    print(json.dumps(data), flush=True)


def _text(raw: bytes | None) -> str | None:
    return None if raw is None else raw.decode("utf-8", "replace")


def _b64(raw: bytes | None) -> str | None:
    return None if raw is None else base64.b64encode(raw).decode()


def _write_line(line: bytes) -> None:
    """Write ``line`` to stdout as its bytes, as Kafka's console consumer writes a record's
    (a value that is not UTF-8 was printed with U+FFFD in place of its bytes, and a stdout
    whose encoding lacks a character failed the run). A text-only stdout (an embedding
    program's) gets the text, bytes that are not UTF-8 replaced."""
    buffer = getattr(sys.stdout, "buffer", None)
    if buffer is None:
        sys.stdout.write(line.decode("utf-8", "replace") + "\n")
        sys.stdout.flush()
        return
    sys.stdout.flush()  # after what was printed as text before
    buffer.write(line + b"\n")
    buffer.flush()


class _Printer:
    """Prints records in the chosen format and counts them against ``--max-messages``."""

    def __init__(self, ctx: Context, signals: StopSignals) -> None:
        self.ctx, self.args = ctx, ctx.args
        self.signals = signals
        self.count = 0

    @property
    def wanted(self) -> int | None:
        m = self.args.max_messages
        return None if m is None else m - self.count

    def __call__(self, topic: str, partition: int, offset: int, key: bytes | None,
                 value: bytes | None, timestamp_ms: int) -> None:
        """Print one record; it counts once printed (a print that fails counts nothing). A stop
        signal while it prints waits until it is printed and counted (``StopSignals.held``)."""
        with self.signals.held():
            if self.ctx.json:
                print_json_line({
                    "topic": topic, "partition": partition, "offset": offset,
                    "timestamp_ms": timestamp_ms, "key": _text(key), "value": _text(value),
                    "key_base64": _b64(key), "value_base64": _b64(value),
                })
            else:
                a = self.args
                parts = ([f"Partition:{partition}".encode(), f"Offset:{offset}".encode()]
                         if a.print_offset else [])
                if a.print_key:
                    parts.append(b"null" if key is None else key)
                parts.append(b"null" if value is None else value)
                # The separator as typed: argv's bytes (os.fsencode undoes their decoding);
                # between every two fields, as Kafka's DefaultMessageFormatter writes it.
                sep = os.fsencode(a.key_separator)
                _write_line(sep.join(parts))
            self.count += 1


_CONSUME_LIMITS = {"max_messages": INT32_MAX, "timeout_ms": INT64_MAX}
"""The largest of each: Kafka's console consumer reads ``--max-messages`` as an Integer and
``--timeout-ms`` as a Long, and refuses a number past them; here one past a float's range
failed with an OverflowError before a record was read."""


def _consume(ctx: Context) -> int:
    a = ctx.args
    for name, most in _CONSUME_LIMITS.items():
        value = getattr(a, name)
        if value == -1:
            # Kafka's console consumer's default for both, "no limit": a script written for
            # it that passes -1 explicitly ran into a usage error here.
            setattr(a, name, None)
        elif value is not None and not 1 <= value <= most:
            raise UsageError(f"--{name.replace('_', '-')} must be from 1 to {most} (or -1: no "
                             f"limit), got {value}")
    if a.group is not None and not a.group.strip():
        # Kafka's consumer refuses such a group.id (InvalidGroupIdException). Here "" read as
        # no group and ran unattached, committing nothing, and " " joined a group named " ".
        raise UsageError(f"--group {a.group!r}: a group id must not be empty or whitespace; "
                         "leave --group out to read without a group")
    _check_partition_options(a)
    count = ctx.topics().partition_count(a.topic)  # a missing topic: an error, not a wait
    if a.group is not None:
        # A group's commits would outlive the delete that finishes the topic, as the offsets
        # reset-offsets is refused to write; reading without a group writes nothing.
        ctx.refuse_marked_for_deletion([a.topic], "nothing was consumed or committed")
    if a.partition is not None and not 0 <= a.partition < count:
        raise Failure(f"topic {a.topic!r} has {count} partitions; there is no partition "
                      f"{a.partition}")
    signals = StopSignals().install()
    printer = _Printer(ctx, signals)
    try:
        if a.group is not None:
            _consume_group(ctx, printer)
        else:
            _consume_direct(ctx, printer)
    except BrokenPipeError:
        # The reader of stdout went away (``| head``): a normal end, as Kafka's console
        # consumer stops on a failed write.
        stdout_gone()
    finally:
        signals.restore()
        ctx.note(f"Processed a total of {printer.count} messages")
    return 0


def _check_partition_options(a: argparse.Namespace) -> None:
    """Kafka's console consumer's rules for ``--partition`` and ``--offset``
    (ConsoleConsumerOptions): an offset needs a partition, a partition excludes a group, and a
    start is given once. A negative partition is a bad flag (exit 2, as ``produce`` says it),
    found before the topic is looked up: it was "there is no partition -1" (exit 1), or, for
    a topic that does not exist, only the missing topic."""
    if a.partition is not None and a.partition < 0:
        raise UsageError(f"--partition must be >= 0, got {a.partition}")
    if a.offset is not None:
        if a.partition is None:
            raise UsageError("--offset needs --partition (the partition it is an offset of)")
        if a.from_beginning:
            raise UsageError("--from-beginning and --offset cannot be given together")
        word = a.offset.strip().lower()
        if word not in ("earliest", "latest") and not (word.isdigit() and word.isascii()):
            raise UsageError(f"--offset {a.offset!r} is not 'earliest', 'latest' or a "
                             "non-negative offset")
    if a.partition is not None and a.group is not None:
        raise UsageError("--group and --partition cannot be given together: a group member "
                         "reads the partitions the group assigns it")


def _start(ctx: Context, p: int, start: int, end: int) -> int:
    """Where the reading of partition ``p`` begins: ``--offset`` (checked against the log's
    offsets, as a consumer resets an offset out of range), else the log start with
    ``--from-beginning``, else the log end."""
    a = ctx.args
    word = (a.offset or "").strip().lower()
    if word == "earliest" or (not word and a.from_beginning):
        return start
    if word in ("", "latest"):
        return end
    offset = int(word)
    if offset < start:
        ctx.note(f"partition {p}: offset {offset} is below the log start {start} (removed by "
                 "retention); reading from the log start")
        return start
    if offset > end:
        ctx.note(f"partition {p}: offset {offset} is past the log end {end}; reading from the "
                 "log end")
        return end
    return offset


def _idle_deadline(a: argparse.Namespace) -> float | None:
    return None if a.timeout_ms is None else time.monotonic() + a.timeout_ms / 1000


def _consume_direct(ctx: Context, printer: _Printer) -> None:
    """Every partition, read in turn; waits (blocking read) only when all are caught up, and
    then looks for partitions added meanwhile (at most every ``PARTITIONS_REFRESH_S``)."""
    from ..topics import fetch

    a = ctx.args
    position: dict[int, int] = {}
    _add_partitions(ctx, position, at_start=True)
    parts = sorted(position)
    looked = time.monotonic()
    idle_until = _idle_deadline(a)
    turn = 0
    while printer.wanted is None or printer.wanted > 0:
        got = False
        for i in range(len(parts)):
            p = parts[(turn + i) % len(parts)]
            want = printer.wanted
            res = fetch(ctx.client, ctx.namespace, a.topic, p, position[p],
                        max_records=min(FETCH_MAX_RECORDS, want) if want else FETCH_MAX_RECORDS,
                        max_bytes=FETCH_MAX_BYTES)
            if res.records:
                got = True
                for r in res.records:
                    printer(a.topic, p, r.offset, r.key, r.value, r.timestamp_ms)
                position[p] = res.records[-1].offset + 1
                break
            if position[p] > res.log_end_offset >= 0:
                # Past the log end: the topic was deleted and created again (a log never
                # shrinks otherwise). Before, the consumer waited, silent, until the new log
                # passed the old position, and never showed the records below it.
                ctx.note(f"partition {p}: offset {position[p]} is past the log end "
                         f"{res.log_end_offset} (the topic was deleted and created again?); "
                         f"reading it from its log start {res.log_start_offset}")
                position[p] = res.log_start_offset
                continue
            # Retention passed this position: go on from the log start.
            position[p] = max(position[p], res.log_start_offset)
        turn += 1
        if got:
            idle_until = _idle_deadline(a)
            continue
        if idle_until is not None and time.monotonic() >= idle_until:
            return
        if a.partition is None and time.monotonic() - looked >= PARTITIONS_REFRESH_S:
            looked = time.monotonic()
            if _add_partitions(ctx, position, at_start=False):
                parts = sorted(position)
                continue
        # All caught up: wait on partition ``turn`` for a while, then look at all again.
        p = parts[turn % len(parts)]
        fetch(ctx.client, ctx.namespace, a.topic, p, position[p], max_records=1,
              block_ms=min(FETCH_WAIT_MS, _left_ms(idle_until)) if len(parts) == 1 else 50)


def _add_partitions(ctx: Context, position: dict[int, int], at_start: bool) -> bool:
    """Add the topic's partitions not in ``position`` yet; return whether there were any.

    At the start each begins where ``_start`` says (with ``--partition``, only that one). A
    partition added while the consumer runs begins at its log start: every record in it came
    after the consumer started, and a console consumer that missed those (Kafka's, with its
    default ``auto.offset.reset=latest``, can) would not show what was produced to it."""
    from ..topics import log_offsets

    a = ctx.args
    if a.partition is not None:
        start, end = log_offsets(ctx.client, ctx.namespace, a.topic, a.partition)
        position[a.partition] = _start(ctx, a.partition, start, end)
        return True
    count = ctx.topics().partition_count(a.topic)
    added = False
    for p in range(len(position), count):
        start, end = log_offsets(ctx.client, ctx.namespace, a.topic, p)
        position[p] = _start(ctx, p, start, end) if at_start else start
        added = True
    return added


def _left_ms(deadline: float | None) -> int:
    if deadline is None:
        return FETCH_WAIT_MS
    return max(1, int((deadline - time.monotonic()) * 1000))


def _consume_group(ctx: Context, printer: _Printer) -> None:
    """A member of the group: the group assigns the partitions; positions are committed as the
    consumer goes (auto-commit) and when it stops (it leaves the group)."""
    import socket

    from ..client import Consumer, ConsumerGroupConfig

    a = ctx.args
    config = ConsumerGroupConfig(
        group_id=a.group, topics=[a.topic], redis_client=ctx.client, namespace=ctx.namespace,
        client_id=f"rcoord-console-{socket.gethostname()}-{os.getpid()}",
        start_offset="earliest" if a.from_beginning else "latest",
    )
    consumer = Consumer(config, fetch_max_wait_ms=FETCH_WAIT_MS)
    printer.signals.on_stop = consumer.wakeup
    progress = Progress(ctx, every_s=2.0)
    try:
        idle_until = _idle_deadline(a)
        while printer.wanted is None or printer.wanted > 0:
            # A stop signal inside waits for the poll (cut short by wakeup()) and the printing
            # of what it returned: ended between the two, records handed out but never printed
            # were committed as read by close().
            with printer.signals.held():
                records = consumer.poll(timeout=min(1.0, _left_ms(idle_until) / 1000),
                                        max_records=printer.wanted or 500)
                _print_all(consumer, records, printer)
            if records:
                idle_until = _idle_deadline(a)
            elif idle_until is not None and time.monotonic() >= idle_until:
                return
            elif not consumer.assignment():
                progress(lambda: f"waiting to join group {a.group!r}")
    finally:
        # The clean stop itself: a stop signal now waits for it (and then exits 143 or 130)
        # instead of cutting the final commit and the LeaveGroup short, as Kafka's console
        # consumer closes from its shutdown hook; a repeated one is ignored (StopSignals).
        printer.signals.on_stop = None  # nothing to wake: close() is bounded by its timeout
        with printer.signals.held():
            consumer.close(timeout=10)


def _print_all(consumer: Any, records: list[Any], printer: _Printer) -> None:
    """Print one poll's records. If a print fails (stdout closed, Ctrl-C), each partition is
    sought back to its first record not printed, so the positions close() commits are exactly
    what was printed, never records polled but not shown (the printer counts a record in the
    same held block that prints it, so ``count`` says exactly how many were)."""
    before = printer.count
    try:
        for r in records:
            printer(r.topic, r.partition, r.offset, r.key, r.value, r.timestamp_ms)
    except BaseException:
        first: dict[tuple[str, int], Any] = {}
        for r in records[printer.count - before:]:
            first.setdefault((r.topic, r.partition), r)
        for r in first.values():
            consumer.seek(r.topic_partition, r.offset)
        raise
