"""Review 73 of the assignors against Kafka's: reproductions of the defects found (no Redis)."""

from __future__ import annotations

import re
from typing import Any

import pytest

from rcoord.assignors import CooperativeAssignmentError, RebalanceProtocol, get_assignor
from rcoord.client.join import leader_assignment
from rcoord.protocol.consumer import ConsumerProtocolSubscription
from rcoord.protocol.join import JoinGroupMember, JoinGroupResult
from rcoord.protocol.offsets import TopicPartition

T0 = [TopicPartition("t0", p) for p in range(4)]


def test_cooperative_general_path_does_not_hand_a_stale_claim_back_before_revocation():
    """B owns t0p0-t0p3 in generation 5; A still claims t0p0, t0p1 from generation 4.

    ``resolve_claims`` gives them to B (the newer generation wins), and balancing then hands
    them back to A, their previous owner. With the cooperative protocol B must revoke them
    first: A may only get them in the following round. The constrained path (C reading t0 too)
    holds them back; the general path (C reading only t1) gives them to A at once, because the
    partitions transferring ownership are computed from the raw claims, in which A "owns" them.
    """
    members = {
        "A": ConsumerProtocolSubscription(["t0"], b"", T0[:2], 4),
        "B": ConsumerProtocolSubscription(["t0"], b"", T0, 5),
        "C": ConsumerProtocolSubscription(["t1"], b"", [TopicPartition("t1", 0)], 5),
    }
    result = get_assignor("cooperative-sticky").assign(members, {"t0": 4, "t1": 1})
    # B keeps what it is not asked to revoke; what it gives up reaches nobody this round.
    given_away = set(T0) - set(result["B"])
    assert not given_away & set(result["A"]), result


def test_cooperative_general_path_holds_back_a_partition_claimed_twice_in_one_generation():
    """A and B both claim t0p0 in generation 5: neither claim stands, and A must revoke it.

    The constrained path (C reading t0 too) gives t0p0 to nobody this round, as Kafka's
    ``ConstrainedAssignmentBuilder`` does (``partitionsWithMultiplePreviousOwners`` always
    transfer). The general path (C reading only t1) gives it to B at once while A still holds
    it, since B's own claim makes it look kept in the raw ``owned_partitions``.
    """
    members = {
        "A": ConsumerProtocolSubscription(["t0"], b"", T0[:2], 5),
        "B": ConsumerProtocolSubscription(["t0"], b"", T0[:1], 5),
        "C": ConsumerProtocolSubscription(["t1"], b"", [], 5),
    }
    result = get_assignor("cooperative-sticky").assign(members, {"t0": 4, "t1": 1})
    assert T0[0] not in result["A"]  # A is told to revoke it...
    assert T0[0] not in result["B"], result  # ...so nobody gets it until A has


STALE = {  # A's claim on t0p0, t0p1 is older than B's
    "A": ConsumerProtocolSubscription(["t0"], b"", T0[:2], 4),
    "B": ConsumerProtocolSubscription(["t0"], b"", T0, 5),
    "C": ConsumerProtocolSubscription(["t1"], b"", [TopicPartition("t1", 0)], 5),
}
TWICE = {  # A and B both claim t0p0 in generation 5
    "A": ConsumerProtocolSubscription(["t0"], b"", T0[:2], 5),
    "B": ConsumerProtocolSubscription(["t0"], b"", T0[:1], 5),
    "C": ConsumerProtocolSubscription(["t1"], b"", [], 5),
}


class Fixed:
    """A plug-in claiming COOPERATIVE that returns ``plan`` whatever it is given."""

    name = "fixed"
    supported_protocols = (RebalanceProtocol.COOPERATIVE,)

    def __init__(self, plan: dict[str, list[TopicPartition]]) -> None:
        self.plan = plan

    def assign(self, members: Any, partitions_per_topic: Any, **kw: Any) -> Any:
        return self.plan


class Counts:
    def partition_counts(self, topics: list[str]) -> dict[str, int]:
        return {"t0": 4, "t1": 1}


def lead(members: dict[str, ConsumerProtocolSubscription], assignor: Any) -> None:
    joined = JoinGroupResult(
        error=0, generation_id=6, protocol_type="consumer",  # type: ignore[arg-type]
        protocol_name=assignor.name, leader_id="A", member_id="A",
        members=[JoinGroupMember(mid, None, sub.encode("kafka")) for mid, sub in members.items()])
    leader_assignment(joined, [assignor], Counts(), lambda call, error_of: call(),  # type: ignore[arg-type]
                      "g", protocol=RebalanceProtocol.COOPERATIVE)


@pytest.mark.parametrize("members, plan", [
    # t0p0 and t0p1 back to A, whose claim lost to B's, in the round B is told to revoke them
    (STALE, {"A": T0[:2], "B": T0[2:], "C": [TopicPartition("t1", 0)]}),
    # t0p0 to B in the round A, claiming it in the same generation, is told to revoke it
    (TWICE, {"A": T0[1:2], "B": T0[:1] + T0[2:], "C": [TopicPartition("t1", 0)]}),
], ids=["stale-claim", "same-generation-claims"])
def test_the_leader_refuses_a_partition_whose_claim_did_not_stand(members, plan):
    """The leader's KIP-429 check counted a partition as kept by any member that claimed it, so
    it let through what cooperative-sticky now holds back; it counts one kept only where the
    claim stood (``resolve_claims``). Cooperative-sticky's own plan passes it."""
    with pytest.raises(CooperativeAssignmentError, match=r"t0-0 -> [AB]"):
        lead(members, Fixed(plan))
    lead(members, get_assignor("cooperative-sticky"))


@pytest.mark.parametrize("key", [("t0", "0"), (b"t0", 0), ("t0", -1)])
def test_partition_racks_with_a_malformed_partition_is_refused(key):
    """``check_partition_racks`` refuses a bare str of racks, yet takes a key whose partition is
    not an int (or a topic that is not a str): such an entry matches no partition, so rack
    awareness is silently off, which is the mistake its checks are there to catch."""
    members = {"A": ConsumerProtocolSubscription(["t0"], rack="a"),
               "B": ConsumerProtocolSubscription(["t0"], rack="b")}
    with pytest.raises((TypeError, ValueError), match=re.escape(repr(key))):
        get_assignor("range").assign(members, {"t0": 2}, partition_racks={key: {"b"}})
