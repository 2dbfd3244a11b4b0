"""The Kafka gateway driven by real Kafka clients (kafka-python, confluent-kafka) and by raw
frames for the error paths. Each test starts its own gateway on a free loopback port."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import pytest

pytest.importorskip("kio")
kafka = pytest.importorskip("kafka")

from gateway_harness import (
    FAST_GROUPS,
    GatewayThread,
    closed_by_gateway,
    recv_frame,
    request_frame,
    settle_fast_groups,
    take,
)
from gateway_harness import connect as _connect
from harness import wait_until

from rcoord.topics import Topics, fetch


def test_api_versions_lists_only_what_is_served(gateway: GatewayThread) -> None:
    from kio.schema.api_versions.v3.response import ApiVersionsResponse
    from kio.serial import entity_reader

    with _connect(gateway) as sock:
        sock.sendall(request_frame(18, 3, 7, {"client_software_name": "t",
                                         "client_software_version": "1"}))
        frame = recv_frame(sock)
    assert int.from_bytes(frame[:4], "big") == 7  # response header v0: correlation id only
    resp, _ = entity_reader(ApiVersionsResponse)(frame, 4)
    assert resp.error_code.value == 0
    served = {k.api_key: (k.min_version, k.max_version) for k in resp.api_keys}
    assert served[18] == (0, 3)
    assert served[11] == (0, 9) and served[1] == (4, 12) and served[0] == (3, 9)
    assert served[22] == (0, 5)  # InitProducerId
    assert 29 not in served  # DescribeAcls: not served, so not advertised


def test_api_versions_out_of_range_answers_v0_with_the_ranges(gateway: GatewayThread) -> None:
    from kio.schema.api_versions.v0.response import ApiVersionsResponse
    from kio.serial import entity_reader

    frame = (b"\x00\x12\x00\x63" + (9).to_bytes(4, "big") + b"\x00\x00\x00")  # v99, garbage body
    with _connect(gateway) as sock:
        sock.sendall(len(frame).to_bytes(4, "big") + frame)
        reply = recv_frame(sock)
    assert int.from_bytes(reply[:4], "big") == 9
    resp, _ = entity_reader(ApiVersionsResponse)(reply, 4)
    assert resp.error_code.value == 35  # UNSUPPORTED_VERSION
    assert any(k.api_key == 3 for k in resp.api_keys)


def test_unserved_api_gets_unsupported_version_and_the_connection_stays(
    gateway: GatewayThread,
) -> None:
    from kio.schema.describe_acls.v1.response import DescribeAclsResponse
    from kio.serial import entity_reader

    with _connect(gateway) as sock:
        sock.sendall(request_frame(29, 1, 3, {}))  # DescribeAcls: Kafka has it, the gateway not
        reply = recv_frame(sock)
        resp, _ = entity_reader(DescribeAclsResponse)(reply, 4)
        assert resp.error_code.value == 35
        sock.sendall(request_frame(18, 3, 4, {"client_software_name": "t",
                                         "client_software_version": "1"}))
        assert int.from_bytes(recv_frame(sock)[:4], "big") == 4


@pytest.mark.parametrize("bad", ["unknown-key", "truncated", "oversized", "garbage-body"])
def test_bad_frames_close_only_their_connection(gateway: GatewayThread, bad: str,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    good = _connect(gateway)
    victim = _connect(gateway)
    try:
        if bad == "unknown-key":
            body = (9999).to_bytes(2, "big") + b"\x00\x00" + b"\x00\x00\x00\x01"
            victim.sendall(len(body).to_bytes(4, "big") + body)
        elif bad == "truncated":
            victim.sendall((100).to_bytes(4, "big") + b"\x00\x12\x00\x03")
            victim.shutdown(socket.SHUT_WR)
        elif bad == "oversized":
            victim.sendall((200 * 1024 * 1024).to_bytes(4, "big"))
        else:
            body = b"\x00\x03\x00\x0c\x00\x00\x00\x01" + b"\xff" * 5  # Metadata v12, junk
            victim.sendall(len(body).to_bytes(4, "big") + body)
        assert closed_by_gateway(victim)
        good.sendall(request_frame(18, 3, 11, {"client_software_name": "t",
                                          "client_software_version": "1"}))
        assert int.from_bytes(recv_frame(good)[:4], "big") == 11
    finally:
        good.close()
        victim.close()
    if bad != "truncated":
        wait_until(lambda: any("closing connection" in r.getMessage() for r in caplog.records))


def test_bytes_after_a_request_body_are_ignored_as_kafka_does(gateway: GatewayThread,
                                                              topics: Topics) -> None:
    """librdkafka's Metadata v12 for all topics, byte for byte: a null topic array, then 3
    bytes more (librdkafka issue #5049). Kafka's broker ignores them; the gateway closed the
    connection, so librdkafka never had metadata for all topics."""
    from kio.schema.metadata.v12.response import MetadataResponse
    from kio.serial import entity_reader

    topics.create("lt", 2)
    header = bytes.fromhex("0003" "000c" "00000007" "0007") + b"rdkafka" + b"\x00"  # v2
    # topics null (varint 0), allow_auto_topic_creation, include_topic_authorized_operations,
    # no tagged fields; then what librdkafka leaves of its int32 -1
    body = header + bytes.fromhex("00" "00" "00" "00") + bytes.fromhex("010000")
    with _connect(gateway) as sock:
        sock.sendall(len(body).to_bytes(4, "big") + body)
        reply = recv_frame(sock)
        assert int.from_bytes(reply[:4], "big") == 7
        resp, _ = entity_reader(MetadataResponse)(reply, 5)
        assert [(t.name, len(t.partitions)) for t in resp.topics] == [("lt", 2)]
        sock.sendall(request_frame(18, 3, 8, {"client_software_name": "t",
                                         "client_software_version": "1"}))
        assert int.from_bytes(recv_frame(sock)[:4], "big") == 8  # the connection stayed


# -- kafka-python -----------------------------------------------------------------------------


def test_metadata_names_this_gateway_as_the_only_broker(gateway: GatewayThread,
                                                        topics: Topics) -> None:
    topics.create("orders", 3)
    admin = kafka.KafkaAdminClient(bootstrap_servers=gateway.bootstrap)
    try:
        assert "orders" in admin.list_topics()
        cluster = admin.describe_cluster()
        host, port = gateway.address
        assert [(b["host"], b["port"], b["broker_id"]) for b in cluster["brokers"]] == [
            (host, port, 0)]
        (desc,) = admin.describe_topics(["orders"])
        assert sorted(p["partition_index"] for p in desc["partitions"]) == [0, 1, 2]
        assert {p["leader_id"] for p in desc["partitions"]} == {0}
    finally:
        admin.close()


def test_advertised_address_is_what_clients_are_told(redis_server: Any, namespace: str) -> None:
    settle_fast_groups(redis_server.client(), namespace)
    gw = GatewayThread(redis_server.url, namespace, advertise_host="localhost",
                       advertise_port=19092).start()
    try:
        from kio.schema.metadata.v12.response import MetadataResponse
        from kio.serial import entity_reader

        with _connect(gw) as sock:
            sock.sendall(request_frame(3, 12, 1, {"topics": None}))
            resp, _ = entity_reader(MetadataResponse)(recv_frame(sock), 5)
        assert [(b.host, b.port) for b in resp.brokers] == [("localhost", 19092)]
    finally:
        gw.stop()


def _producer(gw: GatewayThread) -> Any:
    return kafka.KafkaProducer(bootstrap_servers=gw.bootstrap, enable_idempotence=False)


def test_kafka_python_produces_and_consumes_keys_and_headers(gateway: GatewayThread,
                                                           topics: Topics) -> None:
    topics.create("events", 2)
    producer = _producer(gateway)
    sent = []
    for i in range(20):
        md = producer.send("events", key=b"key-%d" % i, value=b"value-%d" % i,
                           headers=[("trace", b"t%d" % i)]).get(timeout=10)
        sent.append((md.partition, md.offset, b"key-%d" % i, b"value-%d" % i))
    producer.close()
    assert len({(p, o) for p, o, _, _ in sent}) == 20
    consumer = kafka.KafkaConsumer("events", bootstrap_servers=gateway.bootstrap,
                                   auto_offset_reset="earliest", consumer_timeout_ms=3000,
                                   enable_auto_commit=False, group_id=None)
    got = [(m.partition, m.offset, m.key, m.value, m.headers) for m in take(consumer, 20)]
    consumer.close()
    assert sorted(g[:4] for g in got) == sorted(sent)
    for _, _, key, _, headers in got:
        assert headers == [("trace", b"t" + key.split(b"-")[1])]
    # Keys were partitioned by Kafka's murmur2, as rcoord's own producer does.
    from rcoord.murmur2 import partition_for_key

    assert all(p == partition_for_key(k, 2) for p, _, k, _ in sent)


def test_repeated_and_null_headers_survive_the_gateway(gateway: GatewayThread, topics: Topics,
                                                      redis_server: Any, namespace: str) -> None:
    """Kafka's headers are an ordered list: a name may repeat and a value may be null. Both
    come back to a Kafka consumer as sent, and rcoord's reader sees them in ``header_list``.
    kafka-python sends repeated names (it refuses null values); librdkafka sends a null one."""
    ck = pytest.importorskip("confluent_kafka")
    topics.create("hdrs", 1)
    repeated = [("a", b"1"), ("a", b"2"), ("b", b""), ("a", b"3")]
    producer = _producer(gateway)
    producer.send("hdrs", value=b"v", headers=repeated).get(timeout=10)
    producer.close()
    nulls = [("n", None), ("n", b"x")]
    rd = ck.Producer({"bootstrap.servers": gateway.bootstrap, "enable.idempotence": False,
                      "broker.address.family": "v4"})
    rd.produce("hdrs", value=b"w", headers=nulls, partition=0)
    rd.produce("hdrs", value=b"plain", partition=0)
    assert rd.flush(20) == 0
    consumer = kafka.KafkaConsumer("hdrs", bootstrap_servers=gateway.bootstrap,
                                   auto_offset_reset="earliest", consumer_timeout_ms=3000,
                                   enable_auto_commit=False, group_id=None)
    got = [(m.value, list(m.headers)) for m in take(consumer, 3)]
    consumer.close()
    assert got == [(b"v", repeated), (b"w", nulls), (b"plain", [])]
    client = redis_server.client()
    try:
        records = fetch(client, namespace, "hdrs", 0, 0, 10).records
    finally:
        client.close()
    assert [(r.header_list, r.headers) for r in records] == [
        (tuple(repeated), {"a": b"3", "b": b""}), (tuple(nulls), {"n": b"x"}), ((), {})]


def test_a_null_header_name_is_refused_as_kafka_does() -> None:
    """Kafka's broker refuses a header whose name is null (INVALID_RECORD: DefaultRecord's
    InvalidRecordException); so does the gateway's decoder, naming what is wrong (before, the
    header became one named "", then it was CORRUPT_MESSAGE, which clients retry)."""
    import datetime as dt
    import io

    from kio.records.schema import NewRecordBatch, RecordHeader
    from kio.records.schema import Record as KioRecord
    from kio.records.writers import write_new_batch
    from kio.static.primitive import i8, i16, i32, i64

    from rcoord.gateway.errors import INVALID_RECORD
    from rcoord.gateway.records import BatchError, decode_batches

    def batch(key: bytes | None) -> bytes:
        rec = KioRecord(attributes=i8(0), timestamp=dt.datetime.now(dt.UTC), offset=i64(0),
                        key=None, value=b"v", headers=(RecordHeader(key=key, value=b"x"),))
        buf = io.BytesIO()
        write_new_batch(buf, NewRecordBatch(producer_id=i64(-1), producer_epoch=i16(-1),
                                            base_sequence=i32(-1), records=(rec,),
                                            attributes=i16(0)))
        return buf.getvalue()

    (ok,) = decode_batches(batch(b"h"), 0, 9)
    assert ok.records[0].headers == [("h", b"x")]
    with pytest.raises(BatchError, match="null key") as err:
        decode_batches(batch(None), 0, 9)
    assert err.value.code == INVALID_RECORD


class _Member(threading.Thread):
    """A kafka-python group member polling in its own thread; records its assignment.

    The member reads the cluster's topic metadata before it first polls, so the first group
    it joins is assigned from full metadata. Otherwise kafka-python may join before it knows
    the topic's partitions: its leader then assigns nothing, and rejoins once the metadata
    arrives. kafka-python (3.0.12) starts that rejoin without marking the member as needing
    one (the Java client's fix is KAFKA-9815): once the JoinGroup answer has been assigned
    from, ``need_rejoin()`` is False, so if the answer lands between two ``poll()`` calls (the
    JoinGroup is parked until the other member rejoins, longer than one poll), the next poll
    never collects the finished join: the member stays without an assignment and sends no
    heartbeat, and the coordinator removes it a session timeout later. That is the client's
    race, whichever broker answers; this test is about the gateway's rebalances.
    """

    def __init__(self, gw: GatewayThread, group: str, topic: str) -> None:
        super().__init__(daemon=True)
        self.consumer = kafka.KafkaConsumer(
            topic, bootstrap_servers=gw.bootstrap, group_id=group,
            auto_offset_reset="earliest", enable_auto_commit=False,
            heartbeat_interval_ms=200, session_timeout_ms=6000)
        # A metadata fetch made after subscribing: the coordinator's snapshot has the topic.
        assert topic in self.consumer.topics()
        self.stop = threading.Event()
        self.assigned: set[int] = set()
        self.records: list[Any] = []

    def run(self) -> None:
        while not self.stop.is_set():
            for batch in self.consumer.poll(timeout_ms=100).values():
                self.records.extend(batch)
            self.assigned = {tp.partition for tp in self.consumer.assignment()}
        self.consumer.close()


def test_kafka_python_group_forms_rebalances_and_commits(gateway: GatewayThread,
                                                         topics: Topics) -> None:
    topics.create("work", 4)
    producer = _producer(gateway)
    for i in range(40):
        producer.send("work", value=b"%d" % i, partition=i % 4)
    producer.flush()
    producer.close()
    a, b = _Member(gateway, "g", "work"), _Member(gateway, "g", "work")
    a.start()
    b.start()
    try:
        wait_until(lambda: a.assigned and b.assigned and a.assigned | b.assigned == {0, 1, 2, 3}
                   and not a.assigned & b.assigned)
        b.stop.set()
        b.join(30)
        wait_until(lambda: a.assigned == {0, 1, 2, 3})
        wait_until(lambda: len({(r.partition, r.offset) for r in a.records + b.records}) == 40)
    finally:
        a.stop.set()
        b.stop.set()
        a.join(30)
    # Commits and committed offsets, through a fresh member of the now-empty group.
    c = kafka.KafkaConsumer(bootstrap_servers=gateway.bootstrap, group_id="g",
                            enable_auto_commit=False)
    try:
        tp = kafka.TopicPartition("work", 2)
        c.assign([tp])
        c.commit({tp: kafka.OffsetAndMetadata(7, "meta", -1)})
        assert c.committed(tp) == 7
        other = kafka.TopicPartition("work", 3)
        assert c.committed(other) is None
    finally:
        c.close()


def test_group_offsets_are_rcoord_offsets(gateway: GatewayThread, topics: Topics,
                                          redis_server: Any, namespace: str) -> None:
    """A commit made through the gateway is the one rcoord's Python API reads."""
    from rcoord import CoordinatorConfig, GroupCoordinator
    from rcoord.protocol.offsets import TopicPartition

    topics.create("shared", 1)
    c = kafka.KafkaConsumer(bootstrap_servers=gateway.bootstrap, group_id="both",
                            enable_auto_commit=False)
    try:
        tp = kafka.TopicPartition("shared", 0)
        c.assign([tp])
        c.commit({tp: kafka.OffsetAndMetadata(5, "from-kafka", -1)})
    finally:
        c.close()
    client = redis_server.client()
    coord = GroupCoordinator(client, CoordinatorConfig(namespace=namespace, **FAST_GROUPS))
    got = coord.start().fetch_offsets("both", [TopicPartition("shared", 0)])
    client.close()
    assert got.offsets[TopicPartition("shared", 0)].offset == 5
    assert got.offsets[TopicPartition("shared", 0)].metadata == "from-kafka"


# -- confluent-kafka (librdkafka) -------------------------------------------------------------


def test_confluent_kafka_produces_and_consumes(gateway: GatewayThread, topics: Topics) -> None:
    ck = pytest.importorskip("confluent_kafka")
    topics.create("rd", 3)
    producer = ck.Producer({"bootstrap.servers": gateway.bootstrap, "enable.idempotence": False,
                            "broker.address.family": "v4"})
    for i in range(30):
        producer.produce("rd", key=b"k%d" % i, value=b"v%d" % i, headers=[("n", b"%d" % i)])
    assert producer.flush(20) == 0
    consumer = ck.Consumer({"bootstrap.servers": gateway.bootstrap, "group.id": "rdg",
                            "auto.offset.reset": "earliest", "enable.auto.commit": False,
                            "broker.address.family": "v4", "session.timeout.ms": 6000,
                            "heartbeat.interval.ms": 500})
    consumer.subscribe(["rd"])
    got: dict[bytes, tuple[bytes, Any]] = {}
    deadline = time.monotonic() + 60
    try:
        while len(got) < 30 and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None or msg.error():
                continue
            got[msg.key()] = (msg.value(), msg.headers())
        consumer.commit(asynchronous=False)
        committed = consumer.committed([ck.TopicPartition("rd", p) for p in range(3)],
                                       timeout=10)
    finally:
        consumer.close()
    assert got == {b"k%d" % i: (b"v%d" % i, [("n", b"%d" % i)]) for i in range(30)}
    ends = {p.partition: p.log_end_offset for p in topics.describe("rd").partitions}
    assert {tp.partition: tp.offset for tp in committed} == ends


def test_confluent_kafka_lists_all_topics_and_subscribes_by_pattern(gateway: GatewayThread,
                                                                    topics: Topics) -> None:
    """Both send Metadata for all topics, which librdkafka sends with 3 bytes after the body:
    refused, list_topics() failed and a pattern subscription never got a partition."""
    ck = pytest.importorskip("confluent_kafka")
    topics.create("rx-a", 2)
    conf = {"bootstrap.servers": gateway.bootstrap, "broker.address.family": "v4"}
    consumer = ck.Consumer({**conf, "group.id": "rx", "session.timeout.ms": 6000})
    try:
        listed = consumer.list_topics(timeout=10)
        assert {n: len(t.partitions) for n, t in listed.topics.items()} == {"rx-a": 2}
        consumer.subscribe(["^rx-.*"])
        wait_until(lambda: len(consumer.assignment()) == 2, lambda: consumer.poll(0.1), 30)
        assigned = sorted((tp.topic, tp.partition) for tp in consumer.assignment())
    finally:
        consumer.close()
    assert assigned == [("rx-a", 0), ("rx-a", 1)]


# -- admin ------------------------------------------------------------------------------------


def _group_states(admin: Any) -> dict[str, str]:
    return {g["group_id"]: g["group_state"] for g in admin.list_groups()}


def test_kafka_python_admin_topics_and_groups(gateway: GatewayThread, topics: Topics) -> None:
    from kafka.admin import NewTopic
    from kafka.errors import InvalidConfigurationError, TopicAlreadyExistsError

    admin = kafka.KafkaAdminClient(bootstrap_servers=gateway.bootstrap)
    try:
        admin.create_topics([NewTopic("made", 3, 1, topic_configs={"retention.ms": "60000"})])
        desc = topics.describe("made")
        assert len(desc.partitions) == 3 and desc.retention_ms == 60000
        with pytest.raises(TopicAlreadyExistsError):
            admin.create_topics([NewTopic("made", 1, 1)])
        with pytest.raises(InvalidConfigurationError):
            admin.create_topics([NewTopic("other", 1, 1, topic_configs={"cleanup.policy": "x"})])

        member = _Member(gateway, "admin-g", "made")
        member.start()
        try:
            wait_until(lambda: member.assigned == {0, 1, 2})
            assert _group_states(admin)["admin-g"] == "Stable"
            described = admin.describe_groups(["admin-g"])["admin-g"]
            assert described["group_state"] == "Stable"
            assert described["protocol_data"] == "range"
            (m,) = described["members"]
            # The address the member connects from, written as Kafka's broker writes it
            # (Java's InetAddress.toString: "/" and the address).
            assert m["client_host"] == "/127.0.0.1"
            # The client's ConsumerProtocol bytes passed through the coordinator untouched.
            assert m["member_metadata"]["topics"] == ["made"]
            assert m["member_assignment"]["assigned_partitions"] == [
                {"topic": "made", "partitions": [0, 1, 2]}]
        finally:
            member.stop.set()
            member.join(30)
        wait_until(lambda: _group_states(admin).get("admin-g") == "Empty")
        simple = kafka.KafkaConsumer(bootstrap_servers=gateway.bootstrap, group_id="admin-g",
                                     enable_auto_commit=False)
        simple.assign([kafka.TopicPartition("made", 1)])
        simple.commit({kafka.TopicPartition("made", 1): kafka.OffsetAndMetadata(0, "", -1)})
        simple.close()
        offsets = admin.list_group_offsets("admin-g")["admin-g"]
        assert {(tp.topic, tp.partition): om.offset for tp, om in offsets.items()} == {
            ("made", 1): 0}
        admin.delete_groups(["admin-g"])
        assert "admin-g" not in _group_states(admin)
        admin.delete_topics(["made"])
        assert "made" not in topics.list()
    finally:
        admin.close()
