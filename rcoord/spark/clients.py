"""Redis clients for the Spark source and sink: one per URL per Python process, while in use.

Spark reuses its Python workers across tasks, and a driver's sink runs once per micro-batch:
a client (and its connection pool) per call would connect again every time. So a task, a plan
or a sink call leases the process's client for its URL (``leased``), and the client stays open
for the next one.

But a worker outlives queries. Kept for the process's life, a client stayed open (with its
pooled connections on the server) for every URL the worker ever met: each query on another
database, user or password (a rotated password is another URL) added one for good. So a client
no lease holds is closed once it has been idle ``IDLE_S`` (Spark's Kafka connector closes its
cached producers after ``spark.kafka.producer.cache.timeout``, 10 minutes), and at most
``MAX_IDLE`` idle clients are kept (the least recently used is closed first). The bound is
there for a worker that meets a stream of URLs, not for the URLs of one job: with a bound of
4, a worker whose tasks took turns over more URLs (a union of sources on several servers or
databases, a sink on yet another) closed and opened a client on every task, as a
least-recently-used table does when cycled over more keys than it holds. This is checked
whenever a lease begins or ends, so a worker that runs no more rcoord tasks keeps at most
``MAX_IDLE`` clients until it exits. A client in use is never closed.

A lease may end in a finalizer: a read task's generator holds its lease across yields, and one
abandoned in a reference cycle is closed by the cyclic garbage collector, which runs between
any two bytecodes of the thread that allocates, also one inside this module's lock. So ending a
lease never waits for the lock: it is queued, and applied by whoever holds the lock next, or
by the thread ending it if the lock is free (``_settle``).

A long-lived caller that owns its client (the stream reader's group membership, in the runner
process) makes its own with ``client_from_url`` and closes it when the query stops.

Across ``fork``: redis-py's connection pool notices the new process id and opens new
connections in the child, never touching the parent's sockets, so a client leased before a
fork is safe to use in the child. The lease table's lock starts afresh in the child: another
thread of the parent may have held it at the fork (a driver's ``foreachBatch`` threads asking
``batch_generation`` while user code forks), and nobody would release it there, so the child's
first lease waited for ever.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from ..client import client_from_url

__all__ = ["IDLE_S", "MAX_IDLE", "leased"]

log = logging.getLogger("rcoord.spark")

IDLE_S = 600.0
"""How long a client no lease holds stays open (seconds)."""

MAX_IDLE = 16
"""How many clients no lease holds stay open at most (one connection each, a cluster client's
one per node it used). Spark's Kafka connector bounds its cached producers by time only."""


@dataclass
class _Entry:
    client: Any
    users: int = 0
    idle_since: float = 0.0


_entries: dict[str, _Entry] = {}
_lock = threading.Lock()
_ended: deque[tuple[str, Any, float]] = deque()  # leases ended, not yet applied (_settle)


@contextmanager
def leased(url: str) -> Iterator[Any]:
    """The process's client for ``url`` (created on first use), not closed while held."""
    client = _acquire(url)
    try:
        yield client
    finally:
        _release(url, client)


def _acquire(url: str) -> Any:
    with _lock:
        doomed = _expired(time.monotonic())
        entry = _entries.get(url)
        if entry is not None:
            entry.users += 1
    _close(doomed)
    _settle()
    if entry is not None:
        return entry.client
    made = client_from_url(url)  # outside the lock: connecting takes round trips
    with _lock:
        entry = _entries.get(url)
        if entry is None:  # else another thread connected first: use its client
            entry = _entries[url] = _Entry(made)
        entry.users += 1
    _settle()
    if entry.client is not made:
        _close([made])
    return entry.client


def _release(url: str, client: Any) -> None:
    _ended.append((url, client, time.monotonic()))  # never waits (see the module docstring)
    _settle()


def _settle() -> None:
    """Apply the ended leases, and close the clients that are then idle too long or too many,
    unless the lock is held: its holder settles once it lets go (it calls this after every
    region), which also covers a lease ended inside that region on the holder's own thread."""
    while _ended and _lock.acquire(blocking=False):
        try:
            while _ended:
                url, client, since = _ended.popleft()
                entry = _entries.get(url)
                if entry is not None and entry.client is client:
                    entry.users -= 1
                    if entry.users == 0:
                        entry.idle_since = since
            doomed = _expired(time.monotonic())
        finally:
            _lock.release()
        _close(doomed)


def _expired(now: float) -> list[Any]:
    """Take out the idle clients to close: idle for ``IDLE_S``, or past ``MAX_IDLE``."""
    idle = sorted((e.idle_since, url) for url, e in _entries.items() if e.users == 0)
    return [_entries.pop(url).client for n, (since, url) in enumerate(idle)
            if now - since >= IDLE_S or len(idle) - n > MAX_IDLE]


def _after_fork_in_child() -> None:
    """A fresh lock in a forked child (see the module docstring)."""
    global _lock
    _lock = threading.Lock()


if hasattr(os, "register_at_fork"):  # (not on Windows, which has no fork)
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _close(clients: list[Any]) -> None:
    for client in clients:
        try:
            client.close()
        except Exception as exc:  # noqa: BLE001 - a socket that fails to close is gone anyway
            log.debug("closing an idle Redis client failed: %s", exc)
