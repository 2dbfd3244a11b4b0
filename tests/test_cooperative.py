"""The incremental cooperative protocol (KIP-429) in the worker client.

Pure checks first (the leader's validation, protocol choice), then consumers against a real
server with ``cooperative-sticky``: the
revoke/assign/rejoin sequence, kept partitions consumed through the rebalance, the rolling
upgrade from eager, fencing, and a leader whose assignor breaks the protocol. Every wait is on a
condition, bounded by ``wait_until``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from harness import wait_until
from test_client_group import WAIT_S
from test_consumer import Recorder

from rcoord import GroupCoordinator, MemberIdentity, TopicPartition
from rcoord.assignors import RebalanceProtocol, get_assignor, rebalance_protocol
from rcoord.client import Consumer, ConsumerGroup, ConsumerGroupConfig
from rcoord.client.coordinator import RedisCoordinator
from rcoord.client.errors import CommitFailedError, CooperativeAssignmentError, WakeupError
from rcoord.client.join import check_cooperative
from rcoord.topics import Producer, Topics

TP = TopicPartition
COOP = "cooperative-sticky"



class DirectMover:
    """A broken plug-in: claims COOPERATIVE but deals partitions as range does, moving owned
    partitions straight to newcomers."""

    name = "bad-coop"
    supported_protocols = (RebalanceProtocol.COOPERATIVE,)

    def assign(self, members: Any, partitions_per_topic: Any, **kw: Any) -> Any:
        return get_assignor("range").assign(members, partitions_per_topic)


# -- pure ---------------------------------------------------------------------------------------


def test_check_cooperative_refuses_a_direct_move_and_accepts_withholding() -> None:
    owned = {"a": [TP("t", 0), TP("t", 1)], "b": []}
    check_cooperative(owned, {"a": [TP("t", 0)], "b": []})  # t-1 withheld: fine
    check_cooperative(owned, {"a": [TP("t", 0), TP("t", 1)], "b": [TP("t", 2)]})  # unowned
    with pytest.raises(CooperativeAssignmentError, match=r"t-1 -> b"):
        check_cooperative(owned, {"a": [TP("t", 0)], "b": [TP("t", 1)]})


def test_protocol_is_the_strongest_common_one() -> None:
    def group(*names: str) -> ConsumerGroup:
        cfg = ConsumerGroupConfig(
            group_id="g", topics=["t"], assignors=names, redis_url="redis://127.0.0.1:1/0"
        )
        return ConsumerGroup(cfg)

    assert group(COOP).protocol is RebalanceProtocol.COOPERATIVE
    assert group(COOP, "range").protocol is RebalanceProtocol.EAGER  # rolling upgrade, step 1
    assert group("range").protocol is RebalanceProtocol.EAGER
    assert rebalance_protocol([get_assignor(COOP)]) is RebalanceProtocol.COOPERATIVE


def test_cooperative_sticky_withholds_moved_partitions_then_hands_them_out() -> None:
    from rcoord.protocol.consumer import ConsumerProtocolSubscription as Sub

    a = get_assignor(COOP)
    owned = {m: [TP("t", p) for p in range(i * 4, i * 4 + 4)] for i, m in enumerate("abc")}
    subs = {m: Sub(["t"], owned_partitions=owned.get(m, [])) for m in "abcd"}
    first = a.assign(subs, {"t": 12})
    check_cooperative(owned, first)
    assert [len(first[m]) for m in "abcd"] == [3, 3, 3, 0]
    subs = {m: Sub(["t"], owned_partitions=first[m]) for m in "abcd"}
    second = a.assign(subs, {"t": 12})
    assert [len(second[m]) for m in "abcd"] == [3, 3, 3, 3]
    assert all(second[m] == first[m] for m in "abc")


# -- against a real server ----------------------------------------------------------------------


LONG_MS = int(WAIT_S * 1000)
"""The members' sessions and rebalances: as long as a wait. The tests judge every callback of
every member, and a process stalled past a short session (CI's 2 CPUs beside a JVM; shown with a
2.5 s hold of the GIL) had a member removed, its partitions lost and dealt anew. Nothing here
waits for a session or a rebalance timeout to pass (members leave by close() or LeaveGroup)."""


class Runner:
    """One consumer polled in its own thread; records (monotonic time, partition) per record."""

    def __init__(self, consumer: Consumer, listener: Recorder) -> None:
        self.consumer, self.listener = consumer, listener
        self.seen: list[tuple[float, int]] = []
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.errors: list[BaseException] = []
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                records = self.consumer.poll(timeout=0.05)
            except Exception as exc:  # noqa: BLE001 - kept for the test to assert on
                self.errors.append(exc)
                continue
            now = time.monotonic()
            with self.lock:
                self.seen.extend((now, r.partition) for r in records)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(WAIT_S)
        self.consumer.close(timeout=WAIT_S)


@pytest.fixture
def env(make_coordinator: Any, redis_client: Any, namespace: str) -> Iterator[Any]:
    coord: GroupCoordinator = make_coordinator()
    runners: list[Runner] = []

    class Env:
        pass

    e: Any = Env()
    e.coord, e.topics = coord, Topics(redis_client, namespace)
    e.producer = Producer(redis_client, namespace, "round_robin")

    def consumer(
        assignors: tuple[str, ...] = (COOP,), listener: Recorder | None = None, *,
        session_timeout_ms: int = LONG_MS, rebalance_timeout_ms: int = LONG_MS, **kw: Any
    ) -> Runner:
        cfg = ConsumerGroupConfig(
            group_id="g",
            topics=["t"],
            assignors=assignors,
            redis_client=redis_client,
            namespace=namespace,
            heartbeat_interval_ms=50,
            session_timeout_ms=session_timeout_ms,
            rebalance_timeout_ms=rebalance_timeout_ms,
            retry_backoff_ms=10,
            retry_backoff_max_ms=100,
        )
        listener = listener if listener is not None else Recorder()
        c = Consumer(cfg, listener=listener, fetch_max_wait_ms=20, **kw)
        r = Runner(c, listener)
        runners.append(r)
        return r

    e.consumer = consumer
    yield e
    for r in runners:
        r.close()


def _parts(events: list[tuple[Any, ...]], kind: str) -> list[list[int]]:
    return [[tp.partition for tp in e[1]] for e in events if e[0] == kind]


def _held(r: Runner) -> set[int]:
    return {tp.partition for tp in r.consumer.assignment()}


def _settled(runners: list[Runner], n: int) -> bool:
    held = [_held(r) for r in runners]
    return sum(map(len, held)) == n and len(set().union(*held)) == n and all(held)


def _told(r: Runner) -> set[int]:
    """What the listener was told this member holds: assigned adds, revoked and lost remove."""
    told: set[int] = set()
    with r.listener.lock:
        for kind, parts in r.listener.events:
            ps = {tp.partition for tp in parts}
            told = told | ps if kind == "assigned" else told - ps
    return told


def _stable(runners: list[Runner], n: int) -> bool:
    """Settled, balanced, and every listener has heard of exactly what its member holds.

    ``_settled`` alone can hold mid-rebalance: a member whose poll() has not yet taken the
    generation that shrinks it still holds its old, larger share while the others hold the rest
    (e.g. 4, 6 and 2 of 12; the assignor withheld the 2 it must give up). And a member's
    assignment changes just before its listener hears of it. Either way a revocation or
    assignment would still be on its way. Balanced shares (what cooperative-sticky converges to)
    with every listener up to date mean no member has anything left to revoke or hear.
    """
    sizes = [len(_held(r)) for r in runners]
    return (
        _settled(runners, n)
        and max(sizes) - min(sizes) <= 1
        and all(_told(r) == _held(r) for r in runners)
    )


def test_a_joining_member_takes_partitions_without_stopping_the_others(env: Any) -> None:
    env.topics.create("t", 12)
    first = [env.consumer() for _ in range(3)]  # (sessions of LONG_MS, as every test's)
    wait_until(lambda: _stable(first, 12))  # 4 each: the group formed, callbacks all ran
    before = {id(r): _held(r) for r in first}
    marks = [len(r.listener.events) for r in first]
    # Records keep arriving: each kept partition must keep being returned by poll().
    stop = threading.Event()
    feeder = threading.Thread(
        target=lambda: [env.producer.send_batch("t", [b"x"] * 24) or stop.wait(0.02)
                        for _ in iter(stop.is_set, True)],
        daemon=True,
    )
    feeder.start()
    try:
        fourth = env.consumer()
        wait_until(lambda: _stable([*first, fourth], 12))
        t_done = time.monotonic()
        wait_until(lambda: all(any(t > t_done for t, _ in r.seen) for r in first))
    finally:
        stop.set()
        feeder.join(WAIT_S)
    for r, mark in zip(first, marks, strict=True):
        tail = r.listener.events[mark:]
        kept = before[id(r)] & _held(r)
        assert len(kept) == 3 and _held(r) == kept  # it only gave one up
        # Told exactly what moved: revoked the one partition (once), and in every round
        # (the one that withheld it, the one that handed it out, and any other round the
        # joining member's arrival caused) assigned nothing new.
        assert "lost" not in [e[0] for e in tail]
        assert _parts(tail, "revoked") == [sorted(before[id(r)] - kept)]
        assert all(parts == [] for parts in _parts(tail, "assigned")) and len(tail) >= 2
        assert not r.errors
    # The newcomer: nothing in its first round (all twelve were owned, so all were withheld),
    # then the three moved ones, each once. Usually they all come in the second round; a member
    # whose generation of the first round ended before its poll() took it (it is withdrawn) only
    # gives its partition up in the next one, so the newcomer gets that one a round later.
    got = _parts(fourth.listener.events, "assigned")
    assert got[0] == [] and sorted(p for parts in got[1:] for p in parts) == sorted(_held(fourth))
    assert not any(e[0] in ("revoked", "lost") for e in fourth.listener.events)


class JoinSpy(RedisCoordinator):
    """The Redis coordinator of one member, counting that member's JoinGroup calls."""

    def __init__(self, redis_client: Any, namespace: str) -> None:
        super().__init__(redis_client, namespace)
        self.joins = 0
        self.cond = threading.Condition()

    def join_group(self, *args: Any, **kwargs: Any) -> Any:
        with self.cond:
            self.joins += 1
            self.cond.notify_all()
        return super().join_group(*args, **kwargs)

    def joined_since(self, count: int, timeout: float) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: self.joins > count, timeout)


class SlowRevoker(Recorder):
    """Its first ``on_partitions_revoked`` waits until the generation it revokes in has ended
    (the coordinator started another rebalance), then waits a little for the member to rejoin,
    notes whether it did, and commits, as a listener that flushes work before committing."""

    def __init__(self, spy: JoinSpy, started: threading.Event) -> None:
        super().__init__()
        self.spy, self.started = spy, started
        self.consumer_ref: Consumer | None = None
        self.rejoined_inside: list[bool] = []
        self.commit_errors: list[CommitFailedError] = []

    def on_partitions_revoked(self, partitions: list[TopicPartition]) -> None:
        assert self.consumer_ref is not None
        gen = self.consumer_ref.generation
        assert gen is not None
        if not self.started.is_set():
            joins = self.spy.joins
            self.started.set()
            assert gen.done.wait(WAIT_S), "the next rebalance never started"
            self.rejoined_inside.append(self.spy.joined_since(joins, REJOIN_GRACE_S))
            try:  # the generation is over, but the member has not rejoined: still accepted
                self.consumer_ref.commit()
            except CommitFailedError as exc:
                self.commit_errors.append(exc)
        super().on_partitions_revoked(partitions)


REJOIN_GRACE_S = 1.0
"""How long ``SlowRevoker`` gives a member to rejoin from inside the callback: well under the
rebalance timeout (``LONG_MS``, after which the coordinator would drop the member), and far
above the few milliseconds a member that does not wait for the callback takes to rejoin."""


def test_a_revoking_member_rejoins_only_after_on_partitions_revoked_returns(
    env: Any, redis_client: Any, namespace: str
) -> None:
    """KIP-429 / Kafka's ConsumerCoordinator: the revocation callback runs before the member
    rejoins, even when another member's arrival ends the generation meanwhile, so the revoked
    partition's new owner cannot get it (nor the callback's commit be refused) while it runs."""
    env.topics.create("t", 3)
    spy = JoinSpy(redis_client, namespace)
    spy.start()
    started = threading.Event()
    listener = SlowRevoker(spy, started)
    a = env.consumer(listener=listener, coordinator=spy)
    listener.consumer_ref = a.consumer
    wait_until(lambda: _stable([a], 3))
    b = env.consumer()  # a keeps two, revokes one (withheld from b this round)
    assert started.wait(WAIT_S)
    c = env.consumer()  # its JoinGroup ends a's generation while a's callback still runs
    wait_until(lambda: _stable([a, b, c], 3))
    assert listener.rejoined_inside == [False] and not listener.commit_errors
    assert not a.errors and "lost" not in a.listener.kinds()


def test_kept_partitions_are_polled_while_the_group_rebalances(env: Any) -> None:
    env.topics.create("t", 4)
    a = env.consumer()
    wait_until(lambda: _held(a) == {0, 1, 2, 3})
    gen = a.consumer.generation
    assert gen is not None
    b = env.consumer()
    # a's generation ends (b joined) but a keeps its partitions through the rejoin ...
    wait_until(lambda: gen.done.is_set() and gen.carried)
    env.producer.send_batch("t", [b"r%d" % i for i in range(40)])
    # ... and returns records of them; once it settles, it holds two of them, b the others.
    wait_until(lambda: _settled([a, b], 4))
    wait_until(lambda: len(a.seen) + len(b.seen) >= 40)
    assert len({p for _, p in a.seen} | {p for _, p in b.seen}) == 4
    # One revocation; the rounds after it (a's own rejoin, b's hand-out) assign a nothing new.
    kinds = a.listener.kinds()
    assert kinds[:3] == ["assigned", "revoked", "assigned"] and set(kinds[3:]) <= {"assigned"}
    assert all(e[1] == [] for e in a.listener.events[2:] if e[0] == "assigned")


class PositionCommitter(Recorder):
    """Manual commits, Kafka's idiom: ``on_partitions_revoked`` notes the revoked partitions'
    positions and the assignment, then commits every position."""

    def __init__(self) -> None:
        super().__init__()
        self.consumer_ref: Consumer | None = None
        self.inside: list[tuple[dict[TopicPartition, int], list[TopicPartition]]] = []
        self.errors: list[Exception] = []

    def on_partitions_revoked(self, partitions: list[TopicPartition]) -> None:
        c = self.consumer_ref
        assert c is not None
        try:
            self.inside.append(({tp: c.position(tp) for tp in partitions}, c.assignment()))
            c.commit()
        except Exception as exc:
            self.errors.append(exc)
            raise
        finally:
            super().on_partitions_revoked(partitions)


def test_on_partitions_revoked_reads_and_commits_the_revoked_partitions(env: Any) -> None:
    """As Kafka's ConsumerCoordinator: the revoked partitions are still assigned while the
    callback runs (positions readable, commit() includes them), and removed only after it."""
    env.topics.create("t", 4)
    env.producer.send_batch("t", [b"r%d" % i for i in range(40)])  # 10 a partition
    listener = PositionCommitter()
    a = env.consumer(listener=listener, enable_auto_commit=False)
    listener.consumer_ref = a.consumer
    wait_until(lambda: len(a.seen) >= 40)
    b = env.consumer(enable_auto_commit=False)
    wait_until(lambda: _stable([a, b], 4))
    revoked = sorted(set(range(4)) - _held(a))
    assert len(revoked) == 2 and listener.errors == [] and not a.errors
    assert listener.inside == [
        ({TP("t", p): 10 for p in revoked}, [TP("t", p) for p in range(4)])
    ]
    committed = env.coord.fetch_offsets("g", [TP("t", p) for p in range(4)]).offsets
    assert {tp.partition: o.offset for tp, o in committed.items()} == {p: 10 for p in range(4)}
    with pytest.raises(Exception, match="not assigned"):
        a.consumer.position(TP("t", revoked[0]))  # gone once the callback returned


class FailingRevoker(Recorder):
    """Records each callback with the generation it ran in; ``on_partitions_revoked`` raises."""

    def __init__(self) -> None:
        super().__init__()
        self.consumer_ref: Consumer | None = None
        self.generations: list[tuple[str, int]] = []

    def _note(self, kind: str) -> None:
        gen = self.consumer_ref.generation if self.consumer_ref is not None else None
        self.generations.append((kind, gen.generation_id if gen is not None else -1))

    def on_partitions_revoked(self, partitions: list[TopicPartition]) -> None:
        self._note("revoked")
        super().on_partitions_revoked(partitions)
        raise RuntimeError("the revocation handler failed")

    def on_partitions_assigned(self, partitions: list[TopicPartition]) -> None:
        self._note("assigned")
        super().on_partitions_assigned(partitions)


def test_on_partitions_assigned_runs_even_if_on_partitions_revoked_raised(env: Any) -> None:
    """As Kafka's ConsumerCoordinator: the assigned callback of the same generation still runs,
    then poll() raises what on_partitions_revoked raised."""
    env.topics.create("t", 4)
    listener = FailingRevoker()
    a = env.consumer(listener=listener)
    listener.consumer_ref = a.consumer
    wait_until(lambda: _stable([a], 4))
    b = env.consumer()
    wait_until(lambda: _stable([a, b], 4))
    at = [kind for kind, _ in listener.generations].index("revoked")
    revoked_in = listener.generations[at][1]
    # Right after it, in the same generation (not the next round's, nor missing).
    assert listener.generations[at + 1 : at + 2] == [("assigned", revoked_in)]
    assert [str(e) for e in a.errors] == ["the revocation handler failed"]
    with pytest.raises(RuntimeError, match="the revocation handler failed"):
        a.close()  # the final revocation's, raised once the consumer is closed


class AsyncCommitter(Recorder):
    """``on_partitions_revoked`` queues many async commits of the revoked partitions."""

    QUEUED = 200

    def __init__(self) -> None:
        super().__init__()
        self.consumer_ref: Consumer | None = None
        self.completions: list[BaseException | None] = []

    def on_partitions_revoked(self, partitions: list[TopicPartition]) -> None:
        c = self.consumer_ref
        assert c is not None
        positions = {tp: c.position(tp) for tp in partitions}
        for _ in range(self.QUEUED):
            c.commit_async(positions, lambda offsets, exc: self.completions.append(exc))
        super().on_partitions_revoked(partitions)


def test_async_commits_in_on_partitions_revoked_land_before_the_follow_up_rejoin(
    env: Any,
) -> None:
    """The follow-up rejoin that hands the revoked partitions over waits for the callback's
    async commits: sent after it, they would meet the next generation and be fenced."""
    env.topics.create("t", 4)
    env.producer.send_batch("t", [b"r%d" % i for i in range(40)])  # 10 a partition
    listener = AsyncCommitter()
    a = env.consumer(listener=listener, enable_auto_commit=False)
    listener.consumer_ref = a.consumer
    wait_until(lambda: len(a.seen) >= 40)
    b = env.consumer(enable_auto_commit=False)
    wait_until(lambda: _stable([a, b], 4))
    wait_until(lambda: len(listener.completions) == AsyncCommitter.QUEUED)  # a polls on
    assert [exc for exc in listener.completions if exc is not None] == []
    revoked = set(range(4)) - _held(a)
    committed = env.coord.fetch_offsets("g", [TP("t", p) for p in sorted(revoked)]).offsets
    assert len(revoked) == 2
    assert {tp.partition: o.offset for tp, o in committed.items()} == {p: 10 for p in revoked}


def test_rolling_upgrade_from_eager_to_cooperative(env: Any) -> None:
    env.topics.create("t", 6)
    # Step 1: every member lists both; the group runs the cooperative assignor eagerly.
    old = [env.consumer((COOP, "range")) for _ in range(2)]
    wait_until(lambda: _settled(old, 6))
    assert all(r.consumer.group.protocol is RebalanceProtocol.EAGER for r in old)
    assert old[0].consumer.generation.protocol_name == COOP  # type: ignore[union-attr]
    # Step 2, one member at a time: replace it with one that lists only cooperative-sticky.
    new: list[Runner] = []
    for i in range(2):
        old[i].close()
        new.append(env.consumer())
        group = [*old[i + 1:], *new]
        wait_until(lambda g=group: _settled(g, 6))
        assert new[-1].consumer.group.protocol is RebalanceProtocol.COOPERATIVE
    # Eager members revoked everything each time; cooperative ones only what moved.
    for r in new:
        assert "lost" not in r.listener.kinds() and not r.errors
    kinds = old[1].listener.kinds()
    assert kinds[:3] == ["assigned", "revoked", "assigned"]  # eager: all, then all again
    assert old[1].listener.events[1][1] == old[1].listener.events[0][1]


def test_fenced_member_under_cooperative_loses_everything(env: Any) -> None:
    env.topics.create("t", 2)
    env.producer.send_batch("t", [b"%d" % i for i in range(4)])
    a = env.consumer()
    wait_until(lambda: _held(a) == {0, 1})
    old = a.consumer.generation
    assert old is not None
    env.coord.leave_group("g", [MemberIdentity(old.member_id)])  # as a session expiry would
    wait_until(lambda: a.listener.kinds() == ["assigned", "lost", "assigned"])
    assert a.listener.events[1][1] == [TP("t", 0), TP("t", 1)]
    assert a.listener.events[2][1] == [TP("t", 0), TP("t", 1)]  # all new: nothing was kept
    assert a.consumer.member_id != old.member_id
    assert old.lost and not old.carried


def test_leader_refuses_an_assignor_that_moves_partitions_directly(
    make_coordinator: Any, redis_client: Any, namespace: str
) -> None:
    make_coordinator()
    Topics(redis_client, namespace).create("t", 4)
    bad = DirectMover()

    def cfg() -> ConsumerGroupConfig:
        return ConsumerGroupConfig(
            group_id="g", topics=["t"], assignors=[bad], redis_client=redis_client,
            namespace=namespace, heartbeat_interval_ms=50, session_timeout_ms=LONG_MS,
            rebalance_timeout_ms=LONG_MS, join_backoff_ms=100, retry_backoff_ms=10,
        )

    other = ConsumerGroup(cfg())  # not started yet (entering a with block would start it)
    with ConsumerGroup(cfg()) as leader:
        try:
            gen = leader.next(timeout=WAIT_S)
            assert len(gen.partitions) == 4
            other.start()
            # The leader's next round moves two partitions straight to the newcomer: refused.
            with pytest.raises(CooperativeAssignmentError, match="bad-coop"):
                while True:
                    leader.next(timeout=WAIT_S)
        finally:
            other.close(timeout=WAIT_S)


def test_eager_sticky_members_keep_their_partitions_when_one_leaves(env: Any) -> None:
    # An eager member revokes everything before it rejoins, so only the user_data Kafka's
    # StickyAssignor writes (last assignment, generation) tells the leader what it had. rcoord's
    # members sent none: each rebalance started from scratch ([0,3] [1,4] [2,5] became
    # [1,3,5] [0,2,4] when the third left).
    env.topics.create("t", 6)
    members = [env.consumer(("sticky",)) for _ in range(3)]
    wait_until(lambda: _stable(members, 6))
    before = {id(r): _held(r) for r in members}
    first = members[0].consumer.generation
    assert first is not None
    members.pop().close()
    wait_until(lambda: _stable(members, 6) and all(
        g is not None and g.generation_id > first.generation_id
        for g in (r.consumer.generation for r in members)))
    for r in members:
        assert before[id(r)] < _held(r), (before[id(r)], _held(r))
    assert all(r.consumer.group.protocol is RebalanceProtocol.EAGER for r in members)


def test_sticky_user_data_is_kafkas_v1_layout() -> None:
    from rcoord.protocol.kafka_consumer import decode_sticky_user_data, encode_sticky_user_data

    sticky = get_assignor("sticky")
    assert sticky.subscription_user_data([TP("t", 1)], -1) == b""  # no assignment yet
    data = sticky.subscription_user_data([TP("u", 0), TP("t", 4), TP("t", 1)], 7)
    assert data == encode_sticky_user_data([("t", 1), ("t", 4), ("u", 0)], 7)
    # topics: int32 count; per topic int16-length name, int32 count, int32 partitions; int32 gen
    assert data == (b"\0\0\0\x02" b"\0\x01t" b"\0\0\0\x02" b"\0\0\0\x01" b"\0\0\0\x04"
                    b"\0\x01u" b"\0\0\0\x01" b"\0\0\0\0" b"\0\0\0\x07")
    assert decode_sticky_user_data(data) == ([("t", 1), ("t", 4), ("u", 0)], 7)


class WokenRevoker(Recorder):
    """Its first ``on_partitions_revoked`` raises ``WakeupError`` (as a ``commit()`` in it does
    when ``wakeup()`` ends its retries); every callback notes how many errors poll() had
    raised by then (``runner.errors``)."""

    def __init__(self) -> None:
        super().__init__()
        self.runner: Runner | None = None
        self.raised = False
        self.errors_seen: list[tuple[str, int]] = []

    def _note(self, kind: str) -> None:
        errors = self.runner.errors if self.runner is not None else []  # set after its start
        self.errors_seen.append((kind, len(errors)))

    def on_partitions_revoked(self, partitions: list[TopicPartition]) -> None:
        self._note("revoked")
        super().on_partitions_revoked(partitions)
        if not self.raised:
            self.raised = True
            raise WakeupError("commit() interrupted by wakeup()")

    def on_partitions_assigned(self, partitions: list[TopicPartition]) -> None:
        self._note("assigned")
        super().on_partitions_assigned(partitions)


def test_wakeup_in_on_partitions_revoked_is_raised_before_on_partitions_assigned(
    env: Any,
) -> None:
    """As Kafka's ConsumerRebalanceListenerInvoker, which rethrows a WakeupException from the
    revocation callback at once: that poll() raises it without running the assigned callback,
    so the application that was woken up to stop is not kept in its assigned callback first;
    and as Kafka's next poll(), which runs onJoinComplete again, the next poll() runs the
    revocation again (its commits were cut short), then announces the assignment, once."""
    env.topics.create("t", 4)
    listener = WokenRevoker()
    a = env.consumer(listener=listener)
    listener.runner = a
    wait_until(lambda: _stable([a], 4))
    b = env.consumer()
    wait_until(lambda: _stable([a, b], 4))
    at = [kind for kind, _ in listener.errors_seen].index("revoked")
    before = listener.errors_seen[at][1]
    assert listener.errors_seen[at + 1:at + 3] == [  # after the poll raised
        ("revoked", before + 1), ("assigned", before + 1)]
    assert [type(e) for e in a.errors] == [WakeupError]
    revoked = [parts for kind, parts in listener.events if kind == "revoked"]
    assert len(revoked) == 2 and revoked[0] == revoked[1]


class FailThenWoken(Recorder):
    """Its first ``on_partitions_revoked`` raises RuntimeError, and the
    ``on_partitions_assigned`` after it ``WakeupError``."""

    def __init__(self) -> None:
        super().__init__()
        self.revoked = 0

    def on_partitions_revoked(self, partitions: list[TopicPartition]) -> None:
        super().on_partitions_revoked(partitions)
        self.revoked += 1
        if self.revoked == 1:
            raise RuntimeError("the revocation handler failed")

    def on_partitions_assigned(self, partitions: list[TopicPartition]) -> None:
        super().on_partitions_assigned(partitions)
        if self.revoked == 1:
            self.revoked += 1
            raise WakeupError("commit() interrupted by wakeup()")


def test_wakeup_in_on_partitions_assigned_outranks_a_failed_revocation(env: Any) -> None:
    """As Kafka: a WakeupError of the assigned callback propagates even when the revocation
    callback before it raised (that error is logged). poll() raised the revocation's error
    instead, and the wakeup() the application asked for was lost."""
    env.topics.create("t", 4)
    listener = FailThenWoken()
    a = env.consumer(listener=listener)
    wait_until(lambda: _stable([a], 4))
    b = env.consumer()
    wait_until(lambda: _stable([a, b], 4) and listener.revoked == 2)
    wait_until(lambda: bool(a.errors))
    assert [type(e) for e in a.errors] == [WakeupError]
