"""What the timer loop hears: one frozen dataclass per kind of event on the service's queue.

The listener threads and the lease round put these on one ``queue.Queue`` that the timer loop
drains (``CoordinatorService._handle``). Typed events instead of string-tagged tuples, as in
``rcoord.protocol.park``: a misspelt kind or a missing field fails at construction or under
mypy, not as an event the loop silently ignores.
"""

from __future__ import annotations

import queue
from dataclasses import dataclass

__all__ = ["CoordinatorsChanged", "Deadline", "Event", "EventQueue", "Hint", "Owned", "Resync"]


@dataclass(frozen=True)
class Owned:
    """The lease round settled: these partitions are this process's now."""

    partitions: frozenset[int]


@dataclass(frozen=True)
class Deadline:
    """A partition's shard channel announced a deadline due at ``at_ms`` (Redis time)."""

    partition: int
    at_ms: int


@dataclass(frozen=True)
class Hint:
    """A group's hint key expired: the group had a deadline due."""

    partition: int
    group_id: str


@dataclass(frozen=True)
class Resync:
    """A subscription was (re)made: anything published in the gap is lost, so re-read the
    deadline index, which is the authority."""


@dataclass(frozen=True)
class CoordinatorsChanged:
    """A coordinator joined or left: run a lease round now rather than at the next tick."""


Event = Owned | Deadline | Hint | Resync | CoordinatorsChanged
EventQueue = queue.Queue[Event]
