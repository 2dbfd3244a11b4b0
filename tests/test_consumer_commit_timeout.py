"""``Consumer.commit()`` while Redis does not answer: Kafka's ``commitSync(timeout)``.

Redis held (a client whose redis-py retries hold every call until the test releases them, as
the default client's retries, or a socket timeout, hold a call to an unreachable Redis for
seconds): ``commit()`` raises ``TimeoutError`` by its timeout (by default
``default_api_timeout_ms``), the commit stays in flight on the committer thread, and a later
commit is sent after it, so the committed offset never goes back."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from harness import WAIT_S, this_threads, wait_until
from redis.backoff import NoBackoff
from redis.retry import Retry

from rcoord.client import Consumer, ConsumerGroupConfig, WakeupError
from rcoord.protocol.offsets import TopicPartition
from rcoord.testing.embedded import EmbeddedServer
from rcoord.topics import Topics

TP = TopicPartition("t", 0)


class _Gate:
    """Holds every Redis call of the client while ``held`` is set, until ``released`` is."""

    def __init__(self) -> None:
        self.held = threading.Event()
        self.released = threading.Event()
        self.waiting = 0  # calls held now

    def client(self, port: int) -> redis.Redis:
        gate = self

        class HeldRetry(Retry):
            def call_with_retry(self, do: Any, fail: Any, *args: Any, **kwargs: Any) -> Any:
                if gate.held.is_set():
                    gate.waiting += 1
                    gate.released.wait(WAIT_S)
                    gate.waiting -= 1
                return super().call_with_retry(do, fail, *args, **kwargs)

        return redis.Redis(host="127.0.0.1", port=port, retry=HeldRetry(NoBackoff(), 0))


@pytest.fixture
def held(redis_server: EmbeddedServer, namespace: str) -> Iterator[tuple[_Gate, Consumer]]:
    """A consumer assigned ``t-0`` (a simple group: no heartbeat) on a client the gate holds,
    with a 0.3 s ``default_api_timeout_ms``."""
    gate = _Gate()
    r = gate.client(redis_server.port)
    Topics(r, namespace).create("t", 1)
    consumer = Consumer(
        ConsumerGroupConfig(group_id="g", topics=[], redis_client=r, namespace=namespace,
                            retry_backoff_ms=10, retry_backoff_max_ms=50),
        enable_auto_commit=False, default_api_timeout_ms=300)
    consumer.assign([TP])
    try:
        yield gate, consumer
    finally:
        gate.released.set()
        consumer.close(timeout=WAIT_S)
        r.close()


def _answer(call: Callable[[], object]) -> list[object]:
    """``call`` run on a thread of its own; the list gets its result or its exception."""
    out: list[object] = []

    def run() -> None:
        try:
            out.append(call())
        except Exception as exc:  # noqa: BLE001 - the answer is what is tested
            out.append(exc)

    threading.Thread(target=run, daemon=True).start()
    return out


@pytest.mark.parametrize("how", ["default", "timeout", "wakeup"])
def test_a_commit_redis_holds_ends_by_its_timeout_and_later_commits_stay_after_it(
        held: tuple[_Gate, Consumer], how: str) -> None:
    """``commit()`` ran on the caller's thread with no bound of its own: each attempt held
    redis-py's whole retry cycle (or a socket timeout), so against a server that did not
    answer it took 30 s for a 3 s session timeout. Now it
    waits by its timeout (``default_api_timeout_ms`` unless given), or until ``wakeup()``,
    and the commit it gave up on, still in flight, lands before the next one."""
    gate, consumer = held
    consumer.commit({TP: 1})  # (the coordinator started, the counts of t read)
    gate.held.set()
    if how == "default":
        first = _answer(lambda: consumer.commit({TP: 5}))
    elif how == "timeout":
        first = _answer(lambda: consumer.commit({TP: 5}, timeout=0.1))
    else:
        first = _answer(lambda: consumer.commit({TP: 5}, timeout=60))
        wait_until(lambda: gate.waiting > 0)
        consumer.wakeup()
    wait_until(lambda: bool(first), timeout_s=5)
    expected = WakeupError if how == "wakeup" else TimeoutError
    assert isinstance(first[0], expected), first
    assert "may land later" in str(first[0])
    second = _answer(lambda: consumer.commit({TP: 7}, timeout=WAIT_S))
    gate.released.set()
    wait_until(lambda: bool(second))
    assert second == [None]
    assert consumer.committed([TP]) == {TP: 7}  # the first landed before, not after



@pytest.mark.parametrize("earlier", ["commit", "commit_async"])
def test_a_commit_behind_one_still_in_flight_says_which_kind_it_waited_for(
        held: tuple[_Gate, Consumer], earlier: str) -> None:
    """A ``commit()`` that times out waiting for an earlier commit still in flight said
    "1 earlier async commits are still in flight" also when that was a ``commit()`` given
    up on (its timeout): the application made no async commit. Now it says which."""
    gate, consumer = held
    consumer.commit({TP: 1})  # (the coordinator started, the counts of t read)
    gate.held.set()
    if earlier == "commit":
        with pytest.raises(TimeoutError):
            consumer.commit({TP: 5}, timeout=0.05)
    else:
        consumer.commit_async({TP: 5})
        wait_until(lambda: gate.waiting > 0)
    with pytest.raises(TimeoutError) as raised:
        consumer.commit({TP: 7}, timeout=0.05)
    said = str(raised.value)
    assert "nothing of this commit was sent" in said
    if earlier == "commit":
        assert "async" not in said
        assert "1 earlier commit is still in flight: a commit() that timed out" in said, said
    else:
        assert "1 earlier async commit is still in flight" in said, said


def _failing_client(port: int, failing: threading.Event) -> redis.Redis:
    """A client whose calls from a committer thread fail as an unreachable Redis fails them
    while ``failing`` is set (the caller's calls go through)."""

    class FailingRetry(Retry):
        def call_with_retry(self, do: Any, fail: Any, *args: Any, **kwargs: Any) -> Any:
            if failing.is_set() and threading.current_thread().name.endswith("-committer"):
                raise redis.ConnectionError("unreachable (test)")
            return super().call_with_retry(do, fail, *args, **kwargs)

    return redis.Redis(host="127.0.0.1", port=port, retry=FailingRetry(NoBackoff(), 0))


def test_unsubscribe_after_assign_commits_after_an_async_commit_still_retrying(
        redis_server: EmbeddedServer, namespace: str) -> None:
    """``unsubscribe()`` after ``assign()`` auto-commits the positions (a simple-group commit,
    which no generation fences). It waited for the async commits queued before for two
    session timeouts, then committed on the caller's thread: an older async commit whose
    retry came later (here after a back-off of 2 s or more) landed after it and moved the committed
    offset back, from 5 to 2. Now the commit is queued behind it on the committer thread."""
    failing = threading.Event()
    r = _failing_client(redis_server.port, failing)
    Topics(r, namespace).create("t", 1)
    consumer = Consumer(
        ConsumerGroupConfig(group_id="g", topics=[], redis_client=r, namespace=namespace,
                            session_timeout_ms=300, heartbeat_interval_ms=50,
                            retry_backoff_ms=2000, retry_backoff_max_ms=2000))
    try:
        consumer.assign([TP])
        consumer.commit({TP: 1})  # (the coordinator started, the counts of t read)
        failing.set()
        consumer.commit_async({TP: 2})  # fails once, then waits 2 s or more to retry
        consumer.seek(TP, 5)
        left = _answer(consumer.unsubscribe)
        # Before: unsubscribe() returned, having committed 5. Now: its commit is queued.
        wait_until(lambda: bool(left) or consumer._committer.pending >= 2)
        failing.clear()
        wait_until(lambda: bool(left))
        assert left == [None]
        wait_until(lambda: consumer._committer.pending == 0)
        assert consumer.committed([TP]) == {TP: 5}
    finally:
        failing.clear()
        consumer.close(timeout=WAIT_S)
        r.close()


def test_a_commit_given_up_on_that_fails_later_is_logged_saying_so(
        caplog: pytest.LogCaptureFixture) -> None:
    """The failure of a commit whose ``commit()`` raised first (``TimeoutError``,
    ``WakeupError``) is logged when it comes, naming the partitions and why commit() had
    raised (it read "commit() given up on of t-0 failed: ...")."""
    from rcoord import ConnectionLost
    from rcoord.client.consumer import _SyncCommit

    outcome = _SyncCommit()
    outcome.abandoned = True
    with caplog.at_level("WARNING", logger="rcoord.client"):
        outcome.done({TP: 5}, ConnectionLost("unreachable"))
        outcome.done({TP: 6}, None)
    assert [r.getMessage() for r in this_threads(caplog.records)] == [
        ("commit() of t-0, which raised before it was done (its timeout, wakeup() or an "
         "interrupt), failed: unreachable")]
    assert outcome.error is None


def _interrupt_waits_for_a_commit(consumer: Consumer, monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``KeyboardInterrupt`` (Ctrl-C) ends every wait for one commit on the committer
    (``wait_idle(upto=...)``); the waits for the queue as a whole go on as they are."""
    committer = consumer._committer
    wait_idle = committer.wait_idle

    def interrupted(timeout: float | None = None, *interrupts: threading.Event,
                    upto: int | None = None) -> bool:
        if upto is not None:
            raise KeyboardInterrupt
        return wait_idle(timeout, *interrupts, upto=upto)

    monkeypatch.setattr(committer, "wait_idle", interrupted)


def test_a_commit_whose_wait_a_keyboard_interrupt_ended_logs_its_later_failure(
        held: tuple[_Gate, Consumer], caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``KeyboardInterrupt`` (Ctrl-C) that ends ``commit()``'s wait for its commit leaves
    the commit in flight, as its timeout does: its failure, when it comes, is logged. Before,
    the commit was not marked given up on, so the failure went to the outcome nobody reads
    any more, and nothing was logged (here: a commit of a partition that does not exist)."""
    _, consumer = held
    _interrupt_waits_for_a_commit(consumer, monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        consumer.commit({TopicPartition("nope", 0): 1}, timeout=WAIT_S)
    monkeypatch.undo()
    wait_until(lambda: consumer._committer.pending == 0)
    with caplog.at_level("WARNING", logger="rcoord.client"):
        consumer.commit({TP: 1}, timeout=WAIT_S)  # (runs the completions: the first's too)
    assert any("nope-0" in r.getMessage() and "failed" in r.getMessage()
               for r in caplog.records), [r.getMessage() for r in caplog.records]


@pytest.mark.parametrize("offsets", [{}, None])
def test_a_commit_of_nothing_returns_at_once_whatever_its_timeout(
        held: tuple[_Gate, Consumer], offsets: dict[TopicPartition, int] | None) -> None:
    """``commit({})``, or ``commit()`` with no position to commit (``t-0`` waits for its
    ``seek_to_end()``), sends nothing and returns
    once the async commits queued before have finished (Kafka's ``commitOffsetsSync`` returns
    for empty offsets). Before, it queued an empty job on the committer thread and waited
    for it, so with ``timeout=0`` it raised ``TimeoutError`` ("still in flight and may land
    later") for a commit of nothing."""
    _, consumer = held
    consumer.seek_to_end([TP])
    before = consumer._committer.last_ticket
    consumer.commit(offsets, timeout=0)
    assert consumer._committer.last_ticket == before  # nothing queued


def test_a_commit_from_an_async_commit_callback_that_close_runs_is_made(
        held: tuple[_Gate, Consumer], redis_server: EmbeddedServer, namespace: str) -> None:
    """close() runs the callbacks of the async commits that finished; one may commit again
    (a failed ``commit_async`` retried by ``commit()``), as the consumer is not closed yet.
    Since ``commit()`` went through the committer thread, close() had closed that before it
    ran the callbacks, so the callback's ``commit()`` raised
    ``RuntimeError('the committer is closed')`` (logged by close()) and the offset was not
    committed (3 stayed, not 9)."""
    _, consumer = held
    raised: list[BaseException] = []

    def callback(offsets: dict[TopicPartition, int], error: BaseException | None) -> None:
        try:
            consumer.commit({TP: 9}, timeout=WAIT_S)
        except Exception as exc:  # noqa: BLE001 - the answer is what is tested
            raised.append(exc)

    consumer.commit_async({TP: 3}, callback)
    consumer.close(timeout=WAIT_S)
    assert raised == []
    r = redis.Redis(host="127.0.0.1", port=redis_server.port)
    reader = Consumer(ConsumerGroupConfig(group_id="g", topics=[], redis_client=r,
                                          namespace=namespace), enable_auto_commit=False)
    try:
        assert reader.committed([TP]) == {TP: 9}
    finally:
        reader.close()
        r.close()


def test_an_unsubscribe_commit_whose_wait_a_keyboard_interrupt_ended_logs_its_failure(
        redis_server: EmbeddedServer, namespace: str, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``unsubscribe()`` after ``assign()`` auto-commits on the committer thread and waits for
    it; a ``KeyboardInterrupt`` that ends the wait leaves the commit in flight, and its
    failure, when it comes, is logged. Before, its callback ignored the outcome (the wait
    was to raise it), so nothing was logged."""
    from rcoord import ConnectionLost

    r = redis.Redis(host="127.0.0.1", port=redis_server.port)
    Topics(r, namespace).create("t", 1)
    consumer = Consumer(ConsumerGroupConfig(group_id="g", topics=[], redis_client=r,
                                            namespace=namespace))
    try:
        consumer.assign([TP])
        consumer.seek(TP, 5)

        def refused(offsets: object) -> None:
            raise ConnectionLost("unreachable (test)")

        monkeypatch.setattr(consumer, "_commit_simple", refused)
        _interrupt_waits_for_a_commit(consumer, monkeypatch)
        with pytest.raises(KeyboardInterrupt):
            consumer.unsubscribe()
        monkeypatch.undo()
        wait_until(lambda: consumer._committer.pending == 0)
        with caplog.at_level("WARNING", logger="rcoord.client"):
            consumer.commit({TP: 1}, timeout=WAIT_S)  # (runs the completions)
        assert any("t-0" in r.getMessage() and "unreachable (test)" in r.getMessage()
                   for r in caplog.records), [r.getMessage() for r in caplog.records]
    finally:
        monkeypatch.undo()
        consumer.close(timeout=WAIT_S)
        r.close()
