"""A generation's background threads: the heartbeat and the watcher.

``start_helpers`` starts them (as the generation's helper threads, which ``Generation.collect``
joins) when a generation is handed out; they end the generation
(``Generation._end``) when the coordinator, the partition counts or the topics a pattern matches
say so, and stop once its routines have returned (the heartbeat) or it has ended (the watcher).

The watcher runs on the leader (partition counts of every topic the group subscribes to, as
Kafka's leader compares its metadata snapshot with the one it assigned from) and on every member
that subscribes by pattern (the topics its pattern matches against the set it joined with, as
Kafka's consumer rejoins when its pattern subscription changed since the last join). A
follower's changed subscription makes the coordinator rebalance the group, so a topic that only
a follower's pattern matches is picked up too.
"""

from __future__ import annotations

import logging
import time

from ..errors import Errors, RcoordError
from .config import ConsumerGroupConfig
from .coordinator import Coordinator
from .generation import EndReason, Generation
from .join import topics_matching
from .policy import reaction_for
from .retry import Retry

__all__ = ["heartbeat_loop", "start_helpers", "watch_partitions", "watch_session"]

log = logging.getLogger("rcoord.client")


def start_helpers(
    gen: Generation, coordinator: Coordinator, config: ConsumerGroupConfig, retry: Retry
) -> None:
    """Start the heartbeat (and the partition watcher, on the leader or under a pattern
    subscription) of ``gen`` as its helper threads; ``Generation.collect`` joins them."""
    gen.start_helper(lambda: heartbeat_loop(gen, coordinator, config, retry), "heartbeat")
    gen.start_helper(lambda: watch_session(gen, config), "session")
    if (config.watch_partition_changes and gen.is_leader) or gen.watched_pattern is not None:
        gen.start_helper(lambda: watch_partitions(gen, coordinator, config), "watcher")


def heartbeat_loop(
    gen: Generation, coordinator: Coordinator, config: ConsumerGroupConfig, retry: Retry
) -> None:
    """Beat every heartbeat interval until the generation's routines have all returned.

    Errors follow ``ERROR_POLICY``: a revoking member (REBALANCE_IN_PROGRESS) keeps beating
    so that its session survives a slow revocation; once the partitions are lost, beating
    is pointless and stops.
    """
    cfg = config
    coord = coordinator
    interval = cfg.heartbeat_interval_ms / 1000
    sent = [0.0]

    def beat() -> Errors:
        sent[0] = time.monotonic()  # (of this attempt: retries resend)
        return coord.heartbeat(
            gen.group_id, gen.generation_id, gen.member_id, cfg.group_instance_id)

    while not gen.wait_routines(interval):
        if gen.lost:
            # Lost from the client's side too (the poll timer left the group): a static member,
            # which sends no LeaveGroup, must stop beating so its session ends and the others
            # get its partitions, as Kafka's heartbeat thread stops once the generation is reset.
            return
        try:
            error = retry(beat, lambda e: e)
        except Exception as exc:  # noqa: BLE001 - ERROR_POLICY decides (OTHERWISE for bugs)
            gen._end(EndReason.of(exc), exc)
            return
        if error in (Errors.NONE, Errors.REBALANCE_IN_PROGRESS):  # the session was refreshed
            gen.heartbeat_answered(sent[0])
        if error is Errors.NONE:
            continue
        gen._end(EndReason.of(error), error)
        if reaction_for(error).lost:
            return


def watch_session(gen: Generation, config: ConsumerGroupConfig) -> None:
    """End ``gen`` with its partitions lost once no heartbeat has been answered for a session
    timeout (``Generation._session_expired``), whatever the heartbeat thread is waiting for.

    A member cut off from Redis (a black hole, no reset) had its heartbeat stuck in calls that
    each wait for the client's socket timeout and are retried, so its generation ended about
    30 s later, while the coordinator gave its partitions to another member after the session
    timeout, and ``poll()`` went on handing out the records it had fetched: two owners. The
    session is counted from the sending of the last heartbeat answered (or of the SyncGroup
    that made the generation, plus the server's time it was parked waiting for the leader's),
    never later than the coordinator counts it. Stops when the generation ends.
    """
    session_s = config.session_timeout_ms / 1000
    while True:
        left = gen.session_left(session_s)
        if left <= 0:
            if not gen.done.is_set():
                log.warning("group %r: no heartbeat answered for %d ms (the session timeout): "
                            "the partitions of generation %d are lost", gen.group_id,
                            config.session_timeout_ms, gen.generation_id)
                gen._session_expired(config.session_timeout_ms)
            return
        if gen.done.wait(left):
            return


def watch_partitions(
    gen: Generation, coordinator: Coordinator, config: ConsumerGroupConfig
) -> None:
    """End the generation when a partition count changes (leader) or the topics the member's
    pattern matches change (pattern subscription), checking every partition watch interval."""
    cfg = config
    topics = gen.watched_topics
    baseline = gen.watched_baseline
    interval = cfg.partition_watch_interval_ms / 1000
    coord = coordinator
    counting = cfg.watch_partition_changes and gen.is_leader
    if not counting:
        while not gen.done.wait(interval):
            if _pattern_changed(gen, coord, cfg):
                return
        return
    if baseline is None:
        try:
            baseline = _counts(coord, topics)
        except RcoordError as exc:
            log.warning("partition watcher: reading partition counts failed: %s", exc)
            baseline = None
    while not gen.done.wait(interval):
        if _pattern_changed(gen, coord, cfg):
            return
        try:
            counts = _counts(coord, topics)
        except RcoordError as exc:
            log.warning("partition watcher: reading partition counts failed: %s", exc)
            continue
        if baseline is None:
            baseline = counts
        elif counts != baseline:
            log.info(
                "group %r: partition counts changed %s -> %s; rejoining",
                cfg.group_id,
                baseline,
                counts,
            )
            gen._end(EndReason.PARTITIONS_CHANGED)
            return


def _pattern_changed(gen: Generation, coord: Coordinator, cfg: ConsumerGroupConfig) -> bool:
    """If ``gen``'s member subscribes by pattern and the matched topics are no longer the set it
    joined with, end the generation (the rejoin sends the new set) and return True."""
    pattern = gen.watched_pattern
    if pattern is None:
        return False
    try:
        matched = topics_matching(pattern, coord.list_topics())
    except RcoordError as exc:
        log.warning("pattern watcher: listing the topics failed: %s", exc)
        return False
    if matched == gen.watched_matched:
        return False
    log.info(
        "group %r: pattern %r now matches %s (joined with %s); rejoining",
        cfg.group_id,
        pattern.pattern,
        list(matched),
        list(gen.watched_matched),
    )
    gen._end(EndReason.SUBSCRIPTION_CHANGED)
    return True


def _counts(coord: Coordinator, topics: list[str]) -> dict[str, int]:
    found = coord.partition_counts(topics)
    return {t: found.get(t, 0) for t in topics}
