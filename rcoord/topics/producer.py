"""The producer: Kafka's partitioners (murmur2 on the key, sticky or round-robin without one),
and Kafka's idempotent producer (KIP-98): a retried append is never appended twice."""

from __future__ import annotations

import math
import operator
import random
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from ..errors import ConnectionLost, Errors, InvalidRequestError, translate_redis_errors
from ..forking import renew_after_fork
from ..murmur2 import partition_for_key, to_positive
from ._base import (
    APPEND,
    APPEND_IDEMPOTENT,
    MAX_APPEND_PER_CALL,
    PRODUCER_ID,
    PRODUCER_ID_EXPIRATION_MS,
    PRODUCER_PRUNE_PER_CALL,
    Headers,
    ProducerRecord,
    RecordMetadata,
    SlotMoveOutlasted,
    TopicError,
    _Call,
    _check_client,
    _check_int,
    _check_namespace,
    _check_topic,
    _encode_record,
    _id_offset,
    _name,
    _run,
    _run_through_slot_moves,
    last_timestamp_key,
    meta_key,
    partition_key,
    partition_keys,
    producer_id_counter_key,
    producer_log_key,
)

# -- producer ---------------------------------------------------------------------------------

PartitionerFn = Callable[[str, "bytes | None", int], int]

_MAX_EPOCH = (1 << 53) - 1  # sequence and epoch arithmetic in Lua is exact up to 2**53
MAX_REQUEST_SIZE = 1 << 20
"""Kafka's ``max.request.size`` default: the largest record, and the bytes one script call
carries (a call holds its shard while it runs, and a larger argument than the server's
``proto-max-bulk-len`` breaks the connection)."""
MAX_REQUEST_SIZE_LIMIT = 1 << 29
"""The largest ``max_request_size``: Redis's default ``proto-max-bulk-len`` (512 MiB)."""
KAFKA_SEQUENCE_MODULUS = 1 << 31
"""A Kafka producer's sequence numbers are int32s that go from 2**31 - 1 back to 0
(``DefaultRecordBatch.incrementSequence``); ``append_idempotent(wrapping=True)`` compares them
modulo this."""
_MAX_PRODUCER_ID_LEN = 1024
DELIVERY_TIMEOUT_MS = 120_000
"""Kafka's ``delivery.timeout.ms`` default: how long an idempotent ``Producer`` resends a call
that a slot on the move refused (``Producer``, "Slot moves")."""
# Worst first: the error raised when several partitions of one call failed.
_SEVERITY = (Errors.PRODUCER_FENCED, Errors.OUT_OF_ORDER_SEQUENCE_NUMBER)


@dataclass
class _Sequence:
    """An idempotent producer's numbering of one partition.

    ``lost_from``: the lowest sequence number of a call whose outcome is unknown (the connection
    failed) or that was refused; the next append tells the script that those numbers may be
    missing, so the gap is accepted once and the lost records can never appear later. The lock
    is held from numbering until the reply, so one producer's appends to a partition reach
    the server in sequence order even when several threads share the producer.

    ``acked``: the highest sequence number the server said it holds (appended or duplicate), so
    an OUT_OF_ORDER_SEQUENCE_NUMBER that expects a number at or below it means the partition
    lost records it had acknowledged (a failover). ``epoch``: the epoch this numbering is in
    (``None`` until the first send); an allocated producer raises its epoch after such a loss,
    and each partition's numbering starts again from 0 at its next send.
    """

    next: int = 0
    lost_from: int | None = None
    acked: int = -1
    epoch: int | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)


class Producer:
    """Appends records to topic partitions, choosing partitions the way Kafka's producer does.

    ``partitioner``:

    * ``"default"``: Kafka's BuiltInPartitioner. A keyed record goes to
      ``toPositive(murmur2(key)) % partitions``, so every Kafka client agrees on it. Keyless
      records stick to one partition until ``batch_size`` bytes of values went there (Kafka's
      ``batch.size``, the "batch is done" point; an empty value counts one byte), then move to
      another partition at random.
    * ``"round_robin"``: Kafka's RoundRobinPartitioner: every record, keyed or not, to the next
      partition in turn.
    * a callable ``(topic, key, num_partitions) -> partition``.

    An explicit ``partition`` always wins. Partition counts are cached for
    ``metadata_max_age_ms`` (client monotonic time, only used for this cache) and re-read at
    once when a partition looks out of range or a topic unknown. A topic not sent to for
    ``metadata_max_idle_ms`` (Kafka's ``metadata.max.idle.ms``, 5 minutes by default, at least
    5 seconds), or that a read finds gone, loses its cached count, expiration setting and
    keyless sticky partition (one a given ``rng`` chose is kept, as after a fork): a long-lived
    producer that sends to ever new topics (the gateway's) kept them all for good. The
    idempotent numbering is kept (the partition's state may still expect it). The producer is
    thread-safe.

    **Idempotence** (``idempotent=True``, the default, as in Kafka >= 3.0). The producer has an
    id (``producer_id``; ``None`` allocates a unique one from Redis on first use) and an epoch
    (``producer_epoch``), and numbers its records per partition from 0, consecutively. The
    append script keeps, per partition and producer id, the epoch, the last sequence appended
    and the offsets of the last 5 batches, and drops records whose sequence it already has. So
    a call resent by redis-py's ``Retry`` (or run twice by a lost reply) appends nothing twice;
    the duplicate records come back with ``duplicate=True`` and their original offsets (-1 when
    no longer remembered). A lower epoch than the partition has seen raises TopicError
    PRODUCER_FENCED; a sequence gap raises OUT_OF_ORDER_SEQUENCE_NUMBER. A new Producer with the
    same id and epoch that resends the same records in the same order appends nothing twice
    either (a replay; the Spark sink also handles another order, see ``log_appends``); a
    record whose earlier send failed and was skipped as lost is refused with
    OUT_OF_ORDER_SEQUENCE_NUMBER, never reported stored (while the partition still holds the
    producer's state, expired or not: docs/guarantees.md). One with a higher epoch starts again
    from 0. The state expires after the topic's
    ``producer_id_expiration_ms`` without an append. See docs/guarantees.md.
    ``idempotent=False`` appends every call as it comes.

    **Acknowledged records lost by a failover.** Redis replicates asynchronously, so a failover
    can lose an append the producer was told had succeeded, and with it the partition's state
    of that append: the partition then expects a lower sequence than the producer sends. The
    send that finds this raises TopicError OUT_OF_ORDER_SEQUENCE_NUMBER naming the lost
    sequence numbers (those records are gone; this call appended nothing). A producer whose id
    rcoord allocated then raises its epoch, as Kafka's does since KIP-360, so its later sends
    number every partition from 0 again and are appended; ``producer_epoch`` shows the new
    epoch. A producer with a ``producer_id`` of its own keeps its epoch (the caller chose it,
    e.g. the Spark sink's batch id), so that partition refuses it from then on: make a new
    ``Producer`` with a higher ``producer_epoch``.

    **After ``os.fork``** (multiprocessing's fork, a pre-forking server) the child's copy starts
    afresh: new locks (one a parent's thread held would never be released), a keyless sticky
    partition chosen anew with a generator of its own (a given ``rng`` and the sticky partition
    it chose are kept instead: it is seeded for placements that must repeat), and an
    allocated id is replaced by one of the child's own. Parent and child numbering one id
    alike would each have their records taken for the other's duplicates: dropped, and
    reported stored at the other's offsets. A producer with a ``producer_id`` of its own
    cannot be renamed, so it refuses to send in the child: make it in the process that sends.

    ``log_appends`` (named idempotent producers): each partition also keeps the offset ranges
    this producer appended in its current epoch (one line per script call, an ``APPEND``), so a
    later producer under the same id and epoch can read back what was stored
    (``rcoord.topics.epoch_log``) and go on from there with ``resume_sequence``: the Spark
    sink's retried tasks, whose rows may come in another order.

    ``max_request_size`` (Kafka's ``max.request.size``, 1 MiB by default, at most 512 MiB):
    a record whose value, key and headers together are larger is refused with TopicError
    MESSAGE_TOO_LARGE before anything of the call is appended, and one script call carries at
    most this many bytes (and ``MAX_APPEND_PER_CALL`` records), so no call holds its shard for
    long.

    **Slot moves** (a Redis Cluster resharding, ``delivery_timeout_ms``: Kafka's
    ``delivery.timeout.ms``, 2 minutes by default). While a partition's slot migrates, a master
    refuses an append whose keys are split between it and the other (``TRYAGAIN``), and one
    naming a key that does not exist yet (a partition's first producer state, an append log)
    until the move ends; redis-py gives up after about 0.4 s. An idempotent producer sends the
    refused calls again (with the later calls of their partitions), with the same sequence
    numbers, every 100 ms until the move is over or ``delivery_timeout_ms`` ran out (then
    ``ConnectionLost``, saying which of the call's records were appended; counted from the
    send, a wait behind another send to the partition included, so sends queued behind a move
    do not each wait one timeout more); the calls that ran keep their answers, and a record
    that went in anyway is answered as a duplicate, never appended twice. Only the refused
    partitions wait: other sends to those partitions queue behind the refused calls (sequence
    order), those to the call's other partitions go on. A call a node refused with
    ``CLUSTERDOWN`` (a failover under way) is sent again the same way. ``idempotent=False``
    raises ``ConnectionLost`` at once (resending would append twice what other partitions
    took).

    ``clock`` (tests only, like ``GroupCoordinator``'s): milliseconds that replace Redis TIME for
    an idempotent producer's record timestamps and producer state expiry (a producer with
    ``idempotent=False`` stamps its records with TIME: its script takes no clock).
    """

    def __init__(
        self,
        redis_client: Any,
        namespace: str = "rcoord",
        partitioner: Literal["default", "round_robin"] | PartitionerFn = "default",
        *,
        batch_size: int = 16384,
        metadata_max_age_ms: int = 5000,
        metadata_max_idle_ms: int = 300_000,
        rng: random.Random | None = None,
        idempotent: bool = True,
        producer_id: str | None = None,
        producer_epoch: int = 0,
        clock: Callable[[], int] | None = None,
        log_appends: bool = False,
        max_request_size: int = MAX_REQUEST_SIZE,
        delivery_timeout_ms: int = DELIVERY_TIMEOUT_MS,
    ) -> None:
        _check_client(redis_client)
        _check_namespace(namespace)
        if not callable(partitioner) and partitioner not in ("default", "round_robin"):
            raise InvalidRequestError(f"unknown partitioner {partitioner!r}")
        if not isinstance(idempotent, bool):
            raise TypeError(f"idempotent must be bool, got {type(idempotent).__name__}")
        if producer_id is not None:
            if not isinstance(producer_id, str):
                raise TypeError(f"producer_id must be str or None, got {type(producer_id).__name__}")
            _check_producer_id(producer_id)
            if not idempotent:
                raise InvalidRequestError("producer_id only applies with idempotent=True")
        if log_appends and producer_id is None:
            raise InvalidRequestError("log_appends needs a producer_id: the log is read back "
                                      "by a later producer of the same id")
        _check_int("producer_epoch", producer_epoch, 0)
        if producer_epoch > _MAX_EPOCH:
            raise InvalidRequestError(f"producer_epoch must be <= {_MAX_EPOCH}, got {producer_epoch}")
        self._idempotent = idempotent
        self._producer_id = producer_id
        # An allocated id is this producer's alone, so it may raise its epoch (KIP-360).
        self._allocated_id = producer_id is None
        self._epoch = producer_epoch
        self._clock = clock
        self._log_appends = log_appends
        self._id_lock = threading.Lock()
        self._seqs: dict[tuple[str, int], _Sequence] = {}
        self._expiration: dict[str, int] = {}
        self._r = redis_client
        self._ns = namespace
        self._partitioner = partitioner
        self._batch_size = _check_int("batch_size", batch_size, 1)
        self._max_request_size = _check_int("max_request_size", max_request_size, 1)
        if max_request_size > MAX_REQUEST_SIZE_LIMIT:
            raise InvalidRequestError(
                f"max_request_size must be <= {MAX_REQUEST_SIZE_LIMIT} (Redis's largest "
                f"argument by default), got {max_request_size}")
        self._max_age_s = _check_int("metadata_max_age_ms", metadata_max_age_ms, 0) / 1000
        self._delivery_timeout_s = _check_int("delivery_timeout_ms", delivery_timeout_ms, 0) / 1000
        self._max_idle_s = _check_int("metadata_max_idle_ms", metadata_max_idle_ms, 5000) / 1000
        self._monotonic: Callable[[], float] = time.monotonic  # (tests replace it)
        self._rng = rng or random.Random()
        self._own_rng = rng is None
        self._lock = threading.Lock()
        self._counts: dict[str, tuple[int, float]] = {}
        self._sticky: dict[str, tuple[int, int]] = {}  # topic -> (partition, bytes sent to it)
        self._rr: dict[str, int] = {}
        self._used: dict[str, float] = {}  # topic -> when a send last read its metadata
        self._next_sweep = -math.inf  # the first send starts the period
        self._forked: str | None = None  # why a named producer refuses to send (a fork)
        renew_after_fork(self)

    def _after_fork_in_child(self) -> None:
        """Start this copy afresh in a forked child (the class docstring says why)."""
        self._lock = threading.Lock()
        self._id_lock = threading.Lock()
        self._seqs = {}
        if self._own_rng:
            # The parent's generator, copied, made every child pick the parent's keyless
            # partitions in the same order: all of them writing to one partition at a time.
            # (A caller's rng is kept: it is seeded for placements that must repeat.)
            self._rng = random.Random()
            self._sticky = {}
        if not self._idempotent:
            return
        if self._allocated_id:
            self._producer_id = None  # the child's first send allocates its own
        elif self._forked is None:
            self._forked = (
                f"this Producer (producer_id {self._producer_id!r}) was made before the process "
                f"forked, and the parent may send under that id and epoch too: each process's "
                f"records would be taken for the other's duplicates and dropped. Make the "
                f"Producer in the process that sends it (or leave producer_id unset: a forked "
                f"child then gets an id of its own)")

    # -- metadata

    def _num_partitions(self, topic: str, refresh: bool = False) -> int:
        now = self._monotonic()
        with self._lock:
            cached = self._counts.get(topic)
            self._used[topic] = now
            if now >= self._next_sweep:
                self._next_sweep = now + self._max_idle_s
                for idle in [t for t, used in self._used.items()
                             if now - used >= self._max_idle_s]:
                    self._forget_topic(idle)
        if cached is not None and not refresh and now - cached[1] < self._max_age_s:
            return cached[0]
        raw, expiration = self._r.hmget(
            meta_key(self._ns, topic), ["partitions", "producer_id_expiration_ms"])
        if raw is None:
            with self._lock:
                self._forget_topic(topic)
            raise TopicError(Errors.UNKNOWN_TOPIC_OR_PARTITION, topic)
        with self._lock:
            self._counts[topic] = (int(raw), now)
            self._expiration[topic] = (
                PRODUCER_ID_EXPIRATION_MS if expiration is None else int(expiration))
        return int(raw)

    def _forget_topic(self, topic: str) -> None:
        """Drop a topic's metadata (idle for ``metadata_max_idle_ms``, or gone; Kafka's
        ``ProducerMetadata.retainTopic``), with ``self._lock`` held: its next send reads it
        again. The sticky partition a caller's ``rng`` chose stays (it is seeded for placements
        that must repeat), and so do the round-robin counter and the idempotent numbering
        (``_seqs``: the partition's producer state may still expect the next sequence, and a
        fresh start at 0 would have records taken for duplicates of stored ones)."""
        self._counts.pop(topic, None)
        self._expiration.pop(topic, None)
        self._used.pop(topic, None)
        if self._own_rng:
            self._sticky.pop(topic, None)

    # -- idempotence

    @property
    def producer_id(self) -> str | None:
        """The id in use; with ``idempotent=True`` and none given, allocated now if not yet.

        ``None`` only for a non-idempotent producer.
        """
        if self._idempotent and self._producer_id is None:
            self._allocate_producer_id()
        return self._producer_id

    @property
    def producer_epoch(self) -> int:
        return self._epoch

    @property
    def logs_appends(self) -> bool:
        """Whether each partition keeps this producer's append log (``log_appends``)."""
        return self._log_appends

    @property
    def redis_client(self) -> Any:
        return self._r

    @property
    def namespace(self) -> str:
        return self._ns

    @translate_redis_errors
    def partition_count(self, topic: str) -> int:
        """The topic's partition count, from the cache the partitioner uses (Kafka's
        ``partitionsFor``); UNKNOWN_TOPIC_OR_PARTITION if there is no such topic."""
        _check_topic(topic)
        return self._num_partitions(topic)

    @translate_redis_errors
    def choose_partition(self, topic: str, record: ProducerRecord) -> int:
        """The partition a send of ``record`` would append it to, chosen now: its own
        ``partition``, else the partitioner's choice (which moves a sticky or round-robin
        partitioner on, as that send would). Sent with that partition, the record goes there
        without moving the partitioner again.

        For a caller that places records in a fixed order whether or not it sends each: the
        Spark sink places the rows an earlier attempt stored too, so it places the others where
        an attempt in the same order does (``rcoord.spark.write``)."""
        _check_topic(topic)
        # Every check a send makes of one record, so a caller placing records before it sends
        # any (the Spark sink, per topic) finds a bad one before it sends the others': a row
        # over the size or past the partitions failed only when its topic's batch went, after
        # other topics' rows placed before it were appended.
        encoded = _encode_record(record)
        self._check_size(topic, "the record", len(encoded[1]) + len(encoded[2]) + len(encoded[3]))
        n = self._num_partitions(topic)
        if record.partition is not None:
            return self._explicit_partition(topic, record.partition, n)[0]
        return _in_range(topic, self._choose(topic, record, n), n)

    def _check_size(self, topic: str, which: str, size: int) -> None:
        if size > self._max_request_size:
            raise TopicError(Errors.MESSAGE_TOO_LARGE, (
                f"{topic}: {which} is {size} bytes (value, key and headers), more than "
                f"max_request_size {self._max_request_size}; nothing of this call was "
                f"appended"))

    def _explicit_partition(self, topic: str, partition: int, n: int) -> tuple[int, int]:
        """A record's own partition, checked (and the count ``n``, read again if the partition
        is past it: partitions may have been added since it was cached)."""
        p = _check_int("partition", partition, 0)  # (Kafka: non-negative or null)
        if p >= n:
            n = self._num_partitions(topic, refresh=True)
        return _in_range(topic, p, n), n

    @translate_redis_errors
    def _allocate_producer_id(self) -> str:
        """A number from the namespace's counter plus a random part: unique even if the counter
        key is lost, so a new producer can never inherit another's sequence numbers."""
        with self._id_lock:
            if self._producer_id is None:
                (number,) = _run(self._r, [(PRODUCER_ID, [producer_id_counter_key(self._ns)], [])])
                self._producer_id = f"rcoord-{int(number)}-{secrets.token_hex(8)}"
            return self._producer_id

    def resume_sequence(self, topic: str, partition: int, next_sequence: int) -> None:
        """Number this producer's next record to ``partition`` ``next_sequence``, not 0.

        For a producer that takes over an epoch an earlier producer of the same id appended in
        (``rcoord.topics.epoch_log``): its new records follow the stored ones instead of being
        taken for their duplicates. Only before the first send to that partition.
        """
        if not self._idempotent:
            raise InvalidRequestError("resume_sequence is for idempotent producers")
        if self._forked is not None:
            raise InvalidRequestError(self._forked)
        _check_topic(topic)
        _check_int("partition", partition, 0)
        _check_int("next_sequence", next_sequence, 0)
        seq = self._sequence(topic, partition)
        with seq.lock:
            if seq.next != 0:
                raise InvalidRequestError(
                    f"{topic} partition {partition}: this producer has sent records there "
                    f"already (next sequence {seq.next})")
            seq.next = next_sequence
            # The earlier producer's records below it are stored: a loss of them is reported.
            seq.acked = next_sequence - 1

    def _sequence(self, topic: str, partition: int) -> _Sequence:
        with self._lock:
            return self._seqs.setdefault((topic, partition), _Sequence())

    def _now_arg(self) -> str:
        return "" if self._clock is None else str(int(self._clock()))

    def _choose(self, topic: str, rec: ProducerRecord, n: int) -> int:
        if callable(self._partitioner):
            chosen = self._partitioner(topic, rec.key, n)
            # An int, or an int-like such as numpy's (operator.index); not 1.9, which int() cut
            # to 1.
            if isinstance(chosen, bool) or not hasattr(type(chosen), "__index__"):
                raise TypeError(f"the partitioner must return an int partition, got "
                                f"{type(chosen).__name__} {chosen!r}")
            part = operator.index(chosen)
            if part < 0:  # (retried as UNKNOWN_TOPIC_OR_PARTITION, it failed for ever)
                raise InvalidRequestError(
                    f"the partitioner chose partition {part} for topic {topic!r}; a partition "
                    "number is never negative (Kafka's producer refuses it too)")
            return part
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
            # An empty value (a tombstone, a record whose data is in its headers) counts one
            # byte: counted as none, such records never finished a batch and all went to one
            # partition for good (Kafka counts each record's size, never 0).
            self._sticky[topic] = (part, used + max(1, len(rec.value or b"")))
        return part

    # -- sending

    @translate_redis_errors
    def send(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None = None,
        partition: int | None = None,
        headers: Headers | None = None,
    ) -> RecordMetadata:
        """Append one record; its offset and Redis-time timestamp come back.

        ``headers``: a mapping, or a sequence of ``(name, value)`` pairs kept in order with
        repeated names (see ``ProducerRecord``)."""
        return self._send(topic, [ProducerRecord(value, key, partition, headers)])[0]

    @translate_redis_errors
    def send_batch(
        self, topic: str, records: Iterable[ProducerRecord | bytes], *, atomic: bool = False
    ) -> list[RecordMetadata]:
        """Append many records in one pipeline; metadata comes back in the order given.

        Records of one partition go in one script call (per ``MAX_APPEND_PER_CALL``; more are
        several calls, and one that fails leaves those before it appended), so they get
        consecutive offsets in the order given. If a partition vanished meanwhile the other
        partitions' records are still appended and TopicError is raised. The same holds for a
        call Redis refuses (``ServerUnavailable``: READONLY, BUSY, OOM) or a connection lost
        mid-batch (``ConnectionLost``): the refused call appended nothing, but the calls of other
        partitions may have, so a batch spanning partitions can be partly appended (how to
        resend it without duplicates: docs/guarantees.md, "What is not guaranteed").

        ``atomic``: each partition's records go in one script call however many there are, so
        no other producer's records can land between them (more than ``MAX_APPEND_PER_CALL``
        would otherwise be several calls). Kafka's gateway needs it: a Kafka record batch is
        appended whole, and its client computes every record's offset as base + index. The
        caller bounds the batch (the gateway by its frame size), as one call holds the server.
        """
        recs = [r if isinstance(r, ProducerRecord) else ProducerRecord(r) for r in records]
        return self._send(topic, recs, atomic) if recs else []

    def _send(self, topic: str, recs: list[ProducerRecord], atomic: bool = False
              ) -> list[RecordMetadata]:
        _check_topic(topic)
        # Records are checked (and encoded) before a partition is chosen: the partitioner reads
        # the key and the value's length, so a str key failed there with bytes()'s "string
        # argument without an encoding" and an int value with "has no len()".
        encoded = [_encode_record(rec) for rec in recs]
        sizes = [len(e[1]) + len(e[2]) + len(e[3]) for e in encoded]
        for i, size in enumerate(sizes):
            self._check_size(topic, f"record {i}", size)
        n = self._num_partitions(topic)
        parts: list[int] = []
        for rec in recs:
            if rec.partition is not None:
                p, n = self._explicit_partition(topic, rec.partition, n)
            else:
                p = _in_range(topic, self._choose(topic, rec, n), n)  # (a custom partitioner's)
            parts.append(p)

        by_part: dict[int, list[int]] = {}
        for i, p in enumerate(parts):
            by_part.setdefault(p, []).append(i)
        if self._idempotent:
            if atomic:
                raise InvalidRequestError(
                    "atomic appends are for producers that number their own batches: use "
                    "append_idempotent(..., atomic=True), or an idempotent=False Producer")
            return self._send_idempotent(topic, by_part, encoded, sizes)
        calls: list[_Call] = []
        chunks: list[tuple[int, list[int]]] = []
        for p, idxs in by_part.items():
            split = [(0, idxs)] if atomic else self._calls_of(idxs, sizes)
            for _, chunk in split:
                args = [a for i in chunk for a in encoded[i]]
                calls.append((APPEND, [partition_key(self._ns, topic, p),
                                       last_timestamp_key(self._ns, topic, p)], args))
                chunks.append((p, chunk))

        out: list[RecordMetadata | None] = [None] * len(recs)
        failed: list[int] = []
        refused: dict[int, str] = {}  # partition -> why (a stream an XADD by hand broke)
        for (p, chunk), res in zip(chunks, _run(self._r, calls)):
            if res is None:
                continue  # not sent: an earlier chunk of its partition failed
            error = _name(res[0])
            if error == Errors.UNKNOWN_TOPIC_OR_PARTITION:
                failed.append(p)
                continue
            if error != Errors.NONE:
                refused[p] = res[1].decode() if len(res) > 1 else error.name
                continue
            first, ts = _id_offset(res[1]), int(res[2])
            for j, i in enumerate(chunk):
                out[i] = RecordMetadata(topic, p, first + j, ts)
        if failed:
            with self._lock:
                self._forget_topic(topic)
            raise TopicError(Errors.UNKNOWN_TOPIC_OR_PARTITION,
                             f"{topic} partitions {sorted(set(failed))} do not exist")
        if refused:
            raise TopicError(Errors.UNKNOWN_SERVER_ERROR, f"{topic} " + "; ".join(
                f"partition {p}: {why}" for p, why in sorted(refused.items())))
        return [m for m in out if m is not None]

    def _calls_of(self, idxs: list[int], sizes: list[int]) -> list[tuple[int, list[int]]]:
        """One partition's records split into script calls, as (index of the first, records):
        at most ``MAX_APPEND_PER_CALL`` records and ``max_request_size`` bytes each (one record
        over it goes alone; ``_send`` refused larger ones)."""
        out: list[tuple[int, list[int]]] = []
        start, total = 0, 0
        for k, i in enumerate(idxs):
            if k > start and (k - start >= MAX_APPEND_PER_CALL
                              or total + sizes[i] > self._max_request_size):
                out.append((start, idxs[start:k]))
                start, total = k, 0
            total += sizes[i]
        if idxs:
            out.append((start, idxs[start:]))
        return out

    def _send_idempotent(
        self, topic: str, by_part: dict[int, list[int]], encoded: list[list[Any]],
        sizes: list[int],
    ) -> list[RecordMetadata]:
        """Number the records per partition and append them; see the class docstring.

        The partitions' locks are taken in partition order (one topic per call), so two threads
        sending to overlapping partitions cannot deadlock. Each is let go as soon as that
        partition's calls have final answers: a partition that waits out a slot move holds
        only its own sends (Kafka batches per partition), not those to the others of this call.
        """
        if self._forked is not None:
            raise InvalidRequestError(self._forked)
        # delivery_timeout_ms counts from the send, as Kafka's from send(): a send queued
        # behind another waiting out a move (the partition's lock) waited a timeout of its own
        # once its turn came, and each one queued after it one more.
        deadline = time.monotonic() + self._delivery_timeout_s
        pid = self.producer_id
        assert pid is not None
        with self._lock:
            expiration = self._expiration.get(topic)
        if expiration is None:  # forgotten since this send read the count (``_forget_topic``)
            self._num_partitions(topic, refresh=True)
            with self._lock:
                expiration = self._expiration.get(topic, PRODUCER_ID_EXPIRATION_MS)
        order = sorted(by_part)
        seqs = {p: self._sequence(topic, p) for p in order}
        out: list[RecordMetadata | None] = [None] * len(encoded)
        failed: dict[int, tuple[Errors, str, int]] = {}  # partition -> error, why, first seq
        held: list[int] = []  # partitions whose lock this send holds
        try:
            for p in order:
                seqs[p].lock.acquire()
                held.append(p)
            with self._lock:
                epoch = self._epoch
            for p in order:
                seq = seqs[p]
                if seq.epoch is None:
                    seq.epoch = epoch
                elif seq.epoch != epoch:
                    # The epoch was raised (a lost append, below): a new epoch numbers from 0,
                    # and the partition's state starts again when it sees it.
                    seq.epoch, seq.next, seq.lost_from, seq.acked = epoch, 0, None, -1
            now = self._now_arg()
            calls: list[_Call] = []
            chunks: list[tuple[int, int, list[int]]] = []  # partition, first sequence, records
            for p in order:
                idxs, seq = by_part[p], seqs[p]
                lost = "" if seq.lost_from is None else seq.lost_from
                keys = partition_keys(self._ns, topic, p)
                if self._log_appends:
                    keys.append(producer_log_key(self._ns, topic, p, pid))
                for lo, chunk in self._calls_of(idxs, sizes):
                    args = _idempotent_args(now, pid, epoch, seq.next + lo, lost,
                                            expiration, "", [encoded[i] for i in chunk])
                    calls.append((APPEND_IDEMPOTENT, keys, args))
                    chunks.append((p, seq.next + lo, chunk))
            spent: set[int] = set()  # partitions whose numbers are advanced
            left = {p: 0 for p in order}  # partition -> its calls without a final answer
            for p, _, _ in chunks:
                left[p] += 1
            expected: dict[int, int] = {}  # partition -> sequence an OUT_OF_ORDER one expected
            # partition -> "lost"/"unknown": a skipped sequence resent
            skipped: dict[int, str] = {}
            acked: dict[int, int] = {}  # partition -> last sequence the server says it holds

            def settle(answers: list[tuple[int, Any]]) -> None:
                """Take final answers; a partition all of whose calls have one is numbered on
                and let go at once, so other sends to it need not wait for this send's other
                partitions (a slot move can hold one for ``delivery_timeout_ms``)."""
                for k, res in answers:
                    p, first_seq, chunk = chunks[k]
                    left[p] -= 1
                    if res is None:
                        continue  # not sent: an earlier chunk of its partition failed
                    error = _name(res[0])
                    if error != Errors.NONE:
                        if p not in failed:
                            why = res[1].decode() if len(res) > 1 else ""
                            failed[p] = (error, why, first_seq)
                            if error == Errors.OUT_OF_ORDER_SEQUENCE_NUMBER and len(res) > 2:
                                expected[p] = int(res[2])
                                if len(res) > 3:
                                    skipped[p] = res[3].decode()
                        continue
                    acked[p] = max(acked.get(p, -1), first_seq + len(chunk) - 1)
                    first = _id_offset(res[1]) if res[1] else -1
                    ts, dup = int(res[2]), int(res[3])
                    for j, i in enumerate(chunk):
                        if j < dup:
                            out[i] = RecordMetadata(topic, p, int(res[4][j]), int(res[5][j]), True)
                        else:
                            out[i] = RecordMetadata(topic, p, first + j - dup, ts)
                for p in order:
                    if left[p] or p in spent:
                        continue
                    seq = seqs[p]
                    seq.acked = max(seq.acked, acked.get(p, -1))
                    if p in expected:
                        error, why, first_seq = failed[p]
                        failed[p] = (error, self._out_of_order(epoch, seq, expected[p], why,
                                                               skipped.get(p)), first_seq)
                    lost_at = failed[p][2] if p in failed else None
                    self._spend(seq, len(by_part[p]), lost_at)
                    spent.add(p)
                    held.remove(p)
                    seq.lock.release()

            try:
                _run_through_slot_moves(self._r, calls, max(0.0, deadline - time.monotonic()),
                                        settle)
            except BaseException as exc:
                # Unknown outcome (the connection failed, the move outlasted the delivery
                # timeout, or an exception such as a signal handler's came after the calls ran,
                # before their numbers were advanced): the numbers are spent either way, and
                # may be missing. Left unspent, the next send reused them and its records were
                # dropped as duplicates. (Partitions let go already are another send's now.)
                waiting = [p for p in order if p not in spent]
                for p in waiting:
                    # From past the calls the server answered stored (a move that let the
                    # first through): declared lost from the send's first number, a stored
                    # record's number was taken for one of unknown outcome once the state had
                    # expired, and a replay of it was refused, not answered duplicate.
                    self._spend(seqs[p], len(by_part[p]),
                                max(seqs[p].next, acked.get(p, -1) + 1))
                if not isinstance(exc, SlotMoveOutlasted):
                    raise
                # (It read "slot unavailable for now (TTL exhausted.)": redis-py's first
                # refusal, as if nothing had waited, and no word of what was stored.)
                done = [p for p in order if p in spent and p not in failed]
                stored = f"; its records to partition(s) {done} were" if done else ""
                # A waiting partition's records in several calls: those the move let through
                # before it split the keys were appended (it said none were: resent, they
                # were stored twice).
                partly = []
                for p in waiting:
                    seqs[p].acked = max(seqs[p].acked, acked.get(p, -1))
                    if got := _partly_appended(by_part[p], out):
                        partly.append(f"partition {p}: {got}")
                appended = ("this call's records to those partitions were not appended"
                            if not partly else "of this call's records to those partitions, "
                            + "; ".join(partly) + "; the others were not appended")
                # The partitions that refused their records in the same call (fenced, out of
                # order, gone): their errors were dropped, so the caller, told only what
                # was and was not appended of the others, never learnt of those records.
                refused = "".join(
                    f"; partition {p} refused its records ({e.name}{': ' + why if why else ''})"
                    for p, (e, why, _) in sorted(failed.items()))
                if any(e == Errors.UNKNOWN_TOPIC_OR_PARTITION for e, _, _ in failed.values()):
                    with self._lock:
                        self._forget_topic(topic)
                raise ConnectionLost(
                    f"{topic} partition(s) {waiting}: a slot move or failover refused the "
                    f"append until delivery_timeout_ms ({self._delivery_timeout_s * 1000:.0f} "
                    f"ms, counted from the send) ran out ({exc.__cause__}); {appended} (the "
                    f"next send goes on past them){stored}{refused}") from exc
        finally:
            for p in held:
                seqs[p].lock.release()
        if failed:
            if any(e == Errors.UNKNOWN_TOPIC_OR_PARTITION for e, _, _ in failed.values()):
                with self._lock:
                    self._forget_topic(topic)
            worst = min(failed.values(), key=lambda f: _rank(f[0]))[0]
            # A partition whose records went in several calls, refused after the first was
            # stored: told only of the refusal, a caller resending them stored those twice.
            detail = "; ".join(
                f"partition {p}: {why or e.name}"
                + (f" ({some})" if (some := _partly_appended(by_part[p], out)) else "")
                for p, (e, why, _) in sorted(failed.items()))
            raise TopicError(worst, f"{topic} {detail}")
        return [m for m in out if m is not None]

    def _out_of_order(self, epoch: int, seq: _Sequence, expected: int, why: str,
                      skipped: str | None) -> str:
        """The message of an OUT_OF_ORDER_SEQUENCE_NUMBER refusal, and for an allocated id the
        recovery: the epoch goes up by one, so every partition numbers from 0 again (Kafka's
        KIP-360 epoch bump). Called with the partition's lock held, after its append.

        ``skipped``: the call resent a sequence the partition skipped as lost ("lost": never
        appended; "unknown": maybe appended), a replay of a failed call's records. The
        producer's own numbering is unharmed then: nothing to recover. "This call appended
        nothing" holds for a call split in several script calls too: they stop at the refused
        one (``_run``), and those before it resent sequences the partition had."""
        if skipped == "lost":
            return (f"{why}. This call appended nothing; to store that record, send it with a "
                    f"new Producer with a higher producer_epoch")
        if skipped is not None:
            return (f"{why}. This call appended nothing; sending that record under a higher "
                    f"producer_epoch stores it, a second time if it was stored")
        if expected <= seq.acked:
            what = (f"the partition lost records this producer was told were stored: sequences "
                    f"{expected}..{seq.acked} of epoch {epoch} are missing (a failover to a "
                    f"replica that had not received them, or older data restored). Those "
                    f"records are gone; this call appended nothing ({why})")
        else:
            what = why
        if self._allocated_id and epoch < _MAX_EPOCH:
            with self._lock:
                if self._epoch == epoch:
                    self._epoch = epoch + 1
            return (f"{what}. The producer moved to epoch {epoch + 1}: its later sends number "
                    f"from 0 again and are appended; send the lost records again if they must "
                    f"be stored")
        return (f"{what}. Producer id {self._producer_id} cannot append to this partition again "
                f"at epoch {epoch}: use a new Producer with a higher producer_epoch (or no "
                f"producer_id, so that one is allocated), and send the lost records again if "
                f"they must be stored")

    @staticmethod
    def _spend(seq: _Sequence, count: int, lost_at: int | None) -> None:
        """Advance past ``count`` numbers; remember the lowest one that may be missing, or
        forget the old one once an append went through."""
        seq.next += count
        if lost_at is None:
            seq.lost_from = None
        elif seq.lost_from is None:
            seq.lost_from = lost_at




def _partly_appended(idxs: list[int], out: list[RecordMetadata | None]) -> str:
    """What a partition's failed send stored, when its first calls were (its records ``idxs``
    in several calls): a caller told the send failed would resend those and store them twice.
    Empty when none was."""
    got = [m for m in (out[i] for i in idxs) if m is not None]
    if not got:
        return ""
    return (f"{len(got)} of its {len(idxs)} records were appended (offsets "
            f"{min(m.offset for m in got)}..{max(m.offset for m in got)}), the rest not")


def _idempotent_args(now: str, producer_id: str, epoch: int, first_sequence: int,
                     lost_from: int | str, expiration: int, modulus: int | str,
                     records: Sequence[list[Any]]) -> list[Any]:
    """ARGV of one ``topic_append_idempotent.lua`` call (its header lists them): the one place
    both the ``Producer`` and ``append_idempotent`` (the gateway's) lay them out. ``modulus``
    is "" for rcoord's unbounded sequences, ``KAFKA_SEQUENCE_MODULUS`` for a Kafka producer's."""
    return [now, producer_id, epoch, first_sequence, lost_from, expiration,
            PRODUCER_PRUNE_PER_CALL, modulus, *(a for rec in records for a in rec)]


def _check_producer_id(producer_id: str) -> None:
    """The id's size is its UTF-8 bytes (its length in characters was reported, so a
    1,000-character id of accented letters was "1..1024 bytes, got 1000"); one that is not
    UTF-8 (a lone surrogate) is refused by name, not with the codec's traceback."""
    try:
        size = len(producer_id.encode())
    except UnicodeEncodeError as exc:
        raise InvalidRequestError(
            f"producer_id {producer_id!r} is not valid UTF-8 ({exc.reason})") from None
    if not 0 < size <= _MAX_PRODUCER_ID_LEN:
        raise InvalidRequestError(
            f"producer_id must be 1..{_MAX_PRODUCER_ID_LEN} bytes of UTF-8, got {size}")


def _rank(error: Errors) -> int:
    return _SEVERITY.index(error) if error in _SEVERITY else len(_SEVERITY)


# -- appends numbered by the caller ------------------------------------------------------------


@translate_redis_errors
def allocate_producer_number(redis_client: Any, namespace: str = "rcoord") -> int:
    """The next number of the namespace's producer id counter (the one ``Producer`` uses).

    For a front end that must hand out producer ids of its own shape (the Kafka gateway's are
    64-bit integers); it adds a random part, as ``Producer`` does, so a reset counter cannot
    make a new producer inherit an old one's sequence numbers.
    """
    _check_client(redis_client)
    _check_namespace(namespace)
    (number,) = _run(redis_client, [(PRODUCER_ID, [producer_id_counter_key(namespace)], [])])
    return int(number)


@translate_redis_errors
def append_idempotent(
    redis_client: Any,
    namespace: str,
    topic: str,
    partition: int,
    records: Iterable[ProducerRecord | bytes],
    *,
    producer_id: str,
    producer_epoch: int,
    base_sequence: int,
    lost_from: int | None = None,
    producer_id_expiration_ms: int | None = None,
    clock: Callable[[], int] | None = None,
    atomic: bool = False,
    wrapping: bool = False,
) -> list[RecordMetadata]:
    """Append one batch of an idempotent producer that numbers its records itself.

    ``Producer`` numbers its own records; a front end whose clients already do (Kafka's
    producers send a producer id, an epoch and a base sequence with every batch, and resend the
    batch unchanged on a retry) calls this instead, so the same script decides: records
    ``base_sequence .. base_sequence + n - 1`` of ``(producer_id, producer_epoch)`` go to
    ``partition`` at most once. The result is one ``RecordMetadata`` per record, in order;
    records the partition already had come back with ``duplicate=True`` and their original
    offset and timestamp (-1 once the batch is no longer among the last 5 remembered; never
    with ``wrapping``). Raises
    TopicError PRODUCER_FENCED (an older epoch than the partition has seen),
    OUT_OF_ORDER_SEQUENCE_NUMBER (a gap) or UNKNOWN_TOPIC_OR_PARTITION; the script call that
    raises appended nothing, but without ``atomic`` a batch of more than
    ``MAX_APPEND_PER_CALL`` records goes in several calls, and those before it stay appended
    (a resend of the batch finds them as duplicates). ``lost_from``: see ``Producer`` (the
    lowest sequence the caller may have lost, so the gap is accepted once).
    ``producer_id_expiration_ms``: the topic's setting, read from Redis
    when None. ``clock``: tests only, as for ``Producer``. The batch's ``partition`` fields are
    ignored: every record goes to ``partition``. ``atomic``: the whole batch in one script
    call (see ``Producer.send_batch``), so nothing lands between its records and it is
    remembered as one batch for deduplication, as Kafka does; the caller bounds its size.
    ``wrapping``: sequences are a Kafka producer's, ``0 .. 2**31 - 1`` with 0 after the top
    (a batch may span it), and are compared modulo ``KAFKA_SEQUENCE_MODULUS``: a sequence is a
    retry, the next one or a gap by its distance from the next expected, within 2**30 either
    way (the script keeps them unwrapped). ``lost_from`` is not taken then (Kafka producers
    resend instead), and duplicates are Kafka's: only a call that is exactly one of the last 5
    remembered (same first and last sequence) is a duplicate, and any other at or below the
    last sequence raises OUT_OF_ORDER_SEQUENCE_NUMBER (a Kafka producer resends batches whole;
    a sequence below the last is not proof of an append, since a producer's state may start
    past it).
    """
    _check_client(redis_client)
    _check_namespace(namespace)
    _check_topic(topic)
    _check_int("partition", partition, 0)
    if not isinstance(producer_id, str):
        raise TypeError(f"producer_id must be str, got {type(producer_id).__name__}")
    _check_producer_id(producer_id)
    _check_int("producer_epoch", producer_epoch, 0)
    _check_int("base_sequence", base_sequence, 0)
    if not isinstance(wrapping, bool):
        raise TypeError(f"wrapping must be bool, got {type(wrapping).__name__}")
    if wrapping:
        if base_sequence >= KAFKA_SEQUENCE_MODULUS:
            raise InvalidRequestError(
                f"base_sequence must be < {KAFKA_SEQUENCE_MODULUS} with wrapping=True, "
                f"got {base_sequence}")
        if lost_from is not None:
            raise InvalidRequestError("lost_from does not apply with wrapping=True")
    recs = [r if isinstance(r, ProducerRecord) else ProducerRecord(r) for r in records]
    if not recs:
        return []
    last_sequence = len(recs) - 1 + (0 if wrapping else base_sequence)
    for name, value in (("producer_epoch", producer_epoch), ("base_sequence", last_sequence)):
        if value > _MAX_EPOCH:
            raise InvalidRequestError(f"{name} must be <= {_MAX_EPOCH}, got {value}")
    if lost_from is not None:
        _check_int("lost_from", lost_from, 0)
    if producer_id_expiration_ms is None:
        raw = redis_client.hget(meta_key(namespace, topic), "producer_id_expiration_ms")
        expiration = PRODUCER_ID_EXPIRATION_MS if raw is None else int(raw)
    else:
        expiration = _check_int("producer_id_expiration_ms", producer_id_expiration_ms, 1)
    encoded = [_encode_record(rec) for rec in recs]
    now = "" if clock is None else str(int(clock()))
    lost = "" if lost_from is None else lost_from
    keys = partition_keys(namespace, topic, partition)
    step = len(recs) if atomic else MAX_APPEND_PER_CALL
    calls: list[_Call] = []
    modulus = KAFKA_SEQUENCE_MODULUS if wrapping else ""
    for lo in range(0, len(recs), step):
        chunk = encoded[lo : lo + step]
        first = (base_sequence + lo) % KAFKA_SEQUENCE_MODULUS if wrapping else base_sequence + lo
        args = _idempotent_args(now, producer_id, producer_epoch, first, lost, expiration,
                                modulus, chunk)
        calls.append((APPEND_IDEMPOTENT, keys, args))
    out: list[RecordMetadata] = []
    for lo, res in zip(range(0, len(recs), step), _run(redis_client, calls)):
        error = _name(res[0])  # (a call after a failed one is not sent: this raises first)
        if error != Errors.NONE:
            why = res[1].decode() if len(res) > 1 else ""
            raise TopicError(error, f"{topic} partition {partition}: {why or error.name}")
        first = _id_offset(res[1]) if res[1] else -1
        ts, dup = int(res[2]), int(res[3])
        for j in range(min(step, len(recs) - lo)):
            if j < dup:
                out.append(RecordMetadata(topic, partition, int(res[4][j]), int(res[5][j]), True))
            else:
                out.append(RecordMetadata(topic, partition, first + j - dup, ts))
    return out


def _in_range(topic: str, partition: int, count: int) -> int:
    if not 0 <= partition < count:
        raise TopicError(Errors.UNKNOWN_TOPIC_OR_PARTITION,
                         f"{topic} has no partition {partition} (count {count})")
    return partition
