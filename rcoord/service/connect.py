"""Connecting a coordinator process to Redis: one node or a cluster, found from the URL alone."""

from __future__ import annotations

from typing import Any

import redis
import redis.cluster

from ..connect import connect

__all__ = ["connect", "primaries"]


def primaries(client: Any) -> list[redis.Redis]:
    """One client per master: keyspace events are node-local, so each must be heard."""
    if isinstance(client, redis.cluster.RedisCluster):
        return [client.get_redis_connection(node) for node in client.get_primaries()]
    return [client]
