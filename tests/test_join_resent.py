"""A JoinGroup sent twice, as redis-py sends a call again when the connection lost its reply
(its retry on ConnectionError / TimeoutError, and rcoord.flow sending a failed pipeline's calls
again alone). A new member's id comes from the request's UUID, so both copies name the same
member: the second must be that member's rejoin, never a second member."""

from __future__ import annotations

import functools
import uuid
from typing import Any

import msgpack
import pytest
from harness import WAIT_S, RawGroup, wait_until

from rcoord import CoordinatorConfig, Errors, GroupCoordinator
from rcoord.client import ConsumerGroup, ConsumerGroupConfig
from rcoord.errors import InvalidRequestError
from rcoord.protocol.join import JoinGroupResult, JoinRequest, new_member_id
from rcoord.topics import Topics

GROUP = "resent"
T0 = 1_000_000
SESSION_MS = 10_000


def join_args(*, static: str | None = None, member_id: str = "", require_known: bool = False,
              member_uuid: str | None = None) -> list[Any]:
    """One JoinGroup's arguments, built once: a resend sends these same ones (same UUID)."""
    return JoinRequest.build(
        GROUP, member_id, protocol_type="consumer", protocols=[("range", b"meta")],
        session_timeout_ms=SESSION_MS, rebalance_timeout_ms=SESSION_MS,
        group_instance_id=static, client_id="c", client_host="",
        require_known_member_id=require_known, reason=None,
        new_member_uuid=member_uuid).args()


class Group(RawGroup):
    def __init__(self, coord: Any) -> None:
        super().__init__(coord, GROUP)

    def members(self) -> list[str]:
        return sorted(k.decode() for k in self.r.hkeys(self.keys.members))

    def assert_one_member(self, member_id: str) -> None:
        assert self.members() == [member_id]
        assert self.r.hlen(self.keys.joining) <= 1
        # The counts the group keeps of its members' protocols and rebalance timeouts.
        assert self.field("P:range") == "1"
        rtc = self.r.hget(self.keys.group, "rtc")
        assert rtc is not None and msgpack.unpackb(rtc, strict_map_key=False) == {SESSION_MS: 1}


def joined(reply: Any) -> JoinGroupResult:
    assert reply[0] == b"R", reply
    return JoinGroupResult.decode(bytes(reply[1]))


@pytest.mark.parametrize("static", [None, "instance-1"], ids=["dynamic", "static"])
def test_a_join_sent_again_after_it_completed_is_answered_as_the_same_member(
        make_coordinator, static):
    g = Group(make_coordinator(group_initial_rebalance_delay_ms=0))
    args = join_args(static=static)
    parked = g.call("join_group", T0, *args)
    assert parked[0] == b"W", parked  # the join phase completes at the next call (no delay)
    first = joined(g.call("await_reply", T0, parked[4].decode(), "j"))
    assert first.error is Errors.NONE and first.generation_id == 1
    again = joined(g.call("join_group", T0 + 1, *args))
    # The member resends in CompletingRebalance with the same metadata: the same answer.
    assert again.error is Errors.NONE
    assert (again.member_id, again.generation_id, again.leader_id, again.protocol_name) == (
        first.member_id, 1, first.member_id, "range")
    assert [m.member_id for m in again.members] == [first.member_id]
    g.assert_one_member(first.member_id)
    assert g.field("state") == "CompletingRebalance" and g.field("pname") == "range"
    if static:
        assert g.r.hget(g.keys.statics, static) == first.member_id.encode()


@pytest.mark.parametrize("static", [None, "instance-1"], ids=["dynamic", "static"])
def test_a_join_sent_again_while_it_is_parked_parks_the_same_member(make_coordinator, static):
    delay = 100
    g = Group(make_coordinator(group_initial_rebalance_delay_ms=delay))
    args = join_args(static=static)
    first = g.call("join_group", T0, *args)
    assert first[0] == b"W", first
    member_id = first[4].decode()
    again = g.call("join_group", T0 + 1, *args)
    assert again[0] == b"W" and again[4].decode() == member_id, again
    g.assert_one_member(member_id)
    # The initial delay passes: one member, generation 1, the protocol every member supports.
    done = joined(g.call("await_reply", T0 + 1 + delay, member_id, "j"))
    assert done.error is Errors.NONE
    assert (done.generation_id, done.leader_id, done.protocol_name) == (1, member_id, "range")
    assert [m.member_id for m in done.members] == [member_id]
    assert g.field("state") == "CompletingRebalance"


# -- the worker's first JoinGroup: one request, a UUID of its own --------------------------------


def new_member_join(coord: Any, **kw: Any) -> Any:
    """A new member's JoinGroup through the public API, as the worker sends it (no KIP-394
    round); ``kw`` adds to or overrides the arguments."""
    return functools.partial(
        coord.join_group, GROUP, "", protocol_type="consumer", protocols=[("range", b"meta")],
        session_timeout_ms=SESSION_MS, require_known_member_id=False, **kw)


@pytest.mark.parametrize("static", [None, "instance-1"], ids=["dynamic", "static"])
def test_a_new_member_that_sends_its_uuid_again_is_one_member(make_coordinator, pool, static):
    """What the worker does (rcoord.client.join): no MEMBER_ID_REQUIRED round, and every retry
    of its first join carries the UUID it chose. The id is known before the answer (new_member_id)
    and a second request with the same UUID, while the first is parked, is the same member."""
    coord = make_coordinator(group_initial_rebalance_delay_ms=300)
    g = Group(coord)
    member_uuid = str(uuid.uuid4())
    expected = new_member_id("c", static or "", member_uuid)
    join = new_member_join(coord, group_instance_id=static, client_id="c",
                           new_member_uuid=member_uuid)
    first = pool.submit(join)
    wait_until(lambda: g.r.hexists(g.keys.joining, expected))
    again = pool.submit(join)
    results = [first.result(WAIT_S), again.result(WAIT_S)]
    for res in results:
        assert res.error is Errors.NONE and res.member_id == expected, res
        assert res.generation_id == 1 and res.leader_id == expected
    g.assert_one_member(expected)
    assert g.r.hlen(g.keys.pending) == 0  # no KIP-394 round


def test_a_member_id_required_round_naming_a_member_changes_nothing(make_coordinator):
    """A KIP-394 first round whose UUID makes the id of a member already in the group (the
    round sent again after its member joined, or a UUID taken from another member's id, which
    a description shows): the id is handed out again and nothing is written. Before, the
    member was also made pending and its session deadline replaced by a pending one, whose
    expiry dropped only the pending entry: the member never expired."""
    g = Group(make_coordinator(group_initial_rebalance_delay_ms=0))
    member_uuid = str(uuid.uuid4())
    parked = g.call("join_group", T0, *join_args(member_uuid=member_uuid))
    member = joined(g.call("await_reply", T0, parked[4].decode(), "j"))
    assert member.error is Errors.NONE
    session = g.r.zscore(g.keys.deadlines, f"hb:{member.member_id}")
    assert session == T0 + SESSION_MS

    again = joined(g.call("join_group", T0 + 1_000,
                          *join_args(require_known=True, member_uuid=member_uuid)))
    assert (again.error, again.member_id) == (Errors.MEMBER_ID_REQUIRED, member.member_id)
    assert g.r.hlen(g.keys.pending) == 0
    assert g.r.zscore(g.keys.deadlines, f"hb:{member.member_id}") == session
    g.assert_one_member(member.member_id)
    # It never heartbeats again: its session ends, and the group with it.
    assert g.call("expire_deadlines", T0 + SESSION_MS)[0] >= 1
    assert g.members() == [] and g.field("state") == "Empty"


def test_new_member_uuid_must_be_a_uuid(make_coordinator):
    coord = make_coordinator()
    join = new_member_join(coord)
    with pytest.raises(InvalidRequestError, match="new_member_uuid 'worker-7' is not a UUID"):
        join(new_member_uuid="worker-7")
    with pytest.raises(TypeError, match="new_member_uuid must be a str"):
        join(new_member_uuid=7)
    assert not coord.list_groups()  # refused before anything was sent


def test_a_worker_closed_during_its_first_join_leaves_at_once(redis_client, namespace):
    """The worker knows its id before its first join returns, so close() leaves while that join
    is parked: the member is gone at once (its parked join answered), not after its join
    timeout."""
    coord = GroupCoordinator(redis_client, CoordinatorConfig(
        namespace=namespace, group_initial_rebalance_delay_ms=0))
    Topics(redis_client, namespace).create("t", 2)
    # A member that stays in the group without rejoining, so the worker's join stays parked.
    first = coord.join_group("g", "", protocol_type="consumer",
                             protocols=[("range", b"")], session_timeout_ms=30_000,
                             rebalance_timeout_ms=30_000, require_known_member_id=False)
    assert first.error is Errors.NONE
    assert coord.sync_group("g", 1, first.member_id, assignments={}).error is Errors.NONE
    worker = ConsumerGroup(ConsumerGroupConfig(
        group_id="g", topics=["t"], client_id="w", redis_client=redis_client,
        namespace=namespace, session_timeout_ms=30_000, rebalance_timeout_ms=30_000))
    keys = coord._keys("g")
    with worker:
        wait_until(lambda: redis_client.hlen(keys.joining) == 1)
        parked_id = worker.member_id
        assert parked_id.startswith("w-") and redis_client.hexists(keys.joining, parked_id)
        assert redis_client.hlen(keys.pending) == 0
        worker.close(timeout=WAIT_S)
        thread = worker._thread
        assert thread is not None and not thread.is_alive()
    assert [m.member_id for m in coord.describe_group("g").members] == [first.member_id]
    assert redis_client.hlen(keys.joining) == 0


@pytest.mark.parametrize("protocols", ["same", "changed"])
def test_a_static_join_sent_again_in_stable_replaces_as_kafka_does(make_coordinator, protocols):
    """A static member's first JoinGroup sent again once the group is Stable (its reply was
    lost, or a replacement's was): Kafka takes it for a new instance of that static member and
    replaces it without a rebalance while the selected protocol stays the same, telling a leader
    to skip the assignment (KIP-814). Here both copies name the same member id: the answer is
    the one that replacement gives, not a known leader's rejoin (which forces a rebalance)."""
    coord = make_coordinator(group_initial_rebalance_delay_ms=0)
    g = Group(coord)
    member_uuid = str(uuid.uuid4())
    join = new_member_join(coord, group_instance_id="instance-1", client_id="c",
                           new_member_uuid=member_uuid)
    first = join()
    assert first.error is Errors.NONE and first.leader_id == first.member_id
    synced = coord.sync_group(GROUP, first.generation_id, first.member_id,
                              assignments={first.member_id: b"a"})
    assert synced.error is Errors.NONE and g.field("state") == "Stable"

    if protocols == "same":
        again = join()
        assert again.error is Errors.NONE
        assert (again.member_id, again.generation_id, again.leader_id) == (
            first.member_id, 1, first.member_id)
        assert again.skip_assignment and [m.member_id for m in again.members] == [first.member_id]
        assert g.field("state") == "Stable" and g.field("gen") == "1"
        g.assert_one_member(first.member_id)
        # The generation is the same one: the member's heartbeats and commits go on.
        assert coord.heartbeat(GROUP, 1, first.member_id,
                               group_instance_id="instance-1") is Errors.NONE
    else:
        # Another protocol selected: as in Kafka, the replacement rebalances.
        again = join(protocols=[("roundrobin", b"meta"), ("range", b"meta")])
        assert again.error is Errors.NONE and again.generation_id == 2
        assert again.protocol_name == "roundrobin" and not again.skip_assignment
