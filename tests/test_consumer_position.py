"""``Consumer.position()`` and the pending offset resets it evaluates (``seek_to_beginning``,
``seek_to_end``), against Kafka's ``ClassicKafkaConsumer.position`` and
``updateFetchPositions``. Real servers (the ``env`` fixture of test_consumer)."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import test_consumer
from test_client_group import WAIT_S

from rcoord import TopicPartition
from rcoord.client import WakeupError
from rcoord.client.coordinator import RedisCoordinator

TP = TopicPartition
env = test_consumer.env


class _CreatesOnFirstMiss(RedisCoordinator):
    """Once ``armed``, creates the topic ``t`` (and appends ``records`` to t-0) when a
    log-offsets read has found it missing: the position() asking next must find it."""

    def __init__(self, env: Any, records: int) -> None:
        super().__init__(env.client, env.namespace)
        self._env, self._records = env, records
        self.armed = False
        self.misses = 0

    def log_offsets(self, topic: str, partition: int) -> tuple[int, int]:
        try:
            return super().log_offsets(topic, partition)
        except Exception:
            if not self.armed:
                raise  # (assign()'s start_offset policy reads it too)
            self.misses += 1
            if self.misses == 1:
                self._env.topics.create("t", 1)
                for i in range(self._records):
                    self._env.producer.send("t", b"r%d" % i, partition=0)
            raise


def test_position_waits_for_a_topic_created_after_the_first_try(env: Any) -> None:
    """As Kafka's position(), which retries the pending reset until its timeout: a
    seek_to_end() of an assign()ed partition whose topic appears while position() runs
    resolves to the end the topic then has. Before, the first UNKNOWN_TOPIC_OR_PARTITION
    was raised at once."""
    coord = _CreatesOnFirstMiss(env, 2)
    consumer = env.consumer(enable_auto_commit=False, topics=[], coordinator=coord)
    consumer.assign([TP("t", 0)])
    consumer.seek_to_end()
    coord.armed = True
    assert consumer.position(TP("t", 0), timeout=WAIT_S) == 2
    assert coord.misses == 1


def test_position_of_a_missing_topic_times_out(env: Any) -> None:
    """Kafka's position() raises a TimeoutException once its timeout passed without the
    position; here TimeoutError, naming the partition and what is missing. Before, the
    TopicError of the first read, at once, whatever the timeout."""
    consumer = env.consumer(enable_auto_commit=False, topics=[])
    consumer.assign([TP("t", 0)])
    consumer.seek_to_beginning()
    with pytest.raises(TimeoutError, match="t-0 .*UNKNOWN_TOPIC_OR_PARTITION"):
        consumer.position(TP("t", 0), timeout=0.05)
    # The seek stays pending: once the topic exists, the position is its start.
    env.topics.create("t", 1)
    assert consumer.position(TP("t", 0), timeout=WAIT_S) == 0


def test_wakeup_ends_positions_wait_for_a_missing_topic(env: Any) -> None:
    """wakeup() from another thread ends position()'s retries (Kafka's position() polls the
    network client, which a wakeup() interrupts)."""
    consumer = env.consumer(enable_auto_commit=False, topics=[], retry_backoff_ms=60_000,
                            retry_backoff_max_ms=60_000)
    consumer.assign([TP("t", 0)])
    consumer.seek_to_end()
    failed: list[Exception] = []

    def ask() -> None:
        try:
            consumer.position(TP("t", 0), timeout=WAIT_S)
        except Exception as exc:  # noqa: BLE001 (the test looks at what it was)
            failed.append(exc)

    asking = threading.Thread(target=ask)
    asking.start()
    consumer.wakeup()
    asking.join(WAIT_S)
    assert not asking.is_alive()
    assert len(failed) == 1 and isinstance(failed[0], WakeupError)


def test_position_evaluates_every_pending_reset(env: Any) -> None:
    """Kafka's position() runs updateFetchPositions, which resets every partition awaiting a
    reset, not only the one asked about: after seek_to_end() of two partitions, position() of
    one fixes the other's at the end it has then, and records appended after that are read.
    Before, the other's edge was read only at the next poll(), past those records. A
    partition of a topic that does not exist yet stays pending and does not hold up the
    answer."""
    env.topics.create("t", 2)
    for p in (0, 1):
        env.producer.send("t", b"old", partition=p)
    consumer = env.consumer(enable_auto_commit=False, topics=[])
    consumer.assign([TP("t", 0), TP("t", 1), TP("u", 0)])
    consumer.seek_to_end()
    assert consumer.position(TP("t", 0), timeout=WAIT_S) == 1
    env.producer.send("t", b"new", partition=1)
    assert consumer.lag() == {TP("t", 0): 0, TP("t", 1): 1}  # (u-0: still no position)
    assert consumer.position(TP("t", 1), timeout=0) == 1
    with pytest.raises(TimeoutError):
        consumer.position(TP("u", 0), timeout=0)
