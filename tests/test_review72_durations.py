"""Review 72: durations past Kafka's INT (be93569 bounded ConsumerGroupConfig's and the Spark
source's; Long.MAX is a Java user's "no limit"). The Consumer's own durations were left
unbounded: ``default_api_timeout_ms`` (Kafka's ``default.api.timeout.ms``, an INT) becomes the
budget of ``commit()`` and the offset queries, whose deadline threading cannot wait for; and
ConsumerGroupConfig's ``join_backoff_ms``, the group thread's wait after a failed join."""

from __future__ import annotations

from typing import Any

import pytest
from harness import wait_until
from test_consumer import env  # noqa: F401 - env: the fixture

from rcoord import TopicPartition
from rcoord.client.coordinator import RedisCoordinator
from rcoord.errors import ConfigError

LONG_MAX = 2**63 - 1
TP = TopicPartition("t", 0)


def test_default_api_timeout_ms_past_kafkas_int_is_refused_or_works(
        env: Any) -> None:  # noqa: F811 - the fixture
    """Taken, the first commit() failed with 'OverflowError: timestamp out of range for
    platform time_t' (the committer's wait for its deadline), naming no setting: refused at
    construction naming the option (as ConfigError) it would be a clear error instead."""
    refused_or_commits(env, "default_api_timeout_ms", LONG_MAX)


def refused_or_commits(env: Any, name: str, value: int) -> None:  # noqa: F811 - not the fixture
    """A consumer made with setting ``name`` at ``value`` is refused (a ConfigError naming
    it), or commits and reads back what it committed."""
    env.topics.create("t", 1)
    try:
        consumer = env.consumer(topics=[], **{name: value})
    except ConfigError as exc:
        assert name in str(exc)
        return
    try:
        consumer.assign([TP])
        consumer.commit({TP: 0})
        assert consumer.committed([TP]) == {TP: 0}
    finally:
        consumer.close(timeout=0)


class _JoinFailsOnce(RedisCoordinator):
    """The first JoinGroup fails with an error the policy backs off from (``OTHERWISE``:
    ``join_backoff_ms``)."""

    failed = False

    def join_group(self, *args: Any, **kw: Any) -> Any:
        if not self.failed:
            self.failed = True
            raise RuntimeError("the test's")
        return super().join_group(*args, **kw)


def test_join_backoff_ms_past_kafkas_int_is_refused(env: Any) -> None:  # noqa: F811 - the fixture
    """be93569 left join_backoff_ms unbounded. Taken, the group's thread waits it after a
    failed join (``_closing.wait``), which threading cannot take: the group stopped with
    'unexpected error: OverflowError('timestamp out of range for platform time_t')' and every
    later poll() raised that GroupClosedError, naming no setting. Refused at construction
    (ConfigError naming it, as its sibling durations since be93569), it is a clear error."""
    env.topics.create("t", 1)
    coord = _JoinFailsOnce(env.client, env.namespace)
    try:
        consumer = env.consumer(coordinator=coord, join_backoff_ms=LONG_MAX)
    except ConfigError as exc:
        assert "join_backoff_ms" in str(exc)
        return
    raised: list[BaseException] = []

    def poll() -> None:
        try:
            consumer.poll(timeout=0.05)
        except Exception as exc:  # noqa: BLE001 - the failed join's, reported by poll()
            raised.append(exc)

    try:
        wait_until(lambda: bool(raised), step=poll)  # (the failed join: the backoff begins)
        wait_until(lambda: consumer._group._fatal is not None, step=poll)
        fatal = consumer._group._fatal
    finally:
        consumer.close(timeout=0)
    pytest.fail(f"join_backoff_ms={LONG_MAX} was taken, and after a failed join the group "
                f"stopped: {fatal!r}")
