"""The settings of a namespace, its partition count above all, as one fact every party agrees on.

Which coordinator partition holds a group depends on the partition count, so two processes that
disagree on it would each run their own copy of a group (split brain). Kafka avoids this by
fixing ``offsets.topic.num.partitions`` when ``__consumer_offsets`` is created; rcoord does the
same with Redis as the only authority:

* **Established once, atomically, by whoever comes first.** ``<ns>:settings`` is written by one
  script only if it does not exist (``establish``); a process that named nothing proposes the
  defaults, and every later process adopts what is stored. A process that *names* a setting
  updates it (``update``), which bumps ``version``.
* **Checked by every group script.** Each partition holds a copy (``<ns>:{tag}:cfg``), and the
  tag includes the partition count (``rcoord.partitioning``), so a process with a stale count
  addresses keys where no copy exists. The group scripts refuse such a call before any write
  (``RCOORD_NOT_COORDINATOR``), and the coordinator settles again and retries by itself, as a
  Kafka client re-discovers its coordinator on NOT_COORDINATOR.
* **Repaired by every settle, written only where wrong.** A copy can be lost on a failover (a
  replica that never got it), so every settle reads every copy (one pipeline, with the
  settings hash) and writes those that are missing, older, or the same version with other
  values. Many workers starting at once against a settled namespace so only read.
* **Caught up when the settings fall behind a copy.** A failover may roll the settings hash
  back (a replica that missed the last update) while the copies keep the newer version, which
  refuses every repair. A settle that finds the hash still behind a copy it read a round
  earlier adopts the newest copy (``adopt``, only over an older version), then repairs; a
  count it moves away from is marked to be retired, as a change of count marks it.
* **Re-established after data loss without disagreement.** A process that finds the settings
  gone proposes the newest surviving copy (``_recover``): an anchor (``keys.anchor_keys``: 16
  copies at names independent of the partition count, spread over the slot range, because the
  settings hash and the copies live in different slots and a failover may lose one and not the
  other), or a partition copy of the layout the anchors name (of the layout it read if no
  anchor is left); else the settings it was already using, or its own. It proposes the highest
  version it read, so no surviving copy is newer than the settings (such a copy would refuse
  every repair). Whatever it proposes, ``establish`` lets only the first proposal stand. The
  ``retire:`` marks were lost with the hash, so the settings established again ask for a search
  (``SWEEP``): a settle lists every copy of the namespace (a SCAN of every master) and marks
  each layout of another count to be retired, as a change of count marks the one it leaves. A
  process that named settings writes them again when it notices they are gone (the
  coordinator service checks every lease round), so a lowered minimum session timeout comes
  back by itself; also when another process established them again first (from its own
  settings, or the defaults), which the random ``origin`` each establishment stores tells
  apart from a change, whatever the version.
* **Changed by another process: adopted, not fought.** A coordinator service that finds the
  version moved while the settings still exist, and any process whose call was refused under
  a stale layout (``GroupSteps.resettle``), adopts the stored values (``write_named=False``)
  and logs once which of its named settings were overridden. It writes its own again only
  when the settings are lost; otherwise two processes naming different values (a rolling
  change of ``--set``) would rewrite each other every lease round, or every refused call. A
  process that starts still writes what it names (``update``), so the last one started
  stands; except a coordinator service's partition count, written only where none is stored
  (as Kafka's ``offsets.topic.num.partitions``).
* **The count changes only in an empty namespace.** Changing it first checks that no group
  exists, then stores the new count with a mark naming the old one (``RETIRE``), only if the
  count stored is still the one checked (``move``; else it reads and checks again), deletes the
  old copies (old-layout calls are refused from then on), then the mark, and writes the new
  ones; a settle that finds a mark left (the deletion failed) deletes that layout. The
  deletion leaves a mark in each old partition (``_withdrawn``) by which the ``copy`` op
  refuses a copy written from the old settings afterwards, whether or not its writer lives on
  to notice. A settle that wrote copies reads the count again and, if it moved meanwhile,
  deletes them and goes another round (``_overtaken``): they may have come before the
  changer's deletion. A group
  created in the instant between the check and the deletion can no longer be reached (its
  heartbeats too are refused) and is deleted, logged with the offsets it held
  (``_drop_stranded``); its members rejoin under the new count.

The steps are one sans-I/O flow (``settle_flow``, see ``rcoord.flow``), so the blocking and the
asyncio coordinators share them and differ only in the driver that performs the I/O.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from typing import Any

import redis.exceptions

from .config import STORED_SETTINGS, CoordinatorConfig, bad_stored_setting
from .errors import ConfigError
from .flow import UNREACHABLE, Command, Flow, Pipeline, Script, ScriptBatch, drive
from .keys import PartitionKeys, anchor_keys, settings_key
from .protocol.offsets import decode_fetch

__all__ = ["MAX_SETTLE_ROUNDS", "Settled", "copy_pattern", "settle", "settle_flow"]

log = logging.getLogger("rcoord.settings")

MAX_SETTLE_ROUNDS = 5
"""Rounds of settling when writers race (a copy write meets a newer version); then give up.
A rolled-back settings hash takes two (one to see a newer copy, one to adopt it)."""

ORIGIN = "origin"
"""A field of the settings hash naming its establishment (random, written by ``establish``
only): settings lost and established again by another process carry another origin, though
their version may be the one a process knew (``Settled.origin``)."""

RETIRE = "retire:"
"""Prefix of a field of the settings hash marking an old partition count whose layout is still
to be deleted (``retire:50``), written with the new count (``_retire``). Its value is a random
token (``_token``): a settle removes the mark only if it still holds the token it read
(``unmark``), so a layout marked again meanwhile (another settle's copies of it, written after
this one's deletion) stays marked. Before, the mark was removed whatever its value: another
settle that had marked its copies of that layout, and then failed to delete them, left them
for good."""


SWEEP = "sweep"
"""A field of the settings hash written by ``establish`` after a loss (a random token): the
layouts other than the one established are still to be looked for (``_sweep``). Written in the
same write as the settings, and removed only once every layout found is marked, so a settle
that fails (or a process killed) between the two leaves the search to the next settle.
Before, a ``RETIRE`` mark lost with the hash (its layout's deletion pending: a withdraw that
failed, a changer killed) was found again only if the settle re-establishing the settings
happened to read that layout; otherwise its copies stayed for good, and a process that had
settled on it was never refused (it ran its own copy of every group it served)."""

SCAN_COUNT = 1000
"""``COUNT`` of the ``SCAN`` pages of ``_sweep`` (one node)."""


def _token() -> str:
    """The value of a ``RETIRE`` mark: another marking of the same count writes another one."""
    return uuid.uuid4().hex[:16]


class Settled:
    """What ``settle_flow`` returns: the settings in force and their version."""

    def __init__(self, config: CoordinatorConfig, version: int, was: Mapping[str, str],
                 written: tuple[str, ...] = (), origin: str | None = None) -> None:
        self.config = config
        self.version = version
        self.origin = origin
        """The establishment of the settings in force (``ORIGIN``; None for settings stored
        before it was written)."""
        self.was = dict(was)
        """The stored values before this settle changed them ({} if none were stored)."""
        self.written = written
        """The copies this settle wrote (missing, older or different ones); () if all held it."""


def copy_pattern(namespace: str) -> str:
    """SCAN pattern of every partition copy of ``namespace``, whatever its count (for checks)."""
    return f"{namespace}:{{*}}:cfg"


def _decode(raw: Any) -> dict[str, str]:
    """A flat field/value reply (or a dict) as str -> str."""
    return {(k.decode() if isinstance(k, bytes) else str(k)): (v.decode() if isinstance(v, bytes) else str(v))
            for k, v in _hash(raw).items()}


def _values(cfg: CoordinatorConfig) -> dict[str, str]:
    return {name: str(value) for name, value in cfg.stored_values().items()}


def settle_flow(
    namespace: str, given: CoordinatorConfig | None, known: CoordinatorConfig | None,
    write_named: bool = True,
) -> Flow[Settled]:
    """Settle the namespace's settings (a flow of ``rcoord.flow``); returns the settings in force.

    ``given`` is the config the caller constructed (its *named* settings are written); ``known``
    the settings the caller used so far (re-proposed if the namespace lost them).
    ``write_named=False`` adopts what is stored instead of writing the named settings over it:
    what a long-running process does when *another* process changed them, so two processes
    naming different values do not rewrite each other's forever (the last writer stands).

    Each round reads the settings hash and, in the same round trip, every copy under the count
    this process expects; copies are then written only where they differ (``_repair_copies``).
    A round ends in another when a copy holds a newer version (a racing writer moved on). If
    the settings hash is gone, ``_recover`` chooses what to establish from what was read.

    **A copy newer than the settings hash** ends the round before any write: settings a copy
    has outgrown are neither updated nor copied. Seen once, it may be a writer caught between
    the hash and the copy reads of one pipeline (a writer writes the hash, then the copies).
    If a later round, reading the hash after that copy, still finds the hash older, the hash
    went back: a failover to a replica that missed the last update, or settings established
    below a copy. No writer leaves that behind, so waiting cannot help; the settle ``adopt``s
    the newest copy (``_ahead``) and goes on (the caller's named settings, then the repair).
    It adopts at the copy's own version, and ``adopt`` writes only over an older one, so
    concurrent settles adopt once and agree, and an ``update`` that reached the rolled-back
    hash first (at that version) stands: the settle writes it over the copies, which ``copy``
    allows at an equal version. Adopting one version above would overwrite that update. An
    update below the adopted version is not lost either: its writer's settle cannot end while
    a newer copy is read, and it applies its named settings again on the adopted ones.
    """
    base = given if given is not None else CoordinatorConfig(namespace=namespace)
    named = (given.named - {"namespace"}) if given is not None else frozenset()
    if not write_named:
        # The stored values win over the named ones, in the writes and in the settings in force.
        base, named = CoordinatorConfig(namespace=namespace), frozenset()
    key = settings_key(namespace)
    was: dict[str, str] | None = None
    guess = (known if known is not None else base).num_partitions
    ahead_seen = -1  # the newest copy an earlier round read above the settings it read
    withdrawn = (0, -1)  # a layout an earlier round's repair was refused in, and its version
    for _ in range(MAX_SETTLE_ROUNDS):
        # One round trip: the settings and, under the count this process expects, every copy.
        stored, held = yield from _read(namespace, guess)
        if was is None:  # what was stored before this settle (a retried round changed it)
            was = dict(stored)
        if "num_partitions" not in stored:
            read_under = guess
            names = set(anchor_keys(namespace))
            found = any(copy for k, copy in held.items() if k not in names)
            lived = found or known is not None or any(held[k] for k in names)
            proposal, guess, held = yield from _recover(namespace, base, known, guess, held)
            # A namespace that lived before (a copy read, or this process used settings) may
            # hold layouts no settle reads: looked for once the settings are established.
            sweep = {SWEEP: _token()} if lived else {}
            stored = yield from _write(key, "establish",
                                       {**proposal, ORIGIN: uuid.uuid4().hex, **sweep})
            if "num_partitions" not in stored:
                # The hash exists without a count (its field deleted by hand): ``establish``
                # writes nothing over it. Settling on another count (the default one, with its
                # copies written) would run the namespace's groups under two layouts.
                raise ConfigError(bad_stored_setting(namespace, "num_partitions", None))
            if found and _count(stored) != read_under:
                # Copies of another layout than the one established were read: the layout in
                # force before the loss (the anchors already naming a change whose hash was
                # lost with its mark), or one a failed withdraw left. It is marked to be
                # retired, as a change of count marks the layout it leaves. Before, it was only
                # logged (``_recover``): its copies stayed, and a process that had settled on
                # it was never refused, so it ran its own copy of its groups for good.
                token = _token()
                if (yield Script("settings", [key], ["mark", f"{RETIRE}{read_under}", token])):
                    stored = {**stored, f"{RETIRE}{read_under}": token}
        # A copy newer than the settings: a writer between this read of the settings and of
        # the copy, or settings rolled back below it (then adopted, see the docstring).
        # Nothing is written from settings a copy has outgrown: no update, no repair.
        guess, held = yield from _layout(namespace, _count(stored), guess, held)
        ahead = _ahead(namespace, held, stored, guess)
        if ahead is not None and _version(stored) < ahead_seen:
            stored = yield from _adopt(key, ahead, _count(stored))
            if "num_partitions" not in stored:  # lost meanwhile: the next round recovers them
                continue
            guess, held = yield from _layout(namespace, _count(stored), guess, held)
            ahead = _ahead(namespace, held, stored, guess)
        if ahead is not None:
            ahead_seen = max(ahead_seen, _version(ahead))
            continue
        if withdrawn[0] == _count(stored) and _version(stored) <= withdrawn[1]:
            # A repair of this layout was refused as withdrawn at a version the settings read
            # a round later still do not exceed: no writer leaves that (a change of count
            # stores the other count at that version first, and versions only go up), so the
            # settings were lost or rolled back below the withdrawal and name this count
            # again. They are moved above it (``adopt``, their own values), as a copy newer
            # than the settings moves them; else every repair was refused, for good.
            values = {k: v for k, v in stored.items() if k in STORED_SETTINGS}
            stored = yield from _adopt(key, {**values, "version": str(withdrawn[1] + 1)},
                                       _count(stored))
            if "num_partitions" not in stored:  # lost meanwhile: the next round recovers them
                continue
        if not _readable_version(stored):
            # No copy newer to adopt it from (with one, ``_ahead`` above restores it): the
            # next ``update`` would fail in the script (HINCRBY), and the settle used it as is.
            raise ConfigError(_bad_version(namespace, stored["version"]))
        changes = {name: str(getattr(base, name)) for name in named
                   if stored.get(name) != str(getattr(base, name))}
        if changes:
            # What the hash would hold must be valid as a whole before any of it is written: a
            # value valid alone may contradict one stored (this process's minimum session above
            # the stored maximum), and a write that fails its check afterwards left every later
            # start of the namespace, and every running coordinator's next settle, failing.
            base.merged_with_stored({**stored, **changes})
            old_np = _count(stored)
            if old_np is None:  # (no layout to check for groups: named over, it could be live)
                raise ConfigError(bad_stored_setting(namespace, "num_partitions",
                                                     stored["num_partitions"]))
            new_np = int(changes.get("num_partitions", old_np))
            if new_np != old_np and (yield from _count_groups(namespace, old_np)):
                raise ConfigError(
                    f"num_partitions is fixed at {old_np} for namespace {namespace!r} because it "
                    "holds groups; delete them or use another namespace"
                )
            if new_np != old_np:
                # Marked in the same write as the new count, so that a settle that fails before
                # the old layout is deleted leaves the deletion to the next one (_retire).
                changes[f"{RETIRE}{old_np}"] = _token()
                # Only over the count checked for groups (``move``). Before, an ``update`` wrote
                # the new count over whatever was stored by then: another process's change
                # landing between this read and the write (5 -> 7 while this one moved 5 -> 3)
                # was never checked for groups nor marked, so its layout was never retired and
                # the processes that had settled on it ran their groups there for good.
                stored = yield from _named(key, "move", changes, stored["num_partitions"])
                if _count(stored) != new_np:
                    continue  # (moved or lost meanwhile: read again, check that layout)
            else:
                stored = yield from _named(key, "update", changes)
                if not stored:
                    continue  # (lost meanwhile: the next round establishes them again)
        stored = yield from _sweep(namespace, key, stored)
        stored = yield from _retire(namespace, key, stored)
        effective = base.merged_with_stored(stored)
        version = int(stored.get("version", "1"))
        guess, held = yield from _layout(namespace, effective.num_partitions, guess, held)
        written, stale, gone = yield from _repair_copies(held, version, _values(effective))
        if (yield from _overtaken(namespace, key, effective.num_partitions, version,
                                   written)):
            continue
        if not stale:
            return Settled(effective, version, was, written, stored.get(ORIGIN))
        withdrawn = (effective.num_partitions, gone) if gone >= 0 else withdrawn
    raise ConfigError(
        f"the settings of namespace {namespace!r} kept changing while this process read them "
        f"({MAX_SETTLE_ROUNDS} rounds); try again"
    )


def _sweep(namespace: str, key: str, stored: dict[str, str]) -> Flow[dict[str, str]]:
    """Mark (``RETIRE``) every layout holding a copy whose count is not the one ``stored``, if
    ``stored`` asks for it (``SWEEP``: settings established again after a loss), then remove
    that request; ``stored`` with the marks (``_retire`` then deletes those layouts).

    The marks of the layouts whose deletion was pending were lost with the hash, and the
    settle that established it again read only the anchors and one layout. So every copy of
    the namespace is listed (``_scan_copies``: a ``SCAN`` of every master; after a loss only,
    so rarely). A layout found is marked whatever it is; ``_retire`` keeps one that is in
    force again by then (a count changed back). If a copy found holds a newer version than the
    settings, the settings are first moved up to it (``adopt``, the version alone, so the
    values stored then stand, an update made meanwhile included): the deletion
    spares copies newer than the settings (``_withdraw``: written for a change back), so such a
    copy would have stayed, and it would refuse the repairs of a later change back to its
    count. A copy written while the scan runs is not missed for good: its writer reads the
    count afterwards, and withdraws it (marked first) if it is not this one (``_overtaken``)."""
    token = stored.get(SWEEP)
    current = _count(stored)
    if token is None or current is None:
        return stored
    try:
        found = yield from _scan_copies(namespace)
    except UNREACHABLE as exc:
        # A master down (a failover under way): the search waits for the next settle (the
        # coordinator service's next lease round), and this one goes on. Failing it instead
        # failed every start and every refused call's settle until every master was back,
        # though the groups of the masters that answer can be served meanwhile.
        log.warning("namespace %r: the search for layouts left behind by the loss of its "
                    "settings waits for the next settle: %s", namespace, exc)
        return stored
    stale = {key_: count for key_, count in found.items() if count != current}
    marks: dict[str, str] = {}
    for count in sorted(set(stale.values())):
        name, value = f"{RETIRE}{count}", _token()
        if not (yield Script("settings", [key], ["mark", name, value])):
            return stored  # (lost again: the next establishment asks for another sweep)
        marks[name] = value
    if stale:
        log.warning("namespace %r lost its settings; copies of other layouts than the one "
                    "established (%d partitions) were found, of %s partitions: they are "
                    "retired, and their groups' members rejoin without the offsets committed "
                    "there", namespace, current, sorted(set(stale.values())))
        versions = yield Pipeline([("HGET", k, "version") for k in stale])
        top = max([-1, *(_version({"version": _text(v)}) for v in versions if v is not None)])
        if top > _version(stored):
            # The version alone: the values read before the scan may be a settle old by now.
            # Before, they were written too (over any older version), so an ``update`` made
            # during the scan was undone in the hash while its writer's settle, whose own sweep
            # found the version already moved, returned it in force (named values win there):
            # that process ran on a value the namespace no longer stored.
            adopted = yield from _adopt(key, {"version": str(top)}, current)
            if "num_partitions" not in adopted:
                return stored  # (lost again: as above)
            stored = adopted
    yield Script("settings", [key], ["unmark", SWEEP, token])
    return {**{k: v for k, v in stored.items() if k != SWEEP}, **marks}


def _scan_copies(namespace: str) -> Flow[dict[str, int]]:
    """Every partition copy of ``namespace`` on every master (key -> its layout's count).

    On one node, ``SCAN`` pages of ``SCAN_COUNT``. A cluster client sends ``SCAN`` to every
    master with the one cursor given, and a cursor is one node's, so it cannot go on page by
    page: the scan starts again from 0 with a ``COUNT`` 16 times larger until every master
    finished in one call. Only keys named as a copy of some layout count (``PartitionKeys``;
    the pattern alone also matches other keys whose name ends so)."""
    pattern = copy_pattern(namespace)
    cursor, count = "0", SCAN_COUNT
    keys: list[Any] = []
    while True:
        at, page = yield Command(("SCAN", cursor, "MATCH", pattern, "COUNT", count))
        keys.extend(page)
        if isinstance(at, dict):  # a cluster: one reply per master, each from cursor 0
            if all(int(c) == 0 for c in at.values()):
                break
            keys, count = [], count * 16
            continue
        cursor = _text(at)
        if cursor == "0":
            break
    found: dict[str, int] = {}
    prefix = f"{namespace}:{{"
    for raw in keys:
        name = _text(raw)
        tag = name[len(prefix):-len("}:cfg")].split(".")
        if len(tag) < 2 or not (tag[0].isdigit() and tag[1].isdigit()):
            continue
        count_, partition = int(tag[0]), int(tag[1])
        if (0 < count_ <= 16384 and partition < count_
                and PartitionKeys(namespace, partition, count_).cfg == name):
            found[name] = count_
    return found


def _retire(namespace: str, key: str, stored: dict[str, str]) -> Flow[dict[str, str]]:
    """Delete what is left of each old layout the settings ``stored`` mark (``RETIRE``), then
    the mark; ``stored`` without the marks.

    The old layout's partitions are gone with their copies (old-layout calls are refused from
    then on): so are their events streams, the service's read positions in them and replica-ack
    counters, which nothing reads again. The mark is written with the new count and removed only
    once the deletion succeeded: a settle that stored the new count and then failed (a master
    down, a timeout, the process killed) left the old copies behind for good before, and a
    process still on the old count went on creating groups there while every other process
    used the new layout, so a group existed twice. A layout that is the current one again (a
    count changed back) is not deleted, only unmarked.

    Each copy is deleted only if it holds no newer version than the settings the count was
    read with, which one script decides on its key (``_withdraw``).
    Before, the copies were deleted one round trip after that read, and a change back landing
    in between (two processes naming different counts at once) lost the live layout's copies
    (its calls refused until a settle repaired them) and events streams, with a warning that
    called its groups ones created under an old count. A change back writes its copies at a
    newer version, so they are kept, and the partitions whose copy was kept lose nothing."""
    marks = [name for name in stored if name.startswith(RETIRE)]
    if not marks:
        return stored
    current = _count(stored)
    if current is None:  # (unreadable: merged_with_stored names it; the marks wait for it)
        return {k: v for k, v in stored.items() if not k.startswith(RETIRE)}
    # The count as stored now: ``stored`` may be a settle old, and the count changed back to a
    # marked one meanwhile (50 -> 10, then 10 -> 50 by another process) is the layout in use;
    # before, a settle that had read the mark deleted it (its copies, hence refused calls until
    # repaired, and its groups' events streams) and warned of groups created under an old count.
    # The version read with it bounds what the deletion may remove (a change back after
    # this read is a newer one).
    now, at = yield Command(("HMGET", key, "num_partitions", "version"))
    in_force = current if now is None else _count({"num_partitions": _text(now)})
    version = max(_version(stored), -1 if at is None else _version({"version": _text(at)}))
    for name in marks:
        try:
            old = int(name[len(RETIRE):])
        except ValueError:
            old = current
        if old not in (current, in_force) and 0 < old <= 16384:
            copies = _partition_copies(namespace, old)
            gone = yield from _withdraw(copies, version, [
                _partition_leftovers(namespace, p, old) for p in range(old)])
            late = (yield from _count_groups(namespace, old)) if len(gone) == old else 0
            if late:
                # Counted after the deletion: a change back to ``old`` since (its copies written
                # again) and a group formed there is counted too; that group is live, so the
                # count is read again. Before, the warning called such a group one created under
                # an old count whose members rejoin: they are in force, and nobody rejoins.
                back = yield Command(("HGET", key, "num_partitions"))
                # Settings lost meanwhile (back None) cannot say which layout is in force, and
                # copies of the layout in force may be missing too: no group is dropped then
                # (a stranded one stays, as before 2026-12-01: two faults at once).
                late = 0 if back is None or _text(back) == str(old) else late
            if late:
                log.warning("%d group(s) were created under the old partition count %d while "
                            "namespace %r moved to %d; they are deleted, and their members "
                            "rejoin under the new count", late, old, namespace, current)
                yield from _drop_stranded(namespace, old, current)
        yield Script("settings", [key], ["unmark", name, stored[name]])
    return {k: v for k, v in stored.items() if not k.startswith(RETIRE)}


def _drop_stranded(namespace: str, old: int, current: int) -> Flow[None]:
    """Delete the groups left in the withdrawn ``old`` layout (formed between a change of
    count's check for groups and its deletion of the copies), each logged with the offsets it
    held. No step serves them (each refuses a partition with no copy), and kept, a change back
    to ``old`` made them live again with offsets from before two changes of count. Each goes
    in one script in its slot, and only while its partition has no copy: one written since (a
    change back) makes the layout, and the group, the one in force, and it is kept."""
    held = yield Pipeline([("SMEMBERS", PartitionKeys(namespace, p, old).groups)
                           for p in range(old)])
    for p, ids in enumerate(held):
        for raw in ids:
            keys = PartitionKeys(namespace, p, old).group(_text(raw))
            pk = keys.partition
            own = [k for k in keys.own() if k not in (keys.offsets, keys.wake)]
            offsets = yield Script("settings", [pk.cfg, pk.groups, pk.due, keys.offsets,
                                                keys.wake, *own], ["drop", keys.group_id])
            if isinstance(offsets, list):
                log.warning("group %r, formed under the withdrawn partition count %d of namespace "
                            "%r (now %d), is deleted with its committed offsets %s",
                            keys.group_id, old, namespace, current,
                            {f"{tp.topic}-{tp.partition}": rec.offset
                             for tp, rec in decode_fetch(offsets).items()} or "(none)")


def _withdraw(copies: list[str], version: int,
              leftovers: list[list[str]] | None = None) -> Flow[list[str]]:
    """Delete the partition ``copies`` of a layout no longer in force, each unless it holds a
    newer version than ``version``, and with each copy deleted its partition's ``leftovers``
    (one list per copy, ``_partition_leftovers``; none if None); returns the copies deleted.

    ``version`` is that of the settings whose count showed the layout out of force. A copy
    written later for the layout in force again (a count changed back) holds a newer version
    and is kept, with its partition's keys: the ``withdraw`` op decides on its key and deletes
    in the same script, so no round trip lies between the check and the deletion. Before, the
    leftovers were deleted one round trip after the copies: a change back landing in between,
    and a group formed there, lost its partition's events stream, read position and acks."""
    extra = leftovers if leftovers is not None else [[] for _ in copies]
    replies = yield ScriptBatch("settings", [([k, _withdrawn(k), *more],
                                              ["withdraw", str(version)])
                                             for k, more in zip(copies, extra, strict=True)])
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    return [k for k, reply in zip(copies, replies, strict=True) if int(reply) == 1]


def _overtaken(namespace: str, key: str, count: int, version: int,
               written: tuple[str, ...]) -> Flow[bool]:
    """Whether the partition count stored moved away from ``count`` (or the settings were
    lost) while this settle wrote the copies ``written`` of its layout (at ``version``); if so
    they are deleted again
    (``_withdraw``; the next round reads the count in force).

    A process that changes the count deletes the old layout's copies after storing the new
    count; copies of the old layout written after that deletion (by a settle that read the old
    count just before) were left for good: that settle returned the old count, its calls found
    their copies and were never refused, and it ran its own copy of every group it served while
    every other process used the new layout. Reading the count after the writes closes that:
    a change stored later deletes these copies itself (it deletes after it stores). They are
    deleted only if they hold no newer version than the settings read here: deleted one round
    trip after the read regardless, a change back to ``count`` in between lost its freshly
    written copies.
    """
    names = set(anchor_keys(namespace))
    mine = [k for k in written if k not in names]
    if not mine:
        return False
    now, at = yield Command(("HMGET", key, "num_partitions", "version"))
    if now is not None and _count({"num_partitions": _text(now)}) == count:
        return False
    # Moved, or lost meanwhile: which count is in force is unknown until the settings are
    # established again (the next round), and a change before the loss may have withdrawn this
    # layout with its mark lost since. Before, a loss here returned this count with the copies
    # just written in place: its calls found them and were never refused, so it ran its groups
    # under this count for good if the settings came back under another one.
    if now is not None:
        # Marked first, as a change of count marks the layout it leaves: a withdraw that fails
        # (a master down) is finished by the next settle (_retire). Before, these copies,
        # written after the changer's deletion, stayed for good, and a process still on this
        # count (not refused since) ran its groups there while every other process used the new
        # one. (A count changed back to this one meanwhile keeps its layout: _retire checks.)
        yield Script("settings", [key], ["mark", f"{RETIRE}{count}", _token()])
    yield from _withdraw(mine, max(version, -1 if at is None else _version({"version": _text(at)})))
    return True


def _text(raw: Any) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)


def _write(key: str, op: str, values: Mapping[str, str],
           *first: str) -> Flow[dict[str, str]]:
    """``establish``, ``update`` or ``move`` (``first``: the count expected stored) the
    settings hash; the stored hash after the script."""
    flat = [x for kv in values.items() for x in kv]
    return _decode((yield Script("settings", [key], [op, *first, *flat])))


def _named(key: str, op: str, values: Mapping[str, str],
           *first: str) -> Flow[dict[str, str]]:
    """``_write`` with ``update`` or ``move`` (the named settings over the stored ones); {} if
    the settings hash was lost since the settle read it (the script's NOT_COORDINATOR).

    Before, that NOT_COORDINATOR went out of the settle: a start failed, and a refused call's
    re-settle raised it to the caller, though the settle's next round re-establishes the
    settings (``_recover``) as every settle that finds them lost does."""
    try:
        return (yield from _write(key, op, values, *first))
    except redis.exceptions.ResponseError as exc:
        if "RCOORD_NOT_COORDINATOR" not in str(exc):
            raise
        return {}


def _layout(namespace: str, count: int | None, guess: int,
            held: Held) -> Flow[tuple[int, Held]]:
    """``held`` with the partition copies of the ``count`` layout (read now if the ones held
    are another layout's, ``guess``); returns the count they belong to, and them."""
    if count is None or count == guess:
        return guess, held
    anchors = {k: held[k] for k in anchor_keys(namespace)}
    return count, {**(yield from _read_copies(_partition_copies(namespace, count))), **anchors}


def _ahead(namespace: str, held: Held, stored: Mapping[str, str],
           count: int) -> dict[str, str] | None:
    """What to ``adopt`` if a copy in ``held`` holds a newer version than the settings
    ``stored`` (None if none does): the newest such copy that can hold the settings (an anchor
    naming a count, or a partition copy naming its layout's ``count``), else the stored
    settings, at the highest version among the copies (as ``_recover`` proposes: no copy read
    is left newer than the settings, so none refuses a repair for good)."""
    version = _version(stored)
    names = set(anchor_keys(namespace))
    above: list[dict[str, str]] = []
    top = version
    for key, copy in held.items():
        if _version(copy) <= version:
            continue
        top = max(top, _version(copy))
        decoded = _decode(copy)
        if _count(decoded) is not None and (key in names or _count(decoded) == count):
            above.append(decoded)
    if top == version:
        return None
    best = _newest(above)
    settings = {k: v for k, v in (best if best is not None else stored).items()
                if k in STORED_SETTINGS}
    return {**settings, "version": str(top)}


def _adopt(key: str, proposal: Mapping[str, str],
           count: int | None) -> Flow[dict[str, str]]:
    """``adopt`` ``proposal`` (its version among its fields) if the settings hash holds an older
    version; the stored hash after the script ({} if it was lost meanwhile).

    A proposal naming another partition count than the one read (``count``) marks that one to
    be retired (``RETIRE``) in the same write, as a change of count does. Before, the adopt
    moved the count alone: a layout written under settings that fell behind (re-established
    from anchors not yet updated, or a hash rolled back across a change of count) kept its
    copies, and a process that had settled on it was never refused (a group existing twice)."""
    marks = {}
    if count is not None and _count(proposal) not in (None, count):
        marks = {f"{RETIRE}{count}": _token()}
    fields = [x for kv in {**proposal, **marks}.items() if kv[0] != "version" for x in kv]
    return _decode((yield Script("settings", [key], ["adopt", proposal["version"], *fields])))


def _count_groups(namespace: str, num_partitions: int) -> Flow[int]:
    """Groups held under ``num_partitions``."""
    replies = yield Pipeline([("SCARD", PartitionKeys(namespace, p, num_partitions).groups)
                              for p in range(num_partitions)])
    return sum(int(n) for n in replies)


def _partition_leftovers(namespace: str, partition: int, num_partitions: int) -> list[str]:
    """The keys of a partition of a layout no longer in use that hold no group, besides its
    settings copy (deleted with it, by ``_withdraw``): its events stream, events read position
    (``rcoord.service.observe``) and replica-ack counter."""
    pk = PartitionKeys(namespace, partition, num_partitions)
    return [pk.events, pk.tail, pk.acks]


def _partition_copies(namespace: str, num_partitions: int) -> list[str]:
    """The copy in each partition of the ``num_partitions`` layout."""
    return [PartitionKeys(namespace, p, num_partitions).cfg for p in range(num_partitions)]


Held = dict[str, dict[Any, Any]]
"""Copies as read: key -> the hash found there as the client parsed it (bytes -> bytes; {} if
none). Left undecoded: a start compares every copy, and decoding them took about a tenth of a
start's client time (cProfile, 50 partitions on a cluster)."""


def _read(namespace: str, num_partitions: int) -> Flow[tuple[dict[str, str], Held]]:
    """The settings hash and every copy under ``num_partitions`` (key -> hash), in one pipeline."""
    keys = _partition_copies(namespace, num_partitions) + anchor_keys(namespace)
    replies = yield Pipeline([("HGETALL", settings_key(namespace))]
                             + [("HGETALL", k) for k in keys])
    return _decode(replies[0]), {k: _hash(r) for k, r in zip(keys, replies[1:], strict=True)}


def _read_copies(keys: list[str]) -> Flow[Held]:
    replies = yield Pipeline([("HGETALL", k) for k in keys])
    return {k: _hash(r) for k, r in zip(keys, replies, strict=True)}


def _hash(raw: Any) -> dict[Any, Any]:
    """A hash reply as a dict (redis-py parses HGETALL to one; a flat reply is paired up)."""
    if isinstance(raw, dict):
        return raw
    return {raw[i]: raw[i + 1] for i in range(0, len(raw), 2)}


def _repair_copies(held: Held, version: int,
                   values: Mapping[str, str]) -> Flow[tuple[tuple[str, ...], int, int]]:
    """Write the copies in ``held`` (key -> what a read found there) that differ from
    ``version`` and ``values``; the keys written, how many copies hold a newer version
    (found so, or refusing the write), and the newest version a refusing partition's layout
    was withdrawn at (``_withdrawn``; -1 if none refused so).

    A copy is written only if the write would change it: missing (never written, or lost on a
    failover), older, or the same version with other values (settings re-established after a
    loss start again at version 1). A copy found newer is not written (the ``copy`` op would
    refuse it); it counts, as a refused write does, as a sign that the settings moved on. The
    read may be a round trip old: a copy deleted since is written by the next settle, and a
    racing writer's newer version is still kept by the ``copy`` op, which is the guarantee.
    """
    want = {k.encode(): v.encode() for k, v in {"version": str(version), **values}.items()}
    newer: list[str] = []
    todo: list[str] = []
    for key, copy in held.items():
        if copy != want:
            (newer if _version(copy) > version else todo).append(key)
    if not todo:
        return (), len(newer), -1
    flat = ["copy", str(version), *[x for kv in values.items() for x in kv]]
    replies = yield ScriptBatch("settings", [(_copy_keys(k), flat) for k in todo])
    gone = -1
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
        if isinstance(reply, list):  # ['withdrawn', version]: the layout withdrawn since
            gone = max(gone, _version({"version": _text(reply[1])}))
    written = tuple(k for k, reply in zip(todo, replies, strict=True)
                    if not isinstance(reply, list) and int(reply) == 1)
    return written, len(newer) + len(todo) - len(written), gone


def _withdrawn(copy: str) -> str:
    """The withdrawal mark of the partition whose copy is ``copy`` (``<ns>:{tag}:withdrawn``,
    the same slot): the version its layout was last withdrawn at, set by the ``withdraw`` op
    and deleted by a ``copy`` written there. The ``copy`` op refuses a copy no newer than it.

    Before, a withdrawal left nothing in the partition: a settle that read the old count just
    before a change wrote its repair of a lost copy after the changer's deletion, and if it was
    killed before it read the count again (``_overtaken``), that copy stayed for good with no
    mark naming its layout; a process still on the old count then ran a group there while
    every other process used the new count (the group existed twice)."""
    return copy[:-len(":cfg")] + ":withdrawn"


def _copy_keys(copy: str) -> list[str]:
    """The keys of a ``copy`` op on ``copy``: a partition copy with its withdrawal mark, an
    anchor (no layout, never withdrawn) alone."""
    return [copy, _withdrawn(copy)] if copy.endswith(":cfg") else [copy]


def _count(copy: Mapping[str, str]) -> int | None:
    """The partition count a copy names; None if none (or none usable: it cannot propose)."""
    try:
        count = int(copy["num_partitions"])
    except (KeyError, ValueError):
        return None
    return count if count > 0 else None


def _version(copy: Mapping[Any, Any]) -> int:
    """The version a copy holds, decoded (str keys) or as read (``Held``: bytes keys); -1 if
    none (or none readable: such a copy is rewritten)."""
    try:
        return int(copy.get("version", copy.get(b"version", -1)))
    except ValueError:
        return -1


def _readable_version(stored: Mapping[str, str]) -> bool:
    """The settings hash holds no ``version`` field, or an integer there."""
    try:
        int(stored.get("version", "1"))
    except ValueError:
        return False
    return True


def _bad_version(namespace: str, value: str) -> str:
    """What to fix when the settings hash's ``version`` is ``value``, no integer (written by
    hand). Naming a setting cannot repair it (``update`` increments it), and no copy holds a
    version to restore: any integer will do, the copies are then written at it."""
    key = settings_key(namespace)
    return (f"the stored setting version of namespace {namespace!r} is {value!r}, not an "
            f"integer, and no partition copy holds one to restore it from: set it by hand "
            f"(HSET {key} version 1)")


def _newest(copies: list[dict[str, str]]) -> dict[str, str] | None:
    """The copy with the highest version; among equal versions the greatest content, so every
    process that read the same copies picks the same one, whatever order it read them in."""
    if not copies:
        return None
    return max(copies, key=lambda c: (_version(c), sorted(c.items())))


def _recover(namespace: str, base: CoordinatorConfig, known: CoordinatorConfig | None,
             guess: int, held: Held) -> Flow[tuple[dict[str, str], int, Held]]:
    """What to ``establish`` when the settings hash is gone, from the copies ``held`` (the
    anchors and every partition copy under ``guess``, as the same read found them); returns the
    proposal, the count whose partition copies ``held`` now holds, and ``held``.

    **Which copy.** The newest (highest version, then greatest content) among the copies that
    name a partition count. Only if none does, the settings this process used (``known``), else
    its own config: a namespace that lost everything starts again from the caller's settings.

    **Which count.** The anchors sit at names every process reads whatever count it guesses,
    so they decide it whenever one survives: the newest anchor's count. Partition copies are
    found only under the guessed count (the one used, else named, else 50), so processes with
    different guesses read different ones; were they to decide the count while an anchor names
    another, processes guessing differently would propose different counts, and copies left
    behind by an older layout could overrule the current one. So while an anchor survives,
    partition copies count only if they name the anchors' count (a warning names the others,
    and ``settle_flow`` marks their layout to be retired once another count is established);
    if the anchors' count is not the guessed one, that layout's copies are read first (one more
    round trip), so what is proposed has seen the layout it adopts. With no anchor left, the
    partition copies under the guess are all there is, and they decide. Either way a partition
    copy counts only if it names the count of the layout it sits in (no settle writes another).
    A layout nobody guesses and no anchor names is not found: its copies stay, unread.

    **Which version.** The highest version among everything read, the ignored copies included,
    and at least the chosen copy's: every copy the settle then checks holds the same version or
    an older one, so it is rewritten rather than counted as newer in every round (settings
    re-established below a surviving copy were refused by it for good), and a copy ignored here
    never refuses a later write. Settings proposed from the caller's config, which no copy
    holds, take one above the highest version read, as an update would; 1 if nothing was read.

    **Racing.** ``establish`` keeps the first proposal; every other process adopts it (and
    reads that layout's copies again if it guessed another). Processes that read the same keys
    propose the same settings; with different guesses (no anchor left) they may propose
    different ones, and the one kept stands for all.
    """
    names = anchor_keys(namespace)
    anchors = [_decode(held[k]) for k in names if held[k]]
    top = max(_version(c) for c in held.values())
    counts = sorted({n for n in map(_count, anchors) if n is not None})
    newest_anchor = _newest([c for c in anchors if _count(c) is not None])
    count = guess if newest_anchor is None else int(newest_anchor["num_partitions"])
    if len(counts) > 1:
        log.warning("the anchor copies of namespace %r name several partition counts %s; "
                    "adopting the newest one's, %d", namespace, counts, count)
    if count != guess:
        ignored = [k for k in held if k not in names and held[k]]
        if ignored:
            log.warning("namespace %r lost its settings; %d partition copies of another layout "
                        "(%d partitions) were found, but the surviving anchors name %d: that "
                        "layout is retired, and its groups' members rejoin without the offsets "
                        "committed there", namespace, len(ignored), guess, count)
        _, held = yield from _layout(namespace, count, guess, held)
        top = max([top, *(_version(c) for c in held.values())])
    found = [_decode(copy) for copy in held.values() if copy]
    usable = [c for c in found if _count(c) == count]
    best = _newest(usable)
    if best is not None:
        proposal = {k: v for k, v in best.items() if k in STORED_SETTINGS}
        version = max(top, _version(best), 1)
    else:
        proposal = _values(known if known is not None else base)
        version = top + 1 if top > 0 else 1
    return {**proposal, "version": str(version)}, count, held


def settle(client: Any, scripts: Any, namespace: str, given: CoordinatorConfig | None,
           known: CoordinatorConfig | None) -> Settled:
    """Run ``settle_flow`` with a blocking redis-py client (``scripts.settings`` loaded)."""
    return drive(client, scripts, settle_flow(namespace, given, known))

