"""Which coordinator partition a group lives in, and which Redis Cluster slot that partition uses.

A group's partition is Kafka's ``__consumer_offsets`` partition:
``Utils.abs(groupId.hashCode()) % num_partitions``, with Java's ``String.hashCode`` over UTF-16
code units and Kafka's ``Utils.abs`` (Integer.MIN_VALUE maps to 0). Python's ``hash()`` is
randomised per process, so the Java arithmetic is reproduced here exactly.

Every key of a partition carries the same hash tag, so a partition is one cluster slot and a script
may touch a group's keys and the partition's deadline index together. Naive tags (``{0}``..``{49}``)
put 12, 17 and 21 of 50 partitions on three masters; instead each partition's tag is the first
string ``<n>.<p>.<k>`` (``n`` the partition count) whose slot falls in the p-th equal share of the
slot range, so an even split of slots over masters also splits the partitions evenly (exactly
when the master count divides the partition count; else a share may straddle two masters).

The count is part of the tag so that two layouts of one namespace never share a key: a process
with a stale count addresses keys where no settings copy exists, and every group script refuses
it (see ``rcoord.settings``) instead of creating a second copy of a group.
"""

from __future__ import annotations

import functools
import itertools

__all__ = [
    "SLOTS",
    "java_string_hashcode",
    "kafka_abs",
    "keyslot",
    "partition_for",
    "partition_tag",
]

SLOTS = 16384


def java_string_hashcode(s: str) -> int:
    """Java's ``String.hashCode``: ``s[0]*31^(n-1) + ... + s[n-1]`` over UTF-16 units, as int32."""
    h = 0
    data = s.encode("utf-16-be", "surrogatepass")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h >= (1 << 31) else h


def kafka_abs(n: int) -> int:
    """Kafka's ``Utils.abs``: absolute value, with Integer.MIN_VALUE mapped to 0."""
    return 0 if n == -(1 << 31) else abs(n)


def partition_for(group_id: str, num_partitions: int = 50) -> int:
    """The coordinator partition of ``group_id``, exactly as Kafka's GroupCoordinator computes it."""
    if num_partitions < 1:
        raise ValueError(f"num_partitions must be >= 1, got {num_partitions}")
    return kafka_abs(java_string_hashcode(group_id)) % num_partitions


def _crc16_table() -> list[int]:
    table = []
    for i in range(256):
        crc = i << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else (crc << 1)
        table.append(crc & 0xFFFF)
    return table


_CRC16 = _crc16_table()


def _crc16(data: bytes) -> int:
    crc = 0
    for b in data:
        crc = ((crc << 8) & 0xFFFF) ^ _CRC16[((crc >> 8) ^ b) & 0xFF]
    return crc


def keyslot(key: str | bytes) -> int:
    """Redis Cluster's slot for ``key`` (CRC16/XMODEM mod 16384, honouring ``{hash tags}``)."""
    k = key.encode() if isinstance(key, str) else key
    start = k.find(b"{")
    if start >= 0:
        end = k.find(b"}", start + 1)
        if end > start + 1:
            k = k[start + 1 : end]
    return _crc16(k) % SLOTS


@functools.cache
def _tags(num_partitions: int) -> tuple[str, ...]:
    if not 1 <= num_partitions <= SLOTS:
        raise ValueError(f"num_partitions must be in 1..{SLOTS}, got {num_partitions}")
    return tuple(tag_in_share(f"{num_partitions}.{p}", p, num_partitions) for p in range(num_partitions))


def tag_in_share(prefix: str, share: int, shares: int) -> str:
    """The first ``<prefix>.<k>`` whose slot lies in the ``share``-th of ``shares`` equal parts
    of the slot range: how partition tags (and the settings anchors) spread over the masters.

    Found without trying each k: CRC16/XMODEM (zero start, no final xor) is linear, so the CRC
    of ``<prefix>.`` followed by the digits of k is the CRC of ``<prefix>.`` followed by as many
    zero bytes, xor the CRC of the digits alone. One table per number of digits (the smallest k
    for each slot, shared by every prefix) then answers a share in one look-up per slot. Trying
    k = 0, 1, 2 ... cost about one CRC per slot of the share, 16,384 per partition at 16,384
    partitions: the first key of a process took 32 s of CPU at 4,096 partitions and about 37
    minutes at 16,384 (a count the settings accept), for the same tags."""
    lo, hi = share * SLOTS // shares, (share + 1) * SLOTS // shares
    head = f"{prefix}.".encode()
    for digits in itertools.count(1):
        base = _crc16(head + bytes(digits)) % SLOTS
        first = _first_k_by_slot(digits)
        found = [k for k in (first[slot ^ base] for slot in range(lo, hi)) if k >= 0]
        if found:
            return f"{prefix}.{min(found)}"
    raise AssertionError("unreachable: itertools.count never ends")


@functools.cache
def _first_k_by_slot(digits: int) -> list[int]:
    """For each slot value, the smallest k of ``digits`` digits whose CRC16 (alone) gives it,
    or -1 where none does (six digits reach every slot)."""
    first = [-1] * SLOTS
    for k in range(0 if digits == 1 else 10 ** (digits - 1), 10**digits):
        slot = _crc16(str(k).encode()) % SLOTS
        if first[slot] < 0:
            first[slot] = k
    return first


def partition_tag(partition: int, num_partitions: int) -> str:
    """The hash-tag text (without braces) for ``partition``; its slot is in the p-th slot share."""
    if not 0 <= partition < num_partitions:
        raise ValueError(f"partition {partition} out of range 0..{num_partitions - 1}")
    return _tags(num_partitions)[partition]
