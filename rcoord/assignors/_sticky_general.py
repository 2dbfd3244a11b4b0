"""The sticky assignors' general path, for members with different subscriptions.

Kafka's ``AbstractStickyAssignor.GeneralAssignmentBuilder``:

1. keep every owned partition whose topic the member still subscribes to (Kafka, with rack
   awareness, keeps only those whose replicas are on the member's rack; here one off its rack
   moves in step 2 only to a member on its rack no heavier than its owner, else stays: see
   ``sticky``);
2. give each unassigned partition to the least-loaded member subscribed to its topic (first a
   member on a matching rack, then anyone), ties broken by member id;
3. move partitions from heavier to lighter subscribers until no partition can move to make the
   counts more even: first only the partitions that were unassigned (if nothing had to be
   revoked), then all of them; a partition goes back to its previous owner (from an older
   generation) when that evens the load; the moves are undone unless they improve the balance.

Kafka finds the least-loaded subscriber by scanning a sorted set of all members and checks
"balanced" by scanning every member's every partition, once per partition considered. Here the
same choices come from per-topic heaps keyed by (count, member id), and "balanced" is kept up
to date incrementally: a topic is unbalanced when its lightest subscriber has two fewer
partitions than the heaviest member holding one of its partitions (that lightest member could
take one; see ``_topic_unbalanced``), and a move can only change that for the topics its two
members subscribe to. Those topics are only marked as worth checking again; "balanced" checks
marked topics until it finds one unbalanced (which stays marked) or none is left. So a move
costs O(topics of the two members x log members), not O(partitions), and the topic checks are
paid for when asked, one per answer "unbalanced", not for every topic after every move (a
member reading 100 topics made each of its moves check all 100).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping

from ..protocol.consumer import ConsumerProtocolSubscription
from ..protocol.offsets import TopicPartition
from ._sticky_inputs import Claims, RackInfo


class _Movements:
    """Where each moved partition came from, so a partition that moves back is not "moved".

    Kafka's ``PartitionMovements``: when a partition should go from A to B while some partition
    of the same topic already went from B to A, move that one back instead; the result keeps
    more partitions with their previous owners.
    """

    def __init__(self) -> None:
        self.pair_of: dict[TopicPartition, tuple[str, str]] = {}
        self.by_topic: dict[str, dict[tuple[str, str], set[TopicPartition]]] = {}

    def _remove(self, tp: TopicPartition) -> tuple[str, str]:
        pair = self.pair_of.pop(tp)
        pairs = self.by_topic[tp.topic]
        pairs[pair].discard(tp)
        if not pairs[pair]:
            del pairs[pair]
        if not pairs:
            del self.by_topic[tp.topic]
        return pair

    def _add(self, tp: TopicPartition, pair: tuple[str, str]) -> None:
        self.pair_of[tp] = pair
        self.by_topic.setdefault(tp.topic, {}).setdefault(pair, set()).add(tp)

    def move(self, tp: TopicPartition, old: str, new: str) -> None:
        if tp in self.pair_of:
            src, _ = self._remove(tp)
            if src != new:
                self._add(tp, (src, new))
        else:
            self._add(tp, (old, new))

    def partition_to_move(self, tp: TopicPartition, old: str, new: str) -> TopicPartition:
        pairs = self.by_topic.get(tp.topic)
        if not pairs:
            return tp
        if tp in self.pair_of:
            old = self.pair_of[tp][0]
        reverse = pairs.get((new, old))
        # Kafka takes whichever its hash set yields first; the smallest is deterministic.
        return min(reverse) if reverse else tp


class GeneralAssignment:
    """One run of the general path; ``build()`` returns the assignment.

    ``relocate=False`` leaves every owned partition off its rack with its owner (the baseline
    a run that moved some is compared with); ``relocated`` says whether a run moved any.
    """

    def __init__(
        self,
        ids: list[str],
        members: Mapping[str, ConsumerProtocolSubscription],
        topics: list[str],
        counts: Mapping[str, int],
        claims: Claims,
        racks: RackInfo,
        relocate: bool = True,
    ) -> None:
        self.ids = ids
        self.relocate = relocate
        self.counts = counts
        self.racks = racks
        self.subs: dict[str, list[str]] = {
            mid: [t for t in members[mid].topics if t in counts] for mid in ids
        }
        self.subscribers: dict[str, list[str]] = {t: [] for t in topics}
        for mid in ids:
            for t in self.subs[mid]:
                self.subscribers[t].append(mid)
        # Partitions in Kafka's order: topics with fewer subscribers first, then by name.
        ordered_topics = sorted(topics, key=lambda t: (len(self.subscribers[t]), t))
        self.all_partitions = [TopicPartition(t, p) for t in ordered_topics
                               for p in range(counts[t])]
        self.members = members
        self.claims = claims
        # Insertion-ordered dicts serve as ordered sets: O(1) removal of a moved partition.
        self.assignment: dict[str, dict[TopicPartition, None]] = {
            mid: dict.fromkeys(claims.owned[mid]) for mid in ids
        }
        self.owner: dict[TopicPartition, str] = {}
        self.sizes: dict[str, int] = {}
        self.revocation_required = False
        self.misplaced: dict[TopicPartition, str] = {}  # owned off its rack -> owner
        self.misplaced_moved = False  # by the last _assign_least_loaded
        self.relocated = False  # any misplaced partition moved

    # -- steps 1 and 2 -----------------------------------------------------------------------

    def _previous_owners(self) -> dict[TopicPartition, tuple[str, int]]:
        """Owners from older generations: where a partition goes back to if that evens load."""
        prev: dict[TopicPartition, tuple[str, int]] = {}
        for mid in self.ids:
            sub = self.members[mid]
            if sub.generation_id >= self.claims.max_generation:
                continue
            for tp in sub.owned_partitions:
                if tp not in prev or sub.generation_id > prev[tp][1]:
                    prev[tp] = (mid, sub.generation_id)
        return prev

    def _keep_owned(self) -> set[TopicPartition]:
        """Keep what members own and still subscribe to; note what sits off its rack.

        Kafka revokes an owned partition whose replicas are not on its owner's rack. Here it
        stays, listed in ``misplaced``, and the rack-aware pass moves it only to a member on its
        rack no heavier than its owner (see ``_assign_least_loaded``).
        """
        kept: set[TopicPartition] = set()
        for mid in self.ids:
            mine = self.assignment[mid]
            subscribed = set(self.subs[mid])
            for tp in list(mine):
                if tp.topic not in subscribed:
                    del mine[tp]
                    self.revocation_required = True
                    continue
                if self.racks.mismatch(mid, tp):
                    self.misplaced[tp] = mid
                kept.add(tp)
                self.owner[tp] = mid
        return kept

    def _assign_least_loaded(self, partitions: list[TopicPartition], match_racks: bool
                             ) -> list[TopicPartition]:
        """Each partition to the lightest eligible subscriber; returns those nobody could take.

        A ``misplaced`` partition (owned off its rack) in ``partitions`` moves only to a member
        on one of its racks holding no more partitions than its owner; otherwise it stays. Kafka
        takes every such partition away and gives it to the lightest member on its rack, however
        loaded, and balancing then puts partitions back off their racks: with unequal
        subscriptions the group can cycle between two assignments for ever (each cooperative
        round revoking what the next re-assigns). A move onto a member already heavier than the
        owner, or off the partition's rack, gains nothing lasting.

        A heap entry whose count is out of date is refreshed (counts grow, except an owner's
        when a misplaced partition leaves it, which pushes a fresh entry). A topic's heaps are
        built when one of its partitions first needs them: the sweeps after a move pass a
        handful of partitions, and building every topic's heaps for them cost O(members x
        topics) each time.
        """
        heaps: dict[tuple[str, str | None], list[tuple[int, str]]] = {}
        built: set[str] = set()
        rack_of = self.racks.consumer_racks if match_racks else {}
        left = []
        self.misplaced_moved = False
        for tp in partitions:
            if tp.topic not in built:
                built.add(tp.topic)
                for mid in self.subscribers[tp.topic]:
                    heaps.setdefault((tp.topic, rack_of.get(mid)), []).append(
                        (self.sizes[mid], mid))
                for r in {rack_of.get(mid) for mid in self.subscribers[tp.topic]}:
                    heapq.heapify(heaps[(tp.topic, r)])
            holder = self.misplaced.get(tp) if match_racks else None
            keys: Iterable[tuple[str, str | None]] = [(tp.topic, None)]
            if match_racks:
                keys = [(tp.topic, r) for r in sorted(self.racks.partition_racks.get(tp, ()))]
                if holder is None:
                    keys = [(tp.topic, None), *keys]
            best: tuple[int, str] | None = None
            best_heap: list[tuple[int, str]] | None = None
            for key in keys:
                candidates = heaps.get(key)
                if not candidates:
                    continue
                while candidates[0][0] != self.sizes[candidates[0][1]]:
                    _, stale = heapq.heappop(candidates)
                    heapq.heappush(candidates, (self.sizes[stale], stale))
                if best is None or candidates[0] < best:
                    best, best_heap = candidates[0], candidates
            if holder is not None:
                if best is None or best_heap is None or best[0] > self.sizes[holder]:
                    continue  # it stays with its owner
                del self.assignment[holder][tp]
                del self.misplaced[tp]
                self.sizes[holder] -= 1
                self.revocation_required = self.misplaced_moved = self.relocated = True
                rack = self.racks.consumer_racks.get(holder)
                for t in self.subs[holder]:
                    if (t, rack) in heaps:
                        heapq.heappush(heaps[(t, rack)], (self.sizes[holder], holder))
            elif best is None or best_heap is None:
                left.append(tp)
                continue
            assert best is not None and best_heap is not None
            mid = best[1]
            self.assignment[mid][tp] = None
            self.owner[tp] = mid
            self.sizes[mid] += 1
            heapq.heapreplace(best_heap, (self.sizes[mid], mid))
        return left

    # -- step 3: balancing ---------------------------------------------------------------------

    def build(self) -> dict[str, list[TopicPartition]]:
        prev = self._previous_owners()
        kept = self._keep_owned()
        unassigned = [tp for tp in self.all_partitions if tp not in kept]
        self.sizes = {mid: len(self.assignment[mid]) for mid in self.ids}
        initializing = max(self.sizes.values(), default=0) == 0
        if self.racks.enabled:
            ordered = [tp for tp in self.all_partitions
                       if tp not in kept or (self.relocate and tp in self.misplaced)]
            left = self._assign_least_loaded(ordered, True)
            # A move makes its new owner the heavier one, which may let a partition it holds
            # off its rack move on: sweep until none does (each move is one fewer off its
            # rack), so that the next rebalance does not find the next move of the chain.
            while self.misplaced_moved:
                self._assign_least_loaded(
                    [tp for tp in self.all_partitions if tp in self.misplaced], True)
            self._assign_least_loaded(left, False)
        else:
            self._assign_least_loaded(unassigned, False)

        movable_topics = {t for t, subs in self.subscribers.items() if len(subs) >= 2}
        movable = [tp for tp in self.all_partitions if tp.topic in movable_topics]
        newly_assigned = [tp for tp in unassigned if tp.topic in movable_topics]
        self.active = [mid for mid in self.ids if self._can_participate(mid, movable_topics)]
        before = {mid: dict(self.assignment[mid]) for mid in self.active}
        before_owner = dict(self.owner)
        before_sizes = dict(self.sizes)

        self._start_balancing(movable_topics)
        self.movements = _Movements()
        if not self.revocation_required:
            self._reassign(newly_assigned, prev)
        moved = self._reassign(movable, prev)
        if not initializing and moved and (
                self.balance_score(self.sizes[m] for m in self.active)
                >= self.balance_score(before_sizes[m] for m in self.active)):
            for mid in self.active:
                self.assignment[mid] = before[mid]
            self.owner = before_owner
            self.sizes = before_sizes
        return {mid: sorted(self.assignment[mid]) for mid in self.ids}

    def _can_participate(self, mid: str, movable_topics: set[str]) -> bool:
        """A member whose load could change: it lacks partitions it could have, or shares."""
        capacity = sum(self.counts[t] for t in self.subs[mid])
        if self.sizes[mid] < capacity:
            return True
        return any(tp.topic in movable_topics for tp in self.assignment[mid])

    @staticmethod
    def balance_score(sizes: Iterable[int]) -> int:
        """Kafka's score: the sum of |a - b| over all pairs of members (0 = perfectly even)."""
        ordered = sorted(sizes)
        n = len(ordered)
        return sum(size * (2 * i - n + 1) for i, size in enumerate(ordered))

    def _start_balancing(self, movable_topics: set[str]) -> None:
        """Set up what makes each step cheap: who holds what, and the unbalanced topics.

        A topic's heaps are built when a step first asks about it (``_light_heap``,
        ``_heavy_heap``), from the counts at that time: a group that is already balanced, as
        in the leader's replayed rounds, asks about none.
        """
        self.light: dict[str, list[tuple[int, str]]] = {}  # topic -> (count, member) min-heap
        self.heavy: dict[str, list[tuple[int, str]]] = {}  # topic -> (-count, member) max-heap
        self.holding: dict[str, dict[str, int]] = {}  # topic -> member -> partitions of it held
        for t in movable_topics:
            self.holding[t] = {}
        for mid in self.active:
            for tp in self.assignment[mid]:
                if tp.topic in self.holding:
                    held = self.holding[tp.topic]
                    held[mid] = held.get(mid, 0) + 1
        self.movable_of = {mid: [t for t in self.subs[mid] if t in movable_topics]
                           for mid in self.ids}
        self.size_counts: dict[int, int] = {}
        for mid in self.active:
            self.size_counts[self.sizes[mid]] = self.size_counts.get(self.sizes[mid], 0) + 1
        # Topics that may be unbalanced: every topic that is, and some that no longer are.
        self.unbalanced = set(movable_topics)

    def _light_heap(self, topic: str) -> list[tuple[int, str]]:
        heap = self.light.get(topic)
        if heap is None:
            heap = self.light[topic] = [(self.sizes[m], m) for m in self.subscribers[topic]]
            heapq.heapify(heap)
        return heap

    def _heavy_heap(self, topic: str) -> list[tuple[int, str]]:
        heap = self.heavy.get(topic)
        if heap is None:
            heap = self.heavy[topic] = [(-self.sizes[m], m)
                                        for m, n in self.holding[topic].items() if n]
            heapq.heapify(heap)
        return heap

    def _lightest(self, topic: str) -> str:
        """The topic's lightest subscriber (then smallest id).

        Every subscriber has an entry no larger than its count (``_resize`` pushes one when a
        count falls; a rise leaves the old, smaller entry, refreshed here when it comes up), so
        a top entry matching its member's count is the true minimum.
        """
        heap = self._light_heap(topic)
        while True:
            size, mid = heap[0]
            actual = self.sizes[mid]
            if size == actual:
                return mid
            if size > actual:
                heapq.heappop(heap)  # a smaller entry of that member is further down
            else:
                heapq.heapreplace(heap, (actual, mid))

    def _heaviest_size(self, topic: str) -> int:
        """The count of the heaviest member holding a partition of ``topic`` (0 if none).

        The mirror of ``_lightest``: every holder has an entry no smaller than its count
        (pushed when a count rises or a member starts holding the topic).
        """
        heap = self._heavy_heap(topic)
        held = self.holding[topic]
        while heap:
            size, mid = heap[0]
            actual = self.sizes[mid]
            if -size == actual and held.get(mid, 0):
                return actual
            if -size > actual and held.get(mid, 0):
                heapq.heapreplace(heap, (-actual, mid))
            else:
                heapq.heappop(heap)
        return 0

    def _topic_unbalanced(self, topic: str) -> bool:
        """Some subscriber could take a partition of ``topic`` from a member 2+ heavier.

        This is Kafka's ``isBalanced`` test restricted to one topic. The lightest subscriber
        cannot already hold all of the topic if someone 2+ heavier holds part of it, so it is
        the member that could take one.
        """
        return self.sizes[self._lightest(topic)] + 1 < self._heaviest_size(topic)

    def _balanced(self) -> bool:
        if not self.size_counts:
            return True
        if max(self.size_counts) - min(self.size_counts) <= 1:
            return True
        # Drop marked topics found balanced; stop at the first unbalanced one, leaving it
        # marked. Which one is checked first changes the cost, never the answer.
        while self.unbalanced:
            topic = self.unbalanced.pop()
            if self._topic_unbalanced(topic):
                self.unbalanced.add(topic)
                return False
        return True

    def _resize(self, mid: str, delta: int) -> None:
        old = self.sizes[mid]
        self.size_counts[old] -= 1
        if not self.size_counts[old]:
            del self.size_counts[old]
        self.sizes[mid] = old + delta
        self.size_counts[old + delta] = self.size_counts.get(old + delta, 0) + 1
        # Only the entries a stale one could hide are pushed (see ``_lightest``): lighter
        # in the topics it reads, heavier in those it holds.
        # Heaps not built yet will be built from the counts of their time.
        if delta < 0:
            for t in self.movable_of[mid]:
                if t in self.light:
                    heapq.heappush(self.light[t], (old + delta, mid))
        else:
            for t in self.movable_of[mid]:
                if t in self.heavy and self.holding[t].get(mid, 0):
                    heapq.heappush(self.heavy[t], (-(old + delta), mid))

    def _reassign(self, partitions: list[TopicPartition],
                  prev: Mapping[TopicPartition, tuple[str, int]]) -> bool:
        """Kafka's ``performReassignments``: sweep until a sweep moves nothing."""
        performed = False
        modified = True
        while modified:
            modified = False
            for tp in partitions:
                if self._balanced():
                    break
                current = self.owner[tp]
                previous = prev.get(tp)
                if previous is not None:
                    back = previous[0]
                    # Kafka assumes the previous owner still takes part and subscribes.
                    if (back in self.subs and tp.topic in self.subs[back] and back in self.sizes
                            and self.sizes[current] > self.sizes[back] + 1):
                        self._move(tp, back)
                        performed = modified = True
                        continue
                target = self._lightest(tp.topic)
                if self.sizes[current] > self.sizes[target] + 1:
                    self._move(tp, target)
                    performed = modified = True
        return performed

    def _move(self, tp: TopicPartition, new: str) -> None:
        actual = self.movements.partition_to_move(tp, self.owner[tp], new)
        old = self.owner[actual]
        self.movements.move(actual, old, new)
        del self.assignment[old][actual]
        self.assignment[new][actual] = None
        self.owner[actual] = new
        held = self.holding[actual.topic]
        held[old] -= 1
        held[new] = held.get(new, 0) + 1
        if held[new] == 1 and actual.topic in self.heavy:
            heapq.heappush(self.heavy[actual.topic], (-self.sizes[new], new))
        self._resize(old, -1)
        self._resize(new, +1)
        self.unbalanced.update(self.movable_of[old])
        self.unbalanced.update(self.movable_of[new])
