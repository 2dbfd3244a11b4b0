"""Two reviewer's findings on the asyncio coordinator: its command bound was one for all the
masters of a cluster, so the calls stuck on one stalled master held up those for the others;
and ``close()`` failed only the parked calls waiting on a read at that moment, so one between
two reads (its due check, say) went on parking afterwards, with a reader of its own."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from typing import Any

import pytest
import redis.asyncio
import redis.asyncio.cluster
import redis.exceptions
from harness import WAIT_S, await_until, wait_until

from rcoord import ConnectionLost, CoordinatorConfig, Errors, GroupCoordinator
from rcoord.asyncio import AsyncGroupCoordinator
from rcoord.asyncio.wake import AsyncWakeReads
from rcoord.keys import GroupKeys

FORM: dict[str, Any] = {"protocol_type": "consumer", "protocols": [("range", b"m")],
                        "session_timeout_ms": 30_000, "rebalance_timeout_ms": 30_000}


def _cluster_ok(cluster: Any) -> bool:
    """Whether every node says the cluster is ok (again: a stall past the node timeout fails
    the stalled master until it answers)."""
    for node in cluster.nodes:
        with contextlib.closing(node.client(decode_responses=True)) as client:
            if "cluster_state:ok" not in client.execute_command("CLUSTER", "INFO"):
                return False
    return True


def test_calls_stuck_on_a_stalled_master_leave_the_other_masters_served(redis_cluster, namespace):
    """A reviewer's repro, scaled down: with 70 members' heartbeats on a SIGSTOPped master, a
    heartbeat for a group on a healthy master waited for the whole stall and its member expired,
    as every command waited under one bound for all masters. The bound is now per master, as
    the pools are, so here (pools of 4: two places a master) three calls stuck on the stalled
    master leave a call for a group on another master to be answered while they still wait."""
    admin = redis_cluster.client()
    n = GroupCoordinator(admin, CoordinatorConfig(namespace=namespace)).start().config.num_partitions

    def port(group: str) -> int:
        return int(admin.get_node_from_key(GroupKeys.of(namespace, n, group).group).port)

    stalled = next(s for s in redis_cluster.nodes if s.port == port("stuck"))
    healthy = next(f"h{i}" for i in range(100) if port(f"h{i}") != stalled.port)
    healthy_port = port(healthy)

    class Counting(redis.asyncio.cluster.RedisCluster):
        sent = 0  # commands that went out (each under its master's bound)

        async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
            Counting.sent += 1
            return await super().execute_command(*args, **kwargs)

    async def scenario() -> None:
        client = Counting(host="127.0.0.1", port=healthy_port, max_connections=4)
        try:
            coord = await AsyncGroupCoordinator(client, namespace).start()
            bound = 2  # command_limit: half of each node's pool of 4
            # (Routes known.)
            assert await coord.heartbeat("stuck", 1, "m") == Errors.UNKNOWN_MEMBER_ID
            stuck: list[asyncio.Task[Any]] = []
            os.kill(stalled.pid, signal.SIGSTOP)
            try:
                Counting.sent = 0
                stuck += [asyncio.create_task(coord.heartbeat("stuck", 1, "m"))
                          for _ in range(bound + 1)]
                # The stalled master's places taken.
                await await_until(lambda: Counting.sent >= bound)
                answer = await asyncio.wait_for(coord.heartbeat(healthy, 1, "m"), WAIT_S)
                assert answer == Errors.UNKNOWN_MEMBER_ID
                assert not any(task.done() for task in stuck)  # answered during the stall
            finally:
                os.kill(stalled.pid, signal.SIGCONT)
                outcomes = await asyncio.wait_for(asyncio.gather(*stuck, return_exceptions=True),
                                                  WAIT_S)
            assert set(outcomes) <= {Errors.UNKNOWN_MEMBER_ID}, outcomes
            assert coord._wake_reads._by_master == {}  # no idle master's bound is kept
            await coord.close()
        finally:
            await client.aclose()

    try:
        asyncio.run(scenario())
    finally:
        wait_until(lambda: _cluster_ok(redis_cluster), timeout_s=4 * WAIT_S)
        admin.close()


def test_reads_stuck_on_a_stalled_master_leave_the_other_masters_reads_to_go(redis_cluster):
    """The wake-stream reads had one bound for all masters (half the commands' bound), so the
    reads stuck on a stalled master held every read place: a parked call on a healthy master
    was not woken by its stream, only by its own timeout (up to a second late, at every wake).
    The read bound is now per master too: here (a bound of one read) a read stuck on the stalled
    master leaves a read on another master to see its stream move."""
    admin = redis_cluster.client()

    def port(key: str) -> int:
        return int(admin.get_node_from_key(key).port)

    stuck_key = "wake-stuck"
    stalled = next(s for s in redis_cluster.nodes if s.port == port(stuck_key))
    healthy_key = next(f"wake-{i}" for i in range(100) if port(f"wake-{i}") != stalled.port)

    async def scenario() -> None:
        client = redis.asyncio.cluster.RedisCluster(host="127.0.0.1", port=port(healthy_key))
        await client.initialize()
        reads = AsyncWakeReads(2)  # one read in flight per master
        os.kill(stalled.pid, signal.SIGSTOP)
        try:
            stuck = asyncio.create_task(reads.wait(client, stuck_key, b"0-0", 60_000))
            await await_until(lambda: reads.reading() == 1)  # its read sent, or waiting to be
            healthy = asyncio.create_task(reads.wait(client, healthy_key, b"0-0", 4_000))
            await await_until(lambda: reads.waiting(healthy_key) == 1)
            admin.xadd(healthy_key, {"w": "1"})
            assert await asyncio.wait_for(healthy, WAIT_S) is True  # (the old code: False)
            assert not stuck.done()
        finally:
            os.kill(stalled.pid, signal.SIGCONT)
            await reads.close()
            outcomes = await asyncio.gather(stuck, return_exceptions=True)
            await client.aclose()
        assert all(isinstance(o, (bool, redis.exceptions.ConnectionError)) for o in outcomes)
        assert reads._by_master == {}  # no idle master's bound is kept

    try:
        asyncio.run(scenario())
    finally:
        wait_until(lambda: _cluster_ok(redis_cluster), timeout_s=4 * WAIT_S)
        admin.close()


async def _formed(coord: AsyncGroupCoordinator) -> tuple[int, str]:
    """(generation, follower) of a two-member group "g" formed: the follower's SyncGroup parks
    (the leader never sends the assignment, and the rebalance timeout is 30 s)."""
    ids = [(await coord.join_group("g", **FORM)).member_id for _ in range(2)]
    joined = await asyncio.gather(*(coord.join_group("g", i, **FORM) for i in ids))
    assert {r.error for r in joined} == {Errors.NONE}
    return joined[0].generation_id, next(i for i in ids if i != joined[0].leader_id)


def _settled(redis_server: Any, namespace: str) -> None:
    """The namespace's settings, with an initial delay that a member's join lagging the other's
    (on a loaded machine) cannot outlast: at 300 ms a lag that long formed a second generation,
    and the first generation's follower was answered at once instead of parking."""
    with contextlib.closing(redis_server.client()) as admin:
        GroupCoordinator(admin, CoordinatorConfig(
            namespace=namespace, group_min_session_timeout_ms=10,
            group_initial_rebalance_delay_ms=1000)).start()


def test_close_fails_a_parked_call_between_two_reads(redis_server, namespace):
    """A reviewer's repro: ``close()`` failed only the waiters it found; a parked call in its
    due check (after one wake-stream read timed out, before the next) was not among them, so
    it read again after ``close()``, with a reader task of its own, and would have reconnected
    the client closed after it. Every later read now fails at once, so the call fails with
    ``ConnectionLost`` and no reader survives ``close()``."""
    _settled(redis_server, namespace)

    class GatedDueCheck(redis.asyncio.Redis):
        """Holds a due check (ZSCORE) once ``gate`` is set, until the gate opens."""

        gate: asyncio.Event | None = None
        checking = asyncio.Event()

        async def execute_command(self, *args: Any, **options: Any) -> Any:
            if args[0] == "ZSCORE" and self.gate is not None:
                self.checking.set()
                await self.gate.wait()
            return await super().execute_command(*args, **options)

    async def scenario() -> None:
        client = GatedDueCheck(host="127.0.0.1", port=redis_server.port)
        try:
            coord = await AsyncGroupCoordinator(client, namespace).start()
            reads = coord._wake_reads
            generation, follower = await _formed(coord)
            client.gate = asyncio.Event()
            call = asyncio.create_task(coord.sync_group("g", generation, follower))
            await asyncio.wait_for(client.checking.wait(), WAIT_S)  # its first read timed out
            await coord.close()
            client.gate.set()
            with pytest.raises(ConnectionLost):
                await asyncio.wait_for(call, WAIT_S)
            assert reads.reading() == 0
            assert asyncio.all_tasks() == {asyncio.current_task()}
        finally:
            await client.aclose()

    asyncio.run(scenario())


def test_a_closed_coordinator_refuses_calls_until_started_again(redis_server, namespace):
    """After ``close()`` a call fails at once with ``ConnectionLost`` (it used to start
    afresh, so a call racing ``close()`` could reconnect the client closed after it), as Kafka's
    coordinator answers COORDINATOR_NOT_AVAILABLE between ``shutdown()`` and ``startup()``;
    ``start()`` opens it again."""
    _settled(redis_server, namespace)

    async def scenario() -> None:
        client = redis.asyncio.Redis(host="127.0.0.1", port=redis_server.port)
        try:
            coord = await AsyncGroupCoordinator(client, namespace).start()
            generation, follower = await _formed(coord)
            call = asyncio.create_task(coord.sync_group("g", generation, follower))
            # Parked, its read in flight.
            await await_until(lambda: coord._wake_reads.reading() == 1)
            await coord.close()
            with pytest.raises(ConnectionLost):
                await asyncio.wait_for(call, WAIT_S)
            with pytest.raises(ConnectionLost):
                await coord.describe_group("g")
            await coord.start()
            assert (await coord.describe_group("g")).state == "CompletingRebalance"
            await coord.close()
        finally:
            await client.aclose()

    asyncio.run(scenario())
