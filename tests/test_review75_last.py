"""Reproductions from a review of the last session's commits (c09d7b4..ce2053d)."""

from __future__ import annotations

from typing import Any

import pytest

from rcoord.topics import Producer, ProducerRecord, Topics, log_offsets
from rcoord.topics import _base as topics_base


@pytest.fixture
def topics(redis_client: Any, namespace: str) -> Topics:
    return Topics(redis_client, namespace)


def _filled(redis_client: Any, namespace: str, topics: Topics, n: int, value: bytes,
            **settings: Any) -> None:
    topics.create("t", 1, **settings)
    Producer(redis_client, namespace, idempotent=False).send_batch(
        "t", [ProducerRecord(value, partition=0) for _ in range(n)])


def test_apply_retention_leaves_a_topic_made_again_between_rounds_alone(
        redis_client: Any, namespace: str, topics: Topics, monkeypatch: Any) -> None:
    """apply_retention reads the topic's settings once, then trims in rounds; a topic deleted
    and made again (same name, no retention) after the first round is another log, which the
    old topic's retention.records must not trim, as 4aa942b made delete_records' rounds check
    the creation token read when they began."""
    _filled(redis_client, namespace, topics, 40, b"x" * 1000, retention_records=5)
    monkeypatch.setattr("rcoord.topics.admin.RETENTION_TRIM_BYTES", 5000)  # (several rounds)
    made_again: list[int] = []

    class Recreating(topics_base._Lua):
        def __call__(self, client: Any, keys: Any, args: Any) -> Any:
            reply = super().__call__(client, keys, args)
            if not made_again:  # (after the first round, which removed a few records)
                topics.delete("t")
                _filled(redis_client, namespace, topics, 40, b"y" * 1000)
                made_again.append(int(reply[1]))
            return reply

    monkeypatch.setattr("rcoord.topics.admin.RETENTION", Recreating("topic_retention"))
    try:
        topics.apply_retention("t")
    except topics_base.TopicError:
        pass  # (answering the old topic gone is fine; trimming the new one is not)
    assert made_again and made_again[0] > 0
    assert log_offsets(redis_client, namespace, "t", 0) == (0, 40)
