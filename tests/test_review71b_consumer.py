"""Review 71b: ``wakeup()`` in ``unsubscribe()`` (7a69ed5, 8e605f3, 7d104da).

``_await_committer(woken)`` with no wakeup waits ``limit`` for the committer with the wakeup,
then ``limit`` again without: twice its bound before "committing anyway"."""

from __future__ import annotations

from typing import Any

import pytest
from test_consumer import env  # noqa: F401 - env: the fixture


class _Stalled:
    """A committer whose jobs never finish: the bound of ``_await_committer`` is all that
    ends its wait. The timeouts it was waited with are kept."""

    pending = 1

    def __init__(self) -> None:
        self.waited: list[float | None] = []

    def wait_idle(self, timeout: float | None = None, *interrupts: Any,
                  upto: int | None = None) -> bool:
        self.waited.append(timeout)
        return False


def test_await_committer_in_unsubscribe_waits_its_bound_once(
        env: Any, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811 - the fixture
    """Its bound (two session timeouts) is what unsubscribe() waits for a committer that
    close() stopped with jobs left before committing anyway. With ``woken`` and no wakeup it
    waited that bound with the wakeup, then the whole bound again."""
    consumer = env.consumer(topics=[], session_timeout_ms=10_000)
    try:
        stalled = _Stalled()
        monkeypatch.setattr(consumer, "_committer", stalled)
        consumer._await_committer(lambda: True)
    finally:
        monkeypatch.undo()
        consumer.close(timeout=0)
    limit = 2 * 10_000 / 1000
    assert sum(t for t in stalled.waited if t is not None) <= limit, (
        f"waited {stalled.waited} s for a bound of {limit} s")
