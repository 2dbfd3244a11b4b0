"""``rcoord groups``: the command line (``rcoord.cli.main``, in this process: see
``run_in_process``) against real servers, on one node and on a 3-master cluster; tables and
JSON both checked.

Groups with members are formed in this process through the coordinator (consumer-protocol
subscriptions and assignments, long sessions), so the command sees a Stable group it did not
make itself.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from harness import Ctx, wait_for_the_next_ms
from test_cli_errors import one_error_line

from rcoord import Errors, TopicPartition
from rcoord.cli import UsageError
from rcoord.ops.common import Context, Failure
from rcoord.ops.groups import _commit
from rcoord.ops.reset import (
    Mode,
    Row,
    parse_datetime,
    parse_duration,
    parse_reset_file,
    parse_topics,
    plan,
)
from rcoord.protocol.consumer import ConsumerProtocolAssignment, ConsumerProtocolSubscription
from rcoord.topics import Producer, ProducerRecord, Topics

ROOT = Path(__file__).resolve().parent.parent
T0 = 1_704_067_200_000  # 2024-01-01T00:00:00Z


@pytest.fixture
def url(request: pytest.FixtureRequest, backend: str) -> str:
    server = request.getfixturevalue("redis_server" if backend == "single" else "redis_cluster")
    return str(server.url)


def run_in_process(argv: list[str],
                   stdin: str | bytes | None = None) -> subprocess.CompletedProcess[str]:
    """``rcoord.cli.main(argv)`` in this process, with its own stdin, stdout and stderr; the
    result looks like ``subprocess.run``'s.

    What a subprocess adds (``python -m rcoord``, the exit status through ``sys.exit``, a
    fresh interpreter) is covered by tests/test_cli_errors.py, which runs every command that
    way, and by test_cli_topics' environment test; the rest of the CLI tests call ``main``
    directly, which saves an interpreter start (about 0.4 s) per command.
    """
    import contextlib
    import io

    from rcoord.cli import main

    out, err = io.StringIO(), io.StringIO()
    saved_stdin = sys.stdin
    # A text layer over bytes, as a real stdin (``topics produce`` reads its bytes).
    raw = stdin.encode() if isinstance(stdin, str) else (stdin or b"")
    sys.stdin = io.TextIOWrapper(io.BytesIO(raw), encoding="utf-8")
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(argv)
            except SystemExit as exc:  # argparse's usage errors and --help
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
                if isinstance(exc.code, str):
                    err.write(exc.code + "\n")
    finally:
        sys.stdin = saved_stdin
    return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())


@pytest.fixture
def cli(url: str, namespace: str, make_coordinator: Any,
        monkeypatch: pytest.MonkeyPatch) -> Any:
    """``cli("groups", "describe", "g")``: runs the command on this test's server and namespace
    (whose settings a coordinator established first, with no initial rebalance delay), in this
    process (see run_in_process), with no ``RCOORD_*`` variable set."""
    make_coordinator()
    for key in [k for k in os.environ if k.startswith("RCOORD_")]:
        monkeypatch.delenv(key)

    def run(*args: str, stdin: str | bytes | None = None) -> subprocess.CompletedProcess[str]:
        return run_in_process([*args, "--redis-url", url, "--namespace", namespace], stdin)

    return run


def ok(res: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert res.returncode == 0, res.stderr + res.stdout
    assert "Traceback" not in res.stderr
    return res


def rows(stdout: str, header: str) -> list[list[str]]:
    """The rows of the table whose column names start with the words of ``header``, each row
    split on blanks."""
    lines, words = stdout.splitlines(), header.split()
    start = next(i for i, ln in enumerate(lines) if ln.split()[:len(words)] == words)
    out = []
    for ln in lines[start + 1:]:
        if not ln.strip():
            break
        out.append(ln.split())
    return out


def committed(coord: Any, group: str) -> dict[tuple[str, int], int]:
    return {(tp.topic, tp.partition): o.offset
            for tp, o in coord.fetch_offsets(group).offsets.items()}


def stable_group(coord: Any, pool: Any, group: str, topic: str,
                 owners: dict[str, list[int]]) -> tuple[int, dict[str, str]]:
    """A Stable consumer group: one member per client id in ``owners``, each assigned those
    partitions of ``topic``; returns (generation, client id -> member id)."""
    ctx = Ctx(coord, None, pool, group_id=group, session_timeout_ms=120_000,
              rebalance_timeout_ms=120_000)
    protocols = [("range", ConsumerProtocolSubscription([topic]).encode())]

    def kw(name: str) -> dict[str, Any]:
        return {"client_id": name, "client_host": f"/10.0.0.{len(name)}", "protocols": protocols}

    names = list(owners)
    ids = {name: ctx.new_member_id(**kw(name)) for name in names}
    first = ctx.join(ids[names[0]], **kw(names[0]))
    assert first.error == Errors.NONE
    assert ctx.sync(ids[names[0]], first.generation_id, {ids[names[0]]: b""}).error == Errors.NONE
    futures = [ctx.join_async(ids[n], **kw(n)) for n in names]
    results = [f.result(30) for f in futures]
    assert all(r.error == Errors.NONE for r in results), results
    gen, leader = results[0].generation_id, results[0].leader_id
    plan_ = {ids[n]: ConsumerProtocolAssignment([(topic, p) for p in parts]).encode()
             for n, parts in owners.items()}
    syncs = [ctx.sync_async(ids[n], gen, plan_ if ids[n] == leader else None) for n in names]
    assert all(s.result(30).error == Errors.NONE for s in syncs)
    assert ctx.state() == "Stable"
    return gen, ids


def produce(client: Any, namespace: str, topic: str, counts: dict[int, int],
            stamps: list[int] | None = None) -> None:
    """``counts[p]`` records to partition p; with ``stamps``, record i of each partition is
    appended at time stamps[i] (the producer's test clock)."""
    now = [0]
    producer = Producer(client, namespace, clock=(lambda: now[0]) if stamps else None)
    for p, n in counts.items():
        for i in range(n):
            if stamps:
                now[0] = stamps[i]
            producer.send_batch(topic, [ProducerRecord(f"r{i}".encode(), partition=p)])


# -- list and describe ------------------------------------------------------------------------


def test_list_and_describe_with_lag(cli, make_coordinator, redis_client, namespace, pool):
    coord = make_coordinator()
    Topics(redis_client, namespace).create("orders", 3)
    produce(redis_client, namespace, "orders", {0: 5, 1: 3})
    gen, ids = stable_group(coord, pool, "busy", "orders", {"alpha": [0, 1], "beta": [2]})
    errors = coord.commit_offsets("busy", {TopicPartition("orders", 0): 2,
                                           TopicPartition("orders", 1): 3},
                                  member_id=ids["alpha"], generation_id=gen)
    assert set(errors.values()) == {Errors.NONE}
    coord.commit_offsets("idle", {TopicPartition("orders", 0): 5})  # a simple (Empty) group

    res = ok(cli("groups", "list"))
    assert rows(res.stdout, "GROUP") == [["busy", "Stable", "consumer"],
                                         ["idle", "Empty", "-"]]  # a simple group
    res = ok(cli("groups", "list", "--state", "stable", "--output", "json"))
    assert json.loads(res.stdout) == [
        {"group": "busy", "state": "Stable", "protocol_type": "consumer"}]
    assert json.loads(ok(cli("groups", "list", "--state", "Empty,Dead", "--output",
                             "json")).stdout) == [
        {"group": "idle", "state": "Empty", "protocol_type": None}]

    res = ok(cli("groups", "describe", "busy"))
    assert rows(res.stdout, "GROUP  STATE") == [  # orders-2's lag is unknown: a lower bound
        ["busy", "Stable", "consumer", "range", "2", ">=3"]]
    members = rows(res.stdout, "CONSUMER-ID")
    assert sorted(members) == sorted([[ids["alpha"], "-", "/10.0.0.5", "alpha", "2"],
                                      [ids["beta"], "-", "/10.0.0.4", "beta", "1"]])
    assert rows(res.stdout, "GROUP  TOPIC") == [
        ["busy", "orders", "0", "2", "5", "3", ids["alpha"], "/10.0.0.5", "alpha"],
        ["busy", "orders", "1", "3", "3", "0", ids["alpha"], "/10.0.0.5", "alpha"],
        ["busy", "orders", "2", "-", "0", "-", ids["beta"], "/10.0.0.4", "beta"],
    ]
    assert res.stderr == ""

    doc = json.loads(ok(cli("groups", "describe", "busy", "--output", "json")).stdout)
    assert (doc["group"], doc["state"], doc["protocol_type"], doc["protocol"]) == (
        "busy", "Stable", "consumer", "range")
    assert (doc["total_lag"], doc["known_lag"], doc["lag_unknown_partitions"]) == (None, 3, 1)
    assert {m["client_id"]: (m["consumer_id"], m["host"], m["partitions"])
            for m in doc["members"]} == {
        "alpha": (ids["alpha"], "/10.0.0.5", [["orders", 0], ["orders", 1]]),
        "beta": (ids["beta"], "/10.0.0.4", [["orders", 2]]),
    }
    assert doc["partitions"][0] == {
        "topic": "orders", "partition": 0, "current_offset": 2, "log_end_offset": 5, "lag": 3,
        "consumer_id": ids["alpha"], "host": "/10.0.0.5", "client_id": "alpha"}
    assert doc["partitions"][2]["current_offset"] is None and doc["partitions"][2]["lag"] is None

    res = ok(cli("groups", "describe", "idle"))
    assert rows(res.stdout, "GROUP  STATE") == [["idle", "Empty", "-", "-", "0", "0"]]
    assert rows(res.stdout, "GROUP  TOPIC") == [["idle", "orders", "0", "5", "5", "0", "-", "-",
                                                 "-"]]
    assert "consumer group 'idle' has no active members" in res.stderr
    doc = json.loads(ok(cli("groups", "describe", "idle", "--output", "json")).stdout)
    assert (doc["total_lag"], doc["known_lag"], doc["lag_unknown_partitions"]) == (0, 0, 0)


def test_a_control_character_in_an_id_keeps_a_table_row_on_one_line(cli, make_coordinator,
                                                                  redis_client, namespace, pool):
    """Client ids and instance ids are free text: a newline or a tab printed as it is split a
    member's row in two and shifted its columns. The table escapes them; JSON keeps them."""
    coord = make_coordinator()
    Topics(redis_client, namespace).create("orders", 1)
    _, ids = stable_group(coord, pool, "odd", "orders", {"two\nlines\ttab": [0]})
    res = ok(cli("groups", "describe", "odd"))
    member = ids["two\nlines\ttab"]
    shown = member.replace("\n", "\\n").replace("\t", "\\t")
    assert rows(res.stdout, "CONSUMER-ID") == [
        [shown, "-", "/10.0.0.13", "two\\nlines\\ttab", "1"]]
    doc = json.loads(ok(cli("groups", "describe", "odd", "--output", "json")).stdout)
    assert [m["client_id"] for m in doc["members"]] == ["two\nlines\ttab"]


@pytest.mark.parametrize("backend", ["single"])
def test_total_lag_is_never_a_guess(cli, make_coordinator, redis_client, namespace, pool):
    """TOTAL-LAG was 0 for a group with no lag known (nothing committed: every LAG '-'), and
    the sum of the known ones when only some were, so an alert on it read 0 for a group a
    whole log behind. Now: '-' / null when none is known; '>=N' in the table and a null
    total_lag with known_lag N in JSON when some are."""
    coord = make_coordinator()
    Topics(redis_client, namespace).create("orders", 2)
    Topics(redis_client, namespace).create("audit", 2)
    produce(redis_client, namespace, "orders", {0: 5, 1: 7})
    produce(redis_client, namespace, "audit", {0: 4, 1: 2})
    stable_group(coord, pool, "fresh", "orders", {"alpha": [0, 1]})
    gen, ids = stable_group(coord, pool, "some", "audit", {"beta": [0, 1]})
    errors = coord.commit_offsets("some", {TopicPartition("audit", 0): 1},
                                  member_id=ids["beta"], generation_id=gen)
    assert set(errors.values()) == {Errors.NONE}

    res = ok(cli("groups", "describe", "fresh"))
    assert rows(res.stdout, "GROUP  STATE") == [["fresh", "Stable", "consumer", "range", "1", "-"]]
    assert [r[5] for r in rows(res.stdout, "GROUP  TOPIC")] == ["-", "-"]
    doc = json.loads(ok(cli("groups", "describe", "fresh", "--output", "json")).stdout)
    assert (doc["total_lag"], doc["known_lag"], doc["lag_unknown_partitions"]) == (None, None, 2)

    res = ok(cli("groups", "describe", "some"))
    assert rows(res.stdout, "GROUP  STATE") == [["some", "Stable", "consumer", "range", "1",
                                                 ">=3"]]
    assert [r[5] for r in rows(res.stdout, "GROUP  TOPIC")] == ["3", "-"]
    doc = json.loads(ok(cli("groups", "describe", "some", "--output", "json")).stdout)
    assert (doc["total_lag"], doc["known_lag"], doc["lag_unknown_partitions"]) == (None, 3, 1)

    # Every lag known: the total, as before.
    errors = coord.commit_offsets("some", {TopicPartition("audit", 1): 0},
                                  member_id=ids["beta"], generation_id=gen)
    assert set(errors.values()) == {Errors.NONE}
    assert rows(ok(cli("groups", "describe", "some")).stdout, "GROUP  STATE")[0][5] == "5"
    doc = json.loads(ok(cli("groups", "describe", "some", "--output", "json")).stdout)
    assert (doc["total_lag"], doc["known_lag"], doc["lag_unknown_partitions"]) == (5, 5, 0)


@pytest.mark.parametrize("backend", ["single"])
def test_a_commit_past_the_log_end_does_not_lower_the_total_lag(cli, make_coordinator,
                                                                 redis_client, namespace):
    """A partition committed past its log end (records lost to a failover, or a reset by
    hand) shows its negative LAG, as Kafka's ``getLag`` does; but the total summed it, so
    another partition 4 behind made a TOTAL-LAG of -4 + 4 = 0, and an alert on it read a
    group that is behind as caught up. It counts as 0 behind in the total."""
    coord = make_coordinator()
    Topics(redis_client, namespace).create("orders", 2)
    produce(redis_client, namespace, "orders", {0: 2, 1: 4})
    errors = coord.commit_offsets("ahead", {TopicPartition("orders", 0): 6,
                                            TopicPartition("orders", 1): 0})
    assert set(errors.values()) == {Errors.NONE}
    res = ok(cli("groups", "describe", "ahead"))
    assert [r[5] for r in rows(res.stdout, "GROUP  TOPIC")] == ["-4", "4"]
    assert rows(res.stdout, "GROUP  STATE")[0][5] == "4"
    doc = json.loads(ok(cli("groups", "describe", "ahead", "--output", "json")).stdout)
    assert [p["lag"] for p in doc["partitions"]] == [-4, 4]
    assert (doc["total_lag"], doc["known_lag"], doc["lag_unknown_partitions"]) == (4, 4, 0)


@pytest.mark.parametrize("backend", ["single"])
def test_a_deleted_topics_offsets_leave_the_total_lag_known(cli, make_coordinator,
                                                            redis_client, namespace):
    """Kafka deletes a topic's committed offsets with it, so its describe never shows them;
    rcoord keeps them until delete-offsets, and their unknown LAG made the TOTAL-LAG '>=N'
    (null in JSON) for good, though they are behind nothing. They are shown, left out of the
    total, and a note says how to remove them."""
    coord = make_coordinator()
    topics = Topics(redis_client, namespace)
    topics.create("orders", 1)
    topics.create("old", 2)
    produce(redis_client, namespace, "orders", {0: 9})
    errors = coord.commit_offsets("g", {TopicPartition("orders", 0): 4,
                                        TopicPartition("old", 0): 1,
                                        TopicPartition("old", 1): 2})
    assert set(errors.values()) == {Errors.NONE}
    topics.delete("old")
    res = ok(cli("groups", "describe", "g"))
    assert rows(res.stdout, "GROUP  STATE")[0][5] == "5"
    assert [r[1:6] for r in rows(res.stdout, "GROUP  TOPIC")] == [
        ["old", "0", "1", "-", "-"], ["old", "1", "2", "-", "-"], ["orders", "0", "4", "9", "5"]]
    assert ("note: topic 'old' does not exist (any more); its committed offsets are not in "
            "TOTAL-LAG (remove them with: groups delete-offsets g --topic old:0,1)") in res.stderr
    doc = json.loads(ok(cli("groups", "describe", "g", "--output", "json")).stdout)
    assert (doc["total_lag"], doc["known_lag"], doc["lag_unknown_partitions"]) == (5, 5, 0)
    assert len(doc["partitions"]) == 3


def test_describe_leaves_out_offsets_committed_to_a_deleted_topic(cli, make_coordinator,
                                                                   redis_client, namespace):
    # Kafka deletes a topic's committed offsets with it. Before, the old topic's offset 50
    # stood against the new topic's log end 10: a lag of -40.
    coord = make_coordinator()
    topics = Topics(redis_client, namespace)
    topics.create("orders", 1)
    coord.commit_offsets("idle", {TopicPartition("orders", 0): 50})
    topics.delete("orders")
    topics.create("orders", 1)
    produce(redis_client, namespace, "orders", {0: 10})
    res = ok(cli("groups", "describe", "idle"))
    assert "orders" not in res.stdout, res.stdout
    wait_for_the_next_ms(redis_client, topics.describe("orders").created_ms)
    coord.commit_offsets("idle", {TopicPartition("orders", 0): 4})
    res = ok(cli("groups", "describe", "idle"))
    assert rows(res.stdout, "GROUP  TOPIC") == [["idle", "orders", "0", "4", "10", "6", "-", "-",
                                                 "-"]]


def test_describe_an_unknown_group(cli):
    res = cli("groups", "describe", "nobody")
    assert res.returncode == 1
    assert "consumer group 'nobody' does not exist" in one_error_line(res, "groups describe")


@pytest.mark.parametrize("backend", ["single"])
def test_a_namespace_nothing_used_is_named_and_not_written_to(url, namespace, redis_client,
                                                             reset_setup):
    """A mistyped ``--namespace``: the commands that only read say so and write nothing (they
    used to establish its settings, 67 keys, and answer as for an empty namespace); a reset's
    dry run too, while ``--execute`` may set a new group's first offsets anywhere."""
    typo = namespace + "-typo"

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return run_in_process([*args, "--redis-url", url, "--namespace", typo])

    for args in (["groups", "list"], ["groups", "describe", "g"], ["groups", "delete", "g"],
                 ["groups", "delete-offsets", "g", "--topic", "t:0"],
                 ["groups", "reset-offsets", "g", "--all-topics", "--to-earliest"]):
        res = run(*args)
        assert res.returncode == 1, args
        assert (f"namespace '{typo}' has no rcoord settings"
                in one_error_line(res, " ".join(args[:2]))
                and "is --namespace" in res.stderr), args
    assert redis_client.keys(f"{typo}:*") == []
    # --execute may set a new group's first offsets there, but in a namespace with nothing in
    # it any reset fails, and as the dry run does (naming the namespace), writing nothing: it
    # used to establish the settings first.
    for args in (["--topic", "t"], ["--all-topics"]):
        res = run("groups", "reset-offsets", "g", *args, "--to-earliest", "--execute")
        assert res.returncode == 1, args
        assert (f"namespace '{typo}' has no rcoord settings and no topics"
                in one_error_line(res, "groups reset-offsets")), args
    assert redis_client.keys(f"{typo}:*") == []
    # A namespace that only holds a topic: the reset sets the group's first offsets.
    Topics(redis_client, typo).create("t", 1)
    produce(redis_client, typo, "t", {0: 3})
    res = run("groups", "reset-offsets", "g", "--topic", "t", "--to-latest", "--execute")
    assert res.returncode == 0, res.stderr
    res = run("groups", "describe", "g", "--output", "json")
    assert res.returncode == 0, res.stderr
    assert [p["current_offset"] for p in json.loads(res.stdout)["partitions"]] == [3]
    # The real namespace answers as before.
    res = run_in_process(["groups", "list", "--redis-url", url, "--namespace", namespace])
    assert res.returncode == 0 and "g" in res.stdout.split()


@pytest.mark.parametrize("backend", ["single"])
def test_a_dry_run_plans_what_execute_commits_where_only_topics_were_made(url, namespace,
                                                                         redis_client):
    """A namespace ``topics create`` made and no coordinator used: the dry run refused, saying
    nothing had used the namespace, while --execute committed. Now it plans the rows
    --execute commits, writes nothing (not the settings either), and says that --execute
    fixes the settings; the commands that read or remove groups find none."""
    fresh = namespace + "-fresh"

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return run_in_process([*args, "--redis-url", url, "--namespace", fresh])

    Topics(redis_client, fresh).create("orders", 2)
    produce(redis_client, fresh, "orders", {0: 3, 1: 1})
    before = sorted(redis_client.keys(f"{fresh}:*"))
    reset_args = ("groups", "reset-offsets", "g", "--topic", "orders", "--to-offset", "2")
    dry = run(*reset_args, "--output", "json")
    assert dry.returncode == 0, dry.stderr
    assert "--execute establishes them at the defaults (num_partitions=50)" in dry.stderr
    assert "dry run: nothing was changed" in dry.stderr
    planned = json.loads(dry.stdout)
    assert planned["executed"] is False
    assert [(p["partition"], p["current_offset"], p["new_offset"])
            for p in planned["partitions"]] == [(0, None, 2), (1, None, 1)]
    assert sorted(redis_client.keys(f"{fresh}:*")) == before  # no settings, no group
    table = ok(run(*reset_args, "--dry-run")).stdout  # the flag: the same plan
    assert rows(table, "GROUP") == [["g", "orders", "0", "-", "2"], ["g", "orders", "1", "-", "1"]]
    # The commands that read or remove groups answer as for a namespace without groups, as
    # Kafka's tool on a cluster without groups (``groups list`` failed there, exit 1).
    listed = ok(run("groups", "list", "--output", "json"))
    assert json.loads(listed.stdout) == []
    for args, said in ((("groups", "describe", "g"), "consumer group 'g' does not exist"),
                       (("groups", "delete", "g"), "GROUP_ID_NOT_FOUND (no such group)"),
                       (("groups", "delete-offsets", "g", "--topic", "orders"),
                        "consumer group 'g' does not exist")):
        res = run(*args)
        assert res.returncode == 1 and said in one_error_line(res, " ".join(args[:2])), res.stderr
    assert sorted(redis_client.keys(f"{fresh}:*")) == before

    done = run(*reset_args, "--execute", "--output", "json")
    assert done.returncode == 0, done.stderr
    assert "this commit establishes them at the defaults" in done.stderr
    executed = json.loads(done.stdout)
    assert executed["executed"] is True
    assert executed["partitions"] == planned["partitions"]
    # Settled now: a dry run reads the group as before, and says nothing of the settings.
    again = run(*reset_args, "--output", "json")
    assert again.returncode == 0, again.stderr
    assert "establishes" not in again.stderr
    assert [(p["current_offset"], p["new_offset"])
            for p in json.loads(again.stdout)["partitions"]] == [(2, 2), (1, 1)]


@pytest.mark.parametrize("backend", ["single"])
def test_python_m_rcoord_answers_as_main_does(cli, url, namespace, redis_client):
    """The one check that the in-process runner stands for the real command: ``python -m
    rcoord`` in a subprocess gives the same exit status, stdout and stderr, for a table, JSON
    and an error."""
    Topics(redis_client, namespace).create("t", 2)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RCOORD_")}
    env["PYTHONPATH"] = str(ROOT)
    for args in (["groups", "list"], ["groups", "list", "--output", "json"],
                 ["groups", "describe", "nobody"], ["topics", "describe", "t"],
                 ["groups", "list", "--state", "sleepy"]):
        real = subprocess.run(
            [sys.executable, "-m", "rcoord", *args, "--redis-url", url, "--namespace", namespace],
            env=env, capture_output=True, text=True, timeout=120, check=False)
        here = cli(*args)
        assert (real.returncode, real.stdout, real.stderr) == (
            here.returncode, here.stdout, here.stderr), args


# -- reset-offsets ----------------------------------------------------------------------------


@pytest.fixture
def reset_setup(make_coordinator, redis_client, namespace):
    """Group ``g`` (Empty) at offsets 4 and 3 of topic ``t``. Partition 0: 10 records, one a
    minute from 2024-01-01T00:00Z, retention keeping 8 (log start 2); partition 1: 5 records."""
    coord = make_coordinator()
    topics = Topics(redis_client, namespace)
    topics.create("t", 2, retention_records=8)
    produce(redis_client, namespace, "t", {0: 10, 1: 5},
            stamps=[T0 + i * 60_000 for i in range(10)])
    assert topics.apply_retention("t") == {0: 2, 1: 0}
    coord.commit_offsets("g", {TopicPartition("t", 0): 4, TopicPartition("t", 1): 3})
    return coord


def reset(cli, *args: str) -> tuple[list[list[str]], str]:
    res = ok(cli("groups", "reset-offsets", "g", *args))
    return rows(res.stdout, "GROUP"), res.stderr


def test_reset_offsets_to_current(cli, reset_setup):
    """``--to-current`` (Kafka's): the committed offset where there is one, else the log end,
    with a note; it was refused as an unrecognized option."""
    coord = reset_setup
    ok(cli("groups", "delete-offsets", "g", "--topic", "t:1"))
    plan_rows, err = reset(cli, "--topic", "t", "--to-current", "--execute")
    assert plan_rows == [["g", "t", "0", "4", "4"], ["g", "t", "1", "-", "5"]]
    assert "t-1: no committed offset: the log end" in err
    assert committed(coord, "g") == {("t", 0): 4, ("t", 1): 5}


def test_reset_offsets_to_current_keeps_a_committed_offset_out_of_range(cli, reset_setup):
    """A committed offset below the log start (retention removed its records) stays as it
    is: Kafka's ``resetToCurrent`` commits it unchecked, so ``--all-topics --to-current`` gives
    the uncommitted partitions an offset and changes nothing else. It was clamped to the log
    start, moving what the group resumes from (and hiding an out-of-range from a consumer with
    ``auto.offset.reset=none``)."""
    coord = reset_setup
    coord.commit_offsets("g", {TopicPartition("t", 0): 1})  # log start is 2
    plan_rows, err = reset(cli, "--topic", "t", "--to-current", "--execute")
    assert plan_rows == [["g", "t", "0", "1", "1"], ["g", "t", "1", "3", "3"]]
    assert "t-0: 1 is outside the log's offsets [2, 10]; kept, as committed" in err
    assert committed(coord, "g") == {("t", 0): 1, ("t", 1): 3}


def test_a_change_larger_than_one_request_is_refused_before_any_write(cli, reset_setup,
                                                                      monkeypatch):
    """More partitions than one request may change (10,000; 1 here) is refused up front with
    what to do, and nothing changes; before, the call failed with the API's "offsets has N
    items" as if the input were wrong (exit 2). A dry run still shows the plan, and says that
    --execute would refuse it (it said nothing)."""
    from rcoord.protocol import _checks

    coord = reset_setup
    monkeypatch.setattr(_checks, "MAX_ITEMS_PER_CALL", 1)
    plan_rows, err = reset(cli, "--topic", "t", "--to-earliest")
    assert plan_rows == [["g", "t", "0", "4", "2"], ["g", "t", "1", "3", "0"]]
    assert ("note: --execute would refuse this plan: the reset covers 2 partitions, more than "
            "the 1 one request may change") in err
    for args in (["reset-offsets", "g", "--topic", "t", "--to-earliest", "--execute"],
                 ["delete-offsets", "g", "--topic", "t"]):
        res = cli("groups", *args)
        assert res.returncode == 1
        assert ("covers 2 partitions, more than the 1 one request may change; nothing was "
                "changed. Name fewer with --topic") in one_error_line(res, f"groups {args[0]}")
    assert committed(coord, "g") == {("t", 0): 4, ("t", 1): 3}


def test_reset_offsets_export_and_from_file(cli, reset_setup, tmp_path):
    """Kafka's ``--export`` prints the plan as ``topic,partition,offset`` lines, and
    ``--from-file`` resets to a file of them (or of ``group,topic,partition,offset`` lines, the
    other groups' skipped), clamped into the log as every mode; a file that does not parse, or
    that has nothing for the group, changes nothing. A file naming a topic that does not exist
    says so, naming the file (it said "has no partition 0 (any more)" of a misspelt topic)."""
    coord = reset_setup
    res = ok(cli("groups", "reset-offsets", "g", "--topic", "t", "--to-earliest", "--export"))
    assert res.stdout == "t,0,2\nt,1,0\n"
    assert committed(coord, "g") == {("t", 0): 4, ("t", 1): 3}
    plan_file = tmp_path / "plan.csv"
    plan_file.write_text(res.stdout)
    _, err = reset(cli, "--from-file", str(plan_file), "--execute")
    assert committed(coord, "g") == {("t", 0): 2, ("t", 1): 0}

    plan_file.write_text("other,t,0,9\ng,t,1,99\n\ng,t,0,1\n")
    plan_rows, err = reset(cli, "--from-file", str(plan_file), "--execute")
    assert plan_rows == [["g", "t", "0", "2", "2"], ["g", "t", "1", "0", "5"]]
    assert "t-1: 99 is above the log end offset; clamped to 5" in err
    assert "t-0: 1 is below the log start offset; clamped to 2" in err
    assert committed(coord, "g") == {("t", 0): 2, ("t", 1): 5}

    for text, code, says in (
        ("t,0,1\nt,x,1\n", 2, "line 2: the partition and offset must be integers"),
        ("t,0,1\nt,0,2\n", 2, "line 2: t-0 was given on line 1 already"),
        ("t,0\n", 2, "line 1: expected topic,partition,offset"),
        ("t,0,-1\n", 2, "must be >= 0"),
        ("other,t,0,1\n", 1, "has no offsets for group 'g'; nothing was changed"),
        ("t,7,1\n", 1, "has no partition 7 (any more); nothing was changed"),
        ("nope,0,1\n", 1, "topic 'nope' named in --from-file "),
        ("nope,0,1\n", 1, "does not exist (any more); nothing was changed"),
    ):
        plan_file.write_text(text)
        res = cli("groups", "reset-offsets", "g", "--from-file", str(plan_file), "--execute")
        assert res.returncode == code and says in one_error_line(
            res, "groups reset-offsets"), (text, res.stderr)
    res = cli("groups", "reset-offsets", "g", "--from-file", str(tmp_path / "missing.csv"))
    assert res.returncode == 1 and "cannot read --from-file" in res.stderr
    res = cli("groups", "reset-offsets", "g", "--topic", "t", "--from-file", str(plan_file))
    assert res.returncode == 2 and "leave out --topic and --all-topics" in res.stderr
    res = cli("groups", "reset-offsets", "g", "--to-earliest")
    assert res.returncode == 2 and "--topic --all-topics is required" in res.stderr
    assert committed(coord, "g") == {("t", 0): 2, ("t", 1): 5}


def test_reset_offsets_from_file_reads_every_line_in_the_first_lines_format(cli, reset_setup,
                                                                              tmp_path):
    """A ``--from-file`` plan is read in its first line's format, every line of it, as
    Kafka's reader does: a line with a field too many in a ``topic,partition,offset`` file
    (``t,1,1,9``) was taken for another group's line and skipped, so ``--execute`` reset t-0,
    left t-1 where it was and exited 0; it is a usage error naming the line, and nothing
    changes. A trailing comma is no field, as Kafka's CSV reader takes it (such a file was
    all "other groups'" lines: "no offsets for group"). A dry run of a file writes nothing."""
    coord = reset_setup
    plan_file = tmp_path / "plan.csv"
    for text, says in (
        ("t,0,3\nt,1,1,9\n", ("line 2: expected topic,partition,offset, the format of the "
                               "file's first line, got 't,1,1,9'")),
        ("g,t,0,3\nt,1,1\n", ("line 2: expected group,topic,partition,offset, the format of "
                              "the file's first line")),
    ):
        plan_file.write_text(text)
        res = cli("groups", "reset-offsets", "g", "--from-file", str(plan_file), "--execute")
        assert res.returncode == 2 and says in one_error_line(
            res, "groups reset-offsets"), (text, res.stderr)
        assert committed(coord, "g") == {("t", 0): 4, ("t", 1): 3}
    plan_file.write_text("t,0,3,\nt,1,1,\n")
    plan_rows, err = reset(cli, "--from-file", str(plan_file))
    assert plan_rows == [["g", "t", "0", "4", "3"], ["g", "t", "1", "3", "1"]]
    assert "dry run: nothing was changed" in err
    assert committed(coord, "g") == {("t", 0): 4, ("t", 1): 3}
    reset(cli, "--from-file", str(plan_file), "--execute")
    assert committed(coord, "g") == {("t", 0): 3, ("t", 1): 1}


@pytest.mark.parametrize("number", ["1_0", "+3", "\u0663", "0x1", "1.0"])
def test_reset_offsets_from_file_takes_only_ascii_digits(number):
    """A plan's partition and offset are plain digits: ``int()`` took ``1_0`` as 10, ``+3``
    and Arabic-Indic digits (``\u0663`` as 3), which Kafka's reader refuses; a plan typed
    with a slip reset a partition to an offset nobody wrote. Each is a usage error naming
    the line, for the partition as for the offset."""
    for line in (f"t,0,{number}\n", f"t,{number},5\n"):
        with pytest.raises(UsageError, match=r"plan\.csv, line 1: the partition and offset "
                                             r"must be integers"):
            parse_reset_file(line, "g", "plan.csv")
    assert parse_reset_file("t,0,10\nt,1, 7 \n", "g", "plan.csv") == {
        TopicPartition("t", 0): 10, TopicPartition("t", 1): 7}


def test_reset_offsets_from_file_reads_quoted_csv_fields(cli, reset_setup, tmp_path):
    """``--from-file`` reads CSV as Kafka's reader does, quotes included: Kafka's writer
    quotes a group id with a comma in it (``"eu,orders",t,0,3``), and such a plan was refused
    as a line of five fields. An unclosed quote is a usage error naming its line."""
    coord = reset_setup
    coord.commit_offsets("eu,orders", {TopicPartition("t", 0): 4})
    plan_file = tmp_path / "plan.csv"
    plan_file.write_text('"eu,orders",t,0,3\ng,t,0,1\n"eu,orders","t",1,2\n')
    res = ok(cli("groups", "reset-offsets", "eu,orders", "--from-file", str(plan_file),
                 "--execute"))
    assert rows(res.stdout, "GROUP") == [["eu,orders", "t", "0", "4", "3"],
                                         ["eu,orders", "t", "1", "-", "2"]]
    assert committed(coord, "eu,orders") == {("t", 0): 3, ("t", 1): 2}
    plan_file.write_text('"eu,orders,t,0,3\n')
    res = cli("groups", "reset-offsets", "eu,orders", "--from-file", str(plan_file),
              "--execute")
    assert res.returncode == 2 and "line 1: not a CSV line" in one_error_line(
        res, "groups reset-offsets")
    assert committed(coord, "eu,orders") == {("t", 0): 3, ("t", 1): 2}


def test_reset_offsets_from_file_with_a_byte_order_mark(cli, reset_setup, tmp_path):
    """A plan saved with a UTF-8 byte order mark (Excel's "CSV UTF-8", Windows PowerShell's
    ``Out-File -Encoding utf8``) is read as without one. The mark was read as the first
    field's first character: in a ``group,topic,partition,offset`` file the first line then
    named group "\\ufeffg" and was skipped as another group's, so the reset committed the
    other lines and left that partition where it was, without a word."""
    coord = reset_setup
    plan_file = tmp_path / "plan.csv"
    plan_file.write_bytes(b"\xef\xbb\xbfg,t,0,3\ng,t,1,1\n")
    res = ok(cli("groups", "reset-offsets", "g", "--from-file", str(plan_file), "--execute"))
    assert rows(res.stdout, "GROUP") == [["g", "t", "0", "4", "3"], ["g", "t", "1", "3", "1"]]
    assert committed(coord, "g") == {("t", 0): 3, ("t", 1): 1}
    plan_file.write_bytes(b"\xef\xbb\xbft,0,5\n")  # (the topic read as "\\ufefft": none)
    ok(cli("groups", "reset-offsets", "g", "--from-file", str(plan_file), "--execute"))
    assert committed(coord, "g") == {("t", 0): 5, ("t", 1): 1}


def test_reset_offsets_every_mode(cli, reset_setup):
    coord = reset_setup
    # The default is a dry run: the plan is shown, nothing changes.
    plan_rows, err = reset(cli, "--topic", "t", "--to-earliest")
    assert plan_rows == [["g", "t", "0", "4", "2"], ["g", "t", "1", "3", "0"]]
    assert "dry run: nothing was changed; add --execute" in err
    assert committed(coord, "g") == {("t", 0): 4, ("t", 1): 3}
    reset(cli, "--topic", "t", "--to-earliest", "--dry-run")
    assert committed(coord, "g") == {("t", 0): 4, ("t", 1): 3}

    _, err = reset(cli, "--topic", "t", "--to-earliest", "--execute")
    assert committed(coord, "g") == {("t", 0): 2, ("t", 1): 0}
    assert "committed 2 offsets of group 'g'" in err
    reset(cli, "--topic", "t", "--to-latest", "--execute")
    assert committed(coord, "g") == {("t", 0): 10, ("t", 1): 5}

    # --to-offset, clamped into [log start, log end] with a note, as Kafka does.
    _, err = reset(cli, "--topic", "t", "--to-offset", "7", "--execute")
    assert committed(coord, "g") == {("t", 0): 7, ("t", 1): 5}
    assert "t-1: 7 is above the log end offset; clamped to 5" in err
    _, err = reset(cli, "--topic", "t:0", "--to-offset", "0", "--execute")
    assert committed(coord, "g") == {("t", 0): 2, ("t", 1): 5}
    assert "t-0: 0 is below the log start offset; clamped to 2" in err

    # --shift-by, both signs, from the committed offsets (and clamped).
    reset(cli, "--topic", "t", "--shift-by", "3", "--execute")
    assert committed(coord, "g") == {("t", 0): 5, ("t", 1): 5}
    reset(cli, "--topic", "t", "--shift-by", "-2", "--execute")
    assert committed(coord, "g") == {("t", 0): 3, ("t", 1): 3}
    _, err = reset(cli, "--topic", "t", "--shift-by", "-100", "--execute")
    assert committed(coord, "g") == {("t", 0): 2, ("t", 1): 0}
    assert "t-0: -97 is below the log start offset; clamped to 2" in err

    # --to-datetime: the first record at or after it (partition 1's records are at T0..T0+4m).
    plan_rows, _ = reset(cli, "--topic", "t", "--to-datetime", "2024-01-01T00:03:30.000Z",
                         "--execute")
    assert plan_rows == [["g", "t", "0", "2", "4"], ["g", "t", "1", "0", "4"]]
    assert committed(coord, "g") == {("t", 0): 4, ("t", 1): 4}
    plan_rows, _ = reset(cli, "--topic", "t", "--to-datetime", "2024-01-01T01:03:30.000+01:00")
    assert [r[4] for r in plan_rows] == ["4", "4"]  # the same instant in another zone
    _, err = reset(cli, "--topic", "t", "--to-datetime", "2024-01-01T00:07:00.000Z", "--execute")
    assert committed(coord, "g") == {("t", 0): 7, ("t", 1): 5}
    assert "t-1: no record at or after that time: the log end" in err

    # JSON: the plan with its log offsets and notes.
    res = ok(cli("groups", "reset-offsets", "g", "--topic", "t", "--to-offset", "9",
                 "--output", "json"))
    doc = json.loads(res.stdout)
    assert doc["executed"] is False
    assert doc["partitions"] == [
        {"group": "g", "topic": "t", "partition": 0, "current_offset": 7, "new_offset": 9,
         "log_start_offset": 2, "log_end_offset": 10, "requested_offset": 9, "note": None},
        {"group": "g", "topic": "t", "partition": 1, "current_offset": 5, "new_offset": 5,
         "log_start_offset": 0, "log_end_offset": 5, "requested_offset": 9,
         "note": "9 is above the log end offset; clamped to 5"},
    ]
    assert committed(coord, "g") == {("t", 0): 7, ("t", 1): 5}


def test_reset_by_duration_uses_the_servers_clock(cli, make_coordinator, redis_client,
                                                  namespace):
    coord = make_coordinator()
    Topics(redis_client, namespace).create("t", 1)
    secs, micros = redis_client.time()
    now = int(secs) * 1000 + int(micros) // 1000
    minute = 60_000
    produce(redis_client, namespace, "t", {0: 5}, stamps=[now - k * 10 * minute
                                                          for k in (5, 4, 3, 2, 1)])
    coord.commit_offsets("g", {TopicPartition("t", 0): 0})
    plan_rows, _ = reset(cli, "--topic", "t", "--by-duration", "PT25M", "--execute")
    assert plan_rows == [["g", "t", "0", "0", "3"]]  # the record of 20 minutes ago
    assert committed(coord, "g") == {("t", 0): 3}
    reset(cli, "--all-topics", "--by-duration", "P1D", "--execute")
    assert committed(coord, "g") == {("t", 0): 0}
    res = ok(cli("groups", "reset-offsets", "g", "--topic", "t", "--by-duration", "PT1M",
                 "--output", "json"))
    assert json.loads(res.stdout)["partitions"][0]["new_offset"] == 5  # none that recent
    # A negative duration (the future) is a value, written apart or with '=', as Java's
    # Duration.parse reads it: no record is that recent. Also after the flag abbreviated, as
    # argparse takes every long option (it was refused as an unknown -P).
    for args in (["--by-duration", "-PT1H"], ["--by-duration=-PT1H"], ["--by-dur", "-PT1H"]):
        res = ok(cli("groups", "reset-offsets", "g", "--topic", "t", *args, "--output", "json"))
        assert json.loads(res.stdout)["partitions"][0]["new_offset"] == 5, args


def test_reset_refuses_a_group_with_members(cli, make_coordinator, redis_client, namespace,
                                            pool, url):
    coord = make_coordinator()
    Topics(redis_client, namespace).create("t", 2)
    produce(redis_client, namespace, "t", {0: 4, 1: 4})
    gen, ids = stable_group(coord, pool, "g", "t", {"a": [0, 1]})
    coord.commit_offsets("g", {TopicPartition("t", 0): 1}, member_id=ids["a"],
                         generation_id=gen)
    for run in ("--dry-run", "--execute"):
        res = cli("groups", "reset-offsets", "g", "--topic", "t", "--to-latest", run)
        line = one_error_line(res, "groups reset-offsets")
        assert res.returncode == 1
        assert ("Assignments can only be reset if the group 'g' is inactive, but the current "
                "state is Stable.") in line
    assert committed(coord, "g") == {("t", 0): 1}
    # Past the state check (a member joined after it): the commit itself is refused, by the
    # coordinator's simple-commit path, and nothing is written.
    ctx = Context(argparse.Namespace(namespace=namespace, output="table"),
                  "rcoord groups reset-offsets", url, client=redis_client)
    tp0 = TopicPartition("t", 0)
    with pytest.raises(Failure, match="has members now .UNKNOWN_MEMBER_ID"):
        _commit(ctx, "g", [Row(tp0, 1, 0, 4, 4, 4)])
    assert committed(coord, "g") == {("t", 0): 1}


# -- delete and delete-offsets ----------------------------------------------------------------


def test_delete_refuses_a_group_with_members(cli, make_coordinator, redis_client, namespace,
                                             pool):
    coord = make_coordinator()
    Topics(redis_client, namespace).create("t", 1)
    stable_group(coord, pool, "live", "t", {"a": [0]})
    coord.commit_offsets("old", {TopicPartition("t", 0): 0})
    coord.commit_offsets("older", {TopicPartition("t", 0): 0})
    res = cli("groups", "delete", "live")
    line = one_error_line(res, "groups delete")
    assert res.returncode == 1
    assert "group 'live' could not be deleted: NON_EMPTY_GROUP" in line
    assert coord.describe_group("live").state == "Stable"
    res = ok(cli("groups", "delete", "old"))
    assert res.stdout.strip() == "Deletion of requested consumer groups ('old') was successful."
    res = cli("groups", "delete", "older", "live", "--output", "json")
    assert res.returncode == 1
    assert json.loads(res.stdout) == {"deleted": ["older"], "failed": {"live": "NON_EMPTY_GROUP"}}
    assert "NON_EMPTY_GROUP" in one_error_line(res, "groups delete")
    assert {g.group_id for g in coord.list_groups()} == {"live"}


def test_offsets_under_a_name_with_a_colon_can_be_deleted(cli, make_coordinator):
    """A group may commit for names that are not rcoord topics, colons included: ``--topic``
    takes the partitions after the last colon, so the command the reset suggests for them
    works. Before, ``files:2026:0`` was topic ``files`` with partitions ``2026:0``: "partitions
    must be numbers", and the offset stayed."""
    coord = make_coordinator()
    coord.commit_offsets("g", {TopicPartition("files:2026", 0): 7,
                               TopicPartition("files:2026", 1): 7})
    res = ok(cli("groups", "delete-offsets", "g", "--topic", "files:2026:0"))
    assert rows(res.stdout, "TOPIC") == [["files:2026", "0", "Successful"]]
    assert committed(coord, "g") == {("files:2026", 1): 7}
    assert parse_topics(["t", "t:0,2", "a:b:3"]) == [("t", None), ("t", [0, 2]), ("a:b", [3])]


def test_delete_offsets(cli, make_coordinator, redis_client, namespace, pool):
    coord = make_coordinator()
    topics = Topics(redis_client, namespace)
    topics.create("a", 2)
    topics.create("b", 1)
    offsets = {TopicPartition("a", 0): 1, TopicPartition("a", 1): 1, TopicPartition("b", 0): 1}
    coord.commit_offsets("g", offsets)
    res = ok(cli("groups", "delete-offsets", "g", "--topic", "a:1"))
    assert rows(res.stdout, "TOPIC") == [["a", "1", "Successful"]]
    res = ok(cli("groups", "delete-offsets", "g", "--topic", "a", "--output", "json"))
    assert json.loads(res.stdout) == [{"topic": "a", "partition": 0, "error": None},
                                      {"topic": "a", "partition": 1, "error": None}]
    assert committed(coord, "g") == {("b", 0): 1}
    # A member subscribed to the topic: refused per partition, in one line.
    gen, ids = stable_group(coord, pool, "live", "b", {"m": [0]})
    coord.commit_offsets("live", {TopicPartition("b", 0): 1}, member_id=ids["m"],
                         generation_id=gen)
    res = cli("groups", "delete-offsets", "live", "--topic", "b")
    assert res.returncode == 1
    assert rows(res.stdout, "TOPIC") == [["b", "0", "Error:", "GROUP_SUBSCRIBED_TO_TOPIC"]]
    assert "GROUP_SUBSCRIBED_TO_TOPIC" in one_error_line(res, "groups delete-offsets")
    assert committed(coord, "live") == {("b", 0): 1}
    res = cli("groups", "delete-offsets", "nobody", "--topic", "b")
    assert "consumer group 'nobody' does not exist (GROUP_ID_NOT_FOUND)" in one_error_line(
        res, "groups delete-offsets")


def test_offsets_of_a_deleted_topic_are_left_out_of_a_reset_and_can_be_deleted(
        cli, make_coordinator, redis_client, namespace):
    """Offsets outlive their topic: --all-topics resets the others and notes the deleted one;
    delete-offsets removes them when their partitions are named (as Kafka's broker, which
    does not check the topic), and says how when only the topic is named."""
    coord = make_coordinator()
    topics = Topics(redis_client, namespace)
    topics.create("x", 2)
    topics.create("y", 1)
    produce(redis_client, namespace, "y", {0: 5})
    coord.commit_offsets("g", {TopicPartition("x", 0): 1, TopicPartition("x", 1): 1,
                               TopicPartition("y", 0): 1})
    topics.delete("x")
    res = ok(cli("groups", "reset-offsets", "g", "--all-topics", "--to-latest", "--execute"))
    assert [r[:5] for r in rows(res.stdout, "GROUP")] == [["g", "y", "0", "1", "5"]]
    assert "topic 'x' does not exist (any more)" in res.stderr
    assert "delete-offsets g --topic x:0,1" in res.stderr
    assert committed(coord, "g") == {("x", 0): 1, ("x", 1): 1, ("y", 0): 5}
    res = cli("groups", "delete-offsets", "g", "--topic", "x")
    assert res.returncode == 1
    assert "name its partitions, e.g. --topic x:0" in one_error_line(res, "groups delete-offsets")
    res = ok(cli("groups", "delete-offsets", "g", "--topic", "x:0,1"))
    assert rows(res.stdout, "TOPIC") == [["x", "0", "Successful"], ["x", "1", "Successful"]]
    assert committed(coord, "g") == {("y", 0): 5}


def test_offsets_of_partitions_past_the_count_are_left_out_of_a_reset_and_can_be_deleted(
        cli, make_coordinator, redis_client, namespace):
    """The group has offsets of partitions 2 and 3 of a topic that now has 2 (created again
    with fewer, or a simple commit named them). Before, reset-offsets --all-topics failed on
    them ("no partition 2 (any more)") and delete-offsets refused to name them ("there is no
    partition 2"), so nothing could remove them; Kafka's broker deletes named partitions'
    offsets without checking the topic."""
    coord = make_coordinator()
    Topics(redis_client, namespace).create("t", 2)
    produce(redis_client, namespace, "t", {0: 5, 1: 5})
    coord.commit_offsets("g", {TopicPartition("t", p): 1 for p in range(4)})
    res = ok(cli("groups", "reset-offsets", "g", "--all-topics", "--to-latest", "--execute"))
    assert [r[:5] for r in rows(res.stdout, "GROUP")] == [["g", "t", "0", "1", "5"],
                                                          ["g", "t", "1", "1", "5"]]
    assert "topic 't' has no partition 2,3 (any more)" in res.stderr
    assert "delete-offsets g --topic t:2,3" in res.stderr
    assert committed(coord, "g") == {("t", 0): 5, ("t", 1): 5, ("t", 2): 1, ("t", 3): 1}
    res = cli("groups", "reset-offsets", "g", "--topic", "t:2", "--to-latest", "--execute")
    assert res.returncode == 1  # named alone, it is still an error: nothing to reset to
    assert "topic 't' has 2 partitions; there is no partition 2" in one_error_line(
        res, "groups reset-offsets")
    res = ok(cli("groups", "delete-offsets", "g", "--topic", "t:2,3"))
    assert rows(res.stdout, "TOPIC") == [["t", "2", "Successful"], ["t", "3", "Successful"]]
    assert committed(coord, "g") == {("t", 0): 5, ("t", 1): 5}


def test_offsets_of_a_name_that_is_no_topic_do_not_stop_the_others(
        cli, make_coordinator, redis_client, namespace):
    """A group commits offsets of any source's partitions, under names rcoord's topics refuse
    ('/' is not in Kafka's topic alphabet): describe shows them without a log end, a reset of
    all topics leaves them out, and delete-offsets removes them."""
    coord = make_coordinator()
    Topics(redis_client, namespace).create("y", 1)
    produce(redis_client, namespace, "y", {0: 5})
    errors = coord.commit_offsets("g", {TopicPartition("files/2026", 0): 7,
                                        TopicPartition("y", 0): 1})
    assert set(errors.values()) == {Errors.NONE}

    res = ok(cli("groups", "describe", "g"))
    assert rows(res.stdout, "GROUP  TOPIC") == [
        ["g", "files/2026", "0", "7", "-", "-", "-", "-", "-"],
        ["g", "y", "0", "1", "5", "4", "-", "-", "-"]]
    res = ok(cli("groups", "reset-offsets", "g", "--all-topics", "--to-latest", "--execute"))
    assert [r[:5] for r in rows(res.stdout, "GROUP")] == [["g", "y", "0", "1", "5"]]
    assert "delete-offsets g --topic files/2026:0" in res.stderr
    assert committed(coord, "g") == {("files/2026", 0): 7, ("y", 0): 5}
    res = ok(cli("groups", "delete-offsets", "g", "--topic", "files/2026:0"))
    assert rows(res.stdout, "TOPIC") == [["files/2026", "0", "Successful"]]
    assert committed(coord, "g") == {("y", 0): 5}


# -- bad input --------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["single"])
@pytest.mark.parametrize(("args", "code", "says"), [
    (["list", "--state", "sleepy"], 2, "--state 'sleepy' is not a group state"),
    (["reset-offsets", "g", "--topic", "t", "--by-duration", "1h"], 2,
     "--by-duration '1h' is not a duration"),
    (["reset-offsets", "g", "--topic", "t", "--to-datetime", "yesterday"], 2,
     "--to-datetime 'yesterday' is not an ISO-8601 date-time"),
    (["reset-offsets", "g", "--topic", "t:x", "--to-earliest"], 2,
     "partitions must be numbers"),
    (["reset-offsets", "g", "--topic", "t", "--to-earliest", "--to-latest"], 2,
     "not allowed with argument"),
    (["reset-offsets", "g", "--topic", "t"], 2, "one of the arguments --to-earliest"),
    (["reset-offsets", "g", "--topic", "t", "--to-offset", "-1"], 2, "--to-offset must be >= 0"),
    (["reset-offsets", "g", "--topic", "t", "--shift-by", "1"], 1,
     "cannot shift the offset of t-0: the group has no committed offset"),
    (["reset-offsets", "g", "--topic", "t:3", "--to-earliest"], 1,
     "topic 't' has 1 partitions; there is no partition 3"),
    (["reset-offsets", "g", "--topic", "nope", "--to-earliest"], 1,
     "UNKNOWN_TOPIC_OR_PARTITION: nope"),
    (["describe", "g", "--output", "yaml"], 2, "invalid choice: 'yaml'"),
])
def test_bad_input_is_one_line(cli, redis_client, namespace, args, code, says):
    Topics(redis_client, namespace).create("t", 1)
    res = cli("groups", *args)
    line = one_error_line(res, f"groups {args[0]}")
    assert res.returncode == code, line
    assert says in line


def test_parse_duration_and_datetime(monkeypatch):
    assert parse_duration("P1D") == 86_400_000
    assert parse_duration("PT2H30M") == 9_000_000
    assert parse_duration("pt0.5s") == 500
    assert parse_duration("P1DT1S") == 86_401_000
    assert parse_duration("-PT1M") == -60_000
    for bad in ("P", "PT", "1H", "P1H", "PT1D", "P1DT"):
        with pytest.raises(UsageError):
            parse_duration(bad)
    assert parse_datetime("2024-01-01T00:00:00.000Z") == T0
    assert parse_datetime("2024-01-01T00:00:00.250+00:00") == T0 + 250
    # Exact milliseconds (a float product truncated this one to ...594 before).
    assert parse_datetime("2038-06-23T00:35:34.595Z") == 2_160_866_134_595
    assert parse_datetime("1969-12-31T23:59:59.999Z") == -1
    # Without a zone, UTC, as Kafka's Utils.getDateTime reads it, whatever the machine's zone
    # (before: the machine's).
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    try:
        assert parse_datetime("2024-01-01T12:00:00.000") == T0 + 12 * 3_600_000
    finally:
        monkeypatch.undo()
        time.tzset()


def test_plan_clamps_and_falls_back_to_the_log_end():
    tp = TopicPartition("t", 0)
    offsets = {tp: (2, 10)}
    assert plan(Mode("to_offset", 12), [tp], {}, offsets, {})[0].new == 10
    assert plan(Mode("shift_by", -5), [tp], {tp: 4}, offsets, {})[0].new == 2
    row = plan(Mode("to_datetime", 0), [tp], {}, offsets, {tp: None})[0]
    assert (row.new, row.note) == (10, "no record at or after that time: the log end")
    with pytest.raises(Failure, match="no committed offset"):
        plan(Mode("shift_by", 1), [tp], {}, offsets, {})
    # --to-current keeps a committed offset as it is, as Kafka does; only the others clamp.
    for current in (0, 12):
        assert plan(Mode("to_current", 0), [tp], {tp: current}, offsets, {})[0].new == current
    assert plan(Mode("to_current", 0), [tp], {}, offsets, {})[0].new == 10


@pytest.mark.parametrize("backend", ["single"])
def test_a_reset_of_a_partition_whose_offsets_cannot_be_read_names_why(cli, redis_client,
                                                                        namespace):
    """A partition whose stream has a last id that is not rcoord's (an XADD by hand) has no log
    offsets; ``Topics.describe`` answers that for the partition alone since 17320c7, and the
    reset took the partition for one that does not exist: "topic 'orders' has no partition 0
    (any more)" (--topic), or with --all-topics a note saying so and its offsets left out. It
    now fails naming the stream and what mends it, as before 17320c7, and changes nothing;
    ``groups describe`` still shows the group, that partition's lag unknown."""
    from rcoord.topics import partition_key

    Topics(redis_client, namespace).create("orders", 2)
    produce(redis_client, namespace, "orders", {0: 3, 1: 2})
    ok(cli("groups", "reset-offsets", "g", "--topic", "orders", "--to-earliest", "--execute"))
    redis_client.execute_command("XADD", partition_key(namespace, "orders", 0), "*", "x", "1")
    for args in (["--topic", "orders"], ["--all-topics"]):
        res = cli("groups", "reset-offsets", "g", *args, "--to-latest", "--execute")
        assert res.returncode == 1, (args, res.stderr)
        line = one_error_line(res, "groups reset-offsets")
        assert partition_key(namespace, "orders", 0) in line and "no partition" not in line, line
    # A reset of the other partition alone goes on.
    ok(cli("groups", "reset-offsets", "g", "--topic", "orders:1", "--to-offset", "1",
           "--execute"))
    res = ok(cli("groups", "describe", "g", "--output", "json"))
    doc = json.loads(res.stdout)
    assert [(p["partition"], p["current_offset"], p["lag"]) for p in doc["partitions"]] == [
        (0, 0, None), (1, 1, 1)]
    # Why that lag is unknown is said on stderr, with what mends it (it was said nowhere).
    notes = [line for line in res.stderr.splitlines()
             if partition_key(namespace, "orders", 0) in line]
    assert len(notes) == 1 and "orders-0: UNKNOWN_SERVER_ERROR" in notes[0], res.stderr
