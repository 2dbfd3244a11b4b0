"""Review 72: ``rcoord topics consume --group G --max-messages N`` commits exactly what it
printed on a topic whose log start was moved (``delete-records``) and which grew
(``add-partitions``), as docs/operations.md promises. A reviewer saw such a run commit every
partition's log end after printing 2 records; run here as they described it (in process, and
as a process with its stdout a file and the namespace's default settings), it commits what
it printed, so these tests guard that."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import test_cli_groups
from test_cli_groups import ok
from test_cli_topics import rcoord_process

from rcoord import TopicPartition
from rcoord.topics import Producer, ProducerRecord, Topics

url = test_cli_groups.url  # fixtures: the backend's URL, and the command line on it
cli = test_cli_groups.cli

STARTS = {0: 0, 1: 0, 2: 5, 3: 0}
ENDS = {0: 3, 1: 3, 2: 20, 3: 0}


def _orders(redis_client: Any, namespace: str) -> None:
    """The reviewer's topic: 3, 3 and 20 records in partitions 0-2, partition 2's records
    below 5 deleted, then a fourth partition, new and empty."""
    topics = Topics(redis_client, namespace)
    topics.create("orders", 3)
    producer = Producer(redis_client, namespace)
    for p, n in enumerate([3, 3, 20]):
        producer.send_batch("orders", [ProducerRecord(b"p%d-%d" % (p, i), partition=p)
                                       for i in range(n)])
    topics.delete_records("orders", {2: 5})
    topics.add_partitions("orders", 4)


def _printed(stdout: str) -> list[tuple[int, int]]:
    """(partition, offset) of each line printed with --print-offset."""
    out = []
    for line in stdout.splitlines():
        partition, offset, _ = line.split("\t")
        out.append((int(partition.removeprefix("Partition:")),
                    int(offset.removeprefix("Offset:"))))
    return out


def _committed(coord: Any, group: str) -> dict[int, int]:
    got = coord.fetch_offsets(group, [TopicPartition("orders", p) for p in range(4)]).offsets
    return {tp.partition: o.offset for tp, o in got.items()}


def _expected(before: dict[int, int], printed: list[tuple[int, int]]) -> dict[int, int]:
    """Each partition's position after ``printed``: past its last record printed, else where
    it started (the committed offset, or the log start by --from-beginning)."""
    after = dict(before)
    for p, offset in printed:
        assert offset == after[p], f"partition {p}: printed offset {offset}, expected {after[p]}"
        after[p] = offset + 1
    return after


@pytest.mark.parametrize("backend", ["single"])
@pytest.mark.parametrize("committed_below_start", [False, True])
def test_a_group_consumer_commits_what_it_printed_after_delete_records_and_growth(
        cli: Any, make_coordinator: Any, redis_client: Any, namespace: str,
        committed_below_start: bool) -> None:
    """Two runs of ``--max-messages 2``, then one for the remaining 17: each commits exactly
    the records it printed (each partition past its last one printed; the others where they
    start: the log start, partition 2's 5 also when the group's commit of it, 2, fell below
    it, as Kafka's auto.offset.reset=earliest resets to the log start), and together they
    print every record once, none skipped."""
    coord = make_coordinator()
    if committed_below_start:
        coord.commit_offsets("g", {TopicPartition("orders", 2): 2})
    _orders(redis_client, namespace)
    position = dict(STARTS)
    for n in (2, 2, 17):
        res = ok(cli("topics", "consume", "orders", "--group", "g", "--from-beginning",
                     "--max-messages", str(n), "--print-offset", "--timeout-ms", "60000"))
        printed = _printed(res.stdout)
        assert len(printed) == n and f"Processed a total of {n} messages" in res.stderr
        position = _expected(position, printed)
        assert _committed(coord, "g") == position
    assert position == ENDS


@pytest.mark.parametrize("backend", ["single"])
def test_a_group_consumer_process_writing_to_a_file_commits_what_it_printed(
        url: str, make_coordinator: Any, redis_client: Any, namespace: str,
        tmp_path: Path) -> None:
    """As the reviewer ran it: ``rcoord topics consume orders --group jg3 --from-beginning
    --max-messages 2 > file``, a process (no --timeout-ms), for two new groups in turn."""
    coord = make_coordinator()
    _orders(redis_client, namespace)
    for group in ("jg2", "jg3"):
        out = tmp_path / group
        with out.open("wb") as stdout:
            proc = rcoord_process(url, namespace, "topics", "consume", "orders", "--group",
                                  group, "--from-beginning", "--max-messages", "2",
                                  "--print-offset", stdout=stdout, stderr=subprocess.PIPE)
            _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err.decode()
        assert "Processed a total of 2 messages" in err.decode()
        printed = _printed(out.read_text())
        assert _committed(coord, group) == _expected(STARTS, printed)
