"""Review 72b: idempotent appends (7c03e45, skipped ranges carried across an expiry).
Reproductions of defects found; each fails on the code it was written against. Real servers
(``redis_client``: one node and a cluster)."""

from __future__ import annotations

from typing import Any

from test_idempotent_producer import append, expire_twice_declaring_losses, ok, topics, values

from rcoord.topics import Topics

__all__ = ["topics"]  # (the fixture, imported so pytest finds it here)


def test_a_carried_gap_does_not_refuse_a_record_the_new_state_stored(
    topics: Topics, redis_client: Any, namespace: str
) -> None:
    """Sequence 1's call failed and call 2 declared it lost: the state keeps the gap 1..1.
    After the expiry a replay (a new Producer, same id and epoch, same calls in the same
    order) starts a new state at sequence 0, which is handed the old gap, and then appends
    sequence 1 (b), the new state's next sequence. The replayer's retry of that call (its
    reply lost) is refused OUT_OF_ORDER_SEQUENCE_NUMBER, 'that record is not in the
    partition', while b is stored: a carried range at or above the new state's first sequence
    names sequences the new state itself defines."""
    topics.create("t", 1)
    exp = 10_000
    for first, vals, lost, now in ((0, [b"a"], None, 1_000),
                                   (2, [b"c"], 1, 1_000),  # 1 failed: declared lost here
                                   (0, [b"a"], None, 1_000 + exp),  # the replay, after expiry
                                   (1, [b"b"], None, 1_000 + exp)):
        assert ok(append(redis_client, namespace, "t", 0, "p", 0, first, vals, lost=lost,
                         now=now, expiration=exp))[1] == 0
    assert values(namespace, redis_client, "t", 0) == [b"a", b"c", b"a", b"b"]
    res = append(redis_client, namespace, "t", 0, "p", 0, 1, [b"b"], now=1_000 + exp,
                 expiration=exp)
    assert res[0] == b"NONE", f"stored record b refused on resend: {res[:4]}"
    assert ok(res) == (-1, 1, [3])
    assert values(namespace, redis_client, "t", 0) == [b"a", b"c", b"a", b"b"]


def test_joining_two_ranges_of_unknown_outcome_does_not_take_in_a_stored_record(
    topics: Topics, redis_client: Any, namespace: str
) -> None:
    """As test_idempotent_producer's second-expiry test: 2..3 of unknown outcome (declared lost
    after a first expiry), then 5 (after a second). The carried range and the new one are
    joined into 2..5, which takes in sequence 4, e, appended after the first expiry and
    stored. A replay of 4 was answered a duplicate before 7c03e45; after it, refused as of
    unknown outcome ('may or may not be in the partition'), and a replayer told to go on
    under a higher epoch stores e twice. Two disjoint ranges would need two entries (or the
    carried one kept apart), not their hull (8e32664 keeps them apart)."""
    exp = expire_twice_declaring_losses(topics, redis_client, namespace)
    res = append(redis_client, namespace, "t", 0, "p", 0, 4, [b"e"], now=1_000 + 2 * exp,
                 expiration=exp)
    assert res[0] == b"NONE", f"stored record e refused on replay: {res[:1]} {res[3:]}"
    assert ok(res)[1] == 1
    assert values(namespace, redis_client, "t", 0) == [b"a", b"b", b"e", b"g"]
