"""Where the Lua time of a rebalance round's JoinGroup and SyncGroup goes: a profile by function.

An instrumented copy of the Functions library (``profiled_copy``) replaces every top-level
``local function`` of the shared part (clock.lua, deadline_index.lua, prelude.lua) and of the
two step files (join_group.lua, sync_group.lua) by a wrapper that adds its inclusive CPU time
(``os.clock()``) and its calls to a table; ``redis.call`` is wrapped the same way and counted
per command name ("redis.call HSET"), and each registered function's whole body per step
("(step total)"). The wrappers are assigned over the locals after their file's definitions
(a Lua local function's callers reach it through the same variable, so they call the
wrapper), before the step registers. step_cost.py's rebalance round of the one-member group
(the leader rejoins, the join completes in the same call, then the leader syncs its
assignment) runs ``-n`` times through the copy, and the table gives, per step: each function's
calls per step, inclusive µs per step, its share of the step's total, and its self time (its
inclusive time less that of the wrapped functions and commands it called).

How the instrumentation distorts, and what is subtracted:

- ``os.clock()`` is the process's CPU time (CLOCK_PROCESS_CPUTIME_ID: every thread of the
  server, so keep the machine quiet), with microsecond resolution: one call's figure is noise,
  the average over thousands is not. Each wrapped call costs two ``os.clock()`` calls and the
  bookkeeping, about a microsecond, which is as much as a small helper's own work.
- The cost of a wrapper is measured twice. In a tight loop on the server (``calibrate``: an
  empty function called through the same wrapper and directly): ``E``, what a wrapped call
  adds to its caller's time, and ``I``, the part of it between its own two clock readings
  (what an empty function's inclusive time reads). That E is too low among a step's real work
  (cache and allocator effects; 2026-11-30: 1.2 µs, against 1.46 in place), so E is taken in
  place: the rounds run in batches, each beside as many through the library itself (its own
  groups, the same server), and E is the median difference of their server time per round
  (``INFO commandstats``) over the wrapped calls a round makes (counted exactly); I is scaled
  with it. A function's figure is its raw inclusive time minus E for every wrapped call under
  it and I for each of its own calls; a step's total, minus E for every wrapped call in it (so
  the totals add up to the library's own time less the calls themselves); a self time, minus
  E - I for each wrapped call it made and its own I.
- E is one figure for every wrapper; a real wrapper costs more or less by where it runs, so
  the self time of a function that makes many wrapped calls (transition, finish, complete_join)
  is over-corrected and may read 0, and the smallest, most called helpers (set_g) keep some
  of their wrappers' cost. Read the inclusive figures and shares, not the decimals, and
  measure a change with ``step_cost.py --against``.
- A recursive call is counted but not timed twice (only the outermost call of a function
  times). A call that raises (an illegal-state error) leaves no figure (each step's call
  starts afresh); the round never raises.
- The copy's step totals are the Lua inside the function body: ``INFO commandstats`` (bench/
  step_cost.py) adds the call itself (about a microsecond with 16 keys).

Run: ``python bench/lua_profile.py`` (``-n`` rounds, default 5000, in ``--rounds`` batches,
default 5; ``--least``: leave out functions under that many µs per step, default 0.05;
``--redis-url`` for an existing server). Prints a table per step.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import redis

from rcoord.scripts import library_source, lua_dir
from rcoord.testing.library import library_copy

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import print_table, script_stats, server_label, start_server
from step_cost import ROUND, prepare

PROFILED_LIB = "rcoord_bench_prof"
DUMP = "rcoord_bench_pdump"  # (not under the copy's prefix: not profiled)
CALIBRATE = "rcoord_bench_pcalibrate"
SHARED_FILES = ("clock", "deadline_index", "prelude")
STEP_FILES = {"join_group": "group_step('join_group',", "sync_group": "group_step('sync_group',"}
TOTAL = "(step total)"

# Put in front of the copy's body. PROF_WRAP(name, fn) returns fn timed; redis (a local that
# shadows the global for the whole library) times redis.call per command and each registered
# function's whole call per step. Four locals of the main chunk (Lua 5.1 allows 200).
_PROFILER = r"""
local PROF = {stats = {}, step = '-', n = 0, clock = function() return 0 end, child = 0,
              kids = 0, active = {}}
local function PROF_WRAP(name, fn)
  local function done(t0, n0, child, kids, ...)
    local t1 = PROF.clock()
    PROF.active[name] = nil
    local per = PROF.stats[PROF.step]
    if not per then per = {}; PROF.stats[PROF.step] = per end
    local s = per[name]
    if not s then s = {0, 0, 0, 0, 0}; per[name] = s end
    local dt = t1 - t0
    s[1], s[2], s[3] = s[1] + 1, s[2] + dt, s[3] + (PROF.n - n0)
    s[4], s[5] = s[4] + (dt - PROF.child), s[5] + PROF.kids
    PROF.child, PROF.kids = child + dt, kids + 1
    return ...
  end
  return function(...)
    PROF.n = PROF.n + 1
    if PROF.active[name] then
      local per = PROF.stats[PROF.step]
      local s = per and per[name]
      if s then s[1] = s[1] + 1 end
      return fn(...)
    end
    PROF.active[name] = true
    local n0, child, kids = PROF.n, PROF.child, PROF.kids
    PROF.child, PROF.kids = 0, 0
    return done(PROF.clock(), n0, child, kids, fn(...))
  end
end
local function PROF_REDIS() return redis end -- the global, as each call finds it
local redis = (function()
  local timed = {}
  local function call(cmd, ...)
    local f = timed[cmd]
    if not f then
      f = PROF_WRAP('redis.call ' .. cmd:upper(), function(...) return PROF_REDIS().call(...) end)
      timed[cmd] = f
    end
    return f(cmd, ...)
  end
  local function register_function(spec, callback)
    if callback ~= nil then spec = {function_name = spec, callback = callback} end
    local name, fn = spec.function_name, spec.callback
    if name:sub(1, #LIB + 1) ~= LIB .. '_' then return PROF_REDIS().register_function(spec) end
    local step = name:sub(#LIB + 2) -- (the global string is not there while it loads)
    local total = PROF_WRAP('""" + TOTAL + r"""', fn)
    spec.callback = function(keys, args)
      PROF.clock = os.clock -- a library may not read the global os while it loads
      PROF.step, PROF.n, PROF.child, PROF.kids, PROF.active = step, 0, 0, 0, {}
      return total(keys, args)
    end
    return PROF_REDIS().register_function(spec)
  end
  return {call = call, pcall = function(...) return PROF_REDIS().pcall(...) end,
          error_reply = function(...) return PROF_REDIS().error_reply(...) end,
          register_function = register_function}
end)()
"""

# After the copy's body: the dump (every figure since the last dump, then cleared) and the
# calibration of the wrapper's own cost.
_TAIL = r"""
redis.register_function('""" + DUMP + r"""', function()
  local out = {}
  for step, per in pairs(PROF.stats) do
    for name, s in pairs(per) do
      out[#out + 1] = {step, name, tostring(s[1]), string.format('%.17g', s[2]),
                       tostring(s[3]), string.format('%.17g', s[4]), tostring(s[5])}
    end
  end
  PROF.stats = {}
  return out
end)
redis.register_function('""" + CALIBRATE + r"""', function(_, args)
  local m = tonumber(args[1])
  PROF.clock = os.clock
  local function empty() end
  local wrapped = PROF_WRAP('empty', empty)
  PROF.step = '(calibration)'
  local t0 = os.clock()
  for _ = 1, m do empty() end
  local t1 = os.clock()
  for _ = 1, m do wrapped() end
  local t2 = os.clock()
  local inner = PROF.stats['(calibration)'].empty[2]
  PROF.stats['(calibration)'] = nil
  return {string.format('%.17g', ((t2 - t1) - (t1 - t0)) / m),
          string.format('%.17g', inner / m - (t1 - t0) / m)}
end)
"""


def top_functions(text: str) -> list[str]:
    """The names of a Lua file's top-level ``local function`` definitions, in order."""
    return re.findall(r"^local function (\w+)\(", text, re.MULTILINE)


def wraps(names: list[str]) -> str:
    return "".join(f"{n} = PROF_WRAP('{n}', {n})\n" for n in names)


def profiled_copy(name: str, source: str, copy: str = PROFILED_LIB) -> str:
    """The FUNCTION LOAD source of library ``name`` (``source``) under the name ``copy``, every
    top-level function of the shared part and of the join and sync step files timed."""
    base = lua_dir()
    prelude = (base / "prelude.lua").read_text()
    at = source.index(prelude) + len(prelude)
    shared = [f for part in SHARED_FILES for f in top_functions((base / f"{part}.lua").read_text())]
    source = f"{source[:at]}\n{wraps(shared)}{source[at:]}"
    for step, registration in STEP_FILES.items():
        at = source.index("\n" + registration) + 1
        names = top_functions((base / f"{step}.lua").read_text())
        source = f"{source[:at]}{wraps(names)}{source[at:]}"
    return library_copy(name, source, copy, before=_PROFILER, after=_TAIL)


Stat = tuple[int, float, int, float, int]


def dump(r: redis.Redis) -> dict[str, dict[str, Stat]]:
    """Per step, per function: (calls, raw inclusive seconds, wrapped calls under it, raw self
    seconds, wrapped calls it made itself)."""
    out: dict[str, dict[str, Stat]] = {}
    for step, fn, calls, secs, under, own, kids in r.fcall(DUMP, 0):
        out.setdefault(step.decode(), {})[fn.decode()] = (
            int(calls), float(secs), int(under), float(own), int(kids))
    return out


def calibrate(r: redis.Redis, m: int = 200_000, rounds: int = 5) -> tuple[float, float]:
    """(E, I) in seconds: the median over ``rounds`` of what a wrapped call adds to its caller,
    and of what falls between its own clock readings."""
    got = [tuple(float(x) for x in r.fcall(CALIBRATE, 0, m)) for _ in range(rounds)]
    return (statistics.median(e for e, _ in got), statistics.median(i for _, i in got))


def run_rounds(r: redis.Redis, make: Any, n: int, batch: int = 100) -> None:
    """``n`` rebalance rounds (``make()``'s calls) in pipelines of ``batch`` rounds."""
    done = 0
    while done < n:
        pipe = r.pipeline(transaction=False)
        for _ in range(min(batch, n - done)):
            for cmd in make():
                pipe.execute_command(*cmd)
            done += 1
        for reply in pipe.execute(raise_on_error=False):
            if isinstance(reply, Exception):
                raise reply


def table(stats: dict[str, Stat], e: float, i: float, least_us: float) -> list[list[str]]:
    """The rows of one step: every function at least ``least_us`` per step (inclusive),
    costliest first; µs per step with the wrappers' cost taken out."""
    steps = stats[TOTAL][0]

    def inclusive(s: Stat, own: bool = True) -> float:
        calls, secs, under = s[:3]
        return max(secs - under * e - (calls * i if own else 0.0), 0.0) * 1e6 / steps

    def self_time(s: Stat) -> float:
        # Its raw self time holds, for every wrapped call it made, what the wrapper adds
        # around the callee's own clock readings (E - I), and its own I.
        return max(s[3] - s[4] * (e - i) - s[0] * i, 0.0) * 1e6 / steps

    total = inclusive(stats[TOTAL], own=False)
    rows = [[TOTAL, f"{stats[TOTAL][0] / steps:.2f}", f"{total:.2f}", "100.0 %",
             f"{self_time(stats[TOTAL]) + i * 1e6:.2f}"]]
    for fn, s in sorted(stats.items(), key=lambda kv: -inclusive(kv[1])):
        us = inclusive(s)
        if fn == TOTAL or us < least_us:
            continue
        rows.append([fn, f"{s[0] / steps:.2f}", f"{us:.2f}", f"{100 * us / max(total, 1e-9):.1f} %",
                     f"{self_time(s):.2f}"])
    return rows


def round_us(r: redis.Redis, make: Any, n: int) -> float:
    """Server µs per rebalance round (both calls) over ``n`` rounds, from ``INFO
    commandstats``."""
    c0, u0 = script_stats(r)
    run_rounds(r, make, n)
    c1, u1 = script_stats(r)
    assert c1 - c0 == 2 * n, (c0, c1)
    return (u1 - u0) / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", type=int, default=5000, help="rebalance rounds profiled")
    ap.add_argument("--rounds", type=int, default=5,
                    help="batches of -n/rounds rounds, the copies interleaved (wrapper cost)")
    ap.add_argument("--least", type=float, default=0.05,
                    help="leave out functions under this many µs per step")
    ap.add_argument("--redis-url")
    opts = ap.parse_args()
    server, url, _, _ = start_server(opts.redis_url)
    try:
        r = redis.Redis.from_url(url)
        name, source = library_source()
        copy = profiled_copy(name, source)
        make = prepare(r, "profiled", (PROFILED_LIB, copy)).phases[ROUND]
        plain = prepare(r, "plain", None).phases[ROUND]
        for m in (make, plain):
            run_rounds(r, m, min(opts.n, 500))  # warm up: caches, the allocator
        dump(r)
        e_loop, i_loop = calibrate(r)
        extra, plain_us = [], []
        batch = max(opts.n // opts.rounds, 1)
        for _ in range(opts.rounds):
            profiled = round_us(r, make, batch)
            plain_us.append(round_us(r, plain, batch))
            extra.append(profiled - plain_us[-1])
        stats = dump(r)
        # Every wrapped call of a round: those under each step's total, and the total itself.
        wrapped = sum(st[TOTAL][2] / st[TOTAL][0] + 1 for st in stats.values())
        e = statistics.median(extra) * 1e-6 / wrapped
        i = i_loop * e / e_loop
        print(f"server: {server_label(r.info('server'))}, {batch * opts.rounds} rebalance "
              f"rounds of the one-member group through the profiled copy, in {opts.rounds} "
              f"batches, each beside the same through the library itself")
        print(f"the library itself: {statistics.median(plain_us):.1f} µs per round (join + "
              f"sync, INFO commandstats); the copy: {wrapped:.0f} wrapped calls per round, "
              f"{e * 1e6:.3f} µs each (E; a tight loop reads {e_loop * 1e6:.3f}), "
              f"I = {i * 1e6:.3f} µs, subtracted")
        for step in ("join_group", "sync_group"):
            print(f"\n{step}")
            print_table(["function", "calls/step", "inclusive µs/step", "share", "self µs/step"],
                        table(stats[step], e, i, opts.least))
        r.function_delete(PROFILED_LIB)
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    main()
