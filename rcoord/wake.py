"""One blocking read of a group's wake stream at a time, for every thread of a coordinator.

A parked JoinGroup or SyncGroup waits on its group's wake stream (``rcoord.protocol.park``).
With one ``XREAD BLOCK`` per parked thread, a process hosting many members of one group (a
Spark executor, a fleet of worker threads) holds one blocked connection per member, and every
wake-up makes all of them return, parse and go round again: in a 250-thread process those reads
were more than a third of all the commands it sent while a group formed, and each costs the
process far more than the server (the GIL, context switches, redis-py's per-call work). Here the
threads of one ``GroupCoordinator`` share the read: the first thread that must wait becomes the
reader and blocks on the stream from the oldest position any waiting thread still needs; the
others wait on a condition. When the read returns, every thread whose position the stream has
passed is woken; a thread whose own time runs out returns "not moved" by itself, whatever the
reader is doing, so each caller keeps exactly the wait its flow asked for. Readers take turns:
after each read the role is free again, so no thread waits longer than its own block time.

Only the blocking driver uses this; asyncio members are coroutines on one loop, where a blocked
read per member costs a socket, not a thread.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from typing import Any

__all__ = ["SharedWakeReads"]


def _stream_id(raw: Any) -> tuple[int, int]:
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    ms, _, seq = text.partition("-")
    return int(ms), int(seq or 0)


class _Stream:
    """The waiting threads of one wake stream, and what the last read saw."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.reading = False
        self.newest: tuple[int, int] | None = None  # the newest entry any read has returned
        self.positions: Counter[tuple[int, int]] = Counter()  # waiting threads' positions
        self.read_from = (0, 0)  # where the read in flight started

    def moved(self, after: tuple[int, int]) -> bool:
        return self.newest is not None and self.newest > after

    def wait(self, client: Any, key: Any, after: Any, block_ms: int) -> bool:
        position = _stream_id(after)
        deadline = time.monotonic() + block_ms / 1000
        with self.cond:
            if self.moved(position):
                return True
            behind = self.reading and position < self.read_from
        if behind:
            # The read in flight starts after this position and would not see entries between
            # the two: look once, without blocking.
            reply = client.xread({key: _text(position)}, count=16)
            with self.cond:
                self._note(reply)
                if self.moved(position):
                    return True
        with self.cond:
            self.positions[position] += 1
            try:
                while True:
                    remaining = deadline - time.monotonic()
                    if self.moved(position):
                        self._leave(position)
                        return True
                    if remaining <= 0:
                        self._leave(position)
                        return False
                    if not self.reading:
                        break
                    self.cond.wait(remaining)
                self.reading = True
                self.read_from = start = min(self.positions)
            except BaseException:
                self._leave(position)
                raise
        try:
            # The oldest position any waiting thread needs, for as long as this thread waits.
            reply = client.xread({key: _text(start)}, count=16,
                                 block=max(1, int(remaining * 1000)))
        except BaseException:
            with self.cond:
                self.reading = False
                self._leave(position)
                self.cond.notify_all()
            raise
        with self.cond:
            self.reading = False
            self._note(reply)
            self._leave(position)
            self.cond.notify_all()
            return self.moved(position)

    def _note(self, reply: Any) -> None:
        """Remember the newest entry a read returned (the caller holds the condition)."""
        for _stream, entries in _entries(reply):
            if entries:
                newest = _stream_id(entries[-1][0])
                if self.newest is None or newest > self.newest:
                    self.newest = newest

    def _leave(self, position: tuple[int, int]) -> None:
        self.positions[position] -= 1
        if self.positions[position] <= 0:
            del self.positions[position]


def _text(position: tuple[int, int]) -> str:
    return f"{position[0]}-{position[1]}"


def _entries(reply: Any) -> list[tuple[Any, list[Any]]]:
    """``[(stream, entries)]`` from an XREAD reply, as RESP2 (a list) or RESP3 (a dict)."""
    if not reply:
        return []
    if isinstance(reply, dict):
        return list(reply.items())
    return [(stream, entries) for stream, entries in reply]


MAX_IDLE_STREAMS = 256
"""Streams remembered before the idle ones are forgotten (a process that touched many groups)."""


class SharedWakeReads:
    """The wake-stream reads of one blocking coordinator (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._streams: dict[Any, _Stream] = {}
        self._pid = os.getpid()

    def wait(self, client: Any, key: Any, after: Any, block_ms: int) -> bool:
        """Block up to ``block_ms`` until ``key`` has an entry after ``after``; whether it has."""
        with self._lock:
            if self._pid != os.getpid():  # a forked child: the parent's waiters are not ours
                self._streams, self._pid = {}, os.getpid()
            stream = self._streams.get(key)
            if stream is None:
                if len(self._streams) >= MAX_IDLE_STREAMS:
                    self._drop_idle()
                stream = self._streams[key] = _Stream()
        return stream.wait(client, key, after, block_ms)

    def waiting(self, key: Any) -> int:
        """How many threads wait on ``key`` now (for tests and debugging)."""
        with self._lock:
            stream = self._streams.get(key)
        if stream is None:
            return 0
        with stream.cond:
            return sum(stream.positions.values())

    def _drop_idle(self) -> None:
        # Racy by design, and harmless: a thread that already holds a dropped stream still
        # waits correctly on it, only no longer shares its read with later arrivals.
        for key in [k for k, st in self._streams.items() if not st.reading and not st.positions]:
            del self._streams[key]
