"""How long each partition stops when a member joins: eager vs cooperative, real workers.

Run from the repository root::

    python bench/rebalance_pause.py              # 3 trials per protocol
    python bench/rebalance_pause.py --trials 1

Each trial starts an embedded server, the rcoord service and three worker processes
(``workers/fault_worker.py``: ``Consumer``, commit after every batch) on a 6-partition topic fed
continuously (25 records every 50 ms, round robin), waits until the three hold every partition,
then starts a fourth worker and waits until the four hold every partition. For each partition,
the *pause* is the longest gap between two records of it being returned by ``poll()`` (any
worker), from the join until half a second after the group settled, and the *steady-state gap*
the longest gap in the second before the join (the machine's own noise). Partitions are split
into *kept* (the same worker holds them before and after) and *moved*. A partition that keeps
flowing has a pause of about the steady-state gap; a stopped one, the time it stopped.
Heartbeat 300 ms, session 1.5 s.

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


def trial(assignor: str) -> list[tuple[bool, float, float]]:
    """Per partition around one join: (kept by its owner?, pause, baseline), in seconds.

    The pause is the longest gap between two of its records returned by ``poll()`` from the
    join until half a second after the group settled; the baseline is the longest gap in the
    steady second before the join (the machine's own noise: producer cadence, scheduling).
    """
    with tempfile.TemporaryDirectory() as tmp:
        sc = Scenario(Path(tmp), workers=0, records=10**6)
        try:
            sc.workers.extend(BenchWorker(sc, f"w{i}", assignor) for i in (1, 2, 3))
            sc.start_traffic()
            wait_until(lambda: _settled(sc.events(), {"w1", "w2", "w3"}), timeout_s=WAIT_S)
            time.sleep(1.0)  # a steady second before the join (measured, not waited on)
            t_join = time.time()
            before = _held(sc.events())
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
    after = _held(events)
    owner = {p: w for w, parts in before.items() for p in parts}
    out = []
    for p in range(PARTITIONS):
        times = sorted(e["t"] for e in events if e["e"] == "processed"
                       and p in e.get("parts", ()) and t_join - 1.0 <= e["t"] <= t_end)
        quiet = [t for t in times if t <= t_join]
        busy = [t for t in times if t >= (quiet[-1] if quiet else t_join)]
        pause = max((b - a for a, b in pairwise(busy)), default=0.0)
        baseline = max((b - a for a, b in pairwise(quiet)), default=0.0)
        out.append((p in after.get(owner.get(p, ""), set()), pause, baseline))
    return out


def _ms(values: list[float], fn: Any) -> str:
    return f"{fn(values) * 1000:.0f} ms" if values else "-"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=3)
    args = ap.parse_args()
    print(f"rebalance pause when a 4th worker joins 3 ({PARTITIONS} partitions, heartbeat "
          f"{HEARTBEAT_MS} ms, {args.trials} trial(s) each)")
    print("| protocol | kept partitions: median / max pause | moved partitions: median / max "
          "pause | steady-state gap: median / max |")
    print("|---|---|---|---|")
    for label, assignor in (("eager (range)", "range"),
                            ("cooperative (cooperative-sticky)", "cooperative-sticky")):
        rows = [row for _ in range(args.trials) for row in trial(assignor)]
        kept = [pause for is_kept, pause, _ in rows if is_kept]
        moved = [pause for is_kept, pause, _ in rows if not is_kept]
        base = [b for _, _, b in rows]
        print(f"| {label} | {_ms(kept, statistics.median)} / {_ms(kept, max)} ({len(kept)}) "
              f"| {_ms(moved, statistics.median)} / {_ms(moved, max)} ({len(moved)}) "
              f"| {_ms(base, statistics.median)} / {_ms(base, max)} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
