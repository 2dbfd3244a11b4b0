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

75bdda9 has the leader check every cooperative plan against the claims that stood, read as
cooperative-sticky reads them (``standing_claims``: a member without a generation in its
subscription takes the int32 at the start of its ``user_data``). Under any other assignor that
``user_data`` is the plug-in's own (Kafka's ``CooperativeStickyAssignor.memberData`` is that
assignor's alone; Kafka's leader checks the raw owned partitions), so its first four bytes
become a generation that can beat a real one, and the leader refuses a plan that keeps a
partition with its newest claimant.
"""

from __future__ import annotations

from typing import Any

import redis
from harness import drive_by_hand, server_ms
from test_review73_assignors import T0, Fixed, lead

from rcoord import CoordinatorConfig, Errors, GroupCoordinator
from rcoord.protocol.consumer import ConsumerProtocolSubscription

JOIN: dict[str, Any] = {"protocol_type": "consumer", "protocols": [("range", b"")],
                        "session_timeout_ms": 10_000, "rebalance_timeout_ms": 2000}


def sweeper_beside_a_coordinator(own_server: Any, namespace: str) -> tuple[Any, Any, Any]:
    """(client, coordinator, sweeper) of one partition, the sweeper's retry of a failed group a
    minute ahead, its clock synced and its partition read."""
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
    return client, coord, sweeper


def test_a_failed_expiry_moves_a_deadline_a_step_published_meanwhile(own_server, namespace):
    client, coord, sweeper = sweeper_beside_a_coordinator(own_server, namespace)
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
    from rcoord.service.metrics import Metrics
    from rcoord.service.sweeper import Sweeper

    other = Sweeper(client, coord._scripts, namespace, 1, Metrics())
    other.sync_clock()
    other.resync({0})
    index = client.zscore(due, "good")
    assert index is not None and index <= int(ea), (
        f"the index entry {index:.0f} is {index - int(ea):.0f} ms past the group's published "
        f"earliest deadline {int(ea)}; another sweeper waits until {other.next_due():.0f}")


class Weighted(Fixed):
    """A cooperative plug-in whose members send their weight as an int32 in ``user_data``."""

    name = "weighted"


def test_the_leader_reads_no_generation_in_another_assignors_user_data():
    # A has no generation in its subscription (reset, or a v1 subscription) and still claims
    # t0p0; B, of generation 5, owns t0p0-t0p3. B's claim is the newer one: the plug-in keeps
    # everything on B and A revokes t0p0, which is no transfer by any reading of the claims.
    plan = {"A": [], "B": T0}
    members = {"A": ConsumerProtocolSubscription(["t0"], b"", T0[:1], -1),
               "B": ConsumerProtocolSubscription(["t0"], b"", T0, 5)}
    lead(members, Weighted(plan))  # passes
    # The same group, A's plug-in sending its weight (9): the leader refuses the round.
    members["A"] = ConsumerProtocolSubscription(["t0"], (9).to_bytes(4, "big"), T0[:1], -1)
    lead(members, Weighted(plan))


def test_heartbeat_many_whose_resend_sweep_stays_refused_answers_the_others() -> None:
    """21ba8f5/90d6b22 answer a group NOT_COORDINATOR when its resent heartbeat, or a heartbeat
    one by one, is still refused under a stale layout after every re-settle, so the other
    groups' answers stand. The resend's first call, the group's sweep (``expire_deadlines``),
    can be refused the same way (the count changes again at each of its re-settles): it raises
    out of ``_resend_heartbeats`` and heartbeat_many raises it for every member of every
    group."""
    import redis.exceptions

    from rcoord import CoordinatorConfig
    from rcoord.flow import Script, ScriptBatch
    from rcoord.steps import GroupSteps

    steps = GroupSteps(CoordinatorConfig(namespace="hbdue"), "hbdue", None)
    steps.config = CoordinatorConfig(namespace="hbdue")

    def answer(op: Any) -> Any:
        if isinstance(op, ScriptBatch):  # group "a" falls due; "b" answers
            return [b"DUE" if args[1] == "a" else [b"NONE"] for _, args in op.calls]
        assert isinstance(op, Script) and op.name == "expire_deadlines", op
        # Refused under a stale layout, each time after another process settled.
        steps.config = CoordinatorConfig(namespace="hbdue")
        raise redis.exceptions.ResponseError(
            "RCOORD_NOT_COORDINATOR no settings at hbdue:{10.0.2}:cfg")

    got = drive_by_hand(steps.heartbeat_many([("a", 1, "m1"), ("b", 1, "n1")]), answer)
    assert got == [Errors.NOT_COORDINATOR, Errors.NONE]
