"""Kafka's key hash: ``Utils.murmur2``, ``Utils.toPositive`` and the producer's key partitioner.

A record with a key must land in the same partition whatever client produced it, so that a
Kafka producer, a Kafka Streams app and rcoord all agree on where ``key`` lives. That only holds
if the hash is bit-for-bit Kafka's, so Java's arithmetic is reproduced here: 32-bit ``int``
overflow on every multiply, ``>>>`` (unsigned shift) and the switch on ``length % 4`` whose cases
fall through. Python's ``hash()`` is randomised per process and could never be used.
"""

from __future__ import annotations

__all__ = ["murmur2", "partition_for_key", "to_positive"]

_SEED = 0x9747B28C
_M = 0x5BD1E995
_R = 24
_MASK = 0xFFFFFFFF


def _to_int32(n: int) -> int:
    """Reinterpret the low 32 bits as a Java ``int`` (two's complement)."""
    n &= _MASK
    return n - (1 << 32) if n & 0x80000000 else n


def murmur2(data: bytes) -> int:
    """Kafka's ``Utils.murmur2(byte[])``: a signed 32-bit result, equal to Java's for every input.

    All state is kept as an unsigned 32-bit value (``& _MASK`` after every multiply), which makes
    Python's ``>>`` behave like Java's ``>>>``; only the result is turned back into a signed int.
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"murmur2 needs bytes, got {type(data).__name__}")
    data = bytes(data)
    length = len(data)
    h = (_SEED ^ length) & _MASK
    length4 = length // 4

    for i in range(length4):
        i4 = i * 4
        k = data[i4] | (data[i4 + 1] << 8) | (data[i4 + 2] << 16) | (data[i4 + 3] << 24)
        k = (k * _M) & _MASK
        k ^= k >> _R
        k = (k * _M) & _MASK
        h = (h * _M) & _MASK
        h ^= k

    # Java's switch (length % 4) falls through: case 3 also runs cases 2 and 1, and the final
    # multiply belongs to case 1, so it runs for any non-empty tail and never for an empty one.
    tail = length & ~3
    rest = length % 4
    if rest >= 3:
        h ^= data[tail + 2] << 16
    if rest >= 2:
        h ^= data[tail + 1] << 8
    if rest >= 1:
        h ^= data[tail]
        h = (h * _M) & _MASK

    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return _to_int32(h)


def to_positive(number: int) -> int:
    """Kafka's ``Utils.toPositive``: clear the sign bit (not ``abs``; MIN_VALUE maps to 0)."""
    return number & 0x7FFFFFFF


def partition_for_key(key: bytes, num_partitions: int) -> int:
    """Kafka's ``BuiltInPartitioner.partitionForKey``: ``toPositive(murmur2(key)) % n``."""
    if num_partitions < 1:
        raise ValueError(f"num_partitions must be >= 1, got {num_partitions}")
    return to_positive(murmur2(key)) % num_partitions
