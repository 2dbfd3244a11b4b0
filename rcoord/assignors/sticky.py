"""Kafka's StickyAssignor and CooperativeStickyAssignor.

Both compute the same assignment (Kafka's ``AbstractStickyAssignor``): as balanced as the
subscriptions allow, and, within that, moving as few previously owned partitions as possible.
They differ in the rebalance protocol:

* ``sticky`` is EAGER: every member revokes everything before it rejoins, so the assignment is
  handed out whole.
* ``cooperative-sticky`` supports COOPERATIVE (KIP-429) and EAGER: a partition moving from one
  current owner to another is left out of this round; the owner revokes it, the group
  rebalances again, and the next round assigns it. Members keep consuming everything else.

What a member owned, and in which generation, each assignor reads as Kafka's does
(``memberData``):

* ``cooperative-sticky``: the subscription's ``owned_partitions`` and ``generation_id``
  (KIP-429, KIP-792). A subscription without a generation (below v2, or reset to -1) falls back
  to the generation Kafka's CooperativeStickyAssignor keeps in ``user_data`` (one int32).
* ``sticky``: the previous assignment and generation Kafka's StickyAssignor keeps in
  ``user_data``, because an eager member has already revoked everything (and so reports no
  owned partitions) when it rejoins. rcoord's own members write it as Kafka's do
  (``StickyAssignor.subscription_user_data``); without it, the subscription's fields are used.

``user_data`` that does not decode never fails the assignment: the member counts as holding
no generation (and, for ``sticky``, nothing).

Where Kafka's result depends on hash-map iteration order, members and topics are visited in
sorted order, so every leader computes the same assignment.

Departure from Kafka, with racks and unequal subscriptions (the general path only; with no
member rack, or no partition rack, results are Kafka's). Kafka's ``AbstractStickyAssignor``
revokes every owned partition that has no replica on its owner's rack and gives it to the
lightest member on its rack; balancing, which ranks above racks (KIP-881), then puts
partitions back off their racks, and the next rebalance does it again. Some groups never
settle: a member on rack r0 that reads only a topic with no partition on r0 loses its
partition every other generation, the cooperative protocol leaves it unread in between, and
the group rebalances for ever (Kafka's own assignor cycles on the same input). rcoord's rule:

* an owned partition off its rack stays with its owner unless a member on one of its racks
  holding no more partitions than the owner takes it (a move to another wrong rack, or onto a
  member already heavier, gains nothing but churn);
* those moves are kept only if, after balancing, fewer partitions are off their racks than
  when nothing moves, and balance is no worse;
* the leader plays the following rounds itself (feeding its result back as what members own,
  up to ``_SETTLE_ROUNDS`` times) until the result repeats, so that the group's next rebalance
  has nothing more to move: eager settles in one rebalance;
* cooperative-sticky also plays the assign round that follows a round holding partitions
  back: that round starts from what members kept and places the held-back partitions afresh,
  not necessarily where the leader meant them to go, and if it would then take a kept
  partition from its member, the leader aims this round at that round's result instead (up
  to ``_PLAN_ROUNDS`` times). Cooperative groups so mostly settle in the usual
  revoke-then-assign pair; after a leave or a join, about 1 random group of 2-8 members in
  1,000 and 1 of 10-30 members in 25 take one round more (3 % and 42 % did before the assign
  round was played; Kafka without racks needs one more too, more rarely).

Balance is Kafka's either way; only which partition sits where changes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..protocol.consumer import ConsumerProtocolSubscription
from ..protocol.kafka_consumer import encode_sticky_user_data
from ..protocol.offsets import TopicPartition
from ._base import (
    RebalanceProtocol,
    check_inputs,
    check_partition_racks,
    java_order,
    subscribed_known_topics,
)
from ._sticky_constrained import ConstrainedAssignment
from ._sticky_general import GeneralAssignment
from ._sticky_inputs import (
    Claims,
    MemberData,
    RackInfo,
    cooperative_sticky_member_data,
    resolve_claims,
    sticky_member_data,
    subscription_member_data,
)
from .cooperative import partitions_transferring_ownership

__all__ = ["CooperativeStickyAssignor", "StickyAssignor", "sticky_assignment"]


def sticky_assignment(
    members: Mapping[str, ConsumerProtocolSubscription],
    partitions_per_topic: Mapping[str, int],
    member_order: Sequence[str] | None = None,
    partition_racks: Mapping[TopicPartition, Any] | None = None,
    *,
    member_data: MemberData = subscription_member_data,
    plan_assign_round: bool = False,
) -> tuple[dict[str, list[TopicPartition]], dict[TopicPartition, str]]:
    """The sticky assignment, and the partitions it moves from one owner to another.

    The second value maps each partition the assignment gives to a member other than the one
    that owns it to its new member. What a member owns, and in which generation, is what
    ``member_data`` reads from its subscription (by default its ``owned_partitions`` and
    ``generation_id``; the assignors pass their Kafka counterpart's reading).
    """
    order = check_inputs(members, partitions_per_topic, member_order)
    members = {mid: member_data(sub) for mid, sub in members.items()}
    racks = check_partition_racks(partition_racks)
    topics = subscribed_known_topics(members, partitions_per_topic)
    counts = {t: partitions_per_topic[t] for t in topics}
    if not members:
        return {}, {}
    # The algorithm compares member ids (sorted visits, ties between equally loaded members),
    # and Kafka compares them as Java strings (``java_order``). It runs on stand-in names that
    # sort the same way in Python, and its result is given back under the real ids.
    real = dict(enumerate(sorted(members, key=java_order)))
    alias = {mid: f"{i:010d}" for i, mid in real.items()}
    built, moving = _assign(sorted(alias.values()),
                            {alias[mid]: data for mid, data in members.items()},
                            topics, counts, racks, plan_assign_round)
    return ({mid: sorted(built[alias[mid]]) for mid in order},
            {tp: real[int(a)] for tp, a in moving.items()})


def _assign(ids: list[str], members: Mapping[str, Any], topics: list[str],
            counts: Mapping[str, int], racks: Any, plan_assign_round: bool = False
            ) -> tuple[dict[str, list[TopicPartition]], dict[TopicPartition, str]]:
    claims = resolve_claims(ids, members, counts)
    all_partitions = [TopicPartition(t, p) for t in topics for p in range(counts[t])]
    rack_info = RackInfo(members, all_partitions, racks)
    if claims.all_equal:
        builder = ConstrainedAssignment(ids, topics, counts, claims, rack_info)
        built = builder.build()
        moving = builder.transferring
    else:
        generation = claims.max_generation + 1
        built = _settle(ids, members, topics, counts, claims, rack_info, generation)
        owned = {mid: members[mid].owned_partitions for mid in ids}
        # A partition whose claim did not stand (a stale or a doubled one) is not kept by its
        # claimant: like the constrained path, wait for its holder to revoke it.
        moving = partitions_transferring_ownership(owned, built, claims.owned)
        for _ in range(_PLAN_ROUNDS if plan_assign_round and rack_info.enabled else 0):
            if not moving:
                break
            # The cooperative protocol holds ``moving`` back this round; the next round starts
            # from what is kept and places the held-back partitions afresh, not necessarily
            # where this round meant them to go. If the settled result of that round would
            # take a kept partition from its member (a third round, or more, would follow),
            # aim this round at that result instead: the next round then mostly repeats it.
            kept = {mid: [tp for tp in built[mid] if moving.get(tp) != mid] for mid in ids}
            fed = _fed(ids, members, kept, generation)
            following = _settle(ids, fed, topics, counts, resolve_claims(ids, fed, counts),
                                rack_info, generation + 1)
            if not partitions_transferring_ownership(kept, following):
                break
            built = following
            moving = partitions_transferring_ownership(owned, built, claims.owned)
    return built, moving


def _fed(ids: list[str], members: Mapping[str, Any],
         assignment: Mapping[str, list[TopicPartition]], generation: int
         ) -> dict[str, ConsumerProtocolSubscription]:
    """The members as they rejoin after receiving ``assignment`` in ``generation``."""
    return {mid: ConsumerProtocolSubscription(members[mid].topics, b"", assignment[mid],
                                              generation, members[mid].rack)
            for mid in ids}


def _settle(ids: list[str], members: Mapping[str, Any], topics: list[str],
            counts: Mapping[str, int], claims: Claims, rack_info: RackInfo, generation: int
            ) -> dict[str, list[TopicPartition]]:
    """The general path's assignment; with racks, replayed until the next round repeats it."""
    built = _general(ids, members, topics, counts, claims, rack_info)
    settled = {mid: sorted(claims.owned[mid]) for mid in ids}
    for _ in range(_SETTLE_ROUNDS if rack_info.enabled else 0):
        if built == settled:
            break
        # With racks, what moved changes what the next round does (partitions moved onto
        # their racks, balancing putting others off theirs): play the next rounds here, so
        # that the group's next rebalance finds nothing more to move.
        settled = built
        fed = _fed(ids, members, built, generation)
        built = _general(ids, fed, topics, counts, resolve_claims(ids, fed, counts), rack_info)
    return built


_SETTLE_ROUNDS = 16
"""How many following rounds the general path plays itself, with racks, until its result
repeats (see the module docstring). Small groups settle within two; 80 members on 3 racks with
1-8 of 20 topics each often need five or six (each round leaves fewer partitions off their
racks than the one before), and a cap of four left about one such group in seven to move again
at its next rebalance. A round stops the loop as soon as it repeats, so the cap only bounds
the cost of a group that would otherwise keep improving (a round is one or two general-path
runs, a few tenths of a second at 1,000 members x 10,000 partitions)."""

_PLAN_ROUNDS = 3
"""How many times cooperative-sticky, with racks, plays the assign round that follows a round
holding partitions back, aiming this round at that round's result while it would still take a
kept partition from its member (see ``_assign``). Each time costs one settle. Of random leave
and join histories of 10-30 members reading 1-6 of 10 topics on 3 racks, 42 % took a third
round or more before; 14 % with one play, 8 % with two, 4 % with three."""


def _general(ids: list[str], members: Mapping[str, Any], topics: list[str],
             counts: Mapping[str, int], claims: Claims, rack_info: RackInfo
             ) -> dict[str, list[TopicPartition]]:
    """The general path's assignment.

    Moving owned partitions onto their racks only counts if balancing did not put as many
    others off theirs, and did not cost balance: else every owned partition stays where it is
    (the assignment of ``relocate=False``; see the module docstring).
    """
    general = GeneralAssignment(ids, members, topics, counts, claims, rack_info)
    built = general.build()
    if not general.relocated:
        return built
    staying = GeneralAssignment(ids, members, topics, counts, claims, rack_info,
                                relocate=False).build()
    if (_off_rack(staying, rack_info) <= _off_rack(built, rack_info)
            or _spread(built) > _spread(staying)):
        return staying
    return built


def _off_rack(assignment: Mapping[str, list[TopicPartition]], racks: RackInfo) -> int:
    return sum(racks.mismatch(mid, tp) for mid, parts in assignment.items() for tp in parts)


def _spread(assignment: Mapping[str, list[TopicPartition]]) -> int:
    return GeneralAssignment.balance_score(len(parts) for parts in assignment.values())


class StickyAssignor:
    """Kafka's StickyAssignor (EAGER): balanced, and keeping as many owned partitions as it can.

    Three members own t0p0-t0p5 two each; when C2 leaves, C0 and C1 keep theirs and split C2's
    (range and roundrobin would reshuffle everything):

    ======  ===============  =========================
    member  owned (gen 5)    assigned
    ======  ===============  =========================
    C0      t0p0, t0p1       t0p0, t0p1, t0p4
    C1      t0p2, t0p3       t0p2, t0p3, t0p5
    ======  ===============  =========================

    Conflicting claims (two members reporting the same partition) are settled as Kafka does:
    the newer generation wins; two claims of the same generation void the partition for both.
    """

    name = "sticky"
    supported_protocols = (RebalanceProtocol.EAGER,)

    def subscription_user_data(self, assigned: Sequence[TopicPartition],
                               generation: int) -> bytes:
        """What a member sends with its subscription: its last assignment and that
        generation (none before its first), as Kafka's StickyAssignor does. Without it an eager
        member, which revoked everything before rejoining, would give the leader nothing to
        stay sticky to."""
        if generation < 0:
            return b""
        return encode_sticky_user_data(((tp.topic, tp.partition) for tp in assigned), generation)

    def assign(
        self,
        members: Mapping[str, ConsumerProtocolSubscription],
        partitions_per_topic: Mapping[str, int],
        *,
        member_order: Sequence[str] | None = None,
        partition_racks: Mapping[TopicPartition, Any] | None = None,
    ) -> dict[str, list[TopicPartition]]:
        result, _ = sticky_assignment(
            members, partitions_per_topic, member_order, partition_racks,
            member_data=sticky_member_data)
        return result


class CooperativeStickyAssignor:
    """Kafka's CooperativeStickyAssignor: the sticky assignment, minus partitions still owned.

    A partition the sticky assignment moves from one current owner to another is left out of
    this round (KIP-429): its owner sees it missing and revokes it, the group rebalances once
    more, and then it is assigned. C2 joins C0 (owning t0p0-t0p2) and C1 (t0p3-t0p5):

    ======  ===============  ===========  ===========
    member  owned (gen 5)    round 1      round 2
    ======  ===============  ===========  ===========
    C0      t0p0-t0p2        t0p0, t0p1   t0p0, t0p1
    C1      t0p3-t0p5        t0p3, t0p4   t0p3, t0p4
    C2      (none)           (none)       t0p2, t0p5
    ======  ===============  ===========  ===========
    """

    name = "cooperative-sticky"
    supported_protocols = (RebalanceProtocol.COOPERATIVE, RebalanceProtocol.EAGER)

    def assign(
        self,
        members: Mapping[str, ConsumerProtocolSubscription],
        partitions_per_topic: Mapping[str, int],
        *,
        member_order: Sequence[str] | None = None,
        partition_racks: Mapping[TopicPartition, Any] | None = None,
    ) -> dict[str, list[TopicPartition]]:
        result, moving = sticky_assignment(
            members, partitions_per_topic, member_order, partition_racks,
            member_data=cooperative_sticky_member_data, plan_assign_round=True)
        if moving:
            for mid, parts in result.items():
                result[mid] = [tp for tp in parts if moving.get(tp) != mid]
        return result
