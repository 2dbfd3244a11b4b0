"""Partition assignors: the leader's pure, deterministic strategies for dividing partitions.

One module per strategy, registered under the protocol name members send in JoinGroup:

==================== ============================ =================== ===========================
name                 class                        rebalance protocols follows
==================== ============================ =================== ===========================
range                ``RangeAssignor``            EAGER               Kafka RangeAssignor (KIP-881)
roundrobin           ``RoundRobinAssignor``       EAGER               Kafka RoundRobinAssignor
sticky               ``StickyAssignor``           EAGER               Kafka StickyAssignor
cooperative-sticky   ``CooperativeStickyAssignor`` COOPERATIVE, EAGER Kafka CooperativeStickyAssignor
rack-affinity        ``RackAffinityAssignor``     EAGER               kafka-go RackAffinityGroupBalancer
==================== ============================ =================== ===========================

The contract every built-in assignor meets (``_base`` has the shared rules)::

    get_assignor(name).assign(members, partitions_per_topic, member_order=None,
                              partition_racks=None) -> {member_id: [TopicPartition, ...]}

``validate_cooperative_assignment`` is the leader's KIP-429 check before it sends a
cooperative assignment.
"""

from __future__ import annotations

from ._base import (  # _REGISTRY stays importable: tests unregister what they register
    _REGISTRY as _REGISTRY,
)
from ._base import (
    ASSIGNORS,
    Assignor,
    PartitionRacks,
    RebalanceProtocol,
    UnknownAssignorError,
    get_assignor,
    kafka_member_order,
    rebalance_protocol,
    register_assignor,
    supported_protocols,
    user_data_for,
)
from .cooperative import (
    CooperativeAssignmentError,
    partitions_transferring_ownership,
    standing_claims,
    validate_cooperative_assignment,
)
from .rack_affinity import RackAffinityAssignor
from .range import RangeAssignor
from .roundrobin import RoundRobinAssignor
from .sticky import CooperativeStickyAssignor, StickyAssignor, sticky_assignment

__all__ = [
    "ASSIGNORS",
    "Assignor",
    "CooperativeAssignmentError",
    "CooperativeStickyAssignor",
    "PartitionRacks",
    "RackAffinityAssignor",
    "RangeAssignor",
    "RebalanceProtocol",
    "RoundRobinAssignor",
    "StickyAssignor",
    "UnknownAssignorError",
    "get_assignor",
    "kafka_member_order",
    "partitions_transferring_ownership",
    "rebalance_protocol",
    "register_assignor",
    "standing_claims",
    "sticky_assignment",
    "supported_protocols",
    "user_data_for",
    "validate_cooperative_assignment",
]

for _assignor in (RangeAssignor(), RoundRobinAssignor(), StickyAssignor(),
                  CooperativeStickyAssignor(), RackAffinityAssignor()):
    register_assignor(_assignor)
del _assignor
