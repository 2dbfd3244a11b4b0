"""Consumer benchmark for rcoord: consume throughput, and rebalance time after a worker dies.

Run from the repository root::

    python bench/consume.py            # full run (~45 s on 2 vCPU)
    python bench/consume.py --quick    # smaller run (~15 s)
    python bench/consume.py --redis-url redis://127.0.0.1:6379/0

Without ``--redis-url`` an ``rcoord.testing.embedded.EmbeddedServer`` is started on a free 127.0.0.1
port and stopped at the end. Every run uses a fresh namespace and deletes its keys.

Sections:

1. **Throughput.** N records (100-byte values) are produced into a 12-partition topic first.
   Then 1 or 3 worker processes (``multiprocessing``, spawn) start together and consume them
   with ``Consumer.poll`` (auto-commit every second). Each worker notes the monotonic time of its
   first and last record; the rate is N / (last record - first record) over all workers, so
   process start-up and group formation are not counted (they are reported separately as
   "start to first record").
2. **Rebalance after SIGKILL.** Three workers consume a stream produced continuously (about 6,000
   records/s over 12 partitions). One worker is killed with SIGKILL. The rebalance time is from
   the kill until every partition the dead worker held has had a record processed by a surviving
   worker. It is split into *detection* (kill -> the survivors' heartbeat reports the
   rebalance, which needs the dead member's session to expire) and *hand-over* (-> every partition
   consumed again). Repeated for two session timeouts; median of the trials.

Times from different processes compare because CLOCK_MONOTONIC is system-wide on Linux.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import secrets
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import functools
import operator

from _common import server_label

from rcoord import CoordinatorConfig, GroupCoordinator
from rcoord.client.group import client_from_url
from rcoord.topics import Producer, ProducerRecord, Topics

GROUP = "bench"
TOPIC = "bench-events"
PARTITIONS = 12
VALUE = b"x" * 100
TIMEOUT_S = 60.0


def now() -> float:
    return time.monotonic()


# -- the worker process -----------------------------------------------------------------------


def worker_main(url: str, ns: str, name: str, settings: dict[str, Any], go: Any, stop: Any) -> None:
    import logging

    from rcoord.client import Consumer, ConsumerGroupConfig
    from rcoord.client.history import RebalanceHistory

    logging.basicConfig(level=logging.WARNING, format=f"[{name}] %(levelname)s %(message)s")
    client = client_from_url(url)
    client.rpush(f"{ns}:ready", name)
    go.wait(TIMEOUT_S)
    events = RebalanceHistory(client, f"{ns}:events", name, extra=lambda: {"t": now()})

    config = ConsumerGroupConfig(
        group_id=GROUP,
        topics=[TOPIC],
        redis_client=client,
        namespace=ns,
        session_timeout_ms=settings["session_ms"],
        heartbeat_interval_ms=settings["heartbeat_ms"],
        rebalance_timeout_ms=10_000,
        join_backoff_ms=500,
        retry_backoff_ms=50,
        retry_backoff_max_ms=500,
    )
    consumer = Consumer(
        config,
        listener=events,
        auto_commit_interval_ms=1000,
        max_poll_records=settings["max_poll_records"],
        fetch_max_wait_ms=50,
    )
    events.consumer = consumer
    count, first, last, reported, reported_count = 0, 0.0, 0.0, 0.0, 0
    seen: set[tuple[int, int]] = set()
    while not stop.is_set():
        records = consumer.poll(timeout=0.1)
        t = now()
        if records:
            first = first or t
            count += len(records)
            last = t
            gen = consumer.generation.generation_id if consumer.generation else -1
            fresh = {r.partition for r in records if (gen, r.partition) not in seen}
            if fresh:
                seen.update((gen, p) for p in fresh)
                client.rpush(
                    f"{ns}:firsts",
                    *[
                        json.dumps({"t": t, "worker": name, "gen": gen, "partition": p})
                        for p in fresh
                    ],
                )
        # Report at most every 50 ms while busy, and at once when idle.
        if count != reported_count and (t - reported > 0.05 or not records):
            reported, reported_count = t, count
            client.hset(
                f"{ns}:stats:{name}", mapping={"count": count, "first": first, "last": last}
            )
    client.hset(f"{ns}:stats:{name}", mapping={"count": count, "first": first, "last": last})
    consumer.close(timeout=30)
    client.close()


# -- the main process -------------------------------------------------------------------------


class Run:
    """One scenario in a fresh namespace: coordinator settings, topic, workers."""

    def __init__(self, url: str, label: str) -> None:
        self.url = url
        self.r = client_from_url(url)
        self.ns = f"bench-{os.getpid()}-{label}-{secrets.token_hex(2)}"
        self.coord = GroupCoordinator(
            self.r,
            CoordinatorConfig(
                namespace=self.ns,
                group_min_session_timeout_ms=100,
                group_initial_rebalance_delay_ms=500,
            ),
        ).start()
        self.topics = Topics(self.r, self.ns)
        self.topics.create(TOPIC, PARTITIONS)
        self.producer = Producer(self.r, self.ns, "round_robin")
        self.ctx = mp.get_context("spawn")
        self.go = self.ctx.Event()
        self.procs: dict[str, Any] = {}
        self.stops: dict[str, Any] = {}

    def produce(self, n: int) -> None:
        for lo in range(0, n, 12_000):
            self.producer.send_batch(
                TOPIC,
                [
                    ProducerRecord(VALUE, partition=i % PARTITIONS)
                    for i in range(lo, min(n, lo + 12_000))
                ],
            )

    def start_workers(self, names: list[str], settings: dict[str, Any]) -> float:
        for name in names:
            stop = self.ctx.Event()
            proc = self.ctx.Process(
                target=worker_main,
                daemon=True,
                args=(self.url, self.ns, name, settings, self.go, stop),
            )
            proc.start()
            self.procs[name], self.stops[name] = proc, stop
        wait(lambda: self.r.llen(f"{self.ns}:ready") >= len(names), "workers ready")
        self.go.set()
        return now()

    def stats(self) -> dict[str, dict[str, float]]:
        out = {}
        for name in self.procs:
            raw = self.r.hgetall(f"{self.ns}:stats:{name}")
            out[name] = {k.decode(): float(v) for k, v in raw.items()}
        return out

    def events(self, key: str) -> list[dict[str, Any]]:
        return [json.loads(x) for x in self.r.lrange(f"{self.ns}:{key}", 0, -1)]

    def stop_all(self) -> None:
        for stop in self.stops.values():
            stop.set()
        for proc in self.procs.values():
            proc.join(30)
            if proc.is_alive():
                proc.kill()

    def cleanup(self) -> None:
        for proc in self.procs.values():
            if proc.is_alive():
                proc.kill()
        for key in list(self.r.scan_iter(match=f"{self.ns}:*", count=1000)):
            self.r.delete(key)
        self.r.close()


def wait(cond: Any, what: str, timeout: float = TIMEOUT_S) -> None:
    deadline = now() + timeout
    while not cond():
        if now() > deadline:
            raise TimeoutError(f"{what}: not reached within {timeout:g} s")
        time.sleep(0.02)


def throughput(url: str, workers: int, records: int, max_poll_records: int) -> dict[str, float]:
    run = Run(url, f"tp{workers}")
    try:
        run.produce(records)
        names = [f"w{i + 1}" for i in range(workers)]
        settings = {
            "session_ms": 10_000,
            "heartbeat_ms": 1000,
            "max_poll_records": max_poll_records,
        }
        started = run.start_workers(names, settings)
        wait(
            lambda: sum(s.get("count", 0) for s in run.stats().values()) >= records, "all consumed"
        )
        stats = run.stats()
        run.stop_all()
        first = min(s["first"] for s in stats.values() if s.get("count"))
        last = max(s["last"] for s in stats.values() if s.get("count"))
        gens = {e["gen"] for e in run.events("events") if e["event"] == "assigned"}
        return {
            "records": records,
            "seconds": last - first,
            "rate": records / max(1e-9, last - first),
            "startup": first - started,
            "generations": len(gens),
        }
    finally:
        run.cleanup()


def rebalance(url: str, session_ms: int, heartbeat_ms: int) -> dict[str, float]:
    run = Run(url, f"rb{session_ms}")
    stop_producing = threading.Event()

    def produce() -> None:
        while not stop_producing.wait(0.02):
            run.produce(120)

    producer = threading.Thread(target=produce, daemon=True)
    try:
        settings = {"session_ms": session_ms, "heartbeat_ms": heartbeat_ms, "max_poll_records": 500}
        run.start_workers(["w1", "w2", "w3"], settings)
        producer.start()

        def stable_gen() -> tuple[int, dict[str, list[int]]] | None:
            by_gen: dict[int, dict[str, list[int]]] = {}
            for e in run.events("events"):
                if e["event"] == "assigned":
                    by_gen.setdefault(e["gen"], {})[e["worker"]] = e["partitions"]
            for gen in sorted(by_gen, reverse=True):
                owners = by_gen[gen]
                if set(owners) == {"w1", "w2", "w3"} and sorted(
                    functools.reduce(operator.iadd, owners.values(), [])
                ) == list(range(PARTITIONS)):
                    return gen, owners
            return None

        wait(lambda: stable_gen() is not None, "a stable group of three")
        gen, owners = stable_gen()  # type: ignore[misc]
        # Every partition consumed in that generation, so the group is really running.
        wait(
            lambda: (
                {f["partition"] for f in run.events("firsts") if f["gen"] == gen}
                == set(range(PARTITIONS))
            ),
            "all partitions flowing",
        )
        victim_parts = set(owners["w3"])
        killed = now()
        run.procs["w3"].kill()

        def handed_over() -> bool:
            got = {
                f["partition"]
                for f in run.events("firsts")
                if f["worker"] != "w3" and f["t"] > killed and f["gen"] > gen
            }
            return victim_parts <= got

        wait(handed_over, "the dead worker's partitions consumed again")
        firsts = [
            f
            for f in run.events("firsts")
            if f["worker"] != "w3"
            and f["t"] > killed
            and f["gen"] > gen
            and f["partition"] in victim_parts
        ]
        done = max(min(f["t"] for f in firsts if f["partition"] == p) for p in victim_parts)
        detected = min(
            (e["t"] for e in run.events("events") if e["event"] == "revoked" and e["t"] > killed),
            default=done,
        )
        stop_producing.set()
        producer.join(5)
        run.procs.pop("w3")
        run.stops.pop("w3")
        run.stop_all()
        return {"total": done - killed, "detect": detected - killed, "handover": done - detected}
    finally:
        stop_producing.set()
        run.cleanup()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--quick", action="store_true", help="smaller run (~15 s)")
    p.add_argument(
        "--redis-url", help="use this server (127.0.0.1 only) instead of an embedded one"
    )
    p.add_argument("--records", type=int, help="records for the throughput runs")
    p.add_argument("--trials", type=int, help="SIGKILL trials per session timeout")
    p.add_argument("--max-poll-records", type=int, default=500)
    args = p.parse_args(argv)
    records = args.records or (30_000 if args.quick else 120_000)
    trials = args.trials or (1 if args.quick else 3)

    server = None
    url = args.redis_url
    if not url:
        from rcoord.testing.embedded import EmbeddedServer

        server = EmbeddedServer().start()
        url = server.url
    try:
        probe = client_from_url(url)
        version = server_label(probe.info("server"))
        probe.close()
        print(
            f"# rcoord consumer benchmark — {platform.node()}, {os.cpu_count()} CPUs, "
            f"Python {platform.python_version()}, server {version} at {url}",
            flush=True,
        )
        print(
            f"# topic: {PARTITIONS} partitions, {len(VALUE)}-byte values; "
            f"max_poll_records={args.max_poll_records}",
            flush=True,
        )
        print(flush=True)
        print("| scenario | records | seconds | records/s | start to first record | generations |")
        print("|---|---:|---:|---:|---:|---:|")
        for workers in (1, 3):
            res = throughput(url, workers, records, args.max_poll_records)
            print(
                f"| consume, {workers} worker{'s' if workers > 1 else ''} | {records:,} | "
                f"{res['seconds']:.2f} | {res['rate']:,.0f} | {res['startup']:.2f} s | "
                f"{res['generations']:.0f} |",
                flush=True,
            )
        print()
        print(
            "| SIGKILL one of 3 workers | session / heartbeat | detect (median) | hand-over (median) | kill -> all consumed (median, min-max) |"
        )
        print("|---|---|---:|---:|---:|")
        for session_ms, heartbeat_ms in ((1500, 300), (6000, 1000)):
            runs = [rebalance(url, session_ms, heartbeat_ms) for _ in range(trials)]
            tot = [r["total"] for r in runs]
            print(
                f"| {trials} trial{'s' if trials > 1 else ''} | {session_ms} ms / {heartbeat_ms} ms | "
                f"{statistics.median(r['detect'] for r in runs):.2f} s | "
                f"{statistics.median(r['handover'] for r in runs):.2f} s | "
                f"{statistics.median(tot):.2f} s ({min(tot):.2f}-{max(tot):.2f}) |",
                flush=True,
            )
        return 0
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    sys.exit(main())
