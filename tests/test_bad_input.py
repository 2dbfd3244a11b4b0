"""Malformed arguments sent to the library's functions directly (another client, a version
skew): each is refused with RCOORD_BAD_ARGUMENT (``InvalidRequestError``) before anything is
written, never a Lua runtime error after a partial write (Redis does not undo a script that
fails half-way). The public API's own checks are in test_bounds.py."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
import redis

from rcoord import GroupCoordinator, MockTime
from rcoord.errors import Errors, InvalidRequestError, translate_redis_errors
from rcoord.protocol.join import JoinRequest
from rcoord.protocol.offsets import OffsetAndMetadata, TopicPartition

pytestmark = pytest.mark.parametrize("backend", ["single"])

GROUP = "g"


@pytest.fixture
def stable(make_coordinator: Any) -> tuple[GroupCoordinator, str, int, MockTime]:
    """A Stable group of one member with a committed offset (coordinator, member id,
    generation, clock)."""
    clock = MockTime()
    coord = make_coordinator(clock=clock)
    joined = coord.join_group(GROUP, protocol_type="consumer", protocols=[("range", b"m")],
                              session_timeout_ms=10_000, require_known_member_id=False)
    mid, gen = joined.member_id, joined.generation_id
    coord.sync_group(GROUP, gen, mid, assignments={mid: b"a"})
    coord.commit_offsets(GROUP, {TopicPartition("t", 0): 5}, member_id=mid, generation_id=gen)
    return coord, mid, gen, clock


def snapshot(client: redis.Redis, coord: GroupCoordinator) -> dict[bytes, bytes]:
    pattern = coord.config.namespace + "*"
    return {k: client.dump(k) for k in client.scan_iter(match=pattern, count=1000)}


@translate_redis_errors
def call(coord: GroupCoordinator, step: str, args: list[Any]) -> Any:
    return coord._call(step, coord._keys(GROUP), args)


def join_args(mid: str, **changed: Any) -> list[Any]:
    args = JoinRequest.build(
        GROUP, mid, protocol_type="consumer", protocols=[("range", b"m")],
        session_timeout_ms=10_000, rebalance_timeout_ms=10_000, group_instance_id=None,
        client_id="c", client_host="h", require_known_member_id=True, reason=None,
    ).args()
    for index, value in changed.items():
        args[int(index[1:]) - 3] = value  # ("a8": ARGV[8])
    return args


@pytest.mark.parametrize("argv", [
    {"a7": "nan"},     # session timeout: wrote the join's event and deadline, then failed
    {"a8": ""},        # rebalance timeout: wrote the member, then "table index is nil"
    {"a8": "abc"},
    {"a8": "nan"},
])
def test_a_join_with_a_non_numeric_timeout_is_refused_before_any_write(
        stable: Any, redis_client: redis.Redis, argv: dict[str, Any]) -> None:
    coord, mid, _, _ = stable
    before = snapshot(redis_client, coord)
    with pytest.raises(InvalidRequestError, match="timeout_ms"):
        call(coord, "join_group", join_args(mid, **argv))
    assert snapshot(redis_client, coord) == before
    assert coord.describe_group(GROUP).state == "Stable"


@pytest.mark.parametrize("step, args", [
    ("join_group", ["x"]),                                     # too few arguments
    ("join_group", None),                                      # protocols not msgpack
    ("sync_group", ["m", "1"]),
    ("sync_group", ["m", "abc", "", "", "", b""]),            # generation not a number
    ("sync_group", ["m", "1", "", "", "", b"\x05"]),          # assignments not a map
    ("sync_group", ["m", "1", "", "consumer", "", b""]),     # type given without its '='
    ("sync_group", ["m", "1", "", "", "range", b""]),        # name given without its '='
    ("leave_group", []),
    ("leave_group", [b"\x05"]),
    ("leave_group", [msgpack.packb([[1, 2]], use_bin_type=False)]),
    ("commit_offsets", ["m", "1", "", "x", msgpack.packb([], use_bin_type=False)]),
    ("commit_offsets", ["m", "1", "", "", b"\xc1"]),
    ("fetch_offsets", ["#0", "abc"]),
    ("fetch_offsets", ["#x", "10"]),
    ("fetch_offsets", ["#0", "99999999999999999999"]),
    ("fetch_offsets", ["#18446744073709551616", "10"]),     # a cursor beyond uint64
    ("fetch_offsets", ["#99999999999999999999999", "10"]),
    ("describe_group", ["0", "nan"]),
    ("describe_group", ["-1"]),
    ("await_reply", []),
    ("await_reply", ["m", "x"]),
])
def test_malformed_arguments_of_a_group_step_are_refused_by_name(
        stable: Any, redis_client: redis.Redis, step: str, args: list[Any] | None) -> None:
    """Each was a raw Lua error ("attempt to compare nil", "bad argument #1 to 'ipairs'",
    HSCAN's "value is not an integer" or "invalid cursor"), naming neither the step nor the
    argument."""
    coord, mid, _, _ = stable
    if args is None:
        args = join_args(mid, a6="abc")
    before = snapshot(redis_client, coord)
    with pytest.raises(InvalidRequestError, match=step):
        call(coord, step, args)
    assert snapshot(redis_client, coord) == before


def test_a_page_of_offsets_from_the_largest_cursor_is_read(stable: Any) -> None:
    """HSCAN takes any uint64 cursor; so does the page check (a cursor from another server
    process may be any)."""
    coord, _, _, _ = stable
    page = call(coord, "fetch_offsets", ["#18446744073709551615", "10"])
    assert page[-4] == b"#" and page[-2] == b"@"


def test_a_step_with_a_non_numeric_clock_is_refused(stable: Any, redis_client: redis.Redis
                                                      ) -> None:
    coord, _, _, _ = stable
    keys = coord._keys(GROUP)
    before = snapshot(redis_client, coord)
    with pytest.raises(redis.ResponseError, match="RCOORD_BAD_ARGUMENT .*now"):
        coord._scripts.call("describe_group", keys.all(), ["soon", GROUP, "0", ""])
    assert snapshot(redis_client, coord) == before


def test_a_commit_of_a_non_decimal_offset_is_refused(stable: Any,
                                                     redis_client: redis.Redis) -> None:
    """Offsets are stored as the decimal strings they came as: "6x" was stored, and every
    fetch of the group's offsets failed from then on (ValueError in ``decode_record``)."""
    coord, mid, gen, _ = stable
    entry = [b"0:t", b"6x", b"", b"-1", 0]
    before = snapshot(redis_client, coord)
    with pytest.raises(InvalidRequestError, match="decimal offset"):
        call(coord, "commit_offsets",
             [mid, str(gen), "", "", msgpack.packb([entry], use_bin_type=False)])
    assert snapshot(redis_client, coord) == before
    assert coord.fetch_offsets(GROUP).offsets[TopicPartition("t", 0)].offset == 5


def test_a_heartbeat_with_a_short_last_triple_refreshes_no_session(
        stable: Any, redis_client: redis.Redis) -> None:
    """The first triple's session was refreshed, then the short one failed the call."""
    coord, mid, gen, clock = stable
    clock.sleep(1000)
    keys = coord._keys(GROUP)
    before = snapshot(redis_client, coord)
    for args in ([coord._now_arg(), GROUP, mid, str(gen), "", mid],
                 [coord._now_arg(), GROUP, mid, str(gen), "", mid, "x", ""]):
        with pytest.raises(redis.ResponseError, match="RCOORD_BAD_ARGUMENT heartbeat"):
            coord._scripts.call("heartbeat", keys.heartbeat_keys(), args)
        assert snapshot(redis_client, coord) == before
    assert coord.heartbeat(GROUP, gen, mid).name == "NONE"


@pytest.mark.parametrize("argv", [{"a11": "true"}, {"a11": ""}, {"a14": "false"}])
def test_a_join_whose_flag_is_neither_1_nor_0_is_refused(
        stable: Any, redis_client: redis.Redis, argv: dict[str, Any]) -> None:
    """ARGV[11] (require a known member id) was on only for '1', ARGV[14] (the client reads
    SkipAssignment) off only for '0': a caller that sent 'true' and 'false' had a new member
    added without MEMBER_ID_REQUIRED, or a client that cannot read SkipAssignment answered as
    one that can (a static leader back in a Stable group told it leads)."""
    coord, _, _, _ = stable
    before = snapshot(redis_client, coord)
    with pytest.raises(InvalidRequestError, match=r"join_group: .*ARGV\[1[14]\]"):
        call(coord, "join_group", join_args("", **argv))
    assert snapshot(redis_client, coord) == before


def test_a_join_that_would_add_a_member_with_an_empty_id_is_refused(
        stable: Any, redis_client: redis.Redis) -> None:
    """'' is a new member's id in a JoinGroup: a member stored under it (the join's ARGV[12]
    empty) was listed in the group and could never heartbeat, sync or leave by its id."""
    coord, _, _, _ = stable
    args = join_args("", a11="0", a12="")
    before = snapshot(redis_client, coord)
    with pytest.raises(InvalidRequestError, match="ARGV.12"):
        call(coord, "join_group", args)
    assert snapshot(redis_client, coord) == before
    assert "" not in [m.member_id for m in coord.describe_group(GROUP).members]


@pytest.mark.parametrize("entry, retention", [
    ([b"abc", b"6", b"", b"-1", 0], ""),        # no partition: every fetch failed (ValueError)
    ([b":t", b"6", b"", b"-1", 0], ""),
    ([b"0:", b"6", b"", b"-1", 0], ""),         # no topic (the API refuses an empty one)
    ([b"2147483648:t", b"6", b"", b"-1", 0], ""),
    ([b"00:t", b"6", b"", b"-1", 0], ""),       # a second field of partition 0
    ([b"0:t", b"9223372036854775808", b"", b"-1", 0], ""),  # beyond int64
    ([b"0:t", b"-9223372036854775809", b"", b"-1", 0], ""),
    ([b"0:t", b"6", b"", b"2147483648", 0], ""),           # beyond int32
    ([b"0:t", b"6", b"", b"-1", 0], str(2 ** 53)),          # retention above 2^52
])
def test_a_commit_whose_record_no_fetch_could_return_is_refused(
        stable: Any, redis_client: redis.Redis, entry: list[Any], retention: str) -> None:
    """Every fetch of a group decodes all its offsets: a field with no partition was stored
    and failed each one from then on; an offset beyond int64 (an epoch or a partition beyond
    int32) was stored and fetched as a value no Kafka field holds; "00:t" was a second record
    of partition 0, and a fetch returned either."""
    coord, mid, gen, _ = stable
    before = snapshot(redis_client, coord)
    with pytest.raises(InvalidRequestError, match=r"commit_offsets: .*ARGV\[[67]\]"):
        call(coord, "commit_offsets",
             [mid, str(gen), "", retention, msgpack.packb([entry], use_bin_type=False)])
    assert snapshot(redis_client, coord) == before
    assert coord.fetch_offsets(GROUP).offsets == {TopicPartition("t", 0): OffsetAndMetadata(5)}


def test_a_commit_of_the_extreme_int64_offsets_and_int32_epochs_is_stored_exactly(
        stable: Any) -> None:
    """The range checks compare decimal text: the ends of each range are stored as sent."""
    coord, mid, gen, _ = stable
    offsets = {TopicPartition("t", 0): OffsetAndMetadata(2 ** 63 - 1, "", 2 ** 31 - 1),
               TopicPartition("t", 2 ** 31 - 1): OffsetAndMetadata(-(2 ** 63), "", 0),
               TopicPartition("u", 1): OffsetAndMetadata(-1),
               TopicPartition("u", 2): OffsetAndMetadata(0)}
    assert set(coord.commit_offsets(GROUP, offsets, member_id=mid, generation_id=gen,
                                    retention_ms=2 ** 63 - 1).values()) == {Errors.NONE}
    entry = [b"3:u", b"-000042", b"", b"-2147483648", 0]  # (leading zeros: the same number)
    assert call(coord, "commit_offsets",
                [mid, str(gen), "", "", msgpack.packb([entry], use_bin_type=False)])[0] == b"NONE"
    fetched = coord.fetch_offsets(GROUP).offsets
    assert {tp: fetched[tp] for tp in offsets} == offsets
    # (a leader epoch below -1 is kept as Kafka keeps it: only -1 means none, 798299d)
    assert fetched[TopicPartition("u", 3)] == OffsetAndMetadata(-42, "", -(2 ** 31))
