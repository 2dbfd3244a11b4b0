"""Where the fixed cost of a group step goes: the wrapper every group step runs (``group_step``
in lua/prelude.lua), measured a piece at a time.

step_cost.py's "fixed overhead" row is ``expire_deadlines`` with nothing due and the group's
published deadline still ahead, which runs the wrapper alone (the "+ finish" row); where the
published deadline has passed the sweep also publishes the group's earliest one (the "+ publish"
row: it repairs the index). This bench splits that call into its parts. A copy of this tree's
library, under another name, gets probe functions appended that run the wrapper's own helpers up
to a point and return: each row adds one piece to the row above (except the full group read,
which replaces the brief one), called with the same 16 keys and arguments as the real call, on
the same two-member Stable group as step_cost.py. The difference between two rows is what that
piece costs; the first row is what any call with a group step's keys costs before it runs a
line. Server time from ``INFO commandstats`` deltas, every row ``--rounds`` times interleaved,
median and range.

Run: ``python bench/step_parts.py`` (``-n`` calls per row and round, default 4000; ``--rounds``,
default 5; ``--redis-url`` for an existing server). Prints a table.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import redis
from _common import rows_options, server_us_per_call, start_server
from step_cost import prepare

from rcoord.scripts import library_source
from rcoord.testing.library import library_copy

PROBE_LIB = "rcoord_bench_parts"
# Appended to the library copy: the helpers are locals of its main chunk, so code at its end
# reaches them. Each probe repeats the one above it and adds a piece.
PROBES = """
do
local function probe(name, fn)
  redis.register_function{function_name = 'parts_' .. name, callback = fn}
end
probe('empty', function(keys, args) return 1 end)
probe('clock', function(keys, args) bind_group_keys(keys) read_clock(args[1]) return 1 end)
probe('settings', function(keys, args)
  bind_group_keys(keys) read_clock(args[1]) read_settings(false, true) return 1
end)
probe('brief', function(keys, args) begin(keys, args, false, nil, true) return 1 end)
probe('full', function(keys, args) begin(keys, args, false, nil, false) return 1 end)
probe('due', function(keys, args) begin(keys, args, false, nil, true) apply_due() return 1 end)
probe('finish', function(keys, args)
  begin(keys, args, false, nil, true) apply_due() finish() return 1
end)
probe('publish', function(keys, args)
  begin(keys, args, false, nil, true) apply_due() FORCE_PUBLISH = true finish() return 1
end)
end
"""
ROWS = [
    ("a call with a group step's 16 keys, empty body", "parts_empty"),
    ("+ bind the keys, read the clock (TIME)", "parts_clock"),
    ("+ the partition's settings copy (HMGET, 2 fields: a brief step's)", "parts_settings"),
    ("+ per-call state, the group's brief read (HMGET, 5 fields)", "parts_brief"),
    ("  (the full read instead: HMGET, 13 fields)", "parts_full"),
    ("+ check for passed deadlines (none due)", "parts_due"),
    ("+ finish (nothing to publish or wake): a step that does nothing", "parts_finish"),
    ("+ publish the earliest deadline (ZRANGE): the sweep's repair", "parts_publish"),
    ("expire_deadlines itself (step_cost.py's fixed-overhead row)", None),
]


def main() -> None:
    opts = rows_options(__doc__, 4000)
    server, url, _, _ = start_server(opts.redis_url)
    try:
        r = redis.Redis.from_url(url)
        variant = prepare(r, "this tree", None)
        expire = variant.phases["fixed overhead (expire_deadlines, nothing due)"]()[0]
        assert r.execute_command(*expire)[0] == 0, "expire_deadlines found something due"
        name, source = library_source()
        r.function_load(library_copy(name, source, PROBE_LIB, after=PROBES), replace=True)
        args = expire[2:]
        fns = [fn or str(expire[1]).replace(name, PROBE_LIB, 1) for _, fn in ROWS]
        results: dict[str, list[float]] = {fn: [] for fn in fns}
        for _ in range(opts.rounds):
            for fn in fns:
                results[fn].append(server_us_per_call(r, ("FCALL", fn, *args), opts.n, 100))
        r.function_delete(PROBE_LIB)
    finally:
        if server is not None:
            server.stop()
    print(f"{opts.n} calls per row and round, {opts.rounds} rounds, pipelines of 100")
    print("| part of the group step wrapper | server µs/call (median) | range |")
    print("|---|---:|---:|")
    for (label, _), fn in zip(ROWS, fns, strict=True):
        xs = sorted(results[fn])
        print(f"| {label} | {statistics.median(xs):.2f} | {xs[0]:.2f}-{xs[-1]:.2f} |")


if __name__ == "__main__":
    main()
