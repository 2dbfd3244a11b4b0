"""Kafka clients through the gateway, beside rcoord's own Python client, on the same server.

Run from the repository root::

    python bench/gateway.py             # 50,000 records; formation of 20 and 100 members
    python bench/gateway.py --quick     # 10,000 records; formation of 20 members

Starts an embedded server (or takes ``--redis-url``) and ``rcoord gateway`` as a separate
process (``python -m rcoord gateway``), so the gateway's event loop and the load generator are
different processes, as in a deployment; both share the machine's cores with the server.

* **produce**: ``--records`` values of 100 bytes to a 6-partition topic, round robin.
  confluent-kafka through the gateway (``linger.ms=5``, ``acks=all``, no idempotence, timed
  until ``flush()`` returns) beside rcoord's ``Producer.send_batch`` with 500 records per call
  (non-idempotent, as the gateway's Produce of a batch without producer id). The log end
  offsets are checked afterwards.
* **consume**: the same records read by one group member: confluent-kafka through the gateway
  (``consume(1000)``) beside rcoord's ``Consumer`` (``max_poll_records=1000``); records/s
  from the first batch returned to the last record, the first batch not counted (so the group
  join and the first fetch are left out).
* **formation**: N members subscribe to an N-partition topic, one thread per member in this
  process; time from the first ``subscribe`` to the moment every member holds exactly one
  partition. librdkafka consumers through the gateway (``heartbeat.interval.ms=100``) beside
  rcoord ``Consumer``s (``heartbeat_interval_ms=100``). The namespace's initial rebalance delay
  is ``--initial-delay-ms`` (extended while members keep arriving, as in Kafka), and is part
  of the time on both sides.

Prints a table. The figures depend on the machine's load (two cores shared with the server);
compare the two columns of one run.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import confluent_kafka as ck
import redis

from rcoord import CoordinatorConfig, GroupCoordinator
from rcoord.client import ConsumerGroupConfig
from rcoord.client.consumer import Consumer
from rcoord.testing.embedded import EmbeddedServer
from rcoord.topics import Producer, ProducerRecord, Topics

PARTITIONS = 6
VALUE = b"x" * 100
BATCH = 500
LIMIT_S = 300.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def gateway_process(url: str, ns: str) -> Iterator[str]:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "rcoord", "gateway", "--listen", f"127.0.0.1:{port}",
         "--redis-url", url, "--namespace", ns, "--log-level", "WARNING"], env=env)
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the gateway did not start")
            time.sleep(0.05)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(30)


def until(cond: Callable[[], bool], what: str, limit_s: float = LIMIT_S) -> None:
    deadline = time.monotonic() + limit_s
    while not cond():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not reached in {limit_s:.0f} s")
        time.sleep(0.005)


def ends(topics: Topics, topic: str) -> int:
    return sum(p.log_end_offset for p in topics.describe(topic).partitions)


# -- produce ----------------------------------------------------------------------------------


def produce_kafka(bootstrap: str, topic: str, n: int) -> float:
    producer = ck.Producer({"bootstrap.servers": bootstrap, "broker.address.family": "v4",
                            "linger.ms": 5, "acks": "all", "enable.idempotence": False})
    producer.produce(topic, value=VALUE, partition=0)  # connect and learn metadata untimed
    producer.flush(30)
    t0 = time.perf_counter()
    for i in range(n):
        while True:
            try:
                producer.produce(topic, value=VALUE, partition=i % PARTITIONS)
                break
            except BufferError:
                producer.poll(0.01)
        if i % 1000 == 0:
            producer.poll(0)
    if producer.flush(LIMIT_S) != 0:
        raise RuntimeError("confluent-kafka did not deliver every record")
    return time.perf_counter() - t0


def produce_rcoord(client: Any, ns: str, topic: str, n: int) -> float:
    producer = Producer(client, ns, idempotent=False)
    producer.send_batch(topic, [ProducerRecord(VALUE, partition=0)])
    t0 = time.perf_counter()
    for start in range(0, n, BATCH):
        producer.send_batch(topic, [ProducerRecord(VALUE, partition=i % PARTITIONS)
                                    for i in range(start, min(n, start + BATCH))])
    return time.perf_counter() - t0


# -- consume ----------------------------------------------------------------------------------


def consume_kafka(bootstrap: str, topic: str, n: int) -> float:
    """Records/s after the first batch returned (the group join and first fetch left out)."""
    consumer = ck.Consumer({"bootstrap.servers": bootstrap, "broker.address.family": "v4",
                            "group.id": f"bench-{uuid.uuid4().hex[:6]}",
                            "auto.offset.reset": "earliest", "enable.auto.commit": True})
    consumer.subscribe([topic])
    got = first = 0
    t0 = 0.0
    deadline = time.monotonic() + LIMIT_S
    try:
        while got < n:
            if time.monotonic() > deadline:
                raise RuntimeError(f"confluent-kafka consumed {got} of {n}")
            batch = [m for m in consumer.consume(1000, 0.5) if not m.error()]
            if batch and first == 0:
                t0, first = time.perf_counter(), len(batch)
            got += len(batch)
        return (got - first) / (time.perf_counter() - t0)
    finally:
        consumer.close()


def consume_rcoord(url: str, ns: str, topic: str, n: int) -> float:
    consumer = Consumer(ConsumerGroupConfig(group_id=f"bench-{uuid.uuid4().hex[:6]}",
                                            topics=[topic], redis_url=url, namespace=ns),
                        max_poll_records=1000)
    got = first = 0
    t0 = 0.0
    deadline = time.monotonic() + LIMIT_S
    try:
        while got < n:
            if time.monotonic() > deadline:
                raise RuntimeError(f"rcoord consumed {got} of {n}")
            records = consumer.poll(0.5)
            if records and first == 0:
                t0, first = time.perf_counter(), len(records)
            got += len(records)
        return (got - first) / (time.perf_counter() - t0)
    finally:
        consumer.close()


# -- formation --------------------------------------------------------------------------------


class Members:
    """N members in threads; ``held[i]`` is the partition count member i holds now."""

    def __init__(self, n: int, make: Callable[[int], Any], begin: Callable[[Any], None],
                 poll: Callable[[Any], None], held: Callable[[Any], int],
                 close: Callable[[Any], None]) -> None:
        self.n = n
        self.held = [0] * n
        self.stop = threading.Event()
        self.started = threading.Barrier(n + 1)
        self._threads = [threading.Thread(target=self._run,
                                          args=(i, make, begin, poll, held, close), daemon=True)
                         for i in range(n)]

    def _run(self, i: int, make: Any, begin: Any, poll: Any, held: Any, close: Any) -> None:
        member = make(i)
        self.started.wait()
        begin(member)
        try:
            while not self.stop.is_set():
                poll(member)
                self.held[i] = held(member)
        finally:
            close(member)

    def formation_s(self) -> float:
        for t in self._threads:
            t.start()
        self.started.wait()  # every member is built; each subscribes now
        t0 = time.perf_counter()
        until(lambda: all(h == 1 for h in self.held), f"{self.n} members holding one each")
        took = time.perf_counter() - t0
        self.stop.set()
        for t in self._threads:
            t.join(60)
        return took


def formation_kafka(bootstrap: str, topic: str, n: int) -> float:
    group = f"form-{uuid.uuid4().hex[:6]}"

    def make(i: int) -> Any:
        return ck.Consumer({"bootstrap.servers": bootstrap, "broker.address.family": "v4",
                            "group.id": group, "session.timeout.ms": 30000,
                            "heartbeat.interval.ms": 100, "enable.auto.commit": False})

    return Members(n, make, lambda c: c.subscribe([topic]), lambda c: c.poll(0.05), lambda c: len(c.assignment()),
                   lambda c: c.close()).formation_s()


def formation_rcoord(url: str, ns: str, topic: str, n: int) -> float:
    group = f"form-{uuid.uuid4().hex[:6]}"

    def make(i: int) -> Any:
        return Consumer(ConsumerGroupConfig(group_id=group, topics=[topic], redis_url=url,
                                            namespace=ns, heartbeat_interval_ms=100),
                        enable_auto_commit=False)

    # rcoord's Consumer subscribes through its config and joins in its first poll().
    return Members(n, make, lambda c: None, lambda c: c.poll(0.05), lambda c: len(c.assignment()),
                   lambda c: c.close()).formation_s()


# -- main -------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--redis-url", default=None, help="use this server (default: embedded)")
    ap.add_argument("--records", type=int, default=50_000)
    ap.add_argument("--members", default="20,100", help="formation sizes (comma separated)")
    ap.add_argument("--initial-delay-ms", type=int, default=300)
    ap.add_argument("--quick", action="store_true", help="10,000 records, 20 members")
    args = ap.parse_args(argv)
    records = 10_000 if args.quick else args.records
    sizes = [20] if args.quick else [int(x) for x in args.members.split(",")]

    server = None
    url = args.redis_url
    if url is None:
        server = EmbeddedServer().start()
        url = server.url
    client = redis.Redis.from_url(url)
    ns = f"bgw{uuid.uuid4().hex[:6]}"
    GroupCoordinator(client, CoordinatorConfig(
        namespace=ns, group_initial_rebalance_delay_ms=args.initial_delay_ms,
        group_min_session_timeout_ms=1000)).start()
    topics = Topics(client, ns)
    rows: list[tuple[str, str, str]] = []
    try:
        with gateway_process(url, ns) as bootstrap:
            topics.create("via-gateway", PARTITIONS)
            topics.create("via-rcoord", PARTITIONS)
            k = produce_kafka(bootstrap, "via-gateway", records)
            r = produce_rcoord(client, ns, "via-rcoord", records)
            for name in ("via-gateway", "via-rcoord"):
                if ends(topics, name) != records + 1:
                    raise RuntimeError(f"{name} holds {ends(topics, name)} records")
            rows.append((f"produce {records:,} x 100 B, records/s",
                         f"{records / k:,.0f}", f"{records / r:,.0f}"))
            k = consume_kafka(bootstrap, "via-gateway", records + 1)
            r = consume_rcoord(url, ns, "via-rcoord", records + 1)
            rows.append((f"consume {records + 1:,}, records/s (after the first batch)",
                         f"{k:,.0f}", f"{r:,.0f}"))
            for n in sizes:
                topics.create(f"form-{n}", n)
                k = formation_kafka(bootstrap, f"form-{n}", n)
                r = formation_rcoord(url, ns, f"form-{n}", n)
                rows.append((f"formation, {n} members (threads, one process), s",
                             f"{k:.2f}", f"{r:.2f}"))
    finally:
        client.close()
        if server is not None:
            server.stop()

    head = ("measure", "confluent-kafka via gateway", "rcoord Python client")
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(3)]
    print(f"initial rebalance delay {args.initial_delay_ms} ms; {os.cpu_count()} CPUs")
    for row in [head, tuple("-" * w for w in widths), *rows]:
        print("| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
