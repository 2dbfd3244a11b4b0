"""Review of this session's fixes (74x): defects a fix brought, each reproduced."""

from __future__ import annotations

from typing import Any

import pytest

from rcoord.errors import Errors
from rcoord.topics import Producer, ProducerRecord, TopicError, Topics


def test_choose_partition_refuses_a_custom_partitioners_choice_past_the_count_as_a_send_does(
    topics: Topics, redis_client: Any, namespace: str
) -> None:
    """f132a09 made ``choose_partition`` "make every check a send of the record makes", but a
    partitioner's choice past the topic's partitions is checked by ``_send`` only: the choice
    is returned, and the send of the placed record fails later, after other records placed
    before it went (the half-write the fix was for)."""
    topics.create("t", 2)
    producer = Producer(redis_client, namespace, partitioner=lambda topic, key, n: n)
    with pytest.raises(TopicError) as sent:
        producer.send_batch("t", [ProducerRecord(b"v")])
    assert sent.value.error == Errors.UNKNOWN_TOPIC_OR_PARTITION
    with pytest.raises(TopicError) as chosen:
        producer.choose_partition("t", ProducerRecord(b"v"))
    assert chosen.value.error == Errors.UNKNOWN_TOPIC_OR_PARTITION
