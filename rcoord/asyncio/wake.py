"""What the parked calls of one asyncio coordinator share: their wake-stream reads, and a bound
on the commands they have in flight.

A parked JoinGroup or SyncGroup waits on its group's wake stream (``rcoord.protocol.park``). As
coroutines, each waiting with its own ``XREAD BLOCK`` held one pooled connection for up to a
second, and ``redis.asyncio`` pools refuse a connection past their ``max_connections`` (100 by
default) instead of waiting for one: a group of more than about 100 members hosted on one event
loop failed to form, its members told ``ConnectionLost: Too many connections``. Here the parked
calls of one ``AsyncGroupCoordinator`` share one read per stream, as the blocking coordinator's
threads do (``rcoord.wake``): a reader task reads from the oldest position any waiter needs, and
every waiter whose position the stream has passed is woken by its answer; each waiter still
returns "not moved" at its own deadline. A failed read fails one waiter (the oldest), as a
failed read of the blocking coordinator fails the one thread that made it, and the others read
again; a read nobody waits for any more (its waiters woken, timed out or cancelled) is
cancelled, and ``close`` ends them all. And every other command waits for a place under a
bound below the pool's size (``command_limit``): a wake-up sends every woken call's next
command at once, which a pool of 100 could not serve either. On a cluster the bound is per
master, as the pools are (``places``): with one bound for all masters, the calls stuck on one
stalled master took every place, and a heartbeat for a group on a healthy master waited for the
whole stall, its member expiring. The reads have a bound of their own (half that one, per
master too): a read holds its connection for up to a second, and sharing one bound, reads of as
many parked groups as the bound took every place, so a heartbeat (or the SyncGroup that would
wake them) waited for a read to end; and with one read bound for all masters, the reads stuck on
a stalled master held every read place, so a parked call on a healthy master was woken only by
its own timeout, up to a second late, each time. A commit's replica WAIT, which holds its
connection up to its ack timeout, waits under the reads' bound too (``blocking_place``). When
the deadline the parked calls wait for falls due, they all ask whether it is due and then claim
it: the same question in flight is asked once and its answer shared (``read``), and one call
per claim's length asks for the claim (``claim``), as the blocking coordinator's threads do.

The bounds, and the streams, belong to the event loop that uses them (an ``asyncio.Semaphore``
binds to its loop): a coordinator used from another loop (``asyncio.run`` twice) starts afresh.
``close`` is for good: every call of this object afterwards fails at once
(``AsyncGroupCoordinator.start`` makes a new one), so a call that was between two reads at
``close`` cannot start a reader, or send a command, on a client closed after it.

Nothing is remembered between reads (the blocking version keeps the newest id it saw, and
must then tell a stream made again under the same key from the one it remembers): a waiter
that arrives after a read returned starts the next read from its own position, which answers
at once if the stream has moved.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

import redis.exceptions

from ..flow import UNREACHABLE, _master_name
from ..wake import (
    MAX_IDLE_STREAMS,
    WAKE_READ_COUNT,
    _newest,
    _stream_id,
    _text,
    open_claim_gate,
)
from .cancel import cancel_and_wait

__all__ = ["AsyncWakeReads", "command_limit", "pool_size"]

MAX_COMMANDS_IN_FLIGHT = 64
"""Commands one asyncio coordinator has in flight at most on one master (besides its wake-stream
reads)."""


def pool_size(client: Any) -> int | None:
    """The ``max_connections`` of the asyncio client ``client``'s pool; on a cluster client,
    of each node's pool (each is made with the same); None when it does not say."""
    pool = getattr(client, "connection_pool", None)
    if pool is not None:  # redis.asyncio.Redis
        size = getattr(pool, "max_connections", None)
    else:  # redis.asyncio.RedisCluster: each node's pool is made with these
        manager = getattr(client, "nodes_manager", None)
        size = getattr(manager, "connection_kwargs", {}).get("max_connections")
    return size if isinstance(size, int) and size > 0 else None


def command_limit(client: Any) -> int:
    """How many commands one coordinator may have in flight on each master of ``client``: half
    the pool's ``max_connections`` (each node's pool on a cluster), leaving the rest to whatever
    else shares the client, and at most ``MAX_COMMANDS_IN_FLIGHT``."""
    size = pool_size(client)
    if size is None:
        return MAX_COMMANDS_IN_FLIGHT
    return max(1, min(MAX_COMMANDS_IN_FLIGHT, size // 2))


async def _masters(client: Any, keys: Sequence[Any]) -> list[str]:
    """The names of the masters ``client`` sends ``keys`` to, sorted, without repeats. "" on a
    single-node client, and for a key whose master a cluster client does not know now (a slot
    left uncovered by a failover): their commands share one bound. Keyed by master, not by
    slot: the bound is on a master's pool, which serves thousands of slots."""
    if hasattr(client, "get_node_from_key"):
        with contextlib.suppress(*UNREACHABLE):
            await client.initialize()  # (at once when it knows the slots; a command would too)
    names = set()
    for key in keys:
        try:
            names.add(_master_name(client, key))
        except UNREACHABLE:
            names.add("")
    return sorted(names) or [""]


class _MasterBound:
    """One master's bound (of its commands, or of its reads), and how many calls hold or wait
    for a place under it: dropped when none does, so a client that met many masters (failovers,
    reshards) keeps none idle."""

    __slots__ = ("places", "users")

    def __init__(self, size: int) -> None:
        self.places = asyncio.Semaphore(size)
        self.users = 0


class _Stream:
    """The waiters of one wake stream (position and deadline each), and the read in flight."""

    __slots__ = ("read_from", "reader", "waiters")

    def __init__(self) -> None:
        self.reader: asyncio.Task[None] | None = None
        self.read_from = (0, 0)
        self.waiters: dict[asyncio.Future[bool], tuple[tuple[int, int], float]] = {}


class AsyncWakeReads:
    """The wake-stream reads of one asyncio coordinator (see the module docstring), and the
    bounds on its commands (``commands`` per master) and its reads in flight (``commands // 2``
    per master, at least one; within the commands' own when ``pool``, the connections of each
    master's pool, cannot hold both)."""

    def __init__(self, commands: int, pool: int | None = None) -> None:
        self._sizes = (commands, max(1, commands // 2))
        # A pool too small for both bounds (``max_connections=1``): the reads take the
        # commands' places. Apart, a reader cancelled at its waiter's deadline, not yet ended,
        # held the one connection as the call sent its next command ("Too many connections"),
        # where the blocking coordinator serves the same call with a pool of one.
        self._share = pool is not None and pool < sum(self._sizes)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._commands = self._reads = asyncio.Semaphore(1)  # (made for each loop: _bound)
        # a cluster's bounds while in use, by (master name, whether of reads)
        self._by_master: dict[tuple[str, bool], _MasterBound] = {}
        self._closed = False
        self._streams: dict[Any, _Stream] = {}
        self._shared: dict[tuple[Any, ...], asyncio.Future[Any]] = {}  # read in flight
        self._sharers: dict[tuple[Any, ...], int] = {}  # calls waiting for it
        self._claims: dict[Any, float] = {}  # claim key -> loop time its gate opens
        self._ending: set[asyncio.Task[None]] = set()  # reads cancelled, not yet ended

    def _bound(self) -> asyncio.AbstractEventLoop:
        """The running loop, with this object's bounds and streams made for it."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._loop = loop
            self._commands = asyncio.Semaphore(self._sizes[0])
            self._reads = self._commands if self._share else asyncio.Semaphore(self._sizes[1])
            self._by_master = {}
            self._streams, self._shared, self._sharers, self._claims = {}, {}, {}, {}
            self._ending = set()
        return loop

    @property
    def closed(self) -> bool:
        """Whether ``close`` was called (then every call fails at once)."""
        return self._closed

    def _check_open(self) -> None:
        """Fail a call made after ``close``, as a call still parked at ``close`` fails: Kafka's
        coordinator answers COORDINATOR_NOT_AVAILABLE from ``shutdown()`` until ``startup()``
        (``GroupCoordinator.scala``, ``isActive``), and a closed one must neither read nor
        reconnect a client its owner may have closed since."""
        if self._closed:
            raise redis.exceptions.ConnectionError("the coordinator was closed")

    def commands(self) -> asyncio.Semaphore:
        """The bound of the commands of a single-node client (on a cluster, of those whose
        master the client does not know now; see ``places``)."""
        self._bound()
        return self._commands

    @contextlib.asynccontextmanager
    async def places(self, client: Any, keys: Sequence[Any]) -> AsyncIterator[None]:
        """Hold a place under the bound of each master the commands for ``keys`` go to, while
        they are sent; one bound on a single-node client. Per master, as its pool is, and as
        Kafka's clients bound their requests in flight per broker (``InFlightRequests.
        canSendMore(node)``, ``max.in.flight.requests.per.connection``): calls stuck on a
        stalled master hold only that master's places, and calls for groups on the others go
        on. Taken in name order, so two calls that each need several masters (a pipeline over
        partitions) never wait for each other."""
        self._bound()
        self._check_open()
        async with contextlib.AsyncExitStack() as held:
            for name in await _masters(client, keys):
                await held.enter_async_context(self._place(name))
            self._check_open()  # (closed while this call waited for a place)
            yield

    @contextlib.asynccontextmanager
    async def _place(self, name: str, reads: bool = False) -> AsyncIterator[None]:
        """A place under master ``name``'s bound of commands, or of blocking reads (``reads``);
        "" is a single-node client's (``commands()``, or the reads' own)."""
        reads = reads and not self._share
        if not name:
            async with self._reads if reads else self._commands:
                yield
            return
        bound = self._by_master.get((name, reads))
        if bound is None:
            bound = self._by_master[name, reads] = _MasterBound(self._sizes[reads])
        bound.users += 1
        try:
            async with bound.places:
                yield
        finally:
            bound.users -= 1
            if not bound.users and self._by_master.get((name, reads)) is bound:
                del self._by_master[name, reads]

    @contextlib.asynccontextmanager
    async def blocking_place(self, client: Any, key: Any) -> AsyncIterator[None]:
        """Hold a place for a command that blocks its connection for long (a commit's replica
        WAIT, up to its ack timeout), on the master of ``key``: under the bound of the blocking
        reads, not the commands', so the commands (a member's heartbeat) never wait for it.
        Within the commands' own when the pool cannot hold both (``_share``)."""
        self._bound()
        self._check_open()
        async with self._read_place(client, key):
            self._check_open()  # (closed while this call waited for a place)
            yield

    @contextlib.asynccontextmanager
    async def _read_place(self, client: Any, key: Any) -> AsyncIterator[None]:
        """A place under the read bound of the master that serves ``key``."""
        (name,) = await _masters(client, [key])
        async with self._place(name, reads=True):
            yield

    async def wait(self, client: Any, key: Any, after: Any, block_ms: int) -> bool:
        """Wait up to ``block_ms`` until ``key`` has an entry after ``after``: whether it has."""
        loop = self._bound()
        self._check_open()
        position = _stream_id(after)
        deadline = loop.time() + block_ms / 1000
        stream = self._streams.get(key)
        if stream is None:
            if len(self._streams) >= MAX_IDLE_STREAMS:
                self._drop_idle()
            stream = self._streams[key] = _Stream()
        # A read in flight that starts after this position would not see entries between the
        # two: look, without blocking. During the look that read may end and a later call
        # start another, also after this position, past an entry that came meanwhile: look
        # again whenever the read in flight is not the one looked past (the blocking side
        # remembers the newest entry instead, ``rcoord.wake``), until this call's deadline:
        # calls that keep ending that read and starting another would keep it looking.
        looked_past = None
        while (stream.reader is not None and stream.reader is not looked_past
               and position < stream.read_from):
            looked_past = stream.reader
            if await self._read(client, key, position, None) is not None:
                return True
            self._check_open()  # (closed during that look: it must not start a read)
            if loop.time() >= deadline:
                return False
            # During the look the read may have ended, its waiters left and ``_drop_idle``
            # forgotten the stream: parked on that object, this call would read alone,
            # uncounted and out of ``close()``'s reach. Wait on the stream this object knows
            # under ``key`` (the same one, made again, or one a later call made meanwhile).
            stream = self._streams.setdefault(key, stream)
        waiter: asyncio.Future[bool] = loop.create_future()
        stream.waiters[waiter] = (position, deadline)
        try:
            if stream.reader is None:
                self._start_read(client, key, stream)
            try:
                # (asyncio.timeout, not wait_for: on 3.11 wait_for loses a cancel that comes
                # as the waiter is resolved, gh-86296)
                async with asyncio.timeout(max(0.0, deadline - loop.time())):
                    return await asyncio.shield(waiter)
            except TimeoutError:
                return False
        finally:
            stream.waiters.pop(waiter, None)
            if waiter.done() and not waiter.cancelled():
                waiter.exception()  # (retrieved: an error handed to it as it was leaving)
            waiter.cancel()  # (no-op once resolved) so the reader never resolves it later
            if stream.reader is not None and all(w.done() for w in stream.waiters):
                # Nobody is left to wait for the read in flight (they were woken, timed out or
                # were cancelled): end it rather than let it hold its place and its connection
                # until the deadline of a waiter that is gone. Kept until it has ended, for
                # ``close()``: on 3.11 the cancel can be lost in redis-py (gh-86296).
                self._end(stream.reader)
                stream.reader = None

    async def read(self, client: Any, command: tuple[Any, ...]) -> Any:
        """Send ``command`` (a read), unless the same command is in flight for another call:
        then share that call's reply (or error). When a deadline falls due, every call parked
        on the group wakes and asks whether it is due; this makes it one question per
        coordinator, as ``rcoord.wake.SharedWakeReads.read`` does for threads. A caller that
        shares holds no place under the commands' bound."""
        loop = self._bound()
        self._check_open()
        task = asyncio.current_task()
        # (Counted from here: a task that once caught a cancellation without ``uncancel()``
        # keeps a count above 0, and its call failed with CancelledError when a sender it
        # shared with was cancelled.)
        cancels = task.cancelling() if task is not None else 0
        while (call := self._shared.get(command)) is not None:
            self._sharers[command] = self._sharers.get(command, 0) + 1
            try:
                return await asyncio.shield(call)
            except asyncio.CancelledError:
                if not call.cancelled() or (task is not None and task.cancelling() > cancels):
                    raise  # this caller was cancelled
                # The sending call was cancelled (its caller's affair): read again, or share.
            finally:
                left = self._sharers.pop(command) - 1
                if left:
                    self._sharers[command] = left
        call = self._shared[command] = loop.create_future()
        try:
            async with self.places(client, command[1:2]):
                value = await client.execute_command(*command)
        except Exception as exc:
            call.set_exception(exc)
            call.exception()  # (retrieved: nobody may have shared it)
            raise
        except BaseException:
            call.cancel()
            raise
        else:
            call.set_result(value)
            return value
        finally:
            if self._shared.get(command) is call:
                del self._shared[command]

    async def claim(self, client: Any, key: Any, px_ms: int) -> bool:
        """``SET key NX PX px_ms``: whether this call won the claim. Only one call of the
        coordinator asks per ``px_ms``: the others are told no at once, which is what the
        server would answer them while the claim holds (``rcoord.wake``, the same rule)."""
        now = self._bound().time()  # (first: a new loop gets a new set of gates)
        self._check_open()
        if not open_claim_gate(self._claims, key, now, px_ms):
            return False
        async with self.places(client, [key]):
            return bool(await client.set(key, b"1", nx=True, px=px_ms))

    def sharing(self, command: tuple[Any, ...]) -> int:
        """How many calls wait for the reply of ``command`` in flight (for tests)."""
        return self._sharers.get(command, 0)

    def waiting(self, key: Any) -> int:
        """How many calls wait on ``key`` now (for tests and debugging)."""
        stream = self._streams.get(key)
        return 0 if stream is None else len(stream.waiters)

    def reading(self) -> int:
        """How many reads are in flight now, on any stream (for tests and debugging)."""
        return sum(1 for stream in self._streams.values() if stream.reader is not None)

    async def close(self) -> None:
        """End every read in flight, and every read its waiters left that has not ended yet
        (cancelled, and waited for); a call still waiting on one fails with ``ConnectionError``
        (it would otherwise read again once its wait ended), and so does every later call of
        this object, at once: a call that was between two reads
        (in its due check, ``await_reply``, or the look that precedes a read) would otherwise
        start a reader, and reconnect a client closed after this."""
        self._closed = True
        if self._loop is not asyncio.get_running_loop():
            self._streams, self._ending = {}, set()  # (another loop's reads ended with it)
            return
        readers = list(self._ending)
        for stream in self._streams.values():
            if stream.reader is not None:
                readers.append(stream.reader)
                stream.reader = None
            for waiter in stream.waiters:
                if not waiter.done():
                    waiter.set_exception(
                        redis.exceptions.ConnectionError("the coordinator was closed"))
        await cancel_and_wait(readers)  # (a cancel() alone can be lost on 3.11)

    def _end(self, reader: asyncio.Task[None]) -> None:
        """Cancel ``reader``, and hold it until it has ended, for ``close()`` to wait for."""
        reader.cancel()
        if not reader.done():
            self._ending.add(reader)
            reader.add_done_callback(self._ending.discard)

    def _start_read(self, client: Any, key: Any, stream: _Stream) -> None:
        waiting = [pd for w, pd in stream.waiters.items() if not w.done()]
        start = min(position for position, _ in waiting)
        until = max(deadline for _, deadline in waiting)
        stream.read_from = start
        stream.reader = asyncio.ensure_future(self._read_for(client, key, stream, start, until))

    async def _read_for(self, client: Any, key: Any, stream: _Stream, start: tuple[int, int],
                        until: float) -> None:
        """One blocking read from ``start`` for the waiters, until the latest one's deadline;
        then wake those the stream has passed, and start the next read for those still waiting.
        A failed read fails one waiter, the oldest (as a failed read of the blocking
        coordinator fails the one thread that made it), and the others read again: an error
        that lasts reaches each of them in turn, one per read, each within its own deadline."""
        me = asyncio.current_task()
        try:
            newest = await self._read(client, key, start, until)
        except Exception as exc:  # noqa: BLE001 - the waiter's flow decides, as with its own read
            if stream.reader is not me:
                return  # (ended meanwhile: its waiters left, or close())
            stream.reader = None
            oldest = next((w for w in stream.waiters if not w.done()), None)
            if oldest is not None:
                oldest.set_exception(exc)
        except BaseException:
            if stream.reader is me:
                stream.reader = None  # cancelled (the loop is closing): the waiters time out
            raise
        else:
            if stream.reader is not me:
                return
            stream.reader = None
            for waiter, (position, _) in stream.waiters.items():
                if newest is not None and position < newest and not waiter.done():
                    waiter.set_result(True)
        if any(not w.done() for w in stream.waiters):
            self._start_read(client, key, stream)

    async def _read(self, client: Any, key: Any, start: tuple[int, int],
                    until: float | None) -> tuple[int, int] | None:
        """The newest entry after ``start``, waiting until ``until`` (loop time; None: not at
        all: a short command, under its master's bound; else under its master's read bound),
        counted once a place is free."""
        async with (self._read_place(client, key) if until is not None
                    else self.places(client, [key])):
            block_ms = None
            if until is not None:
                block_ms = max(1, int((until - asyncio.get_running_loop().time()) * 1000))
            reply = await client.xread({key: _text(start)}, count=WAKE_READ_COUNT, block=block_ms)
        return _newest(reply)

    def _drop_idle(self) -> None:
        for key in [k for k, st in self._streams.items() if st.reader is None and not st.waiters]:
            del self._streams[key]

