"""End to end: real worker processes share a partitioned topic as one consumer group.

Each worker is a separate OS process (multiprocessing, spawn) running ``Consumer`` with short
timeouts. Workers write what they process and every assignment they receive to Redis lists, so
the test can check the group's history afterwards:

* every produced record was processed at least once, and every committed offset reached the
  log end;
* within one generation no two members ever held the same partition;
* a worker killed with SIGKILL loses its partitions to the others once its session times out,
  and a commit stamped with its generation is refused afterwards;
* scaling from one worker to four and back, and a topic gaining partitions, lose nothing.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from harness import wait_until

from rcoord import Errors, GroupCoordinator, TopicPartition
from rcoord.topics import Producer, ProducerRecord, Topics

TP = TopicPartition
GROUP = "e2e"
TOPIC = "t"
SESSION_MS = 1500
HEARTBEAT_MS = 300
WAIT_S = 40.0
WORKER = {
    "session_timeout_ms": SESSION_MS,
    "heartbeat_interval_ms": HEARTBEAT_MS,
    "rebalance_timeout_ms": 5000,
    "partition_watch_interval_ms": 300,
    "join_backoff_ms": 500,
    "retry_backoff_ms": 50,
    "retry_backoff_max_ms": 500,
}


def worker_main(url: str, namespace: str, name: str, stop: Any) -> None:
    """One worker process: consume until ``stop`` is set, then close (commit, leave)."""
    import logging

    from rcoord.client import Consumer, ConsumerGroupConfig, client_from_url
    from rcoord.client.history import RebalanceHistory

    logging.basicConfig(level=logging.WARNING, format=f"{name} %(levelname)s %(message)s")
    client = client_from_url(url)
    history = f"{namespace}:e2e:history"
    processed = f"{namespace}:e2e:processed:{name}"
    record = RebalanceHistory(client, history, name)

    config = ConsumerGroupConfig(
        group_id=GROUP, topics=[TOPIC], redis_client=client, namespace=namespace, **WORKER
    )
    consumer = Consumer(
        config, listener=record, auto_commit_interval_ms=200, fetch_max_wait_ms=50
    )
    record.consumer = consumer
    while not stop.is_set():
        try:
            records = consumer.poll(timeout=0.1)
        except Exception as exc:  # noqa: BLE001 - a join error is reported once; keep polling
            logging.getLogger("e2e").warning("poll: %s", exc)
            continue
        if records:
            # "Processing" = recording; it happens before the next poll commits the positions.
            client.rpush(processed, *[f"{r.partition}:{r.offset}" for r in records])
    consumer.close(timeout=30)
    client.close()


class Workers:
    """The worker processes of one test, plus what they recorded."""

    def __init__(
        self, url: str, namespace: str, coord: GroupCoordinator, redis_client: Any
    ) -> None:
        self.url, self.namespace, self.coord, self.r = url, namespace, coord, redis_client
        self.ctx = mp.get_context("spawn")
        self.procs: dict[str, Any] = {}
        self.stops: dict[str, Any] = {}
        self.names: set[str] = set()
        self.topics = Topics(redis_client, namespace)
        self.producer = Producer(redis_client, namespace, "round_robin")

    def start(self, name: str) -> None:
        stop = self.ctx.Event()
        proc = self.ctx.Process(
            target=worker_main, args=(self.url, self.namespace, name, stop), daemon=True
        )
        proc.start()
        self.procs[name], self.stops[name] = proc, stop
        self.names.add(name)

    def kill(self, name: str) -> None:
        proc = self.procs.pop(name)
        proc.kill()  # SIGKILL: no close, no LeaveGroup, no final commit
        proc.join(WAIT_S)

    def stop(self, *names: str) -> None:
        for name in names:
            self.stops[name].set()
        for name in names:
            proc = self.procs.pop(name)
            proc.join(WAIT_S)
            assert proc.exitcode == 0, f"worker {name} exited with {proc.exitcode}"

    def close(self) -> None:
        for proc in self.procs.values():
            proc.kill()
            proc.join(WAIT_S)

    # -- what happened

    def history(self) -> list[dict[str, Any]]:
        return [json.loads(x) for x in self.r.lrange(f"{self.namespace}:e2e:history", 0, -1)]

    def assignments(self) -> dict[int, dict[str, tuple[str, list[int]]]]:
        """generation -> member -> (worker, partitions), from every "assigned" event."""
        out: dict[int, dict[str, tuple[str, list[int]]]] = defaultdict(dict)
        for ev in self.history():
            if ev["event"] == "assigned":
                assert ev["member"] not in out[ev["gen"]], f"member assigned twice in {ev}"
                out[ev["gen"]][ev["member"]] = (ev["worker"], ev["partitions"])
        return out

    def group_events(self) -> list[dict[str, str]]:
        """The coordinator's events of the group (transitions, expiries), oldest first; their
        ``at`` is the coordinator's clock."""
        key = self.coord._keys(GROUP).partition.events
        events = [{k.decode(): v.decode() for k, v in fields.items()}
                  for _, fields in self.r.xrange(key)]
        return [e for e in events if e["g"] == GROUP]

    def generation_where(self, cond: Any) -> int | None:
        """The latest generation whose assignments satisfy ``cond(members)``, if any."""
        for gen, members in sorted(self.assignments().items(), reverse=True):
            if cond(members):
                return gen
        return None

    def processed(self) -> set[tuple[int, int]]:
        out: set[tuple[int, int]] = set()
        for name in self.names:
            for item in self.r.lrange(f"{self.namespace}:e2e:processed:{name}", 0, -1):
                p, o = item.decode().split(":")
                out.add((int(p), int(o)))
        return out

    def log_ends(self) -> dict[int, int]:
        return {p.partition: p.log_end_offset for p in self.topics.describe(TOPIC).partitions}

    def committed(self) -> dict[int, int]:
        n = len(self.log_ends())
        got = self.coord.fetch_offsets(GROUP, [TP(TOPIC, p) for p in range(n)]).offsets
        return {tp.partition: o.offset for tp, o in got.items()}

    # -- checks

    def all_processed(self) -> bool:
        done = self.processed()
        return all((p, o) in done for p, end in self.log_ends().items() for o in range(end))

    def drained(self) -> bool:
        """Every record processed and every committed offset at the log end."""
        return self.committed() == self.log_ends() and self.all_processed()

    def check_history(self) -> None:
        """No two members of one generation ever held the same partition."""
        for gen, members in self.assignments().items():
            seen: dict[int, str] = {}
            for member, (_, parts) in members.items():
                for p in parts:
                    assert p not in seen, (
                        f"generation {gen}: partition {p} held by {seen[p]} and {member}"
                    )
                    seen[p] = member

    def produce(self, n: int, tag: str) -> None:
        self.producer.send_batch(TOPIC, [f"{tag}-{i}".encode() for i in range(n)])


def covers(n: int, workers: set[str]) -> Any:
    """A predicate: the members of a generation are exactly ``workers`` and hold all n partitions."""

    def cond(members: dict[str, tuple[str, list[int]]]) -> bool:
        names = {w for w, _ in members.values()}
        parts = sorted(p for _, ps in members.values() for p in ps)
        return names == workers and parts == list(range(n))

    return cond


@pytest.fixture
def workers(
    request: pytest.FixtureRequest,
    backend: str,
    make_coordinator: Any,
    redis_client: Any,
    namespace: str,
) -> Iterator[Workers]:
    server = request.getfixturevalue("redis_server" if backend == "single" else "redis_cluster")
    coord = make_coordinator(group_initial_rebalance_delay_ms=300)
    w = Workers(server.url, namespace, coord, redis_client)
    try:
        yield w
    finally:
        w.close()


def test_sigkill_moves_partitions_after_the_session_timeout(workers: Workers) -> None:
    w = workers
    w.topics.create(TOPIC, 12)
    w.produce(600, "a")
    for name in ("w0", "w1", "w2"):
        w.start(name)
    wait_until(
        lambda: w.generation_where(covers(12, {"w0", "w1", "w2"})) is not None, timeout_s=WAIT_S
    )
    wait_until(w.all_processed, timeout_s=WAIT_S)

    victim_gen = w.generation_where(covers(12, {"w0", "w1", "w2"}))
    assert victim_gen is not None
    ((victim, (_, victim_parts)),) = [
        (m, v) for m, v in w.assignments()[victim_gen].items() if v[0] == "w0"
    ]
    w.kill("w0")
    w.produce(600, "b")

    wait_until(
        lambda: (w.generation_where(covers(12, {"w1", "w2"})) or 0) > victim_gen, timeout_s=WAIT_S
    )
    # The others only rebalance once the coordinator expires the dead member's session: its
    # expiry, not before its deadline, ends the victim's generation. (Timed from the kill on the
    # test's clock, this failed when the worker, starved on a loaded machine, had last heartbeat
    # well before it was killed: its session ran out sooner after the kill.)
    events = w.group_events()
    expired = [e for e in events if e["e"] == "expired" and e["member"] == victim]
    assert len(expired) == 1 and int(expired[0]["late"]) >= 0, events
    ended = next(e for e in events if e["e"] == "transition"
                 and e["to"] == "PreparingRebalance" and int(e["gen"]) == victim_gen)
    assert int(ended["at"]) >= int(expired[0]["at"]), events

    # A zombie commit stamped with the killed member's generation is refused.
    refused = w.coord.commit_offsets(
        GROUP,
        {TP(TOPIC, p): 0 for p in victim_parts},
        member_id=victim,
        generation_id=victim_gen,
    )
    assert set(refused.values()) <= {Errors.UNKNOWN_MEMBER_ID, Errors.ILLEGAL_GENERATION}, refused

    w.start("w3")
    w.produce(600, "c")
    wait_until(
        lambda: w.generation_where(covers(12, {"w1", "w2", "w3"})) is not None, timeout_s=WAIT_S
    )
    wait_until(w.drained, timeout_s=WAIT_S)
    w.stop("w1", "w2", "w3")
    assert w.drained()
    w.check_history()


def test_scale_from_one_to_four_workers_and_back(workers: Workers) -> None:
    w = workers
    w.topics.create(TOPIC, 12)
    w.produce(300, "a")
    w.start("w0")
    wait_until(lambda: w.generation_where(covers(12, {"w0"})) is not None, timeout_s=WAIT_S)
    for name in ("w1", "w2", "w3"):
        w.start(name)
    w.produce(300, "b")
    four = {"w0", "w1", "w2", "w3"}
    wait_until(lambda: w.generation_where(covers(12, four)) is not None, timeout_s=WAIT_S)
    gen4 = w.generation_where(covers(12, four))
    assert gen4 is not None
    assert sorted(len(ps) for _, ps in w.assignments()[gen4].values()) == [3, 3, 3, 3]
    w.produce(300, "c")
    w.stop("w1", "w2", "w3")  # graceful: LeaveGroup, so no session timeout to wait for
    wait_until(lambda: (w.generation_where(covers(12, {"w0"})) or 0) > gen4, timeout_s=WAIT_S)
    w.produce(300, "d")
    wait_until(w.drained, timeout_s=WAIT_S)
    w.stop("w0")
    w.check_history()


def test_workers_pick_up_new_partitions(workers: Workers) -> None:
    w = workers
    w.topics.create(TOPIC, 4)
    w.produce(40, "a")
    w.start("w0")
    w.start("w1")
    wait_until(lambda: w.generation_where(covers(4, {"w0", "w1"})) is not None, timeout_s=WAIT_S)
    w.topics.add_partitions(TOPIC, 8)
    # The producer's cached partition count is 4 for a while; name the partitions instead.
    w.producer.send_batch(
        TOPIC, [ProducerRecord(b"b", partition=p) for p in range(8) for _ in range(10)]
    )
    wait_until(lambda: w.generation_where(covers(8, {"w0", "w1"})) is not None, timeout_s=WAIT_S)
    wait_until(w.drained, timeout_s=WAIT_S)
    assert all(end > 0 for end in w.log_ends().values())
    w.stop("w0", "w1")
    w.check_history()


def test_demo_main_job_exits_zero() -> None:
    """``rcoord demo`` (the README's main job) with no Redis configured: embedded server."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "RCOORD_REDIS_URL"}
    done = subprocess.run(
        [sys.executable, "-m", "rcoord", "demo", "--records", "900", "--produce-seconds", "3"],
        capture_output=True,
        check=False,
        text=True,
        timeout=90,
        env=env,
    )
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert "started an embedded server" in out
    assert "with SIGKILL" in out and "is refused" in out
    assert "every produced record processed at least once ... yes" in out
    assert "every committed offset is at the log end ........ yes" in out
    # cooperative-sticky by default: the workers that stay revoke nothing they keep on a join.
    assert "the workers that stayed revoked only what moved . yes" in out
    assert out.rstrip().endswith("demo: OK")


def test_demo_with_an_eager_assignor_reports_the_stop() -> None:
    """With --assignor range (eager), the same demo passes and reports what the stop cost."""
    import re
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "RCOORD_REDIS_URL"}
    done = subprocess.run(
        [sys.executable, "-m", "rcoord", "demo", "--records", "600", "--produce-seconds", "2",
         "--assignor", "range"],
        capture_output=True, check=False, text=True, timeout=90, env=env,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    found = re.search(r"eager rebalancing \(range\): the workers that stayed revoked (\d+)",
                      done.stdout)
    assert found and int(found.group(1)) > 0, done.stdout


@pytest.mark.parametrize("signame, code, after", [
    ("SIGTERM", 143, "the group is stable"), ("SIGINT", 130, "the group is stable"),
    ("SIGINT", 130, "started worker w3")])
def test_a_demo_stopped_by_a_signal_leaves_nothing_running(signame: str, code: int,
                                                           after: str) -> None:
    """``kill``, ``timeout``, ``docker stop`` (SIGTERM) or Ctrl-C (SIGINT to the process group)
    in the middle of ``rcoord demo``: it stops its workers and its embedded server, exits 143
    or 130 saying so, and no worker prints a traceback. Before, SIGTERM killed the demo at once
    and its server, workers and multiprocessing helper went on running; a Ctrl-C while the
    workers were starting printed a traceback from each, and a later one said nothing."""
    import re
    import signal
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "RCOORD_REDIS_URL"}
    # ``python -m rcoord demo`` with Ctrl-C raising, as from a terminal: a shell's background
    # job (CI's, perhaps) ignores SIGINT, and a child inherits that, which Python keeps.
    demo = ("import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
            "sys.argv = ['rcoord', 'demo', '--records', '100000', '--produce-seconds', '60']; "
            "runpy.run_module('rcoord', run_name='__main__')")
    proc = subprocess.Popen(
        [sys.executable, "-c", demo], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env=env, start_new_session=True)
    try:
        assert proc.stdout is not None
        lines: list[str] = []
        while not any(after in line for line in lines):
            line = proc.stdout.readline()
            assert line, "".join(lines)
            lines.append(line)
        found = re.search(r"redis://127\.0\.0\.1:(\d+)", "".join(lines))
        assert found, "".join(lines)
        port = int(found.group(1))
        if signame == "SIGINT":
            os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
        else:
            proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    assert proc.returncode == code, "".join(lines) + out + err
    assert "Traceback" not in err, err
    assert "its workers and server are stopped" in err.splitlines()[-1], err

    def group_empty() -> bool:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return True
        return False

    wait_until(group_empty, timeout_s=20)  # workers, server, resource tracker: all gone
    with pytest.raises(redis.exceptions.ConnectionError):
        redis.Redis(port=port, socket_connect_timeout=1).ping()


def test_a_demo_progress_line_is_one_consistent_reading(redis_server) -> None:
    """The demo's progress line counts what the topic holds as produced: records stored while
    the producer thread had not yet counted them showed as lag with nothing produced."""
    import argparse
    import time

    from rcoord.demo import DEMO_GROUP, DEMO_TOPIC, _Demo
    from rcoord.protocol.offsets import TopicPartition
    from rcoord.topics import ProducerRecord

    demo = _Demo(redis_server.url, argparse.Namespace(partitions=2), time.monotonic() + 60)
    try:
        demo.topics.create(DEMO_TOPIC, 2)
        demo.producer.send_batch(
            DEMO_TOPIC, [ProducerRecord(b"x", partition=p) for p in (0, 1) for _ in range(5)]
        )
        assert demo.produced == 0  # the demo's producer thread never ran
        assert demo.progress() == "produced 10, processed , lag 10"
        demo.coord.commit_offsets(DEMO_GROUP, {TopicPartition(DEMO_TOPIC, 0): 3})
        assert demo.progress() == "produced 10, processed , lag 7"
    finally:
        demo.cleanup(delete_keys=True, until=time.monotonic() + 10)
