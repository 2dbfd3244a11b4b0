"""Kafka's idempotent producer through the gateway: InitProducerId, and Produce numbered by the
client (kafka-python 3 and librdkafka with idempotence on), resends appended once."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("kio")
kafka = pytest.importorskip("kafka")

from gateway_harness import (
    GatewayThread,
    LossyProxy,
    call_once,
    connect,
    produced_batch,
    request_frame,
    response,
    running_gateway,
    topics_of,
)

from rcoord.gateway.errors import TRANSACTIONAL_ID_AUTHORIZATION_FAILED
from rcoord.topics import Record, Topics, producer_state_keys

INIT_PRODUCER_ID, PRODUCE = 22, 0


def _producers_in(redis_server: Any, namespace: str, topic: str, partitions: int) -> set[str]:
    """The producer names with state in the topic's partitions (Redis, not the gateway)."""
    client = redis_server.client()
    try:
        return {name.decode() for p in range(partitions)
                for name in client.hkeys(producer_state_keys(namespace, topic, p)[0])}
    finally:
        client.close()


# -- raw frames -------------------------------------------------------------------------------


class _Raw:
    """One connection speaking InitProducerId v4 and Produce v9 (both flexible: header v1)."""

    def __init__(self, gw: GatewayThread) -> None:
        self.sock = connect(gw)
        self.corr = 0

    def init_producer_id(self, transactional_id: str | None = None, producer_id: int = -1,
                         producer_epoch: int = -1) -> Any:
        self.corr += 1
        self.sock.sendall(request_frame(INIT_PRODUCER_ID, 4, self.corr, {
            "transactional_id": transactional_id, "transaction_timeout": 60000,
            "producer_id": producer_id, "producer_epoch": producer_epoch}))
        return response(self.sock, INIT_PRODUCER_ID, 4, 5)

    def produce(self, topic: str, batch: bytes) -> Any:
        self.corr += 1
        self.sock.sendall(request_frame(PRODUCE, 9, self.corr, {
            "acks": -1, "timeout": 10000, "topic_data": [
                {"name": topic, "partition_data": [{"index": 0, "records": batch}]}]}))
        (topic_resp,) = response(self.sock, PRODUCE, 9, 5).responses
        (part,) = topic_resp.partition_responses
        return part


def _batch(pid: int, epoch: int, seq: int, values: list[bytes]) -> bytes:
    records = [Record(i, None, v, {}, 0) for i, v in enumerate(values)]
    return produced_batch(records, producer_id=pid, producer_epoch=epoch, base_sequence=seq)


def test_resent_batch_is_appended_once_and_sequences_are_checked(
    gateway: GatewayThread, topics: Topics, redis_server: Any, namespace: str,
) -> None:
    topics.create("idem", 1)
    raw = _Raw(gateway)
    try:
        init = raw.init_producer_id()
        assert init.error_code.value == 0 and init.producer_epoch == 0
        pid = int(init.producer_id)
        assert pid > 0 and int(raw.init_producer_id().producer_id) != pid  # always a new id

        first = _batch(pid, 0, 0, [b"a", b"b", b"c"])
        ok = raw.produce("idem", first)
        assert (ok.error_code.value, ok.base_offset) == (0, 0)
        again = raw.produce("idem", first)  # the resend of a batch whose answer was lost
        assert (again.error_code.value, again.base_offset) == (0, 0)
        assert again.log_append_time == ok.log_append_time  # the original append's
        assert raw.produce("idem", _batch(pid, 0, 3, [b"d"])).base_offset == 3

        gap = raw.produce("idem", _batch(pid, 0, 9, [b"x"]))
        assert gap.error_code.value == 45  # OUT_OF_ORDER_SEQUENCE_NUMBER
        for seq in range(4, 9):  # five more batches: the first one is no longer remembered
            assert raw.produce("idem", _batch(pid, 0, seq, [b"%d" % seq])).error_code.value == 0
        forgotten = raw.produce("idem", first)
        # No longer remembered: not appended, and not answered as a duplicate (a Kafka client
        # takes DUPLICATE_SEQUENCE_NUMBER for success), but as Kafka's broker does.
        assert forgotten.error_code.value == 45  # OUT_OF_ORDER_SEQUENCE_NUMBER

        assert raw.produce("idem", _batch(pid, 1, 0, [b"new-epoch"])).error_code.value == 0
        fenced = raw.produce("idem", _batch(pid, 0, 9, [b"zombie"]))
        assert fenced.error_code.value == 47  # INVALID_PRODUCER_EPOCH
        # (the reason alone: it began "PRODUCER_FENCED: ", another code's name, which a Kafka
        # client logged after INVALID_PRODUCER_EPOCH)
        assert fenced.error_message and "epoch" in fenced.error_message, fenced.error_message
        assert "PRODUCER_FENCED" not in fenced.error_message, fenced.error_message

        txn = raw.init_producer_id("a-transaction")
        assert txn.error_code.value == TRANSACTIONAL_ID_AUTHORIZATION_FAILED  # not served
    finally:
        raw.sock.close()
    values = [r.value for r in _read_all(redis_server, namespace, "idem", 0)]
    assert values == [b"a", b"b", b"c", b"d", b"4", b"5", b"6", b"7", b"8", b"new-epoch"]
    assert _producers_in(redis_server, namespace, "idem", 1) == {f"kafka-{pid}"}


SEQ_MAX = (1 << 31) - 1  # Kafka's Integer.MAX_VALUE: the sequence after it is 0


def test_sequences_wrap_after_int_max_as_kafka_numbers_them(
    gateway: GatewayThread, topics: Topics, redis_server: Any, namespace: str,
) -> None:
    """A Kafka producer's sequence after 2**31 - 1 is 0 (DefaultRecordBatch.incrementSequence),
    and a batch may span the wrap. Before, the gateway compared them as plain integers: the
    records after the wrap were taken for duplicates (answered, never appended)."""
    topics.create("wrap", 1)
    raw = _Raw(gateway)
    try:
        pid = int(raw.init_producer_id().producer_id)
        # A producer's first batch may start anywhere; these two end exactly at the top.
        assert raw.produce("wrap", _batch(pid, 0, SEQ_MAX - 1, [b"a"])).base_offset == 0
        assert raw.produce("wrap", _batch(pid, 0, SEQ_MAX, [b"b"])).base_offset == 1
        after = raw.produce("wrap", _batch(pid, 0, 0, [b"c", b"d"]))
        assert (after.error_code.value, after.base_offset) == (0, 2)
        retried = raw.produce("wrap", _batch(pid, 0, SEQ_MAX, [b"b"]))  # before the wrap
        assert (retried.error_code.value, retried.base_offset) == (0, 1)
        assert raw.produce("wrap", _batch(pid, 0, 5, [b"x"])).error_code.value == 45  # gap
        assert raw.produce("wrap", _batch(pid, 0, 2, [b"e"])).base_offset == 4

        # A batch spanning the wrap: 2**31 - 3 .. 1, then 2 follows it.
        other = int(raw.init_producer_id().producer_id)
        span = _batch(other, 0, SEQ_MAX - 2, [b"s0", b"s1", b"s2", b"s3", b"s4"])
        assert raw.produce("wrap", span).base_offset == 5
        assert raw.produce("wrap", _batch(other, 0, 2, [b"t"])).base_offset == 10
        again = raw.produce("wrap", span)  # its resend, across the wrap: a duplicate
        assert (again.error_code.value, again.base_offset) == (0, 5)
        # Part of a batch is not a resend of it (a Kafka producer resends batches whole), so
        # it is out of order, as in Kafka's broker.
        tail = raw.produce("wrap", _batch(other, 0, 0, [b"s3", b"s4"]))
        assert tail.error_code.value == 45
        assert raw.produce("wrap", _batch(other, 0, 4, [b"x"])).error_code.value == 45  # gap
        # Below the span (never sent by this producer): not appended, and out of order.
        assert raw.produce("wrap", _batch(other, 0, SEQ_MAX - 3, [b"x"])).error_code.value == 45
        assert raw.produce("wrap", _batch(other, 0, 3, [b"u"])).base_offset == 11
    finally:
        raw.sock.close()
    values = [r.value for r in _read_all(redis_server, namespace, "wrap", 0)]
    assert values == [b"a", b"b", b"c", b"d", b"e", b"s0", b"s1", b"s2", b"s3", b"s4", b"t", b"u"]


def _read_all(redis_server: Any, namespace: str, topic: str, partition: int) -> list[Record]:
    from rcoord.topics import fetch

    client = redis_server.client()
    try:
        return fetch(client, namespace, topic, partition, 0, 10_000).records
    finally:
        client.close()


def test_a_transactional_id_is_refused_with_the_reason(gateway: GatewayThread,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    """Transactions are not served. FindCoordinator for a transactional id answered
    COORDINATOR_NOT_AVAILABLE, which clients retry until their timeout; it answers what Kafka
    answers a transactional id the caller may not use, TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    fatal to clients, with the reason; InitProducerId too (it answered INVALID_REQUEST)."""
    found = call_once(gateway, 10, 4, {"key_type": 1, "coordinator_keys": ["tx-1"]})
    (coordinator,) = found.coordinators
    assert (coordinator.key, coordinator.error_code.value, coordinator.node_id) == (
        "tx-1", TRANSACTIONAL_ID_AUTHORIZATION_FAILED, -1)
    assert "transactions are not supported" in (coordinator.error_message or "")
    raw = _Raw(gateway)
    try:
        init = raw.init_producer_id("tx-1")
    finally:
        raw.sock.close()
    assert (init.error_code.value, init.producer_id) == (TRANSACTIONAL_ID_AUTHORIZATION_FAILED, -1)
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len([m for m in warned if "'tx-1'" in m and "not supported" in m]) == 2


def test_current_id_and_epoch_come_both_or_neither(gateway: GatewayThread) -> None:
    """InitProducerId v3+ may name the producer's current id and epoch (KIP-360). Kafka answers
    INVALID_REQUEST when only one is set (KafkaApis.handleInitProducerIdRequest); the gateway
    handed out a new id."""
    raw = _Raw(gateway)
    try:
        only_id = raw.init_producer_id(producer_id=1234)
        only_epoch = raw.init_producer_id(producer_epoch=3)
        both = raw.init_producer_id(producer_id=1234, producer_epoch=3)
    finally:
        raw.sock.close()
    for half in (only_id, only_epoch):
        assert (half.error_code.value, half.producer_id, half.producer_epoch) == (42, -1, -1)
    assert (both.error_code.value, both.producer_epoch) == (0, 0)  # a new id, as without
    assert int(both.producer_id) not in (-1, 1234)


def test_transactional_producers_fail_at_once(gateway: GatewayThread) -> None:
    """librdkafka and kafka-python: init_transactions() fails with a fatal, non-retriable error
    at once (it ran out its timeout, retrying, and librdkafka said "retry call to resume")."""
    ck = pytest.importorskip("confluent_kafka")
    producer = ck.Producer({"bootstrap.servers": gateway.bootstrap, "transactional.id": "tx-1",
                            "broker.address.family": "v4"})
    with pytest.raises(ck.KafkaException) as raised:
        producer.init_transactions(10)
    error = raised.value.args[0]
    assert error.code() == ck.KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    assert error.fatal() and not error.retriable()
    assert "transactions are not supported by the rcoord gateway" in error.str()
    del producer
    kp = kafka.KafkaProducer(bootstrap_servers=gateway.bootstrap, transactional_id="tx-2",
                             max_block_ms=10_000)
    try:
        with pytest.raises(kafka.errors.TransactionalIdAuthorizationFailedError):
            kp.init_transactions()
    finally:
        kp.close(timeout=10)


# -- real clients -----------------------------------------------------------------------------


def test_kafka_python_idempotent_producer(gateway: GatewayThread, topics: Topics,
                                          redis_server: Any, namespace: str) -> None:
    topics.create("kp", 3)
    producer = kafka.KafkaProducer(bootstrap_servers=gateway.bootstrap)  # idempotent by default
    try:
        metas = [producer.send("kp", key=b"k%d" % i, value=b"v%d" % i,
                               headers=[("h", b"%d" % i)]) for i in range(60)]
        producer.flush(20)
        placed = {(m.get(10).partition, m.get(10).offset) for m in metas}
    finally:
        producer.close()
    assert len(placed) == 60
    got = [r for p in range(3) for r in _read_all(redis_server, namespace, "kp", p)]
    assert sorted(r.value for r in got) == sorted(b"v%d" % i for i in range(60))
    names = _producers_in(redis_server, namespace, "kp", 3)
    assert len(names) == 1 and next(iter(names)).startswith("kafka-")


def test_a_record_over_a_mebibyte_is_taken_within_the_frame_limit(
        topics: Topics, redis_server: Any, namespace: str) -> None:
    """A Kafka client bounds its records by its own ``max.request.size``; the gateway's
    appends take any record its ``message_max_bytes`` lets in (Kafka's ``message.max.bytes``,
    raised here as on a broker), not the Producer's 1 MiB default."""
    topics.create("large", 1)
    with running_gateway(redis_server, namespace, message_max_bytes=4 << 20) as gateway:
        producer = kafka.KafkaProducer(bootstrap_servers=gateway.bootstrap,
                                       enable_idempotence=False, max_request_size=4 << 20)
        try:
            meta = producer.send("large", value=b"L" * (2 << 20)).get(20)
        finally:
            producer.close()
    assert meta.offset == 0
    assert [len(r.value or b"") for r in _read_all(redis_server, namespace, "large", 0)] == [
        2 << 20]


def test_confluent_kafka_idempotent_producer(gateway: GatewayThread, topics: Topics,
                                             redis_server: Any, namespace: str) -> None:
    ck = pytest.importorskip("confluent_kafka")
    topics.create("rdk", 3)
    producer = ck.Producer({"bootstrap.servers": gateway.bootstrap, "enable.idempotence": True,
                            "broker.address.family": "v4"})
    errors: list[Any] = []
    for i in range(60):
        producer.produce("rdk", key=b"k%d" % i, value=b"v%d" % i, headers=[("h", b"%d" % i)],
                         on_delivery=lambda err, msg: errors.append(err) if err else None)
    assert producer.flush(20) == 0
    assert errors == []
    got = [r for p in range(3) for r in _read_all(redis_server, namespace, "rdk", p)]
    assert sorted(r.value for r in got) == sorted(b"v%d" % i for i in range(60))
    names = _producers_in(redis_server, namespace, "rdk", 3)
    assert len(names) == 1 and next(iter(names)).startswith("kafka-")


@pytest.mark.parametrize("client", ["kafka-python", "confluent-kafka"])
def test_a_batch_resent_after_a_lost_answer_is_appended_once(
    client: str, redis_server: Any, namespace: str,
) -> None:
    """The proxy lets the first Produce through and loses its answer; the client resends the
    same batch (same producer id, epoch and sequence) on a new connection."""
    proxy = LossyProxy()
    with running_gateway(redis_server, namespace, advertise_host="127.0.0.1",
                         advertise_port=proxy.port) as gw, topics_of(redis_server, namespace) as t:
        t.create("lossy", 1)
        proxy.start(gw.address)
        bootstrap = f"127.0.0.1:{proxy.port}"
        try:
            proxy.drop(PRODUCE)
            if client == "kafka-python":
                producer = kafka.KafkaProducer(bootstrap_servers=bootstrap, retries=5,
                                               linger_ms=50)
                futures = [producer.send("lossy", value=b"v%d" % i) for i in range(10)]
                producer.flush(30)
                offsets = sorted(f.get(10).offset for f in futures)
                producer.close()
            else:
                ck = pytest.importorskip("confluent_kafka")
                producer = ck.Producer({"bootstrap.servers": bootstrap, "linger.ms": 50,
                                        "enable.idempotence": True,
                                        "broker.address.family": "v4"})
                got: list[Any] = []
                for i in range(10):
                    producer.produce("lossy", value=b"v%d" % i,
                                     on_delivery=lambda err, msg: got.append((err, msg.offset())))
                assert producer.flush(30) == 0
                assert [e for e, _ in got if e is not None] == []
                offsets = sorted(o for _, o in got)
        finally:
            proxy.stop()
        assert proxy.dropped == 1
        values = [r.value for r in _read_all(redis_server, namespace, "lossy", 0)]
    assert sorted(values) == sorted(b"v%d" % i for i in range(10))  # each exactly once
    assert offsets == list(range(10))
