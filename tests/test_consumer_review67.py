"""The consumer's implicit commits (auto-commit's, a revocation's, ``close()``'s) and the
application's commits still in flight.

Commits land in the order they were queued, so a commit's landing says what is committed
only while no commit of the same partition queued after it is still pending: that one
overwrites it. And an application's commit that failed commits nothing, so it holds none of
the consumer's own commits back (Kafka pins nothing on a failed ``commitAsync``).
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from harness import WAIT_S, wait_until
from test_consumer import _committed, env, poll_until  # noqa: F401 - env: the fixture
from test_consumer_review66 import _ten_records

from rcoord import TopicPartition
from rcoord.client import Consumer
from rcoord.client.coordinator import RedisCoordinator
from rcoord.errors import RcoordError

TP0 = TopicPartition("t", 0)


class _Refused(RcoordError):
    """A commit's failure for good (no retry: not one of the policy's retriable errors)."""


class _Gated(RedisCoordinator):
    """Each commit waits for a permit of ``gate`` (``open()`` lets all through); a commit
    of an offset in ``refused`` fails (``_Refused``), nothing of it committed."""

    def __init__(self, env: Any) -> None:  # noqa: F811 - the fixture object
        super().__init__(env.client, env.namespace)
        self.gate = threading.Semaphore(0)
        self.refused: set[int] = set()

    def commit_offsets(self, group_id: str, offsets: Any, *args: Any, **kw: Any) -> Any:
        assert self.gate.acquire(timeout=WAIT_S)
        if any(getattr(o, "offset", o) in self.refused for o in offsets.values()):
            raise _Refused("refused")
        return super().commit_offsets(group_id, offsets, *args, **kw)

    def open(self) -> None:
        self.gate.release(1000)


def _assigned_at_10(environment: Any, coord: _Gated, **kw: Any) -> Consumer:
    """Topic t (one partition, records 0 to 9) and a consumer of it after ``assign()``
    (commits through ``coord``), which has polled all ten: its position is 10."""
    environment.topics.create("t", 1)
    environment.producer.send_batch("t", [b"%d" % i for i in range(10)])
    consumer: Consumer = environment.consumer(topics=[], coordinator=coord, **kw)
    consumer.assign([TP0])
    coord.open()  # (auto-commits on the way land)
    poll_until(consumer, lambda got: bool(got) and got[-1].offset == 9)
    wait_until(lambda: consumer._committer.pending == 0)
    coord.gate = threading.Semaphore(0)  # (the commits are held from now on)
    return consumer


def test_close_commits_the_position_after_an_older_async_commit_queued_behind_an_auto_commit(
        env: Any) -> None:  # noqa: F811 - the fixture
    """An auto-commit of 10 queued, then commit_async({t-0: 2}); the auto-commit landed and
    its callback ran (poll()) while the async commit was still held: that landing noted 10 as
    committed, so close() committed nothing of t-0, and the async commit then left 2."""
    coord = _Gated(env)
    consumer = _assigned_at_10(env, coord, auto_commit_interval_ms=1)
    wait_until(lambda: consumer._committer.pending == 1,
               step=lambda: consumer.poll(timeout=0))  # the auto-commit of 10, held
    consumer.commit_async({TP0: 2})
    coord.gate.release()  # the auto-commit lands; the async commit is held
    wait_until(lambda: consumer._committer.pending == 1)
    assert consumer.poll(timeout=0) == []  # runs the auto-commit's callback
    coord.open()
    consumer.close(timeout=WAIT_S)
    assert _committed(env, 1) == {TP0: 10}


def _ten_records_assigned(environment: Any, coord: _Gated) -> Consumer:
    """Topic t (one partition, records 0 to 9) and a consumer of it after ``assign()``, with
    auto-commit at close() only, its commits through ``coord`` (let through)."""
    consumer = _ten_records(environment, topics=[], coordinator=coord,
                            auto_commit_interval_ms=3_600_000)
    consumer.assign([TP0])
    coord.open()
    return consumer


def test_close_in_the_loop_body_commits_its_record_after_a_commit_that_failed(
        env: Any) -> None:  # noqa: F811 - the fixture
    """commit() of 1 lands; at record 3, commit() (4) fails for good, then close(): the failed
    commit's 4 still held close()'s commit of 3 back, and 1 stayed committed (records 1 and 2
    again on restart), where Kafka's close() commits the position whatever a failed commit
    said."""
    coord = _Gated(env)
    consumer = _ten_records_assigned(env, coord)
    coord.refused.add(4)
    for record in consumer:
        if record.offset == 1:
            consumer.commit({TP0: 1})
        if record.offset == 3:
            with pytest.raises(_Refused):
                consumer.commit()
            consumer.close()
    assert _committed(env, 1) == {TP0: 3}


def test_close_in_the_loop_body_keeps_the_landed_commit_under_one_that_failed(
        env: Any) -> None:  # noqa: F811 - the fixture
    """At record 3, commit() (4) lands, then commit_async({t-0: 6}) fails, then close(): the
    landed 4 still holds close()'s commit of 3 back (as in test_consumer_review66)."""
    coord = _Gated(env)
    consumer = _ten_records_assigned(env, coord)
    coord.refused.add(6)
    failed: list[BaseException | None] = []
    for record in consumer:
        if record.offset == 3:
            consumer.commit()
            consumer.commit_async({TP0: 6}, lambda offsets, exc: failed.append(exc))
            wait_until(lambda: consumer._committer.pending == 0)
            consumer.commit()  # (runs the failed commit's callback; commits 4 again)
            consumer.close()
    assert len(failed) == 1 and isinstance(failed[0], _Refused)
    assert _committed(env, 1) == {TP0: 4}
