"""What the parked threads of one blocking coordinator share: their wake-stream reads, their
reply reads, their deadline checks and their claims.

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

The same herd then asked three more things one thread at a time, and the process now asks each
once: a woken thread's reply (the reader reads the reply slots of every thread it wakes in one
``HMGET``, after the move, and hands each its own); whether the deadline they all woke for is
due (``read``: threads asking the same question while it is in flight share the answer); and
the claim to apply it (``claim``: one thread of the process asks the server, the others are
told no while the claim holds). Measured with 250 member threads in one process forming a group:
about 370 reply reads, 280 due checks and up to 100 claims became 2-5, 90-190 and 2-5.

Only the blocking driver uses this; the asyncio coordinator shares its reads with
``rcoord.asyncio.wake`` (a blocked read per coroutine held a pooled connection each, and
redis.asyncio's pools refuse a connection past their size).
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from .flow import Woken

__all__ = ["SharedWakeReads"]


def _stream_id(raw: Any) -> tuple[int, int]:
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    ms, _, seq = text.partition("-")
    return int(ms), int(seq or 0)


class _Waiter:
    """One waiting thread: where it waits from, and the reply slot the reader may read for it."""

    __slots__ = ("position", "slot", "woken")

    def __init__(self, position: tuple[int, int], slot: tuple[Any, Any] | None) -> None:
        self.position, self.slot = position, slot
        self.woken: Woken | None = None


class _Stream:
    """The waiting threads of one wake stream, and what the last read saw."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.reading = False
        self.newest: tuple[int, int] | None = None  # the newest entry any read has returned
        # The position each reply slot was last told, from ``newest`` alone, the stream had
        # moved past (see ``wait``); emptied whenever ``newest`` moves on.
        self.told: dict[Any, tuple[int, int]] = {}
        self.waiters: set[_Waiter] = set()  # the waiting threads (each with its position)
        self.read_from = (0, 0)  # where the read in flight started

    def moved(self, after: tuple[int, int]) -> bool:
        return self.newest is not None and self.newest > after

    def wait(self, client: Any, key: Any, after: Any, block_ms: int,
             slot: tuple[Any, Any] | None = None) -> bool | Woken:
        position = _stream_id(after)
        deadline = time.monotonic() + block_ms / 1000
        with self.cond:
            if self.moved(position):
                if slot is None or self.told.get(slot) != position:
                    if slot is not None:
                        self.told[slot] = position
                    return True
                # The parked call was told the stream had moved past this position, found no
                # reply, asked the server, and comes back with the same position: the group's
                # wake id, its stream's newest entry, is older than what this process remembers.
                # So the memory is of an earlier stream under this key (the group was deleted
                # and made again; a failover lost entries), and trusting it again would send
                # the call round HGET and await_reply until the stream passes it: forget it.
                self.newest = None
                self.told.clear()
            behind = self.reading and position < self.read_from
        if behind:
            # The read in flight starts after this position and would not see entries between
            # the two: look once, without blocking.
            reply = client.xread({key: _text(position)}, count=WAKE_READ_COUNT)
            with self.cond:
                self._note(_newest(reply))
                if self.moved(position):
                    return True
        me = _Waiter(position, slot)
        with self.cond:
            self.waiters.add(me)
            try:
                while True:
                    remaining = deadline - time.monotonic()
                    if me.woken is not None or self.moved(position):
                        self.waiters.discard(me)
                        return me.woken or True
                    if remaining <= 0:
                        self.waiters.discard(me)
                        return False
                    if not self.reading:
                        break
                    self.cond.wait(remaining)
                self.reading = True
                self.read_from = start = min(w.position for w in self.waiters)
            except BaseException:
                self.waiters.discard(me)
                raise
        try:
            # The oldest position any waiting thread needs, for as long as this thread waits.
            newest = _newest(client.xread({key: _text(start)}, count=WAKE_READ_COUNT,
                                          block=max(1, int(remaining * 1000))))
            stored = self._read_slots(client, newest)
        except BaseException:
            with self.cond:
                self.reading = False
                self.waiters.discard(me)
                self.cond.notify_all()
            raise
        with self.cond:
            self.reading = False
            self._note(newest)
            for waiter, value in stored:
                waiter.woken = Woken(value)
            self.waiters.discard(me)
            self.cond.notify_all()
            return me.woken or self.moved(position)

    def _read_slots(self, client: Any, newest: tuple[int, int] | None) -> list[tuple[_Waiter, Any]]:
        """The reply slots of every waiter the stream has passed, in one HMGET per hash (all
        of one group's slots are in one hash): a wake-up answers a whole group's parked calls
        at once, so this replaces one HGET per thread. The slot is read after the stream moved,
        as each thread's own read would be (``rcoord.protocol.park`` says why that is safe). If
        the read fails, the waiters read their slots themselves."""
        if newest is None:
            return []
        by_hash: dict[Any, list[_Waiter]] = {}
        with self.cond:
            for waiter in self.waiters:
                if waiter.slot is not None and waiter.position < newest:
                    by_hash.setdefault(waiter.slot[0], []).append(waiter)
        out: list[tuple[_Waiter, Any]] = []
        for hash_key, waiters in by_hash.items():
            try:
                values = client.hmget(hash_key, [w.slot[1] for w in waiters])  # type: ignore[index]
            except Exception:  # noqa: BLE001, S112 - each waiter's own HGET reports it
                continue
            out.extend(zip(waiters, values, strict=True))
        return out

    def _note(self, newest: tuple[int, int] | None) -> None:
        """Remember the newest entry a read returned (the caller holds the condition)."""
        if newest is not None and (self.newest is None or newest > self.newest):
            self.newest = newest
            self.told.clear()


def _newest(reply: Any) -> tuple[int, int] | None:
    """The newest entry id in an XREAD reply (None when it returned nothing)."""
    newest = None
    for _stream, entries in _entries(reply):
        if entries:
            last = _stream_id(entries[-1][0])
            if newest is None or last > newest:
                newest = last
    return newest


def _text(position: tuple[int, int]) -> str:
    return f"{position[0]}-{position[1]}"


def _entries(reply: Any) -> list[tuple[Any, list[Any]]]:
    """``[(stream, entries)]`` from an XREAD reply, as RESP2 (a list) or RESP3 (a dict)."""
    if not reply:
        return []
    if isinstance(reply, dict):
        return list(reply.items())
    return [(stream, entries) for stream, entries in reply]


WAKE_READ_COUNT = 128
"""Entries one read of a wake stream asks for: more than the stream holds (the group steps trim
it a stream node at a time, ``XADD MAXLEN ~ 16``: up to about 116 entries with the server's
default ``stream-node-max-entries`` of 100), so a read from any position still in the stream
returns its newest entry, and every thread parked anywhere in it learns from that one read."""

MAX_IDLE_STREAMS = 256
"""Streams (and claims) remembered before the idle ones are forgotten (a process that touched
many groups)."""


def open_claim_gate(claims: dict[Any, float], key: Any, now: float, px_ms: int) -> bool:
    """Whether a caller may ask the server for claim ``key`` at ``now`` (a monotonic time): not
    while another caller of the process asked less than ``px_ms`` ago. If it may, the gate is
    closed for ``px_ms`` from now. ``claims`` (key -> when its gate opens) is the caller's, kept
    under ``MAX_IDLE_STREAMS`` entries; shared by the blocking and asyncio coordinators."""
    if claims.get(key, 0.0) > now:
        return False
    if len(claims) >= MAX_IDLE_STREAMS:
        for done in [k for k, t in claims.items() if t <= now]:
            del claims[done]
    claims[key] = now + px_ms / 1000
    return True


class _Read:
    """A read in flight, and its outcome once ``done`` is set."""

    __slots__ = ("done", "error", "sharers", "value")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.sharers = 0
        self.value: Any = None
        self.error: BaseException | None = None


class SharedWakeReads:
    """The wake-stream reads of one blocking coordinator (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._streams: dict[Any, _Stream] = {}
        self._reads: dict[tuple[Any, ...], _Read] = {}
        self._claims: dict[Any, float] = {}  # claim key -> monotonic time its gate opens
        self._pid = os.getpid()

    def _forked(self) -> None:
        """In a forked child the parent's waiters, reads and claims are not ours (the caller
        holds the lock)."""
        if self._pid != os.getpid():
            self._streams, self._reads, self._claims = {}, {}, {}
            self._pid = os.getpid()

    def wait(self, client: Any, key: Any, after: Any, block_ms: int,
             slot: tuple[Any, Any] | None = None) -> bool | Woken:
        """Block up to ``block_ms`` until ``key`` has an entry after ``after``: False if it
        has none, else True, or ``Woken`` when ``slot`` (a hash and a field: the waiter's reply
        slot) was given and the reader read it for this waiter after the stream moved."""
        with self._lock:
            self._forked()
            stream = self._streams.get(key)
            if stream is None:
                if len(self._streams) >= MAX_IDLE_STREAMS:
                    self._drop_idle()
                stream = self._streams[key] = _Stream()
        return stream.wait(client, key, after, block_ms, slot)

    def read(self, client: Any, command: tuple[Any, ...]) -> Any:
        """Send ``command`` (a read), unless the same command is in flight for another thread:
        then wait for that call and share its reply. When a deadline falls due, every thread
        parked on the group wakes within a few ms and asks whether it is due; this makes that
        one question per process instead of one per thread. A reply shared this way was read
        after the sharing thread's wait ended, or at most one round trip before: no staler
        than any reply is by the time its caller acts on it."""
        while True:
            with self._lock:
                self._forked()
                call = self._reads.get(command)
                if call is None:
                    call = self._reads[command] = _Read()
                    break
                call.sharers += 1
            call.done.wait()
            if call.error is None:
                return call.value
            if isinstance(call.error, Exception):
                raise call.error
            # The reading thread was interrupted (KeyboardInterrupt, SystemExit): that is its
            # own affair, not this thread's; read again (or share the next read).
        try:
            call.value = client.execute_command(*command)
        except BaseException as exc:
            call.error = exc
            raise
        finally:
            with self._lock:
                self._reads.pop(command, None)
            call.done.set()
        return call.value

    def claim(self, client: Any, key: Any, px_ms: int) -> bool:
        """``SET key NX PX px_ms``: whether this thread won the claim. Only one thread of the
        process asks per ``px_ms``: the others are told no at once, which is what the server
        would answer them while the claim holds (if it ends sooner, they ask again after
        ``px_ms``, as a thread that lost to another process does)."""
        with self._lock:
            self._forked()
            if not open_claim_gate(self._claims, key, time.monotonic(), px_ms):
                return False
        return bool(client.set(key, b"1", nx=True, px=px_ms))

    def sharing(self, command: tuple[Any, ...]) -> int:
        """How many threads wait for the reply of ``command`` in flight (for tests)."""
        with self._lock:
            call = self._reads.get(command)
            return 0 if call is None else call.sharers

    def waiting(self, key: Any) -> int:
        """How many threads wait on ``key`` now (for tests and debugging)."""
        with self._lock:
            stream = self._streams.get(key)
        if stream is None:
            return 0
        with stream.cond:
            return len(stream.waiters)

    def _drop_idle(self) -> None:
        # Racy by design, and harmless: a thread that already holds a dropped stream still
        # waits correctly on it, only no longer shares its read with later arrivals.
        for key in [k for k, st in self._streams.items() if not st.reading and not st.waiters]:
            del self._streams[key]
