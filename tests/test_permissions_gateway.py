"""A request the gateway's own Redis user is refused while it runs: the Kafka client gets the
error on every partition it named, and the gateway's log says once, in one line, which rule
to add (not a traceback per request)."""

from __future__ import annotations

import logging
import uuid
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


def _produce(sock: Any, corr: int) -> dict[tuple[str, int], int]:
    batch = produced_batch([Record(0, b"k", b"v", {}, 0)])
    sock.sendall(request_frame(0, 9, corr, {"acks": -1, "timeout": 1000, "topic_data": [
        {"name": "t", "partition_data": [{"index": 0, "records": batch},
                                         {"index": 1, "records": batch}]}]}))
    got = response(sock, 0, 9, 5)
    return {(t.name, p.index): int(p.error_code.value)
            for t in got.responses for p in t.partition_responses}


def test_a_refused_request_is_logged_once_naming_the_rule(own_server: EmbeddedServer,
                                                          caplog: pytest.LogCaptureFixture
                                                          ) -> None:
    ns = "p" + uuid.uuid4().hex[:10]
    user = "gw" + uuid.uuid4().hex[:6]
    admin = own_server.client()
    settle_fast_groups(admin, ns)
    Topics(admin, ns).create("t", 2)
    admin.execute_command("ACL", "SETUSER", user, "on", ">pw", f"~{ns}:*", "+@all")
    gw = GatewayThread(own_server.url.replace("redis://", f"redis://{user}:pw@"), ns).start()
    sock = connect(gw)
    refused = {("t", 0): UNKNOWN_SERVER_ERROR, ("t", 1): UNKNOWN_SERVER_ERROR}
    try:
        with caplog.at_level(logging.DEBUG, logger="rcoord.gateway"):
            admin.execute_command("ACL", "SETUSER", user, "-xadd")  # refused in the script
            assert _produce(sock, 1) == refused
            assert _produce(sock, 2) == refused
            admin.execute_command("ACL", "SETUSER", user, "+xadd", "resetkeys")  # the keys
            assert _produce(sock, 3) == refused
            assert _produce(sock, 4) == refused
    finally:
        sock.close()
        gw.stop()
        admin.execute_command("ACL", "DELUSER", user)
        admin.close()
    ours = [r for r in caplog.records if r.name == "rcoord.gateway"]
    assert not [r for r in ours if r.exc_info], "a traceback was logged"
    errors = [r.getMessage() for r in ours if r.levelno >= logging.WARNING]
    assert len(errors) == 2, errors  # one per refusal, not one per request
    assert "run the 'xadd' command" in errors[0] and "docs/security.md" in errors[0]
    assert f"the user's key patterns must include ~{ns}:*" in errors[1]
    assert all(m.startswith("Produce v9: ") and "(logged once)" in m for m in errors)
    again = [r.getMessage() for r in ours if r.levelno == logging.DEBUG and "logged before" in
             r.getMessage()]
    assert len(again) == 2
