"""DeleteRecords (``kafka-delete-records``, AdminClient's ``deleteRecords``) over
``rcoord.topics.Topics.delete_records``.

As Kafka's ``KafkaApis.handleDeleteRecordsRequest``: DELETE on the topic (else
TOPIC_AUTHORIZATION_FAILED), a topic or partition that does not exist UNKNOWN_TOPIC_OR_PARTITION
(an illegal name, a negative index too), then per partition what the log answers
(OFFSET_OUT_OF_RANGE past the log end; the new log start, the ``low_watermark``, otherwise);
-1 for the low watermark of every error. A partition named twice is answered once, with the
last offset given, as Kafka's request map keeps it. A topic whose call cannot reach Redis is
REQUEST_TIMED_OUT on its partitions alone, and a partition of it Redis cannot reach (its slot
with no master) on itself alone; NOT_LEADER_OR_FOLLOWER where Redis refused the call unrun
(``_unreached_code``). A partition the log cannot serve (a stream whose last
id an XADD by hand made its own) is UNKNOWN_SERVER_ERROR, and the gateway logs why and what
mends it, which DeleteRecords has no field to carry.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from ..connect import one_operation, refused_unrun
from ..errors import Errors
from ..topics import DeletedRecords, DeleteRecordsIncomplete, TopicError
from .acl import Operation, ResourceType
from .errors import NOT_LEADER_OR_FOLLOWER, TOPIC_AUTHORIZATION_FAILED, UNREACHED, log_unreached
from .registry import api
from .state import Connection, GatewayState

__all__: list[str] = []

log = logging.getLogger(__name__)


def _delete(state: GatewayState, topic: str, offsets: dict[int, int]) -> dict[int, tuple[int, int]]:
    """Blocking: partition -> (error code, low watermark) for one topic's partitions."""
    out = _negative(offsets)
    wanted = {p: offset for p, offset in offsets.items() if p >= 0}
    try:
        with one_operation(state.sync_redis):  # (a script reload's resend judged with its send)
            answers = state.topics.delete_records(topic, wanted) if wanted else {}
    except TopicError as exc:
        if exc.error not in (Errors.UNKNOWN_TOPIC_OR_PARTITION, Errors.INVALID_TOPIC_EXCEPTION):
            raise
        return {p: (Errors.UNKNOWN_TOPIC_OR_PARTITION.value, -1) for p in offsets}
    return {**out, **_answers(topic, answers)}


def _negative(offsets: dict[int, int]) -> dict[int, tuple[int, int]]:
    """The answers of the negative partition indexes of ``offsets`` (none exists)."""
    return {p: (Errors.UNKNOWN_TOPIC_OR_PARTITION.value, -1) for p in offsets if p < 0}


def _answers(topic: str, answers: dict[int, DeletedRecords]) -> dict[int, tuple[int, int]]:
    """partition -> (error code, low watermark) of ``Topics.delete_records``' answers."""
    out: dict[int, tuple[int, int]] = {}
    for p, a in answers.items():
        if a.detail:
            # The answer's UNKNOWN_SERVER_ERROR alone says nothing (a DeleteRecords partition
            # has no error message): the why and the mend go to the log. Before the
            # per-partition answer (ba3c0cb) the whole request failed and dispatch logged the
            # error with them; then they were dropped, and the operator had only the code.
            log.warning("DeleteRecords of %s-%d: %s: %s", topic, p, a.error.name, a.detail)
        out[p] = (a.error.value, a.low_watermark)
    return out


def _unreached_code(exc: BaseException) -> int:
    """The error of a partition whose removal could not reach Redis: REQUEST_TIMED_OUT, or
    NOT_LEADER_OR_FOLLOWER when every attempt of the failed call was refused unrun (a slot
    move's ``TRYAGAIN``, a slot with no master, CLUSTERDOWN: ``rcoord.connect.refused_unrun``),
    as Kafka's ``ReplicaManager.deleteRecords`` answers a partition whose leader moved.
    kafka-python's ``delete_records`` asks such a partition again, with fresh metadata, until
    its timeout, and raised at once on REQUEST_TIMED_OUT; Java's AdminClient retries both. A
    removal asked again is harmless (one done is done again with no effect), so the certainty
    only makes the retry automatic; earlier rounds of a large removal may have trimmed some."""
    return NOT_LEADER_OR_FOLLOWER if refused_unrun(exc) else Errors.REQUEST_TIMED_OUT.value


async def _topic_reached(state: GatewayState, name: str) -> bool:
    """Whether the topic's own keys (its partition count) can be read: else its partitions
    are not asked one by one, each to fail the same way (Redis itself unreachable)."""
    try:
        await state.blocking(state.topics.partition_count, name)
    except UNREACHED:
        return False
    except TopicError:
        pass  # (deleted meanwhile: each partition's call answers it)
    return True


@api(21, "DeleteRecords", 0, 2)
async def delete_records(conn: Connection, req: Any, version: int) -> dict[str, Any]:
    state = conn.state
    wanted: dict[str, dict[int, int]] = {}
    for topic in req.topics:
        offsets = wanted.setdefault(topic.name, {})
        offsets.update((int(p.partition_index), int(p.offset)) for p in topic.partitions)

    async def one(name: str, offsets: dict[int, int]) -> dict[int, tuple[int, int]]:
        if not conn.may(Operation.DELETE, ResourceType.TOPIC, name):
            return dict.fromkeys(offsets, (TOPIC_AUTHORIZATION_FAILED, -1))
        try:
            return await state.blocking(_delete, state, name, offsets)
        except UNREACHED as exc:
            log_unreached(state, f"topic {name!r}", exc)
            out: dict[int, tuple[int, int]] = {}
            again, done = offsets, False
            if isinstance(exc, DeleteRecordsIncomplete):
                # The partitions it finished keep their answers, and the others are asked
                # again at the offsets it resolved: asked again, a -1 (the log end) removed
                # the records appended since the first call read it. (Redis answered some of
                # its calls: one partition left is asked again too.)
                out = {**_negative(offsets), **_answers(name, exc.done)}
                again, done = exc.unfinished, bool(exc.done)
            if (len(again) < 2 and not done) or not await _topic_reached(state, name):
                return {**out, **dict.fromkeys(again, (_unreached_code(exc), -1))}
        # One partition Redis could not reach (on a cluster, its slot with no master) failed
        # the topic's call after the others' records were removed: every partition was
        # REQUEST_TIMED_OUT. Each is asked again alone (a removal done is done again with no
        # effect), so that only the unreached ones are, as Kafka answers by partition.
        alone = await asyncio.gather(*(state.blocking(_delete, state, name, {p: offset})
                                       for p, offset in again.items()),
                                     return_exceptions=True)
        for p, res in zip(again, alone, strict=True):
            if isinstance(res, UNREACHED):
                out[p] = (_unreached_code(res), -1)
            elif isinstance(res, BaseException):
                raise res
            else:
                out.update(res)
        return out

    answers = await asyncio.gather(*(one(name, offsets) for name, offsets in wanted.items()))
    return {"throttle_time": 0, "topics": [
        {"name": name, "partitions": [
            {"partition_index": p, "low_watermark": low, "error_code": code}
            for p, (code, low) in answered.items()]}
        for name, answered in zip(wanted, answers)]}
