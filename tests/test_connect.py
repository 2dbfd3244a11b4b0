"""rcoord.connect: the clients it makes announce themselves as redis-py would, computed once."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from rcoord.connect import connect

driver_info = pytest.importorskip("redis.driver_info")  # redis-py >= 7.1


def _lib(client: Any) -> tuple[str, str]:
    """The lib-name and lib-ver the server recorded for the client's connection."""
    info = client.client_info()
    return str(info["lib-name"]), str(info["lib-ver"])


def test_connect_sends_redis_pys_own_name_and_version(redis_server: Any) -> None:
    """CLIENT SETINFO carries what redis-py would send (its name and installed version), while
    every connection of every client made by ``connect`` shares one ``DriverInfo`` (redis-py
    would read the package metadata again for each connection of a URL-made pool).

    Single node: a cluster client has no ``connection_pool`` of its own to inspect (closing one
    is tested in test_connect_close.py)."""
    first, second = connect(redis_server.url), connect(redis_server.url)
    try:
        assert _lib(first) == ("redis-py", redis.__version__)
        assert _lib(second) == ("redis-py", redis.__version__)
        shared = first.connection_pool.connection_kwargs["driver_info"]
        assert isinstance(shared, driver_info.DriverInfo)
        assert second.connection_pool.connection_kwargs["driver_info"] is shared
    finally:
        first.close()
        second.close()


def test_connect_keeps_a_callers_own_driver_info(redis_server: Any) -> None:
    """A caller that names its driver (e.g. a framework wrapping rcoord) is not overridden."""
    mine = driver_info.DriverInfo(name="my-framework", lib_version="1.2.3")
    client = connect(redis_server.url, driver_info=mine)
    try:
        assert client.connection_pool.connection_kwargs["driver_info"] is mine
        assert _lib(client) == ("my-framework", "1.2.3")
    finally:
        client.close()


def test_a_client_serves_more_threads_at_once_than_redis_pys_default_pool(
        redis_server: Any) -> None:
    """150 threads each in a blocking call at once on one ``connect`` client (as member
    threads parked in JoinGroup on one blocking coordinator are): all are served. redis-py 8's
    default pool refused past 100 ("Too many connections"). The URL's own bound still wins."""
    import threading

    from rcoord.connect import MAX_CONNECTIONS

    client = connect(redis_server.url)
    results: list[Any] = []
    lock = threading.Lock()
    inside = threading.Barrier(150)

    def call(i: int) -> None:
        try:
            inside.wait(timeout=30)
            outcome: Any = client.blpop([f"rcoord-test-idle-{i}"], timeout=1)
        except Exception as exc:  # noqa: BLE001 - recorded and asserted below
            outcome = exc
        with lock:
            results.append(outcome)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(150)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert results == [None] * 150
        assert client.connection_pool.max_connections == MAX_CONNECTIONS
    finally:
        client.close()
    bounded = connect(redis_server.url + "?max_connections=7")
    try:
        assert bounded.connection_pool.max_connections == 7
    finally:
        bounded.close()


def test_a_database_on_a_cluster_is_named_with_what_to_fix(redis_cluster: Any) -> None:
    """redis://cluster-node:port/1 failed with the server's "SELECT is not allowed in cluster
    mode", a ResponseError naming neither the URL nor its /1: the CLIs printed
    "ResponseError: SELECT is not allowed in cluster mode" and a worker raised it from start."""
    from rcoord.cli import EXIT_USAGE, explain
    from rcoord.errors import ConfigError

    url = redis_cluster.url + "/1"
    with pytest.raises(ConfigError) as raised:
        connect(url)
    message = str(raised.value)
    assert "names database 1, but the server is a Redis Cluster" in message, message
    assert f"{redis_cluster.url}/1" in message and "drop /1" in message, message
    assert explain(raised.value, url)[0] == EXIT_USAGE
