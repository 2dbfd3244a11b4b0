"""IncrementalAlterConfigs (API 44) and AlterConfigs (API 33) through the gateway: what each
changes, Kafka's checks in Kafka's words, ``validate_only``, ACLs (ALTER_CONFIGS), a topic
Redis cannot be reached for, and confluent-kafka's AdminClient changing a topic's configs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("kio")

from gateway_harness import call_once, gateway_for_alice

from rcoord.errors import Errors
from rcoord.topics import Topics

WAIT_S = 60.0
TOPIC, BROKER, GROUP = 2, 4, 32
SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3
TOPIC_AUTHZ, CLUSTER_AUTHZ = 29, 31


def _incremental(gateway: Any, resources: list[tuple[int, str, list[tuple[str, int, Any]]]],
                 validate_only: bool = False, version: int = 1, **kw: Any
                 ) -> list[tuple[str, int, str | None]]:
    body = {"validate_only": validate_only, "resources": [
        {"resource_type": kind, "resource_name": name, "configs": [
            {"name": n, "config_operation": op, "value": v} for n, op, v in ops]}
        for kind, name, ops in resources]}
    answer = call_once(gateway, 44, version, body, 5 if version >= 1 else 4, **kw)
    return [(r.resource_name, r.error_code.value, r.error_message) for r in answer.responses]


def _legacy(gateway: Any, resources: list[tuple[int, str, list[tuple[str, Any]]]],
            validate_only: bool = False, version: int = 2
            ) -> list[tuple[str, int, str | None]]:
    body = {"validate_only": validate_only, "resources": [
        {"resource_type": kind, "resource_name": name, "configs": [
            {"name": n, "value": v} for n, v in configs]}
        for kind, name, configs in resources]}
    answer = call_once(gateway, 33, version, body, 5 if version >= 2 else 4)
    return [(r.resource_name, r.error_code.value, r.error_message) for r in answer.responses]


def _settings(topics: Topics, topic: str) -> tuple[int | None, int | None, int | None]:
    d = topics.describe(topic)
    return d.retention_ms, d.retention_records, d.producer_id_expiration_ms


@pytest.mark.parametrize("version", [0, 1])
def test_incremental_changes_only_what_it_names(gateway, topics, version):
    topics.create("t", 1, retention_records=7, producer_id_expiration_ms=5000)
    got = _incremental(gateway, [(TOPIC, "t", [("retention.ms", SET, "60000"),
                                              ("retention.records", DELETE, None),
                                              ("cleanup.policy", APPEND, "delete")])],
                       version=version)
    assert got == [("t", 0, None)]
    assert _settings(topics, "t") == (60_000, None, 5000)
    got = _incremental(gateway, [(TOPIC, "t", [("retention.ms", SET, "-1")])], version=version)
    assert got == [("t", 0, None)] and _settings(topics, "t") == (None, None, 5000)


@pytest.mark.parametrize("version", [0, 1, 2])
def test_legacy_alter_configs_replaces_them_whole(gateway, topics, version):
    """As Kafka's legacyAlterConfigs: a setting the request does not name goes back to its
    default."""
    topics.create("t", 1, retention_records=7, producer_id_expiration_ms=5000)
    got = _legacy(gateway, [(TOPIC, "t", [("retention.ms", "1000"),
                                         ("cleanup.policy", "delete")])], version=version)
    assert got == [("t", 0, None)]
    assert _settings(topics, "t") == (1000, None, None)


def test_kafkas_checks_in_kafkas_words(gateway, topics):
    """Each refusal as Kafka answers it; none changes anything, and a refused resource does not
    keep the others of the request from changing."""
    topics.create("t", 1, retention_ms=5)
    topics.create("u", 1)
    for validate_only in (False, True):
        got = {n: (c, m) for n, c, m in _incremental(gateway, [
            (TOPIC, "t", [("retention.ms", SET, "6"), ("retention.ms", DELETE, None)]),
            (TOPIC, "", [("retention.ms", SET, "6")]),
            (TOPIC, "bad/name", [("retention.ms", SET, "6")]),
            (TOPIC, "nope", [("retention.ms", SET, "6")]),
            (BROKER, "7", []),
            (BROKER, "x", []),
            (BROKER, "0", [("offsets.commit.timeout.ms", SET, "1")]),
            (GROUP, "g", [("retention.ms", SET, "6")]),
        ], validate_only)}
        assert got["t"] == (Errors.INVALID_REQUEST, "Error due to duplicate config keys")
        assert got[""] == (Errors.INVALID_REQUEST, "Default topic resources are not allowed.")
        assert got["bad/name"][0] == Errors.INVALID_TOPIC_EXCEPTION
        assert got["nope"][0] == Errors.UNKNOWN_TOPIC_OR_PARTITION
        assert got["7"] == (Errors.INVALID_REQUEST,
                            "Unexpected broker id, expected 0, but received 7")
        assert got["x"] == (Errors.INVALID_REQUEST, "Node id must be an integer, but it is: x")
        code, message = got["0"]
        assert code == Errors.INVALID_REQUEST and message.startswith(
            "Cannot update these configs dynamically: offsets.commit.timeout.ms")
        assert got["g"][0] == Errors.INVALID_REQUEST and "resource type 32" in got["g"][1]

        for ops, code, says in (
            ([("retention.ms", SET, None)], Errors.INVALID_REQUEST,
             "Null value not supported for : retention.ms"),
            ([("retention.ms", 7, "1")], Errors.INVALID_REQUEST, "Unknown operations type 7"),
            ([("segment.bytes", SET, "1")], Errors.INVALID_CONFIG,
             "Unknown topic config name: segment.bytes"),
            ([("retention.ms", SET, "1"), ("retention.records", SET, "-2")],
             Errors.INVALID_CONFIG, "Invalid value -2 for configuration retention.records"),
            ([("retention.ms", APPEND, "1")], Errors.INVALID_CONFIG,
             "Can't APPEND to key retention.ms because its type is not LIST."),
            ([("cleanup.policy", SET, "compact")], Errors.INVALID_CONFIG,
             "rcoord topics are never compacted"),
            ([("cleanup.policy", SUBTRACT, "delete")], Errors.INVALID_CONFIG,
             "rcoord topics are never compacted"),
        ):
            ((_, got_code, message),) = _incremental(gateway, [(TOPIC, "t", ops)], validate_only)
            assert got_code == code and message.startswith(says), (ops, message)

        got = _incremental(gateway, [(TOPIC, "u", [("retention.ms", SET, "1")]),
                                     (TOPIC, "u", [("retention.ms", SET, "2")]),
                                     (BROKER, "0", [])], validate_only)
        assert got == [("u", Errors.INVALID_REQUEST, "Each resource must appear at most once."),
                       ("u", Errors.INVALID_REQUEST, "Each resource must appear at most once."),
                       ("0", 0, None)]
        got = _legacy(gateway, [(TOPIC, "t", [("retention.ms", None)])], validate_only)
        assert got == [("t", Errors.INVALID_REQUEST,
                        "Null value not supported for : retention.ms")]
    assert _settings(topics, "t") == (5, None, None)
    assert _settings(topics, "u") == (None, None, None)
    assert sorted(topics.list()) == ["t", "u"]


def test_validate_only_checks_and_changes_nothing(gateway, topics):
    topics.create("t", 1)
    ops = [("retention.records", SET, "3")]
    assert _incremental(gateway, [(TOPIC, "t", ops)], validate_only=True) == [("t", 0, None)]
    assert _settings(topics, "t") == (None, None, None)
    assert _incremental(gateway, [(TOPIC, "t", ops)]) == [("t", 0, None)]
    assert _settings(topics, "t") == (None, 3, None)


def test_a_topic_redis_fails_on_is_answered_alone(gateway, topics, monkeypatch, caplog):
    import redis

    alter = Topics.alter_configs

    def failing(self: Topics, topic: str, settings: Any, **kw: Any) -> None:
        if topic == "cut":
            raise redis.exceptions.ConnectionError("connection reset (test)")
        alter(self, topic, settings, **kw)

    monkeypatch.setattr(Topics, "alter_configs", failing)
    topics.create("kept", 1)
    topics.create("cut", 1)
    ops = [("retention.ms", SET, "9")]
    got = _incremental(gateway, [(TOPIC, "kept", ops), (TOPIC, "cut", ops)])
    assert [(n, c) for n, c, _ in got] == [("kept", 0), ("cut", Errors.REQUEST_TIMED_OUT)]
    assert (_settings(topics, "kept")[0], _settings(topics, "cut")[0]) == (9, None)
    assert "configs of 'cut': Redis unreachable or unavailable" in caplog.text


def test_altering_configs_needs_alter_configs(redis_server, namespace, tmp_path: Path):
    with gateway_for_alice(redis_server, namespace, tmp_path, ["ALTER_CONFIGS"],
                           ["READ", "WRITE", "ALTER", "DESCRIBE_CONFIGS"]) as (gw, topics):
        ops = [("retention.ms", SET, "9")]
        got = _incremental(gw, [(TOPIC, "mine", ops), (TOPIC, "theirs", ops),
                                (TOPIC, "ghost", ops), (BROKER, "0", [])],
                           login=("alice", "pw"))
        # A refused topic is refused whether it exists or not (existence is not revealed).
        assert [(n, c) for n, c, _ in got] == [("mine", 0), ("theirs", TOPIC_AUTHZ),
                                               ("ghost", TOPIC_AUTHZ), ("0", CLUSTER_AUTHZ)]
        assert (topics.describe("mine").retention_ms, topics.describe("theirs").retention_ms) \
            == (9, None)


def set_retention_and_delete(gateway: Any, topic: str, deleted: str) -> tuple[Any, Any]:
    """confluent-kafka's IncrementalAlterConfigs of ``topic`` through the gateway: retention.ms
    SET to 60000 and ``deleted`` DELETEd in one resource, answered NONE; (the AdminClient, the
    topic's configs described after)."""
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

    admin = AdminClient({"bootstrap.servers": gateway.bootstrap, "broker.address.family": "v4"})
    change = ConfigResource("topic", topic, incremental_configs=[
        ConfigEntry("retention.ms", "60000", incremental_operation=AlterConfigOpType.SET),
        ConfigEntry(deleted, None, incremental_operation=AlterConfigOpType.DELETE)])
    futures = admin.incremental_alter_configs([change], request_timeout=30)
    assert futures[change].result(timeout=WAIT_S) is None
    resource = ConfigResource("topic", topic)
    return admin, admin.describe_configs([resource], request_timeout=30)[resource].result(
        timeout=WAIT_S)


def test_confluent_kafka_alters_configs(gateway, topics):
    ck = pytest.importorskip("confluent_kafka")
    from confluent_kafka.admin import (
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
        ConfigSource,
    )

    topics.create("t", 1, retention_records=7)
    admin, entries = set_retention_and_delete(gateway, "t", "retention.records")
    assert _settings(topics, "t") == (60_000, None, None)
    assert (entries["retention.ms"].value, entries["retention.ms"].source) == (
        "60000", ConfigSource.DYNAMIC_TOPIC_CONFIG.value)
    assert entries["retention.records"].source == ConfigSource.DEFAULT_CONFIG.value

    bad = ConfigResource("topic", "t", incremental_configs=[
        ConfigEntry("retention.ms", "soon", incremental_operation=AlterConfigOpType.SET)])
    with pytest.raises(ck.KafkaException) as info:
        admin.incremental_alter_configs([bad], request_timeout=30)[bad].result(timeout=WAIT_S)
    assert info.value.args[0].code() == ck.KafkaError.INVALID_CONFIG
    assert _settings(topics, "t") == (60_000, None, None)
