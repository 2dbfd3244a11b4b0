"""A Consumer against a server that stops answering: ``poll(timeout)`` and ``close(timeout)``
return by their timeouts, as Kafka's do, and nothing is lost or read twice once it answers.

The client here has no socket timeout, so a call to the SIGSTOPped server returns only after
SIGCONT: a ``poll()`` or ``close()`` that returns while the server is stopped cannot have
waited for it. Before, ``poll(0.5)`` waited for the fetch (the socket timeout, 10 s) and then
for the auto-commit's retries (a session timeout: 53 s in all, measured), and ``close(1.0)``
for its final commit (10 s).
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from harness import wait_until, without_join_delay
from test_consumer import Recorder, _outage_client, _outage_consumer, poll_until

from rcoord.client import Consumer, ConsumerGroupConfig, WakeupError
from rcoord.client.committer import AsyncCommitter
from rcoord.client.inflight import InFlight
from rcoord.errors import ConnectionLost
from rcoord.protocol.offsets import TopicPartition as TP
from rcoord.testing.embedded import EmbeddedServer
from rcoord.topics import Producer, Topics

BOUND_S = 15.0
"""How long a call may take before the test calls it stuck (the server stays stopped until
the call returned, so a call that waits for it never returns by itself)."""


@pytest.fixture
def stalled(own_server: EmbeddedServer) -> Iterator[Callable[[], None]]:
    """Stops the server when called (SIGSTOP); it answers again at the end of the test."""
    pid = own_server.pid
    assert pid is not None
    stopped: list[bool] = []

    def stop() -> None:
        os.kill(pid, signal.SIGSTOP)
        stopped.append(True)

    try:
        yield stop
    finally:
        if stopped:
            os.kill(pid, signal.SIGCONT)


def _resume(server: EmbeddedServer) -> None:
    assert server.pid is not None
    os.kill(server.pid, signal.SIGCONT)


@pytest.fixture
def client(own_server: EmbeddedServer) -> Iterator[Any]:
    c = own_server.client(socket_timeout=None)
    try:
        yield c
    finally:
        c.close()


def _topic(client: Any, namespace: str, records: int) -> None:
    """Topic "t", one partition, holding ``records`` records; the namespace's group settings
    without an initial rebalance delay (a first join completes at once, not after 3 s)."""
    without_join_delay(client, namespace)
    Topics(client, namespace).create("t", 1)
    if records:
        Producer(client, namespace).send_batch("t", [b"%d" % i for i in range(records)])


def _consumer(client: Any, namespace: str, *, assignors: list[str] | None = None,
              topics: tuple[str, ...] = ("t",), **kw: Any) -> Consumer:
    """A member of group "g" reading ``topics`` ("t") through ``client``."""
    config = ConsumerGroupConfig(
        group_id="g", topics=list(topics), redis_client=client, namespace=namespace,
        heartbeat_interval_ms=100, session_timeout_ms=30_000, rebalance_timeout_ms=30_000,
        retry_backoff_ms=10, retry_backoff_max_ms=100,
        **({} if assignors is None else {"assignors": assignors}),
    )
    return Consumer(config, fetch_max_wait_ms=20, **kw)


def _returns_by_itself(call: Callable[[], Any]) -> Any:
    """Runs ``call`` in a thread and returns what it returned; fails if it is still running
    after ``BOUND_S`` (it waits for the stopped server)."""
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(call()), daemon=True)
    thread.start()
    thread.join(BOUND_S)
    assert not thread.is_alive(), "the call waited for the server that does not answer"
    return out[0]


def test_poll_returns_by_its_timeout_while_redis_does_not_answer(
    own_server: EmbeddedServer, client: Any, namespace: str, stalled: Callable[[], None]
) -> None:
    """The fetch and the auto-commit (due at every poll here) stay in flight; poll() returns
    [] each time. Once the server answers, the auto-commit lands and the records produced
    meanwhile are read once each, after the ones before."""
    _topic(client, namespace, 5)
    consumer = _consumer(client, namespace, auto_commit_interval_ms=1)
    try:
        assert [r.offset for r in poll_until(consumer, lambda g: len(g) >= 5)] == [0, 1, 2, 3, 4]
        stalled()
        for _ in range(3):
            assert _returns_by_itself(lambda: consumer.poll(timeout=0.2)) == []
        _resume(own_server)
        Producer(client, namespace).send_batch("t", [b"5", b"6"])
        assert [r.offset for r in poll_until(consumer, lambda g: len(g) >= 2)] == [5, 6]
        tp = TP("t", 0)
        wait_until(lambda: consumer.committed([tp]) == {tp: 7},
                   lambda: consumer.poll(timeout=0.05))
        assert consumer.poll(timeout=0.1) == []  # nothing twice
    finally:
        consumer.close(timeout=5)


def test_a_fetch_answer_for_a_position_sought_meanwhile_is_dropped(
    own_server: EmbeddedServer, client: Any, namespace: str, stalled: Callable[[], None]
) -> None:
    """poll() returned while its fetch from offset 5 was in flight; the application seeks to
    2. The answer that comes later (records 5-7) is for a position the partition no longer
    has: it is dropped, and the next fetch reads from 2. Applying it would have handed out 5-7
    at position 2, skipping 2-4."""
    _topic(client, namespace, 5)
    consumer = _consumer(client, namespace, enable_auto_commit=False)
    tp = TP("t", 0)
    try:
        poll_until(consumer, lambda g: len(g) >= 5)
        Producer(client, namespace).send_batch("t", [b"5", b"6", b"7"])
        stalled()
        assert _returns_by_itself(lambda: consumer.poll(timeout=0.2)) == []
        assert consumer._fetching.busy  # the fetch from 5 is in flight
        consumer.seek(tp, 2)
        _resume(own_server)
        assert [r.offset for r in poll_until(consumer, lambda g: len(g) >= 6)] == [2, 3, 4, 5, 6, 7]
        assert consumer.poll(timeout=0.1) == []
    finally:
        consumer.close(timeout=5)


def test_close_returns_by_its_timeout_while_redis_does_not_answer(
    own_server: EmbeddedServer, client: Any, namespace: str, stalled: Callable[[], None]
) -> None:
    """close(0.5), with a final auto-commit to send and a fetch in flight, returns while the
    server is stopped. Afterwards a new member reads from the committed offset: the final
    commit landed (5) or not (nothing committed: 0), and nothing is lost."""
    _topic(client, namespace, 5)
    consumer = _consumer(client, namespace, auto_commit_interval_ms=100_000)
    poll_until(consumer, lambda g: len(g) >= 5)
    stalled()
    assert _returns_by_itself(lambda: consumer.poll(timeout=0.1)) == []
    _returns_by_itself(lambda: consumer.close(timeout=0.5))
    _resume(own_server)
    Producer(client, namespace).send_batch("t", [b"5"])
    after = _consumer(client, namespace)
    try:
        offsets = [r.offset for r in poll_until(after, lambda g: len(g) >= 1)]
        if offsets[0] == 0:
            offsets += [r.offset for r in poll_until(after, lambda g: len(g) >= 6 - len(offsets))]
        assert offsets in ([5], [0, 1, 2, 3, 4, 5]), offsets
    finally:
        after.close(timeout=5)


def test_close_from_another_thread_ends_a_poll_waiting_for_its_auto_commit(
    own_server: EmbeddedServer, client: Any, namespace: str, stalled: Callable[[], None]
) -> None:
    """poll(timeout=None) in a thread waits for its auto-commit, which the stopped server does
    not answer; close(0.5) from another thread ends that wait (the poll returns []) and
    returns by itself."""
    _topic(client, namespace, 5)
    consumer = _consumer(client, namespace, auto_commit_interval_ms=1)
    poll_until(consumer, lambda g: len(g) >= 5)
    stalled()
    out: list[object] = []
    poller = threading.Thread(target=lambda: out.append(consumer.poll(timeout=None)),
                              daemon=True)
    poller.start()
    wait_until(lambda: consumer._committer.pending > 0)  # the auto-commit is in flight
    _returns_by_itself(lambda: consumer.close(timeout=0.5))
    poller.join(BOUND_S)
    assert not poller.is_alive() and out == [[]], out


def test_wakeup_ends_a_poll_waiting_for_a_fetch_in_flight(
    own_server: EmbeddedServer, client: Any, namespace: str, stalled: Callable[[], None]
) -> None:
    """poll(timeout=None) waits for the fetch in flight with no bound of its own: wakeup()
    from another thread ends the wait (WakeupError)."""
    _topic(client, namespace, 5)
    consumer = _consumer(client, namespace, enable_auto_commit=False)
    try:
        poll_until(consumer, lambda g: len(g) >= 5)
        stalled()
        ended: list[BaseException | None] = []

        poller = threading.Thread(
            target=lambda: ended.append(_raised(lambda: consumer.poll(timeout=None))),
            daemon=True)
        poller.start()
        wait_until(lambda: consumer._fetching.busy)
        consumer.wakeup()
        poller.join(BOUND_S)
        assert not poller.is_alive() and isinstance(ended[0], WakeupError), ended
    finally:
        _resume(own_server)
        consumer.close(timeout=5)


class _Revocations:
    """A listener that notes each revocation with the committed offset it found then."""

    def __init__(self) -> None:
        self.consumer: Consumer | None = None
        self.revoked: list[tuple[list[TP], dict[TP, int]]] = []
        self.assigned: list[list[TP]] = []

    def on_partitions_revoked(self, partitions: list[TP]) -> None:
        assert self.consumer is not None
        self.revoked.append((partitions, self.consumer.committed(partitions)))

    def on_partitions_assigned(self, partitions: list[TP]) -> None:
        self.assigned.append(partitions)


def _polling(consumer: Consumer, stop: threading.Event) -> threading.Thread:
    """A thread polling ``consumer`` until ``stop`` (to keep a second member in the group)."""

    def run() -> None:
        while not stop.is_set():
            consumer.poll(timeout=0.05)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_a_revocations_final_commit_does_not_hold_poll_past_its_timeout(
    own_server: EmbeddedServer, client: Any, namespace: str, stalled: Callable[[], None]
) -> None:
    """A second member joins, ending the first one's generation; then the server stops. The
    first one's poll(0.3) returns [] while the revocation's final auto-commit is in flight
    (Kafka's onJoinPrepare waits for it only under the poll timer), and wakeup() ends such a
    poll; the member does not rejoin and on_partitions_revoked is not called yet. Once the
    server answers, a later poll() finishes the revocation: the commit landed before the
    listener ran, and whoever owns the partition next starts after the records read."""
    _topic(client, namespace, 10)
    listener = _Revocations()
    first = _consumer(client, namespace, auto_commit_interval_ms=100_000, listener=listener)
    listener.consumer = first
    second = _consumer(own_server.client(), namespace, auto_commit_interval_ms=100_000)
    stop = threading.Event()
    tp = TP("t", 0)
    try:
        poll_until(first, lambda g: len(g) >= 10)
        gen = first.generation
        assert gen is not None and first.committed([tp]) == {tp: -1}  # none
        joiner = _polling(second, stop)
        wait_until(lambda: gen.done.is_set() and gen.wait_decided(0))  # rebalancing
        stalled()
        for _ in range(2):
            assert _returns_by_itself(lambda: first.poll(timeout=0.3)) == []
        first.wakeup()
        woken = _returns_by_itself(lambda: _raised(lambda: first.poll(timeout=0.3)))
        assert isinstance(woken, WakeupError), woken
        assert listener.revoked == [] and first.generation is gen
        _resume(own_server)
        wait_until(lambda: len(listener.assigned) == 2, lambda: first.poll(timeout=0.05))
        assert listener.revoked == [([tp], {tp: 10})]
        new = first.generation
        assert new is not None
        wait_until(lambda: second.generation is not None
                   and second.generation.generation_id == new.generation_id)
        stop.set()  # the second member now polls here only
        joiner.join(BOUND_S)
        assert not joiner.is_alive()
        Producer(client, namespace).send_batch("t", [b"10", b"11"])
        owner = first if first.assignment() == [tp] else second
        assert [r.offset for r in poll_until(owner, lambda g: len(g) >= 2)] == [10, 11]
    finally:
        stop.set()
        _resume(own_server)
        first.close(timeout=5)
        second.close(timeout=5)


def test_a_cooperative_revocations_commit_does_not_hold_poll_past_its_timeout(
    own_server: EmbeddedServer, client: Any, namespace: str, stalled: Callable[[], None]
) -> None:
    """cooperative-sticky, two partitions: a second member joins; the first one's group takes
    the next generation (it keeps one partition, gives up the other), then the server stops.
    The first one's poll(0.3) revokes the partition, runs the callbacks and returns: the
    revoked partition's commit stays in flight and the rejoin that hands it over waits for
    it, not poll(). Once the server answers, the second member gets the partition and starts
    where the first one stopped."""
    without_join_delay(client, namespace)
    Topics(client, namespace).create("t", 2)
    Producer(client, namespace).send_batch("t", [b"%d" % i for i in range(10)])
    noted = Recorder()
    first = _consumer(client, namespace, auto_commit_interval_ms=100_000, listener=noted,
                      assignors=["cooperative-sticky"])
    second = _consumer(own_server.client(), namespace, auto_commit_interval_ms=100_000,
                       assignors=["cooperative-sticky"])
    stop = threading.Event()
    try:
        poll_until(first, lambda g: len(g) >= 10)
        gen, group = first.generation, first.group
        assert gen is not None and len(first.assignment()) == 2
        read = {tp: first.position(tp) for tp in first.assignment()}
        joiner = _polling(second, stop)

        def next_taken() -> bool:
            ahead = group.peek()
            return ahead is not None and ahead.generation_id > gen.generation_id

        wait_until(next_taken)
        stalled()
        assert _returns_by_itself(lambda: first.poll(timeout=0.3)) == []
        (kept,) = first.assignment()
        (gone,) = set(read) - {kept}
        assert noted.events[-2:] == [("revoked", [gone]), ("assigned", [])]
        assert first._rejoin_after is not None  # the rejoin waits for the commit
        assert _returns_by_itself(lambda: first.poll(timeout=0.3)) == []
        _resume(own_server)
        wait_until(lambda: second.assignment() == [gone], lambda: first.poll(timeout=0.05))
        stop.set()
        joiner.join(BOUND_S)
        assert not joiner.is_alive()
        assert second.committed([gone]) == {gone: read[gone]}
        Producer(client, namespace).send("t", b"new", partition=gone.partition)
        got = poll_until(second, lambda g: len(g) >= 1)
        assert [(r.partition, r.offset) for r in got] == [(gone.partition, read[gone])]
    finally:
        stop.set()
        _resume(own_server)
        first.close(timeout=5)
        second.close(timeout=5)


def test_a_new_subscriptions_revocation_commit_does_not_hold_poll_past_its_timeout(
    own_server: EmbeddedServer, client: Any, namespace: str, stalled: Callable[[], None]
) -> None:
    """cooperative-sticky, topics "a" and "b": the member subscribes to "b" only, then the
    server stops. poll(0.3) revokes a-0 (auto-commit queued, then the callback) and returns
    while that commit is in flight: the rejoin with the new subscription waits for it, not
    poll(), and the member goes on consuming b-0. Once the server answers, the commit lands
    before the rejoin, and a member subscribed to "a" starts where this one stopped."""
    without_join_delay(client, namespace)
    topics = Topics(client, namespace)
    topics.create("a", 1)
    topics.create("b", 1)
    Producer(client, namespace).send_batch("a", [b"%d" % i for i in range(10)])
    a0, b0 = TP("a", 0), TP("b", 0)
    noted = Recorder()
    first = _consumer(client, namespace, auto_commit_interval_ms=100_000, listener=noted,
                      assignors=["cooperative-sticky"], topics=("a", "b"))
    second: Consumer | None = None
    stop = threading.Event()
    try:
        poll_until(first, lambda g: len(g) >= 10)
        gen = first.generation
        assert gen is not None and first.assignment() == [a0, b0]
        assert first.position(a0) == 10 and first.committed([a0]) == {a0: -1}
        first.subscribe(["b"])
        stalled()
        assert _returns_by_itself(lambda: first.poll(timeout=0.3)) == []
        assert noted.events[-1] == ("revoked", [a0])
        assert first.assignment() == [b0] and first._rejoin_after is not None
        assert first.generation is gen  # not rejoined: the commit is in flight
        assert _returns_by_itself(lambda: first.poll(timeout=0.3)) == []
        _resume(own_server)
        Producer(client, namespace).send("b", b"b0")
        got = poll_until(first, lambda g: len(g) >= 1)
        assert [(r.topic, r.offset) for r in got] == [("b", 0)]
        wait_until(lambda: first.generation is not gen and first._rejoin_after is None,
                   lambda: first.poll(timeout=0.05))
        assert first.subscription() == ["b"] and first.assignment() == [b0]
        assert first.committed([a0]) == {a0: 10}
        second = _consumer(own_server.client(), namespace, topics=("a",),
                           assignors=["cooperative-sticky"])
        polling = _polling(first, stop)  # the first member rejoins as the second one joins
        Producer(client, namespace).send("a", b"10")
        got = poll_until(second, lambda g: len(g) >= 1)
        assert [(r.topic, r.offset) for r in got] == [("a", 10)]
        stop.set()
        polling.join(BOUND_S)
        assert not polling.is_alive()
    finally:
        stop.set()
        _resume(own_server)
        first.close(timeout=5)
        if second is not None:
            second.close(timeout=5)


def _raised(call: Callable[[], Any]) -> BaseException | None:
    try:
        call()
    except BaseException as exc:  # noqa: BLE001 - the test looks at how it ended
        return exc
    return None


# -- InFlight itself


def test_inflight_hands_back_the_value_or_the_error_with_its_tag() -> None:
    calls: InFlight[int, str] = InFlight("t-inflight")
    try:
        calls.start(lambda: 7, "a")
        done = calls.wait(BOUND_S)
        assert done is not None and (done.tag, done.value, done.error) == ("a", 7, None)
        assert not calls.busy
        boom = ValueError("boom")

        def fail() -> int:
            raise boom

        calls.start(fail, "b")
        done = calls.wait(BOUND_S)
        assert done is not None and done.tag == "b" and done.error is boom
    finally:
        calls.close()


def test_inflight_wait_times_out_or_is_interrupted_and_the_call_stays_in_flight() -> None:
    calls: InFlight[str, None] = InFlight("t-inflight")
    release = threading.Event()
    interrupt = threading.Event()
    try:
        calls.start(lambda: "late" if release.wait(BOUND_S) else "never", None)
        assert calls.wait(0.01) is None and calls.busy
        with pytest.raises(RuntimeError, match="already in flight"):
            calls.start(lambda: "x", None)
        interrupt.set()
        assert calls.wait(None, interrupt) is None  # set before the wait: returns at once
        release.set()
        done = calls.wait(BOUND_S)
        assert done is not None and done.value == "late" and not calls.busy
        with pytest.raises(RuntimeError, match="no call in flight"):
            calls.wait(0)
    finally:
        calls.close()
    with pytest.raises(RuntimeError, match="closed"):
        calls.start(lambda: "x", None)


def test_inflight_thread_ends_when_idle_and_the_next_call_starts_another() -> None:
    """A consumer dropped without close() must not leave its fetcher thread behind: the
    thread ends after ``IDLE_EXIT_S`` with nothing to do, and the next call starts one."""
    calls: InFlight[int, None] = InFlight("t-inflight-idle", idle_exit_s=0.2)

    def alive() -> bool:
        return any(t.name == "t-inflight-idle" for t in threading.enumerate())

    try:
        calls.start(lambda: 1, None)
        assert alive()
        assert calls.wait(BOUND_S) is not None
        wait_until(lambda: not alive())
        calls.start(lambda: 2, None)
        done = calls.wait(BOUND_S)
        assert done is not None and done.value == 2
    finally:
        calls.close()
    wait_until(lambda: not alive())


def test_committer_thread_ends_when_idle_and_the_next_commit_starts_another() -> None:
    """The same for the committer, which every auto-committing consumer now starts."""
    committer = AsyncCommitter("t-committer-idle", idle_exit_s=0.2)
    ran: list[int] = []

    def alive() -> bool:
        return any(t.name == "t-committer-idle" for t in threading.enumerate())

    try:
        for n in (1, 2):
            ticket = committer.submit(functools.partial(ran.append, n), {}, None)
            assert committer.wait_idle(BOUND_S, upto=ticket) and committer.finished(ticket)
            wait_until(lambda: not alive())
        assert ran == [1, 2]
    finally:
        committer.close(BOUND_S)


# -- offset queries retry a lost connection (Kafka's default.api.timeout.ms) --------------------

QUERIES: dict[str, Callable[[Consumer], Any]] = {
    "committed": lambda c: c.committed([TP("t", 0)]),
    "beginning_offsets": lambda c: c.beginning_offsets([TP("t", 0)]),
    "end_offsets": lambda c: c.end_offsets([TP("t", 0)]),
    "offsets_for_times": lambda c: c.offsets_for_times({TP("t", 0): 0}),
    "lag": lambda c: c.lag(),
}


def _retrying(caplog: pytest.LogCaptureFixture, thread: threading.Thread) -> bool:
    """Whether ``thread`` (the query's: its retries log there) logged a retry: not another
    test's consumer still retrying in this process, which ended the wait before this query
    had failed once (and the test then proved nothing)."""
    return any("retrying after" in r.getMessage() and r.thread == thread.ident
               for r in caplog.records)


def _in_thread(call: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    """Runs ``call`` in a thread; the list gets its result or its exception."""
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(call())
        except Exception as exc:  # noqa: BLE001 - handed to the test
            out.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


@pytest.mark.parametrize("query", sorted(QUERIES))
def test_an_offset_query_retries_while_redis_does_not_answer(
    own_server: EmbeddedServer, namespace: str, stalled: Callable[[], None], query: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The call fails (the client's 0.3 s socket timeout), is retried, and answers once the
    server does; before, its first ConnectionLost reached the application at once."""
    client = _outage_client(own_server)
    consumer = _outage_consumer(client, namespace, "assign")
    try:
        consumer.position(TP("t", 0))  # (its start read: lag() has a position to count from)
        expected = QUERIES[query](consumer)
        with caplog.at_level(logging.INFO, logger="rcoord.client"):
            stalled()
            thread, out = _in_thread(lambda: QUERIES[query](consumer))
            wait_until(lambda: _retrying(caplog, thread) or not thread.is_alive())
            assert thread.is_alive(), out  # still retrying, not failed
            _resume(own_server)
            thread.join(BOUND_S)
        assert not thread.is_alive() and out == [expected]
    finally:
        _resume(own_server)
        consumer.close(timeout=5)
        client.close()


def test_an_offset_query_gives_up_after_its_timeout_and_a_wakeup_ends_it_sooner(
    own_server: EmbeddedServer, namespace: str, stalled: Callable[[], None],
    caplog: pytest.LogCaptureFixture,
) -> None:
    client = _outage_client(own_server)
    consumer = _outage_consumer(client, namespace, "assign")
    tp = TP("t", 0)
    try:
        with pytest.raises(ValueError, match="timeout must be >= 0"):
            consumer.end_offsets([tp], timeout=-1)
        stalled()
        gave_up = _returns_by_itself(lambda: _raised(lambda: consumer.end_offsets([tp], timeout=0.5)))
        assert isinstance(gave_up, ConnectionLost), gave_up
        # The default (60 s) outlasts the test: wakeup() ends it.
        with caplog.at_level(logging.INFO, logger="rcoord.client"):
            caplog.clear()
            thread, out = _in_thread(lambda: consumer.committed([tp]))
            wait_until(lambda: _retrying(caplog, thread) or not thread.is_alive())
        consumer.wakeup()
        thread.join(BOUND_S)
        assert not thread.is_alive() and len(out) == 1 and isinstance(out[0], WakeupError), out
    finally:
        _resume(own_server)
        consumer.close(timeout=5)
        client.close()


def _assigned(client: Any, namespace: str, **kw: Any) -> Consumer:
    """A consumer of group "g" with partition t-0 ``assign()``ed (no membership)."""
    consumer = _consumer(client, namespace, topics=(), **kw)
    consumer.assign([TP("t", 0)])
    return consumer


def test_the_first_poll_after_assign_returns_by_its_timeout_while_redis_does_not_answer(
    own_server: EmbeddedServer, client: Any, namespace: str, stalled: Callable[[], None]
) -> None:
    """The first poll() after assign() reads where the partition starts (its committed offset,
    3). With the server stopped, each poll(0.2) returns [] while that read stays in flight
    (the client has no socket timeout: it waited until SIGCONT, for ever here). Once the
    server answers, reading starts at the committed offset: 3 and 4, once each."""
    consumer = _assigned_after_a_commit_of_3(client, namespace)
    try:
        stalled()
        for _ in range(3):
            assert _returns_by_itself(lambda: consumer.poll(timeout=0.2)) == []
        assert consumer._reading_starts.busy  # the read, still in flight: not sent again
        _resume(own_server)
        assert [r.offset for r in poll_until(consumer, lambda g: len(g) >= 2)] == [3, 4]
        assert consumer.poll(timeout=0.1) == []
    finally:
        _resume(own_server)
        consumer.close(timeout=5)


def _assigned_after_a_commit_of_3(client: Any, namespace: str) -> Any:
    """A consumer assigned t-0 (5 records), whose group another consumer committed 3 for."""
    _topic(client, namespace, 5)
    committer = _assigned(client, namespace, enable_auto_commit=False)
    committer.commit({TP("t", 0): 3})
    committer.close(timeout=5)
    return _assigned(client, namespace, enable_auto_commit=False)


def _hold_up_offset_reads(consumer: Any, monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """The consumer's reads of committed offsets answer only once the event returned is set
    (as a slow server's would): what they read, they read at once."""
    coord = consumer._own_coordinator
    assert coord is not None
    answer = threading.Event()
    read = coord.fetch_offsets

    def held_up(*args: Any, **kwargs: Any) -> Any:
        found = read(*args, **kwargs)
        answer.wait(BOUND_S)
        return found

    monkeypatch.setattr(coord, "fetch_offsets", held_up)
    return answer


def test_a_commit_landed_while_the_start_read_is_in_flight_sets_the_start(
    client: Any, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """poll()'s read of the assigned partition's start found the committed offset 3, and its
    answer is held up (as by a slow server). Meanwhile the application commits 4, which
    lands: the partition starts there, as a commit of it made before the first poll() does,
    and the read's older answer, collected afterwards, does not set the start back to 3
    (which read 3 again)."""
    tp = TP("t", 0)
    consumer = _assigned_after_a_commit_of_3(client, namespace)
    answer = _hold_up_offset_reads(consumer, monkeypatch)
    try:
        assert consumer.poll(timeout=0.1) == []
        assert consumer._reading_starts.busy
        landed: list[Any] = []
        consumer.commit_async({tp: 4}, lambda offsets, error: landed.append(error))
        # (the read's answer still held up: not 3, nor nothing until it comes)
        got = poll_until(consumer, lambda g: bool(landed) and len(g) >= 1)
        assert landed == [None] and [r.offset for r in got] == [4]
        answer.set()
        wait_until(lambda: consumer._reading_starts.wait_finished(0))
        assert consumer.poll(timeout=0.1) == []  # (its answer does not set the start back)
        assert consumer.position(tp) == 5
    finally:
        answer.set()
        consumer.close(timeout=5)


def test_a_start_read_sent_before_an_assign_that_took_the_partition_again_is_dropped(
    client: Any, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """poll()'s read of t-0's start found the committed offset 3, and its answer is held up.
    The application gives the partition up and assigns it again; another client commits 4;
    then the old answer comes. The partition starts at 4, where a read after that assign()
    finds it: the answer from before it is dropped, not taken for the new assignment's."""
    _topic(client, namespace, 5)
    tp = TP("t", 0)
    other = _assigned(client, namespace, enable_auto_commit=False)
    other.commit({tp: 3})
    consumer = _assigned(client, namespace, enable_auto_commit=False)
    answer = _hold_up_offset_reads(consumer, monkeypatch)
    try:
        assert consumer.poll(timeout=0.1) == []
        assert consumer._reading_starts.busy
        consumer.assign([TP("t", 1)])  # (no such partition: given up, t-0 is not read)
        consumer.assign([tp])
        other.commit({tp: 4})
        answer.set()
        assert [r.offset for r in poll_until(consumer, lambda g: len(g) >= 1)] == [4]
        assert consumer.poll(timeout=0.1) == []
    finally:
        answer.set()
        other.close(timeout=5)
        consumer.close(timeout=5)
