"""Objects that must start afresh in a forked child (multiprocessing's fork, a pre-forking
server): their locks, which a parent thread may have held at the fork and nobody would release
in the child, and state that must not be shared with the parent (a producer's id and sequence
numbers, queued calls). Each registers itself and defines ``_after_fork_in_child``, which one
at-fork hook calls in the child for every live registrant."""

from __future__ import annotations

import os
import weakref
from typing import Any

__all__ = ["renew_after_fork"]

_LIVE: weakref.WeakSet[Any] = weakref.WeakSet()


def renew_after_fork(obj: Any) -> None:
    """Have ``obj._after_fork_in_child()`` called in every child forked while ``obj`` lives."""
    _LIVE.add(obj)


def _after_fork_in_child() -> None:
    for obj in list(_LIVE):
        obj._after_fork_in_child()


if hasattr(os, "register_at_fork"):  # (not on Windows, which has no fork)
    os.register_at_fork(after_in_child=_after_fork_in_child)
