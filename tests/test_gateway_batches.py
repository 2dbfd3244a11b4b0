"""A Kafka record batch is appended whole: however many records it holds, nothing another
producer sends lands between them, so base offset + index is each record's offset (the clients
compute it so). rcoord's own producer splits at ``MAX_APPEND_PER_CALL``; the gateway must not."""

from __future__ import annotations

import threading
import uuid
from typing import Any

import pytest

kafka = pytest.importorskip("kafka")

from gateway_harness import (
    INIT_PRODUCER_ID_BODY,
    connect,
    produced_batch,
    request_frame,
    response,
    running_gateway,
    topics_of,
)
from harness import wait_until

from rcoord.topics import Record, fetch
from rcoord.topics._base import MAX_APPEND_PER_CALL

N = MAX_APPEND_PER_CALL * 2 + 500
ROUNDS = 3


def _produce(gw: Any, tag: str, producer_id: int, out: dict[tuple[str, int], int]) -> None:
    sock = connect(gw)
    try:
        for r in range(ROUNDS):
            recs = [Record(i, None, f"{tag}-{r}-{i}".encode(), {}, 0) for i in range(N)]
            batch = (produced_batch(recs) if producer_id < 0 else
                     produced_batch(recs, producer_id, 0, r * N))
            sock.sendall(request_frame(0, 9, r + 1, {"acks": -1, "timeout": 10000, "topic_data": [
                {"name": "t", "partition_data": [{"index": 0, "records": batch}]}]}))
            part = response(sock, 0, 9, 5).responses[0].partition_responses[0]
            assert int(part.error_code.value) == 0, part
            out[(tag, r)] = int(part.base_offset)
    finally:
        sock.close()


def _script_calls(client: Any) -> int:
    stats = client.info("commandstats")
    return sum(int(v["calls"]) for k, v in stats.items()
               if k.split("|")[0] in ("cmdstat_evalsha", "cmdstat_eval", "cmdstat_fcall"))


def test_two_producers_big_batches_each_land_whole_at_the_answered_base_offset(own_server):
    ns = "b" + uuid.uuid4().hex[:10]
    with running_gateway(own_server, ns) as gw:
        with topics_of(own_server, ns) as topics:
            topics.create("t", 1)
        # An idempotent producer (numbered batches) and a plain one, concurrently.
        init = connect(gw)
        init.sendall(request_frame(22, 4, 1, INIT_PRODUCER_ID_BODY))
        pid = int(response(init, 22, 4, 5).producer_id)
        init.close()
        bases: dict[tuple[str, int], int] = {}
        threads = [threading.Thread(target=_produce, args=(gw, "A", -1, bases)),
                   threading.Thread(target=_produce, args=(gw, "B", pid, bases))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert len(bases) == 2 * ROUNDS
        client = own_server.client()
        try:
            at: dict[str, int] = {}
            offset = 0
            while True:
                res = fetch(client, ns, "t", 0, offset, 5000)
                if not res.records:
                    break
                at.update({(r.value or b"").decode(): r.offset for r in res.records})
                offset = res.records[-1].offset + 1
            assert len(at) == 2 * ROUNDS * N
            misplaced = {(tag, r): sum(at[f"{tag}-{r}-{i}"] != base + i for i in range(N))
                         for (tag, r), base in bases.items()}
            assert misplaced == {key: 0 for key in bases}

            # And one batch is one script call, however many records it holds.
            def calls_for(count: int, tag: str) -> int:
                sock = connect(gw)
                try:
                    before = _script_calls(client)
                    batch = produced_batch([Record(i, None, f"{tag}{i}".encode(), {}, 0)
                                            for i in range(count)])
                    sock.sendall(request_frame(0, 9, 1, {"acks": -1, "timeout": 10000,
                                                         "topic_data": [{"name": "t",
                        "partition_data": [{"index": 0, "records": batch}]}]}))
                    response(sock, 0, 9, 5)
                    return _script_calls(client) - before
                finally:
                    sock.close()

            assert calls_for(N, "big") == calls_for(1, "one")
        finally:
            client.close()


def _redis_ms(client: Any) -> int:
    sec, usec = client.time()
    return int(sec) * 1000 + int(usec) // 1000


def test_consumed_timestamps_are_each_records_own_not_the_newest(gateway, redis_server, topics):
    """Records of three appends, fetched in one response: each keeps its append's timestamp
    (kafka-python reads a LogAppendTime batch's max timestamp for all of its records)."""
    topics.create("ts", 1)
    produced: list[tuple[int, int]] = []
    producer = kafka.KafkaProducer(bootstrap_servers=gateway.bootstrap, linger_ms=0)
    clock = redis_server.client()
    try:
        for i in range(3):
            if produced:  # the next append gets a later Redis millisecond
                wait_until(lambda: _redis_ms(clock) > produced[-1][1])
            md = producer.send("ts", f"v{i}".encode(), partition=0).get(10)
            produced.append((md.offset, md.timestamp))
    finally:
        producer.close()
        clock.close()
    assert len({ts for _, ts in produced}) == 3
    consumer = kafka.KafkaConsumer(bootstrap_servers=gateway.bootstrap, enable_auto_commit=False)
    try:
        tp = kafka.TopicPartition("ts", 0)
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        got: list[tuple[int, int, int]] = []

        def poll() -> None:
            for recs in consumer.poll(200).values():
                got.extend((r.offset, r.timestamp, r.timestamp_type) for r in recs)

        wait_until(lambda: len(got) >= 3, poll)
    finally:
        consumer.close()
    assert [(o, ts) for o, ts, _ in got] == produced
    assert {kind for _, _, kind in got} == {1}  # LogAppendTime: the Redis clock at append
