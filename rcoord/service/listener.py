"""Listening for wake-ups: deadline messages on the partitions' shard channels, expired-key
events from every master, and coordinators joining or leaving.

Everything heard goes into one queue that the timer loop reads. Pub/sub is at-most-once and
redis-py reconnects silently, so every reconnect (seen as a new subscribe confirmation) queues
a ``resync``: the loop then re-reads the deadline index, which is the authority.
"""

from __future__ import annotations

import logging
import queue
import re
import threading
from typing import Any

import redis
import redis.exceptions

from ..keys import PartitionKeys
from ..partitioning import partition_tag
from .connect import primaries

__all__ = ["Listener", "enable_keyspace_events"]

log = logging.getLogger("rcoord.service")


INDEX_ALONE = "deadlines act from the index alone"


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
                 events: "queue.Queue[tuple[Any, ...]]", *, deadlines: bool, hints: bool,
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
        self._hint_re = re.compile(rb"^" + re.escape(namespace.encode()) + rb":\{([^}]*)\}:h:(.*)$", re.S)
        self.keyspace_status = "disabled" if not hints else "starting"

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
            for node in nodes:
                self._spawn(lambda n=node: self._run_keyspace(n), "rcoord-hints")

    def _spawn(self, fn: Any, name: str) -> None:
        t = threading.Thread(target=fn, name=name, daemon=True)
        t.start()
        self._threads.append(t)

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=3)

    def _run_shard(self) -> None:
        """Shard channels of every partition: a script made a deadline the partition's earliest."""
        self._listen(lambda ps: ps.ssubscribe(*self._channels),
                     lambda ps: ps.get_sharded_message(timeout=0.02))

    def _run_lease_channel(self) -> None:
        self._listen(lambda ps: ps.subscribe(self._lease_channel), lambda ps: ps.get_message(timeout=0.2))

    def _listen(self, subscribe: Any, receive: Any) -> None:
        while not self._stop.is_set():
            pubsub = None
            try:
                pubsub = self._client.pubsub()
                subscribe(pubsub)
                while not self._stop.is_set():
                    msg = receive(pubsub)
                    if msg is not None:
                        self._dispatch(msg)
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                log.warning("listener lost its connection; resyncing",
                            extra={"event": "listener_reconnect", "why": str(exc)})
                self._events.put(("resync",))
                self._stop.wait(0.2)
            finally:
                if pubsub is not None:
                    try:
                        pubsub.close()
                    except Exception:  # noqa: BLE001 - closing a broken connection
                        pass

    def _dispatch(self, msg: dict[str, Any]) -> None:
        kind = msg.get("type")
        if kind in ("subscribe", "ssubscribe"):
            self._events.put(("resync",))  # (re)subscribed: anything in the gap is lost
        elif kind == "smessage":
            p = self._channels.get(msg["channel"])
            if p is not None:
                self._events.put(("deadline", p, int(msg["data"])))
        elif kind == "message" and msg["channel"] == self._lease_channel.encode():
            self._events.put(("coordinators",))

    def _run_keyspace(self, node: redis.Redis) -> None:
        channel = f"__keyevent@{self._db}__:expired"
        while not self._stop.is_set():
            pubsub = None
            try:
                # Again on every (re)connect: CONFIG SET does not survive a restart or failover.
                problem = enable_keyspace_events(node)
                self.keyspace_status = "enabled" if not problem else "unknown: " + problem
                pubsub = node.pubsub()
                pubsub.subscribe(channel)
                while not self._stop.is_set():
                    msg = pubsub.get_message(timeout=0.2)
                    if msg is None:
                        continue
                    if msg["type"] == "subscribe":
                        self._events.put(("resync",))
                    elif msg["type"] == "message":
                        m = self._hint_re.match(msg["data"])
                        if m and m.group(1).decode() in self._tags:
                            self._events.put(("hint", self._tags[m.group(1).decode()],
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
            except (redis.ConnectionError, redis.TimeoutError):
                self._events.put(("resync",))
                self._stop.wait(0.2)
            finally:
                if pubsub is not None:
                    try:
                        pubsub.close()
                    except Exception:  # noqa: BLE001
                        pass
