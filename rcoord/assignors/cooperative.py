"""KIP-429's rule for cooperative rebalancing: a partition never moves owner-to-owner in one round.

With the cooperative protocol a member keeps consuming what it owns while the group
rebalances. So the leader must not give a partition to a new member while its current owner
still holds it: the owner first revokes it (it is simply missing from the owner's new
assignment), the group rebalances once more, and then the partition, now owned by nobody, is
assigned. ``validate_cooperative_assignment`` is the leader's check of that rule (Kafka's
``ConsumerCoordinator.validateCooperativeAssignment``); ``partitions_transferring_ownership``
finds the partitions a plain assignment would move directly.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from ..errors import RcoordError
from ..protocol.consumer import ConsumerProtocolSubscription
from ..protocol.offsets import TopicPartition
from ._sticky_inputs import cooperative_sticky_member_data, resolve_claims

__all__ = [
    "CooperativeAssignmentError",
    "partitions_transferring_ownership",
    "standing_claims",
    "validate_cooperative_assignment",
]


class CooperativeAssignmentError(RcoordError):
    """An assignment hands a partition to a new member while another member still owns it.

    Raised on the leader before it sends the assignment (Kafka raises IllegalStateException):
    the assignor does not support the cooperative protocol it claims to. ``partitions`` lists
    the offending partitions, sorted.
    """

    def __init__(self, message: str, partitions: list[TopicPartition]) -> None:
        super().__init__(message)
        self.partitions = partitions


def partitions_transferring_ownership(
    owned: Mapping[str, Iterable[TopicPartition]],
    assigned: Mapping[str, Iterable[TopicPartition]],
    standing: Mapping[str, Iterable[TopicPartition]] | None = None,
) -> dict[TopicPartition, str]:
    """``{partition: new member}`` for partitions that some member gains while another loses.

    A member missing from ``assigned`` loses everything it owned; a member missing from
    ``owned`` owned nothing. ``standing`` is what each member's claims come to once conflicts
    are settled (``resolve_claims``; by default ``owned``): a partition outside its member's
    standing claims counts as gained even if the member claimed it, because another claimant
    (a newer generation's, or a rival of the same generation) may still hold it, and must
    revoke it before anyone is given it.
    """
    if standing is None:
        standing = owned
    added: dict[TopicPartition, str] = {}
    revoked: set[TopicPartition] = set()
    for mid, parts in assigned.items():
        mine = set(owned.get(mid, ()))
        new = set(parts)
        for tp in new - set(standing.get(mid, ())):
            added[tp] = mid
        revoked |= mine - new
    for mid, parts in owned.items():
        if mid not in assigned:
            revoked.update(parts)
    return {tp: mid for tp, mid in added.items() if tp in revoked}


def standing_claims(
    members: Mapping[str, ConsumerProtocolSubscription],
    partitions_per_topic: Mapping[str, int],
    generation_in_user_data: bool = True,
) -> dict[str, list[TopicPartition]]:
    """Each member's owned partitions whose claim stands, as cooperative-sticky settles them.

    The leader checks an assignment against these, so that it refuses what cooperative-sticky
    holds back: a partition handed to a claimant whose claim lost (to a newer generation, or to
    a rival of the same generation) while the other claimant may still consume it.
    Generations are the subscriptions'; with ``generation_in_user_data`` (cooperative-sticky's
    own members) a member without one is read as Kafka's cooperative-sticky reads it, from its
    ``user_data``. Another assignor's ``user_data`` is its own: its first bytes read as a
    generation made a plug-in's data beat a real newer generation.
    """
    ids = sorted(members)
    read = ({mid: cooperative_sticky_member_data(sub) for mid, sub in members.items()}
            if generation_in_user_data else members)
    return resolve_claims(ids, read, partitions_per_topic).owned


def validate_cooperative_assignment(
    owned: Mapping[str, Iterable[TopicPartition]],
    assigned: Mapping[str, Iterable[TopicPartition]],
    standing: Mapping[str, Iterable[TopicPartition]] | None = None,
) -> None:
    """Raise ``CooperativeAssignmentError`` if any partition moves directly between members.

    ``owned`` is what each member reported owning in its JoinGroup subscription
    (``owned_partitions``), ``assigned`` the assignment about to be sent, ``standing`` the
    claims that stood (see ``partitions_transferring_ownership``). Returns None when the
    assignment respects KIP-429.
    """
    moving = partitions_transferring_ownership(owned, assigned, standing)
    if moving:
        bad = sorted(moving)
        shown = ", ".join(f"{tp.topic}-{tp.partition} -> {moving[tp]}" for tp in bad[:10])
        more = f" and {len(bad) - 10} more" if len(bad) > 10 else ""
        raise CooperativeAssignmentError(
            "with the cooperative protocol a partition must be revoked by its owner before "
            f"another member gets it, but the assignor moved {shown}{more}; "
            "use an assignor that supports COOPERATIVE (e.g. cooperative-sticky)",
            bad,
        )
