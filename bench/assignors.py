"""Assignor cost and stickiness: time for 1,000 members x 10,000 partitions, partitions moved.

For every registered assignor:

* the time of one ``assign`` for 1,000 members and 10,000 partitions, as one topic and as 100
  topics of 100 (fresh group, then the rebalance after one member leaves, with the previous
  assignment fed back as ``owned_partitions``; the best of ``--repeat`` runs);
* how many partitions change owner when one member of 100 leaves, and when one joins
  (1,000 partitions in 10 topics). The minimum is what the leaver owned (10), or what the
  joiner must get (9-10). For cooperative-sticky the figure is over both rounds of the
  incremental rebalance (the first round holds the moving partitions back).

A second table times the paths the first does not reach, at the same size (1,000 members,
10,000 partitions in 100 topics):

* *different subscriptions: fresh* -- member ``i`` subscribes to 50 of the 100 topics, starting
  at topic ``i mod 100``; nobody owns anything yet (the sticky assignors' general path);
* *different subscriptions: 999 join 1 owner of all* -- the general path with owned
  partitions, at its worst: ``member-0000`` subscribes to all 100 topics and owns all 10,000
  partitions (the assignor's own result for it alone, as when one member starts first or the
  group grows back from one), and members 1-999, subscribed as above, join. About 9,990
  partitions must move off an owner that keeps them (all but its fair share of 10), the most
  any rebalance of this size can need; when half the members are new or re-subscribed, fewer
  move and it takes less. One run, not the best of
  ``--repeat`` (the sticky pair take seconds here); for cooperative-sticky this is the first
  round of the incremental rebalance;
* *with racks: fresh* -- 3 racks; member ``i`` in rack ``i mod 3``; each partition held in one
  rack: KIP-881 for range and the sticky pair, zones for rack-affinity;
* *different subscriptions with racks* -- the two "different subscriptions" cases with those
  racks: the sticky pair's general path with racks, where the leader replays the following
  rounds (and cooperative-sticky the assign round after one that holds partitions back) until
  the result repeats. One run each.

Pure Python, no Redis. Run: ``python bench/assignors.py`` (``--repeat N``). Prints two tables
and a note.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rcoord.assignors import ASSIGNORS, get_assignor
from rcoord.protocol.consumer import ConsumerProtocolSubscription
from rcoord.protocol.offsets import TopicPartition

Assignment = dict[str, list[TopicPartition]]


def group(n: int, topics: list[str], owned: Mapping[str, list[TopicPartition]] | None = None,
          generation: int = 1) -> dict[str, ConsumerProtocolSubscription]:
    owned = owned or {}
    return {f"member-{i:04d}": ConsumerProtocolSubscription(
        topics, owned_partitions=owned.get(f"member-{i:04d}", ()),
        generation_id=generation if owned else -1) for i in range(n)}


def timed(name: str, members: dict[str, ConsumerProtocolSubscription],
          counts: dict[str, int], repeat: int) -> tuple[float, Assignment]:
    assignor = get_assignor(name)
    best, result = float("inf"), {}
    for _ in range(repeat):
        start = time.perf_counter()
        result = assignor.assign(members, counts)
        best = min(best, time.perf_counter() - start)
    return best, result


def settle(name: str, members: dict[str, ConsumerProtocolSubscription],
           counts: dict[str, int], generation: int) -> Assignment:
    """Assign; for a cooperative assignor, rejoin once more with what each member kept."""
    assignor = get_assignor(name)
    result = assignor.assign(members, counts)
    if name == "cooperative-sticky":
        members = {m: ConsumerProtocolSubscription(s.topics, owned_partitions=result[m],
                                                   generation_id=generation + 1)
                   for m, s in members.items()}
        result = assignor.assign(members, counts)
    return result


def moved(before: Assignment, after: Assignment) -> int:
    owner = {tp: m for m, parts in before.items() for tp in parts}
    return sum(1 for m, parts in after.items() for tp in parts if owner.get(tp) != m)


def churn(name: str) -> tuple[int, int]:
    topics = [f"t{i}" for i in range(10)]
    counts = dict.fromkeys(topics, 100)
    start = settle(name, group(100, topics), counts, 1)
    stayers = group(100, topics, start, 1)
    del stayers["member-0042"]
    left = settle(name, stayers, counts, 1)
    grown = group(100, topics, start, 1)
    grown["member-0100"] = ConsumerProtocolSubscription(topics)
    joined = settle(name, grown, counts, 1)
    return moved(start, left), moved(start, joined)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    shapes = {"1 topic": {"t": 10_000}, "100 topics": {f"t{i:03d}": 100 for i in range(100)}}
    print("| assignor | 1 topic: fresh | 1 topic: after a leave | 100 topics: fresh "
          "| 100 topics: after a leave | moved, 1 of 100 leaves | moved, 1 joins 100 |")
    print("|---|---|---|---|---|---|---|")
    for name in sorted(ASSIGNORS):
        cells = []
        for counts in shapes.values():
            topics = sorted(counts)
            fresh_s, fresh = timed(name, group(1000, topics), counts, args.repeat)
            stayers = group(1000, topics, fresh)
            del stayers["member-0500"]
            again_s, _ = timed(name, stayers, counts, args.repeat)
            cells += [f"{fresh_s * 1000:.0f} ms", f"{again_s * 1000:.0f} ms"]
        leave, join = churn(name)
        print(f"| {name} | " + " | ".join(cells) + f" | {leave} | {join} |")
    print()
    topics = [f"t{i:03d}" for i in range(100)]
    counts = {t: 100 for t in topics}
    mixed = {f"member-{i:04d}": ConsumerProtocolSubscription(
        [topics[(i + k) % 100] for k in range(50)]) for i in range(1000)}
    racked = {f"member-{i:04d}": ConsumerProtocolSubscription(topics, rack=f"r{i % 3}")
              for i in range(1000)}
    racks = {TopicPartition(t, p): {f"r{(hash_of(t) + p) % 3}"} for t in topics for p in range(100)}
    mixed_racked = {m: ConsumerProtocolSubscription(sub.topics, rack=f"r{i % 3}")
                    for i, (m, sub) in enumerate(mixed.items())}
    print("| assignor | different subscriptions: fresh "
          "| different subscriptions: 999 join 1 owner of all (1 run) | with racks: fresh "
          "| different subscriptions with racks: fresh (1 run) | ... 999 join 1 owner (1 run) |")
    print("|---|---|---|---|---|---|")
    for name in sorted(ASSIGNORS):
        assignor = get_assignor(name)
        mixed_s, mixed_out = timed(name, mixed, counts, args.repeat)
        check_valid(mixed, counts, mixed_out)
        alone = {"member-0000": ConsumerProtocolSubscription(topics)}
        owned = settle(name, alone, counts, 1)["member-0000"]
        joining = dict(mixed, **{"member-0000": ConsumerProtocolSubscription(
            topics, owned_partitions=owned, generation_id=2)})
        join_s, join_out = timed(name, joining, counts, 1)
        # cooperative-sticky's first round holds back the moving partitions: not all assigned.
        check_valid(joining, counts, join_out, complete=name != "cooperative-sticky")
        best = float("inf")
        for _ in range(args.repeat):
            start = time.perf_counter()
            racked_out = assignor.assign(racked, counts, partition_racks=racks)  # type: ignore[call-arg]
            best = min(best, time.perf_counter() - start)
        check_valid(racked, counts, racked_out)
        start = time.perf_counter()
        out = assignor.assign(mixed_racked, counts, partition_racks=racks)  # type: ignore[call-arg]
        mixed_racked_s = time.perf_counter() - start
        check_valid(mixed_racked, counts, out)
        alone = {"member-0000": ConsumerProtocolSubscription(topics, rack="r0")}
        out = assignor.assign(alone, counts, partition_racks=racks)  # type: ignore[call-arg]
        owned = out["member-0000"]
        joining = dict(mixed_racked, **{"member-0000": ConsumerProtocolSubscription(
            topics, owned_partitions=owned, generation_id=2, rack="r0")})
        start = time.perf_counter()
        out = assignor.assign(joining, counts, partition_racks=racks)  # type: ignore[call-arg]
        join_racked_s = time.perf_counter() - start
        check_valid(joining, counts, out, complete=name != "cooperative-sticky")
        print(f"| {name} | {mixed_s * 1000:.0f} ms | {join_s * 1000:.0f} ms "
              f"| {best * 1000:.0f} ms | {mixed_racked_s * 1000:.0f} ms "
              f"| {join_racked_s * 1000:.0f} ms |")
    print()
    print("Fresh columns: best of --repeat runs. 999 join 1 owner of all: one run; member-0000 "
          "owns all 10,000 partitions (all 100 topics), members 1-999 join with 50 topics each, "
          "so about 9,990 partitions move off their owner: the general path's worst case with "
          "owned partitions (cooperative-sticky: first round).")


def hash_of(topic: str) -> int:
    """A stable small number per topic (Python's str hash is salted per process)."""
    return sum(topic.encode())


def check_valid(members: Mapping[str, ConsumerProtocolSubscription], counts: Mapping[str, int],
                result: Assignment, complete: bool = True) -> None:
    """Each partition of a subscribed topic exactly once (at most once unless ``complete``),
    only to a subscriber."""
    seen: set[TopicPartition] = set()
    for member, parts in result.items():
        for tp in parts:
            if tp in seen or tp.topic not in members[member].topics:
                raise SystemExit(f"invalid assignment: {tp} to {member}")
            seen.add(tp)
    wanted = {TopicPartition(t, p) for sub in members.values() for t in sub.topics
              for p in range(counts[t])}
    if seen - wanted or (complete and seen != wanted):
        raise SystemExit(f"{len(wanted - seen)} partitions unassigned")


if __name__ == "__main__":
    main()
