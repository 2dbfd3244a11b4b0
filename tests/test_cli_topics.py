"""``rcoord topics``: the command line (``rcoord.cli.main``, in this process, as in
test_cli_groups; the environment test runs ``python -m rcoord``) against real servers, on one
node and on a 3-master cluster; tables and JSON both checked, and the console
producer and consumer (directly and as a group member) end to end."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import test_cli_groups
from harness import wait_until
from test_cli_errors import one_error_line
from test_cli_groups import ok, rows

from rcoord import OffsetAndMetadata, TopicPartition
from rcoord.topics import Topics, fetch

url = test_cli_groups.url  # fixtures: the backend's URL, and the command line on it
cli = test_cli_groups.cli
ROOT = Path(__file__).resolve().parent.parent


def records(client: Any, namespace: str, topic: str, partition: int) -> list[tuple[Any, ...]]:
    return [(r.key, r.value)
            for r in fetch(client, namespace, topic, partition, 0, max_records=10_000).records]


def rcoord_process(url: str, namespace: str, *args: str, hook: str = "",
                   **popen: Any) -> subprocess.Popen[bytes]:
    """``python -m rcoord ARGS --redis-url URL --namespace NAMESPACE`` as a process, with no
    ``RCOORD_*`` variable set; ``hook``: Python code run in it first (a test's seam);
    ``popen``: its stdout, stderr ..."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RCOORD_")}
    env["PYTHONPATH"] = str(ROOT)
    run = ["-m", "rcoord"] if not hook else [
        "-c", f"{hook}\nimport sys\nfrom rcoord.cli import main\nsys.exit(main())"]
    return subprocess.Popen([sys.executable, *run, *args, "--redis-url", url,
                             "--namespace", namespace], env=env, **popen)


def test_create_list_describe_grow_delete(cli, redis_client, namespace):
    res = ok(cli("topics", "create", "orders", "--partitions", "3"))
    assert res.stdout.strip() == "Created topic orders."
    ok(cli("topics", "create", "audit", "--partitions", "1", "--retention-ms", "60000",
           "--retention-records", "100"))
    assert ok(cli("topics", "list")).stdout.split() == ["audit", "orders"]
    assert json.loads(ok(cli("topics", "list", "--output", "json")).stdout) == ["audit", "orders"]

    res = ok(cli("topics", "create", "orders", "--partitions", "3", "--if-not-exists"))
    assert res.stdout.strip() == "Topic orders already exists."
    res = cli("topics", "create", "orders", "--partitions", "3")
    assert res.returncode == 1
    assert "TOPIC_ALREADY_EXISTS: orders" in one_error_line(res, "topics create")

    ok(cli("topics", "produce", "orders", "--partition", "1", stdin="a\nb\n"))
    res = ok(cli("topics", "describe"))
    assert rows(res.stdout, "TOPIC  PARTITIONS") == [["audit", "1", "-", "60000", "100", "0"],
                                                     ["orders", "3", "-", "-", "-", "2"]]
    assert rows(res.stdout, "TOPIC PARTITION") == [
        ["audit", "0", "0", "0", "-"], ["orders", "0", "0", "0", "-"],
        ["orders", "1", "0", "2", "-"], ["orders", "2", "0", "0", "-"]]

    res = ok(cli("topics", "add-partitions", "orders", "--partitions", "5"))
    assert res.stdout.strip() == "Topic orders now has 5 partitions (was 3)."
    doc = json.loads(ok(cli("topics", "describe", "orders", "--output", "json")).stdout)
    assert [(d["topic"], d["partition_count"], d["retention_ms"]) for d in doc] == [
        ("orders", 5, None)]
    assert [(p["partition"], p["log_start_offset"], p["log_end_offset"], p["error"])
            for p in doc[0]["partitions"]] == [
        (0, 0, 0, None), (1, 0, 2, None), (2, 0, 0, None), (3, 0, 0, None), (4, 0, 0, None)]
    assert Topics(redis_client, namespace).partition_count("orders") == 5
    res = cli("topics", "add-partitions", "orders", "--partitions", "4")
    assert res.returncode == 2
    assert "orders has 5 partitions; cannot go to 4" in one_error_line(res, "topics add-partitions")

    res = ok(cli("topics", "delete", "audit", "--output", "json"))
    assert json.loads(res.stdout) == {"deleted": ["audit"]}
    res = cli("topics", "delete", "audit")
    assert res.returncode == 1
    assert "UNKNOWN_TOPIC_OR_PARTITION: audit" in one_error_line(res, "topics delete")
    assert ok(cli("topics", "delete", "audit", "orders", "--if-exists")).stdout.strip() == (
        "Deleted topic orders.")
    assert Topics(redis_client, namespace).list() == []


@pytest.mark.parametrize("backend", ["single"])
def test_describe_names_a_topic_named_twice_once(cli, redis_client, namespace):
    """As ``delete``: a topic named twice (a script's list with a repeat) is one topic, not two
    rows whose RECORDS, and JSON entries, a reader would add up twice."""
    Topics(redis_client, namespace).create("orders", 2)
    doc = json.loads(ok(cli("topics", "describe", "orders", "orders", "--output",
                            "json")).stdout)
    assert [d["topic"] for d in doc] == ["orders"]
    res = ok(cli("topics", "describe", "orders", "orders"))
    assert rows(res.stdout, "TOPIC  PARTITIONS") == [["orders", "2", "-", "-", "-", "0"]]
    assert len(rows(res.stdout, "TOPIC PARTITION")) == 2


@pytest.mark.parametrize("backend", ["single"])
def test_describe_says_why_a_partition_cannot_be_read(cli, redis_client, namespace):
    """A partition whose stream has a last id that is not rcoord's (an XADD by hand) is
    described with the error UNKNOWN_SERVER_ERROR for it alone since 17320c7, whose detail
    names the stream and what mends it; the command showed the code alone, with no word of the
    cause, where it had failed with that detail. It is a note on stderr now (text and JSON),
    and the other partitions are described as before."""
    from rcoord.topics import partition_key

    Topics(redis_client, namespace).create("orders", 2)
    ok(cli("topics", "produce", "orders", "--partition", "1", stdin="a\n"))
    redis_client.execute_command("XADD", partition_key(namespace, "orders", 0), "*", "x", "1")
    key = partition_key(namespace, "orders", 0)
    for args in ([], ["--output", "json"]):
        res = ok(cli("topics", "describe", "orders", *args))
        notes = [line for line in res.stderr.splitlines() if key in line]
        assert len(notes) == 1 and "orders-0: UNKNOWN_SERVER_ERROR" in notes[0], res.stderr
        assert "XADD by hand" in notes[0]
    assert rows(ok(cli("topics", "describe", "orders")).stdout,
                "TOPIC PARTITION") == [["orders", "0", "-1", "-1", "UNKNOWN_SERVER_ERROR"],
                                       ["orders", "1", "0", "1", "-"]]


def test_delete_checks_every_named_topic_before_deleting_any(cli, redis_client, namespace):
    """As kafka-topics.sh: a missing name among several deletes nothing and is named; with
    --if-exists the others are deleted and each is reported."""
    admin = Topics(redis_client, namespace)
    admin.create("a", 1)
    admin.create("c", 2)
    res = cli("topics", "delete", "a", "missing", "c", "gone")
    assert res.returncode == 1
    line = one_error_line(res, "topics delete")
    assert "UNKNOWN_TOPIC_OR_PARTITION: missing, gone" in line and "nothing was deleted" in line
    assert res.stdout == ""
    assert admin.list() == ["a", "c"]
    res = ok(cli("topics", "delete", "a", "missing", "c", "--if-exists", "--output", "json"))
    assert json.loads(res.stdout) == {"deleted": ["a", "c"]}
    assert admin.list() == []


def test_a_delete_that_fails_half_way_still_says_in_json_what_it_deleted(cli, redis_client,
                                                                         namespace, monkeypatch):
    """Redis lost after the first of two deletes: the JSON names the deleted topic, as the
    text output's "Deleted topic" line does, and the command fails."""
    from rcoord.errors import ConnectionLost

    admin = Topics(redis_client, namespace)
    admin.create("first", 1)
    admin.create("second", 1)
    real_delete = Topics.delete

    def delete(self: Topics, name: str) -> Any:
        if name == "second":
            raise ConnectionLost("Redis went away")
        return real_delete(self, name)

    monkeypatch.setattr(Topics, "delete", delete)
    res = cli("topics", "delete", "first", "second", "--output", "json")
    assert res.returncode != 0
    assert json.loads(res.stdout) == {"deleted": ["first"]}
    assert "Redis went away" in res.stderr
    assert admin.list() == ["second"]


def test_consume_takes_minus_one_as_no_limit_as_kafka(cli, redis_client, namespace):
    """Kafka's console consumer's default for ``--max-messages`` and ``--timeout-ms`` is -1,
    no limit; a script passing it explicitly got a usage error (exit 2) here."""
    from rcoord.topics import Producer

    Topics(redis_client, namespace).create("ev", 1)
    Producer(redis_client, namespace).send_batch("ev", [f"v{i}".encode() for i in range(3)])
    res = ok(cli("topics", "consume", "ev", "--from-beginning", "--max-messages", "-1",
                 "--timeout-ms", "300"))
    assert res.stdout.splitlines() == ["v0", "v1", "v2"]
    res = ok(cli("topics", "consume", "ev", "--from-beginning", "--max-messages", "2",
                 "--timeout-ms", "-1"))
    assert res.stdout.splitlines() == ["v0", "v1"]
    # The largest each takes (Kafka's Integer and Long): a wait that long is a deadline too.
    res = ok(cli("topics", "consume", "ev", "--from-beginning", "--max-messages", "2147483647",
                 "--timeout-ms", "300"))
    assert res.stdout.splitlines() == ["v0", "v1", "v2"]
    res = ok(cli("topics", "consume", "ev", "--from-beginning", "--max-messages", "1",
                 "--timeout-ms", "9223372036854775807"))
    assert res.stdout.splitlines() == ["v0"]


def test_produce_and_consume_directly(cli, redis_client, namespace):
    Topics(redis_client, namespace).create("ev", 3)
    lines = "".join(f"user-{i}:event {i}\n" for i in range(12))
    res = ok(cli("topics", "produce", "ev", "--key-separator", ":", stdin=lines))
    assert res.stdout.startswith("Produced 12 records to ev (partitions ")
    got = sorted(kv for p in range(3) for kv in records(redis_client, namespace, "ev", p))
    assert got == sorted((f"user-{i}".encode(), f"event {i}".encode()) for i in range(12))
    doc = json.loads(ok(cli("topics", "produce", "ev", "--partition", "2", "--output", "json",
                            stdin="x\ny\n")).stdout)
    assert doc == {"topic": "ev", "records": 2, "partitions": {"2": 2}}

    res = ok(cli("topics", "consume", "ev", "--from-beginning", "--max-messages", "14",
                 "--print-key", "--key-separator", "="))
    printed = res.stdout.splitlines()
    assert sorted(printed) == sorted([f"user-{i}=event {i}" for i in range(12)]
                                     + ["null=x", "null=y"])
    assert "Processed a total of 14 messages" in res.stderr
    # Per partition, in offset order.
    res = ok(cli("topics", "consume", "ev", "--from-beginning", "--max-messages", "14",
                 "--output", "json"))
    docs = [json.loads(line) for line in res.stdout.splitlines()]
    assert len(docs) == 14 and {d["topic"] for d in docs} == {"ev"}
    for p in range(3):
        offsets = [d["offset"] for d in docs if d["partition"] == p]
        assert offsets == list(range(len(offsets)))
    assert {(d["key"], d["value"]) for d in docs if d["partition"] == 2} >= {
        (None, "x"), (None, "y")}
    # Without --from-beginning only new records count: none arrive, so it stops idle.
    res = ok(cli("topics", "consume", "ev", "--timeout-ms", "300"))
    assert res.stdout == "" and "Processed a total of 0 messages" in res.stderr


def test_a_direct_consumer_reads_about_a_mib_at_once(cli, redis_client, namespace, monkeypatch):
    """Each read of ``topics consume`` (without ``--group``) takes about 1 MiB of records at
    most (Kafka's ``max.partition.fetch.bytes`` default), not 500 records whatever their size:
    six records of 400 kB were one read of 2.4 MB; now reads of two. All are printed, in
    order."""
    import rcoord.topics
    from rcoord.topics import Producer

    Topics(redis_client, namespace).create("big", 1)
    producer = Producer(redis_client, namespace)
    for i in range(6):
        producer.send("big", str(i).encode() * 400_000)
    real, counts = rcoord.topics.fetch, []

    def spy(*args: Any, **kwargs: Any) -> Any:
        res = real(*args, **kwargs)
        counts.append(len(res.records))
        return res

    monkeypatch.setattr(rcoord.topics, "fetch", spy)
    res = ok(cli("topics", "consume", "big", "--from-beginning", "--max-messages", "6"))
    assert res.stdout.splitlines() == [str(i) * 400_000 for i in range(6)]
    assert max(counts) == 2, counts


def test_consume_one_partition_from_an_offset(cli, redis_client, namespace):
    """Kafka's console consumer's ``--partition`` and ``--offset`` (earliest, latest or an
    offset; an offset out of the log's range starts at its nearer end, with a note), and its
    rules: an offset needs a partition, a partition excludes a group and --from-beginning."""
    Topics(redis_client, namespace).create("one", 2)
    ok(cli("topics", "produce", "one", "--partition", "1", stdin="a\nb\nc\nd\ne\n"))
    ok(cli("topics", "produce", "one", "--partition", "0", stdin="x\ny\n"))

    def consume(*args: str) -> tuple[list[tuple[int, int, str]], str]:
        res = ok(cli("topics", "consume", "one", "--timeout-ms", "300", "--output", "json",
                     *args))
        docs = [json.loads(line) for line in res.stdout.splitlines()]
        return [(d["partition"], d["offset"], d["value"]) for d in docs], res.stderr

    got, _ = consume("--partition", "1", "--offset", "2")
    assert got == [(1, 2, "c"), (1, 3, "d"), (1, 4, "e")]
    assert consume("--partition", "1", "--offset", "earliest")[0] == [
        (1, i, v) for i, v in enumerate("abcde")]
    assert consume("--partition", "0", "--from-beginning")[0] == [(0, 0, "x"), (0, 1, "y")]
    assert consume("--partition", "0", "--offset", "latest")[0] == []
    assert consume("--partition", "0")[0] == []  # the log end, as without --partition
    got, err = consume("--partition", "1", "--offset", "99")
    assert got == [] and "partition 1: offset 99 is past the log end 5" in err
    admin = Topics(redis_client, namespace)
    admin.create("kept", 1, retention_records=2)
    ok(cli("topics", "produce", "kept", stdin="a\nb\nc\nd\n"))
    assert admin.apply_retention("kept") == {0: 2}
    res = ok(cli("topics", "consume", "kept", "--partition", "0", "--offset", "1",
                 "--timeout-ms", "300"))
    assert res.stdout.splitlines() == ["c", "d"]
    assert "partition 0: offset 1 is below the log start 2 (removed by retention)" in res.stderr
    for args, said in ((["--offset", "1"], "--offset needs --partition"),
                       (["--partition", "0", "--group", "g"], "--group and --partition"),
                       (["--partition", "0", "--offset", "1", "--from-beginning"],
                        "--from-beginning and --offset"),
                       (["--partition", "0", "--offset", "-1"], "is not 'earliest'"),
                       (["--partition", "0", "--offset", "first"], "is not 'earliest'")):
        res = cli("topics", "consume", "one", *args)
        assert res.returncode == 2 and said in res.stderr, (args, res.stderr)
    res = cli("topics", "consume", "one", "--partition", "2")
    assert res.returncode == 1
    assert "topic 'one' has 2 partitions; there is no partition 2" in one_error_line(
        res, "topics consume")


def test_consume_as_a_group_member(cli, make_coordinator, redis_client, namespace):
    coord = make_coordinator()
    Topics(redis_client, namespace).create("ev", 2)
    ok(cli("topics", "produce", "ev", stdin="".join(f"v{i}\n" for i in range(6))))
    res = ok(cli("topics", "consume", "ev", "--group", "g", "--from-beginning",
                 "--max-messages", "6", "--print-offset", "--timeout-ms", "30000"))
    assert sorted(ln.split("\t")[2] for ln in res.stdout.splitlines()) == [
        f"v{i}" for i in range(6)]
    # It committed what it printed, and left the group.
    ends = {(p.partition): p.log_end_offset
            for p in Topics(redis_client, namespace).describe("ev").partitions}
    got = coord.fetch_offsets("g", [TopicPartition("ev", p) for p in range(2)]).offsets
    assert {tp.partition: o.offset for tp, o in got.items()} == ends
    assert coord.describe_group("g").state == "Empty"
    # Run again: it resumes from the committed offsets, so there is nothing to print.
    res = ok(cli("topics", "consume", "ev", "--group", "g", "--from-beginning",
                 "--timeout-ms", "1500"))
    assert res.stdout == "" and "Processed a total of 0 messages" in res.stderr
    doc = json.loads(ok(cli("groups", "describe", "g", "--output", "json")).stdout)
    assert doc["total_lag"] == 0 and len(doc["partitions"]) == 2


@pytest.mark.parametrize("backend", ["single"])
def test_produce_stores_each_lines_bytes_and_says_what_a_failed_append_left(
        cli, redis_client, namespace, monkeypatch):
    """A line that is not UTF-8 is stored as it is (it used to stop the run half-way with
    "unexpected UnicodeEncodeError", the lines of the pending batch dropped unsaid); an empty
    key prints as empty, not as "null" (no key); and an append that fails says which lines are
    stored, so the input can be sent again from the right one."""
    from rcoord.errors import ConnectionLost
    from rcoord.topics import Producer

    Topics(redis_client, namespace).create("t", 1)
    lines = b"".join(b"k%d:v%d\n" % (i, i) for i in range(700))
    ok(cli("topics", "produce", "t", "--key-separator", ":",
           stdin=lines[:3000] + b"k:\xff\xfe raw\n:empty key\n" + lines[3000:]))
    got = records(redis_client, namespace, "t", 0)
    assert len(got) == 702 and (b"k", b"\xff\xfe raw") in got and (b"", b"empty key") in got
    res = ok(cli("topics", "consume", "t", "--from-beginning", "--max-messages", "702",
                 "--print-key", "--key-separator", "="))
    assert "=empty key" in res.stdout.splitlines()

    real = Producer.send_batch
    calls = []

    def second_fails(self: Any, topic: str, batch: Any) -> Any:
        calls.append(len(batch))
        if len(calls) == 2:
            raise ConnectionLost("Redis went away")
        return real(self, topic, batch)

    monkeypatch.setattr(Producer, "send_batch", second_fails)
    res = cli("topics", "produce", "t", stdin="".join(f"n{i}\n" for i in range(700)))
    assert res.returncode == 1 and calls == [500, 200]
    assert ("Redis went away; lines 1-500 were produced (500 records); lines 501-700 may or "
            "may not have been") in one_error_line(res, "topics produce")
    assert len(records(redis_client, namespace, "t", 0)) == 702 + 500


@pytest.mark.parametrize("backend", ["single"])
def test_a_group_consumer_piped_into_head_commits_exactly_what_it_printed(
        url, namespace, redis_client, make_coordinator):
    """``rcoord topics consume --group g | head -n 3``: the consumer stops cleanly (exit 0,
    no "unexpected BrokenPipeError") and the group's committed offset is the number of records
    it printed, not the 500 its last poll() took (the group skipped what nobody saw)."""
    coord = make_coordinator()
    Topics(redis_client, namespace).create("t", 1)
    from rcoord.topics import Producer

    # 2,000 lines of 200 bytes: far more than a pipe holds, so a print fails once head left.
    Producer(redis_client, namespace).send_batch("t", [b"%04d" % i + b"x" * 195
                                                       for i in range(2000)])
    proc = rcoord_process(url, namespace, "topics", "consume", "t", "--group", "g",
                          "--from-beginning", "--timeout-ms", "30000",
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None
    head = [proc.stdout.readline() for _ in range(3)]
    proc.stdout.close()
    _, err = proc.communicate(timeout=120)
    stderr = err.decode()
    assert [line[:4] for line in head] == [b"0000", b"0001", b"0002"]
    assert proc.returncode == 0, stderr
    assert "unexpected" not in stderr and "Traceback" not in stderr
    printed = int(re.search(r"Processed a total of (\d+) messages", stderr).group(1))
    assert 3 <= printed < 2000
    committed = coord.fetch_offsets("g", [TopicPartition("t", 0)]).offsets
    assert committed[TopicPartition("t", 0)].offset == printed


@pytest.mark.parametrize("backend", ["single"])
def test_a_group_consumer_stopped_by_sigterm_commits_what_it_printed_and_leaves(
        url, namespace, redis_client, make_coordinator):
    """``kill``, ``timeout`` or ``docker stop`` (SIGTERM) end ``topics consume --group`` as
    Ctrl-C does: it commits what it printed, leaves the group and exits 143. Before, it died
    at once: still a member for a session timeout (a reset-offsets refused meanwhile) and
    nothing it printed committed."""
    import signal

    coord = make_coordinator()
    Topics(redis_client, namespace).create("t", 1)
    from rcoord.topics import Producer

    Producer(redis_client, namespace).send_batch("t", [b"%d" % i for i in range(10)])
    proc = rcoord_process(url, namespace, "topics", "consume", "t", "--group", "g",
                          "--from-beginning", "--timeout-ms", "60000",
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        printed = [proc.stdout.readline().strip() for _ in range(10)]
        assert printed == [b"%d" % i for i in range(10)]
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 143, err.decode()
    assert "Traceback" not in err.decode()
    assert coord.describe_group("g").members == []
    assert coord.fetch_offsets("g", [TopicPartition("t", 0)]).offsets[
        TopicPartition("t", 0)].offset == 10


@pytest.mark.parametrize("backend", ["single"])
def test_a_command_whose_stdout_was_closed_still_succeeds(url, namespace, redis_client,
                                                          make_coordinator):
    """A reset whose reader went away before it printed (``| (exec 0<&-; ...)``) commits and
    exits 0, as Kafka's tools do; before, it said "unexpected BrokenPipeError" and exited 1
    after committing, so a script took it for failed."""
    coord = make_coordinator()
    Topics(redis_client, namespace).create("t", 1)
    from rcoord.topics import Producer

    Producer(redis_client, namespace).send_batch("t", [b"x"] * 5)
    read_end, write_end = os.pipe()
    os.close(read_end)  # every write to stdout fails (EPIPE)
    try:
        proc = rcoord_process(url, namespace, "groups", "reset-offsets", "g", "--topic", "t",
                              "--to-latest", "--execute", stdout=write_end,
                              stderr=subprocess.PIPE)
        _, err = proc.communicate(timeout=60)
    finally:
        os.close(write_end)
    assert proc.returncode == 0, err.decode()
    # Only its note on stderr (the report to stdout goes nowhere), no error.
    assert err.decode() == "rcoord groups reset-offsets: committed 1 offsets of group 'g'\n"
    assert coord.fetch_offsets("g", [TopicPartition("t", 0)]).offsets[
        TopicPartition("t", 0)].offset == 5


def _into_a_closed_pipe(url: str, namespace: str, *args: str) -> tuple[int, str]:
    """Run ``python -m rcoord ARGS`` with a stdout whose reader has gone (every write fails
    with EPIPE); its exit status and stderr."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = rcoord_process(url, namespace, *args, stdout=write_end, stderr=subprocess.PIPE)
        _, err = proc.communicate(timeout=60)
    finally:
        os.close(write_end)
    return proc.returncode, err.decode()


def test_a_reader_gone_neither_hides_a_failure_nor_stops_the_work(url, namespace, redis_client,
                                                                  make_coordinator):
    """Into a pipe whose reader went away: ``groups delete`` of an empty group and a busy one
    still exits 1 with the busy one's error (before: exit 0, nothing on stderr, the report of
    the deleted one having raised BrokenPipeError first), and ``topics delete`` of several
    topics deletes every one (before: it stopped at its first "Deleted topic" line)."""
    coord = make_coordinator()
    coord.commit_offsets("idle", {TopicPartition("t", 0): OffsetAndMetadata(1)})
    first = coord.join_group("busy", protocol_type="consumer", protocols=[("range", b"")],
                             session_timeout_ms=60_000)
    coord.join_group("busy", first.member_id, protocol_type="consumer",
                     protocols=[("range", b"")], session_timeout_ms=60_000)
    code, err = _into_a_closed_pipe(url, namespace, "groups", "delete", "idle", "busy")
    assert code == 1, err
    assert "group 'busy' could not be deleted: NON_EMPTY_GROUP" in err
    assert [g.group_id for g in coord.list_groups()] == ["busy"]

    topics = Topics(redis_client, namespace)
    for name in ("a", "b", "c"):
        topics.create(name, 1)
    code, err = _into_a_closed_pipe(url, namespace, "topics", "delete", "a", "b", "c")
    assert (code, err) == (0, "")
    assert topics.list() == []


def test_an_option_value_with_a_blank_that_starts_with_a_dash(cli, redis_client, namespace):
    """``--key-separator '-> '`` is a value, as argparse reads it (a dash and a blank); the
    check for misspelt options took it for one ("unrecognized option: ->")."""
    Topics(redis_client, namespace).create("t", 1)
    ok(cli("topics", "produce", "t", "--key-separator", "-> ", stdin="k-> v\n"))
    assert records(redis_client, namespace, "t", 0) == [(b"k", b"v")]


def test_a_direct_consumer_reads_partitions_added_while_it_runs(url, namespace, redis_client):
    """``rcoord topics consume t`` (no group) started on one partition: a record produced to a
    partition added after it started is printed (it used to read only the partitions it saw
    at its start)."""
    import threading

    from rcoord.topics import Producer

    admin = Topics(redis_client, namespace)
    admin.create("t", 1)
    proc = rcoord_process(url, namespace, "topics", "consume", "t", "--timeout-ms", "60000",
                          "--output", "json", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    started = threading.Event()

    def produce_until_started() -> None:
        # It reads from the log end: a record printed says it runs.
        producer = Producer(redis_client, namespace)
        while not started.wait(0.1):
            producer.send("t", b"before", partition=0)

    feeder = threading.Thread(target=produce_until_started)
    feeder.start()
    try:
        assert proc.stdout is not None
        first = json.loads(proc.stdout.readline())
        started.set()
        feeder.join()
        assert (first["partition"], first["value"]) == (0, "before")
        admin.add_partitions("t", 2)
        Producer(redis_client, namespace).send("t", b"after", partition=1)
        while True:  # the "before" records it had not printed yet, then the new partition's
            record = json.loads(proc.stdout.readline())
            if record["value"] == "after":
                break
            assert (record["partition"], record["value"]) == (0, "before")
        assert record["partition"] == 1
    finally:
        started.set()
        feeder.join()
        proc.kill()
        proc.communicate()


def test_a_direct_consumer_reads_a_topic_created_again_from_its_start(url, namespace,
                                                                      redis_client):
    """The topic is deleted and created again while ``rcoord topics consume t`` reads it at
    offset 10. Before, the consumer waited without a word until the new log passed offset 10,
    and never showed the new records below it (Kafka's consumer resets a position past the
    log end: OFFSET_OUT_OF_RANGE)."""
    import threading

    from rcoord.topics import Producer

    admin = Topics(redis_client, namespace)
    admin.create("t", 1)
    proc = rcoord_process(url, namespace, "topics", "consume", "t", "--timeout-ms", "15000",
                          "--output", "json", stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True)
    started = threading.Event()

    def produce_until_started() -> None:
        producer = Producer(redis_client, namespace)
        while not started.wait(0.1):
            producer.send("t", b"before")

    feeder = threading.Thread(target=produce_until_started)
    feeder.start()
    try:
        assert proc.stdout is not None and proc.stderr is not None
        assert json.loads(proc.stdout.readline())["value"] == "before"
        started.set()
        feeder.join()
        Producer(redis_client, namespace).send_batch("t", [b"old"] * 10)
        while json.loads(proc.stdout.readline())["value"] != "old":
            pass
        for _ in range(9):
            assert json.loads(proc.stdout.readline())["value"] == "old"
        admin.delete("t")
        admin.create("t", 1)
        Producer(redis_client, namespace).send_batch("t", [b"new-0", b"new-1", b"new-2"])
        printed = [json.loads(proc.stdout.readline()) for _ in range(3)]
        assert [(r["offset"], r["value"]) for r in printed] == [
            (0, "new-0"), (1, "new-1"), (2, "new-2")]
    finally:
        started.set()
        feeder.join()
        proc.kill()
        _, err = proc.communicate()
    assert re.search(r"partition 0: offset \d+ is past the log end [0-3] \(the topic was "
                     r"deleted and created again\?\); reading it from its log start 0", err)


@pytest.mark.parametrize("backend", ["single"])
@pytest.mark.parametrize(("args", "stdin", "code", "says"), [
    (["create", "bad name", "--partitions", "1"], None, 2, "illegal topic name 'bad name'"),
    (["create", "t2", "--partitions", "0"], None, 2, "INVALID_PARTITIONS"),
    (["create", "t2"], None, 2, "the following arguments are required: --partitions"),
    # A misspelt option is named (it used to be "required: --partitions", hiding the typo).
    (["create", "--partitons", "3", "--topic", "t2"], None, 2,
     "unrecognized options: --partitons (did you mean --partitions?), --topic"),
    (["create", "t2", "--partitions=3", "--retension-ms=5"], None, 2,
     "unrecognized option: --retension-ms (did you mean --retention-ms?)"),
    (["create", "t2", "--partitions", "1", "--retention-ms", "-2"], None, 2,
     "--retention-ms must be >= 0, or -1 for no limit (as leaving it out), got -2"),
    (["produce", "t", "--key-separator", ":"], "k:v\nno separator\n", 1,
     "line 2 has no key separator ':'; the 1 records before it were produced"),
    (["produce", "nope"], "x\n", 1, "UNKNOWN_TOPIC_OR_PARTITION: nope"),
    (["produce", "t", "--partition", "4"], "x\n", 1, "there is no partition 4"),
    (["consume", "nope", "--timeout-ms", "100"], None, 1, "UNKNOWN_TOPIC_OR_PARTITION: nope"),
    (["consume", "t", "--max-messages", "0"], None, 2,
     "--max-messages must be from 1 to 2147483647 (or -1: no limit), got 0"),
    (["consume", "t", "--timeout-ms", "-2"], None, 2,
     "--timeout-ms must be from 1 to 9223372036854775807 (or -1: no limit), got -2"),
    # Past Kafka's Integer and Long (its console consumer refuses them too).
    (["consume", "t", "--max-messages", "2147483648"], None, 2,
     "--max-messages must be from 1 to 2147483647 (or -1: no limit), got 2147483648"),
    (["consume", "t", "--timeout-ms", "9223372036854775808"], None, 2,
     "--timeout-ms must be from 1 to 9223372036854775807 (or -1: no limit), got "
     "9223372036854775808"),
    # Kafka's consumer refuses an empty or blank group.id; "" ran without a group (exit 0,
    # nothing committed) and " " joined a group named " ".
    (["consume", "t", "--group", "", "--timeout-ms", "100"], None, 2,
     "--group '': a group id must not be empty or whitespace"),
    (["consume", "t", "--group", " \t", "--timeout-ms", "100"], None, 2,
     "--group ' \\t': a group id must not be empty or whitespace"),
    (["describe", "nope"], None, 1, "UNKNOWN_TOPIC_OR_PARTITION: nope"),
    # A value no call could take is a usage error too, said as the library says it.
    (["add-partitions", "t", "--partitions", "0"], None, 2, "--partitions must be >= 1, got 0"),
    (["produce", "t", "--partition", "-1"], "x\n", 2, "partition must be >= 0, got -1"),
    # As produce's: a negative --partition is a bad flag (exit 2), said before the topic is
    # looked up; consume said "there is no partition -1" (exit 1), or named the topic.
    (["consume", "t", "--partition", "-1", "--timeout-ms", "100"], None, 2,
     "--partition must be >= 0, got -1"),
    (["consume", "nope", "--partition", "-1", "--timeout-ms", "100"], None, 2,
     "--partition must be >= 0, got -1"),
])
def test_bad_input_is_one_line(cli, redis_client, namespace, args, stdin, code, says):
    Topics(redis_client, namespace).create("t", 1)
    res = cli("topics", *args, stdin=stdin)
    line = one_error_line(res, f"topics {args[0]}")
    assert res.returncode == code, line
    assert says in line


@pytest.mark.parametrize("backend", ["single"])
def test_a_line_over_max_request_size_is_named_and_the_lines_before_it_are_produced(
        cli, redis_client, namespace):
    """A line larger than the producer takes: it said "record 2 is ... bytes" (its place in
    the batch, not its line) and then that lines 1-4 "may or may not have been" produced,
    though the refused batch appended none of them; the lines before it were not produced."""
    from rcoord.topics.producer import MAX_REQUEST_SIZE

    Topics(redis_client, namespace).create("t", 1)
    res = cli("topics", "produce", "t", "--key-separator", ":",
              stdin="a:1\nb:2\nk:" + "x" * MAX_REQUEST_SIZE + "\nc:3\n")
    assert res.returncode == 1
    assert (f"line 3 is {MAX_REQUEST_SIZE + 1} bytes (key and value), more than the "
            f"producer's max_request_size {MAX_REQUEST_SIZE}; the 2 records before it were "
            "produced") in one_error_line(res, "topics produce")
    assert records(redis_client, namespace, "t", 0) == [(b"a", b"1"), (b"b", b"2")]


@pytest.mark.parametrize("backend", ["single"])
def test_create_takes_minus_one_as_no_retention_limit(cli, redis_client, namespace):
    """-1 is Kafka's "unlimited" (``retention.ms=-1``, ``retention.bytes=-1``): the topic gets
    no retention setting, as with the flag left out. It was refused (INVALID_CONFIG, "must be
    an int from 0"), without saying that leaving the flag out is how to get that."""
    ok(cli("topics", "create", "t", "--partitions", "1", "--retention-ms", "-1",
           "--retention-records", "-1"))
    described = Topics(redis_client, namespace).describe("t")
    assert (described.retention_ms, described.retention_records) == (None, None)


@pytest.mark.parametrize("backend", ["single"])
def test_common_options_before_the_command(cli, url, redis_client, namespace):
    """``rcoord --redis-url URL topics list`` works as ``rcoord topics list --redis-url URL``
    (it was "invalid choice" for the URL); given on both sides, the one after the command
    wins. An option the command does not take is named."""
    from test_cli_groups import run_in_process

    Topics(redis_client, namespace).create("t", 1)
    res = ok(run_in_process(["--redis-url", url, "--namespace", namespace, "--output", "json",
                             "--log-level", "info", "topics", "list"]))
    assert json.loads(res.stdout) == ["t"]
    res = ok(run_in_process(["--redis-url", "redis://127.0.0.1:1", "--namespace", "elsewhere",
                             "--output", "json", "topics", "list", "--redis-url", url,
                             "--namespace", namespace, "--output", "table"]))
    assert res.stdout.split() == ["t"]
    res = run_in_process(["--tls-ca-file", "ca.pem", "topics", "list", "--redis-url", url])
    assert res.returncode == 2
    assert "need a rediss:// URL" in one_error_line(res, "topics list")
    res = run_in_process(["--output", "json", "demo", "--redis-url", url])
    assert res.returncode == 2
    assert res.stderr.startswith("rcoord: error: --output is not an option of rcoord demo")


def test_create_partitions_has_help():
    from test_cli_groups import run_in_process

    res = ok(run_in_process(["topics", "create", "--help"]))
    assert "how many partitions (1 or more" in " ".join(res.stdout.split())


def test_namespace_and_url_come_from_the_environment(redis_server, namespace):
    import os
    import subprocess
    import sys

    from test_cli_groups import ROOT

    env = {k: v for k, v in os.environ.items() if not k.startswith("RCOORD_")}
    env |= {"PYTHONPATH": str(ROOT), "RCOORD_REDIS_URL": redis_server.url,
            "RCOORD_NAMESPACE": namespace}
    res = subprocess.run([sys.executable, "-m", "rcoord", "topics", "create", "e", "--partitions",
                          "1"], env=env, capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 0, res.stderr
    with redis_server.client() as client:
        assert Topics(client, namespace).list() == ["e"]


class _SignalledStdout:
    """A stdout whose ``write`` of a record's line sends this process ``signum`` once that line
    is written: the stop lands in the window between a record printed and it being counted."""

    def __init__(self, signum: int, on_line: int) -> None:
        self.signum, self.on_line = signum, on_line
        self.lines: list[str] = []

    def write(self, text: str) -> int:
        import signal

        if text.strip():
            self.lines.append(text.strip())
            if len(self.lines) == self.on_line:
                signal.raise_signal(self.signum)
        return len(text)

    def flush(self) -> None:
        pass


@pytest.mark.parametrize("signame, raised", [("SIGTERM", "Terminated"),
                                             ("SIGINT", "KeyboardInterrupt")])
def test_a_stop_signal_as_a_record_is_printed_leaves_that_record_printed_and_counted(
        monkeypatch, signame, raised):
    """A SIGTERM or Ctrl-C that lands just after a record's line is written ends the console
    consumer after that record is counted: the positions it commits include every line it
    printed. Before, the stop could land between the write and the count, the printed record
    was sought back, and the group's commit was one short (CI saw 9 of 10)."""
    import signal
    from types import SimpleNamespace

    from rcoord.ops import common, console

    stdout = _SignalledStdout(getattr(signal, signame), on_line=2)
    monkeypatch.setattr(sys, "stdout", stdout)
    args = SimpleNamespace(print_offset=False, print_key=False, key_separator="\t",
                           max_messages=None)
    ctx = SimpleNamespace(json=False, args=args)
    polled = [SimpleNamespace(topic="t", partition=0, offset=o, key=None, value=b"%d" % o,
                              timestamp_ms=0, topic_partition=TopicPartition("t", 0))
              for o in range(5)]
    sought: list[tuple[TopicPartition, int]] = []
    consumer = SimpleNamespace(seek=lambda tp, offset: sought.append((tp, offset)))
    # (What this process had before: a test that ran earlier in it may have installed one.)
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    signals = common.StopSignals().install()
    try:
        printer = console._Printer(ctx, signals)
        with pytest.raises(BaseException) as stopped:
            console._print_all(consumer, polled, printer)
    finally:
        signals.restore()
    assert type(stopped.value).__name__ == raised
    assert stdout.lines == ["0", "1"]
    assert printer.count == 2
    assert sought == [(TopicPartition("t", 0), 2)]
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before


def test_a_third_stop_signal_while_a_print_is_held_stops_at_once():
    """A print blocked on a full pipe must still be stoppable: the first signal waits for the
    print, the second is taken for the same stop (``timeout`` sends two) and ignored, a third
    inside the same print raises there and then."""
    import signal

    from rcoord.ops import common

    signals = common.StopSignals().install()
    reached = []
    try:
        with pytest.raises(common.Terminated), signals.held():
            for n in ("first", "second", "third"):
                signal.raise_signal(signal.SIGTERM)
                reached.append(f"after the {n}")
    finally:
        signals.restore()
    assert reached == ["after the first", "after the second"]


class _StoppedConsumer:
    """A console consumer's ``Consumer`` that is sent SIGTERM ``in_poll`` times as its poll
    hands out ``records`` and ``in_close`` times inside ``close()``; ``calls`` says what ran."""

    def __init__(self, records: int, in_poll: int, in_close: int) -> None:
        self.records, self.in_poll, self.in_close = records, in_poll, in_close
        self.calls: list[str] = []

    @staticmethod
    def _signal(times: int) -> None:
        import signal

        for _ in range(times):
            signal.raise_signal(signal.SIGTERM)

    def poll(self, timeout: float, max_records: int) -> list[Any]:
        from types import SimpleNamespace

        self.calls.append("poll")
        self._signal(self.in_poll)  # lands as the records are handed out
        return [SimpleNamespace(topic="t", partition=0, offset=o, key=None, value=b"%d" % o,
                                timestamp_ms=0, topic_partition=TopicPartition("t", 0))
                for o in range(min(self.records, max_records))]

    def wakeup(self) -> None:
        self.calls.append("wakeup")

    def assignment(self) -> set[TopicPartition]:
        return {TopicPartition("t", 0)}

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.calls.append(f"seek {offset}")

    def close(self, timeout: float) -> None:
        self.calls.append("close")
        self._signal(self.in_close)
        self.calls.append("closed")


def _consume_group_in_process(monkeypatch: Any, consumer: _StoppedConsumer,
                              max_messages: int | None = None
                              ) -> tuple[list[str], BaseException | None]:
    """``console._consume_group`` on ``consumer``, with its stop signals installed: the lines
    it printed, and what it raised."""
    import signal
    from types import SimpleNamespace

    import rcoord.client
    from rcoord.ops import common, console

    monkeypatch.setattr(rcoord.client, "Consumer", lambda config, **kwargs: consumer)
    stdout = _SignalledStdout(signal.SIGTERM, on_line=0)
    monkeypatch.setattr(sys, "stdout", stdout)
    args = SimpleNamespace(print_offset=False, print_key=False, key_separator="\t",
                           max_messages=max_messages, group="g", topic="t",
                           from_beginning=True, timeout_ms=None)
    ctx = SimpleNamespace(json=False, args=args, client=None, namespace="ns",
                          note=lambda text: None)
    signals = common.StopSignals().install()
    stopped: BaseException | None = None
    try:
        console._consume_group(ctx, console._Printer(ctx, signals))
    except BaseException as exc:  # noqa: BLE001 - the caller checks it
        stopped = exc
    finally:
        signals.restore()
    return stdout.lines, stopped


def test_a_stop_signal_during_a_group_poll_prints_what_the_poll_handed_out(monkeypatch):
    """A SIGTERM that lands while ``poll()`` is handing records out wakes the poll, and the
    console consumer prints every record the poll returned before it stops, so close() commits
    nothing that was not printed. Before, the stop could end the command between the poll and
    the printing, and close() committed the unprinted records as read."""
    from rcoord.ops import common

    consumer = _StoppedConsumer(records=3, in_poll=1, in_close=0)
    lines, stopped = _consume_group_in_process(monkeypatch, consumer)
    assert type(stopped) is common.Terminated
    assert lines == ["0", "1", "2"]
    assert consumer.calls == ["poll", "wakeup", "close", "closed"]


@pytest.mark.parametrize(("in_poll", "in_close", "max_messages", "printed", "calls"), [
    # `timeout`: one SIGTERM to the command, one to its process group; the second lands in
    # close(). It used to raise there: no final commit, no LeaveGroup.
    (1, 1, None, 3, ["poll", "wakeup", "close", "closed"]),
    # Both land in the poll: the second used to raise there, and what it handed out was lost.
    (2, 0, None, 3, ["poll", "wakeup", "close", "closed"]),
    # --max-messages reached, and a stop comes as it closes: the close ends first.
    (0, 1, 3, 3, ["poll", "close", "closed"]),
    # An operator insisting: the third signal ends even a close.
    (1, 2, None, 3, ["poll", "wakeup", "close"]),
])
def test_a_repeated_stop_signal_does_not_cut_a_group_consumers_close_short(
        monkeypatch, in_poll, in_close, max_messages, printed, calls):
    """Once a stop is under way, a second SIGTERM is the same stop sent twice (GNU ``timeout``
    signals the command and its process group): close() still commits what was printed and
    leaves the group, as Kafka's console consumer closes from a shutdown hook further signals
    do not interrupt. A stop signal during close() waits for it, then exits 143."""
    from rcoord.ops import common

    consumer = _StoppedConsumer(records=3, in_poll=in_poll, in_close=in_close)
    lines, stopped = _consume_group_in_process(monkeypatch, consumer, max_messages)
    assert type(stopped) is common.Terminated
    assert lines == [str(o) for o in range(printed)]
    assert consumer.calls == calls


_CLOSE_WAITS_FOR_STDIN = """
import sys
import rcoord.client

real_close = rcoord.client.Consumer.close

def close(self, timeout=None):
    print("closing", file=sys.stderr, flush=True)
    sys.stdin.readline()  # the test signals again, then lets the close go on
    real_close(self, timeout)

rcoord.client.Consumer.close = close
"""


@pytest.mark.parametrize("backend", ["single"])
def test_a_group_consumer_sent_sigterm_twice_commits_what_it_printed_and_leaves(
        url, namespace, redis_client, make_coordinator):
    """``timeout N rcoord topics consume T --group G``: GNU timeout sends SIGTERM to the command
    and to its process group, so the consumer gets two. It still commits what it printed and
    leaves the group (exit 143). Before, the second SIGTERM often raised inside close(): the
    member stayed for a session timeout and nothing it printed was committed (3 runs in 6).
    The second is sent once close() has begun (the hook says so and waits for stdin), where
    it hurt; how far apart timeout's two land varies."""
    import signal

    coord = make_coordinator()
    Topics(redis_client, namespace).create("t", 1)
    from rcoord.topics import Producer

    Producer(redis_client, namespace).send_batch("t", [b"%d" % i for i in range(10)])
    proc = rcoord_process(url, namespace, "topics", "consume", "t", "--group", "g",
                          "--from-beginning", "--timeout-ms", "60000",
                          hook=_CLOSE_WAITS_FOR_STDIN, stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          start_new_session=True)
    try:
        assert proc.stdout is not None and proc.stderr is not None and proc.stdin is not None
        printed = [proc.stdout.readline().strip() for _ in range(10)]
        assert printed == [b"%d" % i for i in range(10)]
        os.kill(proc.pid, signal.SIGTERM)  # what timeout does: the command,
        said = [proc.stderr.readline()]
        while said[-1] not in (b"closing\n", b""):
            said.append(proc.stderr.readline())
        assert said[-1] == b"closing\n", said
        os.killpg(proc.pid, signal.SIGTERM)  # then its process group
        proc.stdin.write(b"go on\n")
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.communicate()
    assert proc.returncode == 143, err.decode()
    assert "Processed a total of 10 messages" in err.decode()
    group = coord.describe_group("g")
    assert (group.state, group.members) == ("Empty", [])
    assert coord.fetch_offsets("g", [TopicPartition("t", 0)]).offsets[
        TopicPartition("t", 0)].offset == 10


# -- the console producer's linger and stop, the consumer's bytes ---------------------------

_ANNOUNCE_LINES = """
import sys
import rcoord.ops.console as console
console.LINGER_S = 600.0  # no linger: the test decides when the lines are sent
_lines = console._lines
def _announced(*args):
    for item in _lines(*args):
        yield item
        if item is not None:
            sys.stderr.write(f"read {item[0]}\\n")
            sys.stderr.flush()
console._lines = _announced
"""
"""A console producer's seam: each line read is announced on stderr (``read N``), and the
linger is too long to send a batch by itself."""


@pytest.mark.parametrize("backend", ["single"])
def test_produce_from_a_slow_pipe_sends_the_lines_without_waiting_for_more(
        url, namespace, redis_client):
    """``tail -f app.log | rcoord topics produce t``: lines that wait for a batch are sent
    after the linger (1 s, as Kafka's console producer's ``--timeout``). They were held until
    500 lines had come or stdin ended, so a slow pipe's lines could wait for ever."""
    Topics(redis_client, namespace).create("t", 1)
    proc = rcoord_process(url, namespace, "topics", "produce", "t", stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdin is not None
        proc.stdin.write(b"a\nb\nc\npartial")
        proc.stdin.flush()
        wait_until(lambda: len(records(redis_client, namespace, "t", 0)) >= 3,
                   timeout_s=30, why=lambda: proc.poll())
        assert records(redis_client, namespace, "t", 0) == [(None, b"a"), (None, b"b"),
                                                            (None, b"c")]
        # The rest, then the end of input, which sends it at once.
        out, err = proc.communicate(b" line\nd\n", timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, err.decode()
    assert [v for _, v in records(redis_client, namespace, "t", 0)] == [
        b"a", b"b", b"c", b"partial line", b"d"]
    assert b"Produced 5 records to t" in out


@pytest.mark.parametrize("backend", ["single"])
@pytest.mark.parametrize(("stop", "code"), [("SIGINT", 130), ("SIGTERM", 143)])
def test_produce_stopped_sends_the_lines_it_read(url, namespace, redis_client, stop, code):
    """Ctrl-C or SIGTERM: the lines read are sent before the command stops (Kafka's console
    producer closes, so flushes, its producer from a shutdown hook), and it says which lines
    were produced. They were dropped, silently (SIGTERM killed it at once)."""
    import signal

    Topics(redis_client, namespace).create("t", 1)
    proc = rcoord_process(url, namespace, "topics", "produce", "t", hook=_ANNOUNCE_LINES,
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdin is not None and proc.stderr is not None
        proc.stdin.write(b"a\nb\nc\n")
        proc.stdin.flush()
        assert [proc.stderr.readline() for _ in range(3)] == [b"read 1\n", b"read 2\n",
                                                              b"read 3\n"]
        assert records(redis_client, namespace, "t", 0) == []  # read, not sent yet
        proc.send_signal(getattr(signal, stop))
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == code, err.decode()
    assert records(redis_client, namespace, "t", 0) == [(None, b"a"), (None, b"b"),
                                                        (None, b"c")]
    assert "stopped; lines 1-3 were produced (3 records)" in err.decode()
    assert "Traceback" not in err.decode()


@pytest.mark.parametrize("backend", ["single"])
@pytest.mark.parametrize("encoding", ["utf-8", "ascii"])
def test_consume_prints_keys_and_values_as_their_bytes(url, namespace, redis_client,
                                                       monkeypatch, encoding):
    """A record's key and value are written as their bytes, as Kafka's console consumer
    writes them, whatever stdout's encoding: bytes that are not UTF-8 were printed as U+FFFD
    (so produce then consume did not give the input back), and a stdout that could not encode
    a character failed the run ("unexpected UnicodeEncodeError", exit 1)."""
    from rcoord.topics import Producer, ProducerRecord

    monkeypatch.setenv("PYTHONIOENCODING", encoding)
    Topics(redis_client, namespace).create("t", 1)
    Producer(redis_client, namespace).send_batch("t", [
        ProducerRecord(b"\xff\xfe raw", key=b"k\xe9"), ProducerRecord("café".encode())])
    proc = rcoord_process(url, namespace, "topics", "consume", "t", "--from-beginning",
                          "--max-messages", "2", "--print-key", "--key-separator", "→",
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err.decode()
    assert out == b"k\xe9\xe2\x86\x92\xff\xfe raw\nnull\xe2\x86\x92caf\xc3\xa9\n"
