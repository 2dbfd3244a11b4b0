"""The service's listener when the slot of a deadline channel moves to another master.

Redis Cluster ends a client's subscription to the shard channels of a slot that moves: the
source pushes an ``sunsubscribe`` for each (Redis 7: "when a slot is migrated, the client is
unsubscribed from the shard channels of that slot"). redis-py passes it up as a message and
keeps the channel in its books; the connection stays up, so no reconnect ever follows.
"""

from __future__ import annotations

import logging
import queue
import uuid
from collections.abc import Iterator

import pytest
import redis.cluster
from cluster_replicas import NodeInfo, ReplicaCluster, running_cluster
from harness import wait_until

from rcoord.connect import connect
from rcoord.keys import PartitionKeys
from rcoord.service.events import Deadline, Event, Resync
from rcoord.service.listener import Listener

pytestmark = [pytest.mark.slow]

PARTITIONS = 4


@pytest.fixture
def cluster() -> Iterator[ReplicaCluster]:
    yield from running_cluster(masters=3, replicas=0)


def _move_empty_slot(cluster: ReplicaCluster, slot: int, src: NodeInfo, dst: NodeInfo) -> None:
    """Give ``slot`` (which holds no key) to ``dst``, telling the source last: the source then
    pushes the ``sunsubscribe``, and by then every other node names the new owner, so the test
    measures the listener, not how fast the cluster agrees (``test_resharding.migrate_slot``
    tells the source second)."""
    for m in sorted(cluster.masters(), key=lambda m: (m.id == src.id, m.id != dst.id)):
        c = cluster.node_client(m.port)
        try:
            assert not c.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot)
            c.execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst.id)
        finally:
            c.close()


def test_a_deadline_channel_whose_slot_moved_is_heard_from_its_new_master(cluster, caplog):
    """The slot of partition 1's deadline channel moves. The listener ignored the source's
    ``sunsubscribe``: it heard nothing more of that partition (its connection stayed up, so it
    never subscribed again) and the sweeper's index reads were all that acted on its deadlines.
    Now it subscribes again at once, on the new master, and resyncs: a deadline published there
    is heard, with no reconnect and one log line."""
    ns = "mv" + uuid.uuid4().hex[:6]
    part = 1
    channel = PartitionKeys(ns, part, PARTITIONS).due
    client = connect(cluster.url(), socket_timeout=5)
    publisher = connect(cluster.url(), socket_timeout=5)
    heard: queue.Queue[Event] = queue.Queue()
    events: list[Event] = []
    listener = Listener(client, ns, PARTITIONS, f"{ns}:coordinators", heard,
                        deadlines=True, hints=False)
    caplog.set_level(logging.DEBUG, logger="rcoord.service")

    def drained() -> list[Event]:
        while not heard.empty():
            events.append(heard.get())
        return events

    listener.start()
    try:
        wait_until(lambda: Deadline(part, 1) in drained(),
                   lambda: publisher.spublish(channel, 1), timeout_s=30)
        slot = redis.cluster.key_slot(channel.encode())
        src = cluster.master_of_slot(slot)
        dst = next(m for m in cluster.masters() if m.id != src.id)
        events.clear()
        _move_empty_slot(cluster, slot, src, dst)
        assert cluster.master_of_slot(slot).port == dst.port

        wait_until(lambda: Deadline(part, 2) in drained(),
                   lambda: publisher.spublish(channel, 2), timeout_s=30)
        assert Resync() in events[:events.index(Deadline(part, 2))]
        events_logged = [getattr(r, "event", None) for r in caplog.records
                         if r.levelno >= logging.INFO]
        assert "listener_reconnect" not in events_logged, events_logged
        assert "listener_error" not in events_logged, [getattr(r, "why", None) for r in caplog.records]
        assert events_logged.count("listener_slot_moved") == 1, events_logged
    finally:
        listener.stop()
        client.close()
        publisher.close()
