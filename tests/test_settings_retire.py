"""A change of the partition count that fails part way must not leave the old layout usable."""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

import pytest
import redis
from test_settings import FAST, JOIN, _form_alone

from rcoord import ConfigError, CoordinatorConfig, GroupCoordinator
from rcoord.flow import Command, Pipeline, Script, ScriptBatch, _perform, drive
from rcoord.keys import GroupKeys, PartitionKeys, settings_key
from rcoord.scripts import Scripts
from rcoord.settings import copy_pattern, settle_flow


def _copies(client: Any, namespace: str) -> set[str]:
    """The partition copies of ``namespace``, of any layout."""
    return {k.decode() for k in client.scan_iter(match=copy_pattern(namespace), count=1000)}


def _retires(op: Any) -> bool:
    """Whether ``op`` deletes copies of a layout no longer in force (``_withdraw``)."""
    return isinstance(op, ScriptBatch) and all(args[0] == "withdraw" for _, args in op.calls)


def _failing_deletes(flow: Generator[Any, Any, Any]) -> Generator[Any, Any, Any]:
    """``flow`` with its deletion of copies, or pipeline of DELs, failing as a master that went
    away fails it."""
    op = next(flow)
    while True:
        if _retires(op) or (isinstance(op, Pipeline) and op.commands
                            and op.commands[0][0] == "DEL"):
            op = flow.throw(redis.exceptions.ConnectionError("master down (test)"))
            continue
        op = flow.send((yield op))


def _change_count_failing_deletion(client: Any, namespace: str, count: int) -> Scripts:
    """Change the namespace's partition count to ``count`` with the deletion of the old
    layout failing (the new count and its mark stored); the loaded scripts."""
    scripts = Scripts(client)
    scripts.load()
    given = CoordinatorConfig(namespace=namespace, num_partitions=count)
    with pytest.raises(redis.exceptions.ConnectionError):
        drive(client, scripts, _failing_deletes(settle_flow(namespace, given, None)))
    return scripts


def test_a_count_change_whose_deletion_failed_is_finished_by_the_next_settle(
        redis_client, namespace):
    """The new count was stored, then the deletion of the old layout's copies failed (a master
    down, a timeout, a crash). Before, no later settle deleted them (the count stored was
    already the named one), so a process still on the old count went on creating groups there
    while every other process used the new layout: the group existed twice."""
    stale = GroupCoordinator(redis_client, CoordinatorConfig(
        namespace=namespace, group_min_session_timeout_ms=10,
        group_initial_rebalance_delay_ms=0)).start()
    _change_count_failing_deletion(redis_client, namespace, 7)
    # The failed process is started again (its supervisor), or any other process settles.
    GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace, num_partitions=7)).start()
    copies = _copies(redis_client, namespace)
    assert copies and all(k.startswith(f"{namespace}:{{7.") for k in copies)
    newcomer = GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace)).start()
    member = _form_alone(newcomer, "g")
    # The stale process is refused under the old layout and finds the one group.
    assert stale.join_group("g", **JOIN).error.name == "MEMBER_ID_REQUIRED"
    assert stale.config.num_partitions == 7
    assert not redis_client.exists(GroupKeys.of(namespace, 50, "g").group)
    assert {m.member_id for m in newcomer.describe_group("g").members} == {member}


def test_a_count_changed_back_before_the_deletion_keeps_its_layout(redis_client, namespace):
    """50 -> 7 failed before deleting the 50 layout, then 7 -> 50: the pending deletion of the
    50 layout is dropped (it is the current one again), the 7 layout is deleted."""
    GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace)).start()
    _change_count_failing_deletion(redis_client, namespace, 7)
    back = GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace,
                                                            num_partitions=50)).start()
    assert back.config.num_partitions == 50
    copies = _copies(redis_client, namespace)
    assert len(copies) == 50 and all(k.startswith(f"{namespace}:{{50.") for k in copies)
    stored = redis_client.hgetall(settings_key(namespace))
    assert not [k for k in stored if k.startswith(b"retire:")]


def _run_until_batch(client: Any, scripts: Scripts, flow: Generator[Any, Any, Any],
                     op: Any) -> Any:
    """Perform ``flow``'s operations from ``op`` on until it asks for a ScriptBatch that
    repairs copies, which is returned unperformed; or return what the flow returned."""
    while not isinstance(op, ScriptBatch) or _retires(op):
        try:
            op = flow.send(_perform(client, scripts, op, None, None))
        except StopIteration as done:
            return done.value
    return op


def _finish(client: Any, scripts: Scripts, flow: Generator[Any, Any, Any], op: Any,
            after_each: Callable[[Any], None] | None = None) -> Any:
    """Perform ``flow``'s operations from ``op`` on to its end; what it returned.
    ``after_each`` is called after each operation with the next one."""
    while True:
        try:
            op = flow.send(_perform(client, scripts, op, None, None))
        except StopIteration as done:
            return done.value
        if after_each is not None:
            after_each(op)


def test_a_repair_that_races_a_count_change_leaves_no_copy_of_the_old_layout(
        redis_client, namespace):
    """Two processes naming different counts start together on an empty namespace. The first
    establishes 10; the second changes the count to 20 and deletes the 10 layout (nothing yet);
    then the first writes the copies of the 10 layout, then the second those of 20. Before,
    the first ran under 10 for good, its copies left in place (nothing refused its calls),
    while every other process used 20: each created its own copy of a group."""
    scripts = Scripts(redis_client)
    scripts.load()
    first = settle_flow(namespace, CoordinatorConfig(namespace=namespace, num_partitions=10), None)
    first_op = _run_until_batch(redis_client, scripts, first, next(first))
    second = settle_flow(namespace, CoordinatorConfig(namespace=namespace, num_partitions=20), None)
    second_op = _run_until_batch(redis_client, scripts, second, next(second))
    assert isinstance(first_op, ScriptBatch) and isinstance(second_op, ScriptBatch)
    assert redis_client.hget(settings_key(namespace), "num_partitions") == b"20"
    settled = [_finish(redis_client, scripts, first, first_op),
               _finish(redis_client, scripts, second, second_op)]
    stored = int(redis_client.hget(settings_key(namespace), "num_partitions"))
    copies = _copies(redis_client, namespace)
    assert copies == {PartitionKeys(namespace, p, stored).cfg for p in range(stored)}
    # Whoever settled last holds the count stored; one that settled under another count has
    # no copy left, so its calls are refused and it settles again.
    assert settled[-1].config.num_partitions == stored


def test_a_settle_that_read_a_mark_keeps_the_layout_changed_back_to_meanwhile(
        redis_client, namespace):
    """50 -> 10 failed before deleting the 50 layout (a mark left); a process settling then
    (a worker starting) reads the mark; another changes the count back to 50 and a group forms
    there; then the first settle goes on. Before, it deleted the 50 layout as marked: the
    group's partition lost its copy (calls refused until repaired) and its events stream, and
    a warning said the group was created under an old count. The count is read again first.
    (The namespace's settings name no initial delay: the group forms at once.)"""
    GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace, **FAST)).start()
    scripts = _change_count_failing_deletion(redis_client, namespace, 10)
    reader = settle_flow(namespace, None, None)
    op = reader.send(_perform(redis_client, scripts, next(reader), None, None))  # (read)
    GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace,
                                                     num_partitions=50)).start()
    worker = GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace)).start()
    member = _form_alone(worker, "g")
    partition = GroupKeys.of(namespace, 50, "g").partition
    assert redis_client.exists(partition.cfg, partition.events) == 2
    gone: list[str] = []
    settled = _finish(redis_client, scripts, reader, op, lambda _: gone.extend(
        k for k in (partition.cfg, partition.events) if not redis_client.exists(k)))
    assert settled.config.num_partitions == 50
    assert gone == []
    assert {m.member_id for m in worker.describe_group("g").members} == {member}


def _reads_the_count(op: Any, key: str) -> bool:
    """Whether ``op`` is a settle's read of the stored count alone (``_retire``, ``_overtaken``)."""
    return (isinstance(op, Command) and op.args[0] in ("HGET", "HMGET")
            and op.args[1] == key and "num_partitions" in op.args[2:])


def test_a_count_changed_back_between_the_retire_read_and_the_deletion_keeps_its_layout(
        redis_client, namespace):
    """50 -> 10 by one process, 10 -> 50 by another landing in the one round trip between the
    first's read of the count (10: the 50 layout is old) and its deletion; a group forms under
    50 meanwhile. Before, the deletion went ahead: the live layout's copies and events streams
    were deleted (the group's calls refused until some settle repaired them; a warning called
    the live group one created under an old count). Each copy is now deleted only if it holds
    no newer version than the settings the count was read with."""
    GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace)).start()
    scripts = Scripts(redis_client)
    scripts.load()
    key = settings_key(namespace)
    changer = settle_flow(namespace, CoordinatorConfig(namespace=namespace, num_partitions=10),
                          None)
    op = next(changer)
    while not _reads_the_count(op, key):
        op = changer.send(_perform(redis_client, scripts, op, None, None))
    read = _perform(redis_client, scripts, op, None, None)
    back = GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace,
                                                            num_partitions=50)).start()
    assert back.config.num_partitions == 50
    worker = GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace, **FAST)).start()
    member = _form_alone(worker, "g")
    partition = GroupKeys.of(namespace, 50, "g").partition
    with pytest.raises(ConfigError, match="num_partitions is fixed at 50"):
        _finish(redis_client, scripts, changer, changer.send(read))
    assert redis_client.hget(partition.cfg, "num_partitions") == b"50"
    assert redis_client.exists(partition.events)
    live = [PartitionKeys(namespace, p, 50).cfg for p in range(50)]
    assert all(redis_client.hget(k, "num_partitions") == b"50" for k in live)
    assert all(k.startswith(f"{namespace}:{{50.") for k in _copies(redis_client, namespace))
    assert {m.member_id for m in worker.describe_group("g").members} == {member}


def test_a_count_changed_back_before_an_overtaken_settle_withdraws_keeps_its_copies(
        redis_client, namespace):
    """A settle under 10 repairs a lost copy, then reads the count: 20 (another process
    changed it). In the one round trip before it withdraws its copy, a third changes the count
    back to 10 and a group forms in that partition. Before, the copy was deleted regardless:
    the live group's calls were refused until some settle repaired it. It is kept now (it holds
    the newer version of the change back)."""
    GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace,
                                                     num_partitions=10)).start()
    scripts = Scripts(redis_client)
    scripts.load()
    key = settings_key(namespace)
    partition = GroupKeys.of(namespace, 10, "g").partition
    redis_client.delete(partition.cfg)  # (lost on a failover: the settle below repairs it)
    settling = settle_flow(namespace, None, None)
    op = _run_until_batch(redis_client, scripts, settling, next(settling))
    assert isinstance(op, ScriptBatch) and [keys for keys, _ in op.calls] == [
        [partition.cfg, f"{partition.prefix}:withdrawn"]]
    op = settling.send(_perform(redis_client, scripts, op, None, None))
    assert _reads_the_count(op, key)
    GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace,
                                                     num_partitions=20)).start()
    read = _perform(redis_client, scripts, op, None, None)
    GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace,
                                                     num_partitions=10)).start()
    worker = GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace, **FAST)).start()
    member = _form_alone(worker, "g")
    lost: list[Any] = []

    def copy_kept(op: Any) -> None:
        if redis_client.hget(partition.cfg, "num_partitions") != b"10":
            lost.append(op)

    settled = _finish(redis_client, scripts, settling, settling.send(read), copy_kept)
    assert lost == []
    assert settled.config.num_partitions == 10
    assert {m.member_id for m in worker.describe_group("g").members} == {member}


def test_a_count_changed_back_after_the_withdraw_keeps_the_live_partitions_streams(
        redis_client, namespace):
    """50 -> 10 by one process withdraws the 50 layout's copies; before it goes on, another
    changes the count back to 50 and a group forms there (its partition's events stream
    written). Before, the first then deleted each withdrawn partition's events stream, read
    position and acks one round trip after its copy: the live group's events were lost. They
    are deleted with the copy, in the same script, now."""
    GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace)).start()
    scripts = Scripts(redis_client)
    scripts.load()
    changer = settle_flow(namespace, CoordinatorConfig(namespace=namespace, num_partitions=10),
                          None)
    op = next(changer)
    while not _retires(op):
        op = changer.send(_perform(redis_client, scripts, op, None, None))
    op = changer.send(_perform(redis_client, scripts, op, None, None))  # (the withdraw)
    GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace,
                                                     num_partitions=50)).start()
    worker = GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace, **FAST)).start()
    member = _form_alone(worker, "g")
    partition = GroupKeys.of(namespace, 50, "g").partition
    assert redis_client.exists(partition.cfg, partition.events) == 2
    gone: list[str] = []
    with pytest.raises(ConfigError, match="num_partitions is fixed at 50"):
        _finish(redis_client, scripts, changer, op, lambda _: gone.extend(
            k for k in (partition.cfg, partition.events) if not redis_client.exists(k)))
    assert gone == []
    assert {m.member_id for m in worker.describe_group("g").members} == {member}


def test_a_count_change_racing_another_checks_the_layout_it_moves_away_from(
        redis_client, namespace):
    """Empty at 5: one process naming 3 checks the 5 layout for groups; before it stores 3,
    another process moves the count to 7 and a group forms there. Before, the first stored 3
    over 7 regardless (marking 5, not 7, to be retired): the group under 7 was never checked
    for, its layout never retired, and processes settled on 7 ran it while the others used 3.
    The count is now written only over the one checked; the first settles again and is told."""
    GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace, num_partitions=5)).start()
    scripts = Scripts(redis_client)
    scripts.load()
    changer = settle_flow(namespace, CoordinatorConfig(namespace=namespace, num_partitions=3),
                          None)
    op = next(changer)
    while not (isinstance(op, Script) and "num_partitions" in op.args):
        op = changer.send(_perform(redis_client, scripts, op, None, None))
    other = GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace,
                                                             num_partitions=7, **FAST)).start()
    member = _form_alone(other, "g")
    with pytest.raises(ConfigError, match="num_partitions is fixed at 7"):
        _finish(redis_client, scripts, changer, op)
    assert redis_client.hget(settings_key(namespace), "num_partitions") == b"7"
    assert all(k.startswith(f"{namespace}:{{7.") for k in _copies(redis_client, namespace))
    assert {m.member_id for m in other.describe_group("g").members} == {member}


def test_a_layout_re_established_from_stale_anchors_is_retired_when_the_newer_count_is_adopted(
        redis_client, namespace):
    """7 -> 3: the changer stored 3 and withdrew the 7 layout; before it wrote the anchors, the
    settings hash was lost, and a worker re-established 7 from the anchors (still naming 7) and
    wrote the 7 layout's copies again. The changer then wrote the anchors (3, newer), found the
    count 7, and adopted its newer 3. Before, the adopt moved the count from 7 to 3 without
    marking 7 to be retired: the worker's copies stayed, so it ran under 7 for good, never
    refused, while the others used 3 (a group existing twice). The adopt now marks the count it
    moves away from, in the same write."""
    GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace, num_partitions=7)).start()
    scripts = Scripts(redis_client)
    scripts.load()
    changer = settle_flow(namespace, CoordinatorConfig(namespace=namespace, num_partitions=3),
                          None)
    op = _run_until_batch(redis_client, scripts, changer, next(changer))
    assert isinstance(op, ScriptBatch)
    redis_client.delete(settings_key(namespace))
    worker = drive(redis_client, scripts, settle_flow(namespace, None, None))
    assert worker.config.num_partitions == 7
    settled = _finish(redis_client, scripts, changer, op)
    assert settled.config.num_partitions == 3
    assert redis_client.hget(settings_key(namespace), "num_partitions") == b"3"
    assert all(k.startswith(f"{namespace}:{{3.") for k in _copies(redis_client, namespace))


def test_a_repair_whose_count_check_finds_the_settings_lost_withdraws_it(
        redis_client, namespace):
    """A settle under 5 read the settings with one copy missing; another process moved the
    count to 7 (withdrawing the 5 layout); the settle repaired its copy; then the settings hash
    was lost, and the settle's check of the count found none. Before, it returned 5 with its
    copy in place ("the calls refused now settle again": none is, their copy exists), and once
    the settings were re-established from the anchors (7), its groups of that partition ran
    under 5 while every other process used 7. The copy was withdrawn and the settle went on;
    since the change's withdrawal leaves a mark in each partition, the repair itself is refused
    (``rcoord.settings._withdrawn``), and the settle goes on to 7 all the same."""
    GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace, num_partitions=5)).start()
    scripts = Scripts(redis_client)
    scripts.load()
    key = settings_key(namespace)
    redis_client.delete(PartitionKeys(namespace, 0, 5).cfg)  # (lost: the settle repairs it)
    settling = settle_flow(namespace, None, None)
    op = settling.send(_perform(redis_client, scripts, next(settling), None, None))  # (read)
    GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace, num_partitions=7)).start()
    op = _run_until_batch(redis_client, scripts, settling, op)
    assert isinstance(op, ScriptBatch)
    refused = _perform(redis_client, scripts, op, None, None)
    assert all(isinstance(r, list) and r[0] in (b"withdrawn", "withdrawn") for r in refused)
    op = settling.send(refused)
    redis_client.delete(key)
    settled = _finish(redis_client, scripts, settling, op)
    worker = GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace)).start()
    assert worker.config.num_partitions == 7
    assert all(k.startswith(f"{namespace}:{{7.") for k in _copies(redis_client, namespace))
    assert settled.config.num_partitions == 7


def overtaken_with_a_failed_withdraw(redis_client: Any, namespace: str) -> None:
    """Empty namespace: a settle establishes 10 and is about to write its copies; another
    stores 20 (marking 10) and is killed before its withdraw of the 10 layout; the first
    writes the 10 layout, reads the count (20), and its withdraw of those copies fails (a
    master down): the 10 layout is left, marked. (Copies written after the changer's withdraw
    are refused by the mark it leaves in each partition: ``rcoord.settings._withdrawn``.)"""
    scripts = Scripts(redis_client)
    scripts.load()
    first = settle_flow(namespace, CoordinatorConfig(namespace=namespace, num_partitions=10), None)
    op = _run_until_batch(redis_client, scripts, first, next(first))
    assert isinstance(op, ScriptBatch)
    changer = settle_flow(namespace, CoordinatorConfig(namespace=namespace, num_partitions=20),
                          None)
    changing = next(changer)
    while not _retires(changing):
        changing = changer.send(_perform(redis_client, scripts, changing, None, None))
    changer.close()  # (killed before its withdraw)
    op = first.send(_perform(redis_client, scripts, op, None, None))  # (the 10 layout written)
    while not _retires(op):
        op = first.send(_perform(redis_client, scripts, op, None, None))
    with pytest.raises(redis.exceptions.ConnectionError):
        first.throw(redis.exceptions.ConnectionError("master down (test)"))


def test_an_overtaken_settle_whose_withdraw_fails_leaves_its_layout_to_the_next_settle(
        redis_client, namespace):
    """Empty namespace: one settle establishes 10 and is about to write its copies; another
    stores 20 and is killed before it deletes the 10 layout; the first writes the 10 layout,
    reads the count (20), and its withdraw of those copies fails (a master down). Before,
    with the changer's deletion done first (nothing yet) and its mark removed, nothing marked
    the 10 layout, so its copies stayed for good and a process still on 10 was never refused.
    That deletion now refuses such copies (its marks in the partitions); here the layout is
    marked (by the changer, and again by the first), and the next settle deletes it."""
    overtaken_with_a_failed_withdraw(redis_client, namespace)
    assert any(k.startswith(f"{namespace}:{{10.") for k in _copies(redis_client, namespace))
    GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace)).start()
    copies = _copies(redis_client, namespace)
    assert len(copies) == 20 and all(k.startswith(f"{namespace}:{{20.") for k in copies)


def _unmarks(op: Any) -> bool:
    """Whether ``op`` removes a mark of a layout to be retired (``_retire``, once deleted)."""
    return ((isinstance(op, Command) and op.args[0] == "HDEL")
            or (isinstance(op, Script) and op.args[0] == "unmark"))


def test_a_mark_set_again_after_a_retire_read_it_stays_for_the_next_settle(
        redis_client, namespace):
    """At 5: a settle reads the settings (5). Another process moves the count to 7 and deletes
    the 5 layout, its removal of the mark still to come. The first writes the 5 layout again
    (it reads it after the deletion), finds the count moved, marks 5 again, and its withdraw
    fails (a master down). Then the changer removes the mark. Before, it removed it whatever
    had been marked since: the first's copies stayed for good, and a process still on 5 was
    never refused. The mark is removed only if it is still the one read now, and the next
    settle deletes the copies."""
    GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace, num_partitions=5)).start()
    scripts = Scripts(redis_client)
    scripts.load()
    repairing = settle_flow(namespace, None, None)
    op = repairing.send(_perform(redis_client, scripts, next(repairing), None, None))  # (read)
    changer = settle_flow(namespace, CoordinatorConfig(namespace=namespace, num_partitions=7),
                          None)
    unmark = next(changer)
    while not _unmarks(unmark):
        unmark = changer.send(_perform(redis_client, scripts, unmark, None, None))
    op = _run_until_batch(redis_client, scripts, repairing, op)
    op = repairing.send(_perform(redis_client, scripts, op, None, None))  # (the 5 layout)
    while not _retires(op):
        op = repairing.send(_perform(redis_client, scripts, op, None, None))
    with pytest.raises(redis.exceptions.ConnectionError):
        repairing.throw(redis.exceptions.ConnectionError("master down (test)"))
    assert _finish(redis_client, scripts, changer, unmark).config.num_partitions == 7
    GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace)).start()
    copies = _copies(redis_client, namespace)
    assert len(copies) == 7 and all(k.startswith(f"{namespace}:{{7.") for k in copies)
