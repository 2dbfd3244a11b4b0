"""Commits a replica has acknowledged (issue 13): ``commit_offsets(required_acks=N)``.

Redis replicates asynchronously, so a commit the master answered can be lost in a failover.
With ``required_acks`` the commit is followed by WAIT on the master that holds the group; a
commit fewer replicas acknowledged in time answers COORDINATOR_NOT_AVAILABLE (Kafka's answer
when the offsets topic's ISR did not acknowledge), and the offsets are on the master.
Both drivers run the same flow; both are exercised.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.asyncio
from harness import wait_until

from rcoord import CoordinatorConfig, Errors, GroupCoordinator, InvalidRequestError, TopicPartition
from rcoord.errors import MissingPermissionError
from rcoord.keys import GroupKeys
from rcoord.testing.embedded import EmbeddedServer

TP = TopicPartition("t", 0)


@pytest.fixture(scope="module")
def primary_with_replica() -> Iterator[tuple[EmbeddedServer, EmbeddedServer]]:
    from cluster_replicas import NO_SYNC_DELAY

    primary = EmbeddedServer(extra_args=NO_SYNC_DELAY).start()
    replica = EmbeddedServer().start()
    try:
        with replica.client() as r:
            r.execute_command("REPLICAOF", "127.0.0.1", primary.port)
        with primary.client() as p:
            # Online, not just connected: a replica acknowledges nothing before its full sync
            # (which NO_SYNC_DELAY starts at once instead of after 5 s) has ended.
            wait_until(lambda: p.info("replication").get("slave0", {}).get("state") == "online",
                       timeout_s=30)
        yield primary, replica
    finally:
        replica.stop()
        primary.stop()


def _coordinators(request: Any, server: EmbeddedServer, driver: str) -> Any:
    cfg = CoordinatorConfig(namespace="a" + uuid.uuid4().hex[:10], num_partitions=4)
    client = server.client()
    request.addfinalizer(client.close)
    if driver == "blocking":
        return GroupCoordinator(client, cfg).start()
    from async_driver import AsyncBacked

    coord = AsyncBacked(client, lambda: redis.asyncio.Redis(host="127.0.0.1", port=server.port),
                        cfg).start()
    request.addfinalizer(coord.close)
    return coord


@pytest.mark.parametrize("driver", ["blocking", "asyncio"])
def test_a_commit_the_replica_has_is_answered_none(request, primary_with_replica, driver):
    primary, replica = primary_with_replica
    coord = _coordinators(request, primary, driver)
    assert coord.commit_offsets("g", {TP: 41}, required_acks=1) == {TP: Errors.NONE}
    # Acknowledged means the replica has it now, before anything else happens.
    with replica.client() as r:
        keys = GroupKeys.of(coord.config.namespace, coord.config.num_partitions, "g")
        assert r.hexists(keys.offsets, "0:t")


@pytest.mark.parametrize("driver", ["blocking", "asyncio"])
def test_too_few_replicas_is_coordinator_not_available_and_the_master_has_it(
        request, primary_with_replica, driver):
    primary, _ = primary_with_replica
    coord = _coordinators(request, primary, driver)
    got = coord.commit_offsets("g", {TP: 7}, required_acks=2, ack_timeout_ms=50)
    assert got == {TP: Errors.COORDINATOR_NOT_AVAILABLE}
    assert coord.fetch_offsets("g", [TP]).offsets[TP].offset == 7  # on the master
    # A refusal of the commit itself is not hidden behind the wait's answer.
    fenced = coord.commit_offsets("g", {TP: 8}, member_id="m", generation_id=3, required_acks=2,
                                  ack_timeout_ms=50)
    assert fenced == {TP: Errors.UNKNOWN_MEMBER_ID}


def test_without_a_replica_a_required_ack_never_comes(request, redis_server):
    coord = _coordinators(request, redis_server, "blocking")
    assert coord.commit_offsets("g", {TP: 1}, required_acks=1, ack_timeout_ms=20) == {
        TP: Errors.COORDINATOR_NOT_AVAILABLE}
    assert coord.commit_offsets("g", {TP: 2}) == {TP: Errors.NONE}  # the default does not wait


@pytest.mark.parametrize("bad", [dict(required_acks=-1), dict(ack_timeout_ms=-5),
                                 dict(required_acks=1, ack_timeout_ms=0)])
def test_negative_acks_or_a_timeout_below_one_ms_are_invalid(request, redis_server, bad):
    # WAIT with timeout 0 would wait for ever; Kafka's -1 (all in-sync replicas) has no Redis
    # equivalent. Both are refused before anything is written.
    coord = _coordinators(request, redis_server, "blocking")
    with pytest.raises(InvalidRequestError, match="required_acks must be >= 0"):
        coord.commit_offsets("g", {TP: 1}, **bad)
    assert coord.fetch_offsets("g", [TP]).offsets[TP].offset == -1  # nothing written


@pytest.mark.parametrize("driver", ["blocking", "asyncio"])
def test_a_server_that_refuses_wait_raises_instead_of_answering_not_available(
        request, redis_server, driver):
    # docs/guarantees.md: a misconfiguration (an ACL without +wait) must not pass for a replica
    # that is only late, which the caller would retry for ever.
    with redis_server.client() as admin:
        admin.execute_command("ACL", "SETUSER", "nowait", "on", ">pw", "~*", "&*", "+@all",
                              "-wait")

    def drop_user() -> None:
        with redis_server.client() as admin:
            admin.execute_command("ACL", "DELUSER", "nowait")

    request.addfinalizer(drop_user)
    login = {"host": "127.0.0.1", "port": redis_server.port, "username": "nowait",
             "password": "pw"}
    cfg = CoordinatorConfig(namespace="a" + uuid.uuid4().hex[:10], num_partitions=4)
    client = redis.Redis(**login)
    request.addfinalizer(client.close)
    if driver == "blocking":
        coord: Any = GroupCoordinator(client, cfg).start()
    else:
        from async_driver import AsyncBacked

        coord = AsyncBacked(client, lambda: redis.asyncio.Redis(**login), cfg).start()
        request.addfinalizer(coord.close)
    with pytest.raises(MissingPermissionError, match="wait"):
        coord.commit_offsets("g", {TP: 3}, required_acks=1, ack_timeout_ms=20)
    assert coord.commit_offsets("g", {TP: 4}) == {TP: Errors.NONE}  # without a wait: served


@pytest.fixture(scope="module")
def replica_cluster() -> Iterator[Any]:
    from cluster_replicas import running_cluster

    yield from running_cluster(masters=3, replicas=1)


@pytest.mark.slow
@pytest.mark.parametrize("driver", ["blocking", "asyncio"])
def test_on_a_cluster_the_group_masters_replica_acknowledges(request, replica_cluster, driver):
    import redis.asyncio.cluster
    import redis.cluster

    port = next(iter(replica_cluster.nodes))
    client = redis.cluster.RedisCluster(host="127.0.0.1", port=port)
    request.addfinalizer(client.close)
    cfg = CoordinatorConfig(namespace="a" + uuid.uuid4().hex[:10], num_partitions=8)
    if driver == "blocking":
        coord: Any = GroupCoordinator(client, cfg).start()
    else:
        from async_driver import AsyncBacked

        coord = AsyncBacked(client, lambda: redis.asyncio.cluster.RedisCluster(
            host="127.0.0.1", port=port), cfg).start()
        request.addfinalizer(coord.close)
    groups = [f"g{i}" for i in range(8)]  # spread over the masters
    for g in groups:
        assert coord.commit_offsets(g, {TP: 5}, required_acks=1) == {TP: Errors.NONE}, g
    # Each commit is on the replica of the master that holds its group, already.
    for g in groups:
        keys = GroupKeys.of(cfg.namespace, cfg.num_partitions, g)
        master = replica_cluster.master_of_slot(client.keyslot(keys.offsets))
        replica = replica_cluster.replica_of(master)
        with replica_cluster.node_client(replica.port) as r:
            r.execute_command("READONLY")  # a cluster replica serves reads only when asked
            assert r.hexists(keys.offsets, "0:t"), g
    assert coord.commit_offsets("g0", {TP: 6}, required_acks=2, ack_timeout_ms=50) == {
        TP: Errors.COORDINATOR_NOT_AVAILABLE}


def test_the_wait_ends_before_the_clients_socket_timeout(request, redis_server):
    # A 5 s ack timeout on a client whose socket times out after 1 s: the wait is capped, so
    # the caller gets an answer (not a lost connection, not 5 s of retries).
    client = redis.Redis(host="127.0.0.1", port=redis_server.port, socket_timeout=1.0)
    request.addfinalizer(client.close)
    coord = GroupCoordinator(client, CoordinatorConfig(namespace="a" + uuid.uuid4().hex[:10]))
    assert coord.commit_offsets("g", {TP: 3}, required_acks=1, ack_timeout_ms=5000) == {
        TP: Errors.COORDINATOR_NOT_AVAILABLE}


def test_a_worker_commits_with_the_acks_its_config_asks_for(primary_with_replica):
    # ConsumerGroupConfig(commit_required_acks=N) reaches every commit the worker makes: the
    # generation's, a simple assign() commit, and the Spark source's (all go through its
    # RedisCoordinator). Two replicas asked of a server that has one: never acknowledged.
    from rcoord.client import ConsumerGroupConfig
    from rcoord.client.coordinator import RedisCoordinator

    primary, _ = primary_with_replica
    ns = "a" + uuid.uuid4().hex[:10]
    with primary.client() as client:
        one = RedisCoordinator(client, ns, commit_required_acks=1).start()
        assert one.commit_offsets("g", {TP: 1}) == {TP: Errors.NONE}
        two = RedisCoordinator(client, ns, commit_required_acks=2, commit_ack_timeout_ms=20)
        assert two.start().commit_offsets("g", {TP: 2}) == {TP: Errors.COORDINATOR_NOT_AVAILABLE}
        assert two.commit_offsets("g", {TP: 3}, required_acks=0) == {TP: Errors.NONE}
    # The group's own coordinator is built with them.
    from rcoord.client import ConsumerGroup

    with primary.client() as client:
        cfg = ConsumerGroupConfig(group_id="g", topics=["t"], redis_client=client, namespace=ns,
                                  commit_required_acks=2, commit_ack_timeout_ms=20)
        group = ConsumerGroup(cfg).start()
        try:
            assert group.coordinator.commit_offsets("g", {TP: 4}) == {
                TP: Errors.COORDINATOR_NOT_AVAILABLE}
        finally:
            group.close(timeout=10)
    with pytest.raises(Exception, match="commit_required_acks must be >= 0"):
        ConsumerGroupConfig(group_id="g", topics=["t"], commit_required_acks=-1)
    with pytest.raises(Exception, match="commit_ack_timeout_ms"):
        ConsumerGroupConfig(group_id="g", topics=["t"], commit_ack_timeout_ms=0)
