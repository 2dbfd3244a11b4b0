"""End to end, with real worker processes: a fourth worker joins a group of three that uses the
cooperative protocol, and the three never stop consuming the partitions they keep.

The workers are ``workers/fault_worker.py`` with ``--assignor cooperative-sticky``; the run uses
the fault suite's scenario harness (server, service, producer, sampler) and its history checker.
What is judged comes from the workers' own files:

* **kept partitions keep flowing**: every partition a worker holds from before the join until
  the end is never revoked or lost, and ``poll()`` returned records of it while the group was
  rebalancing (between the fourth worker's start and the settled assignment). An eager
  rebalance revokes every partition of every member, so it fails both. The longest gap is
  printed, not asserted: on a loaded 2-core machine every process stalls now and then, which no
  protocol can prevent;
* **one owner at a time**: ownership intervals (from ``assigned`` to ``revoked``/``lost``/exit)
  of one partition never overlap between workers, a stronger form of the checker's rule 1,
  which cooperative ``assigned`` events (only what was added) would weaken;
* the fault suite's four rules (``assert_clean``).
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections import defaultdict
from itertools import pairwise
from pathlib import Path
from typing import Any

from faults.history import assert_clean
from harness import wait_until
from test_faults import GROUP, PARTITIONS, TOPIC, WAIT_S, WORKER, Scenario, Worker, _env

HEARTBEAT_MS = 300
SESSION_MS = REBALANCE_MS = 10_000
"""Longer than a worker process may stall on a loaded machine (CI's 2 CPUs beside a JVM). The
test judges every partition's owners, and a worker stalled past a short session had its
partitions dealt to another while it still held them, recording ``lost`` only once it ran
again (an overlap, as the fault suite's SIGSTOP scenario shows on purpose; shown here with a
2 s SIGSTOP of w1 and the 1.5 s session used before). Nothing here waits for either to pass:
the workers leave the group when they are stopped."""


class CoopWorker(Worker):
    """The fault worker with the cooperative-sticky assignor."""

    def __init__(self, sc: Scenario, name: str) -> None:
        self.name = name
        self.history = sc.dir / f"{name}.jsonl"
        self._fh = open(sc.dir / f"{name}.out", "w")  # noqa: SIM115 - open for the process's life
        self.proc = subprocess.Popen(
            [sys.executable, str(WORKER), "--redis-url", sc.url, "--namespace", sc.ns,
             "--group", GROUP, "--topic", TOPIC, "--name", name, "--history", str(self.history),
             "--session-timeout-ms", str(SESSION_MS), "--rebalance-timeout-ms",
             str(REBALANCE_MS), "--heartbeat-interval-ms", str(HEARTBEAT_MS),
             "--assignor", "cooperative-sticky"],
            stdout=self._fh, stderr=subprocess.STDOUT, env=_env(),
        )


def holdings(events: list[dict[str, Any]]) -> dict[str, set[int]]:
    """What each worker holds now, folded from its assigned/revoked/lost events."""
    held: dict[str, set[int]] = defaultdict(set)
    for ev in sorted(events, key=lambda e: e["t"]):
        if ev["e"] == "assigned":
            held[ev["worker"]] |= set(ev["parts"])
        elif ev["e"] in ("revoked", "lost"):
            held[ev["worker"]] -= set(ev["parts"])
    return held


def settled(events: list[dict[str, Any]], names: set[str]) -> bool:
    """Whether the rebalance is over: every worker of ``names`` has taken the same generation,
    and their holdings split the partitions between them, each holding some.

    The holdings alone can look complete in the middle of a cooperative round. A member notes
    what it revokes only when it takes the round's generation, and the others may take theirs
    (with their added partitions) first; until it does, it still holds the partition it is about
    to give up, every partition has one holder, and the next round gives that partition to
    someone else (w1 holds 0-2 while w2 and w3 already took 4 and 3, 5 in a round that
    withholds 2 from everyone). Once every member took the round, a withheld partition is a
    hole in the split, so a complete split in one common generation is the final one. Every
    member notes ``assigned`` for every generation it takes, with no partitions if none are
    added.
    """
    latest: dict[str, int] = {}
    for ev in events:
        if ev["e"] == "assigned":
            latest[ev["worker"]] = max(latest.get(ev["worker"], -1), ev["gen"])
    if not names <= latest.keys() or len({latest[n] for n in names}) != 1:
        return False
    held = holdings(events)
    parts = [p for n in names for p in held.get(n, ())]
    return all(held.get(n) for n in names) and sorted(parts) == list(range(PARTITIONS))


def intervals(events: list[dict[str, Any]], end: float) -> dict[int, list[tuple[float, float, str]]]:
    """partition -> [(from, to, worker)] ownership intervals."""
    open_at: dict[tuple[str, int], float] = {}
    out: dict[int, list[tuple[float, float, str]]] = defaultdict(list)
    for ev in sorted(events, key=lambda e: e["t"]):
        if ev["e"] == "assigned":
            for p in ev["parts"]:
                open_at[(ev["worker"], p)] = ev["t"]
        elif ev["e"] in ("revoked", "lost"):
            for p in ev["parts"]:
                start = open_at.pop((ev["worker"], p))
                out[p].append((start, ev["t"], ev["worker"]))
    for (worker, p), start in open_at.items():
        out[p].append((start, end, worker))
    return out


def test_settled_waits_for_the_round_that_hands_over_a_revoked_partition() -> None:
    """The history of a real run whose second and third workers joined 0.3 s apart (the order of
    its events; times are seconds). In generation 3 w2 and w3 took their partitions 37 ms before
    w1 took it and revoked 2, which generation 4 gave to w2. Taken for the end of the
    rebalance, the split of that moment had made the test below count partition 2 as moved by
    the fourth worker's join (its one failure under load: 4 kept partitions, not 5)."""
    def ev(t: float, worker: str, e: str, gen: int, parts: list[int]) -> dict[str, Any]:
        return {"t": t, "worker": worker, "e": e, "gen": gen, "parts": parts}

    names = {"w1", "w2", "w3"}
    history = [
        ev(0.000, "w1", "assigned", 1, [0, 1, 2, 3, 4, 5]),
        ev(0.626, "w2", "assigned", 2, []),
        ev(0.659, "w1", "revoked", 2, [3, 4, 5]),
        ev(0.659, "w1", "assigned", 2, []),
        ev(0.934, "w2", "assigned", 3, [4]),
        ev(0.935, "w3", "assigned", 3, [3, 5]),
    ]
    assert not settled(history, names)  # w1 still holds 0-2, but has not taken generation 3
    history += [ev(0.972, "w1", "revoked", 3, [2]), ev(0.972, "w1", "assigned", 3, [])]
    assert not settled(history, names)  # generation 3 withholds 2 from everyone
    history += [ev(1.288, "w3", "assigned", 4, []), ev(1.289, "w1", "assigned", 4, []),
                ev(1.289, "w2", "assigned", 4, [2])]
    assert settled(history, names)
    assert holdings(history) == {"w1": {0, 1}, "w2": {2, 4}, "w3": {3, 5}}


def test_fourth_worker_joins_without_stopping_the_kept_partitions(tmp_path: Path) -> None:
    sc = Scenario(tmp_path, workers=0, records=100_000)  # the producer runs until finish()
    try:
        sc.workers.extend(CoopWorker(sc, f"w{i}") for i in (1, 2, 3))
        sc.start_traffic()
        wait_until(lambda: settled(sc.events(), {"w1", "w2", "w3"}), timeout_s=WAIT_S)
        before = holdings(sc.events())
        t_join = time.time()
        sc.workers.append(CoopWorker(sc, "w4"))
        wait_until(lambda: settled(sc.events(), {"w1", "w2", "w3", "w4"}), timeout_s=WAIT_S)
        t_settled = time.time()
        # Let the kept partitions run on for a while after the rebalance, by their own records.
        wait_until(lambda: all(
            any(e["e"] == "processed" and e["t"] > t_settled + 0.5 for e in w.events())
            for w in sc.workers), timeout_s=WAIT_S)
        events = sc.events()
        after = holdings(events)
        h = sc.finish()
    finally:
        sc.close()

    assert_clean(h)
    # No partition ever had two owners at once.
    for p, spans in intervals(events, time.time()).items():
        spans.sort()
        for (s1, e1, w1), (s2, _, w2) in pairwise(spans):
            assert s2 >= e1, f"partition {p}: {w1} held it until {e1}, {w2} from {s2}"
    # The three kept most of their partitions, and never paused them.
    kept = {w: before[w] & after[w] for w in ("w1", "w2", "w3")}
    assert sum(map(len, kept.values())) == PARTITIONS - len(after["w4"]) >= PARTITIONS - 2
    worst = 0.0
    for w, parts in kept.items():
        for p in parts:
            times = sorted(e["t"] for e in events if e["worker"] == w
                           and e["e"] == "processed" and p in e.get("parts", ()))
            during = [t for t in times if t_join < t < t_settled]
            assert during, f"{w} returned no record of kept partition {p} during the rebalance"
            window = [t for t in times if t_join - 1.0 <= t <= t_settled + 0.5]
            worst = max([worst, *(b - a for a, b in pairwise(window))])
    # The revoking worker was told exactly what moved, and the newcomer got it; a kept partition
    # was never revoked or lost (an eager rebalance revokes every partition of every member).
    moved = set().union(*(before[w] - after[w] for w in ("w1", "w2", "w3")))
    assert moved == after["w4"]
    for w in ("w1", "w2", "w3"):
        gone = {p for e in events if e["worker"] == w and e["e"] in ("revoked", "lost")
                and e["t"] >= t_join for p in e["parts"]}
        assert gone == before[w] - after[w], (w, gone)
    print(f"longest gap of a kept partition around the rebalance: {worst * 1000:.0f} ms")
