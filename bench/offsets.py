"""Offset commit throughput: offsets per second with 1 and with 100 partitions per commit.

A Stable one-member group commits through ``GroupCoordinator.commit_offsets`` (fenced by member
id and generation, one atomic script call per commit): sequentially from one thread, and from
8 threads. Every reply is checked to be NONE for every partition, and the last committed
offsets are read back with ``fetch_offsets``.

Run: ``python bench/offsets.py`` (``--quick`` for a shorter run; ``--redis-url`` for an existing
server). Prints a table.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import redis  # noqa: E402

from rcoord import CoordinatorConfig, Errors, GroupCoordinator, TopicPartition  # noqa: E402
from rcoord.testing.embedded import EmbeddedServer  # noqa: E402

JOIN = dict(protocol_type="consumer", protocols=[("range", b"")], session_timeout_ms=60_000,
            require_known_member_id=False)


def measure(url: str, per_commit: int, threads: int, seconds: float) -> dict[str, float]:
    client = redis.Redis.from_url(url, max_connections=64)
    ns = f"bo{uuid.uuid4().hex[:8]}"
    coord = GroupCoordinator(client, CoordinatorConfig(namespace=ns, group_initial_rebalance_delay_ms=0,
                                                       group_min_session_timeout_ms=100)).start()
    res = coord.join_group("g", **JOIN)
    coord.sync_group("g", res.generation_id, res.member_id, assignments={})
    partitions = [TopicPartition("t", p) for p in range(per_commit)]

    def worker(k: int) -> tuple[int, int]:
        commits = errors = 0
        end = time.monotonic() + seconds
        offset = k * 10**9
        while time.monotonic() < end:
            offset += 1
            out = coord.commit_offsets("g", {tp: offset for tp in partitions},
                                       member_id=res.member_id, generation_id=res.generation_id)
            commits += 1
            errors += sum(1 for e in out.values() if e != Errors.NONE)
        return commits, errors

    t0 = time.monotonic()
    with cf.ThreadPoolExecutor(threads) as ex:
        results = list(ex.map(worker, range(threads)))
    elapsed = time.monotonic() - t0
    commits = sum(c for c, _ in results)
    errors = sum(e for _, e in results)
    fetched = coord.fetch_offsets("g", partitions[:1]).offsets[partitions[0]].offset
    for key in client.scan_iter(match=f"{ns}:*", count=1000):
        client.unlink(key)
    client.close()
    return {"per_commit": per_commit, "threads": threads, "commits_s": commits / elapsed,
            "offsets_s": commits * per_commit / elapsed, "errors": errors, "fetched_ok": fetched > 0}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--redis-url")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    seconds = 1.0 if args.quick else 3.0
    server = None
    url = args.redis_url
    if not url:
        server = EmbeddedServer().start()
        url = server.url
    try:
        rows = [measure(url, per, th, seconds) for per in (1, 100) for th in (1, 8)]
    finally:
        if server is not None:
            server.stop()
    print("partitions/commit  threads  commits/s  offsets/s  errors  read_back")
    print("-----------------  -------  ---------  ---------  ------  ---------")
    for r in rows:
        print(f"{r['per_commit']:>17}  {r['threads']:>7}  {r['commits_s']:>9,.0f}  {r['offsets_s']:>9,.0f}"
              f"  {r['errors']:>6}  {'ok' if r['fetched_ok'] else 'FAILED'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
