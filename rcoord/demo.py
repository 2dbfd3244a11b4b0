"""``rcoord demo``: the main job, end to end, with its own checks.

A topic, a producer, a coordinator and a consumer group of worker processes; one worker is
killed midway and another one joins; at the end it checks that every record was processed at
least once, every committed offset reached the log end, the killed member's commit was refused,
and (with the cooperative assignor, the default) that the workers that stayed revoked nothing
they kept. Exits 0 only if all hold. See ``rcoord demo --help``.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import secrets
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis
import redis.exceptions

from .cli import (
    ENV_REDIS_URL,
    AfterCommand,
    StopSignals,
    Terminated,
    UsageError,
    add_tls_arguments,
    check_url,
    env_default,
    log_level,
    report,
    with_tls_files,
)
from .ops.common import integer, seconds
from .topics.admin import MAX_PARTITIONS_PER_CALL

__all__ = ["add_arguments", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The demo's flags (registered by ``rcoord.cli``)."""
    _demo_arguments(p)


def run(args: argparse.Namespace) -> int:
    """Run the demo; the exit status."""
    return _run_demo(args)


DEMO_GROUP = "demo"
DEMO_TOPIC = "demo-events"


def _demo_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--redis-url",
        action=AfterCommand,
        default=env_default(ENV_REDIS_URL),
        help=f"Redis or Redis Cluster to use (default ${ENV_REDIS_URL}); without one, "
        "an embedded server is started on 127.0.0.1",
    )
    p.add_argument("--partitions", type=integer, default=12,
                   help="partitions of the topic (12)")
    p.add_argument("--records", type=integer, default=3000, help="records to produce (3000)")
    p.add_argument("--workers", type=integer, default=3,
                   help="worker processes at the start (3)")
    p.add_argument(
        "--produce-seconds",
        type=seconds,
        default=8.0,
        help="spread the records over this many seconds (8)",
    )
    p.add_argument(
        "--time-limit",
        type=seconds,
        default=55.0,
        help="give up (exit 1) after this many seconds, set-up included (55)",
    )
    p.add_argument(
        "--assignor",
        default="cooperative-sticky",
        help="the workers' assignor (cooperative-sticky: incremental rebalancing, the workers "
        "that stay keep consuming; range or roundrobin: eager, every worker stops)",
    )
    p.add_argument("--log-level", action=AfterCommand,
                   default=env_default("RCOORD_LOG_LEVEL", "WARNING"),
                   help="of this process; DEBUG also prints the traceback of an error "
                   "(default $RCOORD_LOG_LEVEL, else WARNING)")
    add_tls_arguments(p)


@dataclass
class _DemoState:
    """What the main process knows while the demo runs."""

    started: float = field(default_factory=time.monotonic)
    printed_events: int = 0
    generations: dict[int, dict[str, tuple[str, list[int]]]] = field(
        default_factory=lambda: defaultdict(dict)
    )
    events: list[dict[str, Any]] = field(default_factory=list)

    def clock(self) -> str:
        return f"{time.monotonic() - self.started:6.2f}s"


DEMO_WORKER: dict[str, Any] = {
    "session_timeout_ms": 1500,
    "heartbeat_interval_ms": 300,
    "rebalance_timeout_ms": 5000,
    "partition_watch_interval_ms": 1000,
    "join_backoff_ms": 500,
    "retry_backoff_ms": 50,
    "retry_backoff_max_ms": 500,
}
DEMO_WORK_MS = 1.0
"""Simulated work per record, so the group is visibly busy while it rebalances."""


def _demo_worker(url: str, namespace: str, name: str, stop: Any,
                 assignor: str = "cooperative-sticky", ready: Any = None, go: Any = None) -> None:
    """One worker process of the demo (spawned; stopped by ``stop``, or killed).

    It sets ``ready`` once it is set up and polls (so joins the group) only once ``go`` is
    set: a spawned process takes a second or more to import rcoord, longer on a loaded
    machine, and workers that came to the group further apart than its initial delay split
    the first generation in several, each taking the partitions from the last.
    """
    import logging

    from .client import Consumer, ConsumerGroupConfig
    from .client.group import client_from_url
    from .client.history import RebalanceHistory

    logging.basicConfig(level=logging.WARNING, format=f"  [{name}] %(levelname)s %(message)s")
    log = logging.getLogger(f"rcoord.demo.{name}")
    client = client_from_url(url)
    report = RebalanceHistory(client, f"{namespace}:demo:events", name)

    config = ConsumerGroupConfig(
        group_id=DEMO_GROUP,
        topics=[DEMO_TOPIC],
        redis_client=client,
        namespace=namespace,
        client_id=name,
        assignors=[assignor],
        **DEMO_WORKER,
    )
    consumer = Consumer(
        config,
        listener=report,
        auto_commit_interval_ms=250,
        fetch_max_wait_ms=50,
        max_poll_records=200,
    )
    report.consumer = consumer
    if ready is not None:
        ready.set()
    while go is not None and not go.wait(0.1):
        if stop.is_set():
            break  # stopped before the group: still closed below
    try:
        while not stop.is_set():
            try:
                records = consumer.poll(timeout=0.2)
            except Exception as exc:  # noqa: BLE001 - a join error is reported once; keep polling
                log.warning("poll: %s", exc)
                continue
            if not records:
                continue
            time.sleep(DEMO_WORK_MS * len(records) / 1000)  # the "work"
            pipe = client.pipeline(transaction=False)
            pipe.rpush(f"{namespace}:demo:done:{name}",
                       *[f"{r.partition}:{r.offset}" for r in records])
            pipe.execute()
    except KeyboardInterrupt:
        return  # Ctrl-C reaches the whole process group: the demo itself stops the workers
    consumer.close(timeout=30)
    client.close()


class _Demo:
    def __init__(self, url: str, args: argparse.Namespace, deadline: float) -> None:
        from .config import CoordinatorConfig
        from .coordinator import GroupCoordinator
        from .topics import Producer, Topics

        self.url, self.args = url, args
        self.state = _DemoState()
        self.deadline = deadline
        self.step = "connecting to Redis"
        self.r = _demo_client(url)
        self.ns = f"demo-{os.getpid()}-{secrets.token_hex(3)}"
        self.coord = GroupCoordinator(
            self.r,
            CoordinatorConfig(
                namespace=self.ns,
                group_min_session_timeout_ms=100,
                group_initial_rebalance_delay_ms=500,
            ),
        ).start()
        self.topics = Topics(self.r, self.ns)
        self.producer = Producer(self.r, self.ns)
        self.ctx = mp.get_context("spawn")
        self.procs: dict[str, Any] = {}
        self.stops: dict[str, Any] = {}
        self.ready: dict[str, Any] = {}
        self.go = self.ctx.Event()
        """Set once the first workers are all ready: they join the group together."""
        self.names: list[str] = []
        self.produced = 0
        self.producing = False
        self.last_progress = 0.0
        self.stop_threads = threading.Event()
        self.service: Any = None

    # -- output

    def say(self, text: str) -> None:
        print(f"{self.state.clock()}  {text}", flush=True)

    def show_events(self) -> None:
        raw = self.r.lrange(f"{self.ns}:demo:events", self.state.printed_events, -1)
        for item in raw:
            ev = json.loads(item)
            self.state.printed_events += 1
            self.state.events.append(ev)
            parts = " ".join(str(p) for p in ev["partitions"]) or "-"
            why = f" ({ev['reason']})" if ev["event"] != "assigned" and ev["reason"] else ""
            self.say(f"generation {ev['gen']:>2}  {ev['worker']} {ev['event']:<8} [{parts}]{why}")
            if ev["event"] == "assigned":
                # Under the cooperative protocol "partitions" is only what was added.
                held = ev.get("held", ev["partitions"])
                self.state.generations[ev["gen"]][ev["member"]] = (ev["worker"], held)

    def owners(self, names: set[str]) -> int | None:
        """The latest generation in which exactly ``names`` hold every partition."""
        for gen, members in sorted(self.state.generations.items(), reverse=True):
            workers = {w for w, _ in members.values()}
            parts = sorted(p for _, ps in members.values() for p in ps)
            if workers == names and parts == list(range(self.args.partitions)):
                return gen
        return None

    # -- workers

    def start_worker(self) -> str:
        name = f"w{len(self.names) + 1}"
        stop, ready = self.ctx.Event(), self.ctx.Event()
        proc = self.ctx.Process(
            target=_demo_worker,
            args=(self.url, self.ns, name, stop, self.args.assignor, ready, self.go),
            daemon=True
        )
        # The worker starts with SIGINT blocked (a mask survives fork and exec): Ctrl-C reaches
        # the whole process group, and landing in a worker still importing rcoord it printed a
        # traceback per worker. The demo stops its workers itself (``stop``, or a kill); a
        # SIGINT to this process meanwhile waits until the mask is lifted, so none is lost.
        import signal

        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            proc.start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        self.procs[name], self.stops[name], self.ready[name] = proc, stop, ready
        self.names.append(name)
        self.say(f"started worker {name} (pid {proc.pid})")
        return name

    def live(self) -> set[str]:
        return set(self.procs)

    # -- waiting

    def wait(self, what: str, cond: Callable[[], bool], every: float = 0.05) -> None:
        """Print events (and progress once a second) until ``cond()``; bounded by --time-limit."""
        self.step = f"waiting for {what}"
        while not cond():
            if time.monotonic() > self.deadline:
                raise TimeoutError(self.step)
            self.show_events()
            if self.producing and time.monotonic() - self.last_progress >= 1.0:
                self.last_progress = time.monotonic()
                self.say(self.progress())
            time.sleep(every)
        self.show_events()

    # -- data

    def log_ends(self) -> dict[int, int]:
        return {p.partition: p.log_end_offset for p in self.topics.describe(DEMO_TOPIC).partitions}

    def committed(self) -> dict[int, int]:
        from .protocol.offsets import TopicPartition

        got = self.coord.fetch_offsets(
            DEMO_GROUP, [TopicPartition(DEMO_TOPIC, p) for p in range(self.args.partitions)]
        ).offsets
        return {tp.partition: o.offset for tp, o in got.items()}

    def processed(self) -> dict[str, list[tuple[int, int]]]:
        out: dict[str, list[tuple[int, int]]] = {}
        for name in self.names:
            items = self.r.lrange(f"{self.ns}:demo:done:{name}", 0, -1)
            out[name] = [(int(p), int(o)) for p, o in (x.decode().split(":") for x in items)]
        return out

    def progress(self) -> str:
        """One consistent reading: what the topic holds, what was processed, and the lag.

        The producer's own count moves only after its batch is stored, so the topic's log ends
        are what counts as produced; the commits are read before them, so no partition's lag
        is negative (a commit never passes the log end it was made under).
        """
        done = self.committed()
        ends = self.log_ends()
        lag = sum(end - max(0, done.get(p, -1)) for p, end in ends.items())
        counts = {n: len(v) for n, v in self.processed().items()}
        per = "  ".join(f"{n}={c}" for n, c in counts.items())
        return f"produced {sum(ends.values())}, processed {per}, lag {lag}"

    # -- background threads

    def start_coordinator(self) -> str:
        """The coordinator service in a thread of this process (or a stand-in without it)."""
        try:
            from .service import CoordinatorService, ServiceConfig

            self.service = CoordinatorService(
                ServiceConfig(redis_url=self.url, namespace=self.ns, coordinator_id="demo")
            ).start()
        except Exception as exc:  # noqa: BLE001 - the demo can run without the service
            self.service = None
            threading.Thread(target=self.run_timers, daemon=True).start()
            return f"GroupCoordinator.run_timers() every 100 ms (no coordinator service: {exc})"
        threading.Thread(
            target=self.service.run, name="rcoord-demo-coordinator", daemon=True
        ).start()
        return "rcoord.service.CoordinatorService, in a thread of this process"

    def run_timers(self) -> None:
        """The stand-in coordinator: apply passed deadlines (session timeouts) promptly."""
        while not self.stop_threads.wait(0.1):
            try:
                self.coord.run_timers()
            except Exception as exc:  # noqa: BLE001 - scripts apply deadlines lazily anyway
                self.say(f"coordinator: run_timers failed: {exc}")

    def produce(self) -> None:
        batch = 50
        pause = self.args.produce_seconds / max(1, -(-self.args.records // batch))
        while self.produced < self.args.records and not self.stop_threads.is_set():
            from .topics import ProducerRecord

            n = min(batch, self.args.records - self.produced)
            self.producer.send_batch(
                DEMO_TOPIC,
                [
                    ProducerRecord(
                        f"event {self.produced + i}".encode(),
                        key=f"user-{(self.produced + i) % 97}".encode(),
                    )
                    for i in range(n)
                ],
            )
            self.produced += n
            self.stop_threads.wait(pause)

    # -- the script

    def run(self) -> int:
        a = self.args
        self.say(
            f"namespace {self.ns}; topic {DEMO_TOPIC!r} with {a.partitions} partitions; "
            f"group {DEMO_GROUP!r}; session timeout {DEMO_WORKER['session_timeout_ms']} ms, "
            f"heartbeat {DEMO_WORKER['heartbeat_interval_ms']} ms"
        )
        self.step = f"set-up: creating topic {DEMO_TOPIC!r} with {a.partitions} partitions"
        self.topics.create(DEMO_TOPIC, a.partitions)
        self.step = "set-up: starting the coordinator"
        self.say(f"coordinator: {self.start_coordinator()}")
        self.step = "set-up: starting the workers"
        for _ in range(a.workers):
            self.start_worker()
        first = set(self.names)
        self.wait("the workers to start", lambda: all(self.ready[n].is_set() for n in first))
        self.go.set()
        self.wait("the first generation", lambda: self.owners(first) is not None)
        self.say(f"the group is stable: {self.ownership(self.owners(first))}")

        producer = threading.Thread(target=self.produce, daemon=True)
        producer.start()
        self.producing = True
        self.say(f"producing {a.records} records (keyed; Kafka's murmur2 partitioner)")
        self.wait("a third of the records", lambda: self.produced >= a.records // 3)
        self.say(self.progress())

        victim = self.names[-1]
        victim_gen = self.owners(first)
        assert victim_gen is not None
        victim_member, victim_parts = next(
            (m, ps) for m, (w, ps) in self.state.generations[victim_gen].items() if w == victim
        )
        killed_at = time.monotonic()
        self.procs.pop(victim).kill()
        self.say(
            f"killed {victim} with SIGKILL (it held {victim_parts} in generation {victim_gen})"
        )
        survivors = self.live()
        self.wait(
            "the dead worker's partitions to move",
            lambda: (self.owners(survivors) or 0) > victim_gen,
        )
        moved = time.monotonic() - killed_at
        self.say(
            f"{victim}'s partitions moved to {sorted(survivors)} {moved:.2f} s after the kill "
            f"(session timeout {DEMO_WORKER['session_timeout_ms'] / 1000:g} s)"
        )
        from .protocol.offsets import TopicPartition

        zombie = self.coord.commit_offsets(
            DEMO_GROUP,
            {TopicPartition(DEMO_TOPIC, p): 0 for p in victim_parts},
            member_id=victim_member,
            generation_id=victim_gen,
        )
        codes = sorted({e.name for e in zombie.values()})
        self.say(f"a commit stamped with {victim}'s generation {victim_gen} is refused: {codes}")

        self.show_events()
        mark = len(self.state.events)
        newcomer = self.start_worker()
        everyone = self.live()
        self.wait(f"{newcomer} to join", lambda: self.owners(everyone) is not None)
        self.say(f"the group is stable again: {self.ownership(self.owners(everyone))}")
        kept_revoked = self.kept_but_revoked(self.state.events[mark:], self.owners(everyone))

        def drained() -> bool:
            return self.produced >= a.records and self.committed() == self.log_ends()

        self.wait("every committed offset to reach the log end", drained, every=0.1)
        self.producing = False
        self.say(self.progress())
        self.say("stopping the workers (each revokes what it holds as it leaves the group)")
        for name in sorted(self.live()):
            self.stops[name].set()
        for name in sorted(self.live()):
            self.procs[name].join(30)
        self.show_events()
        return self.report(
            zombie_refused=all(
                e.name in ("UNKNOWN_MEMBER_ID", "ILLEGAL_GENERATION") for e in zombie.values()
            ),
            kept_revoked=kept_revoked,
        )

    def kept_but_revoked(self, events: list[dict[str, Any]], gen: int | None) -> int:
        """Partitions a worker kept across the newcomer's join but was made to revoke anyway.

        Zero is the point of the cooperative protocol (KIP-429): the workers that stay keep
        consuming what they keep. An eager protocol revokes every partition of every worker.
        """
        final = {w: set(ps) for w, ps in self.state.generations.get(gen or -1, {}).values()}
        revoked: dict[str, set[int]] = defaultdict(set)
        for ev in events:
            if ev["event"] in ("revoked", "lost"):
                revoked[ev["worker"]] |= set(ev["partitions"])
        return sum(len(revoked[w] & final.get(w, set())) for w in revoked)

    def ownership(self, gen: int | None) -> str:
        members = self.state.generations.get(gen or -1, {})
        return f"generation {gen}: " + "; ".join(
            f"{w} [{' '.join(map(str, ps))}]" for w, ps in sorted(members.values())
        )

    def report(self, *, zombie_refused: bool, kept_revoked: int) -> int:
        ends, committed = self.log_ends(), self.committed()
        processed = self.processed()
        seen: dict[tuple[int, int], int] = defaultdict(int)
        for items in processed.values():
            for item in items:
                seen[item] += 1
        total = sum(ends.values())
        missing = [(p, o) for p, end in ends.items() for o in range(end) if (p, o) not in seen]
        duplicates = sum(c - 1 for c in seen.values() if c > 1)
        print(flush=True)
        print("worker  records processed", flush=True)
        for name in self.names:
            print(f"{name:<7} {len(processed.get(name, [])):>17}", flush=True)
        print(flush=True)
        print(f"generations: {', '.join(str(g) for g in sorted(self.state.generations))}")
        at_end = committed == ends
        all_once = not missing
        print(
            f"produced {total} records; processed {len(seen)} distinct, "
            f"{duplicates} more than once (at-least-once: records after a member's last "
            "commit are processed again by the partition's next owner)"
        )
        print(
            f"check: every produced record processed at least once ... "
            f"{'yes' if all_once else f'NO ({len(missing)} missing, e.g. {missing[:5]})'}"
        )
        print(
            f"check: every committed offset is at the log end ........ "
            f"{'yes' if at_end else f'NO (committed {committed}, log end {ends})'}"
        )
        print(
            f"check: the killed member's commit was refused .......... "
            f"{'yes' if zombie_refused else 'NO'}"
        )
        cooperative = self.args.assignor == "cooperative-sticky"
        kept_ok = kept_revoked == 0 or not cooperative
        if cooperative:
            print(
                f"check: the workers that stayed revoked only what moved . "
                f"{'yes' if kept_ok else f'NO ({kept_revoked} kept partitions were revoked)'}"
            )
        else:
            print(f"eager rebalancing ({self.args.assignor}): the workers that stayed revoked "
                  f"{kept_revoked} partitions they kept when one joined")
        ok = all_once and at_end and zombie_refused and kept_ok
        print("demo: OK" if ok else "demo: FAILED", flush=True)
        return 0 if ok else 1

    def abandon(self) -> None:
        """Stop the run from another thread: its calls to Redis fail from now on.

        The pool hands out no more connections, and the calls in flight lose theirs; redis-py
        would retry those (reconnect and send again), so each connection's retries are spent
        first. Their sockets are shut, not closed (``disconnect_all``, as the coordinator
        service's stop does): closing one under a call raced with the call's ``poll``, which
        could then watch whatever socket got that descriptor next for a whole socket timeout.
        ``cleanup()`` closes the client. On a cluster the client is closed (best effort: it
        may reconnect).
        """
        from .service.nodes import disconnect_all

        self.stop_threads.set()
        pool = getattr(self.r, "connection_pool", None)
        if not isinstance(pool, _GatedPool):
            self.r.close()
            return
        pool.closed = True
        for conn in [*pool._in_use_connections, *pool._available_connections]:
            retry = getattr(conn, "retry", None)
            if retry is not None:
                retry.update_retries(0)
        disconnect_all(self.r)  # shuts the sockets of calls in flight, too

    def cleanup(self, *, delete_keys: bool, until: float) -> None:
        """Stop the coordinator and workers; delete the run's keys (batched) unless the server is
        thrown away anyway. Bounded by ``until`` (at least CLEANUP_S from now)."""
        from .client.group import client_from_url

        self.stop_threads.set()
        if self.service is not None:
            self.service.stop()
        for proc in self.procs.values():
            if proc.is_alive():
                proc.kill()
            proc.join(5)
        self.r.close()
        pool = getattr(self.r, "connection_pool", None)
        if pool is not None:
            pool.disconnect()
        if not delete_keys:
            return
        left = 0
        try:
            r = client_from_url(self.url)  # a fresh one: abandon() may have cut the old one
            try:
                batch: list[bytes] = []
                for key in r.scan_iter(match=f"{self.ns}:*", count=1000):
                    batch.append(key)
                    if len(batch) == 1000 and time.monotonic() < until:
                        _unlink(r, batch)
                        batch = []
                    elif time.monotonic() >= until:
                        left += 1
                _unlink(r, batch)
            finally:
                r.close()
        except Exception as exc:  # noqa: BLE001 - the namespace is unique to this run
            print(f"demo: could not delete the keys of {self.ns}: {exc}", file=sys.stderr)
            return
        if left:
            print(f"demo: {left} keys of {self.ns} are left (clean-up ran out of time)",
                  file=sys.stderr)


class _GatedPool(redis.ConnectionPool):
    """A connection pool that can be shut: once ``closed``, every call fails at once. The demo's
    set-up is a few long calls in library code that cannot watch the deadline themselves."""

    closed = False

    def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        if self.closed:
            raise redis.exceptions.ConnectionError("the demo gave up (--time-limit)")
        return super().get_connection(*args, **kwargs)


def _demo_client(url: str) -> Any:
    """The demo's client: a RedisCluster for a cluster, else a Redis on a _GatedPool."""
    from .client.coordinator import SOCKET_TIMEOUT_S
    from .client.group import client_from_url

    client = client_from_url(url)
    if not isinstance(client, redis.Redis):
        return client
    client.close()
    # (from_pool: the client's close() disconnects the pool, closing the sockets abandon()
    # only shut; a client given a pool by connection_pool= leaves it open.)
    return redis.Redis.from_pool(_GatedPool.from_url(
        url, socket_timeout=SOCKET_TIMEOUT_S, socket_connect_timeout=5.0
    ))


CLEANUP_S = 10.0
"""The clean-up after the verdict may take this long even when --time-limit is used up."""


def _unlink(r: Any, keys: list[bytes]) -> None:
    pipe = r.pipeline(transaction=False)
    for key in keys:
        pipe.unlink(key)
    pipe.execute()


def _run_demo(args: argparse.Namespace) -> int:
    """The demo, bounded as a whole by --time-limit: set-up, the run, the checks. Clean-up
    follows (at most CLEANUP_S more)."""
    prog = "rcoord demo"
    started = time.monotonic()
    deadline = started + args.time_limit
    try:
        level = log_level(args.log_level)
        if args.partitions < 2 or args.workers < 2 or args.records < 1:
            raise UsageError("needs --partitions >= 2, --workers >= 2, --records >= 1")
        if args.partitions > MAX_PARTITIONS_PER_CALL:
            raise UsageError(f"--partitions must be <= {MAX_PARTITIONS_PER_CALL} (one topic "
                             f"create), got {args.partitions}")
        # "not > 0": nan passes a "<= 0" check, and the demo gave up at its first deadline.
        if not args.time_limit > 0 or math.isinf(args.time_limit):
            raise UsageError(f"--time-limit must be a number of seconds > 0, got "
                             f"{args.time_limit:g}")
        if not 0 <= args.produce_seconds < math.inf:
            raise UsageError(f"--produce-seconds must be a number of seconds >= 0, got "
                             f"{args.produce_seconds:g}")
        from .assignors import UnknownAssignorError, get_assignor

        try:
            get_assignor(args.assignor)
        except UnknownAssignorError as exc:
            raise UsageError(f"--assignor: {exc}") from None
        url = args.redis_url
        if url:
            url = with_tls_files(
                check_url(url), args.tls_ca_file, args.tls_cert_file, args.tls_key_file
            )
    except UsageError as exc:
        return report(exc, prog)
    import logging

    logging.basicConfig(level=level, format="%(levelname)s %(name)s %(message)s")
    # SIGTERM (kill, timeout, docker stop) cleans up as Ctrl-C does: before, it killed the
    # demo at once and left its embedded server, its workers and (on a given Redis) its
    # members and keys behind.
    signals = StopSignals().install()
    try:
        return _demo_bounded(args, url, started, deadline)
    except Terminated:
        print(f"{prog}: stopped by SIGTERM; its workers and server are stopped", file=sys.stderr)
        return 143
    except KeyboardInterrupt:
        print(f"{prog}: interrupted; its workers and server are stopped", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - the edge: one line, the traceback only on DEBUG
        return report(exc, prog, url=url, debug=level == "DEBUG")
    finally:
        signals.restore()


def _demo_bounded(args: argparse.Namespace, url: str | None, started: float,
                  deadline: float) -> int:
    from .testing.embedded import EmbeddedServer

    server = None
    if not url:
        server = EmbeddedServer(own_session=True).start()
        url = server.url
        print(
            f"  0.00s  no Redis configured: started an embedded server at {url} "
            f"({os.path.basename(server.binary or 'server')})",
            flush=True,
        )
    demo = None
    try:
        demo = _Demo(url, args, deadline)
        demo.state.started = started
        outcome: dict[str, Any] = {}

        def body() -> None:
            try:
                outcome["code"] = demo.run()
            except BaseException as exc:  # noqa: BLE001 - handed to the main thread
                outcome["error"] = exc

        runner = threading.Thread(target=body, name="rcoord-demo", daemon=True)
        runner.start()
        # The run checks the deadline between steps; a step that cannot (a long set-up call)
        # is cut off from here.
        # In short slices: a signal the kernel hands to another thread runs its Python handler
        # only when this one runs again (a SIGTERM waited out the whole run).
        while runner.is_alive() and time.monotonic() < deadline:
            runner.join(min(0.2, max(0.0, deadline - time.monotonic())))
        gave_up = time.monotonic() - started
        if runner.is_alive():
            # Not joined: it may be computing in library code for a while, but from here on
            # every call it makes to Redis fails, so nothing it does outlives the clean-up.
            outcome = {"error": TimeoutError(demo.step)}
            demo.abandon()
        error = outcome.get("error")
        if isinstance(error, TimeoutError):
            print(
                f"demo: FAILED: {error}: not done within --time-limit {args.time_limit:g} s "
                f"(gave up at {gave_up:.2f} s)",
                flush=True,
            )
            return 1
        if error is not None:
            raise error
        return int(outcome["code"])
    finally:
        if demo is not None:
            demo.cleanup(delete_keys=server is None,
                         until=max(deadline, time.monotonic() + CLEANUP_S))
        if server is not None:
            server.stop()
