"""One round of the group protocol, for one member: from JoinGroup to a ``Generation``.

1. **JoinGroup**, once: a new member names itself with a UUID it sends with every retry of
   its first join, instead of KIP-394's MEMBER_ID_REQUIRED round (see ``join_generation``).
   Each configured assignor is offered as a protocol, with a ``ConsumerProtocolSubscription``
   of the topics as its metadata.
2. **Assign** (leader only): see ``leader_assignment``.
3. **SyncGroup**: the leader sends every member's ``ConsumerProtocolAssignment``; every member
   gets its own back.
4. **OffsetFetch** for the assigned partitions: see ``start_offsets``.

``join_generation`` runs the round; the steps between its requests are functions of their own:

* ``leader_assignment``: the leader decodes every member's subscription, reads the partition
  counts of all subscribed topics and runs the assignor the coordinator selected.
* ``member_assignment``: what SyncGroup gave this member, decoded.
* ``start_offsets``: OffsetFetch for the assigned partitions; a partition without a committed
  offset starts at the ``start_offset`` policy (log start or log end).
* ``warn_unassigned_missing``: a follower's warning of its topics that do not exist.
* ``topics_to_watch``: the topics whose partition counts the leader watches.
* ``topics_matching``: the topics a pattern subscription stands for now.
"""

from __future__ import annotations

import functools
import inspect
import logging
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any

from .. import topics as _topics
from ..assignors import (
    Assignor,
    CooperativeAssignmentError,
    CooperativeStickyAssignor,
    RackAffinityAssignor,
    RebalanceProtocol,
    kafka_member_order,
    standing_claims,
    user_data_for,
    validate_cooperative_assignment,
)
from ..errors import Errors, ProtocolError, RcoordError
from ..protocol.consumer import (
    PROTOCOL_TYPE,
    ConsumerProtocolAssignment,
    ConsumerProtocolSubscription,
    MalformedMetadataError,
    metadata_encoding,
)
from ..protocol.join import JoinGroupResult, new_member_id
from ..protocol.kafka_consumer import HIGHEST_VERSION
from ..protocol.offsets import TopicPartition
from ..protocol.sync import SyncGroupResult
from ..topics import incarnation as _incarnation
from .config import ConsumerGroupConfig
from .coordinator import Coordinator
from .errors import InvalidAssignmentError, JoinRefusedError
from .generation import Generation
from .policy import reaction_for
from .retry import Retry

__all__ = [
    "NO_POSITION",
    "check_assignment",
    "check_cooperative",
    "fenced_reason",
    "join_generation",
    "leader_assignment",
    "log_offsets_of",
    "member_assignment",
    "start_offsets",
    "topics_matching",
    "topics_to_watch",
    "warn_unassigned_missing",
]

log = logging.getLogger("rcoord.client")


def fenced_reason(group_instance_id: str | None) -> str:
    """Why FENCED_INSTANCE_ID ended this member, as Kafka's ``FencedInstanceIdException``
    says it ("another consumer with the same group.instance.id has registered with a different
    member.id"). The code alone ("the coordinator answered FENCED_INSTANCE_ID") did not say
    that two running processes share one ``group_instance_id`` (a deployment that started the
    new copy before stopping the old one, or the same id in two configs), which is fatal to
    the older one and the only thing to fix."""
    return (f"another process joined with group_instance_id={group_instance_id!r} and took "
            "this member's place: each running process needs its own group_instance_id")


def join_error_hint(error: Errors, cfg: ConsumerGroupConfig) -> str:
    """What to change after a JoinGroup refusal that no retry can mend, as Kafka's exception
    messages say it (``InvalidSessionTimeoutException``: "not within the range allowed by the
    broker"). These refusals are fatal (``ERROR_POLICY``): the group closes, and
    ``JoinRefusedError`` carries this hint to the application. "" for other codes."""
    if error is Errors.INVALID_SESSION_TIMEOUT:
        return (
            f"session_timeout_ms={cfg.session_timeout_ms} is outside the namespace's "
            "group_min_session_timeout_ms..group_max_session_timeout_ms, Kafka's 6000..1800000 "
            "unless changed: set session_timeout_ms within them, or change the namespace "
            "settings with CoordinatorConfig"
        )
    if error is Errors.INCONSISTENT_GROUP_PROTOCOL:
        names = ", ".join(a if isinstance(a, str) else a.name for a in cfg.assignors)
        return (
            f"the group's members share none of this member's assignors [{names}], or "
            "use another protocol type: give every member of the group a common assignor"
        )
    if error is Errors.GROUP_MAX_SIZE_REACHED:
        return ("the group already has the namespace's group_max_size members: stop one, "
                "or raise group_max_size")
    if error is Errors.INVALID_GROUP_ID:
        return f"group_id={cfg.group_id!r} is not a valid group id: set a non-empty group_id"
    if error is Errors.GROUP_AUTHORIZATION_FAILED:
        return (f"this client may not use group {cfg.group_id!r}: grant it the group, or use "
                "another group_id")
    return ""


def join_generation(
    reason: str,
    member_id: str,
    *,
    config: ConsumerGroupConfig,
    assignors: Sequence[Assignor],
    coordinator: Coordinator,
    retry: Retry,
    closing: threading.Event,
    parked: Callable[[], AbstractContextManager[object]],
    on_member_id: Callable[[str], None],
    on_end: Callable[[], None],
    protocol: RebalanceProtocol = RebalanceProtocol.EAGER,
    owned: Sequence[TopicPartition] = (),
    owned_generation: int = -1,
    assigned: Sequence[TopicPartition] = (),
    assigned_generation: int = -1,
    generation_retry: Retry | None = None,
    new_member_uuid: str | None = None,
) -> Generation | None:
    """One round: JoinGroup, the leader's assignment, SyncGroup, OffsetFetch.

    ``member_id`` is the id to join with ("" for a new member); a new member's id is reported
    through ``on_member_id`` before its join is sent, so the group can leave while that join
    is parked. JoinGroup and SyncGroup run inside ``parked()``. Returns the new generation
    (whose ``on_end`` is ``on_end``), or None if ``closing`` was set. Raises ``ProtocolError``
    for an error code that retries did not clear, and ``MalformedMetadataError`` for metadata
    that cannot be decoded.

    ``owned`` and ``owned_generation`` are the partitions the member keeps through this rejoin
    and the generation it got them in (cooperative protocol, KIP-429); they go into the
    subscription so the assignor can leave them in place, and the generation's ``added`` and
    ``revoked`` are computed against them. Under the eager protocol both are empty.
    ``assigned`` and ``assigned_generation`` are the member's last assignment, kept or not, and
    its generation (-1 before the first): an assignor that remembers it in ``user_data``
    (eager ``sticky``, as Kafka's) gets them through ``user_data_for``.

    With ``config.topic_pattern`` the subscription sent is the topics the pattern matches now
    (Kafka's ``subscribeFromPattern`` on a metadata refresh); the generation keeps the pattern
    and that set so ``heartbeat.watch_partitions`` can see the set change.

    ``generation_retry`` (default ``retry``) is what the generation's commits use: the group's
    goes on after ``closing`` until the routines have returned, so their final commits retry.

    A new member's id is only its own until the coordinator answers the JoinGroup: if the join
    fails with an error whose ``ERROR_POLICY`` row keeps the member id (a lost connection, the
    coordinator unavailable), ``on_member_id("")`` forgets it, so the next round joins as a
    new member again, named by ``new_member_uuid`` (the caller keeps the UUID of an unanswered
    join and passes it back: if that join did add the member, the coordinator takes the next
    one as its rejoin). Kept, the next join went out as a known member with an id the
    coordinator never gave, which a static member whose instance id the group still maps to
    its previous process has refused as FENCED_INSTANCE_ID, fatal. While ``closing`` the id is
    kept, so the group's LeaveGroup can remove a join that landed.

    From the JoinGroup answer until the generation is made, ``heartbeat.JoinBeats`` beats, so a
    slow assignment or slow start-offset reads do not outlast the session.
    """
    cfg = config
    coord = coordinator
    pattern = cfg.topic_pattern
    if pattern is None:
        topics: tuple[str, ...] = tuple(cfg.topics)
    else:
        topics = topics_matching(pattern, retry(coord.list_topics, None))
        log.info("group %r: pattern %r matches %s", cfg.group_id, pattern.pattern, list(topics))
    subscribed = set(topics)
    owned = sorted(tp for tp in owned if tp.topic in subscribed)

    def metadata(assignor: Assignor) -> bytes:
        user_data = user_data_for(assignor, assigned, assigned_generation)
        if not user_data and assignor.name == RACK_AFFINITY and cfg.client_rack:
            user_data = _zone_user_data(cfg.client_rack)
        return ConsumerProtocolSubscription(
            topics, user_data=user_data,
            owned_partitions=owned, generation_id=owned_generation if owned else -1,
            rack=cfg.client_rack,
        ).encode(cfg.protocol_encoding)

    protocols = [(a.name, metadata(a)) for a in assignors]
    if closing.is_set():
        return None
    # A new member names itself: its id is made from a UUID chosen here and sent with every
    # retry of this join, so a retry after a lost answer rejoins the member the first attempt
    # may have added, never a second one. That is what KIP-394's MEMBER_ID_REQUIRED round
    # protects against in Kafka (and KIP-848's client-chosen member ids do the same), so the
    # round is skipped: one JoinGroup instead of two. The id is known before the join returns,
    # so close() can leave while it is parked.
    member_uuid = None
    if not member_id:
        member_uuid = new_member_uuid or str(uuid.uuid4())
        on_member_id(new_member_id(cfg.client_id, cfg.group_instance_id or "", member_uuid))

    def unanswered(error: BaseException | Errors) -> None:
        """The new member's join failed with ``error``: where its ``ERROR_POLICY`` row keeps
        the member id, there is none to keep (see the docstring). (Rows that leave send
        LeaveGroup for the id first: a join refused after it added the member is undone.)"""
        if (member_uuid is not None and not closing.is_set()
                and reaction_for(error).member_id == "keep"):
            on_member_id("")

    try:
        with parked():
            joined = retry(
                functools.partial(
                    coord.join_group,
                    cfg.group_id,
                    member_id,
                    protocol_type=PROTOCOL_TYPE,
                    protocols=protocols,
                    session_timeout_ms=cfg.session_timeout_ms,
                    rebalance_timeout_ms=cfg.rebalance_timeout_ms,
                    group_instance_id=cfg.group_instance_id,
                    client_id=cfg.client_id,
                    reason=reason,
                    require_known_member_id=False,
                    new_member_uuid=member_uuid,
                ),
                lambda r: r.error,
            )
    except Exception as exc:
        unanswered(exc)
        raise
    if joined.error is not Errors.NONE:
        unanswered(joined.error)
        message = f"JoinGroup of {cfg.group_id!r} failed: {joined.error.name}"
        if joined.error is Errors.FENCED_INSTANCE_ID:
            message += f" ({fenced_reason(cfg.group_instance_id)})"
        hint = join_error_hint(joined.error, cfg)
        if hint:
            raise JoinRefusedError(f"{message} ({hint})", joined.error, hint)
        raise ProtocolError.of(joined.error, message)
    member_id = joined.member_id
    on_member_id(member_id)
    if closing.is_set():
        return None
    log.info(
        "group %r: joined generation %d as %s%s (protocol %s)",
        cfg.group_id,
        joined.generation_id,
        member_id,
        " (leader)" if joined.leader_id == member_id else "",
        joined.protocol_name,
    )
    # (Imported here: heartbeat imports this module.)
    from .heartbeat import JoinBeats

    with JoinBeats(coord, cfg, joined.generation_id, member_id) as beats:
        plan: dict[str, bytes] | None = None
        counts: dict[str, int] | None = None
        if joined.leader_id == member_id and not joined.skip_assignment:
            plan, counts = leader_assignment(
                joined, assignors, coord, retry, cfg.group_id, protocol=protocol
            )
            beats.check()
        synced_at = [0.0]

        def sync() -> SyncGroupResult:
            synced_at[0] = time.monotonic()  # (of this attempt: the session counts from it)
            return coord.sync_group(
                cfg.group_id,
                joined.generation_id,
                member_id,
                assignments=plan,
                group_instance_id=cfg.group_instance_id,
                protocol_type=PROTOCOL_TYPE,
                protocol_name=joined.protocol_name,
            )

        with parked():
            synced = retry(sync, lambda r: r.error)
        session_from = synced_at[0]
        if synced.parked_ms is not None:
            # A parked SyncGroup kept the session alive until the leader's assignment was
            # stored, which refreshed it (sync_group.lua): count from then, the sending plus the
            # server's time parked, which is never later than the coordinator counts (the call
            # arrived after it was sent). Counting from the sending alone ended the generation
            # as lost at once when the leader synced more than a session timeout after this
            # member.
            session_from = min(session_from + synced.parked_ms / 1000, time.monotonic())
        if synced.error is not Errors.NONE:
            raise ProtocolError.of(
                synced.error,
                f"SyncGroup of {cfg.group_id!r} generation {joined.generation_id} failed: "
                f"{synced.error.name}",
            )
        partitions = member_assignment(synced, cfg.group_id)
        if counts is None and pattern is None:  # (the leader's assignment warned already)
            warn_unassigned_missing(topics, partitions, coord, cfg.group_id, member_id)
        offsets, committed = start_offsets(partitions, coord, cfg, retry)
        gen = Generation(
            group_id=cfg.group_id,
            generation_id=joined.generation_id,
            member_id=member_id,
            leader_id=joined.leader_id,
            protocol_name=joined.protocol_name,
            assignments=offsets,
            committed=committed,
            coordinator=coord,
            group_instance_id=cfg.group_instance_id,
            retention_ms=cfg.retention_ms,
            retry=generation_retry or retry,
            on_end=on_end,
            owned_before=owned,
            session_from=session_from,
            session_timeout_ms=cfg.session_timeout_ms,
        )
        beats.hand_over(gen)
    gen._watch_baseline = counts
    gen._watch_topics = topics_to_watch(topics, joined)
    gen._watch_pattern = pattern
    gen._watch_matched = topics
    return gen


def leader_assignment(
    joined: JoinGroupResult,
    assignors: Sequence[Assignor],
    coordinator: Coordinator,
    retry: Retry,
    group_id: str,
    *,
    protocol: RebalanceProtocol = RebalanceProtocol.EAGER,
) -> tuple[dict[str, bytes], dict[str, int]]:
    """The leader's step: run the selected assignor over every member's subscription.

    Under the cooperative protocol the result is checked first (``check_cooperative``): an
    assignor that moves a partition straight from one owner to another in one round would make
    two members consume it at once, so the round fails instead (Kafka's leader does the same).

    Returns every member's encoded ``ConsumerProtocolAssignment`` and the partition counts the
    assignment was made from (the partition watcher's baseline). Each assignment is encoded the
    way that member's subscription was (msgpack, or Kafka's ConsumerProtocol at the version it
    sent, at most 3), so Kafka clients in the group can read theirs.
    """
    name = joined.protocol_name or ""
    assignor = next((a for a in assignors if a.name == name), None)
    if assignor is None:
        raise ProtocolError.of(
            Errors.INCONSISTENT_GROUP_PROTOCOL,
            f"the coordinator selected protocol {name!r}, which this member did not offer "
            f"(offered: {[a.name for a in assignors]})",
        )
    subscriptions: dict[str, ConsumerProtocolSubscription] = {}
    for member in joined.members:
        try:
            subscriptions[member.member_id] = ConsumerProtocolSubscription.decode(member.metadata)
        except MalformedMetadataError as exc:
            raise MalformedMetadataError(
                f"member {member.member_id!r} of group {group_id!r} sent JoinGroup "
                f"metadata for protocol {name!r} that is not a consumer subscription: {exc}"
            ) from exc
    topics = sorted({t for sub in subscriptions.values() for t in sub.topics})
    counts = retry(lambda: coordinator.partition_counts(topics), None)
    for topic in (t for t in topics if t not in counts):
        # Kafka's client logs the topic at each metadata refresh (UNKNOWN_TOPIC_OR_PARTITION);
        # without a word, a --topic typo looked like a member waiting for partitions for ever.
        log.warning("group %r: subscribed topic %r does not exist (UNKNOWN_TOPIC_OR_PARTITION); "
                    "its partitions are assigned once it is created", group_id, topic)
    order = kafka_member_order((m.member_id, m.group_instance_id) for m in joined.members)
    extra: dict[str, Any] = {}
    if _takes(assignor, "member_order"):
        extra["member_order"] = order
    racks_of = getattr(coordinator, "partition_racks", None)
    if (_takes(assignor, "partition_racks") and racks_of is not None
            and any(_has_zone(name, sub) for sub in subscriptions.values())):
        # Only when some member says where it runs: the racks cost a read per rebalance.
        extra["partition_racks"] = retry(lambda: racks_of(counts), None)
    plan = assignor.assign(subscriptions, counts, **extra)
    log.debug("group %r: %s assignment %s", group_id, name, plan)
    check_assignment(plan, subscriptions, counts, name, group_id)
    if protocol is RebalanceProtocol.COOPERATIVE:
        owned = {mid: list(sub.owned_partitions) for mid, sub in subscriptions.items()}
        standing = standing_claims(subscriptions, counts,
                                   generation_in_user_data=name == CooperativeStickyAssignor.name)
        check_cooperative(owned, plan, name, standing)
    encodings = {m.member_id: metadata_encoding(m.metadata) for m in joined.members}
    encoded = {
        mid: ConsumerProtocolAssignment(plan.get(mid, [])).encode(
            encodings[mid][0], min(encodings[mid][1], HIGHEST_VERSION)
        )
        for mid in subscriptions
    }
    return encoded, {t: counts.get(t, 0) for t in topics}


def check_assignment(
    plan: Mapping[str, Sequence[TopicPartition]],
    subscriptions: Mapping[str, ConsumerProtocolSubscription],
    counts: Mapping[str, int],
    assignor_name: str,
    group_id: str,
) -> None:
    """Raise ``InvalidAssignmentError`` if ``plan`` gives partitions to an id that is not a
    member, or a partition its topic does not have (of the topics in ``counts``, those the
    group subscribes to): the leader's check of a plug-in's output before anything is synced.

    A topic outside the member's subscription is let through, as Kafka's leader lets a custom
    assignor add topics (``maybeUpdateGroupSubscription``): the member refuses it and rejoins
    (``Consumer``, as Kafka's ``checkAssignmentMatchedSubscription``)."""
    # A subscribed topic missing from ``counts`` does not exist: it has no partition to give.
    subscribed = {t for sub in subscriptions.values() for t in sub.topics} | set(counts)
    for mid in sorted(plan, key=repr):  # (ids of another type are named, not compared)
        said = f"group {group_id!r}: assignor {assignor_name!r} gave"
        entries = list(plan[mid])
        # (spread below: an entry that is no pair ended the round in a TypeError, or, a
        # two-letter str, was read as a topic and a partition)
        odd = [e for e in entries if isinstance(e, (str, bytes)) or not isinstance(e, Sequence)
               or len(e) != 2]
        if odd:
            raise InvalidAssignmentError(
                f"{said} {odd[0]!r} to member {mid!r}: a partition is a (topic, partition id) "
                "pair", mid, [])
        parts = [TopicPartition(*tp) for tp in entries]
        if not parts:
            continue
        if mid not in subscriptions:
            raise InvalidAssignmentError(
                f"{said} {_listed(parts)} to {mid!r}, which is not a member of the group "
                f"(members: {sorted(subscriptions)}), so no one would consume them", mid, parts)
        # (compared below: a partition id of another type ended the round in a TypeError
        # naming neither the assignor nor the member)
        mistyped = [tp for tp in parts if not isinstance(tp.topic, str)
                    or not isinstance(tp.partition, int) or isinstance(tp.partition, bool)]
        if mistyped:
            raise InvalidAssignmentError(
                f"{said} {mistyped[0]!r} to member {mid!r}: a partition is a topic (str) and "
                "a partition id (int)", mid, mistyped[:1])  # (the first: no order among them)
        missing = [tp for tp in parts if tp.topic in subscribed
                   and not 0 <= tp.partition < counts.get(tp.topic, 0)]
        if missing:
            topic = min(missing).topic
            raise InvalidAssignmentError(
                f"{said} {_listed(missing)} to member {mid!r}, but topic {topic!r} has "
                f"{counts.get(topic, 0)} partitions"
                + ("" if topic in counts else " (it does not exist)"), mid, missing)


def unsubscribed_error(gen: Generation) -> InvalidAssignmentError | None:
    """The error for ``gen``'s partitions of topics its member did not subscribe to, if any.

    A custom leader's assignor may hand them out (``check_assignment`` lets them through, as
    Kafka's leader does). ``Consumer`` leaves them out and rejoins; a ``ConsumerGroup`` that
    hands its generations out whole (``acknowledge="on_take"``) cannot take part of one, and
    its routines consumed them: it refuses the generation with this error instead."""
    # Under a pattern, the pattern decides, as Kafka's checkAssignmentMatchedSubscription does:
    # the leader may have seen a matching topic made since this member listed the topics.
    subscribed, pattern = set(gen.watched_matched), gen.watched_pattern
    foreign = [tp for tp in gen.partitions if tp.topic not in subscribed
               and (pattern is None or not pattern.fullmatch(tp.topic))]
    if not foreign:
        return None
    topic = min(foreign).topic
    return InvalidAssignmentError(
        f"group {gen.group_id!r}: the leader's assignor {gen.protocol_name!r} gave topic "
        f"{topic!r} ({_listed(foreign)}) to member {gen.member_id!r}, which does not subscribe "
        f"to it (its topics: {sorted(subscribed)})", gen.member_id, foreign)


def _listed(parts: Sequence[TopicPartition]) -> str:
    return ", ".join(f"{tp.topic}-{tp.partition}" for tp in sorted(parts))


def check_cooperative(
    owned: Mapping[str, Sequence[TopicPartition]],
    assigned: Mapping[str, Sequence[TopicPartition]],
    assignor_name: str = "",
    standing: Mapping[str, Sequence[TopicPartition]] | None = None,
) -> None:
    """Raise ``CooperativeAssignmentError`` if a partition moves between two owners in one round.

    KIP-429's rule (``rcoord.assignors.validate_cooperative_assignment``), with the assignor
    named in the message so the leader's error says which plug-in is at fault.
    """
    try:
        validate_cooperative_assignment(owned, assigned, standing)
    except CooperativeAssignmentError as exc:
        raise CooperativeAssignmentError(
            f"assignor {assignor_name!r} breaks the cooperative protocol: {exc}", exc.partitions
        ) from None


def member_assignment(synced: SyncGroupResult, group_id: str) -> list[TopicPartition]:
    """The partitions SyncGroup assigned to this member."""
    try:
        assignment = (
            ConsumerProtocolAssignment.decode(synced.assignment)
            if synced.assignment
            else ConsumerProtocolAssignment([])
        )
    except MalformedMetadataError as exc:
        raise MalformedMetadataError(
            f"the leader of {group_id!r} sent this member an assignment it cannot decode: {exc}"
        ) from exc
    return list(assignment.partitions)


def warn_unassigned_missing(topics: Sequence[str], partitions: Sequence[TopicPartition],
                            coordinator: Coordinator, group_id: str, member_id: str) -> None:
    """Warn of each of a follower's ``topics`` that does not exist, once per generation, as
    the leader does at each assignment: only the leader read the counts, so a follower with a
    --topic typo (in its process, not the leader's) was assigned nothing without a word.

    A topic of which the member got a partition exists: only the others are read, so a member
    holding partitions of all its topics makes no round trip. The read is one attempt whose
    failure is only logged: a warning is not worth failing a generation already synced."""
    held = {tp.topic for tp in partitions}
    unassigned = [t for t in topics if t not in held]
    if not unassigned:
        return
    try:
        counts = coordinator.partition_counts(unassigned)
    except RcoordError as exc:
        log.debug("group %r: reading whether %s exist failed: %s", group_id, unassigned, exc)
        return
    for topic in (t for t in unassigned if t not in counts):
        log.warning("group %r: topic %r this member (%s) subscribes to does not exist "
                    "(UNKNOWN_TOPIC_OR_PARTITION); its partitions are assigned once it is "
                    "created", group_id, topic, member_id)


def topics_to_watch(topics: Sequence[str], joined: JoinGroupResult) -> list[str]:
    """This member's topics and every topic another member subscribed to."""
    watched = set(topics)
    for member in joined.members:
        try:
            watched.update(ConsumerProtocolSubscription.decode(member.metadata).topics)
        except MalformedMetadataError:
            pass
    return sorted(watched)


def topics_matching(pattern: re.Pattern[str], names: Iterable[str]) -> tuple[str, ...]:
    """The names ``pattern`` matches as a whole (Java's ``Matcher.matches``, which Kafka's
    pattern subscription uses), sorted: ``orders-.*`` takes ``orders-eu``, not ``old-orders-eu``."""
    return tuple(sorted(n for n in set(names) if pattern.fullmatch(n)))


NO_POSITION = -1
"""The start offset of a partition with no committed offset under ``start_offset="none"``."""


def start_offsets(
    partitions: list[TopicPartition],
    coordinator: Coordinator,
    config: ConsumerGroupConfig,
    retry: Retry,
    *,
    missing: set[TopicPartition] | None = None,
) -> tuple[dict[TopicPartition, int], dict[TopicPartition, int]]:
    """Committed offsets of the assigned partitions, the start-offset policy elsewhere.

    Returns (offset to start at, committed offset) for each partition; partitions without a
    committed offset are missing from the second, and start at ``NO_POSITION`` under the
    policy "none" (the application chooses). A commit older than its topic (made to a deleted
    topic of the same name: ``rcoord.topics.incarnation``) counts as none, as Kafka deletes it
    with the topic.

    A partition to start by the policy that does not exist (UNKNOWN_TOPIC_OR_PARTITION) starts
    at 0, or, when the caller passes a ``missing`` set (``assign()``, which leaves it without a
    position until it exists), is added to it, 0 standing for no offset. The same log read
    decides it, so a topic created between two reads cannot start at 0, and the log line says
    what happens to it (it said "starting at 0" for those too). With that set, a committed
    partition that does not exist counts as one without a commit, as Kafka deletes a topic's
    offsets with it: rcoord keeps them, and a commit older than its topic is judged only
    while the topic exists, so ``assign()`` of a deleted topic's partition started at the old
    offset, and skipped that many records of the topic created again.
    """
    if not partitions:
        return {}, {}
    cfg = config
    coord = coordinator
    fetched = retry(lambda: coord.fetch_offsets(cfg.group_id, partitions), lambda r: r.error)
    if fetched.error is not Errors.NONE:
        raise ProtocolError.of(fetched.error, f"OffsetFetch of {cfg.group_id!r} failed")
    kept = {tp for tp in partitions
            if (found := fetched.offsets.get(tp)) is not None and found.offset >= 0}
    # The logs are read before the creation times: a commit is judged by the topic that exists
    # after every read it is checked against. Judged first, a topic deleted and created again
    # between the two reads (milliseconds) kept the deleted topic's commit, which assign()'s
    # log read then found to exist: the new topic started at the old offset, records skipped.
    # With a ``missing`` set, the committed partitions' logs are read too (the same read): a
    # commit to a partition that does not exist is left from a deleted topic.
    uncommitted = [] if cfg.start_offset == "none" else [tp for tp in partitions
                                                         if tp not in kept]
    checked = [tp for tp in partitions if tp in kept] if missing is not None else []
    edges = log_offsets_of(uncommitted + checked, coord, retry)
    judged = _incarnation.topics_to_judge(fetched.offsets)
    created = retry(lambda: coord.created_times(judged), None) if judged else {}
    stale = _incarnation.older_than_their_topic(fetched.offsets, created) & kept
    for tp in sorted(stale):
        log.warning("group %r: the offset %d committed to %s-%d predates the topic's creation "
                    "(it was deleted and created again): starting by start_offset=%r",
                    cfg.group_id, fetched.offsets[tp].offset, tp.topic, tp.partition,
                    cfg.start_offset)
    offsets: dict[TopicPartition, int] = {}
    committed: dict[TopicPartition, int] = {}
    for tp in partitions:
        if tp in kept and tp not in stale:
            offsets[tp] = committed[tp] = fetched.offsets[tp].offset
        elif cfg.start_offset == "none":
            offsets[tp] = NO_POSITION
    # Read again, the rare cases (a round trip more): a stale commit's partition, which starts
    # by the policy at the edges of the topic created again (the read above may have been of
    # the deleted topic); and, with a ``missing`` set, a kept commit whose topic has no
    # creation time now (deleted after the read above, or made before topics kept one): a
    # partition that does not exist now has no position, as when the first read found none.
    again = [] if cfg.start_offset == "none" else sorted(stale)
    again += [tp for tp in checked if tp in committed and tp.topic not in created]
    edges.update(log_offsets_of(again, coord, retry))
    for tp in checked:
        got = edges[tp]
        if (tp in committed and isinstance(got, _topics.TopicError)
                and got.error is Errors.UNKNOWN_TOPIC_OR_PARTITION):
            log.warning("group %r: the offset %d committed to %s-%d is of a partition that does "
                        "not exist (a deleted topic's): it counts as none", cfg.group_id,
                        committed[tp], tp.topic, tp.partition)
            del offsets[tp], committed[tp]
            if cfg.start_offset == "none":
                offsets[tp] = NO_POSITION
    for tp in partitions:
        if tp not in offsets:
            got = edges[tp]
            if (isinstance(got, _topics.TopicError) and missing is not None
                    and got.error is Errors.UNKNOWN_TOPIC_OR_PARTITION):
                log.warning("%s-%d does not exist yet; it gets no position until it does, then "
                            "start_offset=%r at that time", tp.topic, tp.partition,
                            cfg.start_offset)
                missing.add(tp)
                got = (0, 0)
            elif isinstance(got, _topics.TopicError):
                log.warning("no log offsets for %s-%d (%s); starting at 0",
                            tp.topic, tp.partition, got)
                got = (0, 0)
            offsets[tp] = got[0] if cfg.start_offset == "earliest" else got[1]
    return {tp: offsets[tp] for tp in partitions}, committed


def log_offsets_of(
    partitions: Sequence[TopicPartition], coordinator: Coordinator, retry: Retry
) -> dict[TopicPartition, tuple[int, int] | _topics.TopicError]:
    """The log start and end offsets of ``partitions`` (for ``start_offsets``, and the Spark
    member's placements), in one ``log_offsets_many`` (a round trip per node), or the
    ``TopicError`` of one that has none (a deleted topic, a partition out of range, a stream
    whose last id is not rcoord's: UNKNOWN_SERVER_ERROR with its ``detail``). Other errors
    (Redis away) raise, after ``retry``.

    One read each cost a round trip per partition on every rebalance: with 2000 partitions
    and a 1 ms network round trip, two seconds. A name the batched read refuses before it
    sends anything (an illegal topic name in the leader's assignment) fails the whole batch,
    so then the partitions are read one by one, each with its own answer as before."""
    if not partitions:
        return {}
    out: dict[TopicPartition, tuple[int, int] | _topics.TopicError] = {}
    try:
        answers = retry(lambda: coordinator.log_offsets_many(partitions), None)
    except _topics.TopicError:
        for tp in partitions:
            try:
                out[tp] = retry(
                    functools.partial(coordinator.log_offsets, tp.topic, tp.partition), None)
            except _topics.TopicError as exc:
                out[tp] = exc
        return out
    for tp, got in zip(partitions, answers, strict=True):  # (a TopicError kept: its detail)
        out[tp] = (got if isinstance(got, (tuple, _topics.TopicError))
                   else _topics.TopicError(got, f"{tp.topic}-{tp.partition}"))
    return out


RACK_AFFINITY = RackAffinityAssignor.name
"""kafka-go's ``RackAffinityGroupBalancer`` protocol, whose members say their zone in
``user_data`` (the bare rack name), not in the subscription's ``rack`` field."""


def _zone_user_data(rack: str) -> bytes:
    """A member's ``user_data`` for the rack-affinity protocol: its rack, as kafka-go's
    ``RackAffinityGroupBalancer.UserData`` sends it. A kafka-go leader reads every member's
    zone from there only; without it, it took an rcoord member for zone "" and gave it
    partitions of other zones."""
    return rack.encode("utf-8")


def _has_zone(protocol: str, sub: ConsumerProtocolSubscription) -> bool:
    """Whether a member says where it runs: a ``rack``, or under rack-affinity a zone in
    ``user_data`` (how kafka-go members, which send no rack field, say it). The leader reads the
    partition racks only then; under rack-affinity, a group of kafka-go members never got them,
    so their assignor saw no zones."""
    return bool(sub.rack) or (protocol == RACK_AFFINITY and bool(sub.user_data))


def _takes(assignor: Assignor, keyword: str) -> bool:
    """Whether the assignor's ``assign`` accepts ``keyword`` (plug-ins may not)."""
    try:
        return keyword in inspect.signature(assignor.assign).parameters
    except (TypeError, ValueError):
        return False
