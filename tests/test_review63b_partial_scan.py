"""A listing over every master (SCAN) while one slot is served by no master: rcoord's cluster
clients serve the covered slots then (``connect.FULL_COVERAGE``), but a SCAN sent to every
master only reaches the covered ones, so it left out the keys lost with that slot's master
without a word. It is refused instead (retriable), as it was before the clients stopped
requiring full coverage: ``topics list`` omitted the topic (and a gateway's Metadata for all
topics, a pattern subscription's, dropped it), and a settings sweep marked done a search that
had not seen every copy. (Here the slot's keys stay on their old master, which a SCAN still
reads; what is checked is the refusal.)"""

from __future__ import annotations

import asyncio

import pytest
import redis.exceptions
from test_gateway_slot_moves import _unserved

from rcoord.asyncio.cluster import AsyncClusterClient
from rcoord.connect import connect
from rcoord.errors import ConnectionLost
from rcoord.topics import Topics
from rcoord.topics._base import meta_key

NS = "review63b"


def test_topics_list_is_refused_while_a_topics_slot_has_no_master(own_cluster):
    client = connect(own_cluster.url, socket_timeout=5)
    try:
        topics = Topics(client, NS)
        names = ["a", "b", "c", "d", "e", "f"]
        for name in names:
            topics.create(name, 1)
        assert topics.list() == names
        with _unserved(own_cluster, meta_key(NS, "c")):
            client.nodes_manager.initialize()  # (the topology refresh a MOVED or failover makes)
            with pytest.raises(ConnectionLost, match="no master"):
                topics.list()
            with pytest.raises(redis.exceptions.SlotNotCoveredError):
                client.execute_command("SCAN", 0, "MATCH", f"{NS}:*", "COUNT", 1000)
            # What names one slot is still served.
            assert topics.partition_count("a") == 1
        assert topics.list() == names  # (the listing refreshed the client's slot map)
    finally:
        client.close()


def test_the_asyncio_client_refuses_a_scan_while_a_slot_has_no_master(own_cluster):
    async def scan() -> None:
        client = AsyncClusterClient.from_url(own_cluster.url, require_full_coverage=False)
        try:
            await client.execute_command("SCAN", 0, "COUNT", 10)
            with _unserved(own_cluster, "some-key"):
                await client.nodes_manager.initialize()
                with pytest.raises(redis.exceptions.SlotNotCoveredError):
                    await client.execute_command("SCAN", 0, "COUNT", 10)
                await client.set("other-key-x", b"1")
            await client.execute_command("SCAN", 0, "COUNT", 10)
        finally:
            await client.aclose()

    asyncio.run(scan())
