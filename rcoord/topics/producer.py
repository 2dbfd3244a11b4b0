"""The producer: Kafka's partitioners (murmur2 on the key, sticky or round-robin without one)."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, Literal

from ..errors import Errors, InvalidRequestError, translate_redis_errors
from ..murmur2 import partition_for_key, to_positive
from ._base import (
    APPEND,
    MAX_APPEND_PER_CALL,
    ProducerRecord,
    RecordMetadata,
    TopicError,
    _Call,
    _check_client,
    _check_int,
    _check_topic,
    _encode_record,
    _id_offset,
    _name,
    _run,
    meta_key,
    partition_key,
)

# -- producer ---------------------------------------------------------------------------------

PartitionerFn = Callable[[str, "bytes | None", int], int]


class Producer:
    """Appends records to topic partitions, choosing partitions the way Kafka's producer does.

    ``partitioner``:

    * ``"default"``: Kafka's BuiltInPartitioner. A keyed record goes to
      ``toPositive(murmur2(key)) % partitions``, so every Kafka client agrees on it. Keyless
      records stick to one partition until ``batch_size`` bytes of values went there (Kafka's
      ``batch.size``, the "batch is done" point), then move to another partition at random.
    * ``"round_robin"``: Kafka's RoundRobinPartitioner: every record, keyed or not, to the next
      partition in turn.
    * a callable ``(topic, key, num_partitions) -> partition``.

    An explicit ``partition`` always wins. Partition counts are cached for
    ``metadata_max_age_ms`` (client monotonic time, only used for this cache) and re-read at
    once when a partition looks out of range or a topic unknown. The producer is thread-safe.
    """

    def __init__(
        self,
        redis_client: Any,
        namespace: str = "rcoord",
        partitioner: Literal["default", "round_robin"] | PartitionerFn = "default",
        *,
        batch_size: int = 16384,
        metadata_max_age_ms: int = 5000,
        rng: random.Random | None = None,
    ) -> None:
        _check_client(redis_client)
        if not callable(partitioner) and partitioner not in ("default", "round_robin"):
            raise InvalidRequestError(f"unknown partitioner {partitioner!r}")
        self._r = redis_client
        self._ns = namespace
        self._partitioner = partitioner
        self._batch_size = _check_int("batch_size", batch_size, 1)
        self._max_age_s = _check_int("metadata_max_age_ms", metadata_max_age_ms, 0) / 1000
        self._rng = rng or random.Random()
        self._lock = threading.Lock()
        self._counts: dict[str, tuple[int, float]] = {}
        self._sticky: dict[str, tuple[int, int]] = {}  # topic -> (partition, bytes sent to it)
        self._rr: dict[str, int] = {}

    # -- metadata

    def _num_partitions(self, topic: str, refresh: bool = False) -> int:
        now = time.monotonic()
        with self._lock:
            cached = self._counts.get(topic)
        if cached is not None and not refresh and now - cached[1] < self._max_age_s:
            return cached[0]
        raw = self._r.hget(meta_key(self._ns, topic), "partitions")
        if raw is None:
            with self._lock:
                self._counts.pop(topic, None)
            raise TopicError(Errors.UNKNOWN_TOPIC_OR_PARTITION, topic)
        with self._lock:
            self._counts[topic] = (int(raw), now)
        return int(raw)

    def _choose(self, topic: str, rec: ProducerRecord, n: int) -> int:
        if callable(self._partitioner):
            return int(self._partitioner(topic, rec.key, n))
        if self._partitioner == "round_robin":
            with self._lock:
                counter = self._rr.get(topic, 0)
                self._rr[topic] = counter + 1
            return to_positive(counter) % n
        if rec.key is not None:
            return partition_for_key(bytes(rec.key), n)
        with self._lock:
            part, used = self._sticky.get(topic, (-1, 0))
            if part < 0 or part >= n:
                part, used = self._rng.randrange(n), 0
            elif used >= self._batch_size:
                # The batch is done: move to another partition, never the same one again.
                if n > 1:
                    other = self._rng.randrange(n - 1)
                    part = other if other < part else other + 1
                used = 0
            self._sticky[topic] = (part, used + len(rec.value or b""))
        return part

    # -- sending

    @translate_redis_errors
    def send(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None = None,
        partition: int | None = None,
        headers: dict[str, bytes] | None = None,
    ) -> RecordMetadata:
        """Append one record; its offset and Redis-time timestamp come back."""
        return self._send(topic, [ProducerRecord(value, key, partition, headers)])[0]

    @translate_redis_errors
    def send_batch(
        self, topic: str, records: Iterable[ProducerRecord | bytes]
    ) -> list[RecordMetadata]:
        """Append many records in one pipeline; metadata comes back in the order given.

        Records of one partition go in one script call (per ``MAX_APPEND_PER_CALL``), so they
        get consecutive offsets in the order given. If a partition vanished meanwhile the other
        partitions' records are still appended and TopicError is raised.
        """
        recs = [r if isinstance(r, ProducerRecord) else ProducerRecord(r) for r in records]
        return self._send(topic, recs) if recs else []

    def _send(self, topic: str, recs: list[ProducerRecord]) -> list[RecordMetadata]:
        _check_topic(topic)
        n = self._num_partitions(topic)
        parts: list[int] = []
        for rec in recs:
            if rec.partition is not None:
                p = _check_int("partition", rec.partition, -(1 << 31))
                if p >= n:
                    n = self._num_partitions(topic, refresh=True)
            else:
                p = self._choose(topic, rec, n)
            if not 0 <= p < n:
                raise TopicError(Errors.UNKNOWN_TOPIC_OR_PARTITION,
                                 f"{topic} has no partition {p} (count {n})")
            parts.append(p)
        encoded = [_encode_record(rec) for rec in recs]

        by_part: dict[int, list[int]] = {}
        for i, p in enumerate(parts):
            by_part.setdefault(p, []).append(i)
        calls: list[_Call] = []
        chunks: list[tuple[int, list[int]]] = []
        for p, idxs in by_part.items():
            for lo in range(0, len(idxs), MAX_APPEND_PER_CALL):
                chunk = idxs[lo : lo + MAX_APPEND_PER_CALL]
                args = [a for i in chunk for a in encoded[i]]
                calls.append((APPEND, [partition_key(self._ns, topic, p)], args))
                chunks.append((p, chunk))

        out: list[RecordMetadata | None] = [None] * len(recs)
        failed: list[int] = []
        for (p, chunk), res in zip(chunks, _run(self._r, calls)):
            if _name(res[0]) != Errors.NONE:
                failed.append(p)
                continue
            first, ts = _id_offset(res[1]), int(res[2])
            for j, i in enumerate(chunk):
                out[i] = RecordMetadata(topic, p, first + j, ts)
        if failed:
            with self._lock:
                self._counts.pop(topic, None)
            raise TopicError(Errors.UNKNOWN_TOPIC_OR_PARTITION,
                             f"{topic} partitions {sorted(set(failed))} do not exist")
        return [m for m in out if m is not None]
