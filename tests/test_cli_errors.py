"""The command line at its edges: a bad setting or an unreachable, unwelcoming Redis is one line
on stderr that says what to fix, and a non-zero exit (2 usage, 1 runtime); the traceback only
with ``--log-level debug``. Every case runs ``python -m rcoord`` against real servers."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from rcoord.cli import UsageError, explain
from rcoord.errors import MissingPermissionError
from rcoord.ops.reset import parse_topics
from rcoord.testing.embedded import EmbeddedServer

ROOT = Path(__file__).resolve().parent.parent
PASSWORD = "s3cret-pw"


def rcoord(*args: str, timeout: float = 60,
           env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m rcoord ARGS`` without the caller's ``RCOORD_*`` variables, with ``env``'s."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("RCOORD_")}
    full.update(env or {})
    full["PYTHONPATH"] = str(ROOT)
    return subprocess.run([sys.executable, "-m", "rcoord", *args], env=full, capture_output=True,
                          text=True, timeout=timeout, check=False)


def one_error_line(res: subprocess.CompletedProcess[str], command: str) -> str:
    """The single ``rcoord <command>: error: ...`` line of stderr (and nothing else on it)."""
    assert "Traceback" not in res.stderr + res.stdout, res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith(f"rcoord {command}: error: "), lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def locked_server() -> Iterator[EmbeddedServer]:
    """A server with ``requirepass`` (the default user needs the password); set once it answers,
    since EmbeddedServer.start() waits for a PING without one."""
    server = EmbeddedServer().start()
    try:
        with server.client() as admin:
            admin.config_set("requirepass", PASSWORD)
        yield server
    finally:
        server.stop()


COMMANDS = ["coordinator", "demo"]


@pytest.mark.parametrize("command", COMMANDS)
def test_a_url_that_is_not_a_redis_url(command):
    res = rcoord(command, "--redis-url", "http://127.0.0.1:6379")
    line = one_error_line(res, command)
    assert res.returncode == 2
    assert "--redis-url 'http://127.0.0.1:6379' is not a Redis URL" in line
    assert "redis://[USER:PASSWORD@]HOST:PORT" in line


@pytest.mark.parametrize("command", [*COMMANDS, "groups list", "topics list"])
def test_a_misspelt_url_query_argument_is_named(command, refused_port):
    """A query argument redis-py does not know is named with what to check, as a usage error,
    before any connection; before, it reached the connection and came back as "unexpected
    TypeError: ... got an unexpected keyword argument 'socket_timout'" (exit 1)."""
    res = rcoord(*command.split(),
                 "--redis-url", f"redis://127.0.0.1:{refused_port}/0?socket_timout=5")
    line = one_error_line(res, command)
    assert res.returncode == 2
    assert "'socket_timout' is not a connection option (check the spelling" in line


def test_known_url_query_arguments_pass_the_check():
    from rcoord.cli import check_url

    for url in ("redis://h:1/0?socket_timeout=5&client_name=x&health_check_interval=2",
                "rediss://h:1?ssl_ca_certs=/ca.pem&ssl_cert_reqs=none",
                "unix:///tmp/r.sock?db=1", "redis://h:1/0?protocol=3"):
        assert check_url(url) == url


@pytest.mark.parametrize("path", ["/abc", "/1/2", "/-1", "/0x1"])
def test_a_database_that_is_not_a_number_is_refused(path):
    """redis-py took ``/abc`` for no database (0) and ``/1/2`` for database 12, silently."""
    from rcoord.cli import UsageError, check_url

    with pytest.raises(UsageError, match=f"the path '{path}' is not a database number"):
        check_url(f"redis://h:1{path}")
    for url in ("redis://h:1", "redis://h:1/", "redis://h:1/15", "unix:///tmp/r.sock"):
        assert check_url(url) == url


@pytest.mark.parametrize("command", COMMANDS)
def test_a_refused_port(command, refused_port):
    res = rcoord(command, "--redis-url", f"redis://127.0.0.1:{refused_port}")
    line = one_error_line(res, command)
    assert res.returncode == 1
    assert f"cannot reach Redis at redis://127.0.0.1:{refused_port}" in line
    assert "Connection refused" in line and "check the host and port" in line


def test_an_unknown_host():
    res = rcoord("coordinator", "--redis-url", "redis://no-such-host.invalid:6379")
    line = one_error_line(res, "coordinator")
    assert res.returncode == 1
    assert "cannot reach Redis at redis://no-such-host.invalid:6379" in line
    assert "no-such-host.invalid" in line


@pytest.mark.parametrize("command", COMMANDS)
def test_a_wrong_password_is_named_and_not_printed(command, locked_server):
    url = f"redis://default:wrong-pw@127.0.0.1:{locked_server.port}"
    res = rcoord(command, "--redis-url", url)
    line = one_error_line(res, command)
    assert res.returncode == 1
    assert "refused the login" in line and "check the user and password" in line
    assert "wrong-pw" not in res.stderr + res.stdout
    assert f"redis://default:***@127.0.0.1:{locked_server.port}" in line


def test_an_unknown_user(locked_server):
    url = f"redis://nobody:{PASSWORD}@127.0.0.1:{locked_server.port}"
    line = one_error_line(rcoord("coordinator", "--redis-url", url), "coordinator")
    assert "refused the login" in line and "invalid username-password pair" in line


def test_no_password_where_one_is_required(locked_server):
    res = rcoord("coordinator", "--redis-url", locked_server.url)
    line = one_error_line(res, "coordinator")
    assert res.returncode == 1 and "refused the login" in line


def test_a_bad_namespace_is_a_usage_error(redis_server):
    res = rcoord("coordinator", "--redis-url", redis_server.url, "--namespace", "a{b}")
    line = one_error_line(res, "coordinator")
    assert res.returncode == 2 and "namespace must be" in line and "'a{b}'" in line


def test_an_argument_no_call_takes_is_a_usage_error(redis_server, capsys):
    """The library's InvalidRequestError (a size or a value no call could ever take) means the
    arguments were wrong: exit 2 and its message, as a bad flag; it was exit 1 with the
    exception's name. (Every command checks its own flags first; this is the rule behind them.)"""
    import argparse

    from rcoord.errors import InvalidRequestError
    from rcoord.ops.common import run

    def body(ctx: object) -> int:
        raise InvalidRequestError("max_records must be >= 1, got 0")

    args = argparse.Namespace(prog="rcoord topics consume", redis_url=redis_server.url,
                              namespace="rcoord", output="table", log_level="WARNING",
                              tls_ca_file=None, tls_cert_file=None, tls_key_file=None,
                              body=body)
    assert run(args) == 2
    assert capsys.readouterr().err == (
        "rcoord topics consume: error: max_records must be >= 1, got 0\n")


@pytest.mark.parametrize("command", COMMANDS)
def test_a_bad_log_level_is_a_usage_error(command, redis_server):
    res = rcoord(command, "--redis-url", redis_server.url, "--log-level", "loud")
    line = one_error_line(res, command)
    assert res.returncode == 2
    assert "--log-level 'loud' is not a log level" in line and "DEBUG" in line


@pytest.mark.parametrize("command", [*COMMANDS, "groups list", "topics list", "gateway"])
def test_a_bad_value_in_the_environment_names_its_variable(command, redis_server):
    """A bad ``$RCOORD_LOG_LEVEL`` or ``$RCOORD_REDIS_URL`` is named as the variable it came
    from, as ``rcoord coordinator`` names its own (the error named only a flag nobody typed)."""
    words = command.split()
    res = rcoord(*words, "--redis-url", redis_server.url, env={"RCOORD_LOG_LEVEL": "loud"})
    line = one_error_line(res, command)
    assert res.returncode == 2
    assert "--log-level 'loud' (from $RCOORD_LOG_LEVEL) is not a log level" in line
    res = rcoord(*words, env={"RCOORD_REDIS_URL": "http://127.0.0.1:1"})
    line = one_error_line(res, command)
    assert res.returncode == 2
    assert "--redis-url 'http://127.0.0.1:1' (from $RCOORD_REDIS_URL) is not a Redis URL" in line


def test_a_bad_flag_value_is_one_line(redis_server):
    res = rcoord("demo", "--redis-url", redis_server.url, "--partitions", "many")
    line = one_error_line(res, "demo")
    assert res.returncode == 2 and "--partitions: 'many' is not an integer" in line


def test_an_unknown_demo_assignor_is_a_usage_error(redis_server):
    res = rcoord("demo", "--redis-url", redis_server.url, "--assignor", "stickyish")
    line = one_error_line(res, "demo")
    assert res.returncode == 2 and "--assignor: unknown assignor 'stickyish'" in line
    assert "cooperative-sticky" in line  # the known names are listed


def test_tls_files_need_a_rediss_url(redis_server, tmp_path):
    ca = tmp_path / "ca.pem"
    ca.write_text("not used")
    res = rcoord("coordinator", "--redis-url", redis_server.url, "--tls-ca-file", str(ca))
    line = one_error_line(res, "coordinator")
    assert res.returncode == 2 and "need a rediss:// URL" in line


@pytest.mark.parametrize("command", [*COMMANDS, "topics list", "gateway"])
def test_a_tls_file_from_the_environment_is_named_as_its_flag_and_variable(
        command, redis_server, tmp_path):
    """A ``$RCOORD_TLS_*`` file is named as its flag and variable: one set for another command
    was refused as "--tls-ca-file/--tls-cert-file/--tls-key-file need a rediss:// URL", flags
    nobody typed, and a missing one as "ssl_ca_certs file ... does not exist"."""
    ca = tmp_path / "ca.pem"
    ca.write_text("not used")
    res = rcoord(*command.split(), "--redis-url", redis_server.url,
                 env={"RCOORD_TLS_CA_FILE": str(ca)})
    line = one_error_line(res, command)
    assert res.returncode == 2
    assert "--tls-ca-file (from $RCOORD_TLS_CA_FILE): TLS files need a rediss:// URL" in line
    missing = tmp_path / "missing.pem"
    res = rcoord(*command.split(), "--redis-url", "rediss://127.0.0.1:1",
                 env={"RCOORD_TLS_KEY_FILE": str(missing)})
    line = one_error_line(res, command)
    assert res.returncode == 2
    assert (f"--tls-key-file file '{missing}' (from $RCOORD_TLS_KEY_FILE) does not exist"
            in line)


@pytest.mark.parametrize("command", COMMANDS)
def test_debug_keeps_the_traceback(command, refused_port):
    res = rcoord(command, "--redis-url", f"redis://127.0.0.1:{refused_port}", "--log-level",
                 "debug")
    assert res.returncode == 1
    assert "Traceback (most recent call last)" in res.stderr
    assert "ConnectionError" in res.stderr
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith(f"rcoord {command}: error: cannot reach Redis"), last


def test_demo_time_limit_covers_set_up(redis_server, single_client):
    """A topic of many partitions makes set-up outlast the limit: the demo gives up during set-up
    (it used to notice only at its first wait, after the whole set-up), and leaves no keys.
    (The most partitions one create makes, 10,000, took 2.8 s here: ten times the limit.)"""
    res = rcoord("demo", "--redis-url", redis_server.url, "--partitions", "10000",
                 "--time-limit", "0.3", timeout=120)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "Traceback" not in res.stderr + res.stdout
    m = re.search(
        r"demo: FAILED: (.*): not done within --time-limit 0.3 s \(gave up at ([\d.]+) s\)",
        res.stdout)
    assert m, res.stdout
    assert m.group(1) == "set-up: creating topic 'demo-events' with 10000 partitions"
    # The demo's own clock: it stops at the limit, not after the set-up it was in.
    assert 0.3 <= float(m.group(2)) < 5.0
    ns = re.search(r"namespace (demo-\S+);", res.stdout)
    assert ns, res.stdout
    assert list(single_client.scan_iter(match=f"{ns.group(1)}:*", count=1000)) == []


def test_a_replica_is_named_with_what_to_do_instead(own_server, refused_port):
    """A write sent to a replica (a URL naming the wrong node, or a master demoted by a
    failover) says so and asks for the master's URL."""
    with own_server.client() as client:
        client.execute_command("REPLICAOF", "127.0.0.1", refused_port)
    res = rcoord("topics", "create", "orders", "--partitions", "1", "--redis-url", own_server.url)
    line = one_error_line(res, "topics create")
    assert res.returncode == 1
    assert "read-only replica" in line and "give the URL of its master" in line, line


def test_a_replica_that_serves_no_stale_data_is_named_alike(own_server, refused_port):
    """A replica with ``replica-serve-stale-data no`` whose link to its master is down refuses
    reads too, with MASTERDOWN: the same words as READONLY, where it said "MasterDownError:
    Link with MASTER is down ..." and nothing of what to do."""
    with own_server.client() as client:
        client.execute_command("REPLICAOF", "127.0.0.1", refused_port)
        client.config_set("replica-serve-stale-data", "no")
    res = rcoord("topics", "list", "--redis-url", own_server.url)
    line = one_error_line(res, "topics list")
    assert res.returncode == 1
    assert "read-only replica (Link with MASTER is down" in line, line
    assert "give the URL of its master" in line, line


def test_a_server_out_of_memory_says_what_to_free(own_server):
    """Used memory above maxmemory (noeviction) refuses the write; rcoord's error says to free
    memory or raise maxmemory, which the line kept: it said only "cannot run this now ...; try
    again", and trying again met the same refusal."""
    with own_server.client() as client:
        client.config_set("maxmemory-policy", "noeviction")
        client.config_set("maxmemory", 1)
        try:
            res = rcoord("topics", "create", "orders", "--partitions", "1",
                         "--redis-url", own_server.url)
        finally:
            client.config_set("maxmemory", 0)
    line = one_error_line(res, "topics create")
    assert res.returncode == 1
    assert f"Redis at {own_server.url} is out of memory (used memory > maxmemory)" in line, line
    assert "free memory (topic retention, deleting data) or raise maxmemory" in line, line


def test_a_refusal_after_a_failed_save_says_what_to_mend():
    """The same for MISCONF (the last RDB save failed, stop-writes-on-bgsave-error): what to
    fix, not only "try again"."""
    from rcoord.errors import reraise_as_rcoord

    with pytest.raises(Exception) as caught:
        reraise_as_rcoord("append", redis.ResponseError(
            "MISCONF Redis is configured to save RDB snapshots, but it's currently unable to "
            "persist to disk."))
    code, line = explain(caught.value, "redis://h:1")
    assert code == 1
    assert line.startswith("Redis at redis://h:1 refuses writes because its last RDB save "
                           "failed (stop-writes-on-bgsave-error); fix what failed the save "
                           "(disk space, the permissions of its dir)"), line


_RULES = "add the missing rule to its ACL rules (docs/security.md lists the rules of each role)"


@pytest.mark.parametrize(("error", "words"), [
    (redis.exceptions.NoPermissionError("User w has no permissions to run the 'xadd' command"),
     "User w has no permissions to run the 'xadd' command"),
    # The same refusal met inside a function: a plain error, without the NOPERM code.
    (redis.ResponseError("ACL failure in script: User w has no permissions to run the 'xadd' "
                         "command script: topic_append, on @user_function:12."),
     ("ACL failure in script: User w has no permissions to run the 'xadd' command script: "
      "topic_append, on @user_function:12")),
    (MissingPermissionError("the Redis user may not do what rcoord needs: User w has no "
                            f"permissions to run the 'xadd' command; {_RULES}"),
     "User w has no permissions to run the 'xadd' command"),
], ids=["noperm", "in-function", "rcoord"])
def test_a_missing_permission_is_one_line_naming_the_rules(error, words):
    """Whether it comes through rcoord (MissingPermissionError) or from a plain redis-py call,
    the same words: the server's, and where the rules are."""
    assert explain(error) == (1, f"the Redis user may not do what rcoord needs: {words}; {_RULES}")


def test_the_gateway_takes_its_log_level_from_the_environment_as_every_command(monkeypatch):
    """``$RCOORD_LOG_LEVEL`` set the level of every command but the gateway's, which stayed at
    INFO (so ``RCOORD_LOG_LEVEL=DEBUG rcoord gateway`` logged no DEBUG line); without the
    variable its default is still INFO."""
    import argparse

    from rcoord.cli import log_level
    from rcoord.gateway.cli import add_arguments

    def level() -> str:
        p = argparse.ArgumentParser()
        add_arguments(p)  # (defaults are read from the environment here, as main() does)
        return log_level(p.parse_args([]).log_level)

    monkeypatch.setenv("RCOORD_LOG_LEVEL", "debug")
    assert level() == "DEBUG"
    monkeypatch.delenv("RCOORD_LOG_LEVEL")
    assert level() == "INFO"


@pytest.mark.parametrize("number", ["1_0", " 3", "\u0663", "3-"])
@pytest.mark.parametrize("args", [
    ("groups", "reset-offsets", "g", "--topic", "t", "--to-offset", "{}"),
    ("topics", "create", "t", "--partitions", "{}"),
    ("topics", "consume", "t", "--partition", "{}"),
])
def test_a_number_is_digits_only(args, number):
    """int() read "1_0" as 10, " 3" as 3 and other scripts' digits as theirs: a typo became
    another partition or offset (a reset committed it). (A sign is taken, as Java's
    Long.valueOf takes it: tests/test_review71b_cli.py.)
    Refused before anything connects (nothing listens at the URL): a usage error (exit 2)
    naming the value."""
    res = rcoord(*(a.format(number) for a in args),
                 env={"RCOORD_REDIS_URL": "redis://127.0.0.1:1"})
    assert res.returncode == 2, (res.returncode, res.stderr)
    assert repr(number) in one_error_line(res, " ".join(args[:2]))


@pytest.mark.parametrize("number", ["1_0", " 3", "\u0663", "3-"])
def test_a_topics_partitions_are_digits_only(number):
    """``--topic t:1_0`` named partition 10 (read once connected, so tested here directly)."""
    with pytest.raises(UsageError, match="partitions must be numbers"):
        parse_topics([f"t:{number}"])


@pytest.mark.parametrize("number", ["1_0", " 3", "\u0663"])
@pytest.mark.parametrize("flag", ["--partitions", "--records", "--workers"])
def test_the_demo_numbers_are_digits_only(flag, number):
    """The demo read its numbers with int(): ``--records 1_0`` ran with 10 records where the
    groups and topics commands refuse "1_0" (test_a_number_is_digits_only)."""
    res = rcoord("demo", flag, number, env={"RCOORD_REDIS_URL": "redis://127.0.0.1:1"})
    assert res.returncode == 2, (res.returncode, res.stderr)
    line = one_error_line(res, "demo")
    assert flag in line and repr(number) in line, line
