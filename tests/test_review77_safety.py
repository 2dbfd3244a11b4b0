"""Review 77 ("a group must never exist twice", two namespaces on one Redis): reproductions of
keys of one namespace that another namespace's operations write or delete. Each test FAILS on
the code it was written against.

A namespace may contain ``:`` (``rcoord.names``), and the Spark replay record of a group is
``<ns>:replays:<group>`` (``rcoord.keys.replays_key``), with the group id, which may hold any
character, after it. So namespace ``N``'s replay record of group ``settings`` is namespace
``N:replays``'s settings hash, and of group ``x:{<tag>}:o:g`` namespace ``N:replays:x``'s
committed offsets of group ``g``. ``delete_groups`` deletes the record after the group
(``GroupSteps.delete_groups``), so deleting an Empty group of one namespace deletes another
namespace's settings or offsets; ``record_replay`` writes into them and sets them to expire.
"""

from __future__ import annotations

from typing import Any

from conftest import FAST

from rcoord import Errors, GroupCoordinator, TopicPartition
from rcoord.config import CoordinatorConfig
from rcoord.keys import GroupKeys, settings_key
from rcoord.spark.plan import Position

TP = TopicPartition("orders", 0)


def _coordinator(client: Any, namespace: str) -> GroupCoordinator:
    return GroupCoordinator(client, CoordinatorConfig(namespace=namespace, **FAST)).start()


def test_deleting_a_group_leaves_another_namespaces_offsets(redis_client: Any,
                                                            namespace: str) -> None:
    other = f"{namespace}:replays:x"  # a valid namespace (names.NAMESPACE_RULE)
    victim = _coordinator(redis_client, other)
    assert victim.commit_offsets("g", {TP: 7})[TP] == Errors.NONE
    offsets = GroupKeys.of(other, victim.config.num_partitions, "g").offsets
    assert redis_client.exists(offsets)

    # The group in `namespace` whose replay record is that key: "x:{<tag>}:o:g".
    gid = offsets[len(f"{namespace}:replays:"):]
    mine = _coordinator(redis_client, namespace)
    assert mine.commit_offsets(gid, {TP: 1})[TP] == Errors.NONE
    assert mine.delete_groups([gid]) == {gid: Errors.NONE}

    kept = victim.fetch_offsets("g").offsets.get(TP)
    assert kept is not None and kept.offset == 7, "the other namespace's offsets were deleted"


def test_deleting_a_group_leaves_another_namespaces_settings(redis_client: Any,
                                                             namespace: str) -> None:
    other = f"{namespace}:replays"
    _coordinator(redis_client, other)
    assert redis_client.exists(settings_key(other))

    mine = _coordinator(redis_client, namespace)
    assert mine.commit_offsets("settings", {TP: 1})[TP] == Errors.NONE
    assert mine.delete_groups(["settings"]) == {"settings": Errors.NONE}

    assert redis_client.exists(settings_key(other))


def test_a_replay_record_leaves_another_namespaces_settings(redis_client: Any,
                                                            namespace: str) -> None:
    from rcoord.spark.replays import record_replay

    other = f"{namespace}:replays"
    _coordinator(redis_client, other)
    before = redis_client.hgetall(settings_key(other))

    record_replay(redis_client, namespace, "settings", Position({}, generation=3, member="m"),
                  4)

    assert redis_client.pttl(settings_key(other)) == -1  # no expiry set on the settings
    assert redis_client.hgetall(settings_key(other)) == before
