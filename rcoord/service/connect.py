"""Connecting a coordinator process to Redis: one node or a cluster, found from the URL alone."""

from __future__ import annotations

from typing import Any

import redis
import redis.cluster

__all__ = ["connect", "primaries"]


def connect(url: str, **kwargs: Any) -> Any:
    """A client for ``url`` (redis://, rediss://, with user:password): a RedisCluster when the
    server reports cluster mode, else a Redis. ``decode_responses`` is always False."""
    kwargs.setdefault("socket_connect_timeout", 5.0)
    kwargs["decode_responses"] = False
    probe = redis.Redis.from_url(url, **kwargs)
    try:
        cluster = str(probe.info("cluster").get("cluster_enabled", 0)) == "1"
    finally:
        probe.close()
    if cluster:
        return redis.cluster.RedisCluster.from_url(url, **kwargs)
    return redis.Redis.from_url(url, **kwargs)


def primaries(client: Any) -> list[redis.Redis]:
    """One client per master: keyspace events are node-local, so each must be heard."""
    if isinstance(client, redis.cluster.RedisCluster):
        return [client.get_redis_connection(node) for node in client.get_primaries()]
    return [client]
