"""The cost of commits a replica has acknowledged (``commit_offsets(required_acks=1)``).

One primary and one replica (embedded servers on 127.0.0.1, replication over loopback); one
thread commits one partition at a time, with ``required_acks`` 0 (the master's answer) and 1
(followed by WAIT on the same master). Every reply is checked to be NONE. Prints commits/s and
the latency percentiles per mode.

Run: ``python bench/replica_acks.py [--seconds 3]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rcoord import CoordinatorConfig, Errors, GroupCoordinator, TopicPartition
from rcoord.testing.embedded import EmbeddedServer

TP = TopicPartition("t", 0)


def run(primary: EmbeddedServer, acks: int, seconds: float) -> dict[str, float]:
    client = primary.client()
    coord = GroupCoordinator(client, CoordinatorConfig(namespace="ra" + uuid.uuid4().hex[:8]))
    coord.start()
    latencies: list[float] = []
    offset = 0
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        offset += 1
        t0 = time.perf_counter()
        got = coord.commit_offsets("g", {TP: offset}, required_acks=acks)
        latencies.append(time.perf_counter() - t0)
        if got != {TP: Errors.NONE}:
            raise SystemExit(f"commit {offset} answered {got}")
    client.close()
    cuts = statistics.quantiles(latencies, n=100)
    return {"commits_s": len(latencies) / seconds, "p50_ms": cuts[49] * 1000,
            "p99_ms": cuts[98] * 1000}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=3.0)
    args = p.parse_args()
    primary, replica = EmbeddedServer().start(), EmbeddedServer().start()
    try:
        with replica.client() as r:
            r.execute_command("REPLICAOF", "127.0.0.1", primary.port)
        with primary.client() as c:
            deadline = time.monotonic() + 30
            while c.info("replication").get("slave0", {}).get("state") != "online":
                if time.monotonic() > deadline:
                    raise SystemExit("the replica never connected")
                time.sleep(0.05)
        rows = [(acks, run(primary, acks, args.seconds)) for acks in (0, 1, 0, 1)]
    finally:
        replica.stop()
        primary.stop()
    print("| required_acks | commits/s | p50 ms | p99 ms |")
    print("|---|---|---|---|")
    for acks, r in rows:
        print(f"| {acks} | {r['commits_s']:,.0f} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} |")


if __name__ == "__main__":
    main()
