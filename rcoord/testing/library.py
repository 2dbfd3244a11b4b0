"""Copies of the rcoord library under other names, for tests and benches that compare a changed
library with the real one on the same server (a copy's functions are registered under its own
prefix, so it loads beside the original)."""

from __future__ import annotations

from ..scripts import library_head

__all__ = ["library_copy"]


def library_copy(name: str, source: str, copy: str, before: str = "", after: str = "") -> str:
    """The FUNCTION LOAD source of library ``name`` (``source``) under the name ``copy``, with
    Lua ``before`` its body (after the name lines) and ``after`` it."""
    head = library_head(name)
    assert source.startswith(head), "the library's first lines changed"
    return f"{library_head(copy)}{before}{source[len(head):]}{after}"
