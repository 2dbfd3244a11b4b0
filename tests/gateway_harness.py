"""A gateway on a free loopback port, served by its own event loop in a thread, for tests that
drive it with blocking Kafka clients (kafka-python, confluent-kafka); raw Kafka frames for the
tests that must send what no client sends."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import io
import itertools
import json
import re
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from harness import WAIT_S, socket_warnings_on_collect

from rcoord import CoordinatorConfig, GroupCoordinator
from rcoord.gateway import Gateway, GatewayConfig
from rcoord.gateway.wire import build, request_class
from rcoord.topics import Producer, ProducerRecord, Topics

FAST_GROUPS = {
    "group_min_session_timeout_ms": 10,
    "group_max_session_timeout_ms": 600_000,
    "group_initial_rebalance_delay_ms": 0,
}


class GatewayThread:
    """``start()`` returns once the gateway listens; ``bootstrap`` is its HOST:PORT."""

    def __init__(self, redis_url: str, namespace: str, auth: Any = None,
                 redis_kwargs: dict[str, Any] | None = None, **config: Any) -> None:
        self.redis_kwargs = redis_kwargs or {}
        self.config = GatewayConfig(listen_host="127.0.0.1", listen_port=0, namespace=namespace,
                                    **config)
        self.redis_url = redis_url
        self.auth = auth
        self.loop = asyncio.new_event_loop()
        self.gateway: Gateway | None = None
        self._address: tuple[str, int] | None = None
        self._thread = threading.Thread(target=self.loop.run_forever, name="gateway",
                                        daemon=True)

    def start(self) -> GatewayThread:
        # What earlier tests left to the collector is not this gateway's test's to judge at its
        # stop (a service's socket, left by a test with no gateway, failed the next gateway
        # test's teardown): collected now, before anything of this test's exists.
        socket_warnings_on_collect()
        self._thread.start()
        self.gateway = Gateway(self.config, self.redis_url, auth=self.auth, **self.redis_kwargs)
        asyncio.run_coroutine_threadsafe(self.gateway.start(), self.loop).result(30)
        self._address = self.gateway.address  # kept: a closed server has no sockets to ask
        _RUNNING.add(self._address)
        return self

    @property
    def address(self) -> tuple[str, int]:
        assert self._address is not None, "the gateway is not started"
        return self._address

    @property
    def bootstrap(self) -> str:
        host, port = self.address
        return f"{host}:{port}"

    def stop(self) -> None:
        if self.gateway is not None:
            asyncio.run_coroutine_threadsafe(self.gateway.close(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(30)
        self.loop.close()
        if self._address is not None:
            try:
                _collect_unclosed_sockets(excused_gateways() | {self._address})
            finally:
                _RUNNING.discard(self._address)
                _STOPPED.append(self._address)


_RUNNING: set[tuple[str, int]] = set()
"""The listen addresses of the gateways started and not yet stopped in this process."""
_STOPPED: collections.deque[tuple[str, int]] = collections.deque(maxlen=4)
"""Those of the last gateways stopped: a Kafka client's socket may reach the collector only
after its gateway stopped (a kafka-python consumer's, refused its group, was collected at the
next test's gateway stop and failed that test, 1 run in 8 of tests/test_gateway_acl.py). Only
the last few: a port is used again, by a Redis server too, whose leaked sockets must fail."""


def excused_gateways() -> set[tuple[str, int]]:
    """The gateways a socket left to the collector may reach (a Kafka client's: let go)."""
    return _RUNNING | set(_STOPPED)
_PEER = re.compile(r"raddr=\('([^']*)', (\d+)\)")


def _collect_unclosed_sockets(gateways: set[tuple[str, int]]) -> None:
    """Collect garbage as a gateway stops, so a socket some test left unclosed is reported in the
    test that used it, not in whichever later test the next collection runs in (where the
    suite's ``filterwarnings = error`` failed an unrelated test twice in CI, each time with a
    connected loopback socket, after a kafka-python test).

    A socket connected to one of these gateways is a Kafka client's: rcoord only listens on
    them. Kafka client libraries (kafka-python 3.0.12: docs/gateway.md, "Known client issues")
    can leave one to the collector after their ``close()``; that is the test driver's, and is
    let go. Any other unclosed socket fails the test that left it."""
    leaked = socket_warnings_on_collect()
    ours = [w for w in leaked
            if (m := _PEER.search(w)) is None or (m[1], int(m[2])) not in gateways]
    assert not ours, f"unclosed sockets left by this test: {ours}"


def poll_until(consumer: Any, done: Callable[[list[Any]], bool], timeout_s: float = WAIT_S
               ) -> None:
    """Poll a kafka-python group member until ``done`` (given each poll's records) holds.

    kafka-python 3.0.12 rejoins once after its first assignment (the metadata snapshot it keeps
    from that join is empty), and a poll whose timeout expires while that rejoin is in flight
    drops the join's result: the member stays in the group, never stable, with nothing to
    fetch, and no later poll rejoins. Seen in CI under load, with polls of 200 ms. Polls here
    last long enough for a join, and a member left in that state is asked to rejoin."""
    deadline = time.monotonic() + timeout_s
    while True:
        records = [r for rs in consumer.poll(timeout_ms=500).values() for r in rs]
        if done(records):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"kafka-python member not done in {timeout_s} s; assignment "
                                 f"{sorted(consumer.assignment())}")
        member = consumer._coordinator
        if member.generation_if_stable() is None and not member.need_rejoin():
            member.request_rejoin()


def committed_when_stable(consumer: Any, offsets: Any = None) -> bool:
    """Commit, or False when kafka-python refuses because its member is rebalancing (its own
    advice: poll, then retry); for ``poll_until``."""
    import kafka.errors

    try:
        consumer.commit(offsets)
    except (kafka.errors.RebalanceInProgressError, kafka.errors.CommitFailedError):
        return False
    return True


def settle_fast_groups(client: Any, namespace: str) -> None:
    """Name the namespace's settings (small timeouts, no initial delay) before the gateway."""
    GroupCoordinator(client, CoordinatorConfig(namespace=namespace, **FAST_GROUPS)).start()


@contextlib.contextmanager
def running_gateway(redis_server: Any, namespace: str, redis_kwargs: dict[str, Any] | None = None,
                    **config: Any) -> Iterator[GatewayThread]:
    """A started gateway over ``redis_server`` (fast group settings), stopped at the end;
    ``redis_kwargs`` go to its Redis clients (e.g. a small ``socket_timeout``)."""
    client = redis_server.client()
    settle_fast_groups(client, namespace)
    client.close()
    gw = GatewayThread(redis_server.url, namespace, redis_kwargs=redis_kwargs, **config).start()
    try:
        yield gw
    finally:
        gw.stop()


@contextlib.contextmanager
def topics_of(redis_server: Any, namespace: str) -> Iterator[Topics]:
    client = redis_server.client()
    try:
        yield Topics(client, namespace)
    finally:
        client.close()


def fill_backlog(redis_server: Any, namespace: str, topic: str, partitions: int = 40,
                 records: int = 20, size: int = 50_000) -> None:
    """``records`` records of ``size`` bytes in each of ``partitions`` partitions of ``topic``
    (made by the caller): the backlog of the gateway's Fetch byte-bound tests."""
    client = redis_server.client()
    try:
        producer = Producer(client, namespace, idempotent=False)
        for p in range(partitions):
            producer.send_batch(topic, [ProducerRecord(b"x" * size, partition=p)
                                        for _ in range(records)])
    finally:
        client.close()


@contextlib.contextmanager
def gateway_for_alice(redis_server: Any, namespace: str, tmp_path: Any, mine: list[str],
                      theirs: list[str]) -> Iterator[tuple[GatewayThread, Topics]]:
    """A gateway whose auth file lets user ``alice`` (password ``pw``) do the ``mine``
    operations on topic "mine" and the ``theirs`` ones on topic "theirs", both topics made
    with one partition: for the tests of an API's ACL check (the one operation it needs)."""
    from rcoord.gateway.auth import load_auth_file

    path = tmp_path / "auth.json"
    path.write_text(json.dumps({"users": {"alice": "pw"}, "acls": [
        {"principal": "User:alice", "resource": "topic", "name": name, "operations": ops}
        for name, ops in (("mine", mine), ("theirs", theirs))]}))
    with running_gateway(redis_server, namespace, auth=load_auth_file(path)) as gw, \
            topics_of(redis_server, namespace) as topics:
        topics.create("mine", 1)
        topics.create("theirs", 1)
        yield gw, topics


# -- raw frames -------------------------------------------------------------------------------


def produced_batch(records: Any, producer_id: int = -1, producer_epoch: int = -1,
                   base_sequence: int = -1) -> bytes:
    """A v2 batch as a Kafka producer sends it: the gateway's own encoding (``encode_batch``,
    made for Fetch) with the timestamp type CreateTime, since a broker refuses a producer's
    LogAppendTime batch (INVALID_TIMESTAMP)."""
    from rcoord.gateway.records import encode_batch

    out = bytearray(encode_batch(records, producer_id, producer_epoch, base_sequence))
    out[22] &= ~0x08  # attributes' low byte: the timestamp type bit
    return with_crc(out)


def with_crc(batch: bytes | bytearray) -> bytes:
    """A v2 batch with its CRC (over what follows the CRC field) made again, after a test
    changed some of its bytes."""
    import crc32c

    out = bytearray(batch)
    out[17:21] = crc32c.crc32c(bytes(out[21:])).to_bytes(4, "big")
    return bytes(out)


def fetched_records(data: bytes) -> list[Any]:
    """Every record (kio's) of a Fetch response's ``records`` field, batch after batch."""
    from kio.records.readers import read_batch

    view, pos, out = memoryview(data), 0, []
    while pos < len(view):
        batch, size = read_batch(view, pos)
        out.extend(batch.records)
        pos += size
    return out


def request_frame(api_key: int, version: int, corr: int, body: dict[str, Any]) -> bytes:
    """A whole request frame (size prefix, header v1/v2, body) built from plain data."""
    from kio.serial import entity_writer

    cls = request_class(api_key, version)
    header_cls = cls.__header_schema__
    buf = io.BytesIO()
    entity_writer(header_cls)(buf, build(header_cls, {
        "request_api_key": api_key, "request_api_version": version, "correlation_id": corr,
        "client_id": "raw"}))
    entity_writer(cls)(buf, build(cls, body))
    data = buf.getvalue()
    return len(data).to_bytes(4, "big") + data


def recv_frame(sock: socket.socket) -> bytes:
    """The next response frame's body (header and payload)."""
    def exactly(n: int) -> bytes:
        out = b""
        while len(out) < n:
            chunk = sock.recv(n - len(out))
            if not chunk:
                raise ConnectionError("closed")
            out += chunk
        return out

    return exactly(int.from_bytes(exactly(4), "big"))


def response(sock: socket.socket, api_key: int, version: int, header_bytes: int) -> Any:
    """Read the next frame as ``api_key``'s response at ``version``; ``header_bytes``: 4 for
    response header v0, 5 for v1 (flexible versions: an empty tagged-field section)."""
    from kio.serial import entity_reader

    from rcoord.gateway.wire import response_class

    frame = recv_frame(sock)
    resp, _ = entity_reader(response_class(api_key, version))(frame, header_bytes)
    return resp


INIT_PRODUCER_ID_BODY = {"transactional_id": None, "transaction_timeout": 60000,
                         "producer_id": -1, "producer_epoch": -1}
"""An InitProducerId (v2+) body of an idempotent producer with no id yet, as Kafka's sends."""


@contextlib.contextmanager
def demoted(admin: Any, refused_port: int) -> Iterator[None]:
    """``admin``'s server a replica of a port nothing listens on while the block runs (a
    master a failover demoted: writes are refused READONLY, blocked reads ended), then a
    master again."""
    admin.execute_command("REPLICAOF", "127.0.0.1", refused_port)
    try:
        yield
    finally:
        admin.execute_command("REPLICAOF", "NO", "ONE")


def fetch_body(topic: str, partitions: Iterable[int], offset: int, max_wait_ms: int = 0
               ) -> dict[str, Any]:
    """A Fetch (v4-v12) body reading ``partitions`` of ``topic`` from ``offset``, up to 1 MiB
    each and in all, waiting up to ``max_wait_ms`` for a first byte."""
    return {"replica_id": -1, "max_wait": max_wait_ms, "min_bytes": 1, "max_bytes": 1 << 20,
            "topics": [{"topic": topic, "partitions": [
                {"partition": p, "fetch_offset": offset, "partition_max_bytes": 1 << 20}
                for p in partitions]}]}


def connect(gw: GatewayThread) -> socket.socket:
    return socket.create_connection(gw.address, timeout=10)


def closed_by_gateway(sock: socket.socket, timeout_s: float | None = None) -> bool:
    """Whether the gateway closed ``sock`` (instead of answering what was sent on it), waiting
    up to the socket's timeout, or ``timeout_s`` if given: a reset counts as closed."""
    if timeout_s is not None:
        sock.settimeout(timeout_s)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def call_once(gw: GatewayThread, api_key: int, version: int, body: dict[str, Any],
              header_bytes: int = 5, login: tuple[str, str] | None = None) -> Any:
    """One request on a connection of its own (a flexible version: response header v1, 5
    bytes; ``header_bytes=4`` for the response header v0 of a version that is not), made as
    ``login`` (user, password; SASL/PLAIN) if given."""
    sock = connect(gw) if login is None else sasl_connect(gw, *login)
    try:
        sock.sendall(request_frame(api_key, version, 3, body))
        return response(sock, api_key, version, header_bytes)
    finally:
        sock.close()


class LossyProxy:
    """A TCP proxy in front of a gateway that loses the answer to chosen requests: it forwards
    the request, then closes the client's connection instead of forwarding the response, so the
    client cannot know whether the request was applied and must resend it (Kafka's "network
    exception" case). ``drop(api_key, times)`` arms it; ``dropped`` counts what it did.

    Bind first (``port``), start the gateway advertising that port, then ``start(upstream)``.
    """

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._lock = threading.Lock()
        self._armed: dict[int, int] = {}
        self.dropped = 0
        self._closing = threading.Event()
        self._socks: list[socket.socket] = []
        self._threads: list[threading.Thread] = []

    def drop(self, api_key: int, times: int = 1) -> None:
        with self._lock:
            self._armed[api_key] = times

    def start(self, upstream: tuple[str, int]) -> LossyProxy:
        self._upstream = upstream
        self._spawn(self._accept_loop)
        return self

    def _spawn(self, fn: Any, *args: Any) -> None:
        t = threading.Thread(target=fn, args=args, daemon=True)
        self._threads.append(t)
        t.start()

    def _accept_loop(self) -> None:
        while not self._closing.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(self._upstream)
            self._socks += [client, server]
            doomed: set[int] = set()
            self._spawn(self._requests, client, server, doomed)
            self._spawn(self._responses, server, client, doomed)

    def _requests(self, client: socket.socket, server: socket.socket, doomed: set[int]) -> None:
        try:
            while True:
                body = recv_frame(client)
                key = int.from_bytes(body[0:2], "big")
                with self._lock:
                    if self._armed.get(key, 0) > 0:
                        self._armed[key] -= 1
                        doomed.add(int.from_bytes(body[4:8], "big"))
                server.sendall(len(body).to_bytes(4, "big") + body)
        except OSError:
            pass
        finally:
            _close(client, server)

    def _responses(self, server: socket.socket, client: socket.socket, doomed: set[int]) -> None:
        try:
            while True:
                body = recv_frame(server)
                if int.from_bytes(body[0:4], "big") in doomed:
                    with self._lock:
                        self.dropped += 1
                    return  # applied upstream, never answered: the client must resend
                client.sendall(len(body).to_bytes(4, "big") + body)
        except OSError:
            pass
        finally:
            _close(client, server)

    def stop(self) -> None:
        self._closing.set()
        _close(self._listener, *self._socks)
        for t in self._threads:
            t.join(10)


def _close(*socks: socket.socket) -> None:
    for s in socks:
        with contextlib.suppress(OSError):
            s.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            s.close()


def sasl_connect(gw: GatewayThread, user: str, password: str) -> socket.socket:
    """A raw connection authenticated with SASL/PLAIN (handshake v1, authenticate v2)."""
    sock = connect(gw)
    sock.sendall(request_frame(17, 1, 1, {"mechanism": "PLAIN"}))
    if response(sock, 17, 1, 4).error_code.value != 0:
        raise AssertionError("SASL handshake refused")
    sock.sendall(request_frame(36, 2, 2, {"auth_bytes": b"\0%s\0%s" % (user.encode(),
                                                                        password.encode())}))
    if response(sock, 36, 2, 5).error_code.value != 0:
        raise AssertionError(f"SASL authentication of {user} failed")
    return sock


# -- certificates -------------------------------------------------------------------------------


def _openssl(d: Any, *args: str) -> None:
    import subprocess

    subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True, timeout=60)


def _key_and_csr(d: Any, name: str, cn: str) -> None:
    _openssl(d, "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={cn}")


def make_certs(d: Any) -> None:
    """In directory ``d``, with the ``openssl`` CLI: ``ca.pem`` signs ``server.pem`` (IP
    127.0.0.1) and ``client.pem`` (CN=alice); ``other-ca.pem`` signs ``stranger.pem``."""
    for ca in ("ca", "other-ca"):
        _openssl(d, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                 "-nodes", "-keyout", f"{ca}.key", "-out", f"{ca}.pem", "-days", "1",
                 "-subj", f"/CN={ca}")
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    for name, cn, ca, ext in (("server", "127.0.0.1", "ca", ["-extfile", "san.ext"]),
                              ("client", "alice", "ca", []),
                              ("stranger", "mallory", "other-ca", [])):
        _key_and_csr(d, name, cn)
        _openssl(d, "x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey",
                 f"{ca}.key", "-CAcreateserial", "-out", f"{name}.pem", "-days", "1", *ext)


def take(consumer: Any, n: int) -> list[Any]:
    """The first ``n`` messages a kafka-python ``KafkaConsumer`` yields, fewer if its
    ``consumer_timeout_ms`` passes first (the caller's comparison then fails).

    ``list(consumer)`` instead ends only after ``consumer_timeout_ms`` without a message, so
    every such read cost that whole bound after its last record.
    """
    return list(itertools.islice(consumer, n))


def answered_while_building(gw: GatewayThread, monkeypatch: Any, api_key: int, version: int,
                            body: dict[str, Any], wait_s: float = 60.0) -> Any:
    """Send one request and hold its response's build (``wire.build``) until another
    connection's FindCoordinator has been answered; then read the response (header v1).

    For responses built on the topic threads (``Api.offload``): built on the event loop,
    nothing else could be answered meanwhile, and this fails by timeout.
    """
    from rcoord.gateway import wire

    name = wire.response_class(api_key, version).__name__
    started, release = threading.Event(), threading.Event()
    real_build = wire.build

    def held_build(cls: Any, data: Any) -> Any:
        if cls.__name__ == name:
            started.set()
            assert release.wait(wait_s)
        return real_build(cls, data)

    monkeypatch.setattr(wire, "build", held_build)
    sock = connect(gw)
    try:
        sock.sendall(request_frame(api_key, version, 1, body))
        assert started.wait(wait_s)
        try:
            found = call_once(gw, 10, 4, {"key_type": 0, "coordinator_keys": ["g"]})
        finally:
            release.set()
        assert [(c.key, c.error_code.value) for c in found.coordinators] == [("g", 0)]
        return response(sock, api_key, version, 5)
    finally:
        sock.close()
