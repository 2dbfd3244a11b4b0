"""The sticky assignors' fast path, when every member subscribes to the same topics.

Kafka's ``AbstractStickyAssignor.ConstrainedAssignmentBuilder``. With identical subscriptions
the balanced counts are known up front: ``total // members`` each (``min_quota``), and exactly
``total % members`` members get one more (``max_quota``). So the algorithm is linear:

1. each member keeps its owned partitions up to its quota (fewer than ``min_quota``: all of
   them; otherwise ``max_quota`` while members with an extra partition are still wanted, else
   ``min_quota``); what it gives up may be revoked;
2. with rack awareness, unassigned partitions go round-robin to under-quota members on a rack
   holding a replica;
3. the rest go round-robin to the members still under quota, then to members at ``min_quota``
   that may take the last extras.

A partition given to a member other than the one that gave it up is "transferring ownership":
the cooperative assignor must leave it out of this round (KIP-429).
"""

from __future__ import annotations

from collections.abc import Mapping

from ..protocol.offsets import TopicPartition
from ._sticky_inputs import Claims, RackInfo


class ConstrainedAssignment:
    """One run of the fast path; ``build()`` returns the assignment, ``transferring`` the moves."""

    def __init__(
        self,
        ids: list[str],
        topics: list[str],
        counts: Mapping[str, int],
        claims: Claims,
        racks: RackInfo,
    ) -> None:
        self.ids = ids
        self.topics = topics
        self.counts = counts
        self.claims = claims
        self.racks = racks
        total = sum(counts[t] for t in topics)
        self.min_quota, self.expected_over_min = divmod(total, len(ids))
        self.max_quota = self.min_quota + (1 if self.expected_over_min else 0)
        self.current_over_min = 0
        self.assignment: dict[str, list[TopicPartition]] = {mid: [] for mid in ids}
        self.maybe_revoked: dict[TopicPartition, str] = {}
        self.transferring: dict[TopicPartition, str] = {}
        self.under_min: list[str] = []  # members below min_quota
        self.at_min: list[str] = []  # members at min_quota that may still take an extra

    def build(self) -> dict[str, list[TopicPartition]]:
        assigned = self._keep_owned()
        unassigned = [
            TopicPartition(t, p)
            for t in self.topics
            for p in range(self.counts[t])
            if TopicPartition(t, p) not in assigned
        ]
        self.under_min.sort()
        self.at_min.sort()
        unassigned = self.racks.sort_by_scarcity(unassigned)
        unassigned = self._assign_rack_aware_round_robin(unassigned)
        self._assign_round_robin(unassigned)
        return self.assignment

    def _wants_extra(self) -> bool:
        return self.current_over_min < self.expected_over_min

    def _keep_owned(self) -> set[TopicPartition]:
        assigned: set[TopicPartition] = set()
        for mid in self.ids:
            owned = []
            for tp in self.claims.owned[mid]:
                if self.racks.mismatch(mid, tp):
                    self.maybe_revoked[tp] = mid
                else:
                    owned.append(tp)
            # Kafka keeps the lowest partition numbers first, across topics.
            owned.sort(key=lambda tp: (tp.partition, tp.topic))
            owned = [tp for tp in owned if tp not in self.claims.contested]
            mine = self.assignment[mid]
            if len(owned) < self.min_quota:
                self.under_min.append(mid)
                keep = len(owned)
            elif len(owned) >= self.max_quota and self._wants_extra():
                self.current_over_min += 1
                if not self._wants_extra():
                    self.at_min.clear()
                keep = self.max_quota
            else:
                keep = self.min_quota
                if self._wants_extra():
                    self.at_min.append(mid)
            mine.extend(owned[:keep])
            assigned.update(owned[:keep])
            for tp in owned[keep:]:
                self.maybe_revoked[tp] = mid
        return assigned

    def _assign_new(self, tp: TopicPartition, mid: str) -> int:
        mine = self.assignment[mid]
        mine.append(tp)
        previous = self.maybe_revoked.get(tp)
        if (previous is not None and previous != mid) or tp in self.claims.contested:
            self.transferring[tp] = mid
        return len(mine)

    def _assign_rack_aware_round_robin(
        self, unassigned: list[TopicPartition]
    ) -> list[TopicPartition]:
        """Round robin within racks, up to the quotas; returns the partitions left over."""
        if not self.racks.enabled:
            return unassigned
        left: list[TopicPartition] = []
        next_index = 0
        for tp in unassigned:
            chosen = None
            index = self.racks.next_rack_consumer(tp, self.under_min, next_index)
            if index >= 0:
                chosen = self.under_min[index]
                count = len(self.assignment[chosen]) + 1
                if count >= self.min_quota:
                    del self.under_min[index]
                    if count < self.max_quota and self._wants_extra():
                        self.at_min.append(chosen)
                else:
                    index += 1
                next_index = index % len(self.under_min) if self.under_min else 0
            elif self.at_min:
                first = self.racks.next_rack_consumer(tp, self.at_min, 0)
                if first >= 0:
                    chosen = self.at_min[first]
                    if len(self.assignment[chosen]) + 1 == self.max_quota:
                        del self.at_min[first]
                        self.current_over_min += 1
                        if not self._wants_extra():
                            self.at_min.clear()
            if chosen is None:
                left.append(tp)
            else:
                self._assign_new(tp, chosen)
        return left

    def _assign_round_robin(self, unassigned: list[TopicPartition]) -> None:
        """Deal the rest to under-quota members in turn, then the extras to members at min."""
        cursor = 0  # position of Kafka's iterator over under_min
        for tp in unassigned:
            from_under = True
            if cursor < len(self.under_min):
                mid = self.under_min[cursor]
                cursor += 1
            elif not self.under_min:
                if not self.at_min:
                    raise AssertionError(f"sticky: no member can take {tp} (quota bug)")
                mid = self.at_min.pop(0)
                from_under = False
            else:
                mid = self.under_min[0]
                cursor = 1
            count = self._assign_new(tp, mid)
            if count == self.min_quota and from_under:
                del self.under_min[cursor - 1]
                cursor -= 1
                self.at_min.append(mid)
            elif count == self.max_quota:
                self.current_over_min += 1
