"""The gateway's defences, as a security review found them wanting: ACL hosts compared as
addresses and refused when they are not one; Kafka's SASL order, the bound on a connection that
never authenticates and the delay of a failed authentication; a corrupt TLS record; listener TLS
files that cannot be used; and ACL decisions that read only the rules that can match."""

from __future__ import annotations

import dataclasses
import json
import logging
import random
import select
import shutil
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("kio")

from gateway_harness import (
    GatewayThread,
    closed_by_gateway,
    connect,
    make_certs,
    recv_frame,
    request_frame,
    response,
    running_gateway,
    sasl_connect,
    settle_fast_groups,
    topics_of,
)
from harness import wait_until

from rcoord.gateway.acl import Acl, Authorizer, Operation, ResourceType, parse_acls
from rcoord.gateway.auth import AuthConfig, load_auth_file

ROOT = Path(__file__).resolve().parent.parent
WAIT_S = 60.0
R, W, D = Operation.READ, Operation.WRITE, Operation.DESCRIBE
T, G = ResourceType.TOPIC, ResourceType.GROUP
TOPIC_AUTHORIZATION_FAILED, UNSUPPORTED_VERSION, ILLEGAL_SASL_STATE = 29, 35, 34
SASL_AUTHENTICATION_FAILED = 58
PASSWORD = "alice-pw"

ALLOW_ALL = {"principal": "User:alice", "resource": "topic", "name": "*", "operations": ["ALL"]}


def _deny_secret(host: Any) -> dict[str, Any]:
    return {"principal": "User:alice", "resource": "topic", "name": "secret",
            "operations": ["DESCRIBE"], "permission": "deny", "host": host}


# -- ACL hosts ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("rule_host", "client_host"), [
    ("0:0:0:0:0:0:0:1", "::1"),  # Java's spelling of ::1, as Kafka lists a client's address
    ("::1", "0:0:0:0:0:0:0:1"),
    ("1.2.3.4", "::ffff:1.2.3.4"),  # an IPv4 client on a dual-stack socket: Java sees 1.2.3.4
    ("FE80::A", "fe80::a"),
])
def test_an_acl_host_matches_its_address_however_it_is_written(rule_host: str,
                                                               client_host: str) -> None:
    authorizer = Authorizer(parse_acls([ALLOW_ALL, _deny_secret(rule_host)]))
    assert not authorizer.authorize("User:alice", client_host, D, T, "secret")
    assert authorizer.authorize("User:alice", client_host, D, T, "news")
    assert authorizer.authorize("User:alice", "10.1.2.3", D, T, "secret")  # another host


@pytest.mark.parametrize("host", ["::1/128", "10.0.0.0/8", "gateway.example.com", "", 7])
def test_an_acl_host_that_is_not_an_address_stops_the_auth_file(tmp_path: Path,
                                                                 host: Any) -> None:
    # Such a rule never matched a client: a deny written with a CIDR range denied nothing.
    path = tmp_path / "auth.json"
    path.write_text(json.dumps({"users": {"alice": PASSWORD},
                                "acls": [ALLOW_ALL, _deny_secret(host)]}))
    with pytest.raises(ValueError, match=r"acls\[1\]: host must be an IP address or '\*'"):
        load_auth_file(path)


def test_a_deny_written_as_kafka_prints_the_ipv6_loopback_denies_a_client_on_it(
    redis_server: Any, namespace: str, tmp_path: Path,
) -> None:
    try:
        with socket.create_server(("::1", 0), family=socket.AF_INET6):
            pass
    except OSError:
        pytest.skip("no IPv6 loopback")
    path = tmp_path / "auth.json"
    path.write_text(json.dumps({"users": {"alice": PASSWORD},
                                "acls": [ALLOW_ALL, _deny_secret("0:0:0:0:0:0:0:1")]}))
    with topics_of(redis_server, namespace) as topics:
        topics.create("secret", 1)
    client = redis_server.client()
    settle_fast_groups(client, namespace)
    client.close()
    gw = GatewayThread(redis_server.url, namespace, auth=load_auth_file(path))
    gw.config = dataclasses.replace(gw.config, listen_host="::1")
    gw.start()
    try:
        with sasl_connect(gw, "alice", PASSWORD) as sock:
            sock.sendall(request_frame(3, 12, 7, {
                "topics": [{"name": "secret", "topic_id": None}],
                "allow_auto_topic_creation": False, "include_topic_authorized_operations": False}))
            answer = response(sock, 3, 12, 5)
        assert [t.error_code.value for t in answer.topics] == [TOPIC_AUTHORIZATION_FAILED]
    finally:
        gw.stop()


# -- ACL decisions: indexed, and as before ------------------------------------------------------


def _tenants(n: int) -> list[dict[str, Any]]:
    rules: list[dict[str, Any]] = []
    for i in range(n):
        rules += [{"principal": f"User:t{i}", "resource": "topic", "name": f"t{i}.",
                   "pattern": "prefixed", "operations": ["READ", "WRITE"]},
                  {"principal": f"User:t{i}", "resource": "group", "name": f"t{i}.",
                   "pattern": "prefixed", "operations": ["READ"]}]
    return [*rules, {"principal": "User:*", "resource": "topic", "name": "public",
                     "operations": ["READ"]}]


def test_a_decision_reads_only_the_rules_that_can_match(monkeypatch: pytest.MonkeyPatch) -> None:
    # Metadata for all topics asks once per topic, on the event loop: with 1000 rules and
    # 3000 topics the scan of every rule per decision took about a second.
    authorizer = Authorizer(parse_acls(_tenants(500)))
    read: set[int] = set()
    for method in ("grants", "applies_to", "matches_resource"):
        original = getattr(Acl, method)

        def counted(self: Acl, *args: Any, _original: Any = original) -> Any:
            read.add(id(self))
            return _original(self, *args)

        monkeypatch.setattr(Acl, method, counted)
    assert authorizer.authorize("User:t7", "127.0.0.1", W, T, "t7.orders")
    assert not authorizer.authorize("User:t7", "127.0.0.1", R, T, "t8.orders")
    assert authorizer.authorize("User:t7", "127.0.0.1", R, T, "public")
    assert len(read) <= 3, f"{len(read)} of {len(authorizer.acls)} rules read"


def _scan(acls: list[Acl], principal: str, host: str, op: Operation, resource: ResourceType,
          name: str) -> bool:
    """The decision by reading every rule (the authorizer before its index)."""
    allowed = False
    for acl in acls:
        if acl.applies_to(principal, host) and acl.matches_resource(resource, name) \
                and acl.grants(op):
            if not acl.allow:
                return False
            allowed = True
    return allowed


def test_indexed_decisions_are_those_of_a_scan_of_every_rule() -> None:
    rng = random.Random(5)
    names = ["a", "ab", "abc", "b", "ba", "*"]
    entries = []
    for _ in range(300):
        resource = rng.choice(["topic", "group"])
        pattern = rng.choice(["literal", "prefixed"])
        name = rng.choice([n for n in names if pattern == "literal" or n != "*"])
        entries.append({
            "principal": rng.choice(["User:u1", "User:u2", "User:*"]), "resource": resource,
            "name": name, "pattern": pattern, "permission": rng.choice(["allow", "deny"]),
            "operations": [rng.choice(["READ", "DELETE", "DESCRIBE", "ALL"])],
            "host": rng.choice(["*", "10.0.0.1", "::1"])})
    acls = parse_acls(entries)
    authorizer = Authorizer(acls)
    for _ in range(3000):
        ask = (rng.choice(["User:u1", "User:u2", "User:u3"]),
               rng.choice(["10.0.0.1", "0:0:0:0:0:0:0:1", "10.0.0.2"]),
               rng.choice([R, D, Operation.DELETE]), rng.choice([T, G]),
               rng.choice(["a", "ab", "abc", "abcd", "b", "bab", "c", ""]))
        assert authorizer.authorize(*ask, log_denied=False) is _scan(acls, *ask), ask


# -- SASL: Kafka's order, the bound before authentication, the delay of a failure --------------


@pytest.fixture
def auth(tmp_path: Path) -> AuthConfig:
    path = tmp_path / "auth.json"
    path.write_text(json.dumps({"users": {"alice": PASSWORD}}))
    return load_auth_file(path)


def _api_versions(corr: int) -> bytes:
    return request_frame(18, 3, corr, {"client_software_name": "t",
                                       "client_software_version": "1"})


def _unserved_api_versions(corr: int) -> bytes:
    """ApiVersions at a version no schema has: answered at v0, UNSUPPORTED_VERSION."""
    body = (18).to_bytes(2, "big") + (99).to_bytes(2, "big") + corr.to_bytes(4, "big") + \
        b"\xff\xff"
    return len(body).to_bytes(4, "big") + body


def _handshake(sock: socket.socket, corr: int) -> int:
    sock.sendall(request_frame(17, 1, corr, {"mechanism": "PLAIN"}))
    return int(response(sock, 17, 1, 4).error_code.value)


def test_api_versions_is_served_once_and_only_before_the_handshake(
    redis_server: Any, namespace: str, auth: AuthConfig,
) -> None:
    # Kafka's SaslServerAuthenticator: ApiVersions, then SaslHandshake, then SaslAuthenticate.
    with running_gateway(redis_server, namespace, auth=auth) as gw:
        with connect(gw) as twice:  # a second ApiVersions closes the connection unanswered
            twice.sendall(_api_versions(1))
            assert response(twice, 18, 3, 4).error_code.value == 0
            twice.sendall(_api_versions(2))
            assert closed_by_gateway(twice, WAIT_S)
        with connect(gw) as retried:  # one answered UNSUPPORTED_VERSION does not count
            retried.sendall(_unserved_api_versions(1))
            assert response(retried, 18, 0, 4).error_code.value == UNSUPPORTED_VERSION
            retried.sendall(_api_versions(2))
            assert response(retried, 18, 3, 4).error_code.value == 0
            assert _handshake(retried, 3) == 0
            retried.sendall(request_frame(36, 2, 4, {"auth_bytes": b"\0alice\0" +
                                                     PASSWORD.encode()}))
            assert response(retried, 36, 2, 5).error_code.value == 0
            retried.sendall(_api_versions(5))  # once authenticated, as often as it likes
            assert response(retried, 18, 3, 4).error_code.value == 0
        with connect(gw) as late:  # after the handshake: ILLEGAL_SASL_STATE, then closed
            assert _handshake(late, 1) == 0
            late.sendall(_api_versions(2))
            assert response(late, 18, 3, 4).error_code.value == ILLEGAL_SASL_STATE
            assert closed_by_gateway(late, WAIT_S)
        with connect(gw) as again:
            assert _handshake(again, 1) == 0
            assert _handshake(again, 2) == ILLEGAL_SASL_STATE
            assert closed_by_gateway(again, WAIT_S)


def test_another_request_after_the_handshake_is_answered_illegal_sasl_state_then_closed(
    redis_server: Any, namespace: str, auth: AuthConfig,
) -> None:
    # Kafka's handleSaslToken: after SaslHandshake any request it can parse but SaslAuthenticate
    # gets its own error response with ILLEGAL_SASL_STATE, then the connection closes. The
    # gateway closed it unanswered (as Kafka does only before the handshake, kept here).
    metadata = request_frame(3, 12, 2, {"topics": [{"name": "t"}]})
    with running_gateway(redis_server, namespace, auth=auth) as gw:
        with connect(gw) as after:
            assert _handshake(after, 1) == 0
            after.sendall(metadata)
            (topic,) = response(after, 3, 12, 5).topics
            assert (topic.name, topic.error_code.value) == ("t", ILLEGAL_SASL_STATE)
            assert closed_by_gateway(after, WAIT_S)
        with connect(gw) as everything:  # all topics: nothing to carry the code, as before
            assert _handshake(everything, 1) == 0
            everything.sendall(request_frame(3, 12, 2, {"topics": None}))
            assert closed_by_gateway(everything, WAIT_S)
        with connect(gw) as before:  # before the handshake: closed unanswered, as Kafka
            before.sendall(metadata)
            assert closed_by_gateway(before, WAIT_S)


@pytest.mark.parametrize("version", [1, 3])
def test_find_coordinator_below_v4_after_the_handshake_names_no_node(
    redis_server: Any, namespace: str, auth: AuthConfig, version: int,
) -> None:
    # Kafka's FindCoordinatorRequest.getErrorResponse below v4: prepareOldResponse with
    # Node.noNode() (-1, "", -1) and the error's message. The gateway sent node 0, port 0 and
    # a null message: a coordinator address that looks real.
    with running_gateway(redis_server, namespace, auth=auth) as gw, connect(gw) as sock:
        assert _handshake(sock, 1) == 0
        sock.sendall(request_frame(10, version, 2, {"key": "g", "key_type": 0}))
        found = response(sock, 10, version, 5 if version >= 3 else 4)
        assert (found.error_code.value, found.node_id, found.host, found.port) == (
            ILLEGAL_SASL_STATE, -1, "", -1)
        assert found.error_message == "Request is not valid given the current SASL state."
        assert closed_by_gateway(sock, WAIT_S)


def test_sasl_authenticate_once_authenticated_is_refused_and_the_connection_stays(
    redis_server: Any, namespace: str, auth: AuthConfig,
) -> None:
    # Kafka's KafkaApis.handleSaslAuthenticateRequest: ILLEGAL_SASL_STATE, connection open
    # (the gateway closed it, saying "no SASL handshake before"); likewise on a listener
    # without authentication, where Kafka's request reaches KafkaApis too.
    token = {"auth_bytes": b"\0alice\0" + PASSWORD.encode()}
    with running_gateway(redis_server, namespace, auth=auth) as gw, \
            sasl_connect(gw, "alice", PASSWORD) as sock:
        sock.sendall(request_frame(36, 2, 7, token))
        again = response(sock, 36, 2, 5)
        assert again.error_code.value == ILLEGAL_SASL_STATE
        assert again.error_message == ("SaslAuthenticate request received after successful "
                                       "authentication")
        sock.sendall(_api_versions(8))
        assert response(sock, 18, 3, 4).error_code.value == 0
    with running_gateway(redis_server, namespace) as gw, connect(gw) as sock:
        sock.sendall(request_frame(36, 2, 7, token))
        plain = response(sock, 36, 2, 5)
        assert plain.error_code.value == ILLEGAL_SASL_STATE
        assert "does not authenticate" in plain.error_message
        sock.sendall(_api_versions(8))
        assert response(sock, 18, 3, 4).error_code.value == 0


@pytest.mark.parametrize(("name", "version"), [("bad name!", "1"), ("t", ""), ("-t", "1"),
                                               ("t", "1.")])
def test_api_versions_refuses_a_software_name_kafka_refuses(
    redis_server: Any, namespace: str, auth: AuthConfig, name: str, version: str,
) -> None:
    # Kafka's ApiVersionsRequest.isValid (v3+): letters, digits, '-' and '.', starting and
    # ending with a letter or digit; INVALID_REQUEST and no API keys. Before a SASL handshake
    # the refused one does not count as the connection's ApiVersions.
    bad = request_frame(18, 3, 1, {"client_software_name": name,
                                   "client_software_version": version})
    with running_gateway(redis_server, namespace) as gw, connect(gw) as sock:
        sock.sendall(bad)
        refused = response(sock, 18, 3, 4)
        assert refused.error_code.value == 42 and refused.api_keys == ()
        sock.sendall(request_frame(18, 3, 2, {"client_software_name": "apache-kafka-java",
                                              "client_software_version": "3.9.0-rc1"}))
        assert response(sock, 18, 3, 4).error_code.value == 0
    with running_gateway(redis_server, namespace, auth=auth) as gw, connect(gw) as sock:
        sock.sendall(bad)
        assert response(sock, 18, 3, 4).error_code.value == 42
        sock.sendall(_api_versions(2))
        assert response(sock, 18, 3, 4).error_code.value == 0
        assert _handshake(sock, 3) == 0


def test_requests_do_not_keep_an_unauthenticated_connection_open(
    redis_server: Any, namespace: str, auth: AuthConfig,
) -> None:
    # Counted from accept: one that asks for ApiVersions every 50 ms (each answered
    # UNSUPPORTED_VERSION, which Kafka's order allows again) is closed after about the idle
    # limit; an authenticated one asking as often stays open.
    with running_gateway(redis_server, namespace, auth=auth, connections_max_idle_ms=300) as gw:
        deadline = time.monotonic() + WAIT_S
        with connect(gw) as pending, sasl_connect(gw, "alice", PASSWORD) as authenticated:
            for corr in range(1, 10**6):
                authenticated.sendall(_api_versions(corr))
                assert response(authenticated, 18, 3, 4).error_code.value == 0
                try:
                    pending.sendall(_unserved_api_versions(corr))
                    recv_frame(pending)
                except OSError:  # (ConnectionError: closed by the gateway)
                    break
                assert time.monotonic() < deadline, "its requests kept it open"
                time.sleep(0.05)
            authenticated.sendall(_api_versions(0))
            assert response(authenticated, 18, 3, 4).error_code.value == 0


def test_a_failed_authentication_is_answered_late_without_holding_up_others(
    redis_server: Any, namespace: str, auth: AuthConfig,
) -> None:
    # Kafka's connection.failed.authentication.delay.ms (default 100 ms): one client can no
    # longer try passwords as fast as the round trips go (about 1400 a second before).
    assert auth.failed_authentication_delay_ms == 100
    with pytest.raises(ValueError, match="failed_authentication_delay_ms"):
        AuthConfig({"a": "b"}, failed_authentication_delay_ms=-1)
    slow = dataclasses.replace(auth, failed_authentication_delay_ms=int(WAIT_S * 1000))
    with running_gateway(redis_server, namespace, auth=slow) as gw, connect(gw) as guesser:
        assert _handshake(guesser, 1) == 0
        guesser.sendall(request_frame(36, 2, 2, {"auth_bytes": b"\0alice\0guess"}))
        with sasl_connect(gw, "alice", PASSWORD) as other:  # served meanwhile
            other.sendall(_api_versions(3))
            assert response(other, 18, 3, 4).error_code.value == 0
        assert select.select([guesser], [], [], 0.5)[0] == [], "answered without the delay"
    fast = dataclasses.replace(auth, failed_authentication_delay_ms=0)
    with running_gateway(redis_server, namespace, auth=fast) as gw, connect(gw) as guesser:
        assert _handshake(guesser, 1) == 0
        guesser.sendall(request_frame(36, 2, 2, {"auth_bytes": b"\0alice\0guess"}))
        assert response(guesser, 36, 2, 5).error_code.value == SASL_AUTHENTICATION_FAILED
        assert closed_by_gateway(guesser, WAIT_S)


# -- TLS: a corrupt record, and files that cannot be used ---------------------------------------

@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl CLI")
    d = tmp_path_factory.mktemp("gateway-tls-files")
    make_certs(d)
    subprocess.run(["openssl", "pkey", "-in", "server.key", "-aes256", "-passout",
                    "pass:secret", "-out", "server-enc.key"], cwd=d, check=True,
                   capture_output=True, timeout=WAIT_S)
    (d / "pass-phrase").write_text("secret\n")
    (d / "wrong-pass-phrase").write_text("secre\n")
    (d / "empty-pass-phrase").write_text("\n")
    return d


def _handshake_then_corrupt_record(address: tuple[str, int], ca: Path) -> None:
    ctx = ssl.create_default_context(cafile=str(ca))
    ctx.maximum_version = ssl.TLSVersion.TLSv1_2
    with socket.create_connection(address, timeout=WAIT_S) as sock:
        incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        tls = ctx.wrap_bio(incoming, outgoing, server_hostname="127.0.0.1")
        while True:
            try:
                tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                sock.sendall(outgoing.read())
                data = sock.recv(65536)
                assert data, "closed during the handshake"
                incoming.write(data)
        sock.sendall(outgoing.read())
        sock.sendall(b"\x17\x03\x03\x00\x20" + b"\xaa" * 32)  # application data, bad MAC
        with pytest.raises(OSError):  # read until the gateway closes it
            while sock.recv(4096):
                pass
            raise ConnectionError("closed")


def test_a_corrupt_tls_record_closes_its_connection_with_one_line(
    redis_server: Any, namespace: str, auth: AuthConfig, certs: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # It was "Unhandled exception in client_connected_cb" and a traceback, at ERROR, per
    # connection: a peer that never authenticates could fill the log with them.
    caplog.set_level(logging.INFO)
    with running_gateway(redis_server, namespace, auth=auth,
                         tls_cert_file=str(certs / "server.pem"),
                         tls_key_file=str(certs / "server.key")) as gw:
        _handshake_then_corrupt_record(gw.address, certs / "ca.pem")

        def logged() -> list[str]:
            return [r.getMessage() for r in caplog.records
                    if r.name == "rcoord.gateway" and "SSLError" in r.getMessage()]

        wait_until(lambda: logged(), timeout_s=WAIT_S)
    assert len(logged()) == 1 and logged()[0].startswith("closing connection from 127.0.0.1:")
    # (The gateway's: not an error some other test's thread, still ending, logged meanwhile.)
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR
            and (r.name.startswith("rcoord.gateway") or r.name == "asyncio")] == []


@pytest.mark.parametrize(("flags", "flag", "file", "problem"), [
    ({"cert": "server.pem", "key": "server-enc.key"}, "--listen-tls-key-file",
     "server-enc.key", ("holds an encrypted private key and no pass phrase file was given "
                        "(--listen-tls-key-password-file")),
    ({"cert": "server.pem", "key": "server-enc.key", "key-password": "wrong-pass-phrase"},
     "--listen-tls-key-password-file", "wrong-pass-phrase", "does not hold the pass phrase of"),
    ({"cert": "server.pem", "key": "server-enc.key", "key-password": "empty-pass-phrase"},
     "--listen-tls-key-password-file", "empty-pass-phrase", "is empty"),
    ({"cert": "server.pem", "key": "server-enc.key", "key-password": "no-such-file"},
     "--listen-tls-key-password-file", "no-such-file", "does not exist"),
    ({"cert": "server.pem", "key": "client.key"}, "--listen-tls-key-file", "client.key",
     "is not the private key of the certificate in"),
    ({"cert": "server.pem", "key": "server.key", "ca": "san.ext"}, "--listen-tls-ca-file",
     "san.ext", "holds no PEM CA certificate"),
    ({"cert": "server.key", "key": "server.key"}, "--listen-tls-cert-file", "server.key",
     "holds no PEM certificate"),
    ({"cert": "server.pem", "key": "ca.pem"}, "--listen-tls-key-file", "ca.pem",
     "holds no PEM private key"),
])
def test_listener_tls_files_that_cannot_be_used_are_usage_errors(
    certs: Path, refused_port: int, flags: dict[str, str], flag: str, file: str, problem: str,
) -> None:
    # An encrypted key made OpenSSL ask for its pass phrase at the terminal (a gateway with
    # one waited there); the others were "unexpected SSLError", exit 1. Each is now checked
    # before Redis is reached (none listens on refused_port). No terminal: a new session.
    args = [f"--listen-tls-{k}-file={certs / v}" for k, v in
            (("cert", flags["cert"]), ("key", flags["key"]), ("ca", flags.get("ca")),
             ("key-password", flags.get("key-password")))
            if v is not None]
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}
    res = subprocess.run(
        [sys.executable, "-m", "rcoord", "gateway", "--listen", "127.0.0.1:0", "--redis-url",
         f"redis://127.0.0.1:{refused_port}", *args], env=env, capture_output=True, text=True,
        timeout=WAIT_S, check=False, stdin=subprocess.DEVNULL, start_new_session=True)
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.returncode == 2 and len(lines) == 1, res.stderr
    assert lines[0].startswith(f"rcoord gateway: error: {flag} '{certs / file}' {problem}"), \
        lines[0]


def test_an_encrypted_key_is_served_with_its_pass_phrase_file(
    redis_server: Any, namespace: str, certs: Path,
) -> None:
    # Kafka's ssl.key.password: the key stays encrypted on disk, its pass phrase in a file of
    # its own. Before, an encrypted key was refused and had to be stored decrypted.
    with running_gateway(redis_server, namespace, tls_cert_file=str(certs / "server.pem"),
                         tls_key_file=str(certs / "server-enc.key"),
                         tls_key_password_file=str(certs / "pass-phrase")) as gw:
        ctx = ssl.create_default_context(cafile=str(certs / "ca.pem"))
        with connect(gw) as raw, ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            tls.sendall(request_frame(18, 3, 1, {"client_software_name": "t",
                                                 "client_software_version": "1"}))
            assert response(tls, 18, 3, 4).error_code.value == 0
