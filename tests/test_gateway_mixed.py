"""One group, two kinds of member: rcoord's own Consumer (straight to Redis, with
``protocol_encoding="kafka"``) and a kafka-python consumer (through the gateway), under the
range assignor. Each kind leads once (the first member to join leads): the leader reads the
other kind's subscription and the other kind reads the assignment it is given. The partitions
split between them, each reads its own, and when the second leaves the first takes all."""

from __future__ import annotations

import threading
from typing import Any

import pytest

pytest.importorskip("kio")
kafka = pytest.importorskip("kafka")

from gateway_harness import GatewayThread
from harness import wait_until

from rcoord.client import Consumer, ConsumerGroupConfig
from rcoord.topics import Producer, Topics

WAIT_S = 60.0
TOPIC, GROUP, N = "mixed", "mixed-g", 4


class _Member(threading.Thread):
    """A polling thread; ``assigned`` is what the client holds, ``seen`` what it read (with
    the assignment it held at the time), ``leader`` whether it led its last generation."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.assigned: frozenset[int] = frozenset()
        self.seen: list[tuple[int, int, frozenset[int]]] = []
        self.leader: bool | None = None
        self.error: Exception | None = None

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                self.step()
        except Exception as exc:  # noqa: BLE001 (reported by the test, not lost in the thread)
            self.error = exc
        finally:
            self.close()

    def step(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def record(self, parts: frozenset[int], records: list[tuple[int, int]]) -> None:
        with self.lock:
            self.assigned = parts
            self.seen.extend((p, o, parts) for p, o in records)

    def finish(self) -> None:
        self.stop.set()
        self.join(30)
        assert not self.is_alive()
        assert self.error is None, self.error


class RcoordMember(_Member):
    def __init__(self, redis_url: str, namespace: str) -> None:
        super().__init__()
        self.consumer = Consumer(ConsumerGroupConfig(
            group_id=GROUP, topics=[TOPIC], redis_url=redis_url, namespace=namespace,
            assignors=("range",), protocol_encoding="kafka", heartbeat_interval_ms=200,
            session_timeout_ms=6000, rebalance_timeout_ms=10_000, retry_backoff_ms=10,
            retry_backoff_max_ms=100), fetch_max_wait_ms=50)

    def step(self) -> None:
        records = self.consumer.poll(timeout=0.1)
        gen = self.consumer.generation
        if gen is not None:
            self.leader = gen.leader_id == gen.member_id
        self.record(frozenset(tp.partition for tp in self.consumer.assignment()),
                    [(r.partition, r.offset) for r in records])

    def close(self) -> None:
        self.consumer.close(timeout=30)


class KafkaMember(_Member):
    def __init__(self, gw: GatewayThread) -> None:
        super().__init__()
        from kafka.coordinator.assignors.range import RangePartitionAssignor

        self.consumer = kafka.KafkaConsumer(
            TOPIC, bootstrap_servers=gw.bootstrap, group_id=GROUP,
            auto_offset_reset="earliest", heartbeat_interval_ms=200, session_timeout_ms=6000,
            partition_assignment_strategy=[RangePartitionAssignor])
        # kafka-python can join before its first metadata answer is in; as the leader it then
        # assigns nothing ("No partition metadata for topic") and rejoins once that answer
        # lands, a rejoin whose result a poll that times out meanwhile drops (see
        # gateway_harness.poll_until). Seen under a loaded machine. A metadata fetch made after
        # subscribing (topics() always asks; partitions_for_topic may answer from the cache,
        # leaving the coordinator's snapshot empty) takes the race out.
        assert TOPIC in self.consumer.topics()
        assert self.consumer.partitions_for_topic(TOPIC) == set(range(N))

    def step(self) -> None:
        batches = self.consumer.poll(timeout_ms=100)
        coord = self.consumer._coordinator  # no public "am I the leader"
        if coord._generation.generation_id > 0:
            self.leader = bool(coord._is_leader)
        self.record(frozenset(tp.partition for tp in self.consumer.assignment()),
                    [(r.partition, r.offset) for batch in batches.values() for r in batch])

    def close(self) -> None:
        self.consumer.close()


def _produce(redis_server: Any, namespace: str, tag: bytes) -> None:
    client = redis_server.client()
    try:
        producer = Producer(client, namespace, "round_robin")
        for i in range(10 * N):
            producer.send(TOPIC, tag + b"%d" % i, partition=i % N)
    finally:
        client.close()


def _split(a: _Member, b: _Member) -> bool:
    return bool(a.assigned and b.assigned and a.assigned | b.assigned == frozenset(range(N))
                and not a.assigned & b.assigned)


@pytest.mark.parametrize("first", ["rcoord", "kafka"])
def test_rcoord_and_kafka_python_members_share_one_group(
        first: str, gateway: GatewayThread, topics: Topics, redis_server: Any,
        namespace: str) -> None:
    topics.create(TOPIC, N)
    rc = RcoordMember(redis_server.url, namespace)
    kp = KafkaMember(gateway)
    lead, other = (rc, kp) if first == "rcoord" else (kp, rc)
    lead.start()
    try:
        wait_until(lambda: lead.assigned == frozenset(range(N)) and lead.leader,
                   timeout_s=WAIT_S)
        other.start()
        wait_until(lambda: _split(lead, other), timeout_s=WAIT_S)
        # Range over 4 partitions and 2 members: two each, and the first member still leads.
        assert len(lead.assigned) == len(other.assigned) == 2
        wait_until(lambda: lead.leader is True and other.leader is False, timeout_s=WAIT_S)

        _produce(redis_server, namespace, b"a")
        wait_until(lambda: {(p, o) for m in (lead, other) for p, o, _ in m.seen}
                   == {(p, o) for p in range(N) for o in range(10)}, timeout_s=WAIT_S)
        for m in (lead, other):
            with m.lock:
                assert m.seen and all(p in parts for p, _, parts in m.seen)
                assert {p for p, _, _ in m.seen} == m.assigned  # each read its own, all of them

        other.finish()
        wait_until(lambda: lead.assigned == frozenset(range(N)), timeout_s=WAIT_S)
        _produce(redis_server, namespace, b"b")
        wait_until(lambda: {(p, o) for p, o, _ in lead.seen if o >= 10}
                   == {(p, o) for p in range(N) for o in range(10, 20)}, timeout_s=WAIT_S)
    finally:
        other.stop.set()
        lead.stop.set()
        for m in (lead, other):
            if m.is_alive():
                m.join(30)
    assert lead.error is None and other.error is None, (lead.error, other.error)
