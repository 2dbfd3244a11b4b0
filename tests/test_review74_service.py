"""Review 74 (fresh eyes on the coordinator service): reproductions of what it found."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import redis
from test_service_retention import (  # noqa: F401 - retention_log: the fixture
    N,
    _produce,
    retention_log,
)

from rcoord.errors import ConnectionLost, Errors
from rcoord.service.metrics import Metrics
from rcoord.service.retention import RetentionKeeper
from rcoord.topics import TopicError, Topics, meta_key


def _half_deleted(client: Any, namespace: str, topic: str,
                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``Topics.delete`` that stopped after removing the streams, before the metadata (the
    process died, Redis went away; or a pass that reads the topic while a delete runs): the
    topic stays listed, marked for deletion, with no partition left."""
    topics = Topics(client, namespace)
    real = client.delete

    def dies_at_the_metadata(*keys: str) -> Any:
        if meta_key(namespace, topic) in keys:
            raise redis.ConnectionError("the process died here")
        return real(*keys)

    with monkeypatch.context() as patched:
        patched.setattr(client, "delete", dies_at_the_metadata)
        with pytest.raises(ConnectionLost):
            topics.delete(topic)
    assert topic in topics.list()


def test_retention_of_a_topic_whose_partitions_are_gone_is_not_answered_as_log_starts(
        single_client, namespace, monkeypatch):
    """Each partition's script answers UNKNOWN_TOPIC_OR_PARTITION; ``apply_retention`` read
    only its offsets and answered {0: -1, 1: -1}, as if -1 were where each log starts."""
    topics = Topics(single_client, namespace)
    topics.create("gone", 2, retention_records=1)
    _produce(single_client, namespace, "gone", 3)
    _half_deleted(single_client, namespace, "gone", monkeypatch)
    try:
        starts = topics.apply_retention("gone")
    except TopicError as exc:
        assert exc.error == Errors.UNKNOWN_TOPIC_OR_PARTITION
    else:
        assert all(start >= 0 for start in starts.values()), starts


def test_a_topic_whose_delete_stopped_partway_is_not_counted_applied_every_pass(
        single_client, namespace, retention_log, monkeypatch):  # noqa: F811 - the fixture
    """A half-deleted topic (its streams removed, its metadata left) has no record to trim,
    yet every pass counted it in rcoord_retention_topics_applied_total and logged
    ``retention_applied`` with log starts of -1, as long as the topic stayed half-deleted."""
    topics = Topics(single_client, namespace)
    topics.create("half", 1, retention_records=1)
    _produce(single_client, namespace, "half", 3)
    _half_deleted(single_client, namespace, "half", monkeypatch)
    metrics = Metrics()
    keeper = RetentionKeeper(single_client, namespace, N, metrics, lambda: set(range(N)),
                             60_000, threading.Event(), "c1")
    for _ in range(2):
        assert keeper.run_once() == 0
    assert metrics.registry.get_sample_value("rcoord_retention_topics_applied_total") == 0
    assert retention_log.appliers("half") == set()
