"""A layout left behind when the settings hash is lost with its retire marks is found again."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Generator
from typing import Any

import pytest
import redis
from test_settings import FAST
from test_settings_retire import _retires

from rcoord import CoordinatorConfig, GroupCoordinator
from rcoord.flow import Command, Script, _perform, drive
from rcoord.keys import PartitionKeys, anchor_keys, settings_key
from rcoord.scripts import Scripts
from rcoord.settings import SWEEP, copy_pattern, settle_flow

COUNTS = (3, 5, 7)


def _copies(client: Any, namespace: str) -> set[str]:
    """The partition copies of ``namespace``, of any layout."""
    return {k.decode() for k in client.scan_iter(match=copy_pattern(namespace), count=1000)}


def _layouts(client: Any, namespace: str) -> set[int]:
    """The counts of the layouts holding a copy."""
    return {int(k[len(namespace) + 2:].split(".")[0]) for k in _copies(client, namespace)}


def _race(client: Any, scripts: Scripts, namespace: str, seed: int) -> None:
    """2 to 4 settles naming or having used counts of ``COUNTS``, their operations interleaved
    at random (``seed``), with the settings hash lost now and then, and withdraws failing (a
    master down: that settle ends there, as its process would)."""
    rng = random.Random(seed)
    flows: list[tuple[Generator[Any, Any, Any], Any]] = []
    for _ in range(rng.randint(2, 4)):
        count = rng.choice(COUNTS)
        cfg = CoordinatorConfig(namespace=namespace, num_partitions=count)
        flow = (settle_flow(namespace, cfg, None) if rng.random() < 0.5
                else settle_flow(namespace, None, cfg, write_named=False))
        flows.append((flow, next(flow)))
    losses = 0
    while flows:
        i = rng.randrange(len(flows))
        flow, op = flows[i]
        if losses < 2 and rng.random() < 0.08:
            losses += 1
            client.delete(settings_key(namespace))
        try:
            if _retires(op) and rng.random() < 0.3:
                flow.throw(redis.exceptions.ConnectionError("master down (test)"))
                raise AssertionError("a settle went on after its withdraw failed")
            try:
                result = _perform(client, scripts, op, None, None)
            except redis.exceptions.ResponseError as exc:  # (thrown in, as ``drive`` does)
                flows[i] = (flow, flow.throw(exc))
            else:
                flows[i] = (flow, flow.send(result))
        except (StopIteration, redis.exceptions.ConnectionError):
            del flows[i]
        except Exception as exc:  # (a settle giving up, "kept changing", ends)
            if "kept changing" not in str(exc) and "fixed at" not in str(exc):
                raise
            del flows[i]


RUNS = 600


def _run(client: Any, scripts: Scripts, namespace: str, seed: int) -> set[int]:
    """One race (``seed``) from a settled namespace, then one settle: the layouts holding a
    copy that is not of the count stored ({} if none)."""
    GroupCoordinator(client, CoordinatorConfig(
        namespace=namespace, num_partitions=random.Random(seed).choice(COUNTS))).start()
    _race(client, scripts, namespace, seed)
    settled = drive(client, scripts, settle_flow(namespace, None, None))
    stored = int(client.hget(settings_key(namespace), "num_partitions"))
    assert settled.config.num_partitions == stored
    assert all(client.exists(PartitionKeys(namespace, p, stored).cfg) for p in range(stored))
    return _layouts(client, namespace) - {stored}


def test_no_layout_is_left_behind_by_racing_settles_and_lost_settings(own_server, namespace):
    """Settles racing (2 to 4, counts 3, 5 or 7, changing it or adopting it) while the settings
    hash is lost (up to twice) and withdraws fail; then one settle, as any later process does.
    Before, a loss while a layout's deletion was pending (its ``retire:`` mark in the lost
    hash), or two losses where the re-establishing settle never read that layout, left it in
    place (about 1 run in 100 here): its copies stayed, and a process that had settled on it
    was never refused, so it ran its own copy of every group it served. Every copy is now of
    the count stored (``SWEEP``). Seeded, ``RUNS`` runs, each in its own namespace.

    On a server of its own: each run scans the whole server a few times (sweeps, ``_layouts``,
    the clean-up), and the session's server holds every earlier test's keys (tens of thousands
    late in a run), which made this test take a minute in the suite instead of seconds."""
    client = own_server.client()
    scripts = Scripts(client)
    scripts.load()
    left: dict[int, set[int]] = {}
    try:
        for seed in range(RUNS):
            ns = f"{namespace}.{seed}"
            try:
                if stale := _run(client, scripts, ns, seed):
                    left[seed] = stale
            finally:  # (each sweep scans the server: keep it small)
                client.delete(*client.scan_iter(match=f"{ns}:*", count=1000))
    finally:
        client.close()
    assert left == {}


@pytest.mark.parametrize("page", [1, 1000])
def test_a_layout_whose_withdraw_failed_is_retired_after_the_settings_are_lost(
        redis_client, namespace, monkeypatch, page):
    """10 -> 20, and the deletion of the 10 layout rolled back (a failover of the masters
    holding it to replicas that missed it: its copies back, and the marks the deletion left in
    its partitions gone), while the settings hash, its ``retire:10`` mark removed, kept the
    change. Then the settings hash is lost, and a worker establishes it again from the anchors
    (20), reading only the 20 layout. Before, the 10 layout's copies stayed for good: a process
    still on 10 was never refused and ran its own copy of its groups. Every copy of the
    namespace is looked for after a re-establishment now (a SCAN of every master; ``page`` 1
    makes the cluster's scan start again with larger pages), and the 10 layout is retired."""
    import rcoord.settings

    monkeypatch.setattr(rcoord.settings, "SCAN_COUNT", page, raising=False)
    GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace,
                                                     num_partitions=10)).start()
    layout = [PartitionKeys(namespace, p, 10) for p in range(10)]
    old = {pk: redis_client.hgetall(pk.cfg) for pk in layout}
    GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace,
                                                     num_partitions=20)).start()
    for pk, copy in old.items():  # (the rollback)
        redis_client.delete(f"{pk.prefix}:withdrawn")
        redis_client.hset(pk.cfg, mapping=copy)
    assert _layouts(redis_client, namespace) == {10, 20}
    redis_client.delete(settings_key(namespace))
    worker = GroupCoordinator(redis_client, CoordinatorConfig(namespace=namespace, **FAST)).start()
    assert worker.config.num_partitions == 20
    assert _layouts(redis_client, namespace) == {20}
    assert SWEEP.encode() not in redis_client.hgetall(settings_key(namespace))
    assert not [k for k in redis_client.hgetall(settings_key(namespace)) if k.startswith(b"re")]


def test_a_left_layout_newer_than_the_settings_re_established_is_retired(
        single_client, namespace):
    """The settings hash and the anchors were lost; the 3 layout, whose retire mark went with
    the hash, holds a newer version (9) than the 7 layout a process re-establishes from (1).
    The deletion spares copies newer than the settings (a change back writes those), so the
    settings first move up to that version; the 7 layout is copied again at it, and a later
    change back to 3 writes its copies (the old ones refused it)."""
    GroupCoordinator(single_client, CoordinatorConfig(namespace=namespace,
                                                      num_partitions=7)).start()
    stale = [PartitionKeys(namespace, p, 3).cfg for p in range(3)]
    for key in stale:
        single_client.hset(key, mapping={"version": "9", "num_partitions": "3"})
    single_client.delete(settings_key(namespace), *anchor_keys(namespace))
    scripts = Scripts(single_client)
    scripts.load()
    settled = drive(single_client, scripts,
                    settle_flow(namespace, None, CoordinatorConfig(namespace=namespace,
                                                                   num_partitions=7)))
    assert _layouts(single_client, namespace) == {7}
    assert settled.config.num_partitions == 7 and settled.version >= 9
    back = GroupCoordinator(single_client, CoordinatorConfig(namespace=namespace,
                                                             num_partitions=3)).start()
    assert back.config.num_partitions == 3
    assert _layouts(single_client, namespace) == {3}


def test_a_new_namespace_is_not_scanned(single_client, namespace):
    """The first process of a namespace finds nothing: no layout can be left, so no scan."""
    scanned: list[Any] = []
    flow = settle_flow(namespace, None, None)
    scripts = Scripts(single_client)
    scripts.load()
    op = next(flow)
    try:
        while True:
            if isinstance(op, Command) and op.args[0] == "SCAN":
                scanned.append(op)
            op = flow.send(_perform(single_client, scripts, op, None, None))
    except StopIteration:
        pass
    assert scanned == []
    assert SWEEP.encode() not in single_client.hgetall(settings_key(namespace))


@pytest.mark.parametrize("backend", ["single", "cluster"], indirect=True)
def _a_5_layout_left_then_settings_lost(client: Any, namespace: str) -> None:
    """Settings at 7 partitions beside a 5 layout whose retire mark was lost with them: the
    settings hash is gone too."""
    GroupCoordinator(client, CoordinatorConfig(namespace=namespace, num_partitions=7)).start()
    for p in range(5):
        client.hset(PartitionKeys(namespace, p, 5).cfg,
                    mapping={"version": "1", "num_partitions": "5"})
    client.delete(settings_key(namespace))


def test_the_asyncio_coordinator_retires_a_left_layout_too(redis_client, backend, namespace,
                                                           monkeypatch):
    """The scan is a flow operation: the asyncio driver runs it on one node and on a cluster
    (every master; one-key pages make the cluster's scan start again with larger ones)."""
    import redis.asyncio
    import redis.asyncio.cluster

    import rcoord.settings
    from rcoord.asyncio import AsyncGroupCoordinator

    monkeypatch.setattr(rcoord.settings, "SCAN_COUNT", 1, raising=False)
    _a_5_layout_left_then_settings_lost(redis_client, namespace)
    port = (redis_client.get_default_node().port if backend == "cluster"
            else redis_client.connection_pool.connection_kwargs["port"])

    async def start() -> int:
        client: Any = (redis.asyncio.cluster.RedisCluster(host="127.0.0.1", port=port)
                       if backend == "cluster" else redis.asyncio.Redis(host="127.0.0.1",
                                                                        port=port))
        try:
            coord = await AsyncGroupCoordinator(client, namespace).start()
            return int(coord.config.num_partitions)
        finally:
            await client.aclose()

    assert asyncio.run(start()) == 7
    assert _layouts(redis_client, namespace) == {7}


def _scan_failing(flow: Generator[Any, Any, Any]) -> Generator[Any, Any, Any]:
    """``flow`` with its SCANs failing, as a cluster's fail while one master is down."""
    op = next(flow)
    while True:
        try:
            if isinstance(op, Command) and op.args[0] == "SCAN":
                op = flow.throw(redis.exceptions.ConnectionError("master down (test)"))
                continue
            op = flow.send((yield op))
        except StopIteration as done:
            return done.value


def test_a_search_that_cannot_reach_every_master_waits_for_the_next_settle(
        single_client, namespace):
    """The settings were lost and a master is down while they are established again: the
    search for layouts left behind cannot list that master's keys. The settle goes on (the
    groups of the masters that answer are served) and leaves the request (``sweep``) for the
    next settle, which retires the 5 layout."""
    _a_5_layout_left_then_settings_lost(single_client, namespace)
    scripts = Scripts(single_client)
    scripts.load()
    settled = drive(single_client, scripts, _scan_failing(settle_flow(namespace, None, None)))
    assert settled.config.num_partitions == 7
    assert single_client.hexists(settings_key(namespace), SWEEP)
    assert _layouts(single_client, namespace) == {5, 7}
    drive(single_client, scripts, settle_flow(namespace, None, None))
    assert not single_client.hexists(settings_key(namespace), SWEEP)
    assert _layouts(single_client, namespace) == {7}


def _until(client: Any, scripts: Scripts, flow: Generator[Any, Any, Any], op: Any,
           stop: Any) -> Any:
    """Perform ``flow``'s operations from ``op`` on until one for which ``stop`` holds (not
    performed); that one."""
    while not stop(op):
        op = flow.send(_perform(client, scripts, op, None, None))
    return op


def _finish(client: Any, scripts: Scripts, flow: Generator[Any, Any, Any], op: Any) -> Any:
    """Perform the rest of ``flow`` from ``op``; what it returns."""
    try:
        while True:
            op = flow.send(_perform(client, scripts, op, None, None))
    except StopIteration as done:
        return done.value


def _is(name: str) -> Any:
    """Whether an operation is the settings script's ``name`` op."""
    return lambda op: isinstance(op, Script) and op.args[0] == name


def test_the_sweep_moving_the_version_up_keeps_an_update_made_meanwhile(single_client,
                                                                        namespace):
    """The settings were re-established after a loss (at version 1, with ``sweep``) and a left
    layout holds a newer version (9). While the sweep looks, a process starting names a lowered
    minimum session timeout (``update``: version 2). Before, the sweep then moved the settings
    up to 9 with the values it had read before that update (``adopt`` writes over any older
    version): the update was gone from the hash, though its process's settle, whose own sweep
    found the version already moved, returned it in force (named values win in the config).
    That process believed 100 while the namespace stored 6000, and the next settle anywhere
    rewrote its copies to 6000. The sweep now moves the version alone."""
    GroupCoordinator(single_client, CoordinatorConfig(namespace=namespace,
                                                      num_partitions=7)).start()
    for p in range(3):  # (a layout whose retire mark was lost with the settings)
        single_client.hset(PartitionKeys(namespace, p, 3).cfg,
                           mapping={"version": "9", "num_partitions": "3"})
    key = settings_key(namespace)
    single_client.delete(key, *anchor_keys(namespace))
    scripts = Scripts(single_client)
    scripts.load()
    known = CoordinatorConfig(namespace=namespace, num_partitions=7)
    sweeping = settle_flow(namespace, None, known)
    at = _until(single_client, scripts, sweeping, next(sweeping), _is("adopt"))
    assert single_client.hget(key, "version") == b"1"
    named = CoordinatorConfig(namespace=namespace, group_min_session_timeout_ms=100)
    starting = settle_flow(namespace, named, None)
    late = _until(single_client, scripts, starting, next(starting), _is("mark"))
    assert single_client.hget(key, "group_min_session_timeout_ms") == b"100"
    at = sweeping.send(_perform(single_client, scripts, at, None, None))  # (the adopt)
    started = _finish(single_client, scripts, starting, late)
    settled = _finish(single_client, scripts, sweeping, at)
    assert started.config.group_min_session_timeout_ms == 100
    assert single_client.hget(key, "group_min_session_timeout_ms") == b"100"
    assert settled.config.num_partitions == 7 and _layouts(single_client, namespace) == {7}
    again = drive(single_client, scripts, settle_flow(namespace, None, None))
    assert again.config.group_min_session_timeout_ms == 100
