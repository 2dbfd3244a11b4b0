"""Rendering: aligned tables for people, JSON for programs. A missing value is ``-`` in a table
(Kafka's tools print the same) and ``null`` in JSON."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["cell", "print_json", "print_table", "table"]

MISSING = "-"


def cell(value: Any) -> str:
    if value is None or value == "":
        return MISSING
    return str(value)


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """Columns padded to their widest cell, separated by two spaces; no trailing blanks."""
    text = [list(headers)] + [[cell(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in text) for i in range(len(headers))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in text
    )


def print_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    print(table(headers, rows), flush=True)


def print_json(data: Any) -> None:
    json.dump(data, sys.stdout, indent=2, sort_keys=False)
    sys.stdout.write("\n")
    sys.stdout.flush()
