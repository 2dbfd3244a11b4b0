"""Group instance ids the coordinator takes: any non-empty string, as Kafka's broker does.

Only Kafka's Java client checks group.instance.id against the topic-name charset
(JoinGroupRequest.validateGroupInstanceId, from ConsumerConfig); the broker's group coordinator
takes whatever a client sends. librdkafka, kafka-python or franz-go members with ids such as
``host:1`` or ``pod/3`` were answered INVALID_REQUEST at every step. The worker's own config
keeps the Java client's rule (tests/test_names.py).
"""

from __future__ import annotations

import pytest

from rcoord import Errors, MemberIdentity, TopicPartition
from rcoord.errors import InvalidRequestError
from rcoord.protocol._checks import MAX_ID_BYTES

ODD_IDS = ["host:1", "pod/3", "a b", "line\nbreak", "{tag}x", "ü-é", "..", "x" * MAX_ID_BYTES]
T0 = TopicPartition("t", 0)


@pytest.mark.parametrize("iid", ODD_IDS)
def test_a_static_member_with_any_instance_id_joins_syncs_heartbeats_commits_and_leaves(
        ctx, iid):
    first = ctx.join(group_instance_id=iid)
    assert first.error == Errors.NONE, first
    mid, gen = first.member_id, first.generation_id
    # Its generated member id stays within the id bound, so every later call can send it back.
    assert len(mid.encode()) <= MAX_ID_BYTES and mid.startswith(iid[:100])
    assert ctx.sync(mid, gen, {mid: b"a"}, group_instance_id=iid).assignment == b"a"
    assert ctx.heartbeat(mid, gen, group_instance_id=iid) == Errors.NONE
    assert ctx.coord.commit_offsets(ctx.group_id, {T0: 5}, member_id=mid, generation_id=gen,
                                    group_instance_id=iid) == {T0: Errors.NONE}
    (member,) = ctx.coord.describe_group(ctx.group_id).members
    assert (member.member_id, member.group_instance_id) == (mid, iid)
    # A restart (no member id) takes the old member's place; the old id is fenced.
    back = ctx.join(group_instance_id=iid)
    assert back.error == Errors.NONE and back.member_id != mid
    assert ctx.heartbeat(mid, gen, group_instance_id=iid) == Errors.FENCED_INSTANCE_ID
    res = ctx.coord.leave_group(ctx.group_id, [MemberIdentity("", iid)])
    assert [m.error for m in res.members] == [Errors.NONE]
    assert ctx.member_ids() == set()
    assert ctx.coord.fetch_offsets(ctx.group_id, [T0]).offsets[T0].offset == 5


@pytest.mark.parametrize(("iid", "says"), [
    ("", "group_instance_id is empty"),
    ("x" * (MAX_ID_BYTES + 1), "longer than 1024 bytes"),
    ("\ud800", "not valid Unicode"),
])
def test_instance_ids_no_coordinator_could_take_are_invalid_requests(ctx, iid, says):
    with pytest.raises(InvalidRequestError, match=says):
        ctx.join(group_instance_id=iid)
    with pytest.raises(InvalidRequestError, match=says):
        ctx.heartbeat("m", 1, group_instance_id=iid)
