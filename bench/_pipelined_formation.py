"""Section 1b of the membership bench: formation driven by one pipelined client.

See bench/README.md ("1b. Formation driven by one pipelined client").
"""

from __future__ import annotations

import sys
import time
from typing import Any

import _common  # noqa: F401  (puts the repository root on sys.path)
import redis
from _common import (
    NamespaceRegistry,
    fmt_ms,
    now,
    print_table,
    server_cpu_s,
)
from _membership_setup import (
    GROUP,
    PROTOCOL_TYPE,
    PROTOCOLS,
    SESSION_TIMEOUT_MS,
    assignment_for,
    make_config,
)

from rcoord import Errors, GroupCoordinator
from rcoord.contract import reply_field
from rcoord.scripts import Scripts


def run_pipelined_formation(r: redis.Redis, nsreg: NamespaceRegistry, *, members: int,
                            delay_ms: int, timeout_s: float) -> dict[str, Any]:
    """Form a group by sending each protocol step for all members in one pipeline.

    The scripts never block (a parked call returns 'W' and the client waits), so one client can
    play every member: every member's JoinGroup (as the worker sends it: no MEMBER_ID_REQUIRED
    round), then (once the join timer has fired) every member's reply (read as a parked caller
    does: HGET, then await_reply if it is not there), then every SyncGroup (followers first, the
    leader last), then the followers' replies. Time spent waiting for the join timer is not
    counted.
    """
    from rcoord.protocol.join import JoinGroupResult, JoinRequest
    from rcoord.protocol.sync import SyncGroupResult, SyncRequest

    ns = nsreg.new()
    coord = GroupCoordinator(r, make_config(ns, delay_ms)).start()
    gk = coord._keys(GROUP)  # GroupCoordinator's documented hook for benches
    keys = gk.all()
    scripts = Scripts(r)  # the public function library, to queue raw FCALLs in pipelines
    scripts.load()
    scripts.load_library()  # the library must be there before raw pipelined FCALLs

    def run(calls: list[tuple[str, list[Any]]]) -> list[Any]:
        pipe = r.pipeline(transaction=False)
        for step, args in calls:
            pipe.execute_command(*scripts.command(step, keys, ["", GROUP, *args]))
        return pipe.execute()

    def join_args(i: int) -> list[Any]:
        """A new member's JoinGroup as the worker sends it (rcoord.client): a UUID of its own
        (JoinRequest.build makes one) and no MEMBER_ID_REQUIRED round."""
        return JoinRequest.build(
            GROUP, "", protocol_type=PROTOCOL_TYPE, protocols=PROTOCOLS,
            session_timeout_ms=SESSION_TIMEOUT_MS, rebalance_timeout_ms=None,
            group_instance_id=None, client_id=f"m{i}", client_host="",
            require_known_member_id=False, reason=None,
        ).args()

    def collect(got: dict[str, Any], todo: list[str], kind: str) -> int:
        """Collect the replies of ``todo`` into ``got`` (shaped as ``await_reply``'s) as woken
        parked callers do (rcoord.protocol.park): read the stored reply with a plain HGET, and
        call ``await_reply`` only for those not there yet. Returns the function calls made.

        A large group's join completion and the leader's assignment are written in chunks
        (prelude.lua): each call applies at most one more chunk, so a member whose reply is not
        written yet is answered 'W' and looks again, as a parked member does when the wake
        stream moves."""
        made = 0
        for _ in range(100):
            if not todo:
                break
            pipe = r.pipeline(transaction=False)
            for mid in todo:
                pipe.hget(gk.replies, reply_field(kind, mid))
            got.update({mid: [b"R", blob] for mid, blob in zip(todo, pipe.execute()) if blob})
            todo = [mid for mid in todo if mid not in got]
            if not todo:
                break
            polled = run([("await_reply", [mid, kind]) for mid in todo])
            made += len(todo)
            got.update({mid: x for mid, x in zip(todo, polled) if x[0] == b"R"})
            todo = [mid for mid, x in zip(todo, polled) if x[0] != b"R"]
        return made

    res: dict[str, Any] = {"members": members, "delay_ms": delay_ms, "ok": False, "problems": []}
    try:
        # Untimed: the JoinGroups' arguments.
        joins = [("join_group", join_args(i)) for i in range(members)]
        scpu0 = server_cpu_s(r)
        timed = 0.0
        calls = 0

        t = now()
        replies = run(joins)
        register = now() - t
        calls += len(joins)
        parked = sum(1 for x in replies if x[0] == b"W")
        if parked != members:
            res["problems"].append(f"{members - parked} JoinGroups were not parked")
        ids = [x[4].decode() for x in replies if x[0] == b"W"]  # ('W', wake, due, now, member id)

        # Wait (untimed) for the join timer; the call that applies it is timed.
        complete = 0.0
        deadline = now() + timeout_s
        state = b""
        last: Any = None
        while now() < deadline:
            score = r.zscore(gk.deadlines, "join")
            if score is not None:
                sec, usec = r.time()
                wait = (score - (sec * 1000 + usec / 1000)) / 1000.0
                if wait > 0:
                    time.sleep(wait + 0.001)
            t = now()
            last = run([("await_reply", [ids[0], "j"])])[0]
            complete += now() - t
            calls += 1
            state = r.hget(gk.group, "state") or b""
            if state != b"PreparingRebalance":
                break
        if state != b"CompletingRebalance":
            raise RuntimeError(f"join phase did not complete (state {state!r})")

        t = now()
        got: dict[str, Any] = {ids[0]: last} if last[0] == b"R" else {}
        calls += collect(got, [mid for mid in ids if mid not in got], "j")
        collect_join = now() - t
        joined = [JoinGroupResult.decode(bytes(got[mid][1])) if mid in got else None
                  for mid in ids]
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
        results = {mid: x for mid, x in zip(followers + [leader], sreplies) if x[0] == b"R"}
        calls += collect(results, waiting, "s")
        collect_sync = now() - t
        scpu1 = server_cpu_s(r)
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
        if r.hget(gk.group, "state") != b"Stable":
            res["problems"].append("group not Stable after the SyncGroup round")
        timed = register + complete + collect_join + sync + collect_sync
        res.update(
            ok=not res["problems"], gen=gen, calls=calls, total_ms=timed * 1000,
            register_ms=register * 1000, complete_ms=complete * 1000,
            collect_join_ms=collect_join * 1000, sync_ms=sync * 1000,
            collect_sync_ms=collect_sync * 1000, server_cpu_ms=(scpu1 - scpu0) * 1000,
        )
    except Exception as exc:  # noqa: BLE001 - any failure is reported as a PROBLEM row
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


