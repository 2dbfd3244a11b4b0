"""Rendering: aligned tables for people, JSON for programs. A missing value is ``-`` in a table
(Kafka's tools print the same) and ``null`` in JSON."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any

__all__ = ["cell", "print_json", "print_line", "print_table", "stdout_gone", "table"]

MISSING = "-"


def cell(value: Any) -> str:
    """Ids are free text (a client id or group instance id may hold a newline or a tab, which
    split a row and shifted its columns): characters that do not print are shown escaped, as
    Python writes them (``\\n``); JSON output keeps them as they are."""
    if value is None or value == "":
        return MISSING
    text = str(value)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii")
                   for c in text)


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """Columns padded to their widest cell, separated by two spaces; no trailing blanks."""
    text = [list(headers)] + [[cell(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in text) for i in range(len(headers))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in text
    )


def print_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    _best_effort(lambda: print(table(headers, rows), flush=True))


def print_json(data: Any) -> None:
    def write() -> None:
        json.dump(data, sys.stdout, indent=2, sort_keys=False)
        sys.stdout.write("\n")
        sys.stdout.flush()

    _best_effort(write)


def print_line(text: str = "") -> None:
    _best_effort(lambda: print(text, flush=True))


def _best_effort(write: Callable[[], None]) -> None:
    """A command's report is written if someone reads it. A reader that went away (``| head``,
    ``| true``) must neither stop the work left (``topics delete`` stopped deleting at its
    first line) nor hide the command's outcome: a failure raised after the report (``groups
    delete`` of a busy group) exited 0 with no error line. The rest of the report goes nowhere
    (``stdout_gone``). The console consumer writes its records itself: it stops on a failed
    write, as Kafka's does."""
    try:
        write()
    except BrokenPipeError:
        stdout_gone()


def stdout_gone() -> None:
    """The reader of stdout went away (``| head``): later writes (the interpreter's flush at
    exit too) go nowhere instead of raising ``BrokenPipeError`` again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
