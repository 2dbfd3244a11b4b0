"""A bounded, seeded chaos run of the group protocol, end to end (what tests/test_faults.py does
one fault at a time, here several faults of other kinds in a row on one group).

Real worker processes (``workers/fault_worker.py``: ``Consumer``, a commit after each batch) and
the coordinator service run against one embedded server, while a seeded sequence of faults hits
them: a worker SIGKILLed (and replaced), a worker SIGSTOPped past its session (a zombie that
wakes up and commits with its old generation), every connection of a worker closed by CLIENT
KILL, the server frozen by ``DEBUG SLEEP`` for less than a session, and faults piled onto a
rebalance under way (a member frozen mid-rebalance; a kill, a newcomer, every connection closed
and a DEBUG SLEEP at once). A second test fences a frozen static member by its replacement.
Each fault is followed
by a wait on a condition, never on a time: the group is stable again with exactly the live
workers, or every worker committed twice more.

The deadlines (sessions, rebalance timeouts) are applied by the coordinator service, or, in a
second run with the service stopped, by the members' own calls.

What must hold throughout (tests/faults/history.py checks 1, 2 and the at-least-once count):

1. no partition has two owners in one generation;
2. a member fenced by a newer generation cannot commit: the zombie's own commits and one sent
   in its name are refused (ILLEGAL_GENERATION / UNKNOWN_MEMBER_ID), and the committed offsets
   sampled every 100 ms never go back;
3. every acknowledged record is processed at least once;
4. once the faults stop, the group is Stable with every live worker a member, and the
   partitions are assigned once each.

The run is bounded: a fixed number of faults, each wait bounded, the whole under a minute.
``RCOORD_CHAOS_SEED`` picks another seed (the default one is the suite's).
"""

from __future__ import annotations

import dataclasses
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import test_faults
from harness import wait_until
from test_faults import GROUP, PARTITIONS, TOPIC, Scenario, Worker, _judge

from rcoord.keys import GroupKeys
from rcoord.protocol.consumer import ConsumerProtocolAssignment
from rcoord.protocol.offsets import TopicPartition
from rcoord.testing.embedded import EmbeddedServer

pytestmark = [pytest.mark.faults, pytest.mark.timeout(180)]

SEED = int(os.environ.get("RCOORD_CHAOS_SEED", "60"))
FAULTS = 10
STEP_WAIT_S = 20.0
FENCED = {"UNKNOWN_MEMBER_ID", "ILLEGAL_GENERATION"}


class DebugServer(EmbeddedServer):
    """The embedded server with DEBUG allowed from loopback (for ``DEBUG SLEEP``)."""

    def _mode_args(self, port: int) -> list[str]:
        return ["--enable-debug-command", "local"]


@pytest.fixture
def chaos(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., Scenario]]:
    monkeypatch.setattr(test_faults, "EmbeddedServer", DebugServer)
    made: list[Scenario] = []

    def make(**kw: Any) -> Scenario:
        made.append(Scenario(tmp_path, persistent=False, **kw))
        return made[-1]

    yield make
    for sc in made:
        sc.close()


def _local_ports(pid: int) -> set[int]:
    """The local TCP ports of ``pid``'s sockets (Linux: its fds' socket inodes, looked up in
    its network namespace's tables)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    ports = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            if cols[9] in inodes:
                ports.add(int(cols[1].rsplit(":", 1)[1], 16))
    return ports


def _client_ids(sc: Scenario, w: Worker) -> set[str]:
    """The server's ids of worker ``w``'s connections (ids, unlike ports, are never reused)."""
    ports = _local_ports(w.proc.pid)
    return {c["id"] for c in sc.r.client_list() if int(c["addr"].rsplit(":", 1)[1]) in ports}


def _kill_connections(sc: Scenario, w: Worker) -> int:
    """CLIENT KILL every connection of worker ``w``; how many were closed."""
    n = 0
    for cid in _client_ids(sc, w):
        try:
            sc.r.client_kill_filter(_id=cid)
        except redis.ResponseError:
            continue  # it closed by itself meanwhile
        n += 1
    return n


def _freeze(w: Worker) -> None:
    """SIGSTOP ``w`` and wait until it is stopped: the signal is only queued when ``kill()``
    returns, and a worker on the other CPU runs on (and may join, commit) until it lands, so
    what the server says of it is read only after."""
    w.signal(signal.SIGSTOP)
    wait_until(lambda: Path(f"/proc/{w.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
               == "T", timeout_s=STEP_WAIT_S)


def _member_id(sc: Scenario, w: Worker) -> str | None:
    """``w``'s member id in the server's record (None: not a member now)."""
    desc = sc.coord.describe_group(GROUP)
    return next((m.member_id for m in desc.members if m.client_id == w.name), None)


def _generation(sc: Scenario) -> int:
    """The group's generation in the server's record (the group hash)."""
    return int(sc.r.hget(GroupKeys.of(sc.ns, sc.coord.config.num_partitions, GROUP).group, "gen"))


def _generation_without(sc: Scenario, w: Worker) -> int:
    """A generation the server has Stable without ``w`` (waited for): every generation ``w``
    was a member of is older. Read from the group hash on both sides of the description, so
    the description is of that generation (generations only grow)."""
    found: list[int] = []

    def read() -> bool:
        before = _generation(sc)
        desc = sc.coord.describe_group(GROUP)
        if _generation(sc) != before or desc.state != "Stable" or any(
                m.client_id == w.name for m in desc.members):
            return False
        found.append(before)
        return True

    wait_until(read, timeout_s=STEP_WAIT_S)
    return found[0]


def _commits(sc: Scenario) -> dict[str, int]:
    out: dict[str, int] = {}
    for w in sc.workers:
        out[w.name] = sum(1 for ev in w.events() if ev["e"] == "commit")
    return out


def _live(sc: Scenario) -> list[Worker]:
    return [w for w in sc.workers if w.proc.poll() is None]


def _wait_commits(sc: Scenario, more: int = 2) -> None:
    """Every live worker noted ``more`` commits after now: it is back at work. One the live
    workers' last generation gave no partition is left out: it has nothing to commit (three
    pause_in_rebalance steps, as seed 13 draws, make 7 workers for the 6 partitions)."""
    base = _commits(sc)
    live = _live(sc)
    gen = sc.stable(live)
    busy = [w for w in live if gen is None or _assigned(sc, w, gen)["parts"]]
    wait_until(lambda: all(_commits(sc)[w.name] >= base[w.name] + more for w in busy),
               timeout_s=STEP_WAIT_S)


def _wait_rebalancing(sc: Scenario, workers: list[Worker], after: float) -> None:
    """Until the group is rebalancing, or the generation of ``workers`` (recorded after
    ``after``) is already there: the rebalance a newcomer starts lasts a few hundred ms, which
    a test thread descheduled on a loaded machine misses, and the group then stays Stable."""
    wait_until(lambda: sc.coord.describe_group(GROUP).state != "Stable"
               or sc.stable(workers, after) is not None, timeout_s=STEP_WAIT_S)


def _assigned(sc: Scenario, w: Worker, gen: int) -> dict[str, Any]:
    return next(ev for ev in w.events() if ev["e"] == "assigned" and ev["gen"] == gen)


@pytest.mark.parametrize("timers", ["service", "members"])
def test_seeded_chaos_keeps_the_group_invariants(chaos, timers):
    """``timers``: who applies the deadlines (sessions, rebalance timeouts): the coordinator
    service, or, with the service stopped, the members' own calls (a step finds a deadline
    passed and applies it first)."""
    rng = random.Random(SEED)
    sc = chaos(workers=4, records=1_000_000)
    gen = sc.wait_stable(timeout_s=STEP_WAIT_S)
    if timers == "members":
        sc.services[0].stop()
    sc.start_traffic()
    _wait_commits(sc, more=1)
    kinds = ["kill", "zombie", "client_kill", "debug_sleep", "storm",
             "pause_in_rebalance"]
    plan = kinds + [rng.choice(kinds) for _ in range(FAULTS - len(kinds))]
    rng.shuffle(plan)
    fenced_checks = 0
    for step, kind in enumerate(plan):
        live = _live(sc)
        victim = rng.choice(live)
        t0 = time.time()
        if kind == "kill":
            victim.proc.kill()  # no LeaveGroup: its session must run out
            victim.proc.wait(10)
            others = [w for w in live if w is not victim]
            gen = sc.wait_stable(others, after=t0, timeout_s=STEP_WAIT_S)
            # Each ``after`` is taken before the act that lets the next generation form: one
            # taken after it misses a generation formed while this thread was descheduled.
            joined = time.time()
            sc.add_worker(f"n{step}")
            gen = sc.wait_stable(_live(sc), after=joined, timeout_s=STEP_WAIT_S)
        elif kind == "zombie":
            # What is judged is the server's record, read while the victim is frozen, and the
            # interval a commit began in; never the victim's notes: a member frozen while a
            # rebalance is under way (after an unexpected session expiry) has revoked its last
            # noted generation, or has joined one it has not noted yet.
            _freeze(victim)
            member, frozen = _member_id(sc, victim), _generation(sc)
            others = [w for w in live if w is not victim]
            gen = sc.wait_stable(others, after=t0, timeout_s=STEP_WAIT_S)
            fenced = _generation_without(sc, victim)
            # A commit in the zombie's name: with the generation the group had when it was
            # frozen, and with the one it is not in. Both are fenced; nothing is written. (Not a
            # member when frozen: any id it had is as good, as member ids are never reused.)
            if member is None:
                member = [ev for ev in victim.events() if ev["e"] == "assigned"][-1]["member"]
            before = sc.committed()
            tps = {TopicPartition(TOPIC, p): 0 for p in range(PARTITIONS)}
            for g in (frozen, fenced):
                got = sc.coord.commit_offsets(GROUP, tps, member_id=member, generation_id=g)
                assert {e.name for e in got.values()} <= FENCED, (g, got)
                fenced_checks += 1
            after = sc.committed()
            assert all(after.get(p, -1) >= o for p, o in before.items()), (before, after)
            woke = time.time()
            victim.signal(signal.SIGCONT)  # it wakes up mid-poll and commits, then rejoins
            gen = sc.wait_stable(live, after=woke, timeout_s=STEP_WAIT_S)
            # No commit it began after the wake was stored with a generation it had before, or
            # with the member id it was frozen with: the group was at ``fenced`` by then. (One
            # begun before the freeze may be answered, and written down, after the wake.)
            zombie = [ev for ev in victim.events() if ev["e"] == "commit" and ev["sent"] > woke
                      and (ev["gen"] < fenced or ev["member"] == member)]
            assert not zombie, zombie
        elif kind == "pause_in_rebalance":
            # A member frozen mid-rebalance (maybe the leader, before its SyncGroup), past its
            # session: the rebalance goes on without it, and it rejoins when it wakes.
            newcomer = sc.add_worker(f"n{step}")
            _wait_rebalancing(sc, [*live, newcomer], after=t0)
            victim.signal(signal.SIGSTOP)
            others = [w for w in live if w is not victim] + [newcomer]
            gen = sc.wait_stable(others, after=t0, timeout_s=STEP_WAIT_S)
            woke = time.time()
            victim.signal(signal.SIGCONT)
            gen = sc.wait_stable(_live(sc), after=woke, timeout_s=STEP_WAIT_S)
        elif kind == "client_kill":
            assert _kill_connections(sc, victim) >= 1
            _wait_commits(sc)
        elif kind == "storm":
            # Faults on top of a rebalance: a worker killed, and while the group waits for its
            # session to run out, a newcomer joins, every other connection (the workers', the
            # service's) is closed, and the server sleeps.
            victim.proc.kill()
            victim.proc.wait(10)
            sc.add_worker(f"n{step}")
            _wait_rebalancing(sc, _live(sc), after=t0)
            sc.r.client_kill_filter(_type="normal", skipme=True)
            sc.r.execute_command("DEBUG", "SLEEP", "0.3")
            gen = sc.wait_stable(_live(sc), after=t0, timeout_s=STEP_WAIT_S)
        else:
            sc.r.execute_command("DEBUG", "SLEEP", "0.4")  # well inside the 1.5 s session
            _wait_commits(sc)
    sc.stop_producing()

    # The faults are over: the group converges to Stable with exactly the live workers, each
    # partition assigned once.
    live = _live(sc)
    gen = sc.wait_stable(live, timeout_s=STEP_WAIT_S)
    wait_until(lambda: sc.coord.describe_group(GROUP).state == "Stable", timeout_s=STEP_WAIT_S)
    desc = sc.coord.describe_group(GROUP)
    assert len(desc.members) == len(live)
    owned = sorted(tp.partition for m in desc.members
                   for tp in ConsumerProtocolAssignment.decode(m.assignment).partitions)
    assert owned == list(range(PARTITIONS))
    # A live member's commit with a generation it has left (a commit delayed past a rebalance)
    # is refused, and writes nothing. Its member id is Redis's (the description just read):
    # one from the worker's notes may be one a stall of a loaded machine has since expired.
    member = next(m.member_id for m in desc.members if m.client_id == live[0].name)
    before = sc.committed()
    got = sc.coord.commit_offsets(GROUP, {TopicPartition(TOPIC, p): 0 for p in range(PARTITIONS)},
                                  member_id=member, generation_id=gen - 1)
    assert {e.name for e in got.values()} == {"ILLEGAL_GENERATION"}, got
    after = sc.committed()
    assert all(after.get(p, -1) >= o for p, o in before.items()), (before, after)
    sc.drain(timeout_s=STEP_WAIT_S)
    # A zombie's own late commits (with the generation it was fenced from) were refused.
    refused = [ev for w in sc.workers for ev in w.events() if ev["e"] == "commit_refused"]
    assert {ev["error"] for ev in refused} <= FENCED | {"REBALANCE_IN_PROGRESS"}, refused
    assert fenced_checks >= 2
    _judge(sc.finish(), owed_at_least=100)


class StaticWorker(Worker):
    """A fault worker with a ``group.instance.id`` (a static member, KIP-345)."""

    def __init__(self, sc: Scenario, name: str, iid: str) -> None:
        self.name = name
        self.history = sc.dir / f"{name}.jsonl"
        self._fh = open(sc.dir / f"{name}.out", "w")  # noqa: SIM115 - open for its life
        self.proc = subprocess.Popen(
            [sys.executable, str(test_faults.WORKER), "--redis-url", sc.url,
             "--namespace", sc.ns, "--group", GROUP, "--topic", TOPIC, "--name", name,
             "--history", str(self.history), "--session-timeout-ms", str(sc.session_ms),
             "--heartbeat-interval-ms", str(max(100, sc.session_ms // 5)),
             "--group-instance-id", iid],
            stdout=self._fh, stderr=subprocess.STDOUT, env=test_faults._env(),
        )
        sc.workers.append(self)


def test_a_frozen_static_member_replaced_by_its_instance_id_is_fenced(chaos):
    """A static member frozen (SIGSTOP) and, within its session, replaced by a new process with
    the same ``group.instance.id``: the new one takes its place (and its partitions); the old
    one, woken, is fenced (FENCED_INSTANCE_ID): neither it nor a commit in its name writes an
    offset, and the group is Stable with the replacement.

    Whether the woken one wrote an offset is read from the server, not only from its notes: a
    commit it began before the freeze, held in its socket (half written) and run after the
    wake, is answered after the wake like one stored before the freeze. So the traffic is
    drained while it is frozen (every committed offset at the log end, which has grown since
    the freeze, so anything it could commit is lower), and after it is woken, gone, and every
    connection it had when frozen is closed by the server, the committed offsets are the log
    ends still: nobody else has anything left to commit, so no later commit hides its write."""
    sc = chaos(workers=2, records=1_000_000)
    old_w = StaticWorker(sc, "s1", "i1")
    sc.wait_stable(timeout_s=STEP_WAIT_S)
    sc.start_traffic()
    _wait_commits(sc, more=1)
    old = [ev for ev in old_w.events() if ev["e"] == "assigned"][-1]
    _freeze(old_w)
    frozen_ends = sc.log_ends()
    held = _client_ids(sc, old_w)
    assert held
    new_w = StaticWorker(sc, "s1b", "i1")
    wait_until(lambda: any(ev["e"] == "assigned" for ev in new_w.events()),
               timeout_s=STEP_WAIT_S)
    before = sc.committed()
    tps = {TopicPartition(TOPIC, p): 0 for p in range(PARTITIONS)}
    got = sc.coord.commit_offsets(GROUP, tps, member_id=old["member"],
                                  generation_id=old["gen"], group_instance_id="i1")
    assert {e.name for e in got.values()} == {"FENCED_INSTANCE_ID"}, got
    assert all(sc.committed().get(p, -1) >= o for p, o in before.items())
    wait_until(lambda: all(end > frozen_ends[p] for p, end in sc.log_ends().items()),
               timeout_s=STEP_WAIT_S)
    sc.stop_producing()
    sc.drain(timeout_s=STEP_WAIT_S)  # the replacement committed the log end of i1's partitions
    ends = sc.log_ends()
    woke = time.time()
    old_w.signal(signal.SIGCONT)
    wait_until(lambda: any(ev["e"] in ("lost", "revoked") and ev["t"] > woke
                           for ev in old_w.events()), timeout_s=STEP_WAIT_S)
    _freeze(old_w)  # (and the connections it has opened since, a commit retried on one)
    held |= _client_ids(sc, old_w)
    assert old_w.stop() == 0
    # (No commit begun after the wake was stored. One begun before the freeze was stored
    # before the replacement, though its answer may be written down after the wake: a SIGSTOP
    # between the commit and its note failed this test, which read the note's time.)
    assert not [ev for ev in old_w.events() if ev["e"] == "commit" and ev["sent"] > woke]
    # The server read to its end what each connection of the old one carried (it closes a
    # connection only then), and stored none of it: the offsets are the log ends still.
    wait_until(lambda: not held & {c["id"] for c in sc.r.client_list()}, timeout_s=STEP_WAIT_S)
    assert sc.committed() == ends, (sc.committed(), ends)
    live = _live(sc)
    wait_until(lambda: sc.coord.describe_group(GROUP).state == "Stable", timeout_s=STEP_WAIT_S)
    desc = sc.coord.describe_group(GROUP)
    assert len(desc.members) == len(live)
    # Kafka keeps the generation when a static member is replaced in a Stable group (the new
    # member id gets the old one's assignment): one owner per generation is one *instance*.
    h = sc.finish()
    h.assignments = [dataclasses.replace(a, member="i1") if a.worker in ("s1", "s1b") else a
                     for a in h.assignments]
    _judge(h, owed_at_least=100)
