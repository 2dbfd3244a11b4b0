"""The sweeper's back-off of a group whose ``expire_deadlines`` fails is the group's own: a group
deleted and made again under its id starts with no failures, its first retry after
``backoff_first_ms``, not after the old group's doubled wait (the count was kept per group id,
``Sweeper.backed_off``, and outlived the group until the retry time was long past)."""

from __future__ import annotations

import logging
from typing import Any

from harness import handling, wait_until

from rcoord import CoordinatorConfig, Errors, GroupCoordinator, MemberIdentity
from rcoord.service.metrics import Metrics
from rcoord.service.sweeper import Sweeper

JOIN: dict[str, Any] = {"protocol_type": "consumer", "protocols": [("range", b"")],
                        "session_timeout_ms": 300, "rebalance_timeout_ms": 2000}
GROUP = "made-again"
FIRST_MS = 60_000  # no retry within the test


class ExpireErrors(logging.Handler):
    """The ``expire_error`` records of ``GROUP``: (failures, retry_in_ms) each."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[int, int]] = []

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(record, "event", None) == "expire_error" and getattr(record, "group", None) == GROUP:
            self.seen.append((int(record.failures), int(record.retry_in_ms)))  # type: ignore[attr-defined]


def _lonely_member(coord: GroupCoordinator) -> str:
    """A one-member Stable group whose member then goes silent (its session ends soon)."""
    mid = coord.join_group(GROUP, **JOIN).member_id
    res = coord.join_group(GROUP, mid, **JOIN)
    assert coord.sync_group(GROUP, res.generation_id, mid, assignments={}).error == Errors.NONE
    return mid


def _fails(client: Any, coord: GroupCoordinator, sweeper: Sweeper, errors: ExpireErrors,
           times: int) -> list[tuple[int, int]]:
    """The group's deadlines are made unreadable (its deadlines zset a string: the call fails
    before it writes anything) until the sweeper's ``expire_deadlines`` of the member's passed
    session has failed ``times`` times (each retry made due at once); then put back. The
    (failures, retry_in_ms) of each."""
    keys = coord._keys(GROUP)
    saved = client.dump(keys.deadlines)
    client.delete(keys.deadlines)
    client.set(keys.deadlines, "not a hash")
    before = len(errors.seen)
    try:
        for n in range(1, times + 1):
            if n > 1:
                client.zadd(keys.partition.due, {GROUP: 0})  # its retry, now
            wait_until(lambda n=n: len(errors.seen) >= before + n, timeout_s=10,  # type: ignore[misc]
                       step=lambda: (sweeper.resync({0}), sweeper.sweep_due("deadline")))
    finally:
        client.delete(keys.deadlines)
        client.restore(keys.deadlines, 0, saved)
    return errors.seen[before:]


def test_a_group_made_again_starts_its_back_off_afresh(redis_server: Any, namespace: str) -> None:
    client = redis_server.client()
    coord = GroupCoordinator(client, CoordinatorConfig(
        namespace=namespace, num_partitions=1, group_min_session_timeout_ms=10,
        group_initial_rebalance_delay_ms=0)).start()
    sweeper = Sweeper(client, coord._scripts, namespace, 1, Metrics())
    sweeper.backoff_first_ms = FIRST_MS
    sweeper.backoff_max_ms = 10 * FIRST_MS
    sweeper.sync_clock()
    with handling(ExpireErrors(), "rcoord.service", logging.ERROR) as errors:
        mid = _lonely_member(coord)
        assert _fails(client, coord, sweeper, errors, 2) == [(1, FIRST_MS), (2, 2 * FIRST_MS)]

        # Its member gone, the Empty group is deleted ...
        coord.leave_group(GROUP, [MemberIdentity(mid)])
        assert coord.delete_groups([GROUP]) == {GROUP: Errors.NONE}
        assert not client.exists(coord._keys(GROUP).group)
        # ... and made again under its id, whose call fails too: its first failure, then its
        # second (the count of one group still doubles the wait).
        _lonely_member(coord)
        assert _fails(client, coord, sweeper, errors, 2) == [(1, FIRST_MS), (2, 2 * FIRST_MS)], (
            "the group made again inherited the deleted group's failure count")
