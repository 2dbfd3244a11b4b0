"""Review 72 of the operator's CLI against Kafka's tools: ``rcoord topics produce`` and the
commands that change a topic or a group's offsets of it, on a topic whose delete stopped
partway (marked for deletion), and the line ends ``produce`` splits its input at. Each test
fails on the code it was written against."""

from __future__ import annotations

import os
import sys
from typing import Any

import pytest
import test_cli_groups
from test_cli_errors import one_error_line
from test_cli_groups import ok
from test_topics_review64_marked import _stopped_delete

from rcoord import TopicPartition
from rcoord.topics import Topics, fetch

url = test_cli_groups.url  # fixtures: the backend's URL, and the command line on it
cli = test_cli_groups.cli


def _values(redis_client: Any, namespace: str, topic: str, partition: int) -> list[bytes | None]:
    return [r.value for r in fetch(redis_client, namespace, topic, partition, 0).records]


@pytest.mark.parametrize("backend", ["single"])
@pytest.mark.parametrize("where", [[], ["--partition", "0"], ["--partition", "1"]])
def test_produce_to_a_topic_marked_for_deletion_is_refused_definitely(
        cli: Any, redis_client: Any, namespace: str, monkeypatch: pytest.MonkeyPatch,
        where: list[str]) -> None:
    """Topic t's delete removed partition 0 and stopped. Produced to partition 0 (or by the
    partitioner, which chose it) the lines were refused and said to be ones that "may or may
    not have been" produced, though the refusal is certain and nothing was written; produced
    to partition 1, which survives, they were appended to a topic the delete that finishes it
    throws away. Now the command refuses before it reads a line, says nothing was produced,
    and names the way out."""
    _stopped_delete(redis_client, namespace, monkeypatch)
    res = cli("topics", "produce", "t", *where, stdin="a\nb\n")
    assert res.returncode == 1, res.stdout + res.stderr
    line = one_error_line(res, "topics produce")
    assert "'t' is marked for deletion" in line and "no line was produced" in line, line
    assert "may or may not" not in line
    assert "rcoord topics delete t" in line and "rcoord topics create t" in line
    assert _values(redis_client, namespace, "t", 1) == [b"old"]  # nothing appended
    ok(cli("topics", "delete", "t"))
    ok(cli("topics", "create", "t", "--partitions", "2"))
    ok(cli("topics", "produce", "t", *where, stdin="a\nb\n"))


@pytest.mark.parametrize("backend", ["single"])
@pytest.mark.parametrize("args", [
    ["groups", "reset-offsets", "g", "--topic", "t:1", "--to-earliest", "--execute"],
    ["groups", "reset-offsets", "g", "--all-topics", "--to-earliest", "--execute"],
    ["groups", "reset-offsets", "g", "--topic", "t", "--to-earliest", "--execute"],
    ["groups", "reset-offsets", "g", "--topic", "t:1", "--to-earliest"],  # (a dry run)
    ["topics", "delete-records", "t", "--offset", "-1", "--partition", "1"],
    ["topics", "delete-records", "t", "--offset", "-1"],
    ["topics", "alter-configs", "t", "--add-config", "retention.ms=5000"],
    ["topics", "alter-configs", "t", "--add-config", "retention.ms=5000", "--validate-only"],
])
def test_commands_that_change_a_topic_marked_for_deletion_refuse_it(
        cli: Any, make_coordinator: Any, redis_client: Any, namespace: str,
        monkeypatch: pytest.MonkeyPatch, args: list[str]) -> None:
    """Kafka refuses requests on a topic marked for deletion, and once it is deleted there is
    nothing to act on. Here the surviving partition 1 of t (its delete removed partition 0 and
    stopped) was reset, trimmed or reconfigured, for the delete that finishes it to throw away
    (a reset of all of t, or a trim of every partition, said "no partition 0 (any more)" or
    UNKNOWN_TOPIC_OR_PARTITION, with no word of why). Now each is refused, naming the topic
    and what finishes the delete, and writes nothing."""
    coord = make_coordinator()
    _stopped_delete(redis_client, namespace, monkeypatch)
    coord.commit_offsets("g", {TopicPartition("t", 1): 1})  # (once t is made: its offset)
    before = Topics(redis_client, namespace).settings("t")
    res = cli(*args)
    assert res.returncode == 1, res.stdout + res.stderr
    line = one_error_line(res, " ".join(args[:2]))
    assert "'t' is marked for deletion" in line and "rcoord topics delete t" in line, line
    assert line.endswith(("nothing was changed", "no record was deleted",
                          "no config was changed")), line
    assert {tp: o.offset for tp, o in coord.fetch_offsets("g").offsets.items()} == {
        TopicPartition("t", 1): 1}
    assert _values(redis_client, namespace, "t", 1) == [b"old"]
    assert Topics(redis_client, namespace).settings("t") == before


@pytest.mark.parametrize("backend", ["single"])
@pytest.mark.parametrize(("text", "lines"), [
    (b"a\rb\r\nc\r\r\nd\n\ne", [b"a", b"b", b"c", b"", b"d", b"", b"e"]),
    (b"x\r\ny\r\n", [b"x", b"y"]),  # (no empty line after the last line end)
    (b"x\r", [b"x"]),
    (b"\n", [b""]),
])
def test_produce_ends_a_line_where_kafkas_console_producer_does(
        cli: Any, redis_client: Any, namespace: str, text: bytes, lines: list[bytes]) -> None:
    """Kafka's console producer reads its lines with ``BufferedReader.readLine``, which ends a
    line at ``\\n``, ``\\r`` or ``\\r\\n``. Here only ``\\n`` ended one, and every ``\\r`` before
    it was stripped: ``a\\rb\\r\\n`` was one record ``a\\rb``, and ``c\\r\\r\\n`` one record, not
    ``c`` and an empty one."""
    Topics(redis_client, namespace).create("t", 1)
    ok(cli("topics", "produce", "t", stdin=text))
    assert _values(redis_client, namespace, "t", 0) == lines


def test_produce_reads_a_line_end_split_across_reads_as_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """stdin a pipe (read as it comes): a ``\\r`` ends its line at once, before the next byte
    comes (as readLine returns), and a ``\\n`` that comes next is the same line end, not an
    empty line."""
    from rcoord.ops.console import _lines

    r, w = os.pipe()
    with os.fdopen(r, "r") as stdin:
        monkeypatch.setattr(sys, "stdin", stdin)
        lines = _lines(linger_s=5.0)  # (what is asked for is written before: no wait)
        try:
            os.write(w, b"a\r")
            assert next(lines) == (1, b"a")
            os.write(w, b"\nb\nc\r")
        finally:
            os.close(w)
        assert list(lines) == [(2, b"b"), (3, b"c")]
