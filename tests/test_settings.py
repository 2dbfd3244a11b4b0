"""The namespace layout is one agreed fact: a group never exists twice (issue 8, item 1).

Each scenario is one the safety review found: a process with a stale partition count, a layout
change in an empty namespace, and data loss (whole, or only the settings hash) with processes
that started before and after it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import pickle
import threading
from typing import Any

import pytest
import redis.asyncio
from harness import PROTOCOLS

from rcoord import ConfigError, CoordinatorConfig, Errors, GroupCoordinator, TopicPartition
from rcoord.asyncio import AsyncGroupCoordinator
from rcoord.keys import GroupKeys, PartitionKeys, settings_key
from rcoord.scripts import Scripts
from rcoord.settings import settle

JOIN = dict(protocol_type="consumer", protocols=PROTOCOLS, session_timeout_ms=10_000,
            rebalance_timeout_ms=10_000)
FAST = dict(group_min_session_timeout_ms=10, group_initial_rebalance_delay_ms=0)


def _lose_namespace(client: Any, namespace: str, only: str | None = None) -> None:
    """What a restart without persistence or a failover to an empty replica does to a namespace."""
    keys = [only] if only else list(client.scan_iter(match=f"{namespace}:*", count=1000))
    for key in keys:
        client.delete(key)


def _form_alone(coord: GroupCoordinator, group: str) -> str:
    first = coord.join_group(group, **JOIN)
    assert first.error == Errors.MEMBER_ID_REQUIRED
    joined = coord.join_group(group, first.member_id, **JOIN)
    assert joined.error == Errors.NONE and joined.generation_id == 1
    return joined.member_id


def _members(coord: GroupCoordinator, group: str) -> set[str]:
    return {m.member_id for m in coord.describe_group(group).members}


def test_workers_with_defaults_then_an_admin_naming_another_count_is_refused(redis_client, namespace):
    worker = GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace, **FAST)).start()
    member = _form_alone(worker, "g")
    with pytest.raises(ConfigError, match="num_partitions is fixed at 50 .* holds groups"):
        GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace, num_partitions=10)).start()
    # Nothing moved: the worker's group is where every party looks for it.
    fresh = GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace)).start()
    assert fresh.config.num_partitions == 50
    assert _members(fresh, "g") == {member}


def test_a_named_value_that_contradicts_a_stored_one_is_refused_before_it_is_written(
        redis_client, namespace):
    """Valid alone, contradicting a stored setting once merged (a minimum session above the
    stored maximum): refused before any write. Before, the value was written and then the
    check failed, so the stored settings contradicted themselves and every later start of the
    namespace (and every running coordinator's next settle) failed."""
    GroupCoordinator(redis_client, CoordinatorConfig(
        namespace=namespace, group_max_session_timeout_ms=10_000)).start()
    before = redis_client.hgetall(settings_key(namespace))
    with pytest.raises(ConfigError, match=r"group_min_session_timeout_ms \(20000\) must not "
                       r"exceed group_max_session_timeout_ms \(10000\)"):
        GroupCoordinator(redis_client, CoordinatorConfig(
            namespace=namespace, group_min_session_timeout_ms=20_000)).start()
    assert redis_client.hgetall(settings_key(namespace)) == before
    assert GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace)).start() \
        .config.group_max_session_timeout_ms == 10_000


def test_a_process_with_a_stale_count_is_refused_and_corrects_itself(redis_client, namespace):
    stale = GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace, **FAST)).start()
    assert stale.config.num_partitions == 50
    # The namespace holds no group, so an admin may change its layout.
    GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace, num_partitions=10)).start()
    newcomer = GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace)).start()
    member = _form_alone(newcomer, "g")
    # The stale process addresses the old layout: the script refuses, and the coordinator
    # settles again and retries, so it sees the one group instead of creating a second.
    assert _members(stale, "g") == {member}
    assert stale.config.num_partitions == 10
    assert not redis_client.exists(GroupKeys.of(namespace, 50, "g").group)
    second = stale.join_group("g", **JOIN)
    assert second.error == Errors.MEMBER_ID_REQUIRED


def test_the_old_layout_copies_are_gone_after_a_change(redis_client, namespace):
    GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace)).start()
    GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace, num_partitions=7)).start()
    copies = set(redis_client.scan_iter(match=f"{namespace}:{{*}}:cfg", count=1000))
    assert len(copies) == 7
    assert all(k.decode().startswith(f"{namespace}:{{7.") for k in copies)


def test_no_key_of_the_old_layout_is_left_after_a_change(redis_client, namespace):
    """A count change in an empty namespace left each old partition's events stream and the
    service's read position in it behind, for good: nothing addresses that layout again. Only
    each old partition's withdrawal mark stays (``rcoord.settings._withdrawn``: a few bytes,
    which refuse a late copy of the old count there, and go once the count comes back)."""
    old = GroupCoordinator(redis_client, CoordinatorConfig(
        namespace=namespace, num_partitions=8, **FAST)).start()
    for i in range(8):  # events in the old partitions: groups created, then deleted
        old.commit_offsets(f"g{i}", {TopicPartition("t", 0): 1})
        assert old.delete_groups([f"g{i}"]) == {f"g{i}": Errors.NONE}
    for p in range(8):  # as the coordinator service leaves them (rcoord.service.observe)
        redis_client.set(PartitionKeys(namespace, p, 8).tail, "1-0")
    prefix = f"{namespace}:{{8."
    assert any(k.decode().startswith(prefix) and k.decode().endswith(":events")
               for k in redis_client.scan_iter(match=f"{namespace}:*", count=1000))
    GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace, num_partitions=7)).start()
    left = {k.decode() for k in redis_client.scan_iter(match=f"{namespace}:*", count=1000)
            if k.decode().startswith(prefix)}
    assert left == {PartitionKeys(namespace, p, 8).prefix + ":withdrawn" for p in range(8)}


@pytest.mark.parametrize("first", ["started-before", "started-after"])
def test_after_data_loss_old_and_new_processes_agree(redis_client, namespace, first):
    GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace, num_partitions=10,
                                                     group_min_session_timeout_ms=10)).start()
    # A worker that names no count: it learned 10 from the namespace.
    before = GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace,
                                                              group_initial_rebalance_delay_ms=0)).start()
    assert before.config.num_partitions == 10
    _form_alone(before, "warm-up")
    _lose_namespace(redis_client, namespace)

    if first == "started-before":
        # The old process acts first: it re-proposes what it knew (10, the lowered minimum).
        member = _form_alone(before, "g")
        after = GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace)).start()
        assert after.config.num_partitions == 10
        assert after.config.group_min_session_timeout_ms == 10
        assert _members(after, "g") == {member}
    else:
        # A process started after the loss establishes first (its defaults: 50); the old one
        # is refused under its stale count and adopts 50 too.
        after = GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace, **FAST)).start()
        assert after.config.num_partitions == 50
        assert before.config.num_partitions == 10  # not yet told
        member = _form_alone(after, "g")
        assert _members(before, "g") == {member}
        assert before.config.num_partitions == 50


def test_surviving_copies_decide_when_only_the_settings_hash_is_lost(redis_client, namespace):
    cfg = CoordinatorConfig(namespace=namespace, num_partitions=10, group_min_session_timeout_ms=123)
    GroupCoordinator(redis_client, cfg).start()
    _lose_namespace(redis_client, namespace, only=settings_key(namespace))
    newcomer = GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace)).start()
    assert newcomer.config.num_partitions == 10
    assert newcomer.config.group_min_session_timeout_ms == 123
    assert redis_client.hget(settings_key(namespace), "num_partitions") == b"10"


def test_a_group_call_writes_nothing_under_a_stale_layout(redis_client, namespace):
    coord = GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace, **FAST)).start()
    stale_keys = GroupKeys.of(namespace, 13, "g")
    scripts = Scripts(redis_client)
    scripts.load()
    with pytest.raises(Exception, match="RCOORD_NOT_COORDINATOR"):
        scripts.join_group(keys=stale_keys.all(), args=["", "g", "", "", "consumer", b"\x90", 10_000,
                                                         10_000, "", "", "1", "u", b"\x90",
                                                         "0"])
    assert not any(redis_client.exists(k) for k in stale_keys.all())
    assert coord.config.num_partitions == 50


def test_concurrent_settles_after_a_loss_agree(redis_client, namespace):
    """Processes that knew different counts race to re-establish: one proposal stands."""
    scripts = Scripts(redis_client)
    scripts.load()
    barrier = threading.Barrier(8)
    results: list[int] = []
    lock = threading.Lock()

    def one(i: int) -> None:
        known = CoordinatorConfig(namespace=namespace, num_partitions=7 if i % 2 else 13)
        barrier.wait(10)
        settled = settle(redis_client, scripts, namespace, None, known)
        with lock:
            results.append(settled.config.num_partitions)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(results) == 8 and len(set(results)) == 1
    copies = list(redis_client.scan_iter(match=f"{namespace}:{{*}}:cfg", count=1000))
    assert len(copies) == results[0]


def test_a_named_setting_survives_a_loss_through_its_owner(redis_client, namespace):
    owner = GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace, group_min_session_timeout_ms=50,
                                                             group_initial_rebalance_delay_ms=0)).start()
    _lose_namespace(redis_client, namespace)
    # A member that names nothing comes first and establishes Kafka's defaults ...
    member = GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace)).start()
    assert member.join_group("g", **{**JOIN, "session_timeout_ms": 100}).error == Errors.INVALID_SESSION_TIMEOUT
    # ... until the owner notices (the service does this every lease round) and writes its own.
    owner.resettle()
    assert member.join_group("g", **{**JOIN, "session_timeout_ms": 100}).error == Errors.MEMBER_ID_REQUIRED


def test_asyncio_coordinator_follows_a_layout_change(redis_server, namespace):
    sync_client = redis_server.client()
    GroupCoordinator(sync_client, CoordinatorConfig(namespace=namespace, **FAST)).start()

    async def scenario() -> tuple[int, Errors]:
        client = redis.asyncio.Redis(host="127.0.0.1", port=redis_server.port)
        try:
            coord = await AsyncGroupCoordinator(client, namespace).start()
            assert coord.config.num_partitions == 50
            GroupCoordinator(sync_client, CoordinatorConfig(namespace=namespace, num_partitions=9)).start()
            res = await coord.join_group("g", **JOIN)
            return coord.config.num_partitions, res.error
        finally:
            await client.aclose()

    try:
        assert asyncio.run(scenario()) == (9, Errors.MEMBER_ID_REQUIRED)
    finally:
        sync_client.close()


def test_list_groups_follows_a_layout_change(redis_client, namespace):
    stale = GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace, **FAST)).start()
    GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace, num_partitions=3)).start()
    member = _form_alone(GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace)).start(), "g")
    assert [g.group_id for g in stale.list_groups()] == ["g"]
    assert stale.config.num_partitions == 3 and _members(stale, "g") == {member}


def test_a_process_naming_another_count_after_a_loss_is_told_why(redis_client, namespace):
    """An admin process that named 10 finds, after a loss, 50 established and holding groups:
    it does not move the groups; its calls say what to fix."""
    admin = GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace, num_partitions=10, **FAST)).start()
    _lose_namespace(redis_client, namespace)
    worker = GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace, **FAST)).start()
    _form_alone(worker, "g")
    with pytest.raises(ConfigError, match="num_partitions is fixed at 50"):
        admin.describe_group("g")


def test_a_stored_value_that_is_no_integer_is_named(redis_client, namespace):
    """A value written into the settings hash by hand: the error names the setting and the
    key to correct; before, it was int()'s own message, naming neither."""
    GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace)).start()
    redis_client.hset(settings_key(namespace), "group_max_size", "abc")
    with pytest.raises(ConfigError, match=r"stored setting group_max_size .* is 'abc', not an "
                       r"integer: correct it in .*:settings"):
        GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace)).start()
    # Naming it writes it over the bad value.
    named = GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace,
                                                             group_max_size=5)).start()
    assert named.config.group_max_size == 5


def test_a_stored_partition_count_that_is_no_integer_is_named_when_named_over(
        redis_client, namespace):
    """A partition count written by hand as no integer: a coordinator naming the count, which
    the message for the other settings suggests, failed with int()'s bare ValueError, and so
    did every settle of a namespace holding a mark of an old count (``RETIRE``). Naming it
    cannot repair it (the layout in use, to check for groups, is unknown), so the error says
    to correct it by hand."""
    GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace)).start()
    redis_client.hset(settings_key(namespace), "num_partitions", "abc")
    message = (r"stored setting num_partitions .* is 'abc', not a positive integer: correct it "
               r"in .*:settings to the partition count in use")
    with pytest.raises(ConfigError, match=message):
        GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace,
                                                         num_partitions=50)).start()
    redis_client.hset(settings_key(namespace), "retire:10", "1")
    with pytest.raises(ConfigError, match=message):
        GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace)).start()
    assert redis_client.hget(settings_key(namespace), "retire:10") == b"1"
    redis_client.hset(settings_key(namespace), "num_partitions", "50")
    GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace)).start()
    assert redis_client.hget(settings_key(namespace), "retire:10") is None



@pytest.mark.parametrize("named", [{}, {"num_partitions": 10}])
def test_a_settings_hash_without_a_partition_count_is_named(redis_client, namespace, named):
    """The settings hash lost its ``num_partitions`` field (deleted by hand) but not the hash.
    ``establish`` writes nothing over an existing hash, so before, a process naming no count
    settled on the default 50 and wrote that layout's copies while the namespace's groups and
    copies were under 10 (each process ran its own copy of a group), and one naming the count
    failed with a bare KeyError. The error now says what to correct, and nothing is written."""
    worker = GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace,
                                                              num_partitions=10, **FAST)).start()
    member = _form_alone(worker, "g")
    redis_client.hdel(settings_key(namespace), "num_partitions")
    message = (r"stored setting num_partitions .* is None, not a positive integer: correct it "
               r"in .*:settings to the partition count in use")
    with pytest.raises(ConfigError, match=message):
        GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace, **named)).start()
    assert not redis_client.exists(PartitionKeys(namespace, 0, 50).cfg)
    redis_client.hset(settings_key(namespace), "num_partitions", "10")
    fresh = GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace)).start()
    assert fresh.config.num_partitions == 10 and _members(fresh, "g") == {member}

def test_a_replaced_config_names_only_what_it_changed(redis_client, namespace):
    """``dataclasses.replace`` passes every field to the constructor again; before, the copy
    named every setting, so starting a coordinator with it wrote every default over the
    namespace's settings (a lowered minimum session timeout, and the partition count while no
    group exists)."""
    GroupCoordinator(redis_client, CoordinatorConfig(
        namespace=namespace, num_partitions=10, group_min_session_timeout_ms=100)).start()
    config = dataclasses.replace(CoordinatorConfig(namespace=namespace), group_max_size=9)
    assert config.named == {"namespace", "group_max_size"}
    started = GroupCoordinator(redis_client, config).start().config
    assert (started.num_partitions, started.group_min_session_timeout_ms,
            started.group_max_size) == (10, 100, 9)
    stored = redis_client.hmget(settings_key(namespace), "num_partitions",
                                "group_min_session_timeout_ms")
    assert stored == [b"10", b"100"]
    # A copy (pickle, copy.deepcopy) names what the original named.
    assert pickle.loads(pickle.dumps(config)).named == config.named
    assert dataclasses.replace(pickle.loads(pickle.dumps(config)), num_partitions=3).named \
        == {"namespace", "group_max_size", "num_partitions"}
