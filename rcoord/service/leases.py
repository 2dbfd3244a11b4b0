"""Partition leases: which coordinator process does each partition's timer work.

Live coordinators register in ``<ns>:coordinators`` (a zset of id -> expiry, server time). Every
coordinator computes the same plan from the same live set: each partition goes to the
coordinator that ranks it highest (rendezvous hashing, so a join or a death moves few
partitions), capped at the fair share ceil(partitions / coordinators). A coordinator acquires
the leases the plan gives it, renews them, and hands the others straight to their planned holder
and announces it, so the new holder starts at once. A lease whose holder is gone from the
registry (it stopped, or died and its registry entry expired after one TTL) is taken by the
partition's planned holder at once. Leases never guard state: two holders at once are harmless.

A coordinator id is one process's (``LeaseKeeper.claim_key``), as a broker id is one broker's:
each process draws an incarnation (host, pid and a random part), and the id's claim holds it for
a lease TTL, renewed by every round. Only the claim's holder registers the id, takes, renews or
releases its leases. A process started with the id of one that runs is refused once it sees the
claim renewed (``CoordinatorIdInUse``, as Kafka's controller refuses a broker whose id is
registered under another incarnation with a live session, DUPLICATE_BROKER_REGISTRATION); one
started after the last holder died takes the claim at once if that holder ran on this machine,
in this pid namespace, and its pid is free (``died_here``: a SIGKILL, a crash, systemd's
restart), else waits for the claim to lapse (at most the dead one's TTL); then it takes the
leases still under the id at once. A holder that finds its claim taken (it was paused for a
TTL, and another process took the id meanwhile) stops, and releases nothing: before, two
processes with one id shared every lease silently (each swept and logged the same partitions),
and stopping either one released the other's leases and registry entry.

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
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import redis

from ..errors import ConfigError, is_missing_function
from ..keys import PartitionKeys
from ..scripts import Scripts
from .nodes import NODE_FAILURES, each_node, node_scripts, on_node

__all__ = ["CoordinatorIdInUse", "LeaseKeeper", "StoppedBeforeClaim", "died_here",
           "new_incarnation", "plan", "this_machine"]

log = logging.getLogger("rcoord.service")
T = TypeVar("T")


class StoppedBeforeClaim(Exception):
    """The process was asked to stop (SIGTERM) while it waited for its id's claim to lapse: a
    graceful stop of a process that had not started, not an error (it took, wrote and released
    nothing)."""


class CoordinatorIdInUse(ConfigError):
    """Another process holds this coordinator id's claim: two processes were given one id."""

    def __init__(self, message: str, holder: str) -> None:
        super().__init__(message)
        self.holder = holder
        """The incarnation that holds the claim (host-pid-random, ``new_incarnation``)."""


def new_incarnation() -> str:
    """This process's incarnation: which process holds a claim (host and pid, for the operator
    to find it), unique per start (the random part), and, where it can be read, after a ``/``
    the kernel boot and pid namespace its pid is counted in (``this_machine``), which lets a
    process restarted on the same machine see that the holder died (``died_here``)."""
    here = this_machine()
    return (f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:12]}"
            + (f"/{here}" if here else ""))


def this_machine() -> str | None:
    """The running kernel's boot id and this process's pid namespace (its inode and device):
    two processes that give the same one count pids alike, so one can tell by the pid whether
    the other still runs. None where they cannot be read, or where ``/proc`` is not this pid
    namespace's (``/proc/self`` is not ``os.getpid()``)."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            boot = f.read().strip()
        if int(os.readlink("/proc/self")) != os.getpid():
            return None
        ns = os.stat("/proc/self/ns/pid")
    except (OSError, ValueError):
        return None
    return f"{boot}:{ns.st_dev}:{ns.st_ino}" if boot else None


def died_here(incarnation: str) -> bool:
    """Whether the process of ``incarnation`` is known to have ended: it ran on this machine,
    in this pid namespace (``this_machine``) and under this host name, and no process has its
    pid now. False whenever that cannot be told (another machine or container, a pid in use,
    which may be a new process's: the claim is then waited for, as before). A zombie (ended,
    not yet reaped) counts as running. The host name must match too because VMs cloned from
    one running snapshot share the boot id, and the first pid namespace has the same inode on
    every kernel: a clone's holder, alive, looked ended here."""
    named, slash, where = incarnation.rpartition("/")
    here = this_machine()
    if not slash or not here or where != here:
        return False
    try:
        host, pid_text, _ = named.rsplit("-", 2)
        pid = int(pid_text)
    except ValueError:
        return False
    if host != socket.gethostname():
        return False
    if pid <= 0 or pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # (PermissionError: it runs, as another user)
        return False
    return False


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
        incarnation: str | None = None,
    ) -> None:
        self._client = client
        self._scripts = scripts
        self._namespace = namespace
        self._n = num_partitions
        self.coordinator_id = coordinator_id
        self.ttl_ms = ttl_ms
        self.incarnation = incarnation or new_incarnation()
        self._claimed = False
        """This process holds the id's claim (it took it, and has not found it taken since)."""
        self.owned: set[int] = set()
        self.live: list[str] = []
        self.handed_off = False
        # A round and a release never overlap, and none runs after the final release: a round
        # still running when the service stopped took back every lease the release had just
        # freed, and put the process back in the registry (the others then waited for them
        # to lapse).
        self._round = threading.Lock()
        self._released_for_good = False
        self.size(num_partitions)

    def size(self, num_partitions: int) -> None:
        """The partition count, when it was not known at construction: the service takes the
        id's claim (``claim_id``) before it settles the namespace settings, so a process
        refused its id changes none of them (before, it wrote the settings it named, which the
        process running under the id then adopted). Before the first round."""
        self._n = num_partitions
        self._lease_keys = [PartitionKeys(self._namespace, p, num_partitions).lease
                            for p in range(num_partitions)]

    @property
    def registry_key(self) -> str:
        return f"{self._namespace}:coordinators"

    @property
    def claim_key(self) -> str:
        """The id's claim: the incarnation of the one process that uses the id (a string that
        lapses a TTL after its holder's last round). Its hash tag is the registry's name, so it
        lives in the registry's slot: a round renews both in one round trip, on one node."""
        return f"{self._namespace}:coordinator:{{{self.registry_key}}}:{self.coordinator_id}"

    @property
    def channel(self) -> str:
        """Broadcast channel: a coordinator joined or left; everyone re-plans at once."""
        return f"{self._namespace}:coordinators"

    def _on_registry_node(self, call: Callable[[Any], T]) -> T:
        """``call`` through the registry's node's own client (never the cluster client's
        retries), with that node's backoff and log (``nodes.on_node``)."""
        return on_node(self._client, self.registry_key, call)

    def _claim(self, op: str) -> str:
        """``lease.lua``'s ``op`` on the id's claim, for this incarnation ('acquire': take it if
        free, renew it if ours; 'release'): the holder after it ('' when free)."""
        def run(node: Any) -> str:
            holder = node_scripts(self._scripts, node).lease(
                keys=[self.claim_key], args=[op, self.incarnation, self.ttl_ms, ""])
            return holder.decode() if isinstance(holder, bytes) else str(holder)

        return on_node(self._client, self.claim_key, run)

    def claim_id(self, stop: threading.Event) -> None:
        """Take the id's claim before the first round. A claim held by another incarnation may
        be a dead process's: taken at once when its holder is shown ended (``died_here``), else
        waited for: its holder's registry entry, renewed with the
        claim, says when it lapses (the holder's TTL, which may not be this process's), and a
        renewal of that entry meanwhile says the holder runs: ``CoordinatorIdInUse`` then, or
        when the claim is still held past that time (and a round's period);
        ``StoppedBeforeClaim`` if ``stop`` is set while waiting."""
        period_s = self.ttl_ms / 4000
        deadline = first = None
        while True:
            holder = self._claim("acquire")
            if holder == self.incarnation:
                self._claimed = True
                return
            if died_here(holder):
                # A process of this machine that ended (SIGKILL, a crash: systemd restarting
                # the service) renews the claim no more: taken at once, only if it is still
                # that process's (``lease.lua``'s steal compares), instead of after its TTL.
                # A holder that cannot be told dead (another machine or container) is waited
                # for, so two running processes never hold the claim together.
                if self._steal_claim(holder) == self.incarnation:
                    log.warning("took over this coordinator id from a process of this machine "
                                "that ended without releasing it", extra={
                                    "event": "coordinator_id_taken_over",
                                    "id": self.coordinator_id, "from": holder})
                    self._claimed = True
                    return
                continue  # (it changed hands meanwhile: look again)
            lasts_ms, expiry = self._registry_entry()
            if deadline is None or first is None:
                first = expiry
                deadline = time.monotonic() + max(self.ttl_ms, lasts_ms) / 1000 + period_s
                log.warning("this coordinator id is held by another process; waiting for it to "
                            "lapse (a process that died) or be renewed (one that runs)", extra={
                                "event": "coordinator_id_held", "id": self.coordinator_id,
                                "by": holder, "wait_ms": max(self.ttl_ms, lasts_ms)})
            renewed = expiry > first
            left = deadline - time.monotonic()
            if renewed or left <= 0:
                raise CoordinatorIdInUse(
                    f"coordinator id {self.coordinator_id!r} of namespace {self._namespace!r} "
                    f"is in use by another running process (incarnation {holder}), which renews "
                    "it. Give each coordinator process its own id (--id, "
                    "$RCOORD_COORDINATOR_ID), or leave it out for a unique one", holder)
            if stop.wait(min(period_s, left)):
                raise StoppedBeforeClaim(
                    f"stopped while waiting for coordinator id {self.coordinator_id!r} of "
                    f"namespace {self._namespace!r} to be released by incarnation {holder}; "
                    "nothing was taken")

    def _steal_claim(self, holder: str) -> str:
        """``lease.lua``'s steal on the id's claim: this incarnation's if ``holder`` still
        holds it; the holder after it."""
        def run(node: Any) -> str:
            now = node_scripts(self._scripts, node).lease(
                keys=[self.claim_key], args=["steal", self.incarnation, self.ttl_ms, holder])
            return now.decode() if isinstance(now, bytes) else str(now)

        return on_node(self._client, self.claim_key, run)

    def _registry_entry(self) -> tuple[int, int]:
        """(ms the id's registry entry still lasts, its expiry) on the server's clock; (0, 0)
        without one."""
        def run(node: Any) -> tuple[int, int]:
            sec, usec = node.time()
            expiry = node.zscore(self.registry_key, self.coordinator_id)
            if expiry is None:
                return 0, 0
            return max(0, int(expiry) - (int(sec) * 1000 + int(usec) // 1000)), int(expiry)

        return self._on_registry_node(run)

    def _claimed_by(self, holder: str) -> None:
        """The claim's holder, as a round found it: this process (it holds the id for a TTL
        from then), or another: ``CoordinatorIdInUse``, and this process owns nothing."""
        if holder == self.incarnation:
            self._claimed = True
            return
        self._claimed = False
        self.owned, self.handed_off = set(), False
        raise CoordinatorIdInUse(
            f"coordinator id {self.coordinator_id!r} of namespace {self._namespace!r} was taken "
            f"by another process (incarnation {holder}) while this one did not renew it (paused "
            f"for a lease TTL?); this process stops and releases nothing. Give each "
            f"coordinator process its own id (--id, $RCOORD_COORDINATOR_ID), or leave it out "
            f"for a unique one", holder)

    def register(self) -> list[str]:
        """Renew the id's claim (``_claimed_by``: raises if another process holds it) and the
        registry entry, and read the live set: one round trip, on the registry's node."""
        def run(node: Any) -> tuple[str, list[Any]]:
            sec, usec = node.time()
            now = int(sec) * 1000 + int(usec) // 1000
            pipe = node.pipeline(transaction=False)
            pipe.execute_command(*self._scripts.command(
                "lease", [self.claim_key], ["acquire", self.incarnation, self.ttl_ms, ""]))
            pipe.zadd(self.registry_key, {self.coordinator_id: now + self.ttl_ms})
            pipe.zremrangebyscore(self.registry_key, "-inf", now)
            pipe.zrange(self.registry_key, 0, -1)
            claim, *rest = pipe.execute(raise_on_error=False)
            for reply in rest:
                if isinstance(reply, Exception):
                    raise reply
            if is_missing_function(claim):  # (library missing after a restart: loaded here)
                claim = node_scripts(self._scripts, node).lease(
                    keys=[self.claim_key], args=["acquire", self.incarnation, self.ttl_ms, ""])
            elif isinstance(claim, Exception):
                raise claim
            return claim.decode() if isinstance(claim, bytes) else str(claim), list(rest[2])

        holder, members = self._on_registry_node(run)
        self._claimed_by(holder)
        live = sorted(x.decode() for x in members)
        self.live = live
        return live

    def _registered(self) -> list[str]:
        """``register()``; if the registry's node cannot be reached, the coordinators known
        from the last round: every coordinator then keeps the plan it had, and the leases on
        the healthy nodes are renewed while the registry's node fails over (no newcomer or
        departure is seen meanwhile; nor can the id's claim, on that node too, be taken)."""
        try:
            return self.register()
        except NODE_FAILURES as exc:
            if not self.live or not self._claimed:
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
        ``final``: no round takes leases again, and the id's claim is freed too (the service's
        stop: a process started under the id next starts at once; a stalled timer loop's
        release is taken back by the next round once the loop runs again).

        Only while the id's claim is this process's: the leases under the id, its registry
        entry and its claim are otherwise another process's (one refused at its start, or
        one whose claim was taken)."""
        with self._round:
            if final:
                self._released_for_good = True
            self._release(final)

    def _release(self, final: bool) -> None:
        if not self._claimed:
            self.owned = set()
            return
        try:
            # (Renewed: it stays ours for a TTL, while this releases. Its node failing, the
            # leases are released as before: nobody could take the claim there either.)
            try:
                holder = self._claim("acquire")
            except NODE_FAILURES:
                holder = self.incarnation
            self._claimed_by(holder)
        except CoordinatorIdInUse as exc:
            log.error("not releasing the leases: this coordinator id is another process's now",
                      extra={"event": "coordinator_id_taken", "id": self.coordinator_id,
                             "by": exc.holder})
            return
        self._ops([(p, "release", "") for p in sorted(self.owned)], set())
        self.owned = set()
        self._on_registry_node(lambda node: node.zrem(self.registry_key, self.coordinator_id))
        if final:
            self._claim("release")
            self._claimed = False
        self.announce(b"left")

    def announce(self, what: bytes) -> None:
        """Tell the other coordinators (``channel``), through the registry's node: a message
        published on one node of a cluster reaches every node's subscribers."""
        self._on_registry_node(lambda node: node.publish(self.channel, what))
