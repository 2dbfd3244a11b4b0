"""Server time per protocol step: what one call of each group step costs inside Redis.

Stable groups on an embedded server (two members, and one for the rebalance rounds); each phase
replays N calls of one kind, captured from the public blocking API's flows (the first
script/function call each step makes; for the fixed overhead and ``await_reply``, the
coordinator's single-step hook), in pipelines, so the server stays busy as under load, and reads
the server's own timing of the calls: ``INFO commandstats`` deltas (EVALSHA + FCALL + FCALL_RO).
A rebalance round is a JoinGroup and then a SyncGroup: to tell them apart, one pass has an
``INFO commandstats`` between every two calls (the difference of two consecutive replies is the
one call between them), which costs the cache, so those two rows read high; a second pass
without it gives the round's cost per call. Every phase runs ``--rounds`` times, the phases
interleaved; the table shows the median and the range over rounds, because this machine's
figures move between runs by up to half.

Rows: a bare call (a script / function that only returns), the fixed overhead of a group step
(``expire_deadlines`` with nothing due: read the clock, settings and group, apply nothing, check
the group's earliest deadline against the published one), a heartbeat of a member whose session
is not the group's earliest, a heartbeat of the member whose session is (in a steady group the
next member to heartbeat is that one), a one-partition OffsetCommit, a JoinGroup and SyncGroup
of a rebalance round of the one-member group (the leader rejoins: the join completes in the same
call, then the leader syncs its assignment), and ``await_reply`` collecting a stored reply.
Issue 12's targets are printed beside them.

Run: ``python bench/step_cost.py`` (``-n`` calls per phase and round, default 4000;
``--rounds``, default 5; ``--redis-url`` for an existing server). Prints a table.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import statistics
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import redis  # noqa: E402

from rcoord import CoordinatorConfig, GroupCoordinator, TopicPartition  # noqa: E402
from rcoord.testing.embedded import EmbeddedServer  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import SCRIPT_COMMANDS, script_stats, stats_of  # noqa: E402

JOIN = dict(protocol_type="consumer", protocols=[("range", b"\x00\x01")],
            session_timeout_ms=60_000, rebalance_timeout_ms=60_000,
            require_known_member_id=False)
BARE_LIB = "#!lua name=rcoord_bench_bare\nredis.register_function('rcoord_bench_bare', " \
           "function() return 1 end)"
TARGETS = {"fixed overhead": "<= 3", "heartbeat": "<= 6", "commit": "<= 15", "join": "<= 20",
           "sync": "<= 20"}


def first_op(flow: Any) -> Any:
    """The first operation a step's flow asks for: its script/function call, to replay."""
    op = next(flow)
    flow.close()
    return op


def call_command(coord: GroupCoordinator, op: Any) -> tuple[Any, ...]:
    """The Redis command that performs ``op``: FCALL of the library function, or EVALSHA."""
    scripts = coord._scripts
    if hasattr(scripts, "command"):
        return tuple(scripts.command(op.name, op.keys, op.args))
    return ("EVALSHA", scripts.sha(op.name), len(op.keys), *op.keys, *op.args)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", type=int, default=4000, help="calls per phase")
    ap.add_argument("--batch", type=int, default=100, help="calls per pipeline")
    ap.add_argument("--rounds", type=int, default=5,
                    help="rounds of every phase, interleaved; the table shows the median")
    ap.add_argument("--redis-url")
    opts = ap.parse_args()
    server = None if opts.redis_url else EmbeddedServer().start()
    try:
        url = opts.redis_url or server.url  # type: ignore[union-attr]
        run(redis.Redis.from_url(url), opts.n, opts.batch, opts.rounds)
    finally:
        if server is not None:
            server.stop()


def run(r: redis.Redis, n: int, batch: int, rounds: int) -> None:
    ns = f"sc{uuid.uuid4().hex[:8]}"
    coord = GroupCoordinator(r, CoordinatorConfig(
        namespace=ns, group_initial_rebalance_delay_ms=0, group_min_session_timeout_ms=100)).start()
    joined = coord.join_group("g", **JOIN)
    mid, gen = joined.member_id, joined.generation_id
    coord.sync_group("g", gen, mid, assignments={mid: b"a"})
    # A two-member group: A (the measured member, 120 s session) and B (60 s), so A's session
    # deadline is not the group's earliest and A's heartbeats and commits leave the partition's
    # deadline index alone, as for most members of a real group.
    a = coord.join_group("g2", **{**JOIN, "session_timeout_ms": 120_000})
    coord.sync_group("g2", a.generation_id, a.member_id, assignments={})
    with cf.ThreadPoolExecutor(2) as pool:
        fb = pool.submit(coord.join_group, "g2", **{**JOIN, "session_timeout_ms": 60_000})
        fa = pool.submit(coord.join_group, "g2", member_id=a.member_id,
                         **{**JOIN, "session_timeout_ms": 120_000})
        ja, jb = fa.result(), fb.result()
        sa = pool.submit(coord.sync_group, "g2", ja.generation_id, ja.member_id,
                         assignments={ja.member_id: b"a", jb.member_id: b"b"})
        sb = pool.submit(coord.sync_group, "g2", jb.generation_id, jb.member_id)
        assert sa.result().error.name == sb.result().error.name == "NONE"
    mid2, gen2 = ja.member_id, ja.generation_id
    keys = coord._keys("g2")
    steps = coord._steps
    bare_sha = r.script_load("return 1")
    has_functions = True
    try:
        r.execute_command("FUNCTION", "LOAD", "REPLACE", BARE_LIB)
    except redis.ResponseError:
        has_functions = False
    if not hasattr(coord._scripts, "command"):  # scripts: make sure each is in the cache
        from rcoord.scripts import lua_source
        for step in ("join_group", "sync_group", "heartbeat", "commit_offsets",
                     "expire_deadlines", "await_reply"):
            r.script_load(lua_source(step))
    tp = TopicPartition("t", 0)
    join_op = first_op(steps.join_group("g", mid, **JOIN))
    heartbeat = call_command(coord, first_op(steps.heartbeat("g2", gen2, mid2)))
    # B's 60 s session is g2's earliest deadline: in a steady group the member whose session is
    # the earliest is the next to heartbeat, so this is the common heartbeat of a real group.
    heartbeat_earliest = call_command(coord, first_op(steps.heartbeat("g2", gen2, jb.member_id)))
    commit = call_command(coord, first_op(steps.commit_offsets(
        "g2", {tp: 7}, member_id=mid2, generation_id=gen2)))
    expire = call_command(coord, first_op(steps.call("expire_deadlines", keys, [])))
    await_reply = call_command(coord, first_op(steps.call("await_reply", keys, [mid2, "s"])))
    join = call_command(coord, join_op)
    # The replayed calls must take the path they are named for (a heartbeat answered DUE, for
    # one, would measure only the check for passed deadlines).
    assert r.execute_command(*expire)[0] == 0
    assert r.execute_command(*heartbeat) == [b"NONE"], r.execute_command(*heartbeat)
    assert r.execute_command(*commit)[0] == b"NONE"
    assert r.execute_command(*await_reply)[0] == b"R"
    assert r.execute_command(*heartbeat_earliest) == [b"NONE"]
    state = {"gen": gen}

    def sync_cmd() -> tuple[Any, ...]:
        # SyncGroup ARGV: now, group, member, generation, ... (lua/sync_group.lua); each
        # rebalance round bumps the generation by one.
        state["gen"] += 1
        op = first_op(steps.sync_group("g", state["gen"], mid, assignments={mid: b"a"}))
        return call_command(coord, op)

    phases: list[tuple[str, Callable[[], list[tuple[Any, ...]]]]] = [
        ("bare EVALSHA", lambda: [("EVALSHA", bare_sha, 0)]),
    ]
    if has_functions:
        phases.append(("bare FCALL", lambda: [("FCALL", "rcoord_bench_bare", 0)]))
    phases += [
        ("fixed overhead (expire_deadlines, nothing due)", lambda: [expire]),
        ("heartbeat", lambda: [heartbeat]),
        ("heartbeat, the group's earliest session", lambda: [heartbeat_earliest]),
        ("commit, 1 partition", lambda: [commit]),
        ("rebalance round", lambda: [join, sync_cmd()]),
        ("await_reply (reply stored)", lambda: [await_reply]),
    ]
    # Which step each replayed call is: its function name, or the script sha of the step.
    names = {heartbeat[1]: "heartbeat", join[1]: "join_group", commit[1]: "commit_offsets",
             expire[1]: "expire_deadlines", await_reply[1]: "await_reply"}
    names[sync_cmd()[1]] = "sync_group"
    state["gen"] -= 1
    # per phase label: per round, step -> (calls, usec)
    per_round: dict[str, list[dict[str, tuple[int, int]]]] = {label: [] for label, _ in phases}
    for _ in range(rounds):
        for label, make in phases:
            per_round[label].append(measure(r, make, n, batch, names,
                                            split=label == "rebalance round"))
    rows = []
    for label, _ in phases:
        if label == "rebalance round":
            for step, row_label in (("join_group", "join (rebalance round, INFO between)"),
                                    ("sync_group", "sync (rebalance round, INFO between)")):
                rows.append(row(row_label, [rd[step] for rd in per_round[label]]))
            rows.append(row("join + sync, per call (rebalance round)",
                            [rd["all"] for rd in per_round[label]], per_round[label][0]["inner"]))
        else:
            rows.append(row(label, [rd["all"] for rd in per_round[label]],
                            per_round[label][0]["inner"]))
    check = coord.join_group("g", member_id=mid, **JOIN)  # the group still works
    assert check.error.name == "NONE", check
    info = r.info("server")
    print(f"server: {info.get('server_name', 'redis')} "
          f"{info.get('valkey_version') or info.get('redis_version')}, {n} calls per phase and "
          f"round, {rounds} rounds, pipelines of {batch}")
    print_table(["step", "calls/round", "commands/call", "server µs/call (median)", "range",
                 "target µs"],
                rows)


def measure(r: redis.Redis, make: Callable[[], list[tuple[Any, ...]]], n: int, batch: int,
            names: dict[Any, str], split: bool) -> dict[str, tuple[int, int]]:
    """Replay ``n`` rounds of ``make()``'s calls in pipelines of ``batch``; the server's own
    time of the calls from ``INFO commandstats`` deltas. Returns (calls, usec): under "all" for
    the whole phase, and, with ``split``, per step too, from an INFO between every two calls
    (the difference of consecutive replies is the one call between them; INFO costs the
    cache, so the split reads high: the "all" figure of a split phase is from a second pass
    without it)."""
    out: dict[str, tuple[int, int]] = {}
    for with_info in ((True, False) if split else (False,)):
        inner0 = inner_calls(r)
        c0, u0 = script_stats(r)
        done = 0
        while done < n:
            pipe = r.pipeline(transaction=False)
            sent: list[str] = []
            for _ in range(min(batch, n - done)):
                for cmd in make():
                    if with_info:
                        pipe.execute_command("INFO", "commandstats")
                    pipe.execute_command(*cmd)
                    sent.append(names.get(cmd[1], str(cmd[1])))
                done += 1
            if with_info:
                pipe.execute_command("INFO", "commandstats")
            replies = pipe.execute(raise_on_error=False)
            for reply in replies:
                if isinstance(reply, Exception):
                    raise reply
            if with_info:
                infos = [stats_of(x) for x in replies[0::2]]
                for i, step in enumerate(sent):
                    calls, usec = out.get(step, (0, 0))
                    out[step] = (calls + 1, usec + infos[i + 1][1] - infos[i][1])
        c1, u1 = script_stats(r)
        if not with_info:
            out["all"] = (c1 - c0, u1 - u0)
            out["inner"] = (c1 - c0, inner_calls(r) - inner0)
    return out


def inner_calls(r: redis.Redis) -> int:
    """Commands run so far other than script/function calls and INFO: the commands the
    steps' scripts ran (each costs about a microsecond of server time inside a script)."""
    stats = r.info("commandstats")
    skip = {f"cmdstat_{c}" for c in (*SCRIPT_COMMANDS, "info")}
    return sum(int(v.get("calls", 0)) for k, v in stats.items() if k not in skip)


def row(label: str, per_round: list[tuple[int, int]],
        inner: tuple[int, int] | None = None) -> list[str]:
    """One table row: calls per round, commands each call ran, the median over rounds of µs per
    call and the range."""
    target = next((v for k, v in TARGETS.items() if label.startswith(k)), "")
    rates = sorted(u / max(c, 1) for c, u in per_round)
    commands = "-" if inner is None else f"{inner[1] / max(inner[0], 1):.1f}"
    return [label, f"{per_round[0][0]:,}", commands, f"{statistics.median(rates):.1f}",
            f"{rates[0]:.1f}-{rates[-1]:.1f}", target]


def print_table(header: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=True)]
    print("| " + " | ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for rw in rows:
        print("| " + " | ".join(str(x).ljust(w) for x, w in zip(rw, widths, strict=True)) + " |")


if __name__ == "__main__":
    main()
