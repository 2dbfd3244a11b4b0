"""Review 71 (77a7287, asyncio wake reads): a waiter older than the read in flight looks again
while that read is not the one it looked past, whatever its own deadline: as long as other
calls end the read and start another during each look, a short wait kept looking past its
deadline."""

from __future__ import annotations

import asyncio

from harness import await_until
from test_review69_asyncio import wake_scene


def test_a_waiter_does_not_look_again_past_its_deadline(redis_server, namespace):
    """Fails before the fix: W2 (100 ms, from 2-0) looks again after its deadline, because
    the read in flight was restarted (W1 left, W3 came) while its first look was out."""
    key = f"{namespace}:wake71"

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        async with wake_scene(redis_server.port, key) as scene:
            client, admin, reads, tasks = scene.client, scene.admin, scene.reads, scene.tasks
            await admin.xadd(key, {"e": 1}, id="1-0")
            # W1 reads from 3-0; W2 (from 2-0, older) looks first, and is held in the look.
            tasks.append(asyncio.create_task(reads.wait(client, key, "3-0", 120_000)))
            await await_until(lambda: reads.waiting(key) == 1 and reads.reading() == 1,
                              "W1's read in flight")
            tasks.append(asyncio.create_task(reads.wait(client, key, "2-0", 100)))
            await asyncio.wait_for(client.looked.wait(), 30)
            looked_at = loop.time()  # (W2's deadline is at most 100 ms after this)
            # Meanwhile W1 leaves (its read is ended) and W3 starts another read from 3-0.
            tasks[0].cancel()
            await asyncio.gather(tasks[0], return_exceptions=True)
            await await_until(lambda: reads.reading() == 0, "W1's read ended")
            tasks.append(asyncio.create_task(reads.wait(client, key, "3-0", 120_000)))
            await await_until(lambda: reads.waiting(key) == 1 and reads.reading() == 1,
                              "W3's read in flight")
            await await_until(lambda: loop.time() > looked_at + 0.3, "W2's deadline passed")
            # W2's look returns (nothing after 2-0); a look it makes again is held.
            held, client.gate = client.gate, asyncio.Event()
            client.looked.clear()
            held.set()
            done, _ = await asyncio.wait([tasks[1]], timeout=20)
            assert done and not client.looked.is_set(), (
                "W2 (100 ms) looked again past its deadline, the read in flight having been "
                "restarted during its first look")
            assert tasks[1].result() is False

    asyncio.run(scenario())
