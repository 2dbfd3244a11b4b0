"""Clocks. In production there is one clock, Redis ``TIME``, read inside every script.

``MockTime`` is for tests (Kafka's MockTime): pass it as ``GroupCoordinator(..., clock=t)`` and
every script uses ``t()`` as "now", so a test moves time with ``t.sleep(ms)`` and then lets it act
with ``coordinator.run_timers()``.
"""

from __future__ import annotations

import threading

__all__ = ["MockTime"]


class MockTime:
    """A manually advanced clock in milliseconds; thread-safe."""

    def __init__(self, start_ms: int = 1_700_000_000_000) -> None:
        self._now = start_ms
        self._lock = threading.Lock()

    def __call__(self) -> int:
        with self._lock:
            return self._now

    def milliseconds(self) -> int:
        return self()

    def sleep(self, ms: int) -> None:
        """Advance the clock (never blocks)."""
        if ms < 0:
            raise ValueError("cannot move time backwards")
        with self._lock:
            self._now += ms
