"""The seam between the worker client and Redis: the narrow ``Coordinator`` protocol.

``Coordinator`` has one method per request the client sends (kafka-go's ``coordinator``
interface), so tests can replace Redis with a fake whose methods are plain function fields.
``RedisCoordinator`` is the implementation on Redis; ``client_from_url`` makes its client.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, TypeVar

from .. import topics as _topics
from ..config import CoordinatorConfig
from ..connect import connect
from ..coordinator import GroupCoordinator
from ..errors import (
    AuthenticationFailedError,
    Errors,
    as_authentication_failed,
    translate_redis_errors,
)
from ..protocol.join import JoinGroupResult
from ..protocol.leave import LeaveGroupResult, MemberIdentity
from ..protocol.offsets import OffsetAndMetadata, OffsetFetchResult, TopicPartition
from ..protocol.sync import SyncGroupResult
from ..topics import incarnation as _incarnation
from ..topics import racks as _racks
from ..topics.fetch import log_offsets_each as _log_offsets_each
from ..topics.times import OffsetAndTimestamp
from ..topics.times import offsets_for_times as _offsets_for_times

__all__ = ["SOCKET_TIMEOUT_S", "Coordinator", "RedisCoordinator", "client_from_url"]

R = TypeVar("R")

SOCKET_TIMEOUT_S = 10.0
"""Socket timeout of clients made from ``redis_url``: above a parked call's 1 s XREAD."""


class Coordinator(Protocol):
    """What the client needs from the coordinator and the topics, one method per request.

    ``RedisCoordinator`` implements it on Redis; tests implement it with function fields.
    Group-step methods have ``GroupCoordinator``'s signatures and Kafka error codes.
    """

    def join_group(
        self,
        group_id: str,
        member_id: str = "",
        *,
        protocol_type: str,
        protocols: Sequence[tuple[str, bytes]],
        session_timeout_ms: int,
        rebalance_timeout_ms: int | None = None,
        group_instance_id: str | None = None,
        client_id: str = "",
        reason: str | None = None,
        require_known_member_id: bool = True,
        new_member_uuid: str | None = None,
    ) -> JoinGroupResult: ...

    def sync_group(
        self,
        group_id: str,
        generation_id: int,
        member_id: str,
        *,
        assignments: dict[str, bytes] | None = None,
        group_instance_id: str | None = None,
        protocol_type: str | None = None,
        protocol_name: str | None = None,
    ) -> SyncGroupResult: ...

    def heartbeat(
        self,
        group_id: str,
        generation_id: int,
        member_id: str,
        group_instance_id: str | None = None,
    ) -> Errors: ...

    def leave_group(self, group_id: str, members: Sequence[MemberIdentity]) -> LeaveGroupResult: ...

    def commit_offsets(
        self,
        group_id: str,
        offsets: dict[TopicPartition, OffsetAndMetadata | int],
        *,
        member_id: str = "",
        generation_id: int = -1,
        group_instance_id: str | None = None,
        retention_ms: int | None = None,
    ) -> dict[TopicPartition, Errors]: ...

    def fetch_offsets(
        self, group_id: str, partitions: Sequence[TopicPartition] | None = None
    ) -> OffsetFetchResult: ...

    def partition_counts(self, topics: Sequence[str]) -> dict[str, int]:
        """Partition count of each existing topic; unknown topics are left out."""
        ...

    def partition_racks(self, counts: Mapping[str, int]) -> dict[TopicPartition, set[str]]:
        """The racks holding each partition (``rcoord.topics.racks``); {} when none declared."""
        ...

    def log_offsets(self, topic: str, partition: int) -> tuple[int, int]:
        """(log start offset, log end offset) of a partition."""
        ...

    def log_offsets_many(
        self, partitions: Sequence[TopicPartition]
    ) -> list[tuple[int, int] | Errors | _topics.TopicError]:
        """``log_offsets`` of several partitions in one round trip, in the same order; the
        error code (UNKNOWN_TOPIC_OR_PARTITION) for one that does not exist, and the
        ``TopicError`` (UNKNOWN_SERVER_ERROR, its ``detail`` saying what mends it) for one
        whose stream cannot be read (``rcoord.topics.fetch.log_offsets_each``), each in its
        place, as Kafka's ListOffsets answers per partition."""
        ...

    def created_times(self, topics: Sequence[str]) -> dict[str, int]:
        """Each existing topic's creation time (``rcoord.topics.incarnation``: a commit older
        than its topic belongs to a deleted topic of the same name)."""
        ...

    def fetch(
        self, topic: str, partition: int, offset: int, max_records: int, block_ms: int | None,
        *, max_bytes: int | None = None, waker: _topics.FetchWaker | None = None,
    ) -> _topics.FetchResult:
        """Records of one partition from ``offset`` (``rcoord.topics.fetch``); ``waker`` ends
        its ``block_ms`` wait early."""
        ...

    def fetch_many_as(
        self, reads: Sequence[tuple[str, int, int]], max_records: int, record_type: type[R],
        *, max_bytes: int | None = None, partition_max_bytes: int | None = None,
        record_bytes: Sequence[int] | None = None,
    ) -> list[_topics.PartitionRecords[R]]:
        """Records of several ``(topic, partition, offset)`` reads as ``record_type``s, answers
        in the same order, in one round trip per node and byte-bounded step; never blocks
        (``rcoord.topics.fetch_many_as``)."""
        ...

    def offsets_for_times(
        self, timestamps: Mapping[tuple[str, int], int]
    ) -> dict[tuple[str, int], OffsetAndTimestamp | None]:
        """The first offset at or after each timestamp (``rcoord.topics.offsets_for_times``)."""
        ...

    def list_topics(self) -> list[str]:
        """Every topic of the namespace (for pattern subscriptions)."""
        ...


class RedisCoordinator(GroupCoordinator):
    """The ``Coordinator`` on Redis: ``GroupCoordinator`` plus the topic reads a worker needs.

    It uses the settings stored in the namespace (it writes none), so workers enforce the limits
    the deployment's coordinators configured. Its members join with this machine's host name as
    their client host: Kafka's broker records the address a member connects from, which
    ``rcoord groups describe`` shows in its HOST column; behind Redis no server sees the worker,
    so the worker names its host itself.
    """

    def __init__(self, redis_client: Any, namespace: str = "rcoord", *,
                 commit_required_acks: int = 0, commit_ack_timeout_ms: int = 5000) -> None:
        super().__init__(redis_client, CoordinatorConfig(namespace=namespace))
        self._ns = namespace
        self._topic_admin = _topics.Topics(redis_client, namespace)
        self._commit_acks = (commit_required_acks, commit_ack_timeout_ms)
        self._client_host = socket.gethostname()

    def join_group(self, group_id: str, member_id: str = "", **kwargs: Any) -> JoinGroupResult:
        """JoinGroup naming this machine as the member's host, unless the call names one."""
        kwargs.setdefault("client_host", self._client_host)
        return super().join_group(group_id, member_id, **kwargs)

    def commit_offsets(
        self,
        group_id: str,
        offsets: dict[TopicPartition, OffsetAndMetadata | int],
        **kwargs: Any,
    ) -> dict[TopicPartition, Errors]:
        """OffsetCommit with the replica acknowledgement the worker's config asks for
        (``commit_required_acks``), unless the call names its own."""
        kwargs.setdefault("required_acks", self._commit_acks[0])
        kwargs.setdefault("ack_timeout_ms", self._commit_acks[1])
        return super().commit_offsets(group_id, offsets, **kwargs)

    @translate_redis_errors
    def partition_counts(self, topics: Sequence[str]) -> dict[str, int]:
        """``Topics.partition_counts``: one round trip per node. The leader reads the counts
        on every rebalance, and its partition watcher every ``metadata_max_age_ms``; one read
        per topic cost a round trip each."""
        return self._topic_admin.partition_counts(topics)

    @translate_redis_errors
    def partition_racks(self, counts: Mapping[str, int]) -> dict[TopicPartition, set[str]]:
        return _racks.partition_racks(self._redis, self._ns, counts)

    def log_offsets(self, topic: str, partition: int) -> tuple[int, int]:
        return _topics.log_offsets(self._redis, self._ns, topic, partition)

    def log_offsets_many(
        self, partitions: Sequence[TopicPartition]
    ) -> list[tuple[int, int] | Errors | _topics.TopicError]:
        """``log_offsets_each``: a stream whose last id is not rcoord's (an XADD by hand) is
        its partition's TopicError in its place. Read with ``log_offsets_many``, it raised
        for the whole call, so the Consumer's ``lag()`` and ``position()`` failed for every
        partition read with it."""
        return _log_offsets_each(
            self._redis, self._ns, [(tp.topic, tp.partition) for tp in partitions])

    @translate_redis_errors
    def created_times(self, topics: Sequence[str]) -> dict[str, int]:
        return _incarnation.created_times(self._redis, self._ns, topics)

    def fetch(
        self, topic: str, partition: int, offset: int, max_records: int, block_ms: int | None,
        *, max_bytes: int | None = None, waker: _topics.FetchWaker | None = None,
    ) -> _topics.FetchResult:
        return _topics.fetch(self._redis, self._ns, topic, partition, offset, max_records,
                             block_ms=block_ms, max_bytes=max_bytes, waker=waker)

    def fetch_many_as(
        self, reads: Sequence[tuple[str, int, int]], max_records: int, record_type: type[R],
        *, max_bytes: int | None = None, partition_max_bytes: int | None = None,
        record_bytes: Sequence[int] | None = None,
    ) -> list[_topics.PartitionRecords[R]]:
        return _topics.fetch_many_as(self._redis, self._ns, reads, max_records, record_type,
                                     max_bytes=max_bytes, partition_max_bytes=partition_max_bytes,
                                     record_bytes=record_bytes)

    def offsets_for_times(
        self, timestamps: Mapping[tuple[str, int], int]
    ) -> dict[tuple[str, int], OffsetAndTimestamp | None]:
        return _offsets_for_times(self._redis, self._ns, timestamps)

    @translate_redis_errors
    def list_topics(self) -> list[str]:
        return self._topic_admin.list()


def client_from_url(url: str) -> Any:
    """A ``redis.Redis`` for ``url``, or a ``redis.RedisCluster`` if the server is a cluster node
    (``rcoord.connect.connect``, with the client's ``SOCKET_TIMEOUT_S``). A refused login
    (``AuthenticationFailedError``) names the URL, its password masked."""
    try:
        return _connect(url)
    except AuthenticationFailedError as exc:
        cause = exc.__cause__ or exc
        raise as_authentication_failed("client_from_url", cause, url) from cause


@translate_redis_errors
def _connect(url: str) -> Any:
    return connect(url, socket_timeout=SOCKET_TIMEOUT_S)
