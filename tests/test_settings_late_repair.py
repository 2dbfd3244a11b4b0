"""A settle's repair write landing after a change of count deleted that layout, the settle
killed before it reads the count again (``_overtaken``): the late copy must not let a process
still on the old count run a group there."""

from __future__ import annotations

from typing import Any

from test_settings import FAST, _form_alone

from rcoord import CoordinatorConfig, GroupCoordinator
from rcoord.flow import ScriptBatch, _perform
from rcoord.keys import GroupKeys, PartitionKeys
from rcoord.scripts import Scripts
from rcoord.settings import settle_flow


def _repairs(op: Any) -> bool:
    """Whether ``op`` writes partition copies (``_repair_copies``)."""
    return isinstance(op, ScriptBatch) and all(args[0] == "copy" for _, args in op.calls)


def test_a_repair_written_after_the_old_layout_was_deleted_is_refused(redis_client, namespace):
    """The namespace runs under 5; a worker settled there; the copy of the partition of group
    g was lost (a failover). A settle of a process starting on 5 reads the count and the copies,
    then a process changes the count to 3 (the 5 layout deleted, its mark removed), then the
    settle's repair of the lost copy lands, and the process is killed before it reads the count
    again. Before, that copy stayed for good with no mark naming its layout, and the worker,
    still on 5, joined g there while every other process used 3: the group existed twice. The
    deletion leaves a mark in each partition of the old layout that the ``copy`` op refuses a
    copy as old as the deletion by, so the worker's join is refused and it settles on 3."""
    GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace, num_partitions=5)).start()
    worker = GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace, **FAST)).start()
    assert worker.config.num_partitions == 5
    redis_client.delete(PartitionKeys(namespace, worker.partition_for("g"), 5).cfg)
    scripts = Scripts(redis_client)
    scripts.load()
    starting = settle_flow(namespace, None, CoordinatorConfig(namespace=namespace,
                                                              num_partitions=5))
    op = next(starting)
    while not _repairs(op):
        op = starting.send(_perform(redis_client, scripts, op, None, None))
    GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace, num_partitions=3)).start()
    _perform(redis_client, scripts, op, None, None)  # the late write; then the process dies
    starting.close()
    _form_alone(worker, "g")
    assert worker.config.num_partitions == 3
    assert not redis_client.exists(GroupKeys.of(namespace, 5, "g").group)
    assert redis_client.sismember(GroupKeys.of(namespace, 3, "g").partition.groups, "g")


def test_settings_lost_below_a_withdrawal_still_settle_on_the_withdrawn_count(redis_client,
                                                                             namespace):
    """5 -> 3 withdrew the 5 layout (each partition marked withdrawn at the new version); then
    the settings, anchors and copies were lost (a restart without persistence of the masters
    holding them) but the marks survived. A process starting on 5 establishes 5 again at
    version 1: its repairs are refused as withdrawn, so it moves the settings above the
    withdrawal and settles there, rather than failing every start ("kept changing")."""
    GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace, num_partitions=5)).start()
    GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace, num_partitions=3)).start()
    for key in list(redis_client.scan_iter(match=f"{namespace}:*", count=1000)):
        if not key.endswith(b":withdrawn"):
            redis_client.delete(key)
    assert redis_client.exists(PartitionKeys(namespace, 0, 5).cfg[:-len(":cfg")] + ":withdrawn")
    again = GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace,
                                                             num_partitions=5, **FAST)).start()
    assert again.config.num_partitions == 5
    _form_alone(again, "g")
    assert not list(redis_client.scan_iter(match=f"{namespace}:*:withdrawn", count=1000))
