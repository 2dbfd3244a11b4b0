"""Producers while a partition's slot migrates between masters, step by step (``CLUSTER SETSLOT
IMPORTING/MIGRATING``, ``MIGRATE`` of some of its keys, ``SETSLOT NODE``), on a cluster of the
module's own. While a partition's keys are split between the masters, or a key an append names
does not exist yet (a partition's first producer state, a producer's append log), Redis refuses
the append (``TRYAGAIN``) until the move ends, and redis-py gives up after about 0.4 s."""

from __future__ import annotations

import concurrent.futures
import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from harness import wait_until
from test_parked_slot_moves import _errors, _Move

from rcoord import ConnectionLost
from rcoord.topics import ProducerRecord, Topics, partition_key
from rcoord.topics._base import last_timestamp_key, producer_log_key, producer_state_keys
from rcoord.topics.fetch import fetch
from rcoord.topics.producer import Producer, allocate_producer_number

REFUSALS = 17
"""``TRYAGAIN`` replies that show a send gave up once on old code: redis-py's pipeline sends a
call, then tries it 16 times more before "TTL exhausted"."""


def _start(move: _Move) -> None:
    """The slot migrating, no key moved yet."""
    src, dst = move.nodes[move.src], move.nodes[move.dst]
    dst.execute_command("CLUSTER", "SETSLOT", move.slot, "IMPORTING", move.ids[move.src])
    src.execute_command("CLUSTER", "SETSLOT", move.slot, "MIGRATING", move.ids[move.dst])


def _migrate(move: _Move, keys: list[str]) -> None:
    """Some of the slot's keys to the importing master (those the source has)."""
    src = move.nodes[move.src]
    held = set(src.execute_command("CLUSTER", "GETKEYSINSLOT", move.slot, 1000))
    have = [k for k in keys if k.encode() in held]
    if have:
        move.nodes[move.src].execute_command("MIGRATE", "127.0.0.1", move.dst, "", 0, 5000,
                                             "KEYS", *have)


def _end(move: _Move) -> None:
    """The move finished (whatever a failed test left), so the module's cluster serves the
    next test; then the clients closed."""
    with contextlib.suppress(redis.RedisError):
        _finish(move)
    move.close()


def _finish(move: _Move) -> None:
    """The rest of the move: the slot's other keys moved, then its owner."""
    move.keys()
    move.owner()


@contextlib.contextmanager
def _split_p0(cluster: Any, namespace: str, partitions: int,
              **producer_args: Any) -> Iterator[tuple[Any, Producer, _Move]]:
    """Topic ``t`` of ``partitions`` partitions, each holding one record (``a`` in p0, ``b``
    in p1), sent by the producer yielded, whose partition 0's slot is migrating with its stream
    moved and its producer state not (an append is refused until the move ends); then the
    move ended and the client closed."""
    client = cluster.client(socket_timeout=30)
    Topics(client, namespace).create("t", partitions)
    stream = partition_key(namespace, "t", 0)
    producer = Producer(client, namespace, **producer_args)
    producer.send_batch("t", [ProducerRecord(v, partition=p)
                              for p, v in enumerate([b"a", b"b"][:partitions])])
    move = _Move(cluster, client, stream)
    for p in range(1, partitions):  # (the other partitions are not moving)
        assert client.keyslot(partition_key(namespace, "t", p)) != move.slot
    try:
        _start(move)
        _migrate(move, [stream])
        yield client, producer, move
    finally:
        _end(move)
        client.close()


@contextlib.contextmanager
def _pool(name: str = "") -> Iterator[concurrent.futures.ThreadPoolExecutor]:
    """Threads for sends, left without waiting for them (one may wait out a move the test
    failed to end)."""
    pool = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix=name)
    try:
        yield pool
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def _refusals(move: _Move) -> int:
    return sum(_errors(port, "TRYAGAIN") for port in (move.src, move.dst))


def _values(client: Any, namespace: str, partition: int) -> list[bytes | None]:
    return [r.value for r in fetch(client, namespace, "t", partition, 0).records]


def _through_refusals(move: _Move, send: Callable[[], Any]) -> Any:
    """``send`` in a thread until it met the refusal long enough for redis-py to give up, then
    the rest of the move; the send's result."""
    pool = concurrent.futures.ThreadPoolExecutor(1)
    try:
        before = _refusals(move)
        sent = pool.submit(send)
        wait_until(lambda: _refusals(move) > before + REFUSALS or sent.done())
        _finish(move)
        return sent.result(60)
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


@pytest.mark.parametrize("moved_first", ["stream", "producer state"])
def test_an_idempotent_send_waits_through_split_keys_and_appends_once(own_cluster, namespace,
                                                                      moved_first):
    """A send_batch to two partitions, one of whose keys are split (the stream moved and the
    producer state not, or the reverse): it used to raise ConnectionLost after 0.4 s with the
    other partition's records stored, so the caller's resend stored those twice. Now the
    refused calls are sent again until the move is over: each record is in the log once, the
    other partition's call, which ran, is not sent again (it was, every 100 ms for the whole
    move, with all its records, and answered as a duplicate), and the sequence state moved
    on."""
    client = own_cluster.client(socket_timeout=30)
    Topics(client, namespace).create("t", 2)
    stream = partition_key(namespace, "t", 0)
    state = [*producer_state_keys(namespace, "t", 0), last_timestamp_key(namespace, "t", 0)]
    producer = Producer(client, namespace)
    producer.send_batch("t", [ProducerRecord(b"a", partition=0), ProducerRecord(b"b", partition=1)])
    move = _Move(own_cluster, client, stream)
    assert client.keyslot(partition_key(namespace, "t", 1)) != move.slot
    try:
        _start(move)
        assert producer.send("t", b"c", partition=0).offset == 1  # (nothing moved yet)
        _migrate(move, [stream] if moved_first == "stream" else state)
        got = _through_refusals(move, lambda: producer.send_batch("t", [
            ProducerRecord(b"d", partition=0), ProducerRecord(b"e", partition=1)]))
        assert [(m.partition, m.offset) for m in got] == [(0, 2), (1, 1)]
        # p0's first calls never ran; p1's did, and keeps its answer (not resent)
        assert [m.duplicate for m in got] == [False, False]
        assert producer.send("t", b"f", partition=0).offset == 3  # no gap, no duplicate
        assert _values(client, namespace, 0) == [b"a", b"c", b"d", b"f"]
        assert _values(client, namespace, 1) == [b"b", b"e"]
        assert move.nodes[move.dst].exists(*state) == len(state)
    finally:
        _end(move)
        client.close()


def test_a_new_append_log_waits_for_the_move_and_is_written(own_cluster, namespace):
    """A producer that logs its appends names a log key that does not exist before its first
    append: refused for the whole migration, not only while the keys are split (it used to
    raise ConnectionLost as soon as the slot was MIGRATING). It waits, and the log has it."""
    client = own_cluster.client(socket_timeout=30)
    Topics(client, namespace).create("t", 1)
    Producer(client, namespace).send("t", b"a", partition=0)  # (the state keys exist)
    move = _Move(own_cluster, client, partition_key(namespace, "t", 0))
    producer = Producer(client, namespace, producer_id="spark-1", producer_epoch=3,
                        log_appends=True)
    try:
        _start(move)
        got = _through_refusals(move, lambda: producer.send("t", b"b", partition=0))
        assert (got.offset, got.duplicate) == (1, False)
        assert _values(client, namespace, 0) == [b"a", b"b"]
        # epoch 3, sequence 0, offset 1, one record
        assert client.get(producer_log_key(namespace, "t", 0, "spark-1")) == b"3 0 1 1\n"
    finally:
        _end(move)
        client.close()


def test_the_delivery_timeout_bounds_the_wait(own_cluster, namespace):
    """Past ``delivery_timeout_ms`` the send raises ConnectionLost, having appended nothing;
    the next send after the move goes on (the numbers skipped as lost), and a plain producer
    raises at once, as before (resending would store other partitions' records twice)."""
    with _split_p0(own_cluster, namespace, 1, delivery_timeout_ms=300) as (client, producer,
                                                                            move):
        with pytest.raises(ConnectionLost) as lost:
            producer.send("t", b"lost", partition=0)
        # (it read "send: slot unavailable for now (TTL exhausted.)", as if nothing had waited)
        assert str(lost.value).startswith(
            "t partition(s) [0]: a slot move or failover refused the append until "
            "delivery_timeout_ms (300 ms, counted from the send) ran out (TTL exhausted")
        assert "were not appended" in str(lost.value)
        with pytest.raises(ConnectionLost):
            Producer(client, namespace, idempotent=False).send("t", b"plain", partition=0)
        _finish(move)
        assert producer.send("t", b"b", partition=0).offset == 1
        assert _values(client, namespace, 0) == [b"a", b"b"]


def test_producer_ids_are_allocated_through_a_move_of_the_counters_slot(own_cluster,
                                                                        namespace):
    """The id counter is one key: served by the source, ``ASK``ed to the importing master once
    moved, then by the new owner; the numbers keep rising."""
    client = own_cluster.client(socket_timeout=30)
    numbers = [allocate_producer_number(client, namespace)]
    move = _Move(own_cluster, client, f"{namespace}:producerids")
    try:
        for step in (_start, _Move.keys, _Move.owner):
            step(move)
            numbers.append(allocate_producer_number(client, namespace))
            assert Producer(client, namespace).producer_id is not None
        assert numbers == [1, 2, 4, 6]
    finally:
        _end(move)
        client.close()


def test_a_change_of_producer_expiry_completes_through_a_move(own_cluster, namespace):
    """``alter_configs`` of ``producer_id_expiration_ms`` writes the setting, then moves the
    producer state keys' expiry; the latter names the append log of each producer, which does
    not exist for one that never logged, so it was refused for the whole move and raised
    ConnectionLost with the setting written and the keys' times not moved. It waits now."""
    client = own_cluster.client(socket_timeout=30)
    topics = Topics(client, namespace)
    topics.create("t", 1, producer_id_expiration_ms=600_000)
    Producer(client, namespace).send("t", b"a", partition=0)  # a producer that never logged
    state = producer_state_keys(namespace, "t", 0)[0]
    assert 0 < client.pttl(state) <= 600_000
    move = _Move(own_cluster, client, partition_key(namespace, "t", 0))
    try:
        _start(move)
        _through_refusals(move, lambda: topics.alter_configs(
            "t", {"producer_id_expiration_ms": 10**9}))
        assert client.pttl(state) > 600_000
    finally:
        _end(move)
        client.close()


class _Refusing:
    """A client whose EVALSHA answers ``[NONE, <its last argument>]``, except that the calls
    named in ``refuse`` are refused, each once, as redis-py gives up on a slot move (a
    ``ClusterError``: never run); ``sent`` lists every call run or refused, in order."""

    def __init__(self, refuse: set[str]) -> None:
        self.refuse, self.sent = refuse, []  # type: ignore[var-annotated]

    def evalsha(self, sha: str, numkeys: int, *rest: str) -> Any:
        self.sent.append(rest[-1])
        if rest[-1] in self.refuse:
            self.refuse.discard(rest[-1])
            raise redis.exceptions.ClusterError("TTL exhausted.")
        return [b"NONE", rest[-1]]

    def pipeline(self, transaction: bool) -> Any:
        client, queued = self, []

        class Pipe:
            def execute_command(self, *args: Any) -> None:
                queued.append(args[1:])

            def execute(self, raise_on_error: bool) -> list[Any]:
                out: list[Any] = []
                for args in queued:
                    try:
                        out.append(client.evalsha(*args))
                    except redis.exceptions.ClusterError as exc:
                        out.append(exc)
                return out

        return Pipe()


def test_a_call_refused_by_a_move_is_sent_again_alone_with_the_later_calls_of_its_key(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Three chunks of p0 and one call of p1: p0's first chunk and p1's call run, p0's second
    is refused. Only that chunk and the one after it are sent again (in order): the resend
    sent every call of the send again (p0's first chunk and p1's call, with all their records,
    every 100 ms for the whole move), and answered them as duplicates."""
    from rcoord.topics import _base

    monkeypatch.setattr(_base, "SLOT_MOVE_RETRY_S", 0.001)
    client = _Refusing({"c2"})
    lua = _base.APPEND_IDEMPOTENT
    calls = [(lua, ["p0"], ["c1"]), (lua, ["p0"], ["c2"]), (lua, ["p0"], ["c3"]),
             (lua, ["p1"], ["d1"])]
    got = _base._run_through_slot_moves(client, calls, 10.0)
    assert got == [[b"NONE", name] for name in ("c1", "c2", "c3", "d1")]
    assert client.sent == ["c1", "d1", "c2", "c2", "c3"]


def test_a_send_waiting_out_a_move_does_not_hold_its_other_partitions(own_cluster, namespace):
    """A send_batch to p0 (its keys split by a move) and p1 (not moving) waits for p0; another
    thread's send to p1 waited with it, for the whole move or ``delivery_timeout_ms`` (the
    waiting send held p1's lock though p1's call had its answer), where Kafka batches per
    partition and one partition's retries never hold another's. Now p1 is released once its
    call is answered: the other send goes through during the move, after the waiting send's
    p1 record; the waiting send still ends with both its records once, in order."""
    with _split_p0(own_cluster, namespace, 2) as (client, producer, move), _pool() as pool:
        before = _refusals(move)
        waiting = pool.submit(producer.send_batch, "t", [
            ProducerRecord(b"c", partition=0), ProducerRecord(b"d", partition=1)])
        wait_until(lambda: _refusals(move) > before + REFUSALS or waiting.done())
        other = pool.submit(producer.send, "t", b"e", partition=1)
        wait_until(other.done)  # (it waited for the move: beyond this wait)
        assert not waiting.done()  # (the move is not over: p0 still waits)
        assert (other.result().offset, other.result().duplicate) == (2, False)
        _finish(move)
        got = waiting.result(60)
        assert [(m.partition, m.offset, m.duplicate) for m in got] == [(0, 1, False),
                                                                     (1, 1, False)]
        assert producer.send("t", b"f", partition=0).offset == 2  # no gap, no duplicate
        assert _values(client, namespace, 0) == [b"a", b"c", b"f"]
        assert _values(client, namespace, 1) == [b"b", b"d", b"e"]


def test_the_delivery_timeout_counts_from_the_send_not_from_its_turn(own_cluster, namespace,
                                                                     monkeypatch):
    """Two sends to a partition whose keys a move split: the second waits for the first (its
    lock: sequence order), and then waited a whole ``delivery_timeout_ms`` of its own, so
    each send queued behind it waited one timeout more (Kafka's ``delivery.timeout.ms``
    bounds a record's time from ``send``). Now its wait counts from its start: the first
    send's second round is held until the second's time is up, so the second's turn comes
    after it, and it tries one round and raises. (It held nothing before, and the second
    made at most 2 rounds only if its thread started within a round of the first's
    first refusal: not so on a loaded machine.)"""
    from rcoord.topics import _base

    timeout_s = 3.0
    rounds: list[str] = []
    run = _base._run
    second_began: list[float] = []  # when the second send had read its deadline
    began = threading.Event()

    def counted(*args: Any, **kwargs: Any) -> Any:
        who = threading.current_thread().name.split("_")[0]
        rounds.append(who)
        if who == "first" and rounds.count("first") == 2:
            assert began.wait(60)
            wait_until(lambda: time.monotonic() > second_began[0] + timeout_s + 0.1)
        return run(*args, **kwargs)

    monkeypatch.setattr(_base, "_run", counted)
    with (_split_p0(own_cluster, namespace, 1, delivery_timeout_ms=int(timeout_s * 1000))
          as (client, producer, move), _pool("first") as first, _pool("second") as second):
        sequence = producer._sequence

        def noted(topic: str, partition: int) -> Any:
            # (called after the send read its deadline, before it waits for the lock)
            if threading.current_thread().name.startswith("second"):
                second_began.append(time.monotonic())
                began.set()
            return sequence(topic, partition)

        monkeypatch.setattr(producer, "_sequence", noted)
        before = _refusals(move)
        a = first.submit(producer.send, "t", b"b", partition=0)
        wait_until(lambda: _refusals(move) > before or a.done())  # (its first round)
        assert not a.done()
        b = second.submit(producer.send, "t", b"c", partition=0)
        with pytest.raises(ConnectionLost):
            a.result(60)
        assert rounds.count("first") > 1  # (it did wait, resending)
        with pytest.raises(ConnectionLost):
            b.result(60)
        # Its time was up when its turn came: it used to resend for 3 s more.
        assert rounds.count("second") == 1
        _finish(move)
        assert producer.send("t", b"d", partition=0).offset == 1
        assert _values(client, namespace, 0) == [b"a", b"d"]


def test_the_timeout_names_the_partitions_that_were_stored(own_cluster, namespace):
    """A send_batch to a moving partition and one that is not, timed out: the error says
    which partition's records were not appended and which were."""
    with _split_p0(own_cluster, namespace, 2, delivery_timeout_ms=300) as (client, producer,
                                                                            move):
        with pytest.raises(ConnectionLost, match=r"t partition\(s\) \[0\]: .* not appended "
                           r".*; its records to partition\(s\) \[1\] were$"):
            producer.send_batch("t", [ProducerRecord(b"c", partition=0),
                                      ProducerRecord(b"d", partition=1)])
        _finish(move)
        assert _values(client, namespace, 0) == [b"a"]
        assert _values(client, namespace, 1) == [b"b", b"d"]


def test_the_timeout_says_which_records_of_a_partly_stored_partition_were_appended(
        own_cluster, namespace, monkeypatch):
    """An idempotent send whose partition's records go in several script calls, the first of
    which ran before a slot move split the partition's keys and refused the others until
    ``delivery_timeout_ms`` ran out: the error must not say that none of that partition's
    records were appended (a caller resending them would store the first call's twice)."""
    from rcoord.topics import _base

    client = own_cluster.client(socket_timeout=30)
    Topics(client, namespace).create("t", 1)
    stream = partition_key(namespace, "t", 0)
    # (each record alone in its script call: two calls of p0, sent one after the other)
    producer = Producer(client, namespace, delivery_timeout_ms=300, max_request_size=10)
    producer.send("t", b"a", partition=0)
    move = _Move(own_cluster, client, stream)
    run = _base._run_independent
    rounds: list[int] = []

    def moving_after_the_first(*args: Any, **kwargs: Any) -> Any:
        got = run(*args, **kwargs)
        rounds.append(1)
        if len(rounds) == 1:  # (the move begins between p0's two calls)
            _start(move)
            _migrate(move, [stream])
        return got

    try:
        monkeypatch.setattr(_base, "_run_independent", moving_after_the_first)
        with pytest.raises(ConnectionLost) as lost:
            producer.send_batch("t", [ProducerRecord(b"b1------", partition=0),
                                      ProducerRecord(b"b2------", partition=0)])
        monkeypatch.setattr(_base, "_run_independent", run)
        message = str(lost.value)
        assert "this call's records to those partitions were not appended" not in message
        assert "partition 0: 1 of its 2 records were appended (offsets 1..1)" in message
        _finish(move)
        assert _values(client, namespace, 0) == [b"a", b"b1------"]
        assert producer.send("t", b"c", partition=0).offset == 2  # (no gap, no duplicate)
        assert _values(client, namespace, 0) == [b"a", b"b1------", b"c"]
    finally:
        _end(move)
        client.close()


def test_the_timeout_names_the_partitions_refused_in_the_same_call(own_cluster, namespace):
    """A send_batch to a moving partition (p0) and one that refused its records (p1: the
    producer is fenced there) timed out: the ConnectionLost said p0's records were not
    appended and nothing of p1's, whose refusal (PRODUCER_FENCED) went unreported, so a
    caller resending what was "not appended" dropped p1's records without knowing it."""
    with _split_p0(own_cluster, namespace, 2, producer_id="x",
                   delivery_timeout_ms=300) as (client, producer, move):
        Producer(client, namespace, producer_id="x", producer_epoch=1).send("t", b"c",
                                                                            partition=1)
        with pytest.raises(ConnectionLost) as lost:
            producer.send_batch("t", [ProducerRecord(b"d", partition=0),
                                      ProducerRecord(b"e", partition=1)])
        message = str(lost.value)
        assert message.startswith("t partition(s) [0]: a slot move or failover refused")
        assert "; partition 1 refused its records (PRODUCER_FENCED: " in message
        _finish(move)
        assert _values(client, namespace, 0) == [b"a"]
        assert _values(client, namespace, 1) == [b"b", b"c"]
