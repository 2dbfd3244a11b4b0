"""Review 73c (this session's fixes, re-read): reproductions.

5ae1d7f moves a group's due-index entry to its retry time after ``expire_deadlines`` failed
(``Sweeper._failed``: ``ZADD XX GT``, a command of its own after the failed call's reply). The
index is a lower bound of the group's earliest deadline, never later (lua/deadline_index.lua,
lua/prelude.lua's note_deadline_write); a step that runs between the failed call and that ZADD
(a heartbeat, a join: any step applies the passed deadlines itself and publishes the group's
real earliest, index and 'ea' together) has already written the index, and the ZADD, being
later ('GT'), replaces that fresh value with the retry time. The group is healthy, its 'ea'
holds its real deadline, and its index entry is later: no step republishes it (a write at or
after 'ea' leaves the index alone), so every coordinator that reads the index (a lease moved to
another process) sleeps past the group's deadline until the retry.
"""

from __future__ import annotations

from typing import Any

import redis
from harness import server_ms

from rcoord import CoordinatorConfig, Errors, GroupCoordinator

JOIN: dict[str, Any] = {"protocol_type": "consumer", "protocols": [("range", b"")],
                        "session_timeout_ms": 10_000, "rebalance_timeout_ms": 2000}


def test_a_failed_expiry_moves_a_deadline_a_step_published_meanwhile(own_server, namespace):
    from rcoord.service.metrics import Metrics
    from rcoord.service.sweeper import Sweeper

    client = own_server.client()
    coord = GroupCoordinator(client, CoordinatorConfig(
        namespace=namespace, num_partitions=1, group_min_session_timeout_ms=10,
        group_initial_rebalance_delay_ms=0)).start()
    sweeper = Sweeper(client, coord._scripts, namespace, 1, Metrics())
    sweeper.backoff_first_ms = 60_000  # its retry lies a minute ahead
    sweeper.sync_clock()
    sweeper.resync({0})
    # The sweeper's expire_deadlines of the group failed (a transient script error); before
    # its ZADD reached Redis a step of the group ran and published its real earliest deadline:
    # the group forms, its member's session ends 10 s ahead.
    mid = coord.join_group("good", **JOIN).member_id
    res = coord.join_group("good", mid, **JOIN)
    assert res.error == Errors.NONE
    assert coord.sync_group("good", res.generation_id, mid, assignments={}).error == Errors.NONE
    due = coord._keys("good").partition.due
    published = client.zscore(due, "good")
    ea = client.hget(coord._keys("good").group, "ea")
    assert published is not None and ea is not None and int(ea) == published
    assert published > server_ms(client)  # healthy: nothing due
    sweeper._failed(0, "good", redis.ResponseError("a transient failure"), client)

    # Another coordinator process (the partition's lease moved) reads the index afresh.
    other = Sweeper(client, coord._scripts, namespace, 1, Metrics())
    other.sync_clock()
    other.resync({0})
    index = client.zscore(due, "good")
    assert index is not None and index <= int(ea), (
        f"the index entry {index:.0f} is {index - int(ea):.0f} ms past the group's published "
        f"earliest deadline {int(ea)}; another sweeper waits until {other.next_due():.0f}")
