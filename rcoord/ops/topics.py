"""``rcoord topics``: Kafka's kafka-topics.sh (create, list, describe, delete, add-partitions),
kafka-delete-records.sh as ``delete-records``, kafka-configs.sh ``--alter`` of a topic as
``alter-configs``, plus the console producer and consumer as
``produce`` and ``consume`` (``rcoord.ops.console``).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from ..cli import UsageError
from ..errors import Errors
from ..topics import DeletedRecords, DeleteRecordsIncomplete, TopicError
from ..topics.configs import DELETE, SET, SETTINGS, settings_change, topic_configs
from .common import Context, integer, leaf
from .console import add_console_arguments
from .output import print_json, print_line, print_table

__all__ = ["add_arguments"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    q = leaf(sub, "create", "create a topic", _create)
    q.add_argument("topic")
    q.add_argument("--partitions", type=integer, required=True, metavar="N",
                   help="how many partitions (1 or more; add-partitions grows them later)")
    q.add_argument("--retention-ms", type=integer, metavar="MS",
                   help="records older than this are removed (default, or -1: kept)")
    q.add_argument("--retention-records", type=integer, metavar="N",
                   help="keep only the newest N records per partition (default, or -1: all)")
    q.add_argument("--config", action="append", default=[], metavar="NAME=VALUE[,...]",
                   help="a topic config, as kafka-topics --config: "
                   + ", ".join(s.kafka_name for s in SETTINGS)
                   + "; repeat or separate by commas")
    q.add_argument("--if-not-exists", action="store_true",
                   help="succeed if the topic already exists")
    leaf(sub, "list", "list the topics", _list)
    q = leaf(sub, "describe", "partitions and their log start and end offsets", _describe)
    q.add_argument("topics", nargs="*", metavar="TOPIC", help="default: every topic")
    q = leaf(sub, "delete", "delete topics and their records", _delete)
    q.add_argument("topics", nargs="+", metavar="TOPIC")
    q.add_argument("--if-exists", action="store_true", help="succeed if a topic is missing")
    q = leaf(sub, "add-partitions", "grow a topic to N partitions", _add_partitions)
    q.add_argument("topic")
    q.add_argument("--partitions", type=integer, required=True, metavar="N",
                   help="the new total, more than now")
    q = leaf(sub, "delete-records", "remove the records before an offset (Kafka's "
             "kafka-delete-records)", _delete_records)
    q.add_argument("topic")
    q.add_argument("--offset", type=integer, required=True, metavar="O",
                   help="the new log start offset; -1: the log end (every record goes)")
    q.add_argument("--partition", type=integer, action="append", metavar="P",
                   help="a partition (repeat for more; default: every partition)")
    q = leaf(sub, "alter-configs", "change a topic's configs (Kafka's kafka-configs --alter)",
             _alter_configs)
    q.add_argument("topic")
    q.add_argument("--add-config", action="append", default=[], metavar="NAME=VALUE[,...]",
                   help="set configs: " + ", ".join(s.kafka_name for s in SETTINGS)
                   + " (-1 for retention: no limit); repeat or separate by commas")
    q.add_argument("--delete-config", action="append", default=[], metavar="NAME[,...]",
                   help="configs back to their defaults; repeat or separate by commas")
    q.add_argument("--validate-only", action="store_true",
                   help="check the change and the topic, change nothing")
    add_console_arguments(sub)


def _create(ctx: Context) -> int:
    a = ctx.args
    created = True
    try:
        ctx.topics().create(a.topic, a.partitions, **_create_settings(a))
    except TopicError as exc:
        if not (a.if_not_exists and exc.error == Errors.TOPIC_ALREADY_EXISTS):
            raise
        created = False
    if ctx.json:
        print_json({"topic": a.topic, "created": created})
    else:
        print_line(f"Created topic {a.topic}." if created else f"Topic {a.topic} already exists.")
    return 0


def _create_settings(a: argparse.Namespace) -> dict[str, int | None]:
    """The settings of ``create``: its ``--config`` items (each checked, INVALID_CONFIG for an
    unknown name or a bad value, before anything is created) and the retention flags; one
    setting given both ways is a usage error, not a silent choice."""
    settings = settings_change(_config_ops(a.config, [], "--config")) if a.config else {}
    flags = {"retention_ms": (a.retention_ms, "--retention-ms"),
             "retention_records": (a.retention_records, "--retention-records")}
    for field, (value, flag) in flags.items():
        if value is None:
            continue
        if field in settings:
            raise UsageError(f"{flag} and --config {field.replace('_', '.')} both given; "
                             "give one")
        settings[field] = _limit(value, flag)
    return settings


def _limit(value: int | None, flag: str) -> int | None:
    """A retention flag's value for ``Topics.create``, where no value means no limit. -1 is
    Kafka's "unlimited" (``retention.ms=-1``, ``retention.bytes=-1``): it means the flag left
    out, as an operator used to Kafka expects, rather than being refused."""
    if value == -1:
        return None
    if value is not None and value < 0:
        raise UsageError(f"{flag} must be >= 0, or -1 for no limit (as leaving it out), "
                         f"got {value}")
    return value


def _list(ctx: Context) -> int:
    """Topic names on stdout, one a line (JSON: a list), and for a topic marked for deletion a
    note on stderr, as ``describe`` gives: the list gave no sign of a delete that stopped
    partway, and a script parsing it must not meet a new column."""
    admin = ctx.topics()
    names = admin.list()
    for name in admin.marked_for_deletion(names):
        ctx.note(f"{name}: marked for deletion: a delete of it stopped partway; "
                 f"`rcoord topics delete {name}` finishes it")
    if ctx.json:
        print_json(names)
    else:
        if names:
            print_line("\n".join(names))
    return 0


def _describe(ctx: Context) -> int:
    """The topics named, or every topic. A topic listed (none named) but deleted before its
    own description was read is left out, as if listed a moment later: it failed the whole
    command with UNKNOWN_TOPIC_OR_PARTITION naming a topic nobody asked for. A topic named
    twice is described once, as ``delete`` takes it once. A partition that cannot be read is
    its error in the table, and why (its ``detail``) a note on stderr, as is a topic marked for
    deletion (JSON: ``marked_for_deletion``)."""
    admin = ctx.topics()
    if ctx.args.topics:
        descs = [admin.describe(name) for name in dict.fromkeys(ctx.args.topics)]
    else:
        descs = []
        for name in admin.list():
            try:
                descs.append(admin.describe(name))
            except TopicError as exc:
                if exc.error != Errors.UNKNOWN_TOPIC_OR_PARTITION:
                    raise
    for d in descs:
        if d.marked_for_deletion:
            # A delete that stopped partway (Kafka's "MarkedForDeletion: true"): its removed
            # partitions were bare UNKNOWN_TOPIC_OR_PARTITION rows, with no word of why.
            ctx.note(f"{d.name}: marked for deletion: a delete of it stopped partway (its "
                     f"removed partitions answer UNKNOWN_TOPIC_OR_PARTITION); "
                     f"`rcoord topics delete {d.name}` finishes it")
        for p in d.partitions:
            if p.detail:
                # Why a partition cannot be read (a stream whose last id is not rcoord's) and
                # what mends it: the ERROR column showed UNKNOWN_SERVER_ERROR alone, where
                # describe had failed with this detail before it answered per partition.
                ctx.note(f"{d.name}-{p.partition}: {p.error.name}: {p.detail}")
    if ctx.json:
        print_json([{
            "topic": d.name, "partition_count": len(d.partitions), "created_ms": d.created_ms,
            "marked_for_deletion": d.marked_for_deletion,
            **{c.field: getattr(d, c.field) for c in SETTINGS},
            "partitions": [{"partition": p.partition, "log_start_offset": p.log_start_offset,
                            "log_end_offset": p.log_end_offset,
                            "error": None if p.error == Errors.NONE else p.error.name}
                           for p in d.partitions],
        } for d in descs])
        return 0
    # A setting's column shows its value on the topic, "-" when the default applies. RECORDS is
    # the offsets held (log end less start, summed): the records, but for entries an XDEL by
    # hand removed from a stream's middle, which it still counts (docs/operations.md says so).
    print_table(["TOPIC", "PARTITIONS", *(c.field.upper().replace("_", "-") for c in SETTINGS),
                 "RECORDS"],
                [(d.name, len(d.partitions), *(getattr(d, c.field) for c in SETTINGS),
                  sum(p.log_end_offset - p.log_start_offset for p in d.partitions
                      if p.error == Errors.NONE)) for d in descs])
    rows = [(d.name, p.partition, p.log_start_offset, p.log_end_offset,
             None if p.error == Errors.NONE else p.error.name)
            for d in descs for p in d.partitions]
    if rows:
        print_line()
        print_table(["TOPIC", "PARTITION", "LOG-START-OFFSET", "LOG-END-OFFSET", "ERROR"], rows)
    return 0


def _known(call: Callable[[str], object], topic: str) -> bool:
    """``call(topic)``; False if it answered that the topic does not exist (any other error is
    raised)."""
    try:
        call(topic)
    except TopicError as exc:
        if exc.error != Errors.UNKNOWN_TOPIC_OR_PARTITION:
            raise
        return False
    return True


def _delete(ctx: Context) -> int:
    """Every named topic must exist before any is deleted (as kafka-topics.sh): a typo among
    several names must not leave the others half done and unreported. ``--if-exists`` deletes
    those that exist and skips the rest."""
    admin = ctx.topics()
    names = list(dict.fromkeys(ctx.args.topics))
    missing = [name for name in names if not _known(admin.partition_count, name)]
    if missing and not ctx.args.if_exists:
        raise TopicError(Errors.UNKNOWN_TOPIC_OR_PARTITION,
                         f"{', '.join(missing)} (no such topic; nothing was deleted; "
                         "--if-exists deletes the topics that exist)")
    deleted: list[str] = []
    gone: list[str] = []  # deleted by someone else between the check and the delete
    try:
        for name in names:
            if name in missing:
                continue
            if not _known(admin.delete, name):
                gone.append(name)
                continue
            deleted.append(name)
            if not ctx.json:
                print_line(f"Deleted topic {name}.")
    finally:
        # Also when a delete fails half-way (Redis lost): a program reading the JSON must
        # learn which topics are gone already, as a person reads it from the lines above.
        if ctx.json:
            print_json({"deleted": deleted})
    if gone and not ctx.args.if_exists:
        raise TopicError(Errors.UNKNOWN_TOPIC_OR_PARTITION,
                         f"{', '.join(gone)} (deleted by someone else meanwhile)")
    return 0


def _add_partitions(ctx: Context) -> int:
    if ctx.args.partitions < 1:
        raise UsageError(f"--partitions must be >= 1, got {ctx.args.partitions}")
    admin = ctx.topics()
    before = admin.partition_count(ctx.args.topic)
    admin.add_partitions(ctx.args.topic, ctx.args.partitions)
    if ctx.json:
        print_json({"topic": ctx.args.topic, "partitions_before": before,
                    "partitions": ctx.args.partitions})
    else:
        print_line(f"Topic {ctx.args.topic} now has {ctx.args.partitions} partitions "
                   f"(was {before}).")
    return 0


def _delete_records(ctx: Context) -> int:
    """Exit 0 if every partition's log start is where it was asked to be (or was already past
    it), 1 if any partition refused (its error is in the table) or Redis was lost partway: the
    partitions done by then are printed, and those not done named, before the error, which
    was shown alone, so the operator could not tell whose records were already gone."""
    a = ctx.args
    if a.offset < -1:
        raise UsageError(f"--offset must be >= 0, or -1 for the log end, got {a.offset}")
    admin = ctx.topics()
    partitions = a.partition or range(admin.partition_count(a.topic))
    # (its surviving partitions were trimmed, and the removed ones answered
    # UNKNOWN_TOPIC_OR_PARTITION with no word of why)
    ctx.refuse_marked_for_deletion([a.topic], "no record was deleted")
    try:
        done = admin.delete_records(a.topic, dict.fromkeys(partitions, a.offset))
    except DeleteRecordsIncomplete as exc:
        _print_deleted(ctx, a.topic, exc.done)
        # (the error line says what Redis answered, not which partitions are left)
        ctx.note(_not_done(a.topic, exc.unfinished))
        raise
    return 1 if _print_deleted(ctx, a.topic, done) else 0


def _not_done(topic: str, unfinished: dict[int, int]) -> str:
    """What finishes a DeleteRecords that lost Redis partway: the command again for the
    partitions not done, at the offsets the call resolved -1 to (their log end when it read
    them). Run again with -1, it would read a later log end and remove the records appended
    since, which nobody asked to remove; a -1 is left only where nothing was removed yet."""
    by_offset: dict[int, list[int]] = {}
    for partition, offset in sorted(unfinished.items()):
        by_offset.setdefault(offset, []).append(partition)
    again = "; ".join(
        f"rcoord topics delete-records {topic} --offset {offset} "
        + " ".join(f"--partition {p}" for p in partitions)
        for offset, partitions in sorted(by_offset.items()))
    return f"{topic}: partitions {', '.join(map(str, sorted(unfinished)))} not done; run {again}"


def _print_deleted(ctx: Context, topic: str, done: dict[int, DeletedRecords]) -> bool:
    """Print the partitions' answers (and the detail of those refused); whether any refused."""
    failed = [d for d in done.values() if d.error != Errors.NONE]
    if ctx.json:
        print_json({"topic": topic, "partitions": [
            {"partition": d.partition, "low_watermark": d.low_watermark,
             "error": None if d.error == Errors.NONE else d.error.name}
            for d in done.values()]})
    else:
        print_table(["TOPIC", "PARTITION", "LOW-WATERMARK", "ERROR"], [
            [topic, d.partition, d.low_watermark, "-" if d.error == Errors.NONE else d.error.name]
            for d in done.values()])
    for d in failed:
        if d.detail:  # (UNKNOWN_SERVER_ERROR alone would not say what to do)
            ctx.note(f"{topic}-{d.partition}: {d.detail}")
    return bool(failed)


def _split_configs(text: str) -> list[str]:
    """``a=1,b=[x,y]`` as ``["a=1", "b=x,y"]``: commas inside brackets belong to a list value,
    as kafka-configs.sh reads ``--add-config``."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text + ","):
        depth += (ch == "[") - (ch == "]")
        if ch == "," and depth == 0:
            items.append(text[start:i].replace("[", "").replace("]", ""))
            start = i + 1
    return [item for item in items if item.strip()]


def _config_ops(adds: list[str], deletes: list[str],
                add_flag: str = "--add-config") -> list[tuple[str, int, str]]:
    ops: list[tuple[str, int, str]] = []
    for item in (i for text in adds for i in _split_configs(text)):
        name, eq, value = item.partition("=")
        if not eq or not name.strip():
            raise UsageError(f"{add_flag} takes NAME=VALUE, got {item!r}")
        ops.append((name.strip(), SET, value.strip()))
    ops += [(name.strip(), DELETE, "") for text in deletes for name in text.split(",")
            if name.strip()]
    if not ops:
        also = " or --delete-config NAME (or both)" if add_flag == "--add-config" else ""
        raise UsageError(f"give {add_flag} NAME=VALUE{also}")
    names = [name for name, _, _ in ops]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise UsageError(f"config {', '.join(twice)} given more than once; give it once")
    return ops


def _alter_configs(ctx: Context) -> int:
    """Every change is checked (names, values, the topic) before any is written, and all are
    written at once: an error leaves the topic's configs as they were."""
    a = ctx.args
    ops = _config_ops(a.add_config, a.delete_config)
    # settings_change skips a name rcoord does not keep, as Kafka's broker does (the gateway
    # answers NONE), so a typo said "Changed" and changed nothing; kafka-configs.sh refuses it
    # ("Invalid config(s): a,b"), naming every one (only the first was named, so a second
    # typo surfaced only once the first was mended).
    known = {c.kafka_name for c, _, _ in topic_configs({})}
    unknown = [name for name, op, _ in ops if op == DELETE and name not in known]
    if unknown:
        raise TopicError(Errors.INVALID_CONFIG,
                         f"Unknown topic config name{'s' * (len(unknown) > 1)}: "
                         f"{', '.join(unknown)} (rcoord topics have: {', '.join(sorted(known))})")
    changes = settings_change(ops)
    admin = ctx.topics()
    # (the configs were written, to be thrown away by the delete that finishes it)
    ctx.refuse_marked_for_deletion([a.topic], "no config was changed")
    admin.alter_configs(a.topic, changes, validate_only=a.validate_only)
    current = admin.settings(a.topic)
    # (with --validate-only, what they would be)
    now = topic_configs({**current, **changes} if a.validate_only else current)
    if ctx.json:
        print_json({"topic": a.topic, "validate_only": a.validate_only, "configs": [
            {"name": c.kafka_name, "value": value, "default": not given}
            for c, value, given in now]})
    else:
        if not a.validate_only:
            print_line(f"Changed the configs of topic {a.topic}.")
        print_table(["TOPIC", "CONFIG", "VALUE", "SOURCE"],
                    [(a.topic, c.kafka_name, value, "topic" if given else "default")
                     for c, value, given in now])
    return 0
