"""Partition leases: which coordinator process does each partition's timer work.

Live coordinators register in ``<ns>:coordinators`` (a zset of id -> expiry, server time). Every
coordinator computes the same plan from the same live set: each partition goes to the
coordinator that ranks it highest (rendezvous hashing, so a join or a death moves few
partitions), capped at the fair share ceil(partitions / coordinators). A coordinator acquires
the leases the plan gives it, renews them, and hands the others straight to their planned holder
and announces it, so the new holder starts at once. A lease whose holder is gone from the
registry (it stopped, or died and its registry entry expired after one TTL) is taken by the
partition's planned holder at once. Leases never guard state: two holders at once are harmless.

On a cluster a round is run per node (``nodes.each_node``): a master that fails costs the leases
on it, not the renewal of the others; while the registry's own master fails, every coordinator
keeps the plan of its last round. Each node's piece goes through that node's own client, with
no retry, and a hung master's piece runs beside the others' (``nodes``): a lease round on the
healthy nodes stays far shorter than the TTL, as Kafka's broker times out its requests to one
unresponsive node (``request.timeout.ms``) without holding up the others.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import redis

from ..keys import PartitionKeys
from ..scripts import Scripts
from .nodes import NODE_FAILURES, each_node, node_scripts, on_node

__all__ = ["plan", "LeaseKeeper"]

log = logging.getLogger("rcoord.service")
T = TypeVar("T")


def _rank(coordinator_id: str, partition: int) -> int:
    digest = hashlib.blake2b(f"{coordinator_id}\x00{partition}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def plan(num_partitions: int, live: Sequence[str]) -> dict[int, str]:
    """Partition -> coordinator, the same for everyone who sees the same ``live`` set."""
    if not live:
        return {}
    cap = -(-num_partitions // len(live))
    load = {c: 0 for c in live}
    out: dict[int, str] = {}
    for p in range(num_partitions):
        for c in sorted(live, key=lambda c: (_rank(c, p), c), reverse=True):
            if load[c] < cap:
                out[p] = c
                load[c] += 1
                break
    return out


class LeaseKeeper:
    """One coordinator's view of the leases; ``step()`` is one round of register/acquire/renew."""

    def __init__(
        self,
        client: Any,
        scripts: Scripts,
        namespace: str,
        num_partitions: int,
        coordinator_id: str,
        ttl_ms: int,
    ) -> None:
        self._client = client
        self._scripts = scripts
        self._namespace = namespace
        self._n = num_partitions
        self.coordinator_id = coordinator_id
        self.ttl_ms = ttl_ms
        self.owned: set[int] = set()
        self.live: list[str] = []
        self.handed_off = False
        # A round and a release never overlap, and none runs after the final release: a round
        # still running when the service stopped took back every lease the release had just
        # freed, and put the process back in the registry (the others then waited for them
        # to lapse).
        self._round = threading.Lock()
        self._released_for_good = False
        self._lease_keys = [PartitionKeys(namespace, p, num_partitions).lease for p in range(num_partitions)]

    @property
    def registry_key(self) -> str:
        return f"{self._namespace}:coordinators"

    @property
    def channel(self) -> str:
        """Broadcast channel: a coordinator joined or left; everyone re-plans at once."""
        return f"{self._namespace}:coordinators"

    def _on_registry_node(self, call: Callable[[Any], T]) -> T:
        """``call`` through the registry's node's own client (never the cluster client's
        retries), with that node's backoff and log (``nodes.on_node``)."""
        return on_node(self._client, self.registry_key, call)

    def register(self) -> list[str]:
        def run(node: Any) -> list[Any]:
            sec, usec = node.time()
            now = int(sec) * 1000 + int(usec) // 1000
            pipe = node.pipeline(transaction=False)
            pipe.zadd(self.registry_key, {self.coordinator_id: now + self.ttl_ms})
            pipe.zremrangebyscore(self.registry_key, "-inf", now)
            pipe.zrange(self.registry_key, 0, -1)
            return list(pipe.execute()[2])

        live = sorted(x.decode() for x in self._on_registry_node(run))
        self.live = live
        return live

    def _registered(self) -> list[str]:
        """``register()``; if the registry's node cannot be reached, the coordinators known
        from the last round: every coordinator then keeps the plan it had, and the leases on
        the healthy nodes are renewed while the registry's node fails over (no newcomer or
        departure is seen meanwhile)."""
        try:
            return self.register()
        except NODE_FAILURES as exc:
            if not self.live:
                raise
            # (The node's failure is logged once per outage, by nodes.py.)
            log.debug("the coordinator registry cannot be reached; keeping the last plan",
                      extra={"event": "registry_unreachable", "why": str(exc), "live": self.live})
            return self.live

    def _lease_key(self, p: int) -> str:
        return self._lease_keys[p]

    def _op(self, node: Any, p: int, op: str, target: str = "") -> str:
        holder = node_scripts(self._scripts, node).lease(
            keys=[self._lease_keys[p]], args=[op, self.coordinator_id, self.ttl_ms, target]
        )
        return holder.decode() if isinstance(holder, bytes) else str(holder)

    def _ops(self, ops: list[tuple[int, str, str]], unreachable: set[int]) -> dict[int, str]:
        """Lease operations in one pipeline per node (one round trip each): a lease round must
        stay far shorter than the TTL even with many partitions or a distant server. The
        partitions of a node that fails are added to ``unreachable``."""
        out: dict[int, str] = {}

        def run(node: Any, piece: list[tuple[int, str, str]]) -> None:
            pipe = node.pipeline(transaction=False)
            for p, op, target in piece:
                pipe.execute_command(*self._scripts.command(
                    "lease", [self._lease_keys[p]], [op, self.coordinator_id, self.ttl_ms, target]))
            for (p, op, target), reply in zip(piece, pipe.execute(raise_on_error=False),
                                              strict=True):
                if isinstance(reply, (redis.ConnectionError, redis.TimeoutError,
                                      redis.exceptions.AskError)):
                    raise reply  # (a slot moved: each_node runs the piece again, following it)
                if isinstance(reply, Exception):  # library missing after a restart: _op loads it
                    out[p] = self._op(node, p, op, target)
                else:
                    out[p] = reply.decode() if isinstance(reply, bytes) else str(reply)

        for piece, exc in each_node(self._client, ops, lambda op: self._lease_key(op[0]), run):
            self._node_failed([p for p, _, _ in piece], exc, unreachable)
        return out

    def _holders(self, unreachable: set[int]) -> dict[int, str]:
        holders: dict[int, str] = {}

        def read(node: Any, partitions: list[int]) -> None:
            pipe = node.pipeline(transaction=False)
            for p in partitions:
                pipe.get(self._lease_keys[p])
            for p, h in zip(partitions, pipe.execute(), strict=True):
                holders[p] = h.decode() if h else ""

        for partitions, exc in each_node(self._client, range(self._n), self._lease_key, read):
            self._node_failed(partitions, exc, unreachable)
        return holders

    @staticmethod
    def _node_failed(partitions: list[int], exc: BaseException, unreachable: set[int]) -> None:
        """Leases on a node that fails are neither renewed nor counted as ours this round (they
        lapse with it; the sweeper could not reach those partitions either); the next round
        takes them again once the node answers."""
        unreachable.update(partitions)
        # (The node's failure is logged once per outage, by nodes.py.)
        log.debug("a node's leases could not be renewed", extra={
            "event": "leases_unreachable", "partitions": partitions, "why": str(exc)})

    def step(self) -> set[int]:
        """Register, then take, renew or hand off leases so the plan holds; return what we own.

        Also sets ``handed_off``: whether this round gave partitions away (the caller then tells
        the others, so the new holder starts at once instead of at its next round). After
        ``release_all(final=True)`` a round does nothing and owns nothing."""
        with self._round:
            if self._released_for_good:
                self.owned, self.handed_off = set(), False
                return set()
            return self._step()

    def _step(self) -> set[int]:
        live = self._registered()
        if self.coordinator_id not in live:
            live = sorted([*live, self.coordinator_id])
        wanted = plan(self._n, live)
        unreachable: set[int] = set()
        holders = self._holders(unreachable)
        ops: list[tuple[int, str, str]] = []
        for p in range(self._n):
            if p in unreachable:
                continue
            if wanted[p] == self.coordinator_id:
                ops.append((p, "acquire", ""))
            elif holders[p] == self.coordinator_id:
                ops.append((p, "handoff", wanted[p]))
        # Partitions handed over stop being ours before their new holder can take them: this
        # process then stops reading their events (observe.EventTail) before that holder goes
        # on from the position stored, rather than at the end of the round.
        handing = {p for p, op, _ in ops if op == "handoff"}
        if handing & self.owned:
            self.owned = self.owned - handing
        results = self._ops(ops, unreachable)
        steals = [(p, "steal", h) for p, h in results.items()
                  if p not in unreachable and wanted[p] == self.coordinator_id
                  and h not in ("", self.coordinator_id) and h not in live]
        results.update(self._ops(steals, unreachable))
        self.handed_off = any(op == "handoff" for p, op, _ in ops if p not in unreachable)
        owned = {p for p in range(self._n)
                 if p not in unreachable and results.get(p, holders[p]) == self.coordinator_id}
        self.owned = owned  # a new set each round: readers in other threads see one or the other
        return owned

    def release_all(self, final: bool = False) -> None:
        """Graceful exit: free our leases and leave the registry, so others take over at once
        (a lease on a node that fails lapses by itself). Waits for a round in progress to end;
        ``final``: no round takes leases again (the service's stop; a stalled timer loop's
        release is taken back by the next round once the loop runs again)."""
        with self._round:
            if final:
                self._released_for_good = True
            self._release()

    def _release(self) -> None:
        self._ops([(p, "release", "") for p in sorted(self.owned)], set())
        self.owned = set()
        self._on_registry_node(lambda node: node.zrem(self.registry_key, self.coordinator_id))
        self.announce(b"left")

    def announce(self, what: bytes) -> None:
        """Tell the other coordinators (``channel``), through the registry's node: a message
        published on one node of a cluster reaches every node's subscribers."""
        self._on_registry_node(lambda node: node.publish(self.channel, what))
