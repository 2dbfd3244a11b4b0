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


JOIN: dict[str, Any] = {"protocol_type": "consumer", "protocols": [("range", b"")],
                        "session_timeout_ms": 10_000, "rebalance_timeout_ms": 2000}


def test_a_sweeper_whose_defer_failed_acts_on_a_deadline_published_after_its_failed_call(
        own_server: Any, namespace: str, monkeypatch: Any) -> None:
    """eba6c12 drops the in-memory hold once ``defer_due`` has answered, so a deadline a step
    published after the failed ``expire_deadlines`` is acted on when it falls due. When
    ``defer_due`` itself fails (Redis lost between the two calls), the hold stays, and
    ``_refresh_node`` counts the entry from ``max(score, retry)`` though the score it reads is
    newer than the failed call (a step published it since, so the group's passed deadlines
    were applied): the lease holder sleeps past that real deadline until the retry time (up
    to ``backoff_max_ms``, 30 s), the case eba6c12 meant to close."""
    import redis
    from harness import server_ms
    from test_review73c import sweeper_beside_a_coordinator

    from rcoord import Errors

    client, coord, sweeper = sweeper_beside_a_coordinator(own_server, namespace)
    sent_at = sweeper.server_now()  # the failed expire_deadlines was sent now ...
    mid = coord.join_group("good", **JOIN).member_id  # ... and a step published since
    res = coord.join_group("good", mid, **JOIN)
    assert res.error == Errors.NONE
    assert coord.sync_group("good", res.generation_id, mid, assignments={}).error == Errors.NONE
    ea = client.hget(coord._keys("good").group, "ea")
    assert ea is not None and int(ea) > server_ms(client)  # healthy: nothing due

    def lost(**_: Any) -> Any:
        raise redis.ConnectionError("connection reset (test)")

    monkeypatch.setattr(coord._scripts, "defer_due", lost, raising=False)
    sweeper._failed(0, "good", redis.ResponseError("a transient failure"), client, sent_at)
    assert client.zscore(coord._keys("good").partition.due, "good") == int(ea)

    sweeper.resync({0})  # the lease holder re-reads its partitions (as every second)
    assert sweeper.next_due() <= int(ea), (
        f"the sweeper wakes at {sweeper.next_due():.0f}, {sweeper.next_due() - int(ea):.0f} "
        f"ms past the group's published earliest deadline {int(ea)}")
