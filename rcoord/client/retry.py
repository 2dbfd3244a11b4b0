"""Retrying one coordinator call: lost connections and the ``retry`` rows of ``ERROR_POLICY``.

``call_with_retries`` is the policy (tenacity, exponential back-off with jitter, for at most
one session timeout, cut short by an event the group sets: ``closing`` for joins, and for a
generation's commits and heartbeats the end of its routines after a close, so a final commit is
still retried); ``Retry`` is its shape, as the group hands it to the code that sends requests
for it. ``interruptible_by`` lets one thread's retries be cut short by its own event (the
consumer's ``wakeup()``), leaving other threads' retries (the heartbeat's) alone.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Protocol, TypeVar

import tenacity
from tenacity.stop import stop_base

from ..errors import ConnectionLost, Errors
from .config import ConsumerGroupConfig
from .errors import WakeupError
from .policy import reaction_for

__all__ = ["Retry", "call_with_retries", "interruptible_by"]

log = logging.getLogger("rcoord.client")

T = TypeVar("T")


_local = threading.local()


@contextlib.contextmanager
def interruptible_by(wakeup: threading.Event) -> Iterator[None]:
    """Within this block, retries made *by this thread* stop when ``wakeup`` is set: the pause
    ends at once and the call raises ``WakeupError`` (Kafka's ``wakeup()``, which interrupts
    any blocking call of the consumer, ``commitSync`` included). The first attempt of a call is
    always made; only its retries are cut short.

    Per thread, not per group: the heartbeat thread uses the same retry function as the poll
    thread's commits, and must go on retrying (the member's session depends on it), so the
    group's shared events (``closing``, the routines' end) cannot carry a wakeup."""
    previous = getattr(_local, "wakeup", None)
    _local.wakeup = wakeup
    try:
        yield
    finally:
        _local.wakeup = previous


def _wakeup_of_this_thread() -> threading.Event | None:
    event: threading.Event | None = getattr(_local, "wakeup", None)
    return event


class Retry(Protocol):
    """``retry(call, error_of)``: run ``call`` under the group's retry policy.

    ``error_of`` reads the error code out of a result (None: results are never retried).
    """

    def __call__(self, call: Callable[[], T], error_of: Callable[[T], Errors] | None) -> T: ...


def call_with_retries(
    call: Callable[[], T],
    error_of: Callable[[T], Errors] | None,
    *,
    config: ConsumerGroupConfig,
    closing: threading.Event,
    budget_s: float | None = None,
) -> T:
    """Run ``call``; retry lost connections and the ``retry`` rows of ``ERROR_POLICY``.

    Pauses grow exponentially with jitter (``retry_backoff_ms`` .. ``retry_backoff_max_ms``)
    and wake early when ``closing`` is set. Retries stop ``budget_s`` (default: one session
    timeout) after the first failure; then the last result is returned (or the last exception
    raised). A pause that ``closing`` (or the thread's wakeup) ends is the end: no attempt
    follows it. Tenacity looks at its stop only after an attempt, so the attempt after such a
    pause went out anyway: a JoinGroup retried after close() had sent LeaveGroup added the
    member again, and it held partitions in the group until its session ended.
    """
    cfg = config
    wakeup = _wakeup_of_this_thread()
    # The outcome (and attempt number) before the pause in progress: tenacity clears the
    # state's outcome before it sleeps.
    paused: list[tuple[tenacity.Future, int]] = []

    def sleep(seconds: float) -> None:
        if wakeup is None:
            closing.wait(seconds)
        else:
            # Two events end the pause; the wakeup is waited on, closing looked at every 50 ms.
            end = time.monotonic() + seconds
            while not closing.is_set():
                left = end - time.monotonic()
                if left <= 0 or wakeup.wait(min(left, 0.05)):
                    break
        if closing.is_set() or (wakeup is not None and wakeup.is_set()):
            raise _PauseEnded

    def retriable(result: T) -> bool:
        return error_of is not None and reaction_for(error_of(result)).retry

    def last_outcome(state: tenacity.RetryCallState) -> T:
        assert state.outcome is not None
        return outcome_of(state.outcome, state.attempt_number)

    def outcome_of(outcome: tenacity.Future, attempt: int) -> T:
        if wakeup is not None and wakeup.is_set() and not closing.is_set():
            raise WakeupError(
                f"group {cfg.group_id!r}: retries interrupted by wakeup() after attempt "
                f"{attempt} ("
                + (repr(outcome.exception()) if outcome.failed else "an error code")
                + ")"
            )
        return outcome.result()  # type: ignore[no-any-return]

    def before_sleep(state: tenacity.RetryCallState) -> None:
        assert state.outcome is not None
        paused[:] = [(state.outcome, state.attempt_number)]
        what = (
            state.outcome.exception()
            if state.outcome.failed
            else (error_of(state.outcome.result()) if error_of else "?")
        )
        log.info(
            "group %r: retrying after %s (attempt %d)", cfg.group_id, what, state.attempt_number
        )

    retrying = tenacity.Retrying(
        retry=tenacity.retry_if_exception_type(ConnectionLost)
        | tenacity.retry_if_result(retriable),
        # retry_backoff_ms * 2**n, capped, plus up to one retry_backoff_ms of jitter.
        wait=tenacity.wait_exponential(
            multiplier=cfg.retry_backoff_ms / 1000,
            min=cfg.retry_backoff_ms / 1000,
            max=cfg.retry_backoff_max_ms / 1000,
        )
        + tenacity.wait_random(0, cfg.retry_backoff_ms / 1000),
        stop=_StopAfterFailingFor(cfg.session_timeout_ms / 1000 if budget_s is None else budget_s)
        | _StopWhenClosing(closing)
        | _StopWhenClosing(wakeup or _NEVER),
        sleep=sleep,
        retry_error_callback=last_outcome,
        before_sleep=before_sleep,
    )
    try:
        return retrying(call)
    except _PauseEnded:
        return outcome_of(*paused[0])


class _PauseEnded(Exception):
    """A retry's pause ended by closing or wakeup: no further attempt (``call_with_retries``)."""


_NEVER = threading.Event()  # never set: the wakeup of a thread that has none


class _StopWhenClosing(stop_base):
    """Stop retrying once ``event`` is set (the group's closing, or its routines' end)."""

    def __init__(self, event: threading.Event) -> None:
        self._event = event

    def __call__(self, retry_state: tenacity.RetryCallState) -> bool:
        return self._event.is_set()


class _StopAfterFailingFor(stop_base):
    """Stop once the call has been failing for ``budget`` seconds (measured from the first
    failure, so a long parked call does not use up the budget before its first retry)."""

    def __init__(self, budget: float) -> None:
        self._budget = budget
        self._first: float | None = None

    def __call__(self, retry_state: tenacity.RetryCallState) -> bool:
        now = time.monotonic()
        if self._first is None:
            self._first = now
        return now - self._first >= self._budget
