"""A start repairs the settings copies it finds wrong, and writes nothing when all are right.

Every start settles the namespace (``rcoord.settings``): it reads every copy (one per
partition, plus the anchors) and writes only those that are missing, older or different, so
many workers starting against a settled namespace only read. The copy writes are counted as
the ``settings`` function calls this process sends (the ``nodes`` fixture) and by the settle's
own report (``Settled.written``).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Generator
from typing import Any

import pytest
import redis

from rcoord import CoordinatorConfig, GroupCoordinator
from rcoord.flow import Flow, drive
from rcoord.keys import PartitionKeys, anchor_keys, settings_key
from rcoord.scripts import Scripts
from rcoord.settings import ORIGIN, settle, settle_flow


@pytest.fixture
def nodes(monkeypatch: pytest.MonkeyPatch, namespace: str) -> list[int]:
    """Counts the ``settings`` function calls this process sends for this test's namespace
    (every FCALL goes through ``Scripts.command``, pipelined or not, with either driver).
    Counting here rather than with the servers' INFO commandstats, and only this namespace's
    keys, keeps activity other tests left on the shared servers out of the count."""
    count = [0]
    original = Scripts.command

    def counting(self: Scripts, name: str, keys: Any, args: Any) -> tuple[Any, ...]:
        if name == "settings" and any(namespace in _text_of(k) for k in keys):
            count[0] += 1
        return original(self, name, keys, args)

    monkeypatch.setattr(Scripts, "command", counting)
    return count


def _text_of(key: Any) -> str:
    return key.decode() if isinstance(key, bytes) else str(key)


def _fcalls(nodes: list[int]) -> int:
    return nodes[0]


def _all_copies(namespace: str, num_partitions: int) -> list[str]:
    return [PartitionKeys(namespace, p, num_partitions).cfg for p in range(num_partitions)] + list(
        anchor_keys(namespace))


def _text(raw: dict[bytes, bytes]) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in raw.items()}


def _settings(client: Any, namespace: str) -> dict[str, str]:
    """The settings hash as the copies hold it: without the establishment's origin, which
    only the hash keeps (``rcoord.settings.ORIGIN``)."""
    return {k: v for k, v in _text(client.hgetall(settings_key(namespace))).items()
            if k != ORIGIN}


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
    return (yield from _then_at(flow, 1, hook))


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


# -- re-establishing after the settings hash and every anchor are lost --------------------------


def _lose_settings_and_anchors(client: Any, namespace: str) -> None:
    """A failover to replicas that missed the settings hash and every anchor, but not the
    partition copies (they live on other slots, so other masters)."""
    for key in [settings_key(namespace), *anchor_keys(namespace)]:
        client.delete(key)


def _at_version_3(client: Any, namespace: str, count: int) -> dict[str, str]:
    """Establish the namespace with ``count`` partitions, then update it twice: version 3.
    Returns what every copy holds."""
    _start(client, namespace, num_partitions=count)
    _start(client, namespace, group_max_size=9)
    _start(client, namespace, group_min_session_timeout_ms=77)
    held = _text(client.hgetall(PartitionKeys(namespace, 0, count).cfg))
    assert held["version"] == "3" and held["group_max_size"] == "9"
    return held


def _assert_consistent(client: Any, namespace: str, count: int, want: dict[str, str]) -> None:
    """The settings hash and every copy (each partition's and each anchor) hold ``want``."""
    assert _settings(client, namespace) == want
    for key in _all_copies(namespace, count):
        assert _text(client.hgetall(key)) == want, key


def test_settings_lost_with_every_anchor_are_taken_from_the_partition_copies(redis_client,
                                                                            namespace):
    """Before: the settings were re-established at version 1 from the caller's defaults, the
    surviving copies at version 3 counted as newer in every round, and every start raised
    ConfigError for good."""
    want = _at_version_3(redis_client, namespace, 50)
    _lose_settings_and_anchors(redis_client, namespace)
    coord = _start(redis_client, namespace)
    assert coord.settings_version == 3
    assert coord.config.group_max_size == 9 and coord.config.group_min_session_timeout_ms == 77
    assert coord.config.num_partitions == 50
    _assert_consistent(redis_client, namespace, 50, want)
    assert _start(redis_client, namespace).settings_version == 3  # and it stays so


def test_a_running_coordinator_recovers_its_layout_from_the_partition_copies(redis_client,
                                                                              namespace):
    """A coordinator that used 10 partitions reads that layout's copies (a fresh process that
    names nothing would look at 50): it adopts them, and so does everyone after it."""
    want = _at_version_3(redis_client, namespace, 10)
    running = _start(redis_client, namespace)
    assert running.config.num_partitions == 10
    _lose_settings_and_anchors(redis_client, namespace)
    assert running.resettle().group_max_size == 9
    assert running.settings_version == 3
    _assert_consistent(redis_client, namespace, 10, want)
    fresh = _start(redis_client, namespace)
    assert fresh.config.num_partitions == 10 and fresh.settings_version == 3


def test_the_asyncio_coordinator_recovers_the_same_way(request, backend, redis_client,
                                                      namespace):
    from async_driver import async_client_factory

    from rcoord.asyncio import AsyncGroupCoordinator

    want = _at_version_3(redis_client, namespace, 50)
    _lose_settings_and_anchors(redis_client, namespace)

    async def start() -> tuple[int, int, int]:
        client = async_client_factory(request, backend)()
        try:
            coord = await AsyncGroupCoordinator(client, namespace).start()
            return coord.settings_version, coord.config.num_partitions, coord.config.group_max_size
        finally:
            await client.aclose()

    assert asyncio.run(start()) == (3, 50, 9)
    _assert_consistent(redis_client, namespace, 50, want)


def test_a_namespace_that_lost_everything_takes_the_callers_settings_at_version_1(
        redis_client, namespace):
    _at_version_3(redis_client, namespace, 10)
    for key in list(redis_client.scan_iter(match=f"{namespace}:*", count=1000)):
        redis_client.delete(key)
    coord = _start(redis_client, namespace, num_partitions=7, group_max_size=5)
    assert coord.settings_version == 1
    assert coord.config.num_partitions == 7 and coord.config.group_max_size == 5
    want = _settings(redis_client, namespace)
    assert want["version"] == "1" and want["group_max_size"] == "5"
    _assert_consistent(redis_client, namespace, 7, want)


def _older_copy(client: Any, key: str, held: dict[str, str], version: str, **values: Any) -> None:
    """Replace the copy at ``key`` with ``held`` at ``version`` (and ``values``): what a replica
    that missed later writes holds."""
    client.delete(key)
    fields = {**{k: v for k, v in held.items() if k != "version"},
              **{k: str(v) for k, v in values.items()}}
    _scripts(client).call("settings", [key], ["copy", version,
                                              *[x for kv in fields.items() for x in kv]])


def test_a_surviving_anchor_names_the_count_and_its_layout_is_read(redis_client, namespace):
    """One anchor survives, older (version 2) than its layout's copies (version 3), and the
    process guesses another count (it names nothing: 50). The anchor names 10; the settle reads
    the 10 copies before it proposes, so it establishes version 3, not the anchor's 2 (which
    the copies would then refuse in every round)."""
    want = _at_version_3(redis_client, namespace, 10)
    _lose_settings_and_anchors(redis_client, namespace)
    anchor = anchor_keys(namespace)[7]
    _older_copy(redis_client, anchor, want, "2", group_min_session_timeout_ms=6000)
    coord = _start(redis_client, namespace)
    assert coord.config.num_partitions == 10 and coord.settings_version == 3
    assert coord.config.group_min_session_timeout_ms == 77
    _assert_consistent(redis_client, namespace, 10, want)


def test_copies_of_another_layout_do_not_decide_the_count_while_an_anchor_survives(
        redis_client, namespace, caplog):
    """Copies left under the guessed count (50) by an older layout hold a higher version (5)
    than the surviving anchors (10, version 3): the anchors, read by every process whatever its
    guess, decide the count. The settings take the highest version read, so those copies
    refuse no later write: moving the namespace to 50 partitions rewrites them."""
    want = _at_version_3(redis_client, namespace, 10)
    redis_client.delete(settings_key(namespace))
    for p in range(0, 50, 7):
        _older_copy(redis_client, PartitionKeys(namespace, p, 50).cfg, want, "5",
                    num_partitions=50, group_max_size=33)
    coord = _start(redis_client, namespace)
    assert coord.config.num_partitions == 10 and coord.config.group_max_size == 9
    assert coord.settings_version == 5
    assert "copies of another layout" in caplog.text
    _assert_consistent(redis_client, namespace, 10, {**want, "version": "5"})
    moved = _start(redis_client, namespace, num_partitions=50)
    assert moved.settings_version == 6 and moved.config.group_max_size == 9
    _assert_consistent(redis_client, namespace, 50,
                       {**want, "version": "6", "num_partitions": "50"})


def test_a_copy_naming_another_count_than_its_layout_does_not_decide(redis_client, namespace):
    """With no anchor left, the partition copies under the guessed count decide, but only those
    that name that count: a copy naming another one was not written by a settle of this layout
    (it is ignored, though its version still counts)."""
    want = _at_version_3(redis_client, namespace, 50)
    _lose_settings_and_anchors(redis_client, namespace)
    _older_copy(redis_client, PartitionKeys(namespace, 11, 50).cfg, want, "4", num_partitions=10)
    coord = _start(redis_client, namespace)
    assert coord.config.num_partitions == 50 and coord.settings_version == 4
    _assert_consistent(redis_client, namespace, 50, {**want, "version": "4"})


def test_coordinators_racing_the_recovery_agree(redis_client, namespace):
    want = _at_version_3(redis_client, namespace, 50)
    _lose_settings_and_anchors(redis_client, namespace)
    barrier = threading.Barrier(4)
    results: list[tuple[int, int, int]] = []
    errors: list[BaseException] = []

    def one() -> None:
        try:
            barrier.wait(10)
            coord = _start(redis_client, namespace)
            results.append((coord.settings_version, coord.config.num_partitions,
                            coord.config.group_max_size))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == [] and results == [(3, 50, 9)] * 4
    _assert_consistent(redis_client, namespace, 50, want)


def test_processes_guessing_different_layouts_racing_the_recovery_agree(redis_client, namespace):
    """Half know the surviving layout (10, version 3), half name nothing and find no copy
    under 50, so propose the defaults at version 1. Whichever proposal ``establish`` keeps,
    every process adopts it, and no copy it checks is left newer than the settings."""
    _at_version_3(redis_client, namespace, 10)
    _lose_settings_and_anchors(redis_client, namespace)
    scripts = _scripts(redis_client)
    barrier = threading.Barrier(4)
    results: list[tuple[int, int]] = []
    errors: list[BaseException] = []

    def one(i: int) -> None:
        known = CoordinatorConfig(namespace=namespace, num_partitions=10) if i % 2 else None
        try:
            barrier.wait(10)
            settled = settle(redis_client, scripts, namespace, None, known)
            results.append((settled.version, settled.config.num_partitions))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == [] and len(results) == 4 and len(set(results)) == 1
    version, count = results[0]
    assert (version, count) in {(3, 10), (1, 50)}
    stored = _settings(redis_client, namespace)
    assert stored["version"] == str(version) and stored["num_partitions"] == str(count)
    _assert_consistent(redis_client, namespace, count, stored)


# -- a settings hash older than its copies (rolled back, not lost) -----------------------------


def _roll_back(client: Any, namespace: str, count: int) -> tuple[dict[str, str], dict[str, str]]:
    """After two updates (version 3 everywhere), put the version-2 settings back into the hash
    while every copy keeps version 3: a failover to a replica that missed the last update.
    Returns (what the hash held at version 2, what every copy holds at version 3)."""
    _start(client, namespace, num_partitions=count)
    _start(client, namespace, group_max_size=9)
    two = _settings(client, namespace)
    assert two["version"] == "2"
    _start(client, namespace, group_min_session_timeout_ms=77)
    three = _settings(client, namespace)
    assert three["version"] == "3"
    client.hset(settings_key(namespace), mapping=two)
    assert _settings(client, namespace) == two
    for key in _all_copies(namespace, count):
        assert _text(client.hgetall(key)) == three, key
    return two, three


def test_a_settings_hash_older_than_its_copies_adopts_the_newest_copy(redis_client, namespace,
                                                                      nodes):
    """Before: every round read copies newer than the hash, the copy op refused to write the
    older version over them, and every start raised ConfigError ("kept changing") for good.
    Now the second round, still finding the hash behind a copy the first round read, adopts
    that copy: one ``settings`` call (the adopt), no copy written (they all held it)."""
    two, three = _roll_back(redis_client, namespace, 50)
    assert two["group_min_session_timeout_ms"] != "77"
    calls = _fcalls(nodes)
    coord = _start(redis_client, namespace)
    assert _fcalls(nodes) == calls + 1
    assert coord.settings_version == 3
    assert coord.config.group_max_size == 9 and coord.config.group_min_session_timeout_ms == 77
    _assert_consistent(redis_client, namespace, 50, three)
    assert _start(redis_client, namespace).settings_version == 3  # and it stays so


def test_a_rolled_back_hash_with_lost_copies_adopts_and_repairs_them(redis_client, namespace):
    """Some copies were lost too, and one partition copy names another count than its layout
    at a newer version still (no settle writes such a copy): the hash adopts the newest usable
    copy at the highest version read, so that copy refuses no repair, and every copy is
    rewritten to agree."""
    _, three = _roll_back(redis_client, namespace, 10)
    lost = [PartitionKeys(namespace, 4, 10).cfg, anchor_keys(namespace)[2]]
    for key in lost:
        redis_client.delete(key)
    _older_copy(redis_client, PartitionKeys(namespace, 7, 10).cfg, three, "4", num_partitions=3)
    settled = settle(redis_client, _scripts(redis_client), namespace, None, None)
    assert settled.version == 4 and settled.config.group_min_session_timeout_ms == 77
    assert settled.config.num_partitions == 10
    want = {**three, "version": "4"}
    _assert_consistent(redis_client, namespace, 10, want)
    assert settle(redis_client, _scripts(redis_client), namespace, None, None).written == ()


def test_the_asyncio_coordinator_adopts_the_newest_copy_the_same_way(request, backend,
                                                                    redis_client, namespace):
    from async_driver import async_client_factory

    from rcoord.asyncio import AsyncGroupCoordinator

    _, three = _roll_back(redis_client, namespace, 50)

    async def start() -> tuple[int, int, int]:
        client = async_client_factory(request, backend)()
        try:
            coord = await AsyncGroupCoordinator(client, namespace).start()
            return (coord.settings_version, coord.config.group_max_size,
                    coord.config.group_min_session_timeout_ms)
        finally:
            await client.aclose()

    assert asyncio.run(start()) == (3, 9, 77)
    _assert_consistent(redis_client, namespace, 50, three)


def _run_threads(count: int, target: Any) -> list[BaseException]:
    """Run ``target(i)`` in ``count`` threads released together; the exceptions they raised."""
    barrier = threading.Barrier(count)
    errors: list[BaseException] = []

    def one(i: int) -> None:
        try:
            barrier.wait(10)
            target(i)
        except BaseException as exc:  # noqa: BLE001 - reported by the caller
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads)
    return errors


def test_coordinators_starting_together_on_a_rolled_back_hash_agree(redis_client, namespace):
    _, three = _roll_back(redis_client, namespace, 50)
    results: list[tuple[int, int, int]] = []

    def start(_: int) -> None:
        coord = _start(redis_client, namespace)
        results.append((coord.settings_version, coord.config.group_max_size,
                        coord.config.group_min_session_timeout_ms))

    assert _run_threads(4, start) == []
    assert results == [(3, 9, 77)] * 4
    _assert_consistent(redis_client, namespace, 50, three)


def test_an_update_racing_the_adoption_is_not_lost(redis_client, namespace):
    """Two processes start on a rolled-back hash together; one names group_max_size=11 (an
    update). Whoever adopts, the update lands on the adopted settings (version 4) and every
    process and copy ends there: neither the update nor the version-3 settings are lost."""
    _, three = _roll_back(redis_client, namespace, 50)
    results: list[int] = []

    def start(i: int) -> None:
        coord = _start(redis_client, namespace, **({"group_max_size": 11} if i == 0 else {}))
        results.append(coord.settings_version)

    assert _run_threads(4, start) == []
    assert len(results) == 4 and min(results) >= 3
    want = {**three, "group_max_size": "11", "version": "4"}
    _assert_consistent(redis_client, namespace, 50, want)
    assert _start(redis_client, namespace).settings_version == 4


def _then_at(flow: Flow[Any], n: int, hook: Any) -> Generator[Any, Any, Any]:
    """``flow``, with ``hook()`` run after its ``n``-th operation came back."""
    op = next(flow)
    try:
        for i in range(1, 10_000):
            reply = yield op
            if i == n:
                hook()
            op = flow.send(reply)
    except StopIteration as done:
        return done.value
    raise AssertionError("the flow did not end")


@pytest.mark.parametrize("writer", ["start", "update op"])
def test_an_update_between_the_second_read_and_the_adopt_wins(redis_client, namespace, writer):
    """This settle read the rolled-back hash twice (two rounds, so it adopts next); before its
    adopt, another process updates group_max_size to 11: a whole start (which adopts version 3
    itself, then updates: version 4), or the ``update`` op on the rolled-back hash (version 3,
    the version-2 settings with 11). Either way the hash already holds the version this settle
    would adopt, so its adopt writes nothing and it settles on the update: never lost."""
    two, three = _roll_back(redis_client, namespace, 50)
    scripts = _scripts(redis_client)

    def update() -> None:
        if writer == "start":
            _start(redis_client, namespace, group_max_size=11)
        else:
            scripts.call("settings", [settings_key(namespace)], ["update", "group_max_size", "11"])

    settled = drive(redis_client, scripts, _then_at(settle_flow(namespace, None, None), 2, update))
    want = ({**three, "group_max_size": "11", "version": "4"} if writer == "start"
            else {**two, "group_max_size": "11", "version": "3"})
    assert settled.version == int(want["version"]) and settled.config.group_max_size == 11
    _assert_consistent(redis_client, namespace, 50, want)


def test_adopt_writes_only_over_an_older_version(redis_client, namespace):
    """The op itself: an older hash takes the fields and version; the same or a newer version
    is kept (a racing update that got there first wins); no hash, nothing written."""
    scripts = _scripts(redis_client)
    key = settings_key(namespace)

    def adopt(version: str, **fields: Any) -> dict[str, str]:
        flat = [x for kv in fields.items() for x in (kv[0], str(kv[1]))]
        return _text(_hash_reply(scripts.call("settings", [key], ["adopt", version, *flat])))

    assert adopt("3", group_max_size=9) == {} and not redis_client.exists(key)
    redis_client.hset(key, mapping={"version": "2", "group_max_size": "5", "num_partitions": "7"})
    assert adopt("3", group_max_size=9) == {"version": "3", "group_max_size": "9",
                                            "num_partitions": "7"}
    assert adopt("3", group_max_size=1) == {"version": "3", "group_max_size": "9",
                                            "num_partitions": "7"}
    assert adopt("2", group_max_size=1)["group_max_size"] == "9"
    with pytest.raises(redis.ResponseError, match="RCOORD_BAD_ARGUMENT.*integer version"):
        scripts.call("settings", [key], ["adopt", "x", "group_max_size", "1"])


def _hash_reply(raw: Any) -> dict[bytes, bytes]:
    if isinstance(raw, dict):
        return raw
    return {raw[i]: raw[i + 1] for i in range(0, len(raw), 2)}
