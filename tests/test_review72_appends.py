"""Review 72: idempotent appends against Kafka's idempotent producer. Reproductions of defects
found; each fails on the code it was written against. Real servers (``redis_client``: one node
and a cluster)."""

from __future__ import annotations

from typing import Any

from test_idempotent_producer import append, error, ok, topics, values

from rcoord import Errors
from rcoord.topics import Topics

__all__ = ["topics"]  # (the fixture, imported so pytest finds it here)


def test_a_gap_declared_before_the_state_expired_is_not_a_duplicate_after_it(
    topics: Topics, redis_client: Any, namespace: str
) -> None:
    """Sequence 1's call failed and the next call (2) declared it lost: a gap the state keeps.
    The producer then idled past the expiration; its next call (3) declares nothing (its loss
    was spent by call 2) and starts a new state, without the gap. A replay of sequence 1
    (a new Producer under the same id and epoch, as the Spark sink's retried task) was
    answered a duplicate, "stored" at offset -1, while record b is in no partition: the
    class docstring's "a record whose earlier send failed and was skipped as lost is refused
    with OUT_OF_ORDER_SEQUENCE_NUMBER, never reported stored" does not hold across the
    expiry. (test_idempotent_producer's expiry test covers a loss declared after it.)"""
    topics.create("t", 1)
    exp = 10_000
    for first, vals, lost, now in ((0, [b"a"], None, 1_000),
                                   (2, [b"c"], 1, 1_000),  # 1 failed: declared lost here
                                   (3, [b"d"], None, 1_000 + exp)):  # idle till expiry
        assert ok(append(redis_client, namespace, "t", 0, "p", 0, first, vals, lost=lost,
                         now=now, expiration=exp))[1] == 0
    assert values(namespace, redis_client, "t", 0) == [b"a", b"c", b"d"]
    res = append(redis_client, namespace, "t", 0, "p", 0, 1, [b"b"], now=1_000 + exp,
                 expiration=exp)
    assert error(res) == Errors.OUT_OF_ORDER_SEQUENCE_NUMBER, (
        f"the lost record b was answered {res[:1]} with duplicates {res[3:5]}")
    assert values(namespace, redis_client, "t", 0) == [b"a", b"c", b"d"]
