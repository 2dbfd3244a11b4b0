"""``groups reset-offsets --by-duration`` (and ``--to-datetime``) when the log changes between the
read of its offsets and the search by time (driven here by appending, and removing, in a wrapper
of ``offsets_for_times``, the search the command runs after the read)."""

from __future__ import annotations

import json
from typing import Any

import test_cli_groups
from test_cli_groups import committed, ok, produce

import rcoord.topics
from rcoord import TopicPartition
from rcoord.topics import Topics, log_offsets

url = test_cli_groups.url  # fixtures: the backend's URL, and the command line on it
cli = test_cli_groups.cli


def _search_after(monkeypatch: Any, between: Any) -> None:
    """Run ``between`` once, after the command read the log offsets, before it searches."""
    real = rcoord.topics.offsets_for_times

    def late(*args: Any, **kwargs: Any) -> Any:
        between()
        return real(*args, **kwargs)

    monkeypatch.setattr(rcoord.topics, "offsets_for_times", late)


def test_a_record_appended_before_the_search_is_found_and_not_clamped(
        cli, make_coordinator, redis_client, namespace, monkeypatch):
    """Records appended after the log offsets were read, and the first of them removed (here by
    DeleteRecords, as retention does), leave the search's first record at or after the time
    above the log end read: that offset is in the log, and is what the group resumes from. It
    was clamped to the earlier log end with the note "7 is above the log end offset; clamped
    to 5", which planned an offset below the log start (7), out of range."""
    coord = make_coordinator()
    topics = Topics(redis_client, namespace)
    topics.create("t", 1)
    secs, _ = redis_client.time()
    now = int(secs) * 1000
    produce(redis_client, namespace, "t", {0: 5}, stamps=[now - 3_600_000] * 5)  # (an hour ago)
    coord.commit_offsets("g", {TopicPartition("t", 0): 0})

    def append_and_remove() -> None:
        produce(redis_client, namespace, "t", {0: 3}, stamps=[now] * 3)
        topics.delete_records("t", {0: 7})

    _search_after(monkeypatch, append_and_remove)
    res = ok(cli("groups", "reset-offsets", "g", "--topic", "t", "--by-duration", "PT30M",
                 "--execute", "--output", "json"))
    (row,) = json.loads(res.stdout)["partitions"]
    assert (row["requested_offset"], row["new_offset"], row["log_end_offset"]) == (7, 7, 5)
    assert "clamped" not in res.stderr and "appended after" in (row["note"] or "")
    assert committed(coord, "g") == {("t", 0): 7}
    assert log_offsets(redis_client, namespace, "t", 0) == (7, 8)


def test_records_appended_alone_before_the_search_are_found_at_the_log_end_read(
        cli, make_coordinator, redis_client, namespace, monkeypatch):
    """Without a removal, the first record appended since the read is at the log end read, so
    the plan takes it with no note (nothing is skipped, nothing said to be clamped)."""
    make_coordinator()
    Topics(redis_client, namespace).create("t", 1)
    secs, _ = redis_client.time()
    now = int(secs) * 1000
    produce(redis_client, namespace, "t", {0: 5}, stamps=[now - 3_600_000] * 5)  # (an hour ago)
    _search_after(monkeypatch, lambda: produce(redis_client, namespace, "t", {0: 3},
                                               stamps=[now] * 3))
    res = ok(cli("groups", "reset-offsets", "g", "--topic", "t", "--by-duration", "PT30M",
                 "--output", "json"))
    (row,) = json.loads(res.stdout)["partitions"]
    assert (row["requested_offset"], row["new_offset"], row["log_end_offset"],
            row["note"]) == (5, 5, 5, None)
