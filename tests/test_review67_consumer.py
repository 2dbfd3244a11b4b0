"""Review 67: the consumer's ``_commit_floor`` is noted as the application's commit is queued
(178ed4e), and stays when that commit fails: nothing of it was committed, yet close() (and
auto-commit, a revocation's commit) then skip every position below it.

Here the application's commit names a partition that does not exist besides the one it holds,
so the whole commit is refused (``TopicError``, nothing committed, as the docstrings say), and
its offset of the held partition is never written. close() in the loop body at record 3 then
commits nothing for that partition, where it commits 3 (records 0 to 2 processed) without the
failed commit: those records are delivered again after a restart. A commit that failed is not
"what the application committed"."""

from __future__ import annotations

from typing import Any

from test_consumer import _committed, env  # noqa: F401 - env: the fixture
from test_consumer_review66 import _ten_records

from rcoord import TopicPartition
from rcoord.topics import TopicError

TP0 = TopicPartition("t", 0)
MISSING = TopicPartition("no-such-topic", 0)


def test_close_in_the_loop_body_commits_the_record_it_is_on(
        env: Any) -> None:  # noqa: F811 - the fixture
    """Baseline of the same loop without the failed commit: close() at record 3 commits 3."""
    consumer = _ten_records(env)
    for record in consumer:
        if record.offset == 3:
            consumer.close()
    assert _committed(env, 1) == {TP0: 3}


def test_a_refused_commit_does_not_keep_close_from_committing(
        env: Any) -> None:  # noqa: F811 - the fixture
    """commit() of {t-0: 4, a missing partition} is refused whole; close() in the loop body
    at record 3 must still commit 3, as it does without that commit (before: nothing)."""
    consumer = _ten_records(env)
    refused: list[BaseException] = []
    for record in consumer:
        if record.offset == 3:
            try:
                consumer.commit({TP0: 4, MISSING: 0})
            except TopicError as exc:
                refused.append(exc)
            consumer.close()
    assert len(refused) == 1
    assert _committed(env, 1) == {TP0: 3}


def test_a_refused_async_commit_does_not_keep_close_from_committing(
        env: Any) -> None:  # noqa: F811 - the fixture
    """The same with commit_async(): its callback gets the error, nothing of it is
    committed, and close() left t-0 uncommitted (before: nothing; want 3)."""
    consumer = _ten_records(env)
    errors: list[BaseException | None] = []
    for record in consumer:
        if record.offset == 3:
            consumer.commit_async({TP0: 4, MISSING: 0},
                                  callback=lambda offsets, exc: errors.append(exc))
            consumer.close()
    assert len(errors) == 1 and isinstance(errors[0], TopicError), errors
    assert _committed(env, 1) == {TP0: 3}
