"""Review 77 (do the docs' claims hold?): behaviour that contradicts what a doc or help says."""

from __future__ import annotations

import subprocess

from test_workers import ENV, _word_count

from rcoord import GroupCoordinator, TopicPartition


def test_word_count_max_records_stops_after_that_many_and_commits_no_more(
        redis_server, single_client, namespace):
    """workers/README.md and ``--help``: ``--max-records N`` stops the worker after N records.
    It counted and committed whole polls instead, so ``--max-records 3`` over 10 waiting records
    printed ``records 10`` and committed all 10: a second run (the next member) never saw the 7
    the first one was not asked to count. Kafka's console consumer ``--max-messages`` (and
    ``rcoord topics consume``) stop and commit at exactly N."""
    argv = _word_count(redis_server.url, single_client, namespace, 1, b"alpha", 10,
                       "--group", "wc", "--max-records", "3")
    res = subprocess.run(argv, env=ENV, capture_output=True, text=True, timeout=60,
                         check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "records 3; top words [('alpha', 3)]" in res.stdout, res.stdout
    coord = GroupCoordinator(single_client, namespace).start()
    tp = TopicPartition("lines", 0)
    assert coord.fetch_offsets("wc", [tp]).offsets[tp].offset == 3
