"""Listening for wake-ups: deadline messages on the partitions' shard channels, expired-key
events from every master, and coordinators joining or leaving.

Everything heard goes into one queue that the timer loop reads. Pub/sub is at-most-once and
redis-py reconnects silently, so every reconnect (seen as a new subscribe confirmation) queues
a ``Resync`` event: the loop then re-reads the deadline index, which is the authority.

Expired-key events are heard on each master separately. When a subscription's connection
fails (a master killed, its replica promoted) the listener asks the cluster for its masters
again and subscribes to the ones it does not hear yet (``hint_nodes`` says which it hears);
each outage is logged once as a warning and its end as info.
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import time
from typing import Any

import redis
import redis.exceptions
from redis.crc import key_slot

from ..keys import PartitionKeys
from ..partitioning import partition_tag
from .connect import primaries
from .events import CoordinatorsChanged, Deadline, EventQueue, Hint, Resync

__all__ = ["Listener", "enable_keyspace_events"]

log = logging.getLogger("rcoord.service")


INDEX_ALONE = "deadlines act from the index alone"
REFRESH_S = 0.5
"""At most one topology refresh per this many seconds while a subscription is failing."""
REDISCOVER_S = 5.0
"""Look for new masters (resharding, added nodes) this often even when nothing failed."""
RETRY_FIRST_S = 0.2
RETRY_MAX_S = 2.0
"""A failing subscription is tried again after 0.2 s, doubling to 2 s while it keeps failing."""


class Backoff:
    """The pause before a failing subscription is tried again: short at first, since most
    outages are a reconnect or a failover, then doubling, so a node that stays down (or an ACL
    that keeps refusing) is not asked five times a second, each time with a resync of the
    index behind it."""

    def __init__(self, first_s: float = RETRY_FIRST_S, max_s: float = RETRY_MAX_S) -> None:
        self._first_s, self._max_s = first_s, max_s
        self._next_s = first_s

    def next(self) -> float:
        """The pause to take now; the one after it is twice as long, up to the cap."""
        pause = self._next_s
        self._next_s = min(self._max_s, pause * 2)
        return pause

    def reset(self) -> None:
        """A subscription succeeded: the next outage starts with the short pause again."""
        self._next_s = self._first_s


def enable_keyspace_events(node: redis.Redis) -> str:
    """Turn on expired-key events on ``node`` if needed; return '' or why it could not.

    Managed Redis, and a least-privilege ACL user (docs/security.md), may refuse ``CONFIG``;
    the events may still flow if the operator configured them, so the subscription is kept.
    """
    try:
        raw = node.config_get("notify-keyspace-events").get("notify-keyspace-events") or ""
        flags: str = raw.decode() if isinstance(raw, bytes) else str(raw)
        has_class = "E" in flags
        has_expired = "x" in flags or "A" in flags
        if not (has_class and has_expired):
            wanted = "".join(sorted(set(flags) | {"E", "x"}))
            node.config_set("notify-keyspace-events", wanted)
        return ""
    except redis.ResponseError as exc:  # NOPERM is a ResponseError too
        return (f"CONFIG refused ({exc}); {INDEX_ALONE}; expiry hints arrive only if the "
                "server's notify-keyspace-events already has E and x")


class Listener:
    def __init__(self, client: Any, namespace: str, num_partitions: int, lease_channel: str,
                 events: EventQueue, *, deadlines: bool, hints: bool,
                 db: int = 0) -> None:
        self._client = client
        self._events = events
        self._namespace = namespace
        self._n = num_partitions
        self._lease_channel = lease_channel
        self._want_deadlines = deadlines
        self._want_hints = hints
        self._db = db
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._channels = {PartitionKeys(namespace, p, num_partitions).due.encode(): p
                          for p in range(num_partitions)}
        self._tags = {partition_tag(p, num_partitions): p for p in range(num_partitions)}
        self._hint_re = re.compile(rb"^" + re.escape(namespace.encode()) + rb":\{([^}]*)\}:h:(.*)$", re.DOTALL)
        self.keyspace_status = "disabled" if not hints else "starting"
        self._lock = threading.Lock()
        self._subscribed: set[str] = set()
        self._lost = threading.Event()
        self._refreshed = 0.0
        self._by_slot: dict[int, list[bytes]] = {}
        for channel in self._channels:
            self._by_slot.setdefault(key_slot(channel), []).append(channel)
        self._owners: dict[int, str] = {}
        """The master each slot of deadline channels was last followed to after it moved."""

    def start(self) -> None:
        self._spawn(self._run_lease_channel, "rcoord-coordinators")
        if self._want_deadlines:
            self._spawn(self._run_shard, "rcoord-deadlines")
        if self._want_hints:
            nodes = primaries(self._client)
            problems = [p for p in (enable_keyspace_events(n) for n in nodes) if p]
            # Set before the threads start: a thread that finds the channel refused has the
            # last word.
            self.keyspace_status = "enabled" if not problems else "unknown: " + "; ".join(problems)
            if problems:
                log.warning("expired-key events may be off; deadlines still act from the index",
                            extra={"event": "keyspace_events_unavailable", "why": problems})
            self._spawn(lambda: self._run_hints(nodes), "rcoord-hints")

    @property
    def hint_nodes(self) -> set[str]:
        """The masters (``host:port``) whose expired-key channel this process hears now."""
        with self._lock:
            return set(self._subscribed)

    def _spawn(self, fn: Any, name: str) -> None:
        """Start a thread, and forget the ones that ended: ``_run_hints`` starts one per master
        that appears (each failover, each reshard), and a long-lived process kept every one it
        ever started. (A new list: ``stop()`` may be going through the old one.)"""
        t = threading.Thread(target=fn, name=name, daemon=True)
        t.start()
        with self._lock:
            self._threads = [*(x for x in self._threads if x.is_alive()), t]

    def halt(self) -> None:
        """Tell the threads to end, without waiting for them: the service's stop does, before
        it shuts the client's sockets under the calls in flight (``service``'s
        ``_interrupt_when_stopped``), which are the subscriptions' too. A subscription that
        fails after this ends quietly; before, each logged that it lost its connection
        (warnings, on a graceful stop) and subscribed again on a new one."""
        self._stop.set()
        self._lost.set()

    def stop(self, timeout: float = 3.0) -> None:
        """Stop the threads, waiting for them ``timeout`` seconds in all (a thread blocked in a
        call a node does not answer is left behind: daemons, failed by the client's close).

        The threads are looked up again once those found have ended: ``_spawn`` lists a thread
        after starting it, so a subscriber ``_run_hints`` started as the stop began was not
        in the list taken, and went on (turning keyspace events on, subscribing, logging)
        past the stop, against a client being closed."""
        self.halt()
        deadline = time.monotonic() + timeout
        joined: set[threading.Thread] = set()
        while True:
            with self._lock:
                threads = [t for t in self._threads if t not in joined]
            if not threads:
                return
            for t in threads:
                t.join(max(0.0, deadline - time.monotonic()))
                joined.add(t)

    # -- topology --------------------------------------------------------------------------------

    def _refresh_topology(self) -> None:
        """Ask the cluster which nodes are masters now (CLUSTER SLOTS through redis-py's own
        refresh), at most every ``REFRESH_S``: a connection lost to a master may mean it failed
        and a replica took its slots. A single node has no topology to refresh."""
        manager = getattr(self._client, "nodes_manager", None)
        if manager is None:
            return
        with self._lock:
            if time.monotonic() - self._refreshed < REFRESH_S:
                return
            self._refreshed = time.monotonic()
        try:
            manager.initialize()
        except Exception as exc:  # noqa: BLE001 - no node answers yet; the next failure retries
            log.debug("topology refresh failed", extra={"event": "topology_refresh_failed",
                                                        "why": str(exc)})

    def _run_hints(self, nodes: list[redis.Redis]) -> None:
        """Keep one expired-key subscriber per master as the masters change.

        Keyspace events are node-local, so a master that fails takes its events with it: its
        subscriber then fails to reconnect, and this loop re-discovers the masters (a promoted
        replica is one) and subscribes to the new ones, stopping the subscribers of nodes that
        no longer serve slots. It also looks every ``REDISCOVER_S`` anyway, for masters added by
        resharding."""
        running: dict[str, threading.Event] = {}
        outage = False
        while not self._stop.is_set():
            current = {_addr(n): n for n in nodes}
            for addr, quit_ in list(running.items()):
                if addr not in current:
                    quit_.set()
                    del running[addr]
                    with self._lock:
                        self._subscribed.discard(addr)
            for addr, node in current.items():
                if addr not in running:
                    running[addr] = threading.Event()
                    self._spawn(lambda n=node, a=addr, q=running[addr]: self._run_keyspace(n, a, q),
                                "rcoord-hints-" + addr)
            # While some master is not heard, look again soon: the recovery is then logged
            # (below) as soon as the new subscriptions are confirmed.
            lost = self._lost.wait(REFRESH_S if outage else REDISCOVER_S)
            if self._stop.is_set():
                return
            if lost:
                self._lost.clear()
                outage = True
                self._stop.wait(REFRESH_S)  # let a failover progress; also bounds the rate
                self._refresh_topology()
            # Otherwise the client's slot map is current enough: redis-py refreshes it on MOVED.
            try:
                nodes = primaries(self._client)
            except Exception as exc:  # noqa: BLE001 - keep the old set; the next round retries
                log.debug("listing masters failed", extra={"event": "topology_refresh_failed",
                                                           "why": str(exc)})
                continue
            if outage and self.hint_nodes == {_addr(n) for n in nodes}:
                outage = False
                log.info("expired-key events heard from every master again",
                         extra={"event": "listener_recovered", "nodes": sorted(self.hint_nodes)})

    # -- subscriptions ---------------------------------------------------------------------------

    def _run_shard(self) -> None:
        """Shard channels of every partition: a script made a deadline the partition's earliest."""
        self._listen("deadlines", lambda ps: ps.ssubscribe(*self._channels), self._receive_shard)

    def _receive_shard(self, pubsub: Any) -> dict[str, Any] | None:
        try:
            msg: dict[str, Any] | None = pubsub.get_sharded_message(timeout=0.02)
        except redis.exceptions.MovedError as exc:
            # A master's answer to an (un)subscribe sent to it for a slot it no longer owns:
            # redis-py's own move of a subscription unsubscribes there, and ours subscribes
            # there if the slot map was stale. A reply like any other: the connection is fine.
            if self._stop.is_set() or not self._by_slot.get(exc.slot_id):
                raise
            self._follow_moved_slot(pubsub, exc.slot_id, f"{exc.host}:{exc.port}", exc)
            return None
        if msg is not None and msg["type"] == "sunsubscribe" and not self._stop.is_set():
            self._follow_moved_slot(pubsub, key_slot(msg["channel"]), None, None)
        return msg

    def _follow_moved_slot(self, pubsub: Any, slot: int, moved_to: str | None,
                           moved: Exception | None) -> None:
        """Subscribe again, on its new master, to the deadline channels of a slot that moved.

        The listener never unsubscribes (it closes), so an ``sunsubscribe`` it hears is the
        server's: the slot moved to another master, which ended the subscriptions there.
        redis-py passes it on and keeps the channels in its books, and the connection stays
        up, so nothing else would subscribe again: the partition's deadlines acted only from
        the sweeper's index reads. Each move is logged once (when the owner the listener knows
        of changes); the echoes of one (redis-py's reconciliation, where it has one, moves the
        subscription too, and the old master answers its unsubscribe ``MOVED``) only subscribe
        again, which is a no-op where the channel is heard already.

        The slot map is refreshed at most every ``REFRESH_S``: a ``MOVED`` naming another master
        than a map still stale after that is raised, and ``_listen``'s reconnect (paced by its
        backoff) takes over, rather than a subscribe sent to the wrong master every poll."""
        channels = self._by_slot.get(slot)
        if not channels:
            return
        self._events.put(Resync())  # what the gap lost
        owner = self._owner(channels[0])
        if moved_to is None or owner != moved_to:
            self._refresh_topology()
            owner = self._owner(channels[0])
            if moved is not None and owner != moved_to:
                raise moved
        if self._owners.get(slot) != owner:
            self._owners[slot] = owner
            log.info("a deadline channel's slot moved; subscribing on its new master",
                     extra={"event": "listener_slot_moved", "slot": slot, "node": owner,
                            "partitions": sorted(self._channels[c] for c in channels)})
        pubsub.ssubscribe(*channels)

    def _owner(self, channel: bytes) -> str:
        """``host:port`` of the master the client's slot map names for ``channel`` ('' on a
        single node, whose slots never move)."""
        find = getattr(self._client, "get_node_from_key", None)
        return "" if find is None else str(find(channel).name)

    def _run_lease_channel(self) -> None:
        self._listen("coordinators", lambda ps: ps.subscribe(self._lease_channel),
                     lambda ps: ps.get_message(timeout=0.2))

    def _listen(self, what: str, subscribe: Any, receive: Any) -> None:
        failing = False
        backoff = Backoff()
        while not self._stop.is_set():
            pubsub = None
            try:
                pubsub = self._client.pubsub()
                subscribe(pubsub)
                if failing:
                    failing = False
                    log.info("listener subscribed again", extra={"event": "listener_recovered",
                                                                "channel": what})
                while not self._stop.is_set():
                    msg = receive(pubsub)
                    if msg is not None:
                        self._dispatch(msg)
            except Exception as exc:  # noqa: BLE001 - a listener thread must never end unheard
                if self._stop.is_set():
                    return  # (the stop shut the connection: ``halt``)
                # A lost connection, and also a refusal (CLUSTERDOWN while a cluster heals, an
                # ACL rule withdrawn): either may pass, so subscribe again, less often the
                # longer it lasts. Until then the resyncs keep deadlines acting from the index.
                lost = isinstance(exc, (redis.ConnectionError, redis.TimeoutError))
                if not failing:  # once per outage
                    failing = True
                    backoff.reset()
                    log.warning("listener lost its connection; resyncing and retrying" if lost
                                else "listener refused; resyncing and retrying",
                                extra={"event": "listener_reconnect" if lost else "listener_error",
                                       "channel": what, "why": str(exc)})
                self._events.put(Resync())
                self._refresh_topology()
                self._stop.wait(backoff.next())
            finally:
                if pubsub is not None:
                    with contextlib.suppress(Exception):  # closing a broken connection
                        pubsub.close()

    def _dispatch(self, msg: dict[str, Any]) -> None:
        kind = msg.get("type")
        if kind in ("subscribe", "ssubscribe"):
            self._events.put(Resync())  # (re)subscribed: anything in the gap is lost
        elif kind == "smessage":
            p = self._channels.get(msg["channel"])
            try:
                at_ms = int(msg["data"])
            except ValueError:
                # Not a script's (anyone with PUBLISH rights can send to the channel): ignored;
                # the index holds the real deadlines.
                log.debug("ignored a malformed deadline message", extra={
                    "event": "malformed_message", "data": repr(msg["data"][:64])})
                return
            if p is not None:
                self._events.put(Deadline(p, at_ms))
        elif kind == "message" and msg["channel"] == self._lease_channel.encode():
            self._events.put(CoordinatorsChanged())

    def _run_keyspace(self, node: redis.Redis, addr: str, quit_: threading.Event) -> None:
        """Hear one master's expired-key events until it stops being a master (``quit_``)."""
        channel = f"__keyevent@{self._db}__:expired"
        failing = False
        backoff = Backoff()
        while not (self._stop.is_set() or quit_.is_set()):
            pubsub = None
            try:
                # Again on every (re)connect: CONFIG SET does not survive a restart or failover.
                problem = enable_keyspace_events(node)
                self.keyspace_status = "enabled" if not problem else "unknown: " + problem
                pubsub = node.pubsub()
                pubsub.subscribe(channel)
                while not (self._stop.is_set() or quit_.is_set()):
                    msg = pubsub.get_message(timeout=0.2)
                    if msg is None:
                        continue
                    if msg["type"] == "subscribe":
                        with self._lock:
                            self._subscribed.add(addr)
                        self._events.put(Resync())
                        if failing:
                            failing = False
                            log.info("expired-key events heard again", extra={
                                "event": "keyspace_subscribed", "node": addr})
                        else:
                            log.debug("expired-key events subscribed", extra={
                                "event": "keyspace_subscribed", "node": addr})
                    elif msg["type"] == "message":
                        m = self._hint_re.match(msg["data"])
                        # (Not UTF-8 is no tag of ours: a key someone else let expire, whose
                        # UnicodeDecodeError dropped the subscription, and the hints of the
                        # reconnect's gap with it.)
                        tag = m.group(1).decode("utf-8", "surrogateescape") if m else None
                        if m and tag in self._tags:
                            self._events.put(Hint(self._tags[tag],
                                              m.group(2).decode("utf-8", "surrogateescape")))
            except redis.exceptions.NoPermissionError as exc:
                # The ACL user may not hear this channel: hints are off for good, and the
                # deadline index (which needs no events) does the work.
                self.keyspace_status = (
                    f"unavailable: the Redis user may not subscribe to {channel} ({exc}; add "
                    f"&__keyevent@*__:expired to its ACL rules to get hints); {INDEX_ALONE}")
                log.warning("expired-key events unavailable; deadlines still act from the index",
                            extra={"event": "keyspace_events_unavailable",
                                   "why": self.keyspace_status})
                return
            except Exception as exc:  # noqa: BLE001 - lost or refused: never end unheard
                if self._stop.is_set():
                    break  # (the stop shut the connection: ``halt``)
                with self._lock:
                    self._subscribed.discard(addr)
                if not failing:  # once per outage; the master may have failed over
                    failing = True
                    backoff.reset()
                    log.warning("lost the expired-key subscription of a master; looking for "
                                "the current masters", extra={
                                    "event": "keyspace_lost", "node": addr, "why": str(exc)})
                self._events.put(Resync())
                self._lost.set()
                self._stop.wait(backoff.next())
            finally:
                if pubsub is not None:
                    with contextlib.suppress(Exception):  # closing a broken connection
                        pubsub.close()
        with self._lock:
            self._subscribed.discard(addr)
        if quit_.is_set() and not self._stop.is_set():
            log.info("stopped hearing a node that no longer serves slots",
                     extra={"event": "keyspace_unsubscribed", "node": addr})


def _addr(node: redis.Redis) -> str:
    kw = node.connection_pool.connection_kwargs
    return f"{kw.get('host', '?')}:{kw.get('port', '?')}"
