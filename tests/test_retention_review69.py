"""Review 69: a topic trim that finished in the round the service's stop came was not counted
applied: ``Topics.apply_retention``'s answer (partition -> log start offset) did not say whether
rounds were left, so ``RetentionKeeper`` took every trim that ended with the stop set for cut
short. The answer (``LogStarts``) now names the partitions left (``unfinished``), and only a
trim with some left is logged ``retention_stopped`` and not counted."""

from __future__ import annotations

import threading

from test_service_retention import (  # noqa: F401 - retention_log: the fixture
    _keeper_passes,
    _produce,
    _stopping_before_first_topic,
    retention_log,
)

from rcoord.service.metrics import Metrics
from rcoord.topics import Topics, log_offsets
from rcoord.topics import admin as topics_admin


def test_the_trims_answer_names_the_partitions_a_stop_left(single_client, namespace,
                                                          monkeypatch):
    """Retention 1 record, about one record removed a round (RETENTION_TRIM_BYTES 1): with the
    stop set, partition 0 (2 records) is done in its one round, partition 1 (5 records) is
    not. The answer still equals the plain offsets, for the callers that read only those."""
    topics = Topics(single_client, namespace)
    topics.create("u", 2, retention_records=1)
    _produce(single_client, namespace, "u", 2, partition=0)
    _produce(single_client, namespace, "u", 5, partition=1)
    monkeypatch.setattr(topics_admin, "RETENTION_TRIM_BYTES", 1)
    stop = threading.Event()
    stop.set()
    cut = topics.apply_retention("u", stop)
    assert cut == {0: 1, 1: 1}
    assert (cut.unfinished, cut.done) == ((1,), False)
    finished = topics.apply_retention("u")
    assert finished == {0: 1, 1: 4}
    assert (finished.unfinished, finished.done) == ((), True)


def test_a_topic_whose_trim_finished_in_the_stops_round_is_counted_applied(
        single_client, namespace, retention_log):  # noqa: F811 - the fixture
    """Two topics (retention 1 record, 3 records each); the stop comes just before the first
    topic's trim (a hook on ``owned``, asked at the pass's start and before each topic). That
    trim finishes in its one round: counted and logged applied. The other topic is left, so
    the pass is not ok (nor failed)."""
    topics = Topics(single_client, namespace)
    names = ["f1", "f2"]
    for name in names:
        topics.create(name, 1, retention_records=1)
        _produce(single_client, namespace, name, 3)
    metrics = Metrics()
    keeper, _ = _stopping_before_first_topic(single_client, namespace, metrics)
    applied = keeper.run_once()
    offsets = {t: log_offsets(single_client, namespace, t, 0) for t in names}
    assert sorted(offsets.values()) == [(0, 3), (2, 3)]  # one trimmed, one left
    trimmed = next(t for t, o in offsets.items() if o == (2, 3))
    topics_applied = metrics.registry.get_sample_value("rcoord_retention_topics_applied_total")
    assert (applied, topics_applied) == (1, 1.0)
    assert retention_log.appliers(trimmed) == {"c1"} and retention_log.stopped == []
    assert _keeper_passes(metrics, "ok") == 0 and _keeper_passes(metrics, "failed") == 0


def test_a_pass_whose_stop_came_in_its_last_trims_finished_round_is_ok(
        single_client, namespace, retention_log):  # noqa: F811 - the fixture
    """One topic (retention 1 record, 3 records); the stop comes just before its trim, which
    finishes in its one round: the pass left nothing, so it is ok. Before, every pass that
    ended with the stop set was taken for cut short and counted neither ok nor failed."""
    Topics(single_client, namespace).create("o", 1, retention_records=1)
    _produce(single_client, namespace, "o", 3)
    metrics = Metrics()
    keeper, _ = _stopping_before_first_topic(single_client, namespace, metrics)
    assert keeper.run_once() == 1
    assert log_offsets(single_client, namespace, "o", 0) == (2, 3)
    assert retention_log.appliers("o") == {"c1"} and retention_log.stopped == []
    assert _keeper_passes(metrics, "ok") == 1 and _keeper_passes(metrics, "failed") == 0
