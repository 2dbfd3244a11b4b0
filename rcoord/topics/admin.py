"""Topics administration: create, grow, describe, delete, list, change settings, apply
retention, delete records."""

from __future__ import annotations

import re
import threading
import time
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

import redis.exceptions

from ..errors import ConnectionLost, Errors, reraise_as_rcoord, translate_redis_errors
from ._base import (
    ALTER_META,
    CREATE_META,
    DELETE_RECORDS,
    GROW_META,
    MAKE,
    PRODUCER_ID_EXPIRATION_MS,
    PRODUCER_TTL,
    RETENTION,
    RETENTION_SCAN,
    RETENTION_SCAN_BYTES,
    RETENTION_TRIM_BYTES,
    DeletedRecords,
    PartitionInfo,
    TopicDescription,
    TopicError,
    _check_client,
    _check_int,
    _check_namespace,
    _check_topic,
    _foreign_ids,
    _name,
    _offsets_of,
    _opt_int,
    _run,
    _run_through_slot_moves,
    creation_token_key,
    last_timestamp_key_of,
    legal_topic,
    make_keys,
    meta_key,
    partition_key,
    producer_log_key,
    producer_state_keys,
    read_pipelined,
)
from .configs import SETTINGS, check_settings

ADMIN_TIMEOUT_MS = 60_000
"""How long an admin call waits through a slot move before it raises ``ConnectionLost``
(Kafka's ``default.api.timeout.ms``)."""
MAX_PARTITIONS_PER_CALL = 10_000
"""Most partitions one create or add_partitions makes: Kafka's controller refuses an operation
of more than 10,000 records (QuorumController's MAX_RECORDS_PER_USER_OP). Unbounded, a typo of
100,000,000 registered the topic and then ran for hours making its streams, and every later
describe or metadata request walked that many partitions."""

CREATION_MILLISECOND_S = 0.0015
"""How long ``create`` lets pass after its metadata script answered before it returns: past
one millisecond, so the server's clock has left the topic's ``created_ms``, with room for the
two clocks' rates."""

# -- topics -----------------------------------------------------------------------------------


class DeleteRecordsIncomplete(ConnectionLost):
    """``Topics.delete_records`` lost Redis partway (a partition's slot with no master, a
    dropped connection): ``done`` holds the answers of the partitions it finished, as the call
    would have returned them, ``unfinished`` the offset to ask again of each other partition
    (which may have been trimmed some way already). A -1 the caller asked is resolved to the log
    end before anything is removed, so an offset there keeps, asked again, the records appended
    since; a -1 stays only where Redis was lost before that read, when nothing was removed. It
    raised a bare ``ConnectionLost``
    before, and its caller took the whole call for failed though some partitions' records were
    gone; Kafka's AdminClient answers each partition on its own."""

    def __init__(self, message: str, done: dict[int, DeletedRecords],
                 unfinished: dict[int, int]) -> None:
        self.reason, self.done, self.unfinished = message, done, unfinished
        super().__init__(f"{message} (partitions done: {sorted(done) or 'none'}; not done, "
                         f"to ask again: {unfinished})")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.reason, self.done, self.unfinished))


class LogStarts(dict[int, int]):
    """``Topics.apply_retention``'s answer, partition -> log start offset, with ``unfinished``:
    the partitions a stop left with rounds to go (their scripts answered "more to do"), empty
    when the trim is done. A dict still, so callers that read only the offsets are unchanged;
    the coordinator service counts a topic applied only when ``done``. Before, the answer did
    not say, and a trim that finished in the round the stop came was counted as cut short."""

    def __init__(self, starts: dict[int, int], unfinished: Iterable[int] = ()) -> None:
        super().__init__(sorted(starts.items()))
        self.unfinished = tuple(sorted(unfinished))

    @property
    def done(self) -> bool:
        return not self.unfinished


class Topics:
    """Create, grow, describe, list and delete topics, change their settings, and apply their
    retention.

    Topic-level steps touch several slots (the metadata hash and every partition stream), so
    they are ordered so that a crash leaves nothing a retry cannot mend: ``create`` claims the
    metadata first (the one atomic "does it exist" decision), then makes the streams;
    ``delete`` removes the streams first and the metadata last, so a half-deleted topic is
    still listed and ``delete`` can simply be called again. A ``create`` that failed after
    its claim leaves a listed topic whose missing partitions ``describe`` reports as
    UNKNOWN_TOPIC_OR_PARTITION; ``create`` again makes them (and answers TOPIC_ALREADY_EXISTS,
    as Kafka's does to the retry of a create that went through). A step resent by
    redis-py after a lost reply is not a crash: each ``create`` call carries a token of its own,
    so its resent claim succeeds again and its resent partition step leaves alone the partitions
    it already made (and the records producers appended since).
    """

    def __init__(self, redis_client: Any, namespace: str = "rcoord") -> None:
        _check_client(redis_client)
        _check_namespace(namespace)
        self._r = redis_client
        self._ns = namespace

    @staticmethod
    def check_create(topic: str, partitions: int, *, retention_records: int | None = None,
                     retention_ms: int | None = None,
                     producer_id_expiration_ms: int | None = None) -> None:
        """What ``create`` refuses before it writes anything (the name, the count, the
        settings), without asking Redis: Kafka's CreateTopics with ``validate_only`` answers
        these as the real create would."""
        _check_topic(topic)
        if not isinstance(partitions, int) or isinstance(partitions, bool) or partitions < 1:
            raise TopicError(Errors.INVALID_PARTITIONS, f"partitions must be >= 1: {partitions!r}")
        if partitions > MAX_PARTITIONS_PER_CALL:
            raise TopicError(Errors.INVALID_PARTITIONS,
                             f"partitions must be <= {MAX_PARTITIONS_PER_CALL} in one call: "
                             f"{partitions}")
        check_settings({"retention_records": retention_records, "retention_ms": retention_ms,
                        "producer_id_expiration_ms": producer_id_expiration_ms})

    @translate_redis_errors
    def create(
        self,
        topic: str,
        partitions: int,
        *,
        retention_records: int | None = None,
        retention_ms: int | None = None,
        producer_id_expiration_ms: int | None = None,
    ) -> None:
        """Kafka's CreateTopics: TOPIC_ALREADY_EXISTS, INVALID_PARTITIONS (< 1), INVALID_CONFIG.

        ``producer_id_expiration_ms`` (Kafka's ``producer.id.expiration.ms``, a broker setting
        there): how long an idempotent producer's state in this topic's partitions outlives its
        last append; ``None`` means Kafka's default, 1 day. It is a topic setting so that every
        producer of the topic applies the same expiry.

        TOPIC_ALREADY_EXISTS comes once the existing topic's partitions that have no stream
        were made (``_finish_partitions``): so retrying a create that failed partway (raised
        ConnectionLost after its claim) leaves a whole topic.
        """
        self.check_create(topic, partitions, retention_records=retention_records,
                          retention_ms=retention_ms,
                          producer_id_expiration_ms=producer_id_expiration_ms)
        # One token per call: redis-py resends a script whose reply was lost (its default
        # Retry), and the resent call must know it is the same create, not a second one.
        token = uuid.uuid4().hex
        (res,) = _run(self._r, [(CREATE_META, [meta_key(self._ns, topic)], [
            partitions,
            "" if retention_records is None else retention_records,
            "" if retention_ms is None else retention_ms,
            "" if producer_id_expiration_ms is None else producer_id_expiration_ms,
            token,
        ])])
        if _name(res[0]) != Errors.NONE:
            if _name(res[0]) == Errors.TOPIC_ALREADY_EXISTS and self._finish_partitions(topic):
                raise TopicError(Errors.TOPIC_ALREADY_EXISTS,
                                 f"{_queued_for_deletion(topic)}, then create it")
            raise TopicError(_name(res[0]), topic)
        stamped = time.monotonic()
        # The name is ours now; drop whatever a crashed delete of an older topic left behind,
        # but never what this create made (a resent MAKE finds its token and does nothing).
        _run(self._r, [(MAKE, make_keys(self._ns, topic, p), ["reset", token])
                       for p in range(partitions)])
        # A commit stamped in the topic's ``created_ms`` counts as one of a deleted topic of
        # this name (``rcoord.topics.incarnation``), so return only once that millisecond is
        # over on the server: the script ran before the reply came, so its clock has moved on
        # by at least the time waited since. A commit made once create() returned is then the
        # new topic's (on another master, up to the masters' clock skew).
        left = CREATION_MILLISECOND_S - (time.monotonic() - stamped)
        if left > 0:
            time.sleep(left)

    def _finish_partitions(self, topic: str) -> bool:
        """Make the partitions of an existing ``topic`` that have no stream, with its creation
        token (``topic_make``'s 'ensure': a stream there is left as it is), before ``create``
        answers TOPIC_ALREADY_EXISTS; True, making nothing, when the topic is marked for
        deletion (``delete``'s first write): the streams missing there are the ones a delete
        that stopped partway removed, and making them again empty would pass that half-deleted
        topic off as a whole one, its other partitions keeping the old records.

        Why: a ``create`` whose partition step failed after its claim (a partition's slot
        migrating refuses the multi-key make with TRYAGAIN until redis-py gives up, which is
        ConnectionLost, retriable) left a listed topic without those partitions; its retry,
        like a Kafka client's "create unless it exists", got TOPIC_ALREADY_EXISTS and went on
        with a topic whose partitions answered UNKNOWN_TOPIC_OR_PARTITION until a delete. A
        ``create`` still making them meanwhile finds its token on them and leaves them alone.
        A topic deleted meanwhile may keep an empty stream, which a later ``create`` of the
        name drops and ``add_partitions`` replaces (as after a crashed delete)."""
        count, token, deleting = self._r.hmget(meta_key(self._ns, topic),
                                               ["partitions", "create_token", "deleting"])
        if count is None:
            return False  # (deleted meanwhile)
        if deleting is not None:
            return True
        _run(self._r, [(MAKE, make_keys(self._ns, topic, p), ["ensure", _text(token or b"")])
                       for p in range(int(count))])
        return False

    @translate_redis_errors
    def add_partitions(self, topic: str, new_total: int) -> None:
        """Kafka's CreatePartitions: grow to ``new_total``; INVALID_PARTITIONS unless it grows.

        The new streams are made before the count is raised, so no producer is ever told about
        a partition that does not exist yet. Each carries the topic's creation token. One that
        exists with this topic's token is kept: a concurrent ``add_partitions`` may already
        have announced it and received records. One with another token (or none) was left by
        an older topic of the same name (a ``delete`` that raced an ``add_partitions``) and is
        replaced, records and producer state, once the topic is read again and is still this
        one (so the stream cannot be a newer topic's). Raising the count carries a token of
        this call, so when redis-py resends it after a lost reply, the resend is not taken for a
        second request and answered INVALID_PARTITIONS; it also carries the creation token, so a
        topic deleted (and perhaps created again) meanwhile is UNKNOWN_TOPIC_OR_PARTITION. A
        topic marked for deletion (a ``delete`` that stopped partway) is INVALID_TOPIC_EXCEPTION,
        as Kafka answers for a topic queued for deletion: grown, it would get partitions the
        delete that finishes it may not see.
        """
        _check_topic(topic)
        _check_int("new_total", new_total, 1)
        if self._r.hexists(meta_key(self._ns, topic), "deleting"):  # (again in GROW_META)
            raise TopicError(Errors.INVALID_TOPIC_EXCEPTION, _queued_for_deletion(topic))
        current, token = self._count_and_token(topic)
        self.check_growth(topic, current, new_total)
        made = _run(self._r, [(MAKE, make_keys(self._ns, topic, p), ["ensure", token])
                              for p in range(current, new_total)])
        leftovers = {p: _text(res[1]) for p, res in zip(range(current, new_total), made)
                     if int(res[0]) < 0}
        if leftovers:
            # Streams of another topic of this name. The topic read now is still the one read
            # above, and it was made after whatever made those streams (a newer topic's could
            # only have been made after this one's metadata went), so they are leftovers:
            # replace each if it still carries the token seen.
            if self._count_and_token(topic)[1] != token:
                raise TopicError(Errors.UNKNOWN_TOPIC_OR_PARTITION,
                                 f"{topic} was deleted during add_partitions")
            replaced = _run(self._r, [(MAKE, make_keys(self._ns, topic, p),
                                       ["replace", token, seen])
                                      for p, seen in leftovers.items()])
            if any(int(res[0]) < 0 for res in replaced):
                raise TopicError(Errors.UNKNOWN_TOPIC_OR_PARTITION,
                                 f"{topic}: partitions changed hands during add_partitions")
        # A token per call, as in ``create``: a resend of this very call is not a request for
        # the count the topic already has.
        (res,) = _run(self._r, [(GROW_META, [meta_key(self._ns, topic)],
                                 [new_total, uuid.uuid4().hex, token])])
        if _name(res[0]) == Errors.UNKNOWN_TOPIC_OR_PARTITION:
            raise TopicError(Errors.UNKNOWN_TOPIC_OR_PARTITION,
                             f"{topic} was deleted during add_partitions")
        if _name(res[0]) == Errors.INVALID_TOPIC_EXCEPTION:
            raise TopicError(Errors.INVALID_TOPIC_EXCEPTION, _queued_for_deletion(topic))
        if _name(res[0]) != Errors.NONE:
            raise TopicError(_name(res[0]), f"{topic} has {res[1]} partitions")

    @staticmethod
    def check_growth(topic: str, current: int, new_total: int) -> None:
        """What ``add_partitions`` refuses of growing ``topic`` from ``current`` partitions to
        ``new_total`` (INVALID_PARTITIONS), without doing it: for a request that only
        validates (Kafka's CreatePartitions with ``validate_only``)."""
        if new_total <= current:
            raise TopicError(Errors.INVALID_PARTITIONS,
                             f"{topic} has {current} partitions; cannot go to {new_total}")
        if new_total - current > MAX_PARTITIONS_PER_CALL:
            raise TopicError(Errors.INVALID_PARTITIONS,
                             f"{topic} has {current} partitions; at most "
                             f"{MAX_PARTITIONS_PER_CALL} more in one call, not "
                             f"{new_total - current}")

    @translate_redis_errors
    def alter_configs(self, topic: str, settings: Mapping[str, int | None], *,
                      replace: bool = False, validate_only: bool = False) -> None:
        """Change a topic's settings (Kafka's IncrementalAlterConfigs; with ``replace``, its
        legacy AlterConfigs): ``settings`` maps a setting's name (a keyword of ``create``) to
        its new value, or to None for its default again; with ``replace=True`` every setting
        not named goes back to its default too.

        Every name and value is checked before anything is written (INVALID_CONFIG), and the
        change is one script on the metadata hash: all of it lands or none. A topic that does
        not exist is UNKNOWN_TOPIC_OR_PARTITION. ``validate_only`` checks (the topic's
        existence too) and writes nothing.

        A change of ``producer_id_expiration_ms`` then moves the partitions' producer state
        expiry times, waiting through a slot move for up to ``ADMIN_TIMEOUT_MS`` (Kafka's
        ``default.api.timeout.ms``) before ``ConnectionLost`` (run it again: the same call
        completes it).

        Who reads a setting sees a change at its next read: retention at the service's next
        pass, a ``Producer`` when its metadata is older than ``metadata_max_age_ms``.
        """
        _check_topic(topic)
        if not isinstance(settings, Mapping):
            raise TypeError(f"settings must be a mapping, got {type(settings).__name__}")
        check_settings(settings)
        changes = dict.fromkeys((s.field for s in SETTINGS), None) if replace else {}
        changes.update(settings)
        key = meta_key(self._ns, topic)
        if validate_only:
            if not self._r.hexists(key, "partitions"):
                raise TopicError(Errors.UNKNOWN_TOPIC_OR_PARTITION, topic)
            return
        args = [part for field, value in changes.items()
                for part in (field, "" if value is None else value)]
        (res,) = _run(self._r, [(ALTER_META, [key], args)])
        if _name(res[0]) != Errors.NONE:
            raise TopicError(_name(res[0]), topic)
        if "producer_id_expiration_ms" in changes:
            # The partitions' producer state keys expire the old setting's time after their
            # last idempotent append (topic_append_idempotent.lua): a raise extends them, or a
            # resent batch would find its producer's state gone before the new setting expires
            # it, and be appended twice (topic_producer_ttl.lua).
            # So are the producers' append logs (Producer(log_appends=True)): kept at the old
            # time, a Spark task retried between the two found its producer's state but no
            # log (epoch_appends: not complete) and could store its rows a second time.
            # Through a slot move: the logs of producers that never logged do not exist, and
            # a script naming a missing key is refused for the whole move (the setting, already
            # written, would otherwise stand with the keys' times not moved).
            expiration = changes["producer_id_expiration_ms"]
            count = self._r.hget(key, "partitions")
            if count is not None:
                new = PRODUCER_ID_EXPIRATION_MS if expiration is None else expiration
                states = [producer_state_keys(self._ns, topic, p) for p in range(int(count))]
                pipe = self._r.pipeline(transaction=False)
                for _, activity in states:
                    pipe.zrange(activity, 0, -1)
                pids = [[_text(pid) for pid in got] for got in pipe.execute()]
                done = _run_through_slot_moves(self._r, [
                    (PRODUCER_TTL, [*state, *(producer_log_key(self._ns, topic, p, pid)
                                              for pid in pids[p])], [new, *pids[p]])
                    for p, state in enumerate(states)], ADMIN_TIMEOUT_MS / 1000)
                # Producers that first appended between the read above and the script (one
                # round trip) started their logs with the setting they had read, perhaps the
                # old one: their logs too. Once: each append since reads the stored setting.
                late = {p: [_text(pid) for pid in res[1]] for p, res in enumerate(done)
                        if res[1]}
                _run_through_slot_moves(self._r, [
                    (PRODUCER_TTL, [*states[p], *(producer_log_key(self._ns, topic, p, pid)
                                                  for pid in got)], [new, *got])
                    for p, got in late.items()], ADMIN_TIMEOUT_MS / 1000)

    def _count_and_token(self, topic: str) -> tuple[int, str]:
        """The partition count and the creation token, read together (one HMGET)."""
        count, raw = self._r.hmget(meta_key(self._ns, topic), ["partitions", "create_token"])
        if count is None:
            raise TopicError(Errors.UNKNOWN_TOPIC_OR_PARTITION, topic)
        return int(count), "" if raw is None else _text(raw)

    @translate_redis_errors
    def partition_count(self, topic: str) -> int:
        _check_topic(topic)
        raw = self._r.hget(meta_key(self._ns, topic), "partitions")
        if raw is None:
            raise TopicError(Errors.UNKNOWN_TOPIC_OR_PARTITION, topic)
        return int(raw)

    @translate_redis_errors
    def partition_counts(self, topics: Iterable[str]) -> dict[str, int]:
        """``partition_count`` of several topics in one pipeline (a round trip per node);
        topics that do not exist are left out. An illegal name raises ``TopicError``
        (INVALID_TOPIC_EXCEPTION) before anything is read."""
        names = list(dict.fromkeys(topics))
        for topic in names:
            _check_topic(topic)
        if not names:
            return {}
        replies = read_pipelined(self._r, [("HGET", meta_key(self._ns, topic), "partitions")
                                           for topic in names])
        return {t: int(raw) for t, raw in zip(names, replies, strict=True) if raw is not None}

    @translate_redis_errors
    def marked_for_deletion(self, topics: Iterable[str]) -> list[str]:
        """Those of ``topics`` a ``delete`` began and has not finished (``describe``'s
        ``marked_for_deletion``), sorted, in one pipeline (a round trip per node): so a
        listing can say so without describing every topic."""
        names = sorted(set(topics))
        for topic in names:
            _check_topic(topic)
        if not names:
            return []
        marks = read_pipelined(self._r, [("HEXISTS", meta_key(self._ns, topic), "deleting")
                                         for topic in names])
        return [t for t, marked in zip(names, marks, strict=True) if marked]

    @translate_redis_errors
    def describe(self, topic: str) -> TopicDescription:
        _check_topic(topic)
        meta = self._r.hgetall(meta_key(self._ns, topic))
        if not meta:
            raise TopicError(Errors.UNKNOWN_TOPIC_OR_PARTITION, topic)
        n = int(meta[b"partitions"])
        # A stream an XADD by hand left without offsets is that partition's error alone (it
        # raised for the whole topic: `rcoord topics describe` showed no partition of it).
        infos = [
            PartitionInfo(p, *got) if isinstance(got, tuple)
            else PartitionInfo(p, -1, -1, got.error, got.detail) if isinstance(got, TopicError)
            else PartitionInfo(p, -1, -1, got)
            for p, got in enumerate(_offsets_of(
                self._r, [partition_key(self._ns, topic, p) for p in range(n)]))
        ]
        return TopicDescription(
            name=topic,
            partitions=infos,
            created_ms=int(meta.get(b"created_ms", 0)),
            **{c.field: _opt_int(meta.get(c.field.encode())) for c in SETTINGS},
            create_token=meta.get(b"create_token", b"").decode(),
            marked_for_deletion=b"deleting" in meta,
        )

    @translate_redis_errors
    def settings(self, topic: str) -> dict[str, int | None]:
        """The topic's settings (a keyword of ``create`` -> its value, None where the default
        applies) in one read of its metadata, without ``describe``'s read of every partition;
        UNKNOWN_TOPIC_OR_PARTITION if there is no such topic."""
        _check_topic(topic)
        fields = [s.field for s in SETTINGS]
        count, *values = self._r.hmget(meta_key(self._ns, topic), ["partitions", *fields])
        if count is None:
            raise TopicError(Errors.UNKNOWN_TOPIC_OR_PARTITION, topic)
        return {field: _opt_int(value) for field, value in zip(fields, values, strict=True)}

    @translate_redis_errors
    def create_token(self, topic: str) -> str:
        """The token of the ``create`` call that made ``topic`` (``TopicDescription.create_token``):
        another one means the topic was deleted and created again. UNKNOWN_TOPIC_OR_PARTITION if
        there is no such topic."""
        _check_topic(topic)
        return self._count_and_token(topic)[1]

    @translate_redis_errors
    def delete(self, topic: str) -> None:
        """Kafka's DeleteTopics; UNKNOWN_TOPIC_OR_PARTITION if there is no such topic.

        Idempotent producers' state goes with each partition (and ``create`` clears any that a
        crashed delete left), so a topic re-created under the same name starts clean. The count
        is read again after the streams are deleted, and the partitions a concurrent
        ``add_partitions`` added meanwhile are deleted too, until it stays put. One that grows
        the topic between that last read and the metadata's deletion leaves a stream behind; a
        later topic of the same name does not adopt it (``add_partitions`` replaces it).

        The topic is marked for deletion first (``deleting`` in its metadata, as Kafka marks a
        topic queued for deletion): a delete that stops partway (the process dies, Redis goes
        away) leaves a topic that ``create`` answers TOPIC_ALREADY_EXISTS "marked for
        deletion" without making its removed partitions again; ``delete`` again finishes it.
        """
        n = self.partition_count(topic)
        (res,) = _run(self._r, [(ALTER_META, [meta_key(self._ns, topic)], ["deleting", "1"])])
        if _name(res[0]) != Errors.NONE:
            raise TopicError(_name(res[0]), topic)  # (deleted meanwhile)
        done = 0
        while True:
            self._delete_partitions(topic, range(done, n))
            done = n
            raw = self._r.hget(meta_key(self._ns, topic), "partitions")
            if raw is None or int(raw) <= n:
                break
            n = int(raw)
        self._r.delete(meta_key(self._ns, topic))

    def _delete_partitions(self, topic: str, partitions: range) -> None:
        """Every key of those partitions: streams, producer states and logs, last timestamps,
        creation tokens."""
        # The producers' append logs (Spark sink producers) are named by producer id: found in
        # the state hash, which the log never outlives. Its empty field is the stored
        # producer_id_expiration_ms (topic_producer_ttl.lua), no producer's: it has no log.
        pipe = self._r.pipeline(transaction=False)
        for p in partitions:
            pipe.hkeys(producer_state_keys(self._ns, topic, p)[0])
        producers = pipe.execute()
        pipe = self._r.pipeline(transaction=False)
        for p, pids in zip(partitions, producers):
            for pid in pids:
                if pid:
                    pipe.delete(producer_log_key(self._ns, topic, p, _text(pid)))
            # The stream, producer states, last timestamp and creation token.
            for key in make_keys(self._ns, topic, p):
                pipe.delete(key)
        pipe.execute()

    @translate_redis_errors
    def list(self) -> list[str]:
        """Topic names, sorted. SCAN visits every master in a cluster; the metadata hashes are
        the only registry, so there is no second structure to keep consistent. A key the
        pattern matches whose name is not a legal topic name is another namespace's (one
        called ``<ns>:topicmeta`` has keys such as ``<ns>:topicmeta:{}:replays:q}``), not a
        topic of this one."""
        prefix = f"{self._ns}:topicmeta:{{"
        pattern = re.sub(r"([*?\[\]\\])", r"\\\1", prefix) + "*}"
        names = set()
        for key in self._r.scan_iter(match=pattern, count=1000):
            text = key.decode() if isinstance(key, bytes) else key
            if text.startswith(prefix) and text.endswith("}"):
                name = text[len(prefix):-1]
                if legal_topic(name):
                    names.add(name)
        return sorted(names)

    @translate_redis_errors
    def delete_records(self, topic: str, offsets: Mapping[int, int]
                       ) -> dict[int, DeletedRecords]:
        """Kafka's DeleteRecords (``kafka-delete-records``, AdminClient's ``deleteRecords``):
        raise each partition's log start offset to ``offsets[partition]`` (-1: its log end,
        Kafka's high watermark), removing the records before it; in partition order.

        Per partition, as Kafka's ``UnifiedLog.deleteRecordsOnLeader``: an offset below -1 or
        past the log end is OFFSET_OUT_OF_RANGE and removes nothing; one at or below the log
        start removes nothing and answers the log start; a partition the topic does not have
        is UNKNOWN_TOPIC_OR_PARTITION; one whose stream's last id is not rcoord's (an XADD by
        hand) is UNKNOWN_SERVER_ERROR with a ``detail`` saying what mends it (it raised for the
        whole call, after the other partitions' records were removed, which the caller was then
        not told). Redis lost partway is ``DeleteRecordsIncomplete``, a ``ConnectionLost``
        carrying the partitions done and those to ask again. A consumer positioned before the
        new log start is then
        out of range and resets, as after retention. The removal is split into calls of about
        ``RETENTION_TRIM_BYTES`` each, so none holds the server for long.
        """
        _check_topic(topic)
        for partition, offset in offsets.items():
            _check_int("partition", partition, 0)
            _check_int("offset", offset, -(2**63), 2**63 - 1)
        # (The token, read first, is checked by every call: a topic made again meanwhile is
        # another log, whose records no later call may remove.)
        count, token = self._count_and_token(topic)
        out = {p: DeletedRecords(p, -1, Errors.UNKNOWN_TOPIC_OR_PARTITION)
               for p in offsets if p >= count}
        pending = self._log_ends_for_minus_one(
            topic, {p: offset for p, offset in offsets.items() if p < count}, out)
        while pending:
            calls = [(DELETE_RECORDS, [*_keys_with_mark(partition_key(self._ns, topic, p)),
                                       creation_token_key(self._ns, topic, p)],
                      [target, RETENTION_TRIM_BYTES, token]) for p, target in pending.items()]
            try:
                results = _run(self._r, calls, keep_errors=True)
            except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException) as exc:
                # (a pipeline that raised may have run some of its calls: all stay unfinished)
                _raise_incomplete(exc, out, pending)
                raise
            again: dict[int, int] = {}
            lost: Exception | None = None
            for (p, target), res in zip(pending.items(), results):
                if isinstance(res, Exception):
                    failed = _foreign_ids(res)  # (a stream an XADD by hand left unreadable)
                    if not isinstance(failed, TopicError):
                        # The others' answers of this round still count (each is done or asked
                        # again, never both).
                        lost, again[p] = lost or res, target
                        continue
                    out[p] = DeletedRecords(p, -1, failed.error, failed.detail)
                    continue
                error = _name(res[0])
                if error != Errors.NONE:
                    out[p] = DeletedRecords(p, -1, error)
                elif int(res[3]):
                    again[p] = target
                else:
                    out[p] = DeletedRecords(p, int(res[1]))
            if lost is not None:
                _raise_incomplete(lost, out, again)
                raise lost
            pending = again
        return dict(sorted(out.items()))

    def _log_ends_for_minus_one(self, topic: str, pending: dict[int, int],
                                out: dict[int, DeletedRecords]) -> dict[int, int]:
        """``pending`` with each -1 (the log end) read now, before anything is removed, as
        Kafka resolves it to the high watermark when it takes the request: a call that loses
        Redis partway then names its unfinished partitions at offsets that, asked again, keep
        the records appended since (a -1 asked again was a later log end, and a partition
        trimmed in the round that failed lost those records). A partition that cannot be read
        gets its answer in ``out``."""
        minus_one = [p for p, target in pending.items() if target == -1]
        if not minus_one:
            return pending
        try:
            got = _offsets_of(self._r, [partition_key(self._ns, topic, p) for p in minus_one])
        except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException) as exc:
            _raise_incomplete(exc, out, pending)
            raise
        resolved = dict(pending)
        for p, answer in zip(minus_one, got):
            if isinstance(answer, tuple):
                resolved[p] = answer[1]
                continue
            del resolved[p]
            out[p] = (DeletedRecords(p, -1, answer.error, answer.detail)
                      if isinstance(answer, TopicError) else DeletedRecords(p, -1, answer))
        return resolved

    @translate_redis_errors
    def apply_retention(self, topic: str, stop: threading.Event | None = None) -> LogStarts:
        """Trim every partition by the topic's retention; returns partition -> log start offset
        (``LogStarts``, which also says whether the trim is done).

        By count: the newest ``retention_records`` are kept (exactly; Kafka works per segment
        and so keeps somewhat more); the others go about ``RETENTION_TRIM_BYTES`` a call
        (judged by sizes read as it goes), as in ``delete_records``. By age: records
        older than ``retention_ms`` by the node's clock go from the head, up to the first one
        that is not expired. A partition's timestamps never decrease, so each call
        binary-searches that boundary, copying at most ``RETENTION_SCAN_BYTES`` of records past
        its first probe and removing at most ``RETENTION_SCAN`` records (and
        ``RETENTION_TRIM_BYTES``); calls repeat until done, so no call holds the server for
        long, however large the records or the backlog.

        ``stop`` (the coordinator service's) is looked at between those rounds: once it is set
        the trim ends where it is, every partition trimmed at least one round (a large expired
        backlog takes many; those left are the answer's ``unfinished``), and the next pass goes
        on from there. It held a stopping service for the whole backlog before. An entry with
        no integer timestamp (added with XADD by hand) that the search by age reads is a
        TopicError (UNKNOWN_SERVER_ERROR) naming it, raised once the topic's other partitions
        are trimmed.
        """
        _check_topic(topic)
        desc_meta = self._r.hgetall(meta_key(self._ns, topic))
        if not desc_meta or b"deleting" in desc_meta:
            # A topic marked for deletion is no longer kept (Kafka's LogManager takes a log out
            # of the logs its clean-up goes through when the delete begins): its partitions may
            # be gone already, and each such answer was read as a log start of -1.
            raise TopicError(Errors.UNKNOWN_TOPIC_OR_PARTITION, f"{topic} (marked for deletion)"
                             if desc_meta else topic)
        n = int(desc_meta[b"partitions"])
        records = desc_meta.get(b"retention_records", b"")
        age = desc_meta.get(b"retention_ms", b"")
        # Read with the settings and checked by every round, as in ``delete_records``: a topic
        # deleted and made again between two rounds had its records trimmed by the old topic's
        # retention.
        token = desc_meta.get(b"create_token", b"")
        pending = list(range(n))
        starts: dict[int, int] = {}
        kept: dict[int, int | str] = dict.fromkeys(pending, "")  # the search's bound, per partition
        refused: TopicError | None = None
        while pending:
            results = _run(self._r, [
                (RETENTION, [*_keys_with_mark(partition_key(self._ns, topic, p)),
                             creation_token_key(self._ns, topic, p)],
                 [records, age, RETENTION_SCAN, RETENTION_SCAN_BYTES, kept[p],
                  RETENTION_TRIM_BYTES, token])
                for p in pending
            ], keep_errors=True)
            again = []
            for p, res in zip(pending, results):
                if isinstance(res, Exception):
                    # An entry added by hand (no timestamp, a last id of its own): this
                    # partition stops, the others are trimmed on (each log on its own, as
                    # Kafka's), and its error is raised once they are. Raised at once, it left
                    # every other partition of the topic one round (RETENTION_SCAN records) per
                    # pass, so an expired backlog there grew for as long as the entry stayed.
                    failed = _foreign_ids(res)
                    if not isinstance(failed, TopicError):
                        raise res
                    refused = refused or failed
                    continue
                if _name(res[0]) == Errors.UNKNOWN_TOPIC_OR_PARTITION:
                    # No stream (a create that stopped after its claim), or the topic made
                    # again since the settings were read: nothing of it is trimmed (and an
                    # earlier round's log start, the old topic's, is not answered).
                    starts.pop(p, None)
                    continue
                # (kept -1: the count's removal goes on, the search by age has not begun.)
                starts[p], kept[p] = int(res[1]), int(res[4]) if int(res[4]) >= 0 else ""
                if int(res[3]):
                    again.append(p)
            pending = again
            if stop is not None and stop.is_set():
                break
        if refused is not None:
            raise refused
        if not starts and not pending:
            raise TopicError(Errors.UNKNOWN_TOPIC_OR_PARTITION, f"{topic} has no partition left")
        return LogStarts(starts, pending)


def _raise_incomplete(exc: Exception, done: dict[int, DeletedRecords],
                      unfinished: dict[int, int]) -> None:
    """Raise ``DeleteRecordsIncomplete`` for a redis-py error that rcoord reports as
    ``ConnectionLost`` (else return): ``done`` are the answers so far, ``unfinished`` the
    partitions the failed round asked."""
    try:
        reraise_as_rcoord("delete_records", exc)
    except ConnectionLost as lost:
        raise DeleteRecordsIncomplete(str(lost), dict(sorted(done.items())),
                                      dict(sorted(unfinished.items()))) from exc


def _queued_for_deletion(topic: str) -> str:
    """What a request refused on a topic marked for deletion (``Topics.delete``) says."""
    return (f"{topic} is queued for deletion: a delete of it stopped partway; delete it again "
            "to finish")


def _keys_with_mark(key: str) -> list[str]:
    """KEYS of a script that reads a partition's log offsets: its stream ``key`` and its mark
    (``last_timestamp_key_of``, same hash tag), from which ``topic_common.lua`` reads them
    without XINFO STREAM, whose reply copies the first and last records (about 2 MB with
    records of 1 MB, on every retention and DeleteRecords call)."""
    return [key, last_timestamp_key_of(key)]


def _text(raw: Any) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)
