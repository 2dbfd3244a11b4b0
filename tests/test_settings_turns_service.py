"""Coordinator services naming different partition counts do not restart each other for ever.

A service that finds its named count changed stops with status 3 and is started again by its
supervisor. Before, every start wrote the count it names, so two services naming different
counts in a namespace with no group yet restarted each other for as long as they ran (each
start moved the count, which stopped the other, whose restart moved it back). A service now
writes its named count only where the namespace has none (as Kafka's
``offsets.topic.num.partitions`` applies only when ``__consumer_offsets`` is created), and
when the settings were lost."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from harness import wait_until
from test_service_settings_loss import _lease_rounds

from rcoord import CoordinatorConfig, GroupCoordinator
from rcoord.keys import settings_key


def _service(url: str, namespace: str, cid: str, **settings: int) -> Any:
    from rcoord.service.service import CoordinatorService, ServiceConfig

    return CoordinatorService(ServiceConfig(redis_url=url, namespace=namespace, coordinator_id=cid,
                                            lease_ttl_ms=1000, wake="index",
                                            settings=settings, retention_check_interval_ms=0)
                              ).start()




def _count(client: Any, namespace: str) -> int:
    return int(client.hget(settings_key(namespace), "num_partitions"))


def test_a_service_naming_another_count_adopts_the_one_stored(redis_server, single_client,
                                                               namespace, caplog):
    """Before, B's start stored 20, A stopped with status 3, A's restart stored 10, B stopped
    with status 3, and so on for ever."""
    a = _service(redis_server.url, namespace, "a", num_partitions=10)
    b = None
    try:
        with caplog.at_level(logging.WARNING, logger="rcoord.service"):
            b = _service(redis_server.url, namespace, "b", num_partitions=20)
        assert b.group_config.num_partitions == 10 == _count(single_client, namespace)
        assert any("num_partitions=20" in r.getMessage() for r in caplog.records)
        _lease_rounds(a, 2)
        _lease_rounds(b, 2)
        assert a.exit_code != 3 and b.exit_code != 3
        # A restart (its supervisor's, after any stop) is no different.
        b.stop()
        b = _service(redis_server.url, namespace, "b", num_partitions=20)
        _lease_rounds(a, 2)
        assert a.exit_code != 3 and _count(single_client, namespace) == 10
    finally:
        a.stop()
        if b is not None:
            b.stop()


def test_a_service_restarted_after_another_process_changed_the_count_adopts_it(
        redis_server, single_client, namespace):
    """A program's start still changes the count of a namespace with no group (the library
    writes what it names); the service stops with status 3, and started again it serves the
    new count instead of writing its own back."""
    a = _service(redis_server.url, namespace, "a", num_partitions=10)
    try:
        GroupCoordinator(single_client, CoordinatorConfig(namespace=namespace,
                                                          num_partitions=20)).start()
        wait_until(lambda: a.exit_code == 3, timeout_s=10)
    finally:
        a.stop()
    a = _service(redis_server.url, namespace, "a", num_partitions=10)
    try:
        assert a.group_config.num_partitions == 20 == _count(single_client, namespace)
    finally:
        a.stop()


def test_the_named_count_establishes_a_new_namespace_and_comes_back_after_a_loss(
        redis_server, single_client, namespace):
    """The count named is written where none is stored: a new namespace, or one whose settings
    were lost (its documented behaviour for lost settings)."""
    a = _service(redis_server.url, namespace, "a", num_partitions=10)
    try:
        assert a.group_config.num_partitions == 10 == _count(single_client, namespace)
        for k in list(single_client.scan_iter(match=f"{namespace}:*", count=1000)):
            single_client.delete(k)
        wait_until(lambda: single_client.hget(settings_key(namespace), "num_partitions") == b"10",
                   timeout_s=10)
        _lease_rounds(a, 2)
        assert a.exit_code != 3
    finally:
        a.stop()


def test_on_a_cluster_too(redis_cluster, namespace):
    """The stored count is read from the settings hash's own master."""
    client = redis_cluster.client()
    a = _service(redis_cluster.url, namespace, "a", num_partitions=10)
    b = None
    try:
        b = _service(redis_cluster.url, namespace, "b", num_partitions=20)
        assert b.group_config.num_partitions == 10 == _count(client, namespace)
        _lease_rounds(a, 2)
        assert a.exit_code != 3
    finally:
        a.stop()
        if b is not None:
            b.stop()
        client.close()


@pytest.mark.parametrize("hash_lost", [False, True], ids=["stored", "settings hash lost"])
def test_a_service_naming_another_count_starts_on_a_namespace_with_groups(
        redis_server, single_client, namespace, hash_lost):
    """As a broker configured with another ``offsets.topic.num.partitions`` uses the topic as
    it is: before, the start failed (the count is fixed while groups exist), so a service whose
    --set was out of date could not start at all.

    Also when the settings hash alone was lost (a failover of its node) and its copies and
    anchors survive: the service finds no count stored, so it names 10, which the settle
    refuses after re-establishing 50 from the anchors (the group). Before, that start failed
    with ConfigError, and so did every restart: the workers' calls find their copies and never
    re-establish the settings. It now serves the count stored. (No initial delay: the group's
    first join is answered at once instead of parking 3 s.)"""
    coord = GroupCoordinator(single_client, CoordinatorConfig(
        namespace=namespace, group_min_session_timeout_ms=10,
        group_initial_rebalance_delay_ms=0)).start()
    coord.join_group("g", protocol_type="consumer", protocols=[("range", b"")],
                     session_timeout_ms=10_000, require_known_member_id=False)
    if hash_lost:
        single_client.delete(settings_key(namespace))
    a = _service(redis_server.url, namespace, "a", num_partitions=10)
    try:
        assert a.group_config.num_partitions == 50 == _count(single_client, namespace)
        assert coord.describe_group("g").members
    finally:
        a.stop()
