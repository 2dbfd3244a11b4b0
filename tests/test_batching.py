"""The threads of one blocking coordinator send the calls they make at the same moment in one
pipeline (rcoord.batching): a lone call goes by itself, calls made while a batch is in flight go
together in the next, and every thread gets its own reply or error."""

from __future__ import annotations

import concurrent.futures as cf
import signal
import threading
import uuid
from typing import Any

import pytest
import redis
from harness import wait_until

from rcoord.batching import SharedCalls

WAIT_S = 30


class GatedClient:
    """The test's client: single commands wait for ``gate`` (so a batch stays in flight while
    others queue), and every pipeline's commands are recorded."""

    def __init__(self, client: Any, *, fail_pipelines: BaseException | None = None) -> None:
        self.client = client
        self.gate = threading.Event()
        self.singles: list[tuple[Any, ...]] = []
        self.pipelines: list[list[tuple[Any, ...]]] = []
        self.fail_pipelines = fail_pipelines

    def execute_command(self, *args: Any) -> Any:
        self.singles.append(args)
        assert self.gate.wait(WAIT_S)
        return self.client.execute_command(*args)

    def pipeline(self, transaction: bool = True) -> Any:
        outer = self

        class Recorded:
            def __init__(self) -> None:
                self.inner = outer.client.pipeline(transaction=transaction)
                self.commands: list[tuple[Any, ...]] = []

            def execute_command(self, *args: Any) -> None:
                self.commands.append(args)
                self.inner.execute_command(*args)

            def execute(self, raise_on_error: bool = True) -> list[Any]:
                outer.pipelines.append(self.commands)
                if outer.fail_pipelines is not None:
                    raise outer.fail_pipelines
                return self.inner.execute(raise_on_error=raise_on_error)

        return Recorded()


@pytest.fixture
def key(redis_client: Any) -> Any:
    name = f"batch-{uuid.uuid4().hex[:8]}"
    yield name
    redis_client.delete(name, f"{name}:bad")


def _hold_one_in_flight(shared: SharedCalls, gated: GatedClient, pool: Any, key: str) -> Any:
    """Start one call that stays in flight until the gate opens; return its future."""
    first = pool.submit(shared.execute, gated, ("INCRBY", key, 1000))
    wait_until(lambda: len(gated.singles) == 1)
    return first


def test_a_lone_call_is_sent_by_itself(redis_client, key):
    gated = GatedClient(redis_client)
    gated.gate.set()
    assert SharedCalls().execute(gated, ("INCRBY", key, 5)) == 5
    assert gated.singles == [("INCRBY", key, 5)]
    assert gated.pipelines == []


def test_calls_made_during_a_batch_go_together_and_each_gets_its_own_reply(redis_client, key):
    shared, gated = SharedCalls(), GatedClient(redis_client)
    with cf.ThreadPoolExecutor(9) as pool:
        first = _hold_one_in_flight(shared, gated, pool, key)
        others = {i: pool.submit(shared.execute, gated, ("ECHO", f"reply {i}")) for i in range(8)}
        wait_until(lambda: shared.queued() == 8)
        assert not any(f.done() for f in others.values())
        gated.gate.set()
        assert first.result(WAIT_S) == 1000
        assert {i: f.result(WAIT_S) for i, f in others.items()} == \
            {i: f"reply {i}".encode() for i in range(8)}
    assert len(gated.singles) == 1  # the first call, alone
    assert len(gated.pipelines) == 1 and len(gated.pipelines[0]) == 8  # the rest, together
    assert shared.queued() == 0


def test_an_error_reply_reaches_only_its_caller(redis_client, key):
    shared, gated = SharedCalls(), GatedClient(redis_client)
    redis_client.set(f"{key}:bad", "not a number")
    with cf.ThreadPoolExecutor(4) as pool:
        first = _hold_one_in_flight(shared, gated, pool, key)
        bad = pool.submit(shared.execute, gated, ("INCR", f"{key}:bad"))
        good = [pool.submit(shared.execute, gated, ("INCRBY", key, 1)) for _ in range(2)]
        wait_until(lambda: shared.queued() == 3)
        gated.gate.set()
        first.result(WAIT_S)
        with pytest.raises(redis.ResponseError, match="not an integer"):
            bad.result(WAIT_S)
        assert sorted(f.result(WAIT_S) for f in good) == [1001, 1002]
    assert len(gated.pipelines) == 1


def test_a_failed_send_fails_every_call_of_its_batch_and_the_next_batch_still_goes(
        redis_client, key):
    shared = SharedCalls()
    gated = GatedClient(redis_client, fail_pipelines=redis.ConnectionError("link down"))
    with cf.ThreadPoolExecutor(4) as pool:
        first = _hold_one_in_flight(shared, gated, pool, key)
        batch = [pool.submit(shared.execute, gated, ("INCRBY", key, 1)) for _ in range(3)]
        wait_until(lambda: shared.queued() == 3)
        gated.gate.set()
        assert first.result(WAIT_S) == 1000
        for f in batch:
            with pytest.raises(redis.ConnectionError, match="link down"):
                f.result(WAIT_S)
    # Nothing is left in flight: the next call is sent.
    assert shared.execute(gated, ("INCRBY", key, 1)) == 1001


class Interrupted(BaseException):
    """Stands for a KeyboardInterrupt in the thread that sends a batch."""


def test_calls_of_an_interrupted_batch_fail_instead_of_returning_nothing(redis_client, key):
    shared = SharedCalls()
    gated = GatedClient(redis_client, fail_pipelines=Interrupted())
    with cf.ThreadPoolExecutor(4) as pool:
        first = _hold_one_in_flight(shared, gated, pool, key)
        batch = [pool.submit(shared.execute, gated, ("INCRBY", key, 1)) for _ in range(3)]
        wait_until(lambda: shared.queued() == 3)
        gated.gate.set()
        first.result(WAIT_S)
        outcomes = []
        for f in batch:
            try:
                outcomes.append(f.result(WAIT_S))
            except BaseException as exc:  # noqa: BLE001 - what each caller got is the point
                outcomes.append(type(exc))
    # The thread that sent the batch raises the interruption itself; the others learn that
    # their calls were not sent.
    assert sorted(o.__name__ for o in outcomes) == \
        ["ConnectionError", "ConnectionError", "Interrupted"]
    assert redis_client.get(key) == b"1000"
    assert shared.execute(gated, ("INCRBY", key, 1)) == 1001


def test_concurrent_join_groups_of_one_coordinator_share_a_pipeline(make_coordinator):
    # Eight members join through one coordinator while another call is in flight: their
    # JoinGroups reach the server in one pipeline, and each member gets its own answer.
    coord = make_coordinator(group_initial_rebalance_delay_ms=0)
    join = {"protocol_type": "consumer", "protocols": [("range", b"")],
            "session_timeout_ms": 30_000, "rebalance_timeout_ms": 30_000}
    gated = GatedClient(coord._redis)
    coord._redis = coord._scripts._client = gated  # this test's own coordinator
    with cf.ThreadPoolExecutor(9) as pool:
        first = pool.submit(coord.join_group, "other", **join)
        wait_until(lambda: len(gated.singles) == 1)
        joins = [pool.submit(coord.join_group, "g", **join) for _ in range(8)]
        wait_until(lambda: coord._calls.queued() == 8)
        gated.gate.set()
        assert first.result(WAIT_S).error.name == "MEMBER_ID_REQUIRED"
        results = [f.result(WAIT_S) for f in joins]
    assert {r.error.name for r in results} == {"MEMBER_ID_REQUIRED"}
    assert len({r.member_id for r in results}) == 8
    assert [len(p) for p in gated.pipelines] == [8]
    assert all(c[0] == "FCALL" for c in gated.pipelines[0])


def test_a_caller_interrupted_while_it_waits_its_turn_does_not_stall_the_others(
        redis_client, key):
    # A thread waiting behind the batch in flight is interrupted (a signal handler raising, as
    # a KeyboardInterrupt or a SIGTERM handler's SystemExit does in the main thread) while the
    # turn to send the next batch is about to come to it. The turn must pass on: the call
    # queued behind it is sent, and so is every later call; the interrupted call is not sent.
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals reach the main thread only")
    shared, gated = SharedCalls(), GatedClient(redis_client)
    outcomes: dict[str, Any] = {}

    def call_in_thread(name: str, command: tuple[Any, ...]) -> None:
        # Daemon threads: a call left waiting for ever fails the test instead of hanging it.
        def run() -> None:
            outcomes[name] = shared.execute(gated, command)
        threading.Thread(target=run, daemon=True).start()

    def interrupt_main() -> None:
        wait_until(lambda: shared.queued() == 1)  # the main thread's call waits its turn
        call_in_thread("behind", ("INCRBY", key, 1))
        wait_until(lambda: shared.queued() == 2)
        signal.pthread_kill(threading.main_thread().ident, signal.SIGUSR1)  # type: ignore[arg-type]

    def raise_interrupted(signum: int, frame: Any) -> None:
        raise Interrupted()

    previous = signal.signal(signal.SIGUSR1, raise_interrupted)
    try:
        call_in_thread("first", ("INCRBY", key, 1000))
        wait_until(lambda: len(gated.singles) == 1)
        threading.Thread(target=interrupt_main, daemon=True).start()
        with pytest.raises(Interrupted):
            shared.execute(gated, ("INCRBY", key, 10))
    finally:
        signal.signal(signal.SIGUSR1, previous)
    gated.gate.set()
    wait_until(lambda: {"first", "behind"} <= outcomes.keys(), timeout_s=10)
    assert outcomes == {"first": 1000, "behind": 1001}
    call_in_thread("later", ("INCRBY", key, 1))
    wait_until(lambda: "later" in outcomes, timeout_s=10)
    assert outcomes["later"] == 1002  # the interrupted call was never sent
    assert shared.queued() == 0


class HeldCluster:
    """A cluster client whose single commands wait for ``gate`` (everything else is the
    client's own, so the batching sees a cluster)."""

    def __init__(self, client: Any) -> None:
        self.client, self.gate, self.singles = client, threading.Event(), 0
        self.counting = threading.Lock()  # calls for several lanes arrive at once

    def execute_command(self, *args: Any) -> Any:
        with self.counting:
            self.singles += 1
        assert self.gate.wait(WAIT_S)
        return self.client.execute_command(*args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)


def test_on_a_cluster_a_down_master_fails_only_the_calls_it_holds():
    # One master of a cluster is down. The calls for the healthy masters are in lanes of their
    # own (their slots): they are sent at once, not queued behind the batch for the dead master.
    # The dead master's calls, batched in its slot's lane, fail as a whole in redis-py's
    # pipeline and are sent again one by one, so each caller gets its own call's error.
    from rcoord.testing.embedded import EmbeddedCluster

    with EmbeddedCluster(masters=3).start() as cluster:
        client = cluster.client(socket_connect_timeout=2, socket_timeout=5)
        try:
            by_port: dict[int, str] = {}
            n = 0
            while len(by_port) < 3:
                by_port.setdefault(client.get_node_from_key(f"k{n}").port, f"k{n}")
                n += 1
            dead_port, *live_ports = by_port
            dead_key = by_port[dead_port]
            next(s for s in cluster.nodes if s.port == dead_port).stop()
            shared, held = SharedCalls(), HeldCluster(client)
            with cf.ThreadPoolExecutor(5) as pool:
                first = pool.submit(shared.execute, held, ("INCR", dead_key))
                wait_until(lambda: held.singles == 1)
                # The same slot (a hash tag): queued behind the first call.
                dead = [pool.submit(shared.execute, held, ("INCR", f"{{{dead_key}}}:{i}"))
                        for i in range(2)]
                wait_until(lambda: shared.queued() == 2)
                live = [pool.submit(shared.execute, held, ("INCR", by_port[p])) for p in live_ports]
                wait_until(lambda: held.singles == 3)  # each sent by itself, none queued
                assert shared.queued() == 2
                held.gate.set()
                assert [f.result(WAIT_S) for f in live] == [1, 1]
                for f in [first, *dead]:
                    with pytest.raises(redis.ConnectionError):
                        f.result(WAIT_S)
            assert held.singles == 5  # the failed batch's two calls, sent again alone
            assert shared.queued() == 0
            assert not shared._lanes  # an idle lane is dropped: the lanes do not pile up
        finally:
            client.close()


def test_a_forked_child_calls_though_a_parent_thread_held_the_lock_at_the_fork(
        redis_client: Any, key: str) -> None:
    """A parent thread inside one of its short queue updates when the process forked left the
    child a lock nobody would release: the child's first call waited for it for ever. The child
    now starts with a lock and queues of its own (an at-fork hook)."""
    import os

    shared = SharedCalls()
    with shared._lock:  # (as a parent thread holds it during a queue update)
        pid = os.fork()
        if pid == 0:  # the child: one call, then out, whatever happens
            code = 1
            try:
                done = threading.Event()

                def call() -> None:
                    if shared.execute(redis_client, ("INCRBY", key, 3)) == 3:
                        done.set()

                threading.Thread(target=call, daemon=True).start()
                code = 0 if done.wait(WAIT_S) else 2
            finally:
                os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0  # 2: the child's call never got the lock
    assert shared.execute(redis_client, ("INCRBY", key, 1)) == 4
