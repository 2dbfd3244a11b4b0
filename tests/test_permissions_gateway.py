"""A request the gateway's own Redis user is refused while it runs: the Kafka client gets the
error on every partition it named, and the gateway's log says once, in one line, which rule
to add (not a traceback per request)."""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from gateway_harness import (
    GatewayThread,
    connect,
    produced_batch,
    request_frame,
    response,
    settle_fast_groups,
)

from rcoord.testing.embedded import EmbeddedServer
from rcoord.topics import Record, Topics

UNKNOWN_SERVER_ERROR = -1
COORDINATOR_NOT_AVAILABLE = 15
REQUEST_TIMED_OUT = 7


def _produce(sock: Any, corr: int) -> dict[tuple[str, int], int]:
    batch = produced_batch([Record(0, b"k", b"v", {}, 0)])
    sock.sendall(request_frame(0, 9, corr, {"acks": -1, "timeout": 1000, "topic_data": [
        {"name": "t", "partition_data": [{"index": 0, "records": batch},
                                         {"index": 1, "records": batch}]}]}))
    got = response(sock, 0, 9, 5)
    return {(t.name, p.index): int(p.error_code.value)
            for t in got.responses for p in t.partition_responses}


@contextlib.contextmanager
def _gateway_as_own_user(own_server: EmbeddedServer, caplog: pytest.LogCaptureFixture,
                         topics: dict[str, int], *, fast_groups: bool = False,
                         rules: tuple[str, ...] = ()) -> Iterator[tuple[Any, Any, str, str]]:
    """A gateway running as an ACL user of its own (every command, the namespace's keys, and
    ``rules``) over ``topics``: yields (a socket to it, an admin client, the user's name, the
    namespace), with the gateway's log captured at DEBUG."""
    ns = "p" + uuid.uuid4().hex[:10]
    user = "gw" + uuid.uuid4().hex[:6]
    admin = own_server.client()
    if fast_groups:
        settle_fast_groups(admin, ns)
    for name, count in topics.items():
        Topics(admin, ns).create(name, count)
    admin.execute_command("ACL", "SETUSER", user, "on", ">pw", f"~{ns}:*", *rules, "+@all")
    gw = GatewayThread(own_server.url.replace("redis://", f"redis://{user}:pw@"), ns).start()
    sock = connect(gw)
    try:
        with caplog.at_level(logging.DEBUG, logger="rcoord.gateway"):
            yield sock, admin, user, ns
    finally:
        sock.close()
        gw.stop()
        admin.execute_command("ACL", "DELUSER", user)
        admin.close()


@contextlib.contextmanager
def _rotated(own_server: EmbeddedServer, caplog: pytest.LogCaptureFixture,
             topics: dict[str, int], *, fast_groups: bool = False) -> Iterator[Any]:
    """A gateway running as its own ACL user over ``topics``, whose password is changed under
    it (its connections killed, so they log in again): yields a socket to it, with the
    gateway's log captured at DEBUG."""
    with _gateway_as_own_user(own_server, caplog, topics, fast_groups=fast_groups,
                              rules=("&*",)) as (sock, admin, user, _):
        admin.execute_command("ACL", "SETUSER", user, "resetpass", ">rotated")
        admin.execute_command("CLIENT", "KILL", "USER", user)  # its connections log in again
        yield sock


def _logged(caplog: pytest.LogCaptureFixture) -> tuple[list[str], int]:
    """The gateway's warnings (and errors), and how many debug lines said "logged before"."""
    ours = [r for r in caplog.records if r.name == "rcoord.gateway"]
    return ([r.getMessage() for r in ours if r.levelno >= logging.WARNING],
            len([r for r in ours if r.levelno == logging.DEBUG
                 and "logged before" in r.getMessage()]))


def _commit(sock: Any, corr: int) -> dict[tuple[str, int], int]:
    sock.sendall(request_frame(8, 8, corr, {
        "group_id": "g", "generation_id_or_member_epoch": -1, "member_id": "",
        "topics": [{"name": "t", "partitions": [
            {"partition_index": p, "committed_offset": 1} for p in (0, 1)]}]}))
    got = response(sock, 8, 8, 5)
    return {(t.name, p.partition_index): int(p.error_code.value)
            for t in got.topics for p in t.partitions}


def test_a_refused_request_is_logged_once_naming_the_rule(own_server: EmbeddedServer,
                                                          caplog: pytest.LogCaptureFixture
                                                          ) -> None:
    refused = {("t", 0): UNKNOWN_SERVER_ERROR, ("t", 1): UNKNOWN_SERVER_ERROR}
    with _gateway_as_own_user(own_server, caplog, {"t": 2},
                              fast_groups=True) as (sock, admin, user, ns):
        admin.execute_command("ACL", "SETUSER", user, "-xadd")  # refused in the script
        assert _produce(sock, 1) == refused
        assert _produce(sock, 2) == refused
        admin.execute_command("ACL", "SETUSER", user, "+xadd", "resetkeys")  # the keys
        assert _produce(sock, 3) == refused
        assert _produce(sock, 4) == refused
    ours = [r for r in caplog.records if r.name == "rcoord.gateway"]
    assert not [r for r in ours if r.exc_info], "a traceback was logged"
    errors = [r.getMessage() for r in ours if r.levelno >= logging.WARNING]
    assert len(errors) == 2, errors  # one per refusal, not one per request
    assert "run the 'xadd' command" in errors[0] and "docs/security.md" in errors[0]
    assert f"the user's key patterns must include ~{ns}:*" in errors[1]
    assert all(m.startswith("Produce v9: ") and "logged again at most once a minute" in m
               for m in errors)
    again = [r.getMessage() for r in ours if r.levelno == logging.DEBUG and "logged before" in
             r.getMessage()]
    assert len(again) == 2


def test_a_refusal_mended_and_met_again_is_logged_again(own_server: EmbeddedServer,
                                                       caplog: pytest.LogCaptureFixture,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A refusal was logged once per process: a rule granted, then removed again (an old ACL
    file reloaded), failed every request with debug lines only. It is logged again once
    ``MISSING_PERMISSION_LOG_INTERVAL_S`` has passed, with the requests refused meanwhile."""
    from rcoord.gateway import dispatch

    refused = {("t", 0): UNKNOWN_SERVER_ERROR, ("t", 1): UNKNOWN_SERVER_ERROR}
    with _gateway_as_own_user(own_server, caplog, {"t": 2}) as (sock, admin, user, _):
        admin.execute_command("ACL", "SETUSER", user, "-xadd")
        assert _produce(sock, 1) == refused
        assert _produce(sock, 2) == refused
        admin.execute_command("ACL", "SETUSER", user, "+xadd")  # mended
        assert _produce(sock, 3) == {("t", 0): 0, ("t", 1): 0}
        monkeypatch.setattr(dispatch, "MISSING_PERMISSION_LOG_INTERVAL_S", 0.0,
                            raising=False)
        admin.execute_command("ACL", "SETUSER", user, "-xadd")  # and refused again
        assert _produce(sock, 4) == refused
    errors, before = _logged(caplog)
    assert len(errors) == 2, errors
    assert all("run the 'xadd' command" in m for m in errors)
    assert "since the last such line" not in errors[0]
    assert "(1 more call met it since the last such line)" in errors[1]
    assert before == 1


def test_a_refused_login_of_the_gateways_is_logged_once_a_while_not_per_request(
        own_server: EmbeddedServer, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The gateway's password changed under it: each request still gets the retriable answer
    (the Kafka client retries until the gateway is restarted with the new one), but the log
    says so once, then again at most every ``LOGIN_REFUSED_LOG_INTERVAL_S`` with how many
    requests failed meanwhile, instead of a warning per request (a polling consumer's
    Fetches: hundreds a second)."""
    from rcoord.gateway import errors

    with _rotated(own_server, caplog, {"t": 2}, fast_groups=True) as sock:
        answers = [_commit(sock, corr) for corr in (1, 2, 3)]
        monkeypatch.setattr(errors, "LOGIN_REFUSED_LOG_INTERVAL_S", 0.0)
        answers.append(_commit(sock, 4))
    assert all(a == {("t", 0): COORDINATOR_NOT_AVAILABLE, ("t", 1): COORDINATOR_NOT_AVAILABLE}
               for a in answers)
    warned, before = _logged(caplog)
    assert len(warned) == 2, warned
    assert all("refused the login" in m and "check the user and password" in m for m in warned)
    assert "since the last such line" not in warned[0]
    assert "(2 more calls met it since the last such line)" in warned[1]
    assert before == 2


def test_a_refused_login_met_by_produce_is_logged(own_server: EmbeddedServer,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    """A Produce answers each partition on its own (REQUEST_TIMED_OUT, retriable) and logged
    nothing: a gateway that only producers used gave no sign that Redis refused its login.
    It is logged as for other requests: once, then at most once a while."""
    with _rotated(own_server, caplog, {"t": 2}) as sock:
        answers = [_produce(sock, corr) for corr in (1, 2)]
    assert answers == [{("t", 0): REQUEST_TIMED_OUT, ("t", 1): REQUEST_TIMED_OUT}] * 2
    warned, before = _logged(caplog)
    assert len(warned) == 1, warned
    assert warned[0].startswith("Produce v9: ") and "refused the login" in warned[0]
    assert before == 3  # the other partition, and both of the second request


def test_a_gateway_refused_its_namespaces_keys_at_start_names_the_pattern(
        own_server: EmbeddedServer) -> None:
    """``rcoord gateway`` as a user whose key pattern is another namespace's: one line, exit
    1, naming the pattern to grant with the gateway's namespace filled in (rcoord's boundary,
    where the refusal became MissingPermissionError, does not know it)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    user = "gw" + uuid.uuid4().hex[:6]
    admin = own_server.client()
    admin.execute_command("ACL", "SETUSER", user, "on", ">pw", "~other:*", "&*", "+@all")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RCOORD_")}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parent.parent)
    env["RCOORD_REDIS_URL"] = own_server.url.replace("redis://", f"redis://{user}:pw@")
    try:
        res = subprocess.run([sys.executable, "-m", "rcoord", "gateway", "--listen",
                              "127.0.0.1:0", "--namespace", "orders"], env=env,
                             capture_output=True, text=True, timeout=60, check=False)
    finally:
        admin.execute_command("ACL", "DELUSER", user)
        admin.close()
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.returncode == 1 and len(lines) == 1, res.stderr
    assert lines[0].startswith("rcoord gateway: error: the Redis user may not do what rcoord "
                               "needs: ")
    assert "No permissions to access a key" in lines[0]
    assert "namespace 'orders': the user's key patterns must include ~orders:*" in lines[0]


def _delete_records(sock: Any, corr: int) -> dict[tuple[str, int], int]:
    sock.sendall(request_frame(21, 1, corr, {"timeout_ms": 1000, "topics": [
        {"name": name, "partitions": [{"partition_index": 0, "offset": 0}]}
        for name in ("t", "u")]}))
    got = response(sock, 21, 1, 4)  # (header v0: DeleteRecords v1 is not flexible)
    return {(t.name, p.partition_index): int(p.error_code.value)
            for t in got.topics for p in t.partitions}


def test_a_refused_login_met_by_an_admin_request_is_logged_once_a_while(
        own_server: EmbeddedServer, caplog: pytest.LogCaptureFixture) -> None:
    """The admin requests answer each topic on its own (REQUEST_TIMED_OUT) and logged a
    warning per topic and request for a refused login of the gateway's own ("Redis unreachable
    or unavailable"), where every other request logs it once, then at most once a while."""
    with _rotated(own_server, caplog, {"t": 1, "u": 1}) as sock:
        answers = [_delete_records(sock, corr) for corr in (1, 2)]
    assert answers == [{("t", 0): REQUEST_TIMED_OUT, ("u", 0): REQUEST_TIMED_OUT}] * 2
    warned, before = _logged(caplog)
    assert len(warned) == 1, warned
    assert warned[0].startswith("topic ") and "refused the login" in warned[0]
    assert before == 3


@pytest.mark.parametrize("refusal", ["login", "permission"])
def test_a_fetch_failed_whole_is_answered_after_its_max_wait(
        own_server: EmbeddedServer, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch, refusal: str) -> None:
    """A Fetch failed as a whole (Redis refused the gateway's login, or its user a command)
    was answered at once, and kafka-python, which does not back off from a Fetch's errors,
    fetched again at once: about 700 Fetches a second (1563 in 2 s, measured). Held until its
    ``max_wait``, it comes once per ``max_wait`` at most."""
    import dataclasses
    import time

    import kafka

    from rcoord.gateway.registry import REGISTRY

    fetches: list[float] = []
    served = REGISTRY[1]

    async def counted(conn: Any, req: Any, version: int) -> Any:
        fetches.append(time.monotonic())
        return await served.handler(conn, req, version)

    monkeypatch.setitem(REGISTRY, 1, dataclasses.replace(served, handler=counted))
    max_wait_ms = 200
    ns = "p" + uuid.uuid4().hex[:10]
    user = "gw" + uuid.uuid4().hex[:6]
    admin = own_server.client()
    Topics(admin, ns).create("t", 1)
    admin.execute_command("ACL", "SETUSER", user, "on", ">pw", f"~{ns}:*", "&*", "+@all")
    gw = GatewayThread(own_server.url.replace("redis://", f"redis://{user}:pw@"), ns).start()
    consumer = kafka.KafkaConsumer(bootstrap_servers=gw.bootstrap,
                                   fetch_max_wait_ms=max_wait_ms)
    tp = kafka.TopicPartition("t", 0)
    try:
        consumer.assign([tp])
        consumer.seek(tp, 0)
        while not fetches:
            consumer.poll(50)
        with caplog.at_level(logging.DEBUG, logger="rcoord.gateway"):
            if refusal == "login":
                admin.execute_command("ACL", "SETUSER", user, "resetpass", ">rotated")
                admin.execute_command("CLIENT", "KILL", "USER", user)
            else:
                admin.execute_command("ACL", "SETUSER", user, "-xrange", "-xrevrange")
            first = len(fetches)
            while len(fetches) < first + 3:  # (the first may have been under way)
                consumer.poll(50)
            began, counted_from = time.monotonic(), len(fetches)
            while time.monotonic() - began < 1.0:
                consumer.poll(50)
            ended, seen = time.monotonic(), len(fetches) - counted_from
    finally:
        consumer.close()
        gw.stop()
        admin.execute_command("ACL", "DELUSER", user)
        admin.close()
    warned, _ = _logged(caplog)
    assert warned, "the refusal was not logged"  # (so the Fetches did fail)
    # (one connection, one Fetch at a time, each held max_wait: at most one per max_wait)
    assert seen <= (ended - began) * 1000 / max_wait_ms + 2, seen
