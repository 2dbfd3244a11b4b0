"""Review 67b: 9b7a396 makes close()'s final commit wait for the commits queued before it and
take their outcomes before it reckons the positions, so an application's ``commit_async()``
that fails no longer holds it back (``_settle_commit_floor``). ``unsubscribe()`` after
``assign()`` (and ``assign()`` dropping a partition) makes the same final auto-commit through
``_commit_changed``, which reckons ``_changed_positions()`` at once: the failed commit's
floor, settled only when its outcome is taken, still holds that commit back, whether the
failed commit finished or not. Records the loop handed back (``break``) then come again from
the older committed offset, where close() in the same place commits the record it was on.

The application's commit names a partition that does not exist besides the one it holds, so
it is refused whole (``TopicError``, nothing committed), as in ``test_review67_consumer``.
"""

from __future__ import annotations

from typing import Any

from harness import wait_until
from test_consumer import _committed, env  # noqa: F401 - env: the fixture
from test_consumer_review66 import _ten_records

from rcoord import TopicPartition

TP0 = TopicPartition("t", 0)
MISSING = TopicPartition("no-such-topic", 0)


def _assigned_ten_records(environment: Any) -> Any:
    """Topic t (one partition, records 0 to 9) and a consumer of it after ``assign()``, with
    auto-commit only when it gives the partition up."""
    consumer = _ten_records(environment, topics=[], auto_commit_interval_ms=3_600_000)
    consumer.assign([TP0])
    return consumer


def _left_at_3(consumer: Any, failing_commit: bool) -> list[BaseException | None]:
    """Iterate; at record 3 (maybe after a commit_async() that is refused) leave the loop:
    t-0's position goes back to 3. The callback's outcomes."""
    errors: list[BaseException | None] = []
    for record in consumer:
        if record.offset == 3:
            if failing_commit:
                consumer.commit_async({TP0: 4, MISSING: 0},
                                      callback=lambda offsets, exc: errors.append(exc))
            break
    return errors


def test_unsubscribe_after_a_loop_left_at_a_record_commits_it(
        env: Any) -> None:  # noqa: F811 - the fixture
    """Baseline: the loop left at record 3, unsubscribe() commits 3."""
    consumer = _assigned_ten_records(env)
    _left_at_3(consumer, failing_commit=False)
    consumer.unsubscribe()
    assert _committed(env, 1) == {TP0: 3}


def test_close_after_a_failed_async_commit_commits_the_record_the_loop_was_on(
        env: Any) -> None:  # noqa: F811 - the fixture
    """close() in the same place, after the refused commit_async(): 3 (9b7a396)."""
    consumer = _assigned_ten_records(env)
    errors = _left_at_3(consumer, failing_commit=True)
    consumer.close()
    assert len(errors) == 1 and errors[0] is not None
    assert _committed(env, 1) == {TP0: 3}


def test_unsubscribe_after_a_failed_async_commit_commits_the_record_the_loop_was_on(
        env: Any) -> None:  # noqa: F811 - the fixture
    """The same with unsubscribe(): the refused commit_async()'s 4 still holds its final
    auto-commit back, so t-0 is left uncommitted (want 3, as close() and the baseline)."""
    consumer = _assigned_ten_records(env)
    errors = _left_at_3(consumer, failing_commit=True)
    consumer.unsubscribe()
    consumer.close()  # (runs the callback; nothing assigned, so it commits nothing)
    assert len(errors) == 1 and errors[0] is not None
    assert _committed(env, 1) == {TP0: 3}


def test_assign_dropping_the_partition_after_a_failed_async_commit_commits_its_record(
        env: Any) -> None:  # noqa: F811 - the fixture
    """assign() that drops t-0 makes the same final auto-commit (``_auto_commit_now``), held
    back the same way (want 3)."""
    env.topics.create("u", 1)
    consumer = _assigned_ten_records(env)
    errors = _left_at_3(consumer, failing_commit=True)
    consumer.assign([TopicPartition("u", 0)])
    consumer.close()
    assert len(errors) == 1 and errors[0] is not None
    assert _committed(env, 1) == {TP0: 3}


def test_a_commit_in_a_commit_callback_runs_after_the_earlier_callbacks_and_counts_last(
        env: Any) -> None:  # noqa: F811 - the fixture
    """commit_async({t-0: 5}, a), then commit_async() of the position 10 (b); both landed,
    the next poll() runs a, which commits 2 (commit()). That commit's own callback run takes
    the completions after a's batch only, so b's runs after it (Kafka's commitSync first
    runs the completed callbacks still queued, b's among them), and b's landing, taken last,
    is noted as committed over the 2 the later commit wrote (``_note_committed``: the commit
    after it is no longer pending): close() then takes 10 for committed, and leaves 2."""
    consumer = _assigned_ten_records(env)
    got = []
    while len(got) < 10:
        got.extend(consumer.poll(timeout=0.05))
    order: list[str] = []

    def a(offsets: Any, exc: BaseException | None) -> None:
        order.append("a")
        consumer.commit({TP0: 2})
        order.append("a's commit() returned")

    consumer.commit_async({TP0: 5}, a)
    consumer.commit_async(None, lambda offsets, exc: order.append("b"))
    wait_until(lambda: consumer._committer.pending == 0)
    assert consumer.poll(timeout=0) == []  # runs a, then b
    consumer.close()
    assert (order, _committed(env, 1)) == (["a", "b", "a's commit() returned"], {TP0: 10})
