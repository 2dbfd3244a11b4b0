"""A topic's configs after creation: ``Topics.alter_configs`` on a real server (one node and a
cluster), the Kafka operations it stands for (``rcoord.topics.configs.settings_change``), who
sees a change, and ``rcoord topics alter-configs``."""

from __future__ import annotations

import json
from typing import Any

import pytest
import test_acl
import test_cli_groups
from test_acl import users  # noqa: F401  (the fixture)
from test_cli_groups import ok, rows

from rcoord.errors import Errors
from rcoord.topics import Producer, TopicError, Topics, meta_key, producer_state_keys
from rcoord.topics.configs import APPEND, DELETE, SET, SUBTRACT, settings_change


@pytest.fixture
def topics(redis_client: Any, namespace: str) -> Topics:
    return Topics(redis_client, namespace)


def _settings(topics: Topics, topic: str) -> tuple[int | None, int | None, int | None]:
    d = topics.describe(topic)
    return d.retention_ms, d.retention_records, d.producer_id_expiration_ms


def test_settings_change_and_go_back_to_their_defaults(topics):
    topics.create("t", 2, retention_ms=60_000)
    topics.alter_configs("t", {"retention_records": 5, "producer_id_expiration_ms": 1000})
    assert _settings(topics, "t") == (60_000, 5, 1000)  # the one not named is kept
    topics.alter_configs("t", {"retention_ms": None})
    assert _settings(topics, "t") == (None, 5, 1000)
    topics.alter_configs("t", {"retention_ms": 10}, replace=True)  # legacy AlterConfigs
    assert _settings(topics, "t") == (10, None, None)
    assert topics.partition_count("t") == 2 and topics.describe("t").create_token


def test_every_value_is_checked_before_anything_is_written(topics):
    topics.create("t", 1, retention_records=7)
    for bad, says in (({"retention_ms": 5, "retention_records": -1}, "retention_records must"),
                      ({"retention_ms": 5, "producer_id_expiration_ms": 0},
                       "producer_id_expiration_ms must be an int from 1"),
                      ({"retention_ms": 5, "retention_records": True}, "retention_records must"),
                      ({"retention_ms": 5, "retention_records": 2**63}, "to 9223372036854775807"),
                      ({"retention_ms": 5, "segment_bytes": 1}, "unknown topic setting")):
        with pytest.raises(TopicError) as info:
            topics.alter_configs("t", bad)
        assert info.value.error == Errors.INVALID_CONFIG and says in str(info.value), bad
    assert _settings(topics, "t") == (None, 7, None)
    with pytest.raises(TypeError, match="must be a mapping"):
        topics.alter_configs("t", [("retention_ms", 5)])  # type: ignore[arg-type]


def test_a_missing_topic_is_refused_and_not_made(topics, redis_client, namespace):
    """The script checks the topic first: a change of a deleted topic must not leave a hash of
    settings alone, which ``list`` would then show as a topic."""
    for validate_only in (False, True):
        with pytest.raises(TopicError) as info:
            topics.alter_configs("gone", {"retention_ms": 5}, validate_only=validate_only)
        assert info.value.error == Errors.UNKNOWN_TOPIC_OR_PARTITION
    assert redis_client.exists(meta_key(namespace, "gone")) == 0
    assert topics.list() == []
    with pytest.raises(TopicError) as info:
        topics.alter_configs("bad/name", {"retention_ms": 5})
    assert info.value.error == Errors.INVALID_TOPIC_EXCEPTION


def test_validate_only_writes_nothing(topics):
    topics.create("t", 1)
    topics.alter_configs("t", {"retention_ms": 5}, validate_only=True)
    assert _settings(topics, "t") == (None, None, None)


def test_retention_follows_a_changed_setting(topics, redis_client, namespace):
    topics.create("t", 1)
    producer = Producer(redis_client, namespace, idempotent=False)
    for i in range(6):
        producer.send("t", b"%d" % i, partition=0)
    assert topics.apply_retention("t") == {0: 0}  # no retention setting: all kept
    topics.alter_configs("t", {"retention_records": 2})
    assert topics.apply_retention("t") == {0: 4}
    topics.alter_configs("t", {"retention_records": None})
    for i in range(6, 9):
        producer.send("t", b"%d" % i, partition=0)
    assert topics.apply_retention("t") == {0: 4}


def test_kafka_operations_as_a_settings_change():
    assert settings_change([("retention.ms", SET, "-1"), ("retention.records", SET, " 9 "),
                            ("producer.id.expiration.ms", DELETE, "")]) == {
        "retention_ms": None, "retention_records": 9, "producer_id_expiration_ms": None}
    # The two facts every topic has: their own value, or a list that comes back to it.
    assert settings_change([("cleanup.policy", SET, "delete"),
                            ("message.timestamp.type", SET, "LogAppendTime")]) == {}
    assert settings_change([("cleanup.policy", APPEND, "delete")]) == {}
    assert settings_change([("cleanup.policy", DELETE, "")]) == {}
    for ops, says in (
        ([("cleanup.policy", SET, "compact")], "never compacted"),
        ([("cleanup.policy", APPEND, "compact")], "never compacted"),
        ([("cleanup.policy", SUBTRACT, "delete")], "never compacted"),
        ([("message.timestamp.type", SET, "CreateTime")], "always LogAppendTime"),
        ([("retention.ms", APPEND, "5")],
         "Can't APPEND to key retention.ms because its type is not LIST."),
        ([("message.timestamp.type", SUBTRACT, "x")], "Can't SUBTRACT to key"),
        ([("retention.ms", SET, "-2")], "Invalid value -2 for configuration retention.ms"),
        ([("producer.id.expiration.ms", SET, "-1")], "from 1 to"),
        ([("retention.ms", SET, "5ms")], "Invalid value 5ms"),
        ([("retention.ms", SET, "1_000")], "Invalid value 1_000"),
        ([("segment.bytes", SET, "1")], "Unknown topic config name: segment.bytes"),
    ):
        with pytest.raises(TopicError) as info:
            settings_change(ops)
        assert info.value.error == Errors.INVALID_CONFIG and says in info.value.detail, ops
    with pytest.raises(TopicError) as info:
        settings_change([("retention.ms", 9, "5")])
    assert info.value.error == Errors.INVALID_REQUEST


url = test_cli_groups.url  # fixtures: the backend's URL, and the command line on it
cli = test_cli_groups.cli


def test_the_command_line(cli, topics):
    topics.create("t", 1, retention_records=7)
    res = ok(cli("topics", "alter-configs", "t", "--add-config",
                 "retention.ms=60000,cleanup.policy=[delete]", "--delete-config",
                 "retention.records"))
    assert "Changed the configs of topic t." in res.stdout
    assert rows(res.stdout, "TOPIC CONFIG") == [
        ["t", "cleanup.policy", "delete", "default"],
        ["t", "message.timestamp.type", "LogAppendTime", "default"],
        ["t", "producer.id.expiration.ms", "86400000", "default"],
        ["t", "retention.ms", "60000", "topic"],
        ["t", "retention.records", "-1", "default"]]
    assert _settings(topics, "t") == (60_000, None, None)

    res = ok(cli("topics", "alter-configs", "t", "--add-config", "retention.records=3",
                 "--validate-only", "--output", "json"))
    doc = json.loads(res.stdout)
    assert {c["name"]: (c["value"], c["default"]) for c in doc["configs"]}[
        "retention.records"] == ("3", False)
    assert doc["validate_only"] is True and _settings(topics, "t") == (60_000, None, None)

    # Refusals change nothing, and say what to fix.
    res = cli("topics", "alter-configs", "t", "--add-config", "retention.ms=5",
              "--add-config", "retention.records=-3")
    assert res.returncode == 2 and "Invalid value -3 for configuration retention.records" \
        in res.stderr
    res = cli("topics", "alter-configs", "t", "--add-config", "segment.bytes=1")
    assert res.returncode == 2 and "Unknown topic config name: segment.bytes" in res.stderr
    res = cli("topics", "alter-configs", "t")
    assert res.returncode == 2 and "--add-config NAME=VALUE or --delete-config" in res.stderr
    res = cli("topics", "alter-configs", "t", "--add-config", "retention.ms=5",
              "--delete-config", "retention.ms")
    assert res.returncode == 2 and "retention.ms given more than once" in res.stderr
    res = cli("topics", "alter-configs", "t", "--add-config", "retention.ms")
    assert res.returncode == 2 and "NAME=VALUE" in res.stderr
    assert _settings(topics, "t") == (60_000, None, None)
    res = cli("topics", "alter-configs", "missing", "--add-config", "retention.ms=5")
    assert res.returncode == 1 and "UNKNOWN_TOPIC_OR_PARTITION" in res.stderr


def test_create_takes_configs_as_kafka_topics_does_and_describe_shows_them(cli, topics):
    """``topics create --config`` (kafka-topics' flag) made no topic: the option did not exist,
    so ``producer.id.expiration.ms`` could be given at creation only from Python, and
    ``topics describe`` showed no column or JSON field for it."""
    ok(cli("topics", "create", "t", "--partitions", "1", "--retention-records", "9", "--config",
           "producer.id.expiration.ms=5000,retention.ms=-1", "--config", "cleanup.policy=delete"))
    assert _settings(topics, "t") == (None, 9, 5000)
    assert topics.settings("t") == {"producer_id_expiration_ms": 5000, "retention_ms": None,
                                    "retention_records": 9}
    with pytest.raises(TopicError) as info:
        topics.settings("missing")
    assert info.value.error == Errors.UNKNOWN_TOPIC_OR_PARTITION
    res = ok(cli("topics", "describe", "t"))
    assert rows(res.stdout, "TOPIC  PARTITIONS") == [["t", "1", "5000", "-", "9", "0"]]
    doc = json.loads(ok(cli("topics", "describe", "t", "--output", "json")).stdout)
    assert [(d["producer_id_expiration_ms"], d["retention_ms"], d["retention_records"])
            for d in doc] == [(5000, None, 9)]

    # Refusals create nothing, and say what to fix.
    for args, says in [
            (["--config", "segment.bytes=1"], "Unknown topic config name: segment.bytes"),
            (["--config", "retention.ms=-2"], "Invalid value -2 for configuration retention.ms"),
            (["--config", "retention.ms"], "--config takes NAME=VALUE"),
            (["--config", "cleanup.policy=compact"], "never compacted"),
            (["--config", "retention.ms=1,retention.ms=2"], "retention.ms given more than once"),
            (["--config", "retention.ms=1", "--retention-ms", "2"],
             "--retention-ms and --config retention.ms both given")]:
        res = cli("topics", "create", "u", "--partitions", "1", *args)
        assert res.returncode == 2 and says in res.stderr, (args, res.stderr)
    assert topics.list() == ["t"]


def test_the_admin_role_raises_the_producer_expiration(
    users: test_acl.Users, namespace: str, redis_client: Any  # noqa: F811  (the fixture)
) -> None:
    """A raise of producer_id_expiration_ms extends the partitions' producer state keys
    (topic_producer_ttl.lua), which read their expiry with PTTL: no role of docs/security.md
    may run it, so the admin's alter_configs failed with MissingPermissionError after the
    setting was written, the keys left at the old time."""
    name, client = test_acl.make(users, namespace, "admin")
    topics = Topics(client, namespace)
    topics.create("t", 1, producer_id_expiration_ms=5_000)
    Producer(client, namespace).send("t", b"x", partition=0)
    topics.alter_configs("t", {"producer_id_expiration_ms": 600_000})
    assert users.denials(name) == []
    state, activity = producer_state_keys(namespace, "t", 0)
    assert redis_client.pttl(state) > 60_000 and redis_client.pttl(activity) > 60_000
    client.close()


def test_a_delete_of_a_config_rcoord_does_not_keep_changes_nothing():
    # As Kafka's controller: a deleted name is dropped before the rest is validated, so the
    # request's other changes stand (it was INVALID_CONFIG, and they were lost with it). A SET
    # of such a name is still refused, naming the configs there are.
    assert settings_change([("segment.bytes", DELETE, ""),
                            ("retention.ms", SET, "60000")]) == {"retention_ms": 60000}
    assert settings_change([("no.such.config", DELETE, "")]) == {}
    with pytest.raises(TopicError, match="Unknown topic config name: segment.bytes"):
        settings_change([("segment.bytes", SET, "1024")])


def test_the_command_line_refuses_a_delete_of_a_config_rcoord_does_not_keep(cli, topics):
    """``--delete-config retention.m`` (a typo) printed "Changed the configs of topic t." and
    exited 0, changing nothing (``settings_change`` skips it, for the gateway, as Kafka's broker
    answers NONE); kafka-configs.sh refuses it ("Invalid config(s): retention.m"). The other
    changes given with it are not made either."""
    topics.create("t", 1, retention_ms=60_000)
    res = cli("topics", "alter-configs", "t", "--add-config", "retention.records=3",
              "--delete-config", "retention.m")
    assert res.returncode == 2 and "Unknown topic config name: retention.m " in res.stderr
    assert "Changed" not in res.stdout
    assert _settings(topics, "t") == (60_000, None, None)
    # a config rcoord keeps at its one value is still deleted (it keeps that value)
    assert "Changed the configs of topic t." in ok(cli(
        "topics", "alter-configs", "t", "--delete-config", "cleanup.policy,retention.ms")).stdout
    assert _settings(topics, "t") == (None, None, None)
