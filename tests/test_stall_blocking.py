"""A blocking coordinator on a Redis Cluster whose master stops answering (SIGSTOP): its calls
for the groups on the other masters are still answered at once.

Kafka's client keeps its in-flight requests per broker, so a coordinator broker that stalls
delays only the groups it coordinates. Before, ``rcoord.batching.SharedCalls`` had one queue
for all nodes: while a call waited on the stalled master, every other thread's call queued
behind it, and a member of a group on a healthy master missed its heartbeats and was expired.

The client's socket timeout is generous and the cluster's node timeout longer than the test,
so the stalled call stays in flight (and the cluster healthy) until the master resumes: a call
that returns meanwhile cannot have waited behind it.
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import signal
import threading
import uuid
from typing import Any

from harness import WAIT_S, wait_until

from rcoord import CoordinatorConfig, Errors, GroupCoordinator
from rcoord.protocol.offsets import OffsetAndMetadata, TopicPartition
from rcoord.testing.embedded import EmbeddedCluster

JOIN = {"protocol_type": "consumer", "protocols": [("range", b"")],
        "session_timeout_ms": 60_000, "rebalance_timeout_ms": 60_000}


def _form(coord: GroupCoordinator, group: str) -> tuple[int, str]:
    """A stable one-member group: its (generation, member id)."""
    member = coord.join_group(group, **JOIN).member_id
    joined = coord.join_group(group, member, **JOIN)
    coord.sync_group(group, joined.generation_id, member, assignments={member: b""})
    return joined.generation_id, member


def test_a_stalled_master_does_not_hold_up_the_calls_for_the_other_masters():
    with EmbeddedCluster(masters=3, node_timeout_ms=600_000).start() as cluster:
        client = cluster.client(socket_connect_timeout=2, socket_timeout=120)
        try:
            coord = GroupCoordinator(client, CoordinatorConfig(
                namespace="t" + uuid.uuid4().hex[:12], group_min_session_timeout_ms=10,
                group_initial_rebalance_delay_ms=0)).start()

            def port(group: str) -> int:
                return int(client.get_node_from_key(coord._keys(group).group).port)

            stalled_port = port("stalled")
            healthy = next(g for g in (f"h{n}" for n in range(1000)) if port(g) != stalled_port)
            stalled_member, healthy_member = _form(coord, "stalled"), _form(coord, healthy)

            # Set once the stalled group's call is written: from then on it is the call in
            # flight (a call queued behind a batch is not sent by itself).
            sent = threading.Event()
            execute, slot = client.execute_command, client.keyslot(coord._keys("stalled").group)

            def recording(*args: Any, **kwargs: Any) -> Any:
                if args[0] == "FCALL" and client.keyslot(args[3]) == slot:
                    sent.set()
                return execute(*args, **kwargs)

            client.execute_command = recording
            pid = next(s.pid for s in cluster.nodes if s.port == stalled_port)
            assert pid is not None
            with cf.ThreadPoolExecutor(3) as pool:
                os.kill(pid, signal.SIGSTOP)
                try:
                    stuck = pool.submit(coord.heartbeat, "stalled", *stalled_member)
                    wait_until(sent.is_set)
                    beat = pool.submit(coord.heartbeat, healthy, *healthy_member)
                    commit = pool.submit(
                        coord.commit_offsets, healthy, {TopicPartition("t", 0): OffsetAndMetadata(7)},
                        member_id=healthy_member[1], generation_id=healthy_member[0])
                    wait_until(lambda: beat.done() and commit.done())
                    assert not stuck.done()  # answered while the stalled call is in flight
                    assert beat.result() == Errors.NONE
                    assert commit.result() == {TopicPartition("t", 0): Errors.NONE}
                finally:
                    os.kill(pid, signal.SIGCONT)
                assert stuck.result(WAIT_S) == Errors.NONE  # answered once its master resumes
        finally:
            client.close()
