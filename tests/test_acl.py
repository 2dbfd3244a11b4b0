"""Least privilege: the ACL rules of docs/security.md, tested for real.

The rules are read from the document itself (its ``ACL SETUSER`` lines under ``# role:``), the
users are created on the test servers (every node of the cluster), and each role's operations
run through rcoord as that user. ``ACL LOG`` must then hold no denial for the user, except the
ones the document says a role degrades on (the coordinator service without ``CONFIG``).
"""

from __future__ import annotations

import re
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.cluster
from harness import wait_until

from rcoord import (
    Consumer,
    ConsumerGroupConfig,
    CoordinatorConfig,
    Errors,
    GroupCoordinator,
    TopicPartition,
)
from rcoord.connect import connect
from rcoord.errors import MissingPermissionError
from rcoord.topics import Producer, ProducerRecord, Topics, fetch, offsets_for_times

DOC = Path(__file__).resolve().parent.parent / "docs" / "security.md"
PASSWORD = "acl-test-pw"
FAST = {"group_min_session_timeout_ms": 10, "group_initial_rebalance_delay_ms": 0}
WAIT_S = 15.0


def doc_rules() -> dict[str, list[str]]:
    """role -> the rule tokens of its ``ACL SETUSER <user> ...`` line in docs/security.md."""
    text = DOC.read_text()
    found = re.findall(r"^# role: (\S+)\nACL SETUSER <user> (.+)$", text, flags=re.MULTILINE)
    rules = {role: line.split() for role, line in found}
    assert set(rules) == {"worker", "service", "service-hints", "admin", "cluster"}, rules.keys()
    return rules


RULES = doc_rules()


class Users:
    """ACL users made from the document's rules, on every node; removed afterwards."""

    def __init__(self, nodes: list[redis.Redis], url: str) -> None:
        self.nodes = nodes
        self.url = url
        self.made: list[str] = []

    def make(self, namespace: str, *roles: str) -> str:
        name = f"u-{roles[0]}-{uuid.uuid4().hex[:6]}"
        for node in self.nodes:
            node.execute_command("ACL", "DELUSER", name)
            for role in roles:
                tokens = [t.replace("<password>", PASSWORD).replace("<namespace>", namespace)
                          for t in RULES[role]]
                node.execute_command("ACL", "SETUSER", name, *tokens)
        self.made.append(name)
        return name

    def url_of(self, name: str) -> str:
        return self.url.replace("redis://", f"redis://{name}:{PASSWORD}@")

    def client(self, name: str) -> Any:
        return connect(self.url_of(name))

    def denials(self, name: str) -> list[tuple[str, str]]:
        """(reason, object) of every ACL LOG entry of ``name``, on every node."""
        out = []
        for node in self.nodes:
            for entry in node.execute_command("ACL", "LOG"):
                e = {(k.decode() if isinstance(k, bytes) else k): v for k, v in entry.items()}
                if e["username"] == name.encode():
                    out.append((e["reason"].decode(), e["object"].decode()))
        return out

    def cleanup(self) -> None:
        for node in self.nodes:
            for name in self.made:
                node.execute_command("ACL", "DELUSER", name)


@pytest.fixture
def users(request: pytest.FixtureRequest, backend: str) -> Iterator[Users]:
    if backend == "single":
        server = request.getfixturevalue("redis_server")
        nodes, url = [server.client()], server.url
        extra: tuple[str, ...] = ()
    else:
        cluster = request.getfixturevalue("redis_cluster")
        nodes, url = cluster.node_clients(), cluster.url
        extra = ("cluster",)
    u = Users(nodes, url)
    u.extra = extra  # type: ignore[attr-defined]
    try:
        yield u
    finally:
        u.cleanup()
        for n in nodes:
            n.close()


def make(users: Users, namespace: str, role: str) -> tuple[str, Any]:
    name = users.make(namespace, role, *users.extra)  # type: ignore[attr-defined]
    return name, users.client(name)


def admin_setup(users: Users, namespace: str, partitions: int = 3) -> tuple[str, Any]:
    """The admin user sets the namespace's settings and creates topic ``t``."""
    name, client = make(users, namespace, "admin")
    GroupCoordinator(client, CoordinatorConfig(namespace=namespace, num_partitions=10,
                                               **FAST)).start()
    Topics(client, namespace).create("t", partitions)
    return name, client


def test_admin_operations(users: Users, namespace: str, backend: str) -> None:
    name, client = admin_setup(users, namespace)
    if backend == "cluster":
        assert isinstance(client, redis.cluster.RedisCluster)  # found without INFO
    topics = Topics(client, namespace)
    topics.add_partitions("t", 4)
    assert topics.describe("t").partitions[3].partition == 3
    topics.create("gone", 2)
    topics.delete("gone")
    assert topics.list() == ["t"]
    topics.apply_retention("t")
    coord = GroupCoordinator(client, CoordinatorConfig(namespace=namespace)).start()
    assert coord.config.num_partitions == 10
    join: dict[str, Any] = {"protocol_type": "consumer", "protocols": [("range", b"")],
                            "session_timeout_ms": 5000, "rebalance_timeout_ms": 5000}
    first = coord.join_group("g", "", **join)
    assert coord.join_group("g", first.member_id, **join).error == Errors.NONE
    assert [g.group_id for g in coord.list_groups()] == ["g"]
    assert coord.describe_group("g").members
    assert coord.delete_groups(["nope"]) == {"nope": Errors.GROUP_ID_NOT_FOUND}
    coord.delete_offsets("g", [TopicPartition("t", 0)])
    assert users.denials(name) == []
    client.close()


def test_worker_produces_consumes_and_commits(users: Users, namespace: str) -> None:
    admin_name, admin = admin_setup(users, namespace)
    name, client = make(users, namespace, "worker")
    Producer(client, namespace).send_batch(
        "t", [ProducerRecord(b"v%d" % i, key=b"k%d" % i) for i in range(30)])
    consumer = Consumer(ConsumerGroupConfig(
        group_id="g", topics=["t"], redis_client=client, namespace=namespace,
        session_timeout_ms=1000, heartbeat_interval_ms=200, rebalance_timeout_ms=2000))
    got: list[Any] = []
    try:
        wait_until(lambda: got.extend(consumer.poll(timeout=0.2)) or len(got) >= 30)
        consumer.commit()
    finally:
        consumer.close(timeout=5)
    assert sorted(r.value for r in got) == sorted(b"v%d" % i for i in range(30))
    committed = GroupCoordinator(admin, CoordinatorConfig(namespace=namespace)).fetch_offsets(
        "g", [TopicPartition("t", p) for p in range(3)]).offsets
    assert sum(o.offset for o in committed.values()) == 30
    assert users.denials(name) == [] and users.denials(admin_name) == []
    client.close()
    admin.close()


def _service(users: Users, name: str, namespace: str) -> tuple[Any, threading.Thread]:
    from rcoord.service import CoordinatorService, ServiceConfig

    svc = CoordinatorService(ServiceConfig(redis_url=users.url_of(name), namespace=namespace,
                                           lease_ttl_ms=1000)).start()
    thread = threading.Thread(target=svc.run, daemon=True)
    thread.start()
    return svc, thread


def _idle_member_is_expired_by(users: Users, namespace: str, worker: Any) -> None:
    """A member that never heartbeats again is removed by the service alone."""
    coord = GroupCoordinator(worker, CoordinatorConfig(namespace=namespace)).start()
    join: dict[str, Any] = {"protocol_type": "consumer", "protocols": [("range", b"")],
                            "session_timeout_ms": 300, "rebalance_timeout_ms": 1000}
    first = coord.join_group("idle", "", **join)
    assert coord.join_group("idle", first.member_id, **join).error == Errors.NONE
    members = coord._keys("idle").members
    wait_until(lambda: worker.hlen(members) == 0, timeout_s=10)



def test_an_idle_consumer_waiting_for_records_needs_no_other_rule(users: Users,
                                                                   namespace: str) -> None:
    """A consumer with nothing to read waits in a blocking read, and sends ``CLIENT ID`` with
    it so that ``close()`` can end the wait (``CLIENT UNBLOCK``): the worker rules lacked both,
    and an idle consumer logged a denial to ``ACL LOG`` on every waiting fetch."""
    admin_setup(users, namespace)[1].close()
    name, client = make(users, namespace, "worker")
    consumer = Consumer(ConsumerGroupConfig(
        group_id="g", topics=["t"], redis_client=client, namespace=namespace,
        session_timeout_ms=1000, heartbeat_interval_ms=200, rebalance_timeout_ms=2000,
    ), fetch_max_wait_ms=200)
    try:
        wait_until(lambda: bool(consumer.assignment()),
                   step=lambda: consumer.poll(timeout=0.2))
        for _ in range(3):  # waiting reads, the group formed
            assert not consumer.poll(timeout=0.3)
    finally:
        consumer.close(timeout=5)
        client.close()
    assert users.denials(name) == []

@pytest.mark.parametrize("hints", [False, True], ids=["index-alone", "with-hints"])
def test_coordinator_service(users: Users, namespace: str, backend: str, hints: bool) -> None:
    _, admin = admin_setup(users, namespace)
    _, worker = make(users, namespace, "worker")
    roles = ("service", "service-hints") if hints else ("service",)
    name = users.make(namespace, *roles, *users.extra)  # type: ignore[attr-defined]
    svc, thread = _service(users, name, namespace)
    try:
        wait_until(lambda: svc.health()[1]["leases"] == 10, timeout_s=10)
        _idle_member_is_expired_by(users, namespace, worker)
        status = svc.health()[1]["keyspace_events"]
        ok = svc.health()[0]
    finally:
        svc.stop()
        thread.join(5)
    assert ok
    denied = users.denials(name)
    if hints:
        assert status == "enabled" and denied == []
    else:
        # The documented degradation: no CONFIG, no key-event channel; the index does the work.
        assert status.startswith("unavailable: the Redis user may not subscribe to __keyevent@")
        assert "deadlines act from the index alone" in status
        assert set(denied) <= {("command", "config|get"), ("channel", "__keyevent@0__:expired")}
    worker.close()
    admin.close()


def test_a_namespace_cannot_touch_a_namespace_that_extends_its_name(users: Users,
                                                                     namespace: str) -> None:
    """``~a:*`` (with the separator) does not cover namespace ``a2``; ``~a*`` would."""
    other = namespace + "2"
    _, other_admin = admin_setup(users, other)
    Producer(other_admin, other).send_batch("t", [ProducerRecord(b"secret", key=b"k")])
    name, worker = make(users, namespace, "worker")
    with pytest.raises(redis.exceptions.NoPermissionError):
        worker.hgetall(f"{other}:settings")
    with pytest.raises(redis.exceptions.NoPermissionError):
        worker.hset(f"{other}:settings", "num_partitions", "1")
    # Through rcoord: every script declares its keys, and the ACL checks them. rcoord's calls
    # raise MissingPermissionError, with the server's words and where the rules are.
    with pytest.raises(MissingPermissionError, match="docs/security.md") as info:
        GroupCoordinator(worker, CoordinatorConfig(namespace=other)).start()
    assert isinstance(info.value.__cause__, redis.exceptions.NoPermissionError)
    with pytest.raises(MissingPermissionError, match="No permissions to access a key"):
        Topics(worker, other).describe("t")
    assert {reason for reason, _ in users.denials(name)} == {"key"}
    worker.close()
    other_admin.close()


@pytest.mark.parametrize("backend", ["cluster"])
def test_a_cluster_user_without_cluster_slots_is_told_which_rule_to_add(users: Users,
                                                                        namespace: str) -> None:
    name = users.make(namespace, "worker")  # no "cluster" rule
    with pytest.raises(MissingPermissionError, match=r"CLUSTER SLOTS.*\+cluster\|slots"):
        users.client(name)
    for node in users.nodes:
        node.execute_command("ACL", "SETUSER", name, "+cluster|slots")
    with pytest.raises(MissingPermissionError, match=r"COMMAND.*add \+command "):
        users.client(name)



def _denied(users: Users, name: str) -> int:
    """How many times the server refused ``name`` anything (ACL LOG folds repeats into a
    ``count``), on every node."""
    total = 0
    for node in users.nodes:
        for entry in node.execute_command("ACL", "LOG"):
            e = {(k.decode() if isinstance(k, bytes) else k): v for k, v in entry.items()}
            if e["username"] == name.encode():
                total += int(e["count"])
    return total


@pytest.mark.parametrize("command", ["xadd", "fcall"])
def test_a_worker_without_a_permission_stops_at_once_with_the_servers_message(
        users: Users, namespace: str, command: str) -> None:
    """A worker user without one rule it needs: ``xadd`` is refused inside the join function
    (the server answers "ACL failure in script", without the NOPERM code), ``fcall`` at the
    command (NOPERM). No retry can mend either, so the group closes after the first refusal
    and every ``poll()`` raises ``MissingPermissionError`` naming the command. Before, the
    member backed off and joined again every ``join_backoff_ms`` for ever, and ``poll()``
    raised the server's error once per round, between polls that returned nothing."""
    admin_setup(users, namespace)[1].close()
    name = users.make(namespace, "worker", *users.extra)  # type: ignore[attr-defined]
    for node in users.nodes:
        node.execute_command("ACL", "SETUSER", name, f"-{command}")
    client = users.client(name)
    consumer = Consumer(ConsumerGroupConfig(
        group_id="g", topics=["t"], redis_client=client, namespace=namespace,
        session_timeout_ms=1000, heartbeat_interval_ms=200, rebalance_timeout_ms=2000,
        join_backoff_ms=20, retry_backoff_ms=10, retry_backoff_max_ms=50))
    try:
        for _ in range(2):  # once, and for good
            with pytest.raises(MissingPermissionError, match=f"run the '{command}' command"):
                consumer.poll(timeout=WAIT_S)
        assert consumer.group.closed
        thread = consumer.group._thread
        assert thread is not None
        thread.join(WAIT_S)
        assert not thread.is_alive()  # nothing is left to try again
        refused = _denied(users, name)
        with pytest.raises(MissingPermissionError, match="docs/security.md"):
            consumer.poll(timeout=0.1)
        assert _denied(users, name) == refused  # that poll asked the server nothing
    finally:
        consumer.close(timeout=5)
        client.close()


def test_worker_makes_a_group_again_while_its_old_wake_stream_lingers(users: Users,
                                                                       namespace: str) -> None:
    """Creating a group reads its wake stream's last id (XREVRANGE) and, if a deleted group's
    stream lingers, takes it over (PERSIST): both run with the worker's rights."""
    admin_name, admin = admin_setup(users, namespace)
    name, worker = make(users, namespace, "worker")
    coord = GroupCoordinator(worker, CoordinatorConfig(namespace=namespace)).start()
    wake_key = coord._keys("g").wake
    admin.xadd(wake_key, {"g": "7"})  # what a deleting call that woke parked callers leaves
    admin.pexpire(wake_key, 60_000)
    join: dict[str, Any] = {"protocol_type": "consumer", "protocols": [("range", b"")],
                            "session_timeout_ms": 5000, "rebalance_timeout_ms": 5000}
    first = coord.join_group("g", "", **join)
    assert coord.join_group("g", first.member_id, **join).error == Errors.NONE
    plain = connect(users.url)  # the default user: PTTL is no role's business
    assert plain.pttl(wake_key) == -1  # taken over by the new group
    plain.close()
    assert users.denials(name) == [] and users.denials(admin_name) == []
    worker.close()
    admin.close()


def test_worker_runs_a_named_producer_that_logs_its_appends(users: Users,
                                                           namespace: str) -> None:
    """The Spark sink's producer (``log_appends``): the first append of an epoch SETs the
    partition's append log with PX, later ones APPEND to it and PEXPIRE it; a retried task
    reads it back (GET, XRANGE)."""
    from rcoord.topics.epoch_log import epoch_appends, epoch_states

    admin_name, admin = admin_setup(users, namespace, partitions=1)
    name, worker = make(users, namespace, "worker")
    producer = Producer(worker, namespace, producer_id="sink-0", log_appends=True)
    producer.send_batch("t", [ProducerRecord(b"a", partition=0)])
    producer.send_batch("t", [ProducerRecord(b"b", partition=0)])
    states = epoch_states(worker, namespace, "t", "sink-0", 1)
    stored = epoch_appends(worker, namespace, "t", "sink-0", 0, list(states.values()))
    assert [r.value for r in stored[0].records] == [b"a", b"b"]
    assert users.denials(name) == [] and users.denials(admin_name) == []
    worker.close()
    admin.close()


def test_a_worker_whose_rules_predate_xlen_still_reads(users: Users, namespace: str) -> None:
    """A fetch reads the log offsets with XLEN (``topic_common.lua``'s log_offsets_marked),
    which the worker rules gained with it; a user made from the rules before still reads,
    with XINFO STREAM as before, instead of every fetch failing with NOPERM."""
    admin_setup(users, namespace, partitions=1)[1].close()
    name, client = make(users, namespace, "worker")
    for node in users.nodes:
        node.execute_command("ACL", "SETUSER", name, "-xlen")
    try:
        Producer(client, namespace).send_batch("t", [ProducerRecord(b"x", partition=0)] * 3)
        got = fetch(client, namespace, "t", 0, 1)
    finally:
        client.close()
    assert got.error == Errors.NONE and [r.value for r in got.records] == [b"x", b"x"]
    assert (got.log_start_offset, got.log_end_offset) == (0, 3)


def test_retention_delete_records_and_offsets_by_time_run_without_xinfo(
        users: Users, namespace: str) -> None:
    """Retention, DeleteRecords and offsets_for_times read a non-empty partition's log offsets
    from its mark and XLEN (``topic_common.lua``'s log_offsets_marked), as fetches do, not
    with XINFO STREAM, whose reply copies the first and last records whole (about 2 MB a call
    with records of 1 MB): a user refused XINFO does all three. They read it before, and such
    a user was refused each of them."""
    name, client = make(users, namespace, "admin")
    for node in users.nodes:
        node.execute_command("ACL", "SETUSER", name, "-xinfo|stream")
    try:
        topics = Topics(client, namespace)
        topics.create("r", 2, retention_records=6, retention_ms=3_600_000)
        Producer(client, namespace).send_batch(
            "r", [ProducerRecord(b"x", partition=p) for p in (0, 1) for _ in range(10)])
        assert topics.apply_retention("r") == {0: 4, 1: 4}
        deleted = topics.delete_records("r", {0: 7, 1: 11})
        assert (deleted[0].low_watermark, deleted[1].error) == (7, Errors.OFFSET_OUT_OF_RANGE)
        found = offsets_for_times(client, namespace, {("r", 0): 0, ("r", 1): 0})
        assert [found[("r", p)].offset for p in (0, 1)] == [7, 4]  # type: ignore[union-attr]
        assert _denied(users, name) == 0
    finally:
        client.close()


def test_gateway_serves_kafka_clients_as_the_admin_user(users: Users, namespace: str) -> None:
    """docs/security.md: the gateway runs with the admin rules. kafka-python creates a topic,
    produces, consumes in a group, commits, reads the group's offsets, deletes the group and
    the topic through a gateway whose Redis user has exactly those rules."""
    import kafka
    import kafka.admin
    from gateway_harness import GatewayThread, committed_when_stable, poll_until

    name, admin = admin_setup(users, namespace)  # (the settings, with fast groups)
    admin.close()
    gw = GatewayThread(users.url_of(name), namespace).start()
    try:
        client = kafka.KafkaAdminClient(bootstrap_servers=gw.bootstrap)
        try:
            client.create_topics([kafka.admin.NewTopic("k", 2, 1)])
            producer = kafka.KafkaProducer(bootstrap_servers=gw.bootstrap, acks="all")
            for i in range(6):
                producer.send("k", b"v%d" % i).get(timeout=WAIT_S)
            producer.close()
            consumer = kafka.KafkaConsumer("k", bootstrap_servers=gw.bootstrap, group_id="kg",
                                           auto_offset_reset="earliest",
                                           enable_auto_commit=False)
            assert "k" in consumer.topics()  # (after subscribing: see poll_until)
            got: list[Any] = []
            try:
                poll_until(consumer, lambda records: got.extend(records) or len(got) >= 6)
                poll_until(consumer, lambda _: committed_when_stable(consumer))
            finally:
                consumer.close()
            assert sorted(r.value for r in got) == [b"v%d" % i for i in range(6)]
            offsets = client.list_group_offsets("kg")["kg"]
            assert sum(o.offset for o in offsets.values()) == 6
            client.delete_groups(["kg"])
            client.delete_topics(["k"])
        finally:
            client.close()
    finally:
        gw.stop()
    assert users.denials(name) == []
