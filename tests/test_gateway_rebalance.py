"""librdkafka (confluent-kafka) groups through the gateway: cooperative-sticky rebalances
(KIP-429) and static membership (KIP-345) with a real client."""

from __future__ import annotations

import threading
from typing import Any

import pytest

pytest.importorskip("kio")
ck = pytest.importorskip("confluent_kafka")

from gateway_harness import GatewayThread
from harness import wait_until

from rcoord.topics import Topics

WAIT_S = 60.0


class Member(threading.Thread):
    """A confluent-kafka consumer polling in its own thread. ``assigned`` is its assignment as
    the client sees it; ``revoked`` lists the partitions of each revoke callback."""

    def __init__(self, gw: GatewayThread, group: str, topic: str, **conf: Any) -> None:
        super().__init__(daemon=True)
        self.consumer = ck.Consumer({
            "bootstrap.servers": gw.bootstrap, "group.id": group,
            "auto.offset.reset": "earliest", "enable.auto.commit": False,
            "broker.address.family": "v4", "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 200, **conf})
        self.topic = topic
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.assigned: frozenset[int] = frozenset()
        self.revoked: list[frozenset[int]] = []
        self.assigns = 0

    def _on_assign(self, consumer: Any, parts: list[Any]) -> None:
        with self.lock:
            self.assigns += 1

    def _on_revoke(self, consumer: Any, parts: list[Any]) -> None:
        with self.lock:
            self.revoked.append(frozenset(p.partition for p in parts))

    def run(self) -> None:
        self.consumer.subscribe([self.topic], on_assign=self._on_assign,
                                on_revoke=self._on_revoke)
        try:
            while not self.stop.is_set():
                self.consumer.poll(0.1)
                self.assigned = frozenset(p.partition for p in self.consumer.assignment())
        finally:
            self.consumer.close()

    def finish(self) -> None:
        self.stop.set()
        self.join(30)
        assert not self.is_alive()


def _split(a: Member, b: Member, n: int) -> bool:
    return bool(a.assigned and b.assigned and a.assigned | b.assigned == frozenset(range(n))
                and not a.assigned & b.assigned)


def test_cooperative_sticky_group_rebalances_incrementally(gateway: GatewayThread,
                                                           topics: Topics) -> None:
    topics.create("coop", 6)
    conf = {"partition.assignment.strategy": "cooperative-sticky"}
    a = Member(gateway, "coop-g", "coop", **conf)
    a.start()
    b: Member | None = None
    try:
        wait_until(lambda: a.assigned == frozenset(range(6)), timeout_s=WAIT_S)
        kept_before = a.assigned
        b = Member(gateway, "coop-g", "coop", **conf)
        b.start()
        wait_until(lambda: b is not None and _split(a, b, 6), timeout_s=WAIT_S)
        # Incremental: a gave up only what moved to b, never its whole assignment.
        with a.lock:
            moved = frozenset().union(*a.revoked)
        assert moved == b.assigned and moved != kept_before
        assert len(a.assigned) == 3 and len(b.assigned) == 3  # sticky and balanced
        b.finish()
        wait_until(lambda: a.assigned == frozenset(range(6)), timeout_s=WAIT_S)
        with a.lock:
            assert frozenset().union(*a.revoked) == moved  # b leaving revoked nothing of a's
    finally:
        if b is not None:
            b.finish()
        a.finish()


def test_static_members_keep_their_partitions_across_a_restart(gateway: GatewayThread,
                                                               topics: Topics) -> None:
    topics.create("static", 4)
    conf = {"session.timeout.ms": 30000}
    a = Member(gateway, "static-g", "static", **{**conf, "group.instance.id": "node-a"})
    b = Member(gateway, "static-g", "static", **{**conf, "group.instance.id": "node-b"})
    a.start()
    b.start()
    try:
        wait_until(lambda: _split(a, b, 4), timeout_s=WAIT_S)
        a_parts, b_parts = a.assigned, b.assigned
        with b.lock:
            b_assigns, b_revokes = b.assigns, len(b.revoked)
        a.finish()  # a static member's close sends no LeaveGroup (KIP-345)
        a = Member(gateway, "static-g", "static", **{**conf, "group.instance.id": "node-a"})
        a.start()
        wait_until(lambda: a.assigned == a_parts, timeout_s=WAIT_S)
        # The other member saw no rebalance: its assignment neither revoked nor re-given.
        assert b.assigned == b_parts
        with b.lock:
            assert (b.assigns, len(b.revoked)) == (b_assigns, b_revokes)
    finally:
        a.finish()
        b.finish()
