"""Tests for rcoord.testing.embedded: real throw-away servers on 127.0.0.1."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from rcoord.testing import embedded
from rcoord.testing.embedded import (
    CLUSTER_SLOTS,
    ENV_SERVER_BINARY,
    EmbeddedCluster,
    EmbeddedServer,
    EmbeddedServerError,
    find_server_binary,
)


def _refuses(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return False
    except ConnectionRefusedError:
        return True


@pytest.fixture
def cluster(redis_cluster: EmbeddedCluster) -> EmbeddedCluster:
    """The session's 3-master cluster (conftest): these tests only read its topology and write
    keys of their own, so a second cluster of the same shape would only cost a start."""
    return redis_cluster


# --------------------------------------------------------------------------
# single server
# --------------------------------------------------------------------------


def test_server_set_get_eval_stop_restart() -> None:
    server = EmbeddedServer()
    with server:
        assert server.host == "127.0.0.1"
        assert server.url == f"redis://127.0.0.1:{server.port}/0"
        data_dir = server.data_dir
        assert data_dir is not None and data_dir.is_dir()

        client = server.client(decode_responses=True)
        try:
            assert client.set("k", "v") is True
            assert client.get("k") == "v"
            script = "return redis.call('INCRBY', KEYS[1], ARGV[1])"
            assert client.eval(script, 1, "counter", 5) == 5
            assert client.eval(script, 1, "counter", 2) == 7
            # Persistence is off, protected mode on, loopback only.
            assert client.config_get("save") == {"save": ""}
            assert client.config_get("appendonly") == {"appendonly": "no"}
            assert client.config_get("bind")["bind"] == "127.0.0.1"
        finally:
            client.close()

        port = server.port
        server.restart()
        assert server.port == port
        client = server.client()
        try:
            assert client.ping() is True
            assert client.get("k") is None  # data lost across restart
        finally:
            client.close()

    # Leaving the with-block stopped it: port refuses, temp dir removed.
    assert not server.is_running
    assert _refuses(port)
    assert not data_dir.exists()
    server.stop()  # idempotent


def test_stop_refuses_connections_then_start_again() -> None:
    server = EmbeddedServer().start()
    try:
        port = server.port
        server.stop()
        assert _refuses(port)
        with pytest.raises(redis.exceptions.ConnectionError):
            redis.Redis(
                host="127.0.0.1",
                port=port,
                socket_connect_timeout=1,
                retry=Retry(NoBackoff(), 0),
            ).ping()
        server.stop()  # idempotent
        # The same object can be started again (fresh temp dir and port).
        server.start()
        client = server.client()
        try:
            assert client.ping() is True
        finally:
            client.close()
    finally:
        server.stop()


def test_port_race_is_retried(monkeypatch) -> None:
    # Simulate losing the race for the chosen port: the first candidate is
    # already bound by someone else, so the server fails and start() retries.
    busy = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    busy_port = busy.getsockname()[1]
    real_pick = embedded._pick_free_port
    calls: list[int] = []

    def pick(**kw: bool) -> int:
        port = busy_port if not calls else real_pick(**kw)
        calls.append(port)
        return port

    monkeypatch.setattr(embedded, "_pick_free_port", pick)
    try:
        with EmbeddedServer() as server:
            assert len(calls) == 2 and server.port == calls[1] != busy_port
            client = server.client()
            try:
                assert client.ping() is True
            finally:
                client.close()
    finally:
        busy.close()


def test_fixed_busy_port_fails_fast() -> None:
    busy = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    try:
        port = busy.getsockname()[1]
        server = EmbeddedServer(port=port)
        with pytest.raises(EmbeddedServerError, match="in use"):
            server.start(timeout=5)
        assert not server.is_running
    finally:
        busy.close()


def test_atexit_stops_forgotten_servers(tmp_path) -> None:
    code = (
        "from rcoord.testing.embedded import EmbeddedServer\n"
        "s = EmbeddedServer().start()\n"
        "print(s.pid, s.port, s.data_dir, flush=True)\n"
    )
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (root, env.get("PYTHONPATH")) if p
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True,
        text=True, timeout=30, check=True,
    ).stdout.split()
    pid, port, data_dir = int(out[0]), int(out[1]), out[2]
    # The server was a child of the exited interpreter and must be gone.
    try:
        os.kill(pid, 0)
        alive = True
    except ProcessLookupError:
        alive = False
    assert not alive
    assert _refuses(port)
    assert not os.path.exists(data_dir)


def test_start_failure_raises_with_log_and_cleans_up(tmp_path) -> None:
    # A "server" that exits immediately: start() must raise, not hang.
    fake = tmp_path / "fake-server"
    fake.write_text("#!/bin/sh\necho 'fake server refusing to start'\nexit 3\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    server = EmbeddedServer(str(fake))
    with pytest.raises(EmbeddedServerError, match="refusing to start"):
        server.start(timeout=5)
    assert not server.is_running
    assert server.data_dir is None


# --------------------------------------------------------------------------
# binary discovery
# --------------------------------------------------------------------------


def test_find_server_binary_env_missing(monkeypatch, tmp_path) -> None:
    missing = str(tmp_path / "no-such-redis-server")
    monkeypatch.setenv(ENV_SERVER_BINARY, missing)
    with pytest.raises(EmbeddedServerError) as info:
        find_server_binary()
    assert missing in str(info.value)


def test_find_server_binary_env_not_executable(monkeypatch, tmp_path) -> None:
    plain = tmp_path / "not-executable"
    plain.write_text("")
    plain.chmod(0o644)
    monkeypatch.setenv(ENV_SERVER_BINARY, str(plain))
    with pytest.raises(EmbeddedServerError, match="not executable"):
        find_server_binary()


def test_find_server_binary_env_honoured(monkeypatch) -> None:
    monkeypatch.delenv(ENV_SERVER_BINARY, raising=False)
    real = find_server_binary()
    assert os.access(real, os.X_OK)
    monkeypatch.setenv(ENV_SERVER_BINARY, real)
    assert find_server_binary() == os.path.abspath(real)


# --------------------------------------------------------------------------
# cluster
# --------------------------------------------------------------------------


def test_cluster_formed_with_three_masters(cluster: EmbeddedCluster) -> None:
    assert len(cluster.ports) == 3
    assert cluster.url == f"redis://127.0.0.1:{cluster.ports[0]}"
    assert [(n.host, n.port) for n in cluster.startup_nodes] == [
        ("127.0.0.1", p) for p in cluster.ports
    ]
    nodes = cluster.node_clients(decode_responses=True)
    try:
        assert len(nodes) == 3
        for node in nodes:
            info = node.execute_command("CLUSTER", "INFO")
            if isinstance(info, str):
                assert "cluster_state:ok" in info
            else:
                assert info["cluster_state"] == "ok"
            slots = node.execute_command("CLUSTER", "SLOTS")
            assert sum(int(e[1]) - int(e[0]) + 1 for e in slots) == CLUSTER_SLOTS
            assert {int(e[2][1]) for e in slots} == set(cluster.ports)
    finally:
        for node in nodes:
            node.close()


def test_cluster_client_reaches_all_masters(cluster: EmbeddedCluster) -> None:
    rc = cluster.client(decode_responses=True)
    try:
        # Slot ownership as seen by the client: one key per master.
        owner_by_port: dict[int, str] = {}
        i = 0
        while len(owner_by_port) < 3 and i < 10_000:
            key = f"key:{i}"
            slot = rc.keyslot(key)
            port = rc.nodes_manager.get_node_from_slot(slot).port
            owner_by_port.setdefault(int(port), key)
            i += 1
        assert set(owner_by_port) == set(cluster.ports)

        for port, key in owner_by_port.items():
            assert rc.set(key, f"on-{port}") is True
            assert rc.get(key) == f"on-{port}"

        # Each key really lives on the master we expected.
        for port, key in owner_by_port.items():
            direct = redis.Redis(host="127.0.0.1", port=port, decode_responses=True)
            try:
                assert direct.execute_command("GET", key) == f"on-{port}"
            finally:
                direct.close()
    finally:
        rc.close()


def test_cluster_lua_script_with_hash_tag(cluster: EmbeddedCluster) -> None:
    rc = cluster.client(decode_responses=True)
    try:
        keys = ["{job:42}:a", "{job:42}:b"]
        assert rc.keyslot(keys[0]) == rc.keyslot(keys[1])
        script = rc.register_script(
            "redis.call('SET', KEYS[1], ARGV[1])\n"
            "redis.call('SET', KEYS[2], ARGV[2])\n"
            "return redis.call('MGET', KEYS[1], KEYS[2])"
        )
        assert script(keys=keys, args=["x", "y"]) == ["x", "y"]
        assert script(keys=keys, args=["1", "2"]) == ["1", "2"]
    finally:
        rc.close()


def test_cluster_stop_is_idempotent() -> None:
    c = EmbeddedCluster(masters=1)
    c.start()
    ports = c.ports
    c.stop()
    c.stop()
    assert not c.is_running
    for port in ports:
        assert _refuses(port)
    with pytest.raises(EmbeddedServerError):
        c.client()
