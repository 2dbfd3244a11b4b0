"""A start repairs the settings copies it finds wrong, and writes nothing when all are right.

Every start settles the namespace (``rcoord.settings``): it reads every copy (one per
partition, plus the anchors) and writes only those that are missing, older or different, so
many workers starting against a settled namespace only read. The copy writes are counted as
the ``settings`` function calls this process sends (the ``nodes`` fixture) and by the settle's
own report (``Settled.written``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Generator
from typing import Any

import pytest

from rcoord import CoordinatorConfig, GroupCoordinator
from rcoord.flow import Flow, drive
from rcoord.keys import PartitionKeys, anchor_keys, settings_key
from rcoord.scripts import Scripts
from rcoord.settings import settle, settle_flow


@pytest.fixture
def nodes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the ``settings`` function calls this process sends (every FCALL goes through
    ``Scripts.command``, pipelined or not, with either driver). Counting here rather than with
    the servers' INFO commandstats keeps activity other tests left on the shared servers out of
    the count."""
    count = [0]
    original = Scripts.command

    def counting(self: Scripts, name: str, keys: Any, args: Any) -> tuple[Any, ...]:
        if name == "settings":
            count[0] += 1
        return original(self, name, keys, args)

    monkeypatch.setattr(Scripts, "command", counting)
    return count


def _fcalls(nodes: list[int]) -> int:
    return nodes[0]


def _all_copies(namespace: str, num_partitions: int) -> list[str]:
    return [PartitionKeys(namespace, p, num_partitions).cfg for p in range(num_partitions)] + list(
        anchor_keys(namespace))


def _text(raw: dict[bytes, bytes]) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in raw.items()}


def _scripts(client: Any) -> Scripts:
    scripts = Scripts(client)
    scripts.load()
    return scripts


def _start(client: Any, namespace: str, **named: Any) -> GroupCoordinator:
    return GroupCoordinator(client, CoordinatorConfig(namespace=namespace, **named)).start()


@pytest.mark.parametrize("count", [50, 10])  # a worker naming nothing expects 50: read twice
def test_a_start_with_every_copy_in_place_writes_none(redis_client, namespace, nodes, count):
    _start(redis_client, namespace, num_partitions=count)
    copies = _all_copies(namespace, count)
    before = {k: _text(redis_client.hgetall(k)) for k in copies}
    assert all(before.values()) and len(before) == count + 16
    calls = _fcalls(nodes)
    second = _start(redis_client, namespace)
    assert _fcalls(nodes) == calls  # no settings function ran: nothing was written
    assert second.config.num_partitions == count and second.settings_version == 1
    assert {k: _text(redis_client.hgetall(k)) for k in copies} == before
    assert settle(redis_client, _scripts(redis_client), namespace, None, None).written == ()


@pytest.mark.parametrize("which", ["partition", "anchor"])
def test_a_lost_copy_is_restored_by_the_next_start_and_only_it(redis_client, namespace, nodes,
                                                               which):
    _start(redis_client, namespace, num_partitions=50, group_max_size=9)
    lost = PartitionKeys(namespace, 17, 50).cfg if which == "partition" else anchor_keys(namespace)[5]
    want = _text(redis_client.hgetall(lost))
    redis_client.delete(lost)  # a failover to a replica that never got it
    calls = _fcalls(nodes)
    _start(redis_client, namespace)
    assert _fcalls(nodes) == calls + 1
    assert _text(redis_client.hgetall(lost)) == want
    assert want["group_max_size"] == "9"

    redis_client.delete(lost)
    settled = settle(redis_client, _scripts(redis_client), namespace, None, None)
    assert settled.written == (lost,)
    assert _text(redis_client.hgetall(lost)) == want


def test_an_older_or_different_copy_is_rewritten(redis_client, namespace):
    _start(redis_client, namespace, num_partitions=10)
    _start(redis_client, namespace, group_max_size=9)  # version 2
    scripts = _scripts(redis_client)
    older, other = PartitionKeys(namespace, 3, 10).cfg, PartitionKeys(namespace, 4, 10).cfg
    want = _text(redis_client.hgetall(older))
    assert want["version"] == "2"
    for key, version, max_size in ((older, "1", "7"), (other, "2", "7")):
        # An older copy (a replica that missed the update); the same version with other values
        # (settings re-established at version 1 after a loss that spared this copy).
        redis_client.delete(key)
        fields = {**want, "group_max_size": max_size}
        fields.pop("version")
        scripts.call("settings", [key], ["copy", version, *[x for kv in fields.items() for x in kv]])
        assert _text(redis_client.hgetall(key))["group_max_size"] == "7"
    settled = settle(redis_client, scripts, namespace, None, None)
    assert sorted(settled.written) == sorted([older, other])
    assert _text(redis_client.hgetall(older)) == want == _text(redis_client.hgetall(other))


def _then(flow: Flow[Any], hook: Any) -> Generator[Any, Any, Any]:
    """``flow``, with ``hook()`` run after its first operation (the read) came back: another
    process acting between this settle's read and its writes."""
    reply = yield next(flow)
    hook()
    try:
        op = flow.send(reply)
        while True:
            op = flow.send((yield op))
    except StopIteration as done:
        return done.value


def test_a_writer_racing_with_a_newer_version_wins_over_a_repair(redis_client, namespace):
    """This settle read version 1 with one copy lost; before it repairs the copy, another process
    updates the settings (version 2) and writes every copy. The repair at version 1 is refused,
    so the settle reads again and adopts version 2: no copy is left older."""
    _start(redis_client, namespace, num_partitions=10)
    lost = PartitionKeys(namespace, 6, 10).cfg
    redis_client.delete(lost)
    settled = drive(redis_client, _scripts(redis_client),
                    _then(settle_flow(namespace, None, None),
                          lambda: _start(redis_client, namespace, group_max_size=9)))
    assert settled.version == 2 and settled.config.group_max_size == 9
    assert settled.written == ()  # its one write was refused; round 2 found every copy right
    for key in _all_copies(namespace, 10):
        assert _text(redis_client.hgetall(key))["version"] == "2", key


def test_a_copy_newer_than_the_settings_read_means_read_again(redis_client, namespace):
    """A pipeline is not atomic: this settle may read the settings hash before another process
    updates it and a copy after that process rewrote it. The newer copy is not written over,
    and the settle reads again and adopts the newer settings."""
    _start(redis_client, namespace, num_partitions=10)
    scripts = _scripts(redis_client)
    ahead = PartitionKeys(namespace, 2, 10).cfg
    current = _text(redis_client.hgetall(ahead))
    fields = {k: v for k, v in current.items() if k != "version"}
    fields["group_max_size"] = "9"
    scripts.call("settings", [ahead], ["copy", "2", *[x for kv in fields.items() for x in kv]])
    settled = drive(redis_client, scripts,
                    _then(settle_flow(namespace, None, None),
                          lambda: _start(redis_client, namespace, group_max_size=9)))
    assert settled.version == 2 and settled.config.group_max_size == 9
    assert _text(redis_client.hgetall(ahead)) == {**fields, "version": "2"}
    assert redis_client.hget(settings_key(namespace), "version") == b"2"


def test_the_asyncio_coordinator_reads_and_repairs_the_same_way(request, backend, redis_client,
                                                                namespace, nodes):
    """The asyncio driver runs the same flow: its read pipeline spans every copy's slot."""
    from async_driver import async_client_factory

    from rcoord.asyncio import AsyncGroupCoordinator

    _start(redis_client, namespace, num_partitions=50)
    lost = PartitionKeys(namespace, 31, 50).cfg
    want = _text(redis_client.hgetall(lost))

    async def start() -> int:
        client = async_client_factory(request, backend)()
        try:
            coord = await AsyncGroupCoordinator(client, namespace).start()
            return coord.config.num_partitions
        finally:
            await client.aclose()

    calls = _fcalls(nodes)
    assert asyncio.run(start()) == 50
    assert _fcalls(nodes) == calls
    redis_client.delete(lost)
    assert asyncio.run(start()) == 50
    assert _fcalls(nodes) == calls + 1
    assert _text(redis_client.hgetall(lost)) == want
