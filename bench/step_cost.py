"""Server time per protocol step: what one call of each group step costs inside Redis.

Stable groups on an embedded server (two members, and one for the rebalance rounds); each phase
replays N calls of one kind, captured from the public blocking API's flows (the first function
call each step makes; for the fixed overhead and ``await_reply``, the coordinator's single-step
hook), in pipelines, so the server stays busy as under load, and reads the server's own timing
of the calls: ``INFO commandstats`` deltas (FCALL, and EVALSHA for the bare script). A rebalance
round is a JoinGroup and then a SyncGroup: to tell them apart, one pass has an ``INFO
commandstats`` between every two calls (the difference of two consecutive replies is the one
call between them), which costs the cache, so those two rows read high; a second pass without
it gives the round's cost per call. "commands/call" counts the commands each call ran inside
the server (every one costs about a microsecond there). Every phase runs ``--rounds`` times, the
phases interleaved; the table shows the median and the range over rounds, because this
machine's figures move between runs by up to half.

``--against REV`` loads the library of another revision (built by that revision's own code, from
``git archive``) next to this tree's, on the same server, with its own groups, and runs every
phase for both, interleaved call batch by call batch, so both see the same machine: the table
then gives both medians and the median of this tree's time over REV's per round. That ratio is
the figure to trust for a change; the absolute figures move with the load.

Rows: a bare call (a script / function that only returns), the fixed overhead of a group step
(``expire_deadlines`` with nothing due: read the clock, settings and group, apply nothing; the
group's published deadline lies ahead, so its deadlines are not read), a heartbeat of a member
whose session is not the group's earliest, a heartbeat of the member whose session is (in a steady
group the next member to heartbeat is that one), a one-partition OffsetCommit, a JoinGroup and
SyncGroup of a rebalance round of the one-member group (the leader rejoins: the join completes in
the same
call, then the leader syncs its assignment), and ``await_reply`` collecting a stored reply.
Issue 12's targets are printed beside them, and so is what each row's calls cost when they run
only their Redis commands ("its commands alone"): the commands each call ran, recorded through
a copy of the library whose ``redis.call`` notes them, replayed by a function that does nothing
else, with the same keys and arguments. That is the floor under a step's time for as long as it
runs those commands; the rest of its time is its Lua. Without ``--against`` only.

Run: ``python bench/step_cost.py`` (``-n`` calls per phase and round, default 4000;
``--rounds``, default 5; ``--against REV``; ``--redis-url`` for an existing server). Prints a
table.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import redis

from rcoord import CoordinatorConfig, GroupCoordinator, TopicPartition
from rcoord.testing.embedded import EmbeddedServer
from rcoord.testing.library import RECORDED_FUNCTION, recording_copy

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import SCRIPT_COMMANDS, script_stats, server_label, stats_of

JOIN = {"protocol_type": "consumer", "protocols": [("range", b"\x00\x01")],
        "session_timeout_ms": 60_000, "rebalance_timeout_ms": 60_000,
        "require_known_member_id": False}
BARE_LIB = "#!lua name=rcoord_bench_bare\nredis.register_function('rcoord_bench_bare', " \
           "function() return 1 end)"
RECORDING_LIB = "rcoord_bench_rec"
FLOOR_LIB = "rcoord_bench_floor"
TARGETS = {"fixed overhead": "<= 3", "heartbeat": "<= 6", "commit": "<= 15", "join": "<= 20",
           "sync": "<= 20"}
ROUND = "rebalance round"

Make = Callable[[], list[tuple[Any, ...]]]


@dataclass
class Variant:
    """One library under test: its phases (label -> the calls of one repetition) and which
    step each replayed function name is."""

    name: str
    phases: dict[str, Make]
    steps: dict[Any, str]
    coord: GroupCoordinator | None = None
    # per phase label: per round, step (or "all", "inner") -> (calls, usec or commands)
    results: dict[str, list[dict[str, tuple[int, int]]]] = field(default_factory=dict)


def first_op(flow: Any) -> Any:
    """The first operation a step's flow asks for: its function call, to replay."""
    op = next(flow)
    flow.close()
    return op


def call_command(coord: GroupCoordinator, op: Any) -> tuple[Any, ...]:
    """The FCALL that performs ``op``."""
    return tuple(coord._scripts.command(op.name, op.keys, op.args))


def library_of(rev: str) -> tuple[str, str]:
    """(name, FUNCTION LOAD source) of the library revision ``rev`` builds, by its own code."""
    with tempfile.TemporaryDirectory(prefix="rcoord-ab-") as tmp:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        out = subprocess.run(
            [sys.executable, "-c", ("import sys; from rcoord.scripts import library_source; "
                                    "n, s = library_source(); sys.stdout.write(n + '\\n' + s)")],
            cwd=tmp, env={**os.environ, "PYTHONPATH": tmp}, check=True, capture_output=True,
            text=True).stdout
    name, source = out.split("\n", 1)
    return name, source


def use_library(coord: GroupCoordinator, name: str, source: str) -> None:
    """Point ``coord``'s calls at library ``name`` (loaded on first use, as its own would be)."""
    scripts = coord._scripts
    scripts.library, scripts._source = name, source
    scripts.names = {step: f"{name}_{step}" for step in scripts.names}


def recorded_commands(r: redis.Redis, coord: GroupCoordinator,
                      calls: list[tuple[Any, ...]]) -> list[list[list[bytes]]]:
    """The commands each of ``calls`` runs inside the server, in order: the calls run once,
    in order, through a copy of the library whose ``redis.call`` notes its arguments
    (rcoord.testing.library.recording_copy), so they change the groups as the measured calls
    would."""
    scripts = coord._scripts
    r.function_load(recording_copy(scripts.library, scripts._source, RECORDING_LIB),
                    replace=True)
    out = []
    for cmd in calls:
        name = cmd[1].decode() if isinstance(cmd[1], bytes) else str(cmd[1])
        r.execute_command(cmd[0], name.replace(scripts.library, RECORDING_LIB, 1), *cmd[2:])
        out.append(r.fcall(RECORDED_FUNCTION, 0))
    r.function_delete(RECORDING_LIB)
    return out


def lua_literal(arg: bytes | int) -> str:
    """``arg`` as a Lua string literal (every byte outside printable ASCII, and the quote and
    backslash, as a three-digit decimal escape, which Lua 5.1 reads whatever follows it)."""
    raw = str(arg).encode() if isinstance(arg, int) else arg
    return '"' + "".join(chr(b) if 32 <= b < 127 and b not in b'"\\' else f"\\{b:03d}"
                         for b in raw) + '"'


def commands_alone(r: redis.Redis, v: Variant) -> Variant:
    """What each phase's calls would cost if they ran only their Redis commands: one library
    function per recorded call that replays, with the same keys and arguments passed in (so
    the call itself costs the same), the exact commands the step ran, and nothing else. The
    floor a step's Lua cannot go under without running fewer commands; the replay repeats the
    recorded writes (the same values again), which costs about what the step's writes do."""
    lines = [f"#!lua name={FLOOR_LIB}"]
    phases: dict[str, Make] = {}
    steps: dict[Any, str] = {}
    made = 0
    for label, make in v.phases.items():
        for cmd in make():  # one call first, so the recorded one takes the measured calls' path
            r.execute_command(*cmd)
        calls = make()
        floors = []
        for cmd, recorded in zip(calls, recorded_commands(r, v.coord, calls), strict=True):
            made += 1
            fn = f"{FLOOR_LIB}_{made}"
            body = ", ".join("{" + ", ".join(lua_literal(a) for a in c) + "}" for c in recorded)
            lines.append(f"local C{made} = {{{body}}}")
            lines.append(f"redis.register_function('{fn}', function() for _, c in ipairs(C{made}) "
                         "do redis.call(unpack(c)) end return 1 end)")
            floors.append(("FCALL", fn, *cmd[2:]))
            steps[fn] = v.steps.get(cmd[1], str(cmd[1]))
        phases[label] = lambda floors=floors: floors  # type: ignore[misc]
    r.function_load("\n".join(lines), replace=True)
    return Variant("commands alone", phases, steps)


def prepare(r: redis.Redis, name: str, library: tuple[str, str] | None) -> Variant:
    """Groups to measure on, in a namespace of their own, and the calls to replay."""
    coord = GroupCoordinator(r, CoordinatorConfig(
        namespace=f"sc{uuid.uuid4().hex[:8]}", group_initial_rebalance_delay_ms=0,
        group_min_session_timeout_ms=100))
    if library is not None:
        use_library(coord, *library)
    coord.start()
    joined = coord.join_group("g", **JOIN)
    mid, gen = joined.member_id, joined.generation_id
    coord.sync_group("g", gen, mid, assignments={mid: b"a"})
    # A two-member group: A (the measured member, 120 s session) and B (60 s), so A's session
    # deadline is not the group's earliest, as for most members of a real group.
    a = coord.join_group("g2", **{**JOIN, "session_timeout_ms": 120_000})
    coord.sync_group("g2", a.generation_id, a.member_id, assignments={})
    keys = coord._keys("g2")
    with cf.ThreadPoolExecutor(2) as pool:
        fb = pool.submit(coord.join_group, "g2", **{**JOIN, "session_timeout_ms": 60_000})
        # A rejoins once B's join has started the rebalance: had A come first, its rejoin would
        # form a generation alone, and B's join then another one that A never rejoins.
        waited = time.monotonic() + 30
        while r.hget(keys.group, "state") != b"PreparingRebalance":
            assert time.monotonic() < waited, "B's JoinGroup did not start a rebalance"
            time.sleep(0.001)
        fa = pool.submit(coord.join_group, "g2", member_id=a.member_id,
                         **{**JOIN, "session_timeout_ms": 120_000})
        ja, jb = fa.result(), fb.result()
        sa = pool.submit(coord.sync_group, "g2", ja.generation_id, ja.member_id,
                         assignments={ja.member_id: b"a", jb.member_id: b"b"})
        sb = pool.submit(coord.sync_group, "g2", jb.generation_id, jb.member_id)
        assert sa.result().error.name == sb.result().error.name == "NONE", (
            sa.result(), sb.result())
    mid2, gen2 = ja.member_id, ja.generation_id
    steps = coord._steps
    tp = TopicPartition("t", 0)
    heartbeat = call_command(coord, first_op(steps.heartbeat("g2", gen2, mid2)))
    # B's 60 s session is g2's earliest deadline: in a steady group the member whose session is
    # the earliest is the next to heartbeat, so this is the common heartbeat of a real group.
    heartbeat_earliest = call_command(coord, first_op(steps.heartbeat("g2", gen2, jb.member_id)))
    commit = call_command(coord, first_op(steps.commit_offsets(
        "g2", {tp: 7}, member_id=mid2, generation_id=gen2)))
    expire = call_command(coord, first_op(steps.call("expire_deadlines", keys, [])))
    await_reply = call_command(coord, first_op(steps.call("await_reply", keys, [mid2, "s"])))
    join = call_command(coord, first_op(steps.join_group("g", mid, **JOIN)))
    # The replayed calls must take the path they are named for (a heartbeat answered DUE, for
    # one, would measure only the check for passed deadlines).
    assert r.execute_command(*expire)[0] == 0
    assert r.execute_command(*heartbeat) == [b"NONE"], r.execute_command(*heartbeat)
    assert r.execute_command(*heartbeat_earliest) == [b"NONE"]
    assert r.execute_command(*commit)[0] == b"NONE"
    assert r.execute_command(*await_reply)[0] == b"R"
    generation = {"gen": gen}

    def sync_cmd(advance: bool = True) -> tuple[Any, ...]:
        # Each rebalance round bumps the generation by one.
        nxt = generation["gen"] + 1
        if advance:
            generation["gen"] = nxt
        op = first_op(steps.sync_group("g", nxt, mid, assignments={mid: b"a"}))
        return call_command(coord, op)

    phases: dict[str, Make] = {
        "fixed overhead (expire_deadlines, nothing due)": lambda: [expire],
        "heartbeat": lambda: [heartbeat],
        "heartbeat, the group's earliest session": lambda: [heartbeat_earliest],
        "commit, 1 partition": lambda: [commit],
        ROUND: lambda: [join, sync_cmd()],
        "await_reply (reply stored)": lambda: [await_reply],
    }
    names = {heartbeat[1]: "heartbeat", join[1]: "join_group", commit[1]: "commit_offsets",
             expire[1]: "expire_deadlines", await_reply[1]: "await_reply",
             sync_cmd(advance=False)[1]: "sync_group"}
    return Variant(name, phases, names, coord)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", type=int, default=4000, help="calls per phase and round")
    ap.add_argument("--batch", type=int, default=100, help="calls per pipeline")
    ap.add_argument("--rounds", type=int, default=5,
                    help="rounds of every phase, interleaved; the table shows the median")
    ap.add_argument("--against", metavar="REV",
                    help="also measure the library of git revision REV, interleaved")
    ap.add_argument("--redis-url")
    opts = ap.parse_args()
    other = library_of(opts.against) if opts.against else None
    server = None if opts.redis_url else EmbeddedServer().start()
    try:
        url = opts.redis_url or server.url  # type: ignore[union-attr]
        run(redis.Redis.from_url(url), opts.n, opts.batch, opts.rounds, opts.against, other)
    finally:
        if server is not None:
            server.stop()


def run(r: redis.Redis, n: int, batch: int, rounds: int, against: str | None = None,
        other: tuple[str, str] | None = None) -> None:
    variants = [prepare(r, "this tree", None)]
    if against is not None:
        variants.append(prepare(r, against, other))
    bare_sha = r.script_load("return 1")
    bare: dict[str, Make] = {"bare EVALSHA": lambda: [("EVALSHA", bare_sha, 0)]}
    try:
        r.execute_command("FUNCTION", "LOAD", "REPLACE", BARE_LIB)
        bare["bare FCALL"] = lambda: [("FCALL", "rcoord_bench_bare", 0)]
    except redis.ResponseError:
        pass
    base = Variant("bare", bare, {})
    # Beside this tree's calls (alone, not with --against), the same calls' commands alone.
    # (Their own groups: a replay writes what the recorded calls wrote, the same values again.)
    floor = commands_alone(r, prepare(r, "commands alone", None)) if against is None else None
    measured = variants if floor is None else [*variants, floor]
    labels = [*bare, *variants[0].phases]
    for _ in range(rounds):
        for label in labels:
            for v in ([base] if label in bare else measured):
                # Batch by batch, so two variants see the same moments of the machine.
                v.results.setdefault(label, []).append(
                    measure(r, v.phases[label], n, batch, v.steps, split=label == ROUND))
    info = r.info("server")
    print(f"server: {server_label(info)}, {n} calls per phase and "
          f"round, {rounds} rounds, pipelines of {batch}")
    rows = []
    for label in labels:
        for row_label, pick in row_specs(label):
            cells = []
            for v in ([base] if label in bare else variants):
                per_round = [pick(rd) for rd in v.results[label]]
                inner = v.results[label][0].get("inner") if pick is pick_all else None
                cells.append((per_round, inner))
            out = row(row_label, cells, len(variants))
            if floor is not None:
                alone = "" if label in bare else f"{median_rate(map(pick, floor.results[label])):.1f}"
                out.insert(-1, alone)
            rows.append(out)
    header = ["step", "calls/round", "commands/call", "server µs/call (median)", "range"]
    if floor is not None:
        header.append("its commands alone µs")
    if against is not None:
        header = ["step", "calls/round", "commands/call", "µs/call", f"{against}: commands/call",
                  f"{against}: µs/call", "this / " + against]
    print_table([*header, "target µs"], rows)


def median_rate(per_round: Any) -> float:
    """Median over rounds of µs per call, from (calls, usec) per round."""
    return statistics.median(u / max(c, 1) for c, u in per_round)


def pick_all(rd: dict[str, tuple[int, int]]) -> tuple[int, int]:
    return rd["all"]


def row_specs(label: str) -> list[tuple[str, Callable[[dict[str, tuple[int, int]]],
                                                       tuple[int, int]]]]:
    """The table rows of one phase and how each reads a round's figures."""
    if label != ROUND:
        return [(label, pick_all)]
    return [("join (rebalance round, INFO between)", lambda rd: rd["join_group"]),
            ("sync (rebalance round, INFO between)", lambda rd: rd["sync_group"]),
            ("join + sync, per call (rebalance round)", pick_all)]


def measure(r: redis.Redis, make: Make, n: int, batch: int, names: dict[Any, str],
            split: bool) -> dict[str, tuple[int, int]]:
    """Replay ``n`` rounds of ``make()``'s calls in pipelines of ``batch``; the server's own
    time of the calls from ``INFO commandstats`` deltas. Returns (calls, usec): under "all" for
    the whole phase, and, with ``split``, per step too, from an INFO between every two calls
    (the difference of consecutive replies is the one call between them; INFO costs the
    cache, so the split reads high: the "all" figure of a split phase is from a second pass
    without it); and under "inner", (calls, commands they ran)."""
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
    steps' scripts ran."""
    stats = r.info("commandstats")
    skip = {f"cmdstat_{c}" for c in (*SCRIPT_COMMANDS, "info")}
    return sum(int(v.get("calls", 0)) for k, v in stats.items() if k not in skip)


def row(label: str, cells: list[tuple[list[tuple[int, int]], tuple[int, int] | None]],
        variants: int) -> list[str]:
    """One table row. ``cells``: per variant, (calls and usec per round, calls and inner
    commands). One variant: calls, commands, median µs/call, range. Two: each variant's
    commands and median µs/call, and the median over rounds of the first's time over the
    second's."""
    target = next((v for k, v in TARGETS.items() if label.startswith(k)), "")
    rates = [[u / max(c, 1) for c, u in per_round] for per_round, _ in cells]

    def commands(inner: tuple[int, int] | None) -> str:
        return "-" if inner is None else f"{inner[1] / max(inner[0], 1):.1f}"

    first_calls = f"{cells[0][0][0][0]:,}"
    if variants == 1 or len(cells) == 1:
        ordered = sorted(rates[0])
        out = [label, first_calls, commands(cells[0][1]), f"{statistics.median(ordered):.1f}",
               f"{ordered[0]:.1f}-{ordered[-1]:.1f}"]
        if variants == 2:
            out = [*out[:4], "", "", ""]
        return [*out, target]
    ratio = statistics.median(a / b for a, b in zip(rates[0], rates[1], strict=True) if b)
    return [label, first_calls, commands(cells[0][1]), f"{statistics.median(rates[0]):.1f}",
            commands(cells[1][1]), f"{statistics.median(rates[1]):.1f}", f"{ratio:.2f}", target]


def print_table(header: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=True)]
    print("| " + " | ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for rw in rows:
        print("| " + " | ".join(str(x).ljust(w) for x, w in zip(rw, widths, strict=True)) + " |")


if __name__ == "__main__":
    main()
