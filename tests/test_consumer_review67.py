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

from harness import WAIT_S, wait_until
from test_consumer import _committed, env, poll_until  # noqa: F401 - env: the fixture

from rcoord import TopicPartition
from rcoord.client import Consumer
from rcoord.client.coordinator import RedisCoordinator

TP0 = TopicPartition("t", 0)


class _Gated(RedisCoordinator):
    """Each commit waits for a permit of ``gate`` (``open()`` lets all through)."""

    def __init__(self, env: Any) -> None:  # noqa: F811 - the fixture object
        super().__init__(env.client, env.namespace)
        self.gate = threading.Semaphore(0)

    def commit_offsets(self, *args: Any, **kw: Any) -> Any:
        assert self.gate.acquire(timeout=WAIT_S)
        return super().commit_offsets(*args, **kw)

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
