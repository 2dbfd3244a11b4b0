"""Group formation with asyncio members: the issue's formation targets, load generator aside.

N members, spread over P processes, each process one asyncio loop with N/P member coroutines
(``rcoord.asyncio.AsyncGroupCoordinator``): coroutines cost far less CPU than threads, so on a
2-core machine the members themselves take less of the time being measured. Each member:

1. (untimed) its own Redis connection opened (a live member has one already; connecting is
   not forming a group) and a UUID picked; all processes wait at a barrier until every member
   is ready;
2. JoinGroup as the worker sends it (rcoord.client): member id "" with its UUID, which makes
   its member id, so one JoinGroup adds it (no MEMBER_ID_REQUIRED round; parked until the
   generation forms);
3. SyncGroup (the leader sends every member's assignment; followers wait for it).

Formation time = from the first timed JoinGroup to the last SyncGroup result (wall clock of one
machine), minus the time the group then sat idle on its initial-delay timer (from the last
JoinGroup request to the transition to CompletingRebalance, read from the partition's events).
The delay lets every member's second join land in the first generation, as Kafka intends; while
members keep arriving it is extended (Kafka's rule), so the idle part is not simply one delay.

Run: ``python bench/formation_async.py`` (``--quick``: 100 members only). Prints a table.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import statistics
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import redis  # noqa: E402
import redis.asyncio  # noqa: E402

from rcoord import CoordinatorConfig, Errors, GroupCoordinator  # noqa: E402
from rcoord.asyncio import AsyncGroupCoordinator  # noqa: E402
from rcoord.connect import driver_info  # noqa: E402
from rcoord.testing.embedded import EmbeddedServer  # noqa: E402

JOIN = dict(protocol_type="consumer", protocols=[("range", b"")], session_timeout_ms=60_000,
            rebalance_timeout_ms=60_000, require_known_member_id=False)


def member_process(url: str, ns: str, group: str, count: int, barrier, out) -> None:  # type: ignore[no-untyped-def]
    async def main() -> None:
        client = redis.asyncio.Redis.from_url(url, max_connections=count + 10,
                                              driver_info=driver_info())
        coord = await AsyncGroupCoordinator(client, ns).start()
        uuids = [str(uuid.uuid4()) for _ in range(count)]
        # Every member has its own connection before the clock starts, as a live member would.
        await asyncio.gather(*(client.execute_command("PING") for _ in range(count)))
        await asyncio.get_running_loop().run_in_executor(None, barrier.wait)
        started = time.time()

        sent: list[float] = []

        async def member(member_uuid: str) -> tuple[int, float]:
            sent.append(time.time())
            res = await coord.join_group(group, "", new_member_uuid=member_uuid, **JOIN)
            assert res.error == Errors.NONE, res
            mid = res.member_id
            assignments = {m.member_id: b"a:" + m.member_id.encode() for m in res.members} \
                if res.leader_id == mid else None
            sync = await coord.sync_group(group, res.generation_id, mid, assignments=assignments)
            assert sync.error == Errors.NONE and sync.assignment == b"a:" + mid.encode(), sync
            return res.generation_id, time.time()

        done = await asyncio.gather(*(member(u) for u in uuids))
        out.put((started, max(t for _, t in done), {g for g, _ in done}, max(sent)))
        await client.aclose()

    asyncio.run(main())


def form(url: str, members: int, procs: int, delay_ms: int) -> dict[str, float]:
    ns = f"bf{uuid.uuid4().hex[:8]}"
    GroupCoordinator(redis.Redis.from_url(url), CoordinatorConfig(
        namespace=ns, group_initial_rebalance_delay_ms=delay_ms, group_min_session_timeout_ms=100)).start()
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(procs), ctx.Queue()
    shares = [members // procs + (1 if i < members % procs else 0) for i in range(procs)]
    ps = [ctx.Process(target=member_process, args=(url, ns, "g", n, barrier, out)) for n in shares]
    for p in ps:
        p.start()
    results = [out.get(timeout=120) for _ in ps]
    for p in ps:
        p.join(30)
        if p.is_alive():
            p.terminate()
    start = min(r[0] for r in results)
    end = max(r[1] for r in results)
    gens = set().union(*(r[2] for r in results))
    last_join_sent = max(r[3] for r in results)
    client = redis.Redis.from_url(url)
    # How long the formed join phase then sat waiting on its delay timer: from the last join
    # request to the group's transition to CompletingRebalance (server clock, same machine).
    coord = GroupCoordinator(client, CoordinatorConfig(namespace=ns))
    events = client.xrange(coord._keys("g").partition.events, count=10_000)
    completing = [int(f[b"at"]) / 1000 for _, f in events
                  if f.get(b"e") == b"transition" and f.get(b"to") == b"CompletingRebalance"]
    idle = max(0.0, completing[-1] - last_join_sent) if completing else 0.0
    for key in client.scan_iter(match=f"{ns}:*", count=1000):
        client.unlink(key)
    client.close()
    wall = (end - start) * 1000
    return {"members": members, "delay": delay_ms, "wall_ms": wall, "excl_ms": wall - idle * 1000,
            "idle_ms": idle * 1000, "generations": len(gens)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--redis-url")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    server = None
    url = args.redis_url
    if not url:
        server = EmbeddedServer().start()
        url = server.url
    scenarios = [(100, 100)] if args.quick else [(100, 100), (1000, 300)]
    rows = []
    try:
        for members, delay in scenarios:
            runs = [form(url, members, args.procs, delay) for _ in range(args.runs)]
            rows.append((members, delay, runs))
    finally:
        if server is not None:
            server.stop()
    targets = {100: 100.0, 1000: 1000.0}
    print("members  procs  delay_ms  runs  median_wall_ms  median_idle_ms  median_excl_idle_ms  generations  target")
    print("-------  -----  --------  ----  --------------  --------------  -------------------  -----------  ------")
    for members, delay, runs in rows:
        wall = statistics.median(r["wall_ms"] for r in runs)
        excl = statistics.median(r["excl_ms"] for r in runs)
        idle = statistics.median(r["idle_ms"] for r in runs)
        gens = max(r["generations"] for r in runs)
        t = targets.get(members)
        verdict = "" if t is None else (f"< {t:.0f} ms: {'MET' if excl < t else 'MISSED'}")
        print(f"{members:>7}  {args.procs:>5}  {delay:>8}  {len(runs):>4}  {wall:>14.1f}  {idle:>14.1f}  "
              f"{excl:>19.1f}  {gens:>11}  {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
