"""Property test: random interleavings of joins, syncs, heartbeats, leaves, commits and timer runs
from several simulated members, against a real server, with invariants checked after every step.

Parked calls are not awaited: each member's JoinGroup/SyncGroup is started with the step script
and later collected with ``await_reply``, exactly as the blocking API does, so one thread can
interleave everything deterministically on a MockTime clock.
"""

from __future__ import annotations

import uuid
from typing import Any

import msgpack
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from rcoord import CoordinatorConfig, Errors, GroupCoordinator, MockTime, TopicPartition
from rcoord.protocol.join import JoinGroupResult, JoinRequest
from rcoord.protocol.sync import SyncGroupResult, SyncRequest
from rcoord.state import VALID_PREVIOUS, GroupState

GROUP = "prop-group"
MEMBERS = 4
PARTITIONS = [TopicPartition("t", p) for p in range(3)]
JOIN_ARGS = dict(protocol_type="consumer", session_timeout_ms=3000, rebalance_timeout_ms=5000,
                 group_instance_id=None, client_id="c", client_host="h",
                 require_known_member_id=True, reason=None)


class Member:
    def __init__(self) -> None:
        self.member_id = ""
        self.generation = -1
        self.parked: str | None = None  # "j" or "s"
        self.leader = False
        self.members: list[str] = []


class GroupMachine(RuleBasedStateMachine):
    client: Any = None

    def __init__(self) -> None:
        super().__init__()
        self.clock = MockTime()
        ns = "p" + uuid.uuid4().hex[:10]
        cfg = CoordinatorConfig(namespace=ns, group_min_session_timeout_ms=10,
                                group_initial_rebalance_delay_ms=0, num_partitions=4)
        self.coord = GroupCoordinator(self.client, cfg, clock=self.clock).start()
        self.keys = self.coord._keys(GROUP)
        self.m = [Member() for _ in range(MEMBERS)]
        self.committed: dict[TopicPartition, int] = {}
        self.max_gen = 0

    # -- plumbing ------------------------------------------------------------------------------

    def _settle(self) -> None:
        # Every step leaves the partition's due index safe (checked before the timers run,
        # which would repair it); deadlines due "now" then act before the next step, so each
        # step sees a settled group.
        self._check_due_index()
        self.coord.run_timers()
        self._check_due_index()

    def _check_due_index(self) -> None:
        """The partition's due index holds, for the group, a time no later than its earliest
        deadline (a later one would let a deadline pass unseen; a postponed or removed deadline
        may leave it earlier), the same value the group hash's 'ea' holds."""
        first = self.client.zrange(self.keys.deadlines, 0, 0, withscores=True)
        published = self.client.zscore(self.keys.named("due"), GROUP)
        ea = self.client.hget(self.keys.group, "ea")
        if published is None:
            assert not first, first
            assert ea in (None, b"-"), ea
        else:
            assert first and published <= first[0][1], (first, published)
            assert ea == b"%d" % published, (ea, published)

    def _group(self) -> dict[bytes, bytes]:
        return self.client.hgetall(self.keys.group)

    def _members(self) -> set[str]:
        return {k.decode() for k in self.client.hkeys(self.keys.members)}

    def _start_join(self, m: Member, metadata: bytes = b"x") -> None:
        req = JoinRequest.build(GROUP, m.member_id, protocols=[("range", metadata)], **JOIN_ARGS)
        reply = self.coord._call("join_group", self.keys, req.args())
        if reply[0] == b"W":
            m.member_id = bytes(reply[4]).decode()
            m.parked = "j"
        else:
            self._joined(m, JoinGroupResult.decode(bytes(reply[1])))

    def _joined(self, m: Member, res: JoinGroupResult) -> None:
        m.parked = None
        if res.error == Errors.MEMBER_ID_REQUIRED:
            m.member_id = res.member_id
        elif res.error == Errors.NONE:
            assert res.generation_id >= m.generation
            m.generation = res.generation_id
            m.leader = res.leader_id == m.member_id
            m.members = [x.member_id for x in res.members]
        elif res.error in (Errors.UNKNOWN_MEMBER_ID, Errors.FENCED_INSTANCE_ID):
            m.member_id, m.generation = "", -1
        else:
            assert res.error in (Errors.REBALANCE_IN_PROGRESS, Errors.GROUP_MAX_SIZE_REACHED), res

    def _synced(self, m: Member, res: SyncGroupResult) -> None:
        m.parked = None
        assert res.error in (Errors.NONE, Errors.REBALANCE_IN_PROGRESS, Errors.UNKNOWN_MEMBER_ID,
                             Errors.ILLEGAL_GENERATION), res

    # -- rules -----------------------------------------------------------------------------------

    @rule(i=st.integers(0, MEMBERS - 1), changed=st.booleans())
    def join(self, i: int, changed: bool) -> None:
        m = self.m[i]
        if m.parked:
            return
        self._start_join(m, b"y" if changed else b"x")
        self._settle()

    @rule(i=st.integers(0, MEMBERS - 1))
    def collect(self, i: int) -> None:
        m = self.m[i]
        if not m.parked:
            return
        reply = self.coord._call("await_reply", self.keys, [m.member_id, m.parked])
        if reply[0] == b"R":
            blob = bytes(reply[1])
            if m.parked == "j":
                self._joined(m, JoinGroupResult.decode(blob))
            else:
                self._synced(m, SyncGroupResult.decode(blob))
        self._settle()

    @rule(i=st.integers(0, MEMBERS - 1))
    def sync(self, i: int) -> None:
        m = self.m[i]
        if m.parked or m.generation < 0:
            return
        assignments = {x: x.encode() for x in m.members} if m.leader else None
        req = SyncRequest.build(GROUP, m.generation, m.member_id, assignments=assignments,
                                group_instance_id=None, protocol_type=None, protocol_name=None)
        reply = self.coord._call("sync_group", self.keys, req.args())
        if reply[0] == b"W":
            m.parked = "s"
        else:
            self._synced(m, SyncGroupResult.decode(bytes(reply[1])))
        self._settle()

    @rule(i=st.integers(0, MEMBERS - 1))
    def heartbeat(self, i: int) -> None:
        m = self.m[i]
        if m.member_id:
            self.coord.heartbeat(GROUP, m.generation, m.member_id)
            self._settle()

    @rule(i=st.integers(0, MEMBERS - 1))
    def leave(self, i: int) -> None:
        from rcoord import MemberIdentity

        m = self.m[i]
        if m.member_id and not m.parked:
            self.coord.leave_group(GROUP, [MemberIdentity(m.member_id)])
            m.member_id, m.generation = "", -1
            self._settle()

    @rule(i=st.integers(0, MEMBERS - 1), p=st.integers(0, 2), offset=st.integers(0, 10**6),
          skew=st.sampled_from([0, 0, -1, 1]))
    def commit(self, i: int, p: int, offset: int, skew: int) -> None:
        """A commit with the generation the member knows, or a zombie's (skew != 0)."""
        m = self.m[i]
        tp = PARTITIONS[p]
        before = self._group()
        members = self._members()
        generation = m.generation + skew if m.generation >= 0 else m.generation
        res = self.coord.commit_offsets(GROUP, {tp: offset}, member_id=m.member_id,
                                        generation_id=generation)
        if res[tp] == Errors.NONE:
            state = before.get(b"state", b"").decode()
            gen = int(before.get(b"gen", b"0"))
            # Kafka: generation -1 to an Empty group is the admin/assign() commit, whatever the id.
            simple = generation < 0
            if simple:
                assert not members and state in ("", "Empty"), (state, members)
            else:
                # Only the current generation's members may commit, and not mid-assignment.
                assert m.member_id in members and generation == gen, (m.member_id, generation, gen)
                assert state in ("Stable", "PreparingRebalance"), state
            self.committed[tp] = offset
        self._settle()

    @rule(p=st.integers(0, 2), offset=st.integers(0, 10**6))
    def simple_commit(self, p: int, offset: int) -> None:
        tp = PARTITIONS[p]
        members = self._members()
        state = self._group().get(b"state", b"Empty").decode()
        res = self.coord.commit_offsets(GROUP, {tp: offset})
        # Kafka accepts a simple commit (generation -1, no member id) only while the group is
        # Empty. A group with no members can still be PreparingRebalance, waiting for a pending
        # member (one that was given an id but has not joined again) until it expires.
        if res[tp] == Errors.NONE:
            assert not members and state == "Empty", (members, state)
            self.committed[tp] = offset
        else:
            assert state != "Empty" and res[tp] == Errors.UNKNOWN_MEMBER_ID, (state, res)
        self._settle()

    @rule(ms=st.sampled_from([1, 100, 1000, 2999, 3000, 5000]))
    def sleep(self, ms: int) -> None:
        self.clock.sleep(ms)
        self._settle()

    # -- invariants ------------------------------------------------------------------------------

    @invariant()
    def offsets_change_only_through_accepted_commits(self) -> None:
        raw = self.client.hgetall(self.keys.offsets)
        stored = {}
        for field, blob in raw.items():
            p, _, topic = field.decode().partition(":")
            stored[TopicPartition(topic, int(p))] = int(msgpack.unpackb(blob, raw=True)[b"o"])
        assert stored == self.committed

    @invariant()
    def generation_never_decreases_and_state_is_declared(self) -> None:
        g = self._group()
        if not g:
            return
        gen = int(g[b"gen"])
        assert gen >= self.max_gen
        self.max_gen = gen
        state = GroupState(g[b"state"].decode())
        prev = GroupState(g[b"prev"].decode())
        assert state is not GroupState.DEAD
        assert state == prev == GroupState.EMPTY or prev in VALID_PREVIOUS[state]

    @invariant()
    def parked_members_are_consistent(self) -> None:
        joining = {k.decode() for k in self.client.hkeys(self.keys.joining)}
        assert joining <= self._members()


@pytest.mark.parametrize("backend", ["single", "cluster"], indirect=True)
def test_random_interleavings_keep_the_invariants(redis_client, backend):
    GroupMachine.client = redis_client
    runs = 100 if backend == "single" else 20
    run_state_machine_as_test(
        GroupMachine, settings=settings(max_examples=runs, stateful_step_count=40, deadline=None)
    )


# -- int64 offsets: exact round trip at the edges (issue 8 item 3) -----------------------------

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
# The edges where doubles lose precision or int64 ends, and their neighbours, plus anything.
_EDGES = [0, -1, 1, 2**53 - 1, 2**53, 2**53 + 1, 2**62 + 1, INT64_MAX - 1, INT64_MAX,
          INT64_MIN, INT64_MIN + 1, -(2**53) - 1]
INT64 = st.one_of(st.sampled_from(_EDGES), st.integers(INT64_MIN, INT64_MAX))
EPOCH = st.one_of(st.none(), st.sampled_from([0, INT32_MAX]), st.integers(0, INT32_MAX))
OUTSIDE_INT64 = st.one_of(st.integers(INT64_MAX + 1, 2**80), st.integers(-(2**80), INT64_MIN - 1),
                          st.sampled_from([2**63, 2**64, INT64_MIN - 1]))


@pytest.mark.parametrize("backend", ["single", "cluster"], indirect=True)
def test_offsets_round_trip_exactly_across_int64(redis_client, backend):
    from hypothesis import given

    from rcoord import InvalidRequestError, OffsetAndMetadata

    cfg = CoordinatorConfig(namespace="p" + uuid.uuid4().hex[:10], num_partitions=4)
    coord = GroupCoordinator(redis_client, cfg).start()
    tps = [TopicPartition("t", p) for p in range(3)]

    @settings(max_examples=150 if backend == "single" else 40, deadline=None)
    @given(offsets=st.lists(INT64, min_size=3, max_size=3), epoch=EPOCH, meta=st.text(max_size=8),
           bad=OUTSIDE_INT64)
    def check(offsets: list[int], epoch: int | None, meta: str, bad: int) -> None:
        want = {tp: OffsetAndMetadata(o, meta, epoch) for tp, o in zip(tps, offsets)}
        assert set(coord.commit_offsets("g", want).values()) == {Errors.NONE}
        got = coord.fetch_offsets("g", tps).offsets
        assert got == want  # offset, metadata and leader epoch, exactly
        assert coord.fetch_offsets("g").offsets == want
        # Outside int64 is refused whole, and what was stored stays.
        with pytest.raises(InvalidRequestError, match="int64"):
            coord.commit_offsets("g", {tps[0]: offsets[0] ^ 1, tps[1]: bad})
        assert coord.fetch_offsets("g", tps).offsets == want

    check()
