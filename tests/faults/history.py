"""The fault suite's history checker: what the workers, the producer and a sampler recorded,
and the four rules a run must keep whatever fault it met.

A run is judged only by what was observed, never by what the system says about itself:

1. **One owner per partition and generation.** No two members were assigned the same partition
   in one generation (from the workers' ``assigned`` events).
2. **Committed offsets never go back.** Per partition, the offsets sampled from the coordinator
   over time never decrease, and the commits the workers saw succeed, ordered by generation (one
   owner per generation, and generation N+1 only starts from what N committed), never decrease.
   Within a generation a commit is compared only with those answered before it began: Redis
   stored each somewhere between its ``sent`` and its ``t``, so two that overlap have no order
   a worker can see (a frozen static member's commit, sent before its replacement's, may be
   written down after it).
3. **Every acknowledged record is processed, and is in the log.** Each value the producer got an
   ack for was handed to some worker at least once, and is in the log read back at the end.
4. **No record is appended twice.** Read back, each value is in the log once, and only values
   the producer sent are there.

A data loss (a restart without persistence) starts a new *epoch*: groups, offsets and records
before it are gone, generation numbers start again, and only the acks of the new epoch are owed.
Each event carries its epoch; rules 1 and 2 compare events of one epoch only.
"""

from __future__ import annotations

import json
from bisect import bisect_right
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "Assignment",
    "Commit",
    "EventReader",
    "History",
    "Sample",
    "assert_clean",
    "read_events",
    "read_worker_files",
    "violations",
]


@dataclass(frozen=True)
class Assignment:
    worker: str
    member: str
    gen: int
    partitions: tuple[int, ...]
    epoch: int = 0


@dataclass(frozen=True)
class Commit:
    """A commit a worker saw succeed: begun at ``sent``, its answer written down at ``t``."""

    worker: str
    member: str
    gen: int
    t: float
    offsets: dict[int, int]
    epoch: int = 0
    sent: float | None = None
    """When the commit began (None: at ``t``)."""


@dataclass(frozen=True)
class Sample:
    """Committed offsets read from the coordinator at one moment (-1 or absent: none)."""

    t: float
    offsets: dict[int, int]
    epoch: int = 0


@dataclass
class History:
    assignments: list[Assignment] = field(default_factory=list)
    commits: list[Commit] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    acked: set[str] = field(default_factory=set)
    """Values the producer got an ack for, and that are owed (the current epoch's)."""
    uncertain: set[str] = field(default_factory=set)
    """Values sent without an ack (or acked in an epoch that was lost): at most once in the log."""
    processed: Counter[str] = field(default_factory=Counter)
    log: dict[int, list[str]] = field(default_factory=dict)
    """The log read back at the end: partition -> values in offset order."""


def violations(h: History) -> list[str]:
    """Every broken rule, one line each; [] for a clean run."""
    return [*_two_owners(h), *_offsets_back(h), *_acked_lost(h), *_appended_twice(h)]


def assert_clean(h: History) -> None:
    found = violations(h)
    assert not found, f"{len(found)} violation(s):\n" + "\n".join(found[:20])


def _two_owners(h: History) -> Iterable[str]:
    owners: dict[tuple[int, int, int], set[str]] = defaultdict(set)
    for a in h.assignments:
        for p in a.partitions:
            owners[(a.epoch, a.gen, p)].add(a.member)
    for (epoch, gen, p), members in sorted(owners.items()):
        if len(members) > 1:
            yield (f"two owners: partition {p} in generation {gen} (epoch {epoch}): "
                   f"{sorted(members)}")


def _offsets_back(h: History) -> Iterable[str]:
    last: dict[tuple[int, int], tuple[float, int]] = {}
    for s in sorted(h.samples, key=lambda s: (s.epoch, s.t)):
        for p, off in s.offsets.items():
            if off < 0:
                continue
            prev = last.get((s.epoch, p))
            if prev is not None and off < prev[1]:
                yield (f"committed offset went back: partition {p} (epoch {s.epoch}) was "
                       f"{prev[1]} at t={prev[0]:.3f}, {off} at t={s.t:.3f}")
            last[(s.epoch, p)] = (s.t, off)
    yield from _commits_back(h.commits)


def _commits_back(commits: list[Commit]) -> Iterable[str]:
    """A commit lower than one of an earlier generation, or than one of its own generation
    answered before it began (a prefix of that generation's commits ordered by answer)."""
    earlier: dict[tuple[int, int], tuple[int, Commit]] = {}  # best of earlier generations
    answered: dict[tuple[int, int], list[float]] = {}  # this generation's answer times
    best: dict[tuple[int, int], list[tuple[int, Commit]]] = {}  # their running maximum
    gen_of: dict[tuple[int, int], int] = {}
    for c in sorted(commits, key=lambda c: (c.epoch, c.gen, c.t)):
        began = c.t if c.sent is None else c.sent
        for p, off in c.offsets.items():
            key = (c.epoch, p)
            if gen_of.get(key) != c.gen:
                ended, prev = (best.get(key) or [None])[-1], earlier.get(key)
                if ended is not None and (prev is None or ended[0] > prev[0]):
                    earlier[key] = ended
                gen_of[key], answered[key], best[key] = c.gen, [], []
            before = earlier.get(key)
            n = bisect_right(answered[key], began)
            if n and (before is None or best[key][n - 1][0] > before[0]):
                before = best[key][n - 1]
            if before is not None and off < before[0]:
                b = before[1]
                yield (f"commit went back: partition {p} (epoch {c.epoch}): "
                       f"{b.worker} committed {before[0]} in generation {b.gen}, "
                       f"then {c.worker} {off} in generation {c.gen}")
            top = best[key][-1] if best[key] and best[key][-1][0] >= off else (off, c)
            answered[key].append(c.t)
            best[key].append(top)


def _acked_lost(h: History) -> Iterable[str]:
    never = sorted(h.acked - set(h.processed), key=_natural)
    if never:
        yield f"{len(never)} acked record(s) never processed, e.g. {never[:5]}"
    in_log = {v for values in h.log.values() for v in values}
    missing = sorted(h.acked - in_log, key=_natural)
    if missing:
        yield f"{len(missing)} acked record(s) missing from the log, e.g. {missing[:5]}"


def _appended_twice(h: History) -> Iterable[str]:
    counts = Counter(v for values in h.log.values() for v in values)
    twice = sorted((v for v, n in counts.items() if n > 1), key=_natural)
    if twice:
        yield f"{len(twice)} record(s) appended more than once, e.g. {twice[:5]}"
    phantom = sorted(set(counts) - h.acked - h.uncertain, key=_natural)
    if phantom:
        yield f"{len(phantom)} record(s) in the log that nobody sent, e.g. {phantom[:5]}"


def _natural(value: str) -> tuple[int, str]:
    digits = "".join(ch for ch in value if ch.isdigit())
    return (int(digits) if digits else -1, value)


class EventReader:
    """One worker's history file, read as it grows: a test polls it every few ms all run long,
    and parsing the whole file on each poll took the CPU the workers and the server it judges
    need. Each read parses only the lines appended since the last one, and only complete ones:
    the last line may be cut short, by a SIGKILL or by a read while the worker writes it, and a
    commit's line cut just after its offsets ends with a ``}`` too. It is read again, whole,
    once its newline is there."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._events: list[dict[str, Any]] = []
        self._offset = 0
        """Where the first line not parsed yet begins."""

    def read(self) -> list[dict[str, Any]]:
        """Every complete event so far, as new dicts in a new list: the caller's to change."""
        try:
            with self.path.open("rb") as f:
                f.seek(self._offset)
                appended = f.read()
        except FileNotFoundError:  # a worker that has not started writing
            appended = b""
        end = appended.rfind(b"\n")
        if end >= 0:
            self._events += [json.loads(line) for line in appended[:end].split(b"\n")]
            self._offset += end + 1
        return [dict(ev) for ev in self._events]


def read_events(path: Path) -> list[dict[str, Any]]:
    """The complete events of one worker's history file, read whole (``EventReader``)."""
    return EventReader(path).read()


def read_worker_files(
    paths: Iterable[Path], epoch_of: Any = None
) -> tuple[History, list[dict[str, Any]]]:
    """Fold the workers' history files (workers/fault_worker.py) into a History.

    ``epoch_of(event) -> int`` places an event in an epoch (default: all in epoch 0). Returns
    the History (assignments, commits, processed) and every raw event, for scenario checks.
    """
    h = History()
    events: list[dict[str, Any]] = []
    for path in paths:
        worker = path.stem
        for ev in read_events(path):
            ev["worker"] = worker
            events.append(ev)
            epoch = epoch_of(ev) if epoch_of is not None else 0
            if ev["e"] == "assigned":
                h.assignments.append(Assignment(worker, ev["member"], ev["gen"],
                                                tuple(ev["parts"]), epoch))
            elif ev["e"] == "commit":
                h.commits.append(Commit(worker, ev["member"], ev["gen"], ev["t"],
                                        {int(p): o for p, o in ev["offsets"].items()}, epoch,
                                        ev.get("sent")))
            elif ev["e"] == "processed":
                h.processed.update(ev["values"])
    return h, events
