"""Group -> coordinator partition (Kafka's arithmetic) and partition -> cluster slot."""

from __future__ import annotations

import collections

import pytest

from rcoord.keys import GroupKeys
from rcoord.partitioning import (
    java_string_hashcode,
    kafka_abs,
    keyslot,
    partition_for,
    partition_tag,
)


@pytest.mark.parametrize(
    "text,expected",
    [
        ("", 0),
        ("a", 97),
        ("hello", 99162322),
        ("polygenelubricants", -2147483648),  # Integer.MIN_VALUE
        ("Aa", 2112),
        ("BB", 2112),
        ("\u00e9t\u00e9", 227742),  # 233*31^2 + 116*31 + 233
        ("\U0001F600", 1772899),  # UTF-16 D83D DE00: 55357*31 + 56832
    ],
)
def test_java_string_hashcode(text, expected):
    assert java_string_hashcode(text) == expected


def test_kafka_abs_maps_min_value_to_zero():
    assert kafka_abs(-(2**31)) == 0
    assert kafka_abs(-5) == 5 and kafka_abs(7) == 7


def test_partition_for_matches_kafka():
    # "polygenelubricants" hashes to Integer.MIN_VALUE: Utils.abs gives 0, the old
    # `& 0x7fffffff` also 0; "hello" -> 99162322 % 50 = 22.
    assert partition_for("polygenelubricants") == 0
    assert partition_for("hello") == 22
    assert partition_for("hello", 7) == 99162322 % 7
    # A negative hash: abs, not two's-complement masking.
    h = java_string_hashcode("my-group-xyz")
    assert partition_for("my-group-xyz") == abs(h) % 50


def test_keyslot_matches_redis():
    # Values checked with CLUSTER KEYSLOT on this machine (shared/notes/redis-mechanics.md).
    assert keyslot("{cg-17}:meta") == 2934
    assert keyslot("cg:{17}:members") == 12304
    assert keyslot("{}x") == 10595
    assert keyslot("{}") == 15257


def test_partition_keys_spread_evenly_over_three_masters():
    thirds = collections.Counter(
        keyslot("{" + partition_tag(p, 50) + "}") * 3 // 16384 for p in range(50)
    )
    assert sorted(thirds.values()) == [16, 17, 17]


def test_each_partition_tag_is_in_its_slot_share():
    for n in (1, 3, 50, 64):
        for p in range(n):
            slot = keyslot("{" + partition_tag(p, n) + "}")
            assert p * 16384 // n <= slot < (p + 1) * 16384 // n


def test_all_keys_of_a_group_share_one_slot():
    keys = GroupKeys.of("ns", 50, "some {weird} group").all()
    assert len({keyslot(k) for k in keys}) == 1
    assert len(keys) == len(set(keys)) == 16


def test_partition_for_rejects_bad_partition_count():
    with pytest.raises(ValueError):
        partition_for("g", 0)
