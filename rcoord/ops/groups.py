"""``rcoord groups``: Kafka's kafka-consumer-groups.sh over the coordinator's admin API.

``list``, ``describe`` (state, protocol, members, and per partition the committed offset, the
log end offset and the lag), ``delete``, ``delete-offsets`` and ``reset-offsets``. Answers carry
Kafka's error names (NON_EMPTY_GROUP, GROUP_SUBSCRIBED_TO_TOPIC, ...) so they can be looked up.

``reset-offsets --execute`` commits through the coordinator's simple-commit path (generation -1,
no member id), which the commit script accepts only while the group has no members: the check
that a consumer has not joined since the plan was made is made by the same atomic step that
writes the offsets, never by a read-then-write here.
"""

from __future__ import annotations

import argparse
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from ..cli import UsageError
from ..errors import Errors, InvalidRequestError
from ..protocol.admin import GroupDescription, MemberDescription, OffsetDeleteResult
from ..protocol.offsets import OffsetAndMetadata, TopicPartition
from ..state import GroupState
from ..topics.incarnation import stale_commits
from .common import Context, Failure, integer, leaf
from .output import print_json, print_line, print_table
from .reset import (
    MODES,
    Mode,
    Row,
    export_csv,
    parse_datetime,
    parse_duration,
    parse_reset_file,
    parse_topics,
    plan,
)

__all__ = ["add_arguments"]

STATES = {s.value.lower(): s.value for s in GroupState}
VIEWS = {"state": "group's", "members": "members'", "offsets": "partitions'"}
"""``groups describe``'s one-table views, Kafka's ``--describe`` options; without one, all."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    q = leaf(sub, "list", "list the consumer groups (optionally in some states)", _list)
    # (bare, as Kafka's --list --state: every group, with its state, which the table has)
    q.add_argument("--state", action="append", default=[], nargs="?", const="",
                   help="only groups in this state (repeat, or comma-separate): "
                   + ", ".join(STATES.values()) + "; bare: every group")
    q = leaf(sub, "describe", "a group's state, members, and committed offsets and lag",
             _describe)
    q.epilog = ("TOTAL-LAG is the sum of the partitions' LAG (a negative one, a commit past the "
                "log end, counted as 0) when every one is known; '-' when "
                "none is (LAG is '-' where nothing is committed or the log end is unknown), "
                "'>=N' when only some are, N the sum of those; a deleted topic's offsets "
                "are left out of it. In JSON total_lag is null "
                "unless every lag is known; known_lag (the sum of the known ones, null if none) "
                "and lag_unknown_partitions say the rest.")
    q.add_argument("group")
    view = q.add_mutually_exclusive_group()
    for name, what in VIEWS.items():
        view.add_argument(f"--{name}", dest="view", action="store_const", const=name,
                          help=f"only the {what} table (as kafka-consumer-groups --describe)")
    # (taken with any view, as Kafka's --verbose, which changes only the members' table)
    q.add_argument("--verbose", action="store_true",
                   help="add each member's partitions to the members' table (ASSIGNMENT)")
    q = leaf(sub, "delete", "delete empty groups and their offsets", _delete)
    q.add_argument("groups", nargs="+", metavar="GROUP")
    q = leaf(sub, "delete-offsets", "delete a group's committed offsets of some topics",
             _delete_offsets)
    q.add_argument("group")
    q.add_argument("--topic", action="append", required=True, metavar="TOPIC[:P,...]",
                   help="a topic, or some of its partitions (repeatable)")
    q = leaf(sub, "reset-offsets",
             "move a group's committed offsets (dry run by default; --execute to commit)",
             _reset_offsets)
    q.add_argument("group")
    which = q.add_mutually_exclusive_group()  # (one is needed but with --from-file)
    which.add_argument("--topic", action="append", metavar="TOPIC[:P,...]",
                       help="a topic, or some of its partitions (repeatable)")
    which.add_argument("--all-topics", action="store_true",
                       help="every topic the group has committed offsets for")
    mode = q.add_mutually_exclusive_group(required=True)
    mode.add_argument("--to-earliest", action="store_true", help="the log start offset")
    mode.add_argument("--to-latest", action="store_true", help="the log end offset")
    mode.add_argument("--to-current", action="store_true",
                      help="the committed offset (the log end where there is none)")
    mode.add_argument("--to-offset", type=integer, metavar="N", help="offset N")
    mode.add_argument("--shift-by", type=integer, metavar="N",
                      help="the committed offset plus N (N may be negative)")
    mode.add_argument("--to-datetime", metavar="ISO8601",
                      help="the first record at or after YYYY-MM-DDTHH:mm:SS.sss[zone]")
    mode.add_argument("--by-duration", metavar="PnDTnHnMnS",
                      help="the first record at or after that long ago")
    mode.add_argument("--from-file", metavar="FILE",
                      help="the offsets of a CSV file of topic,partition,offset lines (as "
                      "--export writes them; or group,topic,partition,offset), its partitions "
                      "only")
    q.dash_values = frozenset({"--by-duration"})  # (a negative duration: -PT1H)
    run = q.add_mutually_exclusive_group()
    run.add_argument("--dry-run", action="store_true", help="show the plan only (the default)")
    run.add_argument("--execute", action="store_true",
                     help="commit the plan; only while the group has no members")
    q.add_argument("--export", action="store_true",
                   help="print the plan as topic,partition,offset lines, which --from-file "
                   "reads (instead of the table)")


# -- list -------------------------------------------------------------------------------------


def _list(ctx: Context) -> int:
    wanted = [s.strip() for arg in ctx.args.state for s in arg.split(",") if s.strip()]
    unknown = [s for s in wanted if s.lower() not in STATES]
    if unknown:
        raise UsageError(f"--state {unknown[0]!r} is not a group state; use one of "
                         + ", ".join(STATES.values()))
    coord = ctx.group_coordinator()
    listings = [] if coord is None else coord.list_groups([STATES[s.lower()] for s in wanted])
    listings = sorted(listings, key=lambda g: g.group_id)
    if ctx.json:
        print_json([{"group": g.group_id, "state": g.state,
                     "protocol_type": g.protocol_type or None}
                    for g in listings])
    else:
        print_table(["GROUP", "STATE", "PROTOCOL-TYPE"],
                    [(g.group_id, g.state, g.protocol_type) for g in listings])
    return 0


# -- describe ---------------------------------------------------------------------------------


def _assigned(desc: GroupDescription) -> dict[str, list[TopicPartition]]:
    """Each member's partitions, decoded from its consumer assignment (filled while Stable)."""
    from ..protocol.consumer import ConsumerProtocolAssignment

    out: dict[str, list[TopicPartition]] = {}
    for m in desc.members:
        parts: list[TopicPartition] = []
        if desc.protocol_type == "consumer" and m.assignment:
            try:
                decoded = ConsumerProtocolAssignment.decode(m.assignment).partitions
                parts = [TopicPartition(t, p) for t, p in decoded]
            except Exception:  # noqa: BLE001 - another protocol's bytes: show no partitions
                parts = []
        out[m.member_id] = parts
    return out


NO_SUCH_TOPIC = frozenset({Errors.UNKNOWN_TOPIC_OR_PARTITION, Errors.INVALID_TOPIC_EXCEPTION})
"""A committed topic name with no topic behind it: deleted, or never one rcoord's topics take
(a group commits offsets of any source's partitions; Kafka's checks on names are only for
topics). Its offsets have no log end, and must not stop a command about the group's others."""


def log_ends(ctx: Context, topics: Sequence[str], *, needed: Collection[TopicPartition] = (),
             missing: set[str] | None = None) -> dict[TopicPartition, tuple[int, int]]:
    """(log start, log end) of every partition of ``topics``; a missing topic is left out (and
    added to ``missing``, if given: only this read tells it from an unreadable one).

    A partition whose offsets cannot be read (UNKNOWN_SERVER_ERROR: its stream's last id is
    not rcoord's, an XADD by hand; ``Topics.describe`` answers it for that partition alone)
    is left out too (``describe``: its lag is unknown; a note on stderr says why), unless it
    is among ``needed``: then its TopicError, naming the stream and what mends it, is raised.
    A reset took such a partition for one that does not exist ("has no partition 0 (any
    more)")."""
    from ..topics import TopicError

    out: dict[TopicPartition, tuple[int, int]] = {}
    admin = ctx.topics()
    for topic in sorted(set(topics)):
        try:
            desc = admin.describe(topic)
        except TopicError as exc:
            if exc.error not in NO_SUCH_TOPIC:
                raise
            if missing is not None:
                missing.add(topic)
            continue
        for p in desc.partitions:
            if p.error == Errors.NONE:
                out[TopicPartition(topic, p.partition)] = (p.log_start_offset, p.log_end_offset)
            elif (p.error != Errors.UNKNOWN_TOPIC_OR_PARTITION
                  and TopicPartition(topic, p.partition) in needed):
                raise TopicError(p.error, p.detail or f"{topic}-{p.partition}")
            elif p.detail:
                # Why its lag is unknown, and what mends it: said nowhere before.
                ctx.note(f"{topic}-{p.partition}: {p.error.name}: {p.detail}")
    return out


def _committed(ctx: Context, group: str) -> dict[TopicPartition, OffsetAndMetadata]:
    """The group's committed offsets, without those made to a deleted topic of the same name
    (``rcoord.topics.incarnation``; Kafka deletes them with the topic): they showed a negative
    lag against the topic created again."""
    offsets = ctx.coordinator().fetch_offsets(group).offsets
    stale = stale_commits(ctx.client, ctx.namespace, offsets)
    return {tp: om for tp, om in offsets.items() if tp not in stale}


def _describe(ctx: Context) -> int:
    group = ctx.args.group
    coord = ctx.group_coordinator()
    desc = None if coord is None else coord.describe_group(group)
    if desc is None or desc.state == GroupState.DEAD.value:
        raise Failure(f"consumer group {group!r} does not exist")
    committed = {tp: o.offset for tp, o in _committed(ctx, group).items()}
    assigned = _assigned(desc)
    owner: dict[TopicPartition, MemberDescription] = {}
    for m in desc.members:
        for tp in assigned[m.member_id]:
            owner[tp] = m
    tps = sorted(set(committed) | set(owner))
    missing: set[str] = set()
    ends = log_ends(ctx, [tp.topic for tp in tps], missing=missing)
    rows: list[dict[str, Any]] = []
    for tp in tps:
        offset = committed.get(tp)
        end = ends[tp][1] if tp in ends else None
        lag = end - offset if end is not None and offset is not None and offset >= 0 else None
        m = owner.get(tp)
        rows.append({
            "topic": tp.topic, "partition": tp.partition, "current_offset": offset,
            "log_end_offset": end, "lag": lag,
            "consumer_id": m.member_id if m else None,
            "host": (m.client_host or None) if m else None,
            "client_id": (m.client_id or None) if m else None,
        })
    members = [{
        "consumer_id": m.member_id, "group_instance_id": m.group_instance_id,
        "host": m.client_host or None, "client_id": m.client_id or None,
        "partitions": [[tp.topic, tp.partition] for tp in assigned[m.member_id]],
    } for m in desc.members]
    # An unknown lag is not 0 (a group that committed nothing may be a whole log behind), so
    # the total is given only where every lag is known: a script alerting on it must never
    # read a partial sum, or 0, as the group's lag. Text marks the known part as a lower bound.
    # A partition committed past its log end (records lost to a failover, a reset by hand)
    # shows its negative lag, as Kafka's; in the total it is 0 behind, or it hid another's.
    # A deleted topic's offsets (Kafka deletes them with it; rcoord keeps them until
    # delete-offsets) are behind nothing: they made the total unknown for good.
    # (a topic none of whose partitions could be read is there, its lag unknown)
    gone = [tp for tp in tps if tp.topic in missing and tp not in owner]
    for topic in sorted({tp.topic for tp in gone}):
        parts = ",".join(str(tp.partition) for tp in gone if tp.topic == topic)
        ctx.note(f"note: topic {topic!r} does not exist (any more); its committed offsets are "
                 f"not in TOTAL-LAG (remove them with: groups delete-offsets {group} --topic "
                 f"{topic}:{parts})")
    counted = [r for r, tp in zip(rows, tps, strict=True)
               if tp.topic not in missing or tp in owner]
    known = [max(r["lag"], 0) for r in counted if r["lag"] is not None]
    unknown = len(counted) - len(known)
    known_lag = sum(known) if known or not counted else None
    total = known_lag if not unknown else None
    total_text: int | str | None = total
    if unknown and known_lag is not None:
        total_text = f">={known_lag}"
    if desc.state == GroupState.EMPTY.value:
        ctx.note(f"consumer group {group!r} has no active members")
    elif desc.state != GroupState.STABLE.value:
        ctx.note(f"warning: consumer group {group!r} is rebalancing ({desc.state}); "
                 "the members' partitions are known once it is Stable")
    if ctx.json:
        print_json({
            "group": group, "state": desc.state, "protocol_type": desc.protocol_type or None,
            "protocol": desc.protocol_name or None, "members": members, "partitions": rows,
            "total_lag": total, "known_lag": known_lag, "lag_unknown_partitions": unknown,
        })
        return 0
    # A view prints its table alone, even empty (its header says which it is), as Kafka's;
    # with none, each table there is something to show, a blank line between.
    view = ctx.args.view
    if view in (None, "state"):
        print_table(["GROUP", "STATE", "PROTOCOL-TYPE", "PROTOCOL", "#MEMBERS", "TOTAL-LAG"],
                    [(group, desc.state, desc.protocol_type, desc.protocol_name, len(members),
                      total_text)])
    if view == "members" or (view is None and members):
        if view is None:
            print_line()
        headers = ["CONSUMER-ID", "GROUP-INSTANCE-ID", "HOST", "CLIENT-ID", "#PARTITIONS"]
        table_rows = [[m["consumer_id"], m["group_instance_id"], m["host"], m["client_id"],
                       len(m["partitions"])] for m in members]
        if ctx.args.verbose:
            headers.append("ASSIGNMENT")
            for row, m in zip(table_rows, desc.members, strict=True):
                row.append(_assignment(assigned[m.member_id]))
        print_table(headers, table_rows)
    if view == "offsets" or (view is None and rows):
        if view is None:
            print_line()
        print_table(["GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG",
                     "CONSUMER-ID", "HOST", "CLIENT-ID"],
                    [(group, r["topic"], r["partition"], r["current_offset"],
                      r["log_end_offset"], r["lag"], r["consumer_id"], r["host"],
                      r["client_id"]) for r in rows])
    return 0


def _assignment(tps: Sequence[TopicPartition]) -> str | None:
    """``--verbose``'s ASSIGNMENT, as Kafka's: ``topic(p,p)`` per topic, comma-separated; None
    (shown ``-``) for no partitions. Partitions sort as numbers, where Kafka's sort as strings
    (10 before 2)."""
    by_topic: dict[str, list[int]] = {}
    for tp in tps:
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    return ", ".join(f"{t}({','.join(map(str, sorted(ps)))})"
                     for t, ps in sorted(by_topic.items())) or None


# -- delete -----------------------------------------------------------------------------------

WHY = {
    Errors.NON_EMPTY_GROUP: "the group has members; it can be deleted once it is Empty",
    Errors.GROUP_ID_NOT_FOUND: "no such group",
}


def _delete(ctx: Context) -> int:
    """Group by group (each is its own coordinator call anyway), every id checked first. What
    was deleted is reported also when a later group's deletion fails (Redis lost half-way),
    as ``topics delete`` does: the report came only after the last group, so the groups
    already gone went unmentioned beside the error line."""
    from ..protocol.admin import group_ids_arg

    groups = group_ids_arg(ctx.args.groups)  # a bad id is refused before any is deleted
    coord = ctx.group_coordinator()
    results: dict[str, Errors] = {}
    try:
        for group in groups:
            results.update({group: Errors.GROUP_ID_NOT_FOUND} if coord is None
                           else coord.delete_groups([group]))
    finally:
        deleted = [g for g, e in results.items() if e == Errors.NONE]
        failed = {g: e for g, e in results.items() if e != Errors.NONE}
        if ctx.json:
            print_json({"deleted": deleted, "failed": {g: e.name for g, e in failed.items()}})
        elif deleted:
            names = ", ".join(repr(g) for g in deleted)
            print_line(f"Deletion of requested consumer groups ({names}) was successful.")
    if failed:
        raise Failure("; ".join(
            f"group {g!r} could not be deleted: {e.name}"
            + (f" ({WHY[e]})" if e in WHY else "") for g, e in failed.items()
        ))
    return 0


def _partitions(ctx: Context, specs: Sequence[str],
                named_may_be_gone: bool = False) -> list[TopicPartition]:
    """The partitions ``--topic`` names; every one must exist, except, with
    ``named_may_be_gone``, partitions named explicitly (``x:0``) of a topic that does not exist
    (any more) or past its partition count: offsets outlive their topic in rcoord (Kafka's
    broker deletes them with the topic, and so answers UNKNOWN_TOPIC_OR_PARTITION for such a
    partition), so naming them is how they are removed."""
    from ..topics import TopicError

    out: list[TopicPartition] = []
    admin = ctx.topics()
    for topic, parts in parse_topics(specs):
        try:
            count = admin.partition_count(topic)
        except TopicError as exc:
            if exc.error not in NO_SUCH_TOPIC or not named_may_be_gone:
                raise
            if parts is None:
                raise Failure(f"topic {topic!r} does not exist; to delete the offsets of a "
                              f"deleted topic name its partitions, e.g. --topic {topic}:0") from exc
            out.extend(TopicPartition(topic, p) for p in parts)
            continue
        if parts is None:
            parts = list(range(count))
        missing = [p for p in parts if p >= count]
        if missing and not named_may_be_gone:
            raise Failure(f"topic {topic!r} has {count} partitions; there is no partition "
                          f"{missing[0]}")
        out.extend(TopicPartition(topic, p) for p in parts)
    return sorted(set(out))


def _one_request(tps: Sequence[TopicPartition], what: str) -> None:
    """Refuse, before anything is written, a change too large for one request: the
    coordinator takes at most ``MAX_ITEMS_PER_CALL`` partitions per call, and splitting it
    into several would let a consumer that joins in between leave it half done."""
    from ..protocol import _checks

    try:
        _checks.check_count(what, tps, _checks.MAX_ITEMS_PER_CALL)
    except InvalidRequestError:
        raise Failure(f"{what} covers {len(tps):,} partitions, more than the "
                      f"{_checks.MAX_ITEMS_PER_CALL:,} one request may change; nothing was "
                      "changed. Name fewer with --topic (e.g. one topic per command)") from None


def _delete_offsets(ctx: Context) -> int:
    group = ctx.args.group
    tps = _partitions(ctx, ctx.args.topic, named_may_be_gone=True)
    _one_request(tps, "the deletion")
    coord = ctx.group_coordinator()
    res = (OffsetDeleteResult(Errors.GROUP_ID_NOT_FOUND, {}) if coord is None
           else coord.delete_offsets(group, tps))
    if res.error != Errors.NONE:
        why = {
            Errors.GROUP_ID_NOT_FOUND: f"consumer group {group!r} does not exist",
            Errors.NON_EMPTY_GROUP: f"deleting offsets of consumer group {group!r} is "
            "forbidden while it has members",
        }.get(res.error, f"group {group!r}")
        raise Failure(f"{why} ({res.error.name})")
    rows = [(tp.topic, tp.partition, "Successful" if e == Errors.NONE else f"Error: {e.name}")
            for tp, e in sorted(res.partitions.items())]
    if ctx.json:
        print_json([{"topic": t, "partition": p, "error": None if s == "Successful" else s[7:]}
                    for t, p, s in rows])
    else:
        print_table(["TOPIC", "PARTITION", "STATUS"], rows)
    refused = [f"{tp.topic}-{tp.partition}" for tp, e in sorted(res.partitions.items())
               if e != Errors.NONE]
    if refused:
        codes = sorted({e.name for e in res.partitions.values() if e != Errors.NONE})
        raise Failure(f"offsets of {', '.join(refused)} were not deleted ({', '.join(codes)}: "
                      "a member of the group subscribes to the topic)")
    return 0


# -- reset-offsets ----------------------------------------------------------------------------


def _mode(args: argparse.Namespace, server_ms: Any) -> Mode:
    for name in MODES:
        value = getattr(args, name)
        if value is None or value is False:
            continue
        if name == "to_datetime":
            return Mode(name, parse_datetime(value))
        if name == "by_duration":
            return Mode(name, server_ms() - parse_duration(value))
        if name == "from_file":
            return Mode(name)
        if name == "to_offset" and value < 0:
            raise UsageError(f"--to-offset must be >= 0, got {value}")
        return Mode(name, 0 if value is True else int(value))
    raise UsageError("choose a reset: " + ", ".join("--" + m.replace("_", "-") for m in MODES))


def _reset_offsets(ctx: Context) -> int:
    from ..topics import offsets_for_times
    from ..topics.times import server_ms

    args, group = ctx.args, ctx.args.group
    mode = _mode(args, lambda: server_ms(ctx.client))
    from_file = _reset_file(args) if mode.name == "from_file" else None
    if from_file is None and not (args.topic or args.all_topics):
        raise UsageError("one of the arguments --topic --all-topics is required (or "
                         "--from-file)")
    committed: dict[TopicPartition, int] = {}
    # A dry run takes the path --execute takes and differs only in not committing at the end
    # (as Kafka's resetOffsets): it must not refuse what --execute would commit, nor plan other
    # offsets. Neither mode may start the coordinator before the commit, since its start writes
    # the namespace's settings: a plan, or a reset refused, writes nothing.
    settled = ctx.has_settings()
    if settled:
        state = ctx.coordinator().describe_group(group).state
        if state not in (GroupState.EMPTY.value, GroupState.DEAD.value):
            raise Failure(f"Assignments can only be reset if the group {group!r} is inactive, "
                          f"but the current state is {state}.")
        committed = {tp: o.offset for tp, o in _committed(ctx, group).items() if o.offset >= 0}
    elif not ctx.has_topics():
        # Nothing has used the namespace (or --namespace is mistyped): no topic to reset to and
        # no offsets, so any reset fails; say why, in both modes alike.
        raise Failure(ctx.no_settings())
    # else: topics but no settings (what ``topics create`` leaves): no group exists there and
    # none has offsets, so the group is as a Dead one, with nothing committed.
    if from_file is not None:
        tps = sorted(from_file)
    elif args.all_topics:
        tps = sorted(committed)
        if not tps:
            raise Failure(f"group {group!r} has no committed offsets; name the topics with "
                          "--topic")
    else:
        tps = _partitions(ctx, args.topic)
    # Whatever chose the partitions, and in a dry run too (it plans what --execute commits): the
    # surviving ones were reset, the removed ones said to be "no partition 0 (any more)".
    ctx.refuse_marked_for_deletion({tp.topic for tp in tps}, "nothing was changed")
    by_time_mode = mode.name in ("to_datetime", "by_duration")
    # (read before the log offsets, which every mode plans from: compared after the search by
    # time, just before the commit and after it)
    made = _create_tokens(ctx, [tp.topic for tp in tps])
    offsets = log_ends(ctx, [tp.topic for tp in tps], needed=set(tps))
    if args.all_topics:
        # Offsets outlive their topic, and its partitions: a deleted topic, or a partition past
        # its count (created again with fewer, or named by a simple commit), has nothing to
        # reset to, and must not stop the reset of the others.
        existing = {tp.topic for tp in offsets}
        left_out = [tp for tp in tps if tp not in offsets]
        for topic in sorted({tp.topic for tp in left_out}):
            parts = ",".join(str(tp.partition) for tp in left_out if tp.topic == topic)
            why = ("does not exist (any more)" if topic not in existing
                   else f"has no partition {parts} (any more)")
            ctx.note(f"note: topic {topic!r} {why}; its committed offsets are left out (remove "
                     f"them with: groups delete-offsets {group} --topic {topic}:{parts})")
        if not any(tp.topic in existing for tp in tps):
            raise Failure(f"group {group!r} has committed offsets only for topics that do not "
                          "exist (any more)")
        tps = [tp for tp in tps if tp in offsets]
    gone = [tp for tp in tps if tp not in offsets]
    if gone:
        # (a --from-file partition, or a topic deleted since --topic was read) A misspelt
        # topic was said to have "no partition 0 (any more)", as if it had been one.
        tp, existing = gone[0], {tp.topic for tp in offsets}
        why = (f"has no partition {tp.partition} (any more)" if tp.topic in existing
               else "does not exist (any more)")
        named = f" named in --from-file {args.from_file!r}" if from_file is not None else ""
        raise Failure(f"topic {tp.topic!r}{named} {why}; nothing was changed")
    try:
        _one_request(tps, "the reset")
    except Failure as too_many:
        if args.execute:
            raise
        # A plan is still worth showing, but not as one --execute would commit.
        ctx.note(f"note: --execute would refuse this plan: {too_many}")
    by_time: dict[TopicPartition, int | None] = {}
    if by_time_mode:
        if mode.value < 0:
            raise UsageError(f"--{mode.describe()} points before 1970")
        try:
            found = offsets_for_times(ctx.client, ctx.namespace, {tp: mode.value for tp in tps})
        finally:
            # (a search failed for a topic deleted since is told as that, too)
            _refuse_made_again(ctx, {tp.topic: made[tp.topic] for tp in tps})
        by_time = {TopicPartition(*tp): (f.offset if f else None) for tp, f in found.items()}
    rows = plan(mode, tps, committed, offsets, by_time, from_file)
    for row in rows:
        if row.note:
            ctx.note(f"note: {row.tp.topic}-{row.tp.partition}: {row.note}")
    if not settled:
        # Unavoidable: a group's offsets live at the coordinator partition its id hashes to,
        # so the first commit fixes the partition count, as Kafka's first commit creates
        # __consumer_offsets with the broker's offsets.topic.num.partitions.
        from ..config import CoordinatorConfig

        ctx.note(f"note: namespace {ctx.namespace!r} has no coordinator settings yet: "
                 + ("this commit establishes" if args.execute else "--execute establishes")
                 + " them at the defaults (num_partitions="
                 f"{CoordinatorConfig().num_partitions}), which a coordinator started later "
                 "cannot change while the namespace holds groups; to choose them, start a "
                 "coordinator with them first")
    # Every mode's plan is of the topics whose log offsets were read: one made again since
    # (offsets committed after its creation are its own) was given the old topic's offsets.
    # The commit script cannot compare the tokens itself: they live in each topic's slot, the
    # offsets in the group's, so a change in between is told after the commit.
    made = {r.tp.topic: made[r.tp.topic] for r in rows}
    _refuse_made_again(ctx, made)
    if args.execute:
        _commit(ctx, group, rows)
    _show_plan(ctx, group, rows, executed=bool(args.execute))
    if args.execute:  # (after the plan: it shows what was committed)
        try:
            _refuse_made_again(ctx, made, committed=group)
        except Failure:
            raise
        except Exception as exc:
            # The error alone (a lost connection) read as a reset that had not happened.
            from ..cli import explain

            raise Failure("the offsets were committed, but whether a topic was deleted or made "
                          "again since the plan could not be checked: "
                          f"{explain(exc, ctx.url)[1]}") from exc
    return 0


def _create_tokens(ctx: Context, topics: Sequence[str]) -> dict[str, str | None]:
    """Each topic's creation token (``Topics.create_token``; None: no such topic)."""
    from ..topics import TopicError

    out: dict[str, str | None] = {}
    admin = ctx.topics()
    for topic in sorted(set(topics)):
        try:
            out[topic] = admin.create_token(topic)
        except TopicError as exc:
            if exc.error not in NO_SUCH_TOPIC:
                raise
            out[topic] = None
    return out


def _refuse_made_again(ctx: Context, made: Mapping[str, str | None], *,
                       committed: str | None = None) -> None:
    """Refuse a reset of topics deleted (and perhaps created again), or marked for deletion,
    since their log offsets were read (``made``: the creation tokens read before them): the
    plan holds the old topics' offsets (and a search by time answered the new topic's, planned,
    clamped and committed within the old topic's bounds, offsets of neither); a topic marked
    for deletion is one Kafka answers UNKNOWN_TOPIC_OR_PARTITION for, whose offsets the delete
    finishing it leaves to a topic made again. Every topic is named: the first alone left the
    operator to find the others by running again. ``committed``: the group, for the check
    after its commit, which can only tell that the offsets were committed."""
    now = _create_tokens(ctx, list(made))
    marked = set(ctx.topics().marked_for_deletion(t for t, token in now.items()
                                                  if token is not None))
    changed = [topic for topic in sorted(made) if now[topic] != made[topic] or topic in marked]
    if changed and committed is not None:
        # A commit older than its topic counts as none (``rcoord.topics.incarnation``): one to
        # a topic deleted, or marked, or made again after it, is as any offset of a deleted
        # topic. Only a topic made again before it took the plan's offsets for its own.
        kept = {tp.topic for tp in _committed(ctx, committed)}
        changed = [t for t in changed if now[t] not in (None, made[t]) and t in kept]
    if not changed:
        return
    what = ", ".join(f"topic {topic!r} was " + (
        "deleted" + (" and created again" if now[topic] is not None else "")
        if now[topic] != made[topic] else "marked for deletion") for topic in changed)
    if committed:
        raise Failure(f"{what} while the reset committed; the offsets were committed before "
                      "that was seen, and are taken for the new topic's: run the reset again")
    raise Failure(f"{what} while the reset read {'it' if len(changed) == 1 else 'them'}; "
                  "nothing was changed. Run the reset again")


def _reset_file(args: argparse.Namespace) -> dict[TopicPartition, int]:
    """The offsets ``--from-file`` names for the group, read and checked before anything else
    (the partitions are the file's: ``--topic`` and ``--all-topics`` do not go with it)."""
    if args.topic or args.all_topics:
        raise UsageError("--from-file resets the partitions the file names: leave out "
                         "--topic and --all-topics")
    try:
        # utf-8-sig: a byte order mark (Excel's "CSV UTF-8", Windows PowerShell's Out-File)
        # is no part of the first field. It was: in a group,topic,partition,offset file the
        # first line named group "\ufeffG" and was skipped as another group's, so the reset
        # committed the other lines and left that partition as it was, without a word.
        with open(args.from_file, encoding="utf-8-sig") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise Failure(f"cannot read --from-file {args.from_file!r}: {exc}") from None
    return parse_reset_file(text, args.group, args.from_file)


def _commit(ctx: Context, group: str, rows: Sequence[Row]) -> None:
    """One simple commit (no member, generation -1): the coordinator refuses it if the group
    has members, in the same script that would write the offsets."""
    errors = ctx.coordinator(writes=True).commit_offsets(group, {r.tp: r.new for r in rows})
    bad = {e for e in errors.values() if e != Errors.NONE}
    if Errors.UNKNOWN_MEMBER_ID in bad:
        raise Failure(f"the coordinator refused the reset: group {group!r} has members now "
                      "(UNKNOWN_MEMBER_ID for a commit without a member); nothing was changed. "
                      "Stop its consumers and run again")
    if len(set(errors.values())) == 1 and bad:  # a group-level error: nothing was written
        raise Failure(f"the coordinator refused the reset of group {group!r}: "
                      f"{bad.pop().name}; nothing was changed")
    if bad:
        refused = [f"{tp.topic}-{tp.partition} ({e.name})" for tp, e in sorted(errors.items())
                   if e != Errors.NONE]
        raise Failure(f"these offsets of group {group!r} were not committed (the others were): "
                      + ", ".join(refused))


def _show_plan(ctx: Context, group: str, rows: Sequence[Row], *, executed: bool) -> None:
    if ctx.args.export:
        print_line(export_csv(rows).rstrip("\n"))
    elif ctx.json:
        print_json({"group": group, "executed": executed,
                    "partitions": [r.as_json(group) for r in rows]})
    else:
        print_table(["GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "NEW-OFFSET"],
                    [(group, r.tp.topic, r.tp.partition, r.current, r.new) for r in rows])
    if executed:
        ctx.note(f"committed {len(rows)} offsets of group {group!r}")
    else:
        ctx.note("dry run: nothing was changed; add --execute to commit these offsets")
