"""A partition whose stream got an XADD by hand with an id of its own (its last id is not
rcoord's, so it has no log offsets) is answered with an error for that partition alone by the
reads of log offsets that answer per partition, as Kafka's ListOffsets does: ``Topics.describe``
(and ``rcoord topics describe``), ``log_offsets_each``. Before, that one stream failed the whole
read with a TopicError, so none of the topic's other partitions were described. One node and a
cluster (the ``redis_client`` fixture)."""

from __future__ import annotations

from typing import Any

import pytest
import test_cli_groups
from test_cli_groups import rows

from rcoord.errors import Errors
from rcoord.topics import (
    PartitionInfo,
    Producer,
    ProducerRecord,
    TopicError,
    Topics,
    log_offsets,
    partition_key,
)
from rcoord.topics.fetch import log_offsets_each, log_offsets_many

url = test_cli_groups.url  # fixtures: the backend's URL, and the command line on it
cli = test_cli_groups.cli

MENDS = "delete and re-create the topic"


@pytest.fixture
def topics(redis_client: Any, namespace: str) -> Topics:
    return Topics(redis_client, namespace)


def _foreign_p1(redis_client: Any, namespace: str, topics: Topics) -> None:
    """Topic t of 3 partitions holding 2, 1 and 3 records; t-1 then gets an XADD by hand with
    an id of its own (milliseconds), after which it has no log offsets."""
    topics.create("t", 3)
    Producer(redis_client, namespace, idempotent=False).send_batch(
        "t", [ProducerRecord(b"v", partition=p) for p, n in enumerate([2, 1, 3])
              for _ in range(n)])
    redis_client.execute_command("XADD", partition_key(namespace, "t", 1), "*", "t", 1)


def test_describe_answers_the_unreadable_partition_alone(redis_client, namespace, topics):
    """t-1 is UNKNOWN_SERVER_ERROR (offsets -1) with a detail naming its stream and what mends
    it; t-0 and t-2 are described as usual."""
    _foreign_p1(redis_client, namespace, topics)
    parts = topics.describe("t").partitions
    assert [(p.partition, p.log_start_offset, p.log_end_offset, p.error) for p in parts] == [
        (0, 0, 2, Errors.NONE), (1, -1, -1, Errors.UNKNOWN_SERVER_ERROR), (2, 0, 3, Errors.NONE)]
    assert partition_key(namespace, "t", 1) in parts[1].detail and MENDS in parts[1].detail
    assert parts[0].detail == parts[2].detail == ""
    assert parts[0] == PartitionInfo(0, 0, 2)


def test_log_offsets_each_answers_the_unreadable_partition_in_its_place(
        redis_client, namespace, topics):
    """Each partition in the order asked (t-1 twice, a missing one too); ``log_offsets_many``
    and ``log_offsets`` of t-1 still raise its TopicError, one of t-0 and t-2 does not."""
    _foreign_p1(redis_client, namespace, topics)
    asked = [("t", 0), ("t", 1), ("t", 2), ("t", 1), ("t", 7)]
    got = log_offsets_each(redis_client, namespace, asked)
    assert [g for i, g in enumerate(got) if i not in (1, 3)] == [
        (0, 2), (0, 3), Errors.UNKNOWN_TOPIC_OR_PARTITION]
    for failed in (got[1], got[3]):
        assert isinstance(failed, TopicError)
        assert failed.error is Errors.UNKNOWN_SERVER_ERROR and MENDS in failed.detail
        assert partition_key(namespace, "t", 1) in failed.detail
    assert log_offsets_many(redis_client, namespace, [("t", 0), ("t", 2)]) == [(0, 2), (0, 3)]
    for read in (lambda: log_offsets_many(redis_client, namespace, asked),
                 lambda: log_offsets(redis_client, namespace, "t", 1)):
        with pytest.raises(TopicError) as caught:
            read()
        assert caught.value.error is Errors.UNKNOWN_SERVER_ERROR
        assert MENDS in caught.value.detail


def test_the_command_line_describes_the_other_partitions(cli, redis_client, namespace, topics):
    """``rcoord topics describe t`` prints every partition, t-1 with its error; it failed with
    the TopicError and printed nothing before."""
    _foreign_p1(redis_client, namespace, topics)
    res = cli("topics", "describe", "t")
    assert res.returncode == 0, res.stderr
    assert rows(res.stdout, "TOPIC PARTITION") == [
        ["t", "0", "0", "2", "-"], ["t", "1", "-1", "-1", "UNKNOWN_SERVER_ERROR"],
        ["t", "2", "0", "3", "-"]]
