"""A caller's cancellation of an asyncio coordinator call (``asyncio.timeout``, ``wait_for``,
``task.cancel()``) ends the call, whenever it comes, and leaves the coordinator and the group
as Kafka leaves them when a client abandons a request."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import redis.asyncio
from harness import await_until

from rcoord import CoordinatorConfig, Errors, GroupCoordinator, TopicPartition
from rcoord.asyncio import AsyncGroupCoordinator
from rcoord.asyncio.wake import AsyncWakeReads

FORM: dict[str, Any] = {"protocol_type": "consumer", "protocols": [("range", b"m")],
                        "session_timeout_ms": 30_000, "rebalance_timeout_ms": 3_000}


def test_a_cancel_that_comes_as_a_command_is_written_ends_the_call(redis_server, namespace):
    """A reviewer's repro: on Python 3.11 redis-py writes each command under
    ``asyncio.wait_for`` (a client with a socket timeout: redis-py's default), which loses a
    cancellation that comes as the write completes (CPython gh-86296). ``asyncio.timeout(0)``
    around a parked JoinGroup comes exactly then: the join went on waiting out the rebalance
    and returned NONE, past the caller's deadline, and a commit returned its result instead of
    TimeoutError. Both now raise TimeoutError; the abandoned join's member stays in the group
    (Kafka keeps it until its rebalance timeout) and joins again with the same id."""
    with contextlib.closing(redis_server.client()) as admin:
        GroupCoordinator(admin, CoordinatorConfig(
            namespace=namespace, group_min_session_timeout_ms=10,
            # Longer than a member's join may lag the other's on a loaded machine: at 100 ms,
            # a lag that long formed a second generation.
            group_initial_rebalance_delay_ms=1000)).start()

    async def scenario() -> None:
        client = redis.asyncio.Redis(host="127.0.0.1", port=redis_server.port, socket_timeout=5)
        try:
            coord = await AsyncGroupCoordinator(client, namespace).start()
            ids = [(await coord.join_group("g", **FORM)).member_id for _ in range(2)]
            joined = await asyncio.gather(*(coord.join_group("g", i, **FORM) for i in ids))
            assert [r.generation_id for r in joined] == [1, 1]
            tp = TopicPartition("t", 0)

            # A new protocol list: the join parks until the other member rejoins.
            rejoin = {**FORM, "protocols": [("range", b"n")]}
            with contextlib.suppress(TimeoutError):  # (not raised by the old code)
                async with asyncio.timeout(0):
                    await coord.join_group("g", ids[0], **rejoin)
                raise AssertionError("the parked join outlived its caller's deadline")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0):
                    await coord.commit_offsets("g", {tp: 5}, member_id=ids[0], generation_id=1)
                raise AssertionError("the commit outlived its caller's deadline")
            await await_until(lambda: coord._wake_reads.reading() == 0, "no read left")

            described = await coord.describe_group("g")
            assert (described.state, len(described.members)) == ("PreparingRebalance", 2)
            again = await asyncio.gather(coord.join_group("g", ids[0], **rejoin),
                                         coord.join_group("g", ids[1], **FORM))
            assert {(r.error, r.generation_id) for r in again} == {(Errors.NONE, 2)}
            assert asyncio.all_tasks() == {asyncio.current_task()}
            await coord.close()
        finally:
            await client.aclose()

    asyncio.run(scenario())


def test_a_sharer_with_an_old_cancel_count_reads_again_when_its_sender_is_cancelled(
        redis_server):
    """A reviewer's repro: a parked call that shares a due check (``AsyncWakeReads.read``) sends
    it again when the call that sent it is cancelled, unless it was cancelled itself, which it
    judged by ``Task.cancelling()`` being above 0. A task that once caught a cancellation
    without ``uncancel()`` (a common pattern) keeps a count of 1, so its parked call failed
    with CancelledError when another member's call was cancelled. Now only cancellations since
    the call began count."""
    key = "rev-f-due"
    command = ("ZSCORE", key, "g")

    class Gated(redis.asyncio.Redis):
        """Holds the ZSCORE of the first call until ``gate`` opens."""

        gate = asyncio.Event()
        sending = asyncio.Event()

        async def execute_command(self, *args: Any, **options: Any) -> Any:
            if args[0] == "ZSCORE" and not self.gate.is_set():
                self.sending.set()
                await self.gate.wait()
            return await super().execute_command(*args, **options)

    async def sharer(reads: AsyncWakeReads, client: Any) -> Any:
        me = asyncio.current_task()
        assert me is not None
        me.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(0)  # (caught, not uncancelled: the count stays 1)
        assert me.cancelling() == 1
        return await reads.read(client, command)

    async def scenario() -> None:
        client = Gated(host="127.0.0.1", port=redis_server.port)
        try:
            reads = AsyncWakeReads(8)
            sender = asyncio.create_task(reads.read(client, command))
            await client.sending.wait()
            shared = asyncio.create_task(sharer(reads, client))
            await await_until(lambda: reads.sharing(command) == 1, "the second call shares")
            sender.cancel()
            client.gate.set()
            assert await shared is None  # (the old code: CancelledError)
            assert sender.cancelled()
            await reads.close()
        finally:
            await client.aclose()

    asyncio.run(scenario())
