"""The rcoord Functions library: every group step, the heartbeat, the sweep, leases and settings.

The Lua files are assembled into one Redis Functions library (Redis 7+, Valkey): the shared
helpers (``clock.lua``, ``deadline_index.lua``, ``prelude.lua``) are defined once, when the
library loads, and each step registers a function. A call therefore runs only its step, where a
script re-ran the ~900-line prelude (about a hundred closures) every time.

The library opens with the contract both languages share (states, settings defaults, key
layout, error names), rendered from the Python definitions by ``rcoord.contract``.

The library's name carries a hash of its source (``rcoord_<hash>``, functions
``rcoord_<hash>_<step>``), so two rcoord versions sharing a server never call each other's code
and loading is idempotent. It is loaded lazily: a call that the server answers "Function not
found" (never loaded, a restart without persistence, a failover to a replica that never had it,
``FUNCTION FLUSH``) loads it on the master that answered (``FUNCTION LOAD REPLACE``) and is
sent again, up to ``MAX_RELOADS`` times (another flush or failover may land between the load
and the call). Only that master: a master that is down or hung must not fail, or hold up, the
calls of the others (each master that lost the library loads it at its own first call). The
callers that meet one loss together share one load (see ``Scripts``).

Topic scripts (``lua/topic_*.lua``) stay scripts called by SHA (``rcoord.topics._base``): they
are small, run without the prelude, and are called from pipelines that batch them by the
hundred; ``lua_source`` serves them.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import inspect
import threading
from collections.abc import Callable, Sequence
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

import redis

from .contract import lua_header
from .errors import is_missing_function

__all__ = ["GROUP_STEPS", "MAX_RELOADS", "STANDALONE", "LoopLock", "Scripts", "build_library",
           "is_missing_function", "library_source", "lua_dir", "lua_source", "route_fcall_locally",
           "send_reloading"]

GROUP_STEPS = (
    "join_group",
    "sync_group",
    "leave_group",
    "await_reply",
    "expire_deadlines",
    "commit_offsets",
    "fetch_offsets",
    "describe_group",
    "delete_group",
    "delete_offsets",
)
"""Steps that run inside the prelude's ``group_step`` wrapper and take the group keys layout."""

STANDALONE = ("due_groups", "defer_due", "heartbeat", "lease", "settings")
"""Functions outside the wrapper: partition-level and namespace-level ones, and the heartbeat
hot path."""

SHARED = ("clock", "deadline_index", "prelude")
"""The library's shared part, in order, in front of the step files."""

INCLUDES: dict[str, tuple[str, ...]] = {
    **{f"topic_{n}": ("clock", "topic_common") for n in (
        "append", "append_idempotent", "offsets", "retention", "create_meta",
        "offset_for_time", "delete_records")},
    "topic_producer_ttl": ("clock",),
    "spark_replay_record": ("clock",),
    "spark_replay_read": ("clock",),
}
"""Shared files put in front of a topic (or Spark) script, in order (scripts cannot import)."""


def lua_dir() -> Path:
    """Where the .lua files are: inside the wheel (rcoord/lua) or the source tree (lua/)."""
    packaged = resources.files("rcoord") / "lua"
    if packaged.is_dir():
        return Path(str(packaged))
    source = Path(__file__).resolve().parent.parent / "lua"
    if source.is_dir():
        return source
    raise FileNotFoundError("rcoord's Lua scripts are missing: neither rcoord/lua nor lua/ exists")


def lua_source(name: str) -> str:
    """The full source sent to Redis for the (topic) script ``name``."""
    base = lua_dir()
    parts = [(base / f"{inc}.lua").read_text() for inc in INCLUDES.get(name, ())]
    parts.append((base / f"{name}.lua").read_text())
    return "\n".join(parts)


@functools.cache
def library_source() -> tuple[str, str]:
    """(library name, FUNCTION LOAD source) of the rcoord library."""
    return build_library(lua_header())


def build_library(header: str) -> tuple[str, str]:
    """(name, source) of the library with ``header`` (the rendered contract,
    ``rcoord.contract.lua_header``) in front of the Lua files. The name hashes everything, so a
    changed contract or file is a different library."""
    base = lua_dir()
    shared = [(base / f"{part}.lua").read_text() for part in SHARED]
    steps = [_scoped((base / f"{part}.lua").read_text()) for part in (*GROUP_STEPS, *STANDALONE)]
    body = "\n".join([header, *shared, *steps])
    name = "rcoord_" + hashlib.sha1(body.encode()).hexdigest()[:12]
    return name, library_head(name) + body


def library_head(name: str) -> str:
    """The lines that open library ``name``'s FUNCTION LOAD source: its name, and ``LIB``, the
    prefix its functions are registered under (prelude.lua ``register``)."""
    return f"#!lua name={name}\nlocal LIB = '{name}'\n"


def _scoped(step_file: str) -> str:
    """A step file inside its own ``do ... end`` block. Lua 5.1 allows a function (the library's
    main chunk too) 200 local variables; the shared part's helpers are locals of that chunk, so
    if every step file's own locals counted as well, the library would stop loading after a few
    more helpers. In a block, a file's locals end with the file: the limit applies to the shared
    part plus the largest step file, and no step can reach another's locals by accident."""
    return f"do\n{step_file}\nend"


T = TypeVar("T")

MAX_RELOADS = 3
"""Times one call loads the library and sends itself again while the server answers that the
function is missing. Once is not always enough: another FUNCTION FLUSH, a restart or a failover
may land between the load and the call it was for (most likely what failed one CI run of the
fault test that flushes four times in a row: a member took the second "Function not found" for
an unknown error and left its group). A call that still finds it missing raises, and the public
API's boundary turns that into ``ServerUnavailable`` (retried, not taken for an unknown error)."""


def send_reloading(first: Callable[[], T], again: Callable[[], T], load: Callable[[], object],
                   missing: Callable[[redis.ResponseError], bool]) -> T:
    """``first()``; while the server answers that the function or script is missing
    (``missing``), ``load()`` it and send ``again()``, up to ``MAX_RELOADS`` loads; a call that
    still finds it missing raises. The one reload loop of the library's functions
    (``Scripts.call``; ``Scripts.acall`` is its asyncio twin) and of the topic scripts
    (``rcoord.topics._base._Lua``)."""
    send = first
    for loads in range(MAX_RELOADS + 1):
        try:
            return send()
        except redis.ResponseError as exc:
            if not missing(exc) or loads == MAX_RELOADS:
                raise
        load()
        send = again
    raise AssertionError("not reached")  # (the loop returns or raises)


def route_fcall_locally(client: Any) -> None:
    """Make a redis-py cluster client find an FCALL's (and a pipelined EVALSHA's) slot from its
    first key, without a round trip.

    redis-py treats FCALL as a command with "movable keys" and asks a server (``COMMAND
    GETKEYS``, on its default node) before every call: a second round trip per step, and every
    call fails while that one node is down. Its client knows where EVALSHA keeps its keys, but
    its cluster pipeline asks the default node the same way, so every pipeline of topic scripts
    (appends to several partitions, fetches' log offsets) failed while that node was down,
    though their keys' masters answered. All keys of an rcoord function or topic script share
    one slot and there is always at least one, so the first key decides. The change is made in
    the client's own command table (shared with its pipelines; made again after redis-py
    reloads the table); a client without one is left alone.
    """
    parser = getattr(client, "commands_parser", None)
    commands = getattr(parser, "commands", None)
    if not isinstance(commands, dict):
        return
    for name in ("fcall", "evalsha"):
        entry = commands.get(name)
        if not isinstance(entry, dict) or "movablekeys" not in entry.get("flags", ()):
            continue
        commands[name] = {**entry, "flags": [f for f in entry["flags"] if f != "movablekeys"],
                          "first_key_pos": 3, "last_key_pos": 3, "step_count": 1}


class LoopLock:
    """An ``asyncio.Lock`` for the running event loop: ``lock()`` gives the same lock while the
    loop is the same, and a new one for another loop. An ``asyncio.Lock`` binds to the loop
    that first waits on it, so one made once and contended under one ``asyncio.run`` failed
    every contended caller under the next with ``RuntimeError: ... is bound to a different
    event loop``. (A lock held when its loop ended is of no use to the next loop anyway.)"""

    __slots__ = ("_lock", "_loop")

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock: asyncio.Lock | None = None

    def lock(self) -> asyncio.Lock:
        loop = asyncio.get_running_loop()
        if self._lock is None or loop is not self._loop:
            self._loop, self._lock = loop, asyncio.Lock()
        return self._lock


class Scripts:
    """The library's functions as called through one Redis client (blocking or asyncio).

    ``scripts.<step>(keys=..., args=...)`` runs a function (a coroutine with an asyncio client),
    loading the library first if the server lacks it. ``command()`` gives the FCALL to queue in
    a pipeline; a pipelined call that comes back ``is_missing_function`` is sent again through
    ``scripts.<step>``, which loads. Using a step before ``load()`` is a bug and raises at once.
    """

    def __init__(self, client: Any) -> None:
        self._client = client
        self._async = inspect.iscoroutinefunction(getattr(client, "execute_command", None))
        self.library, self._source = library_source()
        self.names = {step: f"{self.library}_{step}" for step in GROUP_STEPS + STANDALONE}
        self._ready = False
        self._cluster = hasattr(client, "commands_parser")
        # One load per loss, not one per caller: the threads (or tasks) that meet "Function not
        # found" together wait for one load, then send again (a load blocks the server for
        # about 2 ms, and a process may run hundreds of members). ``_loads`` counts the loads
        # done and ``_loaded_at`` holds each master's last one (its count then); a caller loads
        # its master only if that master was not loaded since the caller sent.
        self._loads = 0
        self._loaded_at: dict[str, int] = {}
        self._load_lock = threading.Lock()
        self._aload_lock = LoopLock()  # (asyncio: the running loop's lock)

    @property
    def loaded(self) -> bool:
        return self._ready

    @property
    def client(self) -> Any:
        """The client the functions are called through."""
        return self._client

    @property
    def is_async(self) -> bool:
        """Whether the client is a ``redis.asyncio`` one (its commands are coroutines)."""
        return self._async

    def load(self) -> None:
        """Allow calls. No I/O: the library is loaded on a master at its first "Function not
        found", so a blocking and an asyncio client start alike."""
        self._ready = True

    def command(self, name: str, keys: Sequence[Any], args: Sequence[Any]) -> tuple[Any, ...]:
        """The FCALL of function ``name``, e.g. to queue in a pipeline."""
        if not self._ready:
            raise RuntimeError(f"function {name!r} used before Scripts.load()")
        if self._cluster:
            route_fcall_locally(self._client)
        return ("FCALL", self.names[name], len(keys), *keys, *args)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name not in GROUP_STEPS + STANDALONE:
            raise AttributeError(name)
        if self._async:
            async def acall(*, keys: Sequence[Any], args: Sequence[Any]) -> Any:
                return await self.acall(name, keys, args)
            return acall

        def call(*, keys: Sequence[Any], args: Sequence[Any]) -> Any:
            return self.call(name, keys, args)
        return call

    # -- blocking ------------------------------------------------------------------------------

    def call(self, name: str, keys: Sequence[Any], args: Sequence[Any], shared: Any = None) -> Any:
        """FCALL ``name``; ``shared`` (``rcoord.batching.SharedCalls``) may send it together
        with other threads' calls."""
        command = self.command(name, keys, args)

        def direct() -> Any:
            return self._client.execute_command(*command)

        first = direct if shared is None else lambda: shared.execute(self._client, command)
        seen = self._loads

        def load_once() -> None:
            nonlocal seen
            nodes = self._answering(self._master_of(keys), keys)
            with self._load_lock:
                for node in nodes:
                    if self._due(node, seen):  # else another caller loaded it since this sent
                        self.load_library(node)
                        self._loaded(node)
                seen = self._loads

        return send_reloading(first, direct, load_once, is_missing_function)

    def _master_of(self, keys: Sequence[Any]) -> Any:
        """The cluster node a call with ``keys`` goes to (its first key's slot, as
        ``route_fcall_locally`` routes it); None for one node."""
        if not hasattr(self._client, "get_primaries") or not keys:
            return None
        return self._client.get_node_from_key(keys[0])

    def _answering(self, node: Any, keys: Sequence[Any]) -> list[Any]:
        """The masters that may have answered a call with ``keys`` sent to ``node``, its slot's
        master: ``node``, and the master the slot is migrating to when ``node`` sends the call
        there.

        While a slot migrates, the source answers ``ASK`` to a call whose keys have all moved,
        and the client sends it again to the importing master, which may never have had the
        library (a master just added, the usual reason to reshard). Loading ``node`` alone left
        every such call failing "Function not found" until the slot's move ended. The source is
        asked once, directly (no redirection followed), whether it has the first key
        (``EXISTS``): an ``ASK`` (or ``MOVED``) names the other master. Both are loaded, for the
        first key alone does not tell which of the two ran the call. Any other answer, or error,
        leaves ``node`` alone."""
        connection = getattr(node, "redis_connection", None)
        if connection is None or not keys:
            return [node]
        try:
            connection.execute_command("EXISTS", keys[0])
        except redis.exceptions.AskError as ask:  # (MOVED is one too)
            return self._with_redirect(node, ask)
        except redis.exceptions.RedisError:
            pass
        return [node]

    async def _aanswering(self, node: Any, keys: Sequence[Any]) -> list[Any]:
        """``_answering`` for an asyncio cluster client (whose nodes run commands)."""
        if node is None or not keys or not hasattr(node, "execute_command"):
            return [node]
        try:
            await node.execute_command("EXISTS", keys[0])
        except redis.exceptions.AskError as ask:
            return self._with_redirect(node, ask)
        except redis.exceptions.RedisError:
            pass
        return [node]

    def _with_redirect(self, node: Any, ask: redis.exceptions.AskError) -> list[Any]:
        """``node`` and the master ``ask`` sends to (when the client knows it or learns it)."""
        target = self._client.get_node(node_name=f"{ask.host}:{ask.port}")
        return [node] if target is None or target is node else [node, target]

    def _due(self, node: Any, seen: int) -> bool:
        """Whether ``node`` was last loaded before the caller that saw ``seen`` loads sent."""
        return self._loaded_at.get(getattr(node, "name", ""), 0) <= seen

    def _loaded(self, node: Any) -> None:
        self._loads += 1
        self._loaded_at[getattr(node, "name", "")] = self._loads

    def load_library(self, node: Any = None) -> None:
        """FUNCTION LOAD REPLACE on ``node``, a cluster's master (else on every master; one
        node: the client's)."""
        if node is not None:
            self._client.execute_command("FUNCTION", "LOAD", "REPLACE", self._source,
                                         target_nodes=node)
        elif hasattr(self._client, "get_primaries"):
            for master in self._client.get_primaries():
                self._client.execute_command("FUNCTION", "LOAD", "REPLACE", self._source,
                                             target_nodes=master)
        else:
            self._client.execute_command("FUNCTION", "LOAD", "REPLACE", self._source)

    # -- asyncio -------------------------------------------------------------------------------

    async def acall(self, name: str, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        command = self.command(name, keys, args)
        seen = self._loads
        try:
            return await self._client.execute_command(*command)
        except redis.ResponseError as exc:
            if not is_missing_function(exc):
                raise
        for reload in range(1, MAX_RELOADS + 1):
            nodes = await self._aanswering(self._master_of(keys), keys)
            async with self._aload_lock.lock():  # one load per loss, as in call()
                for node in nodes:
                    if self._due(node, seen):
                        await self.aload_library(node)
                        self._loaded(node)
                seen = self._loads
            try:
                return await self._client.execute_command(*command)
            except redis.ResponseError as exc:
                if not is_missing_function(exc) or reload == MAX_RELOADS:
                    raise
        raise AssertionError("not reached")  # (the loop returns or raises)

    async def aload_library(self, node: Any = None) -> None:
        if node is not None:
            await self._client.execute_command("FUNCTION", "LOAD", "REPLACE", self._source,
                                               target_nodes=node)
        elif hasattr(self._client, "get_primaries"):
            for master in self._client.get_primaries():
                await self._client.execute_command("FUNCTION", "LOAD", "REPLACE", self._source,
                                                   target_nodes=master)
        else:
            await self._client.execute_command("FUNCTION", "LOAD", "REPLACE", self._source)
