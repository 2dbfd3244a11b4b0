"""Retention and DeleteRecords on a topic one of whose partitions holds an entry added by hand
(no integer timestamp, or a last id that is not rcoord's): the other partitions are trimmed as
if it were not there, as Kafka's logs are each trimmed on their own."""

from __future__ import annotations

from typing import Any

import pytest

from rcoord import Errors
from rcoord.topics import TopicError, Topics, partition_key
from rcoord.topics import admin as topics_admin


@pytest.mark.parametrize(("entry_id", "refusal"), [
    ("0-*", "the entry at offset 1 is not a record"), ("*", "its last entry id is")],
    ids=["no-timestamp", "foreign-last-id"])
def test_retention_trims_the_other_partitions_past_an_entry_added_by_hand(
    redis_client: Any, namespace: str, monkeypatch: pytest.MonkeyPatch, entry_id: str,
    refusal: str,
) -> None:
    """One partition's entry with no ``t`` (or an id of its own) made ``apply_retention`` raise
    at its first round, so every other partition of the topic was trimmed one round
    (``RETENTION_SCAN`` records) per pass and an expired backlog there outgrew what a pass
    removed. Now they are trimmed to the
    end, and the error, naming the bad entry, comes after."""
    monkeypatch.setattr(topics_admin, "RETENTION_SCAN", 5)
    topics = Topics(redis_client, namespace)
    topics.create("t", 2, retention_ms=1000)
    bad, good = (partition_key(namespace, "t", p) for p in (0, 1))
    redis_client.execute_command("XADD", bad, "0-*", "t", 1, "v", b"old")
    redis_client.execute_command("XADD", bad, entry_id, "v", b"by hand")
    if entry_id == "0-*":
        redis_client.execute_command("XADD", bad, "0-*", "t", 1, "v", b"old")
    for _ in range(23):
        redis_client.execute_command("XADD", good, "0-*", "t", 1, "v", b"old")
    with pytest.raises(TopicError, match=refusal) as caught:
        topics.apply_retention("t")
    assert caught.value.error == Errors.UNKNOWN_SERVER_ERROR
    assert redis_client.xlen(good) == 0  # (was 18: one round of 5)
    assert redis_client.xlen(bad) == (3 if entry_id == "0-*" else 2)  # (refused unwritten)


def test_delete_records_does_the_other_partitions_past_a_stream_with_a_foreign_last_id(
    redis_client: Any, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A partition whose last id an XADD by hand made its own failed ``delete_records`` at
    its first round, so the other partitions named were left one round
    (``RETENTION_TRIM_BYTES``) into their removal, their answer lost. Now they are done, and
    that partition alone is answered with the error naming its stream (as Kafka's
    DeleteRecords answers per partition)."""
    monkeypatch.setattr(topics_admin, "RETENTION_TRIM_BYTES", 1)  # (a record a call)
    topics = Topics(redis_client, namespace)
    topics.create("t", 2)
    bad, good = (partition_key(namespace, "t", p) for p in (0, 1))
    redis_client.execute_command("XADD", bad, "0-*", "t", 1, "v", b"old")
    redis_client.execute_command("XADD", bad, "*", "v", b"by hand")
    for _ in range(5):
        redis_client.execute_command("XADD", good, "0-*", "t", 1, "v", b"old")
    answers = topics.delete_records("t", {0: 1, 1: -1})
    assert answers[0].error == Errors.UNKNOWN_SERVER_ERROR
    assert "its last entry id is" in answers[0].detail
    assert (answers[1].error, answers[1].low_watermark) == (Errors.NONE, 5)
    assert redis_client.xlen(good) == 0  # (was 4: one round)
    assert redis_client.xlen(bad) == 2
