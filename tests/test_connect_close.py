"""rcoord.connect: closing a client, or failing to connect, leaves no connection open.

The check is the server's own ``CLIENT LIST`` on every node: each test names its connections
(``client_name``) or uses a user of its own, so what remains open after ``close()`` is seen
whether or not the garbage collector would have shut it later. The ResourceWarning check after
``gc.collect()`` is the symptom pytest reported; it cannot fail on its own (redis-py's
``Connection.__del__`` usually shuts the socket before the socket's finalizer would warn), which
is why the server is asked.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
import redis
import redis.cluster
from harness import socket_warnings_on_collect

from rcoord.connect import ClusterClient, connect
from rcoord.errors import MissingPermissionError

CLOSE_WAIT_S = 5.0
"""How long the server may take to notice a closed socket (it is at once on loopback)."""


@pytest.fixture
def admin(request: pytest.FixtureRequest, backend: str) -> Iterator[tuple[str, list[redis.Redis]]]:
    """The URL of the backend's server and one plain client per node (closed afterwards)."""
    if backend == "single":
        server = request.getfixturevalue("redis_server")
        url, nodes = server.url, [server.client()]
    else:
        cluster = request.getfixturevalue("redis_cluster")
        url, nodes = cluster.url, cluster.node_clients()
    try:
        yield url, nodes
    finally:
        for node in nodes:
            node.close()


def _open(nodes: list[redis.Redis], field: str, value: str) -> list[str]:
    """``addr`` of each connection, on any node, whose CLIENT LIST ``field`` is ``value``."""
    return [f"{c['addr']} -> {c['laddr']}" for node in nodes for c in node.client_list()
            if c.get(field) == value]


def _addresses(nodes: list[redis.Redis], field: str, value: str) -> set[str]:
    """The client-side address ("host:port") of each connection ``_open`` reports."""
    return {c["addr"] for node in nodes for c in node.client_list() if c.get(field) == value}


def _open_after_wait(nodes: list[redis.Redis], field: str, value: str) -> list[str]:
    """What ``_open`` still reports once every connection closed, or ``CLOSE_WAIT_S`` passed."""
    deadline = time.monotonic() + CLOSE_WAIT_S
    while (left := _open(nodes, field, value)) and time.monotonic() < deadline:
        time.sleep(0.01)
    return left


def test_close_leaves_no_connection_open(admin: tuple[str, list[redis.Redis]],
                                         backend: str) -> None:
    """``connect`` then ``close``: the probe and every node connection are shut by ``close``.

    On a cluster, redis-py's own ``RedisCluster.close()`` leaves the node sockets open (the
    nodes of a URL-made cluster do not own their pools); ``ClusterClient.close()`` shuts them."""
    url, nodes = admin
    name = f"close-{uuid.uuid4().hex[:8]}"
    client = connect(url, client_name=name)
    if backend == "cluster":
        assert isinstance(client, ClusterClient)
        client.ping(target_nodes=redis.cluster.RedisCluster.ALL_NODES)  # a socket on each node
    client.set(f"{name}:k", b"v")
    assert client.get(f"{name}:k") == b"v"
    client.delete(f"{name}:k")
    ours = _addresses(nodes, "name", name)
    assert len(ours) >= len(nodes)  # the check sees them while open
    client.close()
    assert _open_after_wait(nodes, "name", name) == []
    del client
    assert socket_warnings_on_collect(ours) == []


@pytest.mark.parametrize("backend", ["cluster"])
@pytest.mark.parametrize("refused", ["cluster|slots", "command"])
def test_a_refused_cluster_start_leaves_no_connection_open(
        admin: tuple[str, list[redis.Redis]], refused: str) -> None:
    """A user refused what RedisCluster runs on start: ``connect`` raises and has shut the probe
    and the sockets redis-py opened before failing, while the error (whose traceback holds the
    half-made client) is still alive, as it is for a caller that logs it."""
    url, nodes = admin
    user, password = f"u-close-{uuid.uuid4().hex[:6]}", "pw-close"
    for node in nodes:
        node.execute_command("ACL", "SETUSER", user, "on", f">{password}", "~*", "&*",
                             "+@all", f"-{refused}")
    node_addresses = {f"{n.connection_pool.connection_kwargs['host']}:"
                      f"{n.connection_pool.connection_kwargs['port']}" for n in nodes}
    socket_warnings_on_collect()  # what earlier tests left: not this test's to judge
    try:
        command = refused.upper().replace("|", " ")
        with pytest.raises(MissingPermissionError, match=f"may not run {command},") as err:
            connect(url.replace("redis://", f"redis://{user}:{password}@"))
        assert _open_after_wait(nodes, "user", user) == []
        del err
        assert socket_warnings_on_collect(node_addresses) == []
    finally:
        for node in nodes:
            node.execute_command("ACL", "DELUSER", user)

