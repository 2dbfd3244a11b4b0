"""rcoord.topics.epoch_log: what a producer id stored in its epoch, read back (single node and
cluster), and the Producer calls it works with (log_appends, resume_sequence)."""

from __future__ import annotations

from typing import Any

import pytest

from rcoord import InvalidRequestError
from rcoord.topics import Producer, ProducerRecord, TopicError, Topics, admin, fetch
from rcoord.topics._base import producer_log_key
from rcoord.topics.epoch_log import epoch_appends, epoch_states


@pytest.fixture
def topics(redis_client: Any, namespace: str) -> Topics:
    return Topics(redis_client, namespace)


def _named(client: Any, ns: str, epoch: int, log: bool = True) -> Producer:
    return Producer(client, ns, producer_id="task-1", producer_epoch=epoch, log_appends=log)


def test_the_log_names_exactly_the_records_of_the_epoch_among_others(
        redis_client: Any, namespace: str, topics: Topics) -> None:
    topics.create("t", 3)
    other = Producer(redis_client, namespace, producer_id="task-2", log_appends=True)
    mine = _named(redis_client, namespace, 4)
    sent = []
    for i in range(6):  # calls of both interleave in each partition
        batch = [ProducerRecord(f"m{i}-{j}".encode(), partition=(i + j) % 3,
                                headers=[("h", b"x")] if j == 0 else None) for j in range(5)]
        mine.send_batch("t", batch)
        sent += batch
        other.send_batch("t", [ProducerRecord(f"m{i}-{j}".encode(), partition=j % 3)
                               for j in range(4)])  # same values: content does not tell
    states = epoch_states(redis_client, namespace, "t", "task-1", 3)
    assert {p: (s.epoch, s.last_sequence) for p, s in states.items()} == {
        0: (4, 9), 1: (4, 9), 2: (4, 9)}
    got = epoch_appends(redis_client, namespace, "t", "task-1", 4, list(states.values()))
    assert all(a.complete for a in got.values())
    for p in range(3):
        assert [r.value for r in got[p].records] == [r.value for r in sent if r.partition == p]
    assert got[0].records[0].value == b"m0-0"
    assert got[0].records[0].header_list == (("h", b"x"),)
    # another epoch: nothing of epoch 4 at epoch 5, and the log starts over with epoch 5
    assert epoch_appends(redis_client, namespace, "t", "task-1", 5, list(states.values())) == {}
    _named(redis_client, namespace, 5).send("t", b"new", partition=1)
    states = epoch_states(redis_client, namespace, "t", "task-1", 3)
    got = epoch_appends(redis_client, namespace, "t", "task-1", 5, list(states.values()))
    assert list(got) == [1] and [r.value for r in got[1].records] == [b"new"]
    raw = redis_client.get(producer_log_key(namespace, "t", 1, "task-1"))
    assert raw.count(b"\n") == 1 and raw.startswith(b"5 0 ")
    # the log lives as long as the state would
    assert 0 < redis_client.pttl(producer_log_key(namespace, "t", 1, "task-1")) <= 86_400_000


def test_a_producer_without_a_log_keeps_none_and_the_reader_says_incomplete(
        redis_client: Any, namespace: str, topics: Topics) -> None:
    topics.create("t", 1)
    _named(redis_client, namespace, 2, log=False).send_batch("t", [b"a", b"b"])
    assert redis_client.exists(producer_log_key(namespace, "t", 0, "task-1")) == 0
    later = _named(redis_client, namespace, 2)  # a writer that logs, same epoch
    later.resume_sequence("t", 0, 2)
    later.send("t", b"c")
    states = epoch_states(redis_client, namespace, "t", "task-1", 1)
    got = epoch_appends(redis_client, namespace, "t", "task-1", 2, list(states.values()))
    assert [r.value for r in got[0].records] == [b"c"] and not got[0].complete
    assert [r.value for r in fetch(redis_client, namespace, "t", 0, 0).records] == [
        b"a", b"b", b"c"]


def test_resume_sequence_numbers_after_the_stored_records(
        redis_client: Any, namespace: str, topics: Topics) -> None:
    topics.create("t", 1)
    _named(redis_client, namespace, 1).send_batch("t", [b"a", b"b", b"c"])
    again = _named(redis_client, namespace, 1)
    again.resume_sequence("t", 0, 3)
    metas = again.send_batch("t", [b"d", b"e"])
    assert [(m.offset, m.duplicate) for m in metas] == [(3, False), (4, False)]
    with pytest.raises(InvalidRequestError, match="has sent records there already"):
        again.resume_sequence("t", 0, 9)
    with pytest.raises(InvalidRequestError, match="log_appends needs a producer_id"):
        Producer(redis_client, namespace, log_appends=True)
    with pytest.raises(InvalidRequestError, match="for idempotent producers"):
        Producer(redis_client, namespace, idempotent=False).resume_sequence("t", 0, 1)
    # A partition or topic no send uses was taken: the next sends numbered from 0 again, and
    # the server dropped their records as duplicates of the stored ones.
    fresh = _named(redis_client, namespace, 1)
    with pytest.raises(TypeError, match="partition must be int, got str"):
        fresh.resume_sequence("t", "0", 3)  # type: ignore[arg-type]
    with pytest.raises(InvalidRequestError, match="partition must be >= 0, got -3"):
        fresh.resume_sequence("t", -3, 3)
    with pytest.raises(TopicError, match="INVALID_TOPIC_EXCEPTION: illegal topic name"):
        fresh.resume_sequence("no such topic!", 0, 3)
    fresh.resume_sequence("t", 0, 5)  # nothing refused above took its place
    assert again.partition_count("t") == 1


def test_deleting_the_topic_deletes_the_append_logs(
        redis_client: Any, namespace: str, topics: Topics) -> None:
    """The logs are named by producer id, so a delete finds them through the producer states
    (before, they stayed until they expired, a day by default)."""
    topics.create("t", 2)
    _named(redis_client, namespace, 1).send_batch(
        "t", [ProducerRecord(b"a", partition=0), ProducerRecord(b"b", partition=1)])
    Producer(redis_client, namespace, producer_id="plain").send("t", b"c", partition=1)
    logs = [producer_log_key(namespace, "t", p, "task-1") for p in range(2)]
    assert all(redis_client.exists(k) for k in logs)
    topics.delete("t")
    assert not any(redis_client.exists(k) for k in logs)
    assert redis_client.keys(f"{namespace}:topic*") == []  # nothing of the topic is left


def test_deleting_a_topic_names_no_append_log_for_the_stored_setting(
        redis_client: Any, namespace: str, topics: Topics, monkeypatch: Any) -> None:
    """A change of producer_id_expiration_ms stores it in each partition's producer states
    under the empty field, which is no producer's: the delete took it for one and deleted a
    log key named after it (``...:t:0:``)."""
    topics.create("t", 1)
    _named(redis_client, namespace, 1).send("t", b"a", partition=0)
    topics.alter_configs("t", {"producer_id_expiration_ms": 600_000})
    named = []

    def spy(ns: str, topic: str, partition: int, producer_id: str) -> str:
        named.append(producer_id)
        return producer_log_key(ns, topic, partition, producer_id)

    monkeypatch.setattr(admin, "producer_log_key", spy)
    topics.delete("t")
    assert named == ["task-1"]
    assert redis_client.keys(f"{namespace}:topic*") == []
