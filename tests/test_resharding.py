"""Resharding under load (issue 13): the slot of a live group's coordinator partition moves to
another master by the standard procedure (``CLUSTER SETSLOT IMPORTING/MIGRATING``, ``MIGRATE
... KEYS`` a few keys at a time, ``CLUSTER SETSLOT NODE``) while the fault suite's workers
heartbeat, consume and commit and the coordinator service runs (tests/test_failover.py's
ClusterScenario on tests/cluster_replicas.py's cluster, without replicas).

While the slot is migrating, a script's keys are split between the two masters: the source
answers ``ASK`` for a script whose keys are all gone and ``TRYAGAIN`` for one whose keys are
split, and redis-py retries both. The migration here is slow on purpose (one key per step) so
that calls meet it. Nothing may be lost: the history checker (one owner per generation, no
committed offset back, every acked record processed) judges the whole run, and afterwards the
service, not the members, must apply the partition's deadlines from the new master.
"""

from __future__ import annotations

import signal
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from cluster_replicas import NodeInfo, ReplicaCluster, running_cluster
from harness import wait_until
from test_failover import ClusterScenario, _still_running
from test_faults import GROUP, _commits_after, _judge

from rcoord.keys import GroupKeys

pytestmark = [pytest.mark.faults, pytest.mark.slow]

STEP_PAUSE_S = 0.15
"""Between two MIGRATE steps: keeps the slot half-moved long enough for calls to meet it."""
MIGRATE_BOUND_S = 60.0


def migrate_slot(cluster: ReplicaCluster, slot: int, src: NodeInfo, dst: NodeInfo,
                 keys_per_step: int = 1) -> int:
    """Move ``slot`` from ``src`` to ``dst`` as ``redis-cli --cluster reshard`` does; returns
    the number of keys moved. Bounded by ``MIGRATE_BOUND_S``."""
    s, d = cluster.node_client(src.port), cluster.node_client(dst.port)
    moved = 0
    try:
        d.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", src.id)
        s.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", dst.id)
        deadline = time.monotonic() + MIGRATE_BOUND_S
        while True:
            keys = s.execute_command("CLUSTER", "GETKEYSINSLOT", slot, keys_per_step)
            if not keys:
                break
            assert time.monotonic() < deadline, "migration did not finish in time"
            s.execute_command("MIGRATE", "127.0.0.1", dst.port, "", 0, 5000, "KEYS", *keys)
            moved += len(keys)
            time.sleep(STEP_PAUSE_S)
        # The destination first, so the source's MOVED never points at a node that disowns it.
        d.execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst.id)
        s.execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst.id)
        for m in cluster.masters():
            if m.id not in (src.id, dst.id):
                c = cluster.node_client(m.port)
                try:
                    c.execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst.id)
                finally:
                    c.close()
    finally:
        s.close()
        d.close()
    return moved


def _metric(svc: Any, name: str) -> float:
    """Sum of a counter's samples on the service's /metrics."""
    port = svc.metrics_port
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as resp:
        text = resp.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name) and not line.startswith("#"))


def _redirections(cluster: ReplicaCluster, port: int) -> dict[str, int]:
    """ASK and TRYAGAIN replies a node gave (INFO errorstats): calls that met a migration."""
    c = cluster.node_client(port, decode_responses=True)
    try:
        stats = c.info("errorstats")
    finally:
        c.close()
    return {k: int(v["count"]) for k, v in stats.items()
            if k in ("errorstat_ASK", "errorstat_TRYAGAIN")}


@pytest.fixture
def cluster() -> Iterator[ReplicaCluster]:
    yield from running_cluster(masters=3, replicas=0)


@pytest.fixture
def scenario(tmp_path: Path, cluster: ReplicaCluster) -> Iterator[ClusterScenario]:
    sc = ClusterScenario(tmp_path, cluster, workers=3, records=1500)
    try:
        yield sc
    finally:
        sc.close()


def test_moving_the_groups_slot_under_load_loses_nothing_and_the_service_follows(
        scenario, cluster):
    sc = scenario
    sc.wait_stable()
    sc.start_traffic()
    sc.wait_produced(1 / 4)
    wait_until(lambda: _commits_after(sc, 0) > 0)
    slot = sc.group_slot()
    src = cluster.master_of_slot(slot)
    dst = next(m for m in cluster.masters() if m.id != src.id)
    before = sc.committed()
    moved = migrate_slot(cluster, slot, src, dst)
    done = time.time()
    print(f"\nmoved {moved} keys of slot {slot}")
    assert moved >= 5  # the group's hash, members, offsets, the deadline index, ...
    assert cluster.master_of_slot(slot).port == dst.port
    assert not cluster.node_client(src.port).execute_command("CLUSTER", "COUNTKEYSINSLOT", slot)
    met = _redirections(cluster, src.port)
    print(f"calls that met the migration: {met}")
    assert met, "no call met the migration (no ASK or TRYAGAIN on the source): a vacuous test"
    after = sc.committed()
    assert all(after.get(p, -1) >= off for p, off in before.items()), (before, after)
    sc.drain()
    assert _commits_after(sc, done) > 0  # the same workers commit on the new master
    assert sc.produced == sc.records
    _still_running(sc)

    # The service's timers follow the slot: with the producer and sampler stopped and every
    # member gone silent (SIGKILL, no LeaveGroup), nobody but the service touches the group, so
    # only its sweeps (counted by rcoord_deadlines_applied) can expire the members.
    #
    # The kill waits for the group to be Stable with one member per worker. The members'
    # sessions lapse during the move (their calls meet TRYAGAIN for longer than the 1.5 s
    # session), so right after it the group is Empty and the workers are rejoining, and the
    # kill came 0.4-0.6 s after the move: it found 0 to 3 members, and the service had only
    # those to expire, one deadline each (and one per pending member id), one more for the
    # group's empty join after the last. Killed with one member and no pending id that is 2,
    # short of the one per worker the old wait asked for (it ran out twice in about ten runs);
    # killed with none it is 0 (measured: "applied > before" failed), and the test could not
    # say whether the service followed the slot at all. It does: the members killed after the
    # move were expired 0-2 ms after deadlines set on the new master. Once Stable, each member
    # has a session deadline of its own, applied before the rebalance's (4 s): one per worker
    # at least. The wait reads the members hash, running no step (a step applies passed
    # deadlines itself), and the count in the same wait (the service counts a call's deadlines
    # once it has returned, after it emptied the hash).
    sc._stop.set()
    for t in sc._threads:
        t.join(10)
    wait_until(lambda: (g := sc.coord.describe_group(GROUP)).state == "Stable"
               and len(g.members) == len(sc.workers), timeout_s=30)
    svc = sc.services[0]
    applied = _metric(svc, "rcoord_deadlines_applied_total")
    for w in sc.workers:
        w.proc.send_signal(signal.SIGKILL)
        w.proc.wait(10)
    members = GroupKeys.of(sc.ns, sc.coord.config.num_partitions, GROUP).members
    wait_until(lambda: sc.r.hlen(members) == 0 and _metric(
        svc, "rcoord_deadlines_applied_total") >= applied + len(sc.workers),
        timeout_s=60, why=svc.diagnose)
    assert len(sc.coord.describe_group(GROUP).members) == 0
    _judge(sc.finish(), owed_at_least=sc.records // 2)


def test_migrate_slot_moves_every_key(cluster):
    """The helper above on a quiet slot: every key arrives, in one piece."""
    r = redis.cluster.RedisCluster(host="127.0.0.1", port=next(iter(cluster.nodes)))
    try:
        keys = [f"{{m}}:k{i}" for i in range(7)]
        for k in keys:
            r.set(k, k)
        slot = redis.cluster.key_slot(b"{m}")
        src = cluster.master_of_slot(slot)
        dst = next(m for m in cluster.masters() if m.id != src.id)
        assert migrate_slot(cluster, slot, src, dst, keys_per_step=3) == len(keys)
        assert cluster.master_of_slot(slot).port == dst.port
        assert [r.get(k) for k in keys] == [k.encode() for k in keys]
    finally:
        r.close()


def test_a_reshard_to_a_master_added_since_the_client_started_is_followed(cluster):
    """An operator adds a master (``--cluster add-node``) and moves a live group's slot to it.
    While the slot migrates, a call whose keys have moved is answered ``ASK`` with the new
    master's address, which the clients, started before it joined, do not know. redis-py
    (8.1) failed such a call with ``AttributeError`` ('NoneType' object has no attribute
    'redis_connection'), sync and asyncio: the member's heartbeat ended its generation with its
    partitions lost. Now the clients learn the node from the ``ASK`` and follow it: a key's
    read is served there, and a group step gets what the migration allows (served, or
    ``ConnectionLost`` while its keys are split, retriable), never anything else; once the slot
    is moved the member goes on in its generation."""
    import asyncio
    import subprocess
    import uuid

    from cluster_replicas import find_cli, free_port, node

    from rcoord import CoordinatorConfig, GroupCoordinator, OffsetAndMetadata, TopicPartition
    from rcoord.asyncio.cluster import AsyncClusterClient
    from rcoord.connect import connect
    from rcoord.errors import ConnectionLost, Errors
    from rcoord.keys import GroupKeys

    ns, group, tp = "ask" + uuid.uuid4().hex[:6], "g", TopicPartition("t", 0)
    client = connect(cluster.url(), socket_timeout=3)
    try:
        coord = GroupCoordinator(client, CoordinatorConfig(
            namespace=ns, group_initial_rebalance_delay_ms=0)).start()
        first = coord.join_group(group, protocol_type="consumer", protocols=[("range", b"")],
                                 session_timeout_ms=60_000)
        joined = coord.join_group(group, first.member_id, protocol_type="consumer",
                                  protocols=[("range", b"")], session_timeout_ms=60_000)
        coord.sync_group(group, joined.generation_id, joined.member_id,
                         assignments={joined.member_id: b"a"})
        member = (group, joined.generation_id, joined.member_id)
        group_key = GroupKeys.of(ns, 50, group).group
        slot = redis.cluster.key_slot(group_key.encode())

        extra = node(free_port(), cluster.node_timeout_ms).start()
        cluster.nodes[extra.port] = extra  # stopped with the cluster
        added = subprocess.run([find_cli(), "--cluster", "add-node", f"127.0.0.1:{extra.port}",
                                cluster.addrs[0]], capture_output=True, text=True, timeout=60,
                               check=False)
        assert added.returncode == 0, added.stdout + added.stderr
        wait_until(lambda: all(any(n.port == extra.port for n in cluster.topology(via=p))
                               for p in cluster.nodes), timeout_s=30)
        cluster.wait_replicated()  # every node, the new one too, says cluster_state:ok
        src = cluster.master_of_slot(slot)
        dst = next(n for n in cluster.topology() if n.port == extra.port)
        assert client.get_node(host="127.0.0.1", port=extra.port) is None  # unknown to it

        s, d = cluster.node_client(src.port), cluster.node_client(dst.port)
        try:
            d.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", src.id)
            s.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", dst.id)
            while keys := s.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100):
                s.execute_command("MIGRATE", "127.0.0.1", dst.port, "", 0, 5000, "KEYS", *keys)

            # Every key of the slot is on the new master now: the source answers ASK.
            assert client.exists(group_key) == 1

            async def read_async() -> int:
                async_client = AsyncClusterClient.from_url(cluster.url())
                try:
                    return int(await async_client.exists(group_key))
                finally:
                    await async_client.aclose()

            assert asyncio.run(read_async()) == 1
            for step in (lambda: coord.heartbeat(*member),
                         lambda: coord.commit_offsets(group, {tp: OffsetAndMetadata(1)},
                                                      member_id=member[2],
                                                      generation_id=member[1])[tp]):
                try:
                    assert step() == Errors.NONE
                except ConnectionLost:
                    pass  # its keys are split between the masters: retriable
            assert int(d.info("commandstats").get("cmdstat_asking", {}).get("calls", 0)) > 0

            for c in (d, s, *(cluster.node_client(m.port) for m in cluster.masters()
                              if m.id not in (src.id, dst.id))):
                c.execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst.id)
        finally:
            s.close()
            d.close()
        wait_until(lambda: _served(lambda: coord.heartbeat(*member)) == Errors.NONE,
                   timeout_s=30)
        assert coord.commit_offsets(group, {tp: OffsetAndMetadata(2)}, member_id=member[2],
                                    generation_id=member[1])[tp] == Errors.NONE
        assert [m.member_id for m in coord.describe_group(group).members] == [member[2]]
    finally:
        client.close()


def _served(call: Any) -> Any:
    """The call's answer, or None while the cluster is still settling (a retriable error)."""
    from rcoord.errors import ConnectionLost

    try:
        return call()
    except ConnectionLost:
        return None
