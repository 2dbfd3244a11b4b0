"""A call sent, by an ``ASK``, to the master a slot is migrating to, when that master lacks the
Functions library (a master just added to the cluster, the usual reason to reshard; here one
whose functions were flushed): the library is loaded there, and the call is served.

rcoord loads its library lazily, on the master that answers "Function not found". It loaded the
slot's master (the source, which had it) instead of the importing one that answered, so every
call whose keys had moved failed after its reloads, until the slot's move ended: the service's
lease renewals (one key) among them."""

from __future__ import annotations

import asyncio

import redis.asyncio.cluster
from test_parked_slot_moves import _Move

from rcoord.scripts import Scripts


def _lease_key(namespace: str) -> str:
    return f"{{{namespace}:p7}}:lease"


def test_a_call_asked_to_an_importing_master_without_the_library_loads_it_there(
        own_cluster, namespace):
    client = own_cluster.client()
    scripts = Scripts(client)
    scripts.load()
    key = _lease_key(namespace)
    assert scripts.lease(keys=[key], args=["acquire", "me", 60_000]) == b"me"
    move = _Move(own_cluster, client, key)
    try:
        move.nodes[move.dst].execute_command("FUNCTION", "FLUSH")
        move.keys()  # the lease is on the destination now; the source answers ASK
        assert scripts.lease(keys=[key], args=["renew", "me", 60_000]) == b"me"
        assert move.nodes[move.dst].execute_command("FUNCTION", "LIST", "LIBRARYNAME",
                                                    scripts.library)
    finally:
        move.owner()
        move.close()
        client.close()


def test_the_asyncio_twin_loads_the_importing_master_too(own_cluster, namespace):
    sync_client = own_cluster.client()
    key = _lease_key(namespace)
    move = _Move(own_cluster, sync_client, key)

    async def run() -> None:
        client = redis.asyncio.cluster.RedisCluster(host="127.0.0.1", port=own_cluster.ports[0])
        try:
            scripts = Scripts(client)
            scripts.load()
            assert await scripts.lease(keys=[key], args=["acquire", "me", 60_000]) == b"me"
            move.nodes[move.dst].execute_command("FUNCTION", "FLUSH")
            move.keys()
            assert await scripts.lease(keys=[key], args=["renew", "me", 60_000]) == b"me"
        finally:
            await client.aclose()

    try:
        asyncio.run(run())
    finally:
        move.owner()
        move.close()
        sync_client.close()
