"""A login Redis refuses (a wrong password or user, a password rotated under a running group)
is ``AuthenticationFailedError``: fatal, with a message that says what to check.

redis-py makes its ``AuthenticationError`` a ``ConnectionError``, so it used to come out as
``ConnectionLost``, whose documented reaction is to back off and call again: a group started
with a wrong password raised a type that invites a retry, and a running group whose password
was rotated rejoined for ever, with only a warning per round. Kafka's consumer raises
``AuthenticationException`` from ``poll()``; the group closes on it here too.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from harness import WAIT_S

from rcoord import (
    AuthenticationFailedError,
    ConnectionLost,
    ConsumerGroup,
    ConsumerGroupConfig,
    CoordinatorConfig,
    GroupCoordinator,
)
from rcoord.client.policy import reaction_for
from rcoord.testing.embedded import EmbeddedServer
from rcoord.topics import Topics

PASSWORD = "old-pw"


@pytest.fixture
def locked_server() -> Iterator[tuple[EmbeddedServer, Any]]:
    """A server of its own with ``requirepass``, and an admin connection made before it (which
    stays logged in), the namespace's settings written and topic ``t`` created."""
    server = EmbeddedServer().start()
    admin = server.client()
    try:
        admin.config_set("requirepass", PASSWORD)
        GroupCoordinator(admin, CoordinatorConfig(
            namespace="auth", group_min_session_timeout_ms=10,
            group_initial_rebalance_delay_ms=0)).start()
        Topics(admin, "auth").create("t", 1)
        yield server, admin
    finally:
        admin.close()
        server.stop()


def _config(url: str) -> ConsumerGroupConfig:
    return ConsumerGroupConfig(group_id="g", topics=["t"], redis_url=url, namespace="auth",
                               heartbeat_interval_ms=50, session_timeout_ms=2000,
                               join_backoff_ms=50, retry_backoff_ms=10,
                               retry_backoff_max_ms=50)


def test_a_wrong_password_at_start_is_fatal_and_names_the_url(
        locked_server: tuple[EmbeddedServer, Any]) -> None:
    server, _ = locked_server
    url = f"redis://default:nope@127.0.0.1:{server.port}"
    group = ConsumerGroup(_config(url))
    with pytest.raises(AuthenticationFailedError) as raised:
        group.start()
    text = str(raised.value)
    assert not isinstance(raised.value, ConnectionLost)
    assert reaction_for(raised.value).fatal
    assert f"redis://default:***@127.0.0.1:{server.port}" in text and "nope" not in text
    assert "refused the login" in text and "check the user and password" in text
    group.close(timeout=WAIT_S)


def test_a_running_group_whose_password_is_rotated_closes_with_the_error(
        locked_server: tuple[EmbeddedServer, Any]) -> None:
    server, admin = locked_server
    group = ConsumerGroup(_config(f"redis://default:{PASSWORD}@127.0.0.1:{server.port}"))
    try:
        gen = group.next(timeout=WAIT_S)
        admin.config_set("requirepass", "rotated")
        admin.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
        assert gen.done.wait(WAIT_S)
        with pytest.raises(AuthenticationFailedError, match="refused the login"):
            group.next(timeout=WAIT_S)
        with pytest.raises(AuthenticationFailedError):  # the group closed on it: every call
            group.next(timeout=WAIT_S)
    finally:
        group.close(timeout=WAIT_S)


def test_the_coordinators_and_topics_raise_it_too(
        locked_server: tuple[EmbeddedServer, Any]) -> None:
    """The one mapping (``rcoord.errors.reraise_as_rcoord``) serves every call: the blocking
    and asyncio coordinators, and Topics."""
    import asyncio

    import redis
    import redis.asyncio
    from redis.asyncio.retry import Retry as ARetry
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    from rcoord.asyncio import AsyncGroupCoordinator

    server, _ = locked_server
    # (no retries: redis-py's default retries a refused login as a ConnectionError, for 4 s)
    client = redis.Redis(host="127.0.0.1", port=server.port, password="nope",
                         retry=Retry(NoBackoff(), 0))
    try:
        with pytest.raises(AuthenticationFailedError, match="check the user and password"):
            GroupCoordinator(client, CoordinatorConfig(namespace="auth")).start()
        with pytest.raises(AuthenticationFailedError):
            Topics(client, "auth").list()
    finally:
        client.close()

    async def run() -> None:
        aclient = redis.asyncio.Redis(host="127.0.0.1", port=server.port, password="nope",
                                      retry=ARetry(NoBackoff(), 0))
        try:
            with pytest.raises(AuthenticationFailedError, match="refused the login"):
                await AsyncGroupCoordinator(aclient, "auth").start()
        finally:
            await aclient.aclose()

    asyncio.run(run())


def test_a_consumer_whose_password_is_rotated_raises_it_from_poll(
        locked_server: tuple[EmbeddedServer, Any]) -> None:
    from harness import wait_until

    from rcoord import Consumer

    server, admin = locked_server
    consumer = Consumer(_config(f"redis://default:{PASSWORD}@127.0.0.1:{server.port}"))
    raised: list[BaseException] = []

    def step() -> None:
        try:
            consumer.poll(timeout=0.05)
        except Exception as exc:  # noqa: BLE001 - what poll() raises is the test's subject
            raised.append(exc)

    try:
        wait_until(lambda: bool(consumer.assignment()), step)
        admin.config_set("requirepass", "rotated")
        admin.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
        wait_until(lambda: len(raised) >= 3, step)  # the group closed on it: every poll()
        assert all(isinstance(e, AuthenticationFailedError) for e in raised), raised
    finally:
        consumer.close(timeout=WAIT_S)


def test_a_url_without_a_password_for_a_server_that_needs_one_says_so(
        locked_server: tuple[EmbeddedServer, Any]) -> None:
    """The server's words for a login without credentials are about its HELLO command
    ("HELLO must be called with the client already authenticated, otherwise the HELLO <proto>
    AUTH <user> <pass> option can be used ..."), which tells an operator nothing about the URL;
    the message says that the URL gives no password where the server needs one."""
    server, _ = locked_server
    group = ConsumerGroup(_config(f"redis://127.0.0.1:{server.port}"))
    with pytest.raises(AuthenticationFailedError) as raised:
        group.start()
    text = str(raised.value)
    assert "needs a password and the URL gives none" in text
    assert "HELLO" not in text
    group.close(timeout=WAIT_S)
