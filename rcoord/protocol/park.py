"""Waiting for a parked JoinGroup/SyncGroup reply, as a sans-I/O flow.

The flow is a generator that yields the I/O it needs and receives the results, in the manner of
httpx's auth flows, so the blocking ``GroupCoordinator`` and the asyncio
``AsyncGroupCoordinator`` share the one algorithm and differ only in how they perform I/O:

* ``WaitWake(after, block_ms)``: block on the group's wake stream; send back whether it moved;
* ``ReadDeadline()``: the group's earliest deadline in the partition's due index (or None);
* ``ClaimDeadline()``: try to become the one caller that applies a due deadline (SET NX with a
  short expiry); send back whether it succeeded;
* ``ReadReply()``: read the stored reply with a plain ``HGET``; send back its bytes or None;
* ``Poll()``: run ``await_reply``; send back its reply.

The flow returns the reply's bytes. Why it waits the way it does: the wait ends early when the
wake stream moves (a reply may be ready), and then the reply is read with a plain ``HGET``,
about a tenth of ``await_reply``'s server time; only when it is not there yet (a chunk still to
be written, a deadline to apply) does the caller run the script. That read is safe: the step
that parks a call clears the member's reply slot of that kind in the same atomic call, and a
reply once written is final, so whatever the slot holds after the park is this call's answer,
the one ``await_reply`` would return. When it times out at the group's next deadline, one
cheap read tells whether that deadline is really due; if it is, one caller of the group claims it
and applies it, and the others are woken by the result (or re-check once the claim expires), so
a group of 1,000 parked members runs the script once per deadline, not 1,000 times. A small
random delay spreads the callers' checks.
"""

from __future__ import annotations

import random
import time
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

__all__ = [
    "CLAIM_MS",
    "DEADLINE_JITTER_MS",
    "MAX_BLOCK_MS",
    "MOCK_CLOCK_BLOCK_MS",
    "SAFETY_POLL_MS",
    "ClaimDeadline",
    "Poll",
    "ReadDeadline",
    "ReadReply",
    "WaitWake",
    "park_flow",
]

MAX_BLOCK_MS = 1000
"""Longest single XREAD BLOCK of a parked call; it then re-checks."""
MOCK_CLOCK_BLOCK_MS = 20
"""With an injected clock, time only moves when the test moves it: re-check often."""
DEADLINE_JITTER_MS = 10
"""Spread of parked callers waking at a deadline."""
SAFETY_POLL_MS = 5000
"""A parked call re-checks with the script at least this often, whatever it saw."""
CLAIM_MS = 50
"""How long a claim to apply a due deadline holds; a claimant that dies is replaced after it."""



@dataclass(frozen=True)
class WaitWake:
    """Block on the group's wake stream after ``after`` for up to ``block_ms``."""

    after: Any
    block_ms: int


@dataclass(frozen=True)
class ReadDeadline:
    """Read the group's earliest deadline from the partition's due index."""


@dataclass(frozen=True)
class ClaimDeadline:
    """Try to become the one parked caller that applies the group's due deadline."""


@dataclass(frozen=True)
class ReadReply:
    """Read this member's stored reply (None if it is not written yet)."""


@dataclass(frozen=True)
class Poll:
    """Run ``await_reply`` for this member's parked call."""


Op = WaitWake | ReadDeadline | ClaimDeadline | ReadReply | Poll


def block_ms(deadline: int, now: float, *, mock_clock: bool, max_block_ms: int) -> int:
    if mock_clock:
        return min(MOCK_CLOCK_BLOCK_MS, max_block_ms)
    if deadline < 0:
        return max_block_ms
    return int(max(1, min(max_block_ms, deadline - now + 1)))


def park_flow(reply: list[Any], *, mock_clock: bool, max_block_ms: int) -> Generator[Op, Any, bytes]:
    """Yield I/O requests until the parked call's reply (``{'R', blob}``) arrives."""
    while reply[0] == b"W":
        wake_id, deadline, base_now = reply[1], int(reply[2]), int(reply[3])
        started = time.monotonic()
        while True:
            # Server time now: the script's clock reading plus the (monotonic) time since.
            server_now = base_now + (time.monotonic() - started) * 1000
            block = block_ms(deadline, server_now, mock_clock=mock_clock, max_block_ms=max_block_ms)
            if not mock_clock and deadline >= 0:
                block += random.randint(0, DEADLINE_JITTER_MS)
            woke = yield WaitWake(wake_id, block)
            elapsed_ms = (time.monotonic() - started) * 1000
            if woke:
                stored = yield ReadReply()
                if stored is not None:
                    return bytes(stored)
            if woke or mock_clock or elapsed_ms >= SAFETY_POLL_MS:
                break
            score = yield ReadDeadline()
            if score is not None and score <= base_now + elapsed_ms:
                if (yield ClaimDeadline()):
                    break
                # Another parked caller applies it; its result wakes us, else re-check later.
                deadline = int(base_now + elapsed_ms) + CLAIM_MS
                continue
            deadline = -1 if score is None else int(score)
        reply = yield Poll()
    return bytes(reply[1])
