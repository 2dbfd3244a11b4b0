"""Read-path benchmark: what one process reads from a topic, layer by layer.

Run from the repository root::

    python bench/read_path.py            # 120,000 records, 3 rounds (~40 s on 2 vCPU)
    python bench/read_path.py --quick    # 30,000 records, 1 round (~15 s)
    python bench/read_path.py --redis-url redis://127.0.0.1:6379/0

Without ``--redis-url`` an ``rcoord.testing.embedded.EmbeddedServer`` is started on a free 127.0.0.1
port and stopped at the end. Every run uses fresh namespaces and deletes its keys.

N records (100-byte values) go into a 12-partition topic, then one process reads all of them,
partition after partition, 500 records per call, in three ways:

a. **plain XRANGE**: ``client.xrange(stream, "0-<o+1>", "+", count=500)`` in a loop, the
   stream entries left as redis-py returns them (no Record objects): the data path's ceiling;
b. **rcoord fetch**: ``rcoord.topics.fetch(..., max_records=500)`` in the same loop, so
   the difference to (a) is what the fetch adds (log offsets, checks, decoding into Records);
c. **one Consumer worker**: ``bench/consume.py``'s one-worker throughput run (a spawned
   process, ``Consumer.poll`` with max_poll_records=500, auto-commit every second), timed from
   its first to its last record.

(a), (b) and (c) are repeated ``--rounds`` times in alternation; the table gives the best round
of each (on a loaded machine a single run of (c), about a second long, swings by half).

A second table reads large records (100 of 1 MB, 1,000 of 50 kB, one partition each) in the
same two ways, (a) asking as many entries as 1 MiB holds and (b) with ``max_bytes`` 1 MiB: what
a fetch adds when the records, not the calls, are the cost (its log offsets read used to copy
the partition's first and last records, 2 MB a call for records of 1 MB).
"""

from __future__ import annotations

import argparse
import os
import platform
import secrets
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for path in (ROOT, ROOT / "bench"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import consume  # bench/consume.py: the one-worker run
from _common import server_label

from rcoord.client.group import client_from_url
from rcoord.topics import Producer, ProducerRecord, Topics, fetch, partition_key

TOPIC = "read-path"
PARTITIONS = 12
VALUE = b"x" * 100
BATCH = 500


def produce(client: Any, ns: str, records: int) -> None:
    Topics(client, ns).create(TOPIC, PARTITIONS)
    producer = Producer(client, ns, "round_robin")
    for lo in range(0, records, 12_000):
        producer.send_batch(
            TOPIC,
            [ProducerRecord(VALUE, partition=i % PARTITIONS)
             for i in range(lo, min(records, lo + 12_000))],
        )


def plain_xrange(client: Any, ns: str) -> int:
    count = 0
    for p in range(PARTITIONS):
        key, offset = partition_key(ns, TOPIC, p), 0
        while True:
            entries = client.xrange(key, f"0-{offset + 1}", "+", count=BATCH)
            if not entries:
                break
            count += len(entries)
            offset += len(entries)
    return count


def rcoord_fetch(client: Any, ns: str) -> int:
    count = 0
    for p in range(PARTITIONS):
        offset = 0
        while True:
            res = fetch(client, ns, TOPIC, p, offset, max_records=BATCH)
            if not res.records:
                break
            count += len(res.records)
            offset = res.records[-1].offset + 1
    return count


LARGE = ((1_000_000, 100), (50_000, 1_000))
"""(value bytes, records) of the large-record table."""
MIB = 1 << 20


def _plain_large(client: Any, ns: str, topic: str, count: int) -> int:
    offset = 0
    while entries := client.xrange(partition_key(ns, topic, 0), f"0-{offset + 1}", "+",
                                   count=count):
        offset += len(entries)
    return offset


def _fetch_large(client: Any, ns: str, topic: str, _count: int) -> int:
    offset = 0
    while got := fetch(client, ns, topic, 0, offset, BATCH, max_bytes=MIB).records:
        offset = got[-1].offset + 1
    return offset


def large_records(client: Any, ns: str, rounds: int) -> list[tuple[int, float, float]]:
    """(value bytes, plain XRANGE MB/s, rcoord fetch MB/s), best of ``rounds`` each."""
    out = []
    for size, n in LARGE:
        topic = f"{TOPIC}-{size}"
        Topics(client, ns).create(topic, 1)
        producer = Producer(client, ns, idempotent=False)
        for lo in range(0, n, 10):
            producer.send_batch(topic, [ProducerRecord(b"x" * size, partition=0)] * 10)
        best = [0.0, 0.0]
        for _ in range(rounds):
            for i, fn in enumerate((_plain_large, _fetch_large)):
                t0 = time.perf_counter()
                if fn(client, ns, topic, max(1, MIB // size)) != n:
                    raise AssertionError(f"{fn.__name__} did not read {n} records")
                best[i] = max(best[i], n * size / 1e6 / (time.perf_counter() - t0))
        Topics(client, ns).delete(topic)
        out.append((size, best[0], best[1]))
    return out


def timed(fn: Any, client: Any, ns: str, records: int) -> float:
    t0 = time.perf_counter()
    got = fn(client, ns)
    elapsed = time.perf_counter() - t0
    if got != records:
        raise AssertionError(f"{fn.__name__} read {got} records, expected {records}")
    return records / elapsed


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--quick", action="store_true", help="30,000 records, 1 round")
    p.add_argument("--redis-url", help="use this server (127.0.0.1 only)")
    p.add_argument("--records", type=int)
    p.add_argument("--rounds", type=int)
    args = p.parse_args(argv)
    records = args.records or (30_000 if args.quick else 120_000)
    rounds = args.rounds or (1 if args.quick else 3)

    server = None
    url = args.redis_url
    if not url:
        from rcoord.testing.embedded import EmbeddedServer

        server = EmbeddedServer().start()
        url = server.url
    client = client_from_url(url)
    ns = f"bench-read-{os.getpid()}-{secrets.token_hex(2)}"
    try:
        version = server_label(client.info("server"))
        print(
            f"# rcoord read-path benchmark — {platform.node()}, {os.cpu_count()} CPUs, "
            f"Python {platform.python_version()}, server {version} at {url}",
            flush=True,
        )
        print(f"# {records:,} records, {PARTITIONS} partitions, {len(VALUE)}-byte values, "
              f"{BATCH} per call; best of {rounds} rounds of each", flush=True)
        print(flush=True)
        produce(client, ns, records)
        best = {"xrange": 0.0, "fetch": 0.0, "worker": 0.0}
        for _ in range(rounds):
            best["xrange"] = max(best["xrange"], timed(plain_xrange, client, ns, records))
            best["fetch"] = max(best["fetch"], timed(rcoord_fetch, client, ns, records))
            best["worker"] = max(
                best["worker"], consume.throughput(url, 1, records, BATCH)["rate"]
            )
        worker = best["worker"]
        ceiling = best["xrange"]
        print("| reader | records/s | of plain XRANGE |")
        print("|---|---:|---:|")
        for label, rate in (
            ("(a) plain XRANGE loop", ceiling),
            ("(b) rcoord.topics.fetch loop", best["fetch"]),
            ("(c) one Consumer worker", worker),
        ):
            print(f"| {label} | {rate:,.0f} | {rate / ceiling:.0%} |", flush=True)
        print(flush=True)
        print("| values | (a) plain XRANGE MB/s | (b) rcoord fetch, max_bytes 1 MiB, MB/s "
              "| of plain XRANGE |")
        print("|---|---:|---:|---:|")
        for size, plain, fetched in large_records(client, ns, rounds):
            print(f"| {size:,} bytes | {plain:,.0f} | {fetched:,.0f} | {fetched / plain:.0%} |",
                  flush=True)
        return 0
    finally:
        for key in list(client.scan_iter(match=f"{ns}:*", count=1000)):
            client.delete(key)
        client.close()
        if server is not None:
            server.stop()


if __name__ == "__main__":
    sys.exit(main())
