"""``rcoord gateway`` on the command line: its namespace comes from ``--namespace``, else
``$RCOORD_NAMESPACE``, else ``rcoord``, like every other rcoord command's, and a namespace
rcoord cannot use is a usage error (exit 2, one line) before anything is served. Every case runs
``python -m rcoord gateway`` against the session's server."""

from __future__ import annotations

import contextlib
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("kio")

from gateway_harness import request_frame, response, topics_of
from harness import wait_until

ROOT = Path(__file__).resolve().parent.parent
WAIT_S = 60.0


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RCOORD_")}
    env["PYTHONPATH"] = str(ROOT)
    env.update(extra)
    return env


def _gateway(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "rcoord", *args], env=_env(**env),
                          capture_output=True, text=True, timeout=WAIT_S, check=False)


def _one_error_line(res: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in res.stderr + res.stdout, res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("rcoord gateway: error: "), lines[0]
    return lines[0]


@pytest.mark.parametrize("where", ["flag", "flag before the command", "environment"])
def test_a_namespace_rcoord_cannot_use_is_a_usage_error(redis_server, where):
    """It was an InvalidRequestError from the coordinator's start, exit 1, once connected."""
    common = ("--listen", "127.0.0.1:0", "--redis-url", redis_server.url)
    if where == "flag":
        res = _gateway("gateway", *common, "--namespace", "a{b}")
    elif where == "flag before the command":
        res = _gateway("--namespace", "a{b}", "gateway", *common)
    else:
        res = _gateway("gateway", *common, RCOORD_NAMESPACE="a{b}")
    line = _one_error_line(res)
    assert res.returncode == 2, res.stderr
    assert "namespace must be 1-64 characters of [A-Za-z0-9._:-] (no braces), got 'a{b}'" in line


def test_the_gateway_config_refuses_it_too():
    from rcoord.gateway import GatewayConfig

    with pytest.raises(ValueError, match=r"namespace must be .*got 'a\{b\}'"):
        GatewayConfig(namespace="a{b}").validate()


def test_the_namespace_is_checked_before_redis_is_reached(refused_port):
    res = _gateway("gateway", "--listen", "127.0.0.1:0", "--redis-url",
                   f"redis://127.0.0.1:{refused_port}", "--namespace", "a{b}")
    assert res.returncode == 2 and "namespace must be" in _one_error_line(res)


def _cluster_id_and_topics(port: int) -> tuple[str, list[str]]:
    sock = socket.create_connection(("127.0.0.1", port), timeout=WAIT_S)
    try:
        sock.sendall(request_frame(3, 12, 1, {"topics": None,
                                              "allow_auto_topic_creation": False}))
        got: Any = response(sock, 3, 12, 5)
    finally:
        sock.close()
    return got.cluster_id, sorted(t.name for t in got.topics)


class _StderrLines:
    """The lines a subprocess writes to stderr, read on a thread of their own ("" once it
    closed stderr, that is exited), and kept in ``seen``."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.seen: list[str] = []
        self._lines: queue.Queue[str] = queue.Queue()

        def read() -> None:
            assert proc.stderr is not None
            for ln in proc.stderr:
                self._lines.put(ln)
            self._lines.put("")  # the process closed its stderr (exited)

        self.reader = threading.Thread(target=read, daemon=True)
        self.reader.start()

    def next(self) -> str:
        line = self._lines.get(timeout=WAIT_S)
        self.seen.append(line)
        return line

    def read_for(self, seconds: float) -> None:
        """Keep what it writes for ``seconds`` (less if it exits)."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            with contextlib.suppress(queue.Empty):
                line = self._lines.get(timeout=left)
                self.seen.append(line)
                if not line:
                    return

    def until(self, text: str) -> str:
        """The first line holding ``text``; fails if the process exits first."""
        while text not in (line := self.next()):
            assert line, f"the process exited: {''.join(self.seen)}"
        return line


def _exit_status(proc: subprocess.Popen[str], lines: _StderrLines) -> int:
    """The process's exit status; if it has not exited within ``WAIT_S``, a failure that shows
    its output and where each of its threads is (``SIGUSR1``: the gateway dumps its stacks)."""
    try:
        return proc.wait(WAIT_S)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGUSR1)
        lines.read_for(3)
        pytest.fail(f"still running {WAIT_S} s after the signal:\n{''.join(lines.seen)}")


def test_the_namespace_defaults_to_rcoord_namespace(redis_server, namespace):
    with topics_of(redis_server, namespace) as topics:
        topics.create("only-here", 1)
    with subprocess.Popen(
        [sys.executable, "-m", "rcoord", "gateway", "--listen", "127.0.0.1:0",
         "--redis-url", redis_server.url, "--log-level", "INFO"],
        env=_env(RCOORD_NAMESPACE=namespace), stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True,
    ) as proc:
        lines = _StderrLines(proc)
        try:
            line = lines.until("listening on")  # where it listens (or it exited: a failure)
            found = re.search(r"listening on 127\.0\.0\.1:(\d+) .*\(namespace (\S+)\)", line)
            assert found, line
            assert found.group(2) == namespace
            assert _cluster_id_and_topics(int(found.group(1))) == (f"rcoord-{namespace}",
                                                                   ["only-here"])
        finally:
            proc.terminate()
            proc.wait(WAIT_S)
            lines.reader.join(WAIT_S)


@contextlib.contextmanager
def _gateway_with_a_parked_fetch(redis_server: Any, namespace: str) -> Iterator[
        tuple[subprocess.Popen[str], _StderrLines, socket.socket]]:
    """A gateway process, its stderr, and a connection whose Fetch would be answered in 10
    minutes (parked, or about to be); killed at the end if it still runs."""
    with topics_of(redis_server, namespace) as topics:
        topics.create("idle", 1)
    with subprocess.Popen(
        [sys.executable, "-m", "rcoord", "gateway", "--listen", "127.0.0.1:0",
         "--redis-url", redis_server.url, "--namespace", namespace, "--log-level", "INFO"],
        env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    ) as proc:
        lines = _StderrLines(proc)
        sock = None
        try:
            line = lines.until("listening on")
            found = re.search(r"listening on 127\.0\.0\.1:(\d+) ", line)
            assert found, line
            sock = socket.create_connection(("127.0.0.1", int(found.group(1))), timeout=WAIT_S)
            sock.sendall(request_frame(18, 3, 1, {"client_software_name": "t",
                                                  "client_software_version": "1"}))
            assert response(sock, 18, 3, 4).error_code.value == 0
            sock.sendall(request_frame(1, 12, 2, {
                "replica_id": -1, "max_wait": 600_000, "min_bytes": 1, "max_bytes": 1 << 20,
                "topics": [{"topic": "idle", "partitions": [
                    {"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1 << 20}]}]}))
            yield proc, lines, sock
        finally:
            if sock is not None:
                sock.close()
            if proc.poll() is None:
                proc.kill()
                proc.wait(WAIT_S)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_sigterm_closes_the_gateway_as_ctrl_c_does(redis_server, namespace, sig):
    """SIGTERM (kill, docker stop, systemd) closes the gateway, a parked Fetch's connection
    included, and exits 0, as Ctrl-C does. Before, the process died of it (status -15) and
    ``Gateway.close()`` never ran."""
    with _gateway_with_a_parked_fetch(redis_server, namespace) as (proc, lines, sock):
        proc.send_signal(sig)  # (the close ends the Fetch's connection, parked or not yet)
        assert _exit_status(proc, lines) == 0, "".join(lines.seen)
        lines.reader.join(WAIT_S)
        while lines.next():
            pass
        out = "".join(lines.seen)
        assert "Traceback" not in out, out
        assert re.search(r"rcoord gateway on 127\.0\.0\.1:\d+ closed", out), out
        try:  # closed by the gateway, the Fetch never answered (a reset if it was unread)
            assert sock.recv(1) == b""
        except ConnectionResetError:
            pass


def test_sigusr1_writes_the_threads_and_the_tasks_and_changes_nothing(redis_server, namespace):
    """SIGUSR1 (as for ``rcoord coordinator``): every thread's stack, then every asyncio task's
    chain of awaits, a parked Fetch's included; the gateway goes on serving. Before, the
    signal's default action ended the process."""
    with _gateway_with_a_parked_fetch(redis_server, namespace) as (proc, lines, sock):
        fetch_seen = False
        for _ in range(20):  # (until a dump shows the Fetch parked in its wait)
            if fetch_seen:
                break
            proc.send_signal(signal.SIGUSR1)
            lines.until("asyncio tasks:")
            lines.read_for(0.5)
            fetch_seen = "in _wait_for_records" in "".join(lines.seen)
        out = "".join(lines.seen)
        assert "Current thread" in out and "in gateway_main" in out, out  # the threads
        assert "in fetch_records" in out, out  # the tasks, innermost last
        assert proc.poll() is None, out
        with socket.create_connection(sock.getpeername(), timeout=WAIT_S) as other:
            other.sendall(request_frame(18, 3, 1, {"client_software_name": "t",
                                                   "client_software_version": "1"}))
            assert response(other, 18, 3, 4).error_code.value == 0  # still serving
        proc.send_signal(signal.SIGTERM)
        assert _exit_status(proc, lines) == 0, "".join(lines.seen)


def _clients_of(cluster: Any, name: str) -> int:
    """Connections named ``name`` the cluster's nodes hold: the session's cluster is every
    test's, and a count of all its connections moved with whatever else opened or closed one
    (the gateway process run just before, still closing; another test's clients)."""
    total = 0
    for node in cluster.node_clients():
        with node:
            total += sum(1 for c in node.client_list() if c.get("name") == name)
    return total


def test_a_url_argument_the_asyncio_cluster_client_lacks_is_named(redis_cluster):
    """``?retry_on_timeout=true`` (which every other process takes) failed the gateway's start
    on a cluster as "unexpected TypeError: RedisCluster.__init__() got an unexpected keyword
    argument 'retry_on_timeout'", exit 1. The blocking client it had connected is closed."""
    from rcoord.errors import ConfigError
    from rcoord.gateway import Gateway, GatewayConfig

    url = f"{redis_cluster.url}/0?retry_on_timeout=true"
    res = _gateway("gateway", "--listen", "127.0.0.1:0", "--redis-url", url)
    line = _one_error_line(res)
    assert res.returncode == 2, res.stderr
    assert "has ?retry_on_timeout=, which redis-py's asyncio Redis Cluster client" in line, line

    name = f"gw-{uuid.uuid4().hex[:8]}"
    with pytest.raises(ConfigError, match="retry_on_timeout"):
        Gateway(GatewayConfig(listen_port=0), url, client_name=name)
    wait_until(lambda: _clients_of(redis_cluster, name) == 0)  # (closed: the server sees it)


def test_the_url_whose_argument_the_asyncio_cluster_client_lacks_is_quoted_with_its_query():
    """The message names the query argument to remove but quoted the URL without its query
    ('redis://u:***@127.0.0.1:1/0 has ?retry_on_timeout=, ...'), an argument the URL shown does
    not hold. It quotes the query now, its passwords masked, as the URL checks do (90ec56f).
    (No server: the URL is refused before anything connects.)"""
    from rcoord.errors import ConfigError
    from rcoord.gateway.server import async_cluster

    url = "redis://u:Zm9vYmFy@127.0.0.1:1/0?retry_on_timeout=true&password=Zm9vYmFy"
    with pytest.raises(ConfigError) as raised:
        async_cluster(url)
    message = str(raised.value)
    assert "'redis://u:***@127.0.0.1:1/0?retry_on_timeout=true&password=***' has " \
        "?retry_on_timeout=, which" in message, message
    assert "Zm9vYmFy" not in message, message


@pytest.mark.parametrize("flag", ["--max-frame-bytes", "--connections-max-idle-ms",
                                  "--commit-required-acks", "--commit-ack-timeout-ms"])
@pytest.mark.parametrize("bad", ["1_000_000", " 3000", "\u0663000"])
def test_a_number_int_takes_and_the_other_commands_refuse_is_a_usage_error(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], flag: str,
        bad: str) -> None:
    # type=int read '1_000_000' as 1000000, ' 3000' as 3000 and Arabic-Indic digits as theirs,
    # where every other rcoord command (rcoord.cli.INTEGER) refuses them: the gateway went on
    # (here to the missing Redis URL) with a number the operator may not have meant.
    from rcoord.cli import main

    monkeypatch.delenv("RCOORD_REDIS_URL", raising=False)
    with pytest.raises(SystemExit) as exited:
        main(["gateway", flag, bad])
    assert exited.value.code == 2
    assert f"argument {flag}: {bad!r} is not an integer" in capsys.readouterr().err


def test_the_numbers_keep_their_bounds(monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    from rcoord.cli import main

    assert main(["gateway", "--redis-url", "redis://127.0.0.1:1/0", "--max-frame-bytes",
                 "+1023"]) == 2
    assert "max_frame_bytes must be >= 1024, got 1023" in capsys.readouterr().err
