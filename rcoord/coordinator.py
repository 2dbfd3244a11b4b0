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

State transitions (see ``rcoord.state``): Empty -> PreparingRebalance -> CompletingRebalance
-> Stable, back to PreparingRebalance on any membership change, and Empty when the last member
leaves.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import redis.exceptions

from .config import CoordinatorConfig
from .errors import ConfigError, Errors, translate_redis_errors
from .keys import GroupKeys, PartitionKeys
from .partitioning import partition_for
from .protocol._checks import check_id, check_instance_id, require_int32
from .protocol.admin import (
    GroupDescription,
    GroupListing,
    OffsetDeleteResult,
    decode_description,
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
from .protocol.park import CLAIM_MS, MAX_BLOCK_MS, park_flow
from .protocol.sync import SyncGroupResult, SyncRequest
from .scripts import Scripts
from .settings import settle

__all__ = ["GroupCoordinator"]

"""With an injected clock, time only moves when the test moves it: re-check often."""
DUE_BATCH = 1000
KEYS_CACHE_SIZE = 10_000
MAX_DUE_RETRIES = 5
HEARTBEAT_BATCH = 500
"""Most members of one group in one heartbeat script call (a script blocks its shard)."""
NOT_COORDINATOR_RETRIES = 3
"""Settle-and-retry rounds when a script says the caller's layout is not the namespace's."""
_NOT_COORDINATOR = "RCOORD_NOT_COORDINATOR"


class GroupCoordinator:
    """The server side of Kafka's classic group protocol, one method per request.

    ``redis_client`` is a ``redis.Redis`` or ``redis.RedisCluster`` created with
    ``decode_responses=False``. ``config`` writes the settings it names to the namespace in
    Redis (see ``CoordinatorConfig``); without one, the stored settings (or Kafka's defaults)
    apply. The settings, the partition count above all, are one agreed fact of the namespace
    (``rcoord.settings``): a call made with a stale count is refused by the script and this
    class settles again and retries by itself; a process that named settings writes them again
    if they were lost. ``clock`` (a callable returning milliseconds) replaces Redis ``TIME`` in every
    script; it exists for deterministic tests, like Kafka's MockTime.

    Nothing touches Redis until ``start()`` or the first request.
    """

    def __init__(
        self,
        redis_client: Any,
        config: CoordinatorConfig | None = None,
        *,
        clock: Callable[[], int] | None = None,
    ) -> None:
        self._redis = redis_client
        self._given = config
        self._clock = clock
        self._scripts = Scripts(redis_client)
        self._config: CoordinatorConfig | None = None
        self._lock = threading.Lock()
        self._max_block_ms = MAX_BLOCK_MS
        self._keys_cache: dict[str, GroupKeys] = {}
        self.settings_version = 0
        """The version of the namespace settings this coordinator last settled."""

    # -- lifecycle ---------------------------------------------------------------------------

    @translate_redis_errors
    def start(self) -> GroupCoordinator:
        """Load the scripts and settle the namespace settings. Idempotent."""
        with self._lock:
            if self._config is None:
                self._check_client()
                self._max_block_ms = self._block_limit()
                self._scripts.load()
                self._settle()
        return self

    @translate_redis_errors
    def resettle(self) -> CoordinatorConfig:
        """Read (or re-establish) the namespace settings now; what a NOT_COORDINATOR triggers,
        and what the coordinator service does when it sees the settings changed or lost."""
        self._started()
        with self._lock:
            return self._settle()

    @property
    def config(self) -> CoordinatorConfig:
        """The settings in force (after ``start()``)."""
        return self._started()

    def _started(self) -> CoordinatorConfig:
        if self._config is None:
            self.start()
        assert self._config is not None
        return self._config

    def _check_client(self) -> None:
        encoder = self._redis.get_encoder() if hasattr(self._redis, "get_encoder") else None
        if encoder is not None and getattr(encoder, "decode_responses", False):
            raise ConfigError(
                "GroupCoordinator needs a Redis client with decode_responses=False "
                "(replies carry binary metadata)"
            )

    def _block_limit(self) -> int:
        """A parked call's XREAD must return before the client's socket timeout fires."""
        kwargs: dict[str, Any] = {}
        if hasattr(self._redis, "connection_pool"):
            kwargs = self._redis.connection_pool.connection_kwargs
        elif hasattr(self._redis, "nodes_manager"):
            kwargs = self._redis.nodes_manager.connection_kwargs
        timeout = kwargs.get("socket_timeout")
        if not timeout:
            return MAX_BLOCK_MS
        return max(1, min(MAX_BLOCK_MS, int(timeout * 1000 * 0.5)))

    def _settle(self) -> CoordinatorConfig:
        """Settle the namespace settings (under ``self._lock``); see ``rcoord.settings``."""
        namespace = self._given.namespace if self._given else "rcoord"
        settled = settle(self._redis, self._scripts, namespace, self._given, self._config)
        effective = settled.config
        if self._config is not None and self._config.num_partitions != effective.num_partitions:
            self._keys_cache.clear()
        self._config = effective
        self.settings_version = settled.version
        was_max = int(settled.was.get("group_max_size", effective.group_max_size))
        if was_max > effective.group_max_size:
            # A lowered limit: let every group see it now (oversized ones start to shrink),
            # as Kafka does when it loads a group that is over capacity.
            self._touch_all_groups(effective)
        return effective

    def _touch_all_groups(self, cfg: CoordinatorConfig) -> None:
        for p in range(cfg.num_partitions):
            pk = PartitionKeys(cfg.namespace, p, cfg.num_partitions)
            for raw in self._redis.smembers(pk.groups):
                group_id = raw.decode("utf-8", "surrogateescape")
                keys = pk.group(group_id)
                self._scripts.expire_deadlines(keys=keys.all(), args=[self._now_arg(), group_id])

    # -- plumbing ----------------------------------------------------------------------------

    def partition_for(self, group_id: str) -> int:
        """The coordinator partition of ``group_id`` (Kafka's __consumer_offsets partition)."""
        return partition_for(group_id, self._started().num_partitions)

    def _keys(self, group_id: str) -> GroupKeys:
        keys = self._keys_cache.get(group_id)
        if keys is None:
            cfg = self._started()
            keys = GroupKeys.of(cfg.namespace, cfg.num_partitions, group_id)
            if len(self._keys_cache) >= KEYS_CACHE_SIZE:
                self._keys_cache.clear()
            self._keys_cache[group_id] = keys
        return keys

    def _current_layout(self) -> CoordinatorConfig:
        """For calls that read partitions directly (no group script to refuse a stale layout):
        the first partition's settings copy exists only under the agreed count."""
        cfg = self._started()
        if not self._redis.exists(PartitionKeys(cfg.namespace, 0, cfg.num_partitions).cfg):
            cfg = self.resettle()
        return cfg

    def _now_arg(self) -> str:
        return "" if self._clock is None else str(int(self._clock()))

    def _call(self, step: str, keys: GroupKeys, args: Sequence[Any]) -> Any:
        """Run a group step. A script that finds no settings copy under the caller's layout
        refuses before writing anything; then settle again, re-address the group, retry."""
        script = getattr(self._scripts, step)
        for attempt in range(NOT_COORDINATOR_RETRIES + 1):
            try:
                return script(keys=keys.all(), args=[self._now_arg(), keys.group_id, *args])
            except redis.exceptions.ResponseError as exc:
                if _NOT_COORDINATOR not in str(exc) or attempt == NOT_COORDINATOR_RETRIES:
                    raise
            self.resettle()
            keys = self._keys(keys.group_id)
        raise AssertionError("unreachable")  # pragma: no cover

    def _park(self, keys: GroupKeys, member_id: str, kind: str, reply: list[Any]) -> bytes:
        """Wait for a parked Join/SyncGroup's reply: runs the sans-I/O ``park_flow``."""
        flow = park_flow(reply, mock_clock=self._clock is not None, max_block_ms=self._max_block_ms)
        try:
            op = next(flow)
            while True:
                if op[0] == "xread":
                    result: Any = bool(self._redis.xread({keys.wake: op[1]}, count=1, block=op[2]))
                elif op[0] == "zscore":
                    result = self._redis.zscore(keys.partition.due, keys.group_id)
                elif op[0] == "claim":
                    result = bool(self._redis.set(keys.claim, b"1", nx=True, px=CLAIM_MS))
                else:
                    result = self._call("await_reply", keys, [member_id, kind])
                op = flow.send(result)
        except StopIteration as done:
            return bytes(done.value)

    # -- the protocol ------------------------------------------------------------------------

    @translate_redis_errors
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
    ) -> JoinGroupResult:
        """JoinGroup. Blocks while the join is parked; see ``rcoord.protocol.join`` for errors."""
        req = JoinRequest.build(
            group_id,
            member_id,
            protocol_type=protocol_type,
            protocols=protocols,
            session_timeout_ms=session_timeout_ms,
            rebalance_timeout_ms=rebalance_timeout_ms,
            group_instance_id=group_instance_id,
            client_id=client_id,
            client_host=client_host,
            require_known_member_id=require_known_member_id,
            reason=reason,
        )
        if not req.group_id:
            return JoinGroupResult.failed(Errors.INVALID_GROUP_ID, req.member_id)
        reply = self._call("join_group", self._keys(req.group_id), req.args())
        if reply[0] == b"W":
            # The member id may have been created by this call; the wait reply carries it.
            parked_id = bytes(reply[4]).decode("utf-8", "surrogateescape")
            keys = self._keys(req.group_id)  # as the call addressed it, after any re-settle
            return JoinGroupResult.decode(self._park(keys, parked_id, "j", reply))
        return JoinGroupResult.decode(bytes(reply[1]))

    @translate_redis_errors
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
    ) -> SyncGroupResult:
        """SyncGroup. A follower's call blocks until the leader's assignment is stored."""
        req = SyncRequest.build(
            group_id,
            generation_id,
            member_id,
            assignments=assignments,
            group_instance_id=group_instance_id,
            protocol_type=protocol_type,
            protocol_name=protocol_name,
        )
        if not req.group_id:
            return SyncGroupResult(Errors.INVALID_GROUP_ID)
        reply = self._call("sync_group", self._keys(req.group_id), req.args())
        if reply[0] == b"W":
            keys = self._keys(req.group_id)  # as the call addressed it, after any re-settle
            return SyncGroupResult.decode(self._park(keys, req.member_id, "s", reply))
        return SyncGroupResult.decode(bytes(reply[1]))

    @translate_redis_errors
    def heartbeat(
        self,
        group_id: str,
        generation_id: int,
        member_id: str,
        group_instance_id: str | None = None,
    ) -> Errors:
        """Heartbeat: refreshes the member's session; the code says whether to rejoin."""
        gid, args = heartbeat_args(group_id, generation_id, member_id, group_instance_id)
        if not gid:
            return Errors.INVALID_GROUP_ID
        keys = self._keys(gid)
        for _ in range(MAX_DUE_RETRIES):
            reply = self._scripts.heartbeat(
                keys=keys.heartbeat_keys(), args=[self._now_arg(), gid, *args]
            )
            if reply != b"DUE":
                return decode_heartbeat(reply[0])
            # A deadline of the group has passed: apply it first, as every step does.
            self._call("expire_deadlines", keys, [])
        # Deadlines kept falling due between the calls: a retriable answer, try again shortly.
        return Errors.COORDINATOR_NOT_AVAILABLE

    @translate_redis_errors
    def heartbeat_many(
        self, heartbeats: Sequence[tuple[str, int, str] | tuple[str, int, str, str | None]]
    ) -> list[Errors]:
        """Heartbeats of many members (group id, generation, member id[, instance id]), for a
        process that hosts many members: one script call per group (up to HEARTBEAT_BATCH
        members each), all pipelined in one round trip. Same answers as ``heartbeat``, in order.
        """
        self._started()
        out: list[Errors | None] = [None] * len(heartbeats)
        by_group: dict[str, list[tuple[int, list[Any]]]] = {}
        for i, hb in enumerate(heartbeats):
            gid, args = heartbeat_args(hb[0], hb[1], hb[2], hb[3] if len(hb) > 3 else None)
            if not gid:
                out[i] = Errors.INVALID_GROUP_ID
            else:
                by_group.setdefault(gid, []).append((i, args))
        sha = self._scripts.sha("heartbeat")
        now = self._now_arg()
        calls: list[tuple[str, list[tuple[int, list[Any]]]]] = []
        pipe = self._redis.pipeline(transaction=False)
        for gid, items in by_group.items():
            keys = self._keys(gid).heartbeat_keys()
            for start in range(0, len(items), HEARTBEAT_BATCH):
                chunk = items[start : start + HEARTBEAT_BATCH]
                flat = [x for _, args in chunk for x in args]
                pipe.execute_command("EVALSHA", sha, len(keys), *keys, now, gid, *flat)
                calls.append((gid, chunk))
        for (gid, chunk), reply in zip(calls, pipe.execute(raise_on_error=False), strict=True):
            if reply == b"DUE" or isinstance(reply, Exception):
                # A passed deadline (apply it first, as every step does) or NOSCRIPT after a
                # restart (the Script object reloads it): send this group's chunk again once.
                group_keys = self._keys(gid)
                self._call("expire_deadlines", group_keys, [])
                flat = [x for _, args in chunk for x in args]
                reply = self._scripts.heartbeat(keys=group_keys.heartbeat_keys(), args=[now, gid, *flat])
            if reply == b"DUE":
                for i, args in chunk:  # deadlines keep falling due: one by one
                    out[i] = self.heartbeat(gid, args[1], args[0], args[2] or None)
            else:
                for (i, _), code in zip(chunk, reply, strict=True):
                    out[i] = decode_heartbeat(code)
        return [e if e is not None else Errors.UNKNOWN_SERVER_ERROR for e in out]

    @translate_redis_errors
    def leave_group(self, group_id: str, members: Sequence[MemberIdentity]) -> LeaveGroupResult:
        """LeaveGroup for one or many members (by member id, or by instance id)."""
        gid, idents, packed = leave_args(group_id, members)
        if not gid:
            return LeaveGroupResult(Errors.INVALID_GROUP_ID)
        reply = self._call("leave_group", self._keys(gid), [packed])
        return decode_leave(reply, idents)

    @translate_redis_errors
    def commit_offsets(
        self,
        group_id: str,
        offsets: dict[TopicPartition, OffsetAndMetadata | int],
        *,
        member_id: str = "",
        generation_id: int = -1,
        group_instance_id: str | None = None,
        retention_ms: int | None = None,
    ) -> dict[TopicPartition, Errors]:
        """OffsetCommit, fenced by generation; all accepted partitions are stored atomically.

        ``generation_id=-1`` with no member id is the simple (assign()) commit, accepted only
        while the group has no members. See ``rcoord.protocol.offsets`` for the errors. One call
        carries at most MAX_ITEMS_PER_CALL partitions (``encode_commit`` says why it refuses
        rather than splits); offsets are int64, stored exactly.
        """
        gid = check_id("group_id", group_id)
        order, packed = encode_commit(offsets)
        args = [
            check_id("member_id", member_id),
            require_int32("generation_id", generation_id),
            check_instance_id(group_instance_id),
            retention_arg(retention_ms),
            packed,
        ]
        if not order:
            return {}
        reply = self._call("commit_offsets", self._keys(gid), args)
        return {tp: Errors.from_name(code) for tp, code in zip(order, reply[1], strict=True)}

    @translate_redis_errors
    def fetch_offsets(
        self, group_id: str, partitions: Sequence[TopicPartition] | None = None
    ) -> OffsetFetchResult:
        """OffsetFetch: committed offsets; a requested partition with no commit maps to -1.

        A long partition list is read in several script calls (see ``fetch_batches``).
        """
        gid = check_id("group_id", group_id)
        keys = self._keys(gid)
        if partitions is None:
            return OffsetFetchResult(Errors.NONE, decode_fetch(self._call("fetch_offsets", keys, [])))
        offsets = {}
        for batch in fetch_batches(partitions):
            offsets.update(decode_fetch(self._call("fetch_offsets", keys, batch)))
        return OffsetFetchResult(Errors.NONE, offsets)

    # -- administration ----------------------------------------------------------------------

    @translate_redis_errors
    def describe_group(self, group_id: str) -> GroupDescription:
        """DescribeGroups for one group; an unknown group is "Dead" with no members.

        The empty group id is a group like any other here, as in Kafka.
        """
        gid = check_id("group_id", group_id)
        return decode_description(gid, self._call("describe_group", self._keys(gid), []))

    @translate_redis_errors
    def list_groups(self, states: Sequence[str] | None = None) -> list[GroupListing]:
        """ListGroups across every partition (one node or a cluster), optionally by state name.

        Passed deadlines are applied first, so the states listed are current.
        """
        wanted = states_filter(states)
        self.run_timers()
        cfg = self._current_layout()
        listings: list[GroupListing] = []
        for p in range(cfg.num_partitions):
            pk = PartitionKeys(cfg.namespace, p, cfg.num_partitions)
            ids = sorted(self._redis.smembers(pk.groups))
            if not ids:
                continue
            pipe = self._redis.pipeline(transaction=False)
            for raw in ids:
                pipe.hmget(pk.group(raw.decode("utf-8", "surrogateescape")).all()[3], "state", "ptype")
            for raw, (state, ptype) in zip(ids, pipe.execute(), strict=True):
                if state is None:
                    continue  # deleted between the two reads
                listing = GroupListing(raw.decode("utf-8", "surrogateescape"),
                                       (ptype or b"").decode(), state.decode())
                if wanted is None or listing.state.lower() in wanted:
                    listings.append(listing)
        return listings

    @translate_redis_errors
    def delete_groups(self, group_ids: Sequence[str]) -> dict[str, Errors]:
        """DeleteGroups: Empty groups only (NON_EMPTY_GROUP otherwise); offsets go too.

        Each group is deleted by its own script call, so the list needs no bound of its own (see
        ``group_ids_arg``). The empty group id is a group like any other here, as in Kafka.
        """
        out: dict[str, Errors] = {}
        for gid in group_ids_arg(group_ids):
            out[gid] = Errors.from_name(self._call("delete_group", self._keys(gid), []))
        return out

    @translate_redis_errors
    def delete_offsets(self, group_id: str, partitions: Sequence[TopicPartition]) -> OffsetDeleteResult:
        """OffsetDelete (KIP-496): refused per partition while a member subscribes to the topic.

        At most MAX_ITEMS_PER_CALL partitions, deleted in one script call (``partitions_args``).
        """
        gid = check_id("group_id", group_id)
        partitions = list(partitions)
        fields = partitions_args(partitions)
        order = [TopicPartition(tp[0], tp[1]) for tp in partitions]
        if not gid:
            return OffsetDeleteResult(Errors.INVALID_GROUP_ID)
        reply = self._call("delete_offsets", self._keys(gid), fields)
        top = Errors.from_name(reply[0])
        if top is not Errors.NONE:
            return OffsetDeleteResult(top)
        return OffsetDeleteResult(
            top, {tp: Errors.from_name(code) for tp, code in zip(order, reply[1], strict=True)}
        )

    @translate_redis_errors
    def run_timers(self) -> int:
        """Apply every passed deadline in every partition; return how many were applied."""
        cfg = self._current_layout()
        applied = 0
        for p in range(cfg.num_partitions):
            pk = PartitionKeys(cfg.namespace, p, cfg.num_partitions)
            while True:
                due = self._scripts.due_groups(keys=[pk.due], args=[self._now_arg(), DUE_BATCH])
                groups = [g.decode("utf-8", "surrogateescape") for g in due[1:]]
                for group_id in groups:
                    applied += int(self._call("expire_deadlines", pk.group(group_id), [])[0])
                if len(groups) < DUE_BATCH:
                    break
        return applied
