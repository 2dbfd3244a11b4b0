"""Kafka ACLs on the gateway: per-group and per-topic rules from the auth file, checked with
Kafka's resource/operation model. Unit table for the decision rules, then kafka-python and
confluent-kafka clients, then raw frames for each API's check."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("kio")
kafka = pytest.importorskip("kafka")

from gateway_harness import (
    GatewayThread,
    produced_batch,
    request_frame,
    response,
    running_gateway,
    sasl_connect,
    take,
    topics_of,
)
from harness import wait_until

from rcoord.gateway.acl import Authorizer, Operation, ResourceType, parse_acls
from rcoord.gateway.auth import load_auth_file
from rcoord.topics import Record, Topics

TOPIC_AUTHORIZATION_FAILED, GROUP_AUTHORIZATION_FAILED, CLUSTER_AUTHORIZATION_FAILED = 29, 30, 31
WAIT_S = 60.0

USERS = {"alice": "alice-pw", "bob": "bob-pw", "admin": "admin-pw", "ops": "ops-pw"}


def _allow(resource: str, name: str, ops: list[str], pattern: str = "literal",
           principal: str = "User:alice", permission: str = "allow") -> dict[str, Any]:
    return {"principal": principal, "resource": resource, "name": name, "pattern": pattern,
            "operations": ops, "permission": permission}


ACLS = [
    # alice: group "app" on topic "orders" (literal names)
    _allow("group", "app", ["READ"]),
    _allow("topic", "orders", ["READ", "WRITE"]),
    # alice: everything under the "team-a." prefix
    _allow("group", "team-a.", ["ALL"], "prefixed"),
    _allow("topic", "team-a.", ["ALL"], "prefixed"),
    # alice: every "shared." topic, but never writing "shared.audit" (deny wins)
    _allow("topic", "shared.", ["ALL"], "prefixed"),
    _allow("topic", "shared.audit", ["WRITE"], permission="deny"),
    _allow("topic", "shared.blind", ["DESCRIBE_CONFIGS"], permission="deny"),
    # bob: may only describe the group "app" (no topic, no idempotent write)
    _allow("group", "app", ["DESCRIBE"], principal="User:bob"),
    # ops: everything on the cluster resource, nothing on any topic or group
    _allow("cluster", "kafka-cluster", ["ALL"], principal="User:ops"),
]


# -- the decision rules, as a table -------------------------------------------------------------


def _authorizer(acls: list[dict[str, Any]], supers: tuple[str, ...] = ()) -> Authorizer:
    return Authorizer(parse_acls(acls), supers)


R, W, D, DEL = Operation.READ, Operation.WRITE, Operation.DESCRIBE, Operation.DELETE
T, G, C = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER


@pytest.mark.parametrize(("principal", "op", "resource", "name", "expected"), [
    ("User:alice", R, G, "app", True),
    ("User:alice", D, G, "app", True),            # READ implies DESCRIBE
    ("User:alice", DEL, G, "app", False),          # but not DELETE
    ("User:alice", R, G, "other", False),          # default deny
    ("User:alice", R, G, "team-a.workers", True),  # prefixed
    ("User:alice", R, G, "team-b.workers", False),
    ("User:alice", R, G, "team-a", False),         # a prefix matches only longer-or-equal names
    ("User:alice", W, T, "shared.news", True),
    ("User:alice", W, T, "shared.audit", False),   # deny overrides the prefixed ALL
    ("User:alice", R, T, "shared.audit", True),    # a deny of WRITE leaves READ
    ("User:alice", D, T, "shared.audit", True),
    ("User:bob", D, G, "app", True),
    ("User:bob", R, G, "app", False),              # DESCRIBE does not imply READ
    ("User:carol", R, G, "app", False),
    ("User:admin", DEL, T, "anything", True),      # super user
])
def test_decisions(principal: str, op: Operation, resource: ResourceType, name: str,
                   expected: bool) -> None:
    authorizer = _authorizer(ACLS, ("User:admin",))
    assert authorizer.authorize(principal, "127.0.0.1", op, resource, name) is expected


def test_wildcards_hosts_and_deny_all() -> None:
    a = _authorizer([
        _allow("topic", "*", ["READ"], principal="User:*"),
        _allow("topic", "private", ["ALL"], principal="User:*", permission="deny"),
        {**_allow("group", "*", ["READ"]), "host": "10.0.0.1"},
    ])
    assert a.authorize("User:anyone", "h", R, T, "news")
    assert not a.authorize("User:anyone", "h", R, T, "private")
    assert not a.authorize("User:anyone", "h", D, T, "private")  # a deny of ALL denies DESCRIBE
    assert a.authorize("User:alice", "10.0.0.1", R, G, "g")
    assert not a.authorize("User:alice", "127.0.0.1", R, G, "g")


def test_authorize_any_is_kafkas_authorize_by_resource_type() -> None:
    # WRITE on some topic, as InitProducerId asks (Kafka 3.x).
    assert _authorizer(ACLS).authorize_any("User:alice", "h", W, T)
    assert not _authorizer(ACLS).authorize_any("User:bob", "h", W, T)
    only_denied = _authorizer([_allow("topic", "x", ["WRITE"]),
                               _allow("topic", "x", ["WRITE"], permission="deny")])
    assert not only_denied.authorize_any("User:alice", "h", W, T)
    prefix_denied = _authorizer([_allow("topic", "ab", ["WRITE"]),
                                 _allow("topic", "a", ["WRITE"], "prefixed", permission="deny")])
    assert not prefix_denied.authorize_any("User:alice", "h", W, T)
    wildcard_denied = _authorizer([_allow("topic", "x", ["WRITE"]),
                                   _allow("topic", "*", ["ALL"], permission="deny")])
    assert not wildcard_denied.authorize_any("User:alice", "h", W, T)


@pytest.mark.parametrize(("entry", "message"), [
    ({"resource": "topic", "name": "t", "operations": ["READ"]}, "principal must be"),
    (_allow("table", "t", ["READ"]), "resource 'table' is not one of"),
    (_allow("topic", "t", ["READ"], pattern="regex"), "pattern 'regex' is not one of"),
    (_allow("topic", "t", ["FLY"]), "op 'FLY' is not one of"),
    (_allow("group", "g", ["WRITE"]), "WRITE is not an operation on a group"),
    (_allow("topic", "t", []), "operations must be a non-empty list"),
    (_allow("topic", "*", ["READ"], pattern="prefixed"), "cannot be '\\*'"),
    (_allow("cluster", "mine", ["CREATE"]), "the cluster resource is named"),
    (_allow("topic", "t", ["READ"], permission="maybe"), "permission must be"),
    ({**_allow("topic", "t", ["READ"]), "colour": "red"}, "unknown field"),
])
def test_bad_rules_are_refused_with_what_to_fix(entry: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_acls([entry])


def test_auth_file_with_acls(tmp_path: Path) -> None:
    path = tmp_path / "auth.json"
    path.write_text(json.dumps({"users": USERS, "acls": ACLS, "super_users": ["User:admin"]}))
    auth = load_auth_file(path)
    assert auth.authorizer is not None and "User:admin" in auth.authorizer.super_users
    path.write_text(json.dumps({"users": USERS, "acls": [_allow("topic", "t", ["SING"])]}))
    with pytest.raises(ValueError, match=r"acls\[0\] operations: op 'SING'"):
        load_auth_file(path)
    path.write_text(json.dumps({"users": USERS, "super_users": ["User:admin"]}))
    with pytest.raises(ValueError, match="super_users without acls"):
        load_auth_file(path)


# -- real clients ---------------------------------------------------------------------------------


@pytest.fixture
def gateway(redis_server: Any, namespace: str, tmp_path: Path) -> Iterator[GatewayThread]:
    path = tmp_path / "auth.json"
    path.write_text(json.dumps({"users": USERS, "acls": ACLS, "super_users": ["User:admin"]}))
    with running_gateway(redis_server, namespace, auth=load_auth_file(path)) as gw:
        yield gw


@pytest.fixture
def topics(redis_server: Any, namespace: str) -> Iterator[Topics]:
    with topics_of(redis_server, namespace) as t:
        for name in ("orders", "secret", "team-a.events", "shared.news", "shared.audit"):
            t.create(name, 1)
        yield t


def _kp(gw: GatewayThread, user: str = "alice") -> dict[str, Any]:
    return {"bootstrap_servers": gw.bootstrap, "security_protocol": "SASL_PLAINTEXT",
            "sasl_mechanism": "PLAIN", "sasl_plain_username": user,
            "sasl_plain_password": USERS[user]}


def _ck(gw: GatewayThread, user: str = "alice") -> dict[str, Any]:
    return {"bootstrap.servers": gw.bootstrap, "broker.address.family": "v4",
            "security.protocol": "SASL_PLAINTEXT", "sasl.mechanisms": "PLAIN",
            "sasl.username": user, "sasl.password": USERS[user]}


def test_kafka_python_consumes_its_group_and_is_refused_another(
    gateway: GatewayThread, topics: Topics,
) -> None:
    producer = kafka.KafkaProducer(**_kp(gateway))  # idempotent: InitProducerId by topic WRITE
    try:
        for i in range(3):
            producer.send("orders", value=b"o%d" % i).get(10)
        with pytest.raises(kafka.errors.TopicAuthorizationFailedError):
            producer.send("secret", value=b"never").get(10)
    finally:
        producer.close()
    consumer = kafka.KafkaConsumer("orders", group_id="app", auto_offset_reset="earliest",
                                   enable_auto_commit=False, consumer_timeout_ms=5000,
                                   **_kp(gateway))
    try:
        assert "orders" in consumer.topics()  # (after subscribing: see poll_until)
        assert [m.value for m in take(consumer, 3)] == [b"o0", b"o1", b"o2"]
        consumer.commit()
        tp = kafka.TopicPartition("orders", 0)
        assert consumer.committed(tp) == 3
    finally:
        consumer.close()
    other = kafka.KafkaConsumer("orders", group_id="other", auto_offset_reset="earliest",
                                consumer_timeout_ms=5000, **_kp(gateway))
    try:
        with pytest.raises(kafka.errors.GroupAuthorizationFailedError):
            other.poll(timeout_ms=10_000)
    finally:
        other.close()
    assert [p.log_end_offset for p in topics.describe("secret").partitions] == [0]


def _ck_consume(ck: Any, gw: GatewayThread, group: str, topic: str, want: int
                ) -> tuple[list[bytes], list[Any]]:
    """Poll a librdkafka consumer until ``want`` values or an error arrive."""
    consumer = ck.Consumer({**_ck(gw), "group.id": group, "auto.offset.reset": "earliest",
                            "session.timeout.ms": 6000, "heartbeat.interval.ms": 200})
    values: list[bytes] = []
    errors: list[Any] = []
    consumer.subscribe([topic])
    try:
        def step() -> None:
            msg = consumer.poll(0.2)
            if msg is None:
                return
            if msg.error():
                errors.append(msg.error())
            else:
                values.append(msg.value())

        wait_until(lambda: len(values) >= want or errors, step, timeout_s=WAIT_S)
    finally:
        consumer.close()
    return values, errors


def test_confluent_kafka_prefixed_rules_and_deny_over_allow(
    gateway: GatewayThread, topics: Topics,
) -> None:
    ck = pytest.importorskip("confluent_kafka")
    reports: list[tuple[str, Any]] = []
    producer = ck.Producer({**_ck(gateway), "enable.idempotence": True})
    for topic in ("team-a.events", "shared.news", "shared.audit"):
        producer.produce(topic, value=topic.encode(),
                         on_delivery=lambda err, msg: reports.append((msg.topic(), err)))
    assert producer.flush(30) == 0
    outcome = {t: (None if e is None else e.code()) for t, e in reports}
    assert outcome == {"team-a.events": None, "shared.news": None,
                       "shared.audit": ck.KafkaError.TOPIC_AUTHORIZATION_FAILED}
    assert [p.log_end_offset for p in topics.describe("shared.audit").partitions] == [0]

    values, errors = _ck_consume(ck, gateway, "team-a.workers", "team-a.events", 1)
    assert (values, errors) == ([b"team-a.events"], [])
    values, errors = _ck_consume(ck, gateway, "team-b.workers", "team-a.events", 1)
    assert values == [] and errors[0].code() == ck.KafkaError.GROUP_AUTHORIZATION_FAILED


# -- raw frames: each API's check ----------------------------------------------------------------


class _Session:
    """One authenticated raw connection; ``call`` sends a request and reads its response."""

    def __init__(self, gw: GatewayThread, user: str) -> None:
        self.sock: socket.socket = sasl_connect(gw, user, USERS[user])
        self.corr = 10

    def call(self, key: int, version: int, body: dict[str, Any], header_bytes: int = 5) -> Any:
        """(``header_bytes``: 5 for a flexible version's response header, 4 before.)"""
        self.corr += 1
        self.sock.sendall(request_frame(key, version, self.corr, body))
        return response(self.sock, key, version, header_bytes)

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def alice(gateway: GatewayThread) -> Iterator[_Session]:
    s = _Session(gateway, "alice")
    yield s
    s.close()


@pytest.fixture
def bob(gateway: GatewayThread) -> Iterator[_Session]:
    s = _Session(gateway, "bob")
    yield s
    s.close()


def _codes(items: Any, name_field: str, code_field: str = "error_code") -> dict[str, int]:
    return {getattr(i, name_field): getattr(i, code_field).value for i in items}


def test_metadata_hides_or_refuses_what_may_not_be_described(
    alice: _Session, bob: _Session, topics: Topics,
) -> None:
    everything = alice.call(3, 12, {"topics": None, "allow_auto_topic_creation": False})
    assert sorted(t.name for t in everything.topics) == [
        "orders", "shared.audit", "shared.news", "team-a.events"]  # "secret" is left out
    named = alice.call(3, 12, {"topics": [{"name": "secret"}, {"name": "nosuch"},
                                          {"name": "orders"}]})
    assert _codes(named.topics, "name") == {"secret": TOPIC_AUTHORIZATION_FAILED,
                                            "nosuch": TOPIC_AUTHORIZATION_FAILED, "orders": 0}
    assert bob.call(3, 12, {"topics": None}).topics == ()


def test_records_apis_check_the_topic(alice: _Session, topics: Topics) -> None:
    batch = produced_batch([Record(0, None, b"x", {}, 0)])
    produced = alice.call(0, 9, {"acks": -1, "timeout": 10000, "topic_data": [
        {"name": n, "partition_data": [{"index": 0, "records": batch}]}
        for n in ("secret", "orders")]})
    assert {t.name: t.partition_responses[0].error_code.value for t in produced.responses} == {
        "secret": TOPIC_AUTHORIZATION_FAILED, "orders": 0}
    assert [p.log_end_offset for p in topics.describe("secret").partitions] == [0]
    fetched = alice.call(1, 12, {"replica_id": -1, "max_wait": 0, "min_bytes": 1,
                                 "max_bytes": 1 << 20, "topics": [
        {"topic": n, "partitions": [{"partition": 0, "fetch_offset": 0,
                                     "partition_max_bytes": 1 << 20}]}
        for n in ("secret", "orders")]})
    assert {t.topic: t.partitions[0].error_code.value for t in fetched.responses} == {
        "secret": TOPIC_AUTHORIZATION_FAILED, "orders": 0}
    listed = alice.call(2, 7, {"replica_id": -1, "topics": [
        {"name": n, "partitions": [{"partition_index": 0, "timestamp": -1}]}
        for n in ("secret", "orders")]})
    assert {t.name: t.partitions[0].error_code.value for t in listed.topics} == {
        "secret": TOPIC_AUTHORIZATION_FAILED, "orders": 0}


def test_group_apis_check_the_group(alice: _Session, bob: _Session, topics: Topics) -> None:
    joined = alice.call(11, 9, {"group_id": "other", "session_timeout": 6000,
                                "rebalance_timeout": 6000, "member_id": "",
                                "protocol_type": "consumer",
                                "protocols": [{"name": "range", "metadata": b""}]})
    assert joined.error_code.value == GROUP_AUTHORIZATION_FAILED
    found = alice.call(10, 4, {"key_type": 0, "coordinator_keys": ["app", "other"]})
    assert _codes(found.coordinators, "key") == {"app": 0, "other": GROUP_AUTHORIZATION_FAILED}
    heartbeat = alice.call(12, 4, {"group_id": "other", "generation_id": 1, "member_id": "m"})
    assert heartbeat.error_code.value == GROUP_AUTHORIZATION_FAILED
    # OffsetCommit: the group, then each topic; only the allowed topic is committed.
    committed = alice.call(8, 8, {"group_id": "app", "generation_id_or_member_epoch": -1,
                                  "member_id": "", "topics": [
        {"name": n, "partitions": [{"partition_index": 0, "committed_offset": 1}]}
        for n in ("orders", "secret")]})
    assert {t.name: t.partitions[0].error_code.value for t in committed.topics} == {
        "orders": 0, "secret": TOPIC_AUTHORIZATION_FAILED}
    refused = alice.call(8, 8, {"group_id": "other", "generation_id_or_member_epoch": -1,
                                "member_id": "", "topics": [
        {"name": "orders", "partitions": [{"partition_index": 0, "committed_offset": 1}]}]})
    assert refused.topics[0].partitions[0].error_code.value == GROUP_AUTHORIZATION_FAILED
    # OffsetFetch: bob may describe "app" but no topic: the commit is hidden from him.
    fetched = alice.call(9, 8, {"groups": [{"group_id": "app", "topics": None},
                                           {"group_id": "other", "topics": None}]})
    assert _codes(fetched.groups, "group_id") == {"app": 0, "other": GROUP_AUTHORIZATION_FAILED}
    assert [t.name for t in fetched.groups[0].topics] == ["orders"]
    # The group refused: its partitions are listed only where there is no group-level error
    # (v1), as Kafka's OffsetFetchRequest.getErrorResponse.
    named_other = {"group_id": "other", "topics": [{"name": "orders", "partition_indexes": [0]}]}
    assert alice.call(9, 8, {"groups": [named_other]}).groups[0].topics == ()
    v7 = alice.call(9, 7, {**named_other, "require_stable": False})  # (flexible from v6)
    assert (v7.error_code.value, v7.topics) == (GROUP_AUTHORIZATION_FAILED, ())
    v1 = alice.call(9, 1, named_other, header_bytes=4)
    assert [p.error_code.value for t in v1.topics for p in t.partitions] == [
        GROUP_AUTHORIZATION_FAILED]
    seen_by_bob = bob.call(9, 8, {"groups": [{"group_id": "app", "topics": None}]})
    assert seen_by_bob.groups[0].error_code.value == 0 and seen_by_bob.groups[0].topics == ()
    named = bob.call(9, 8, {"groups": [{"group_id": "app", "topics": [
        {"name": "orders", "partition_indexes": [0]}]}]})
    assert named.groups[0].topics[0].partitions[0].error_code.value == \
        TOPIC_AUTHORIZATION_FAILED
    # Admin: describe, list and delete by group.
    described = alice.call(15, 5, {"groups": ["app", "other"]})
    assert _codes(described.groups, "group_id") == {"app": 0,
                                                    "other": GROUP_AUTHORIZATION_FAILED}
    deleted = alice.call(42, 2, {"groups_names": ["app", "team-a.gone"]})
    assert _codes(deleted.results, "group_id") == {
        "app": GROUP_AUTHORIZATION_FAILED,  # READ is not DELETE
        "team-a.gone": 69}                  # allowed (prefixed ALL), and no such group
    listed = bob.call(16, 4, {"states_filter": []})
    assert [g.group_id for g in listed.groups] == ["app"]


def test_commit_checks_the_topic_before_whether_it_exists(alice: _Session, topics: Topics
                                                         ) -> None:
    """As KafkaApis: a topic the principal may not READ is TOPIC_AUTHORIZATION_FAILED whether or
    not it exists (nothing is told about it); a readable one that does not exist, or a partition
    past its last, is UNKNOWN_TOPIC_OR_PARTITION; the rest is committed."""
    wanted = {"orders": [0, 5], "shared.nosuch": [0], "secret": [0], "nosuch": [0]}
    committed = alice.call(8, 8, {"group_id": "app", "generation_id_or_member_epoch": -1,
                                  "member_id": "", "topics": [
        {"name": n, "partitions": [{"partition_index": p, "committed_offset": 1} for p in ps]}
        for n, ps in wanted.items()]})
    assert {(t.name, p.partition_index): p.error_code.value
            for t in committed.topics for p in t.partitions} == {
        ("orders", 0): 0, ("orders", 5): 3, ("shared.nosuch", 0): 3,
        ("secret", 0): TOPIC_AUTHORIZATION_FAILED, ("nosuch", 0): TOPIC_AUTHORIZATION_FAILED}
    fetched = alice.call(9, 8, {"groups": [{"group_id": "app", "topics": None}]})
    assert [(t.name, [p.partition_index for p in t.partitions])
            for t in fetched.groups[0].topics] == [("orders", [0])]


def test_describe_groups_reports_the_operations_each_principal_may_do(
    gateway: GatewayThread, alice: _Session, bob: _Session, caplog: pytest.LogCaptureFixture,
) -> None:
    """Kafka's AuthHelper.authorizedOperations: each of READ (3), DELETE (6) and DESCRIBE (8)
    the principal may do on the group, as bits; decided without logging the denials."""
    read, delete, describe = 1 << 3, 1 << 6, 1 << 8
    admin = _Session(gateway, "admin")
    try:
        def ops(s: _Session, groups: list[str]) -> list[tuple[str, int, int]]:
            r = s.call(15, 5, {"groups": groups, "include_authorized_operations": True})
            return [(g.group_id, g.error_code.value, g.authorized_operations) for g in r.groups]

        caplog.clear()
        with caplog.at_level("INFO", logger="rcoord.gateway.authorizer"):
            assert ops(alice, ["app", "team-a.g", "other"]) == [
                ("app", 0, read | describe),                 # READ implies DESCRIBE
                ("team-a.g", 0, read | delete | describe),   # prefixed ALL
                ("other", GROUP_AUTHORIZATION_FAILED, -(2**31))]
            assert ops(bob, ["app"]) == [("app", 0, describe)]
            assert ops(admin, ["app"]) == [("app", 0, read | delete | describe)]  # super user
        denied = [r.getMessage() for r in caplog.records if "Denied" in r.getMessage()]
        only_the_check = ("Principal = User:alice is Denied operation = DESCRIBE from host = "
                          "127.0.0.1 on resource = group:other")
        assert denied == [only_the_check]  # computing the bits logs no denial
    finally:
        admin.close()


def test_metadata_reports_the_operations_each_principal_may_do(
    gateway: GatewayThread, alice: _Session, bob: _Session, topics: Topics,
) -> None:
    """Metadata v8+ (KIP-430), as Kafka's handleTopicMetadataRequest: asked for, each topic the
    principal may describe carries the bits of the topic operations it may do (an unknown one
    too); a refused topic keeps the sentinel; the cluster's (v8-v10) are 0 for a principal
    without DESCRIBE on the cluster."""
    read, write, create, delete, alter, describe, describe_configs, alter_configs = (
        1 << 3, 1 << 4, 1 << 5, 1 << 6, 1 << 7, 1 << 8, 1 << 10, 1 << 11)
    every_topic_op = (read | write | create | delete | alter | describe | describe_configs
                      | alter_configs)  # 3576
    every_cluster_op = 8096  # CREATE, ALTER, DESCRIBE, CLUSTER_ACTION, (DESCRIBE|ALTER)_CONFIGS,
    #                          IDEMPOTENT_WRITE
    admin = _Session(gateway, "admin")
    try:
        def ask(s: _Session, names: list[str]) -> tuple[list[tuple[str, int, int]], int]:
            r = s.call(3, 10, {"topics": [{"name": n} for n in names],
                               "allow_auto_topic_creation": False,
                               "include_cluster_authorized_operations": True,
                               "include_topic_authorized_operations": True})
            return ([(t.name, t.error_code.value, t.topic_authorized_operations)
                     for t in sorted(r.topics, key=lambda t: t.name)],
                    r.cluster_authorized_operations)

        assert ask(alice, ["orders", "secret", "shared.audit", "team-a.events",
                           "team-a.nope"]) == ([
            ("orders", 0, read | write | describe),
            ("secret", TOPIC_AUTHORIZATION_FAILED, -(2**31)),
            ("shared.audit", 0, every_topic_op & ~write),  # the deny wins
            ("team-a.events", 0, every_topic_op),
            ("team-a.nope", 3, every_topic_op)], 0)
        assert ask(bob, ["orders"]) == ([("orders", TOPIC_AUTHORIZATION_FAILED, -(2**31))], 0)
        assert ask(admin, ["orders"]) == ([("orders", 0, every_topic_op)], every_cluster_op)
    finally:
        admin.close()


def test_init_producer_id_needs_idempotent_write_or_a_topic_write(
    alice: _Session, bob: _Session,
) -> None:
    body = {"transactional_id": None, "transaction_timeout": 60000}
    assert alice.call(22, 4, body).error_code.value == 0
    assert bob.call(22, 4, body).error_code.value == CLUSTER_AUTHORIZATION_FAILED


def test_create_and_delete_topics_need_create_and_delete(alice: _Session, bob: _Session,
                                                         topics: Topics) -> None:
    def create(s: _Session, name: str) -> int:
        r = s.call(19, 7, {"topics": [{"name": name, "num_partitions": 1,
                                       "replication_factor": -1}], "timeout": 10000})
        return int(r.topics[0].error_code.value)

    assert create(alice, "team-a.new") == 0
    assert create(alice, "elsewhere") == TOPIC_AUTHORIZATION_FAILED
    assert "elsewhere" not in topics.list()
    deleted = alice.call(20, 5, {"topic_names": ["team-a.new", "orders"],
                                 "timeout": 10000})
    assert _codes(deleted.responses, "name") == {"team-a.new": 0,
                                                 "orders": TOPIC_AUTHORIZATION_FAILED}
    assert "orders" in topics.list()


def test_all_on_the_cluster_creates_and_deletes_any_topic(gateway: GatewayThread,
                                                          topics: Topics) -> None:
    """Kafka's ControllerApis: CREATE on the cluster creates any topic, DELETE on the cluster
    (which only an ALL rule on it grants) deletes any topic. The gateway honoured the first
    but refused the second, TOPIC_AUTHORIZATION_FAILED for every topic."""
    ops = _Session(gateway, "ops")
    try:
        created = ops.call(19, 7, {"topics": [{"name": "made", "num_partitions": 1,
                                               "replication_factor": -1}], "timeout": 10000})
        assert _codes(created.topics, "name") == {"made": 0}
        deleted = ops.call(20, 5, {"topic_names": ["made", "orders", "nope"], "timeout": 10000})
        assert _codes(deleted.responses, "name") == {"made": 0, "orders": 0, "nope": 3}
        assert "orders" not in topics.list() and "made" not in topics.list()
    finally:
        ops.close()


def test_delete_topics_answers_a_missing_topic_the_caller_may_see_as_unknown(
        gateway: GatewayThread, alice: _Session, topics: Topics) -> None:
    """Kafka's ControllerApis.deleteTopics refuses (29) a topic the caller may not delete only
    if the caller may not see it or it exists: one it may see (DESCRIBE) that does not exist is
    UNKNOWN_TOPIC_OR_PARTITION, and so is an illegal name (the controller looks names up
    without judging them). Both were refused, 29, and an illegal name was 17."""
    def delete(names: list[str]) -> dict[str, int]:
        return _codes(alice.call(20, 5, {"topic_names": names, "timeout": 10000}).responses,
                      "name")

    assert delete(["orders"]) == {"orders": TOPIC_AUTHORIZATION_FAILED}  # seen, not deletable
    admin = _Session(gateway, "admin")
    try:
        assert _codes(admin.call(20, 5, {"topic_names": ["orders"], "timeout": 10000}
                                 ).responses, "name") == {"orders": 0}
    finally:
        admin.close()
    assert delete(["orders", "elsewhere", "team-a.bad name!"]) == {
        "orders": 3, "elsewhere": TOPIC_AUTHORIZATION_FAILED, "team-a.bad name!": 3}


def test_create_topics_hides_the_configs_of_a_topic_not_describable(alice: _Session,
                                                                    topics: Topics) -> None:
    """Kafka's ControllerApis: a topic created by a principal without DESCRIBE_CONFIGS on it
    is answered without its configs, topic_config_error_code TOPIC_AUTHORIZATION_FAILED."""
    r = alice.call(19, 7, {"topics": [{"name": n, "num_partitions": 2, "replication_factor": -1}
                                      for n in ("shared.blind", "shared.seen")],
                           "timeout": 10000})
    answers = {t.name: (t.error_code.value, int(t.topic_config_error_code), t.num_partitions,
                        len(t.configs or ())) for t in r.topics}
    assert answers == {"shared.blind": (0, TOPIC_AUTHORIZATION_FAILED, -1, 0),
                       "shared.seen": (0, 0, 2, 5)}
    assert topics.partition_count("shared.blind") == 2


def test_a_refused_client_does_not_disturb_an_allowed_one(gateway: GatewayThread,
                                                          topics: Topics) -> None:
    """bob's refused requests on one connection, alice's consumer on another, together."""
    stop = threading.Event()

    def hammer() -> None:
        s = _Session(gateway, "bob")
        try:
            while not stop.is_set():
                s.call(11, 9, {"group_id": "app", "session_timeout": 6000,
                               "rebalance_timeout": 6000, "member_id": "",
                               "protocol_type": "consumer", "protocols": []})
        finally:
            s.close()

    t = threading.Thread(target=hammer, daemon=True)
    t.start()
    try:
        producer = kafka.KafkaProducer(**_kp(gateway))
        producer.send("orders", value=b"ok").get(10)
        producer.close()
        consumer = kafka.KafkaConsumer("orders", group_id="app", auto_offset_reset="earliest",
                                       consumer_timeout_ms=5000, **_kp(gateway))
        try:
            assert "orders" in consumer.topics()  # (after subscribing: see poll_until)
            assert [m.value for m in take(consumer, 1)] == [b"ok"]
        finally:
            consumer.close()
    finally:
        stop.set()
        t.join(30)


@pytest.mark.parametrize("version", [1, 2, 3])
def test_find_coordinator_below_v4_carries_kafkas_message(alice: _Session, version: int
                                                          ) -> None:
    """Below v4 Kafka puts its error's message in FindCoordinator's ``error_message``
    (``Errors.message()``: "NONE" on success, "Group authorization failed." for a group the
    caller may not describe); the gateway sent null, which Kafka never does there."""
    for group, code, text in (("app", 0, "NONE"),
                              ("other", GROUP_AUTHORIZATION_FAILED, "Group authorization failed.")):
        found = alice.call(10, version, {"key_type": 0, "key": group},
                           header_bytes=5 if version >= 3 else 4)
        assert (found.error_code.value, found.error_message) == (code, text)
