"""Review 76: reproductions of the defects found in this session's fixes; each test fails on
the code it was written against (see the review's report)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from test_cli_groups import cli, ok, produce, url  # noqa: F401  (fixtures)
from test_spark_member_reads import member, starts_of  # noqa: F401  (fixture)

from rcoord import Errors, TopicPartition
from rcoord.errors import ConnectionLost
from rcoord.protocol.offsets import TopicPartition as TP
from rcoord.topics import Topics, partition_key


@pytest.mark.parametrize("backend", ["single"])
def test_describe_does_not_call_an_unreadable_topic_deleted(cli: Any,  # noqa: F811
                                                            make_coordinator: Any,
                                                            redis_client: Any,
                                                            namespace: str) -> None:
    """95d7c45 takes a topic missing from ``log_ends`` for a deleted one, but ``log_ends``
    also leaves out a partition whose offsets cannot be read (an XADD by hand). A topic whose
    every partition is so is then said not to exist, its unknown lag is left out of a total
    shown as known, and the note tells the operator to delete its offsets."""
    coord = make_coordinator()
    topics = Topics(redis_client, namespace)
    topics.create("orders", 1)
    topics.create("audit", 1)
    produce(redis_client, namespace, "orders", {0: 9})
    produce(redis_client, namespace, "audit", {0: 3})
    errors = coord.commit_offsets("g", {TopicPartition("orders", 0): 4,
                                        TopicPartition("audit", 0): 1})
    assert set(errors.values()) == {Errors.NONE}
    redis_client.execute_command("XADD", partition_key(namespace, "audit", 0), "*", "x", "1")
    res = ok(cli("groups", "describe", "g"))
    assert "'audit' does not exist" not in res.stderr, res.stderr
    doc = json.loads(ok(cli("groups", "describe", "g", "--output", "json")).stdout)
    # audit-0's lag is unknown: the total is not known, 5 is only a lower bound.
    assert (doc["total_lag"], doc["known_lag"], doc["lag_unknown_partitions"]) == (None, 5, 1)


@pytest.mark.parametrize("backend", ["single"])
def test_a_start_chosen_before_is_not_committed_when_the_token_cannot_be_read(
    member: Any, monkeypatch: pytest.MonkeyPatch,  # noqa: F811
) -> None:
    """6a407ab leaves uncommitted a start chosen before in a topic made again since, but it
    tells that only from a token read now: a read that fails (Redis away a moment) gives no
    token, the start is taken for current, and the old topic's offset is committed after the
    new topic's creation, where a plain Consumer of the group takes it for the new topic's
    (the defect 6a407ab fixed). A start whose topic cannot be checked is not committed; the
    next generation places it again."""
    member._seen.update(starts_of())
    member._chosen[TP("ev", 0)] = (7, "the-deleted-topics-token")

    def away(self: Any, topic: str) -> str:
        raise ConnectionLost("Redis away")

    monkeypatch.setattr(Topics, "create_token", away)
    commits: list[dict[TP, Any]] = []
    gen = SimpleNamespace(group_id="g", member_id="m", committed={},
                          offsets={TP("ev", 0): 9}, commit_offsets=commits.append)
    assert member._place(gen, False) == {TP("ev", 0): 7}
    assert [sorted(c) for c in commits] == [], commits


def test_a_short_raw_plain_token_after_sasl_handshake_v0_logs_in(
        redis_server: Any, namespace: str, tmp_path: Path) -> None:
    """e2794a1 reads the raw token after SaslHandshake v0 as any frame, and ``read_frame``
    refuses a frame below the 8 bytes of a request header: a valid PLAIN token of 7 bytes
    ("\\0bob\\0pw") closed the connection (a FrameError, not even the failed-login delay).
    Kafka's NetworkReceive has no such floor; the token is the whole frame."""
    pytest.importorskip("kio")
    from gateway_harness import connect, recv_frame, request_frame, response, running_gateway

    from rcoord.gateway.auth import load_auth_file
    from rcoord.gateway.framing import frame

    path = tmp_path / "auth.json"
    path.write_text(json.dumps({"users": {"bob": "pw"}}))
    with running_gateway(redis_server, namespace, auth=load_auth_file(path)) as gw, \
            connect(gw) as sock:
        sock.sendall(request_frame(17, 0, 1, {"mechanism": "PLAIN"}))
        assert response(sock, 17, 0, 4).error_code.value == 0
        sock.sendall(frame(b"\0bob\0pw"))
        assert recv_frame(sock) == b""  # PLAIN's empty challenge: logged in
