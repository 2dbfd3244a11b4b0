"""The asyncio front end shares the scripts and the sans-I/O core; run it on both backends."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import redis.asyncio
import redis.asyncio.cluster
from harness import await_until, wait_until

from rcoord import (
    ConfigError,
    CoordinatorConfig,
    Errors,
    GroupCoordinator,
    MemberIdentity,
    TopicPartition,
)
from rcoord.asyncio import AsyncGroupCoordinator

JOIN = dict(protocol_type="consumer", protocols=[("range", b"m")], session_timeout_ms=5000,
            rebalance_timeout_ms=5000)
# The initial rebalance delay of the tests whose concurrent joins must form one generation: how
# long one member's join may lag the others' (its connection's set-up delayed on a loaded
# machine) while their parked calls see the delay end. 200-300 ms formed two generations when
# a member lagged that long; the delay is not what these tests are about.
FORM_DELAY_MS = 1000


def _async_client(request: pytest.FixtureRequest, backend: str) -> Any:
    if backend == "single":
        server = request.getfixturevalue("redis_server")
        return redis.asyncio.Redis(host="127.0.0.1", port=server.port)
    cluster = request.getfixturevalue("redis_cluster")
    return redis.asyncio.cluster.RedisCluster(host="127.0.0.1", port=cluster.ports[0])


def _run_closing(scenario: Callable[[Any], Awaitable[None]],
                 make_client: Callable[[], Any]) -> None:
    """``asyncio.run`` the scenario with a client made on its loop, closed however it ends: a
    client a failed assertion left open reports its transports as unraisable warnings against
    whatever test the collector runs next."""

    async def run() -> None:
        client = make_client()
        try:
            await scenario(client)
        finally:
            await client.aclose()

    asyncio.run(run())


def test_members_form_a_group_and_commit(request, backend, redis_client, namespace):
    # The operator writes the namespace's settings with the blocking API.
    GroupCoordinator(redis_client, CoordinatorConfig(
        namespace=namespace, group_min_session_timeout_ms=10,
        group_initial_rebalance_delay_ms=FORM_DELAY_MS)).start()

    async def scenario(client: Any) -> None:
        coord = await AsyncGroupCoordinator(client, namespace).start()
        assert coord.config.group_initial_rebalance_delay_ms == FORM_DELAY_MS
        ids = [(await coord.join_group("ag", **JOIN)).member_id for _ in range(3)]
        results = await asyncio.gather(*(coord.join_group("ag", i, **JOIN) for i in ids))
        assert {r.generation_id for r in results} == {1}
        leader = results[0].leader_id
        syncs = await asyncio.gather(*(
            coord.sync_group("ag", 1, i, assignments={m: m.encode() for m in ids} if i == leader else None)
            for i in ids))
        assert [s.assignment for s in syncs] == [i.encode() for i in ids]
        assert await coord.heartbeat("ag", 1, ids[0]) == Errors.NONE
        tp = TopicPartition("t", 0)
        assert await coord.commit_offsets("ag", {tp: 7}, member_id=ids[1], generation_id=1) == {tp: Errors.NONE}
        assert await coord.commit_offsets("ag", {tp: 9}, member_id=ids[1], generation_id=0) == {
            tp: Errors.ILLEGAL_GENERATION}
        assert (await coord.fetch_offsets("ag", [tp])).offsets[tp].offset == 7
        res = await coord.leave_group("ag", [MemberIdentity(ids[2]), MemberIdentity("ghost")])
        assert [m.error for m in res.members] == [Errors.NONE, Errors.UNKNOWN_MEMBER_ID]
        assert await coord.heartbeat("ag", 1, ids[0]) == Errors.REBALANCE_IN_PROGRESS

    _run_closing(scenario, lambda: _async_client(request, backend))


def test_async_and_blocking_members_share_one_group(request, backend, redis_client, namespace):
    sync_coord = GroupCoordinator(redis_client, CoordinatorConfig(
        namespace=namespace, group_min_session_timeout_ms=10,
        group_initial_rebalance_delay_ms=FORM_DELAY_MS)).start()

    async def scenario(client: Any) -> None:
        coord = await AsyncGroupCoordinator(client, namespace).start()
        a = (await coord.join_group("mixed", **JOIN)).member_id
        b = sync_coord.join_group("mixed", **JOIN).member_id
        loop = asyncio.get_running_loop()
        ra, rb = await asyncio.gather(coord.join_group("mixed", a, **JOIN),
                                      loop.run_in_executor(None, lambda: sync_coord.join_group("mixed", b, **JOIN)))
        assert ra.generation_id == rb.generation_id == 1 and ra.leader_id == rb.leader_id

    _run_closing(scenario, lambda: _async_client(request, backend))


def test_async_errors_are_typed(request, backend, namespace):
    async def scenario(client: Any) -> None:
        coord = AsyncGroupCoordinator(client, namespace)
        assert (await coord.join_group("", **JOIN)).error == Errors.INVALID_GROUP_ID
        with pytest.raises(TypeError):
            await coord.join_group("g", protocol_type="consumer", protocols="range", session_timeout_ms=10)

    _run_closing(scenario, lambda: _async_client(request, backend))


def _pooled_client(request: pytest.FixtureRequest, backend: str, size: int) -> Any:
    if backend == "single":
        server = request.getfixturevalue("redis_server")
        return redis.asyncio.Redis(host="127.0.0.1", port=server.port, max_connections=size)
    cluster = request.getfixturevalue("redis_cluster")
    return redis.asyncio.cluster.RedisCluster(host="127.0.0.1", port=cluster.ports[0],
                                              max_connections=size)


def test_a_group_larger_than_the_client_pool_forms_on_one_loop(request, backend, redis_client,
                                                               namespace):
    """A reviewer's repro, scaled down: every parked call held a pooled connection with its own
    XREAD BLOCK, and redis.asyncio refuses a connection past the pool's size, so more members
    on one loop than the pool holds (100 by default) failed with ConnectionLost "Too many
    connections". They now share one read per wake stream, and the other commands wait for a
    place under half the pool."""
    from rcoord.keys import GroupKeys

    GroupCoordinator(redis_client, CoordinatorConfig(
        namespace=namespace, group_min_session_timeout_ms=10,
        group_initial_rebalance_delay_ms=FORM_DELAY_MS)).start()
    members, pool = 40, 12
    join = dict(JOIN, session_timeout_ms=30_000, rebalance_timeout_ms=30_000)

    async def scenario(client: Any) -> None:
        coord = await AsyncGroupCoordinator(client, namespace).start()
        ids = [(await coord.join_group("big", **join)).member_id for _ in range(members)]
        joined = await asyncio.gather(*(coord.join_group("big", i, **join) for i in ids))
        assert {r.error for r in joined} == {Errors.NONE}
        assert {r.generation_id for r in joined} == {1}
        leader = joined[0].leader_id
        followers = [asyncio.create_task(coord.sync_group("big", 1, i)) for i in ids if i != leader]
        wake = GroupKeys.of(namespace, coord.config.num_partitions, "big").wake
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        while coord._wake_reads.waiting(wake) < members - 1:  # every follower parked
            assert loop.time() < deadline, coord._wake_reads.waiting(wake)
            await asyncio.sleep(0.01)
        mine = await coord.sync_group("big", 1, leader, assignments={i: i.encode() for i in ids})
        assert mine.assignment == leader.encode()
        synced = await asyncio.gather(*followers)
        assert {s.error for s in synced} == {Errors.NONE}
        assert sorted(s.assignment for s in synced) == sorted(
            i.encode() for i in ids if i != leader)

    _run_closing(scenario, lambda: _pooled_client(request, backend, pool))


def test_each_coordinator_takes_only_its_own_kind_of_client(request, backend, redis_client,
                                                             namespace):
    """A blocking client given to the asyncio coordinator ran its commands on the loop and then
    failed with "object list can't be used in 'await' expression"; the reverse, with
    "'coroutine' object is not subscriptable". An empty namespace= fell back to the default
    namespace on the asyncio coordinator only."""
    with pytest.raises(TypeError, match="AsyncGroupCoordinator needs a redis.asyncio client"):
        AsyncGroupCoordinator(redis_client, namespace)
    client = _async_client(request, backend)
    with pytest.raises(TypeError, match="GroupCoordinator needs a blocking client"):
        GroupCoordinator(client, namespace)
    async def start_empty() -> None:
        with pytest.raises(ConfigError, match="namespace"):
            await AsyncGroupCoordinator(client, namespace="").start()
        await client.aclose()

    asyncio.run(start_empty())
    with pytest.raises(ConfigError, match="namespace"):
        GroupCoordinator(redis_client, "").start()


def test_parked_reads_never_take_the_places_of_other_commands(request, backend, redis_client,
                                                              namespace):
    """A reviewer's repro: the reads shared the commands' bound, so with parked calls in as
    many groups as the bound, every place was held by a blocked read for up to a second, and a
    heartbeat (or the SyncGroup that would wake them) waited for one to end. Reads now have a
    bound of their own (per master, as the commands'). Also: the bounds belong to the loop using them, so the coordinator works
    from a second ``asyncio.run`` (an asyncio.Semaphore binds to the loop that first waits)."""
    from rcoord.keys import GroupKeys

    GroupCoordinator(redis_client, CoordinatorConfig(
        namespace=namespace, group_min_session_timeout_ms=10,
        group_initial_rebalance_delay_ms=FORM_DELAY_MS)).start()
    client = _pooled_client(request, backend, 4)  # commands 2, reads 1
    coord = AsyncGroupCoordinator(client, namespace)
    join = dict(JOIN, session_timeout_ms=30_000, rebalance_timeout_ms=30_000)

    async def park_and_beat() -> None:
        try:
            await parked_and_beaten()
        finally:
            await client.aclose()  # (its connections belong to this loop)

    async def parked_and_beaten() -> None:
        await coord.start()
        groups, leaders, parked = ["r1", "r2"], {}, []
        for g in groups:
            ids = [(await coord.join_group(g, **join)).member_id for _ in range(2)]
            joined = await asyncio.gather(*(coord.join_group(g, i, **join) for i in ids))
            assert len({r.generation_id for r in joined}) == 1
            leaders[g] = (joined[0].leader_id, ids, joined[0].generation_id)
            parked += [asyncio.create_task(coord.sync_group(g, joined[0].generation_id, i))
                       for i in ids if i != joined[0].leader_id]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        wakes = [GroupKeys.of(namespace, coord.config.num_partitions, g).wake for g in groups]
        while not all(coord._wake_reads.waiting(w) for w in wakes):
            assert loop.time() < deadline
            await asyncio.sleep(0.01)
        # Both groups parked, one read place (per master): taken, and the commands' are free.
        reads = coord._wake_reads
        bounds = [(is_read, b.places) for (_, is_read), b in reads._by_master.items()]
        bounds += [(False, reads.commands()), (True, reads._reads)]
        assert any(is_read and places.locked() for is_read, places in bounds)
        assert not any(places.locked() for is_read, places in bounds if not is_read)
        for g, (leader, ids, gen) in leaders.items():
            await coord.sync_group(g, gen, leader, assignments={i: b"x" for i in ids})
        assert {s.error for s in await asyncio.gather(*parked)} == {Errors.NONE}

    async def burst() -> None:
        try:
            listed = await asyncio.gather(*(coord.list_groups() for _ in range(8)))
        finally:
            await client.aclose()
        assert all({"r1", "r2"} <= {g.group_id for g in found} for found in listed)

    asyncio.run(park_and_beat())
    asyncio.run(burst())  # a second loop


# -- one coordinator across loops; a failed shared read; readers nobody waits for -------------

FORM = dict(JOIN, session_timeout_ms=30_000, rebalance_timeout_ms=30_000)


def _blocked_xreads(admin: Any) -> list[Any]:
    return [c for c in admin.client_list() if c.get("cmd") == "xread" and "b" in c.get("flags", "")]


async def _formed(coord: AsyncGroupCoordinator, group: str, members: int) -> tuple[str, list[str], int]:
    """(leader, member ids, generation) of ``group`` formed by ``members`` new members."""
    ids = [(await coord.join_group(group, **FORM)).member_id for _ in range(members)]
    joined = await asyncio.gather(*(coord.join_group(group, i, **FORM) for i in ids))
    assert {r.error for r in joined} == {Errors.NONE}
    return joined[0].leader_id, ids, joined[0].generation_id


def test_one_coordinator_serves_successive_loops_after_a_function_flush(own_server, namespace):
    """A reviewer's repro: the library's reload lock and the coordinator's settle lock were
    asyncio.Locks made once; contended under one asyncio.run, they failed every contended
    caller under the next with "RuntimeError: ... is bound to a different event loop" (after a
    FUNCTION FLUSH, 15 of 20 concurrent calls). Each loop now gets its own locks."""
    admin = own_server.client()
    GroupCoordinator(admin, CoordinatorConfig(namespace=namespace)).start()
    client = redis.asyncio.Redis(host="127.0.0.1", port=own_server.port)
    coord = AsyncGroupCoordinator(client, namespace)

    async def burst() -> list[Any]:
        settled = await asyncio.gather(*(coord.resettle() for _ in range(4)),
                                       return_exceptions=True)
        admin.execute_command("FUNCTION", "FLUSH")  # (a restart or failover, in effect)
        found = await asyncio.gather(*(coord.describe_group(f"g{i}") for i in range(20)),
                                     return_exceptions=True)
        await client.aclose()  # (its connections belong to this loop)
        return [r for r in [*settled, *found] if isinstance(r, BaseException)]

    try:
        for _ in range(4):
            assert asyncio.run(burst()) == []
    finally:
        admin.close()


def test_one_failed_shared_read_fails_one_parked_call(own_server, namespace, monkeypatch):
    """A reviewer's repro: the error of the read the parked calls share went to every waiter,
    so one killed connection failed all five parked SyncGroups, where the blocking coordinator
    fails only the thread whose read it was. Now it fails one (the oldest) and the others read
    again and get their assignments."""
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff

    from rcoord import ConnectionLost, steps
    from rcoord.keys import GroupKeys

    # The shared read blocks until the members' 30 s sessions are near, not for at most a
    # second (MAX_BLOCK_MS, and half the client's socket timeout, 5 s by default): the
    # connection seen blocked in XREAD is still that read's when it is killed. With reads
    # ending every second, a kill that came later (the test's thread lagging the loop on a
    # loaded machine) met a connection that read had left, a due check's (two followers
    # failed) or an idle one, and the test did not judge what it is about.
    monkeypatch.setattr(steps, "MAX_BLOCK_MS", 60_000)

    admin = own_server.client()
    GroupCoordinator(admin, CoordinatorConfig(
        namespace=namespace, group_min_session_timeout_ms=10,
        group_initial_rebalance_delay_ms=FORM_DELAY_MS)).start()

    async def scenario(client: Any) -> None:
        coord = await AsyncGroupCoordinator(client, namespace).start()
        leader, ids, gen = await _formed(coord, "g", 6)
        followers = [asyncio.create_task(coord.sync_group("g", gen, i))
                     for i in ids if i != leader]
        wake = GroupKeys.of(namespace, coord.config.num_partitions, "g").wake
        loop = asyncio.get_running_loop()
        await await_until(lambda: coord._wake_reads.waiting(wake) == 5, "five followers parked")
        blocked: list[Any] = []

        def one_blocked_read() -> bool:
            blocked[:] = _blocked_xreads(admin)
            return len(blocked) == 1

        await loop.run_in_executor(None, wait_until, one_blocked_read)
        admin.client_kill_filter(_id=blocked[0]["id"])
        await await_until(lambda: any(t.done() for t in followers), "a follower failed")
        assert sum(t.done() for t in followers) == 1  # (all five were failed by the one read)
        # The others read again: parked, not failed (their 30 s rebalance is far off).
        await await_until(lambda: coord._wake_reads.waiting(wake) == 4, "four followers parked")
        assert sum(t.done() for t in followers) == 1
        mine = await coord.sync_group("g", gen, leader, assignments={i: i.encode() for i in ids})
        assert mine.error == Errors.NONE
        outcomes = await asyncio.gather(*followers, return_exceptions=True)
        failed = [o for o in outcomes if isinstance(o, BaseException)]
        assert len(failed) == 1 and isinstance(failed[0], ConnectionLost), outcomes
        synced = [o for o in outcomes if not isinstance(o, BaseException)]
        assert {s.error for s in synced} == {Errors.NONE}
        assert all(s.assignment.decode() in ids for s in synced)
        await coord.close()

    try:
        # No retries, so the one killed read is an error and not quietly sent again.
        _run_closing(scenario, lambda: redis.asyncio.Redis(
            host="127.0.0.1", port=own_server.port, retry=Retry(NoBackoff(), 0),
            socket_timeout=120))
    finally:
        admin.close()


def test_a_read_nobody_waits_for_ends_and_close_ends_them_all(own_server, namespace):
    """A reviewer's repro: a parked call cancelled left its shared read blocked (and holding a
    read place) until the gone call's deadline, and after the client was closed the reader
    reconnected and left a connection behind. A read with no waiter left is cancelled, and
    ``close()`` cancels every read and waits for them."""
    from rcoord import ConnectionLost
    from rcoord.keys import GroupKeys

    admin = own_server.client()
    GroupCoordinator(admin, CoordinatorConfig(
        namespace=namespace, group_min_session_timeout_ms=10,
        group_initial_rebalance_delay_ms=FORM_DELAY_MS)).start()
    mine = admin.client_id()

    def others() -> list[Any]:
        return [c for c in admin.client_list() if int(c["id"]) != mine]

    async def scenario(client: Any) -> None:
        coord = await AsyncGroupCoordinator(client, namespace).start()
        reads = coord._wake_reads
        leader, ids, gen = await _formed(coord, "g", 2)
        follower = next(i for i in ids if i != leader)
        wake = GroupKeys.of(namespace, coord.config.num_partitions, "g").wake
        loop = asyncio.get_running_loop()

        async def parked() -> asyncio.Task[Any]:
            call = asyncio.create_task(coord.sync_group("g", gen, follower))
            await await_until(lambda: reads.waiting(wake) == 1
                         and reads._streams[wake].reader is not None, "parked, read in flight")
            await loop.run_in_executor(None, wait_until, lambda: len(_blocked_xreads(admin)) == 1)
            return call

        # The only parked call cancelled: its read is cancelled with it, not left to block.
        call = await parked()
        reader = reads._streams[wake].reader
        assert reader is not None
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        assert reader.done() or reader.cancelling(), "the read outlived its last waiter"
        assert reads.reading() == 0
        await asyncio.gather(reader, return_exceptions=True)
        await loop.run_in_executor(None, wait_until, lambda: not _blocked_xreads(admin))

        # close(): no read is left, the call still parked fails, and nothing reconnects.
        call = await parked()
        await coord.close()
        assert reads.reading() == 0
        with pytest.raises(ConnectionLost):
            await call
        assert asyncio.all_tasks() == {asyncio.current_task()}
        await client.aclose()
        await loop.run_in_executor(None, wait_until, lambda: not others())
        assert asyncio.all_tasks() == {asyncio.current_task()}

    try:
        _run_closing(scenario, lambda: redis.asyncio.Redis(host="127.0.0.1", port=own_server.port))
        assert others() == []
    finally:
        admin.close()


def test_parked_calls_share_the_due_check_and_the_claim(redis_server, namespace):
    """A reviewer's measurement: with 200 members parked in one join, the asyncio coordinator
    sent a due check (ZSCORE) and a claim (SET NX) per parked call each time the join's deadline
    fell due (824 and 204, the blocking coordinator 244 and 7). Now the calls of one coordinator
    share each question in flight and ask for a claim once while it holds."""
    from collections import Counter

    members = 60
    parked: set[bytes] = set()
    everyone_parked = asyncio.Event()

    class Counting(redis.asyncio.Redis):
        sent: Counter[str] = Counter()

        async def execute_command(self, *args: Any, **options: Any) -> Any:
            command = str(args[0]).upper()
            self.sent[command] += 1
            if command == "ZSCORE":
                await asyncio.wait_for(everyone_parked.wait(), 60)
            reply = await super().execute_command(*args, **options)
            if command == "FCALL" and "join_group" in str(args[1]) and reply[0] == b"W":
                parked.add(reply[4])
                if len(parked) == members:
                    everyone_parked.set()
            return reply

    # The generation forms once a due check finds the delay over with no member come in it:
    # the due checks wait until every member is parked, so a join that a loaded machine holds
    # up for longer than the delay still comes in the first generation (CI, with another
    # worker process on its two CPUs, once left more than 300 ms between two joins). Without
    # a stall every member is parked long before the deadline and no check waits. The delay is
    # under MAX_BLOCK_MS (1 s), so a parked call's wait ends at the deadline, not before it,
    # and the due checks counted stay those of the deadline falling due.
    GroupCoordinator(redis_server.client(), CoordinatorConfig(
        namespace=namespace, group_min_session_timeout_ms=10,
        group_initial_rebalance_delay_ms=800)).start()

    async def scenario() -> None:
        client = Counting(host="127.0.0.1", port=redis_server.port, max_connections=500)
        coord = await AsyncGroupCoordinator(client, namespace).start()
        try:
            joined = await asyncio.gather(*(
                coord.join_group("g", **{**FORM, "require_known_member_id": False})
                for _ in range(members)))
        finally:
            # Closed on failure too: a client left to the collector reports its 60 open
            # transports as unraisable warnings against whatever test runs next.
            await coord.close()
            await client.aclose()
        assert {r.error for r in joined} == {Errors.NONE}
        assert len({r.generation_id for r in joined}) == 1

    asyncio.run(scenario())
    # Measured: 2 claims and 22-29 due checks; before, 7-32 claims and 81-95 due checks.
    assert Counting.sent["SET"] <= 4, Counting.sent
    assert Counting.sent["ZSCORE"] < members, Counting.sent
