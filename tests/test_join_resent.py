"""A JoinGroup sent twice, as redis-py sends a call again when the connection lost its reply
(its retry on ConnectionError / TimeoutError, and rcoord.flow sending a failed pipeline's calls
again alone). A new member's id comes from the request's UUID, so both copies name the same
member: the second must be that member's rejoin, never a second member."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from harness import RawGroup

from rcoord import Errors
from rcoord.protocol.join import JoinGroupResult, JoinRequest

GROUP = "resent"
T0 = 1_000_000
SESSION_MS = 10_000


def join_args(*, static: str | None = None, member_id: str = "") -> list[Any]:
    """One JoinGroup's arguments, built once: a resend sends these same ones (same UUID)."""
    return JoinRequest.build(
        GROUP, member_id, protocol_type="consumer", protocols=[("range", b"meta")],
        session_timeout_ms=SESSION_MS, rebalance_timeout_ms=SESSION_MS,
        group_instance_id=static, client_id="c", client_host="",
        require_known_member_id=False, reason=None).args()


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
