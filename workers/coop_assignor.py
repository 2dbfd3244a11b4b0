"""A small cooperative assignor for the workers, tests and bench of the client's cooperative
protocol, until ``rcoord.assignors`` registers the real ``cooperative-sticky``.

``install()`` registers it under ``cooperative-sticky`` only if that name is free, so once the
real assignor exists the workers use it unchanged. The stand-in is deliberately simple, but it
keeps the two rules the client relies on:

* **sticky while balanced**: a member keeps the partitions it owns, up to its quota
  (``n // m``, one more for the first ``n % m`` members by partitions owned, then member id);
* **KIP-429's adjustment**: a partition its owner gives up this round is left unassigned, and
  only unowned partitions are dealt to members below their quota. The owner revokes it and
  rejoins; in that next round the partition is unowned and goes to its new owner.

With 12 partitions over three members and a fourth joining: round 1 leaves each of the three
with 3 and withholds 3; round 2 gives those 3 to the newcomer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rcoord.assignors import ASSIGNORS, RebalanceProtocol, register_assignor
from rcoord.protocol.consumer import ConsumerProtocolSubscription
from rcoord.protocol.offsets import TopicPartition

NAME = "cooperative-sticky"


class StandInCooperativeAssignor:
    """Sticky-while-balanced with KIP-429's withholding; see the module docstring."""

    supported_protocols = (RebalanceProtocol.COOPERATIVE, RebalanceProtocol.EAGER)

    def __init__(self, name: str = NAME, *, withhold: bool = True) -> None:
        self.name = name
        self.withhold = withhold  # False: moves partitions directly (breaks the protocol; tests)

    def assign(
        self,
        members: Mapping[str, ConsumerProtocolSubscription],
        partitions_per_topic: Mapping[str, int],
        *,
        member_order: Sequence[str] | None = None,
        partition_racks: Any = None,
    ) -> dict[str, list[TopicPartition]]:
        topics = sorted({t for s in members.values() for t in s.topics} & set(partitions_per_topic))
        every = [TopicPartition(t, p) for t in topics for p in range(partitions_per_topic[t])]
        valid = set(every)
        owner: dict[TopicPartition, str] = {}
        for mid in sorted(members):
            for tp in members[mid].owned_partitions:
                if tp in valid and tp not in owner:  # the first claim wins (ids sorted)
                    owner[tp] = mid
        owned = {mid: sorted(tp for tp, m in owner.items() if m == mid) for mid in members}
        order = sorted(members, key=lambda m: (-len(owned[m]), m))
        base, extra = divmod(len(every), max(1, len(members)))
        quota = {m: base + (1 if i < extra else 0) for i, m in enumerate(order)}
        result = {m: owned[m][: quota[m]] for m in members}
        kept = {tp for parts in result.values() for tp in parts}
        free = [tp for tp in every if tp not in kept and (tp not in owner or not self.withhold)]
        for m in order:
            while len(result[m]) < quota[m] and free:
                result[m].append(free.pop(0))
        return {m: sorted(parts) for m, parts in result.items()}


def install() -> None:
    """Register the stand-in as ``cooperative-sticky`` unless a real one is registered."""
    if NAME not in ASSIGNORS:
        register_assignor(StandInCooperativeAssignor())
