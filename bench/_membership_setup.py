"""What the membership bench's sections share: the group's name and protocol, its config."""

from __future__ import annotations

import _common  # noqa: F401  (puts the repository root on sys.path)

from rcoord import CoordinatorConfig

GROUP = "bench-group"
PROTOCOL_TYPE = "consumer"
PROTOCOLS = [("range", b"")]
SESSION_TIMEOUT_MS = 60_000  # also the rebalance timeout (JoinGroup default)
SOCKET_TIMEOUT_S = 15.0  # > MAX_BLOCK_MS of a parked call (1 s)


def make_config(namespace: str, delay_ms: int) -> CoordinatorConfig:
    return CoordinatorConfig(
        group_initial_rebalance_delay_ms=delay_ms,
        group_min_session_timeout_ms=1000,
        namespace=namespace,
    )


def assignment_for(member_id: str) -> bytes:
    return b"asg:" + member_id.encode()
