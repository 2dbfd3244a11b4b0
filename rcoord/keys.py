"""Redis key names. Every key of a partition shares the partition's hash tag.

A group's keys, in the order every group script receives them as KEYS (``rcoord.contract``
GROUP_KEYS declares the order, by name, for both languages):

====  ==========================  ============================================================
 #    key                          contents
====  ==========================  ============================================================
 1    ``<ns>:{t}:cfg``             hash: the namespace settings, copied into this partition
 2    ``<ns>:{t}:groups``          set: ids of the groups in this partition
 3    ``<ns>:{t}:due``             zset: group id -> earliest deadline of that group (ms)
 4    ``<ns>:{t}:g:<group>``       hash: state, generation, protocol, leader, timers' arguments
 5    ``<ns>:{t}:m:<group>``       hash: member id -> member record (msgpack)
 6    ``<ns>:{t}:s:<group>``       hash: group instance id -> member id (static members)
 7    ``<ns>:{t}:p:<group>``       hash: pending member ids (KIP-394, awaiting their 2nd join)
 8    ``<ns>:{t}:j:<group>``       hash: member ids with a parked JoinGroup
 9    ``<ns>:{t}:y:<group>``       hash: member ids expected to send SyncGroup this generation
 10   ``<ns>:{t}:r:<group>``       hash: member id -> reply to its parked Join/SyncGroup
 11   ``<ns>:{t}:w:<group>``       stream: wake-ups for parked callers (XREAD BLOCK)
 12   ``<ns>:{t}:d:<group>``       zset: the group's timers (``hb:<member>``, ``join``, ``sync``,
                                  ``gc``; ``cj``, ``cs``: chunked work still to write, due at 0)
 13   ``<ns>:{t}:o:<group>``       hash: committed offsets (msgpack per partition)
 14   ``<ns>:{t}:h:<group>``       string: expires at the time the due index holds for the group
 15   ``<ns>:{t}:events``          stream: the partition's transitions and expiries (capped)
 16   ``<ns>:{t}:q:<group>``       zset: member id -> its join sequence number (the oldest leads)
====  ==========================  ============================================================

``<ns>:{t}:tail`` (same tag, no script touches it) is the id of the partition's last event the
coordinator service logged, so the partition's next lease holder logs from there on
(``rcoord.service.observe``).

``<ns>:{t}:withdrawn`` (same tag; the settings script alone) is the version at which this
partition's layout was withdrawn by a change of the partition count: a copy of the settings
no newer is refused there (``rcoord.settings._withdrawn``). It stays while the count differs.

``<ns>:{t}:a:<group>`` (same tag, no script touches it) is the short-lived claim with which one
parked caller applies a due deadline for the others; DeleteGroups deletes it after the group.

The shard channel named like key 3 (``<ns>:{t}:due``) carries a message whenever a script makes
a deadline the partition's earliest, so the lease holder never sleeps past it.

``<ns>:settings`` (no tag) holds the namespace settings for Python.

``<ns>:coordinators`` (no tag) is the registry of live coordinator processes, and
``<ns>:coordinator:{<ns>:coordinators}:<id>`` (tagged with the registry's name, so in its slot)
the claim of coordinator id ``<id>``: the incarnation of the one process that uses it
(``rcoord.service.leases``).

``<ns>:{}:replays:<group>`` (no tag: read and written alone; ``{}`` is none, so Redis hashes the
whole name) records, for a Spark query restarted on its checkpoint, the generation in which it
replayed its old process's last batch (``rcoord.spark.replays``); ``delete_groups`` deletes it
after the group.

No other key ends in a name a user chooses without a brace before it: a namespace may hold
``:``, so until 2026-12-01 ``<ns>:replays:<group>`` was also namespace ``<ns>:replays``'s settings
(group ``settings``) or another namespace's offsets (a group id with ``{...}:o:`` in it), and
deleting the group deleted them. No namespace holds a brace, so none begins ``<ns>:{}:``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from .contract import GROUP_KEYS, HEARTBEAT_KEYS
from .partitioning import partition_for, partition_tag, tag_in_share

__all__ = ["ANCHORS", "GroupKeys", "PartitionKeys", "anchor_keys", "replays_key", "settings_key"]

ANCHORS = 16
"""Count-independent copies of the namespace settings, one in each sixteenth of the slot range."""


def settings_key(namespace: str) -> str:
    return f"{namespace}:settings"


def replays_key(namespace: str, group_id: str) -> str:
    """Read alone, by the Spark sink's helper and the source runner: no hash tag needed. The
    empty ``{}`` keeps it out of every other namespace's keys (module docstring)."""
    return f"{namespace}:{{}}:replays:{group_id}"


@functools.lru_cache(maxsize=1)
def _anchor_tags() -> tuple[str, ...]:
    return tuple(tag_in_share(f"a.{i}", i, ANCHORS) for i in range(ANCHORS))


def anchor_keys(namespace: str) -> list[str]:
    """Where a process that finds ``<ns>:settings`` gone looks for the settings it held: copies
    spread over the slot range (so over the masters), at names that do not depend on the
    partition count, which is exactly what such a process does not know."""
    return [f"{namespace}:{{{t}}}:anchor" for t in _anchor_tags()]


@dataclass(frozen=True)
class PartitionKeys:
    """Keys shared by all groups of one coordinator partition."""

    namespace: str
    partition: int
    num_partitions: int

    @property
    def prefix(self) -> str:
        return f"{self.namespace}:{{{partition_tag(self.partition, self.num_partitions)}}}"

    @property
    def cfg(self) -> str:
        return f"{self.prefix}:cfg"

    @property
    def groups(self) -> str:
        return f"{self.prefix}:groups"

    @property
    def due(self) -> str:
        return f"{self.prefix}:due"

    @property
    def events(self) -> str:
        return f"{self.prefix}:events"

    @property
    def tail(self) -> str:
        return f"{self.prefix}:tail"

    @property
    def lease(self) -> str:
        return f"{self.prefix}:lease"

    @property
    def acks(self) -> str:
        """Not a script key: the counter a replica-acknowledged commit writes before its WAIT
        (``rcoord.flow.WaitReplicas``)."""
        return f"{self.prefix}:acks"

    def group(self, group_id: str) -> GroupKeys:
        return GroupKeys(self, group_id)


@dataclass(frozen=True)
class GroupKeys:
    """All keys of one group, in script KEYS order (see the module table)."""

    partition: PartitionKeys
    group_id: str

    @classmethod
    def of(cls, namespace: str, num_partitions: int, group_id: str) -> GroupKeys:
        p = partition_for(group_id, num_partitions)
        return cls(PartitionKeys(namespace, p, num_partitions), group_id)

    def _k(self, kind: str) -> str:
        return f"{self.partition.prefix}:{kind}:{self.group_id}"

    # Named keys, so callers never index KEYS by number (the table above gives the order).
    group = property(lambda self: self._k("g"), doc="hash: the group record")
    members = property(lambda self: self._k("m"), doc="hash: member id -> member record")
    statics = property(lambda self: self._k("s"), doc="hash: instance id -> member id")
    pending = property(lambda self: self._k("p"), doc="hash: pending member ids (KIP-394)")
    joining = property(lambda self: self._k("j"), doc="hash: members with a parked JoinGroup")
    syncing = property(lambda self: self._k("y"), doc="hash: members expected to SyncGroup")
    replies = property(lambda self: self._k("r"), doc="hash: replies to parked calls")
    wake = property(lambda self: self._k("w"), doc="stream: wake-ups for parked callers")
    deadlines = property(lambda self: self._k("d"), doc="zset: this group's deadlines")
    offsets = property(lambda self: self._k("o"), doc="hash: committed offsets")
    order = property(lambda self: self._k("q"), doc="zset: member id -> join sequence number")

    def all(self) -> list[str]:
        return list(self._all)

    def named(self, name: str) -> str:
        """The key called ``name`` in ``rcoord.contract``: the group's own, or its partition's."""
        own = getattr(type(self), name, None)
        if isinstance(own, property):
            return str(getattr(self, name))
        return str(getattr(self.partition, name))

    def own(self) -> list[str]:
        """Every key of this group alone, not its partition's: the layout's own keys and the
        claim, which no script takes. What deleting the group outside a step must delete."""
        return [*(self.named(name) for name, _ in GROUP_KEYS
                  if isinstance(getattr(type(self), name, None), property)), self.claim]

    @functools.cached_property
    def _all(self) -> tuple[str, ...]:
        return tuple(self.named(name) for name, _ in GROUP_KEYS)

    @property
    def hint(self) -> str:
        return self._k("h")

    @property
    def claim(self) -> str:
        """Not a script key: parked callers claim a due deadline with it (protocol/park.py)."""
        return self._k("a")

    def heartbeat_keys(self) -> list[str]:
        """KEYS of heartbeat.lua: cfg, due, group, members, statics, deadlines, hint."""
        return list(self._heartbeat)

    @functools.cached_property
    def _heartbeat(self) -> tuple[str, ...]:
        # Built once per group: a heartbeat is a member's most frequent call, and naming its
        # keys took about a sixth of its client CPU.
        return tuple(self.named(name) for name in HEARTBEAT_KEYS)
