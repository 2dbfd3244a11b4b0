"""Review 66: topic admin at its edges (the command line of a DeleteRecords Redis stopped
partway, ...)."""

from __future__ import annotations

from typing import Any

import redis
import test_cli_groups
from test_cli_groups import rows
from test_delete_records import _filled

from rcoord.topics import Topics, log_offsets
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
    real, rounds = topics_admin._run, []

    def cut_in_second_round(client: Any, calls: Any, **kwargs: Any) -> Any:
        rounds.append(len(calls))
        if len(rounds) == 2:
            raise redis.exceptions.ConnectionError("connection reset (test)")
        return real(client, calls, **kwargs)

    monkeypatch.setattr(topics_admin, "_run", cut_in_second_round)
    res = cli("topics", "delete-records", "t", "--offset", "-1")
    assert res.returncode == 1
    assert rows(res.stdout, "TOPIC PARTITION") == [["t", "0", "3", "-"]]
    assert "connection reset (test)" in res.stderr and "t: partitions 1 not done" in res.stderr
    assert "Traceback" not in res.stderr
    assert [log_offsets(redis_client, namespace, "t", p)[0] for p in range(2)] == [3, 4]
