"""How long each partition stops when a member joins: eager vs cooperative, real workers.

Run from the repository root::

    python bench/rebalance_pause.py              # 3 trials per protocol
    python bench/rebalance_pause.py --trials 1

Each trial starts an embedded server, the rcoord service and three worker processes
(``workers/fault_worker.py``: ``Consumer``, commit after every batch) on a 6-partition topic fed
continuously (25 records every 50 ms, round robin), waits until the three hold every partition,
then starts a fourth worker and waits until the four hold every partition. For each partition,
the *pause* is the longest gap between two records of it being returned by ``poll()`` (any
worker), from one second before the join until half a second after the group settled. A
partition that keeps flowing has a pause of about its record spacing (~15 ms here, plus
scheduling noise); a stopped one, the time it stopped. Heartbeat 300 ms, session 1.5 s.

* eager: ``--assignor range`` (every member revokes everything at each rebalance);
* cooperative: ``--assignor cooperative-sticky`` (KIP-429: members keep what they keep).

Uses the fault suite's scenario harness (``tests/test_faults.py``) for the server, service,
producer and worker processes.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from itertools import pairwise
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from harness import wait_until
from test_faults import GROUP, PARTITIONS, TOPIC, WAIT_S, WORKER, Scenario, Worker, _env

HEARTBEAT_MS = 300


class BenchWorker(Worker):
    def __init__(self, sc: Scenario, name: str, assignor: str) -> None:
        self.name = name
        self.history = sc.dir / f"{name}.jsonl"
        self._fh = open(sc.dir / f"{name}.out", "w")  # noqa: SIM115 - open for the process's life
        self.proc = subprocess.Popen(
            [sys.executable, str(WORKER), "--redis-url", sc.url, "--namespace", sc.ns,
             "--group", GROUP, "--topic", TOPIC, "--name", name, "--history", str(self.history),
             "--session-timeout-ms", "1500", "--heartbeat-interval-ms", str(HEARTBEAT_MS),
             "--assignor", assignor],
            stdout=self._fh, stderr=subprocess.STDOUT, env=_env(),
        )


def _held(events: list[dict[str, Any]]) -> dict[str, set[int]]:
    held: dict[str, set[int]] = {}
    for ev in sorted(events, key=lambda e: e["t"]):
        if ev["e"] == "assigned":
            held.setdefault(ev["worker"], set()).update(ev["parts"])
        elif ev["e"] in ("revoked", "lost"):
            held.setdefault(ev["worker"], set()).difference_update(ev["parts"])
    return held


def _settled(events: list[dict[str, Any]], names: set[str]) -> bool:
    held = _held(events)
    parts = [p for n in names for p in held.get(n, ())]
    return all(held.get(n) for n in names) and sorted(parts) == list(range(PARTITIONS))


def trial(assignor: str) -> dict[int, float]:
    """partition -> pause (s) around one join."""
    with tempfile.TemporaryDirectory() as tmp:
        sc = Scenario(Path(tmp), workers=0, records=10**6)
        try:
            sc.workers.extend(BenchWorker(sc, f"w{i}", assignor) for i in (1, 2, 3))
            sc.start_traffic()
            wait_until(lambda: _settled(sc.events(), {"w1", "w2", "w3"}), timeout_s=WAIT_S)
            time.sleep(1.0)  # a steady second before the join (measured, not waited on)
            t_join = time.time()
            sc.workers.append(BenchWorker(sc, "w4", assignor))
            wait_until(lambda: _settled(sc.events(), {"w1", "w2", "w3", "w4"}), timeout_s=WAIT_S)
            t_end = time.time() + 0.5
            wait_until(lambda: time.time() > t_end, lambda: time.sleep(0.05))
            events = sc.events()
        finally:
            sc._stop.set()
            for w in sc.workers:
                w.stop()
            sc.close()
    pauses: dict[int, float] = {}
    for p in range(PARTITIONS):
        times = sorted(e["t"] for e in events if e["e"] == "processed"
                       and p in e.get("parts", ()) and t_join - 1.0 <= e["t"] <= t_end)
        pauses[p] = max((b - a for a, b in pairwise(times)), default=0.0)
    return pauses


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=3)
    args = ap.parse_args()
    rows = []
    for label, assignor in (("eager (range)", "range"),
                            ("cooperative (cooperative-sticky)", "cooperative-sticky")):
        per_partition: list[float] = []
        worst_trial: list[float] = []
        for _ in range(args.trials):
            pauses = trial(assignor)
            per_partition += pauses.values()
            worst_trial.append(max(pauses.values()))
        stopped = sum(1 for x in per_partition if x > 2 * HEARTBEAT_MS / 1000)
        rows.append((label, statistics.median(per_partition), max(per_partition),
                     statistics.median(worst_trial), stopped, len(per_partition)))
    print(f"rebalance pause when a 4th worker joins 3 ({PARTITIONS} partitions, heartbeat "
          f"{HEARTBEAT_MS} ms, {args.trials} trial(s) each)")
    print(f"{'protocol':34} {'median/partition':>17} {'max/partition':>14} "
          f"{'median worst':>13} {'stopped >600ms':>15}")
    for label, med, mx, worst, stopped, n in rows:
        print(f"{label:34} {med * 1000:>14.0f} ms {mx * 1000:>11.0f} ms {worst * 1000:>10.0f} ms "
              f"{stopped:>9}/{n}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
