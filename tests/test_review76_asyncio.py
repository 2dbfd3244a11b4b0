"""Review 76 of the asyncio coordinator: reproductions of defects found (each fails on the code
it was written against; the fixes are the lead's)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis.asyncio
import redis.asyncio.cluster
import redis.exceptions

from rcoord import ConnectionLost, CoordinatorConfig, Errors, GroupCoordinator
from rcoord.asyncio import AsyncGroupCoordinator
from rcoord.errors import reraise_as_rcoord

FORM: dict[str, Any] = {"protocol_type": "consumer", "protocols": [("range", b"m")],
                        "session_timeout_ms": 30_000, "rebalance_timeout_ms": 10_000}


def test_a_lone_parked_join_forms_its_group_on_a_client_with_one_connection(
        request, backend, redis_client, namespace):
    """A parked call's shared read has a bound of its own beside the commands' bound, each at
    least one place, so on a client whose pool has one connection (``max_connections=1``) the
    two take two. A member's own join, alone on the loop, failed ``ConnectionLost: join_group:
    Too many connections``: when its wait ends at its deadline the reader it leaves is
    cancelled, not ended, and still holds the connection as the join sends its due check. The
    blocking coordinator serves the same join with a pool of one (its thread reads, then
    sends). On a cluster (a pool of one per node) the error's text was empty."""
    GroupCoordinator(redis_client, CoordinatorConfig(
        namespace=namespace, group_min_session_timeout_ms=10,
        # Several parked reads (each at most a second) end at the waiter's deadline.
        group_initial_rebalance_delay_ms=2500)).start()

    async def scenario() -> None:
        if backend == "single":
            port = request.getfixturevalue("redis_server").port
            client: Any = redis.asyncio.Redis(host="127.0.0.1", port=port, max_connections=1)
        else:
            port = request.getfixturevalue("redis_cluster").ports[0]
            client = redis.asyncio.cluster.RedisCluster(host="127.0.0.1", port=port,
                                                        max_connections=1)
        coord = AsyncGroupCoordinator(client, namespace)
        try:
            await coord.start()
            member = (await coord.join_group("g", **FORM)).member_id
            joined = await coord.join_group("g", member, **FORM)
            assert (joined.error, joined.generation_id) == (Errors.NONE, 1)
        finally:
            await coord.close()
            await client.aclose()

    asyncio.run(scenario())


def test_a_full_cluster_node_pool_is_named_in_the_connection_lost():
    """redis-py's asyncio cluster client raises ``MaxConnectionsError()`` without a message when
    a node's pool is full (its single-node pool, and the blocking clients', say "Too many
    connections"), and the boundary made it ``ConnectionLost('join_group: ')``: the operator
    was told nothing of what was lost or why."""
    with pytest.raises(ConnectionLost) as raised:
        reraise_as_rcoord("join_group", redis.exceptions.MaxConnectionsError())
    assert str(raised.value).removeprefix("join_group:").strip()


@pytest.mark.parametrize("namespace_arg", [b"ns", 5])
def test_a_namespace_keyword_of_another_type_is_refused_at_construction(namespace_arg):
    """The blocking coordinator refuses a namespace of another type than str when it is made
    (``config_arg``); the asyncio one took ``namespace=b"ns"`` and refused it only at
    ``start()``, with another exception."""
    client = redis.asyncio.Redis(host="127.0.0.1", port=1)  # (never connected)
    with pytest.raises(TypeError, match="namespace must be a str"):
        AsyncGroupCoordinator(client, namespace=namespace_arg)
