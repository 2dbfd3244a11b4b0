"""A cluster client whose slot map was read while a slot had no master (a master lost with no
replica, under ``cluster-require-full-coverage no``) serves that slot again once it has a
master. redis-py reads the map again on a redirection or a failed connection, never when the
map itself has no master for the slot: with full coverage no longer required
(``connect.FULL_COVERAGE``), every call to the slot failed SlotNotCoveredError for the life of
the client, long after the slot was served again (a worker's groups there could not heartbeat
or commit, the gateway's could not be served, until the process restarted)."""

from __future__ import annotations

import asyncio

import pytest
import redis.exceptions
from harness import wait_until
from test_gateway_slot_moves import _unserved

from rcoord.asyncio.cluster import AsyncClusterClient
from rcoord.connect import connect

KEY = "review63b-key"


def _answers(call) -> bool:
    try:
        return call() == b"1"
    except redis.exceptions.SlotNotCoveredError:
        return False


def test_the_blocking_client_serves_a_slot_again_once_it_has_a_master(own_cluster):
    client = connect(own_cluster.url, socket_timeout=5)
    try:
        client.set(KEY, b"1")
        with _unserved(own_cluster, KEY):
            client.nodes_manager.initialize()  # (the topology refresh a MOVED or failover makes)
            with pytest.raises(redis.exceptions.SlotNotCoveredError):
                client.get(KEY)
        wait_until(lambda: _answers(lambda: client.get(KEY)), timeout_s=10)
        # (also what rcoord looks up itself: the service's pieces per node, a script's master)
        assert client.get_node_from_key(KEY) is not None
    finally:
        client.close()


def test_the_asyncio_client_serves_a_slot_again_once_it_has_a_master(own_cluster):
    async def run() -> None:
        client = AsyncClusterClient.from_url(own_cluster.url, require_full_coverage=False)
        try:
            await client.set(KEY, b"1")
            with _unserved(own_cluster, KEY):
                await client.nodes_manager.initialize()
                with pytest.raises(redis.exceptions.SlotNotCoveredError):
                    await client.get(KEY)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 10
            while True:
                try:
                    assert await client.get(KEY) == b"1"
                    break
                except redis.exceptions.SlotNotCoveredError:
                    assert loop.time() < deadline, "the slot was never served again"
                    await asyncio.sleep(0.05)
        finally:
            await client.aclose()

    asyncio.run(run())
