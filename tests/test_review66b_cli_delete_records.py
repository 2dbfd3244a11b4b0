"""Review 66b: ``rcoord topics delete-records --offset -1`` that loses Redis partway.

``Topics.delete_records`` resolves -1 to the log end before removing anything, and its
``DeleteRecordsIncomplete`` carries that offset for each partition not done, so that asking again
keeps the records appended since (commit 19705e3). The command line drops those offsets: it
names the partitions not done and says "run the command again for them", and the command run
again with ``--offset -1`` reads a later log end and removes the records appended meanwhile."""

from __future__ import annotations

import test_cli_groups
from test_delete_records import _filled, _lose_redis_in_round

from rcoord.topics import Producer, ProducerRecord, Topics, log_offsets
from rcoord.topics import admin as topics_admin

url = test_cli_groups.url  # fixtures: the backend's URL, and the command line on it
cli = test_cli_groups.cli


def test_the_partitions_not_done_are_named_with_the_offset_to_ask_again(
        cli, redis_client, namespace, monkeypatch):
    """Partition 1 (40 records) is trimmed in rounds of about 5 records; Redis is lost in the
    second, after 2 records more were appended to it. The call resolved -1 to 40, and the
    exception says to ask 40 again: the operator must be told 40, not to run the command (-1)
    again, which now removes the 2 records appended since."""
    _filled(redis_client, namespace, Topics(redis_client, namespace), [3, 40], b"x" * 1000)
    monkeypatch.setattr(topics_admin, "RETENTION_TRIM_BYTES", 5000)
    producer = Producer(redis_client, namespace, idempotent=False)
    _lose_redis_in_round(monkeypatch, 2, before=lambda: producer.send_batch(
        "t", [ProducerRecord(b"late", partition=1), ProducerRecord(b"late", partition=1)]))
    res = cli("topics", "delete-records", "t", "--offset", "-1")
    assert res.returncode == 1
    assert log_offsets(redis_client, namespace, "t", 1)[1] == 42  # the 2 appended since
    note = next(line for line in res.stderr.splitlines() if "not done" in line)
    # What the operator is told must carry the offset the call resolved -1 to (40): following
    # "run the command again" with -1 removes records 40 and 41, never asked to be removed.
    assert "40" in note, note
