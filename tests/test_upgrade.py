"""Rolling upgrades: an older rcoord and this one driving the same groups in one namespace.

During a rolling upgrade workers and coordinator services are replaced one at a time, so for a
while two rcoord versions share a namespace. Each loads its own Functions library
(``rcoord_<hash>``, rcoord/scripts.py), so neither runs the other's code, but both read and
write the same keys: the group hash, member records, the deadline index, offsets, the reply
slots of parked calls. Kafka keeps brokers of two versions compatible likewise: its readers of
__consumer_offsets accept every older record schema. (Groups only: topics are not driven here.)

``PINNED`` is an older revision whose tree this test builds with ``git archive`` and runs in a
subprocess (its own Python and its own library) beside a subprocess of this tree, on one server
and one clock. A change to a stored format that the older revision misreads (or the other way
round) fails here. Move ``PINNED`` forward only together with docs/operations.md's "Rolling
upgrades", which names the oldest revision a rolling upgrade may start from.

Skipped, saying why, outside a git checkout that holds ``PINNED`` (an sdist, a shallow clone).
"""

from __future__ import annotations

import concurrent.futures
import itertools
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from rcoord.scripts import library_source
from rcoord.testing.embedded import EmbeddedServer

PINNED = "3791d30180322b24bf157b608dce7498df9b1770"
"""The older revision driven beside this tree (2026-11-23, 725 commits before this test): the
member records leading with the session timeout, the join order key, join and sync chunks and
the due index were all in place; the brief group reads, the commit fast path, the paged
retention walk and the parked replies' deadlines came after it."""

ROOT = Path(__file__).resolve().parent.parent
WAIT_S = 30.0

SETTINGS = {"group_min_session_timeout_ms": 10, "group_max_session_timeout_ms": 600_000,
            "group_initial_rebalance_delay_ms": 0}
"""Named alike by both processes (so neither rewrites the other's): no initial delay, short
sessions allowed."""

DRIVER = r'''
import concurrent.futures, dataclasses, enum, json, sys, threading, traceback
from pathlib import Path
import redis
from rcoord import (CoordinatorConfig, GroupCoordinator, MemberIdentity, OffsetAndMetadata,
                    TopicPartition)

port, namespace, clock_file, settings = sys.argv[1], sys.argv[2], Path(sys.argv[3]), sys.argv[4]
client = redis.Redis(host="127.0.0.1", port=int(port))
config = CoordinatorConfig(namespace=namespace, **json.loads(settings))
coord = GroupCoordinator(client, config, clock=lambda: int(clock_file.read_text())).start()
lock = threading.Lock()

def plain(x):
    if dataclasses.is_dataclass(x):
        return {f.name: plain(getattr(x, f.name)) for f in dataclasses.fields(x)}
    if isinstance(x, enum.Enum):
        return x.name
    if isinstance(x, (list, tuple)):
        return [plain(v) for v in x]
    if isinstance(x, dict):
        return {(k if isinstance(k, str) else f"{k[0]}-{k[1]}"): plain(v) for k, v in x.items()}
    if isinstance(x, bytes):
        return x.decode()
    return x

def run(req):
    op, args, kw = req["op"], req["args"], req["kw"]
    try:
        if op == "join_group":
            kw["protocols"] = [(n, m.encode()) for n, m in kw["protocols"]]
        elif op == "sync_group" and kw.get("assignments"):
            kw["assignments"] = {m: a.encode() for m, a in kw["assignments"].items()}
        elif op == "commit_offsets":
            args[1] = {TopicPartition(t, p): OffsetAndMetadata(o, meta)
                       for t, p, o, meta in args[1]}
        elif op == "leave_group":
            args[1] = [MemberIdentity(m) for m in args[1]]
        if op == "library":  # the name of the library this process calls
            reply = {"result": coord._scripts.library}
        else:
            reply = {"result": plain(getattr(coord, op)(*args, **kw))}
    except Exception as exc:
        reply = {"error": "".join(traceback.format_exception(exc))}
    reply["id"] = req["id"]
    with lock:
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()

pool = concurrent.futures.ThreadPoolExecutor(8)
for line in sys.stdin:
    pool.submit(run, json.loads(line))
pool.shutdown(wait=True)
'''
"""One rcoord process: runs each request (a GroupCoordinator method) on a thread, so calls may
park, and answers each with its result as plain JSON. Written against the public API both
revisions share."""


class Process:
    """A driver process over the rcoord tree at ``tree``."""

    def __init__(self, tree: Path, driver: Path, port: int, namespace: str, clock: Path) -> None:
        self.tree = tree
        self.proc = subprocess.Popen(
            [sys.executable, str(driver), str(port), namespace, str(clock), json.dumps(SETTINGS)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=str(driver.parent),
            env={**os.environ, "PYTHONPATH": str(tree)})
        self._ids = itertools.count()
        self._waiting: dict[int, concurrent.futures.Future[Any]] = {}
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            reply = json.loads(line)
            with self._lock:
                future = self._waiting.pop(reply["id"])
            if "error" in reply:
                future.set_exception(AssertionError(f"{self.tree.name}: {reply['error']}"))
            else:
                future.set_result(reply["result"])
        with self._lock:
            for future in self._waiting.values():
                future.set_exception(AssertionError(f"{self.tree.name}: the driver exited"))

    def submit(self, op: str, *args: Any, **kw: Any) -> concurrent.futures.Future[Any]:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        assert self.proc.stdin is not None
        with self._lock:
            rid = next(self._ids)
            self._waiting[rid] = future
            self.proc.stdin.write(json.dumps({"id": rid, "op": op, "args": list(args),
                                              "kw": kw}) + "\n")
            self.proc.stdin.flush()
        return future

    def call(self, op: str, *args: Any, **kw: Any) -> Any:
        return self.submit(op, *args, **kw).result(WAIT_S)

    def join(self, group: str, member_id: str = "", *, session_ms: int = 6000) -> Any:
        return self.submit("join_group", group, member_id, protocol_type="consumer",
                           protocols=[("range", f"meta-{self.tree.name}")],
                           session_timeout_ms=session_ms, rebalance_timeout_ms=10_000)

    def new_member(self, group: str, *, session_ms: int = 6000) -> str:
        """KIP-394's first JoinGroup: the member id to join with."""
        first = self.join(group, session_ms=session_ms).result(WAIT_S)
        assert first["error"] == "MEMBER_ID_REQUIRED", first
        return str(first["member_id"])

    def wait_for_state(self, group: str, state: str) -> None:
        """Until the group is in ``state`` (a call sent before, still parked, got there)."""
        deadline = time.monotonic() + WAIT_S
        while (now := self.call("describe_group", group)["state"]) != state:
            assert time.monotonic() < deadline, f"{group} stayed {now}, never {state}"

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(WAIT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._reader.join(WAIT_S)
        assert self.proc.stdout is not None
        self.proc.stdout.close()


def archived_tree(rev: str, into: Path) -> Path:
    """The rcoord tree of revision ``rev`` (``git archive``), or a skip saying why not."""
    git = shutil.which("git")
    if git is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the older revision's tree comes from git archive")
    found = subprocess.run([git, "-C", str(ROOT), "cat-file", "-e", f"{rev}^{{commit}}"],
                           capture_output=True, check=False)
    if found.returncode != 0:
        pytest.skip(f"the checkout lacks revision {rev[:12]} (a shallow clone?): "
                    "fetch the full history to run the rolling-upgrade test")
    archive = subprocess.run([git, "-C", str(ROOT), "archive", rev], check=True,
                             capture_output=True).stdout
    into.mkdir()
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


@pytest.fixture(scope="module")
def trees(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the pinned revision's tree, this tree)."""
    return archived_tree(PINNED, tmp_path_factory.mktemp("upgrade") / "old"), ROOT


class Clock:
    """The milliseconds both processes' coordinators read (a file), moved only by the test."""

    def __init__(self, path: Path) -> None:
        self.path, self.now = path, 1_000_000
        self.set(self.now)

    def set(self, now: int) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(str(now))
        os.replace(tmp, self.path)
        self.now = now

    def advance(self, ms: int) -> None:
        self.set(self.now + ms)


@pytest.fixture
def mixed(trees: tuple[Path, Path], redis_server: EmbeddedServer, namespace: str,
          tmp_path: Path) -> Iterator[tuple[Process, Process, Clock]]:
    """(older process, this tree's process, their clock) on one namespace."""
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    clock = Clock(tmp_path / "clock")
    old = Process(trees[0], driver, redis_server.port, namespace, clock.path)
    new = Process(trees[1], driver, redis_server.port, namespace, clock.path)
    try:
        yield old, new, clock
    finally:
        old.close()
        new.close()


def libraries(client: redis.Redis) -> set[str]:
    return {lib[1].decode() for lib in client.function_list("rcoord_*")}


@pytest.mark.parametrize("first", ["old", "new"])
def test_two_versions_share_a_group(mixed: tuple[Process, Process, Clock],
                                    redis_server: EmbeddedServer, first: str) -> None:
    """Members of both versions form a group, rebalance it, commit and read each other's
    offsets, see one description, and each version's timer sweep expires the other's member.
    ``first`` is the version whose member creates the group (and leads it)."""
    old, new, clock = mixed
    a, b = (old, new) if first == "old" else (new, old)
    group = f"mixed-{first}"

    # A forms the group alone.
    a_id = a.new_member(group)
    joined = a.join(group, a_id).result(WAIT_S)
    assert (joined["error"], joined["generation_id"], joined["leader_id"]) == ("NONE", 1, a_id)
    synced = a.call("sync_group", group, 1, a_id, assignments={a_id: "a1"})
    assert (synced["error"], synced["assignment"]) == ("NONE", "a1")

    # B's join starts a rebalance; A learns it by heartbeat and rejoins; the version that
    # completes the join answers the other's parked call.
    b_id = b.new_member(group, session_ms=3000)
    b_join = b.join(group, b_id, session_ms=3000)
    b.wait_for_state(group, "PreparingRebalance")
    assert a.call("heartbeat", group, 1, a_id) == "REBALANCE_IN_PROGRESS"
    a_join = a.join(group, a_id)
    ja, jb = a_join.result(WAIT_S), b_join.result(WAIT_S)
    assert (ja["error"], jb["error"]) == ("NONE", "NONE")
    assert ja["generation_id"] == jb["generation_id"] == 2
    assert ja["leader_id"] == jb["leader_id"] == a_id
    assert {m["member_id"]: m["metadata"] for m in ja["members"]} == {
        a_id: f"meta-{a.tree.name}", b_id: f"meta-{b.tree.name}"}

    # B's SyncGroup parks until A, the leader, assigns.
    b_sync = b.submit("sync_group", group, 2, b_id)
    a_sync = a.call("sync_group", group, 2, a_id, assignments={a_id: "a2", b_id: "b2"})
    assert (a_sync["error"], a_sync["assignment"]) == ("NONE", "a2")
    got = b_sync.result(WAIT_S)
    assert (got["error"], got["assignment"]) == ("NONE", "b2")

    # Offsets committed by either version are read alike by both.
    assert a.call("commit_offsets", group, [["t", 0, 10, "from-a"]], member_id=a_id,
                  generation_id=2) == {"t-0": "NONE"}
    assert b.call("commit_offsets", group, [["t", 1, 11, "from-b"]], member_id=b_id,
                  generation_id=2) == {"t-1": "NONE"}
    for p in (a, b):
        fetched = p.call("fetch_offsets", group)
        assert fetched["error"] == "NONE"
        assert {k: (v["offset"], v["metadata"]) for k, v in fetched["offsets"].items()} == {
            "t-0": (10, "from-a"), "t-1": (11, "from-b")}, p.tree.name
        described = p.call("describe_group", group)
        assert (described["state"], described["protocol_name"]) == ("Stable", "range")
        assert {m["member_id"]: m["assignment"] for m in described["members"]} == {
            a_id: "a2", b_id: "b2"}, p.tree.name

    # B's session (3 s) lapses while A heartbeats; A's version sweeps the deadline B's wrote.
    clock.advance(2500)
    assert a.call("heartbeat", group, 2, a_id) == "NONE"
    assert b.call("heartbeat", group, 2, b_id) == "NONE"
    clock.advance(3500)
    assert a.call("run_timers") >= 1
    assert a.call("heartbeat", group, 2, a_id) == "REBALANCE_IN_PROGRESS"
    assert b.call("heartbeat", group, 2, b_id) == "UNKNOWN_MEMBER_ID"
    alone = a.join(group, a_id).result(WAIT_S)
    assert (alone["error"], alone["generation_id"], len(alone["members"])) == ("NONE", 3, 1)
    assert a.call("sync_group", group, 3, a_id, assignments={a_id: "a3"})["error"] == "NONE"

    # And the other way: B's version sweeps the deadline A's version wrote.
    clock.advance(6001)
    assert b.call("run_timers") >= 1
    assert b.call("describe_group", group)["members"] == []
    assert a.call("heartbeat", group, 3, a_id) == "UNKNOWN_MEMBER_ID"
    assert {k: v["offset"] for k, v in a.call("fetch_offsets", group)["offsets"].items()} == {
        "t-0": 10, "t-1": 11}

    # The two versions ran two libraries side by side (else this test compared nothing). The
    # older one may be deleted while a process still uses it (docs/operations.md's clean-up
    # after an upgrade): that process loads it again at its next call.
    older = old.call("library")
    with redis_server.client() as client:
        assert {older, library_source()[0]} <= libraries(client)
        assert older != library_source()[0]
        client.function_delete(older)
        assert old.call("fetch_offsets", group)["error"] == "NONE"
        assert older in libraries(client)


def test_a_member_leaving_through_the_other_version(mixed: tuple[Process, Process, Clock]
                                                    ) -> None:
    """A LeaveGroup sent through the newer version for a member the older one added (a worker
    upgraded between its join and its leave) rebalances the group for the remaining members."""
    old, new, _ = mixed
    group = "leave-across"
    a_id = old.new_member(group)
    assert old.join(group, a_id).result(WAIT_S)["generation_id"] == 1
    old.call("sync_group", group, 1, a_id, assignments={a_id: "x"})
    b_id = old.new_member(group)
    b_join = old.join(group, b_id)
    old.wait_for_state(group, "PreparingRebalance")
    a_join = old.join(group, a_id)
    assert a_join.result(WAIT_S)["generation_id"] == b_join.result(WAIT_S)["generation_id"] == 2
    b_sync = old.submit("sync_group", group, 2, b_id)
    old.call("sync_group", group, 2, a_id, assignments={a_id: "x", b_id: "y"})
    assert b_sync.result(WAIT_S)["assignment"] == "y"

    left = new.call("leave_group", group, [a_id])
    assert left["error"] == "NONE" and [m["error"] for m in left["members"]] == ["NONE"]
    assert old.call("heartbeat", group, 2, b_id) == "REBALANCE_IN_PROGRESS"
    rejoined = old.join(group, b_id).result(WAIT_S)
    assert (rejoined["error"], rejoined["generation_id"], rejoined["leader_id"]) == (
        "NONE", 3, b_id)
