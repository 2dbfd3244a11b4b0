"""Expiry lateness benchmark for the coordinator service (issue: expiry-driven failure detection).

For 1,000 and 10,000 members with short session timeouts, each member forms a one-member group
(so every member has its own session deadline and nothing else touches it), then goes silent.
One coordinator process (``python -m rcoord.service``) is running, in one of three modes:

* ``hints``: only expired-key events wake it (each group's hint key expires at its deadline);
* ``index``: only the deadline index and its shard-channel messages;
* ``both``: the default.

The server also holds 10,000 unrelated keys with a one-hour TTL, which is what makes expired-key
events late (the active expiry cycle scans ~20 keys per DB per tick). Lateness is how long after
its session deadline each member was removed, as recorded by the script that removed it (server
clock): the ``late`` field of the partition's ``expired`` events. The coordinator's CPU time
(user+system, from /proc) over the run is reported per 1,000 members.

Run: ``python bench/expiry.py`` (``--quick`` for 1,000 members only; ``--redis-url`` for an
existing server). Prints a table. Everything is bounded in time; processes are stopped.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import redis  # noqa: E402

from rcoord import CoordinatorConfig, Errors, GroupCoordinator  # noqa: E402
from rcoord.embedded import EmbeddedServer  # noqa: E402
from rcoord.keys import PartitionKeys  # noqa: E402

JOIN = dict(protocol_type="consumer", protocols=[("range", b"")], require_known_member_id=False)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def form(coord: GroupCoordinator, n: int, session_ms: int, prefix: str) -> None:
    def one(i: int) -> None:
        g = f"{prefix}-{i}"
        res = coord.join_group(g, session_timeout_ms=session_ms, rebalance_timeout_ms=session_ms, **JOIN)
        assert res.error == Errors.NONE, res
        s = coord.sync_group(g, res.generation_id, res.member_id, assignments={})
        assert s.error == Errors.NONE, s

    with cf.ThreadPoolExecutor(16) as ex:
        list(ex.map(one, range(n)))


def lateness(client: redis.Redis, ns: str, partitions: int) -> list[int]:
    out = []
    for p in range(partitions):
        for _id, fields in client.xrange(PartitionKeys(ns, p, partitions).events, count=100_000):
            if fields.get(b"e") == b"expired":
                out.append(int(fields[b"late"]))
    return out


def pct(values: list[int], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return float(s[min(len(s) - 1, int(q * len(s)))])


def run(url: str, members: int, mode: str, session_ms: int, wait_s: float) -> dict[str, object]:
    client = redis.Redis.from_url(url)
    ns = f"bx{uuid.uuid4().hex[:8]}"
    coord = GroupCoordinator(client, CoordinatorConfig(
        namespace=ns, group_min_session_timeout_ms=100, group_initial_rebalance_delay_ms=0)).start()
    parts = coord.config.num_partitions
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "rcoord.service", "--redis-url", url, "--namespace", ns,
                             "--wake", mode, "--lease-ttl-ms", "5000", "--log-level", "WARNING",
                             "--id", f"bench-{mode}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        # Wait until it holds every lease, then form the members (their sessions start at sync).
        deadline = time.monotonic() + 20
        leases = [PartitionKeys(ns, p, parts).lease for p in range(parts)]
        while time.monotonic() < deadline and not all(client.mget(leases)):
            time.sleep(0.05)
        t0 = time.monotonic()
        form(coord, members, session_ms, "m")
        formed_s = time.monotonic() - t0
        cpu0 = cpu_seconds(proc.pid)
        w0 = time.monotonic()
        end = w0 + session_ms / 1000 + wait_s
        removed = 0
        while time.monotonic() < end:
            removed = len(lateness(client, ns, parts))
            if removed >= members:
                break
            time.sleep(0.25)
        window_s = time.monotonic() - w0
        cpu = cpu_seconds(proc.pid) - cpu0
        late = lateness(client, ns, parts)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        cleanup(client, ns)
        client.close()
    return {
        "members": members, "mode": mode, "removed": len(late), "formed_s": formed_s,
        "p50": pct(late, 0.50), "p99": pct(late, 0.99), "max": max(late) if late else float("nan"),
        "cpu_ms_per_1000": 1000 * cpu / (members / 1000), "window_s": window_s,
    }


def cleanup(client: redis.Redis, ns: str) -> None:
    for key in client.scan_iter(match=f"{ns}:*", count=1000):
        client.unlink(key)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--redis-url")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--modes", default="index,both,hints")
    ap.add_argument("--hints-wait-s", type=float, default=30.0,
                    help="how long to wait for stragglers after the last deadline in hints mode")
    args = ap.parse_args()
    server = None
    url = args.redis_url
    if not url:
        server = EmbeddedServer().start()
        url = server.url
    try:
        client = redis.Redis.from_url(url)
        # 10,000 unrelated keys with a TTL: the load that delays expired-key events.
        pipe = client.pipeline(transaction=False)
        for i in range(10_000):
            pipe.set(f"bench-ttl-{i}", b"x", px=3_600_000)
        pipe.execute()
        sizes = [1000] if args.quick else [1000, 10_000]
        rows = []
        for members in sizes:
            session_ms = 2000 if members <= 1000 else 8000
            for mode in args.modes.split(","):
                wait = args.hints_wait_s if mode == "hints" else 10.0
                r = run(url, members, mode, session_ms, wait)
                rows.append(r)
                print(json.dumps(r), flush=True)
        for key in client.scan_iter(match="bench-ttl-*", count=1000):
            client.unlink(key)
        client.close()
    finally:
        if server is not None:
            server.stop()
    print()
    print("members  wake   removed   p50_ms   p99_ms   max_ms   coordinator_cpu_ms_per_1000_members")
    print("-------  -----  -------  -------  -------  -------  -----------------------------------")
    for r in rows:
        print(f"{r['members']:>7}  {r['mode']:<5}  {r['removed']:>7}  {r['p50']:>7.0f}  {r['p99']:>7.0f}  "
              f"{r['max']:>7.0f}  {r['cpu_ms_per_1000']:>10.0f}")
    print("\n(10,000 other keys with a 1 h TTL on the same server; one coordinator process; lateness is")
    print(" removal time minus session deadline on the server clock; 'removed' counts members removed")
    print(" within the wait window)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
