"""Connecting to Redis from a URL: one node or a cluster, whichever the server says it is.

The coordinator service (``rcoord.service``) and the worker client (``rcoord.client``) both
connect through ``connect``, so a deployment is described by its URL alone.
"""

from __future__ import annotations

from typing import Any

import redis
import redis.cluster

__all__ = ["connect"]


def connect(url: str, **kwargs: Any) -> Any:
    """A client for ``url`` (redis://, rediss://, with user:password): a RedisCluster when the
    server reports cluster mode (``INFO cluster``), else a Redis.

    ``kwargs`` go to redis-py (``socket_timeout``, ...); ``socket_connect_timeout`` defaults to
    5 s, and ``decode_responses`` is always False (rcoord reads bytes). A server that refuses
    ``INFO cluster`` is taken for a single node.
    """
    kwargs.setdefault("socket_connect_timeout", 5.0)
    kwargs["decode_responses"] = False
    probe = redis.Redis.from_url(url, **kwargs)
    try:
        cluster = str(probe.info("cluster").get("cluster_enabled", 0)) == "1"
    except redis.exceptions.ResponseError:
        cluster = False
    except BaseException:
        probe.close()
        raise
    if not cluster:
        return probe
    probe.close()
    return redis.cluster.RedisCluster.from_url(url, **kwargs)
