"""Expiry lateness benchmark for the coordinator service (issue: expiry-driven failure detection).

For 1,000 and 10,000 members with short session timeouts (3 s; 20 s for 10,000 so that every
deadline falls after the formation load), each member forms a one-member group
(so every member has its own session deadline and nothing else touches it), then goes silent.
The members are formed in pipelined batches within a second or two, so their deadlines come
as a burst, the hard case: a whole rack of workers dying at once.
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

from rcoord import CoordinatorConfig, Errors, GroupCoordinator, JoinGroupResult  # noqa: E402
from rcoord.testing.embedded import EmbeddedServer  # noqa: E402
from rcoord.keys import PartitionKeys  # noqa: E402

JOIN = dict(protocol_type="consumer", protocols=[("range", b"")], require_known_member_id=False)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def form(coord: GroupCoordinator, n: int, session_ms: int, prefix: str, spread_s: float) -> None:
    """Form n one-member groups, paced over ``spread_s`` (0 = as fast as possible): each
    protocol step for a batch of groups is one pipeline of the same scripts the blocking API
    calls (join, await the join, sync). The session deadlines are spread the same way."""
    from rcoord.protocol.join import JoinRequest
    from rcoord.protocol.sync import SyncRequest

    client = coord._redis
    coord._scripts.load_library()  # before raw pipelined FCALLs (start() loads it lazily)
    batch = 100
    t0 = time.monotonic()
    for start in range(0, n, batch):
        pause = t0 + spread_s * start / n - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        groups = [f"{prefix}-{i}" for i in range(start, min(n, start + batch))]
        keys = {g: coord._keys(g).all() for g in groups}

        def run(step: str, args_of: dict[str, list[object]]) -> list[object]:
            pipe = client.pipeline(transaction=False)
            for g in groups:
                pipe.execute_command(*coord._scripts.command(step, keys[g], ["", g, *args_of[g]]))
            return pipe.execute()

        joins = {g: JoinRequest.build(g, "", protocols=JOIN["protocols"], protocol_type="consumer",
                                      session_timeout_ms=session_ms, rebalance_timeout_ms=session_ms,
                                      group_instance_id=None, client_id="b", client_host="",
                                      require_known_member_id=False, reason=None).args() for g in groups}
        replies = run("join_group", joins)
        members = {g: bytes(r[4]).decode() for g, r in zip(groups, replies, strict=True)}
        replies = run("await_reply", {g: [members[g], "j"] for g in groups})
        gens = {}
        for g, r in zip(groups, replies, strict=True):
            res = JoinGroupResult.decode(bytes(r[1]))
            assert r[0] == b"R" and res.error == Errors.NONE, (r, res)
            gens[g] = res.generation_id
        syncs = {g: SyncRequest.build(g, gens[g], members[g], assignments={}, group_instance_id=None,
                                      protocol_type=None, protocol_name=None).args() for g in groups}
        for r in run("sync_group", syncs):
            assert r[0] == b"R", r


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


def run(url: str, members: int, mode: str, session_ms: int, wait_s: float, spread_s: float) -> dict[str, object]:
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
        form(coord, members, session_ms, "m", spread_s)
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
        "members": members, "mode": mode, "spread_s": spread_s, "removed": len(late), "formed_s": formed_s,
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
    ap.add_argument("--spreads", default="3,0",
                    help="seconds over which the members' deadlines are spread (0 = one burst)")
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
            # Longer than forming them takes, so every deadline falls after the formation load.
            session_ms = 3000 if members <= 1000 else 20_000
            for spread in [float(x) for x in args.spreads.split(",")]:
                for mode in args.modes.split(","):
                    if mode == "hints" and spread == 0:
                        continue  # hints are measured once, with spread deadlines
                    wait = args.hints_wait_s if mode == "hints" else 15.0
                    r = run(url, members, mode, session_ms, wait, spread)
                    rows.append(r)
                    print(json.dumps(r), flush=True)
        for key in client.scan_iter(match="bench-ttl-*", count=1000):
            client.unlink(key)
        client.close()
    finally:
        if server is not None:
            server.stop()
    print()
    print("members  deadlines     wake   removed   p50_ms   p99_ms   max_ms   coordinator_cpu_ms_per_1000")
    print("-------  ------------  -----  -------  -------  -------  -------  ---------------------------")
    for r in rows:
        spread = "burst" if r["spread_s"] == 0 else f"over {r['spread_s']:.0f} s"
        print(f"{r['members']:>7}  {spread:<12}  {r['mode']:<5}  {r['removed']:>7}  {r['p50']:>7.0f}  "
              f"{r['p99']:>7.0f}  {r['max']:>7.0f}  {r['cpu_ms_per_1000']:>10.0f}")
    print("\n(10,000 other keys with a 1 h TTL on the same server; one coordinator process; lateness is")
    print(" removal time minus session deadline on the server clock; 'removed' counts members removed")
    print(" within the wait window)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
