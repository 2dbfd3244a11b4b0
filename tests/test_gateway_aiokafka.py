"""aiokafka through the gateway: a producer and a consumer with keys and headers (idempotence
on), and a consumer group of two that forms, divides the partitions and rebalances when one
member leaves."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

pytest.importorskip("kio")
aiokafka = pytest.importorskip("aiokafka")

from gateway_harness import GatewayThread
from harness import await_until

from rcoord.topics import Topics

WAIT_S = 60.0


def test_aiokafka_produces_and_consumes_keys_and_headers(gateway: GatewayThread,
                                                         topics: Topics) -> None:
    topics.create("aio", 3)

    async def run() -> tuple[list[Any], list[Any]]:
        producer = aiokafka.AIOKafkaProducer(bootstrap_servers=gateway.bootstrap,
                                             enable_idempotence=True)
        await producer.start()
        try:
            sent = [await producer.send_and_wait("aio", key=b"k%d" % i, value=b"v%d" % i,
                                                 headers=[("trace", b"t%d" % i)])
                    for i in range(30)]
        finally:
            await producer.stop()
        consumer = aiokafka.AIOKafkaConsumer("aio", bootstrap_servers=gateway.bootstrap,
                                             group_id=None, auto_offset_reset="earliest")
        await consumer.start()
        got: list[Any] = []
        try:
            async with asyncio.timeout(WAIT_S):
                while len(got) < 30:
                    for batch in (await consumer.getmany(timeout_ms=500)).values():
                        got.extend(batch)
        finally:
            await consumer.stop()
        return sent, got

    sent, got = asyncio.run(run())
    assert sorted((m.partition, m.offset) for m in sent) == sorted(
        (m.partition, m.offset) for m in got)
    for m in got:
        n = m.key[1:]
        assert m.value == b"v" + n
        assert list(m.headers) == [("trace", b"t" + n)]
    from rcoord.murmur2 import partition_for_key

    assert all(m.partition == partition_for_key(m.key, 3) for m in got)


def test_aiokafka_group_of_two_forms_rebalances_and_commits(gateway: GatewayThread,
                                                            topics: Topics) -> None:
    topics.create("aiog", 4)

    async def run() -> dict[int, int]:
        producer = aiokafka.AIOKafkaProducer(bootstrap_servers=gateway.bootstrap)
        await producer.start()
        try:
            for i in range(40):
                await producer.send("aiog", value=b"%d" % i, partition=i % 4)
            await producer.flush()
        finally:
            await producer.stop()

        def member() -> Any:
            return aiokafka.AIOKafkaConsumer(
                "aiog", bootstrap_servers=gateway.bootstrap, group_id="aio-group",
                auto_offset_reset="earliest", enable_auto_commit=False,
                heartbeat_interval_ms=200, session_timeout_ms=6000)

        a, b = member(), member()
        seen: set[tuple[int, int]] = set()
        stop = asyncio.Event()

        async def poll(c: Any) -> None:
            while not stop.is_set():
                for batch in (await c.getmany(timeout_ms=100)).values():
                    seen.update((r.partition, r.offset) for r in batch)
                    await c.commit()

        await a.start()
        await b.start()
        tasks = [asyncio.create_task(poll(a)), asyncio.create_task(poll(b))]

        def parts(c: Any) -> set[int]:
            return {tp.partition for tp in c.assignment()}

        try:
            await await_until(lambda: parts(a) and parts(b) and parts(a) | parts(b) == {0, 1, 2, 3}
                              and not parts(a) & parts(b), timeout_s=WAIT_S)
            await await_until(lambda: len(seen) == 40, timeout_s=WAIT_S)
            stop.set()
            await asyncio.gather(*tasks)
            await b.stop()  # LeaveGroup: a gets every partition
            stop.clear()
            tasks = [asyncio.create_task(poll(a))]
            await await_until(lambda: parts(a) == {0, 1, 2, 3}, timeout_s=WAIT_S)
        finally:
            stop.set()
            await asyncio.gather(*tasks, return_exceptions=True)
            await a.stop()
            await b.stop()
        checker = aiokafka.AIOKafkaConsumer(bootstrap_servers=gateway.bootstrap,
                                            group_id="aio-group")
        await checker.start()
        try:
            return {p: await checker.committed(aiokafka.TopicPartition("aiog", p))
                    for p in range(4)}
        finally:
            await checker.stop()

    committed = asyncio.run(run())
    assert committed == {0: 10, 1: 10, 2: 10, 3: 10}
