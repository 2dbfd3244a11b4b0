"""The I/O a protocol flow asks for, and the two drivers that perform it.

Every protocol step, the settling of the namespace settings and the wait of a parked call are
written once, as sans-I/O generators (httpx's auth flows are the model): a flow yields one of
the operations below and is sent back its result, or has the error thrown into it. The
blocking ``GroupCoordinator`` runs flows with ``drive`` and the asyncio one with ``adrive``;
nothing else differs between them, so they cannot drift apart.

The operations are few on purpose (a library function, a command, a pipeline, a blocking stream read),
so a driver is a dozen lines and each flow reads as the protocol it implements.

A caller may give up a parked call (``abandon_parked_when``): before each blocking stream read
(``XRead``, which only the wait of a parked JoinGroup/SyncGroup asks for, each at most
``rcoord.protocol.park.MAX_BLOCK_MS``) both drivers check the caller's event and, once it is set,
throw ``ParkAbandonedError`` into the flow instead of waiting. So a closing worker stops waiting
within one such read, whatever the rebalance timeout, without sending anything: a static member
must not leave (KIP-345), and the server needs nothing from it, since the parked member stays as
it is and its unread reply is pruned. It is a context (``contextvars``), not a parameter, so the
coordinators' public methods keep the one signature of their step (``tests/test_steps.py``), and
a coordinator that does not run flows (a test's fake) simply never looks at it.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
from collections.abc import Coroutine, Generator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import redis.exceptions

from .errors import ParkAbandonedError

__all__ = [
    "UNREACHABLE",
    "Claim",
    "Command",
    "Flow",
    "MasterOf",
    "Pipeline",
    "Script",
    "ScriptBatch",
    "SharedRead",
    "Unbroken",
    "WaitReplicas",
    "Woken",
    "XRead",
    "abandon_parked_when",
    "adrive",
    "drive",
]

R = TypeVar("R")


@dataclass(frozen=True)
class Script:
    """Call one function of the rcoord library by step name (``rcoord.scripts``) with FCALL;
    the library is loaded, and the call sent again, if the server answers it is missing.

    Sent back: the reply. An error reply is thrown into the flow.
    """

    name: str
    keys: Sequence[Any]
    args: Sequence[Any]


@dataclass(frozen=True)
class ScriptBatch:
    """Call one function many times in one round trip (a non-transactional pipeline of FCALL).

    Sent back: the replies in order; a call that failed (the library missing after a restart,
    say) is run again once on its own (loading the library if needed), and if that fails too
    its exception takes its place.
    """

    name: str
    calls: Sequence[tuple[Sequence[Any], Sequence[Any]]]  # (keys, args) per call


@dataclass(frozen=True)
class Command:
    """One Redis command, e.g. ``Command(("HGETALL", key))``. Sent back: the parsed reply."""

    args: tuple[Any, ...]


@dataclass(frozen=True)
class SharedRead:
    """A read-only command whose reply the threads of one process may share: a driver may
    answer a thread that asks while the same command is in flight with that call's reply
    (``rcoord.wake``). Sent back: the parsed reply."""

    args: tuple[Any, ...]


@dataclass(frozen=True)
class Claim:
    """``SET key 1 NX PX px_ms``: try to hold a short claim. Sent back: whether this caller
    holds it; a driver may answer no without asking while another thread of its process
    holds the claim (``rcoord.wake``)."""

    key: Any
    px_ms: int


@dataclass(frozen=True)
class Pipeline:
    """Commands sent in one round trip (not a transaction). Sent back: the replies in order."""

    commands: Sequence[tuple[Any, ...]]


@dataclass(frozen=True)
class XRead:
    """Block up to ``block_ms`` on one stream after ``after``. Sent back: whether it moved,
    or, when ``slot`` (a hash and a field) is given and the driver read that field after the
    stream moved, ``Woken`` with its value; a driver may do that when one read serves many
    waiters (``rcoord.wake``)."""

    key: Any
    after: Any
    block_ms: int
    slot: tuple[Any, Any] | None = None


@dataclass(frozen=True)
class Woken:
    """An ``XRead`` that ended because the stream moved, with the ``slot`` field as read after
    the move (``stored``: None when the field was absent). Truthy, like True."""

    stored: bytes | None


@dataclass(frozen=True)
class WaitReplicas:
    """Wait until ``replicas`` replicas of the master holding ``key`` have every write made
    before this operation, or ``timeout_ms`` passed. Sent back: how many acknowledged.

    Redis's WAIT counts the writes of its own connection, so the driver writes ``key`` (an
    INCR) and sends WAIT on one connection to that master: the replication stream is ordered,
    so a replica that has this write has every earlier write of the master too. Sent back:
    ``(acknowledged, node)``, where node names the master that answered (``MasterOf``).
    """

    key: Any
    replicas: int
    timeout_ms: int


@dataclass(frozen=True)
class MasterOf:
    """Sent back: the name (``host:port``) of the master the client sends ``key`` to; "" on
    one node."""

    key: Any


@dataclass(frozen=True)
class Unbroken:
    """Run ``flow`` (a flow of its own) to its end even if the caller gives up meanwhile, for
    writes that must not be left half made: ``delete_groups`` deletes a group, then its Spark
    replay record in another slot, and a caller cancelled between the two left the record of
    a group that was gone. The asyncio driver runs it as a task of its own, shielded: a
    cancellation of the caller's task is raised once it has ended. Sent back: its value."""

    flow: Generator[Any, Any, Any]


_ABANDON: contextvars.ContextVar[threading.Event | None] = contextvars.ContextVar(
    "rcoord_abandon_parked", default=None)


@contextlib.contextmanager
def abandon_parked_when(event: threading.Event) -> Iterator[None]:
    """Within this block (in this thread, or this asyncio task), a parked JoinGroup/SyncGroup
    whose caller's ``event`` is set stops waiting and raises ``ParkAbandonedError``, at the
    latest one ``MAX_BLOCK_MS`` read after the event was set. The worker client wraps its joins
    in it with its closing event, so ``close()`` of a static member, which sends no LeaveGroup
    to answer the parked call, need not wait out the rebalance."""
    token = _ABANDON.set(event)
    try:
        yield
    finally:
        _ABANDON.reset(token)


def _abandoned(op: Op) -> ParkAbandonedError | None:
    """The error to throw instead of performing ``op``: a blocking read whose caller gave up."""
    if not isinstance(op, XRead):
        return None
    event = _ABANDON.get()
    if event is None or not event.is_set():
        return None
    return ParkAbandonedError(
        f"gave up waiting on {op.key!r}: the caller is closing (abandon_parked_when); the "
        "parked call stays on the server, and a static member keeps its place until its "
        "session times out")


def _master_name(client: Any, key: Any) -> str:
    if not hasattr(client, "get_node_from_key"):
        return ""
    return _node_name(client.get_node_from_key(key))


def _node_name(node: Any) -> str:
    """How a cluster node is named in a replica wait's answer (``host:port``)."""
    return f"{node.host}:{node.port}"


Op = (Script | ScriptBatch | Command | SharedRead | Claim | Pipeline | XRead | WaitReplicas
      | MasterOf | Unbroken)
Flow = Generator[Op, Any, R]


UNREACHABLE = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError,
               redis.exceptions.ClusterError, redis.exceptions.RedisClusterException)
"""Errors that say a call's master could not be reached (not what the call would answer)."""


def _failed_whole(client: Any, op: ScriptBatch, exc: Exception) -> list[Any]:
    """redis-py fails a cluster pipeline as a whole when one of its masters cannot be reached:
    each call is then sent again alone (below), so the calls for the healthy masters are
    answered and only the unreachable master's fail. On one node the error is everyone's."""
    if not hasattr(client, "get_node_from_key") or not isinstance(exc, UNREACHABLE):
        raise exc
    return [exc] * len(op.calls)


def _batch_sync(client: Any, scripts: Any, op: ScriptBatch) -> list[Any]:
    pipe = client.pipeline(transaction=False)
    for keys, args in op.calls:
        pipe.execute_command(*scripts.command(op.name, keys, args))
    try:
        replies = pipe.execute(raise_on_error=False)
    except Exception as exc:  # noqa: BLE001 - _failed_whole re-raises what is not a node's loss
        replies = _failed_whole(client, op, exc)
    out = []
    for (keys, args), reply in zip(op.calls, replies, strict=True):
        if isinstance(reply, Exception):
            try:
                reply = scripts.call(op.name, keys, args)
            except Exception as exc:  # noqa: BLE001 - handed to the flow, which decides
                reply = exc
        out.append(reply)
    return out


def _perform(client: Any, scripts: Any, op: Op, wake_reads: Any = None, calls: Any = None) -> Any:
    if isinstance(op, Script):
        return scripts.call(op.name, op.keys, op.args, calls)
    if isinstance(op, Command):
        return client.execute_command(*op.args)
    if isinstance(op, SharedRead):
        if wake_reads is not None:
            return wake_reads.read(client, op.args)
        return client.execute_command(*op.args)
    if isinstance(op, Claim):
        if wake_reads is not None:
            return wake_reads.claim(client, op.key, op.px_ms)
        return bool(client.set(op.key, b"1", nx=True, px=op.px_ms))
    if isinstance(op, Pipeline):
        pipe = client.pipeline(transaction=False)
        for command in op.commands:
            pipe.execute_command(*command)
        return pipe.execute()
    if isinstance(op, ScriptBatch):
        return _batch_sync(client, scripts, op)
    if isinstance(op, XRead):
        if wake_reads is not None:  # threads of one coordinator share the read (rcoord.wake)
            return wake_reads.wait(client, op.key, op.after, op.block_ms, op.slot)
        return bool(client.xread({op.key: op.after}, count=1, block=op.block_ms))
    if isinstance(op, MasterOf):
        return _master_name(client, op.key)
    if isinstance(op, WaitReplicas):
        target, name = client, ""
        if hasattr(client, "get_node_from_key"):  # a cluster: the key's master, directly,
            node = client.get_node_from_key(op.key)  # so INCR and WAIT share a connection
            target, name = client.get_redis_connection(node), _node_name(node)
        pipe = target.pipeline(transaction=False)
        pipe.execute_command("INCR", op.key)
        pipe.execute_command("WAIT", op.replicas, op.timeout_ms)
        return int(pipe.execute()[1]), name
    if isinstance(op, Unbroken):
        return drive(client, scripts, op.flow, wake_reads, calls)
    raise TypeError(f"not an operation: {op!r}")


def drive(client: Any, scripts: Any, flow: Flow[R], wake_reads: Any = None,
          calls: Any = None) -> R:
    """Run ``flow`` with a blocking redis-py client (``redis.Redis`` or ``RedisCluster``);
    ``wake_reads`` (``rcoord.wake.SharedWakeReads``) shares blocking stream reads between the
    threads of one coordinator, and ``calls`` (``rcoord.batching.SharedCalls``) sends their
    concurrent function calls together."""
    try:
        op = next(flow)
        while True:
            try:
                abandoned = _abandoned(op)
                if abandoned is not None:
                    raise abandoned
                result = _perform(client, scripts, op, wake_reads, calls)
            except Exception as exc:  # noqa: BLE001 - the flow decides what an error means
                op = flow.throw(exc)
            else:
                op = flow.send(result)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


async def _batch_async(client: Any, scripts: Any, op: ScriptBatch) -> list[Any]:
    pipe = client.pipeline(transaction=False)
    for keys, args in op.calls:
        pipe.execute_command(*scripts.command(op.name, keys, args))
    try:
        replies = await pipe.execute(raise_on_error=False)
    except Exception as exc:  # noqa: BLE001 - _failed_whole re-raises what is not a node's loss
        replies = _failed_whole(client, op, exc)
    out = []
    for (keys, args), reply in zip(op.calls, replies, strict=True):
        if isinstance(reply, Exception):
            try:
                reply = await scripts.acall(op.name, keys, args)
            except Exception as exc:  # noqa: BLE001 - handed to the flow, which decides
                reply = exc
        out.append(reply)
    return out


async def _aperform(client: Any, scripts: Any, op: Op, wake_reads: Any = None) -> Any:
    if isinstance(op, Unbroken):
        return await _unbroken(adrive(client, scripts, op.flow, wake_reads))
    if isinstance(op, XRead) and wake_reads is not None:
        # Calls of one coordinator share the read (rcoord.asyncio.wake), which has a bound of
        # its own: a waiter holds no place.
        return await wake_reads.wait(client, op.key, op.after, op.block_ms)
    if isinstance(op, SharedRead) and wake_reads is not None:
        return await wake_reads.read(client, op.args)  # (it takes a place only to send)
    if isinstance(op, Claim) and wake_reads is not None:
        return await wake_reads.claim(client, op.key, op.px_ms)
    if wake_reads is None:
        return await _aperform_one(client, scripts, op)
    if isinstance(op, WaitReplicas):
        # WAIT holds its connection up to its timeout, as a parked read does: under the
        # commands' bound it held a place a heartbeat needed, for the whole ack timeout.
        async with wake_reads.blocking_place(client, op.key):
            return await _aperform_one(client, scripts, op)
    # A place on each master it sends to (one bound on a single node): calls stuck on a stalled
    # master do not hold up those for the others.
    async with wake_reads.places(client, _routing_keys(op)):
        return await _aperform_one(client, scripts, op)


async def _unbroken(run: Coroutine[Any, Any, R]) -> R:
    """Await ``run`` in a task of its own that a cancellation of the caller does not reach
    (``Unbroken``); a cancellation that came meanwhile is raised once it has ended."""
    task = asyncio.ensure_future(run)
    interrupted = False
    while not task.done():
        try:
            await asyncio.wait({task})  # (cancelled, it leaves the task running)
        except asyncio.CancelledError:
            interrupted = True
    if interrupted:
        if not task.cancelled():
            task.exception()  # (retrieved: the caller is told of its cancellation)
        raise asyncio.CancelledError
    return task.result()


def _routing_keys(op: Op) -> list[Any]:
    """The keys that route the commands ``op`` sends: a cluster sends each command to its
    first key's master (a step's keys share one slot)."""
    if isinstance(op, Script):
        return list(op.keys[:1])
    if isinstance(op, ScriptBatch):
        return [keys[0] for keys, _ in op.calls if keys]
    if isinstance(op, Command | SharedRead):
        return list(op.args[1:2])
    if isinstance(op, Pipeline):
        return [command[1] for command in op.commands if len(command) > 1]
    if isinstance(op, Unbroken):
        return []  # (never asked: its flow's operations take their own places)
    return [op.key]  # Claim, XRead, WaitReplicas, MasterOf


async def _aperform_one(client: Any, scripts: Any, op: Op) -> Any:
    if isinstance(op, Script):
        return await scripts.acall(op.name, op.keys, op.args)
    if isinstance(op, Command | SharedRead):
        return await client.execute_command(*op.args)
    if isinstance(op, Claim):
        return bool(await client.set(op.key, b"1", nx=True, px=op.px_ms))
    if isinstance(op, Pipeline):
        pipe = client.pipeline(transaction=False)
        for command in op.commands:
            pipe.execute_command(*command)
        return await pipe.execute()
    if isinstance(op, ScriptBatch):
        return await _batch_async(client, scripts, op)
    if isinstance(op, XRead):
        return bool(await client.xread({op.key: op.after}, count=1, block=op.block_ms))
    if isinstance(op, MasterOf):
        if not hasattr(client, "get_node_from_key"):
            return ""
        from .asyncio.cluster import node_of_key

        node = await node_of_key(client, op.key)  # (a slot the map lost: read again)
        return _node_name(node)
    if isinstance(op, WaitReplicas):
        return await _await_replicas(client, op)
    raise TypeError(f"not an operation: {op!r}")


async def _await_replicas(client: Any, op: WaitReplicas) -> tuple[int, str]:
    if hasattr(client, "get_node_from_key"):  # redis.asyncio.RedisCluster: one node's pipeline
        from .asyncio.cluster import node_of_key

        node = await node_of_key(client, op.key)  # (as MasterOf looks it up)
        try:
            acked = await _node_wait(node, op)
        except redis.exceptions.ConnectionError as exc:
            # A pooled connection the server had closed (idle, killed): redis-py sends a
            # command again on a fresh one, but a node's execute_pipeline does not, and the
            # commit, stored, was reported lost. INCR and WAIT are safe to send again (WAIT
            # counts the new connection's INCR, which follows the commit on that master).
            if isinstance(exc, _NOT_STALE):
                raise
            await node.disconnect_free_connections()
            node = await node_of_key(client, op.key)
            acked = await _node_wait(node, op)
        return acked, _node_name(node)
    pipe = client.pipeline(transaction=False)
    pipe.execute_command("INCR", op.key)
    pipe.execute_command("WAIT", op.replicas, op.timeout_ms)
    return int((await pipe.execute())[1]), ""


_NOT_STALE = (redis.exceptions.MaxConnectionsError, redis.exceptions.AuthenticationError)
"""Connection errors a fresh connection would not mend (a full pool, a refused login)."""


async def _node_wait(node: Any, op: WaitReplicas) -> int:
    """INCR and WAIT on one connection of cluster node ``node``: how many replicas acked."""
    from redis.asyncio.cluster import PipelineCommand

    commands = [PipelineCommand(0, "INCR", op.key),
                PipelineCommand(1, "WAIT", op.replicas, op.timeout_ms)]
    await node.execute_pipeline(commands)
    for command in commands:
        if isinstance(command.result, Exception):
            raise command.result
    acked: Any = commands[1].result
    return int(acked)


def _raise_swallowed_cancel(task: asyncio.Task[Any] | None, cancels: int) -> None:
    """Raise the cancellation of ``task`` requested since it had ``cancels`` pending, if an
    operation swallowed it (``adrive``)."""
    if task is not None and task.cancelling() > cancels:
        raise asyncio.CancelledError


async def adrive(client: Any, scripts: Any, flow: Flow[R], wake_reads: Any = None) -> R:
    """Run ``flow`` with a ``redis.asyncio`` client: the same operations, awaited;
    ``wake_reads`` (``rcoord.asyncio.wake.AsyncWakeReads``) shares the parked calls' stream
    reads and bounds the commands in flight.

    A cancellation of the caller's task that an operation swallowed is raised once the
    operation returns: on Python 3.11 redis-py awaits each command's write with
    ``asyncio.wait_for``, which loses a cancellation that comes as the write completes
    (CPython gh-86296; ``rcoord.asyncio.cancel``). A caller's ``asyncio.timeout`` (or
    ``task.cancel()``) that came then was ignored, and a parked JoinGroup went on waiting for the
    whole rebalance, past the caller's deadline. The task's pending cancellations
    (``Task.cancelling()``) still count it, so the check needs no timing."""
    task = asyncio.current_task()
    cancels = task.cancelling() if task is not None else 0
    try:
        op = next(flow)
        while True:
            try:
                abandoned = _abandoned(op)
                if abandoned is not None:
                    raise abandoned
                result = await _aperform(client, scripts, op, wake_reads)
            except Exception as exc:  # noqa: BLE001 - the flow decides what an error means
                _raise_swallowed_cancel(task, cancels)
                op = flow.throw(exc)
            else:
                _raise_swallowed_cancel(task, cancels)
                op = flow.send(result)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
