"""Retention passes while a master of a cluster is down, or one slot has no master (under
``cluster-require-full-coverage no``).

A pass began with a listing of every master through the cluster client, which fails on the
dead master (still the master of its slots in the slot map) or is refused while a slot has
no master (``connect.refuse_partial_listing``): every pass was skipped, and no topic was
trimmed on any master for as long as that lasted. Kafka's broker applies the retention of the
logs it leads whatever happens to the others. A pass now lists the masters one by one and
trims the topics of those that answer; it is still counted and logged as failed.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import redis
from test_gateway_slot_moves import _unserved

from rcoord.connect import connect
from rcoord.service.metrics import Metrics
from rcoord.service.retention import RetentionKeeper
from rcoord.topics import Producer, ProducerRecord, Topics, log_offsets
from rcoord.topics._base import meta_key, partition_key

N = 8


def _passes(metrics: Metrics, result: str) -> float:
    value = metrics.registry.get_sample_value("rcoord_retention_passes_total",
                                              {"result": result})
    return value or 0.0


def test_a_pass_trims_the_topics_of_the_served_slots_while_a_slot_has_no_master(
        own_cluster: Any, namespace: str, caplog: Any) -> None:
    caplog.set_level(logging.WARNING, logger="rcoord.service")
    client = connect(own_cluster.url, socket_timeout=5)
    try:
        topics = Topics(client, namespace)
        lost = "lost"
        slot = client.keyslot(meta_key(namespace, lost))
        names = [f"kept{i}" for i in range(6)]
        for name in names:
            assert slot not in (client.keyslot(meta_key(namespace, name)),
                                client.keyslot(partition_key(namespace, name, 0)))
        for name in [lost, *names]:
            topics.create(name, 1, retention_records=2)
            Producer(client, namespace).send_batch(
                name, [ProducerRecord(b"v%d" % i, partition=0) for i in range(4)])
        metrics = Metrics()
        keeper = RetentionKeeper(client, namespace, N, metrics, lambda: set(range(N)),
                                 60_000, threading.Event(), "c1")
        with _unserved(own_cluster, meta_key(namespace, lost)):
            client.nodes_manager.initialize()  # (the topology refresh a MOVED or failover makes)
            applied = keeper.run_once()
        assert applied == len(names)
        assert [log_offsets(client, namespace, t, 0) for t in names] == [(2, 4)] * len(names)
        assert log_offsets(client, namespace, lost, 0) == (0, 4)
        assert _passes(metrics, "failed") == 1 and _passes(metrics, "ok") == 0
        assert any("the slots with no master" in r.getMessage() for r in caplog.records
                   if getattr(r, "event", None) == "retention_error")
        # Once the slot has a master again, the next pass trims the rest.
        assert keeper.run_once() >= 1
        assert log_offsets(client, namespace, lost, 0) == (2, 4)
        assert _passes(metrics, "ok") == 1
    finally:
        client.close()


def test_a_pass_trims_the_topics_of_the_other_masters_while_one_is_killed(
        namespace: str, caplog: Any) -> None:
    """A master killed with no replica to promote: its slots keep it as their master in the
    slot map, so the listing through the cluster client failed on it, and so did every pass,
    for good."""
    import os
    import signal

    from harness import partial_coverage_cluster

    caplog.set_level(logging.WARNING, logger="rcoord.service")
    with partial_coverage_cluster() as cluster:
        client = connect(cluster.url, socket_timeout=5)
        try:
            victim = cluster.nodes[0]
            on_victim = {int(victim.port)}

            def port(key: str) -> int:
                return int(client.get_node_from_key(key).port)

            topics = Topics(client, namespace)
            producer = Producer(client, namespace)  # (its id taken now: its key may be lost)
            names = [f"t{i}" for i in range(12)]
            for name in names:
                topics.create(name, 1, retention_records=2)
                producer.send_batch(
                    name, [ProducerRecord(b"v%d" % i, partition=0) for i in range(4)])
            kept = [t for t in names if not {port(meta_key(namespace, t)),
                                             port(partition_key(namespace, t, 0))} & on_victim]
            assert kept and len(kept) < len(names)
            metrics = Metrics()
            keeper = RetentionKeeper(client, namespace, N, metrics, lambda: set(range(N)),
                                     60_000, threading.Event(), "c1")
            # A pass before the master dies (its scripts loaded on every master: a script
            # load goes to every master, and fails with one dead, rcoord.topics._Lua).
            assert keeper.run_once() == len(names)
            assert [log_offsets(client, namespace, t, 0) for t in names] == [(2, 4)] * len(names)
            assert victim.pid is not None
            os.kill(victim.pid, signal.SIGKILL)
            for name in kept:
                producer.send_batch(
                    name, [ProducerRecord(b"w%d" % i, partition=0) for i in range(2)])
            assert keeper.run_once() == len(kept)
            assert [log_offsets(client, namespace, t, 0) for t in kept] == [(4, 6)] * len(kept)
            assert _passes(metrics, "failed") == 1
            assert any(f"127.0.0.1:{victim.port}" in r.getMessage() for r in caplog.records
                       if getattr(r, "event", None) == "retention_error")
        finally:
            client.close()


def test_a_listing_of_the_masters_one_by_one_that_the_stop_cut_short_is_not_ok(
        redis_cluster: Any, namespace: str, monkeypatch: Any) -> None:
    """The cluster client's listing fails once (a master's hiccup), so the pass lists the
    masters one by one, and the stop, set before, ends that listing at its first master: no
    topic found, none failed, and the pass is not ok, since the masters not listed may hold
    topics with retention (nor failed: the stop is not a failure)."""
    client = connect(redis_cluster.url, socket_timeout=5)
    try:
        Topics(client, namespace).create("kept", 1, retention_records=2)
        metrics = Metrics()
        stop = threading.Event()
        stop.set()
        keeper = RetentionKeeper(client, namespace, N, metrics, lambda: set(range(N)),
                                 60_000, stop, "c1")

        def hiccup() -> list[str]:
            raise redis.ConnectionError("a master's hiccup")

        monkeypatch.setattr(keeper._topics, "list", hiccup)
        assert keeper.run_once() == 0
        assert _passes(metrics, "ok") == 0 and _passes(metrics, "failed") == 0
        stop.clear()  # the next pass lists every master one by one and applies the retention
        assert keeper.run_once() == 1
        assert _passes(metrics, "ok") == 1
    finally:
        client.close()
