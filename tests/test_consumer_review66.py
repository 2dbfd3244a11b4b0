"""The consumer's own commits (auto-commit's, a revocation's, ``close()``'s) never move a
partition's committed offset back below what the application committed itself.

``close()`` counts the record the loop is on (or a batch another thread's ``poll()`` handed
out) as not processed yet, and a loop left at a record goes back to it; both are right for
the positions, but the commit that followed sent that lower position and undid the
application's own ``commit()`` of the same records. Kafka's auto-commit commits the
consumed position, never below what the application committed unless it sought back.
"""

from __future__ import annotations

import threading
from typing import Any

from test_consumer import _committed, env  # noqa: F401 - env: the fixture

from rcoord import TopicPartition
from rcoord.client import Consumer

TP0 = TopicPartition("t", 0)


def _ten_records(environment: Any, **kw: Any) -> Consumer:
    """Topic t (one partition, records 0 to 9) and a consumer of it, with auto-commit."""
    environment.topics.create("t", 1)
    environment.producer.send_batch("t", [b"%d" % i for i in range(10)])
    consumer: Consumer = environment.consumer(**kw)
    return consumer


def _committed_at_record_3(consumer: Consumer, *, close: bool) -> None:
    """Iterate to record 3, commit() there (4), then close() in the loop body or leave it."""
    for record in consumer:
        if record.offset == 3:
            consumer.commit()
            if close:
                consumer.close()
            break


def test_close_in_the_loop_body_keeps_the_offset_the_body_committed(
        env: Any) -> None:  # noqa: F811 - the fixture
    """(before: close() committed 3, the record the loop was on, over the body's 4)"""
    consumer = _ten_records(env)
    _committed_at_record_3(consumer, close=True)
    assert _committed(env, 1) == {TP0: 4}


def test_close_after_assign_in_the_loop_body_keeps_the_offset_the_body_committed(
        env: Any) -> None:  # noqa: F811 - the fixture
    """The simple-group close commit (``assign()``): (before: 3)"""
    consumer = _ten_records(env, topics=[])
    consumer.assign([TP0])
    _committed_at_record_3(consumer, close=True)
    assert _committed(env, 1) == {TP0: 4}


def test_close_from_another_thread_keeps_the_batch_the_application_committed(
        env: Any) -> None:  # noqa: F811 - the fixture
    """poll() handed out 0 to 9 and the application committed them (10); a close() from
    another thread counts that batch as not processed (its position goes back to 0), and
    committed 0."""
    consumer = _ten_records(env)
    got: list[int] = []
    while len(got) < 10:
        got += [r.offset for r in consumer.poll(timeout=1.0)]
    consumer.commit()
    closer = threading.Thread(target=consumer.close)
    closer.start()
    closer.join(30)
    assert not closer.is_alive()
    assert _committed(env, 1) == {TP0: 10}


def test_loop_left_after_a_commit_then_unsubscribe_keeps_the_committed_offset(
        env: Any) -> None:  # noqa: F811 - the fixture
    """Leaving the loop at record 3 goes back to it (it comes again); the revocation's
    auto-commit of unsubscribe() committed that 3 over the body's 4."""
    consumer = _ten_records(env)
    _committed_at_record_3(consumer, close=False)
    assert consumer.position(TP0) == 3
    consumer.unsubscribe()
    assert _committed(env, 1) == {TP0: 4}


def test_loop_left_after_a_commit_auto_commits_no_lower_offset(
        env: Any) -> None:  # noqa: F811 - the fixture
    """The next poll()'s auto-commit, due at once, committed 3 before it handed record 3
    out again; the one after that commits the new position."""
    consumer = _ten_records(env, auto_commit_interval_ms=1)
    _committed_at_record_3(consumer, close=False)
    got: list[int] = []
    while not got:
        got = [r.offset for r in consumer.poll(timeout=1.0)]
        assert _committed(env, 1) == {TP0: 4}
    assert got[0] == 3  # (at least once: the record the loop was on comes again)


def test_a_seek_back_after_a_commit_is_committed_by_close(
        env: Any) -> None:  # noqa: F811 - the fixture
    """As Kafka's auto-commit: the application's own seek back below its commit is what
    close() commits (the records from there are to be read again)."""
    consumer = _ten_records(env)
    for record in consumer:
        if record.offset == 3:
            consumer.commit()
            consumer.seek(TP0, 1)
            consumer.close()
    assert _committed(env, 1) == {TP0: 1}


def test_an_explicit_commit_may_still_move_the_offset_back(
        env: Any) -> None:  # noqa: F811 - the fixture
    """commit(offsets) commits what it names, as Kafka's commitSync(offsets)."""
    consumer = _ten_records(env)
    for record in consumer:
        if record.offset == 3:
            consumer.commit()
            consumer.commit({TP0: 2})
            break
    assert _committed(env, 1) == {TP0: 2}


def test_close_in_the_loop_body_keeps_an_async_commit_made_just_before(
        env: Any) -> None:  # noqa: F811 - the fixture
    """commit_async() at record 3 (4), then close(): the final commit, queued behind it and
    made before its callback ran, committed 3 over it."""
    consumer = _ten_records(env)
    done: list[BaseException | None] = []
    for record in consumer:
        if record.offset == 3:
            consumer.commit_async(callback=lambda offsets, exc: done.append(exc))
            consumer.close()
    assert done == [None]
    assert _committed(env, 1) == {TP0: 4}


def test_close_after_an_async_commit_of_an_older_offset_commits_the_position(
        env: Any) -> None:  # noqa: F811 - the fixture
    """As Kafka's close(), which commits the consumed positions after the commitAsync sent
    before it: close() took the position (10) for committed already, as the landed commit()
    said, and left the older offset the async commit then wrote (2)."""
    consumer = _ten_records(env)
    got: list[int] = []
    while len(got) < 10:
        got += [r.offset for r in consumer.poll(timeout=1.0)]
    consumer.commit()
    consumer.commit_async({TP0: 2})
    consumer.close()
    assert _committed(env, 1) == {TP0: 10}
