"""bench/lua_profile.py: the profiled copy of the library loads beside the real one, runs the
rebalance round, and accounts every step's call and the functions the round runs."""

from __future__ import annotations

import sys
from pathlib import Path

import redis

from rcoord.scripts import library_source
from rcoord.testing.embedded import EmbeddedServer

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import lua_profile
import step_cost


def test_profiled_round_accounts_each_step(redis_server: EmbeddedServer) -> None:
    r = redis.Redis.from_url(redis_server.url)
    name, source = library_source()
    copy = lua_profile.profiled_copy(name, source)
    variant = step_cost.prepare(r, "profiled", (lua_profile.PROFILED_LIB, copy))
    try:
        lua_profile.dump(r)  # forget the set-up's calls
        lua_profile.run_rounds(r, variant.phases[step_cost.ROUND], 20, batch=7)
        stats = lua_profile.dump(r)
        for step, own in (("join_group", "join_existing_member"), ("sync_group", "sync_chunk")):
            assert stats[step][lua_profile.TOTAL][0] == 20
            assert stats[step][own][0] == 20  # a step file's and the prelude's functions
            assert stats[step]["redis.call HMGET"][0] >= 20
            rows = lua_profile.table(stats[step], *lua_profile.calibrate(r, 1000, 3), 0.0)
            assert rows[0][0] == lua_profile.TOTAL and len(rows) > 10
        assert lua_profile.dump(r) == {}  # a dump clears the figures
    finally:
        r.function_delete(lua_profile.PROFILED_LIB)
        r.close()
