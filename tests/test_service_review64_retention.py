"""Retention passes while one slot of a cluster has no master (a master lost with no replica
to promote, under ``cluster-require-full-coverage no``).

The cluster client refuses a listing of every master then (``connect.refuse_partial_listing``),
and a pass began with one: every pass was skipped, and no topic was trimmed, on any master,
for as long as the slot had no master. Kafka's broker applies the retention of the logs it
leads whatever happens to the others. A pass now lists the masters one by one and trims the
topics of the served slots; it is still counted and logged as failed.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

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
