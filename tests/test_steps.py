"""Each request is defined once (rcoord.steps); the two coordinators are drivers over it.

The behavioural tests run against both drivers (the ``ctx`` fixture is parametrised over
``blocking`` and ``asyncio``); here, that the two public surfaces cannot drift apart.
"""

from __future__ import annotations

import inspect

from rcoord import GroupCoordinator
from rcoord.asyncio import AsyncGroupCoordinator
from rcoord.steps import PUBLIC_STEPS, GroupSteps


def _public(cls: type) -> set[str]:
    return {n for n in dir(cls) if not n.startswith("_")}


def test_both_coordinators_have_the_same_public_surface():
    assert _public(GroupCoordinator) == _public(AsyncGroupCoordinator)
    assert set(PUBLIC_STEPS) <= _public(GroupCoordinator)


def test_every_request_has_the_signature_and_docs_of_its_one_definition():
    for name in PUBLIC_STEPS:
        step = inspect.signature(getattr(GroupSteps, name))
        blocking = inspect.signature(getattr(GroupCoordinator, name))
        awaited = inspect.signature(getattr(AsyncGroupCoordinator, name))
        assert blocking == awaited, name
        assert list(blocking.parameters)[1:] == list(step.parameters)[1:], name
        assert not str(blocking.return_annotation).startswith("Flow["), name
        assert getattr(GroupCoordinator, name).__doc__ == getattr(GroupSteps, name).__doc__
        assert getattr(AsyncGroupCoordinator, name).__doc__ == getattr(GroupSteps, name).__doc__
        assert inspect.iscoroutinefunction(getattr(AsyncGroupCoordinator, name)), name
        assert not inspect.iscoroutinefunction(getattr(GroupCoordinator, name)), name


def test_the_lifecycle_methods_match_too():
    for name in ("start", "resettle"):
        assert inspect.iscoroutinefunction(getattr(AsyncGroupCoordinator, name))
        sync = inspect.signature(getattr(GroupCoordinator, name))
        awaited = inspect.signature(getattr(AsyncGroupCoordinator, name))
        assert sync.parameters == awaited.parameters, name


def test_both_take_a_config_or_a_namespace_name(redis_client, namespace):
    from rcoord import CoordinatorConfig

    by_name = GroupCoordinator(redis_client, namespace).start()
    assert by_name.config.namespace == namespace
    named = GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace)).start()
    assert named.config == by_name.config
    assert inspect.signature(GroupCoordinator).parameters["config"].annotation == \
        inspect.signature(AsyncGroupCoordinator).parameters["config"].annotation


def test_the_park_flow_asks_for_typed_operations():
    import pytest

    from rcoord.protocol.park import MOCK_CLOCK_BLOCK_MS, Poll, ReadReply, WaitWake, park_flow

    flow = park_flow([b"W", b"5-0", b"-1", b"1000"], mock_clock=True, max_block_ms=1000)
    assert next(flow) == WaitWake(b"5-0", MOCK_CLOCK_BLOCK_MS)
    assert flow.send(False) == Poll()  # a mock clock re-checks after every wait
    assert flow.send([b"W", b"6-0", b"-1", b"1000"]) == WaitWake(b"6-0", MOCK_CLOCK_BLOCK_MS)
    assert flow.send(True) == ReadReply()  # woken: read the stored reply first
    assert flow.send(None) == Poll()  # not written yet: the script applies what is due
    with pytest.raises(StopIteration) as done:
        flow.send([b"R", b"the reply"])
    assert done.value.value == b"the reply"


def test_a_woken_park_flow_returns_the_stored_reply_without_the_script():
    import pytest

    from rcoord.protocol.park import ReadReply, WaitWake, park_flow

    flow = park_flow([b"W", b"5-0", b"-1", b"1000"], mock_clock=False, max_block_ms=1000)
    assert isinstance(next(flow), WaitWake)
    assert flow.send(True) == ReadReply()
    with pytest.raises(StopIteration) as done:
        flow.send(b"the reply")
    assert done.value.value == b"the reply"


def test_asyncio_still_takes_namespace_as_a_keyword():
    import pytest
    import redis.asyncio

    client = redis.asyncio.Redis(host="127.0.0.1", port=1)  # (never connects)
    coord = AsyncGroupCoordinator(client, namespace="kw-ns")
    assert coord._steps.namespace == "kw-ns"
    with pytest.raises(TypeError, match="either"):
        AsyncGroupCoordinator(client, "a", namespace="b")


def test_a_config_of_another_type_is_refused_not_taken_for_the_default_namespace():
    """A reviewer's repro: ``GroupCoordinator(client, b"orders")`` (a namespace read as bytes)
    or a dict of settings was taken as no namespace, so both coordinators served the default
    "rcoord" namespace (another deployment's groups) without a word. Both now refuse it."""
    import pytest
    import redis
    import redis.asyncio

    blocking = redis.Redis(host="127.0.0.1", port=1)  # (never connects)
    asyncio_client = redis.asyncio.Redis(host="127.0.0.1", port=1)
    for config in (b"orders", {"namespace": "orders"}, 5):
        with pytest.raises(TypeError, match="CoordinatorConfig or a namespace name"):
            GroupCoordinator(blocking, config)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="CoordinatorConfig or a namespace name"):
            AsyncGroupCoordinator(asyncio_client, config)  # type: ignore[arg-type]
    assert GroupCoordinator(blocking, "orders")._steps.namespace == "orders"
    assert AsyncGroupCoordinator(asyncio_client)._steps.namespace == "rcoord"
    blocking.close()


def test_a_layout_cached_under_another_count_is_rebuilt():
    from rcoord import CoordinatorConfig
    from rcoord.keys import GroupKeys

    steps = GroupSteps(None, "ns", None)
    steps.config = CoordinatorConfig(namespace="ns", num_partitions=16)
    # A thread that read the old count cached its layout after the new count was settled.
    steps._keys_cache["g"] = GroupKeys.of("ns", 8, "g")
    assert steps.keys("g").partition.num_partitions == 16


def test_a_parked_callers_reply_is_where_the_driver_reads_it(ctx):
    # The park flow reads a woken caller's reply with a plain HGET (ReadReply) before it runs
    # await_reply; the field is the contract's reply_field, which the library renders too.
    from rcoord.contract import reply_field
    from rcoord.protocol.join import JoinGroupResult
    from rcoord.protocol.sync import SyncGroupResult

    gen, ids = ctx.stable_group(2)  # both second JoinGroups park; a SyncGroup parks unless
    replies = ctx._keys().replies    # the leader's came first
    r = ctx.coord._redis
    for mid in ids:
        joined = JoinGroupResult.decode(r.hget(replies, reply_field("j", mid)))
        assert (joined.member_id, joined.generation_id) == (mid, gen)
    stored = {mid: r.hget(replies, reply_field("s", mid)) for mid in ids}
    assert any(stored.values()), stored
    for mid, blob in stored.items():
        if blob is not None:
            assert SyncGroupResult.decode(blob).assignment == mid.encode()


def test_a_reply_read_at_the_wake_up_is_not_read_again():
    # A parked call asks to wait with its reply slot named; when the driver's shared read
    # brought the slot along (Woken), the flow returns it without an HGET of its own.
    import pytest

    from rcoord import CoordinatorConfig
    from rcoord.contract import reply_field
    from rcoord.flow import Command, Woken, XRead

    steps = GroupSteps(None, "ns", None)
    steps.config = CoordinatorConfig(namespace="ns")
    keys = steps.keys("g")
    parked = [b"W", b"5-0", b"-1", b"1000"]
    flow = steps._park("g", "m1", "j", parked)
    op = next(flow)
    assert isinstance(op, XRead) and op.slot == (keys.replies, reply_field("j", "m1"))
    with pytest.raises(StopIteration) as done:
        flow.send(Woken(b"the reply"))
    assert done.value.value == b"the reply"
    # A driver that only says the stream moved leaves the read to the flow.
    flow = steps._park("g", "m1", "j", parked)
    next(flow)
    assert flow.send(True) == Command(("HGET", keys.replies, reply_field("j", "m1")))


def test_both_drivers_give_up_a_blocking_read_once_the_callers_event_is_set(redis_server):
    """``abandon_parked_when``: a set event turns the next ``XRead`` (a parked call's wait)
    into ``ParkAbandonedError`` thrown into the flow; other operations, and the same read
    outside the block or with the event clear, run as usual."""
    import asyncio
    import threading

    import redis.asyncio

    from rcoord.errors import ParkAbandonedError
    from rcoord.flow import Command, XRead, abandon_parked_when, adrive, drive

    def flow():
        assert (yield Command(("PING",))) is True  # runs even while the event is set
        try:
            moved = yield XRead(b"no-such-wake-stream", "0-0", 10)
        except ParkAbandonedError as exc:
            return f"abandoned: {exc}"
        return f"waited: moved={moved}"

    closing = threading.Event()
    client = redis_server.client()
    try:
        with abandon_parked_when(closing):
            assert drive(client, None, flow()) == "waited: moved=False"
            closing.set()
            given_up = drive(client, None, flow())
        assert given_up.startswith("abandoned: gave up waiting on b'no-such-wake-stream'")
        assert drive(client, None, flow()) == "waited: moved=False"  # the block ended
    finally:
        client.close()

    async def run_async() -> list[str]:
        aclient = redis.asyncio.Redis(host=redis_server.host, port=redis_server.port)
        try:
            out = [await adrive(aclient, None, flow())]
            with abandon_parked_when(closing):
                out.append(await adrive(aclient, None, flow()))
            return out
        finally:
            await aclient.aclose()

    waited, abandoned = asyncio.run(run_async())
    assert waited == "waited: moved=False" and abandoned.startswith("abandoned: ")
