"""Every request of Kafka's classic group protocol, defined once, as a flow.

``GroupSteps`` holds what a coordinator knows (the settled namespace settings, its clock, a
cache of key layouts) and defines each request as a sans-I/O flow (``rcoord.flow``): the
request's checks and encoding, the script it runs, the wait of a parked call, the retry after
a stale layout, and the decoding of the reply. ``GroupCoordinator`` (blocking) and
``AsyncGroupCoordinator`` (asyncio) are thin drivers over these flows: their public methods
are generated from them (``blocking_step`` / ``asyncio_step``), so both have the same methods
with the same signatures and the same behaviour, and a fix made here reaches both.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import redis.exceptions

from .config import CoordinatorConfig
from .contract import reply_field
from .errors import (
    AuthenticationFailedError,
    ConfigError,
    ConnectionLost,
    CoordinatorNotAvailableError,
    Errors,
    InvalidRequestError,
    RcoordError,
    reraise_as_rcoord,
)
from .flow import (
    UNREACHABLE,
    Claim,
    Command,
    Flow,
    MasterOf,
    Pipeline,
    Script,
    ScriptBatch,
    SharedRead,
    Unbroken,
    WaitReplicas,
    Woken,
    XRead,
)
from .keys import GroupKeys, PartitionKeys, replays_key, settings_key
from .partitioning import partition_for
from .protocol._checks import NO_MEMBER_ID, check_id, check_instance_id, member_ref, require_int32
from .protocol.admin import (
    DESCRIBE_PAGE,
    DESCRIBE_RESTARTS,
    GroupDescription,
    GroupListing,
    OffsetDeleteResult,
    decode_description_page,
    group_ids_arg,
    states_filter,
)
from .protocol.heartbeat import decode_heartbeat, heartbeat_args
from .protocol.join import JoinGroupResult, JoinRequest
from .protocol.leave import LeaveGroupResult, MemberIdentity, decode_leave, leave_args
from .protocol.offsets import (
    OffsetAndMetadata,
    OffsetFetchResult,
    TopicPartition,
    decode_fetch,
    encode_commit,
    fetch_batches,
    partitions_args,
    retention_arg,
)
from .protocol.park import (
    CLAIM_MS,
    MAX_BLOCK_MS,
    ClaimDeadline,
    ReadDeadline,
    ReadReply,
    WaitWake,
    park_flow,
)
from .protocol.sync import SyncGroupResult, SyncRequest
from .settings import ORIGIN, settle_flow

__all__ = [
    "DUE_BATCH",
    "HEARTBEAT_BATCH",
    "KEYS_CACHE_SIZE",
    "MAX_DUE_RETRIES",
    "NOT_COORDINATOR_RETRIES",
    "PUBLIC_STEPS",
    "GroupSteps",
    "block_limit",
    "config_arg",
    "present_as",
    "socket_timeout_ms",
]

DUE_BATCH = 1000
"""Groups read from a partition's due index per call of ``run_timers``."""
KEYS_CACHE_SIZE = 10_000
"""Key layouts remembered; the cache is emptied when full (layouts are cheap to rebuild)."""
MAX_DUE_RETRIES = 5
"""Heartbeats retried after a deadline sweep that applied nothing, before a retriable answer."""
FETCH_PAGE = 500
"""Offsets a fetch of all a group's offsets reads per script call (about: HSCAN's COUNT)."""
FETCH_RESTARTS = 5
"""Times a fetch of all a group's offsets starts again because its pages came from another
server process (``fetch_offsets``) before it answers COORDINATOR_NOT_AVAILABLE."""
MAX_BUSY_CALLS = 10_000
"""Most calls of one group step answered BUSY before giving up (each applied up to
``due_per_call`` deadlines or wrote one chunk: far more than any group needs)."""
MAX_DUE_CALLS = 1_000
"""Most heartbeat attempts in all, counting those after sweeps that made progress."""
HEARTBEAT_BATCH = 500
"""Most members of one group in one heartbeat script call (a script blocks its shard)."""
NOT_COORDINATOR_RETRIES = 3
"""Settle-and-retry rounds when a script says the caller's layout is not the namespace's."""
_NOT_COORDINATOR = "RCOORD_NOT_COORDINATOR"
_NOT_ACKNOWLEDGED = (
    redis.exceptions.MovedError, redis.exceptions.AskError, redis.exceptions.TryAgainError,
    redis.exceptions.ReadOnlyError, redis.exceptions.ClusterDownError,
)
"""Answers to the replica wait that mean "not now", not "never": anything else (a missing ACL
permission, a proxy without WAIT) is raised, so a misconfiguration is not retried for ever."""

PUBLIC_STEPS = (
    "join_group", "sync_group", "heartbeat", "heartbeat_many", "leave_group", "commit_offsets",
    "fetch_offsets", "describe_group", "list_groups", "delete_groups", "delete_offsets",
    "run_timers",
)
"""The requests both coordinators serve, each from the flow of the same name."""

log = logging.getLogger("rcoord.settings")


def socket_timeout_ms(client: Any) -> int | None:
    """The client's socket timeout in ms (None: it waits for ever)."""
    kwargs: dict[str, Any] = {}
    if hasattr(client, "connection_pool"):
        kwargs = client.connection_pool.connection_kwargs
    elif hasattr(client, "nodes_manager"):
        kwargs = client.nodes_manager.connection_kwargs
    elif hasattr(client, "connection_kwargs"):  # redis.asyncio.RedisCluster
        kwargs = client.connection_kwargs
    timeout = kwargs.get("socket_timeout")
    return int(timeout * 1000) if timeout else None


def block_limit(client: Any) -> int:
    """A parked call's XREAD must return before the client's socket timeout fires."""
    timeout = socket_timeout_ms(client)
    if not timeout:
        return MAX_BLOCK_MS
    return max(1, min(MAX_BLOCK_MS, timeout // 2))


def _busy(reply: Any) -> bool:
    """Whether a group step's reply is BUSY (``{'B'}``: call again)."""
    return isinstance(reply, list) and len(reply) == 1 and reply[0] == b"B"


def config_arg(config: object) -> CoordinatorConfig | None:
    """A coordinator's ``config`` argument as the config it names (None: a namespace name, or
    nothing). Any other type is refused: a namespace given as bytes (or a dict of settings)
    used to be taken as no namespace at all, so the coordinator served the default "rcoord"
    namespace, another deployment's groups, without a word."""
    if config is None or isinstance(config, str):
        return None
    if isinstance(config, CoordinatorConfig):
        return config
    raise TypeError("config must be a CoordinatorConfig or a namespace name (str), "
                    f"got {type(config).__name__} {config!r:.60}")


def present_as(method: Callable[..., Any], step: Callable[..., Any]) -> None:
    """Give a driver's ``method`` the name, docstring and signature of ``step``, with the
    result the caller gets (``R``, not ``Flow[R]``), so ``help()`` and ``inspect`` show it."""
    functools.update_wrapper(method, step)
    sig = inspect.signature(step)
    ret = sig.return_annotation
    if isinstance(ret, str) and ret.startswith("Flow[") and ret.endswith("]"):
        ret = ret[len("Flow["):-1]
    method.__signature__ = sig.replace(return_annotation=ret)  # type: ignore[attr-defined]


def _unavailable(exc: BaseException) -> bool:
    """Whether the public API raises ``exc`` as a ``ConnectionLost`` (a ``ServerUnavailable``
    among them): the call's master is unreachable or refuses it for now, and a retry may pass
    (``rcoord.errors.reraise_as_rcoord``, the one mapping); or as ``AuthenticationFailedError``:
    that master refuses the login (a password rotated one master at a time), which the batched
    path's ``flow.UNREACHABLE`` answers COORDINATOR_NOT_AVAILABLE for its groups alone too."""
    try:
        reraise_as_rcoord("", exc)
    except (ConnectionLost, AuthenticationFailedError):
        return True
    except RcoordError:
        return False
    return False


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


class GroupSteps:
    """A coordinator's state, and one flow per request (see the module docstring).

    ``given`` is the config the coordinator was constructed with (its named settings are
    written to the namespace); ``clock`` replaces Redis ``TIME`` in every script (tests).
    """

    def __init__(self, given: CoordinatorConfig | None, namespace: str,
                 clock: Callable[[], int] | None) -> None:
        self.given = given
        self.namespace = given.namespace if given is not None else namespace
        self.clock = clock
        self.config: CoordinatorConfig | None = None
        self.settings_version = 0
        self.settings_origin: str | None = None
        self.max_block_ms = MAX_BLOCK_MS
        self.socket_timeout_ms: int | None = None
        """The client's socket timeout (a blocking wait must end before it)."""
        self._keys_cache: dict[str, GroupKeys] = {}
        self._overridden: dict[str, object] = {}
        """Named settings reported not in force (name -> the value in force when reported)."""

    # -- state -----------------------------------------------------------------------------

    def prepare(self, client: Any, driver: str) -> None:
        """What a driver's ``start()`` learns from its client before the first call: that it
        returns bytes (replies carry binary metadata) and how long a blocking wait may last."""
        encoder = client.get_encoder() if hasattr(client, "get_encoder") else None
        if encoder is not None and getattr(encoder, "decode_responses", False):
            raise ConfigError(
                f"{driver} needs a Redis client with decode_responses=False "
                "(replies carry binary metadata)"
            )
        self.max_block_ms = block_limit(client)
        self.socket_timeout_ms = socket_timeout_ms(client)

    def settled(self) -> CoordinatorConfig:
        if self.config is None:
            raise RuntimeError("the coordinator is not started")
        return self.config

    def keys(self, group_id: str) -> GroupKeys:
        cfg = self.settled()
        keys = self._keys_cache.get(group_id)
        # A layout cached under another count (a thread that read the old settings while
        # another settled the new ones) is rebuilt, never trusted.
        if keys is None or keys.partition.num_partitions != cfg.num_partitions:
            keys = GroupKeys.of(cfg.namespace, cfg.num_partitions, group_id)
            if len(self._keys_cache) >= KEYS_CACHE_SIZE:
                self._keys_cache.clear()
            self._keys_cache[group_id] = keys
        return keys

    def now_arg(self) -> str:
        return "" if self.clock is None else str(int(self.clock()))

    def partition_for(self, group_id: str) -> int:
        """The coordinator partition of ``group_id`` (Kafka's __consumer_offsets partition)."""
        return partition_for(group_id, self.settled().num_partitions)

    # -- plumbing flows --------------------------------------------------------------------

    def settle(self, write_named: bool = True) -> Flow[CoordinatorConfig]:
        """Settle the namespace settings (``rcoord.settings``) and adopt them; with
        ``write_named=False`` the stored values stand over this process's named ones."""
        settled = yield from settle_flow(self.namespace, self.given, self.config, write_named)
        effective = settled.config
        if self.config is not None and self.config.num_partitions != effective.num_partitions:
            self._keys_cache.clear()
        self.config = effective
        self.settings_version = settled.version
        self.settings_origin = settled.origin
        try:
            was_max = int(settled.was.get("group_max_size", effective.group_max_size))
        except ValueError:  # (a bad value written by hand, now named over: treat as lowered)
            was_max = 2**63
        if was_max > effective.group_max_size:
            # A lowered limit: let every group see it now (oversized ones start to shrink),
            # as Kafka does when it loads a group that is over capacity.
            yield from self._touch_all_groups(effective)
        return effective

    def resettle(self) -> Flow[CoordinatorConfig]:
        """Settle again because a call found its layout stale (NOT_COORDINATOR, a copy
        missing): adopt the settings as stored, writing the named ones only if the settings
        were lost (none stored, or another establishment's ``ORIGIN``), as at a start.

        Before, this wrote the named settings every time: two processes naming different
        counts in a namespace with no group yet took turns (each one's call refused under the
        other's count, then storing its own), flipping the count on every such call, and each
        flip deleted the layout the other one was about to create a group in. Kafka fixes
        ``offsets.topic.num.partitions`` when ``__consumer_offsets`` is created; here the last
        process started stands (``rcoord.settings``). Named settings not in force are logged
        here, once per value (the coordinator service, which settles through ``settle``, logs
        its own ``settings_overridden``)."""
        count, origin = yield Command(("HMGET", settings_key(self.namespace), "num_partitions",
                                       ORIGIN))
        seen = None if origin is None else _text(origin)
        lost = count is None or seen != self.settings_origin
        used = self.settled().num_partitions
        effective = yield from self._resettle(lost, used)
        if not lost and self.settings_origin != seen:
            # Lost and established again by another process between that read and the
            # settle's own: adopted as another process's change, their origin taken for this
            # process's own. Before, its named settings were never written again (a later
            # call's read finds the origin it now knows); they are written as at a loss.
            effective = yield from self._resettle(True, used)
        self._report_overridden(effective)
        return effective

    def _resettle(self, lost: bool, used: int) -> Flow[CoordinatorConfig]:
        """``resettle``'s settle, writing the named settings if ``lost``; ``used`` is the
        partition count this process used before it."""
        try:
            effective = yield from self.settle(write_named=lost)
        except ConfigError:
            if not lost:
                raise
            now = yield Command(("HGET", settings_key(self.namespace), "num_partitions"))
            if now is None or _text(now) != str(used):
                raise  # (its calls would move to another layout: they say what to fix)
            # The named settings cannot be written over the ones re-established under the count
            # this process already used (it had adopted it: another count while groups exist
            # under it, or a value contradicting a stored one): they are adopted again. Before,
            # every call of this process raised ConfigError from then on: each one found the
            # settings of another origin than it knew, and wrote its own again.
            effective = yield from self.settle(write_named=False)
        return effective

    def _report_overridden(self, effective: CoordinatorConfig) -> None:
        """Log once per value in force which settings this process named are not in force
        (another process stored others, and they are adopted)."""
        if self.given is None:
            return
        now = {name: getattr(effective, name) for name in sorted(self.given.named - {"namespace"})
               if getattr(effective, name) != getattr(self.given, name)}
        new = {k: v for k, v in now.items() if self._overridden.get(k, object()) != v}
        self._overridden = now
        if new:
            log.warning("namespace %r: settings another process stored are in force, not the "
                        "ones this process names: %s (adopted: a process writes what it names "
                        "when it starts, or when the settings were lost)", self.namespace,
                        ", ".join(f"{k}={getattr(self.given, k)} (in force: {v})"
                                  for k, v in new.items()))

    def _touch_all_groups(self, cfg: CoordinatorConfig) -> Flow[None]:
        for p in range(cfg.num_partitions):
            pk = PartitionKeys(cfg.namespace, p, cfg.num_partitions)
            for raw in (yield Command(("SMEMBERS", pk.groups))):
                group_id = _text(raw)
                yield Script("expire_deadlines", pk.group(group_id).all(),
                             [self.now_arg(), group_id])

    def call(self, step: str, keys: GroupKeys, args: Sequence[Any]) -> Flow[Any]:
        """Run a group step. A script that finds no settings copy under the caller's layout
        refuses before writing anything; then settle again (unless a concurrent call already
        did), re-address the group, retry. A call that answers BUSY applied its share of the
        group's pending work (due deadlines, a chunk) and did nothing of the step, so no call
        blocks the shard for long (lua/prelude.lua ``group_step``): it is sent again."""
        for attempt in range(NOT_COORDINATOR_RETRIES + 1):
            seen = self.config
            try:
                for _ in range(MAX_BUSY_CALLS):
                    reply = yield Script(step, keys.all(), [self.now_arg(), keys.group_id, *args])
                    if not _busy(reply):
                        return reply
                raise CoordinatorNotAvailableError(
                    f"group {keys.group_id!r} still had deadlines or chunks to apply after "
                    f"{MAX_BUSY_CALLS} calls of {step}; try again")
            except redis.exceptions.ResponseError as exc:
                yield from self._refused(exc, attempt, seen)
            keys = self.keys(keys.group_id)
        raise AssertionError("unreachable")  # pragma: no cover

    def _refused(self, exc: redis.exceptions.ResponseError, attempt: int,
                 seen: CoordinatorConfig | None) -> Flow[None]:
        """After a script's refusal ``exc`` of a call sent under the settings ``seen``: settle
        again if it said the layout is stale (unless a concurrent call already did), so the
        caller re-addresses the group and retries; raise it if it said anything else or this
        was the last of ``NOT_COORDINATOR_RETRIES`` retries."""
        if _NOT_COORDINATOR not in str(exc) or attempt == NOT_COORDINATOR_RETRIES:
            raise exc
        if self.config is seen:
            yield from self.resettle()

    def _park(self, group_id: str, member_id: str, kind: str, reply: list[Any]) -> Flow[bytes]:
        """Wait for a parked Join/SyncGroup's reply (``rcoord.protocol.park``)."""
        keys = self.keys(group_id)  # as the parking call addressed it, after any re-settle
        wait = park_flow(reply, mock_clock=self.clock is not None, max_block_ms=self.max_block_ms)
        slot = reply_field(kind, member_id)
        woken: Woken | None = None  # the reply slot, read by the wake-up's shared reader
        try:
            op = next(wait)
            while True:
                result: Any
                if isinstance(op, WaitWake):
                    result = yield XRead(keys.wake, op.after, op.block_ms, (keys.replies, slot))
                    woken = result if isinstance(result, Woken) else None
                    result = bool(result)
                elif isinstance(op, ReadReply) and woken is not None:
                    result, woken = woken.stored, None
                elif isinstance(op, ReadDeadline):
                    result = yield SharedRead(("ZSCORE", keys.partition.due, keys.group_id))
                    result = None if result is None else float(result)
                elif isinstance(op, ClaimDeadline):
                    result = yield Claim(keys.claim, CLAIM_MS)
                elif isinstance(op, ReadReply):
                    result = yield Command(("HGET", keys.replies, slot))
                else:  # Poll
                    result = yield from self.call("await_reply", keys, [member_id, kind])
                op = wait.send(result)
        except StopIteration as done:
            return bytes(done.value)

    def _current_layout(self) -> Flow[CoordinatorConfig]:
        """For calls that read partitions directly (no group script to refuse a stale layout):
        the first partition's settings copy exists only under the agreed count."""
        cfg = self.settled()
        if not (yield Command(("EXISTS", PartitionKeys(cfg.namespace, 0, cfg.num_partitions).cfg))):
            cfg = yield from self.resettle()
        return cfg

    # -- the protocol ----------------------------------------------------------------------

    def join_group(
        self,
        group_id: str,
        member_id: str = "",
        *,
        protocol_type: str,
        protocols: Sequence[tuple[str, bytes]],
        session_timeout_ms: int,
        rebalance_timeout_ms: int | None = None,
        group_instance_id: str | None = None,
        client_id: str = "",
        client_host: str = "",
        require_known_member_id: bool = True,
        reason: str | None = None,
        new_member_uuid: str | None = None,
        supports_skip_assignment: bool = True,
    ) -> Flow[JoinGroupResult]:
        """JoinGroup. Waits while the join is parked; see ``rcoord.protocol.join`` for errors.

        ``new_member_uuid``: the UUID a member this join adds takes its id from
        (``rcoord.protocol.join.new_member_id``; None: a fresh one). Sending a new member's
        join again with the same UUID names the same member, so a client that knows its UUID
        can skip the MEMBER_ID_REQUIRED round (``require_known_member_id=False``) without
        risking a second member when it retries. ``supports_skip_assignment=False`` (a Kafka
        client below JoinGroup v9): a static leader back in a Stable group is answered as
        before KIP-814, with the leader it replaced and no members, so it does not assign."""
        req = JoinRequest.build(
            group_id, member_id, protocol_type=protocol_type, protocols=protocols,
            session_timeout_ms=session_timeout_ms, rebalance_timeout_ms=rebalance_timeout_ms,
            group_instance_id=group_instance_id, client_id=client_id, client_host=client_host,
            require_known_member_id=require_known_member_id, reason=reason,
            new_member_uuid=new_member_uuid, supports_skip_assignment=supports_skip_assignment,
        )
        if not req.group_id:
            return JoinGroupResult.failed(Errors.INVALID_GROUP_ID, member_id)
        reply = yield from self.call("join_group", self.keys(req.group_id), req.args())
        if reply[0] == b"W":
            # The member id may have been created by this call; the wait reply carries it.
            parked_id = _text(bytes(reply[4]))
            return JoinGroupResult.decode((yield from self._park(req.group_id, parked_id, "j",
                                                                  reply)))
        res = JoinGroupResult.decode(bytes(reply[1]))
        if res.member_id == NO_MEMBER_ID:  # (member_ref's stand-in: the reply echoes the id sent)
            return replace(res, member_id=member_id)
        return res

    def sync_group(
        self,
        group_id: str,
        generation_id: int,
        member_id: str,
        *,
        assignments: dict[str, bytes] | None = None,
        group_instance_id: str | None = None,
        protocol_type: str | None = None,
        protocol_name: str | None = None,
    ) -> Flow[SyncGroupResult]:
        """SyncGroup. A follower's call waits until the leader's assignment is stored."""
        req = SyncRequest.build(
            group_id, generation_id, member_id, assignments=assignments,
            group_instance_id=group_instance_id, protocol_type=protocol_type,
            protocol_name=protocol_name,
        )
        if not req.group_id:
            return SyncGroupResult(Errors.INVALID_GROUP_ID)
        reply = yield from self.call("sync_group", self.keys(req.group_id), req.args())
        if reply[0] == b"W":
            parked_at = int(reply[3])  # (the server time it parked at: the member's session)
            return SyncGroupResult.decode(
                (yield from self._park(req.group_id, req.member_id, "s", reply)), parked_at)
        return SyncGroupResult.decode(bytes(reply[1]))

    def heartbeat(
        self,
        group_id: str,
        generation_id: int,
        member_id: str,
        group_instance_id: str | None = None,
    ) -> Flow[Errors]:
        """Heartbeat: refreshes the member's session; the code says whether to rejoin."""
        gid, args = heartbeat_args(group_id, generation_id, member_id, group_instance_id)
        if not gid:
            return Errors.INVALID_GROUP_ID
        stalled = refused = 0
        for _ in range(MAX_DUE_CALLS):
            keys = self.keys(gid)  # as the group is addressed now (a sweep may have re-settled)
            seen = self.config
            try:
                reply = yield Script("heartbeat", keys.heartbeat_keys(),
                                     [self.now_arg(), gid, *args])
            except redis.exceptions.ResponseError as exc:
                # A stale layout: re-addressed, the member is answered by the group in force
                # (UNKNOWN_MEMBER_ID if it joined only the withdrawn layout's copy: it rejoins).
                yield from self._refused(exc, refused, seen)
                refused += 1
                continue
            if reply != b"DUE":
                return decode_heartbeat(reply[0])
            # A deadline of the group has passed: apply it first, as every step does. A call
            # that applied something (one chunk of a large completion applies per call) made
            # progress and is not counted as a retry.
            applied = yield from self.call("expire_deadlines", keys, [])
            if not applied or int(applied[0]) == 0:
                stalled += 1
                if stalled >= MAX_DUE_RETRIES:
                    break
        # Deadlines kept falling due between the calls: a retriable answer, try again shortly.
        return Errors.COORDINATOR_NOT_AVAILABLE

    def heartbeat_many(
        self, heartbeats: Sequence[tuple[str, int, str] | tuple[str, int, str, str | None]]
    ) -> Flow[list[Errors]]:
        """Heartbeats of many members (group id, generation, member id[, instance id]), for a
        process that hosts many members: one script call per group (up to HEARTBEAT_BATCH
        members each), all in one round trip. Same answers as ``heartbeat``, in order, except
        that a group whose master cannot be reached or refuses the call for now (where
        ``heartbeat`` raises ``ConnectionLost``) answers COORDINATOR_NOT_AVAILABLE for its
        members, and one still refused under a stale layout after every re-settle (where
        ``heartbeat`` raises ``NotCoordinatorError``) NOT_COORDINATOR, so the other groups'
        answers are not lost with it.
        """
        out: list[Errors | None] = [None] * len(heartbeats)
        by_group: dict[str, list[tuple[int, list[Any]]]] = {}
        for i, hb in enumerate(heartbeats):
            if not isinstance(hb, tuple | list) or not 3 <= len(hb) <= 4:
                # (A short one failed with IndexError, a longer one lost its extra items.)
                raise TypeError("each heartbeat must be (group_id, generation_id, member_id"
                                f"[, group_instance_id]), got {hb!r:.80} at index {i}")
            gid, args = heartbeat_args(hb[0], hb[1], hb[2], hb[3] if len(hb) > 3 else None)
            if not gid:
                out[i] = Errors.INVALID_GROUP_ID
            else:
                by_group.setdefault(gid, []).append((i, args))
        now = self.now_arg()
        chunks: list[tuple[str, list[tuple[int, list[Any]]]]] = []
        calls = []
        for gid, items in by_group.items():
            keys = self.keys(gid).heartbeat_keys()
            for start in range(0, len(items), HEARTBEAT_BATCH):
                chunk = items[start : start + HEARTBEAT_BATCH]
                chunks.append((gid, chunk))
                calls.append((keys, [now, gid, *[x for _, args in chunk for x in args]]))
        replies = (yield ScriptBatch("heartbeat", calls)) if calls else []
        for (gid, chunk), (keys, args), reply in zip(chunks, calls, replies, strict=True):
            if isinstance(reply, UNREACHABLE):
                # This group's master cannot be reached (a cluster master down, the others up):
                # its members get what Kafka answers when their coordinator is unavailable,
                # which they retry; the other groups' answers stand.
                for i, _ in chunk:
                    out[i] = Errors.COORDINATOR_NOT_AVAILABLE
                continue
            if reply == b"DUE" or isinstance(reply, Exception):
                # A passed deadline (apply it first, as every step does), or a call that failed
                # even after the driver's reload or was refused under a stale layout
                # (NOT_COORDINATOR: the sweep, refused too, settles again): send this group's
                # chunk again, addressed as the group is now (``_resend_heartbeats``).
                # A master that refuses it for now (out of memory, a failed save, too few
                # replicas, a slot migrating: what the API raises as ServerUnavailable) is
                # answered for this group alone, as an unreachable one is above; raising here
                # lost the answers of every group on the healthy masters for as long as it
                # refused.
                try:
                    reply = yield from self._resend_heartbeats(gid, args)
                except (redis.exceptions.RedisError,
                        redis.exceptions.RedisClusterException) as exc:
                    if not _unavailable(exc):
                        raise
                    for i, _ in chunk:
                        out[i] = Errors.COORDINATOR_NOT_AVAILABLE
                    continue
                if reply is None:
                    for i, _ in chunk:
                        out[i] = Errors.NOT_COORDINATOR
                    continue
            if reply == b"DUE":
                # Deadlines keep falling due: one by one. The master may refuse these calls
                # too (the resend above passed it a moment ago): the members not yet answered
                # get COORDINATOR_NOT_AVAILABLE, as above, not an error for every group.
                for n, (i, hb_args) in enumerate(chunk):
                    try:
                        out[i] = yield from self.heartbeat(gid, hb_args[1], hb_args[0],
                                                           hb_args[2] or None)
                    except (redis.exceptions.RedisError,
                            redis.exceptions.RedisClusterException) as exc:
                        # Still refused under a stale layout after every re-settle, as the
                        # resend above: NOT_COORDINATOR for the rest of this group alone.
                        code = (Errors.NOT_COORDINATOR if _NOT_COORDINATOR in str(exc)
                                else Errors.COORDINATOR_NOT_AVAILABLE)
                        if code is Errors.COORDINATOR_NOT_AVAILABLE and not _unavailable(exc):
                            raise
                        for j, _ in chunk[n:]:
                            out[j] = code
                        break
            else:
                for (i, _), code in zip(chunk, reply, strict=True):
                    out[i] = decode_heartbeat(code)
        return [e if e is not None else Errors.UNKNOWN_SERVER_ERROR for e in out]

    def _resend_heartbeats(self, gid: str, args: list[Any]) -> Flow[Any]:
        """``heartbeat_many``'s second call of one group's chunk (its script ``args``), after
        its deadlines are applied; None if every try was refused under a stale layout.

        The sweep settles again when it is refused, but the count may change again before the
        heartbeats follow it: they settle again and are sent again, within the bound every
        group step keeps (``NOT_COORDINATOR_RETRIES``). Before, that refusal raised for every
        member of every group in the batch; past the bound the caller now answers this
        group's members NOT_COORDINATOR, as Kafka answers each request."""
        for attempt in range(NOT_COORDINATOR_RETRIES + 1):
            try:
                yield from self.call("expire_deadlines", self.keys(gid), [])
            except redis.exceptions.ResponseError as exc:
                # The sweep still refused after its own re-settles (``call``'s bound): this
                # group is answered so, not every group of the batch with an error.
                if _NOT_COORDINATOR in str(exc):
                    return None
                raise
            seen = self.config
            try:
                return (yield Script("heartbeat", self.keys(gid).heartbeat_keys(), args))
            except redis.exceptions.ResponseError as exc:
                if _NOT_COORDINATOR in str(exc) and attempt == NOT_COORDINATOR_RETRIES:
                    return None
                yield from self._refused(exc, attempt, seen)
        raise AssertionError("unreachable")  # pragma: no cover

    def leave_group(self, group_id: str, members: Sequence[MemberIdentity]) -> Flow[LeaveGroupResult]:
        """LeaveGroup for one or many members (by member id, or by instance id)."""
        gid, idents, chunks = leave_args(group_id, members)
        if not gid:
            return LeaveGroupResult(Errors.INVALID_GROUP_ID)
        replies = []
        for packed in chunks:  # LEAVE_CHUNK members per call (rcoord.protocol.leave)
            replies.append((yield from self.call("leave_group", self.keys(gid), [packed])))
            if Errors.from_name(replies[-1][0]) is not Errors.NONE:
                break
        return decode_leave(replies, idents)

    def commit_offsets(
        self,
        group_id: str,
        offsets: dict[TopicPartition, OffsetAndMetadata | int],
        *,
        member_id: str = "",
        generation_id: int = -1,
        group_instance_id: str | None = None,
        retention_ms: int | None = None,
        required_acks: int = 0,
        ack_timeout_ms: int = 5000,
    ) -> Flow[dict[TopicPartition, Errors]]:
        """OffsetCommit, fenced by generation; all accepted partitions are stored atomically.

        ``generation_id=-1`` with no member id is the simple (assign()) commit, accepted only
        while the group is Empty. See ``rcoord.protocol.offsets`` for the errors. One call
        carries at most MAX_ITEMS_PER_CALL partitions (``encode_commit`` says why it refuses
        rather than splits); offsets are int64, stored exactly.

        ``required_acks`` replicas must have the commit before it is answered NONE (Kafka's
        ``offsets.commit.required.acks``; ``ack_timeout_ms`` is its
        ``offsets.commit.timeout.ms``). Redis replicates asynchronously, so with the default 0
        a failover can lose a commit the master acknowledged; with N > 0 the commit is followed
        by WAIT, and if fewer than N replicas have it in time every accepted partition answers
        COORDINATOR_NOT_AVAILABLE, as Kafka answers a commit its ISR did not acknowledge: the
        offsets are on the master (readable at once, unlike Kafka), and the caller commits
        again (the same offsets: harmless). See docs/guarantees.md, "Failover".
        """
        gid = check_id("group_id", group_id)
        order, packed, refused = encode_commit(offsets, self.settled().offset_metadata_max_bytes)
        if refused:
            # Refused by the limit this process read at its start: another process may have
            # raised it since (only the service re-reads settings each round), and the script
            # cannot store metadata it was not sent. Judge by the limit in force, as Kafka does.
            order, packed, _ = encode_commit(
                offsets, (yield from self.resettle()).offset_metadata_max_bytes)
        args = [
            member_ref(member_id),
            require_int32("generation_id", generation_id),
            check_instance_id(group_instance_id),
            retention_arg(retention_ms),
            packed,
        ]
        acks = require_int32("required_acks", required_acks)
        wait_ms = require_int32("ack_timeout_ms", ack_timeout_ms)
        if acks < 0 or wait_ms < 1:
            raise InvalidRequestError(
                f"required_acks must be >= 0 and ack_timeout_ms >= 1, got {acks} and {wait_ms} "
                "(Redis tracks no in-sync replica set, so Kafka's -1 has no equivalent: name a "
                "replica count)")
        if not order:
            return {}
        keys = self.keys(gid)
        master = (yield MasterOf(keys.partition.acks)) if acks else None
        reply = yield from self.call("commit_offsets", keys, args)
        result = {tp: Errors.from_name(code) for tp, code in zip(order, reply[1], strict=True)}
        if acks and Errors.NONE in result.values():
            acked = yield from self._replica_acks(gid, master, acks, wait_ms)
            if acked < acks:
                result = {tp: Errors.COORDINATOR_NOT_AVAILABLE if e is Errors.NONE else e
                          for tp, e in result.items()}
        return result

    def fetch_offsets(
        self, group_id: str, partitions: Sequence[TopicPartition] | None = None
    ) -> Flow[OffsetFetchResult]:
        """OffsetFetch: committed offsets; a requested partition with no commit maps to -1.

        A long partition list is read in several script calls (see ``fetch_batches``), and so
        are all of a group's offsets, a page of about ``FETCH_PAGE`` per call: one call
        reading 300,000 offsets held the shard for 200 ms. Each call reads its share at one
        instant; a commit that lands between two calls may show in the later one only. Pages
        of all offsets that come from two server processes (a failover or a slot migration
        between them) are read again from the first (see ``FETCH_RESTARTS``).
        """
        gid = check_id("group_id", group_id)
        keys = self.keys(gid)
        offsets = {}
        if partitions is None:
            # A page names the server process that read it: an HSCAN cursor is that process's
            # own, and continued on another (a failover, a restart, a slot migration between
            # two pages) it skips offsets, so the fetch starts again there.
            cursor, server, restarts = "0", None, 0
            while True:
                page = yield from self.call("fetch_offsets", keys, [f"#{cursor}", FETCH_PAGE])
                if server is not None and page[-1] != server:
                    restarts += 1
                    if restarts > FETCH_RESTARTS:
                        raise CoordinatorNotAvailableError(
                            f"the offsets of group {gid!r} moved to another server process "
                            f"{restarts} times while they were read; try again")
                    cursor, server, offsets = "0", None, {}
                    continue
                cursor, server = _text(page[-3]), page[-1]
                offsets.update(decode_fetch(page[:-4]))
                if cursor == "0":
                    return OffsetFetchResult(Errors.NONE, offsets)
        for batch in fetch_batches(partitions):
            offsets.update(decode_fetch((yield from self.call("fetch_offsets", keys, batch))))
        return OffsetFetchResult(Errors.NONE, offsets)

    def _replica_acks(self, group_id: str, master: Any, acks: int, wait_ms: int) -> Flow[int]:
        """How many replicas have the commit just made (``-1``: cannot tell, so none count).

        WAIT must measure the master that ran the commit. If the group's slot now belongs to
        another node (a failover or a migration between the two calls), or the layout changed
        under the call, the answer would be about the wrong master: it counts as none, and the
        caller commits again. The wait is capped below the client's socket timeout, so it ends
        as an answer, not as a lost connection.
        """
        keys = self.keys(group_id)
        if self.socket_timeout_ms:
            wait_ms = max(1, min(wait_ms, self.socket_timeout_ms // 2))
        try:
            acked, node = yield WaitReplicas(keys.partition.acks, acks, wait_ms)
        except _NOT_ACKNOWLEDGED:
            return -1  # the slot is moving or its master is gone: not acknowledged
        return int(acked) if node == master else -1

    # -- administration --------------------------------------------------------------------

    def describe_group(self, group_id: str) -> Flow[GroupDescription]:
        """DescribeGroups for one group; an unknown group is "Dead" with no members.

        The empty group id is a group like any other here, as in Kafka.
        """
        gid = check_id("group_id", group_id)
        for attempt in range(DESCRIBE_RESTARTS + 1):
            # A large group is listed a page per call (lua/describe_group.lua); a page taken
            # after the group changed starts the description again, and the last try lists
            # the group in one call, which is consistent by itself.
            size: int | str = DESCRIBE_PAGE if attempt < DESCRIBE_RESTARTS else ""
            keys = self.keys(gid)
            first = decode_description_page(
                gid, (yield from self.call("describe_group", keys, [0, size])))
            members, at = list(first.description.members), first.next
            while at < first.total:
                page = decode_description_page(
                    gid, (yield from self.call("describe_group", keys, [at, size])))
                # A page of another moment, or one that lacks a member its ids named.
                if (page.token != first.token or page.next <= at
                        or len(page.description.members) != page.next - at):
                    break
                members += page.description.members
                at = page.next
            else:
                if len(members) == first.total:
                    return replace(first.description, members=members)
        raise AssertionError("unreachable: the last try lists the group in one call")

    def list_groups(self, states: Sequence[str] | None = None) -> Flow[list[GroupListing]]:
        """ListGroups across every partition (one node or a cluster), optionally by state name.

        Passed deadlines are applied first, so the states listed are current.
        """
        wanted = states_filter(states)
        yield from self.run_timers()
        cfg = yield from self._current_layout()
        listings: list[GroupListing] = []
        for p in range(cfg.num_partitions):
            pk = PartitionKeys(cfg.namespace, p, cfg.num_partitions)
            ids = sorted((yield Command(("SMEMBERS", pk.groups))))
            if not ids:
                continue
            rows = yield Pipeline([("HMGET", pk.group(_text(raw)).group, "state", "ptype")
                                   for raw in ids])
            for raw, (state, ptype) in zip(ids, rows, strict=True):
                if state is None:
                    continue  # deleted between the two reads
                listing = GroupListing(_text(raw), (ptype or b"").decode(), state.decode())
                if wanted is None or listing.state.lower() in wanted:
                    listings.append(listing)
        return listings

    def delete_groups(self, group_ids: Sequence[str]) -> Flow[dict[str, Errors]]:
        """DeleteGroups: Empty groups only (NON_EMPTY_GROUP otherwise); offsets go too.

        Each group is deleted by its own script call, so the list needs no bound of its own (see
        ``group_ids_arg``). The empty group id is a group like any other here, as in Kafka.
        A deleted group's Spark replay record (``replays_key``, in a slot of its own, so not
        the script's) goes after it: a group that comes back starts with nothing of the old.
        """
        out: dict[str, Errors] = {}
        for gid in group_ids_arg(group_ids):
            # Both or neither: a caller cancelled between the two left the record of a group
            # that was gone, and a retry finds no group (GROUP_ID_NOT_FOUND) and deletes nothing.
            out[gid] = yield Unbroken(self._delete_group(gid))
        return out

    def _delete_group(self, gid: str) -> Flow[Errors]:
        """Delete one group, then (if it was deleted) its Spark replay record and the claim
        of its parked callers (``GroupKeys.claim``, no script's key), which outlived the group
        and could hold up the deadline handling of a group made again under its name."""
        code = Errors.from_name((yield from self.call("delete_group", self.keys(gid), [])))
        if code == Errors.NONE:
            yield Pipeline((("DEL", self.keys(gid).claim),
                            ("DEL", replays_key(self.namespace, gid))))
        return code

    def delete_offsets(
        self, group_id: str, partitions: Sequence[TopicPartition]
    ) -> Flow[OffsetDeleteResult]:
        """OffsetDelete (KIP-496): refused per partition while a member subscribes to the topic.

        At most MAX_ITEMS_PER_CALL partitions, deleted in one script call (``partitions_args``).
        """
        gid = check_id("group_id", group_id)
        partitions = list(partitions)
        fields = partitions_args(partitions)
        order = [TopicPartition(tp[0], tp[1]) for tp in partitions]
        if not gid:
            return OffsetDeleteResult(Errors.INVALID_GROUP_ID)
        reply = yield from self.call("delete_offsets", self.keys(gid), fields)
        top = Errors.from_name(reply[0])
        if top is not Errors.NONE:
            return OffsetDeleteResult(top)
        return OffsetDeleteResult(
            top, {tp: Errors.from_name(code) for tp, code in zip(order, reply[1], strict=True)}
        )

    def run_timers(self) -> Flow[int]:
        """Apply every passed deadline in every partition; return how many were applied."""
        cfg = yield from self._current_layout()
        partitions = [PartitionKeys(cfg.namespace, p, cfg.num_partitions)
                      for p in range(cfg.num_partitions)]
        applied = 0
        # Passes over every partition until one finds nothing due or applies nothing: a call
        # applies a share of a group's due deadlines (lua/prelude.lua apply_due) and leaves the
        # group due for the rest, for the next pass, so a partition with a burst does not hold
        # the others back; a group due in the index with nothing to apply is repaired.
        for _ in range(MAX_BUSY_CALLS):
            again, full, pass_applied = [], False, 0
            for pk in partitions:
                due = yield Script("due_groups", [pk.due], [self.now_arg(), DUE_BATCH])
                groups = due[1:]
                for raw in groups:
                    pass_applied += int((yield from self.call(
                        "expire_deadlines", pk.group(_text(raw)), []))[0])
                if groups:
                    again.append(pk)  # (only these can still be due)
                full = full or len(groups) >= DUE_BATCH
            applied += pass_applied
            if not again or (pass_applied == 0 and not full):
                break
            partitions = again
        return applied
