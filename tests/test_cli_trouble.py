"""The operator's commands when things go wrong while they run: Redis going away between the
steps of a command must leave the output saying what was done before it went, next to the one
error line."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import pytest
from test_cli_errors import one_error_line
from test_cli_groups import run_in_process

from rcoord import GroupCoordinator, TopicPartition
from rcoord.config import CoordinatorConfig
from rcoord.testing.embedded import EmbeddedServer
from rcoord.topics import Topics


@pytest.fixture
def no_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in [k for k in os.environ if k.startswith("RCOORD_")]:
        monkeypatch.delenv(key)


@pytest.fixture
def server_with_groups(own_server: EmbeddedServer, namespace: str,
                       no_env: None) -> Iterator[EmbeddedServer]:
    """A server whose namespace holds three Empty groups, "a", "b" and "c"."""
    with own_server.client() as client:
        coord = GroupCoordinator(client, CoordinatorConfig(namespace=namespace)).start()
        for group in ("a", "b", "c"):
            coord.commit_offsets(group, {TopicPartition("t", 0): 1})
    yield own_server


@pytest.mark.parametrize("output", ["table", "json"])
def test_groups_deleted_before_redis_went_away_are_reported(
        server_with_groups: EmbeddedServer, namespace: str, output: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``groups delete a b c`` deletes group by group; when Redis goes away after "a" went,
    the output still says that "a" was deleted (as ``topics delete`` does), beside the error.
    Before, it said nothing of it: a script (or a person) took the whole command for undone,
    and the run again refused "a" as GROUP_ID_NOT_FOUND."""
    server = server_with_groups
    real = GroupCoordinator.delete_groups

    def stop_after_the_first(self: GroupCoordinator, ids: Any) -> Any:
        out = {}
        for gid in ids:
            if gid == "b":
                server.stop()  # Redis goes away after "a" was deleted
            out.update(real(self, [gid]))
        return out

    monkeypatch.setattr(GroupCoordinator, "delete_groups", stop_after_the_first)
    res = run_in_process(["groups", "delete", "a", "b", "c", "--redis-url", server.url,
                          "--namespace", namespace, "--output", output])
    assert res.returncode == 1
    assert "cannot reach Redis" in one_error_line(res, "groups delete")
    if output == "json":
        assert json.loads(res.stdout)["deleted"] == ["a"]
    else:
        assert res.stdout.strip() == ("Deletion of requested consumer groups ('a') was "
                                      "successful.")


def test_produce_to_a_replica_says_to_use_the_master(own_server: EmbeddedServer, namespace: str,
                                                     refused_port: int, no_env: None) -> None:
    """An append refused by a read-only replica is named as the other commands name it, with
    what to do: ``topics produce`` wrapped the raw error, whose "Redis cannot run this now; try
    again" sent the operator to retry against the replica for ever."""
    with own_server.client() as client:
        Topics(client, namespace).create("t", 1)
        client.execute_command("REPLICAOF", "127.0.0.1", refused_port)  # keeps its data
    res = run_in_process(["topics", "produce", "t", "--redis-url", own_server.url,
                          "--namespace", namespace], stdin="a\nb\n")
    line = one_error_line(res, "topics produce")
    assert res.returncode == 1
    assert "read-only replica" in line and "give the URL of its master" in line, line
    assert "try again" not in line, line
    assert line.endswith("no line was produced; lines 1-2 may or may not have been"), line


def test_a_key_separator_that_starts_with_a_dash(redis_server: EmbeddedServer, namespace: str,
                                                 no_env: None) -> None:
    """``--key-separator '->'`` is the separator, for produce and consume alike, as
    ``--by-duration -PT1H`` is a duration: it was refused as "unrecognized option: ->" (only
    ``--key-separator=->`` worked). A value left out before the next option is still an error,
    never that option taken for the separator."""
    url = redis_server.url
    common = ["--redis-url", url, "--namespace", namespace]
    with redis_server.client() as client:
        Topics(client, namespace).create("t", 1)
    res = run_in_process(["topics", "produce", "t", "--key-separator", "->", *common],
                         stdin="k->v\n")
    assert res.returncode == 0, res.stderr
    res = run_in_process(["topics", "consume", "t", "--from-beginning", "--max-messages", "1",
                          "--print-key", "--key-separator", "->", *common])
    assert (res.returncode, res.stdout) == (0, "k->v\n"), res.stderr
    res = run_in_process(["topics", "consume", "t", "--from-beginning", "--max-messages", "1",
                          "--key-separator", "--print-key", *common])
    assert res.returncode == 2
    assert "--key-separator: expected one argument" in one_error_line(res, "topics consume")


def test_describing_every_topic_leaves_out_one_deleted_meanwhile(
        redis_server: EmbeddedServer, namespace: str, no_env: None,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``topics describe`` (no topic named) lists the topics, then reads each: one deleted in
    between is left out, as if listed a moment later. It failed the command (exit 1,
    UNKNOWN_TOPIC_OR_PARTITION) naming a topic the operator never named, so a periodic
    ``topics describe --output json`` failed whenever another job deleted a topic."""
    with redis_server.client() as client:
        Topics(client, namespace).create("kept", 1)
        Topics(client, namespace).create("gone", 1)
    real = Topics.list

    def list_then_delete(self: Topics) -> list[str]:
        names = real(self)
        self.delete("gone")  # another job deletes it right after the listing
        return names

    monkeypatch.setattr(Topics, "list", list_then_delete)
    res = run_in_process(["topics", "describe", "--output", "json", "--redis-url",
                          redis_server.url, "--namespace", namespace])
    assert res.returncode == 0, res.stderr
    assert [d["topic"] for d in json.loads(res.stdout)] == ["kept"]
    # A topic named that does not exist is still an error.
    res = run_in_process(["topics", "describe", "gone", "--redis-url", redis_server.url,
                          "--namespace", namespace])
    assert res.returncode == 1
    assert "UNKNOWN_TOPIC_OR_PARTITION" in one_error_line(res, "topics describe")


def test_produce_to_a_topic_deleted_meanwhile_names_the_kafka_error(
        redis_server: EmbeddedServer, namespace: str, no_env: None,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A Kafka error met while producing reads as in every other command's error line (the
    error name and the topic), followed by which lines were produced."""
    from rcoord.topics import Producer

    with redis_server.client() as client:
        Topics(client, namespace).create("t", 1)
    real = Producer.send_batch
    calls: list[int] = []

    def second_after_a_delete(self: Producer, topic: str, batch: Any) -> Any:
        calls.append(len(batch))
        if len(calls) == 2:
            with redis_server.client() as client:
                Topics(client, namespace).delete(topic)
        return real(self, topic, batch)

    monkeypatch.setattr(Producer, "send_batch", second_after_a_delete)
    res = run_in_process(["topics", "produce", "t", "--redis-url", redis_server.url,
                          "--namespace", namespace],
                         stdin="".join(f"n{i}\n" for i in range(700)))
    line = one_error_line(res, "topics produce")
    assert res.returncode == 1 and calls == [500, 200]
    assert line.startswith("rcoord topics produce: error: UNKNOWN_TOPIC_OR_PARTITION"), line
    assert line.endswith("lines 1-500 were produced (500 records); lines 501-700 may or may "
                         "not have been"), line
