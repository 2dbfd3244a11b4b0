"""Ending tasks for certain, where one ``cancel()`` may be lost."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

__all__ = ["CANCEL_AGAIN_S", "cancel_and_wait"]

CANCEL_AGAIN_S = 0.05
"""How long a round waits for the tasks it cancelled before it cancels the rest again."""


async def cancel_and_wait(tasks: Iterable[asyncio.Future[Any]]) -> None:
    """Cancel ``tasks`` and return once every one has ended, cancelling again what has not.

    One ``cancel()`` is not enough on Python 3.11: its ``asyncio.wait_for`` returns the inner
    result when the cancellation arrives as the inner awaitable completes, and the task goes on
    as if never cancelled (CPython gh-86296, fixed in 3.12). redis-py awaits every command's
    write with it, so a task cancelled just as its command was sent carried on into the reply
    read, and a parked Fetch kept the gateway's close (and a SIGTERM) waiting for up to its
    ``max_wait``. Cancelling every ``CANCEL_AGAIN_S`` until done is what anyio's cancel scopes
    do for the same reason: a cancellation holds until the task ends.

    What a task ended with (its result, a cancellation or an error) is retrieved, not raised.
    """
    pending = {asyncio.ensure_future(t) for t in tasks}
    while pending:
        for task in pending:
            task.cancel()
        done, pending = await asyncio.wait(pending, timeout=CANCEL_AGAIN_S)
        for task in done:
            if not task.cancelled():
                task.exception()  # (retrieved: the caller asked for an end, not a report)
