"""OffsetDelete (KIP-496) and DescribeConfigs through the gateway: raw frames for the exact
codes, then the admin clients that send them (kafka-python's KafkaAdminClient for both,
confluent-kafka's AdminClient for DescribeConfigs)."""

from __future__ import annotations

import json
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("kio")
kafka = pytest.importorskip("kafka")

from gateway_harness import (
    GatewayThread,
    committed_when_stable,
    poll_until,
    request_frame,
    response,
    running_gateway,
    sasl_connect,
    topics_of,
)
from gateway_harness import connect as _connect

from rcoord.gateway.auth import load_auth_file
from rcoord.topics import Topics

NONE, UNKNOWN_TOPIC, INVALID_TOPIC, INVALID_REQUEST = 0, 3, 17, 42
TOPIC_AUTHZ, CLUSTER_AUTHZ = 29, 31
GROUP_ID_NOT_FOUND, GROUP_SUBSCRIBED_TO_TOPIC = 69, 86
TOPIC, BROKER, BROKER_LOGGER = 2, 4, 8
TOPIC_CONFIG, STATIC_BROKER, DEFAULT = 1, 4, 5
WAIT_S = 60.0


class _Raw:
    """One raw connection; ``call`` sends a request and reads its response (``header_bytes``:
    4 for response header v0, 5 for the flexible versions' v1)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.corr = 100

    def call(self, key: int, version: int, body: dict[str, Any], header_bytes: int) -> Any:
        self.corr += 1
        self.sock.sendall(request_frame(key, version, self.corr, body))
        return response(self.sock, key, version, header_bytes)

    def commit(self, group: str, topic: str, offsets: dict[int, int]) -> None:
        """A simple (``assign()``) commit: no member, generation -1."""
        resp = self.call(8, 8, {
            "group_id": group, "generation_id_or_member_epoch": -1, "member_id": "",
            "group_instance_id": None, "topics": [{"name": topic, "partitions": [
                {"partition_index": p, "committed_offset": o, "committed_leader_epoch": -1,
                 "committed_metadata": ""} for p, o in offsets.items()]}]}, 5)
        assert [p.error_code.value for t in resp.topics for p in t.partitions] == \
            [NONE] * len(offsets)

    def committed(self, group: str, topic: str, partitions: list[int]) -> dict[int, int]:
        resp = self.call(9, 8, {"groups": [{"group_id": group, "topics": [
            {"name": topic, "partition_indexes": partitions}]}], "require_stable": False}, 5)
        (g,) = resp.groups
        assert g.error_code.value == NONE
        return {p.partition_index: p.committed_offset for t in g.topics for p in t.partitions}

    def offset_delete(self, group: str, parts: dict[str, list[int]]) -> tuple[int, dict[Any, int]]:
        resp = self.call(47, 0, {"group_id": group, "topics": [
            {"name": t, "partitions": [{"partition_index": p} for p in ps]}
            for t, ps in parts.items()]}, 4)
        return resp.error_code.value, {(t.name, p.partition_index): p.error_code.value
                                       for t in resp.topics for p in t.partitions}

    def describe_configs(self, resources: list[tuple[int, str, list[str] | None]],
                         version: int = 4, **flags: bool) -> Any:
        return self.call(32, version, {"resources": [
            {"resource_type": kind, "resource_name": name, "configuration_keys": keys}
            for kind, name, keys in resources], **flags}, 5 if version >= 4 else 4).results


@pytest.fixture
def raw(gateway: GatewayThread) -> Iterator[_Raw]:
    r = _Raw(_connect(gateway))
    yield r
    r.sock.close()


# -- OffsetDelete ---------------------------------------------------------------------------------


def _subscribed_member(gw: GatewayThread, group: str, topic: str) -> Any:
    """A kafka-python member of ``group`` subscribed to ``topic``, holding its assignment."""
    consumer = kafka.KafkaConsumer(bootstrap_servers=gw.bootstrap, group_id=group,
                                   enable_auto_commit=False, session_timeout_ms=10_000,
                                   heartbeat_interval_ms=500)
    try:
        # A metadata fetch made after subscribing: a leader that assigns before it knows the
        # topic assigns nothing, and kafka-python rejoins when the snapshot it kept changes.
        consumer.subscribe([topic])
        assert topic in consumer.topics()
        poll_until(consumer, lambda _: bool(consumer.assignment()))
    except BaseException:
        consumer.close()
        raise
    return consumer


def test_offset_delete_raw_frames(gateway: GatewayThread, topics: Topics, raw: _Raw) -> None:
    topics.create("t", 2)
    topics.create("u", 1)
    raw.commit("idle", "t", {0: 5, 1: 7})
    assert raw.offset_delete("idle", {"t": [0]}) == (NONE, {("t", 0): NONE})
    assert raw.committed("idle", "t", [0, 1]) == {0: -1, 1: 7}

    assert raw.offset_delete("nobody", {"t": [0]})[0] == GROUP_ID_NOT_FOUND

    consumer = _subscribed_member(gateway, "live", "t")
    try:
        poll_until(consumer, lambda _: committed_when_stable(
            consumer, {kafka.TopicPartition("t", 0): kafka.OffsetAndMetadata(3, "", -1)}))
        top, parts = raw.offset_delete("live", {"t": [0, 1], "u": [0]})
        assert top == NONE
        assert parts == {("t", 0): GROUP_SUBSCRIBED_TO_TOPIC, ("t", 1): GROUP_SUBSCRIBED_TO_TOPIC,
                         ("u", 0): NONE}
        assert raw.committed("live", "t", [0]) == {0: 3}
    finally:
        consumer.close()
    # Once the member left, the group is Empty and nothing subscribes to the topic.
    assert raw.offset_delete("live", {"t": [0]}) == (NONE, {("t", 0): NONE})
    assert raw.committed("live", "t", [0]) == {0: -1}


def test_offset_delete_kafka_python_admin(gateway: GatewayThread, topics: Topics,
                                          raw: _Raw) -> None:
    topics.create("t", 2)
    raw.commit("idle", "t", {0: 5, 1: 7})
    admin = kafka.KafkaAdminClient(bootstrap_servers=gateway.bootstrap)
    consumer = None
    try:
        tp0, tp1 = kafka.TopicPartition("t", 0), kafka.TopicPartition("t", 1)
        assert admin.delete_group_offsets("idle", [tp1]) == {tp1: kafka.errors.NoError}
        assert raw.committed("idle", "t", [0, 1]) == {0: 5, 1: -1}
        with pytest.raises(kafka.errors.GroupIdNotFoundError):
            admin.delete_group_offsets("nobody", [tp0])
        consumer = _subscribed_member(gateway, "live", "t")
        assert admin.delete_group_offsets("live", [tp0]) == {
            tp0: kafka.errors.GroupSubscribedToTopicError}
    finally:
        if consumer is not None:
            consumer.close()
        admin.close()


# confluent-kafka 2.16's Python AdminClient has no OffsetDelete call (librdkafka's
# rd_kafka_DeleteConsumerGroupOffsets is not bound), so only kafka-python's admin is driven here.


# -- DescribeConfigs ------------------------------------------------------------------------------


def _configs(result: Any) -> dict[str, tuple[str, int, bool]]:
    return {c.name: (c.value, c.config_source, c.read_only) for c in result.configs}


def test_describe_configs_topic_raw_frames(gateway: GatewayThread, topics: Topics,
                                           raw: _Raw) -> None:
    topics.create("kept", 2, retention_ms=60_000)
    topics.create("plain", 1)
    kept, plain, missing, illegal = raw.describe_configs([
        (TOPIC, "kept", None), (TOPIC, "plain", []), (TOPIC, "missing", None),
        (TOPIC, "bad name", None)])
    assert (kept.error_code.value, kept.resource_type, kept.resource_name) == (NONE, TOPIC, "kept")
    assert _configs(kept) == {
        "cleanup.policy": ("delete", DEFAULT, True),
        "message.timestamp.type": ("LogAppendTime", DEFAULT, True),
        "producer.id.expiration.ms": ("86400000", DEFAULT, False),
        "retention.ms": ("60000", TOPIC_CONFIG, False),
        "retention.records": ("-1", DEFAULT, False),
    }  # (the settings are altered by AlterConfigs; the two facts are not)
    assert _configs(plain)["retention.ms"] == ("-1", DEFAULT, False)
    assert (missing.error_code.value, missing.configs) == (UNKNOWN_TOPIC, ())
    assert (illegal.error_code.value, illegal.configs) == (INVALID_TOPIC, ())

    # Named keys: only those rcoord has, in v1 (no documentation field) as in v4.
    for version in (1, 4):
        (only,) = raw.describe_configs([(TOPIC, "kept", ["retention.ms", "segment.bytes"])],
                                       version)
        assert _configs(only) == {"retention.ms": ("60000", TOPIC_CONFIG, False)}

    (full,) = raw.describe_configs([(TOPIC, "kept", ["retention.ms"])], 4,
                                   include_synonyms=True, include_documentation=True)
    (entry,) = full.configs
    assert [(s.name, s.value, s.source) for s in entry.synonyms] == \
        [("retention.ms", "60000", TOPIC_CONFIG)]
    assert entry.documentation and entry.config_type == 5  # LONG


def test_describe_configs_of_a_topic_runs_no_script(own_server: Any) -> None:
    """A topic's configs are one read of its settings: its partitions' offsets are not read
    (they were, one script call per partition, through Topics.describe). The calls counted are
    the server's (INFO commandstats), so the gateway has one of its own: on the session's, the
    scripts of any other test's thread still ending in this process counted too."""
    ns = "d" + uuid.uuid4().hex[:10]
    with running_gateway(own_server, ns) as gw, topics_of(own_server, ns) as topics:
        topics.create("wide", 200, retention_records=5)

        def scripts_run() -> int:
            stats = topics._r.info("commandstats")
            return sum(int(v["calls"]) for k, v in stats.items()
                       if k.startswith("cmdstat_eval"))

        raw = _Raw(_connect(gw))
        try:
            before = scripts_run()
            (wide,) = raw.describe_configs([(TOPIC, "wide", None)])
            assert scripts_run() == before
        finally:
            raw.sock.close()
    assert _configs(wide)["retention.records"] == ("5", TOPIC_CONFIG, False)


def test_describe_configs_broker_and_other_types_raw_frames(gateway: GatewayThread,
                                                             raw: _Raw) -> None:
    broker, defaults, other, logger, group = raw.describe_configs([
        (BROKER, "0", None), (BROKER, "", None), (BROKER, "7", None), (BROKER_LOGGER, "0", None),
        (32, "g", None)])
    assert broker.error_code.value == NONE
    assert _configs(broker) == {"message.max.bytes": ("1048588", STATIC_BROKER, True),
                                "offsets.commit.required.acks": ("0", STATIC_BROKER, True),
                                "offsets.commit.timeout.ms": ("5000", STATIC_BROKER, True)}
    assert (defaults.error_code.value, defaults.configs) == (NONE, ())
    assert other.error_code.value == INVALID_REQUEST and "broker 0" in other.error_message
    assert logger.error_code.value == INVALID_REQUEST
    assert group.error_code.value == INVALID_REQUEST


def test_describe_configs_is_advertised(raw: _Raw) -> None:
    resp = raw.call(18, 3, {"client_software_name": "raw", "client_software_version": "0"}, 4)
    versions = {k.api_key: (k.min_version, k.max_version) for k in resp.api_keys}
    assert versions[32] == (1, 4)
    assert versions[47] == (0, 0)


def test_describe_configs_kafka_python(gateway: GatewayThread, topics: Topics) -> None:
    from kafka.admin import ConfigResource, ConfigResourceType

    topics.create("kept", 1, retention_ms=60_000, retention_records=1000)
    admin = kafka.KafkaAdminClient(bootstrap_servers=gateway.bootstrap)
    try:
        topic = ConfigResource(ConfigResourceType.TOPIC, "kept")
        modified = admin.describe_configs([topic])  # kafka-python's default: modified only
        assert {k: v["value"] for k, v in modified["topic"]["kept"].items()} == \
            {"retention.ms": "60000", "retention.records": "1000"}
        every = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, "kept")],
                                       config_filter="all", include_synonyms=True)
        kept = every["topic"]["kept"]
        assert kept["cleanup.policy"]["value"] == "delete"
        assert kept["retention.ms"]["config_source"] == "DYNAMIC_TOPIC_CONFIG"
        assert kept["producer.id.expiration.ms"]["config_source"] == "DEFAULT_CONFIG"
        broker = admin.describe_configs([ConfigResource(ConfigResourceType.BROKER, "0")],
                                        config_filter="all")
        assert broker["broker"]["0"]["offsets.commit.timeout.ms"]["value"] == "5000"
    finally:
        admin.close()


def test_describe_configs_confluent(gateway: GatewayThread, topics: Topics) -> None:
    ck = pytest.importorskip("confluent_kafka")
    from confluent_kafka.admin import AdminClient, ConfigResource, ConfigSource

    topics.create("kept", 1, retention_ms=60_000)
    admin = AdminClient({"bootstrap.servers": gateway.bootstrap})
    kept, missing, broker = (ConfigResource("topic", "kept"), ConfigResource("topic", "missing"),
                             ConfigResource("broker", "0"))
    futures = admin.describe_configs([kept, missing, broker], request_timeout=30)
    entries = futures[kept].result(timeout=WAIT_S)
    assert entries["retention.ms"].value == "60000"
    assert entries["retention.ms"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    assert not entries["retention.ms"].is_read_only
    assert entries["cleanup.policy"].value == "delete" and entries["cleanup.policy"].is_read_only
    assert entries["retention.records"].source == ConfigSource.DEFAULT_CONFIG.value
    with pytest.raises(ck.KafkaException) as info:
        futures[missing].result(timeout=WAIT_S)
    assert info.value.args[0].code() == ck.KafkaError.UNKNOWN_TOPIC_OR_PART
    on_broker = futures[broker].result(timeout=WAIT_S)
    assert on_broker["offsets.commit.required.acks"].value == "0"
    assert on_broker["offsets.commit.required.acks"].source == \
        ConfigSource.STATIC_BROKER_CONFIG.value


# -- DescribeConfigs with ACLs ------------------------------------------------------------------


def test_describe_configs_needs_describe_configs(redis_server: Any, namespace: str,
                                                 tmp_path: Path) -> None:
    acls = [
        {"principal": "User:alice", "resource": "topic", "name": "open",
         "operations": ["DESCRIBE_CONFIGS"]},
        {"principal": "User:alice", "resource": "topic", "name": "readable",
         "operations": ["READ", "WRITE"]},  # neither implies DESCRIBE_CONFIGS
        {"principal": "User:bob", "resource": "topic", "name": "open",
         "operations": ["ALTER_CONFIGS"]},  # implies DESCRIBE_CONFIGS
        {"principal": "User:bob", "resource": "cluster", "operations": ["DESCRIBE_CONFIGS"]},
    ]
    path = tmp_path / "auth.json"
    path.write_text(json.dumps({"users": {"alice": "a-pw", "bob": "b-pw"}, "acls": acls}))
    with topics_of(redis_server, namespace) as t:
        for name in ("open", "readable"):
            t.create(name, 1)
    with running_gateway(redis_server, namespace, auth=load_auth_file(path)) as gw:
        alice, bob = _Raw(sasl_connect(gw, "alice", "a-pw")), _Raw(sasl_connect(gw, "bob", "b-pw"))
        try:
            wanted: list[tuple[int, str, list[str] | None]] = [
                (TOPIC, "open", None), (TOPIC, "readable", None), (TOPIC, "ghost", None),
                (BROKER, "0", None)]
            codes = {r.resource_name: r.error_code.value for r in alice.describe_configs(wanted)}
            # A refused topic is refused whether it exists or not (existence is not revealed).
            assert codes == {"open": NONE, "readable": TOPIC_AUTHZ, "ghost": TOPIC_AUTHZ,
                             "0": CLUSTER_AUTHZ}
            codes = {r.resource_name: r.error_code.value for r in bob.describe_configs(wanted)}
            assert codes == {"open": NONE, "readable": TOPIC_AUTHZ, "ghost": TOPIC_AUTHZ,
                             "0": NONE}
        finally:
            alice.sock.close()
            bob.sock.close()
