"""What an idempotent producer id stored in its current epoch, read back from Redis.

Deduplication by sequence number (``topic_append_idempotent.lua``) is exact only for a replay
that sends the same records in the same order. A producer that takes over an epoch with the
same records in another order (a Spark task retried after a shuffle) must instead learn what
is stored and send only the rest, numbered after it. Two reads serve it:

* ``epoch_states``: each partition's state of the producer (epoch, last sequence): one HGET
  per partition, in one pipeline. It is what every new attempt pays, to learn whether an
  earlier one appended anything.
* ``epoch_appends``: only when one did: the producer's append log in those partitions (kept by
  ``Producer(log_appends=True)``: one line per script call that appended, the epoch, first
  sequence, first offset and count; a call's records have consecutive offsets), then the
  records at those offsets.

The log lives as long as the producer's state (``producer_id_expiration_ms`` after the last
append) and holds the current epoch only.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

from ._base import (
    Record,
    _check_client,
    _check_namespace,
    _check_topic,
    _offset_id,
    partition_key,
    producer_log_key,
    producer_state_keys,
)
from ._decode import decode_entries

__all__ = ["EpochAppends", "ProducerEpochState", "epoch_appends", "epoch_states"]


@dataclass(frozen=True)
class ProducerEpochState:
    """A producer's state in one partition: its epoch and last sequence appended (-1: none in
    that epoch). The script may consider it expired (its clock decides); the records it names
    are stored either way."""

    partition: int
    epoch: int
    last_sequence: int


@dataclass(frozen=True)
class EpochAppends:
    """What a producer appended to one partition in one epoch.

    ``records``: the stored records its log names, in offset order. ``complete``: the log
    names every sequence from 0 to ``last_sequence`` and every one of those records is still
    in the partition (retention may have trimmed some; a log written before the producer kept
    one lacks some; a gap the producer declared lost leaves a hole). When incomplete, a record missing here may be stored all the same, so a
    caller that sends it again may store it twice (never less than once).
    """

    partition: int
    last_sequence: int
    records: list[Record]
    complete: bool


def epoch_states(client: Any, namespace: str, topic: str, producer_id: str,
                 partitions: int) -> dict[int, ProducerEpochState]:
    """The producer's state in each partition that has one (any epoch)."""
    _check_client(client)
    _check_namespace(namespace)
    _check_topic(topic)
    pipe = client.pipeline(transaction=False)
    for p in range(partitions):
        pipe.hget(producer_state_keys(namespace, topic, p)[0], producer_id)
    out = {}
    for p, raw in enumerate(pipe.execute()):
        if raw is not None:
            v = msgpack.unpackb(raw)  # epoch, last sequence, last activity, batches...
            out[p] = ProducerEpochState(p, int(v[0]), int(v[1]))
    return out


def _parse_log(raw: bytes | None, epoch: int) -> list[tuple[int, int, int]]:
    """(first sequence, first offset, count) of each logged call of ``epoch``."""
    calls = []
    for line in (raw or b"").decode().splitlines():
        e, first_seq, first_offset, count = (int(x) for x in line.split())
        if e == epoch:
            calls.append((first_seq, first_offset, count))
    return calls


def epoch_appends(client: Any, namespace: str, topic: str, producer_id: str, epoch: int,
                  states: Sequence[ProducerEpochState]) -> dict[int, EpochAppends]:
    """What the producer appended at ``epoch`` in each partition of ``states`` at that epoch.

    Two pipelines: the logs, then the records at the offsets they name.
    """
    mine = [s for s in states if s.epoch == epoch and s.last_sequence >= 0]
    if not mine:
        return {}
    pipe = client.pipeline(transaction=False)
    for s in mine:
        pipe.get(producer_log_key(namespace, topic, s.partition, producer_id))
    logs = [_parse_log(raw, epoch) for raw in pipe.execute()]
    pipe = client.pipeline(transaction=False)
    ranges: list[tuple[int, int]] = []  # (state index, count)
    for i, (s, calls) in enumerate(zip(mine, logs)):
        key = partition_key(namespace, topic, s.partition)
        for _, first_offset, count in calls:
            pipe.xrange(key, _offset_id(first_offset), _offset_id(first_offset + count - 1))
            ranges.append((i, count))
    replies = pipe.execute() if ranges else []
    records: list[list[Record]] = [[] for _ in mine]
    whole = [True] * len(mine)
    for (i, count), entries in zip(ranges, replies):
        got = decode_entries(entries)
        records[i].extend(got)
        whole[i] = whole[i] and len(got) == count
    out = {}
    for i, (s, calls) in enumerate(zip(mine, logs)):
        covered = sorted((first, first + count - 1) for first, _, count in calls)
        # The log is read after the state: another attempt under this id and epoch may have
        # appended in between, past the state's last sequence. Its records are counted here,
        # so the last sequence is the log's: resumed at the state's, this attempt's own
        # records were answered duplicates of the ones it had just counted, and an identical
        # row was taken for stored twice while stored once.
        last = max([s.last_sequence, *(b for _, b in covered)])
        contiguous = bool(covered) and covered[0][0] == 0 and all(
            b[0] == a[1] + 1 for a, b in itertools.pairwise(covered))
        complete = whole[i] and contiguous and covered[-1][1] == last
        out[s.partition] = EpochAppends(s.partition, last,
                                        sorted(records[i], key=lambda r: r.offset), complete)
    return out
