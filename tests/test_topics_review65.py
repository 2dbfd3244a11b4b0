"""Review 65: topic admin and the idempotent producer at their edges (a DeleteRecords that Redis
stopped partway, ...)."""

from __future__ import annotations

import pickle
from typing import Any

import pytest
import redis

from rcoord.errors import ConnectionLost
from rcoord.topics import DeletedRecords, Producer, ProducerRecord, Topics, log_offsets
from rcoord.topics import admin as topics_admin
from rcoord.topics.admin import DeleteRecordsIncomplete


@pytest.fixture
def topics(redis_client: Any, namespace: str) -> Topics:
    return Topics(redis_client, namespace)


def test_a_delete_records_redis_stops_partway_says_what_it_did(redis_client, namespace, topics,
                                                              monkeypatch):
    """Partition 0's removal is done in the first round; partition 1's, split in bounded calls,
    loses Redis in its second. The call raised a bare ConnectionLost, so its caller took the
    whole call for failed though partition 0's records were gone; Kafka's AdminClient answers
    each partition on its own. The ConnectionLost now says which partitions are done (their
    answers) and which are not, with the offset to ask again: -1 as the log end the call read,
    so that asking again keeps the records appended since."""
    topics.create("t", 2)
    Producer(redis_client, namespace, idempotent=False).send_batch("t", [
        ProducerRecord(b"x" * 1000, partition=p) for p, n in ((0, 3), (1, 40)) for _ in range(n)])
    monkeypatch.setattr(topics_admin, "RETENTION_TRIM_BYTES", 5000)
    real, rounds = topics_admin._run, []

    def cut_in_second_round(client: Any, calls: Any, **kwargs: Any) -> Any:
        rounds.append(len(calls))
        if len(rounds) == 2:
            raise redis.exceptions.ConnectionError("connection reset (test)")
        return real(client, calls, **kwargs)

    monkeypatch.setattr(topics_admin, "_run", cut_in_second_round)
    with pytest.raises(DeleteRecordsIncomplete) as info:
        topics.delete_records("t", {0: 2, 1: -1})
    assert isinstance(info.value, ConnectionLost)  # (retriable, as before)
    assert "connection reset (test)" in str(info.value)
    assert info.value.done == {0: DeletedRecords(0, 2)}
    assert info.value.unfinished == {1: 40}
    assert pickle.loads(pickle.dumps(info.value)).unfinished == {1: 40}
    assert rounds == [2, 1]
    monkeypatch.setattr(topics_admin, "_run", real)
    assert [log_offsets(redis_client, namespace, "t", p)[0] for p in range(2)] == [2, 4]
    assert topics.delete_records("t", info.value.unfinished) == {1: DeletedRecords(1, 40)}
