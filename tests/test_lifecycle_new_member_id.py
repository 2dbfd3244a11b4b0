"""A new member's id is its own until the coordinator answers its JoinGroup.

The worker names a new member itself (``join.join_generation``: an id made from a UUID, sent
with every retry of that join) and records that id before the join is answered, so that
``close()`` can leave while the join is parked. When the join then failed (its retries
exhausted on a lost connection), the policy's "keep the member id" kept that unanswered id,
and the next join went out as a *known* member with it. For a static member whose instance id
the group still maps to its previous process (static members never leave), the coordinator
answers that join FENCED_INSTANCE_ID, which is fatal: a restarted static worker that met an
outage longer than a session timeout at start-up closed itself for good, though no other
process used its instance id. Kafka's member learns its id only from an answer, so it would
have joined again as a new member and replaced the old one.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from harness import wait_until
from test_client_group import (  # noqa: F401 - the fixtures
    WAIT_S,
    OneMemberGroup,
    fake_group,
    real,
)

from rcoord import ConnectionLost, TopicPartition
from rcoord.client import ConsumerGroup, ConsumerGroupConfig
from rcoord.client.coordinator import RedisCoordinator


class JoinOutage(RedisCoordinator):
    """The Redis coordinator; ``outage`` JoinGroup calls fail as if Redis were unreachable."""

    def __init__(self, redis_client: Any, namespace: str, outage: int) -> None:
        super().__init__(redis_client, namespace)
        self.outage = outage
        self.joins: list[str] = []
        self.uuids: list[str | None] = []

    def join_group(self, group_id: str, member_id: str = "", **kwargs: Any) -> Any:
        self.joins.append(member_id)
        self.uuids.append(kwargs.get("new_member_uuid"))
        if self.outage:
            self.outage -= 1
            raise ConnectionLost("join_group: Connection refused")
        return super().join_group(group_id, member_id, **kwargs)


def test_a_restarted_static_member_whose_first_join_failed_replaces_its_old_self(
    real: Any,  # noqa: F811 - the fixture
) -> None:
    real.topics.create("t", 2)
    before = real.group(group_instance_id="static-1", session_timeout_ms=5000)
    old = before.next(timeout=WAIT_S)
    before.close(timeout=WAIT_S)  # a static member leaves no LeaveGroup: it stays registered
    # The restarted process: its first JoinGroup fails for the whole retry budget.
    coord = JoinOutage(real.client, real.namespace, outage=1_000_000)
    coord.start()
    cfg = ConsumerGroupConfig(
        group_id="g", topics=["t"], redis_client=real.client, namespace=real.namespace,
        group_instance_id="static-1", heartbeat_interval_ms=50, session_timeout_ms=300,
        rebalance_timeout_ms=3000, join_backoff_ms=10, retry_backoff_ms=10,
        retry_backoff_max_ms=50,
    )
    group = ConsumerGroup(cfg, coordinator=coord)
    try:
        group.start()
        with pytest.raises(ConnectionLost):
            group.next(timeout=WAIT_S)  # the join that backs off is reported
        coord.outage = 0
        gen = group.next(timeout=WAIT_S)  # not FencedInstanceIdError: no one else is static-1
        assert gen.member_id != old.member_id
        assert sorted(gen.partitions) == [TopicPartition("t", 0), TopicPartition("t", 1)]
        assert coord.joins[-1] == ""  # it joined again as a new member,
        assert len(set(coord.uuids)) == 1  # named as its unanswered join was
    finally:
        group.close(timeout=WAIT_S)


def test_a_new_member_that_leaves_during_its_first_round_rejoins_with_a_new_id(
    fake_group: Any,  # noqa: F811 - the fixture
) -> None:
    """The poll timer makes a new member leave after its JoinGroup was answered, while its
    SyncGroup is under way. Its LeaveGroup went for the id the join gave it, but the UUID that
    id came from was kept (the run thread keeps it while it sees no member id, as for a join
    never answered, and the leave had just forgotten the id), so after ``resume()`` the member
    joined as the very member that had left, not as a new one."""
    state = OneMemberGroup()
    entered, release = threading.Event(), threading.Event()
    sync = state.fake.sync_group

    def held_sync(*args: Any, **kwargs: Any) -> Any:
        entered.set()
        release.wait(WAIT_S)
        return sync(*args, **kwargs)

    state.fake.sync_group = held_sync  # type: ignore[attr-defined]
    group = fake_group(state)
    group.start()
    try:
        assert entered.wait(WAIT_S)  # joined (it has its id), syncing
        group.leave_until_resumed("max.poll.interval.ms passed")
    finally:
        release.set()
    wait_until(lambda: group.newest() is not None and group.newest().done.is_set())
    assert state.leaves[0] == state.id(1)
    group.resume()
    nxt = group.next(timeout=WAIT_S)
    assert nxt.member_id == state.id(2) != state.id(1)
