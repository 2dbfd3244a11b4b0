"""A member id past MAX_ID_BYTES names no member: Kafka, which sets no bound on it, answers it
as any id the group does not know (UNKNOWN_MEMBER_ID, FENCED_INSTANCE_ID beside another
member's instance id), where rcoord refused the call INVALID_REQUEST, an error Kafka's clients
treat as fatal (Heartbeat, SyncGroup, JoinGroup, OffsetCommit; LeaveGroup already answered it)."""

from __future__ import annotations

from typing import Any

import pytest

from rcoord import Errors, TopicPartition
from rcoord.protocol._checks import MAX_ID_BYTES

LONG = "x" * (MAX_ID_BYTES + 1)
T0 = TopicPartition("t", 0)


def test_an_id_past_the_bound_is_answered_as_any_unknown_member(ctx):
    gen, (mid,) = ctx.stable_group(1)
    assert ctx.heartbeat(LONG, gen) == ctx.heartbeat("nobody", gen) == Errors.UNKNOWN_MEMBER_ID
    assert ctx.sync(LONG, gen).error == ctx.sync("nobody", gen).error == Errors.UNKNOWN_MEMBER_ID
    joined = ctx.join(LONG)
    # The reply echoes the id the request sent, as for any other id.
    assert (joined.error, joined.member_id) == (Errors.UNKNOWN_MEMBER_ID, LONG)
    for who in (LONG, "nobody"):
        got = ctx.coord.commit_offsets(ctx.group_id, {T0: 1}, member_id=who, generation_id=gen)
        assert got == {T0: Errors.UNKNOWN_MEMBER_ID}
    # Nothing of the group moved: its member is still there, in its generation.
    assert (ctx.state(), ctx.member_ids()) == ("Stable", {mid})
    assert ctx.heartbeat(mid, gen) == Errors.NONE


def test_an_id_past_the_bound_beside_a_static_members_instance_id_is_fenced(ctx):
    first = ctx.join(group_instance_id="i1")  # (a static member is given its id at once)
    gen, mid = first.generation_id, first.member_id
    assert ctx.sync(mid, gen, {mid: b"A"}, group_instance_id="i1").error == Errors.NONE
    assert ctx.heartbeat(LONG, gen, group_instance_id="i1") == Errors.FENCED_INSTANCE_ID
    joined = ctx.join(LONG, group_instance_id="i1")
    assert (joined.error, joined.member_id) == (Errors.FENCED_INSTANCE_ID, LONG)
    assert ctx.heartbeat(mid, gen, group_instance_id="i1") == Errors.NONE


def test_text_that_is_not_unicode_is_still_refused(ctx):
    from rcoord.errors import InvalidRequestError

    with pytest.raises(InvalidRequestError, match="Unicode"):
        ctx.heartbeat("a\ud800b" + LONG, 1)


def test_the_gateway_answers_kafka_clients_unknown_member_id(gateway: Any) -> None:
    pytest.importorskip("kio")
    from gateway_harness import call_once

    joined = call_once(gateway, 11, 5, {
        "group_id": "g", "session_timeout": 30_000, "rebalance_timeout": 30_000,
        "member_id": "", "group_instance_id": "i1", "protocol_type": "consumer",
        "protocols": [{"name": "range", "metadata": b"a"}]}, 4)
    assert joined.error_code.value == Errors.NONE
    beat = call_once(gateway, 12, 4, {"group_id": "g", "generation_id": joined.generation_id,
                                      "member_id": LONG, "group_instance_id": None})
    assert beat.error_code.value == Errors.UNKNOWN_MEMBER_ID
    synced = call_once(gateway, 14, 5, {
        "group_id": "g", "generation_id": joined.generation_id, "member_id": LONG,
        "group_instance_id": None, "protocol_type": "consumer", "protocol_name": "range",
        "assignments": []})
    assert synced.error_code.value == Errors.UNKNOWN_MEMBER_ID
    rejoined = call_once(gateway, 11, 5, {
        "group_id": "g", "session_timeout": 30_000, "rebalance_timeout": 30_000,
        "member_id": LONG, "group_instance_id": None, "protocol_type": "consumer",
        "protocols": [{"name": "range", "metadata": b"a"}]}, 4)
    assert (rejoined.error_code.value, rejoined.member_id) == (Errors.UNKNOWN_MEMBER_ID, LONG)
