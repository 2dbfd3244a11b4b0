"""The runnable examples in workers/ keep working (they double as documentation)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from harness import without_join_delay

from rcoord.topics import Producer, Topics

ROOT = Path(__file__).resolve().parent.parent
ENV = dict(os.environ, PYTHONPATH=str(ROOT))


def _word_count(url: str, client, namespace: str, partitions: int, line: bytes, count: int,
                *flags: str) -> list[str]:
    """Topic ``lines`` holding ``count`` copies of ``line``, and the word_count command line
    that reads it (``flags`` added)."""
    without_join_delay(client, namespace)
    Topics(client, namespace).create("lines", partitions)
    producer = Producer(client, namespace)
    for i in range(count):
        producer.send("lines", line, key=str(i).encode())
    return [sys.executable, str(ROOT / "workers" / "word_count.py"), "--redis-url", url,
            "--topic", "lines", "--namespace", namespace, *flags]


def test_word_count_worker_counts_every_record(redis_server, single_client, namespace):
    argv = _word_count(redis_server.url, single_client, namespace, 3, b"alpha beta alpha", 30,
                       "--max-records", "30")
    res = subprocess.run(argv, env=ENV, capture_output=True, text=True, timeout=60,
                         check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "records 30; top words [('alpha', 60), ('beta', 30)]" in res.stdout
    assert "assigned [0, 1, 2]" in res.stdout


def test_word_count_idle_exit_counts_only_time_holding_partitions(
        redis_server, single_client, namespace):
    # The group's first rebalance waits 3 s (group.initial.rebalance.delay.ms): idle time
    # counted from the start stopped the worker before it was assigned anything, having read
    # none of the records waiting ("records 0; top words []").
    Topics(single_client, namespace).create("lines", 2)
    producer = Producer(single_client, namespace)
    for i in range(6):
        producer.send("lines", b"gamma", key=str(i).encode())
    # (The namespace from $RCOORD_NAMESPACE, as every rcoord command reads it: the worker read
    # the group and topic of namespace 'rcoord' before, and found no topic.)
    argv = [sys.executable, str(ROOT / "workers" / "word_count.py"), "--redis-url",
            redis_server.url, "--topic", "lines", "--idle-exit-s", "1"]
    res = subprocess.run(argv, env={**ENV, "RCOORD_NAMESPACE": namespace}, capture_output=True,
                         text=True, timeout=60, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "records 6; top words [('gamma', 6)]" in res.stdout


def test_word_count_worker_commits_and_leaves_on_sigterm(redis_server, single_client, namespace):
    """``docker stop`` sends SIGTERM (and kills 10 s later): the worker commits, leaves the group
    at once and prints its summary, as a Kafka consumer closed from a shutdown hook. Before, it
    died on SIGTERM (or, as a container's PID 1, ignored it) and stayed a member for a session
    timeout with its last records uncommitted."""
    import signal

    from harness import wait_until

    from rcoord import GroupCoordinator, TopicPartition
    from rcoord.topics.fetch import log_offsets

    argv = _word_count(redis_server.url, single_client, namespace, 2, b"alpha beta", 10,
                       "--group", "wc")
    proc = subprocess.Popen(argv, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    coord = GroupCoordinator(single_client, namespace).start()
    try:
        parts = [TopicPartition("lines", p) for p in range(2)]
        ends = {tp: log_offsets(single_client, namespace, tp.topic, tp.partition)[1]
                for tp in parts}
        # The auto-commit (every second) shows the worker has read everything.
        wait_until(lambda: {tp: o.offset for tp, o in
                            coord.fetch_offsets("wc", parts).offsets.items()} == ends)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, out + err
    assert "records 10; top words [('alpha', 10), ('beta', 10)]" in out
    assert "stopped by SIGTERM; committed and left the group" in out
    assert "Traceback" not in err
    desc = coord.describe_group("wc")
    assert (desc.state, desc.members) == ("Empty", [])  # left: no session timeout to wait out


def test_clickstream_without_a_redis_url_is_a_usage_error_before_spark_starts():
    """It started Spark, then failed 12 s later behind a Java traceback naming a Spark option."""
    env = {k: v for k, v in os.environ.items() if k != "RCOORD_REDIS_URL"}
    env["PYTHONPATH"] = str(ROOT)
    res = subprocess.run(
        [sys.executable, "-m", "workers.clickstream", "--group", "clicks", "--topic", "events",
         "--out", "/nonexistent-clickstream-out"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 2, res.stderr
    assert res.stderr.splitlines()[-1].endswith(
        "no Redis to read from: give --redis-url URL or set RCOORD_REDIS_URL")
    assert "Traceback" not in res.stderr


def test_clickstream_durations_it_cannot_read_are_usage_errors_before_spark_starts():
    """``--window "10 seconds"`` (Spark's own spelling), ``--watermark 10min`` or ``--window 0``
    started Spark and failed after it behind a traceback (``int()``'s ValueError, or Spark's
    division by zero for a 0 ms window); a 400-digit number failed argparse itself with a
    traceback (float() made it inf, and int(inf) raised an OverflowError argparse lets
    through)."""
    env = {**ENV, "RCOORD_REDIS_URL": "redis://127.0.0.1:1/0"}
    for flag, value in (("--window", "10 seconds"), ("--watermark", "10min"),
                        ("--window", "0"), ("--trigger", "-1s"), ("--watermark", "9" * 400)):
        res = subprocess.run(
            [sys.executable, "-m", "workers.clickstream", "--group", "clicks", "--topic",
             "events", "--out", "/nonexistent-clickstream-out", f"{flag}={value}"],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False)
        assert res.returncode == 2, (flag, value, res.stderr[-2000:])
        last = res.stderr.splitlines()[-1]
        assert f"argument {flag}: " in last and repr(value) in last, last
        assert "Traceback" not in res.stderr


def test_fault_worker_refused_for_its_session_exits_naming_the_setting(
        redis_server, single_client, namespace, tmp_path):
    # Its docstring's command used a 1.5 s session, below a fresh namespace's minimum (6 s):
    # the worker then logged the same refusal about ten times a second for ever. A join
    # refused for good now ends it (status 2), naming what to change.
    Topics(single_client, namespace).create("t", 1)
    res = subprocess.run(
        [sys.executable, str(ROOT / "workers" / "fault_worker.py"), "--redis-url",
         redis_server.url, "--namespace", namespace, "--group", "g", "--topic", "t", "--name",
         "w1", "--history", str(tmp_path / "w1.jsonl"), "--session-timeout-ms", "1500"],
        env=ENV, capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "INVALID_SESSION_TIMEOUT" in res.stderr and "session_timeout_ms=1500" in res.stderr
    assert res.stderr.count("refused") == 1, res.stderr


@pytest.mark.parametrize(("flag", "bad"), [("--max-records", "-5"), ("--max-records", "1_0"),
                                           ("--idle-exit-s", "-1"), ("--idle-exit-s", "nan"),
                                           ("--idle-exit-s", "1_0")])
def test_word_count_refuses_a_negative_limit_before_it_joins(capsys, flag, bad):
    # A negative --max-records or --idle-exit-s stopped the worker at once (before its first
    # record, or at its first empty poll) with "records 0; top words []", as if the topic were
    # empty; the Redis here does not exist: the flag is refused before the worker connects.
    from workers import word_count

    with pytest.raises(SystemExit) as exited:
        word_count.main(["--redis-url", "redis://127.0.0.1:1/0", "--topic", "lines", flag, bad])
    assert exited.value.code == 2
    assert f"argument {flag}: {bad!r}" in capsys.readouterr().err


def test_word_count_takes_its_url_from_the_environment_as_the_rcoord_commands(capsys,
                                                                              monkeypatch):
    """``--redis-url`` was required where clickstream and every rcoord command default to
    $RCOORD_REDIS_URL; a bad one is named with its variable (nothing listens there: refused
    before the worker connects)."""
    from workers import word_count

    monkeypatch.setenv("RCOORD_REDIS_URL", "http://127.0.0.1:1")
    with pytest.raises(SystemExit) as exited:
        word_count.main(["--topic", "lines"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "'http://127.0.0.1:1' (from $RCOORD_REDIS_URL) is not a Redis URL" in err, err


def test_word_count_against_an_unreachable_redis_says_so_and_keeps_trying():
    """With nothing listening at its URL the worker must not wait in silence: the client's
    warning ("consumer group 'word-count': ... Connection refused ...; starting again at the
    next call") reaches stderr without any logging set up (logging's last-resort handler), the
    password never shown, and SIGTERM still stops it with its summary."""
    import signal

    from cluster_replicas import free_port
    from harness import output_lines, wait_until

    port = free_port()  # nothing listens there
    argv = [sys.executable, str(ROOT / "workers" / "word_count.py"), "--redis-url",
            f"redis://admin:Zm9vYmFy@127.0.0.1:{port}/0", "--topic", "lines"]
    with (subprocess.Popen(argv, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True) as proc,
          output_lines(proc) as lines):
        wait_until(lambda: any(f"127.0.0.1:{port}" in line and "starting again" in line
                               for line in lines), timeout_s=30,
                   why=lambda: "no line says Redis cannot be reached:\n" + "".join(lines))
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    text = "".join(lines)
    assert proc.returncode == 0, text
    assert "Zm9vYmFy" not in text and "Traceback" not in text, text
    assert "stopped by SIGTERM; it never joined the group and committed nothing" in text, text
