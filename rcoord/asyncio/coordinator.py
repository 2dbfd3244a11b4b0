"""AsyncGroupCoordinator: the group protocol for asyncio programs (``redis.asyncio`` clients).

It shares everything with ``rcoord.GroupCoordinator`` but the I/O: the Lua scripts, the request
checks and encodings and the reply decoders (``rcoord.protocol``), and the parked-call wait
(``rcoord.protocol.park.park_flow``) and the settling of the namespace settings
(``rcoord.settings.settle_flow``). Writing namespace settings is an operator's act done with the
blocking ``GroupCoordinator``; this class uses what the namespace stores (establishing Kafka's
defaults if nothing is stored), as every party of a namespace must.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import redis.exceptions

from ..config import CoordinatorConfig
from ..errors import ConfigError, ConnectionLost, Errors, raise_for_script_error
from ..keys import GroupKeys
from ..protocol.heartbeat import decode_heartbeat, heartbeat_args
from ..protocol.join import JoinGroupResult, JoinRequest
from ..protocol.leave import LeaveGroupResult, MemberIdentity, decode_leave, leave_args
from ..protocol.offsets import (
    OffsetAndMetadata,
    OffsetFetchResult,
    TopicPartition,
    decode_fetch,
    encode_commit,
    fetch_batches,
)
from ..protocol._checks import check_id, check_instance_id, require_int32
from ..protocol.park import CLAIM_MS, MAX_BLOCK_MS, park_flow
from ..protocol.sync import SyncGroupResult, SyncRequest
from ..coordinator import NOT_COORDINATOR_RETRIES
from ..scripts import Scripts
from ..settings import asettle

__all__ = ["AsyncGroupCoordinator"]

T = TypeVar("T")


def _translated(fn: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T]]:
    """The asyncio twin of ``errors.translate_redis_errors``: the one exception boundary."""

    @functools.wraps(fn)
    async def wrapper(*args: Any, **kwargs: Any) -> T:
        try:
            return await fn(*args, **kwargs)
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
            raise ConnectionLost(f"{fn.__name__}: {exc}") from exc
        except redis.exceptions.ResponseError as exc:
            raise_for_script_error(exc)
            raise

    return wrapper


class AsyncGroupCoordinator:
    """``await coord.join_group(...)`` and friends; see ``rcoord.GroupCoordinator`` for each step.

    ``redis_client`` is a ``redis.asyncio.Redis`` or ``redis.asyncio.RedisCluster`` created with
    ``decode_responses=False``. Nothing touches Redis until ``await start()`` or the first call.
    """

    def __init__(self, redis_client: Any, namespace: str = "rcoord", *,
                 clock: Callable[[], int] | None = None) -> None:
        self._redis = redis_client
        self._namespace = namespace
        self._clock = clock
        self._scripts = Scripts(redis_client)
        self._config: CoordinatorConfig | None = None
        self._keys_cache: dict[str, GroupKeys] = {}

    @_translated
    async def start(self) -> AsyncGroupCoordinator:
        if self._config is None:
            encoder = self._redis.get_encoder() if hasattr(self._redis, "get_encoder") else None
            if encoder is not None and getattr(encoder, "decode_responses", False):
                raise ConfigError("AsyncGroupCoordinator needs a client with decode_responses=False")
            self._scripts.load()
            await self.resettle()
        return self

    async def resettle(self) -> CoordinatorConfig:
        """Read (or re-establish) the namespace settings; what a NOT_COORDINATOR triggers."""
        settled = await asettle(self._redis, self._scripts, self._namespace,
                                CoordinatorConfig(namespace=self._namespace), self._config)
        if self._config is not None and self._config.num_partitions != settled.config.num_partitions:
            self._keys_cache.clear()
        self._config = settled.config
        return settled.config

    @property
    def config(self) -> CoordinatorConfig:
        if self._config is None:
            raise RuntimeError("await start() first")
        return self._config

    async def _keys(self, group_id: str) -> GroupKeys:
        if self._config is None:
            await self.start()
        keys = self._keys_cache.get(group_id)
        if keys is None:
            keys = GroupKeys.of(self.config.namespace, self.config.num_partitions, group_id)
            self._keys_cache[group_id] = keys
        return keys

    def _now_arg(self) -> str:
        return "" if self._clock is None else str(int(self._clock()))

    async def _call(self, step: str, keys: GroupKeys, args: Sequence[Any]) -> Any:
        """Run a group step; on a stale layout settle again and retry (see GroupCoordinator)."""
        script = getattr(self._scripts, step)
        for attempt in range(NOT_COORDINATOR_RETRIES + 1):
            try:
                return await script(keys=keys.all(), args=[self._now_arg(), keys.group_id, *args])
            except redis.exceptions.ResponseError as exc:
                if "RCOORD_NOT_COORDINATOR" not in str(exc) or attempt == NOT_COORDINATOR_RETRIES:
                    raise
            await self.resettle()
            keys = await self._keys(keys.group_id)
        raise AssertionError("unreachable")  # pragma: no cover

    async def _park(self, keys: GroupKeys, member_id: str, kind: str, reply: list[Any]) -> bytes:
        keys = await self._keys(keys.group_id)  # as the parking call addressed it, after any re-settle
        flow = park_flow(reply, mock_clock=self._clock is not None, max_block_ms=MAX_BLOCK_MS)
        try:
            op = next(flow)
            while True:
                if op[0] == "xread":
                    result: Any = bool(await self._redis.xread({keys.wake: op[1]}, count=1, block=op[2]))
                elif op[0] == "zscore":
                    result = await self._redis.zscore(keys.partition.due, keys.group_id)
                elif op[0] == "claim":
                    result = bool(await self._redis.set(keys.claim, b"1", nx=True, px=CLAIM_MS))
                else:
                    result = await self._call("await_reply", keys, [member_id, kind])
                op = flow.send(result)
        except StopIteration as done:
            return bytes(done.value)

    # -- the protocol ------------------------------------------------------------------------

    @_translated
    async def join_group(self, group_id: str, member_id: str = "", *, protocol_type: str,
                         protocols: Sequence[tuple[str, bytes]], session_timeout_ms: int,
                         rebalance_timeout_ms: int | None = None, group_instance_id: str | None = None,
                         client_id: str = "", client_host: str = "",
                         require_known_member_id: bool = True, reason: str | None = None) -> JoinGroupResult:
        req = JoinRequest.build(
            group_id, member_id, protocol_type=protocol_type, protocols=protocols,
            session_timeout_ms=session_timeout_ms, rebalance_timeout_ms=rebalance_timeout_ms,
            group_instance_id=group_instance_id, client_id=client_id, client_host=client_host,
            require_known_member_id=require_known_member_id, reason=reason)
        if not req.group_id:
            return JoinGroupResult.failed(Errors.INVALID_GROUP_ID, req.member_id)
        keys = await self._keys(req.group_id)
        reply = await self._call("join_group", keys, req.args())
        if reply[0] == b"W":
            parked_id = bytes(reply[4]).decode("utf-8", "surrogateescape")
            return JoinGroupResult.decode(await self._park(keys, parked_id, "j", reply))
        return JoinGroupResult.decode(bytes(reply[1]))

    @_translated
    async def sync_group(self, group_id: str, generation_id: int, member_id: str, *,
                         assignments: dict[str, bytes] | None = None, group_instance_id: str | None = None,
                         protocol_type: str | None = None, protocol_name: str | None = None) -> SyncGroupResult:
        req = SyncRequest.build(group_id, generation_id, member_id, assignments=assignments,
                                group_instance_id=group_instance_id, protocol_type=protocol_type,
                                protocol_name=protocol_name)
        if not req.group_id:
            return SyncGroupResult(Errors.INVALID_GROUP_ID)
        keys = await self._keys(req.group_id)
        reply = await self._call("sync_group", keys, req.args())
        if reply[0] == b"W":
            return SyncGroupResult.decode(await self._park(keys, req.member_id, "s", reply))
        return SyncGroupResult.decode(bytes(reply[1]))

    @_translated
    async def heartbeat(self, group_id: str, generation_id: int, member_id: str,
                        group_instance_id: str | None = None) -> Errors:
        gid, args = heartbeat_args(group_id, generation_id, member_id, group_instance_id)
        if not gid:
            return Errors.INVALID_GROUP_ID
        keys = await self._keys(gid)
        for _ in range(5):
            reply = await self._scripts.heartbeat(keys=keys.heartbeat_keys(), args=[self._now_arg(), gid, *args])
            if reply != b"DUE":
                return decode_heartbeat(reply[0])
            await self._call("expire_deadlines", keys, [])  # deadlines act first
        return Errors.COORDINATOR_NOT_AVAILABLE

    @_translated
    async def leave_group(self, group_id: str, members: Sequence[MemberIdentity]) -> LeaveGroupResult:
        gid, idents, packed = leave_args(group_id, members)
        if not gid:
            return LeaveGroupResult(Errors.INVALID_GROUP_ID)
        reply = await self._call("leave_group", await self._keys(gid), [packed])
        return decode_leave(reply, idents)

    @_translated
    async def commit_offsets(self, group_id: str, offsets: dict[TopicPartition, OffsetAndMetadata | int], *,
                             member_id: str = "", generation_id: int = -1,
                             group_instance_id: str | None = None) -> dict[TopicPartition, Errors]:
        gid = check_id("group_id", group_id)
        order, packed = encode_commit(offsets)
        args = [check_id("member_id", member_id), require_int32("generation_id", generation_id),
                check_instance_id(group_instance_id), "", packed]
        if not order:
            return {}
        reply = await self._call("commit_offsets", await self._keys(gid), args)
        return {tp: Errors.from_name(code) for tp, code in zip(order, reply[1], strict=True)}

    @_translated
    async def fetch_offsets(self, group_id: str, partitions: Sequence[TopicPartition] | None = None) -> OffsetFetchResult:
        gid = check_id("group_id", group_id)
        keys = await self._keys(gid)
        if partitions is None:
            flat = await self._call("fetch_offsets", keys, [])
            return OffsetFetchResult(Errors.NONE, decode_fetch(flat))
        offsets = {}
        for batch in fetch_batches(partitions):
            offsets.update(decode_fetch(await self._call("fetch_offsets", keys, batch)))
        return OffsetFetchResult(Errors.NONE, offsets)
