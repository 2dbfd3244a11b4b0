"""Processes naming different settings do not take turns writing them.

A long-running process whose settings another process changed (same establishment, newer
version) adopts them when a call makes it settle again; only a start, or a re-establishment
after the settings were lost, writes the settings a process names (``rcoord.settings``)."""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

import pytest
import redis.asyncio
from test_settings import FAST, JOIN

from rcoord import CoordinatorConfig, GroupCoordinator
from rcoord.asyncio import AsyncGroupCoordinator
from rcoord.keys import settings_key


def _stored(client: Any, namespace: str) -> tuple[int, int]:
    raw = client.hmget(settings_key(namespace), "num_partitions", "version")
    return int(raw[0]), int(raw[1])


def _named_10(records: list[logging.LogRecord]) -> list[logging.LogRecord]:
    """The records naming ``num_partitions=10`` that the test's own thread logged (its
    coordinators' calls run on it): not another test's coordinator, still ending in this
    process, whose settings were overridden too."""
    return [r for r in records
            if "num_partitions=10" in r.getMessage() and r.thread == threading.get_ident()]


def test_a_refused_call_adopts_the_count_another_process_stored(redis_client, namespace, caplog):
    """Before, the re-settle after NOT_COORDINATOR wrote the caller's named count over the one
    another process stored: describing a group on A, then B, then A flipped the count
    20 -> 10 -> 20 -> 10, and each flip reopened the window where a group created meanwhile is
    orphaned under the other layout."""
    a = GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace,
                                                         num_partitions=10)).start()
    b = GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace,
                                                         num_partitions=20)).start()
    assert _stored(redis_client, namespace)[0] == 20  # (a start writes what it names)
    _, version = _stored(redis_client, namespace)
    with caplog.at_level(logging.WARNING, logger="rcoord"):
        for coord in (a, b, a, b, a):
            assert coord.describe_group("g").state == "Dead"
            assert coord.config.num_partitions == 20
            assert _stored(redis_client, namespace) == (20, version)
    named = _named_10(caplog.records)
    assert len(named) == 1, [r.getMessage() for r in caplog.records]  # said once, not per call
    # What A serves is the layout in force: a group it joins is where B finds it.
    assert a.partition_for("g") == b.partition_for("g")


def test_other_named_settings_are_adopted_too(redis_client, namespace):
    """A refused call (here: the count moved) adopts every stored value, not only the count:
    the session limits another process started with stand."""
    a = GroupCoordinator(redis_client, CoordinatorConfig(
        namespace=namespace, num_partitions=10, group_min_session_timeout_ms=100)).start()
    GroupCoordinator(redis_client, CoordinatorConfig(
        namespace=namespace, num_partitions=20, group_min_session_timeout_ms=200)).start()
    a.describe_group("g")
    assert a.config.group_min_session_timeout_ms == 200
    assert redis_client.hget(settings_key(namespace), "group_min_session_timeout_ms") == b"200"


def test_lost_settings_are_written_again_with_the_named_ones(redis_client, namespace):
    """The rule for lost settings stands: a process that finds them gone on a refused call,
    here established again first by another process from its defaults (another origin),
    writes what it names."""
    a = GroupCoordinator(redis_client, CoordinatorConfig(
        namespace=namespace, num_partitions=10, group_min_session_timeout_ms=100)).start()
    for key in list(redis_client.scan_iter(match=f"{namespace}:*", count=1000)):
        redis_client.delete(key)  # (a restart without persistence)
    GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace)).start()
    assert _stored(redis_client, namespace)[0] == 50
    a.describe_group("g")
    assert redis_client.hget(settings_key(namespace), "group_min_session_timeout_ms") == b"100"
    assert a.config.num_partitions == 10 == _stored(redis_client, namespace)[0]


def test_the_asyncio_coordinator_adopts_too(redis_server, namespace):
    async def run() -> None:
        client = redis.asyncio.Redis(host="127.0.0.1", port=redis_server.port, socket_timeout=5)
        try:
            a = await AsyncGroupCoordinator(client, CoordinatorConfig(
                namespace=namespace, num_partitions=10)).start()
            await AsyncGroupCoordinator(client, CoordinatorConfig(
                namespace=namespace, num_partitions=20)).start()
            await a.describe_group("g")
            assert a.config.num_partitions == 20
            raw = await client.hget(settings_key(namespace), "num_partitions")
            assert raw == b"20"
        finally:
            await client.aclose()

    asyncio.run(run())


@pytest.mark.parametrize("call", ["list_groups", "run_timers"])
def test_calls_reading_partitions_directly_adopt_too(redis_client, namespace, call):
    """``list_groups`` and ``run_timers`` find the layout moved by a missing copy, not by a
    refusal; they settle again the same way."""
    a = GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace,
                                                         num_partitions=10)).start()
    GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace,
                                                     num_partitions=20)).start()
    getattr(a, call)()
    assert a.config.num_partitions == 20
    assert _stored(redis_client, namespace)[0] == 20


def test_the_service_style_adoption_logs_nothing_of_its_own(redis_client, namespace, caplog):
    """``resettle(write_named=False)`` (the coordinator service's check, which logs its own
    ``settings_overridden``) does not log the overridden settings a second time."""
    a = GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace,
                                                         num_partitions=10)).start()
    GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace,
                                                     num_partitions=20)).start()
    with caplog.at_level(logging.WARNING, logger="rcoord"):
        assert a.resettle(write_named=False).num_partitions == 20
    assert not _named_10(caplog.records)


def test_lost_settings_under_groups_of_another_count_are_adopted_not_refused(redis_client,
                                                                              namespace):
    """A process that adopted another process's count (20) and then finds the settings lost
    (the hash and the partition copies; the anchors and the groups survive) re-establishes
    them; its named count (10) cannot be written while groups exist under 20. Before, every
    call of that process then raised ConfigError ('num_partitions is fixed at 20'): each one
    found the settings established by another origin than its own, took them for lost, and
    wrote its count again."""
    a = GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace, num_partitions=10,
                                                         **FAST)).start()
    b = GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace, num_partitions=20,
                                                         **FAST)).start()
    b.join_group("g", **JOIN)
    a.describe_group("g")  # (adopts 20)
    redis_client.delete(settings_key(namespace))
    for key in list(redis_client.scan_iter(match=f"{namespace}:{{*}}:cfg", count=1000)):
        redis_client.delete(key)
    for _ in range(2):
        assert a.describe_group("g").state != "Dead"
    assert a.config.num_partitions == 20 == _stored(redis_client, namespace)[0]
