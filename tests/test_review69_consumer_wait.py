"""Review 69: a changed subscription's revocation after the held generation ended
(``Consumer._revoke_unsubscribed``'s last branch, not gated by the hold) waits for the
revocation's commits with ``_await_committer()``: up to two session timeouts, past
``poll()``'s deadline, deaf to ``wakeup()`` and ``close()``. ``poll()``'s docstring says it
returns by its timeout while Redis does not answer, a revocation's commits (a changed
subscription's too) staying in flight for the rejoin to wait for."""

from __future__ import annotations

import threading
from typing import Any

from harness import InThread, wait_until
from test_consumer import Recorder, env  # noqa: F401 - env: the fixture
from test_consumer_review67 import _Gated
from test_consumer_review68 import _Joiner
from test_review69_subscription_wait import _both_at_10


class _Held:
    """A gate for ``_Gated`` that holds every commit until ``release()`` (a minute at most):
    its own bound, the fixture's 15 s, must not end the hold first."""

    def __init__(self) -> None:
        self.opened = threading.Event()

    def acquire(self, timeout: float | None = None) -> bool:
        return self.opened.wait(60)

    def release(self, n: int = 1) -> None:
        self.opened.set()


def test_a_changed_subscriptions_revocation_after_the_generation_ended_returns_by_the_deadline(
        env: Any) -> None:  # noqa: F811 - the fixture
    """Session timeout 30 s. A second member joins (cooperative), ending the generation;
    before the next poll(), subscribe(["u"]). That poll(timeout=0.5) revokes t-0 (the
    generation done, so not gated) and queues its commit, which Redis holds: poll() stayed
    in ``_await_committer()`` until the commit was answered (two session timeouts at most),
    where it returns by its deadline, the commit in flight."""
    coord = _Gated(env)
    listener = Recorder()
    consumer = _both_at_10(env, coord, listener, session_timeout_ms=30_000)
    joiner = _Joiner(env, assignors=["cooperative-sticky"])
    held = _Held()
    try:
        wait_until(lambda: consumer._gen is not None and consumer._gen.done.is_set())
        coord.gate = held  # type: ignore[assignment]
        consumer.subscribe(["u"])
        polled = InThread(lambda: consumer.poll(timeout=0.5))
        wait_until(lambda: "revoked" in listener.kinds())
        wait_until(lambda: bool(polled.outcome), timeout_s=10)  # (the commit still held)
        assert not held.opened.is_set()
    finally:
        held.release()
        joiner.stop()
