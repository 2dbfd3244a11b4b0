"""The compose deployment without a container engine: the cluster bootstrap script that compose
runs (compose/cluster-init.sh), against real cluster-mode servers addressed by host name, and
the compose file against the Compose Specification's JSON schema (vendored, see compose/README.md).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import pytest
import yaml
from cluster_replicas import cluster_nodes, free_port, node, run_init, start_init
from harness import wait_until

from rcoord.testing.embedded import EmbeddedServer, _parse_info

COMPOSE = Path(__file__).resolve().parent.parent / "compose"


@pytest.fixture
def servers() -> Iterator[list[EmbeddedServer]]:
    """Servers a test starts; all stopped at the end, whatever happened."""
    made: list[EmbeddedServer] = []
    yield made
    for s in made:
        s.stop()


def _start(servers: list[EmbeddedServer], n: int) -> list[EmbeddedServer]:
    new = [node(free_port()).start() for _ in range(n)]
    servers.extend(new)
    return new


def _names(nodes: list[EmbeddedServer]) -> list[str]:
    return [f"localhost:{s.port}" for s in nodes]


def _snapshot(nodes: list[EmbeddedServer]) -> dict[int, list[tuple[str, str, str, tuple[str, ...]]]]:
    """What each node knows: ids, roles, masters and slots (sorted), plus its config epoch."""
    out = {}
    for s in nodes:
        c = s.client()
        try:
            view = sorted((n.id, n.role, n.master_id, n.slots) for n in cluster_nodes(c))
            epoch = _parse_info(c.execute_command("CLUSTER", "INFO"))["cluster_current_epoch"]
        finally:
            c.close()
        out[s.port] = [*view, ("epoch", epoch, "", ())]
    return out


def _waiting_to_ping_again(proc: subprocess.Popen[str]) -> bool:
    """Whether the bootstrap script is in its wait between PINGs (Linux: it has a ``sleep``
    child), which before the cluster is made it enters only after a node refused a PING. Read
    from every process's ``/proc/PID/stat`` (``PID (COMM) STATE PPID``): a process's own
    ``children`` file needs a kernel option some kernels lack."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue  # (gone meanwhile)
        comm, _, rest = text.partition("(")[2].rpartition(")")
        fields = rest.split()
        if comm == "sleep" and len(fields) > 1 and fields[1] == str(proc.pid):
            return True
    return False


def _assert_formed(nodes: list[EmbeddedServer], masters: int) -> None:
    for s in nodes:
        c = s.client()
        try:
            info = _parse_info(c.execute_command("CLUSTER", "INFO"))
            view = cluster_nodes(c)
        finally:
            c.close()
        assert info["cluster_state"] == "ok" and int(info["cluster_known_nodes"]) == len(nodes)
        assert sum(1 for n in view if n.role == "master" and n.slots) == masters
        replicas = [n for n in view if n.role == "replica"]
        assert len(replicas) == len(nodes) - masters
        assert {r.master_id for r in replicas} == {n.id for n in view if n.role == "master"}


def test_six_nodes_by_host_name_form_three_masters_with_a_replica_each_and_a_rerun_changes_nothing(
        servers):
    nodes = _start(servers, 6)
    res = run_init(_names(nodes), "--replicas", "1", "--timeout", "30")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "creating a cluster of 6 nodes with 1 replica(s)" in res.stdout
    assert "cluster_state:ok on all 6 nodes (3 masters)" in res.stdout
    _assert_formed(nodes, masters=3)

    before = _snapshot(nodes)
    again = run_init(_names(nodes), "--replicas", "1", "--timeout", "30")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "already hold a cluster; creating nothing" in again.stdout
    assert _snapshot(nodes) == before


@pytest.mark.slow
def test_a_node_that_comes_up_late_is_waited_for(servers):
    nodes = _start(servers, 5)
    late_port = free_port()
    names = [*_names(nodes), f"localhost:{late_port}"]
    proc = start_init(names, "--replicas", "1", "--timeout", "30")
    try:
        # The fault itself: the sixth node starts only once the script has had a PING refused
        # (it is in its one-second wait before the next).
        wait_until(lambda: _waiting_to_ping_again(proc), timeout_s=30,
                   why=lambda: proc.poll() is not None and proc.communicate())
        assert proc.poll() is None, proc.communicate()
        late = node(late_port)
        servers.append(late)
        late.start()
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, out + err
    assert "all 6 nodes answer PING" in out
    _assert_formed([*nodes, late], masters=3)


def test_a_node_that_never_comes_up_fails_with_its_name_within_the_bound(servers):
    nodes = _start(servers, 2)
    missing = free_port()
    names = [*_names(nodes), f"localhost:{missing}"]
    res = run_init(names, "--timeout", "1", bound_s=15)  # killed (and failed) past 15 s
    assert res.returncode == 1
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith(f"cluster-init: FAILED: node localhost:{missing} did not answer "
                               "PING within 1s"), lines
    # Nothing was created on the nodes that did answer.
    for s in nodes:
        c = s.client()
        try:
            assert _parse_info(c.execute_command("CLUSTER", "INFO"))["cluster_known_nodes"] == "1"
        finally:
            c.close()


def test_an_empty_node_beside_an_existing_cluster_fails_loudly(servers):
    nodes = _start(servers, 3)
    assert run_init(_names(nodes), "--timeout", "30").returncode == 0
    stray = _start(servers, 1)[0]
    res = run_init(_names([*nodes, stray]), "--timeout", "1")
    assert res.returncode == 1
    assert res.stderr.startswith("cluster-init: FAILED: node localhost:"), res.stderr
    assert "knows 1 of 4 nodes" in res.stderr or "knows 3 of 4" in res.stderr, res.stderr


@pytest.mark.parametrize("args, message", [
    (["--replicas", "1", "localhost:1", "localhost:2", "localhost:3"],
     "3 node(s) given; a cluster of 3 masters with 1 replica(s) each needs at least 6"),
    (["--replicas", "x", "localhost:1"], "--replicas must be a whole number"),
    (["localhost", "b:2", "c:3"], "node 'localhost' is not HOST:PORT"),
    (["a:1", "b:2", "c:port"], "node 'c:port' is not HOST:PORT"),
    ([], "no nodes given"),
])
def test_bad_arguments_fail_in_one_line(args, message):
    res = run_init([], *args, bound_s=10)
    assert res.returncode == 1
    assert res.stderr.count("\n") == 1 and message in res.stderr, res.stderr


def test_a_missing_client_binary_is_named():
    res = run_init(["a:1", "b:2", "c:3"], env={"REDIS_CLI": "no-such-redis-cli"}, bound_s=10)
    assert res.returncode == 1
    assert "client 'no-such-redis-cli' not found (set REDIS_CLI)" in res.stderr


# -- the compose file ----------------------------------------------------------------------


def _compose() -> dict:
    return yaml.safe_load((COMPOSE / "docker-compose.yml").read_text())


def test_the_compose_file_is_valid_against_the_compose_specification_schema():
    schema = json.loads((COMPOSE / "compose-spec.schema.json").read_text())
    doc = _compose()
    jsonschema.Draft7Validator.check_schema(schema)
    errors = sorted(jsonschema.Draft7Validator(schema).iter_errors(doc), key=str)
    assert not errors, "\n".join(f"{list(e.absolute_path)}: {e.message}" for e in errors)
    # The schema can fail: a misspelt key is refused.
    bad = {**doc, "services": {**doc["services"], "redis": {"imag": "redis:7.4"}}}
    assert list(jsonschema.Draft7Validator(schema).iter_errors(bad))


def test_the_compose_cluster_runs_the_tested_script_and_waits_for_it():
    services = _compose()["services"]
    nodes = sorted(n for n, s in services.items() if n.startswith("redis-"))
    assert len(nodes) == 6
    init = services["cluster-init"]
    cmd = init["command"]
    assert "/cluster-init.sh" in cmd[0] and cmd[1:3] == ["--replicas", "1"]
    assert cmd[-6:] == [f"{n}:6379" for n in nodes]
    assert set(init["depends_on"]) == set(nodes)
    assert all(init["depends_on"][n]["condition"] == "service_started" for n in nodes)
    for name, svc in services.items():
        if "cluster" in svc.get("profiles", []) and name.startswith(("coordinator-", "worker")):
            assert svc["depends_on"]["cluster-init"] == {
                "condition": "service_completed_successfully"}, name
    worker = services["worker"]
    assert worker["deploy"]["replicas"] >= 2
    assert all("healthcheck" in services[n] for n in nodes)


def test_the_script_is_posix_sh():
    # The Redis images have /bin/sh (dash on Debian, busybox on Alpine): no bashisms.
    import shutil
    import subprocess
    dash = shutil.which("dash")
    if dash is None:
        pytest.skip("dash not installed")
    res = subprocess.run([dash, "-n", str(COMPOSE / "cluster-init.sh")], check=False,
                         capture_output=True, text=True, timeout=10)
    assert res.returncode == 0, res.stderr


def test_the_feeder_creates_the_topic_once_and_appends(redis_server, namespace, tmp_path):
    import subprocess
    import sys

    from rcoord.topics import Topics

    ready = tmp_path / "ready"
    cmd = [sys.executable, str(COMPOSE / "feed.py"), "--redis-url", redis_server.url,
           "--namespace", namespace, "--topic", "lines", "--partitions", "3", "--records", "30",
           "--batch", "20", "--interval", "0", "--ready-file", str(ready)]
    env = {**__import__("os").environ, "PYTHONPATH": str(COMPOSE.parent)}
    first = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=60,
                           env=env)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "created topic lines with 3 partitions" in first.stdout and ready.exists()
    again = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=60,
                           env=env)
    assert again.returncode == 0 and "topic lines exists" in again.stdout, again.stderr
    c = redis_server.client()
    try:
        parts = Topics(c, namespace).describe("lines").partitions
    finally:
        c.close()
    assert len(parts) == 3 and sum(p.log_end_offset for p in parts) == 60
