"""Membership benchmark for rcoord: group formation, heartbeat throughput, script ceiling.

Run from the repository root::

    python bench/membership.py            # full run (~2 min on 2 vCPU)
    python bench/membership.py --quick    # smaller run (~30 s)
    python bench/membership.py --redis-url redis://127.0.0.1:6379/0

Without ``--redis-url`` an ``rcoord.testing.embedded.EmbeddedServer`` (a throw-away redis/valkey server
on a free 127.0.0.1 port) is started and stopped at the end. Every run uses fresh namespaces
(``bench-<pid>-<time>-<n>``) and deletes their keys at the end. See bench/README.md for what
each column means and for measured results.

Sections:

1. Group formation of N members (10, 100, 1000), with an initial rebalance delay (one
   generation) and without (two generations). The members are threads spread over several OS
   processes (``multiprocessing``, spawn). Every member first obtains its member id (JoinGroup
   with "" -> MEMBER_ID_REQUIRED); then the clock starts and every member sends its second
   JoinGroup (parked until the generation forms), then SyncGroup (the leader assigns every
   member of its JoinGroupResult.members). The group is formed when every member holds its
   SyncGroup result for the same generation and the group is Stable.
1b. The same formation driven by one client that pipelines each step for all members (the
   scripts never block), to separate the coordinator's share from the Python load generator's.
2. Heartbeats per second from one process on the formed 1000-member group: sequential
   ``coord.heartbeat`` calls, then raw FCALLs of the heartbeat function pipelined in batches.
3. The server-side ceiling of the heartbeat script, with redis-benchmark if available.
4. Reference figures quoted in the issue (not measured here).
"""

from __future__ import annotations

import argparse
import datetime
import platform
import sys
from typing import Any

import _common  # noqa: F401  (puts the repository root on sys.path)
import redis
from _common import (
    NamespaceRegistry,
    load_average,
    machine_line,
    now,
    print_table,
    server_label,
    start_server,
)
from _formation import default_delay, section_formation
from _heartbeats import section_heartbeats, section_server_ceiling
from _membership_setup import SOCKET_TIMEOUT_S
from _pipelined_formation import section_pipelined_formation

# Reference figures quoted in the issue (same machine), not measured by this script.
REFERENCES = [
    ("tooz Redis driver: form a 100-member group", "1.9 s"),
    ("tooz Redis driver: heartbeats", "10,800 /s"),
    ("server: small script, unpipelined", "80,000 /s"),
    ("server: small script, pipelined", "184,000 /s"),
]


def parse_args(argv: list[str] | None = None) -> Any:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--quick", action="store_true", help="smaller run (~30 s)")
    p.add_argument("--redis-url", help="use this server (127.0.0.1 only) instead of an embedded one")
    p.add_argument("--sizes", help="comma-separated group sizes (replaces the default scenarios)")
    p.add_argument("--delay-ms", type=int, default=None,
                   help="group_initial_rebalance_delay_ms for --sizes (default: per size, "
                        "50 / 100 / 1000 ms for <=10 / <=100 / more members)")
    p.add_argument("--runs", type=int, help="formation runs per scenario")
    p.add_argument("--procs", type=int, default=4, help="member processes (default 4)")
    p.add_argument("--hb-interval", type=float, default=0.5,
                   help="seconds between heartbeats of a synced member during formation")
    p.add_argument("--formation-timeout", type=float, default=60.0)
    p.add_argument("--heartbeat-group", type=int, default=1000,
                   help="size of the formed group reused for sections 2 and 3")
    args = p.parse_args(argv)
    if args.sizes or args.delay_ms is not None or args.runs is not None:
        sizes = [int(x) for x in (args.sizes or "10,100,1000").split(",") if x]
        runs = args.runs if args.runs is not None else (1 if args.quick else 3)
        args.scenarios = [
            (n, args.delay_ms if args.delay_ms is not None else default_delay(n), runs)
            for n in sizes
        ]
    elif args.quick:
        args.scenarios = [(10, 50, 1), (100, 100, 1), (100, 0, 1), (1000, 0, 1)]
    else:
        args.scenarios = [
            (10, 50, 3), (100, 100, 3), (1000, 1000, 2),   # initial delay: one generation
            (10, 0, 3), (100, 0, 3), (1000, 0, 2),          # no delay: two generations
            (1000, 200, 1),                                 # short delay: several windows
        ]
    if args.heartbeat_group not in {n for n, _, _ in args.scenarios}:
        args.scenarios.append((args.heartbeat_group, default_delay(args.heartbeat_group), 1))
    args.pipelined_sizes = [100, 1000] if args.quick else [10, 100, 1000]
    args.seq_heartbeats = 3000 if args.quick else 10_000
    args.pipelined_heartbeats = 20_000 if args.quick else 100_000
    args.batches = [100, 1000]
    args.bench_n = 30_000 if args.quick else 200_000
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    server, url, host, port = start_server(
        args.redis_url, ["--maxclients", "10000", "--slowlog-log-slower-than", "1000"]
    )

    r = redis.Redis.from_url(url, socket_timeout=SOCKET_TIMEOUT_S, socket_connect_timeout=5.0)
    nsreg = NamespaceRegistry()
    status = 0
    started = now()
    try:
        info = r.info("server")
        hired = "hiredis" if redis.utils.HIREDIS_AVAILABLE else "pure-python parser"
        print(f"rcoord membership benchmark  {datetime.datetime.now().isoformat(timespec='seconds')}"
              f"  ({'quick' if args.quick else 'full'} run)")
        print(f"machine: {machine_line()}; Python {platform.python_version()}; "
              f"redis-py {redis.__version__} ({hired}); server {server_label(info)} "
              f"{'embedded' if server else 'external'} at {host}:{port}")
        print(f"load average at start: {load_average()}")
        print("config: CoordinatorConfig(group_initial_rebalance_delay_ms=<delay>, "
              "group_min_session_timeout_ms=1000, namespace=<unique per run>)")

        formed = section_formation(url, r, nsreg, args, keep_for_heartbeats=args.heartbeat_group)
        section_pipelined_formation(r, nsreg, args)
        if formed is None:
            print()
            print("2./3. skipped: no formed group to heartbeat")
            status = 1
        else:
            keys, gen, sha, member_ids, problems = section_heartbeats(r, url, formed, args)
            if problems:
                status = 1
            section_server_ceiling(r, host, port, keys, gen, sha, member_ids[0], args)

        print()
        print("4. Reference figures quoted in the issue (same machine; not measured by this script)")
        print()
        print_table(["what", "figure"], [list(x) for x in REFERENCES], right={1})
        print()
        print(f"load average at end: {load_average()}; total benchmark time: "
              f"{now() - started:.1f} s")
    finally:
        nsreg.delete_all(r)
        r.close()
        if server is not None:
            server.stop()
    return status


if __name__ == "__main__":
    sys.exit(main())
