"""The settings of a namespace, its partition count above all, as one fact every party agrees on.

Which coordinator partition holds a group depends on the partition count, so two processes that
disagree on it would each run their own copy of a group (split brain). Kafka avoids this by
fixing ``offsets.topic.num.partitions`` when ``__consumer_offsets`` is created; rcoord does the
same with Redis as the only authority:

* **Established once, atomically, by whoever comes first.** ``<ns>:settings`` is written by one
  script only if it does not exist (``establish``); a process that named nothing proposes the
  defaults, and every later process adopts what is stored. A process that *names* a setting
  updates it (``update``), which bumps ``version``.
* **Checked by every group script.** Each partition holds a copy (``<ns>:{tag}:cfg``), and the
  tag includes the partition count (``rcoord.partitioning``), so a process with a stale count
  addresses keys where no copy exists. The group scripts refuse such a call before any write
  (``RCOORD_NOT_COORDINATOR``), and the coordinator settles again and retries by itself, as a
  Kafka client re-discovers its coordinator on NOT_COORDINATOR.
* **Re-established after data loss without disagreement.** A process that finds the settings
  gone proposes, in order: a surviving anchor copy (``keys.anchor_keys``: 16 copies at names
  independent of the partition count, spread over the slot range, because the settings hash
  and the copies live in different slots and a failover may lose one and not the other), the
  settings it was already using, or its own. Whatever it proposes, ``establish`` lets only the
  first proposal stand. A process that named settings writes them again when it notices they
  are gone (the coordinator service checks every lease round), so a lowered minimum session
  timeout comes back by itself.
* **The count changes only in an empty namespace.** Changing it first checks that no group
  exists, then stores the new count, deletes the old copies (old-layout calls are refused from
  then on) and writes the new ones. A group created in the instant between the check and the
  deletion is reported (logged); it can no longer be reached and its members rejoin under the
  new count.

The steps are a sans-I/O generator (``settle_flow``) so the blocking and the asyncio
coordinators share them; each drives it with its own I/O (``settle`` here, and
``rcoord.asyncio``).
"""

from __future__ import annotations

import logging
from collections.abc import Generator, Mapping
from typing import Any

from .config import STORED_SETTINGS, CoordinatorConfig
from .errors import ConfigError
from .keys import PartitionKeys, anchor_keys, settings_key

__all__ = ["MAX_SETTLE_ROUNDS", "Settled", "asettle", "copy_pattern", "settle", "settle_flow"]

log = logging.getLogger("rcoord.settings")

MAX_SETTLE_ROUNDS = 5
"""Rounds of settling when writers race (a copy write meets a newer version); then give up."""

Op = tuple[Any, ...]


class Settled:
    """What ``settle_flow`` returns: the settings in force and their version."""

    def __init__(self, config: CoordinatorConfig, version: int, was: Mapping[str, str]) -> None:
        self.config = config
        self.version = version
        self.was = dict(was)
        """The stored values before this settle changed them ({} if none were stored)."""


def copy_pattern(namespace: str) -> str:
    """SCAN pattern of every partition copy of ``namespace``, whatever its count (for checks)."""
    return f"{namespace}:{{*}}:cfg"


def _decode(raw: Any) -> dict[str, str]:
    """A flat field/value reply (or a dict) as str -> str."""
    if isinstance(raw, dict):
        items = list(raw.items())
    else:
        items = [(raw[i], raw[i + 1]) for i in range(0, len(raw), 2)]
    return {(k.decode() if isinstance(k, bytes) else str(k)): (v.decode() if isinstance(v, bytes) else str(v))
            for k, v in items}


def _values(cfg: CoordinatorConfig) -> dict[str, str]:
    return {name: str(value) for name, value in cfg.stored_values().items()}


def settle_flow(
    namespace: str, given: CoordinatorConfig | None, known: CoordinatorConfig | None
) -> Generator[Op, Any, Settled]:
    """Settle the namespace's settings; yields I/O operations, returns the settings in force.

    ``given`` is the config the caller constructed (its *named* settings are written); ``known``
    the settings the caller used so far (re-proposed if the namespace lost them). Operations and
    what must be sent back:

    * ``("read",)`` -> the settings hash as a dict (empty if none);
    * ``("find_copies",)`` -> every surviving anchor copy, as a list of dicts;
    * ``("establish", values)`` / ``("update", values)`` -> the stored hash after the script;
    * ``("count_groups", num_partitions)`` -> groups held under that count;
    * ``("copies", num_partitions, version, values)`` -> how many copies were *not* written
      because a newer version was there;
    * ``("drop_copies", num_partitions)`` -> None.
    """
    base = given if given is not None else CoordinatorConfig(namespace=namespace)
    named = (given.named - {"namespace"}) if given is not None else frozenset()
    for _ in range(MAX_SETTLE_ROUNDS):
        stored: dict[str, str] = yield ("read",)
        was = dict(stored)
        if "num_partitions" not in stored:
            stored = yield ("establish", (yield from _proposal(namespace, base, known)))
        changes = {name: str(getattr(base, name)) for name in named
                   if stored.get(name) != str(getattr(base, name))}
        if changes:
            old_np = int(stored["num_partitions"])
            new_np = int(changes.get("num_partitions", old_np))
            if new_np != old_np and (yield ("count_groups", old_np)):
                raise ConfigError(
                    f"num_partitions is fixed at {old_np} for namespace {namespace!r} because it "
                    "holds groups; delete them or use another namespace"
                )
            stored = yield ("update", changes)
            if new_np != old_np:
                yield ("drop_copies", old_np)
                late = yield ("count_groups", old_np)
                if late:
                    log.warning("%d group(s) were created under the old partition count %d while "
                                "namespace %r moved to %d; their members rejoin under the new count",
                                late, old_np, namespace, new_np)
        effective = base.merged_with_stored(stored)
        version = int(stored.get("version", "1"))
        stale = yield ("copies", effective.num_partitions, version, _values(effective))
        if not stale:
            return Settled(effective, version, was)
    raise ConfigError(
        f"the settings of namespace {namespace!r} kept changing while this process read them "
        f"({MAX_SETTLE_ROUNDS} rounds); try again"
    )


def _proposal(
    namespace: str, base: CoordinatorConfig, known: CoordinatorConfig | None
) -> Generator[Op, Any, dict[str, str]]:
    copies: list[dict[str, str]] = yield ("find_copies",)
    usable = [c for c in copies if "num_partitions" in c]
    if usable:
        best = max(usable, key=lambda c: int(c.get("version", "0")))
        counts = {c["num_partitions"] for c in usable}
        if len(counts) > 1:
            log.warning("namespace %r has partition copies for several counts %s; adopting %s",
                        namespace, sorted(counts), best["num_partitions"])
        return {k: v for k, v in best.items() if k in STORED_SETTINGS or k == "version"}
    if known is not None:
        return _values(known)
    return _values(base)


# -- the blocking driver ---------------------------------------------------------------------


def settle(client: Any, scripts: Any, namespace: str, given: CoordinatorConfig | None,
           known: CoordinatorConfig | None) -> Settled:
    """Run ``settle_flow`` with a blocking redis-py client (``scripts.settings`` loaded)."""
    flow = settle_flow(namespace, given, known)
    key = settings_key(namespace)
    result: Any = None
    try:
        op = next(flow)
        while True:
            kind = op[0]
            if kind == "read":
                result = _decode(client.hgetall(key))
            elif kind == "find_copies":
                pipe = client.pipeline(transaction=False)
                for k in anchor_keys(namespace):
                    pipe.hgetall(k)
                result = [_decode(h) for h in pipe.execute() if h]
            elif kind in ("establish", "update"):
                flat = [x for kv in op[1].items() for x in kv]
                result = _decode(scripts.settings(keys=[key], args=[kind, *flat]))
            elif kind == "count_groups":
                result = _count_groups(client, namespace, op[1])
            elif kind == "copies":
                result = _write_copies(client, scripts, namespace, op[1], op[2], op[3])
            elif kind == "drop_copies":
                pipe = client.pipeline(transaction=False)
                for p in range(op[1]):
                    pipe.delete(PartitionKeys(namespace, p, op[1]).cfg)
                pipe.execute()
                result = None
            else:  # pragma: no cover - the flow yields nothing else
                raise AssertionError(op)
            op = flow.send(result)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


def _count_groups(client: Any, namespace: str, num_partitions: int) -> int:
    pipe = client.pipeline(transaction=False)
    for p in range(num_partitions):
        pipe.scard(PartitionKeys(namespace, p, num_partitions).groups)
    return sum(int(n) for n in pipe.execute())


def _write_copies(client: Any, scripts: Any, namespace: str, num_partitions: int, version: int,
                  values: Mapping[str, str]) -> int:
    flat = ["copy", str(version), *[x for kv in values.items() for x in kv]]
    keys = [PartitionKeys(namespace, p, num_partitions).cfg for p in range(num_partitions)]
    keys += anchor_keys(namespace)
    sha = scripts.sha("settings")
    pipe = client.pipeline(transaction=False)
    for k in keys:
        pipe.execute_command("EVALSHA", sha, 1, k, *flat)
    stale = 0
    for k, reply in zip(keys, pipe.execute(raise_on_error=False), strict=True):
        if isinstance(reply, Exception):  # NOSCRIPT after a restart: the Script object reloads
            reply = scripts.settings(keys=[k], args=flat)
        stale += int(reply) == 0
    return stale


# -- the asyncio driver ----------------------------------------------------------------------


async def asettle(client: Any, scripts: Any, namespace: str, given: CoordinatorConfig | None,
                  known: CoordinatorConfig | None) -> Settled:
    """Run ``settle_flow`` with a ``redis.asyncio`` client: the same steps, awaited."""
    flow = settle_flow(namespace, given, known)
    key = settings_key(namespace)
    result: Any = None
    try:
        op = next(flow)
        while True:
            kind = op[0]
            if kind == "read":
                result = _decode(await client.hgetall(key))
            elif kind == "find_copies":
                result = [_decode(h) for h in [await client.hgetall(k) for k in anchor_keys(namespace)] if h]
            elif kind in ("establish", "update"):
                flat = [x for kv in op[1].items() for x in kv]
                result = _decode(await scripts.settings(keys=[key], args=[kind, *flat]))
            elif kind == "count_groups":
                pipe = client.pipeline(transaction=False)
                for p in range(op[1]):
                    pipe.scard(PartitionKeys(namespace, p, op[1]).groups)
                result = sum(int(n) for n in await pipe.execute())
            elif kind == "copies":
                flat = ["copy", str(op[2]), *[x for kv in op[3].items() for x in kv]]
                result = 0
                for k in [PartitionKeys(namespace, p, op[1]).cfg for p in range(op[1])] + anchor_keys(namespace):
                    reply = await scripts.settings(keys=[k], args=flat)
                    result += int(reply) == 0
            elif kind == "drop_copies":
                for p in range(op[1]):
                    await client.delete(PartitionKeys(namespace, p, op[1]).cfg)
                result = None
            else:  # pragma: no cover - the flow yields nothing else
                raise AssertionError(op)
            op = flow.send(result)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
