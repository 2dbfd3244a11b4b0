"""TLS end to end: ``rediss://`` with certificate checks on, through a TLS endpoint on loopback.

The bundled valkey-server is built without TLS ("Failed finding TLS support"), so a small
TLS-terminating proxy (asyncio + ssl) forwards each connection to the plain test server. The CA
and the server certificate are made here with the ``openssl`` command line and thrown away.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from rcoord import CoordinatorConfig, Errors, GroupCoordinator, TopicPartition
from rcoord.connect import connect
from rcoord.topics import Producer, ProducerRecord, Topics, fetch

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl CLI")


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _make_ca(d: Path, name: str) -> None:
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
             "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.pem", "-days", "1",
             "-subj", f"/CN={name}", cwd=d)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """ca.pem signs server.pem (for IP 127.0.0.1); wrong-ca.pem signs nothing here."""
    d = tmp_path_factory.mktemp("tls")
    _make_ca(d, "ca")
    _make_ca(d, "wrong-ca")
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1", cwd=d)
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    _openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
             "-CAcreateserial", "-out", "server.pem", "-days", "1", "-extfile", "san.ext", cwd=d)
    return d


class TlsProxy:
    """Accepts TLS on 127.0.0.1:<port> and forwards the plain bytes to ``target_port``."""

    def __init__(self, target_port: int, cert: Path, key: Path) -> None:
        self._target = target_port
        self._ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self._ctx.load_cert_chain(str(cert), str(key))
        self._loop = asyncio.new_event_loop()
        # A client that refuses our certificate aborts the handshake: expected, not noise.
        self._loop.set_exception_handler(lambda *_: None)
        self._thread = threading.Thread(target=self._loop.run_forever, name="tls-proxy",
                                        daemon=True)
        self._server: asyncio.AbstractServer | None = None
        self.port = 0

    def start(self) -> TlsProxy:
        self._thread.start()
        fut = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._handle, "127.0.0.1", 0, ssl=self._ctx), self._loop)
        self._server = fut.result(10)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self._target)
        except OSError:
            writer.close()
            return
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (OSError, ssl.SSLError):
            pass
        finally:
            writer.close()

    def stop(self) -> None:
        async def close() -> None:
            assert self._server is not None
            self._server.close()
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()

        asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()


@pytest.fixture(scope="module")
def tls_url(redis_server: Any, certs: Path) -> Iterator[str]:
    proxy = TlsProxy(redis_server.port, certs / "server.pem", certs / "server.key").start()
    try:
        yield f"rediss://127.0.0.1:{proxy.port}/0"
    finally:
        proxy.stop()


def test_group_round_trip_and_topics_over_tls(tls_url: str, certs: Path, namespace: str) -> None:
    """The URL carries the CA (what --tls-ca-file writes), with certificate checks required."""
    url = f"{tls_url}?ssl_cert_reqs=required&ssl_ca_certs={certs / 'ca.pem'}"
    client = connect(url)
    try:
        conn = client.connection_pool.get_connection()
        try:
            assert isinstance(conn._sock, ssl.SSLSocket)  # really TLS, and verified
            assert conn._sock.getpeercert()["subject"] == ((("commonName", "127.0.0.1"),),)
        finally:
            client.connection_pool.release(conn)
        coord = GroupCoordinator(client, CoordinatorConfig(
            namespace=namespace, group_min_session_timeout_ms=10,
            group_initial_rebalance_delay_ms=0)).start()
        join: dict[str, Any] = {"protocol_type": "consumer", "protocols": [("range", b"m")],
                                "session_timeout_ms": 5000, "rebalance_timeout_ms": 5000}
        member = coord.join_group("g", "", **join).member_id
        joined = coord.join_group("g", member, **join)
        assert joined.error == Errors.NONE and joined.leader_id == member
        synced = coord.sync_group("g", joined.generation_id, member,
                                  assignments={member: b"all of t"})
        assert synced.error == Errors.NONE and synced.assignment == b"all of t"
        assert coord.heartbeat("g", joined.generation_id, member) == Errors.NONE
        tp = TopicPartition("t", 0)
        Topics(client, namespace).create("t", 1)
        Producer(client, namespace).send_batch(
            "t", [ProducerRecord(b"r%d" % i, partition=0) for i in range(5)])
        got = fetch(client, namespace, "t", 0, 0)
        assert [r.value for r in got.records] == [b"r%d" % i for i in range(5)]
        committed = coord.commit_offsets("g", {tp: 5}, member_id=member,
                                         generation_id=joined.generation_id)
        assert committed == {tp: Errors.NONE}
        assert coord.fetch_offsets("g", [tp]).offsets[tp].offset == 5
    finally:
        client.close()


def test_a_wrong_ca_is_refused(tls_url: str, certs: Path) -> None:
    with pytest.raises(redis.exceptions.ConnectionError, match="certificate verify failed"):
        connect(tls_url, ssl_cert_reqs="required", ssl_ca_certs=str(certs / "wrong-ca.pem"))


def _coordinator(*args: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RCOORD_")}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.Popen([sys.executable, "-m", "rcoord", "coordinator", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_cli_tls_ca_file(tls_url: str, certs: Path, namespace: str) -> None:
    """``rcoord coordinator --tls-ca-file``: the right CA starts it; a wrong one is one line."""
    proc = _coordinator("--redis-url", tls_url, "--tls-ca-file", str(certs / "ca.pem"),
                        "--namespace", namespace, "--lease-ttl-ms", "1000")
    try:
        assert proc.stdout is not None
        started = json.loads(proc.stdout.readline())
        assert started["event"] == "started" and started["namespace"] == namespace
    finally:
        proc.terminate()
        proc.communicate(timeout=20)
    assert proc.returncode == 0

    wrong = _coordinator("--redis-url", tls_url, "--tls-ca-file", str(certs / "wrong-ca.pem"))
    _, err = wrong.communicate(timeout=60)
    assert wrong.returncode == 1 and "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(
        f"rcoord coordinator: error: the TLS certificate of Redis at {tls_url} is not trusted")
    assert "certificate verify failed" in lines[0] and "--tls-ca-file" in lines[0]


@pytest.fixture(scope="module")
def mutual_tls_url(redis_server: Any, certs: Path) -> Iterator[str]:
    """A TLS endpoint that wants a client certificate ca.pem signed (Redis's default,
    ``tls-auth-clients yes``); client.pem and client.key are one."""
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", "client.key", "-out", "client.csr", "-subj", "/CN=rcoord", cwd=certs)
    _openssl("x509", "-req", "-in", "client.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
             "-CAcreateserial", "-out", "client.pem", "-days", "1", cwd=certs)
    proxy = TlsProxy(redis_server.port, certs / "server.pem", certs / "server.key")
    proxy._ctx.verify_mode = ssl.CERT_REQUIRED
    proxy._ctx.load_verify_locations(str(certs / "ca.pem"))
    proxy.start()
    try:
        yield f"rediss://127.0.0.1:{proxy.port}/0"
    finally:
        proxy.stop()


def _topics_list(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RCOORD_")}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run([sys.executable, "-m", "rcoord", "topics", "list", *args], env=env,
                          capture_output=True, text=True, timeout=60, check=False)


def test_a_missing_client_certificate_is_named(mutual_tls_url: str, certs: Path,
                                               namespace: str) -> None:
    """Without --tls-cert-file the server ends the connection; that was printed as "cannot
    reach Redis ...: Connection closed by server; check the host and port, and that the
    server runs", though both were right and it ran."""
    common = ("--redis-url", mutual_tls_url, "--tls-ca-file", str(certs / "ca.pem"),
              "--namespace", namespace)
    res = _topics_list(*common)
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
    assert "check the host and port" not in res.stderr, res.stderr
    assert "asks for a client certificate" in res.stderr, res.stderr
    assert "--tls-cert-file and --tls-key-file" in res.stderr, res.stderr

    ok = _topics_list(*common, "--tls-cert-file", str(certs / "client.pem"),
                      "--tls-key-file", str(certs / "client.key"))
    assert ok.returncode == 0, ok.stderr
