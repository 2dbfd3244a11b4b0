"""A group member whose Redis is a read-only replica: a URL that names a replica is a setting to
fix, not a failover to wait out. Every JoinGroup answered READONLY for the client's whole retry
bound (one session timeout) closes the group with ``ReadOnlyReplicaError``, which says to give
the master's URL; a READONLY that ends within the bound (a failover) is still waited out.
Before, the member took every READONLY for a failover in progress and joined again every
``join_backoff_ms`` for ever: ``rcoord topics consume --group`` said "waiting to join" until
killed, where every other command says to give the master's URL."""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable
from typing import Any

import pytest
import redis
from harness import WAIT_S, wait_until
from test_cli_groups import run_in_process

import rcoord.client
from rcoord import CoordinatorConfig, GroupCoordinator, ServerUnavailable
from rcoord.client import Consumer, ConsumerGroup, ConsumerGroupConfig, ReadOnlyReplicaError
from rcoord.client.coordinator import RedisCoordinator
from rcoord.protocol.offsets import TopicPartition
from rcoord.testing.embedded import EmbeddedServer
from rcoord.topics import Topics

SHORT: dict[str, Any] = {"session_timeout_ms": 300, "heartbeat_interval_ms": 50,
                         "rebalance_timeout_ms": 1000, "retry_backoff_ms": 10,
                         "retry_backoff_max_ms": 50, "join_backoff_ms": 10}
"""A retry bound (one session timeout) a test can wait out."""


@pytest.fixture
def replica(own_server: EmbeddedServer, namespace: str, refused_port: int) -> EmbeddedServer:
    """The server with rcoord's functions, its settings and topic "t" (1 partition), made a
    replica of a master that does not exist: it keeps its data and answers reads, and refuses
    every write with READONLY (as a replica of a live master that has replicated them)."""
    with own_server.client() as client:
        GroupCoordinator(client, CoordinatorConfig(
            namespace=namespace, group_min_session_timeout_ms=10)).start()
        Topics(client, namespace).create("t", 1)
        client.execute_command("REPLICAOF", "127.0.0.1", refused_port)
    return own_server


def _refusal(call: Callable[[], Any], *not_yet: type[BaseException]) -> ReadOnlyReplicaError:
    """Make ``call`` until it raises ``ReadOnlyReplicaError``, and return that; ``not_yet``:
    errors that may come before it (any other is raised)."""
    got: list[ReadOnlyReplicaError] = []

    def raised() -> bool:
        try:
            call()
        except ReadOnlyReplicaError as exc:
            got.append(exc)
            return True
        except not_yet:
            pass
        return False

    wait_until(raised)
    return got[0]


def test_a_group_on_a_replica_closes_with_read_only_replica_error(
        replica: EmbeddedServer, namespace: str) -> None:
    r = replica.client()
    group = ConsumerGroup(ConsumerGroupConfig(
        group_id="g", topics=["t"], redis_client=r, namespace=namespace, **SHORT))
    try:
        with pytest.raises(ReadOnlyReplicaError, match="give it the URL of the master") as caught:
            group.next(timeout=WAIT_S)
        assert isinstance(caught.value.__cause__, redis.exceptions.ReadOnlyError)
        assert "session_timeout_ms" in str(caught.value)
        with pytest.raises(ReadOnlyReplicaError):  # closed: every later call says the same
            group.next(timeout=WAIT_S)
    finally:
        group.close(timeout=WAIT_S)
        r.close()


def test_its_policy_row_is_fatal() -> None:
    """Whoever asks the policy whether the group's error ends it (a Spark query's plan does,
    rcoord.spark.member) hears "fatal": taken for "anything else", the query planned empty
    batches for ever, warning each time, where before it failed once Redis had refused it for
    a session timeout."""
    from rcoord.client import reaction_for

    reaction = reaction_for(ReadOnlyReplicaError("group 'g': ... give it the URL of the master"))
    assert reaction.fatal and not reaction.retry and reaction.member_id == "reset"


def test_a_consumer_on_a_replica_raises_it_from_poll(replica: EmbeddedServer,
                                                     namespace: str) -> None:
    r = replica.client()
    consumer = Consumer(ConsumerGroupConfig(
        group_id="g", topics=["t"], redis_client=r, namespace=namespace, **SHORT))
    try:
        _refusal(lambda: consumer.poll(timeout=0.05))
    finally:
        consumer.close(timeout=WAIT_S)
        r.close()


@pytest.mark.parametrize("api", ["ConsumerGroup", "Consumer"])
def test_a_replica_of_a_namespace_without_settings_closes_the_group_too(
        own_server: EmbeddedServer, namespace: str, refused_port: int, api: str,
        caplog: pytest.LogCaptureFixture) -> None:
    """Where no coordinator has stored the namespace's settings yet (a topic made by ``rcoord
    topics create`` only), the coordinator's start is what the replica refuses, before any
    join: next() and poll() started it again at every call, silently, for ever (poll() takes
    a ConnectionLost for a failure it retries). The first refusal is logged now, and one that
    lasts the retry bound closes the group as a refused join does."""
    with own_server.client() as client:
        Topics(client, namespace).create("t", 1)
        client.execute_command("REPLICAOF", "127.0.0.1", refused_port)
    r = own_server.client()
    config = ConsumerGroupConfig(group_id="g", topics=["t"], redis_client=r, namespace=namespace,
                                 **SHORT)
    member: Any = ConsumerGroup(config) if api == "ConsumerGroup" else Consumer(config)
    try:
        with caplog.at_level(logging.WARNING, "rcoord.client"):
            exc = _refusal(lambda: member.next(timeout=0.05) if api == "ConsumerGroup"
                           else member.poll(timeout=0.05),
                           TimeoutError, ServerUnavailable)  # (next(): not yet)
        assert "to the coordinator's start" in str(exc)
        assert isinstance(exc.__cause__, redis.exceptions.ReadOnlyError)
        assert any("starting again at the next call" in m for m in caplog.messages)
        with pytest.raises(ReadOnlyReplicaError):  # closed on it: every later call says so
            member.next(timeout=0.05) if api == "ConsumerGroup" else member.poll(timeout=0.05)
    finally:
        member.close(timeout=WAIT_S)
        r.close()


def test_a_replica_that_serves_no_stale_data_closes_the_group_too(
        replica: EmbeddedServer, namespace: str) -> None:
    """With ``replica-serve-stale-data no`` a replica whose master is gone answers MASTERDOWN
    to everything, reads included (rcoord raises it as a ``ConnectionLost``): the member
    started, or joined, again for ever, as for READONLY before."""
    r = replica.client()
    r.config_set("replica-serve-stale-data", "no")
    consumer = Consumer(ConsumerGroupConfig(
        group_id="g", topics=["t"], redis_client=r, namespace=namespace, **SHORT))
    try:
        exc = _refusal(lambda: consumer.poll(timeout=0.05))
        assert "answered MASTERDOWN" in str(exc)
        assert isinstance(exc.__cause__, redis.exceptions.MasterDownError)
    finally:
        consumer.close(timeout=WAIT_S)
        r.close()


def test_a_read_only_spell_shorter_than_the_bound_is_waited_out(
        own_server: EmbeddedServer, namespace: str, refused_port: int) -> None:
    """A failover: the server refuses the joins with READONLY, then is a master again within
    the retry bound; the member joins, as before."""
    r = own_server.client()
    GroupCoordinator(r, CoordinatorConfig(namespace=namespace, group_min_session_timeout_ms=10,
                                          group_initial_rebalance_delay_ms=0)).start()
    Topics(r, namespace).create("t", 1)
    refused: list[BaseException] = []

    class Counting(RedisCoordinator):
        def join_group(self, *args: Any, **kwargs: Any) -> Any:
            try:
                return super().join_group(*args, **kwargs)
            except ServerUnavailable as exc:
                refused.append(exc)
                raise

    r.execute_command("REPLICAOF", "127.0.0.1", refused_port)
    group = ConsumerGroup(ConsumerGroupConfig(
        group_id="g", topics=["t"], redis_client=r, namespace=namespace,
        **{**SHORT, "session_timeout_ms": 30_000}), coordinator=Counting(r, namespace)).start()
    try:
        wait_until(lambda: len(refused) >= 2)
        r.execute_command("REPLICAOF", "NO", "ONE")
        gen = group.next(timeout=WAIT_S)
        assert [tp.partition for tp in gen.partitions] == [0]
    finally:
        group.close(timeout=WAIT_S)
        r.execute_command("REPLICAOF", "NO", "ONE")
        r.close()


def test_consume_with_a_group_on_a_replica_says_to_give_the_master(
        replica: EmbeddedServer, namespace: str, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """``topics consume --group`` ends (status 1) with the words the other commands use for a
    replica; before, it waited to join until killed. (A short session timeout, so the test
    waits out the retry bound quickly; the command's own is the client's default.)"""
    for key in [k for k in os.environ if k.startswith("RCOORD_")]:
        monkeypatch.delenv(key)
    monkeypatch.setattr(rcoord.client, "ConsumerGroupConfig",
                        functools.partial(ConsumerGroupConfig, **SHORT))
    caplog.set_level(logging.CRITICAL, "rcoord")  # (the group's own error log line)
    res = run_in_process(["topics", "consume", "t", "--group", "g", "--redis-url", replica.url,
                          "--namespace", namespace])
    assert res.returncode == 1, (res.stdout, res.stderr)
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert lines[-1] == (f"rcoord topics consume: error: Redis at {replica.url} is a read-only "
                         "replica (You can't write against a read only replica); give the URL "
                         "of its master"), res.stderr
    assert "Traceback" not in res.stderr


def test_consume_without_a_group_reads_a_replica(replica: EmbeddedServer,
                                                 namespace: str) -> None:
    """Reading without a group writes nothing, so a replica serves it (as ``topics list`` and
    ``describe``)."""
    res = run_in_process(["topics", "consume", "t", "--from-beginning", "--timeout-ms", "50",
                          "--redis-url", replica.url, "--namespace", namespace])
    assert res.returncode == 0, res.stderr
    assert "Processed a total of 0 messages" in res.stderr


def test_an_unreachable_redis_at_the_start_is_logged(refused_port: int, namespace: str,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    """Not a replica, but the same silent path: with Redis unreachable when the consumer
    first polls, every poll() started the coordinator again and returned nothing, with not
    one line logged (Kafka's consumer warns that the broker may not be available). The first
    failure of the spell is logged; the consumer goes on trying (no retry bound ends it)."""
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    r = redis.Redis(port=refused_port, retry=Retry(NoBackoff(), 0))
    consumer = Consumer(ConsumerGroupConfig(
        group_id="g", topics=["t"], redis_client=r, namespace=namespace, **SHORT))
    try:
        with caplog.at_level(logging.WARNING, "rcoord.client"):
            for _ in range(3):
                assert consumer.poll(timeout=0.01) == []
        # (This consumer's port: a consumer another test left may still be starting again.)
        starts = [m for m in caplog.messages
                  if "starting again at the next call" in m and f":{refused_port}." in m]
        assert len(starts) == 1 and "Connection refused" in starts[0], caplog.messages
    finally:
        consumer.close(timeout=WAIT_S)
        r.close()


def test_an_unreachable_redis_url_at_the_start_is_logged_with_the_url_not_the_call(
        refused_port: int, namespace: str, caplog: pytest.LogCaptureFixture) -> None:
    """The warning read "consumer group 'g': _connect: Error 111 connecting to ...": the name
    of the function the error boundary wrapped (a private one), and not the URL the group was
    given. It names the URL now, its password masked (as "Redis at URL" is said everywhere: no
    query), beside redis-py's own words."""
    url = f"redis://admin:Zm9vYmFy@127.0.0.1:{refused_port}/0?password=Zm9vYmFy"
    consumer = Consumer(ConsumerGroupConfig(
        group_id="g", topics=["t"], redis_url=url, namespace=namespace, **SHORT))
    try:
        with caplog.at_level(logging.WARNING, "rcoord.client"):
            assert consumer.poll(timeout=0.01) == []
        starts = [m for m in caplog.messages
                  if "starting again at the next call" in m
                  and f"127.0.0.1:{refused_port}/0: " in m]  # (not a longer port's)
        assert len(starts) == 1, caplog.messages
        (start,) = starts
        assert start.startswith(
            f"consumer group 'g': Redis at redis://admin:***@127.0.0.1:{refused_port}/0: "
            "Error 111 connecting to "), start
        assert "Connection refused" in start and "_connect" not in start, start
        assert "Zm9vYmFy" not in start, start
    finally:
        consumer.close(timeout=WAIT_S)


def test_offset_queries_and_assign_on_a_replica_say_to_give_the_master(
        replica: EmbeddedServer, namespace: str) -> None:
    """``committed()``, ``position()`` after ``assign()`` (which reads the committed offsets)
    and the other calls reading through the group's OffsetFetch, a function that may write (it applies the group's
    passed deadlines), met READONLY for their whole retry bound and then raised
    ``ServerUnavailable`` "Redis cannot run this now; try again", where the group's joins say
    to give the master's URL."""
    r = replica.client()
    consumer = Consumer(ConsumerGroupConfig(group_id="g", topics=[], redis_client=r,
                                            namespace=namespace, **SHORT))
    try:
        with pytest.raises(ReadOnlyReplicaError, match="give it the URL of the master") as got:
            consumer.committed([TopicPartition("t", 0)], timeout=0.1)
        assert "fetch_offsets for 100 ms" in str(got.value)
        assert isinstance(got.value.__cause__, redis.exceptions.ReadOnlyError)
        consumer.assign([TopicPartition("t", 0)])  # (reads nothing: Kafka's reads at poll)
        with pytest.raises(ReadOnlyReplicaError, match="give it the URL of the master") as got:
            consumer.position(TopicPartition("t", 0), timeout=0.1)
        assert "fetch_offsets for 100 ms" in str(got.value)
        with pytest.raises(ReadOnlyReplicaError, match="give it the URL of the master"):
            # (poll() reads the starts on a thread of its own: one that ends before the read's
            # retries do returns nothing, and a later one raises the read's error)
            for _ in range(100):
                assert consumer.poll(timeout=0.1) == []
        # Reads that write nothing are served by the replica.
        assert consumer.end_offsets([TopicPartition("t", 0)]) == {TopicPartition("t", 0): 0}
    finally:
        consumer.close(timeout=WAIT_S)
        r.close()


def test_a_commit_to_a_demoted_master_says_to_give_the_master(
        own_server: EmbeddedServer, namespace: str, refused_port: int) -> None:
    """The commit of an ``assign()``ed consumer whose server became a replica raised
    ``ServerUnavailable`` "try again" after its retries."""
    r = own_server.client()
    GroupCoordinator(r, CoordinatorConfig(namespace=namespace)).start()
    Topics(r, namespace).create("t", 1)
    consumer = Consumer(ConsumerGroupConfig(group_id="g", topics=[], redis_client=r,
                                            namespace=namespace, **SHORT),
                        enable_auto_commit=False)
    try:
        consumer.assign([TopicPartition("t", 0)])
        r.execute_command("REPLICAOF", "127.0.0.1", refused_port)
        with pytest.raises(ReadOnlyReplicaError, match="give it the URL of the master") as got:
            consumer.commit({TopicPartition("t", 0): 0})
        assert "commit_offsets for 300 ms" in str(got.value)
    finally:
        consumer.close(timeout=WAIT_S)
        r.execute_command("REPLICAOF", "NO", "ONE")
        r.close()


def test_poll_returns_within_its_timeout_while_the_start_waits_on_redis(
        refused_port: int, namespace: str) -> None:
    """The coordinator's start is a call on the user's client, whose own retries (redis-py's
    default: three, backing off up to seconds) made ``poll(timeout=0.2)`` with Redis
    unreachable take about 4 s, every call. Here the client's retry waits until released:
    poll() returned only then; now it returns within its timeout, the start going on, and
    close(timeout) waits for that start only within its own timeout."""
    import threading

    from redis.backoff import NoBackoff
    from redis.retry import Retry

    released = threading.Event()

    class HeldRetry(Retry):
        def call_with_retry(self, do: Any, fail: Any, *args: Any, **kwargs: Any) -> Any:
            released.wait(WAIT_S)
            return super().call_with_retry(do, fail, *args, **kwargs)

    r = redis.Redis(port=refused_port, retry=HeldRetry(NoBackoff(), 0))
    consumer = Consumer(ConsumerGroupConfig(
        group_id="g", topics=["t"], redis_client=r, namespace=namespace, **SHORT))
    polled: list[object] = []

    def polls() -> None:
        polled.append(consumer.poll(timeout=0.05))
        polled.append(consumer.poll(timeout=0.05))  # (the same start, still held)
        consumer.close(timeout=0.05)
        polled.append("closed")

    poller = threading.Thread(target=polls, daemon=True)
    try:
        poller.start()
        wait_until(lambda: len(polled) == 3)
        assert polled == [[], [], "closed"]
    finally:
        released.set()
        poller.join(WAIT_S)
        consumer.close(timeout=WAIT_S)
        r.close()


@pytest.mark.parametrize("topics", [[], ["t"]], ids=["unsubscribed", "subscribed"])
def test_offset_queries_starting_on_a_replica_say_to_give_the_master(
        own_server: EmbeddedServer, namespace: str, refused_port: int,
        topics: list[str]) -> None:
    """Where no coordinator has stored the namespace's settings yet, the first offset query
    (or ``assign()``) is what starts the coordinator, which the replica refuses: the start was
    made outside the query's retries and raised ``ServerUnavailable`` "start: Redis cannot run
    this now; try again" at once."""
    with own_server.client() as client:
        Topics(client, namespace).create("t", 1)
        client.execute_command("REPLICAOF", "127.0.0.1", refused_port)
    r = own_server.client()
    consumer = Consumer(ConsumerGroupConfig(group_id="g", topics=topics, redis_client=r,
                                            namespace=namespace, **SHORT))
    try:
        with pytest.raises(ReadOnlyReplicaError, match="give it the URL of the master") as got:
            consumer.committed([TopicPartition("t", 0)], timeout=0.1)
        assert isinstance(got.value.__cause__, redis.exceptions.ReadOnlyError)
        if not topics:
            with pytest.raises(ReadOnlyReplicaError, match="to start for 300 ms"):
                consumer.assign([TopicPartition("t", 0)])
    finally:
        consumer.close(timeout=WAIT_S)
        r.close()


@pytest.mark.parametrize("start_fails", [False, True], ids=["answered", "failed"])
def test_a_close_during_a_polls_start_leaves_no_connection_open(
        own_server: EmbeddedServer, namespace: str, monkeypatch: pytest.MonkeyPatch,
        start_fails: bool) -> None:
    """close() while the coordinator's start that a ``next(timeout)`` gave up waiting for is
    still running: close() closed the client made from ``redis_url`` as it found it, and the
    start, going on on that client, connected it again; neither an answered nor a failed start
    closed it then, so the closed group kept a connection open for as long as it lived."""
    import threading

    from rcoord.errors import ConnectionLost

    held, ended = threading.Event(), threading.Event()
    original = RedisCoordinator.start

    def start(self: RedisCoordinator) -> None:
        try:
            held.wait(WAIT_S)
            original(self)
            if start_fails:
                raise ConnectionLost("start: Redis went away (test)")
        finally:
            ended.set()

    monkeypatch.setattr(RedisCoordinator, "start", start)
    group = ConsumerGroup(ConsumerGroupConfig(
        group_id="g", topics=["t"], redis_url=own_server.url, namespace=namespace, **SHORT))
    with own_server.client() as checker:
        mine = checker.client_id()

        def others() -> int:
            return sum(1 for c in checker.client_list() if int(c["id"]) != mine)

        try:
            with pytest.raises(TimeoutError, match="has not ended yet"):
                group.next(timeout=0.05)
            group.close(timeout=0.05)  # (it waits for the start within its timeout only)
        finally:
            held.set()
        assert ended.wait(WAIT_S)
        wait_until(lambda: others() == 0, why=lambda: checker.client_list())


def test_a_refused_start_is_made_again_after_retry_backoff_not_at_once(
        own_server: EmbeddedServer, namespace: str, refused_port: int,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A replica of a namespace without settings refuses the coordinator's start at once
    (READONLY). ``poll(timeout)`` calls ``next()`` until its timeout, and each call made the
    start again at once, on a thread of its own: hundreds of starts in a 0.3 s poll. Now a
    failed start is made again after ``retry_backoff_ms`` (Kafka's consumer waits as long
    between coordinator lookups): at most one per 100 ms here, plus the first."""
    with own_server.client() as client:
        Topics(client, namespace).create("t", 1)
        client.execute_command("REPLICAOF", "127.0.0.1", refused_port)
    starts: list[object] = []
    original = RedisCoordinator.start

    def start(self: RedisCoordinator) -> None:
        starts.append(self)
        original(self)

    monkeypatch.setattr(RedisCoordinator, "start", start)
    r = own_server.client()
    consumer = Consumer(ConsumerGroupConfig(
        group_id="g", topics=["t"], redis_client=r, namespace=namespace,
        **dict(SHORT, session_timeout_ms=30000, retry_backoff_ms=100,
               retry_backoff_max_ms=100)))
    try:
        assert consumer.poll(timeout=0.3) == []
        assert 1 <= len(starts) <= 5
    finally:
        consumer.close(timeout=WAIT_S)
        r.close()


def test_a_redis_url_that_cannot_be_reached_is_logged_while_polling(
        refused_port: int, namespace: str, caplog: pytest.LogCaptureFixture) -> None:
    """The group connects to ``redis_url`` as its coordinator's start begins; a failure there
    (Redis down, a wrong port) was raised past ``_refused_at_start``, and ``poll()`` takes a
    ``ConnectionLost`` for "no records yet", so a consumer polled for ever with not one line
    logged, where one given a client for the same address says why at once."""
    caplog.set_level(logging.WARNING, "rcoord")
    consumer = Consumer(ConsumerGroupConfig(
        group_id="g", topics=["t"], redis_url=f"redis://127.0.0.1:{refused_port}",
        namespace=namespace, **SHORT))
    try:
        wait_until(lambda: any("Connection refused" in r.getMessage() for r in caplog.records),
                   step=lambda: consumer.poll(timeout=0.1))
    finally:
        consumer.close(timeout=WAIT_S)
