"""GroupCoordinator: Kafka's classic group protocol, served from Redis by Lua scripts.

Phases of a rebalance, as Kafka runs them and as the scripts reproduce them:

1. **Join.** Members send JoinGroup. A new member is given an id (KIP-394: it must join again
   with it). The group moves to PreparingRebalance and parks each JoinGroup until every known
   member has rejoined, or the rebalance timeout passes (members that did not rejoin are
   dropped), or, for a group's first generation, the initial rebalance delay has passed
   without new arrivals.
2. **Generation.** The join phase completes: the generation id increments, a protocol is
   chosen by vote, and every parked JoinGroup is answered; the leader's answer lists the
   members and their metadata. The group is CompletingRebalance.
3. **Sync.** The leader sends the assignment in SyncGroup; followers' SyncGroups are parked
   until it arrives. The group is Stable.
4. **Liveness.** Heartbeats refresh each member's session deadline; a member whose deadline
   passes is removed and the group rebalances.

Every step is one script call (``lua/``), which first applies the group's passed deadlines,
so no step depends on a timer process having run. A parked call waits on the group's wake
stream (``XREAD BLOCK``) and collects its reply with ``await_reply``; while it waits it also
applies the deadlines it is waiting for.

Each request is defined once, as a flow in ``rcoord.steps``; this class is the blocking driver
of those flows and ``rcoord.asyncio.AsyncGroupCoordinator`` the asyncio one.

State transitions (see ``rcoord.state``): Empty -> PreparingRebalance -> CompletingRebalance
-> Stable, back to PreparingRebalance on any membership change, and Empty when the last member
leaves.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable, Sequence
from typing import Any, Concatenate, ParamSpec, TypeVar

from .batching import SharedCalls
from .config import CoordinatorConfig
from .errors import translate_redis_errors
from .flow import Flow, drive
from .keys import GroupKeys, settings_key
from .scripts import Scripts
from .steps import (
    DUE_BATCH,
    HEARTBEAT_BATCH,
    KEYS_CACHE_SIZE,
    MAX_DUE_RETRIES,
    NOT_COORDINATOR_RETRIES,
    GroupSteps,
    config_arg,
    present_as,
)
from .wake import SharedWakeReads

__all__ = ["GroupCoordinator", "blocking_step", "group_incarnation"]
# Re-exported for callers that tuned or read them here before the steps had their own module.
__all__ += ["DUE_BATCH", "HEARTBEAT_BATCH", "KEYS_CACHE_SIZE", "MAX_DUE_RETRIES",
            "NOT_COORDINATOR_RETRIES"]

P = ParamSpec("P")
R = TypeVar("R")


def blocking_step(
    step: Callable[Concatenate[GroupSteps, P], Flow[R]],
) -> Callable[Concatenate[GroupCoordinator, P], R]:
    """A public method of ``GroupCoordinator`` that runs ``step``'s flow to its end.

    The method has the step's signature and docstring, so the two coordinators cannot differ.
    """

    def method(self: GroupCoordinator, /, *args: P.args, **kwargs: P.kwargs) -> R:
        self._started()
        return self._run(step(self._steps, *args, **kwargs))

    present_as(method, step)
    return translate_redis_errors(method)


class GroupCoordinator:
    """The server side of Kafka's classic group protocol, one method per request.

    ``redis_client`` is a ``redis.Redis`` or ``redis.RedisCluster`` created with
    ``decode_responses=False``. ``config`` writes the settings it names to the namespace in
    Redis (see ``CoordinatorConfig``); without one (or with just a namespace name), the stored
    settings (or Kafka's defaults) apply. The settings, the partition count above all, are one agreed fact of the namespace
    (``rcoord.settings``): a call made with a stale count is refused by the script and this
    class settles again and retries by itself; a process that named settings writes them again
    if they were lost. ``clock`` (a callable returning milliseconds) replaces Redis ``TIME`` in
    every script; it exists for deterministic tests, like Kafka's MockTime.

    Nothing touches Redis until ``start()`` or the first request.
    """

    def __init__(
        self,
        redis_client: Any,
        config: CoordinatorConfig | str | None = None,
        *,
        clock: Callable[[], int] | None = None,
    ) -> None:
        self._redis = redis_client
        self._scripts = Scripts(redis_client)
        if self._scripts.is_async:
            raise TypeError("GroupCoordinator needs a blocking client (redis.Redis or "
                            "redis.RedisCluster); with a redis.asyncio client use "
                            "rcoord.asyncio.AsyncGroupCoordinator")
        given = config_arg(config)
        self._steps = GroupSteps(given, config if isinstance(config, str) else "rcoord", clock)
        self._lock = threading.Lock()
        self._wake_reads = SharedWakeReads()
        self._calls = SharedCalls()

    def _run(self, flow: Flow[R]) -> R:
        return drive(self._redis, self._scripts, flow, self._wake_reads, self._calls)

    # -- lifecycle ---------------------------------------------------------------------------

    @translate_redis_errors
    def start(self) -> GroupCoordinator:
        """Load the scripts and settle the namespace settings. Idempotent."""
        with self._lock:
            if self._steps.config is None:
                self._steps.prepare(self._redis, "GroupCoordinator")
                self._scripts.load()
                self._run(self._steps.settle())
        return self

    @translate_redis_errors
    def resettle(self, *, write_named: bool = True) -> CoordinatorConfig:
        """Read (or re-establish) the namespace settings now; what the coordinator service does
        when it sees the settings changed or lost. (A NOT_COORDINATOR settles by itself, and
        writes the named settings only if the settings were lost: ``GroupSteps.resettle``.)
        ``write_named=False`` adopts the stored values rather than writing the named ones
        (another process changed them; see ``rcoord.settings``)."""
        self._started()
        with self._lock:
            return self._run(self._steps.settle(write_named))

    def close(self) -> None:
        """Nothing to end: the blocking coordinator's wake-stream reads are made by its parked
        threads themselves (``rcoord.wake``), so none outlives its call. The counterpart of
        ``AsyncGroupCoordinator.close``, whose reads are tasks of their own; the client stays
        the caller's to close."""

    @property
    def config(self) -> CoordinatorConfig:
        """The settings in force (after ``start()``)."""
        return self._started()

    @property
    def settings_version(self) -> int:
        """The version of the namespace settings this coordinator last settled."""
        return self._steps.settings_version

    @property
    def settings_origin(self) -> str | None:
        """The establishment of the namespace settings this coordinator last settled
        (``rcoord.settings.ORIGIN``): another one means they were lost and established again."""
        return self._steps.settings_origin

    def _started(self) -> CoordinatorConfig:
        if self._steps.config is None:
            self.start()
        return self._steps.settled()

    def partition_for(self, group_id: str) -> int:
        """The coordinator partition of ``group_id`` (Kafka's __consumer_offsets partition)."""
        self._started()
        return self._steps.partition_for(group_id)

    # -- for tests and benchmarks that drive single scripts ------------------------------------

    def _keys(self, group_id: str) -> GroupKeys:
        self._started()
        return self._steps.keys(group_id)

    def _now_arg(self) -> str:
        return self._steps.now_arg()

    def _call(self, step: str, keys: GroupKeys, args: Sequence[Any]) -> Any:
        return self._run(self._steps.call(step, keys, args))

    # -- the protocol (each a flow of rcoord.steps) --------------------------------------------

    join_group = blocking_step(GroupSteps.join_group)
    sync_group = blocking_step(GroupSteps.sync_group)
    heartbeat = blocking_step(GroupSteps.heartbeat)
    heartbeat_many = blocking_step(GroupSteps.heartbeat_many)
    leave_group = blocking_step(GroupSteps.leave_group)
    commit_offsets = blocking_step(GroupSteps.commit_offsets)
    fetch_offsets = blocking_step(GroupSteps.fetch_offsets)
    describe_group = blocking_step(GroupSteps.describe_group)
    list_groups = blocking_step(GroupSteps.list_groups)
    delete_groups = blocking_step(GroupSteps.delete_groups)
    delete_offsets = blocking_step(GroupSteps.delete_offsets)
    run_timers = blocking_step(GroupSteps.run_timers)


def group_incarnation(redis_client: Any, namespace: str, group_id: str) -> tuple[str, int] | None:
    """The incarnation token of ``group_id`` (``GroupDescription.incarnation``) and its
    generation now; None if the group or the namespace's settings are not there.

    For a process that keeps state per group outside Redis (a job's output) and must tell the
    group it wrote for from one deleted and made again, whose generations start over: one read
    of the group record, writing nothing (``describe_group`` needs a started coordinator, whose
    start may write the settings, and applies the group's passed deadlines). ``redis_client``
    is a blocking client, as ``GroupCoordinator`` takes."""
    count = redis_client.hget(settings_key(namespace), "num_partitions")
    if inspect.isawaitable(count):
        # An asyncio client failed later with int()'s message about a coroutine, and left
        # that coroutine never awaited (a warning at its collection).
        count.close()  # type: ignore[attr-defined]
        raise TypeError("group_incarnation takes a blocking redis client (redis.Redis or "
                        "redis.RedisCluster), as GroupCoordinator does; it was given "
                        f"{type(redis_client).__module__}.{type(redis_client).__name__}")
    if count is None:
        return None
    record = GroupKeys.of(namespace, int(count), group_id).group
    inc, created, gen = redis_client.hmget(record, ["inc", "created", "gen"])
    token = inc if inc is not None else created  # (a record an older rcoord made: no 'inc')
    if token is None:
        return None
    return (token.decode() if isinstance(token, bytes) else str(token)), int(gen or 0)
