"""Section 1 of the membership bench: group formation with member threads in several processes.

See bench/README.md ("1. Group formation") for what each column means.
"""

from __future__ import annotations

import collections
import multiprocessing as mp
import os
import queue
import resource
import statistics
import sys
import threading
import time
import traceback
from typing import Any

import _common  # noqa: F401  (puts the repository root on sys.path)
import redis
from _common import (
    NamespaceRegistry,
    fmt_ms,
    now,
    print_table,
    script_stats,
    server_cpu_s,
    slowest_since,
    slowlog_last_id,
)
from _membership_setup import (
    GROUP,
    PROTOCOL_TYPE,
    PROTOCOLS,
    SESSION_TIMEOUT_MS,
    SOCKET_TIMEOUT_S,
    assignment_for,
    make_config,
)

from rcoord import Errors, GroupCoordinator
from rcoord.connect import driver_info
from rcoord.scripts import Scripts

READY_TIMEOUT_S = 90.0  # workers: start, connect, obtain every member id
COLLECT_TIMEOUT_S = 30.0  # workers: report after stop
JOIN_GRACE_S = 10.0

# Targets from the issue.
FORMATION_TARGET_MS = {100: 100.0, 1000: 1000.0}


def process_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


class CountingRedis(redis.Redis):
    """A redis-py client that counts the coordinator's function calls by step and notes when
    each member's JoinGroup first parks (the join function answers ``W``, whose last field is
    the member id: the member now waits for the generation; the threads of one coordinator
    share one read of the wake stream, so a thread's own ``XREAD`` is no sign of parking).

    It hooks redis-py's public ``execute_command`` and ``pipeline`` (the threads of one
    coordinator send concurrent calls together in one pipeline: ``rcoord.batching``), so the
    coordinator runs unchanged (no private method of rcoord is overridden). ``await_reply`` is
    counted per kind (``await_j``/``await_s``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.counts: collections.Counter[str] = collections.Counter()
        self.count_lock = threading.Lock()
        self.parked_at: dict[bytes, float] = {}  # member id -> when its JoinGroup parked
        self.steps = {fn: step for step, fn in Scripts(self).names.items()}

    def step_of(self, args: tuple[Any, ...]) -> str:
        """The step an FCALL runs, counted ("" for any other command)."""
        if not args or str(args[0]).upper() != "FCALL":
            return ""
        fn = args[1].decode() if isinstance(args[1], bytes) else str(args[1])
        step = self.steps.get(fn, fn)
        if step == "await_reply":
            nkeys = int(args[2])
            kind = args[3 + nkeys + 3]  # ARGV[4]: now, group, member, kind
            step = f"await_{kind.decode() if isinstance(kind, bytes) else kind}"
        with self.count_lock:
            self.counts[step] += 1
        return step

    def note_reply(self, step: str, reply: Any) -> None:
        if step == "join_group" and isinstance(reply, list) and reply and reply[0] == b"W":
            self.parked_at.setdefault(bytes(reply[-1]), now())

    def execute_command(self, *args: Any, **options: Any) -> Any:
        step = self.step_of(args)
        reply = super().execute_command(*args, **options)
        self.note_reply(step, reply)
        return reply

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> Any:
        return CountingPipeline(self, transaction, shard_hint)


class CountingPipeline(redis.client.Pipeline):
    """A pipeline of ``CountingRedis``: its calls are counted and noted like single ones."""

    def __init__(self, owner: CountingRedis, transaction: bool, shard_hint: Any) -> None:
        super().__init__(owner.connection_pool, owner.response_callbacks, transaction,
                         shard_hint)
        self.owner = owner

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        steps = [self.owner.step_of(args) for args, _options in self.command_stack]
        replies = super().execute(raise_on_error)
        for step, reply in zip(steps, replies, strict=True):
            self.owner.note_reply(step, reply)
        return replies


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
        client = CountingRedis.from_url(
            spec["url"],
            socket_timeout=SOCKET_TIMEOUT_S,
            socket_connect_timeout=5.0,
            max_connections=len(slots) + 4,
            driver_info=driver_info(),  # as rcoord.connect's clients (no metadata parse per
        )                               # connection)
        coord = GroupCoordinator(client, make_config(spec["namespace"], spec["delay_ms"])).start()
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
        # The KIP-394 round, as Kafka's clients send it (rcoord's worker joins without it: a
        # UUID of its own makes its id). The delay-0 scenario depends on it: the ids handed out
        # are pending, and keep the join phase open until their owners join.
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
            client.parked_at.pop(member_id.encode(), None)
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
            t_parked[i] = client.parked_at.pop(member_id.encode(), None) or t
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
        with client.count_lock:
            client.counts.clear()  # count only the timed part
        cpu0 = process_cpu_s()
        go.set()
    stop_evt.wait(spec["timeout_s"] + 60)
    cpu1 = process_cpu_s()
    with client.count_lock:
        counts = dict(client.counts)
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



def run_formation(
    url: str, r: redis.Redis, nsreg: NamespaceRegistry, *, members: int, procs: int,
    delay_ms: int, hb_interval: float, timeout_s: float,
) -> dict[str, Any]:
    ns = nsreg.new()
    config = make_config(ns, delay_ms)
    parent = GroupCoordinator(r, config).start()
    gk = parent._keys(GROUP)  # GroupCoordinator's documented hook for benches
    k_group, k_members, k_psync, k_deadlines = gk.group, gk.members, gk.syncing, gk.deadlines

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
        calls0, usec0 = script_stats(r)
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
        calls1, usec1 = script_stats(r)
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


