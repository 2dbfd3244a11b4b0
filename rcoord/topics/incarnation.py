"""Committed offsets that belong to an earlier topic of the same name.

Kafka deletes a topic's committed offsets from every group when the topic is deleted, so a
group that reads a topic created again under that name finds nothing committed and starts by
its reset policy. rcoord keeps them: the topic and each group live in slots of their own, and
no delete could reach every group at once (nor survive a crash half-way). Instead a reader asks
which commits are older than the topic itself: a commit made before the topic's creation
(``created_ms``, the topic node's Redis ``TIME``; the commit's own time is the group node's) is
one of a deleted topic, and counts as none. Before, a consumer resumed the new topic at the old
offset and silently skipped the records below it.

Both times are Redis ``TIME`` in milliseconds, of (in a cluster) two masters, so the rule holds
up to their clock skew: a commit made to the new topic within that skew of its creation (or in
its millisecond) counts as old (the group then starts by its policy again), and one made to the
old topic within the skew of the new topic's creation may count as new. ``Topics.create``
returns only once its millisecond is over, so on one node a commit made after it returned is
always the new topic's.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ..protocol.offsets import OffsetAndMetadata, TopicPartition
from ._base import meta_key

__all__ = ["created_times", "created_times_async", "older_than_their_topic", "stale_commits",
           "topics_to_judge"]


def topics_to_judge(offsets: Mapping[TopicPartition, OffsetAndMetadata]) -> list[str]:
    """The topics whose creation times ``older_than_their_topic`` needs for ``offsets``: those
    with a commit (an offset of -1 is none, and is not judged), sorted."""
    return sorted({tp.topic for tp, om in offsets.items() if om.offset >= 0})


def older_than_their_topic(offsets: Mapping[TopicPartition, OffsetAndMetadata],
                           created: Mapping[str, int]) -> set[TopicPartition]:
    """The partitions of ``offsets`` whose commit was made before their topic was created, or in
    the same millisecond (``created``: topic -> ``created_ms``; a topic missing from it, or with
    no creation time, is not judged). A commit without a time (an offset of -1) is not judged
    either. The millisecond of the creation counts as before: a commit, delete and create can
    fall in one millisecond, and taking the old offset for the new topic's would skip records,
    where taking a new commit for none only starts the partition by the policy again."""
    out = set()
    for tp, om in offsets.items():
        made = om.commit_timestamp_ms
        born = created.get(tp.topic)
        if om.offset >= 0 and made is not None and born and made <= born:
            out.add(tp)
    return out


def _created_pipeline(redis_client: Any, namespace: str, names: list[str]) -> Any:
    """One pipeline reading each topic's ``created_ms`` (a cluster's reaches each node);
    blocking or asyncio, as ``redis_client`` is."""
    pipe = redis_client.pipeline(transaction=False)
    for topic in names:
        pipe.hget(meta_key(namespace, topic), "created_ms")
    return pipe


def _created(topics: list[str], replies: list[Any]) -> dict[str, int]:
    return {t: int(raw) for t, raw in zip(topics, replies, strict=True) if raw is not None}


def created_times(redis_client: Any, namespace: str, topics: Iterable[str]) -> dict[str, int]:
    """Each existing topic's ``created_ms``, in one pipeline."""
    names = sorted(set(topics))
    if not names:
        return {}
    return _created(names, _created_pipeline(redis_client, namespace, names).execute())


async def created_times_async(redis_client: Any, namespace: str,
                              topics: Iterable[str]) -> dict[str, int]:
    """``created_times`` on a ``redis.asyncio`` client."""
    names = sorted(set(topics))
    if not names:
        return {}
    return _created(names, await _created_pipeline(redis_client, namespace, names).execute())


def stale_commits(redis_client: Any, namespace: str,
                  offsets: Mapping[TopicPartition, OffsetAndMetadata]) -> set[TopicPartition]:
    """The partitions of ``offsets`` whose commit belongs to a deleted topic of the same name
    (``older_than_their_topic``), reading the topics' creation times."""
    created = created_times(redis_client, namespace, topics_to_judge(offsets))
    return older_than_their_topic(offsets, created)
