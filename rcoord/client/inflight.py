"""One call in flight on a background thread, outliving the ``poll()`` that sent it.

A Redis call cannot be cut short from outside: a server that stops answering (SIGSTOP, a long
script, a network partition) holds the calling thread until the socket timeout (10 s, above a
parked call's XREAD) and then the retries. Kafka's ``poll(timeout)`` still returns on time
because its fetches are asynchronous requests that stay in flight across polls: a later poll
collects the answer. ``InFlight`` gives the consumer the same shape: the fetch runs on this
thread, ``poll()`` waits for it only until its own deadline, and the answer (or the error) waits
here, tagged with what was asked, for the next ``poll()`` to apply or drop.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["Finished", "InFlight"]

IDLE_EXIT_S = 2.0
"""A thread with nothing to do for this long ends (the next call starts another): a consumer
dropped without ``close()`` leaves no thread behind for long."""

T = TypeVar("T")
A = TypeVar("A")


class Finished(Generic[T, A]):
    """A call's outcome: ``value`` or ``error``, and the ``tag`` it was started with."""

    __slots__ = ("error", "tag", "value")

    def __init__(self, tag: A, value: T | None, error: BaseException | None) -> None:
        self.tag = tag
        self.value = value
        self.error = error


class InFlight(Generic[T, A]):
    """At most one call at a time, on one daemon thread that starts on first use (and ends
    after ``IDLE_EXIT_S`` with nothing to do)."""

    def __init__(self, name: str, idle_exit_s: float = IDLE_EXIT_S) -> None:
        self._name = name
        self._idle_exit_s = idle_exit_s
        self._cond = threading.Condition()
        self._queued: tuple[Callable[[], T], A] | None = None
        self._busy = False  # started and not yet taken
        self._finished: Finished[T, A] | None = None
        self._closed = False
        self._thread: threading.Thread | None = None

    @property
    def busy(self) -> bool:
        """A call was started and its outcome not yet taken (it may be finished)."""
        with self._cond:
            return self._busy

    def start(self, call: Callable[[], T], tag: A) -> None:
        """Run ``call`` in the background; ``tag`` comes back with its outcome."""
        with self._cond:
            if self._closed:
                raise RuntimeError(f"{self._name} is closed")
            if self._busy:
                raise RuntimeError(f"{self._name}: a call is already in flight")
            self._busy = True
            self._queued = (call, tag)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def wait(self, timeout: float | None, *interrupts: threading.Event) -> Finished[T, A] | None:
        """The outcome of the call in flight, taken (the next ``start`` may follow), once it
        finished within ``timeout``; None if it has not, or as soon as one of ``interrupts`` is
        set (whoever sets one calls ``interrupt_waits()`` to wake this wait up to see it)."""
        with self._cond:
            if not self._busy:
                raise RuntimeError(f"{self._name}: no call in flight")
            self._cond.wait_for(
                lambda: self._finished is not None or any(e.is_set() for e in interrupts),
                timeout,
            )
            done, self._finished = self._finished, None
            if done is not None:
                self._busy = False
            return done

    def wait_finished(self, timeout: float | None) -> bool:
        """Whether no call is running (none in flight, or it finished), waiting up to
        ``timeout`` for the one running; the outcome stays for ``wait()`` to take."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._busy or self._finished is not None,
                                       timeout)

    def interrupt_waits(self) -> None:
        """Make every ``wait()`` look at its ``interrupts`` now."""
        with self._cond:
            self._cond.notify_all()

    def close(self) -> None:
        """Stop the thread once its call (if any) returns; never waits for that call, which
        may be held by a server that does not answer (the thread is a daemon)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def _loop(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._queued is not None or self._closed, self._idle_exit_s)
                if self._queued is None:
                    self._thread = None  # closed, or idle: the next start() makes a new one
                    return
                call, tag = self._queued
                self._queued = None
            value: T | None = None
            error: BaseException | None = None
            try:
                value = call()
            except BaseException as exc:  # noqa: BLE001 - handed to whoever waits, in its thread
                error = exc
            with self._cond:
                self._finished = Finished(tag, value, error)
                self._cond.notify_all()
