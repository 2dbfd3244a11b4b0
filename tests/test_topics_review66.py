"""Review 66: topic admin at its edges (the command line of a DeleteRecords Redis stopped
partway, reading many topics from a master that froze, ...)."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import pytest
import test_cli_groups
from redis.backoff import NoBackoff
from redis.retry import Retry
from test_cli_groups import rows
from test_delete_records import _filled, _lose_redis_in_round

from rcoord.connect import connect
from rcoord.errors import ConnectionLost
from rcoord.topics import Topics, log_offsets, meta_key
from rcoord.topics import admin as topics_admin

url = test_cli_groups.url  # fixtures: the backend's URL, and the command line on it
cli = test_cli_groups.cli


def test_delete_records_on_the_command_line_shows_the_partitions_done_before_redis_was_lost(
        cli, redis_client, namespace, monkeypatch):
    """Partition 0's removal is done in the first round, partition 1's loses Redis in its
    second (as test_topics_review65's API test). The command printed the error alone, so the
    operator could not tell partition 0's records were gone; its row is printed now, then which
    partitions are not done, then the error, and the exit status is 1."""
    _filled(redis_client, namespace, Topics(redis_client, namespace), [3, 40], b"x" * 1000)
    monkeypatch.setattr(topics_admin, "RETENTION_TRIM_BYTES", 5000)
    _lose_redis_in_round(monkeypatch, 2)
    res = cli("topics", "delete-records", "t", "--offset", "-1")
    assert res.returncode == 1
    assert rows(res.stdout, "TOPIC PARTITION") == [["t", "0", "3", "-"]]
    assert "connection reset (test)" in res.stderr and "t: partitions 1 not done" in res.stderr
    assert "Traceback" not in res.stderr
    assert [log_offsets(redis_client, namespace, "t", p)[0] for p in range(2)] == [3, 4]


def test_partition_counts_from_a_frozen_master_waits_out_one_read_not_one_per_topic(
        own_cluster, namespace):
    """Four topics' metadata on one master, which freezes (SIGSTOP): redis-py's cluster
    pipeline sent each HGET the node failed again alone, each with its own retries and socket
    timeouts (41 s for 6 topics with a socket timeout of 0.5 s, against 13 s for one), so a
    consumer's metadata read of many topics hung for minutes. Now one HGET is sent alone (with
    redis-py's retries, which follow a failover), and the call fails when it fails."""
    client = connect(own_cluster.url, socket_timeout=0.5)
    try:
        victim = own_cluster.nodes[1]
        names = [t for t in (f"t{i}" for i in range(200))
                 if client.get_node_from_key(meta_key(namespace, t)).port == victim.port][:4]
        topics = Topics(client, namespace)
        for topic in names:
            topics.create(topic, 1)
        # The frozen read has a client of its own that retries once: redis-py's default
        # retries cost 26 socket timeouts here (13 s), and one retry sends the first HGET
        # again all the same. It reads once first, so its connection to the master is open
        # when the master freezes (a new one fails as a whole pipeline, not per command). Its
        # socket timeout of 1 s leaves that first read a margin on a loaded machine.
        frozen = connect(own_cluster.url, socket_timeout=1.0, retry=Retry(NoBackoff(), 1))
        frozen_topics = Topics(frozen, namespace)
        assert frozen_topics.partition_counts(names) == dict.fromkeys(names, 1)
        alone: list[Any] = []  # the commands sent on their own, outside a pipeline
        real_pipeline, real_execute = frozen.pipeline, frozen.execute_command

        def pipeline(*args: Any, **kwargs: Any) -> Any:
            pipe = real_pipeline(*args, **kwargs)
            parent = pipe.parent_execute_command

            def resent(*command: Any, **options: Any) -> Any:
                alone.append(command[1])
                return parent(*command, **options)

            pipe.parent_execute_command = resent
            return pipe

        def execute(*command: Any, **options: Any) -> Any:
            if command[0] == "HGET":
                alone.append(command[1])
            return real_execute(*command, **options)

        frozen.pipeline, frozen.execute_command = pipeline, execute
        os.kill(victim.pid, signal.SIGSTOP)
        try:
            with pytest.raises(ConnectionLost):
                frozen_topics.partition_counts(names)
        finally:
            os.kill(victim.pid, signal.SIGCONT)
            frozen.close()
        assert alone == [meta_key(namespace, names[0])]
        deadline = time.monotonic() + 60  # (the node back, the cluster's state ok again)
        while True:
            try:
                assert topics.partition_counts(names) == dict.fromkeys(names, 1)
                break
            except ConnectionLost:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
    finally:
        client.close()
