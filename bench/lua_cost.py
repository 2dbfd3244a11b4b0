"""What the pieces of a group step cost inside the server: a function call, a ``redis.call``,
Lua work. The cost model in docs/architecture.md ("What a step costs") quotes this table.

Each row is a one-line library function (``rcoord_lua_cost``, loaded next to nothing else) called
in pipelines; its server time comes from ``INFO commandstats`` deltas, as in step_cost.py. Every
row runs ``--rounds`` times, interleaved; the table shows the median and the range.

Run: ``python bench/lua_cost.py`` (``-n`` calls per row and round, default 20000;
``--redis-url`` for an existing server). Prints a table.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import rows_options, server_us_per_call, start_server  # noqa: E402

import redis  # noqa: E402

LIBRARY = """#!lua name=rcoord_lua_cost
local function strings()
  local t = {}
  for i = 1, 10 do t[#t + 1] = 'f' .. i; t[#t + 1] = 'value' .. i end
  return t
end
redis.register_function('lc_empty', function(k, a) return 1 end)
redis.register_function('lc_time', function(k, a) redis.call('TIME') return 1 end)
redis.register_function('lc_hget', function(k, a) redis.call('HGET', k[1], 'f1') return 1 end)
redis.register_function('lc_hmget12', function(k, a)
  redis.call('HMGET', k[1], 'f1', 'f2', 'f3', 'f4', 'f5', 'f6', 'f7', 'f8', 'f9', 'f10', 'g1', 'g2')
  return 1
end)
redis.register_function('lc_strings', function(k, a) strings() return 1 end)
redis.register_function('lc_concat', function(k, a)
  local t = {}
  for i = 1, 20 do t[i] = 'hb:' .. a[1] end
  return 1
end)
redis.register_function('lc_numbers', function(k, a)
  local t = {}
  for i = 1, 20 do t[i] = tostring(1795367058991 + i) end
  return 1
end)
redis.register_function('lc_hset1', function(k, a)
  redis.call('HSET', k[1], unpack(strings())) return 1
end)
redis.register_function('lc_hset10', function(k, a)
  local t = strings()
  for i = 1, #t, 2 do redis.call('HSET', k[1], t[i], t[i + 1]) end
  return 1
end)
redis.register_function('lc_msgpack', function(k, a)
  cmsgpack.unpack(cmsgpack.pack({id = a[1], st = 45000, rt = 300000, as = 0, new = 0,
                                 seq = 12, iid = '', asg = a[1]}))
  return 1
end)
"""

ROWS = [
    ("empty function, no keys", "lc_empty", 0),
    ("empty function, 16 keys (a group step's)", "lc_empty", 16),
    ("+ TIME", "lc_time", 16),
    ("+ one HGET", "lc_hget", 16),
    ("+ one HMGET of 12 fields", "lc_hmget12", 16),
    ("+ 20 strings concatenated from strings (Lua only)", "lc_concat", 16),
    ("+ 20 numbers turned into strings (Lua only)", "lc_numbers", 16),
    ("+ 20 short strings in a table (Lua only)", "lc_strings", 16),
    ("+ the same, then one HSET of 10 fields", "lc_hset1", 16),
    ("+ the same, then 10 HSETs of one field", "lc_hset10", 16),
    ("+ a member record packed and unpacked (cmsgpack)", "lc_msgpack", 16),
]


def main() -> None:
    opts = rows_options(__doc__, 20_000)
    server, url, _, _ = start_server(opts.redis_url)
    try:
        r = redis.Redis.from_url(url)
        r.execute_command("FUNCTION", "LOAD", "REPLACE", LIBRARY)
        keys = [f"{{lua-cost}}:k{i}" for i in range(16)]
        r.hset(keys[0], mapping={f"f{i}": f"value{i}" for i in range(1, 11)})
        results: dict[int, list[float]] = {i: [] for i in range(len(ROWS))}
        for _ in range(opts.rounds):
            for i, (_, fn, nkeys) in enumerate(ROWS):
                results[i].append(server_us_per_call(
                    r, ("FCALL", fn, nkeys, *keys[:nkeys], "m-1"), opts.n, 200))
        r.delete(*keys)
        r.execute_command("FUNCTION", "DELETE", "rcoord_lua_cost")
    finally:
        if server is not None:
            server.stop()
    print(f"{opts.n} calls per row and round, {opts.rounds} rounds, pipelines of 200")
    print("| function body | server µs/call (median) | range |")
    print("|---|---:|---:|")
    for i, (label, _, _) in enumerate(ROWS):
        xs = sorted(results[i])
        print(f"| {label} | {statistics.median(xs):.2f} | {xs[0]:.2f}-{xs[-1]:.2f} |")


if __name__ == "__main__":
    main()
