"""Review 70 (b9ee8a9, asyncio wake reads): a waiter older than the read in flight looks once
without blocking, then parks on the stream it finds under the key. If, during the look, that
read ended and a later caller started another from a position past an entry that arrived
meanwhile, the waiter parks on that read unchecked: the entry is after its position, yet it is
not woken until that read's deadline (or some later entry)."""

from __future__ import annotations

import asyncio

from harness import await_until
from test_review69_asyncio import held_in_look, wake_scene


def test_an_entry_that_came_during_a_waiters_look_wakes_it(redis_server, namespace):
    """Fails now: W2 (from 2-0) is still waiting though 4-0 is in the stream, parked on the
    read W3 started from 4-0 while W2's look was out."""
    key = f"{namespace}:wake70"

    async def scenario() -> None:
        async with wake_scene(redis_server.port, key) as scene:
            client, admin, reads, tasks = scene.client, scene.admin, scene.reads, scene.tasks
            # W1 waits from 3-0; W2 from 2-0 is held in its look.
            tasks += await held_in_look(reads, client, admin, key, "3-0", 120_000)
            # Meanwhile 4-0 arrives: W1 is woken and its read ends.
            await admin.xadd(key, {"e": 2}, id="4-0")
            assert await asyncio.wait_for(tasks[0], 30) is True
            # W3 saw 4-0 and waits after it: a new read, from 4-0.
            tasks.append(asyncio.create_task(reads.wait(client, key, "4-0", 120_000)))
            await await_until(lambda: reads.waiting(key) == 1 and reads.reading() == 1,
                              "W3's read in flight")
            client.gate.set()  # W2's look returns: nothing after 2-0 when it looked
            # 4-0 is after W2's position: it must be woken (within seconds, not at 120 s).
            done, _ = await asyncio.wait([tasks[1]], timeout=20)
            assert done, (f"W2 (from 2-0) still waiting with 4-0 in the stream; "
                          f"waiting({key!r}) = {reads.waiting(key)}")
            assert tasks[1].result() is True

    asyncio.run(scenario())
