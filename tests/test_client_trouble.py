"""The worker client under Redis trouble: calls that wait on Redis keep to their timeouts."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import redis
from harness import WAIT_S, wait_until
from redis.backoff import NoBackoff
from redis.retry import Retry

import rcoord.client.group as group_module
from rcoord import CoordinatorConfig, GroupCoordinator
from rcoord.client import Consumer, ConsumerGroup, ConsumerGroupConfig, ReadOnlyReplicaError
from rcoord.protocol.offsets import TopicPartition
from rcoord.testing.embedded import EmbeddedServer
from rcoord.topics import Topics

SHORT: dict[str, Any] = {"session_timeout_ms": 300, "heartbeat_interval_ms": 50,
                         "rebalance_timeout_ms": 1000, "retry_backoff_ms": 10,
                         "retry_backoff_max_ms": 50, "join_backoff_ms": 10}


def _held_client(port: int, released: threading.Event) -> redis.Redis:
    """A client whose redis-py retries hold every call until ``released`` is set (one whose
    own retries against an unreachable Redis last seconds)."""

    class HeldRetry(Retry):  # (a closure: the config is copied, an Event cannot be)
        def call_with_retry(self, do: Any, fail: Any, *args: Any, **kwargs: Any) -> Any:
            released.wait(WAIT_S)
            return super().call_with_retry(do, fail, *args, **kwargs)

    return redis.Redis(host="127.0.0.1", port=port, retry=HeldRetry(NoBackoff(), 0))


def test_offset_queries_keep_their_timeout_while_a_polls_start_waits_on_redis(
        refused_port: int, namespace: str) -> None:
    """A ``poll(timeout)`` gives the coordinator's start up when its timeout passes, the start
    going on (held in the client's own retries). ``committed(timeout)`` then waited for that
    start on the group's ``_connecting`` lock, for as long as it lasted, past its timeout."""
    released = threading.Event()
    r = _held_client(refused_port, released)
    consumer = Consumer(ConsumerGroupConfig(
        group_id="g", topics=["t"], redis_client=r, namespace=namespace, **SHORT))
    answers: list[object] = []

    def calls() -> None:
        answers.append(consumer.poll(timeout=0.05))
        try:
            consumer.committed([TopicPartition("t", 0)], timeout=0.05)
        except Exception as exc:  # noqa: BLE001 - the answer is what is tested
            answers.append(exc)

    caller = threading.Thread(target=calls, daemon=True)
    try:
        caller.start()
        wait_until(lambda: len(answers) == 2, timeout_s=5)
        assert answers[0] == []
        assert isinstance(answers[1], TimeoutError), answers[1]
    finally:
        released.set()
        caller.join(WAIT_S)
        consumer.close(timeout=WAIT_S)
        r.close()


def test_commits_of_a_generation_on_a_demoted_master_say_to_give_the_master(
        own_server: EmbeddedServer, namespace: str, refused_port: int) -> None:
    """A master demoted mid-generation (``REPLICAOF``) answers READONLY to every commit for
    the client's whole retry bound. The blocking ``Consumer.commit()`` raised
    ``ReadOnlyReplicaError`` then, but a ``Generation.commit_offsets`` (``ConsumerGroup``) and
    ``Consumer.commit_async``'s callback got ``ServerUnavailable`` "try again": retried by
    the caller, it is refused for ever."""
    r = own_server.client()
    GroupCoordinator(r, CoordinatorConfig(
        namespace=namespace, group_min_session_timeout_ms=10,
        group_initial_rebalance_delay_ms=0)).start()
    Topics(r, namespace).create("t", 1)
    tp = TopicPartition("t", 0)
    group = ConsumerGroup(ConsumerGroupConfig(
        group_id="g", topics=["t"], redis_client=r, namespace=namespace, **SHORT))
    consumer = Consumer(ConsumerGroupConfig(
        group_id="h", topics=["t"], redis_client=r, namespace=namespace, **SHORT),
        enable_auto_commit=False)
    answers: list[BaseException | None] = []
    try:
        gen = group.next(timeout=WAIT_S)
        wait_until(lambda: consumer.assignment() == [tp], step=lambda: consumer.poll(0.05))
        r.execute_command("REPLICAOF", "127.0.0.1", refused_port)
        with pytest.raises(ReadOnlyReplicaError, match="give it the URL of the master") as got:
            gen.commit_offsets({tp: 0})
        assert isinstance(got.value.__cause__, redis.exceptions.ReadOnlyError)
        consumer.commit_async({tp: 0}, lambda offsets, exc: answers.append(exc))
        wait_until(lambda: bool(answers), step=lambda: consumer.poll(0.05))
        assert isinstance(answers[0], ReadOnlyReplicaError), answers[0]
    finally:
        consumer.close(timeout=WAIT_S)
        group.close(timeout=WAIT_S)
        r.execute_command("REPLICAOF", "NO", "ONE")
        r.close()


def test_close_waits_for_a_polls_start_before_the_caller_closes_its_client(
        own_server: EmbeddedServer, namespace: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``close()`` returned while the coordinator's start that a ``poll(timeout)`` gave up
    waiting for still ran on the caller's ``redis_client``; the caller then closed its client,
    and the start, going on on it, connected it again (redis-py reconnects a closed client):
    a connection stayed open for as long as the client object lived. Now ``close()`` waits
    for that start within its timeout. (The hold is released as soon as close() waits for the
    start, or once close() and the client's close returned if it does not.)"""
    released = threading.Event()
    closer: list[threading.Thread] = []

    class Watched(threading.Event):
        def wait(self, timeout: float | None = None) -> bool:
            if closer and threading.current_thread() is closer[0]:
                released.set()  # close() waits for the start: let it end
            return super().wait(timeout)

    original = group_module._Attempt.__init__

    def attempt(self: Any, call: Any, name: str) -> None:
        original(self, call, name)  # (its call is held until released: done is not set yet)
        self.done = Watched()

    monkeypatch.setattr(group_module._Attempt, "__init__", attempt)
    r = _held_client(own_server.port, released)
    consumer = Consumer(ConsumerGroupConfig(
        group_id="g", topics=["t"], redis_client=r, namespace=namespace, **SHORT))
    with own_server.client() as checker:
        mine = checker.client_id()

        def closes() -> None:
            consumer.close(timeout=WAIT_S)
            r.close()

        try:
            assert consumer.poll(timeout=0.05) == []
            closer.append(threading.Thread(target=closes, daemon=True))
            closer[0].start()
            closer[0].join(WAIT_S)
            assert not closer[0].is_alive()
        finally:
            released.set()
        for thread in threading.enumerate():
            if thread.name == "rcoord-g-start":
                thread.join(WAIT_S)
        assert [c for c in checker.client_list() if int(c["id"]) != mine] == []
