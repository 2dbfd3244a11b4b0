"""AsyncGroupCoordinator: the group protocol for asyncio programs (``redis.asyncio`` clients).

The asyncio driver of the flows in ``rcoord.steps``, as ``rcoord.GroupCoordinator`` is the
blocking one: the same requests, checks, scripts, parked-call wait and settling of the namespace
settings, with the I/O awaited (``rcoord.flow.adrive``). Its public methods are generated from
the same flows, so the two classes have the same methods with the same signatures.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any, Concatenate, ParamSpec, TypeVar

import redis.exceptions

from ..config import CoordinatorConfig
from ..errors import reraise_as_rcoord
from ..flow import Flow, adrive
from ..scripts import LoopLock, Scripts
from ..steps import GroupSteps, config_arg, present_as
from .cluster import learn_slots
from .wake import AsyncWakeReads, command_limit, pool_size

__all__ = ["AsyncGroupCoordinator", "asyncio_step"]

P = ParamSpec("P")
R = TypeVar("R")


async def _translated(name: str, call: Coroutine[Any, Any, R]) -> R:
    """The asyncio twin of ``errors.translate_redis_errors``: the one exception boundary."""
    try:
        return await call
    except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException) as exc:
        reraise_as_rcoord(name, exc)
        raise


def asyncio_step(
    step: Callable[Concatenate[GroupSteps, P], Flow[R]],
) -> Callable[Concatenate[AsyncGroupCoordinator, P], Coroutine[Any, Any, R]]:
    """A public method of ``AsyncGroupCoordinator`` that runs ``step``'s flow, awaited."""

    async def method(self: AsyncGroupCoordinator, /, *args: P.args, **kwargs: P.kwargs) -> R:
        await self._started()
        return await _translated(step.__name__, self._run(step(self._steps, *args, **kwargs)))

    present_as(method, step)
    return method


class AsyncGroupCoordinator:
    """``await coord.join_group(...)`` and friends; see ``rcoord.GroupCoordinator``.

    ``redis_client`` is a ``redis.asyncio.Redis`` or ``redis.asyncio.RedisCluster`` created
    with ``decode_responses=False``. ``config`` is a ``CoordinatorConfig`` (its named settings
    are written to the namespace, as with the blocking coordinator) or just a namespace name
    (``namespace=`` is still accepted, as before the two coordinators shared a constructor).
    Nothing touches Redis until ``await start()`` or the first call.
    """

    def __init__(self, redis_client: Any, config: CoordinatorConfig | str | None = None, *,
                 clock: Callable[[], int] | None = None, namespace: str | None = None) -> None:
        self._redis = redis_client
        self._scripts = Scripts(redis_client)
        if not self._scripts.is_async:
            raise TypeError("AsyncGroupCoordinator needs a redis.asyncio client (Redis or "
                            "RedisCluster); with a blocking client use rcoord.GroupCoordinator")
        given = config_arg(config)
        if namespace is not None and config is not None:
            raise TypeError("give the namespace either as config or as namespace=, not both")
        if namespace is not None and not isinstance(namespace, str):
            # (as config_arg refuses one given as config; before, only start() refused it)
            raise TypeError(f"namespace must be a str, got {type(namespace).__name__} "
                            f"{namespace!r:.60}")
        # (An empty name is refused as the blocking coordinator refuses it, not the default.)
        namespace = config if isinstance(config, str) else (
            "rcoord" if namespace is None else namespace)
        self._steps = GroupSteps(given, namespace, clock)
        self._lock = LoopLock()  # (an asyncio.Lock binds to a loop: this loop's lock)
        self._wake_reads = AsyncWakeReads(command_limit(redis_client), pool_size(redis_client))

    async def _run(self, flow: Flow[R]) -> R:
        return await adrive(self._redis, self._scripts, flow, self._wake_reads)

    async def start(self) -> AsyncGroupCoordinator:
        """Load the scripts and settle the namespace settings. Idempotent. After ``close()``,
        opens the coordinator again, as Kafka's ``GroupCoordinator.startup()`` serves again
        after ``shutdown()``: calls made from then on are served, while those still running
        from before ``close()`` go on failing."""
        if self._wake_reads.closed:
            self._wake_reads = AsyncWakeReads(command_limit(self._redis), pool_size(self._redis))
        return await self._started()

    async def _started(self) -> AsyncGroupCoordinator:
        """``start()`` without reopening: what each call does first."""
        if self._steps.config is not None:
            return self
        async with self._lock.lock():
            if self._steps.config is None:
                self._steps.prepare(self._redis, "AsyncGroupCoordinator")
                learn_slots(self._redis)
                self._scripts.load()
                await _translated("start", self._run(self._steps.settle()))
        return self

    async def resettle(self, *, write_named: bool = True) -> CoordinatorConfig:
        """Read (or re-establish) the namespace settings. (A NOT_COORDINATOR settles by
        itself, and writes the named settings only if the settings were lost:
        ``GroupSteps.resettle``.)
        ``write_named=False`` adopts the stored values rather than writing the named ones
        (another process changed them; see ``rcoord.settings``)."""
        await self._started()
        async with self._lock.lock():
            return await _translated("resettle", self._run(self._steps.settle(write_named)))

    async def close(self) -> None:
        """End the coordinator's wake-stream reads: the reader tasks its parked calls share
        (``rcoord.asyncio.wake``) are cancelled and waited for, so none is left to read (or to
        reconnect a client closed after this); a call still parked fails with
        ``ConnectionLost``, also one that was between two reads, and so does every call made
        afterwards, at once, until ``start()`` opens it again (Kafka's coordinator answers
        COORDINATOR_NOT_AVAILABLE between ``shutdown()`` and ``startup()``). Call it before
        closing the client (or before the loop ends). The client stays the caller's to close."""
        await self._wake_reads.close()

    @property
    def config(self) -> CoordinatorConfig:
        """The settings in force (after ``await start()``)."""
        return self._steps.settled()

    @property
    def settings_version(self) -> int:
        """The version of the namespace settings this coordinator last settled."""
        return self._steps.settings_version

    @property
    def settings_origin(self) -> str | None:
        """The establishment of the namespace settings this coordinator last settled
        (``rcoord.settings.ORIGIN``): another one means they were lost and established again."""
        return self._steps.settings_origin

    def partition_for(self, group_id: str) -> int:
        """The coordinator partition of ``group_id`` (after ``await start()``)."""
        return self._steps.partition_for(group_id)

    # -- the protocol (each a flow of rcoord.steps) --------------------------------------------

    join_group = asyncio_step(GroupSteps.join_group)
    sync_group = asyncio_step(GroupSteps.sync_group)
    heartbeat = asyncio_step(GroupSteps.heartbeat)
    heartbeat_many = asyncio_step(GroupSteps.heartbeat_many)
    leave_group = asyncio_step(GroupSteps.leave_group)
    commit_offsets = asyncio_step(GroupSteps.commit_offsets)
    fetch_offsets = asyncio_step(GroupSteps.fetch_offsets)
    describe_group = asyncio_step(GroupSteps.describe_group)
    list_groups = asyncio_step(GroupSteps.list_groups)
    delete_groups = asyncio_step(GroupSteps.delete_groups)
    delete_offsets = asyncio_step(GroupSteps.delete_offsets)
    run_timers = asyncio_step(GroupSteps.run_timers)
