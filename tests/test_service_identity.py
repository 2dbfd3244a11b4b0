"""A coordinator id is one process's: a second process given it is refused, one whose id was
taken stops and releases nothing, one restarted under the id of one that died takes it over."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from harness import EventLog, handling, wait_until
from test_service import ROOT, Proc

from rcoord.errors import ConfigError
from rcoord.keys import PartitionKeys
from rcoord.scripts import Scripts
from rcoord.service.leases import (
    CoordinatorIdInUse,
    LeaseKeeper,
    StoppedBeforeClaim,
    died_here,
    this_machine,
)

TTL_MS = 400
"""Where a test waits for a claim to lapse."""
LIVE_TTL_MS = 2000
"""Where a claim must not lapse under a process that runs (a loaded machine's late round)."""


def _service(url: str, namespace: str, cid: str, ttl_ms: int = TTL_MS,
             **settings: int) -> Any:
    from rcoord.service.service import CoordinatorService, ServiceConfig

    return CoordinatorService(ServiceConfig(
        redis_url=url, namespace=namespace, coordinator_id=cid, lease_ttl_ms=ttl_ms,
        wake="index", settings={"num_partitions": 4, **settings}, retention_check_interval_ms=0))


@pytest.fixture
def services() -> Iterator[list[tuple[Any, threading.Thread]]]:
    started: list[tuple[Any, threading.Thread]] = []
    yield started
    for svc, thread in started:
        svc.stop()
        thread.join(15)


def _run(services: list[tuple[Any, threading.Thread]], svc: Any) -> Any:
    thread = threading.Thread(target=svc.run, daemon=True)
    thread.start()
    services.append((svc, thread))
    return svc


def _holders(client: Any, namespace: str) -> list[bytes | None]:
    return [client.get(PartitionKeys(namespace, p, 4).lease) for p in range(4)]


def test_a_second_process_given_a_running_ones_id_is_refused_and_changes_nothing(
        own_server, namespace, services):
    """Before: it started, and both processes held every lease of the id (each swept and
    logged the same partitions); stopping either released the other's."""
    client = own_server.client()
    a = _run(services, _service(own_server.url, namespace, "twin", LIVE_TTL_MS).start())
    wait_until(lambda: a.leases.owned == {0, 1, 2, 3})
    with pytest.raises(CoordinatorIdInUse, match="'twin'.*in use by another running process"
                       ".*own id") as refused:
        _service(own_server.url, namespace, "twin", LIVE_TTL_MS).start()
    assert isinstance(refused.value, ConfigError)  # (the CLI: exit status 2, one line)
    assert refused.value.holder == a.leases.incarnation
    # Its failed start released nothing of the running process's.
    assert _holders(client, namespace) == [b"twin"] * 4
    assert client.zscore(f"{namespace}:coordinators", "twin") is not None
    rounds = a._last_lease_ok
    wait_until(lambda: a._last_lease_ok > rounds)
    assert a.leases.owned == {0, 1, 2, 3} and a.health()[0]


def test_a_process_refused_its_id_writes_none_of_the_settings_it_names(own_server, namespace,
                                                                       services):
    """Before: the refused process had settled the namespace settings first, writing the ones
    it named over the running process's (which then adopted them)."""
    client = own_server.client()
    key = f"{namespace}:settings"
    a = _run(services, _service(own_server.url, namespace, "twin", LIVE_TTL_MS,
                                group_min_session_timeout_ms=100).start())
    wait_until(lambda: a.leases.owned == {0, 1, 2, 3})
    stored = client.hgetall(key)
    with pytest.raises(CoordinatorIdInUse):
        _service(own_server.url, namespace, "twin", LIVE_TTL_MS,
                 group_min_session_timeout_ms=200).start()
    assert client.hgetall(key) == stored
    assert client.hget(key, "group_min_session_timeout_ms") == b"100"


def test_a_process_whose_id_was_taken_while_it_was_paused_stops_and_releases_nothing(
        own_server, namespace, services):
    """A's lease thread pauses past the TTL; B starts under the same id and takes the leases;
    A's next round finds the id taken: A stops (exit status 2) and its stop leaves B's leases
    and registry entry alone. Before: A went on sharing every lease with B, and stopping A
    deleted them."""
    client = own_server.client()
    a = _run(services, _service(own_server.url, namespace, "twin", 1000).start())
    wait_until(lambda: a.leases.owned == {0, 1, 2, 3})
    step, entered, go_on = a.leases.step, threading.Event(), threading.Event()

    def paused_step() -> set[int]:
        entered.set()
        go_on.wait(30)
        return step()

    a.leases.step = paused_step
    assert entered.wait(10)
    wait_until(lambda: _holders(client, namespace) == [None] * 4)  # A's leases lapsed
    with handling(EventLog(), "rcoord", logging.INFO) as log:
        b = _run(services, _service(own_server.url, namespace, "twin", 1000).start())
        wait_until(lambda: b.leases.owned == {0, 1, 2, 3})
        go_on.set()
        wait_until(lambda: a._stop.is_set())
    assert "coordinator_id_taken" in log.seen
    assert a.exit_code == 2 and not a.leases.owned
    _, thread = services.pop(0)
    a.stop()
    thread.join(15)
    assert _holders(client, namespace) == [b"twin"] * 4
    assert client.zscore(f"{namespace}:coordinators", "twin") is not None
    rounds = b._last_lease_ok
    wait_until(lambda: b._last_lease_ok > rounds)
    assert b.leases.owned == {0, 1, 2, 3} and b.health()[0]


def test_a_process_restarted_under_the_id_of_one_that_died_takes_its_leases(
        own_server, namespace, services):
    """The process that died (a keeper that stops its rounds) left its claim and leases: the
    new one waits for the claim to lapse, then holds every lease. The dead one's TTL was
    longer than the new one's: the wait is the dead one's (the claim of a process that no
    longer renews it was taken for a running process's, and the restart refused). After a
    stop, which frees the claim, a new one starts without waiting for it."""
    client = own_server.client()
    first = _service(own_server.url, namespace, "phoenix").start()  # (settles 4 partitions)
    first.stop()
    scripts = Scripts(client)
    scripts.load()
    died = LeaseKeeper(client, scripts, namespace, 4, "phoenix", LIVE_TTL_MS)
    died.claim_id(threading.Event())
    assert died.step() == {0, 1, 2, 3}
    with handling(EventLog(), "rcoord", logging.INFO) as log:
        b = _run(services, _service(own_server.url, namespace, "phoenix").start())
    assert "coordinator_id_held" in log.seen  # (it waited for the claim to lapse)
    assert b.leases.owned == {0, 1, 2, 3}
    assert _holders(client, namespace) == [b"phoenix"] * 4
    services.pop()[0].stop()
    with handling(EventLog(), "rcoord", logging.INFO) as log:
        c = _run(services, _service(own_server.url, namespace, "phoenix").start())
    assert "coordinator_id_held" not in log.seen
    assert c.leases.owned == {0, 1, 2, 3}


def test_the_cli_refuses_an_id_a_running_process_uses(redis_server, namespace):
    first = Proc(redis_server.url, namespace, "twin")
    try:
        wait_until(lambda: first.health().get("leases") == 50, timeout_s=10)
        second = subprocess.run(
            [sys.executable, "-m", "rcoord.service", "--redis-url", redis_server.url,
             "--namespace", namespace, "--id", "twin", "--lease-ttl-ms", "1000"],
            capture_output=True, text=True, timeout=60, check=False,
            env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert second.returncode == 2, second.stdout + second.stderr
        assert "rcoord coordinator: error: coordinator id 'twin'" in second.stderr
        assert "--id" in second.stderr
        assert first.health().get("leases") == 50
    finally:
        first.stop()


def test_a_sigterm_while_waiting_for_a_dead_processs_claim_is_a_graceful_stop(
        redis_server, namespace):
    """A process restarted under the id of one that died waits for the claim to lapse; a
    SIGTERM meanwhile stops it as a SIGTERM stops a running one: exit 0, nothing taken. It
    exited 2 with "error: coordinator id ... is held by another process", which a supervisor
    stopping the service counts as a failure."""
    import json
    import signal

    client = redis_server.client()
    scripts = Scripts(client)
    scripts.load()
    died = LeaseKeeper(client, scripts, namespace, 50, "phoenix", 60_000)
    died.claim_id(threading.Event())
    died.register()  # (its registry entry lasts a minute: the new process waits that long)
    proc = subprocess.Popen(
        [sys.executable, "-m", "rcoord.service", "--redis-url", redis_server.url,
         "--namespace", namespace, "--id", "phoenix", "--lease-ttl-ms", "1000"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        line = proc.stdout.readline()  # (the process logs JSON lines on stdout)
        held = json.loads(line)
        assert held["event"] == "coordinator_id_held" and held["wait_ms"] > 50_000, line
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 0, line + out + err
    assert "error" not in err
    assert json.loads(out.splitlines()[-1])["event"] == "stopped"
    # It took nothing: the dead process's claim is still there, and no lease.
    assert client.get(died.claim_key) == died.incarnation.encode()
    assert client.keys(f"{namespace}:*lease*") == []
    client.close()


def _ended_pid() -> int:
    """The pid of a process of this machine that has ended (and been reaped)."""
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    return int(proc.stdout)


def _scripts(client: Any) -> Scripts:
    scripts = Scripts(client)
    scripts.load()
    return scripts


def _claim_as(client: Any, namespace: str, incarnation: str, ttl_ms: int) -> LeaseKeeper:
    """A claim on id 'phoenix' and its leases left by ``incarnation``, renewed no more."""
    died = LeaseKeeper(client, _scripts(client), namespace, 4, "phoenix", ttl_ms, incarnation)
    died.claim_id(threading.Event())
    died.register()
    return died


@pytest.mark.skipif(this_machine() is None, reason="no /proc to tell a process ended")
def test_a_claim_left_by_a_process_of_this_machine_that_ended_is_taken_at_once(
        own_server, namespace):
    """A process restarted under the id of one of this machine that was SIGKILLed (systemd's
    Restart=) waited the dead one's whole TTL, though its pid showed it gone. Now the claim is
    taken at once (a stop asked before any wait: it was StoppedBeforeClaim), only from that
    incarnation, and the leases under the id follow."""
    client = own_server.client()
    dead = f"{socket.gethostname()}-{_ended_pid()}-0123456789ab/{this_machine()}"
    assert died_here(dead)
    _claim_as(client, namespace, dead, 60_000)
    stopped = threading.Event()
    stopped.set()  # (any wait for the claim to lapse ends at once, unclaimed)
    with handling(EventLog(), "rcoord", logging.INFO) as log:
        new = LeaseKeeper(client, _scripts(client), namespace, 4, "phoenix", TTL_MS)
        new.claim_id(stopped)
    assert "coordinator_id_taken_over" in log.seen and "coordinator_id_held" not in log.seen
    assert client.get(new.claim_key) == new.incarnation.encode()
    assert new.step() == {0, 1, 2, 3}


@pytest.mark.skipif(this_machine() is None, reason="no /proc to tell a process ended")
def test_a_claim_whose_holder_may_run_is_still_waited_for(own_server, namespace):
    """Only a holder proven ended is taken over: one whose pid runs (this process's), or one
    of another machine or pid namespace (its pid means nothing here), is waited for."""
    client = own_server.client()
    here = this_machine()
    pid = _ended_pid()
    host = socket.gethostname()
    for holder in (f"{host}-{os.getpid()}-0123456789ab/{here}",  # a pid that runs
                   f"{host}-{pid}-0123456789ab/other-boot:0:1",  # another machine
                   # a clone of this VM (same boot id and first pid namespace), other name
                   f"other-{host}-{pid}-0123456789ab/{here}",
                   f"{host}-{pid}-0123456789ab"):  # no machine named
        assert not died_here(holder)
        _claim_as(client, namespace, holder, 60_000)
        stopped = threading.Event()
        stopped.set()
        new = LeaseKeeper(client, _scripts(client), namespace, 4, "phoenix", TTL_MS)
        with pytest.raises(StoppedBeforeClaim):
            new.claim_id(stopped)
        assert client.get(new.claim_key) == holder.encode()
        client.delete(new.claim_key)
