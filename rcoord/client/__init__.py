"""The worker side: join a consumer group, get partitions, consume them, commit fenced offsets.

* ``ConsumerGroup`` / ``Generation``: the kafka-go style lifecycle (``group.next()`` hands out
  generations; ``generation.start(fn)`` runs work bound to one; ``generation.commit_offsets``).
* ``Consumer``: Kafka's poll loop on top, with auto-commit and a ``ConsumerRebalanceListener``.
* ``ERROR_POLICY``: how every coordinator error is handled, as one table.
"""

from .config import ConsumerGroupConfig, StartOffset
from .consumer import Consumer, ConsumerRebalanceListener, ConsumerRecord
from .coordinator import Coordinator, RedisCoordinator, client_from_url
from .errors import (
    CommitFailedError,
    ConcurrentModificationError,
    GenerationEndedError,
    GroupClosedError,
    IllegalStateError,
    InvalidAssignmentError,
    InvalidOffsetError,
    JoinRefusedError,
    NoOffsetForPartitionError,
    OffsetOutOfRangeError,
    ReadOnlyReplicaError,
    RebalanceInProgressError,
    WakeupError,
)
from .generation import EndReason, Generation, GenerationContext, PartitionAssignment
from .group import ConsumerGroup
from .policy import CONNECTION_LOST, ERROR_POLICY, OTHERWISE, Reaction, reaction_for

__all__ = [
    "CONNECTION_LOST",
    "ERROR_POLICY",
    "OTHERWISE",
    "CommitFailedError",
    "ConcurrentModificationError",
    "Consumer",
    "ConsumerGroup",
    "ConsumerGroupConfig",
    "ConsumerRebalanceListener",
    "ConsumerRecord",
    "Coordinator",
    "EndReason",
    "Generation",
    "GenerationContext",
    "GenerationEndedError",
    "GroupClosedError",
    "IllegalStateError",
    "InvalidAssignmentError",
    "InvalidOffsetError",
    "JoinRefusedError",
    "NoOffsetForPartitionError",
    "OffsetOutOfRangeError",
    "PartitionAssignment",
    "Reaction",
    "ReadOnlyReplicaError",
    "RebalanceInProgressError",
    "RedisCoordinator",
    "StartOffset",
    "WakeupError",
    "client_from_url",
    "reaction_for",
]
