"""Review 69: where the asyncio coordinator's shared wake reads leave something behind."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import redis.asyncio
from harness import await_until

import rcoord.asyncio.wake
from rcoord.asyncio.wake import AsyncWakeReads


class GatedLook(redis.asyncio.Redis):
    """Holds a non-blocking XREAD of ``key`` (a waiter's look) until ``gate`` is set;
    ``looked`` is set when one is held."""

    key: str
    gate: asyncio.Event
    looked: asyncio.Event

    async def xread(self, streams: Any, count: Any = None, block: Any = None,
                    **kwargs: Any) -> Any:
        reply = await super().xread(streams, count=count, block=block, **kwargs)
        if block is None and self.key in streams:
            self.looked.set()
            await asyncio.wait_for(self.gate.wait(), 60)
        return reply


def gated_look(port: int, key: str) -> GatedLook:
    """A ``GatedLook`` client (made in the running loop, which its events belong to)."""
    client = GatedLook(host="127.0.0.1", port=port)
    client.key, client.gate, client.looked = key, asyncio.Event(), asyncio.Event()
    return client


@dataclasses.dataclass
class WakeScene:
    """What the wake reviews' scenarios share: a gated client, a plain one for setting up, the
    reads under test, and the waits' tasks (``wake_scene`` ends them)."""

    client: GatedLook
    admin: Any
    reads: AsyncWakeReads
    tasks: list[asyncio.Task[bool]]


@contextlib.asynccontextmanager
async def wake_scene(port: int, key: str, *more_keys: str) -> AsyncIterator[WakeScene]:
    """A ``WakeScene`` on ``key``; at the end every look is let go and every wait cancelled,
    the reads closed and the streams deleted."""
    scene = WakeScene(gated_look(port, key), redis.asyncio.Redis(host="127.0.0.1", port=port),
                      AsyncWakeReads(8), [])
    try:
        yield scene
    finally:
        scene.client.gate.set()
        for task in scene.tasks:
            task.cancel()
        await asyncio.gather(*scene.tasks, return_exceptions=True)
        await scene.reads.close()
        await scene.admin.delete(key, *more_keys)
        await scene.admin.aclose()
        await scene.client.aclose()


async def held_in_look(reads: AsyncWakeReads, client: GatedLook, admin: Any, key: str,
                       first_from: str, block_ms: int) -> list[asyncio.Task[bool]]:
    """With 1-0 in the stream, W1 waits from ``first_from`` (the read in flight reads from
    there), then W2 from 2-0, older than that read: it looks first, and is held in the look
    (which found nothing after 2-0). The two waits' tasks."""
    await admin.xadd(key, {"e": 1}, id="1-0")
    w1 = asyncio.create_task(reads.wait(client, key, first_from, block_ms))
    await await_until(lambda: reads.waiting(key) == 1 and reads.reading() == 1,
                      "the first waiter's read in flight")
    w2 = asyncio.create_task(reads.wait(client, key, "2-0", block_ms))
    await asyncio.wait_for(client.looked.wait(), 30)
    return [w1, w2]


async def _blocked_xreads(admin: Any) -> list[Any]:
    return [c for c in await admin.client_list()
            if c.get("cmd") == "xread" and "b" in c.get("flags", "")]


def test_a_stream_forgotten_during_a_waiters_look_is_not_left_behind_by_close(
        redis_server, namespace, monkeypatch):
    """A waiter older than the read in flight first looks without blocking; while it looked,
    the read ended (its only waiter cancelled) and a wait on another stream forgot the idle stream
    (``_drop_idle``, past ``MAX_IDLE_STREAMS``). The waiter then parked on the forgotten
    stream object, with a reader of its own: not counted by ``waiting()``, not ended by
    ``close()``, which must fail every call still waiting and leave no read behind."""
    monkeypatch.setattr(rcoord.asyncio.wake, "MAX_IDLE_STREAMS", 1)
    key, other = f"{namespace}:wake69", f"{namespace}:wake69b"

    async def scenario() -> None:
        async with wake_scene(redis_server.port, key, other) as scene:
            client, admin, reads, tasks = scene.client, scene.admin, scene.reads, scene.tasks
            tasks += await held_in_look(reads, client, admin, key, "9-0", 30_000)
            # Meanwhile W1 gives up (cancelled: a caller's timeout), and its read is ended.
            tasks[0].cancel()
            await asyncio.gather(tasks[0], return_exceptions=True)
            await await_until(lambda: reads.reading() == 0, "the first read ended")
            # A wait on another stream forgets the idle ones.
            tasks.append(asyncio.create_task(reads.wait(client, other, "0-0", 30_000)))
            await await_until(lambda: reads.waiting(other) == 1, "the other stream's waiter")
            client.gate.set()  # W2's look returns: nothing after 2-0 when it looked
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 30
            while not tasks[1].done() and len(await _blocked_xreads(admin)) < 2:
                assert loop.time() < deadline, "W2 neither answered nor parked"
                await asyncio.sleep(0.01)
            await reads.close()
            # close() fails every call still waiting, at once, and leaves no read behind.
            _, pending = await asyncio.wait(tasks[1:], timeout=10)
            assert not pending, (f"{len(pending)} call(s) still waiting after close(); "
                                 f"waiting({key!r}) = {reads.waiting(key)}")

    asyncio.run(scenario())


def test_a_slot_no_master_serves_is_a_connection_loss_on_a_plain_asyncio_cluster_client(
        redis_cluster, namespace):
    """``redis.asyncio.RedisCluster(require_full_coverage=False)`` keeps no entry for a slot no
    master served when it read the slot map (a failover under way), and redis-py 8.1's asyncio
    ``get_node_from_slot`` then raises ``KeyError`` out of the client's ``execute_command``,
    which no error boundary knows: the call failed with a bare ``KeyError``, where the blocking
    coordinator, given ``redis.RedisCluster(require_full_coverage=False)`` in the same state,
    answers (its client reads the map again) or raises the retriable ``ConnectionLost``.
    ``rcoord.asyncio.AsyncClusterClient`` maps it, but the coordinator takes any
    ``redis.asyncio.RedisCluster``."""
    import redis.asyncio.cluster
    import redis.cluster

    from rcoord import ConnectionLost, Errors, GroupCoordinator
    from rcoord.asyncio import AsyncGroupCoordinator
    from rcoord.keys import GroupKeys

    blocking = redis.cluster.RedisCluster(host="127.0.0.1", port=redis_cluster.ports[0],
                                          require_full_coverage=False)
    try:
        coord = GroupCoordinator(blocking, namespace).start()
        slot = redis.cluster.key_slot(
            GroupKeys.of(namespace, coord.config.num_partitions, "g").group.encode())
        # What reading the map leaves when no master served the slot.
        blocking.nodes_manager.slots_cache.pop(slot)
        try:
            assert coord.heartbeat("g", 1, "m") == Errors.UNKNOWN_MEMBER_ID
        except ConnectionLost:
            pass
    finally:
        blocking.close()

    async def scenario() -> None:
        client = redis.asyncio.cluster.RedisCluster(
            host="127.0.0.1", port=redis_cluster.ports[0], require_full_coverage=False)
        try:
            acoord = await AsyncGroupCoordinator(client, namespace).start()
            client.nodes_manager.slots_cache.pop(slot)  # (as above)
            try:
                assert await acoord.heartbeat("g", 1, "m") == Errors.UNKNOWN_MEMBER_ID
            except ConnectionLost:
                pass
        finally:
            await client.aclose()

    asyncio.run(scenario())
