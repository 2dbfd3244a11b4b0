"""Review 76: a newcomer's first hour (the README, ``rcoord demo``, workers/, the everyday CLI).

Each test fails on the code it was written against, showing a defect a first user meets: a
bad flag the demo takes for a run that failed, and the word_count example's bad URL (a
traceback) and its stop line (a commit and a leave claimed where there was neither)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from harness import output_lines, wait_until

from rcoord.cli import main

ROOT = Path(__file__).resolve().parent.parent
ENV = dict(os.environ, PYTHONPATH=str(ROOT))
NOWHERE = "redis://127.0.0.1:1/0"
"""A URL nothing answers at: a flag refused as it should be never gets as far as connecting."""


@pytest.mark.parametrize("flag", [["--time-limit", "nan"], ["--produce-seconds", "nan"],
                                  ["--produce-seconds", "-1"]])
def test_demo_refuses_a_bad_number_before_it_connects(
        flag: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """``--time-limit -1`` is a usage error (exit 2), but ``--time-limit nan`` passed the
    ``<= 0`` check: the demo went on to connect (here, to fail to), and on a live Redis began
    its set-up and gave up at once,
    "demo: FAILED: ... not done within --time-limit nan s", exit 1, as if the run had failed.
    ``--produce-seconds -1`` or ``nan`` ("spread the records over this many seconds") was
    taken silently. Each should be refused as the other number flags are, naming the flag."""
    try:
        status = main(["demo", "--redis-url", NOWHERE, *flag])
    except SystemExit as exc:  # (since 2026-12-01 argparse refuses "nan" as it parses)
        status = exc.code
    err = capsys.readouterr().err
    assert status == 2, err
    assert flag[0] in err and "cannot reach Redis" not in err, err


def test_word_count_refuses_a_bad_url_in_one_line() -> None:
    """``--max-records -5`` is refused in one line, exit 2, before the worker connects; a URL
    that is not a Redis one (``http://...``, the usual slip) ended it with a ConfigError
    traceback, exit 1, its one useful line at the bottom."""
    res = subprocess.run(
        [sys.executable, str(ROOT / "workers" / "word_count.py"), "--redis-url",
         "http://127.0.0.1:1", "--topic", "lines"],
        env=ENV, capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr, res.stderr
    assert "is not a Redis URL" in res.stderr, res.stderr


def test_word_count_stopped_before_it_joined_does_not_claim_a_commit_and_a_leave() -> None:
    """Redis unreachable, the worker retries (and says so); stopped then, it printed "stopped
    by SIGTERM; committed and left the group", though it never joined a group and committed
    nothing: an operator reading that believes its partitions' progress is safe."""
    with subprocess.Popen(
            [sys.executable, str(ROOT / "workers" / "word_count.py"), "--redis-url", NOWHERE,
             "--topic", "lines"],
            env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        err_lines: list[str] = []

        def read_stderr() -> None:
            for line in proc.stderr or ():
                err_lines.append(line)  # noqa: PERF402 - line by line: the test waits on them

        reader = threading.Thread(target=read_stderr, daemon=True)
        reader.start()
        try:
            # Its signal handlers are installed before its first poll, whose failure it logs.
            wait_until(lambda: any("starting again" in line for line in err_lines),
                       timeout_s=60, why=lambda: "".join(err_lines))
            proc.send_signal(signal.SIGTERM)
            out = proc.stdout.read() if proc.stdout else ""
            proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        reader.join(timeout=10)
    assert proc.returncode == 0, out + "".join(err_lines)
    assert "records 0" in out, out
    assert "committed and left the group" not in out, out


def test_clickstream_refuses_a_bad_url_before_spark_starts() -> None:
    """A missing URL is refused before Spark starts (exit 2, one line), but one that is not a
    Redis URL (``http://...``) started Spark and failed about 25 s later behind a Python and a
    Java traceback ("PYTHON_DATA_SOURCE_ERROR ... OptionError: url: ..."), exit 1."""
    env = {k: v for k, v in ENV.items() if k != "RCOORD_REDIS_URL"}
    res = subprocess.run(
        [sys.executable, "-m", "workers.clickstream", "--redis-url", "http://127.0.0.1:1",
         "--group", "clicks", "--topic", "events", "--out", "/nonexistent-clickstream-out"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=180, check=False)
    assert res.returncode == 2, res.stderr[-2000:]
    assert "Traceback" not in res.stderr, res.stderr[-2000:]
    assert res.stderr.splitlines()[-1].endswith(
        "is not a Redis URL; write redis://[USER:PASSWORD@]HOST:PORT[/DB] or rediss://... "
        "for TLS"), res.stderr[-2000:]


@pytest.mark.parametrize("argv", [["groups", "describe", "g1", "g2"],
                                  ["topics", "consume", "orders", "extra"],
                                  ["groups", "reset-offsets", "g1", "orders", "--to-earliest"]])
def test_an_extra_word_is_named_by_the_command_that_refuses_it(
        argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """An option a command does not know is named by that command ("rcoord groups describe:
    error: unrecognized option ... (see rcoord groups describe --help)"); an extra word (a
    second group, as kafka-consumer-groups takes several --group; a topic without --topic)
    was refused by the top-level parser, "rcoord: error: unrecognized arguments: g2 (see
    rcoord --help)", whose help lists the command families and nothing about the mistake."""
    with pytest.raises(SystemExit) as exited:
        main(["--redis-url", NOWHERE, *argv])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    command = " ".join(argv[:2])
    assert err.startswith(f"rcoord {command}: error: "), err
    assert f"(see rcoord {command} --help)" in err, err


def test_word_count_on_a_topic_that_does_not_exist_says_so(redis_server, single_client,
                                                           namespace) -> None:
    """A typo in ``--topic`` (the first mistake a newcomer makes): the worker joined, printed
    "assigned []" and then waited for ever without a word, ``--idle-exit-s`` not counting
    (it holds no partitions). Kafka's consumer logs the missing topic at every metadata
    refresh ("Error while fetching metadata ...: {nosuch=UNKNOWN_TOPIC_OR_PARTITION}")."""
    from harness import without_join_delay

    without_join_delay(single_client, namespace)
    with (subprocess.Popen(
            [sys.executable, str(ROOT / "workers" / "word_count.py"), "--redis-url",
             redis_server.url, "--namespace", namespace, "--topic", "nosuch"],
            env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc,
          output_lines(proc) as lines):
        wait_until(lambda: any("assigned []" in line for line in lines), timeout_s=60,
                   why=lambda: "".join(lines))
        # Generous: any warning would come at the first assignment or metadata refresh.
        wait_until(lambda: any("nosuch" in line for line in lines), timeout_s=30,
                   why=lambda: "no line names the missing topic:\n" + "".join(lines))
