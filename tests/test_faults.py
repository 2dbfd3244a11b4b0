"""The fault suite (issue 8, item 6): real processes, real faults, and a history checker.

Every scenario runs its own Redis-protocol server (its directory in ``tmp_path``, so an AOF
survives a kill), the coordinator service as a subprocess, worker processes
(``workers/fault_worker.py``: ``Consumer``, commits after each batch, history in a local file), an
idempotent producer in a thread of the test, and a sampler that reads the committed offsets every
100 ms. After the fault the run drains (every acked record processed, every committed offset at
the log end), the workers are stopped, the log is read back, and ``tests/faults/history.py``
checks the four rules: one owner per partition and generation, committed offsets never go back,
every acked record processed and in the log, nothing appended twice. Each scenario then checks
what its fault must do. Everything is bounded (records, waits) and stops by itself.

The checker's own tests (hand-made histories that break each rule) come first.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from faults.history import (
    Assignment,
    Commit,
    EventReader,
    History,
    Sample,
    assert_clean,
    read_events,
    read_worker_files,
    violations,
)
from harness import wait_until

from rcoord.client import RedisCoordinator
from rcoord.keys import GroupKeys, settings_key
from rcoord.partitioning import partition_for
from rcoord.protocol.offsets import TopicPartition
from rcoord.scripts import library_source
from rcoord.settings import copy_pattern
from rcoord.testing.embedded import EmbeddedServer
from rcoord.topics import Producer, ProducerRecord, Topics, fetch
from rcoord.topics._base import APPEND_IDEMPOTENT

pytestmark = pytest.mark.faults

ROOT = Path(__file__).resolve().parent.parent
WORKER = ROOT / "workers" / "fault_worker.py"
AOF = ("--appendonly", "yes", "--appendfsync", "always")
GROUP, TOPIC, PARTITIONS = "faults", "events", 6
TPS = [TopicPartition(TOPIC, p) for p in range(PARTITIONS)]
SESSION_MS = 1500
WAIT_S = 30.0


# -- the checker, on hand-made histories -------------------------------------------------------


def _clean() -> History:
    return History(
        assignments=[Assignment("w1", "m1", 1, (0, 1)), Assignment("w2", "m2", 1, (2, 3)),
                     Assignment("w1", "m1", 2, (0, 1, 2, 3))],
        commits=[Commit("w1", "m1", 1, 1.0, {0: 5}), Commit("w2", "m2", 1, 1.1, {2: 3}),
                 Commit("w1", "m1", 2, 2.0, {0: 7, 2: 3})],
        samples=[Sample(1.0, {0: 5, 2: -1}), Sample(2.0, {0: 7, 2: 3})],
        acked={"v1", "v2"},
        uncertain={"v3"},
        processed=__import__("collections").Counter({"v1": 1, "v2": 2}),
        log={0: ["v1", "v3"], 1: ["v2"]},
    )


def test_checker_passes_a_clean_history():
    assert violations(_clean()) == []


def test_checker_finds_two_owners_in_one_generation():
    h = _clean()
    h.assignments.append(Assignment("w3", "m3", 1, (3,)))
    assert [v for v in violations(h) if v.startswith("two owners: partition 3 in generation 1")]
    # The same generation number in another epoch (after a data loss) is another generation.
    h = _clean()
    h.assignments.append(Assignment("w3", "m3", 1, (3,), epoch=1))
    assert violations(h) == []


def test_checker_finds_a_committed_offset_going_back():
    h = _clean()
    h.samples.append(Sample(3.0, {0: 6}))
    assert any("committed offset went back: partition 0" in v for v in violations(h))
    h = _clean()
    h.commits.append(Commit("w2", "m2", 3, 3.0, {0: 6}))  # a later generation, a lower offset
    assert any("commit went back: partition 0" in v for v in violations(h))
    h = _clean()
    h.commits.append(Commit("w1", "m1", 2, 2.5, {0: 6}))  # same member, later, lower
    assert any("commit went back" in v for v in violations(h))


def test_checker_compares_a_commit_only_with_those_answered_before_it_began():
    """A static member frozen between its commit and its note: the commit, sent at 1.5 before
    its replacement's (answered at 2.0), is written down at 3.0. Redis stored it somewhere in
    [1.5, 3.0], so it is no evidence of going back; one sent after 2.0 is."""
    h = _clean()
    h.commits.append(Commit("w1b", "m1b", 2, 3.0, {0: 6}, sent=1.5))
    assert violations(h) == []
    h.commits.append(Commit("w1b", "m1b", 2, 3.5, {0: 5}, sent=2.0))
    assert [v for v in violations(h) if v.startswith("commit went back: partition 0")] == [
        ("commit went back: partition 0 (epoch 0): w1 committed 7 in generation 2, "
         "then w1b 5 in generation 2")]
    # An earlier generation's highest commit counts whenever the later one began.
    h = _clean()
    h.commits.append(Commit("w2", "m2", 3, 3.0, {0: 6}, sent=0.5))
    assert any("w1 committed 7 in generation 2, then w2 6 in generation 3" in v
               for v in violations(h))


def test_checker_finds_an_acked_record_never_processed_or_missing():
    h = _clean()
    h.processed.pop("v1")
    assert any("acked record(s) never processed" in v for v in violations(h))
    h = _clean()
    h.log[0].remove("v1")
    assert any("acked record(s) missing from the log" in v for v in violations(h))


def test_checker_finds_a_record_appended_twice_or_from_nowhere():
    h = _clean()
    h.log[1].append("v1")
    assert any("appended more than once" in v for v in violations(h))
    h = _clean()
    h.log[1].append("v9")
    assert any("nobody sent" in v for v in violations(h))
    with pytest.raises(AssertionError, match="1 violation"):
        assert_clean(h)


def test_checker_reads_worker_files(tmp_path):
    lines = [
        {"e": "assigned", "t": 1.0, "gen": 1, "member": "m1", "parts": [0, 1]},
        {"e": "processed", "t": 1.1, "values": ["v1", "v2"]},
        {"e": "commit", "t": 1.2, "gen": 1, "member": "m1", "offsets": {"0": 2}},
        {"e": "commit", "t": 1.4, "sent": 1.3, "gen": 1, "member": "m1", "offsets": {"0": 3}},
    ]
    path = tmp_path / "w1.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines) + '{"e": "proc')  # cut by a kill
    h, events = read_worker_files([path], epoch_of=lambda ev: 7)
    assert h.assignments == [Assignment("w1", "m1", 1, (0, 1), 7)]
    assert h.commits == [Commit("w1", "m1", 1, 1.2, {0: 2}, 7),
                         Commit("w1", "m1", 1, 1.4, {0: 3}, 7, sent=1.3)]
    assert h.processed == {"v1": 1, "v2": 1}
    assert len(events) == 4


def test_checker_reads_complete_lines_only(tmp_path):
    """A worker's last line cut short (a SIGKILL, or the test reading while the worker writes)
    just after a commit's offsets ends with a ``}``, and is no event."""
    path = tmp_path / "w1.jsonl"
    whole = {"e": "commit", "t": 1.2, "offsets": {"0": 2}, "gen": 1, "member": "m1", "sent": 1.1}
    line = json.dumps(whole)
    path.write_text(line + "\n" + line[:line.index("}") + 1])
    assert read_events(path) == [whole]
    assert read_worker_files([path])[0].commits == [Commit("w1", "m1", 1, 1.2, {0: 2}, sent=1.1)]
    assert read_events(tmp_path / "w2.jsonl") == []  # a worker that has not started writing


def test_event_reader_parses_only_complete_lines_appended_since_its_last_read(tmp_path):
    """The harness polls each worker's file while it grows: a read parses the lines appended
    since the last one (not the whole file again), leaves a line cut short (here inside a
    two-byte character, and just after a commit's offsets) until its newline is there, and
    hands out new dicts in a new list, so a caller cannot change what the next read returns."""
    path = tmp_path / "w1.jsonl"
    reader = EventReader(path)
    assert reader.read() == []  # a worker that has not started writing

    def append(data: bytes) -> None:
        with path.open("ab") as f:
            f.write(data)

    first = {"e": "assigned", "t": 1.0, "gen": 1, "member": "m1", "parts": [0]}
    second = {"e": "processed", "t": 1.1, "values": ["v1", "é"]}
    third = {"e": "commit", "t": 1.2, "offsets": {"0": 2}, "gen": 1, "member": "m1", "sent": 1.1}
    one, two, three = (json.dumps(x, ensure_ascii=False).encode() + b"\n"
                       for x in (first, second, third))
    in_char, after_offsets = two.index("é".encode()) + 1, three.index(b"}") + 1
    append(one + two[:in_char])
    assert reader.read() == [first]
    append(two[in_char:] + three[:after_offsets])
    got = reader.read()
    assert got == [first, second]
    got[0]["worker"] = "w1"
    got.append(third)
    assert reader.read() == [first, second]
    with path.open("r+b") as f:  # what was parsed is not parsed again
        f.write(one.replace(b'"m1"', b'"m9"'))
    append(three[after_offsets:])
    assert reader.read() == [first, second, third]
    assert read_events(path) == [{**first, "member": "m9"}, second, third]


# -- the scenario harness ---------------------------------------------------------------------


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(ROOT))


class Service:
    """``python -m rcoord.service`` as a subprocess; its output goes to a file (no pipe to fill)."""

    def __init__(self, url: str, ns: str, cid: str, out: Path, settings: dict[str, int]) -> None:
        sets = [x for k, v in settings.items() for x in ("--set", f"{k}={v}")]
        self.out = out
        self._fh = open(out, "w")  # noqa: SIM115 - open for the process's life
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rcoord.service", "--redis-url", url, "--namespace", ns,
             "--id", cid, "--metrics-port", "0", "--lease-ttl-ms", "1000", *sets],
            stdout=self._fh, stderr=subprocess.STDOUT, env=_env(),
        )
        wait_until(self._started, timeout_s=20)

    def _started(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"the service exited: {self.out.read_text()}")
        return self.metrics_port is not None

    @property
    def metrics_port(self) -> int | None:
        """The port of its /metrics and /healthz, from the line that announces it (not the
        first line with ``RCOORD_LOG_LEVEL=DEBUG``: redis-py's own debug lines come first)."""
        for line in self.out.read_text(errors="replace").splitlines():
            if line.startswith("{") and '"metrics_port"' in line:
                return int(json.loads(line)["metrics_port"])
        return None

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def diagnose(self, tail: int = 12_000) -> str:
        """The end of the process's output after it wrote every thread's stack (SIGUSR1): what
        a wait on the service that failed needs to be understood."""
        if self.alive:
            size = self.out.stat().st_size
            self.proc.send_signal(signal.SIGUSR1)
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and "Thread 0x" not in \
                    self.out.read_text(errors="replace")[size:]:
                time.sleep(0.05)
        return f"service output (last {tail} chars):\n" + self.out.read_text(errors="replace")[-tail:]

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self._fh.close()


class Worker:
    def __init__(self, sc: Scenario, name: str, session_ms: int) -> None:
        self.name = name
        self.history = sc.dir / f"{name}.jsonl"
        self._fh = open(sc.dir / f"{name}.out", "w")  # noqa: SIM115 - as above
        self.proc = subprocess.Popen(
            [sys.executable, str(WORKER), "--redis-url", sc.url, "--namespace", sc.ns,
             "--group", GROUP, "--topic", TOPIC, "--name", name, "--history", str(self.history),
             "--session-timeout-ms", str(session_ms),
             "--heartbeat-interval-ms", str(sc.heartbeat_ms or max(100, session_ms // 5))],
            stdout=self._fh, stderr=subprocess.STDOUT, env=_env(),
        )

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def stop(self) -> int:
        """SIGCONT (in case it is stopped), SIGTERM, wait; SIGKILL if it does not end."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait(timeout=10)
        self._fh.close()
        return code

    @functools.cached_property
    def _reader(self) -> EventReader:
        """Made on first use, so a subclass with an ``__init__`` of its own has one too."""
        return EventReader(self.history)

    def events(self) -> list[dict[str, Any]]:
        return self._reader.read()


class Scenario:
    """One run: server, service, workers, producer, sampler. ``epoch`` counts data losses twice
    (odd while one is under way), so acks and samples that straddle a loss are not counted."""

    heartbeat_ms: int | None = None
    """The workers' heartbeat interval (None: a fifth of the session)."""

    def __init__(self, tmp_path: Path, *, persistent: bool = True,
                 settings: dict[str, int] | None = None, session_ms: int = SESSION_MS,
                 heartbeat_ms: int | None = None, workers: int = 3, records: int = 1500) -> None:
        self.dir = tmp_path
        self.ns = "f" + uuid.uuid4().hex[:10]
        self.server = EmbeddedServer(data_dir=tmp_path / "redis",
                                     extra_args=AOF if persistent else ()).start()
        self.url = self.server.url
        self.settings = {"group_min_session_timeout_ms": 100,
                         "group_initial_rebalance_delay_ms": 0, **(settings or {})}
        self.session_ms = session_ms
        self.heartbeat_ms = heartbeat_ms
        self.r = redis.Redis(host="127.0.0.1", port=self.server.port, socket_timeout=3,
                             socket_connect_timeout=1)
        self.services: list[Service] = []
        self.workers: list[Worker] = []
        self.start_service()
        Topics(self.r, self.ns).create(TOPIC, PARTITIONS)
        self.coord = RedisCoordinator(self.r, self.ns).start()
        self.producer = Producer(self.r, self.ns, partitioner="round_robin")
        self.records = records
        self.epoch = 0
        self.produced = 0
        self.acked: dict[int, set[str]] = {}
        self.uncertain: set[str] = set()
        self.samples: list[Sample] = []
        self.sample_lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        for i in range(workers):
            self.add_worker(f"w{i + 1}")

    # -- parts

    def start_service(self) -> Service:
        n = len(self.services) + 1
        svc = Service(self.url, self.ns, f"s{n}", self.dir / f"service{n}.out", self.settings)
        self.services.append(svc)
        return svc

    def add_worker(self, name: str) -> Worker:
        w = Worker(self, name, self.session_ms)
        self.workers.append(w)
        return w

    def start_traffic(self) -> None:
        for target in (self._produce, self._sample):
            t = threading.Thread(target=target, daemon=True)
            t.start()
            self._threads.append(t)

    def _produce(self) -> None:
        batch, i = 25, 0
        while i < self.records and not self._stop.is_set():
            values = [f"v{j}" for j in range(i, min(i + batch, self.records))]
            epoch = self.epoch
            try:
                self.producer.send_batch(TOPIC, [ProducerRecord(v.encode()) for v in values])
            except Exception:  # noqa: BLE001 - unknown outcome: at most once in the log
                self.uncertain.update(values)
                self._stop.wait(0.05)
            else:
                if epoch == self.epoch and epoch % 2 == 0:
                    self.acked.setdefault(epoch, set()).update(values)
                else:
                    self.uncertain.update(values)
            i += len(values)
            self.produced = i
            self._stop.wait(0.05)

    def _sample(self) -> None:
        while not self._stop.wait(0.1):
            with self.sample_lock:
                epoch = self.epoch
                try:
                    got = self.coord.fetch_offsets(GROUP, TPS).offsets
                except Exception:  # noqa: BLE001, S112 - the server may be down: no sample
                    continue
                if epoch == self.epoch and epoch % 2 == 0:
                    offs = {tp.partition: o.offset for tp, o in got.items()}
                    self.samples.append(Sample(time.time(), offs, epoch))

    # -- observations

    def events(self) -> list[dict[str, Any]]:
        out = []
        for w in self.workers:
            for ev in w.events():
                ev["worker"] = w.name
                out.append(ev)
        return out

    def owners(self, after: float = 0.0) -> dict[int, dict[str, str]]:
        """gen -> {member: worker} of the assignments recorded after ``after``."""
        gens: dict[int, dict[str, str]] = {}
        for ev in self.events():
            if ev["e"] == "assigned" and ev["t"] > after:
                gens.setdefault(ev["gen"], {})[ev["member"]] = ev["worker"]
        return gens

    def stable(self, workers: list[Worker], after: float = 0.0) -> int | None:
        """The latest generation (recorded after ``after``) in which exactly ``workers`` hold
        every partition between them."""
        names = {w.name for w in workers}
        by_gen: dict[int, list[dict[str, Any]]] = {}
        for ev in self.events():
            if ev["e"] == "assigned" and ev["t"] > after:
                by_gen.setdefault(ev["gen"], []).append(ev)
        for gen in sorted(by_gen, reverse=True):
            evs = by_gen[gen]
            if {e["worker"] for e in evs} == names and sorted(
                    p for e in evs for p in e["parts"]) == list(range(PARTITIONS)):
                return gen
        return None

    def wait_stable(self, workers: list[Worker] | None = None, after: float = 0.0,
                    timeout_s: float = WAIT_S) -> int:
        ws = workers if workers is not None else self.workers
        wait_until(lambda: self.stable(ws, after) is not None, timeout_s=timeout_s)
        gen = self.stable(ws, after)
        assert gen is not None
        return gen

    def wait_produced(self, fraction: float) -> None:
        wait_until(lambda: self.produced >= self.records * fraction, timeout_s=WAIT_S)

    def stop_producing(self) -> None:
        """End the production after the batch under way, for a run that produces until its
        faults are over (a large ``records``): ``drain()`` then waits for what was sent.
        ``_produce`` reads ``records`` before each batch."""
        self.records = self.produced

    def log_ends(self) -> dict[int, int]:
        return {p.partition: p.log_end_offset
                for p in Topics(self.r, self.ns).describe(TOPIC).partitions}

    def committed(self) -> dict[int, int]:
        got = self.coord.fetch_offsets(GROUP, TPS).offsets
        return {tp.partition: o.offset for tp, o in got.items()}

    def drain(self, timeout_s: float = WAIT_S) -> None:
        """Wait until the producer is done, every owed ack was processed and every committed
        offset is at the log end."""
        def done() -> bool:
            if self.produced < self.records:
                return False
            owed = self.acked.get(self.epoch, set())
            processed: set[str] = set()
            for ev in self.events():
                if ev["e"] == "processed":
                    processed.update(ev["values"])
            if not owed <= processed:
                return False
            try:
                ends = self.log_ends()
                return all(self.committed().get(p, -1) == end for p, end in ends.items())
            except redis.RedisError:
                return False

        wait_until(lambda: done() or time.sleep(0.1), timeout_s=timeout_s)

    # -- the end

    def finish(self, epoch_of: Callable[[dict[str, Any]], int] | None = None) -> History:
        """Stop the traffic and the workers (they must exit by themselves, code 0), read the log
        back, and return the history with the current epoch's acks owed."""
        self._stop.set()
        for t in self._threads:
            t.join(10)
        codes = {w.name: w.stop() for w in self.workers if w.proc.returncode is None}
        assert all(c == 0 for c in codes.values()), f"worker exit codes {codes}"
        h, _ = read_worker_files([w.history for w in self.workers if w.history.exists()],
                                 epoch_of)
        h.samples = list(self.samples)
        h.acked = set(self.acked.get(self.epoch, set()))
        h.uncertain = set(self.uncertain)
        for epoch, values in self.acked.items():
            if epoch != self.epoch:
                h.uncertain |= values
        for p in range(PARTITIONS):
            values, offset = [], 0
            while True:
                res = fetch(self.r, self.ns, TOPIC, p, offset, 1000)
                if not res.records:
                    break
                values += [r.value.decode() for r in res.records]
                offset = res.records[-1].offset + 1
            h.log[p] = values
        return h

    def stop_processes(self) -> None:
        """Stop the traffic, kill every worker and service, close the client."""
        self._stop.set()
        for w in self.workers:
            if w.proc.poll() is None:
                w.proc.send_signal(signal.SIGCONT)
                w.proc.kill()
                w.proc.wait(10)
            w._fh.close()
        for s in self.services:
            s.stop(signal.SIGKILL)
        self.r.close()

    def close(self) -> None:
        self.stop_processes()
        if self.server.pid is not None:
            os.kill(self.server.pid, signal.SIGCONT)
        self.server.stop()


@pytest.fixture
def scenario(tmp_path: Path) -> Iterator[Callable[..., Scenario]]:
    made: list[Scenario] = []

    def make(**kw: Any) -> Scenario:
        made.append(Scenario(tmp_path, **kw))
        return made[-1]

    yield make
    for sc in made:
        sc.close()


def _kill9_server(sc: Scenario) -> None:
    pid = sc.server.pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not sc.server.is_running, timeout_s=5)


def _judge(h: History, owed_at_least: int) -> None:
    """The four rules, on a history that is not empty (so the rules had something to check)."""
    assert len(h.acked) >= owed_at_least, f"only {len(h.acked)} acks owed"
    assert h.assignments and h.commits and h.samples
    assert_clean(h)


def _commits_after(sc: Scenario, t: float) -> int:
    """Commits begun after ``t`` (``sent``): one answered before and written down after it,
    by a worker descheduled between the two, ran before it."""
    return sum(1 for ev in sc.events() if ev["e"] == "commit" and ev["sent"] > t)


# -- the faults -------------------------------------------------------------------------------


def test_kill9_of_redis_with_aof_always_loses_no_acked_commit_or_append(scenario):
    sc = scenario()
    sc.wait_stable()
    sc.start_traffic()
    sc.wait_produced(1 / 3)
    wait_until(lambda: _commits_after(sc, 0) > 0)
    before = sc.committed()
    _kill9_server(sc)
    down = time.time()  # a commit begun after this ran on the restarted server
    sc.server.restart()  # same port, same dir: the AOF is replayed
    after = sc.committed()
    assert all(after.get(p, -1) >= off for p, off in before.items()), (before, after)
    sc.drain()
    assert _commits_after(sc, down) > 0  # the same worker processes went on
    assert all(w.proc.poll() is None for w in sc.workers)
    assert all(s.alive for s in sc.services)
    _judge(sc.finish(), owed_at_least=sc.records // 2)


def test_redis_down_for_three_seconds_comes_back_with_its_aof(scenario):
    sc = scenario()
    gen = sc.wait_stable()
    sc.start_traffic()
    sc.wait_produced(1 / 3)
    before = sc.committed()
    pid = sc.server.pid
    assert pid is not None
    os.kill(pid, signal.SIGTERM)
    wait_until(lambda: not sc.server.is_running, timeout_s=10)
    time.sleep(3.0)  # the fault itself: no server for 3 s (twice the session timeout)
    back = time.time()  # before the restart: the workers may regroup before it returns
    sc.server.restart()
    after = sc.committed()
    assert all(after.get(p, -1) >= off for p, off in before.items()), (before, after)
    # The same processes form a group again (their sessions ran out on the server's clock
    # while it was away, so they rejoin), and go on from the committed offsets.
    sc.wait_stable(after=back)
    sc.drain()
    assert all(w.proc.poll() is None for w in sc.workers)
    for w in sc.workers:
        ended = [ev["e"] for ev in w.events() if ev.get("gen") == gen
                 and ev["e"] in ("lost", "revoked")]
        assert ended[:1] == ["lost"], (w.name, ended)
    _judge(sc.finish(), owed_at_least=sc.records // 3)


def _scan(r: redis.Redis, pattern: str) -> list[str]:
    return sorted(k.decode() for k in r.scan_iter(match=pattern, count=1000))


def test_redis_restart_without_persistence_keeps_one_agreed_layout(scenario):
    # Non-default settings, named by the service only: a revert to the defaults would show (50
    # coordinator partitions; a minimum session timeout of 6 s refuses the workers' 1.5 s).
    sc = scenario(persistent=False, settings={"num_partitions": 10})
    sc.wait_stable()
    sc.start_traffic()
    sc.wait_produced(1 / 3)
    pre = {m.member_id for m in sc.coord.describe_group(GROUP).members}
    with sc.sample_lock:
        sc.epoch = 1
        # Members seen before this instant are the pre-loss ones. Taken before the restart:
        # workers may join the empty server while the admin is still re-creating the topic.
        restarting = time.time()
        sc.server.restart()  # SIGTERM; no AOF, no RDB: an empty server on the same port
        assert TOPIC not in Topics(sc.r, sc.ns).list()  # the data is really gone
        Topics(sc.r, sc.ns).create(TOPIC, PARTITIONS)  # the admin re-creates the topic
        sc.epoch = 2
    # A group on every partition needs the topic made again after ``restarting``; a time
    # taken now would miss one formed while this thread was descheduled.
    sc.wait_stable(after=restarting)
    sc.drain()
    pre |= {ev["member"] for ev in sc.events() if ev.get("member") and ev["t"] < restarting}
    h = sc.finish(epoch_of=lambda ev: 0 if ev.get("member") in pre else 1)
    _judge(h, owed_at_least=sc.records // 4)

    stored = {k.decode(): v.decode() for k, v in sc.r.hgetall(settings_key(sc.ns)).items()}
    assert stored["num_partitions"] == "10" and stored["group_min_session_timeout_ms"] == "100"
    copies = _scan(sc.r, copy_pattern(sc.ns))
    assert len(copies) == 10
    assert {sc.r.hget(k, "num_partitions") for k in copies} == {b"10"}
    holders = [k for k in _scan(sc.r, f"{sc.ns}:{{*}}:groups") if sc.r.sismember(k, GROUP)]
    assert holders == [GroupKeys.of(sc.ns, 10, GROUP).partition.groups], holders
    assert sc.coord.partition_for(GROUP) == partition_for(GROUP, 10)
    ends = [ev for w in sc.workers for ev in w.events() if ev["e"] == "exit"]
    assert [ev["num_partitions"] for ev in ends] == [10] * len(sc.workers)
    assert sc.coord.config.num_partitions == 10
    assert all(s.alive for s in sc.services)
    # The pre-loss generations and the post-loss ones are both in the history, and every worker
    # learnt that it lost its pre-loss partitions (no revocation, no commit) and joined again.
    assert {a.epoch for a in h.assignments} == {0, 1}
    for w in sc.workers:
        before = [ev["e"] for ev in w.events() if ev.get("member") in pre]
        after = [ev for ev in w.events() if ev.get("member") and ev["member"] not in pre]
        assert before[-1] == "lost" and after[0]["e"] == "assigned", (w.name, before)


def test_sigstop_of_the_server_shorter_than_the_session_keeps_every_member(scenario):
    # The session leaves the workers 4 s after the freeze to beat (not 1.2 s, with 3 s): a loaded
    # machine that is slow to resume a worker, or holds the test thread past its 1.2 s, must not
    # expire a member. The beats stay 600 ms apart, so the freeze still outlasts two of them.
    sc = scenario(session_ms=6000, heartbeat_ms=600)
    sc.wait_stable()
    formed = time.time()
    sc.start_traffic()
    sc.wait_produced(1 / 3)
    pid = sc.server.pid
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    time.sleep(1.2)  # the fault itself: the server is frozen for 1.2 s
    os.kill(pid, signal.SIGCONT)
    resumed = time.time()
    sc.drain()
    assert _commits_after(sc, resumed) > 0
    # Deadlines are on the server's clock (Redis TIME), which the stall did not outrun: the
    # members' last beats were at most 1.2 s + one interval old, well inside 6 s.
    later = [ev for ev in sc.events() if ev["t"] > formed]
    assert not [ev for ev in later if ev["e"] in ("lost", "revoked", "assigned")]
    _judge(sc.finish(), owed_at_least=sc.records // 2)


def test_sigstop_of_the_server_longer_than_the_session_expires_every_member(scenario):
    sc = scenario()
    gen = sc.wait_stable()
    sc.start_traffic()
    sc.wait_produced(1 / 3)
    pid = sc.server.pid
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    time.sleep(2.5)  # the fault itself: frozen for longer than the 1.5 s session timeout
    resumed = time.time()  # before SIGCONT: nothing is assigned while the server is frozen
    os.kill(pid, signal.SIGCONT)
    # Redis TIME moved on while the server was frozen, so at the first touch every session has
    # run out: the members' partitions are lost (not revoked, no commit) and they rejoin.
    sc.wait_stable(after=resumed)
    sc.drain()
    for w in sc.workers:
        ended = [ev["e"] for ev in w.events() if ev.get("gen") == gen
                 and ev["e"] in ("lost", "revoked")]
        assert ended == ["lost"], (w.name, ended)
    _judge(sc.finish(), owed_at_least=sc.records // 2)


def test_sigstop_of_a_worker_past_its_session_moves_its_partitions_and_fences_it(scenario):
    sc = scenario()
    gen = sc.wait_stable()
    sc.start_traffic()
    sc.wait_produced(1 / 3)
    victim, others = sc.workers[-1], sc.workers[:-1]
    mine = next(ev for ev in victim.events() if ev["e"] == "assigned" and ev["gen"] == gen)
    assert mine["parts"]
    stopped = time.time()  # before the act: the others may regroup before a time taken after
    victim.signal(signal.SIGSTOP)
    sc.wait_stable(others, after=stopped)  # its session ran out: the others took its partitions
    zombie = sc.coord.commit_offsets(GROUP, {TopicPartition(TOPIC, p): 0 for p in mine["parts"]},
                                     member_id=mine["member"], generation_id=gen)
    assert {e.name for e in zombie.values()} <= {"UNKNOWN_MEMBER_ID", "ILLEGAL_GENERATION"}
    resumed = time.time()
    victim.signal(signal.SIGCONT)
    sc.wait_stable(sc.workers, after=resumed)  # it noticed, and rejoined
    sc.drain()
    mine_now = victim.events()
    ended = [ev for ev in mine_now if ev.get("gen") == gen and ev["e"] in ("lost", "revoked")]
    assert [ev["e"] for ev in ended] == ["lost"]  # not revoked: it must not commit them
    assert not [ev for ev in mine_now if ev["e"] == "commit" and ev.get("gen") == gen
                and ev["t"] > ended[0]["t"]]
    _judge(sc.finish(), owed_at_least=sc.records // 2)


def _loaded(sc: Scenario, flush: str) -> bool:
    """Whether what ``flush`` drops is on the server again: the producer's append script
    (the one topic script this run calls all along), or the library of group steps."""
    if flush == "script":
        return bool(sc.r.script_exists(APPEND_IDEMPOTENT.sha)[0])
    return bool(sc.r.function_list())


def _commits_by_worker(sc: Scenario) -> Counter[str]:
    return Counter(w.name for w in sc.workers for ev in w.events() if ev["e"] == "commit")


@pytest.mark.parametrize("flush", ["script", "function"])
def test_script_flush_mid_run_changes_nothing(scenario, flush):
    """SCRIPT FLUSH drops the topic scripts, FUNCTION FLUSH the group steps' library: both are
    loaded again by the next call that misses them, and the run goes on as if nothing
    happened.

    Each flush is followed by explicit conditions, not by times: the server has the code again,
    and then every worker noted two more commits. A worker commits one batch at a time and
    notes it once it returned, so at most one of the two was sent before the code was back,
    and the other ran on it. (Counting commits noted after a time taken before the flush did
    not say that: a test thread descheduled between that time and the flush let the workers
    note three commits that ran before it, and the library was found missing.) The producer
    runs until the flushes are over, so the script has a caller after each of them."""
    # A long session: this test is about the script cache, and "nothing happened" must not
    # be broken by a scheduling stall of a loaded machine expiring a member.
    sc = scenario(session_ms=6000, records=100_000)
    gen = sc.wait_stable()
    formed = time.time()
    sc.start_traffic()
    wait_until(lambda: all(_commits_by_worker(sc)[w.name] for w in sc.workers))
    for _ in range(4):
        if flush == "script":
            sc.r.script_flush()
        else:
            assert sc.r.function_flush()
        wait_until(lambda: _loaded(sc, flush))  # a call missed it and loaded it
        base = _commits_by_worker(sc)
        wait_until(lambda b=base: all(
            _commits_by_worker(sc)[w.name] >= b[w.name] + 2 for w in sc.workers))
    sc.stop_producing()
    if flush == "function":
        libraries = [dict(zip(lib[::2], lib[1::2], strict=True)) for lib in sc.r.function_list()]
        assert [lib[b"library_name"] for lib in libraries] == [library_source()[0].encode()]
    sc.drain()
    later = [ev for ev in sc.events() if ev["t"] > formed]
    assert not [ev for ev in later if ev["e"] in ("lost", "revoked", "assigned", "commit_failed")]
    assert {ev["gen"] for ev in later if ev["e"] == "commit"} == {gen}
    _judge(sc.finish(), owed_at_least=sc.records // 2)


def test_kill9_of_the_service_mid_rebalance_a_second_one_applies_the_deadlines(scenario):
    # The worker to be killed has a session longer than the rebalance that waits for it (the
    # workers' 4 s rebalance timeout), so it is still a member when the first service dies,
    # however late the newcomer starts: with the 1.5 s session, a newcomer that started after it
    # ran out met a group the first service had already rid of it, and nothing was left due.
    # The live workers beat every 300 ms, and their 6 s sessions outlast their freeze below. They
    # are frozen as soon as the group is PreparingRebalance, so one may not have rejoined yet:
    # then the rebalance's deadline, which only the second service can apply, removes it with
    # the dead member, and it joins again once resumed; one that rejoined is kept, and the join
    # that completes while it is frozen sets its next session deadline.
    sc = scenario(workers=2, session_ms=6000, heartbeat_ms=300)
    dead = Worker(sc, "w3", 10_000)
    sc.workers.append(dead)
    sc.wait_stable()
    sc.start_traffic()
    sc.wait_produced(1 / 3)
    members = GroupKeys.of(sc.ns, sc.coord.config.num_partitions, GROUP).members
    dead_id = [ev["member"] for ev in dead.events() if ev["e"] == "assigned"][-1]
    dead.proc.kill()  # silent: no LeaveGroup; the rebalance's deadline must remove it
    dead.proc.wait(10)
    newcomer = sc.add_worker("w4")  # its join starts a rebalance that waits for the dead one
    wait_until(lambda: sc.coord.describe_group(GROUP).state == "PreparingRebalance")
    live = [*sc.workers[:-2], newcomer]
    # Every group step applies the group's due deadlines first: the live workers' parked joins
    # and heartbeats, and the sampler's offset fetches, would remove the dead member as soon
    # as the second service. So they are stopped until it is gone (the sampler waits on the
    # lock it samples under; the producer only appends to the topic), and only the second
    # service can have removed it.
    with sc.sample_lock:
        for w in live:
            w.signal(signal.SIGSTOP)
        sc.services[0].stop(signal.SIGKILL)
        killed = time.time()
        assert sc.r.hexists(members, dead_id)  # its deadline is still to come
        second = sc.start_service()
        wait_until(lambda: not sc.r.hexists(members, dead_id) or time.sleep(0.05),
                   why=second.diagnose)
        for w in live:
            w.signal(signal.SIGCONT)
    sc.wait_stable(live, after=killed)
    sc.drain()
    # Now nobody touches the group but the second service: kill every worker (no LeaveGroup)
    # and stop the sampler; their sessions must still run out.
    sc._stop.set()
    for t in sc._threads:
        t.join(10)
    for w in live:
        w.proc.kill()
        w.proc.wait(10)
    assert sc.r.hlen(members) == len(live)
    wait_until(lambda: sc.r.hlen(members) == 0 or time.sleep(0.05), timeout_s=30)
    assert second.alive
    _judge(sc.finish(), owed_at_least=sc.records // 2)
