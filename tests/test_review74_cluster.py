"""Review 74 (scale-out on Redis Cluster): reproductions of defects found, failing until fixed."""

from __future__ import annotations

from typing import Any

import pytest

from rcoord import partitioning
from rcoord.config import CoordinatorConfig
from rcoord.partitioning import keyslot, partition_tag

HASH_BUDGET = 3_000_000
"""CRC16 computations allowed for every partition tag of one count. Each tag is the first
``<n>.<p>.<k>`` whose slot lies in the p-th share; CRC16 with a zero start is linear, so
crc(prefix + digits) = crc(prefix + zero bytes) ^ crc(digits), and one table of the digits'
CRCs (the first k for each value, about 1.1 million for 6 digits) finds every partition's k
at once: all 16,384 tags in about 2 s. Scanning k for each partition, as now, costs about
16,384 tries per partition at 16,384 partitions (268 million, about 37 minutes of CPU) and 4
per slot of share otherwise (16.7 million, 32 s, at 4,096)."""


@pytest.mark.parametrize("count", [4096, 16384])
def test_every_partition_tag_of_an_accepted_count_is_found_without_scanning(monkeypatch, count):
    """num_partitions up to 16,384 is accepted ("one Redis Cluster slot each"), but the first
    key of any group computes the tags of every partition, so a worker's first call under
    4,096 partitions took 32 s of CPU and under 16,384 about 37 minutes; the coordinator
    service, which settles a settings copy into every partition, the same."""
    CoordinatorConfig(num_partitions=count)  # accepted: no ConfigError
    spent = 0
    crc16 = partitioning._crc16

    def counted(data: Any) -> int:
        nonlocal spent
        spent += 1
        if spent > HASH_BUDGET:
            raise AssertionError(f"more than {HASH_BUDGET} CRC16 computations for {count} tags")
        return crc16(data)

    monkeypatch.setattr(partitioning, "_crc16", counted)
    tags = [partition_tag(p, count) for p in range(count)]
    monkeypatch.undo()
    share = partitioning.SLOTS // count
    assert [keyslot(f"{{{t}}}") // share for t in tags] == list(range(count))
    assert all(t.startswith(f"{count}.{p}.") for p, t in enumerate(tags))
