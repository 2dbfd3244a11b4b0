"""Review 72: durations past Kafka's INT (be93569 bounded ConsumerGroupConfig's and the Spark
source's; Long.MAX is a Java user's "no limit"). The Consumer's own durations were left
unbounded: ``default_api_timeout_ms`` (Kafka's ``default.api.timeout.ms``, an INT) becomes the
budget of ``commit()`` and the offset queries, whose deadline threading cannot wait for."""

from __future__ import annotations

from typing import Any

from test_consumer import env  # noqa: F401 - env: the fixture

from rcoord import TopicPartition
from rcoord.errors import ConfigError

LONG_MAX = 2**63 - 1
TP = TopicPartition("t", 0)


def test_default_api_timeout_ms_past_kafkas_int_is_refused_or_works(
        env: Any) -> None:  # noqa: F811 - the fixture
    """Taken, the first commit() failed with 'OverflowError: timestamp out of range for
    platform time_t' (the committer's wait for its deadline), naming no setting: refused at
    construction naming the option (as ConfigError) it would be a clear error instead."""
    env.topics.create("t", 1)
    try:
        consumer = env.consumer(topics=[], default_api_timeout_ms=LONG_MAX)
    except ConfigError as exc:
        assert "default_api_timeout_ms" in str(exc)
        return
    try:
        consumer.assign([TP])
        consumer.commit({TP: 0})
        assert consumer.committed([TP]) == {TP: 0}
    finally:
        consumer.close(timeout=0)
