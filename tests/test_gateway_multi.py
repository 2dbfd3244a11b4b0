"""Two gateways over the same namespace (one Redis node, and the 3-master cluster): clients
bootstrapped to either one form one group, produce through one and consume through the other.
The gateways share nothing but Redis; each answers FindCoordinator with itself.

The group members are librdkafka's: two kafka-python 3 consumers on two gateways sometimes
(about 1 run in 4 here) end with one member removed from the group after its first assignment
was computed without topic metadata; not diagnosed (docs/gateway.md, "Not done")."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("kio")
kafka = pytest.importorskip("kafka")
ck = pytest.importorskip("confluent_kafka")

from gateway_harness import GatewayThread, running_gateway, topics_of
from harness import wait_until

from rcoord.topics import Topics

WAIT_S = 60.0


@pytest.fixture(params=["single", "cluster"])
def server(request: pytest.FixtureRequest) -> Any:
    return request.getfixturevalue("redis_server" if request.param == "single"
                                   else "redis_cluster")


@pytest.fixture
def two_gateways(server: Any, namespace: str) -> Iterator[tuple[GatewayThread, GatewayThread]]:
    with running_gateway(server, namespace) as one, running_gateway(server, namespace) as two:
        yield one, two


@pytest.fixture
def topics(server: Any, namespace: str) -> Iterator[Topics]:
    with topics_of(server, namespace) as t:
        yield t


class _Member(threading.Thread):
    """A librdkafka group member (it reads metadata before it joins; see the module note)."""

    def __init__(self, gw: GatewayThread, group: str, topic: str) -> None:
        super().__init__(daemon=True)
        self.consumer = ck.Consumer({
            "bootstrap.servers": gw.bootstrap, "group.id": group,
            "auto.offset.reset": "earliest", "enable.auto.commit": False,
            "broker.address.family": "v4", "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 200})
        self.topic = topic
        self.stop = threading.Event()
        self.assigned: set[int] = set()
        self.values: list[bytes] = []

    def run(self) -> None:
        self.consumer.subscribe([self.topic])
        try:
            while not self.stop.is_set():
                msg = self.consumer.poll(0.1)
                if msg is not None and not msg.error():
                    self.values.append(msg.value())
                    self.consumer.commit(msg, asynchronous=False)
                self.assigned = {tp.partition for tp in self.consumer.assignment()}
        finally:
            self.consumer.close()


def test_one_group_spans_two_gateways(two_gateways: tuple[GatewayThread, GatewayThread],
                                      topics: Topics) -> None:
    one, two = two_gateways
    assert one.address != two.address
    topics.create("spread", 4)
    a, b = _Member(one, "multi", "spread"), _Member(two, "multi", "spread")
    a.start()
    b.start()
    try:
        wait_until(lambda: a.assigned and b.assigned and a.assigned | b.assigned == {0, 1, 2, 3}
                   and not a.assigned & b.assigned, timeout_s=WAIT_S)
        # Written through the first gateway's Produce, read through both gateways' Fetch
        # (members parked in a Fetch wait on either one are woken by the other's append).
        producer = kafka.KafkaProducer(bootstrap_servers=one.bootstrap)
        for i in range(40):
            producer.send("spread", value=b"%d" % i, partition=i % 4)
        producer.flush(20)
        producer.close()
        wait_until(lambda: len(a.values) + len(b.values) == 40, timeout_s=WAIT_S)
        assert sorted(a.values + b.values) == sorted(b"%d" % i for i in range(40))
        assert a.values and b.values
        b.stop.set()
        b.join(30)
        wait_until(lambda: a.assigned == {0, 1, 2, 3}, timeout_s=WAIT_S)
    finally:
        a.stop.set()
        b.stop.set()
        a.join(30)
        b.join(30)
    # Commits made through either gateway, read through the other.
    admin = kafka.KafkaAdminClient(bootstrap_servers=two.bootstrap)
    try:
        offsets = admin.list_group_offsets("multi")["multi"]
    finally:
        admin.close()
    assert {tp.partition: om.offset for tp, om in offsets.items()} == {p: 10 for p in range(4)}
