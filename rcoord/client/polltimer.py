"""Liveness apart from progress: Kafka's ``max.poll.interval.ms`` for ``Consumer``.

A heartbeat thread keeps a member's session alive even when the application is stuck between two
``poll()`` calls, so its partitions would never move. ``PollTimer`` watches the time since the
last ``poll()`` returned; past the limit it makes the group leave (``leave_until_resumed``), so
the partitions go to the other members, and the next ``poll()`` lets the member join again as a
new member. Time spent *inside* ``poll()`` does not count: that is the consumer working. The
rebalance listener is the exception: Kafka resets its poll timer when ``poll()`` begins and calls
the listener later within that call, so a listener stuck past ``max.poll.interval.ms`` makes the
member leave. Here the clock runs while the listener does (``listener_running``); exempt, a
listener blocked on a database kept its partitions unread for as long as it blocked, and got
them back at every rebalance.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator

from .group import ConsumerGroup

__all__ = ["PollTimer"]

log = logging.getLogger("rcoord.client")


class PollTimer:
    """The ``max_poll_interval_ms`` watchdog of one consumer.

    ``group_of()`` returns the consumer's current group, or None (``assign()``: there is no
    membership to lose, so the timer never fires). ``stop`` is the consumer's closing event.
    """

    def __init__(
        self,
        group_id: str,
        max_poll_interval_ms: int,
        group_of: Callable[[], ConsumerGroup | None],
        stop: threading.Event,
    ) -> None:
        self._group_id = group_id
        self._limit_s = max_poll_interval_ms / 1000
        self._group_of = group_of
        self._stop = stop
        self._state = threading.Lock()  # guards the three below, shared with the watchdog
        self._last_poll = time.monotonic()
        self._in_poll = False
        self._expired = False
        self._thread: threading.Thread | None = None

    def poll_started(self) -> None:
        """``poll()`` began: stop the clock; if the timer had fired, let the member rejoin."""
        self._stop_clock()
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._watch, name=f"rcoord-{self._group_id}-poll-timer", daemon=True
            )
            self._thread.start()

    @contextlib.contextmanager
    def listener_running(self) -> Iterator[None]:
        """A rebalance listener runs inside ``poll()``: the clock runs from its start, and once
        it returns the clock stops again (rejoining if the timer fired meanwhile, as the next
        ``poll()`` would). Outside ``poll()`` (``close()``'s revocation) nothing changes."""
        with self._state:
            counting = self._in_poll
            if counting:
                self._in_poll = False
                self._last_poll = time.monotonic()
        try:
            yield
        finally:
            if counting:
                self._stop_clock()

    def _stop_clock(self) -> None:
        with self._state:
            self._in_poll = True
            self._last_poll = time.monotonic()
            expired, self._expired = self._expired, False
        if expired:
            log.info("group %r: polling again; rejoining", self._group_id)
            group = self._group_of()
            if group is not None:
                group.resume()

    def poll_finished(self) -> None:
        """``poll()`` returned: the clock runs from now."""
        with self._state:
            self._in_poll = False
            self._last_poll = time.monotonic()

    def reset(self, group_id: str) -> None:
        """A new subscription (a new group): forget an expiry of the old one."""
        with self._state:
            self._group_id = group_id
            self._expired = False
            self._last_poll = time.monotonic()

    def _watch(self) -> None:
        """Leave the group when the application has not called ``poll()`` for the limit."""
        limit = self._limit_s
        period = min(1.0, max(0.01, limit / 10))
        while not self._stop.wait(period):
            with self._state:
                idle = time.monotonic() - self._last_poll
                group = self._group_of()
                if self._in_poll or self._expired or idle <= limit or group is None:
                    continue
                self._expired = True
            reason = (
                f"consumer poll timeout has expired: poll() was not called for {idle:.1f} s "
                f"(max_poll_interval_ms {limit * 1000:.0f}); the application is too slow "
                "processing records, or stuck"
            )
            log.warning("group %r: %s; leaving the group", self._group_id, reason)
            group.leave_until_resumed(reason[:255])
            with self._state:
                polled_meanwhile = not self._expired
            if polled_meanwhile:
                # poll() began between the expiry and the leave, and its resume() came before
                # the leave stopped the member: without this one, it would never join again.
                group.resume()
