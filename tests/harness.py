"""A scenario harness in the spirit of Kafka's GroupMetadataManagerTestContext.

Members are threads; time is a MockTime that only moves when the test calls ``sleep``; parked
calls are futures the test waits on explicitly (with a bounded timeout), never a sleep-and-hope.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import gc
import logging
import re
import signal
import subprocess
import sys
import threading
import warnings
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from rcoord import Errors, GroupCoordinator, JoinGroupResult, MockTime, SyncGroupResult
from rcoord.keys import GroupKeys

WAIT_S = 15.0
PROTOCOLS: list[tuple[str, bytes]] = [("range", b"range-meta")]


@dataclass
class Ctx:
    coord: GroupCoordinator
    clock: MockTime | None
    pool: concurrent.futures.ThreadPoolExecutor
    group_id: str = "group-id"
    protocol_type: str = "consumer"
    session_timeout_ms: int = 5000
    rebalance_timeout_ms: int = 10000
    defaults: dict[str, Any] = field(default_factory=dict)

    # -- requests -----------------------------------------------------------------------------

    def join_async(
        self,
        member_id: str = "",
        *,
        protocols: Sequence[tuple[str, bytes]] | None = None,
        **kw: Any,
    ) -> concurrent.futures.Future[JoinGroupResult]:
        args: dict[str, Any] = dict(
            protocol_type=self.protocol_type,
            protocols=list(protocols if protocols is not None else PROTOCOLS),
            session_timeout_ms=self.session_timeout_ms,
            rebalance_timeout_ms=self.rebalance_timeout_ms,
        )
        args.update(kw)
        group_id = args.pop("group_id", self.group_id)
        return self.pool.submit(self.coord.join_group, group_id, member_id, **args)

    def join(self, member_id: str = "", **kw: Any) -> JoinGroupResult:
        return self.join_async(member_id, **kw).result(WAIT_S)

    def new_member_id(self, **kw: Any) -> str:
        """KIP-394 first round: ask for an id."""
        res = self.join(**kw)
        assert res.error == Errors.MEMBER_ID_REQUIRED, res
        return res.member_id

    def sync_async(
        self, member_id: str, generation_id: int, assignments: dict[str, bytes] | None = None, **kw: Any
    ) -> concurrent.futures.Future[SyncGroupResult]:
        group_id = kw.pop("group_id", self.group_id)
        return self.pool.submit(
            self.coord.sync_group, group_id, generation_id, member_id, assignments=assignments, **kw
        )

    def sync(self, member_id: str, generation_id: int, assignments: dict[str, bytes] | None = None, **kw: Any) -> SyncGroupResult:
        return self.sync_async(member_id, generation_id, assignments, **kw).result(WAIT_S)

    def heartbeat(self, member_id: str, generation_id: int, **kw: Any) -> Errors:
        return self.coord.heartbeat(self.group_id, generation_id, member_id, **kw)

    # -- time and inspection -----------------------------------------------------------------

    def sleep(self, ms: int) -> int:
        """Advance the mock clock and let every passed deadline act."""
        assert self.clock is not None, "sleep needs a MockTime"
        self.clock.sleep(ms)
        return self.coord.run_timers()

    def state(self) -> str:
        keys = self._keys()
        raw = self.coord._redis.hget(keys.group, "state")
        return raw.decode() if raw else "Dead"

    def group_field(self, name: str) -> str | None:
        raw = self.coord._redis.hget(self._keys().group, name)
        return raw.decode() if raw else None

    def member_ids(self) -> set[str]:
        return {k.decode() for k in self.coord._redis.hkeys(self._keys().members)}

    def _keys(self) -> GroupKeys:
        cfg = self.coord.config
        return GroupKeys.of(cfg.namespace, cfg.num_partitions, self.group_id)

    # -- composite steps ---------------------------------------------------------------------

    def settle(self, futures: Sequence[concurrent.futures.Future[Any]], step_ms: int = 100) -> list[Any]:
        """Advance mock time in small steps until every parked call has its reply."""
        wait_until(lambda: all(f.done() for f in futures), lambda: self.sleep(step_ms))
        return [f.result(WAIT_S) for f in futures]

    def parked(self) -> int:
        """Members with a parked JoinGroup."""
        return int(self.coord._redis.hlen(self._keys().joining))

    def awaiting_sync(self, member_id: str) -> bool:
        """Whether ``member_id`` has a parked SyncGroup (its record's ``as`` flag)."""
        import msgpack

        blob = self.coord._redis.hget(self._keys().members, member_id)
        return blob is not None and msgpack.unpackb(blob, raw=True)[b"as"] == 1

    def stable_group(self, n: int, **join_kw: Any) -> tuple[int, list[str]]:
        """Form a Stable group of ``n`` dynamic members; returns (generation, ids, leader first).

        With no initial delay the first member forms generation 1 alone and syncs; the others
        then join together with it, which completes once every pending member has joined.
        """
        ids = [self.new_member_id(**join_kw) for _ in range(n)]
        first = self.join_async(ids[0], **join_kw)
        if self.clock is not None:
            self.settle([first])
        r0 = first.result(WAIT_S)
        assert r0.error == Errors.NONE
        if n > 1:
            # Stable first, so the leader's rejoin below always starts a new rebalance.
            assert self.sync(ids[0], r0.generation_id, {ids[0]: b""}).error == Errors.NONE
        futures = [self.join_async(i, **join_kw) for i in ids] if n > 1 else [first]
        results = [f.result(WAIT_S) for f in futures]
        assert all(r.error == Errors.NONE for r in results), results
        generation = results[0].generation_id
        assert {r.generation_id for r in results} == {generation}
        leader = results[0].leader_id
        syncs = [
            self.sync_async(i, generation, {m: m.encode() for m in ids} if i == leader else None)
            for i in ids
        ]
        for s in syncs:
            assert s.result(WAIT_S).error == Errors.NONE
        assert self.state() == "Stable"
        ordered = [leader] + [i for i in ids if i != leader]
        return generation, ordered


class RawGroup:
    """One group's library functions called one at a time at explicit times (no parking), as
    the tests that look at a step's single calls need them."""

    def __init__(self, coord: GroupCoordinator, group_id: str) -> None:
        self.coord, self.r, self.group_id = coord, coord._redis, group_id
        self.keys = coord._keys(group_id)

    def call_once(self, step: str, now: int, *args: Any) -> Any:
        return self.coord._scripts.call(step, self.keys.all(), [str(now), self.group_id, *args])

    def call(self, step: str, now: int, *args: Any) -> Any:
        """Sent again while it answers BUSY, as rcoord.steps does (each such call wrote a
        chunk or applied due deadlines)."""
        for _ in range(1000):
            reply = self.call_once(step, now, *args)
            if reply != [b"B"]:
                return reply
        raise AssertionError(f"{step} stayed BUSY")

    def field(self, name: str) -> str | None:
        raw = self.r.hget(self.keys.group, name)
        return raw.decode() if raw is not None else None


def without_join_delay(client: Any, namespace: str) -> None:
    """Store ``namespace``'s group settings with no initial rebalance delay: a group's first
    join then completes at once instead of after the 3 s default (Kafka's
    group.initial.rebalance.delay.ms), for tests whose members join one at a time."""
    from rcoord import CoordinatorConfig, GroupCoordinator

    GroupCoordinator(client, CoordinatorConfig(namespace=namespace,
                                               group_initial_rebalance_delay_ms=0)).start()


@contextlib.contextmanager
def output_lines(proc: subprocess.Popen[str], stop_timeout_s: float = 60) -> Iterator[list[str]]:
    """The lines a child process writes to its stdout and stderr, collected as they come (tests
    wait on them). On leaving, a child still running is stopped as an operator would stop it
    (SIGTERM, killed only if it has not ended within ``stop_timeout_s``), and both streams are
    drained, so its last lines are in the list."""
    lines: list[str] = []

    def read(stream: Any) -> None:
        for line in stream:
            lines.append(line)  # noqa: PERF402 - line by line: the test waits on them

    readers = [threading.Thread(target=read, args=(s,), daemon=True)
               for s in (proc.stdout, proc.stderr)]
    for reader in readers:
        reader.start()
    try:
        yield lines
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=stop_timeout_s)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        for reader in readers:
            reader.join(timeout=10)


def wait_until(cond: Any, step: Any = None, timeout_s: float = WAIT_S,
               why: Any = None) -> None:
    """Poll ``cond`` (running ``step`` between polls) until it holds; fail after ``timeout_s``,
    with what ``why()`` returns (if given) in the message: what a rare failure needs to be
    understood (a process's log, its threads' stacks), gathered only then."""
    import time

    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time"
                                 + ("" if why is None else f"\n{why()}"))
        if step is not None:
            step()
        time.sleep(0.01)


class InThread:
    """``call`` run on a daemon thread of its own, started at once; ``outcome`` holds what it
    returned or raised once it ended, for the test to look at (a call blocked on a server the
    test stopped, which another thread must wake)."""

    def __init__(self, call: Any) -> None:
        import threading

        self.outcome: list[Any] = []
        self.thread = threading.Thread(target=self._run, args=(call,), daemon=True)
        self.thread.start()

    def _run(self, call: Any) -> None:
        try:
            self.outcome.append(call())
        except BaseException as exc:  # noqa: BLE001 - the test looks at it
            self.outcome.append(exc)


async def await_until(cond: Any, what: str = "condition", timeout_s: float = WAIT_S) -> None:
    """``wait_until`` on an event loop: let the loop run until ``cond()`` holds; fail after
    ``timeout_s`` (loop time) with ``what`` in the message."""
    import asyncio

    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not cond():
        assert loop.time() < deadline, f"not reached in time: {what}"
        await asyncio.sleep(0.01)


@contextlib.contextmanager
def socket_warnings() -> Iterator[list[str]]:
    """Yield a list that fills with every unclosed-socket ResourceWarning, or unraisable naming
    a socket, raised inside the block (by a finalizer or a collection) instead of raising them."""
    found: list[str] = []
    unraisable: list[str] = []
    previous = sys.unraisablehook
    sys.unraisablehook = lambda u: unraisable.append(f"{u.exc_value!r} in {u.object!r}")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ResourceWarning)
            yield found
    finally:
        sys.unraisablehook = previous
        found += [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
        found += [u for u in unraisable if "socket" in u]


def blocked_xreads(client: Any, name: str | None = None) -> int:
    """How many connections of ``client``'s server are blocked in an XREAD now (only those
    whose ``client_name`` is ``name``, if given: not another test's on a shared server)."""
    return sum(1 for c in client.client_list()
               if c.get("cmd") == "xread" and "b" in c.get("flags", "")
               and (name is None or c.get("name") == name))


_ADDRESS = re.compile(r"[lr]addr=\('([^']*)', (\d+)\)")


def socket_warnings_on_collect(addresses: Collection[str] | None = None) -> list[str]:
    """Collect garbage; return every unclosed-socket ResourceWarning or unraisable it caused.

    ``addresses`` ("host:port" each) keeps only the sockets bound or connected to one of them: a
    test judging its own connections, not a socket an earlier test in this process left to the
    collector (a Kafka client's, let go by tests/gateway_harness.py, failed
    tests/test_connect_close.py in CI with a socket to a port that test never used)."""
    with socket_warnings() as found:
        gc.collect()
    if addresses is None:
        return found
    return [w for w in found
            if any(f"{m[1]}:{m[2]}" in addresses for m in _ADDRESS.finditer(w))]


def prepare_spark_env(root: Any) -> None:
    """What a local SparkSession's Python workers need before it starts: this interpreter,
    loopback, and this checkout (``root``: rcoord and workers/) importable."""
    import os

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    path = os.environ.get("PYTHONPATH", "")
    if str(root) not in path.split(os.pathsep):
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), path) if p)


def drive_by_hand(flow: Any, answer: Any) -> Any:
    """Run a step's flow (``rcoord.flow``) with ``answer(op)`` as its driver: each operation's
    result sent back, a Redis error ``answer`` raises thrown into the flow, as the drivers do;
    the flow's value. Lets a test script what Redis answers, call by call, with no server."""
    import redis.exceptions

    op = next(flow)
    try:
        while True:
            try:
                result = answer(op)
            except redis.exceptions.RedisError as exc:
                op = flow.throw(exc)
            else:
                op = flow.send(result)
    except StopIteration as done:
        return done.value


def server_ms(client: Any) -> int:
    """Redis ``TIME`` in milliseconds (any node of a cluster: the tests' nodes share a clock)."""
    reply = client.time()
    if isinstance(reply, dict):  # a RedisCluster answers per node
        reply = next(iter(reply.values()))
    sec, usec = reply
    return int(sec) * 1000 + int(usec) // 1000


def wait_for_the_next_ms(client: Any, after_ms: int) -> None:
    """Wait until the server clock is past ``after_ms`` (a commit in the millisecond of a
    topic's creation counts as one made to an earlier topic of that name)."""
    wait_until(lambda: server_ms(client) > after_ms)


def this_threads(records: Sequence[logging.LogRecord]) -> list[logging.LogRecord]:
    """Those of ``records`` logged on the calling thread: what a test's own synchronous calls
    logged, not a record of another test's thread still running in this process (``caplog``
    collects every thread's, and an exact list or count of them failed on such a leftover)."""
    import threading

    me = threading.get_ident()
    return [r for r in records if r.thread == me]


H = TypeVar("H", bound=logging.Handler)


@contextlib.contextmanager
def handling(handler: H, logger: str, level: int) -> Iterator[H]:
    """``handler`` on the logger named ``logger``, set to ``level``, for the block; both undone
    after it."""
    log = logging.getLogger(logger)
    old = log.level
    log.addHandler(handler)
    log.setLevel(level)
    try:
        yield handler
    finally:
        log.removeHandler(handler)
        log.setLevel(old)


class EventLog(logging.Handler):
    """The ``event`` field of every log record it is given, in order (rcoord's logs name what
    happened there: ``loop_error``, ``coordinator_id_taken`` ...); use with ``handling``."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.seen.append(str(getattr(record, "event", "")))

    def count(self, event: str) -> int:
        return self.seen.count(event)


class RunningService:
    """One in-process coordinator service (``CoordinatorService``) whose timer loop runs on a
    thread, as the CLI runs it; ``sigterm`` does what the CLI does on SIGTERM."""

    def __init__(self, url: str, namespace: str, *, ttl_ms: int, stop_wait_s: float,
                 settings: dict[str, int]) -> None:
        import threading

        from rcoord.service.service import CoordinatorService, ServiceConfig

        self.svc = CoordinatorService(ServiceConfig(
            redis_url=url, namespace=namespace, lease_ttl_ms=ttl_ms, coordinator_id="c1",
            retention_check_interval_ms=0, settings=settings)).start()
        self.stop_wait_s = stop_wait_s
        self.loop = threading.Thread(target=self.svc.run, daemon=True)
        self.loop.start()
        self.stopper: threading.Thread | None = None

    def sigterm(self, wait_s: float | None = None) -> bool:
        """The stop flag (the CLI's signal handler), then ``stop()`` once ``run()`` returned;
        whether it all ended within ``wait_s`` (``stop_wait_s`` unless given)."""
        import threading

        if self.stopper is None:
            self.stopper = threading.Thread(target=self._stop, daemon=True)
            self.stopper.start()
        self.stopper.join(self.stop_wait_s if wait_s is None else wait_s)
        return not self.stopper.is_alive()

    def _stop(self) -> None:
        self.svc._stop.set()
        self.loop.join()
        self.svc.stop()


@contextlib.contextmanager
def partial_coverage_cluster() -> Iterator[Any]:
    """A 3-master ``EmbeddedCluster`` that needs no full slot coverage, so its other masters go
    on serving while one is down; a node a test stopped (SIGSTOP) is continued before the
    cluster stops."""
    import os
    import signal

    from rcoord.testing.embedded import EmbeddedCluster

    cl = EmbeddedCluster(masters=3, extra_args=["--cluster-require-full-coverage", "no"]).start()
    try:
        yield cl
    finally:
        for node in cl.nodes:
            if node.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(node.pid, signal.SIGCONT)
        cl.stop()
