"""Commits of partitions that do not exist, against Kafka: its broker answers
UNKNOWN_TOPIC_OR_PARTITION for them (KafkaApis.handleOffsetCommitRequest, before the group
coordinator), where rcoord's coordinator stores whatever it is given; the worker ``Consumer``
checks them itself (``Consumer._check_exist``). Real servers (the ``env`` fixture)."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import test_consumer
from harness import wait_until
from test_consumer import poll_until

from rcoord import ConnectionLost, Errors, TopicPartition
from rcoord.client.coordinator import RedisCoordinator
from rcoord.topics import TopicError

TP = TopicPartition
env = test_consumer.env


class _CountsLookups(RedisCoordinator):
    """Counts the partition count reads of the commits: made on the test's own thread, or
    the consumer's committer thread, where ``commit()`` and ``commit_async()`` make their
    checks. The leader's join and partition watcher read them too, on their threads."""

    def __init__(self, env: Any) -> None:
        super().__init__(env.client, env.namespace)
        self.lookups: list[list[str]] = []
        self._thread = threading.current_thread()

    def partition_counts(self, topics: Any) -> dict[str, int]:
        if self._commits():
            self.lookups.append(list(topics))
        return super().partition_counts(topics)

    def _commits(self) -> bool:
        """Whether this thread makes commits: the test's, or a consumer's committer."""
        me = threading.current_thread()
        return me is self._thread or me.name.endswith("-committer")


class _CountsLost(_CountsLookups):
    """Its partition count reads from the commits' threads fail as a node out of reach fails
    them (the leader's reads, on other threads, go through); ``lookups`` keeps the attempts."""

    def partition_counts(self, topics: Any) -> dict[str, int]:
        if self._commits():
            self.lookups.append(list(topics))
            raise ConnectionLost("the node of the topic's metadata is out of reach (test)")
        return super().partition_counts(topics)


def _committed(env: Any, *tps: TopicPartition) -> dict[TopicPartition, int]:
    return {tp: o.offset for tp, o in env.coord.fetch_offsets("g", list(tps)).offsets.items()}


def test_commit_of_a_missing_topic_or_partition_raises_and_stores_nothing(env: Any) -> None:
    """commit(offsets) naming a topic that does not exist, or a partition number past the
    count, raises TopicError(UNKNOWN_TOPIC_OR_PARTITION) naming it, and nothing of that call
    is stored (the existing partition's offset neither). Before, every offset was stored."""
    env.topics.create("t", 1)
    consumer = env.consumer(enable_auto_commit=False, topics=[])
    consumer.assign([TP("t", 0)])
    with pytest.raises(TopicError, match="nope-0.*topic 'nope' does not exist") as raised:
        consumer.commit({TP("t", 0): 1, TP("nope", 0): 5})
    assert raised.value.error is Errors.UNKNOWN_TOPIC_OR_PARTITION
    with pytest.raises(TopicError, match="t-1.*topic 't' has 1 partitions"):
        consumer.commit({TP("t", 0): 1, TP("t", 1): 5})
    assert _committed(env, TP("t", 0), TP("t", 1), TP("nope", 0)) == {
        TP("t", 0): -1, TP("t", 1): -1, TP("nope", 0): -1}
    consumer.commit({TP("t", 0): 1})
    assert _committed(env, TP("t", 0)) == {TP("t", 0): 1}


def test_commit_async_of_a_missing_partition_reports_it_to_the_callback(env: Any) -> None:
    """commit_async: the callback gets the TopicError (as Kafka's commitAsync reports a
    broker's refusal there), nothing of it is stored, and the next commit goes on."""
    env.topics.create("t", 1)
    consumer = env.consumer(enable_auto_commit=False, topics=[])
    consumer.assign([TP("t", 0)])
    results: list[Any] = []
    consumer.commit_async({TP("t", 0): 1, TP("nope", 0): 5}, lambda o, e: results.append(e))
    consumer.commit_async({TP("t", 0): 2}, lambda o, e: results.append(e))
    consumer.commit({})  # waits for both, runs their callbacks
    assert isinstance(results[0], TopicError)
    assert results[0].error is Errors.UNKNOWN_TOPIC_OR_PARTITION and results[1] is None
    assert _committed(env, TP("t", 0), TP("nope", 0)) == {TP("t", 0): 2, TP("nope", 0): -1}


def test_the_check_costs_no_round_trip_per_commit(env: Any) -> None:
    """A subscribed consumer's commits of its assigned partitions read nothing more; others
    (and every partition of an assign()ed consumer) are looked up once per topic."""
    env.topics.create("t", 2)
    env.topics.create("u", 1)
    for p in (0, 1):
        env.producer.send("t", b"x", partition=p)
    coord = _CountsLookups(env)
    consumer = env.consumer(enable_auto_commit=False, coordinator=coord)
    poll_until(consumer, lambda g: len(g) >= 2)
    for i in range(3):
        consumer.commit({TP("t", 0): i, TP("t", 1): i})
    assert coord.lookups == []
    for i in range(3):
        consumer.commit({TP("u", 0): i})
    assert coord.lookups == [["u"]]


def test_a_topic_deleted_after_its_count_was_read_is_noticed(env: Any) -> None:
    """The count read for the check is trusted for a partition watch interval only: a topic
    deleted, or created again with fewer partitions, after it was read is refused once the
    interval passed, as Kafka's broker refuses it. Before, the count was kept for good, and
    such commits were stored for as long as the consumer ran."""
    env.topics.create("t", 4)
    env.topics.create("u", 1)
    consumer = env.consumer(enable_auto_commit=False, topics=[], partition_watch_interval_ms=1)
    consumer.assign([TP("t", 0)])
    consumer.commit({TP("t", 3): 1, TP("u", 0): 1})
    env.topics.delete("t")
    env.topics.create("t", 1)
    env.topics.delete("u")

    def refused(offsets: dict[TopicPartition, int]) -> bool:
        try:
            consumer.commit(offsets)
        except TopicError as exc:
            assert exc.error is Errors.UNKNOWN_TOPIC_OR_PARTITION
            return True
        return False

    wait_until(lambda: refused({TP("t", 3): 2}))
    wait_until(lambda: refused({TP("u", 0): 2}))


def _consuming_t_and_u(env: Any, **kw: Any) -> Any:
    """An assign()ed consumer of t-0 and u-0 that has read one record of each (position 1)."""
    env.topics.create("t", 1)
    env.topics.create("u", 1)
    env.producer.send("t", b"x", partition=0)
    env.producer.send("u", b"x", partition=0)
    consumer = env.consumer(topics=[], **kw)
    consumer.assign([TP("t", 0), TP("u", 0)])
    poll_until(consumer, lambda got: len(got) >= 2)
    return consumer


def test_own_commits_skip_a_deleted_topic_and_commit_the_others(
        env: Any, caplog: pytest.LogCaptureFixture) -> None:
    """commit() and commit_async() without offsets commit the positions of the partitions
    that exist and skip (one warning naming them) those of a topic deleted since, as Kafka's
    broker stores the others and answers UNKNOWN_TOPIC_OR_PARTITION for those. Before, the
    deleted topic's position was stored too."""
    consumer = _consuming_t_and_u(env, enable_auto_commit=False, partition_watch_interval_ms=1)
    env.topics.delete("u")
    with caplog.at_level("WARNING", logger="rcoord.client"):
        consumer.commit()
    assert _committed(env, TP("t", 0), TP("u", 0)) == {TP("t", 0): 1, TP("u", 0): -1}
    assert [r.getMessage() for r in caplog.records if "skipped u-0" in r.getMessage()]
    consumer.seek(TP("t", 0), 0)
    consumer.seek(TP("u", 0), 0)
    results: list[Any] = []
    consumer.commit_async(callback=lambda o, e: results.append(e))
    consumer.commit({})  # waits for it
    assert results == [None]
    assert _committed(env, TP("t", 0), TP("u", 0)) == {TP("t", 0): 0, TP("u", 0): -1}


def test_close_and_auto_commit_skip_a_deleted_topic(env: Any) -> None:
    """close()'s final commit (auto-commit's) stores the existing partitions' positions and
    not the deleted topic's. Before, it stored both."""
    consumer = _consuming_t_and_u(env, auto_commit_interval_ms=100_000,
                                  partition_watch_interval_ms=1)
    env.topics.delete("u")
    consumer.close(timeout=10)
    assert _committed(env, TP("t", 0), TP("u", 0)) == {TP("t", 0): 1, TP("u", 0): -1}


def test_own_commits_read_the_counts_once_per_watch_interval(env: Any) -> None:
    """The check of the consumer's own commits reads the counts of its topics once (one
    round trip for all of them), then trusts them for ``partition_watch_interval_ms``."""
    env.topics.create("t", 1)
    env.topics.create("u", 1)
    coord = _CountsLookups(env)
    consumer = env.consumer(enable_auto_commit=False, topics=[], coordinator=coord,
                            partition_watch_interval_ms=600_000)
    consumer.assign([TP("t", 0), TP("u", 0)])
    consumer.seek(TP("u", 0), 0)  # (a partition never positioned is not committed)
    for p in (3, 4, 5):
        consumer.seek(TP("t", 0), p)
        consumer.commit()
    assert coord.lookups == [["t", "u"]]
    assert _committed(env, TP("t", 0), TP("u", 0)) == {TP("t", 0): 5, TP("u", 0): 0}


def test_own_commits_of_partitions_being_read_cost_no_read(env: Any) -> None:
    """A consumer that is reading its partitions commits their positions without reading
    the counts: its fetches found them within the partition watch interval. A paused one
    is not vouched for by its fetches (it is not fetched): its count is read."""
    coord = _CountsLookups(env)
    consumer = _consuming_t_and_u(env, enable_auto_commit=False, coordinator=coord,
                                  partition_watch_interval_ms=600_000)
    consumer.commit()
    assert coord.lookups == []
    assert _committed(env, TP("t", 0), TP("u", 0)) == {TP("t", 0): 1, TP("u", 0): 1}
    consumer.pause([TP("u", 0)])
    consumer.seek(TP("u", 0), 0)
    consumer.commit()
    assert coord.lookups == [["u"]]


def test_a_subscribed_consumers_final_commit_skips_a_deleted_topic(env: Any) -> None:
    """A subscribed consumer's revocation commit (at close(), or at the rebalance the
    topic's deletion starts) stores the existing partitions' positions, not the deleted
    topic's. Before, it stored both."""
    env.topics.create("t", 1)
    env.topics.create("u", 1)
    env.producer.send("t", b"x", partition=0)
    env.producer.send("u", b"x", partition=0)
    consumer = env.consumer(topics=["t", "u"], auto_commit_interval_ms=100_000,
                            partition_watch_interval_ms=1)
    poll_until(consumer, lambda got: len(got) >= 2)
    env.topics.delete("u")
    consumer.close(timeout=10)
    assert _committed(env, TP("t", 0), TP("u", 0)) == {TP("t", 0): 1, TP("u", 0): -1}


def test_own_commits_whose_check_cannot_read_the_counts_commit_everything(
        env: Any, caplog: pytest.LogCaptureFixture) -> None:
    """The check of the consumer's own commits is not worth their progress: when the counts
    cannot be read (their node out of reach: a cluster node down, the group's node up), the
    check makes one attempt, then the positions are committed as before the check existed,
    with a warning, rather than the commit failing. Before, it retried for a whole session
    timeout (30 s by default) first, so each own commit needing the check (commit(), a
    revocation's on the poll thread) stalled that long, and with Redis down commit() took
    twice as long to fail."""
    env.topics.create("t", 1)
    coord = _CountsLost(env)
    consumer = env.consumer(enable_auto_commit=False, topics=[], coordinator=coord,
                            partition_watch_interval_ms=600_000, session_timeout_ms=2000,
                            retry_backoff_ms=1, retry_backoff_max_ms=2)
    consumer.assign([TP("t", 0)])
    consumer.seek(TP("t", 0), 3)
    with caplog.at_level("WARNING", logger="rcoord.client"):
        consumer.commit()
    assert len(coord.lookups) == 1
    assert _committed(env, TP("t", 0)) == {TP("t", 0): 3}
    assert [r for r in caplog.records if "could not check that t-0" in r.getMessage()]
