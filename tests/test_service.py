"""The coordinator service, as real processes against the test servers."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from harness import EventLog, handling, wait_until

from rcoord import CoordinatorConfig, Errors, GroupCoordinator
from rcoord.keys import PartitionKeys
from rcoord.partitioning import partition_for
from rcoord.service.leases import plan

ROOT = Path(__file__).resolve().parent.parent
JOIN = dict(protocol_type="consumer", protocols=[("range", b"")], session_timeout_ms=300,
            rebalance_timeout_ms=2000)
TTL_MS = 1000


class Proc:
    def __init__(self, url: str, namespace: str, cid: str, *extra: str) -> None:
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rcoord.service", "--redis-url", url, "--namespace", namespace,
             "--id", cid, "--metrics-port", "0", "--lease-ttl-ms", str(TTL_MS), *extra],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True,
        )
        line = self.proc.stdout.readline()
        try:
            started = json.loads(line)
        except ValueError:
            self.proc.kill()
            raise AssertionError(f"coordinator did not start: {line}{self.proc.stdout.read()}")
        self.port = started["metrics_port"]
        self.id = cid

    def health(self) -> dict[str, Any]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=2) as r:
                return json.loads(r.read())
        except OSError:
            return {}

    def metric(self, name: str) -> float:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=2) as r:
            for line in r.read().decode().splitlines():
                if line.startswith(name + " ") or line.startswith(name + "{"):
                    return float(line.rsplit(" ", 1)[1])
        return 0.0

    def why(self) -> str:
        """For a wait that timed out: whether the process still runs, its health, and all it
        wrote, with every thread's stack (SIGUSR1) if it runs; it is stopped to read that."""
        alive = self.proc.poll() is None
        health = self.health() if alive else {}
        if alive:
            self.proc.send_signal(signal.SIGUSR1)
        out = self.stop(signal.SIGTERM)
        return f"running: {alive}, exit code {self.proc.returncode}, health {health}\n{out}"

    def stop(self, sig: int = signal.SIGTERM) -> str:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.communicate(timeout=10)[0]
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.communicate()[0]


@pytest.fixture
def procs() -> Iterator[list[Proc]]:
    started: list[Proc] = []
    yield started
    for p in started:
        p.stop(signal.SIGKILL)


def _setup(client: Any, namespace: str) -> GroupCoordinator:
    return GroupCoordinator(client, CoordinatorConfig(
        namespace=namespace, group_min_session_timeout_ms=10, group_initial_rebalance_delay_ms=0)).start()


def _lonely_member(coord: GroupCoordinator, group: str) -> str:
    """A one-member Stable group whose member then goes silent."""
    mid = coord.join_group(group, **JOIN).member_id
    res = coord.join_group(group, mid, **JOIN)
    assert coord.sync_group(group, res.generation_id, mid, assignments={}).error == Errors.NONE
    return mid


def _is_member(coord: GroupCoordinator, group: str, mid: str) -> bool:
    """A raw read: it applies no deadline, unlike every script."""
    return bool(coord._redis.hexists(coord._keys(group).members, mid))


def _server_ms(client: Any) -> int:
    sec, usec = client.time()
    return int(sec) * 1000 + int(usec) // 1000


def test_plan_is_fair_and_moves_little():
    ids = ["a", "b", "c"]
    p3 = plan(50, ids)
    counts = sorted(list(p3.values()).count(c) for c in ids)
    assert counts == [16, 17, 17]
    p4 = plan(50, ids + ["d"])
    moved = sum(1 for p in range(50) if p3[p] != p4[p])
    assert list(p4.values()).count("d") in (12, 13)
    assert moved <= 20  # mostly the newcomer's share moves


def test_without_coordinators_an_idle_member_waits_for_the_next_touch(single_client, namespace):
    coord = _setup(single_client, namespace)
    mid = _lonely_member(coord, "idle")
    deadline = _server_ms(single_client) + JOIN["session_timeout_ms"]
    wait_until(lambda: _server_ms(single_client) > deadline + 50)
    assert _is_member(coord, "idle", mid)  # nothing ran the timers
    assert coord.describe_group("idle").state == "Empty"  # the touch applies the deadline
    assert not _is_member(coord, "idle", mid)


def test_one_coordinator_expires_an_idle_member_and_rebalances(redis_server, single_client, namespace, procs):
    coord = _setup(single_client, namespace)
    procs.append(Proc(redis_server.url, namespace, "c1"))
    # A session long enough that the member who keeps heartbeating never misses it, even on a
    # loaded machine; only the silent one expires.
    JOIN = {**globals()["JOIN"], "session_timeout_ms": 1500, "rebalance_timeout_ms": 5000}
    a = coord.join_group("g2", **JOIN).member_id
    b = coord.join_group("g2", **JOIN).member_id
    # a forms generation 1 alone, then both join generation 2.
    ra = coord.join_group("g2", a, **JOIN)
    coord.sync_group("g2", ra.generation_id, a, assignments={})
    import concurrent.futures as cf

    with cf.ThreadPoolExecutor(2) as ex:
        fa, fb = ex.submit(coord.join_group, "g2", a, **JOIN), ex.submit(coord.join_group, "g2", b, **JOIN)
        r1, r2 = fa.result(10), fb.result(10)
    gen = r1.generation_id
    assert r2.generation_id == gen
    leader = r1.leader_id
    with cf.ThreadPoolExecutor(2) as ex:
        s = [ex.submit(coord.sync_group, "g2", gen, m, assignments={} if m == leader else None) for m in (a, b)]
        [x.result(10) for x in s]
    # b goes silent; a keeps heartbeating (with raw reads only in between, no touches by b).
    def a_alive_b_gone() -> bool:
        coord.heartbeat("g2", gen, a)
        return not _is_member(coord, "g2", b)

    wait_until(a_alive_b_gone, timeout_s=10)
    assert coord.heartbeat("g2", gen, a) == Errors.REBALANCE_IN_PROGRESS
    out = procs[0].stop()
    assert '"event": "member_expired"' in out and '"event": "group_transition"' in out


def test_three_coordinators_share_partitions_and_survive_a_kill(redis_server, single_client, namespace, procs):
    coord = _setup(single_client, namespace)
    for i in range(3):
        procs.append(Proc(redis_server.url, namespace, f"c{i}"))
    wait_until(lambda: sorted(p.health().get("leases", 0) for p in procs) == [16, 17, 17], timeout_s=15)
    victim = procs[1]
    victim_parts = {p for p, c in plan(50, ["c0", "c1", "c2"]).items() if c == "c1"}
    # Groups whose partitions the victim leases, with members that will go silent.
    groups = []
    i = 0
    while len(groups) < 3:
        g = f"grp-{i}"
        if partition_for(g) in victim_parts:
            groups.append((g, _lonely_member(coord, g)))
        i += 1
    victim.proc.send_signal(signal.SIGKILL)
    victim.proc.wait(10)
    survivors = [procs[0], procs[2]]
    # Its partitions are taken over once its leases expire (one TTL), and its deadlines act.
    wait_until(lambda: sum(p.health().get("leases", 0) for p in survivors) == 50, timeout_s=TTL_MS / 1000 * 4)
    wait_until(lambda: not any(_is_member(coord, g, m) for g, m in groups), timeout_s=10)


def test_a_new_coordinator_takes_its_share_without_a_gap(redis_server, single_client, namespace, procs):
    _setup(single_client, namespace)
    procs.append(Proc(redis_server.url, namespace, "first"))
    wait_until(lambda: procs[0].health().get("leases") == 50, timeout_s=10)
    procs.append(Proc(redis_server.url, namespace, "second"))
    want = list(plan(50, ["first", "second"]).values()).count("second")
    wait_until(lambda: procs[1].health().get("leases") == want and procs[0].health().get("leases") == 50 - want,
               timeout_s=10)
    # Every partition always has a holder: handoffs move the lease directly.
    holders = single_client.mget([f"{namespace}:{{{t}}}:lease" for t in _tags()])
    assert all(holders)


def _tags() -> list[str]:
    from rcoord.partitioning import partition_tag

    return [partition_tag(p, 50) for p in range(50)]


def test_sigterm_releases_leases_at_once(redis_server, single_client, namespace, procs):
    _setup(single_client, namespace)
    long_ttl = ["--lease-ttl-ms", "30000"]
    procs.append(Proc(redis_server.url, namespace, "stays", *long_ttl))
    procs.append(Proc(redis_server.url, namespace, "leaves", *long_ttl))
    wait_until(lambda: procs[1].health().get("leases", 0) > 0, timeout_s=15)
    out = procs[1].stop(signal.SIGTERM)
    assert procs[1].proc.returncode == 0, out
    # Far sooner than the 30 s TTL: released leases are taken at once.
    wait_until(lambda: procs[0].health().get("leases") == 50, timeout_s=10)


def test_sigusr1_writes_every_threads_stack_and_changes_nothing(redis_server, single_client,
                                                                 namespace, procs):
    # For a process that seems stuck, as a JVM's thread dump is for a Kafka broker: without it,
    # a service that silently stopped acting (a CI run of test_resharding) left nothing to read.
    coord = _setup(single_client, namespace)
    procs.append(Proc(redis_server.url, namespace, "dumped"))
    wait_until(lambda: procs[0].health().get("leases") == 50, timeout_s=15)
    # The timer loop turns (it expires a silent member) before the dump is asked for: the
    # leases are taken before run() starts the loop's thread, and a dump in that instant
    # showed the main thread inside Thread.start() and no loop.
    first = _lonely_member(coord, "before")
    wait_until(lambda: not _is_member(coord, "before", first), timeout_s=10, why=procs[0].why)
    procs[0].proc.send_signal(signal.SIGUSR1)
    # It goes on: a member that goes silent afterwards is expired by it, and it is healthy.
    mid = _lonely_member(coord, "g")
    # (A CI run once timed out here, nothing said why: the process's log and stacks do now.)
    wait_until(lambda: not _is_member(coord, "g", mid), timeout_s=10, why=procs[0].why)
    assert procs[0].proc.poll() is None
    assert procs[0].health().get("status") == "ok" and procs[0].health().get("leases") == 50
    out = procs[0].stop(signal.SIGTERM)
    assert procs[0].proc.returncode == 0, out
    # Every thread's stack: run() (the main thread), the timer loop and the lease thread.
    assert ("Thread 0x" in out and "_lease_loop" in out and " in run" in out
            and " in _timer_loop" in out), out[-3000:]


def test_a_service_survives_many_thread_dumps_while_it_works(redis_server, single_client,
                                                            namespace, tmp_path):
    # The dump was written from the signal itself (faulthandler.register), reading the stacks
    # of threads that kept running: the process died of SIGSEGV after 2 to 25 dumps while it
    # expired members (a CI run of the test above lost its process so, once).
    coord = _setup(single_client, namespace)
    out_path = tmp_path / "service.log"
    with open(out_path, "w") as out:  # (a file: a pipe nobody reads fills up with dumps)
        proc = subprocess.Popen(
            [sys.executable, "-m", "rcoord.service", "--redis-url", redis_server.url,
             "--namespace", namespace, "--id", "dumped-often", "--metrics-port", "0",
             "--lease-ttl-ms", str(TTL_MS)],
            stdout=out, stderr=subprocess.STDOUT, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    try:
        wait_until(lambda: out_path.read_text().startswith("{"), timeout_s=15)
        quick = dict(JOIN, session_timeout_ms=20)
        for i in range(100):
            # Members join and go silent meanwhile, so its threads run while it dumps them;
            # the signals come as fast as the joins (an operator's second kill -USR1 may come
            # during a dump too).
            mid = coord.join_group(f"d{i}", **quick).member_id
            coord.join_group(f"d{i}", mid, **quick)
            proc.send_signal(signal.SIGUSR1)
            assert proc.poll() is None, out_path.read_text()[-3000:]
        # It goes on: every member expires, and it still answers a dump.
        wait_until(lambda: proc.poll() is not None
                   or not any(coord._redis.hlen(coord._keys(f"d{i}").members)
                              for i in range(100)), timeout_s=15)
        dumps = out_path.read_text().count("Current thread")
        proc.send_signal(signal.SIGUSR1)
        wait_until(lambda: proc.poll() is not None
                   or out_path.read_text().count("Current thread") > dumps, timeout_s=10)
        assert proc.poll() is None, out_path.read_text()[-3000:]
    finally:
        proc.kill()
        proc.wait()


def test_cluster_coordinator_hears_expiry_events_from_every_master(redis_cluster, namespace, procs):
    client = redis_cluster.client()
    coord = _setup(client, namespace)
    # Hints only: members are removed only if the events of every master reach the process.
    procs.append(Proc(redis_cluster.url, namespace, "hints-only", "--wake", "hints"))
    assert procs[0].health().get("keyspace_events") == "enabled"
    nodes = {}
    i = 0
    while len(nodes) < 3:
        g = f"cl-{i}"
        node = client.get_node_from_key(coord._keys(g).group).name
        if node not in nodes:
            nodes[node] = (g, _lonely_member(coord, g))
        i += 1
    wait_until(lambda: not any(_is_member(coord, g, m) for g, m in nodes.values()), timeout_s=20)
    assert procs[0].metric('rcoord_expiry_hints_total{result="hit"}') >= 3
    client.close()


def test_cli_reports_a_missing_url():
    env = {k: v for k, v in os.environ.items() if k != "RCOORD_REDIS_URL"}
    env["PYTHONPATH"] = str(ROOT)
    res = subprocess.run([sys.executable, "-m", "rcoord.service"], env=env, capture_output=True,
                         text=True, timeout=30)
    assert res.returncode == 2 and "RCOORD_REDIS_URL" in res.stderr


def test_cli_flags_override_environment(monkeypatch):
    import argparse

    from rcoord.service.cli import add_coordinator_arguments

    monkeypatch.setenv("RCOORD_REDIS_URL", "redis://127.0.0.1:1/0")
    monkeypatch.setenv("RCOORD_LEASE_TTL_MS", "1234")
    p = argparse.ArgumentParser()
    add_coordinator_arguments(p)
    args = p.parse_args(["--lease-ttl-ms", "777"])
    assert args.redis_url == "redis://127.0.0.1:1/0" and args.lease_ttl_ms == 777
    assert p.parse_args([]).lease_ttl_ms == 1234


def test_a_bad_number_in_the_environment_names_the_variable(monkeypatch, capsys):
    """A default from the environment that is no number is refused naming the variable (the
    error named only the flag, which the operator never typed); a bad flag is named as before."""
    import argparse

    from rcoord.service.cli import add_coordinator_arguments

    monkeypatch.setenv("RCOORD_LEASE_TTL_MS", "abc")
    p = argparse.ArgumentParser()
    add_coordinator_arguments(p)
    with pytest.raises(SystemExit):
        p.parse_args([])
    assert "--lease-ttl-ms: invalid int value: 'abc' (from $RCOORD_LEASE_TTL_MS)" in (
        capsys.readouterr().err)
    with pytest.raises(SystemExit):
        p.parse_args(["--lease-ttl-ms", "xyz"])
    err = capsys.readouterr().err
    assert "--lease-ttl-ms: invalid int value: 'xyz'" in err and "RCOORD_" not in err
    assert p.parse_args(["--lease-ttl-ms", "9"]).lease_ttl_ms == 9
    # As the groups and topics commands read numbers: int() took "1_0" as 10 and " 3" as 3
    for typo in ("1_0", " 3"):
        with pytest.raises(SystemExit):
            p.parse_args(["--lease-ttl-ms", typo])
        assert f"--lease-ttl-ms: invalid int value: {typo!r}" in capsys.readouterr().err


def test_a_bad_wake_mode_in_the_environment_names_the_variable(monkeypatch, capsys):
    """argparse checks ``choices`` only on a flag typed on the command line, so a bad
    ``$RCOORD_WAKE`` reached the service, whose error named neither the flag nor the variable;
    it is now refused with the flag's usage error naming the variable."""
    import argparse

    from rcoord.service.cli import add_coordinator_arguments

    monkeypatch.setenv("RCOORD_WAKE", "sometimes")
    p = argparse.ArgumentParser()
    add_coordinator_arguments(p)
    with pytest.raises(SystemExit):
        p.parse_args([])
    assert ("--wake: invalid choice: 'sometimes' (from $RCOORD_WAKE) (choose from both, "
            "index, hints)") in capsys.readouterr().err
    assert p.parse_args(["--wake", "index"]).wake == "index"
    with pytest.raises(SystemExit):
        p.parse_args(["--wake", "never"])
    err = capsys.readouterr().err
    assert "--wake: invalid choice: 'never'" in err and "RCOORD_" not in err
    monkeypatch.setenv("RCOORD_WAKE", "hints")
    p = argparse.ArgumentParser()
    add_coordinator_arguments(p)
    assert p.parse_args([]).wake == "hints"


@pytest.mark.parametrize("variable, value, error", [
    ("RCOORD_LOG_LEVEL", "loud", "--log-level 'loud' (from $RCOORD_LOG_LEVEL) is not a log level"),
    ("RCOORD_SETTINGS", "session_timeout_ms=1,num_partitions=x",
     "--set expects NAME=INTEGER, got 'num_partitions=x' (from $RCOORD_SETTINGS)"),
    # before: int() took it as 10
    ("RCOORD_SETTINGS", "num_partitions=1_0",
     "--set expects NAME=INTEGER, got 'num_partitions=1_0' (from $RCOORD_SETTINGS)"),
])
def test_a_bad_log_level_or_setting_in_the_environment_names_the_variable(
        monkeypatch, capsys, variable, value, error):
    """As a bad number does: the error named only a flag the operator never typed. The flag
    given on the command line is still named alone."""
    import argparse

    from rcoord.service.cli import add_coordinator_arguments, coordinator_main

    monkeypatch.setenv("RCOORD_REDIS_URL", "redis://127.0.0.1:1/0")
    monkeypatch.setenv(variable, value)
    p = argparse.ArgumentParser()
    add_coordinator_arguments(p)
    assert coordinator_main(p.parse_args([])) == 2
    assert error in capsys.readouterr().err
    monkeypatch.delenv(variable)
    p = argparse.ArgumentParser()
    add_coordinator_arguments(p)
    flag = ["--log-level", "loud"] if variable == "RCOORD_LOG_LEVEL" else ["--set", "x=y"]
    assert coordinator_main(p.parse_args(flag)) == 2
    err = capsys.readouterr().err
    assert flag[0] in err and "$RCOORD_" not in err


@pytest.mark.parametrize("variable, flag, value", [
    ("RCOORD_LEASE_TTL_MS", "--lease-ttl-ms", "10"),
    ("RCOORD_RETENTION_CHECK_INTERVAL_MS", "--retention-check-interval-ms", "-1"),
    ("RCOORD_METRICS_PORT", "--metrics-port", "70000"),
    ("RCOORD_COORDINATOR_ID", "--id", "a\tb"),
    ("RCOORD_NAMESPACE", "--namespace", "a{b"),
    ("RCOORD_SETTINGS", "--set", "bogus=1"),
    ("RCOORD_SETTINGS", "--set", "group_min_session_timeout_ms=-5"),
])
def test_a_value_out_of_range_names_its_flag_and_variable(monkeypatch, capsys, variable, flag,
                                                          value):
    """A value of the right type the service refuses (a range, a key name) is named as its flag
    and the variable it came from: the error named only ServiceConfig's field ("lease_ttl_ms
    must be in 100..86400000" for RCOORD_LEASE_TTL_MS=10). Typed, the flag alone is named."""
    import argparse

    from rcoord.service.cli import add_coordinator_arguments, coordinator_main

    monkeypatch.setenv("RCOORD_REDIS_URL", "redis://127.0.0.1:1/0")
    shown = value if flag in ("--lease-ttl-ms", "--retention-check-interval-ms",
                              "--metrics-port") else repr(value)
    monkeypatch.setenv(variable, value)
    p = argparse.ArgumentParser()
    add_coordinator_arguments(p)
    assert coordinator_main(p.parse_args([])) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and f"error: {flag} {shown} (from ${variable}): " in lines[0]
    monkeypatch.delenv(variable)
    p = argparse.ArgumentParser()
    add_coordinator_arguments(p)
    assert coordinator_main(p.parse_args([flag, value])) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and f"error: {flag} {shown}: " in lines[0] and "$RCOORD_" not in lines[0]


def test_settings_are_checked_together(monkeypatch, capsys):
    """A maximum below the default minimum is taken with a minimum below it (each ``--set``
    item is not checked alone against the others' defaults); a pair that does not fit names
    the item without which the rest fit."""
    from rcoord.cli import UsageError
    from rcoord.service.cli import check_settings

    url = "redis://127.0.0.1:1/0"
    check_settings(["group_max_session_timeout_ms=100", "group_min_session_timeout_ms=50"], url)
    with pytest.raises(UsageError, match=r"^--set 'group_max_session_timeout_ms=100': "):
        check_settings(["group_max_session_timeout_ms=100", "group_min_session_timeout_ms=500"],
                       url)


def test_a_stop_signal_while_the_main_thread_holds_the_stop_flag_does_not_hang(monkeypatch):
    """The signal handler runs on the main thread; it called ``stop.set()``, which takes the
    event's lock: a SIGTERM arriving while that thread held it (inside ``stop.wait()``, as
    ``start()`` waits for a claimed id) waited for ever for a lock its own thread held. Here
    the handler is called while the lock is held, as the signal would be; the start then sees
    the stop (StoppedBeforeClaim: exit 0)."""
    import argparse

    import rcoord.cli
    from rcoord.service import cli, service
    from rcoord.service.leases import StoppedBeforeClaim

    handlers: dict[int, Any] = {signal.SIGTERM: signal.SIG_DFL,
                                signal.SIGINT: signal.default_int_handler}

    def set_handler(signum: int, h: Any) -> Any:
        previous, handlers[signum] = handlers.get(signum), h
        return previous

    monkeypatch.setattr(signal, "signal", set_handler)

    class Service:
        exit_code = 0

        def __init__(self, config: Any) -> None:
            self._stop = threading.Event()

        def start(self) -> None:
            with self._stop._cond:  # (as inside Event.wait, or Event.set)
                handlers[signal.SIGTERM](signal.SIGTERM, None)
            if self._stop.wait(30):
                raise StoppedBeforeClaim("stopped")

    monkeypatch.setattr(service, "CoordinatorService", Service)
    monkeypatch.setattr(rcoord.cli, "dump_threads_on_sigusr1", lambda: lambda: None)
    monkeypatch.setenv("RCOORD_REDIS_URL", "redis://127.0.0.1:1/0")
    p = argparse.ArgumentParser()
    cli.add_coordinator_arguments(p)
    args = p.parse_args(["--log-level", "ERROR"])
    root = logging.getLogger()
    handlers_before, level_before = root.handlers[:], root.level
    out: list[int] = []
    runner = threading.Thread(target=lambda: out.append(cli.coordinator_main(args)), daemon=True)
    try:
        runner.start()
        runner.join(30)
    finally:
        root.handlers[:], root.level = handlers_before, level_before
    assert not runner.is_alive(), "the signal handler hung on the stop flag's lock"
    assert out == [0]
    # (ended: the handlers found are back)
    assert handlers[signal.SIGTERM] == signal.SIG_DFL
    assert handlers[signal.SIGINT] is signal.default_int_handler


def test_the_coordinator_command_puts_back_the_logging_it_found(monkeypatch):
    """A program running ``rcoord coordinator`` in its own process (``rcoord.cli.main``, a
    test) had the root logger's handlers replaced by the command's JSON lines on stdout, and
    its level changed, for good."""
    import argparse

    import rcoord.cli
    from rcoord.service import cli, service

    class Service:
        exit_code = 0

        def __init__(self, config: Any) -> None:
            self._stop = threading.Event()

        def start(self) -> None:
            logging.getLogger("rcoord.service").info("started")

        def run(self) -> None:
            pass

        def stop(self) -> None:
            pass

    monkeypatch.setattr(service, "CoordinatorService", Service)
    monkeypatch.setattr(rcoord.cli, "dump_threads_on_sigusr1", lambda: lambda: None)
    monkeypatch.setenv("RCOORD_REDIS_URL", "redis://127.0.0.1:1/0")
    p = argparse.ArgumentParser()
    cli.add_coordinator_arguments(p)
    root = logging.getLogger()
    mine = logging.NullHandler()
    handlers_before, level_before = root.handlers[:], root.level
    try:
        root.handlers[:] = [mine]
        root.setLevel(logging.WARNING)
        assert cli.coordinator_main(p.parse_args(["--log-level", "DEBUG"])) == 0
        assert root.handlers == [mine]
        assert root.level == logging.WARNING
    finally:
        root.handlers[:], root.level = handlers_before, level_before


def test_the_coordinator_command_puts_back_the_logging_when_its_signals_fail(monkeypatch):
    """Run off the main thread (a harness's thread), the command fails at SignalStop
    (ValueError: signals are set on the main thread only): that left the root logger's
    handlers replaced by the command's JSON lines on stdout, and its level changed, for the
    rest of the process, which b0ab03b's put-back in the command's end did not reach."""
    import argparse

    from rcoord.service import cli, service

    class Service:
        def __init__(self, config: Any) -> None:
            self._stop = threading.Event()

    monkeypatch.setattr(service, "CoordinatorService", Service)
    monkeypatch.setenv("RCOORD_REDIS_URL", "redis://127.0.0.1:1/0")
    p = argparse.ArgumentParser()
    cli.add_coordinator_arguments(p)
    args = p.parse_args(["--log-level", "DEBUG"])
    root = logging.getLogger()
    mine = logging.NullHandler()
    handlers_before, level_before = root.handlers[:], root.level
    raised: list[BaseException] = []

    def command() -> None:
        try:
            cli.coordinator_main(args)
        except BaseException as exc:  # noqa: BLE001 - looked at below
            raised.append(exc)

    try:
        root.handlers[:] = [mine]
        root.setLevel(logging.WARNING)
        thread = threading.Thread(target=command)
        thread.start()
        thread.join()
        assert [type(exc) for exc in raised] == [ValueError]
        assert root.handlers == [mine]
        assert root.level == logging.WARNING
    finally:
        root.handlers[:], root.level = handlers_before, level_before


@pytest.mark.skipif(not hasattr(signal, "SIGUSR1"), reason="no SIGUSR1 on this platform")
def test_the_coordinator_command_puts_back_the_sigusr1_handler_it_found(monkeypatch):
    """The command's thread dump on SIGUSR1 stayed installed after it ended in a program's own
    process (``rcoord.cli.main``, a test): that program's own SIGUSR1 handling was gone for
    good, and the dump went on writing to a descriptor the program may have reused."""
    import argparse

    from rcoord.service import cli, service

    class Service:
        exit_code = 0

        def __init__(self, config: Any) -> None:
            self._stop = threading.Event()

        def start(self) -> None:
            pass

        def run(self) -> None:
            # While the command runs, SIGUSR1 is its thread dump.
            assert signal.getsignal(signal.SIGUSR1) is not mine

        def stop(self) -> None:
            pass

    def mine(signum: int, frame: Any) -> None:
        pass

    monkeypatch.setattr(service, "CoordinatorService", Service)
    monkeypatch.setenv("RCOORD_REDIS_URL", "redis://127.0.0.1:1/0")
    p = argparse.ArgumentParser()
    cli.add_coordinator_arguments(p)
    root = logging.getLogger()
    before = signal.getsignal(signal.SIGUSR1)
    handlers_before, level_before = root.handlers[:], root.level
    try:
        signal.signal(signal.SIGUSR1, mine)
        assert cli.coordinator_main(p.parse_args([])) == 0
        assert signal.getsignal(signal.SIGUSR1) is mine
    finally:
        signal.signal(signal.SIGUSR1, before)
        root.handlers[:], root.level = handlers_before, level_before


def test_signal_stop_puts_back_the_handlers_it_found():
    """A program running the command in its own process (``rcoord.cli.main``, a test) gets its
    own SIGTERM and SIGINT handling back when the command ends; ``close()`` left both
    ignored, so that program's Ctrl-C did nothing from then on."""
    from rcoord.service.cli import SignalStop

    def mine(signum: int, frame: Any) -> None:
        pass

    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        signal.signal(signal.SIGTERM, mine)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        stop = threading.Event()
        signals = SignalStop(stop)
        assert signal.getsignal(signal.SIGTERM) == signals.handle
        signals.handle(signal.SIGTERM, None)  # (as the signal would)
        assert stop.wait(30)
        signals.close()
        assert signal.getsignal(signal.SIGTERM) is mine
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        for s, h in before.items():
            signal.signal(s, h)


def test_signal_stop_off_the_main_thread_leaves_no_pipe_behind(monkeypatch):
    """``signal.signal`` refuses a thread other than the main one (ValueError); SignalStop
    had opened its pipe and started the thread reading it by then, and left both behind."""
    from rcoord.service.cli import SignalStop

    opened: list[int] = []
    real_pipe = os.pipe

    def pipe() -> tuple[int, int]:
        fds = real_pipe()
        opened.extend(fds)
        return fds

    monkeypatch.setattr(os, "pipe", pipe)
    raised: list[BaseException] = []

    def make() -> None:
        try:
            SignalStop(threading.Event())
        except BaseException as exc:  # noqa: BLE001 - looked at below
            raised.append(exc)

    t = threading.Thread(target=make)
    t.start()
    t.join(30)
    assert len(raised) == 1 and isinstance(raised[0], ValueError)
    assert len(opened) == 2
    for fd in opened:
        with pytest.raises(OSError):
            os.fstat(fd)


def test_the_listener_forgets_the_subscribers_of_masters_gone(monkeypatch):
    """``_run_hints`` starts an expired-key subscriber thread per master that appears (a
    failover, a reshard); the listener kept every one it ever started, ended or not. Here
    each round finds a new master (the old one's subscriber has ended): one thread is kept."""
    from types import SimpleNamespace

    from rcoord.service import listener as listener_module
    from rcoord.service.events import EventQueue
    from rcoord.service.listener import Listener

    lis = Listener(SimpleNamespace(), "ns", 4, "chan", EventQueue(), deadlines=False, hints=True)
    changes = 20
    found: list[int] = []

    def node(port: int) -> Any:
        return SimpleNamespace(connection_pool=SimpleNamespace(
            connection_kwargs={"host": "10.0.0.1", "port": port}))

    def primaries(client: Any) -> list[Any]:
        for t in list(lis._threads):  # (each subscriber ends at once: see _run_keyspace)
            t.join()
        found.append(len(found))
        if len(found) == changes:
            lis._stop.set()
        return [node(7000 + len(found))]  # a new master each time

    monkeypatch.setattr(listener_module, "primaries", primaries)
    monkeypatch.setattr(listener_module, "REFRESH_S", 0.0)
    # (A subscriber that loses its master at once: the loop looks for the masters again.)
    monkeypatch.setattr(lis, "_run_keyspace", lambda n, a, q: lis._lost.set())
    lis._run_hints([node(7000)])
    assert len(found) == changes
    assert len(lis._threads) == 1


def test_the_listener_stop_joins_a_subscriber_started_as_it_began():
    """``_spawn`` lists a thread after starting it: a subscriber that ``_run_hints`` started as
    the stop began was missing from the list ``stop()`` took, and was never joined (it went on
    past the stop). Here the spawning thread lists it only once the stop has taken its list."""
    from types import SimpleNamespace

    from rcoord.service.events import EventQueue
    from rcoord.service.listener import Listener

    lis = Listener(SimpleNamespace(), "ns", 4, "chan", EventQueue(), deadlines=False, hints=False)
    real_lock, listed = lis._lock, threading.Event()
    spawner: list[threading.Thread] = []

    class Lock:
        """The spawner's listing waits until the stop has its list."""

        def __enter__(self) -> None:
            if spawner and threading.current_thread() is spawner[0]:
                assert listed.wait(30)
            real_lock.acquire()
            if lis._stop.is_set():
                listed.set()

        def __exit__(self, *exc: object) -> None:
            real_lock.release()

    subscriber_ended = threading.Event()

    def subscriber() -> None:
        lis._stop.wait()
        subscriber_ended.set()

    def run_hints() -> None:
        lis._stop.wait()  # (as _run_hints, between its check of the flag and its spawn)
        spawner.append(threading.current_thread())
        lis._spawn(subscriber, "rcoord-hints-x")

    lis._spawn(run_hints, "rcoord-hints")
    lis._lock = Lock()  # type: ignore[assignment]
    joined: list[str] = []
    real_join = threading.Thread.join

    def join(self: threading.Thread, timeout: float | None = None) -> None:
        joined.append(self.name)
        real_join(self, timeout)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(threading.Thread, "join", join)
        lis.stop(30)
    assert joined == ["rcoord-hints", "rcoord-hints-x"]
    assert subscriber_ended.is_set()


def test_coordinator_restarts_itself_when_num_partitions_changes(redis_server, single_client, namespace, procs):
    _setup(single_client, namespace)  # 50 partitions, no groups yet
    procs.append(Proc(redis_server.url, namespace, "c1"))
    GroupCoordinator(single_client, CoordinatorConfig(namespace=namespace, num_partitions=10)).start()
    assert procs[0].proc.wait(timeout=15) == 3  # its supervisor starts it again with 10


def test_coordinator_connects_as_an_acl_user(redis_server, single_client, namespace, procs):
    """A Redis ACL user in the URL (user:password@), as managed deployments require."""
    single_client.execute_command("ACL", "SETUSER", "rcoord-svc", "on", ">s3cret", "~*", "&*", "+@all")
    try:
        _setup(single_client, namespace)
        url = redis_server.url.replace("redis://", "redis://rcoord-svc:s3cret@")
        procs.append(Proc(url, namespace, "acl"))
        wait_until(lambda: procs[0].health().get("leases") == 50, timeout_s=10)
    finally:
        procs[0].stop() if procs else None
        single_client.execute_command("ACL", "DELUSER", "rcoord-svc")


def test_service_writes_its_named_settings_again_after_data_loss(redis_server, single_client, namespace, procs):
    """Issue 8: settings named by the service (the broker's part) come back after a data loss,
    so members configured for a lowered minimum session timeout can join again."""
    procs.append(Proc(redis_server.url, namespace, "owner", "--set", "group_min_session_timeout_ms=100"))
    key = f"{namespace}:settings"
    assert single_client.hget(key, "group_min_session_timeout_ms") == b"100"
    for k in list(single_client.scan_iter(match=f"{namespace}:*", count=1000)):
        single_client.delete(k)
    member = GroupCoordinator(single_client, CoordinatorConfig(namespace=namespace))
    wait_until(lambda: single_client.hget(key, "group_min_session_timeout_ms") == b"100", timeout_s=10)
    assert member.join_group("g", **{**JOIN, "session_timeout_ms": 150}).error == Errors.MEMBER_ID_REQUIRED


def test_service_rejects_an_unknown_setting(redis_server, namespace):
    out = subprocess.run(
        [sys.executable, "-m", "rcoord.service", "--redis-url", redis_server.url, "--namespace", namespace,
         "--set", "group_min_sesion_timeout_ms=100"],
        capture_output=True, text=True, timeout=30, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert out.returncode == 2
    assert "unknown group setting" in out.stderr and "group_min_sesion_timeout_ms" in out.stderr


def _in_process(url: str, namespace: str, cid: str, **settings: int) -> Any:
    from rcoord.service.service import CoordinatorService, ServiceConfig

    return CoordinatorService(ServiceConfig(redis_url=url, namespace=namespace, coordinator_id=cid,
                                            lease_ttl_ms=200, wake="index", settings=settings)).start()


def _lease_rounds(svcs: list[Any], rounds: int) -> None:
    """Wait until every service has completed ``rounds`` more lease rounds."""
    seen: list[set[float]] = [{s._last_lease_ok} for s in svcs]

    def done() -> bool:
        for s, times in zip(svcs, seen):
            times.add(s._last_lease_ok)
        return all(len(t) > rounds for t in seen)

    wait_until(done, timeout_s=10)


def test_services_naming_different_settings_do_not_rewrite_each_other(redis_server, single_client,
                                                                      namespace, caplog):
    """Two processes naming different values (a rolling change of --set): the one started last
    wrote its value; the other adopts it, warns once, and nobody writes again every round."""
    caplog.set_level("INFO", logger="rcoord")
    key = f"{namespace}:settings"
    svcs = [_in_process(redis_server.url, namespace, "ten", group_max_size=10)]
    try:
        svcs.append(_in_process(redis_server.url, namespace, "twenty", group_max_size=20))
        version = single_client.hget(key, "version")
        wait_until(lambda: svcs[0]._coord.config.group_max_size == 20, timeout_s=10)
        _lease_rounds(svcs, 5)
        assert single_client.hget(key, "version") == version
        assert single_client.hget(key, "group_max_size") == b"20"
        # ("ten"'s lease rounds' own: not another test's service, still ending in this process.)
        overridden = [r for r in caplog.records
                      if getattr(r, "event", None) == "settings_overridden"
                      and r.thread == svcs[0]._lease_thread.ident]
        assert len(overridden) == 1 and "group_max_size=10" in overridden[0].getMessage()
        # Lost settings are still written again by a process that names them.
        single_client.delete(key)
        wait_until(lambda: single_client.hget(key, "group_max_size") in (b"10", b"20"), timeout_s=10)
        _lease_rounds(svcs, 5)
        settled = single_client.hget(key, "version")
        _lease_rounds(svcs, 5)
        assert single_client.hget(key, "version") == settled
        assert svcs[0]._coord.config.group_max_size == svcs[1]._coord.config.group_max_size
    finally:
        for s in svcs:
            s.stop()


@pytest.fixture
def events() -> Iterator[EventLog]:
    # (DEBUG: each failed turn of the timer loop is a ``loop_retry`` there.)
    with handling(EventLog(), "rcoord", logging.DEBUG) as handler:
        yield handler


def _fcalls(client: Any) -> int:
    return int(client.info("commandstats").get("cmdstat_fcall", {}).get("calls", 0))


def _over_maxmemory(client: Any) -> None:
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("maxmemory", str(int(client.info("memory")["used_memory"]) // 2))


def test_timer_loop_waits_while_redis_refuses_writes(own_server, namespace, events):
    """Out of memory, expire_deadlines is refused for every group: the timer loop waits between
    turns (a loop error each) instead of asking again at once, and catches up once memory is
    freed."""
    client = own_server.client()
    coord = _setup(client, namespace)
    mids = {g: _lonely_member(coord, g) for g in ("g1", "g2", "g3")}
    svc = _in_process(own_server.url, namespace, "oom", group_min_session_timeout_ms=10,
                      group_initial_rebalance_delay_ms=0)
    runner = threading.Thread(target=svc.run, daemon=True)
    try:
        _over_maxmemory(client)
        runner.start()
        wait_until(lambda: events.count("loop_retry") >= 2, timeout_s=10)
        assert events.count("expire_error") == 0  # not blamed on the groups
        assert events.count("loop_error") == 1  # once per outage
        calls = _fcalls(client)
        wait_until(lambda: events.count("loop_retry") >= 4, timeout_s=10)
        # One turn between two loop errors: a bounded number of calls, not a spin.
        assert _fcalls(client) - calls < 500  # lease rounds included; the spin made thousands
        client.config_set("maxmemory", "0")
        wait_until(lambda: not any(_is_member(coord, g, m) for g, m in mids.items()), timeout_s=20)
    finally:
        client.config_set("maxmemory", "0")
        svc.stop()
        runner.join(10)
    assert not runner.is_alive()


def test_a_failing_timer_loop_is_logged_once_per_outage(own_server, namespace, caplog,
                                                         monkeypatch):
    """The timer loop's turns failing (Redis down; or out of memory, where only the turns that
    write fail and the others answer): one ``loop_error`` warning when it starts and one
    ``loop_error_over`` line once turns have succeeded for ``LOOP_QUIET_MS``, each failed turn
    at DEBUG only, as the lease rounds and the nodes log theirs (``nodes.Outage``). Before,
    every failed turn was a warning: about one a second for as long as Redis was down."""
    import redis as redis_lib

    from rcoord.service import service

    monkeypatch.setattr(service, "LOOP_QUIET_MS", 300)
    svc = _in_process(own_server.url, namespace, "outage-once")
    failing = threading.Event()
    calls: list[int] = []
    real_next_due = svc.sweeper.next_due

    def next_due() -> float:
        calls.append(1)
        if failing.is_set() and len(calls) % 4 == 1:  # (two a turn: every other turn fails)
            raise redis_lib.ConnectionError("Redis went away (test)")
        return real_next_due()

    def events(name: str) -> list[logging.LogRecord]:
        # (The timer loop's own: not another test's service, or its loop left behind, still
        # failing in this process.)
        loop = svc._timer_thread
        return [r for r in caplog.records if getattr(r, "event", None) == name
                and loop is not None and r.thread == loop.ident]

    runner = threading.Thread(target=svc.run, daemon=True)
    try:
        with caplog.at_level(logging.DEBUG, logger="rcoord.service"):
            runner.start()
            wait_until(lambda: svc.health()[0], timeout_s=10)
            svc.sweeper.next_due = next_due  # type: ignore[method-assign]
            failing.set()
            wait_until(lambda: len(events("loop_retry")) >= 6, timeout_s=20)
            failing.clear()
            wait_until(lambda: events("loop_error_over"), timeout_s=10)
        warned = [r for r in events("loop_error") if r.levelno >= logging.WARNING]
        assert len(warned) == 1, [r.getMessage() for r in warned]
        assert events("loop_error_over")[0].failures >= 6
    finally:
        failing.clear()
        svc.stop()
        runner.join(10)


def test_stop_ends_the_timer_loop_with_many_refused_due_groups(own_server, namespace):
    """520 due groups in one partition (more than one batch), every call refused: stop() still
    ends run()."""
    client = own_server.client()
    cfg = {"num_partitions": 1, "group_min_session_timeout_ms": 10, "group_initial_rebalance_delay_ms": 0}
    coord = GroupCoordinator(client, CoordinatorConfig(namespace=namespace, **cfg)).start()
    for i in range(520):
        coord.join_group(f"g{i}", **{**JOIN, "session_timeout_ms": 50})
    wait_until(lambda: int(client.zcount(coord._keys("g0").partition.due, 0, _server_ms(client))) == 520)
    svc = _in_process(own_server.url, namespace, "stuck", **cfg)
    runner = threading.Thread(target=svc.run, daemon=True)
    try:
        _over_maxmemory(client)
        calls = _fcalls(client)
        runner.start()
        wait_until(lambda: _fcalls(client) > calls, timeout_s=10)  # sweeping, refused
        svc.stop()
        runner.join(10)
        assert not runner.is_alive()
    finally:
        client.config_set("maxmemory", "0")
        svc.stop()


def test_a_group_whose_call_fails_is_backed_off_and_the_others_expire(own_server, namespace, events):
    """A group whose expire_deadlines fails (here: its record is not a hash) is retried later,
    left out of the next deadline meanwhile; the other due groups of its partition expire."""
    from rcoord.service.metrics import Metrics
    from rcoord.service.sweeper import Sweeper

    client = own_server.client()
    coord = GroupCoordinator(client, CoordinatorConfig(
        namespace=namespace, num_partitions=1, group_min_session_timeout_ms=10,
        group_initial_rebalance_delay_ms=0)).start()
    mid = _lonely_member(coord, "good")
    bad = coord._keys("bad")
    client.set(bad.group, "not a hash")
    client.zadd(bad.partition.due, {"bad": _server_ms(client) - 1000})
    sweeper = Sweeper(client, coord._scripts, namespace, 1, Metrics())
    sweeper.backoff_first_ms = 60_000  # no retry within the test
    sweeper.sync_clock()
    wait_until(lambda: (sweeper.resync({0}), sweeper.next_due() <= sweeper.server_now())[1])
    wait_until(lambda: not _is_member(coord, "good", mid),
               step=lambda: sweeper.sweep_due("deadline"), timeout_s=10)
    assert (0, "bad") in sweeper.backed_off
    assert sweeper.next_due() > sweeper.server_now()  # nothing due: the loop would wait
    calls = _fcalls(client)
    assert sweeper.sweep_due("deadline") == 0
    sweeper.resync({0})
    assert sweeper.next_due() > sweeper.server_now() and _fcalls(client) == calls
    assert events.count("expire_error") == 1


def test_stop_closes_the_connections_start_opened(own_server, namespace):
    client = own_server.client()
    base = len(client.client_list())
    for i in range(2):
        svc = _in_process(own_server.url, namespace, f"cycle{i}")
        runner = threading.Thread(target=svc.run, daemon=True)
        runner.start()
        wait_until(lambda: len(client.client_list()) > base)
        svc.stop()
        runner.join(10)
        assert not runner.is_alive()
        wait_until(lambda: len(client.client_list()) == base, timeout_s=10)


def test_a_lease_round_in_progress_at_stop_does_not_take_the_leases_back(own_server, namespace):
    """stop() released the leases while a lease round was still running (a slow registry
    node); the round then took every lease back and put the process in the registry again,
    so the others waited for them to lapse. Now the release waits for the round, and no round
    runs after it."""
    from rcoord.service.service import CoordinatorService, ServiceConfig

    svc = CoordinatorService(ServiceConfig(redis_url=own_server.url, namespace=namespace,
                                           coordinator_id="leaver", lease_ttl_ms=5000,
                                           wake="index")).start()
    runner = threading.Thread(target=svc.run, daemon=True)
    runner.start()
    n = svc.group_config.num_partitions
    client = own_server.client()

    def held() -> list[int]:
        return [p for p in range(n)
                if client.get(PartitionKeys(namespace, p, n).lease) == b"leaver"]

    assert len(held()) == n
    entered, go_on = threading.Event(), threading.Event()
    register = svc.leases.register

    def held_up_register() -> list[str]:
        entered.set()
        go_on.wait(30)
        return register()

    svc.leases.register = held_up_register
    svc._lease_wake.set()
    assert entered.wait(10)
    stopper = threading.Thread(target=svc.stop, daemon=True)
    stopper.start()
    stopper.join(10)  # (returns after the stop's grace, the round still held up)
    assert not stopper.is_alive()
    go_on.set()
    svc._lease_thread.join(10)
    for thread in threading.enumerate():
        if thread.name == "rcoord-leave":
            thread.join(10)
    assert not svc._lease_thread.is_alive()
    assert client.zscore(f"{namespace}:coordinators", "leaver") is None
    assert held() == []
    assert svc.leases.step() == set() and held() == []  # (no round after the final release)
    runner.join(10)


def test_a_hint_for_a_partition_given_up_since_is_not_acted_on(own_server, namespace):
    """A late expiry hint, then a lease round that gave its partition away, heard in one drain
    of the timer loop's queue: the hint put the partition back in the sweeper's index after the
    round's resync took it out, and the process swept a partition another one held."""
    from rcoord.service.events import Hint, Owned

    client = own_server.client()
    coord = GroupCoordinator(client, CoordinatorConfig(
        namespace=namespace, num_partitions=2, group_min_session_timeout_ms=10,
        group_initial_rebalance_delay_ms=0)).start()
    group = next(f"g{i}" for i in range(100) if partition_for(f"g{i}", 2) == 1)
    _lonely_member(coord, group)  # (a deadline in partition 1)
    svc = _in_process(own_server.url, namespace, "hinted", num_partitions=2)
    try:
        owned = svc._handle(Owned(frozenset({0, 1})), set(), True)
        assert 1 in svc.sweeper.earliest
        owned = svc._handle(Hint(1, group), owned, True)
        assert svc._hinted == {1}
        owned = svc._handle(Owned(frozenset({0})), owned, True)
        assert 1 not in svc.sweeper.earliest
        if svc._hinted:  # (as the loop does after draining)
            svc._check_hints()
        assert 1 not in svc.sweeper.earliest and owned == {0}
    finally:
        svc.stop()


def test_a_failed_start_closes_what_it_opened(own_server, namespace):
    """A start that fails after the listener started (here: the user may not PUBLISH) stops the
    listener's threads and closes its connections, instead of leaving them reconnecting."""
    from rcoord.service.service import CoordinatorService, ServiceConfig

    client = own_server.client()
    client.execute_command("ACL", "SETUSER", "nopub", "on", ">pw", "~*", "&*", "+@all", "-publish")
    url = own_server.url.replace("redis://", "redis://nopub:pw@")
    earlier = set(threading.enumerate())  # another test's threads, still ending: not this start's
    svc = CoordinatorService(ServiceConfig(redis_url=url, namespace=namespace, lease_ttl_ms=200,
                                           coordinator_id="nopub"))
    with pytest.raises(Exception, match="(?i)publish|permission"):
        svc.start()

    def ours() -> list[Any]:
        return [c for c in client.client_list() if c.get("user") == "nopub"]

    wait_until(lambda: not ours(), timeout_s=10)
    wait_until(lambda: not [t for t in threading.enumerate() if t.name.startswith("rcoord-")
                            and t.is_alive() and t not in earlier], timeout_s=10)
    assert client.zscore(f"{namespace}:coordinators", "nopub") is None  # left the registry


def _channel_wakeups(svc: Any) -> float:
    return svc.metrics.registry.get_sample_value("rcoord_wakeups_total", {"source": "channel"}) or 0.0


def _publish_deadline(client: Any, svc: Any, namespace: str, p: int = 0) -> None:
    seconds, micros = client.time()
    channel = PartitionKeys(namespace, p, svc.group_config.num_partitions).due
    client.execute_command("SPUBLISH", channel, str(seconds * 1000 + micros // 1000))


def test_a_malformed_deadline_message_does_not_silence_the_channel(own_server, namespace):
    """Anyone allowed to publish can send anything to a deadline channel: a message that is not
    a deadline is ignored, and the listener goes on hearing the scripts' messages."""
    client = own_server.client()
    svc = _in_process(own_server.url, namespace, "garbage")
    threading.Thread(target=svc.run, daemon=True).start()
    try:
        wait_until(lambda: len(svc.leases.owned) == svc.group_config.num_partitions)
        channel = PartitionKeys(namespace, 0, svc.group_config.num_partitions).due
        client.execute_command("SPUBLISH", channel, "not a deadline")
        before = _channel_wakeups(svc)
        wait_until(lambda: _channel_wakeups(svc) > before,
                   lambda: _publish_deadline(client, svc, namespace), timeout_s=10)
    finally:
        svc.stop()


def test_a_listener_refused_its_channels_subscribes_again_once_allowed(own_server, namespace, caplog):
    """An ACL change that takes the user's channels away (Redis then drops its subscribers) makes
    every subscribe fail with NOPERM: the listener logs it once and retries, and hears deadlines
    again when the channels are given back, instead of its thread ending unnoticed."""
    client = own_server.client()
    client.execute_command("ACL", "SETUSER", "fickle", "on", ">pw", "~*", "&*", "+@all")
    svc = _in_process(own_server.url.replace("redis://", "redis://fickle:pw@"), namespace, "fickle")
    threading.Thread(target=svc.run, daemon=True).start()
    try:
        wait_until(lambda: len(svc.leases.owned) == svc.group_config.num_partitions)
        with caplog.at_level(logging.WARNING, logger="rcoord.service"):
            client.execute_command("ACL", "SETUSER", "fickle", "resetchannels")
            wait_until(lambda: any(getattr(r, "event", None) == "listener_error" for r in caplog.records),
                       timeout_s=10)
        client.execute_command("ACL", "SETUSER", "fickle", "&*")
        before = _channel_wakeups(svc)
        wait_until(lambda: _channel_wakeups(svc) > before,
                   lambda: _publish_deadline(client, svc, namespace), timeout_s=10)
    finally:
        svc.stop()
        client.execute_command("ACL", "DELUSER", "fickle")


def test_an_expired_key_whose_tag_is_not_utf8_does_not_drop_the_hints(own_server, namespace,
                                                                      caplog):
    """A key under the namespace shaped like a hint key but whose tag is not UTF-8 (anyone who
    may write there can let one expire): decoding it raised, which dropped the expired-key
    subscription (a warning, a reconnect) and lost the hints of the gap. It is no tag of ours:
    ignored, and the next hint is heard on the same subscription."""
    import queue

    from rcoord.partitioning import partition_tag
    from rcoord.service.events import Event, Hint
    from rcoord.service.listener import Listener

    client = own_server.client()
    heard: queue.Queue[Event] = queue.Queue()
    listener = Listener(client, namespace, 4, f"{namespace}:coordinators", heard,
                        deadlines=False, hints=True)
    caplog.set_level(logging.INFO, logger="rcoord.service")
    listener.start()
    try:
        wait_until(lambda: listener.hint_nodes != set(), timeout_s=10)
        for key in (f"{namespace}:{{".encode() + b"\xff}:h:x",
                    f"{namespace}:{{{partition_tag(1, 4)}}}:h:grp".encode()):
            client.set(key, b"1", px=1)
            wait_until(lambda k=key: not client.exists(k), timeout_s=10)  # (expired: an event)
        hints: list[Event] = []

        def heard_the_hint() -> bool:
            while not heard.empty():
                hints.append(heard.get())
            return Hint(1, "grp") in hints

        wait_until(heard_the_hint, timeout_s=10)
        assert not [r for r in caplog.records if getattr(r, "event", None) == "keyspace_lost"]
    finally:
        listener.stop()


def test_a_failing_subscription_is_retried_less_often_the_longer_it_fails():
    """Both kinds of subscription (the channels and each master's expired-key events) pause by
    ``Backoff``: short after the first failure, doubling to the cap, short again after a
    success; before, the expired-key one retried (and resynced the index) every 0.2 s for as
    long as a node stayed down."""
    from rcoord.service.listener import RETRY_FIRST_S, RETRY_MAX_S, Backoff

    backoff = Backoff()
    assert [backoff.next() for _ in range(6)] == [RETRY_FIRST_S, 0.4, 0.8, 1.6, RETRY_MAX_S,
                                                  RETRY_MAX_S]
    backoff.reset()
    assert backoff.next() == RETRY_FIRST_S


def _settings_errors(svc: Any, records: list[logging.LogRecord]) -> list[logging.LogRecord]:
    """The ``settings_error`` records of ``svc``'s lease thread (which adopts the settings):
    not another test's service, still ending in this process."""
    return [r for r in records if getattr(r, "event", None) == "settings_error"
            and r.thread == svc._lease_thread.ident]


def test_settings_stored_that_cannot_be_adopted_do_not_stop_the_lease_renewal(
        own_server, namespace, caplog):
    """Another party writes settings that contradict each other: the coordinator logs it once
    and keeps its own, and its leases go on being renewed. Before, the ConfigError ended the
    lease thread: the leases lapsed while the process went on sweeping as if it held them."""
    from rcoord.keys import settings_key

    client = own_server.client()
    svc = _in_process(own_server.url, namespace, "steady")
    try:
        wait_until(lambda: len(svc.leases.owned) == svc.group_config.num_partitions)
        with caplog.at_level(logging.ERROR, logger="rcoord.service"):
            client.hset(settings_key(namespace), mapping={
                "group_min_session_timeout_ms": "2000000", "group_max_session_timeout_ms": "1000"})
            client.hincrby(settings_key(namespace), "version", 1)
            wait_until(lambda: _settings_errors(svc, caplog.records))
            _lease_rounds([svc], 3)
        assert svc._lease_thread.is_alive()
        assert len(svc.leases.owned) == svc.group_config.num_partitions
        assert len(_settings_errors(svc, caplog.records)) == 1
    finally:
        svc.stop()


def test_a_settings_version_written_by_hand_is_repaired_or_named(own_server, namespace,
                                                                  caplog):
    """The settings hash's version edited into no integer under a running coordinator: with
    the partition copies there, the copies' version is adopted (as for settings rolled back
    below them); with none, the settings error names the field and what to write. Before,
    int()'s bare ValueError was the settings_error, and the version stayed unreadable."""
    from rcoord.keys import settings_key
    from rcoord.settings import anchor_keys, copy_pattern

    client = own_server.client()
    key = settings_key(namespace)
    svc = _in_process(own_server.url, namespace, "by-hand")
    try:
        with caplog.at_level(logging.INFO, logger="rcoord.service"):
            client.hset(key, "version", "abc")
            wait_until(lambda: client.hget(key, "version") == b"1")
            _lease_rounds([svc], 2)
            assert _settings_errors(svc, caplog.records) == []
            for copy in [*client.scan_iter(match=copy_pattern(namespace), count=1000),
                         *anchor_keys(namespace)]:
                client.delete(copy)
            client.hset(key, "version", "abc")
            wait_until(lambda: _settings_errors(svc, caplog.records))
        errors = _settings_errors(svc, caplog.records)
        assert "stored setting version" in errors[0].why and "version 1" in errors[0].why
        assert svc._lease_thread.is_alive() and svc.exit_code == 0
    finally:
        svc.stop()
        client.close()


def test_redis_failing_as_the_timer_loop_starts_is_waited_for(own_server, namespace, caplog):
    """The timer loop's first call (the clock's sync) failing is retried as any later failure
    is; before, it was made before the loop's error handling and ended the process."""
    import redis as redis_py

    svc = _in_process(own_server.url, namespace, "blip")
    real = svc.sweeper.sync_clock
    calls: list[int] = []

    def fail_once() -> None:
        calls.append(1)
        if len(calls) == 1:
            raise redis_py.exceptions.TimeoutError("Timeout reading from socket")
        real()

    svc.sweeper.sync_clock = fail_once
    thread = threading.Thread(target=svc.run, daemon=True)
    try:
        with caplog.at_level(logging.WARNING, logger="rcoord.service"):
            thread.start()
            wait_until(lambda: len(calls) >= 2 and svc._last_turn_ok > 0)
            turn = svc._last_turn_ok
            wait_until(lambda: svc._last_turn_ok > turn)
        assert thread.is_alive()
        assert any(getattr(r, "event", None) == "loop_error" for r in caplog.records)
    finally:
        svc.stop()
        thread.join(15)


def test_a_coordinator_whose_leases_are_unconfirmed_does_not_tail_their_events(own_server,
                                                                            namespace):
    """After a pause (SIGSTOP, a frozen VM) the leases may be another process's, which logged
    their events meanwhile: the events are tailed only while the leases were confirmed within a
    TTL. Before, the first turn after the pause logged and counted them a second time."""
    from rcoord.service.service import TAIL_MS

    svc = _in_process(own_server.url, namespace, "paused")
    polls: list[set[int]] = []
    real_poll = svc.tail.poll
    svc.tail.poll = lambda owned: (polls.append(set(owned)), real_poll(owned))[1]
    real_step, stalled = svc.leases.step, threading.Event()
    stalled.set()

    def step() -> Any:
        stalled.wait()  # a lease round that does not come back (the process paused)
        return real_step()

    thread = threading.Thread(target=svc.run, daemon=True)
    try:
        thread.start()
        wait_until(lambda: len(polls) >= 2)
        stalled.clear()
        svc.leases.step = step
        wait_until(lambda: not svc._leases_confirmed())
        seen, since = len(polls), time.monotonic()
        # A turn of the timer loop four tail intervals later (it turns at least once each).
        wait_until(lambda: svc._last_turn_ok > since + 4 * TAIL_MS / 1000)
        assert len(polls) <= seen + 1  # (one may have begun as the TTL ran out)
        stalled.set()
        wait_until(lambda: len(polls) > seen + 1)
    finally:
        stalled.set()
        svc.stop()
        thread.join(15)


def test_a_lease_ttl_too_long_to_wait_is_a_config_error():
    from rcoord.errors import ConfigError
    from rcoord.service.service import ServiceConfig

    with pytest.raises(ConfigError, match=r"lease_ttl_ms must be in 100\.\.86400000"):
        ServiceConfig(redis_url="redis://127.0.0.1:1", lease_ttl_ms=40_000_000_000_000)


@pytest.mark.parametrize("bad", [5, "", "a\nb", "x" * 256, None])
def test_a_coordinator_id_that_is_not_a_printable_str_is_a_config_error(bad):
    """``ServiceConfig(coordinator_id=5)`` failed the start with a TypeError in the lease
    round's sort of the live ids; a line break would split every log line naming it."""
    from rcoord.errors import ConfigError
    from rcoord.service.service import ServiceConfig

    with pytest.raises(ConfigError, match="coordinator_id must be a str of 1 to 255 printable"):
        ServiceConfig(redis_url="redis://127.0.0.1:1", coordinator_id=bad)
    assert ServiceConfig(redis_url="redis://127.0.0.1:1", coordinator_id="c-1 ü").coordinator_id


def test_a_metrics_port_in_use_fails_the_start_before_any_lease_is_taken(own_server, namespace):
    """The HTTP port is bound before the lease round: a port already taken is a configuration
    error, and the other coordinators never see this process join, take partitions and leave."""
    from rcoord.errors import ConfigError
    from rcoord.service.service import CoordinatorService, ServiceConfig

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    port = taken.getsockname()[1]
    client = own_server.client()
    watch = client.pubsub()
    watch.psubscribe(f"{namespace}:*")
    assert watch.get_message(timeout=5)["type"] == "psubscribe"
    svc = CoordinatorService(ServiceConfig(redis_url=own_server.url, namespace=namespace,
                                           coordinator_id="taken", lease_ttl_ms=200,
                                           metrics_port=port))
    try:
        with pytest.raises(ConfigError, match=f"127.0.0.1:{port}.*metrics port"):
            svc.start()
        assert watch.get_message(timeout=0.5) is None  # no "joined", no "left"
        assert client.zscore(f"{namespace}:coordinators", "taken") is None
    finally:
        watch.close()
        taken.close()


def test_a_server_that_never_answers_fails_the_start_instead_of_hanging(namespace):
    """A black-holed connection (accepted, never answered; TCP reports it only after hours):
    the service's calls time out after a lease TTL (at least a second) and fail, as every later
    call of its loops would, to be retried on a new connection."""
    import redis

    from rcoord.service.service import CoordinatorService, ServiceConfig

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    accepted: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                accepted.append(silent.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    outcome: list[BaseException] = []

    def start() -> None:
        try:
            CoordinatorService(ServiceConfig(
                redis_url=f"redis://127.0.0.1:{silent.getsockname()[1]}/0", namespace=namespace,
                lease_ttl_ms=200)).start()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            outcome.append(exc)

    starter = threading.Thread(target=start, daemon=True)
    try:
        starter.start()
        wait_until(lambda: not starter.is_alive(), timeout_s=30)
        assert accepted and len(outcome) == 1
        assert isinstance(outcome[0], redis.TimeoutError), repr(outcome[0])
    finally:
        silent.close()
        for conn in accepted:
            conn.close()


def test_a_stuck_timer_loop_is_reported_then_gives_its_leases_up(own_server, namespace):
    """The lease thread keeps renewing while the timer loop is stuck (here: blocked in a call):
    /healthz must not say ok at once, since the leased partitions are not swept; once the loop has
    been stuck for STALLED_MIN_MS the process releases its leases and leaves the registry, so
    another process sweeps them; it takes leases again when the loop moves."""
    from rcoord.service.service import STALLED_MIN_MS

    registry = own_server.client()
    assert STALLED_MIN_MS > 2 * 200  # the test's lease TTL: reported first, released later
    svc = _in_process(own_server.url, namespace, "stuck-loop")
    blocked, entered, release = threading.Event(), threading.Event(), threading.Event()
    real_next_due = svc.sweeper.next_due

    def next_due() -> float:
        if blocked.is_set():
            entered.set()
            release.wait()
        return real_next_due()

    runner = threading.Thread(target=svc.run, daemon=True)
    try:
        runner.start()
        wait_until(lambda: svc.health()[0], timeout_s=10)
        svc.sweeper.next_due = next_due  # type: ignore[method-assign]
        blocked.set()
        wait_until(entered.is_set, timeout_s=10)


        def stuck_loop_reported() -> bool:
            ok, status = svc.health()
            # Unhealthy because of the timer loop, while the leases are renewed.
            return (not ok and status["last_timer_turn_ms_ago"] >= 400
                    and status["last_lease_round_ms_ago"] < 400)

        wait_until(stuck_loop_reported, timeout_s=10)
        assert svc.leases.owned  # still held: a slow turn is not yet a stuck one

        def gave_up() -> bool:
            return (not svc.leases.owned and svc.health()[1]["leases"] == 0
                    and registry.zscore(f"{namespace}:coordinators", "stuck-loop") is None)

        wait_until(gave_up, timeout_s=10)
        blocked.clear()
        release.set()
        wait_until(lambda: svc.health()[0], timeout_s=10)  # healthy again once it moves
        wait_until(lambda: svc.health()[1]["leases"] > 0, timeout_s=10)
        assert registry.zscore(f"{namespace}:coordinators", "stuck-loop") is not None
    finally:
        blocked.clear()
        release.set()
        svc.stop()
        runner.join(10)


def test_a_backlog_is_applied_in_turns_that_each_end_soon(own_server, namespace):
    """1,100 due groups in one partition (a takeover after an outage): one sweep_due with no
    time left after its first batch applies that batch and leaves the rest due, for the next
    turns (before, one call applied them all: with 40,000 groups, turns of 6-12 s that looked
    like a stuck loop, and every lease was given up)."""
    from rcoord.service.metrics import Metrics
    from rcoord.service.sweeper import DUE_BATCH, Sweeper

    client = own_server.client()
    cfg = {"num_partitions": 1, "group_min_session_timeout_ms": 10,
           "group_initial_rebalance_delay_ms": 0}
    coord = GroupCoordinator(client, CoordinatorConfig(namespace=namespace, **cfg)).start()
    n = 1100
    for i in range(n):
        coord.join_group(f"g{i}", **{**JOIN, "session_timeout_ms": 50})
    due_key = coord._keys("g0").partition.due

    def due_now() -> int:
        return int(client.zcount(due_key, 0, _server_ms(client)))

    wait_until(lambda: due_now() == n)
    sweeper = Sweeper(client, coord._scripts, namespace, 1, Metrics())
    sweeper.turn_budget_ms = 0  # no time left after the first batch
    sweeper.sync_clock()
    sweeper.resync({0})
    began = time.monotonic()
    sweeper.sweep_due("deadline")
    assert due_now() >= n - DUE_BATCH  # one batch applied; the others wait for the next turn
    assert sweeper.next_due() <= sweeper.server_now()  # so the next turn starts at once
    assert sweeper.last_progress >= began  # a sign of life for the stuck-loop check
    wait_until(lambda: due_now() == 0, step=lambda: sweeper.sweep_due("deadline"),
               timeout_s=30)


def test_a_timer_loop_that_redis_refuses_keeps_its_leases(own_server, namespace, events):
    """A timer loop whose calls fail (Redis unreachable for it) waits and tries again, at most
    a second apart: alive, not stuck, so it keeps its leases past STALLED_MIN_MS (before, it
    gave them all up while its lease rounds succeeded, and its retry wait grew to 5 s, so
    deadlines came seconds late once Redis answered)."""
    import redis as redis_lib

    from rcoord.service.service import LOOP_PAUSE_MAX_MS, LOOP_PAUSE_MS, STALLED_MIN_MS

    # The waits of six failed turns add up to more than STALLED_MIN_MS.
    waits, pause = 0, LOOP_PAUSE_MS
    for _ in range(5):
        waits, pause = waits + pause, min(LOOP_PAUSE_MAX_MS, pause * 2)
    assert waits > STALLED_MIN_MS
    svc = _in_process(own_server.url, namespace, "refused-loop")
    failing = threading.Event()
    real_next_due = svc.sweeper.next_due

    def next_due() -> float:
        if failing.is_set():
            raise redis_lib.ConnectionError("Redis went away (test)")
        return real_next_due()

    runner = threading.Thread(target=svc.run, daemon=True)
    try:
        runner.start()
        wait_until(lambda: svc.health()[0] and svc.leases.owned, timeout_s=10)
        svc.sweeper.next_due = next_due  # type: ignore[method-assign]
        failing.set()
        wait_until(lambda: events.count("loop_retry") >= 6, timeout_s=20)
        assert events.count("timer_loop_stalled") == 0
        assert svc.leases.owned and not svc.health()[0]  # unhealthy (failing), leases kept
        failing.clear()
        wait_until(lambda: svc.health()[0], timeout_s=10)
        assert svc.leases.owned
    finally:
        failing.clear()
        svc.stop()
        runner.join(10)


def test_a_partitions_next_holder_logs_from_where_the_last_one_stopped(own_server, namespace):
    """The events a holder had not read when it lost a partition (it died, or handed it over),
    and those of the new holder's first sweep, are logged and counted by the new holder: it
    goes on from the partition's stored tail (before, it started at the stream's end, and the
    expiries of every takeover went unlogged)."""
    from rcoord.service.metrics import Metrics
    from rcoord.service.observe import EventTail

    client = own_server.client()
    coord = GroupCoordinator(client, CoordinatorConfig(
        namespace=namespace, num_partitions=1, group_min_session_timeout_ms=10,
        group_initial_rebalance_delay_ms=0)).start()
    first = EventTail(client, namespace, 1, Metrics())
    assert first.poll({0}) == 0  # the partition's first holder starts at the stream's end
    _lonely_member(coord, "before")
    logged = first.poll({0})
    assert logged > 0  # the group's transitions
    _lonely_member(coord, "after")  # the first holder dies before reading these
    events = coord._keys("after").partition.events
    unread = len(client.xrange(events, min=b"(" + first._last[0]))
    assert unread > 0
    metrics = Metrics()
    second = EventTail(client, namespace, 1, metrics)
    assert second.poll({0}) == 0  # takes the partition: goes on from the stored tail
    assert second.poll({0}) == unread
    assert second.poll({0}) == 0


def test_turns_that_end_on_their_budget_take_the_due_partitions_in_turn(own_server, namespace,
                                                                       monkeypatch):
    """Batches of 5 (DUE_BATCH, patched), no time after the first batch: each turn starts at
    another due partition, so one partition's backlog does not hold the others back."""
    from rcoord.service import sweeper as sweeper_mod
    from rcoord.service.metrics import Metrics

    monkeypatch.setattr(sweeper_mod, "DUE_BATCH", 5)
    client = own_server.client()
    coord = GroupCoordinator(client, CoordinatorConfig(
        namespace=namespace, num_partitions=2, group_min_session_timeout_ms=10,
        group_initial_rebalance_delay_ms=0)).start()
    for i in range(40):
        coord.join_group(f"g{i}", **{**JOIN, "session_timeout_ms": 50})
    dues = [PartitionKeys(namespace, p, 2).due for p in range(2)]

    def due_now() -> list[int]:
        now = _server_ms(client)
        return [int(client.zcount(key, 0, now)) for key in dues]

    wait_until(lambda: sum(due_now()) == 40)
    start = due_now()
    assert min(start) > 5  # both partitions have more than one batch due
    sweeper = sweeper_mod.Sweeper(client, coord._scripts, namespace, 2, Metrics())
    sweeper.turn_budget_ms = 0
    sweeper.sync_clock()
    sweeper.resync({0, 1})
    sweeper.sweep_due("deadline")
    sweeper.sweep_due("deadline")
    assert [a - b for a, b in zip(start, due_now(), strict=True)] == [5, 5]


def test_a_burst_of_resubscriptions_rereads_the_index_once(own_server, namespace):
    """The deadline listener queues a Resync per channel it subscribes (one per partition), so
    a reconnect queued as many as there are partitions, and the timer loop re-read every
    partition's earliest deadline for each one: partitions² calls (seconds with 1,000
    partitions), with no deadline applied meanwhile. Now a drain of the queue re-reads the
    index once, however many Resyncs it held."""
    from rcoord.service.events import Resync

    svc = _in_process(own_server.url, namespace, "burst", num_partitions=8)
    runner = threading.Thread(target=svc.run, daemon=True)
    try:
        reads: list[set[int]] = []
        resync = svc.sweeper.resync

        def counted(owned: set[int]) -> None:
            reads.append(set(owned))
            resync(owned)

        svc.sweeper.resync = counted
        for _ in range(200):  # (a reconnect of a listener hearing 200 partitions)
            svc._queue.put(Resync())
        runner.start()
        wait_until(svc._queue.empty, timeout_s=10)
        drained = time.monotonic()
        wait_until(lambda: svc._last_turn_ok > drained, timeout_s=10)  # that turn has ended
        # The start's Owned, the burst, the first turn's periodic re-read (and another if this
        # machine is slow enough for a second one): not one per Resync.
        assert 2 <= len(reads) <= 5, len(reads)
        assert all(owned == set(range(8)) for owned in reads)
    finally:
        svc.stop()
        runner.join(10)


@pytest.mark.parametrize("host", ["no-such-host.invalid", "192.0.2.1"])  # (192.0.2.1: TEST-NET)
def test_a_metrics_host_that_cannot_be_served_names_its_flag_and_variable(monkeypatch, capsys,
                                                                          host):
    """A name that does not resolve, or an address not of this machine, is refused before the
    service connects, named as ``--metrics-host`` and the variable it came from: it was found
    only when the service started ("cannot serve /metrics on ..."), naming neither."""
    import argparse

    from rcoord.service.cli import add_coordinator_arguments, coordinator_main

    monkeypatch.setenv("RCOORD_REDIS_URL", "redis://127.0.0.1:1/0")  # (never reached)
    monkeypatch.setenv("RCOORD_METRICS_PORT", "0")
    monkeypatch.setenv("RCOORD_METRICS_HOST", host)
    p = argparse.ArgumentParser()
    add_coordinator_arguments(p)
    assert coordinator_main(p.parse_args([])) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1
    assert f"error: --metrics-host {host!r} (from $RCOORD_METRICS_HOST): cannot serve" in lines[0]
    monkeypatch.delenv("RCOORD_METRICS_HOST")
    p = argparse.ArgumentParser()
    add_coordinator_arguments(p)
    assert coordinator_main(p.parse_args(["--metrics-host", host])) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and f"error: --metrics-host {host!r}: cannot serve" in lines[0]
    assert "$RCOORD_" not in lines[0]
