"""When Redis answers that it cannot run a call now (a replica's READONLY after a failover the
client has not followed, BUSY, TRYAGAIN, a function still missing after every reload), the public
API raises ``ServerUnavailable``, a ``ConnectionLost``: retried with the member id kept, as Kafka's
clients retry COORDINATOR_NOT_AVAILABLE, instead of taken for an unknown error (which makes a
worker leave its group)."""

from __future__ import annotations

import asyncio
import concurrent.futures
from typing import Any

import pytest
import redis
import redis.asyncio
from harness import WAIT_S, await_until, wait_until

from rcoord import (
    ConnectionLost,
    CoordinatorConfig,
    Errors,
    GroupCoordinator,
    ServerUnavailable,
)
from rcoord.asyncio import AsyncGroupCoordinator
from rcoord.client import ConsumerGroup, ConsumerGroupConfig
from rcoord.client.coordinator import RedisCoordinator
from rcoord.client.policy import CONNECTION_LOST, reaction_for
from rcoord.errors import MissingPermissionError, reraise_as_rcoord
from rcoord.testing.embedded import EmbeddedServer
from rcoord.topics import Producer, Topics, log_offsets

JOIN = {"protocol_type": "consumer", "protocols": [("range", b"")], "session_timeout_ms": 30_000,
        "require_known_member_id": False}


def _demote(r: redis.Redis, absent_port: int) -> None:
    """Make the server a replica of a master that does not exist: it keeps its data (it never
    syncs) and refuses writes with READONLY, as a demoted master does after a failover."""
    r.execute_command("REPLICAOF", "127.0.0.1", absent_port)


@pytest.mark.parametrize("answer", [
    redis.exceptions.ReadOnlyError("You can't write against a read only replica."),
    redis.exceptions.TryAgainError("Multiple keys request during rehashing of slot"),
    redis.exceptions.NoScriptError("No matching script. Please use EVAL."),
    redis.ResponseError("BUSY Redis is busy running a script. You can only call SCRIPT KILL"),
    redis.ResponseError("NOREPLICAS Not enough good replicas to write."),
    redis.ResponseError("UNBLOCKED force unblock from blocking operation, instance state changed "
                        "(master -> replica?)"),
    redis.ResponseError("Function not found"),
    redis.exceptions.OutOfMemoryError(
        "command not allowed when used memory > 'maxmemory'. script: x, on @user_script:42."),
])
def test_answers_that_mean_not_now_become_server_unavailable(answer: Exception) -> None:
    with pytest.raises(ServerUnavailable) as caught:
        reraise_as_rcoord("heartbeat", answer)
    assert isinstance(caught.value, ConnectionLost) and caught.value.__cause__ is answer
    assert "try again" in str(caught.value)


def test_other_errors_are_left_alone() -> None:
    reraise_as_rcoord("heartbeat", redis.ResponseError("WRONGTYPE Operation against a key"))
    reraise_as_rcoord("heartbeat", redis.ResponseError("ERR unknown command 'FCALL'"))


@pytest.mark.parametrize("answer", [
    redis.exceptions.NoPermissionError(
        "User w has no permissions to run the 'xadd' command"),
    # The same refusal met inside a function: a plain error, without the NOPERM code.
    redis.ResponseError("ACL failure in script: User w has no permissions to run the 'xadd' "
                        "command script: topic_append, on @user_function:12."),
])
def test_a_missing_permission_becomes_missing_permission_error(answer: Exception) -> None:
    """Every rcoord call, not only the worker's group loop: before, GroupCoordinator, Topics and
    a manual commit raised redis-py's error, without the hint."""
    with pytest.raises(MissingPermissionError, match="docs/security.md") as caught:
        reraise_as_rcoord("append", answer)
    assert caught.value.__cause__ is answer
    assert "no permissions to run the 'xadd' command" in str(caught.value)
    assert reaction_for(caught.value).then == "fatal"


def test_the_worker_retries_it_keeping_its_member_id() -> None:
    reaction = reaction_for(ServerUnavailable("heartbeat: Redis cannot run this now"))
    assert reaction == CONNECTION_LOST
    assert reaction.retry and reaction.member_id == "keep"


def test_a_demoted_master_answers_server_unavailable_until_it_is_promoted(
        own_server: EmbeddedServer, refused_port: int, namespace: str) -> None:
    r = redis.Redis(host="127.0.0.1", port=own_server.port)
    coord = GroupCoordinator(r, CoordinatorConfig(
        namespace=namespace, group_initial_rebalance_delay_ms=0,
        group_min_session_timeout_ms=100)).start()
    joined = coord.join_group("g", **JOIN)
    coord.sync_group("g", joined.generation_id, joined.member_id, assignments={})
    _demote(r, refused_port)
    try:
        with pytest.raises(ServerUnavailable, match="READONLY|read only"):
            coord.heartbeat("g", joined.generation_id, joined.member_id)
    finally:
        r.execute_command("REPLICAOF", "NO", "ONE")
    assert coord.heartbeat("g", joined.generation_id, joined.member_id) is Errors.NONE
    r.close()


def test_the_asyncio_coordinator_answers_alike(own_server: EmbeddedServer, refused_port: int,
                                               namespace: str) -> None:
    r = redis.Redis(host="127.0.0.1", port=own_server.port)
    try:
        refused, after = _refused_then_served(
            own_server.port, namespace, "asyncio", lambda: _demote(r, refused_port),
            lambda: r.execute_command("REPLICAOF", "NO", "ONE"))
        assert isinstance(refused, ServerUnavailable)
        assert after is Errors.NONE
    finally:
        r.close()


@pytest.mark.parametrize("idempotent", [False, True], ids=["plain", "idempotent"])
def test_a_send_refused_for_memory_raises_server_unavailable_and_writes_nothing(
    own_server: EmbeddedServer, idempotent: bool
) -> None:
    """Used memory above maxmemory (noeviction): Redis refuses the append script's first XADD,
    so nothing is written, and the producer says so with the typed retriable error instead of
    redis-py's raw OutOfMemoryError."""
    r = own_server.client()
    try:
        Topics(r, "ns").create("t", 1)
        producer = Producer(r, "ns", idempotent=idempotent)
        assert producer.send("t", b"a", partition=0).offset == 0  # (the producer id is made)
        r.config_set("maxmemory-policy", "noeviction")
        r.config_set("maxmemory", 1)
        try:
            with pytest.raises(ServerUnavailable, match="out of memory") as caught:
                producer.send("t", b"b", partition=0)
            assert isinstance(caught.value.__cause__, redis.exceptions.OutOfMemoryError)
            assert log_offsets(r, "ns", "t", 0) == (0, 1)  # nothing was appended
        finally:
            r.config_set("maxmemory", 0)
        assert producer.send("t", b"c", partition=0).offset == 1
    finally:
        r.close()


def _too_few_replicas(r: redis.Redis) -> None:
    """``min-replicas-to-write 1`` on a master with no replica: it refuses every function that
    may write with NOREPLICAS (as when its replica lags past ``min-replicas-max-lag``, the
    setting docs/guarantees.md suggests), and runs none of it."""
    r.config_set("min-replicas-to-write", 1)


def _refused_then_served(port: int, namespace: str, driver: str, refuse: Any,
                         allow: Any) -> tuple[Any, Errors]:
    """A member's heartbeat while the server refuses (``refuse()``; ``allow()`` ends it), with
    the ``driver`` given: what the refused heartbeat raised (None: nothing), and the answer to
    the heartbeat after."""
    cfg = CoordinatorConfig(namespace=namespace, group_initial_rebalance_delay_ms=0,
                            group_min_session_timeout_ms=100)

    async def with_asyncio() -> tuple[Any, Errors]:
        client = redis.asyncio.Redis(host="127.0.0.1", port=port)
        try:
            coord = await AsyncGroupCoordinator(client, cfg).start()
            joined = await coord.join_group("g", **JOIN)
            await coord.sync_group("g", joined.generation_id, joined.member_id, assignments={})
            refuse()
            try:
                await coord.heartbeat("g", joined.generation_id, joined.member_id)
                refused: Any = None
            except ServerUnavailable as exc:
                refused = exc
            finally:
                allow()
            return refused, await coord.heartbeat("g", joined.generation_id, joined.member_id)
        finally:
            await client.aclose()

    if driver == "asyncio":
        return asyncio.run(with_asyncio())
    r = redis.Redis(host="127.0.0.1", port=port)
    try:
        coord = GroupCoordinator(r, cfg).start()
        joined = coord.join_group("g", **JOIN)
        coord.sync_group("g", joined.generation_id, joined.member_id, assignments={})
        refuse()
        try:
            coord.heartbeat("g", joined.generation_id, joined.member_id)
            refused = None
        except ServerUnavailable as exc:
            refused = exc
        finally:
            allow()
        return refused, coord.heartbeat("g", joined.generation_id, joined.member_id)
    finally:
        r.close()


@pytest.mark.parametrize("driver", ["blocking", "asyncio"])
def test_too_few_replicas_answers_server_unavailable_with_either_driver(
        own_server: EmbeddedServer, namespace: str, driver: str) -> None:
    """Kafka's group coordinator answers NOT_ENOUGH_REPLICAS as COORDINATOR_NOT_AVAILABLE
    (GroupMetadataManager). Before, redis-py's plain ResponseError came out of the public API,
    and the worker took it for an unknown error: its generation ended with the partitions lost,
    it left the group, and Consumer.poll() raised it."""
    r = redis.Redis(host="127.0.0.1", port=own_server.port)
    try:
        refused, after = _refused_then_served(
            own_server.port, namespace, driver, lambda: _too_few_replicas(r),
            lambda: r.config_set("min-replicas-to-write", 0))
        assert isinstance(refused, ServerUnavailable) and "NOREPLICAS" in str(refused)
        assert after is Errors.NONE  # nothing ran while refused: the member is as it was
    finally:
        r.config_set("min-replicas-to-write", 0)
        r.close()


def test_a_worker_keeps_its_generation_through_too_few_replicas(
        own_server: EmbeddedServer, namespace: str) -> None:
    """The worker retries the refused heartbeats keeping its member id and its partitions, as
    a Kafka consumer retries COORDINATOR_NOT_AVAILABLE; before, the first refusal ended the
    generation with the partitions lost and the member left the group."""
    r = redis.Redis(host="127.0.0.1", port=own_server.port)
    GroupCoordinator(r, CoordinatorConfig(namespace=namespace, group_initial_rebalance_delay_ms=0,
                                          group_min_session_timeout_ms=100)).start()
    Topics(r, namespace).create("t", 1)
    refused: list[BaseException] = []
    answered = [0]

    class Counting(RedisCoordinator):
        def heartbeat(self, *args: Any, **kwargs: Any) -> Errors:
            try:
                error = super().heartbeat(*args, **kwargs)
            except Exception as exc:
                refused.append(exc)
                raise
            answered[0] += 1
            return error

    group = ConsumerGroup(ConsumerGroupConfig(
        group_id="g", topics=["t"], redis_client=r, namespace=namespace,
        heartbeat_interval_ms=20, session_timeout_ms=10_000, rebalance_timeout_ms=10_000,
        retry_backoff_ms=10, retry_backoff_max_ms=20), coordinator=Counting(r, namespace))
    try:
        gen = group.next(timeout=WAIT_S)
        member = group.member_id
        _too_few_replicas(r)
        try:
            wait_until(lambda: len(refused) >= 3 or gen.done.is_set())
        finally:
            r.config_set("min-replicas-to-write", 0)
        assert not gen.done.is_set(), (gen.end_reason, gen.end_error)
        assert all(isinstance(e, ServerUnavailable) for e in refused), refused
        beats = answered[0]
        wait_until(lambda: answered[0] > beats or gen.done.is_set())
        assert not gen.done.is_set() and not gen.lost
        assert group.member_id == member
        assert [m.member_id for m in GroupCoordinator(r, namespace).describe_group("g").members] \
            == [member]
    finally:
        group.close(timeout=WAIT_S)
        r.config_set("min-replicas-to-write", 0)
        r.close()


@pytest.mark.parametrize("driver", ["blocking", "asyncio"])
def test_writes_stopped_by_a_failed_save_answer_server_unavailable_with_either_driver(
        namespace: str, driver: str) -> None:
    """A server whose last RDB save failed, with save points and the default
    stop-writes-on-bgsave-error, refuses every function with MISCONF (here its dir is /proc,
    where no file can be made). Before, redis-py's plain ResponseError came out of the public
    API and the worker took it for an unknown error (it left its group at every refusal);
    Kafka answers a group write its log cannot store as NOT_COORDINATOR, which is retried."""
    server = EmbeddedServer(extra_args=["--dir", "/proc", "--save", "3600 1"]).start()
    r = server.client()

    def fail_a_save() -> None:
        r.bgsave()
        wait_until(lambda: r.info("persistence")["rdb_bgsave_in_progress"] == 0)
        assert r.info("persistence")["rdb_last_bgsave_status"] == "err"

    try:
        refused, after = _refused_then_served(
            server.port, namespace, driver, fail_a_save,
            lambda: r.config_set("stop-writes-on-bgsave-error", "no"))
        assert isinstance(refused, ServerUnavailable)
        assert "last RDB save failed" in str(refused) and "MISCONF" in str(refused)
        assert after is Errors.NONE  # nothing ran while refused: the member is as it was
    finally:
        r.config_set("save", "")  # (else its shutdown tries to save in /proc, and waits)
        r.close()
        server.stop()


@pytest.mark.parametrize("driver", ["blocking", "asyncio"])
def test_a_parked_join_ended_by_a_demotion_answers_server_unavailable(
        own_server: EmbeddedServer, refused_port: int, namespace: str, driver: str) -> None:
    """A master turned replica (a failover, Sentinel's REPLICAOF) ends every blocked XREAD with
    'UNBLOCKED force unblock ...': the wake-stream read a parked JoinGroup or SyncGroup waits
    on. Before, that plain ResponseError came out of join_group, and the worker took it for an
    unknown error in the middle of the failover: it left the group, forgot its member id and
    backed off, instead of retrying the join with its id as for the READONLY that follows."""
    r = redis.Redis(host="127.0.0.1", port=own_server.port)
    cfg = CoordinatorConfig(namespace=namespace, group_initial_rebalance_delay_ms=60_000)
    join = {**JOIN, "rebalance_timeout_ms": 60_000}

    def parked() -> bool:
        return any(c.get("cmd") == "xread" for c in r.client_list())

    async def scenario() -> Any:
        client = redis.asyncio.Redis(host="127.0.0.1", port=own_server.port)
        try:
            coord = await AsyncGroupCoordinator(client, cfg).start()
            call = asyncio.ensure_future(coord.join_group("g", **join))
            await await_until(parked, "the join parked")
            _demote(r, refused_port)
            try:
                return await asyncio.wait_for(call, WAIT_S)
            except ServerUnavailable as exc:
                return exc
        finally:
            await client.aclose()

    try:
        if driver == "asyncio":
            outcome = asyncio.run(scenario())
        else:
            coord = GroupCoordinator(r, cfg).start()
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                call = pool.submit(coord.join_group, "g", **join)
                wait_until(parked)
                _demote(r, refused_port)
                try:
                    outcome = call.result(WAIT_S)
                except ServerUnavailable as exc:
                    outcome = exc
        assert isinstance(outcome, ServerUnavailable), outcome
        assert "UNBLOCKED" in str(outcome)
    finally:
        r.execute_command("REPLICAOF", "NO", "ONE")
        r.close()
