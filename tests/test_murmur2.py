"""rcoord.murmur2 against vectors produced by Kafka's own code.

The first table is ``UtilsTest.testMurmur2`` from Apache Kafka. The others were produced by
running Kafka's ``Utils.murmur2`` / ``BuiltInPartitioner.partitionForKey`` on a JVM (OpenJDK 17);
they cover every tail length (the fall-through switch) and bytes >= 0x80, which Java reads as
negative and masks with ``& 0xff``.
"""

from __future__ import annotations

import pytest

from rcoord.murmur2 import murmur2, partition_for_key, to_positive

# Kafka: clients/src/test/java/org/apache/kafka/common/utils/UtilsTest.java, testMurmur2.
KAFKA_UTILS_TEST = [
    (b"21", -973932308),
    (b"foobar", -790332482),
    (b"a-little-bit-long-string", -985981536),
    (b"a-little-bit-longer-string", -1486304829),
    (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
    (b"abc", 479470107),
]

# bytes(0xff - 17*i for i in range(n)) for n = 0..9 -> Utils.murmur2 on the JVM.
JVM_BINARY = [
    ("", 275646681),
    ("ff", -311467685),
    ("ffee", 1750061758),
    ("ffeedd", 2053089151),
    ("ffeeddcc", 705638213),
    ("ffeeddccbb", -435349888),
    ("ffeeddccbbaa", -1576922666),
    ("ffeeddccbbaa99", -1046235303),
    ("ffeeddccbbaa9988", -809053009),
    ("ffeeddccbbaa998877", -1660089088),
]

# UTF-8 key -> (murmur2, partitionForKey(key, 3), partitionForKey(key, 50)) on the JVM.
JVM_STRINGS = [
    ("", 275646681, 0, 31),
    ("key", -1079937367, 1, 31),
    ("user-42", 1459644460, 1, 10),
    ("été", -2101193575, 1, 23),
    ("orders", -1029842276, 0, 22),
]

# partitionForKey(("key-" + i).getBytes(UTF_8), 12) for i = 0..99 on the JVM.
KEY_I_12_PARTITIONS = [
    1, 0, 2, 11, 9, 8, 8, 7, 7, 9, 2, 1, 8, 1, 4, 3, 1, 0, 5, 6,
    7, 3, 1, 8, 8, 2, 3, 11, 3, 1, 8, 7, 10, 8, 2, 4, 10, 9, 11, 8,
    1, 5, 3, 6, 10, 7, 5, 1, 2, 11, 2, 10, 1, 0, 1, 4, 9, 1, 11, 9,
    9, 10, 6, 5, 1, 3, 2, 5, 0, 0, 5, 5, 7, 11, 1, 7, 8, 2, 11, 5,
    10, 6, 4, 0, 4, 8, 7, 10, 6, 9, 0, 10, 11, 1, 4, 8, 0, 1, 5, 10,
]


@pytest.mark.parametrize(("data", "expected"), KAFKA_UTILS_TEST)
def test_kafka_utils_test_vectors(data: bytes, expected: int) -> None:
    assert murmur2(data) == expected


@pytest.mark.parametrize(("hexdata", "expected"), JVM_BINARY)
def test_every_tail_length_and_high_bytes(hexdata: str, expected: int) -> None:
    assert murmur2(bytes.fromhex(hexdata)) == expected


@pytest.mark.parametrize(("key", "expected", "p3", "p50"), JVM_STRINGS)
def test_strings_and_partitions(key: str, expected: int, p3: int, p50: int) -> None:
    data = key.encode()
    assert murmur2(data) == expected
    assert partition_for_key(data, 3) == p3
    assert partition_for_key(data, 50) == p50


def test_key_i_over_12_partitions() -> None:
    got = [partition_for_key(f"key-{i}".encode(), 12) for i in range(100)]
    assert got == KEY_I_12_PARTITIONS


def test_accepts_bytearray_and_memoryview() -> None:
    assert murmur2(bytearray(b"foobar")) == murmur2(memoryview(b"foobar")) == -790332482


def test_to_positive_masks_the_sign_bit() -> None:
    # Not abs(): Kafka clears bit 31, so MIN_VALUE -> 0 and -1 -> MAX_VALUE.
    assert to_positive(-(1 << 31)) == 0
    assert to_positive(-1) == 0x7FFFFFFF
    assert to_positive(-311467685) == 1836015963
    assert to_positive(12345) == 12345


def test_rejects_text_and_bad_partition_counts() -> None:
    with pytest.raises(TypeError):
        murmur2("foobar")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        partition_for_key(b"k", 0)
