"""rcoord: Kafka's consumer-group coordination on Redis.

The classic group protocol (JoinGroup, SyncGroup, Heartbeat, LeaveGroup) with Kafka's state
machine, generations, delayed join and static membership, kept in Redis and changed only by
Lua scripts.
"""

from .client import (
    CommitFailedError,
    Consumer,
    ConsumerGroup,
    ConsumerGroupConfig,
    ConsumerRebalanceListener,
    ConsumerRecord,
    Generation,
    GroupClosedError,
)
from .config import CoordinatorConfig
from .coordinator import GroupCoordinator
from .errors import (
    AuthenticationFailedError,
    ConfigError,
    ConnectionLost,
    Errors,
    IllegalStateError,
    InvalidRequestError,
    ProtocolError,
    RcoordError,
    ServerUnavailable,
)
from .partitioning import partition_for
from .protocol import (
    JoinGroupMember,
    JoinGroupResult,
    LeaveGroupResult,
    LeaveMemberResult,
    MemberIdentity,
    SyncGroupResult,
)
from .protocol.admin import GroupDescription, GroupListing, MemberDescription, OffsetDeleteResult
from .protocol.offsets import OffsetAndMetadata, OffsetFetchResult, TopicPartition
from .state import GroupState
from .testing.clock import MockTime

__all__ = [
    "AuthenticationFailedError",
    "CommitFailedError",
    "ConfigError",
    "ConnectionLost",
    "Consumer",
    "ConsumerGroup",
    "ConsumerGroupConfig",
    "ConsumerRebalanceListener",
    "ConsumerRecord",
    "CoordinatorConfig",
    "Errors",
    "Generation",
    "GroupClosedError",
    "GroupCoordinator",
    "GroupDescription",
    "GroupListing",
    "GroupState",
    "IllegalStateError",
    "InvalidRequestError",
    "JoinGroupMember",
    "JoinGroupResult",
    "LeaveGroupResult",
    "LeaveMemberResult",
    "MemberDescription",
    "MemberIdentity",
    "MockTime",
    "OffsetAndMetadata",
    "OffsetDeleteResult",
    "OffsetFetchResult",
    "ProtocolError",
    "RcoordError",
    "ServerUnavailable",
    "SyncGroupResult",
    "TopicPartition",
    "partition_for",
]

__version__ = "0.1.0"
