"""The threads of one blocking coordinator share their blocking reads of a wake stream
(rcoord.wake): one XREAD in flight however many wait, every waiter woken by the entry it
needs, and each waiter's own time limit kept."""

from __future__ import annotations

import concurrent.futures as cf
import uuid
from typing import Any

import pytest
from harness import wait_until

from rcoord.wake import SharedWakeReads

LONG_MS = 10_000


class CountingReads:
    """The test's client with its XREADs counted (the servers are shared with other tests,
    whose leftovers would disturb a server-side count)."""

    def __init__(self, client: Any) -> None:
        self.client, self.calls = client, 0

    def xread(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        return self.client.xread(*args, **kwargs)


@pytest.fixture
def stream(redis_client: Any) -> Any:
    key = f"{{wake-{uuid.uuid4().hex[:8]}}}:w"
    yield key
    redis_client.delete(key)


def test_many_waiting_threads_share_one_read_and_all_wake(redis_client, stream):
    reads = SharedWakeReads()
    counted = CountingReads(redis_client)
    with cf.ThreadPoolExecutor(20) as pool:
        waits = [pool.submit(reads.wait, counted, stream, b"0-0", LONG_MS)
                 for _ in range(20)]
        wait_until(lambda: reads.waiting(stream) == 20)
        assert not any(w.done() for w in waits)
        redis_client.xadd(stream, {"g": 1})
        assert all(w.result(timeout=LONG_MS / 1000) for w in waits)
    # One blocking read woke them all (a second may have started before the entry came).
    assert counted.calls <= 2
    assert reads.waiting(stream) == 0


def test_each_waiter_keeps_its_own_time_limit(redis_client, stream):
    reads = SharedWakeReads()
    with cf.ThreadPoolExecutor(2) as pool:
        long_wait = pool.submit(reads.wait, redis_client, stream, b"0-0", LONG_MS)
        wait_until(lambda: reads.waiting(stream) == 1)
        # The long waiter is reading; a short one times out by itself meanwhile.
        assert reads.wait(redis_client, stream, b"0-0", 30) is False
        assert not long_wait.done()
        redis_client.xadd(stream, {"g": 1})
        assert long_wait.result(timeout=LONG_MS / 1000) is True


def test_a_waiter_behind_the_read_in_flight_sees_the_entries_between(redis_client, stream):
    reads = SharedWakeReads()
    first = redis_client.xadd(stream, {"g": 1})
    newest = redis_client.xadd(stream, {"g": 2})
    with cf.ThreadPoolExecutor(1) as pool:
        current = pool.submit(reads.wait, redis_client, stream, newest, LONG_MS)
        wait_until(lambda: reads.waiting(stream) == 1)
        # Parked before the newest entry: the read in flight (from the newest) would not
        # return it, so this waiter looks for itself and returns at once.
        assert reads.wait(redis_client, stream, first, LONG_MS) is True
        assert not current.done()
        redis_client.xadd(stream, {"g": 3})
        assert current.result(timeout=LONG_MS / 1000) is True


def test_a_failed_read_fails_its_reader_and_leaves_no_waiter(redis_client, stream):
    reads = SharedWakeReads()
    redis_client.set(stream, "not a stream")
    import redis

    with pytest.raises(redis.ResponseError):
        reads.wait(redis_client, stream, b"0-0", 1000)
    assert reads.waiting(stream) == 0


def test_blocking_coordinator_threads_park_on_one_read(make_coordinator):
    # Eight members of one group parked in their JoinGroups through one coordinator: one
    # blocking read is in flight for them, not eight, and all eight get the generation when
    # the initial delay ends.
    coord = make_coordinator(group_initial_rebalance_delay_ms=1500)
    client = coord._redis
    reads = {"calls": 0}
    xread = client.xread

    def counting_xread(*args: Any, **kwargs: Any) -> Any:
        reads["calls"] += 1
        return xread(*args, **kwargs)

    client.xread = counting_xread  # this test's own client (the fixture's, closed after)
    join = {"protocol_type": "consumer", "protocols": [("range", b"")],
            "session_timeout_ms": 30_000, "rebalance_timeout_ms": 30_000}
    ids = [coord.join_group("g", **join).member_id for _ in range(8)]
    wake_key = coord._keys("g").wake
    with cf.ThreadPoolExecutor(8) as pool:
        parked = [pool.submit(coord.join_group, "g", mid, **join) for mid in ids]
        wait_until(lambda: coord._wake_reads.waiting(wake_key) == 8)
        assert reads["calls"] <= 2  # (a second read may have started as the first returned)
        results = [f.result(timeout=30) for f in parked]
    assert {r.error.name for r in results} == {"NONE"}
    assert {r.generation_id for r in results} == {1}
    assert sorted(r.member_id for r in results) == sorted(ids)
