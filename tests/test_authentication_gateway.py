"""The gateway's own Redis login and permissions at start-up: a start Redis refuses (a wrong
password, a user without what the coordinator needs) is one clear error, and leaves nothing
open behind it.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from harness import wait_until

from rcoord import AuthenticationFailedError
from rcoord.errors import MissingPermissionError
from rcoord.gateway.server import Gateway
from rcoord.gateway.state import GatewayConfig
from rcoord.testing.embedded import EmbeddedServer


@pytest.fixture
def acl_user(own_server: EmbeddedServer) -> Iterator[tuple[EmbeddedServer, Any, str]]:
    """``own_server``, an admin connection, and an ACL user's name (password ``pw``)."""
    admin = own_server.client()
    name = "u" + uuid.uuid4().hex[:8]
    try:
        yield own_server, admin, name
    finally:
        admin.execute_command("ACL", "DELUSER", name)
        admin.close()


def _connections_of(admin: Any, user: str) -> list[Any]:
    return [c for c in admin.client_list() if c.get("user") == user]


def test_a_start_that_fails_closes_the_redis_connections_it_opened(
        acl_user: tuple[EmbeddedServer, Any, str]) -> None:
    """A user that may connect but not load the coordinator's library (no +function): the
    constructor connected both clients, ``start()`` failed, and ``async with`` runs no
    ``__aexit__`` after a failed ``__aenter__``: the sockets stayed open until garbage
    collection (a ResourceWarning each)."""
    server, admin, user = acl_user
    admin.execute_command("ACL", "SETUSER", user, "on", ">pw", "~*", "&*", "+@all",
                          "-function")
    url = f"redis://{user}:pw@127.0.0.1:{server.port}"
    gateway: list[Gateway] = []

    async def run() -> None:
        gw = Gateway(GatewayConfig(listen_port=0, namespace="gwauth"), url)
        gateway.append(gw)
        async with gw:
            raise AssertionError("the gateway started")

    with pytest.raises(MissingPermissionError, match="function"):
        asyncio.run(run())
    # (the gateway is still referenced: only a close, not garbage collection, ends them)
    wait_until(lambda: not _connections_of(admin, user))
    assert gateway


@pytest.mark.parametrize("login", ["default:nope@", ""])
def test_a_login_refused_at_start_is_authentication_failed_naming_the_url(
        acl_user: tuple[EmbeddedServer, Any, str], login: str) -> None:
    """A wrong password, or none where one is required: ``Gateway(...)`` raised redis-py's
    ``AuthenticationError``, naming no server, where a login refused at run time (and by every
    other rcoord client at start) is ``AuthenticationFailedError`` naming the URL."""
    server, admin, _ = acl_user
    admin.config_set("requirepass", "pw")
    try:
        url = f"redis://{login}127.0.0.1:{server.port}"
        with pytest.raises(AuthenticationFailedError) as raised:
            Gateway(GatewayConfig(listen_port=0, namespace="gwauth"), url)
        text = str(raised.value)
        assert "refused the login" in text and "check the user and password" in text
        assert f"Redis at redis://{login.replace('nope', '***')}127.0.0.1:{server.port}" in text
        assert "nope" not in text
    finally:
        admin.config_set("requirepass", "")
