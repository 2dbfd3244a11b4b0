"""Spark replay records (``rcoord.spark.replays``) last a retention, not as long as the group
restarts more often than that: each field carries its write time on the Redis server's clock."""

from __future__ import annotations

from typing import Any

from rcoord.keys import replays_key
from rcoord.protocol.offsets import TopicPartition as TP
from rcoord.spark.plan import Position
from rcoord.spark.replays import REPLAY_TTL_S, record_replay, replayed_generation

DAY_MS = 24 * 3600 * 1000
KEEP_MS = REPLAY_TTL_S * 1000


def _end(generation: int, member: str = "m-1") -> Position:
    return Position({TP("ev", 0): 3}, generation=generation, member=member)


def _fields(client: Any, namespace: str) -> set[str]:
    return {f.decode() for f in client.hkeys(replays_key(namespace, "g"))}


def test_a_record_older_than_the_retention_is_dropped_by_the_next_write(
        redis_client: Any, namespace: str) -> None:
    # Before, every restart whose first batch was a replay added a field and renewed the
    # hash's expiry: a query restarted weekly kept one field per restart for good.
    record_replay(redis_client, namespace, "g", _end(1), 2)  # on the server's clock
    key = replays_key(namespace, "g")
    secs, _ = redis_client.time()
    redis_client.hset(key, "@1:m-1", secs * 1000 - KEEP_MS)  # as if written a retention ago
    record_replay(redis_client, namespace, "g", _end(3), 4)
    assert _fields(redis_client, namespace) == {"3:m-1", "@3:m-1"}
    assert replayed_generation(redis_client, namespace, "g", _end(1)) is None
    assert replayed_generation(redis_client, namespace, "g", _end(3)) == 4
    assert 0 < redis_client.pttl(key) <= KEEP_MS


def test_records_count_for_the_retention_from_their_own_write(
        redis_client: Any, namespace: str) -> None:
    t0 = 1_000 * DAY_MS
    record_replay(redis_client, namespace, "g", _end(1), 2, now_ms=t0)
    # another member of the group replays its own batch meanwhile: it keeps the first record
    record_replay(redis_client, namespace, "g", _end(1, "m-2"), 3, now_ms=t0 + KEEP_MS - 1)
    assert replayed_generation(redis_client, namespace, "g", _end(1), now_ms=t0 + KEEP_MS - 1) == 2
    # a retention after its write a record is read as none, whether or not a write dropped it
    assert replayed_generation(redis_client, namespace, "g", _end(1), now_ms=t0 + KEEP_MS) is None
    assert "1:m-1" in _fields(redis_client, namespace)
    record_replay(redis_client, namespace, "g", _end(5), 6, now_ms=t0 + KEEP_MS)
    assert _fields(redis_client, namespace) == {"1:m-2", "@1:m-2", "5:m-1", "@5:m-1"}
    assert replayed_generation(redis_client, namespace, "g", _end(1, "m-2"),
                               now_ms=t0 + KEEP_MS) == 3
    # a record written again counts from its new write
    record_replay(redis_client, namespace, "g", _end(1, "m-2"), 7, now_ms=t0 + 2 * KEEP_MS - 1)
    record_replay(redis_client, namespace, "g", _end(8), 9, now_ms=t0 + 2 * KEEP_MS)
    assert replayed_generation(redis_client, namespace, "g", _end(1, "m-2"),
                               now_ms=t0 + 2 * KEEP_MS) == 7
    assert replayed_generation(redis_client, namespace, "g", _end(5),
                               now_ms=t0 + 2 * KEEP_MS) is None
    assert _fields(redis_client, namespace) == {"1:m-2", "@1:m-2", "8:m-1", "@8:m-1"}


def test_a_record_written_without_a_time_is_read_and_dropped_a_retention_after_a_write(
        redis_client: Any, namespace: str) -> None:
    # what rcoord wrote before the times were kept (and an older rcoord still writes)
    redis_client.hset(replays_key(namespace, "g"), "1:m-1", 2)
    t0 = 1_000 * DAY_MS
    assert replayed_generation(redis_client, namespace, "g", _end(1), now_ms=t0) == 2
    record_replay(redis_client, namespace, "g", _end(3), 4, now_ms=t0)  # judged from here
    assert replayed_generation(redis_client, namespace, "g", _end(1),
                               now_ms=t0 + KEEP_MS - 1) == 2
    record_replay(redis_client, namespace, "g", _end(5), 6, now_ms=t0 + KEEP_MS)
    assert _fields(redis_client, namespace) == {"5:m-1", "@5:m-1"}


def test_the_worker_role_of_docs_security_md_records_and_reads_a_replay(
        redis_server: Any, namespace: str) -> None:
    # The source runner records a replay as a worker. Before, the record's EXPIRE was not
    # among the worker's commands (+pexpire is): the replay was refused with NOPERM, and the
    # group delivered the batch's records again under a new batch id.
    from test_acl import PASSWORD, RULES

    from rcoord.connect import connect

    admin = redis_server.client()
    name = f"u-spark-{namespace}"
    tokens = [t.replace("<password>", PASSWORD).replace("<namespace>", namespace)
              for t in RULES["worker"]]
    admin.execute_command("ACL", "SETUSER", name, *tokens)
    worker = connect(redis_server.url.replace("redis://", f"redis://{name}:{PASSWORD}@"))
    try:
        record_replay(worker, namespace, "g", _end(1), 2)
        assert replayed_generation(worker, namespace, "g", _end(1)) == 2
    finally:
        worker.close()
        admin.execute_command("ACL", "DELUSER", name)
        admin.close()
