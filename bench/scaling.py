"""Horizontally scaled coordinator processes over one 3-master Redis Cluster (issue 13).

Each run starts a fresh namespace and K coordinator processes (``python -m rcoord.service``),
waits until every partition lease is held, then forms N one-member groups (sessions of
``--session-ms``, paced over ``--spread-s`` so deadlines come as a steady stream) and lets every
member go silent, so each session expiry is timer work that only a coordinator process does.
Reported per K: the deadlines each process applied (``rcoord_deadlines_applied``), its CPU time,
and the lateness of the expiries (removal minus deadline, server clock, from the partitions'
``expired`` events).

Then lease hand-over under the same load with 2 processes: one stopped gracefully (SIGTERM
releases its leases), one killed (SIGKILL: its leases wait for its registry entry to expire, one
lease TTL), and one process added. "Hand-over" is the time from the change until every partition
lease is held by a live process as the plan wants it; the lateness columns cover all expiries of
that run, so a slow hand-over shows as late expiries.

Run: ``python bench/scaling.py`` (``--quick`` for fewer groups). Prints two tables. Everything
is bounded in time and every process and server is stopped.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from expiry import JOIN, cpu_seconds, lateness, pct  # noqa: E402

from rcoord import CoordinatorConfig, GroupCoordinator  # noqa: E402
from rcoord.testing.embedded import EmbeddedCluster  # noqa: E402
from rcoord.keys import PartitionKeys  # noqa: E402

LEASE_TTL_MS = 2000


def form(coord: GroupCoordinator, n: int, session_ms: int, prefix: str, spread_s: float) -> None:
    """``bench/expiry.py``'s formation on a cluster: redis-py's cluster pipeline refuses EVALSHA,
    so each batch is split by master and sent as one plain pipeline per master."""
    from rcoord import Errors, JoinGroupResult
    from rcoord.protocol.join import JoinRequest
    from rcoord.protocol.sync import SyncRequest
    client = coord._redis
    nodes = {n.name: client.get_redis_connection(n) for n in client.get_primaries()}
    coord._scripts.load_library()  # on every master, before raw pipelined FCALLs
    batch = 100
    t0 = time.monotonic()
    for start in range(0, n, batch):
        pause = t0 + spread_s * start / n - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        groups = [f"{prefix}-{i}" for i in range(start, min(n, start + batch))]
        keys = {g: coord._keys(g).all() for g in groups}
        owner = {g: client.get_node_from_key(keys[g][0]).name for g in groups}

        def run(step: str, args_of: dict[str, list[object]]) -> dict[str, object]:
            out: dict[str, object] = {}
            for name, node in nodes.items():
                mine = [g for g in groups if owner[g] == name]
                pipe = node.pipeline(transaction=False)
                for g in mine:
                    pipe.execute_command(*coord._scripts.command(step, keys[g],
                                                                 ["", g, *args_of[g]]))
                out.update(zip(mine, pipe.execute(), strict=True))
            return out

        joins = {g: JoinRequest.build(g, "", protocols=JOIN["protocols"], protocol_type="consumer",
                                      session_timeout_ms=session_ms, rebalance_timeout_ms=session_ms,
                                      group_instance_id=None, client_id="b", client_host="",
                                      require_known_member_id=False, reason=None).args()
                 for g in groups}
        replies = run("join_group", joins)
        members = {g: bytes(replies[g][4]).decode() for g in groups}  # type: ignore[index]
        replies = run("await_reply", {g: [members[g], "j"] for g in groups})
        gens = {}
        for g in groups:
            r = replies[g]
            res = JoinGroupResult.decode(bytes(r[1]))  # type: ignore[index]
            assert r[0] == b"R" and res.error == Errors.NONE, (r, res)  # type: ignore[index]
            gens[g] = res.generation_id
        syncs = {g: SyncRequest.build(g, gens[g], members[g], assignments={},
                                      group_instance_id=None, protocol_type=None,
                                      protocol_name=None).args() for g in groups}
        for r in run("sync_group", syncs).values():
            assert r[0] == b"R", r  # type: ignore[index]
BOUND_S = 60.0


class Proc:
    """One coordinator process; its first log line names its metrics port."""

    def __init__(self, url: str, ns: str, cid: str, tmp: Path) -> None:
        self.cid = cid
        self.out = tmp / f"{cid}.out"
        self._fh = open(self.out, "w")  # noqa: SIM115 - open for the process's life
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rcoord.service", "--redis-url", url, "--namespace", ns,
             "--id", cid, "--metrics-port", "0", "--lease-ttl-ms", str(LEASE_TTL_MS),
             "--set", "group_min_session_timeout_ms=100",
             "--set", "group_initial_rebalance_delay_ms=0"],
            stdout=self._fh, stderr=subprocess.STDOUT, env=dict(os.environ, PYTHONPATH=str(ROOT)))
        deadline = time.monotonic() + 30
        while True:
            first = self.out.read_text().split("\n", 1)[0]
            if first.startswith("{") and "metrics_port" in first:
                self.port = json.loads(first)["metrics_port"]
                break
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"service did not start: {self.out.read_text()[-2000:]}")
            time.sleep(0.05)
        self.cpu0 = cpu_seconds(self.proc.pid)
        self.cpu = 0.0

    def metric(self, name: str) -> float:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as r:
            text = r.read().decode()
        return sum(float(x.rsplit(" ", 1)[1]) for x in text.splitlines()
                   if x.startswith(name) and not x.startswith("#"))

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            self.cpu = cpu_seconds(self.proc.pid) - self.cpu0
            self.proc.send_signal(sig)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self._fh.close()


def holders(client: object, ns: str, parts: int) -> list[str | None]:
    out = []
    for p in range(parts):
        v = client.get(PartitionKeys(ns, p, parts).lease)  # type: ignore[attr-defined]
        out.append(None if v is None else v.decode())
    return out


def wait_leases(client: object, ns: str, parts: int, live: set[str], each: bool) -> float:
    """Seconds until every lease is held by a live process (and, if ``each``, every live
    process holds one)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < BOUND_S:
        h = holders(client, ns, parts)
        if all(x in live for x in h) and (not each or live <= set(h)):
            return time.monotonic() - t0
        time.sleep(0.02)
    raise RuntimeError(f"leases not settled in {BOUND_S} s: {h}")


def one_run(cluster: EmbeddedCluster, k: int, groups: int, session_ms: int, spread_s: float,
            change: str | None, tmp: Path) -> dict[str, object]:
    client = cluster.client()
    ns = f"bs{uuid.uuid4().hex[:8]}"
    coord = GroupCoordinator(client, CoordinatorConfig(
        namespace=ns, group_min_session_timeout_ms=100, group_initial_rebalance_delay_ms=0)).start()
    parts = coord.config.num_partitions
    procs = [Proc(cluster.url, ns, f"c{i + 1}", tmp) for i in range(k)]
    stopped: list[Proc] = []
    result: dict[str, object] = {"k": k, "change": change or "-"}
    try:
        wait_leases(client, ns, parts, {p.cid for p in procs}, each=True)
        t0 = time.monotonic()
        # Half the groups, the change, the other half: the change happens under load.
        form(coord, groups // 2, session_ms, "a", spread_s / 2)
        if change is not None:
            live = {p.cid for p in procs}
            if change == "add":
                procs.append(Proc(cluster.url, ns, f"c{k + 1}", tmp))
                live.add(procs[-1].cid)
                t_change = time.monotonic()
            else:
                victim = procs.pop()
                t_change = time.monotonic()
                victim.stop(signal.SIGTERM if change == "stop" else signal.SIGKILL)
                stopped.append(victim)
                live.discard(victim.cid)
            wait_leases(client, ns, parts, live, each=True)
            result["handover_s"] = time.monotonic() - t_change
        form(coord, groups - groups // 2, session_ms, "b", spread_s / 2)
        result["formed_s"] = time.monotonic() - t0
        deadline = time.monotonic() + session_ms / 1000 + BOUND_S
        late: list[int] = []
        while time.monotonic() < deadline:
            late = lateness(client, ns, parts)
            if len(late) >= groups:
                break
            time.sleep(0.2)
        result.update(removed=len(late), p50=pct(late, 0.5), p99=pct(late, 0.99),
                      max=max(late, default=float("nan")))
        result["applied"] = [int(p.metric("rcoord_deadlines_applied_total")) for p in procs]
        for p in procs:
            p.stop()
        result["cpu_ms"] = [int(p.cpu * 1000) for p in procs]
    finally:
        for p in procs + stopped:
            p.stop(signal.SIGKILL)
        client.close()
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--groups", type=int, default=2000)
    ap.add_argument("--session-ms", type=int, default=3000)
    ap.add_argument("--spread-s", type=float, default=4.0)
    ap.add_argument("--quick", action="store_true", help="500 groups")
    args = ap.parse_args()
    groups = 500 if args.quick else args.groups
    with tempfile.TemporaryDirectory() as tmp:
        cluster = EmbeddedCluster(masters=3).start()
        try:
            rows = [one_run(cluster, k, groups, args.session_ms, args.spread_s, None, Path(tmp))
                    for k in (1, 2, 4)]
            changes = [one_run(cluster, 2, groups, args.session_ms, args.spread_s, c, Path(tmp))
                       for c in ("stop", "kill", "add")]
        finally:
            cluster.stop()
    print(f"\n{groups} one-member groups, sessions {args.session_ms} ms, formed over "
          f"{args.spread_s} s, 3 masters, lease TTL {LEASE_TTL_MS} ms\n")
    print("| processes | expired | lateness p50 / p99 / max ms | deadlines applied per process "
          "| CPU ms per process |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['k']} | {r['removed']} | {r['p50']:.0f} / {r['p99']:.0f} / {r['max']:.0f} "
              f"| {r['applied']} | {r['cpu_ms']} |")
    print("\n| 2 processes, under load | hand-over s | expired | lateness p50 / p99 / max ms "
          "| applied per remaining process |")
    print("|---|---|---|---|---|")
    names = {"stop": "one stopped (SIGTERM)", "kill": "one killed (SIGKILL)", "add": "one added"}
    for r in changes:
        print(f"| {names[str(r['change'])]} | {r['handover_s']:.2f} | {r['removed']} "
              f"| {r['p50']:.0f} / {r['p99']:.0f} / {r['max']:.0f} | {r['applied']} |")


if __name__ == "__main__":
    main()
