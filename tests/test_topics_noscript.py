"""A batch of several script calls for one partition meets NOSCRIPT, and another client loads
the script while the batch is on its way (as after a restart, when many clients reload at once).

The server runs the calls one by one as their bytes arrive. ``SplitConnection`` makes the race
happen on cue: it sends a batch holding two calls of the append script in two parts, and between
them waits (on the server's own error counter) until the first call has been answered NOSCRIPT,
then has another client load the script. A batch of one call per partition is sent as usual.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.connection

from rcoord.testing.embedded import EmbeddedServer
from rcoord.topics import Producer, ProducerRecord, Topics, fetch, fetch_many
from rcoord.topics._base import APPEND, APPEND_IDEMPOTENT, MAX_APPEND_PER_CALL, _Lua
from rcoord.topics.fetch import log_offsets_many

WAIT_S = 15.0


def noscript_replies(client: Any) -> int:
    """NOSCRIPT replies the server (every master of a cluster) has sent."""
    if isinstance(client, redis.RedisCluster):
        per_node = client.info("errorstats", target_nodes=client.PRIMARIES).values()
    else:
        per_node = [client.info("errorstats")]
    return sum(int(n.get("errorstat_NOSCRIPT", {}).get("count", 0)) for n in per_node)


def splitting_client(server: EmbeddedServer, script: _Lua, helper: redis.Redis,
                     splits: list[int]) -> redis.Redis:
    """A client whose requests holding two or more calls of ``script`` reach the server in two
    parts: the first call, then (once the server answered it NOSCRIPT and ``helper`` loaded the
    script) the rest. ``splits`` counts the requests split so."""
    call = b"EVALSHA\r\n$40\r\n" + script.sha.encode()

    class SplitConnection(redis.connection.Connection):
        def send_packed_command(self, command: Any, check_health: bool = True) -> None:
            data = bytes(command) if isinstance(command, (bytes, bytearray)) else b"".join(
                bytes(part) for part in command)
            second = data.find(call, data.find(call) + 1)
            if second < 0:
                super().send_packed_command(command, check_health)
                return
            cut = data.rfind(b"*", 0, second)  # the start of the second call's array
            before = noscript_replies(helper)
            super().send_packed_command([data[:cut]], check_health)
            deadline = time.monotonic() + WAIT_S
            while noscript_replies(helper) == before:
                assert time.monotonic() < deadline, "the first call was never answered"
                time.sleep(0.001)
            helper.script_load(script.source)
            splits.append(1)
            super().send_packed_command([data[cut:]], check_health)

    client = server.client()
    client.connection_pool.connection_class = SplitConnection
    return client


@pytest.fixture
def helper(own_server: EmbeddedServer) -> Iterator[redis.Redis]:
    client = own_server.client()
    try:
        yield client
    finally:
        client.close()


@pytest.mark.parametrize("idempotent", [False, True], ids=["plain", "idempotent"])
def test_a_batch_split_into_calls_keeps_its_order_when_the_script_cache_was_flushed(
    own_server: EmbeddedServer, helper: redis.Redis, idempotent: bool
) -> None:
    Topics(helper, "ns").create("t", 1)
    script = APPEND_IDEMPOTENT if idempotent else APPEND
    splits: list[int] = []
    client = splitting_client(own_server, script, helper, splits)
    try:
        producer = Producer(client, "ns", idempotent=idempotent)
        producer.send("t", b"warm", partition=0)  # (the producer id is allocated)
        values = [b"%06d" % i for i in range(MAX_APPEND_PER_CALL + 10)]  # two calls
        helper.script_flush()
        before = noscript_replies(helper)
        metas = producer.send_batch("t", [ProducerRecord(v, partition=0) for v in values])
    finally:
        client.close()
    assert noscript_replies(helper) > before  # the flush was seen: the test is not vacuous
    assert [(m.offset, m.duplicate) for m in metas] == [(1 + i, False) for i in range(len(values))]
    log = fetch(helper, "ns", "t", 0, 1, max_records=len(values) + 1).records
    assert [r.value for r in log] == values
    # Two calls of one partition never share a request (the old _run sent both in one).
    assert splits == []


def test_a_fetch_after_the_script_cache_was_flushed_reloads_the_offsets_script(
    own_server: EmbeddedServer, helper: redis.Redis
) -> None:
    """A fetch reads the log offsets with a script in its pipeline; after a restart or a
    ``SCRIPT FLUSH`` that call answers NOSCRIPT and did not run, and the fetch calls it
    again (which loads it) instead of failing, for one partition and for several."""
    topics = Topics(helper, "ns")
    topics.create("t", 2)
    Producer(helper, "ns").send_batch("t", [ProducerRecord(b"%d" % i, partition=i % 2)
                                            for i in range(6)])
    for attempt in range(2):
        helper.script_flush()
        before = noscript_replies(helper)
        if attempt == 0:
            got = [fetch(helper, "ns", "t", 0, 1)]
        else:
            got = fetch_many(helper, "ns", [("t", 0, 1), ("t", 1, 0)])
        assert noscript_replies(helper) > before  # (the flush was seen)
        assert [([r.value for r in g.records], g.log_start_offset, g.log_end_offset)
                for g in got] == [([b"2", b"4"], 0, 3), ([b"1", b"3", b"5"], 0, 3)][:len(got)]


@pytest.mark.parametrize("backend", ["single", "cluster"])
def test_a_batch_over_many_partitions_reloads_once_after_the_script_cache_was_flushed(
    request: pytest.FixtureRequest, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a restart or ``SCRIPT FLUSH`` every call of a batched read answers NOSCRIPT; the
    calls go again in one pipeline (per node) once the script is loaded, not one round trip
    each (the first rebalance after a restart read 40 partitions' log offsets in 40 more round
    trips)."""
    server = request.getfixturevalue("own_server" if backend == "single" else "own_cluster")
    helper = server.client()
    request.addfinalizer(helper.close)
    topics = Topics(helper, "ns")
    topics.create("t", 40)
    Producer(helper, "ns").send_batch("t", [ProducerRecord(b"%d" % i, partition=i)
                                            for i in range(40)])
    helper.script_flush()
    before = noscript_replies(helper)
    singles: list[Any] = []  # commands sent alone (a pipeline does not go through here)
    single = helper.execute_command

    def counted(*args: Any, **kwargs: Any) -> Any:
        singles.append(args[0])
        return single(*args, **kwargs)

    monkeypatch.setattr(helper, "execute_command", counted)
    got = log_offsets_many(helper, "ns", [("t", p) for p in range(40)])
    monkeypatch.undo()
    assert noscript_replies(helper) - before >= 40  # (the flush was seen by every call)
    assert got == [(0, 1)] * 40
    # One load per master (each on its own: sent to every master in one go, it failed while
    # any was down), then the 40 calls in one pipeline (per node).
    masters = 1 if backend == "single" else len(helper.get_primaries())
    assert singles == ["SCRIPT LOAD"] * masters
