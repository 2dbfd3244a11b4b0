"""Review 72: "a group must never exist twice". Reproductions of the defects found; each test
fails on the code it was written against (see the review's report)."""

from __future__ import annotations

from typing import Any

import pytest

from rcoord import GroupCoordinator, MockTime, settings
from rcoord.config import CoordinatorConfig
from rcoord.errors import Errors
from rcoord.flow import drive
from rcoord.keys import GroupKeys, settings_key
from rcoord.protocol.offsets import TopicPartition
from rcoord.scripts import Scripts

pytestmark = pytest.mark.parametrize("backend", ["single"])

GROUP = "g"
FAST: dict[str, Any] = {"group_min_session_timeout_ms": 10,
                        "group_max_session_timeout_ms": 600_000,
                        "group_initial_rebalance_delay_ms": 0}
SESSION_MS = 10_000


def _join_stable(coord: GroupCoordinator) -> tuple[str, int]:
    """One member joins ``GROUP`` and syncs it Stable; its member id and generation."""
    joined = coord.join_group(GROUP, protocol_type="consumer", protocols=[("range", b"m")],
                              session_timeout_ms=SESSION_MS, require_known_member_id=False)
    assert joined.error is Errors.NONE, joined
    mid, gen = joined.member_id, joined.generation_id
    synced = coord.sync_group(GROUP, gen, mid, assignments={mid: b"all"})
    assert synced.error is Errors.NONE, synced
    return mid, gen


def _change_count_while_forming(redis_client: Any, namespace: str, clock: MockTime,
                                monkeypatch: pytest.MonkeyPatch, old: Any,
                                commit: TopicPartition | None = None) -> tuple[Any, str, int]:
    """Change the namespace's count from 50 to 10 while ``old`` (a process on 50) forms
    ``GROUP`` Stable, one member (committing 42 at ``commit``), between the change's check for
    groups and its deletion of the old layout; the coordinator on 10, the member id and its
    generation."""
    real = settings._count_groups
    formed: list[tuple[str, int]] = []

    def racing(ns: str, n: int) -> Any:
        count = yield from real(ns, n)
        if not formed:  # the change's check found no group; one forms before the deletion
            formed.append(_join_stable(old))
            if commit is not None:
                old.commit_offsets(GROUP, {commit: 42}, member_id=formed[0][0],
                                   generation_id=formed[0][1])
        return count

    monkeypatch.setattr(settings, "_count_groups", racing)
    new = GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace,
                                                           num_partitions=10, **FAST),
                           clock=clock).start()
    monkeypatch.undo()
    assert formed and int(redis_client.hget(settings_key(namespace), "num_partitions")) == 10
    return new, *formed[0]


def test_a_member_left_in_a_withdrawn_layout_is_not_kept_alive_by_its_heartbeats(
        redis_client: Any, namespace: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """settings.py admits a group formed between a change of count's check for groups and the
    old layout's deletion, and says "their members rejoin under the new count". They do not:
    heartbeat.lua reads no settings copy, so a process still on the old count is answered NONE
    for as long as its member heartbeats, in a layout no other process reaches, while the group
    forms again under the new count: two Stable copies of one group, each with a member that
    owns every partition. Kafka answers a heartbeat at a broker that no longer leads the
    group's partition NOT_COORDINATOR, and the member finds the coordinator again."""
    clock = MockTime()
    old = GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace, **FAST),
                           clock=clock).start()
    assert old.config.num_partitions == 50
    new, mid, gen = _change_count_while_forming(redis_client, namespace, clock, monkeypatch, old)

    # The group forms under the count in force, with a member of its own.
    other, other_gen = _join_stable(new)
    assert new.describe_group(GROUP).state == "Stable"

    # The old process's member heartbeats on, within its session, for three sessions.
    answers = []
    for _ in range(6):
        clock.sleep(SESSION_MS // 2)
        answers.append(old.heartbeat(GROUP, gen, mid))
        assert new.heartbeat(GROUP, other_gen, other) is Errors.NONE
    assert Errors.NONE not in answers, (
        f"the old layout's copy of {GROUP!r} stays live: heartbeats answered {answers} while "
        f"the group is Stable under the new count with member {other!r}")


def test_a_group_stranded_by_a_change_of_count_does_not_come_back_when_the_count_does(
        redis_client: Any, namespace: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The group formed during a change of count (as above) keeps its keys in the old layout:
    ``_retire`` counts it and logs it, and deletes only the partitions' copies, events, read
    positions and acks. Changing the count back, which the namespace allows since no group
    exists under the count in force, makes the old layout live again, and with it that group:
    its offsets (and, within its session, its member and generation), from before two changes
    of count, come back: a deleted group's state returns. Kafka has no such return: its
    offsets.topic.num.partitions is fixed once __consumer_offsets exists."""
    clock = MockTime()
    old = GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace, **FAST),
                           clock=clock).start()
    _, mid, _ = _change_count_while_forming(redis_client, namespace, clock, monkeypatch, old,
                                            commit=TopicPartition("t", 0))

    # Long after (the stranded member's session is over), no group exists under 10, so the
    # count may change back; the stranded group must not return with it.
    clock.sleep(3 * SESSION_MS)
    back = GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace,
                                                            num_partitions=50, **FAST),
                            clock=clock).start()
    assert int(redis_client.hget(settings_key(namespace), "num_partitions")) == 50
    described = back.describe_group(GROUP)
    fetched = back.fetch_offsets(GROUP).offsets
    assert (described.state, fetched) == ("Dead", {}), (
        f"{GROUP!r} came back from before two changes of count: {described.state}, "
        f"offsets {fetched} (committed by member {mid!r} under the first count)")


@pytest.mark.parametrize("front", ["blocking", "asyncio"])
@pytest.mark.parametrize("call", ["heartbeat", "heartbeat_many"])
def test_a_stranded_member_is_answered_by_the_group_in_force_and_rejoins(
        request: pytest.FixtureRequest, backend: str, redis_client: Any, namespace: str,
        monkeypatch: pytest.MonkeyPatch, front: str, call: str) -> None:
    """The refused heartbeat (NOT_COORDINATOR: the old layout's settings copy is gone) settles
    the old process again and is sent under the count in force, by either front end and by
    ``heartbeat_many`` too: the member is unknown there, so it rejoins, as a Kafka member that
    found its coordinator again; its process now addresses the group under the new count."""
    from async_driver import AsyncBacked, async_client_factory

    clock = MockTime()
    cfg = CoordinatorConfig(namespace=namespace, **FAST)
    old: Any
    if front == "blocking":
        old = GroupCoordinator(redis_client, cfg, clock=clock).start()
    else:
        old = AsyncBacked(redis_client, async_client_factory(request, backend), cfg,
                          clock).start()
        request.addfinalizer(old.close)
    new, mid, gen = _change_count_while_forming(redis_client, namespace, clock, monkeypatch, old)
    other, other_gen = _join_stable(new)

    if call == "heartbeat":
        answers = [old.heartbeat(GROUP, gen, mid), old.heartbeat(GROUP, other_gen, other)]
    else:
        answers = old.heartbeat_many([(GROUP, gen, mid), (GROUP, other_gen, other)])
    assert answers == [Errors.UNKNOWN_MEMBER_ID, Errors.NONE]
    assert old.config.num_partitions == 10
    # One copy of the group: the member's rejoin (UNKNOWN_MEMBER_ID) reaches the one in force.
    assert [m.member_id for m in new.describe_group(GROUP).members] == [other]


def test_a_stranded_group_is_deleted_whole_and_logged_with_its_offsets(
        redis_client: Any, namespace: str, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """The change of count that withdrew the layout deletes the group formed there in the
    window, every key of it (a wake-up for its parked callers stays, expiring), and says which
    offsets went with it: nothing is dropped silently."""
    clock = MockTime()
    old = GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace, **FAST),
                           clock=clock).start()
    with caplog.at_level("WARNING", logger="rcoord.settings"):
        _change_count_while_forming(redis_client, namespace, clock, monkeypatch, old,
                                    commit=TopicPartition("t", 3))
    pk = GroupKeys.of(namespace, 50, GROUP).partition
    assert not redis_client.sismember(pk.groups, GROUP)
    assert redis_client.zscore(pk.due, GROUP) is None
    left = [k.decode() for k in redis_client.keys(f"{pk.prefix}:*:{GROUP}")]
    assert left == [pk.group(GROUP).wake], left  # drop always leaves the wake-up (280dae2)
    assert redis_client.pttl(left[0]) > 0
    assert any(r.levelname == "WARNING" and repr(GROUP) in r.getMessage()
               and "'t-3': 42" in r.getMessage() for r in caplog.records), caplog.text


def test_a_group_in_a_layout_in_force_is_never_dropped_as_stranded(
        redis_client: Any, namespace: str) -> None:
    """The deletion of stranded groups runs after the old layout's copies went; a change back
    since writes them again, and the groups there are then the ones in force: each is deleted
    only while its partition has no copy, in the same script."""
    coord = GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace, **FAST)).start()
    mid, gen = _join_stable(coord)
    tp = TopicPartition("t", 0)
    coord.commit_offsets(GROUP, {tp: 7}, member_id=mid, generation_id=gen)
    scripts = Scripts(redis_client)
    scripts.load()
    drive(redis_client, scripts, settings._drop_stranded(namespace, 50, 10))
    assert coord.describe_group(GROUP).state == "Stable"
    assert coord.fetch_offsets(GROUP).offsets[tp].offset == 7
    assert coord.heartbeat(GROUP, gen, mid) is Errors.NONE
