"""The settings hash lost between a settle's read and its own write of the named settings."""

from __future__ import annotations

import logging
from collections.abc import Generator
from typing import Any

import pytest
from test_settings import FAST, _form_alone
from test_settings_retire import _change_count_failing_deletion, _copies

from rcoord import CoordinatorConfig, GroupCoordinator
from rcoord.flow import Pipeline, Script, _perform, drive
from rcoord.keys import GroupKeys, PartitionKeys, anchor_keys, settings_key
from rcoord.scripts import Scripts
from rcoord.settings import settle_flow


def _writes_named(op: Any) -> bool:
    """Whether ``op`` writes named settings over the stored ones (``update`` or ``move``)."""
    return isinstance(op, Script) and op.name == "settings" and op.args[0] in ("update", "move")


def _from(flow: Generator[Any, Any, Any], op: Any) -> Generator[Any, Any, Any]:
    """``flow`` resumed at its operation ``op`` (not performed yet), errors thrown into it as
    ``drive`` throws them."""
    while True:
        try:
            try:
                result = yield op
            except Exception as exc:  # noqa: BLE001 - the flow decides, as in drive
                op = flow.throw(exc)
            else:
                op = flow.send(result)
        except StopIteration as done:
            return done.value


@pytest.mark.parametrize("named", [{"num_partitions": 7}, {"group_max_size": 9}])
def test_settings_lost_before_the_named_ones_are_written_are_established_again(
        redis_client, namespace, named):
    """The settle read the settings (5 partitions), then the hash was lost (a failover, a
    restart without persistence) before its ``update`` or ``move`` of the named settings. Before,
    the script's NOT_COORDINATOR ("the settings were lost") went out of the settle: a start
    failed, and a refused call's re-settle raised it to the caller, though the settle's next
    round re-establishes the settings as any settle that finds them lost does. It goes
    another round now, and the named settings stand."""
    GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace, num_partitions=5)).start()
    scripts = Scripts(redis_client)
    scripts.load()
    given = CoordinatorConfig(namespace=namespace, **named)
    settling = settle_flow(namespace, given, None)
    op = next(settling)
    while not _writes_named(op):
        op = settling.send(_perform(redis_client, scripts, op, None, None))
    redis_client.delete(settings_key(namespace))
    settled = drive(redis_client, scripts, _from(settling, op))
    for name, value in named.items():
        assert getattr(settled.config, name) == value
    count = settled.config.num_partitions
    assert int(redis_client.hget(settings_key(namespace), "num_partitions")) == count
    assert all(k.startswith(f"{namespace}:{{{count}.") for k in _copies(redis_client, namespace))


def _counts_groups(op: Any) -> bool:
    """Whether ``op`` counts the groups of a withdrawn layout (``_retire``)."""
    return isinstance(op, Pipeline) and bool(op.commands) and op.commands[0][0] == "SCARD"


def test_a_group_of_the_layout_changed_back_to_after_the_retire_is_not_called_late(
        redis_client, namespace, caplog):
    """5 -> 7 stored, the deletion of the 5 layout failed. A settle retires it (the copies
    deleted); before it counts the groups left there, another process changes the count back
    to 5 and a group forms under it. Before, the settle warned that this live group was
    "created under the old partition count 5 ... its members rejoin under the new count": it
    is in force, and nobody rejoins. The warning is left out when the count is back."""
    GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace, num_partitions=5)).start()
    scripts = _change_count_failing_deletion(redis_client, namespace, 7)
    retiring = settle_flow(namespace, None, None)
    op = next(retiring)
    while not _counts_groups(op):
        op = retiring.send(_perform(redis_client, scripts, op, None, None))
    back = GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace, num_partitions=5,
                                                            **FAST)).start()
    _form_alone(back, "g")
    caplog.set_level(logging.WARNING, logger="rcoord.settings")
    drive(redis_client, scripts, _from(retiring, op))
    assert "created under the old partition count" not in caplog.text
    assert back.describe_group("g").members


def test_settings_lost_and_established_again_as_a_refused_call_settles_get_its_named_ones(
        redis_client, namespace):
    """A worker naming group_max_size=9 has a call refused and settles again: it reads the
    settings' origin (its own), then, before the settle's own read, the namespace loses
    everything (a restart without persistence) and another process establishes its own
    settings (group_max_size=4). Before, the settle adopted them as another process's change
    (the origin it had read was its own), took their origin for its own, and never wrote its
    named setting again; lost settings are written again by a process that names them."""
    worker = GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace,
                                                              group_max_size=9)).start()
    scripts = Scripts(redis_client)
    scripts.load()
    resettling = worker._steps.resettle()
    op = resettling.send(_perform(redis_client, scripts, next(resettling), None, None))
    for key in list(redis_client.scan_iter(match=f"{namespace}:*", count=1000)):
        redis_client.delete(key)
    GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace,
                                                     group_max_size=4)).start()
    assert drive(redis_client, scripts, _from(resettling, op)).group_max_size == 9
    assert redis_client.hget(settings_key(namespace), "group_max_size") == b"9"


def test_settings_established_again_under_another_count_retire_the_layout_read(
        redis_client, namespace, caplog):
    """The namespace runs under 7 (a worker settled there); the anchors name 3 at a newer
    version (an overtaken settle of a change to 3 wrote them, then withdrew its partition
    copies only); the settings hash is lost. A process that used 7 settles: it reads the 7
    layout and the anchors, and establishes 3 (the anchors decide). Before, the 7 layout was
    only logged ("partition copies of another layout were found"): its copies stayed, and the
    worker on 7 was never refused, so it ran its own copy of its groups while every other
    process used 3. The layout read is marked to be retired with the establishment now, and
    the worker's call is refused and settles on 3."""
    GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace, num_partitions=7)).start()
    worker = GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace, **FAST)).start()
    assert worker.config.num_partitions == 7
    scripts = Scripts(redis_client)
    scripts.load()
    values = {k.decode(): v.decode()
              for k, v in redis_client.hgetall(settings_key(namespace)).items()
              if k != b"origin" and k != b"version"}
    flat = [x for kv in {**values, "num_partitions": "3"}.items() for x in kv]
    for anchor in anchor_keys(namespace):
        scripts.call("settings", [anchor], ["copy", "9", *flat])
    redis_client.delete(settings_key(namespace))
    caplog.set_level(logging.WARNING, logger="rcoord.settings")
    settled = drive(redis_client, scripts, settle_flow(
        namespace, None, CoordinatorConfig(namespace=namespace, num_partitions=7)))
    assert settled.config.num_partitions == 3
    assert "(7 partitions) were found" in caplog.text
    assert "that layout is retired" in caplog.text
    copies = _copies(redis_client, namespace)
    assert len(copies) == 3 and all(k.startswith(f"{namespace}:{{3.") for k in copies)
    _form_alone(worker, "g")
    assert worker.config.num_partitions == 3



def test_stale_copies_deleted_by_hand_refuse_the_processes_on_their_layout(redis_client,
                                                                         namespace):
    """What docs/operations.md tells an operator to do when copies of another layout than the
    stored count are found after the settings hash was lost (its marks with it, and the anchors
    too here, so nothing names the old layout): delete them by hand. A process still on that
    layout is then refused and adopts the count stored."""
    GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace, num_partitions=7)).start()
    stale = GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace, **FAST)).start()
    redis_client.delete(settings_key(namespace))
    for anchor in anchor_keys(namespace):
        redis_client.delete(anchor)
    GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace, num_partitions=5)).start()
    copies = _copies(redis_client, namespace)
    assert len(copies) == 12  # (the 7 layout is left: nothing names it)
    for key in copies:
        if key.startswith(f"{namespace}:{{7."):
            redis_client.delete(key)
    _form_alone(stale, "g")
    assert stale.config.num_partitions == 5
    assert redis_client.sismember(GroupKeys.of(namespace, 5, "g").partition.groups, "g")


@pytest.mark.parametrize("layout", [3, 5], ids=["in-force", "retired"])
def test_a_copy_with_an_unreadable_version_is_rewritten_or_withdrawn(redis_client, namespace,
                                                                     layout):
    """A partition copy whose version is not a number (edited by hand). rcoord.settings reads
    it as -1, "such a copy is rewritten"; before, the ``copy`` and ``withdraw`` ops compared it
    as a number and failed with a Lua error, and so did every settle of the namespace, every
    process's start included. It is rewritten (the layout in force) or deleted (one retired)."""
    GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace, num_partitions=3)).start()
    redis_client.hset(PartitionKeys(namespace, 0, layout).cfg,
                      mapping={"num_partitions": str(layout), "version": "abc"})
    if layout == 5:  # (a layout left to retire: its mark, as a change of count writes it)
        redis_client.hset(settings_key(namespace), "retire:5", "token")
    GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace)).start()
    copies = _copies(redis_client, namespace)
    assert len(copies) == 3 and all(k.startswith(f"{namespace}:{{3.") for k in copies)
    assert redis_client.hget(PartitionKeys(namespace, 0, 3).cfg, "version") != b"abc"
